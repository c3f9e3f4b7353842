//! Compiles each BPF congestion control (src/bpf/*.bpf.c) with clang and generates its
//! libbpf-rs skeleton.

use libbpf_cargo::SkeletonBuilder;
use std::path::PathBuf;

/// The bundled congestion controls, one source file each.
const CCS: &[&str] = &[
    "satpep_hybla",
    "satpep_westwood",
    "satpep_vegas",
    "satpep_tarang",
    "satpep_hstcp",
    "satpep_scalable",
    "satpep_sat",
];

fn main() {
    let out = PathBuf::from(std::env::var_os("OUT_DIR").unwrap());
    println!("cargo:rerun-if-changed=src/bpf/satpep_tcp.h");
    println!("cargo:rerun-if-changed=src/bpf/hybla_growth.h");
    println!("cargo:rerun-if-changed=src/bpf/bw_estimate.h");
    for cc in CCS {
        let src = format!("src/bpf/{cc}.bpf.c");
        println!("cargo:rerun-if-changed={src}");
        SkeletonBuilder::new()
            .source(&src)
            .clang_args(["-D__TARGET_ARCH_x86", "-Wall", "-Wno-unused-function"])
            .build_and_generate(out.join(format!("{cc}.skel.rs")))
            .unwrap_or_else(|e| {
                panic!(
                    "building {src} (needs clang and libbpf-dev: scripts/install-deps.sh): {e:#}"
                )
            });
    }
}
