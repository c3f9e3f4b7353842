//! Worker processes of a split proxy (`proxy.workers`).
//!
//! Each process has its own descriptor table, so a host whose descriptor limit cannot be
//! raised (a container without CAP_SYS_RESOURCE) holds `workers` times the connections one
//! process can. The proxy (the leader) starts `workers` copies of itself before it installs
//! interception and accepts nothing itself; every worker binds the transparent listener on
//! `proxy.port` with SO_REUSEPORT, and the kernel's TPROXY lookup spreads new connections
//! among them by their addresses. (A leader that accepted too took a third of its part at
//! 100 000 connections, and the clients queued for it failed.) Only the leader touches
//! nftables, serves `/metrics` and `/connections`, and decides the bypass: each process
//! publishes its live connections and whether it is at its own limit in a page of shared
//! memory ([`Shared`]), and the leader bypasses new connections
//! when the sum reaches `max_connections` or any process is full (the kernel would still give
//! it its share of new ones). Signals the leader gets (stop, reload) are passed on; a worker
//! drains its own connections as the leader does, and the leader removes interception only
//! once every worker has exited. A worker that dies is not replaced (its share of new
//! connections goes to the others); the leader logs it.

use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use tracing::{error, info};

/// Most processes (`proxy.workers`).
pub const MAX_WORKERS: usize = 64;

/// The hidden command-line argument that makes a `satpep proxy` a worker: its index.
pub const WORKER_ARG: &str = "--worker";
/// The hidden argument naming the shared page.
pub const SHARED_ARG: &str = "--worker-shared";

/// One worker's figures in the shared page (slots 1 ..= [`MAX_WORKERS`]; 0 is unused).
#[repr(C)]
pub struct Slot {
    /// Its process ID once it listens (0: not yet, or gone).
    pub pid: AtomicU64,
    /// Live connections.
    pub active: AtomicU64,
    /// Connections it may hold (its share of `max_connections`, or what its descriptors fit).
    pub limit: AtomicU64,
    /// 1 while it is at its limit (until it falls under 90 % of it).
    pub full: AtomicU64,
    /// Connections accepted since it started.
    pub accepted: AtomicU64,
    /// Connections that failed (the upstream connect, or reset for want of descriptors).
    pub failed: AtomicU64,
    /// Connections relayed by copying instead of splice.
    pub copied: AtomicU64,
    /// Bytes relayed client → server.
    pub bytes_up: AtomicU64,
    /// Bytes relayed server → client.
    pub bytes_down: AtomicU64,
}

/// The shared page: a file in /run/satpep mapped by every process of one proxy.
pub struct Shared {
    ptr: *mut Slot,
    path: PathBuf,
    owner: bool,
}

// SAFETY: the mapping holds only atomics, and lives as long as the value.
unsafe impl Send for Shared {}
// SAFETY: as above.
unsafe impl Sync for Shared {}

const SIZE: usize = (MAX_WORKERS + 1) * std::mem::size_of::<Slot>();

impl Shared {
    /// The leader's: a new page, zeroed.
    pub fn create() -> Result<Shared, String> {
        let dir = Path::new("/run/satpep");
        std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        static MADE: AtomicU64 = AtomicU64::new(0);
        let path = dir.join(format!(
            "workers-{}-{}",
            std::process::id(),
            MADE.fetch_add(1, Relaxed)
        ));
        let f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&path)
            .map_err(|e| format!("{}: {e}", path.display()))?;
        f.set_len(SIZE as u64)
            .map_err(|e| format!("{}: {e}", path.display()))?;
        Self::map(f, path, true)
    }

    /// A worker's: the leader's page.
    pub fn open(path: &Path) -> Result<Shared, String> {
        let f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(path)
            .map_err(|e| format!("{}: {e}", path.display()))?;
        let len = f.metadata().map(|m| m.len()).unwrap_or(0);
        if len != SIZE as u64 {
            return Err(format!(
                "{}: {len} bytes, not a satpep workers page ({SIZE})",
                path.display()
            ));
        }
        Self::map(f, path.to_path_buf(), false)
    }

    fn map(f: std::fs::File, path: PathBuf, owner: bool) -> Result<Shared, String> {
        // SAFETY: a shared mapping of a file we opened read-write, of its whole length.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                SIZE,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                f.as_raw_fd(),
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(format!(
                "{}: cannot map it: {}",
                path.display(),
                std::io::Error::last_os_error()
            ));
        }
        Ok(Shared {
            ptr: p as *mut Slot,
            path,
            owner,
        })
    }

    /// Where the page is (what a worker is told).
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Worker `k`'s slot (`k` <= [`MAX_WORKERS`]).
    pub fn slot(&self, k: usize) -> &Slot {
        assert!(k <= MAX_WORKERS, "worker index {k}");
        // SAFETY: in bounds of the mapping, which lives as long as `self`; only atomics.
        unsafe { &*self.ptr.add(k) }
    }

    /// Every worker's live connections and limits added up, and whether one is full.
    pub fn totals(&self) -> Totals {
        let mut t = Totals::default();
        for k in 1..=MAX_WORKERS {
            let s = self.slot(k);
            if s.pid.load(Relaxed) == 0 {
                continue;
            }
            t.workers += 1;
            t.active += s.active.load(Relaxed);
            t.limit += s.limit.load(Relaxed);
            t.any_full |= s.full.load(Relaxed) != 0;
            t.accepted += s.accepted.load(Relaxed);
            t.failed += s.failed.load(Relaxed);
            t.copied += s.copied.load(Relaxed);
            t.bytes_up += s.bytes_up.load(Relaxed);
            t.bytes_down += s.bytes_down.load(Relaxed);
        }
        t
    }
}

impl Drop for Shared {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `map`, unmapped once.
        unsafe { libc::munmap(self.ptr as *mut libc::c_void, SIZE) };
        if self.owner {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

/// The workers' figures added up.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Totals {
    /// Workers listening.
    pub workers: u64,
    /// Their live connections.
    pub active: u64,
    /// The connections they may hold.
    pub limit: u64,
    /// One of them is at its limit.
    pub any_full: bool,
    /// Connections they accepted.
    pub accepted: u64,
    /// Connections that failed in them.
    pub failed: u64,
    /// Connections they relayed by copying.
    pub copied: u64,
    /// Bytes they relayed client → server.
    pub bytes_up: u64,
    /// Bytes they relayed server → client.
    pub bytes_down: u64,
}

/// What this process is to the others.
#[derive(Clone, Debug)]
pub enum Process {
    /// The only process.
    Alone,
    /// The leader of workers started with `command` (the program and its arguments, to which
    /// each worker's index and the shared page are added).
    Leader {
        /// Program and arguments of a worker.
        command: Vec<std::ffi::OsString>,
    },
    /// Worker `index` of the leader whose page is `shared`.
    Worker {
        /// 1 .. workers.
        index: usize,
        /// The leader's page.
        shared: PathBuf,
    },
}

/// The leader's workers: their processes and the page.
pub struct Workers {
    /// The page.
    pub shared: std::sync::Arc<Shared>,
    children: Vec<(usize, tokio::process::Child)>,
}

/// How long a worker may take to listen.
const READY_WAIT: std::time::Duration = std::time::Duration::from_secs(20);

impl Workers {
    /// Starts workers 1 ..= `n` with `command` and waits until each listens. On failure the
    /// ones started are killed.
    pub async fn start(n: u32, command: &[std::ffi::OsString]) -> Result<Workers, String> {
        let shared = std::sync::Arc::new(Shared::create()?);
        let mut w = Workers {
            shared,
            children: Vec::new(),
        };
        let (program, args) = command
            .split_first()
            .ok_or("proxy.workers: no command to start workers with")?;
        for k in 1..=n as usize {
            let mut c = tokio::process::Command::new(program);
            c.args(args)
                .arg(WORKER_ARG)
                .arg(k.to_string())
                .arg(SHARED_ARG)
                .arg(w.shared.path())
                // Only the leader speaks to systemd.
                .env_remove("NOTIFY_SOCKET")
                .env_remove("WATCHDOG_USEC")
                .stdin(std::process::Stdio::null())
                .kill_on_drop(true);
            // SAFETY: prctl in the child before exec; async-signal-safe.
            unsafe {
                c.pre_exec(|| {
                    // A worker whose leader dies drains and exits as at a stop.
                    libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM);
                    Ok(())
                });
            }
            let child = c
                .spawn()
                .map_err(|e| format!("proxy.workers: cannot start worker {k}: {e}"))?;
            w.children.push((k, child));
        }
        let t0 = std::time::Instant::now();
        loop {
            let ready = (1..=n as usize)
                .filter(|&k| w.shared.slot(k).pid.load(Relaxed) != 0)
                .count();
            if ready == n as usize {
                break;
            }
            for (k, c) in &mut w.children {
                if let Ok(Some(st)) = c.try_wait() {
                    return Err(format!(
                        "proxy.workers: worker {k} exited before it listened ({st}); its log says why"
                    ));
                }
            }
            if t0.elapsed() > READY_WAIT {
                return Err(format!(
                    "proxy.workers: {ready} of {n} workers listened within {READY_WAIT:?}"
                ));
            }
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
        info!(workers = n, "worker processes listening");
        Ok(w)
    }

    /// Sends `sig` to every worker still running (those that exited are reaped first, so a
    /// PID the system may have given to another process is never signalled).
    pub fn signal(&mut self, sig: libc::c_int) {
        self.reap();
        for (_, c) in &self.children {
            if let Some(p) = c.id() {
                // SAFETY: signalling a child of this process that has not been reaped.
                unsafe { libc::kill(p as libc::pid_t, sig) };
            }
        }
    }

    /// Waits until every worker of `workers` has exited, logging the ones that failed; the
    /// slots of the gone are cleared. The lock is held only for each look, so a second stop
    /// still reaches the workers meanwhile ([`Workers::signal`]).
    pub async fn wait(workers: &tokio::sync::Mutex<Workers>) {
        loop {
            {
                let mut w = workers.lock().await;
                w.forget_exited(true);
                if w.children.is_empty() {
                    return;
                }
            }
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
    }

    /// Logs and forgets workers that exited on their own (their share of new connections
    /// goes to the others).
    pub fn reap(&mut self) {
        self.forget_exited(false);
    }

    /// Forgets the workers that exited and clears their slots. While running
    /// (`stopping` false) every exit is an error and a worker whose state cannot be read is
    /// kept; while stopping only a failed exit is, and such a worker counts as gone.
    fn forget_exited(&mut self, stopping: bool) {
        let shared = &self.shared;
        self.children.retain_mut(|(k, c)| {
            match c.try_wait() {
                Ok(None) => return true,
                Ok(Some(st)) if !stopping => {
                    error!(worker = *k, "worker exited: {st}; not replaced")
                }
                Ok(Some(st)) if !st.success() => error!(worker = *k, "worker exited: {st}"),
                Ok(Some(_)) => {}
                Err(_) if !stopping => return true,
                Err(e) => error!(worker = *k, error = %e, "worker lost"),
            }
            shared.slot(*k).pid.store(0, Relaxed);
            false
        });
    }
}

/// A worker's side: publishes its figures in its slot.
pub struct Publisher {
    shared: Shared,
    index: usize,
}

impl Publisher {
    /// Opens the leader's page as worker `index`.
    pub fn open(index: usize, shared: &Path) -> Result<Publisher, String> {
        if index == 0 || index > MAX_WORKERS {
            return Err(format!("worker index {index}: not 1 ..= {MAX_WORKERS}"));
        }
        Ok(Publisher {
            shared: Shared::open(shared)?,
            index,
        })
    }

    /// This worker's slot.
    pub fn slot(&self) -> &Slot {
        self.shared.slot(self.index)
    }

    /// This worker's index.
    pub fn index(&self) -> usize {
        self.index
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A worker's figures reach the leader through the page, and only listening workers
    /// count.
    #[test]
    fn the_page_carries_each_workers_figures_to_the_leader() {
        let leader = Shared::create().unwrap();
        let w = Publisher::open(3, leader.path()).unwrap();
        w.slot().active.store(7, Relaxed);
        w.slot().limit.store(100, Relaxed);
        assert_eq!(leader.totals().workers, 0, "not listening yet");
        w.slot().pid.store(42, Relaxed);
        w.slot().full.store(1, Relaxed);
        assert_eq!(
            leader.totals(),
            Totals {
                workers: 1,
                active: 7,
                limit: 100,
                any_full: true,
                ..Totals::default()
            }
        );
        assert!(Publisher::open(0, leader.path()).is_err());
        assert!(Publisher::open(MAX_WORKERS + 1, leader.path()).is_err());
        let path = leader.path().to_path_buf();
        drop(w);
        drop(leader);
        assert!(!path.exists(), "the leader removes its page");
        let e = Shared::open(Path::new("/proc/self/status")).err().unwrap();
        assert!(e.contains("not a satpep workers page"), "{e}");
    }
}
