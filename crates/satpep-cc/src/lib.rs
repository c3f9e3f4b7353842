//! satpep's congestion controls for long, lossy links, loaded into the running kernel as BPF
//! `struct_ops` (no kernel modules). Each lives in its own C file under `src/bpf/`, is built
//! by `build.rs` into a libbpf-rs skeleton, and registers under its name with the kernel,
//! where any socket can select it with `TCP_CONGESTION` (e.g. `iperf3 -C satpep_hybla`).
//!
//! A congestion control stays registered while its `struct_ops` link is open: held by a
//! [`Loaded`] value, or pinned in bpffs ([`Loaded::pin`]) so it outlives the process.

use libbpf_rs::skel::{OpenSkel, SkelBuilder};
use std::mem::MaybeUninit;
use std::path::{Path, PathBuf};

macro_rules! skeleton {
    ($module:ident, $file:literal) => {
        mod $module {
            #![allow(
                clippy::all,
                missing_docs,
                dead_code,
                non_snake_case,
                non_camel_case_types
            )]
            #![allow(unused_imports, unused_qualifications)]
            include!(concat!(env!("OUT_DIR"), "/", $file));
        }
    };
}

skeleton!(hybla_skel, "satpep_hybla.skel.rs");
skeleton!(westwood_skel, "satpep_westwood.skel.rs");
skeleton!(vegas_skel, "satpep_vegas.skel.rs");
skeleton!(tarang_skel, "satpep_tarang.skel.rs");
skeleton!(hstcp_skel, "satpep_hstcp.skel.rs");
skeleton!(scalable_skel, "satpep_scalable.skel.rs");
skeleton!(sat_skel, "satpep_sat.skel.rs");

/// Opens, configures, loads and registers one skeleton; returns its struct_ops link.
macro_rules! load_skel {
    ($name:expr, $builder:ty, $map:ident, |$open:ident| $configure:block) => {{
        let mut storage = MaybeUninit::uninit();
        #[allow(unused_mut)]
        let mut $open = <$builder>::default()
            .open(&mut storage)
            .map_err(|e| explain($name, e))?;
        $configure
        let mut skel = $open.load().map_err(|e| explain($name, e))?;
        skel.maps
            .$map
            .attach_struct_ops()
            .map_err(|e| explain($name, e))?
    }};
}

/// A congestion control shipped with satpep.
#[derive(Debug, Clone, Copy, serde::Serialize)]
pub struct Bundled {
    /// Name it registers under (what `TCP_CONGESTION` and `iperf3 -C` take).
    pub name: &'static str,
    /// One line about it.
    pub about: &'static str,
}

/// Every bundled congestion control.
pub const BUNDLED: &[Bundled] = &[
    Bundled {
        name: "satpep_hybla",
        about: "Hybla: grows per RTT as a connection with RTT0 (25 ms) would; paced",
    },
    Bundled {
        name: "satpep_westwood",
        about: "Westwood+: Reno growth; after a loss, window = bandwidth estimate x min RTT",
    },
    Bundled {
        name: "satpep_vegas",
        about: "Vegas: keeps 2-4 segments queued at the bottleneck, from RTT growth",
    },
    Bundled {
        name: "satpep_tarang",
        about: "Tarang: Hybla growth; loss reaction from bandwidth estimate vs capacity",
    },
    Bundled {
        name: "satpep_hstcp",
        about:
            "HighSpeed (RFC 3649): Reno below 38 segments, faster growth, gentler decrease above",
    },
    Bundled {
        name: "satpep_scalable",
        about: "Scalable: +1 % of cwnd per RTT, -1/8 on loss",
    },
    Bundled {
        name: "satpep_sat",
        about: "satellite: rate x (base RTT + short slack) from measured rate and RTT; ignores random loss, drains queues (split's default)",
    },
];

/// The controller split mode's satellite leg uses when none is configured: the tunnel's
/// controller as a BPF congestion control. On the field benchmark it kept the queue of a
/// GEO link at BER 1e-6 to a p95 of 59 ms where kernel BBR kept 558, and carried more
/// (docs/field.md).
pub const SPLIT_DEFAULT: &str = "satpep_sat";

/// Settings applied when loading.
#[derive(Debug, Clone, Copy)]
pub struct Options {
    /// Hybla's (and Tarang's) reference RTT, microseconds.
    pub rtt0_us: u32,
    /// Tarang's channel capacity, kbit/s (0: estimated per connection).
    pub capacity_kbps: u32,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            rtt0_us: 25_000,
            capacity_kbps: 0,
        }
    }
}

/// A loaded congestion control: registered with the kernel while this lives (or while its
/// pin exists).
pub struct Loaded {
    /// Its name.
    pub name: &'static str,
    link: libbpf_rs::Link,
}

/// Where `satpep cc load --pin` keeps the links.
pub const PIN_DIR: &str = "/sys/fs/bpf/satpep";

impl Loaded {
    /// Pins the registration under [`PIN_DIR`], so it survives this process;
    /// [`unpin`] removes it.
    pub fn pin(&mut self) -> Result<PathBuf, String> {
        ensure_bpffs()?;
        std::fs::create_dir_all(PIN_DIR).map_err(|e| {
            format!("cannot create {PIN_DIR} (is bpffs mounted on /sys/fs/bpf?): {e}")
        })?;
        let path = Path::new(PIN_DIR).join(self.name);
        self.link
            .pin(&path)
            .map_err(|e| format!("cannot pin {} at {}: {e}", self.name, path.display()))?;
        Ok(path)
    }
}

/// Mounts bpffs on /sys/fs/bpf unless it is there (as systemd does at boot; minimal systems
/// and containers often lack it).
fn ensure_bpffs() -> Result<(), String> {
    const BPF_FS_MAGIC: i64 = 0xcafe4a11;
    let path = c"/sys/fs/bpf";
    // SAFETY: statfs fills the struct we pass; the path is a valid C string.
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    if unsafe { libc::statfs(path.as_ptr(), &mut st) } == 0 && st.f_type as i64 == BPF_FS_MAGIC {
        return Ok(());
    }
    // SAFETY: constant, valid C strings; no data argument.
    let r = unsafe {
        libc::mount(
            c"bpf".as_ptr(),
            path.as_ptr(),
            c"bpf".as_ptr(),
            0,
            std::ptr::null(),
        )
    };
    if r != 0 {
        return Err(format!(
            "bpffs is not mounted on /sys/fs/bpf and mounting it failed: {}",
            std::io::Error::last_os_error()
        ));
    }
    Ok(())
}

/// Removes the pin of `name`; the kernel unregisters it once no socket uses it. Returns
/// whether a pin existed.
pub fn unpin(name: &str) -> Result<bool, String> {
    let path = Path::new(PIN_DIR).join(name);
    match std::fs::remove_file(&path) {
        Ok(()) => Ok(true),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(false),
        Err(e) => Err(format!("cannot remove {}: {e}", path.display())),
    }
}

/// Names of the pinned congestion controls.
pub fn pinned() -> Vec<String> {
    std::fs::read_dir(PIN_DIR)
        .map(|d| {
            d.filter_map(|e| e.ok()?.file_name().into_string().ok())
                .collect()
        })
        .unwrap_or_default()
}

/// The congestion controls the kernel offers now (built in, modules, and BPF ones loaded).
pub fn available() -> Vec<String> {
    std::fs::read_to_string("/proc/sys/net/ipv4/tcp_available_congestion_control")
        .unwrap_or_default()
        .split_whitespace()
        .map(String::from)
        .collect()
}

/// Why this kernel or process cannot load BPF congestion controls, if it cannot.
pub fn check_support() -> Result<(), String> {
    if !Path::new("/sys/kernel/btf/vmlinux").exists() {
        return Err(
            "this kernel has no BTF (/sys/kernel/btf/vmlinux; CONFIG_DEBUG_INFO_BTF), \
                    so BPF congestion controls cannot be loaded"
                .into(),
        );
    }
    // SAFETY: no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return Err(
            "loading BPF congestion controls needs root (CAP_BPF and CAP_NET_ADMIN)".into(),
        );
    }
    Ok(())
}

fn explain(name: &str, e: libbpf_rs::Error) -> String {
    let msg = e.to_string();
    let hint = match e.kind() {
        libbpf_rs::ErrorKind::PermissionDenied => " (needs root: CAP_BPF and CAP_NET_ADMIN)",
        libbpf_rs::ErrorKind::AlreadyExists => {
            " (a congestion control of that name is already registered: see satpep cc list)"
        }
        libbpf_rs::ErrorKind::Unsupported => {
            " (the kernel is too old for BPF congestion controls: 5.13 or later needed, \
             6.4 or later for struct_ops links)"
        }
        _ => "",
    };
    format!("cannot load {name}: {msg}{hint}")
}

/// Longest congestion control name the kernel takes (TCP_CA_NAME_MAX less the NUL).
pub const NAME_MAX: usize = 15;

/// Loads and registers the bundled congestion control `name`.
pub fn load(name: &str, opts: &Options) -> Result<Loaded, String> {
    check_support()?;
    if available().iter().any(|a| a == name) {
        return Err(format!(
            "cannot load {name}: a congestion control of that name is already registered \
             (pinned: satpep cc unload {name})"
        ));
    }
    let link = match name {
        "satpep_hybla" => load_skel!(
            name,
            hybla_skel::SatpepHyblaSkelBuilder,
            satpep_hybla,
            |open| {
                if let Some(r) = open.maps.rodata_data.as_deref_mut() {
                    r.rtt0_us = opts.rtt0_us;
                }
            }
        ),
        "satpep_tarang" => load_skel!(
            name,
            tarang_skel::SatpepTarangSkelBuilder,
            satpep_tarang,
            |open| {
                if let Some(r) = open.maps.rodata_data.as_deref_mut() {
                    r.rtt0_us = opts.rtt0_us;
                    r.capacity_kbps = opts.capacity_kbps;
                }
            }
        ),
        "satpep_westwood" => {
            load_skel!(
                name,
                westwood_skel::SatpepWestwoodSkelBuilder,
                satpep_westwood,
                |open| {}
            )
        }
        "satpep_vegas" => load_skel!(
            name,
            vegas_skel::SatpepVegasSkelBuilder,
            satpep_vegas,
            |open| {}
        ),
        "satpep_hstcp" => {
            load_skel!(
                name,
                hstcp_skel::SatpepHstcpSkelBuilder,
                satpep_hstcp,
                |open| {}
            )
        }
        "satpep_scalable" => {
            load_skel!(
                name,
                scalable_skel::SatpepScalableSkelBuilder,
                satpep_scalable,
                |open| {}
            )
        }
        "satpep_sat" => load_skel!(name, sat_skel::SatpepSatSkelBuilder, satpep_sat, |open| {}),
        other => {
            let names: Vec<&str> = BUNDLED.iter().map(|b| b.name).collect();
            return Err(format!(
                "'{other}' is not a bundled congestion control (bundled: {})",
                names.join(", ")
            ));
        }
    };
    let name = BUNDLED.iter().find(|b| b.name == name).unwrap().name;
    Ok(Loaded { name, link })
}
