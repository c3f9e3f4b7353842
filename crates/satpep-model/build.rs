//! Compiles the model (c/sat_model.c, which includes c/sat_model.h: the file the BPF
//! controller `satpep_sat` includes too) into a static library for the Rust wrapper.

fn main() {
    for f in ["sat_model.c", "sat_model.h", "win_minmax.h", "sat_types.h"] {
        println!("cargo:rerun-if-changed=c/{f}");
    }
    cc::Build::new()
        .file("c/sat_model.c")
        .warnings(true)
        .flag_if_supported("-Wno-unused-function")
        .opt_level(2)
        .compile("sat_model");
}
