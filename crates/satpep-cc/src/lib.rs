//! satpep's congestion controls for long, lossy links, loaded into the running kernel as BPF
//! `struct_ops` (no kernel modules). Each lives in its own C file under `src/bpf/`, is built
//! by `build.rs` into a libbpf-rs skeleton, and registers under its name with the kernel,
//! where any socket can select it with `TCP_CONGESTION` (e.g. `iperf3 -C satpep_hybla`).
//!
//! A congestion control stays registered while its `struct_ops` link is open: held by a
//! [`Loaded`] value, or pinned in bpffs ([`Loaded::pin`]) so it outlives the process.

use libbpf_rs::skel::{OpenSkel, SkelBuilder};
use std::mem::MaybeUninit;
use std::os::fd::AsFd;
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

pub mod flow_drop;

/// Opens, configures, loads and registers one skeleton; returns its struct_ops link. A
/// kernel may refuse its socket-storage iterators while it takes the controller (a sandbox's
/// LSM refusing tracing programs: EPERM before the verifier ran): then it loads again without
/// them, and `satpep status` shows the connections without their models.
macro_rules! load_skel {
    ($name:expr, $builder:ty, $map:ident, |$open:ident| $configure:block) => {{
        let mut with_iterators = true;
        loop {
            let mut storage = MaybeUninit::uninit();
            #[allow(unused_mut)]
            let mut $open = <$builder>::default()
                .open(&mut storage)
                .map_err(|e| explain($name, e))?;
            $configure
            let mut iterators = 0;
            for mut p in $open.open_object_mut().progs_mut() {
                if p.section() == ITER_SECTION {
                    iterators += 1;
                    p.set_autoload(with_iterators);
                }
            }
            let mut skel = match $open.load() {
                Ok(s) => s,
                Err(e) if with_iterators && iterators > 0 => {
                    tracing::warn!(
                        "{}: the kernel refused its state iterator ({e}); loading it without: `satpep status` will not show its connections' models",
                        $name
                    );
                    with_iterators = false;
                    continue;
                }
                Err(e) => return Err(explain($name, e)),
            };
            let link = skel
                .maps
                .$map
                .attach_struct_ops()
                .map_err(|e| explain($name, e))?;
            let iters = if with_iterators {
                attach_state_iterators($name, libbpf_rs::skel::Skel::object(&skel))?
            } else {
                Vec::new()
            };
            break (link, iters);
        }
    }};
}

/// The section of a socket-storage iterator program.
const ITER_SECTION: &str = "iter/bpf_sk_storage_map";

/// Attaches a controller's socket-storage iterators (`SEC("iter/bpf_sk_storage_map")`:
/// `satpep_sat`'s `sat_states`) to its [`STATE_MAP`]; none for controllers without one.
fn attach_state_iterators(
    name: &str,
    obj: &libbpf_rs::Object,
) -> Result<Vec<libbpf_rs::Link>, String> {
    use libbpf_rs::MapCore;
    let progs: Vec<_> = obj
        .progs_mut()
        .filter(|p| p.section() == ITER_SECTION)
        .collect();
    if progs.is_empty() {
        return Ok(Vec::new());
    }
    let map = obj.maps().find(|m| m.name() == STATE_MAP).ok_or_else(|| {
        format!("{name}: an iterator over socket storage, but no {STATE_MAP} map")
    })?;
    progs
        .iter()
        .map(|p| p.attach_iter(map.as_fd()).map_err(|e| explain(name, e)))
        .collect()
}

/// A congestion control shipped with satpep.
#[derive(Debug, Clone, Copy, serde::Serialize)]
pub struct Bundled {
    /// Name it registers under (what `TCP_CONGESTION` and `iperf3 -C` take).
    pub name: &'static str,
    /// One line about it.
    pub about: &'static str,
    /// This build of it (a hash of the compiled object): a pinned registration of another
    /// build is replaced (see [`refresh`]).
    pub build: &'static str,
}

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

// The skeletons, `BUNDLED` and `load_bundled`, generated by build.rs from src/bpf/*.bpf.c
// (one file per controller; see CONTRIBUTING.md).
include!(concat!(env!("OUT_DIR"), "/bundled.rs"));

/// A loaded congestion control: registered with the kernel while this lives (or while its
/// pin exists).
pub struct Loaded {
    /// Its name.
    pub name: &'static str,
    link: libbpf_rs::Link,
    /// Its iterator over the sockets' models (`satpep_sat`), pinned beside it.
    states: Option<libbpf_rs::Link>,
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
        // A second pin of the same link names the build (bpffs holds no plain files): a
        // later satpep of another build sees it is not its own.
        if let Some(marker) = build_marker(self.name) {
            let _ = std::fs::remove_file(&marker);
            // libbpf pins a link once; the kernel takes more.
            obj_pin(self.link.as_fd(), &marker)
                .map_err(|e| format!("cannot pin {} at {}: {e}", self.name, marker.display()))?;
        }
        // An earlier copy's iterator goes even when this one has none (a kernel that refused
        // it): it would show that copy's sockets.
        let at = states_pin(self.name);
        let _ = std::fs::remove_file(&at);
        if let Some(states) = &mut self.states {
            states
                .pin(&at)
                .map_err(|e| format!("cannot pin {} at {}: {e}", self.name, at.display()))?;
        }
        Ok(path)
    }

    /// Every socket's model as this copy of the controller holds it now (None: a controller
    /// that keeps none). Needs the right to call bpf(); a process without it reads the pin
    /// ([`ModelStates::read_pinned`]).
    pub fn model_states(&self) -> Option<Result<ModelStates, String>> {
        use std::io::Read;
        let link = self.states.as_ref()?;
        Some((|| {
            let mut it = libbpf_rs::Iter::new(link)
                .map_err(|e| format!("cannot walk {}'s sockets: {e}", self.name))?;
            let mut bytes = Vec::new();
            it.read_to_end(&mut bytes)
                .map_err(|e| format!("cannot walk {}'s sockets: {e}", self.name))?;
            ModelStates::parse(&bytes)
        })())
    }
}

/// Where the iterator over `name`'s sockets' models is pinned: `PIN_DIR/NAME@states` (an
/// `@` as the build markers', so [`pinned`] does not take it for a controller and
/// [`unpin`] removes it with the controller). Absent while `name` is registered: a kernel
/// refused the iterator, and no model can be read.
pub fn states_pin(name: &str) -> PathBuf {
    Path::new(PIN_DIR).join(format!("{name}@states"))
}

/// bpf(BPF_OBJ_PIN): pins the BPF object `fd` at `path` in bpffs.
fn obj_pin(fd: std::os::fd::BorrowedFd<'_>, path: &Path) -> std::io::Result<()> {
    use std::os::fd::AsRawFd;
    use std::os::unix::ffi::OsStrExt;
    const BPF_OBJ_PIN: libc::c_long = 6;
    // The kernel's union bpf_attr for BPF_OBJ_PIN.
    #[repr(C)]
    struct ObjPin {
        pathname: u64,
        bpf_fd: u32,
        file_flags: u32,
        path_fd: i32,
        // The kernel wants the rest of the union zeroed.
        pad: [u8; 108],
    }
    let c = std::ffi::CString::new(path.as_os_str().as_bytes())
        .map_err(|_| std::io::Error::from(std::io::ErrorKind::InvalidInput))?;
    let attr = ObjPin {
        pathname: c.as_ptr() as u64,
        bpf_fd: fd.as_raw_fd() as u32,
        file_flags: 0,
        path_fd: 0,
        pad: [0; 108],
    };
    // SAFETY: attr and the path it points to outlive the call; the size is attr's own.
    let r = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            BPF_OBJ_PIN,
            &attr as *const ObjPin,
            std::mem::size_of::<ObjPin>(),
        )
    };
    if r < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// Where the pin that names this build of `name` goes: `PIN_DIR/NAME@BUILD` (bpffs takes
/// no dots in names).
fn build_marker(name: &str) -> Option<PathBuf> {
    let b = BUNDLED.iter().find(|b| b.name == name)?;
    Some(Path::new(PIN_DIR).join(format!("{}@{}", b.name, b.build)))
}

/// What [`refresh`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refresh {
    /// Not registered by a pin of satpep's: nothing to do.
    NotPinned,
    /// Pinned by this build: kept.
    Current,
    /// Pinned by another build (an upgrade, or a lab testing a change): unpinned, and this
    /// build loaded and pinned in its place. Sockets already on the old one keep it.
    Replaced,
}

/// Makes a pinned registration of the bundled controller `name` this build's. A satpep
/// that finds the name registered uses what is there, so without this an upgraded satpep
/// would run the previous version's controller until a reboot (and a lab measuring a
/// change would measure the old code). A registration held by a process rather than a pin
/// is left alone. The replacement is loaded with `opts` (the old one's are not known).
pub fn refresh(name: &str, opts: &Options) -> Result<Refresh, String> {
    let Some(marker) = build_marker(name) else {
        return Ok(Refresh::NotPinned);
    };
    if !Path::new(PIN_DIR).join(name).exists() {
        return Ok(Refresh::NotPinned);
    }
    if marker.exists() {
        return Ok(Refresh::Current);
    }
    unpin(name)?;
    // The kernel releases the link after the last pin goes, in a work item: wait for the
    // name to leave (a process holding the link keeps it registered, and that is an error).
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(2);
    while available().iter().any(|a| a == name) {
        if std::time::Instant::now() > deadline {
            return Err(format!(
                "cannot replace {name} by this build's: after its pin was removed a process \
                 still holds it registered"
            ));
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    let mut l = load(name, opts)?;
    l.pin()?;
    Ok(Refresh::Replaced)
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

/// The BPF map in which `satpep_sat` remembers each destination's path (docs/model.md).
pub const PATH_MAP: &str = "sat_paths";

/// Forgets every path `satpep_sat` remembers, in every copy of it loaded on this host (a pin
/// and any older copy sockets still hold): new connections start cold again. The lab calls
/// it before each run, since its runs reuse the same addresses on different links, and an
/// operator after a change of beam or terminal. Returns how many paths were forgotten.
pub fn forget_paths() -> Result<usize, String> {
    use libbpf_rs::MapCore;
    let mut n = 0;
    for info in libbpf_rs::query::MapInfoIter::default() {
        if info.name.to_bytes() != PATH_MAP.as_bytes() {
            continue;
        }
        let map = libbpf_rs::MapHandle::from_map_id(info.id)
            .map_err(|e| format!("cannot open BPF map {PATH_MAP} (id {}): {e}", info.id))?;
        // Keys first: deleting while walking them may skip some.
        let keys: Vec<Vec<u8>> = map.keys().collect();
        for k in keys {
            if map.delete(&k).is_ok() {
                n += 1;
            }
        }
    }
    Ok(n)
}

/// The BPF map in which `satpep_sat` keeps each socket's model (socket local storage).
pub const STATE_MAP: &str = "sat_state";

/// Every socket's satellite model, as `satpep_sat` keeps them in the kernel (its socket
/// storage), keyed by socket cookie (`SO_COOKIE`). Read through the controller's iterator:
/// from its pin ([`ModelStates::read_pinned`], needing only the right to read the file) or
/// from a [`Loaded`] ([`Loaded::model_states`]).
#[derive(Debug, Default)]
pub struct ModelStates {
    by_cookie: std::collections::HashMap<u64, Vec<u8>>,
}

/// The header `sat_states` writes before each model (`struct sat_state_record`).
const RECORD_HEADER: usize = 16;

impl ModelStates {
    /// Reads the pinned iterator of [`SPLIT_DEFAULT`]; empty when it is not pinned (not
    /// loaded, or loaded by a build without the iterator).
    pub fn read_pinned() -> Result<ModelStates, String> {
        let at = states_pin(SPLIT_DEFAULT);
        match std::fs::read(&at) {
            Ok(bytes) => ModelStates::parse(&bytes),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(ModelStates::default()),
            Err(e) => Err(format!("cannot read {}: {e}", at.display())),
        }
    }

    /// The iterator's output: records of a header and a model.
    fn parse(mut bytes: &[u8]) -> Result<ModelStates, String> {
        let mut by_cookie = std::collections::HashMap::new();
        while !bytes.is_empty() {
            if bytes.len() < RECORD_HEADER {
                return Err(format!("a truncated record of {} bytes", bytes.len()));
            }
            let cookie = u64::from_ne_bytes(bytes[..8].try_into().unwrap());
            let size = u32::from_ne_bytes(bytes[8..12].try_into().unwrap()) as usize;
            if bytes.len() < RECORD_HEADER + size {
                return Err(format!("a record of a {size}-byte model, truncated"));
            }
            by_cookie.insert(cookie, bytes[RECORD_HEADER..RECORD_HEADER + size].to_vec());
            bytes = &bytes[RECORD_HEADER + size..];
        }
        Ok(ModelStates { by_cookie })
    }

    /// How many sockets' models were read.
    pub fn len(&self) -> usize {
        self.by_cookie.len()
    }

    /// Whether none was.
    pub fn is_empty(&self) -> bool {
        self.by_cookie.is_empty()
    }

    /// The raw `struct sat_model` of the socket whose cookie (`SO_COOKIE`) is `cookie`
    /// (`satpep_model::Snapshot::of_state` reads it).
    pub fn get(&self, cookie: u64) -> Option<&[u8]> {
        self.by_cookie.get(&cookie).map(Vec::as_slice)
    }
}

/// Removes the pin of `name`; the kernel unregisters it once no socket uses it. Returns
/// whether a pin existed.
pub fn unpin(name: &str) -> Result<bool, String> {
    // Its build markers first (any build's), then the pin itself.
    let prefix = format!("{name}@");
    for f in pin_entries().into_iter().filter(|f| f.starts_with(&prefix)) {
        remove_pin(&f)?;
    }
    remove_pin(name)
}

/// Removes the pin `PIN_DIR/entry`; whether it existed.
fn remove_pin(entry: &str) -> Result<bool, String> {
    let path = Path::new(PIN_DIR).join(entry);
    match std::fs::remove_file(&path) {
        Ok(()) => Ok(true),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(false),
        Err(e) => Err(format!("cannot remove {}: {e}", path.display())),
    }
}

fn pin_entries() -> Vec<String> {
    std::fs::read_dir(PIN_DIR)
        .map(|d| {
            d.filter_map(|e| e.ok()?.file_name().into_string().ok())
                .collect()
        })
        .unwrap_or_default()
}

/// Names of the pinned congestion controls.
pub fn pinned() -> Vec<String> {
    // A name with an @ is a build marker.
    pin_entries()
        .into_iter()
        .filter(|n| !n.contains('@'))
        .collect()
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
    let Some((link, iters)) = load_bundled(name, opts)? else {
        let names: Vec<&str> = BUNDLED.iter().map(|b| b.name).collect();
        return Err(format!(
            "'{name}' is not a bundled congestion control (bundled: {})",
            names.join(", ")
        ));
    };
    let name = BUNDLED.iter().find(|b| b.name == name).unwrap().name;
    Ok(Loaded {
        name,
        link,
        states: iters.into_iter().next(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn model_states_parse_records_and_refuse_truncated_ones() {
        let record = |cookie: u64, model: &[u8]| {
            let mut r = cookie.to_ne_bytes().to_vec();
            r.extend((model.len() as u32).to_ne_bytes());
            r.extend([0u8; 4]);
            r.extend(model);
            r
        };
        let mut bytes = record(7, &[1, 2, 3]);
        bytes.extend(record(9, &[4, 5]));
        let s = ModelStates::parse(&bytes).unwrap();
        assert_eq!(
            (s.len(), s.get(7), s.get(9)),
            (2, Some(&[1, 2, 3][..]), Some(&[4, 5][..]))
        );
        assert_eq!(s.get(8), None);
        assert!(ModelStates::parse(&bytes[..bytes.len() - 1]).is_err());
        assert!(ModelStates::parse(&bytes[..5]).is_err());
        assert!(ModelStates::parse(&[]).unwrap().is_empty());
    }
}
