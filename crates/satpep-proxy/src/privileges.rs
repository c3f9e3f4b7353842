//! Dropping privileges once the proxy is set up.
//!
//! Setup needs much of root: loading BPF congestion controls (CAP_BPF, CAP_PERFMON or
//! CAP_SYS_ADMIN), reading key files (CAP_DAC_*), raising the descriptor limit
//! (CAP_SYS_RESOURCE), binding ports below 1024 (CAP_NET_BIND_SERVICE). Running needs only:
//! - CAP_NET_ADMIN: switching the bypass and removing the rules at exit (`nft`, `iptables`),
//!   socket marks (SO_MARK) on upstream sockets, congestion controls outside the sysctl's
//!   allowed list (satpep's own, the adaptive policy's switches);
//! - CAP_NET_RAW: IP_TRANSPARENT on the sockets that connect from the client's address;
//! - CAP_SYS_RESOURCE: relay pipes past `fs.pipe-max-size` and past the per-user pipe limit
//!   (without it, once a few hundred busy connections hold pipes, new pipes shrink to one
//!   page and the relay slows down).
//!
//! Everything else is dropped from every thread's effective, permitted, inheritable and
//! bounding sets, and no_new_privs is set, so neither the proxy nor a program it starts
//! (`nft` runs as root, and root's programs get the bounding set) can regain it.
//!
//! Capabilities belong to threads, and the runtime's threads exist by the time setup ends,
//! so each thread is made to drop its own: a real-time signal whose handler makes the system
//! calls (as libcap's psx does). Threads started later inherit the reduced sets.

use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use std::time::{Duration, Instant};

/// Capabilities kept: CAP_NET_ADMIN, CAP_NET_RAW and CAP_SYS_RESOURCE.
pub const KEPT: [u32; 3] = [12, 13, 24];

/// Their names, for the log and the docs.
pub const KEPT_NAMES: &str = "CAP_NET_ADMIN, CAP_NET_RAW, CAP_SYS_RESOURCE";

const CAPABILITY_VERSION_3: u32 = 0x2008_0522;

#[repr(C)]
struct CapHeader {
    version: u32,
    pid: i32,
}

#[repr(C)]
#[derive(Clone, Copy)]
struct CapData {
    effective: u32,
    permitted: u32,
    inheritable: u32,
}

/// What each thread keeps: [`KEPT`], less what the process did not have to begin with (a
/// thread may not add to its permitted set).
static MASK: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
/// Highest capability number this kernel knows, read before any signal is sent.
static LAST_CAP: AtomicUsize = AtomicUsize::new(40);
/// Threads that have dropped, and those that failed to.
static DONE: AtomicUsize = AtomicUsize::new(0);
static FAILED: AtomicUsize = AtomicUsize::new(0);

fn kept_mask() -> u32 {
    KEPT.iter().fold(0, |m, c| m | 1 << c)
}

/// This thread's permitted set (the low 32 capabilities).
fn permitted_now() -> u32 {
    let mut hdr = CapHeader {
        version: CAPABILITY_VERSION_3,
        pid: 0,
    };
    let mut data = [CapData {
        effective: 0,
        permitted: 0,
        inheritable: 0,
    }; 2];
    // SAFETY: capget with a valid header and room for two data words (version 3).
    if unsafe { libc::syscall(libc::SYS_capget, &mut hdr, data.as_mut_ptr()) } != 0 {
        return 0;
    }
    data[0].permitted
}

/// Drops the calling thread's capabilities to [`KEPT`]. Only system calls: safe in a signal
/// handler. Returns whether every call succeeded.
fn drop_this_thread() -> bool {
    let last = LAST_CAP.load(SeqCst);
    let mut ok = true;
    // The bounding set first, while CAP_SETPCAP is still effective.
    for cap in 0..=last {
        if !KEPT.contains(&(cap as u32)) {
            // SAFETY: prctl with integer arguments.
            let r = unsafe { libc::prctl(libc::PR_CAPBSET_DROP, cap as libc::c_ulong, 0, 0, 0) };
            // EINVAL: a capability this kernel does not have; EPERM: no CAP_SETPCAP (a
            // process started with fewer capabilities), which leaves the bounding set as it
            // was but still drops the rest.
            let e = std::io::Error::last_os_error().raw_os_error();
            if r != 0 && e != Some(libc::EINVAL) && e != Some(libc::EPERM) {
                ok = false;
            }
        }
    }
    let mut hdr = CapHeader {
        version: CAPABILITY_VERSION_3,
        pid: 0,
    };
    let data = [
        CapData {
            effective: MASK.load(SeqCst),
            permitted: MASK.load(SeqCst),
            inheritable: 0,
        },
        CapData {
            effective: 0,
            permitted: 0,
            inheritable: 0,
        },
    ];
    // SAFETY: capset with a valid header and two data words (version 3).
    if unsafe { libc::syscall(libc::SYS_capset, &mut hdr, data.as_ptr()) } != 0 {
        ok = false;
    }
    // SAFETY: prctl with integer arguments.
    if unsafe { libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) } != 0 {
        ok = false;
    }
    ok
}

extern "C" fn on_signal(_: libc::c_int) {
    if drop_this_thread() {
        DONE.fetch_add(1, SeqCst);
    } else {
        FAILED.fetch_add(1, SeqCst);
    }
}

fn signal() -> libc::c_int {
    libc::SIGRTMIN() + 2
}

/// This process's thread ids.
fn threads() -> Vec<i32> {
    std::fs::read_dir("/proc/self/task")
        .map(|d| {
            d.filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
                .collect()
        })
        .unwrap_or_default()
}

/// Drops every thread of this process to [`KEPT`] and sets no_new_privs. Fails with a message
/// naming what did not drop; a process without the capabilities to begin with is left as is.
pub fn drop_all() -> Result<(), String> {
    MASK.store(kept_mask() & permitted_now(), SeqCst);
    if let Ok(t) = std::fs::read_to_string("/proc/sys/kernel/cap_last_cap") {
        if let Ok(n) = t.trim().parse() {
            LAST_CAP.store(n, SeqCst);
        }
    }
    // SAFETY: installing a handler that only makes system calls and touches atomics.
    unsafe {
        let mut sa: libc::sigaction = std::mem::zeroed();
        sa.sa_sigaction = on_signal as *const () as usize;
        sa.sa_flags = libc::SA_RESTART;
        libc::sigemptyset(&mut sa.sa_mask);
        if libc::sigaction(signal(), &sa, std::ptr::null_mut()) != 0 {
            return Err(format!(
                "cannot install the privilege-dropping signal handler: {}",
                std::io::Error::last_os_error()
            ));
        }
    }
    // SAFETY: gettid has no preconditions.
    let me = unsafe { libc::syscall(libc::SYS_gettid) } as i32;
    let mut done: Vec<i32> = Vec::new();
    // Threads may start while this runs (they inherit whatever their creator has then), so
    // repeat until a pass finds none not yet dropped.
    let t0 = Instant::now();
    loop {
        let todo: Vec<i32> = threads()
            .into_iter()
            .filter(|t| *t != me && !done.contains(t))
            .collect();
        if todo.is_empty() {
            break;
        }
        let before = DONE.load(SeqCst) + FAILED.load(SeqCst);
        let mut sent = Vec::new();
        for &tid in &todo {
            // SAFETY: signalling a thread of this process.
            if unsafe { libc::syscall(libc::SYS_tgkill, libc::getpid(), tid, signal()) } == 0 {
                sent.push(tid);
            }
            done.push(tid);
        }
        // Every signalled thread answers, unless it exited first.
        let gone = || {
            sent.iter()
                .filter(|t| !std::path::Path::new(&format!("/proc/self/task/{t}")).exists())
                .count()
        };
        while DONE.load(SeqCst) + FAILED.load(SeqCst) + gone() < before + sent.len() {
            if t0.elapsed() > Duration::from_secs(5) {
                return Err("threads did not answer the privilege-dropping signal".into());
            }
            std::thread::sleep(Duration::from_millis(1));
        }
    }
    let mine = drop_this_thread();
    if !mine || FAILED.load(SeqCst) > 0 {
        return Err(format!(
            "cannot drop capabilities ({} threads failed): {}",
            FAILED.load(SeqCst) + usize::from(!mine),
            std::io::Error::last_os_error()
        ));
    }
    Ok(())
}

/// The capability sets of every thread of process `pid`, as (effective, permitted, bounding).
pub fn thread_caps(pid: u32) -> Vec<(u64, u64, u64)> {
    let Ok(dir) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return Vec::new();
    };
    dir.filter_map(|e| {
        let s = std::fs::read_to_string(e.ok()?.path().join("status")).ok()?;
        let get = |k: &str| {
            s.lines()
                .find(|l| l.starts_with(k))
                .and_then(|l| u64::from_str_radix(l.split_whitespace().nth(1)?, 16).ok())
        };
        Some((get("CapEff:")?, get("CapPrm:")?, get("CapBnd:")?))
    })
    .collect()
}

/// The kept set as `/proc/PID/status` shows it.
pub fn kept_bits() -> u64 {
    u64::from(kept_mask())
}
