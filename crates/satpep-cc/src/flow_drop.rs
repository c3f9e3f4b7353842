//! The split relay's drop-based flow control (Bharadwaj 1999, §4.2): a BPF socket filter
//! (`src/bpf/flow_drop.bpf.c`) that drops one data segment a relayed socket receives when the
//! relay asks, and no other until that one's retransmission has arrived.
//!
//! Loading needs privilege; everything after it does not: sockets are attached with
//! `SO_ATTACH_BPF` (a descriptor the proxy keeps) and armed through a shared mapping of the
//! filter's slots, so a proxy that has dropped its privileges still drives it.

use libbpf_rs::skel::{OpenSkel, SkelBuilder};
use std::io;
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering::SeqCst};
use std::sync::Arc;

skeleton!(flow_drop_skel, "flow_drop.skel.rs");

/// Slots a cookie may occupy (the filter's `PROBES`).
const PROBES: usize = 8;

/// One socket's slot, laid out as the filter's `struct slot`.
#[repr(C)]
struct Slot {
    cookie: AtomicU64,
    state: AtomicU32,
    seq: AtomicU32,
    drops: AtomicU64,
    at_ns: AtomicU64,
}

const IDLE: u32 = 0;
const ARMED: u32 = 1;
const DROPPED: u32 = 2;

/// Where a socket's filter is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DropState {
    /// Nothing pending.
    Idle,
    /// The next data segment will be dropped.
    Armed,
    /// A segment was dropped and its retransmission has not arrived yet.
    Dropped,
}

/// The loaded filter: its program and its slots, mapped into this process.
pub struct DropFilter {
    prog: OwnedFd,
    slots: *mut Slot,
    len: usize,
    map_bytes: usize,
}

// SAFETY: the mapping lives as long as the value and is only accessed through atomics.
unsafe impl Send for DropFilter {}
// SAFETY: as above.
unsafe impl Sync for DropFilter {}

impl Drop for DropFilter {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `load`, no longer referenced (slots hold an Arc).
        unsafe { libc::munmap(self.slots as *mut libc::c_void, self.map_bytes) };
    }
}

impl DropFilter {
    /// Loads the filter with room for about `sockets` armed sockets at once (rounded up to a
    /// power of two, at least 1 024). Needs CAP_BPF (or root).
    pub fn load(sockets: usize) -> Result<Arc<DropFilter>, String> {
        let len = sockets.clamp(1024, 1 << 22).next_power_of_two();
        let why = |e: libbpf_rs::Error| format!("cannot load the drop filter (flow_drop): {e}");
        let mut storage = MaybeUninit::uninit();
        let mut open = flow_drop_skel::FlowDropSkelBuilder::default()
            .open(&mut storage)
            .map_err(why)?;
        open.maps.slots.set_max_entries(len as u32).map_err(why)?;
        if let Some(r) = open.maps.rodata_data.as_deref_mut() {
            r.slot_mask = (len - 1) as u32;
        }
        let skel = open.load().map_err(why)?;
        let prog = skel
            .progs
            .flow_drop
            .as_fd()
            .try_clone_to_owned()
            .map_err(|e| format!("drop filter: {e}"))?;
        let page = 4096usize;
        let map_bytes = (len * std::mem::size_of::<Slot>()).div_ceil(page) * page;
        // SAFETY: maps the array map's values (BPF_F_MMAPABLE), shared with the kernel; the
        // mapping keeps the map alive after the skeleton's descriptors close.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                map_bytes,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                skel.maps.slots.as_fd().as_raw_fd(),
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(format!(
                "drop filter: cannot map its slots: {}",
                io::Error::last_os_error()
            ));
        }
        Ok(Arc::new(DropFilter {
            prog,
            slots: p as *mut Slot,
            len,
            map_bytes,
        }))
    }

    fn slot(&self, i: usize) -> &Slot {
        // SAFETY: i < len; the mapping holds len slots and lives as long as self.
        unsafe { &*self.slots.add(i) }
    }

    /// Attaches the filter to a socket (no privilege needed). A socket with the filter and
    /// no slot is never dropped from.
    pub fn attach(&self, sock: BorrowedFd<'_>) -> io::Result<()> {
        let fd: libc::c_int = self.prog.as_raw_fd();
        // SAFETY: setsockopt reads one c_int.
        let r = unsafe {
            libc::setsockopt(
                sock.as_raw_fd(),
                libc::SOL_SOCKET,
                libc::SO_ATTACH_BPF,
                &fd as *const libc::c_int as *const libc::c_void,
                std::mem::size_of::<libc::c_int>() as libc::socklen_t,
            )
        };
        if r == 0 {
            Ok(())
        } else {
            Err(io::Error::last_os_error())
        }
    }

    /// A slot for the socket with `cookie` (`SO_COOKIE`), free again when dropped; None when
    /// every slot the cookie may use is taken.
    pub fn claim(self: &Arc<Self>, cookie: u64) -> Option<DropSlot> {
        if cookie == 0 {
            return None;
        }
        (0..PROBES)
            .map(|i| (cookie.wrapping_add(i as u64) as usize) & (self.len - 1))
            .find(|&i| {
                self.slot(i)
                    .cookie
                    .compare_exchange(0, cookie, SeqCst, SeqCst)
                    .is_ok()
            })
            .map(|index| DropSlot {
                filter: self.clone(),
                index,
            })
    }
}

/// One socket's place in the filter.
pub struct DropSlot {
    filter: Arc<DropFilter>,
    index: usize,
}

impl DropSlot {
    fn slot(&self) -> &Slot {
        self.filter.slot(self.index)
    }

    /// Where the filter is for this socket.
    pub fn state(&self) -> DropState {
        match self.slot().state.load(SeqCst) {
            ARMED => DropState::Armed,
            DROPPED => DropState::Dropped,
            _ => DropState::Idle,
        }
    }

    /// Drop the next data segment; false unless the filter was idle.
    pub fn arm(&self) -> bool {
        self.slot()
            .state
            .compare_exchange(IDLE, ARMED, SeqCst, SeqCst)
            .is_ok()
    }

    /// Takes back an arming not yet used.
    pub fn disarm(&self) {
        let _ = self
            .slot()
            .state
            .compare_exchange(ARMED, IDLE, SeqCst, SeqCst);
    }

    /// A drop whose retransmission has not been seen for `after` (the connection ended or
    /// the sender sent it differently) no longer holds the filter back.
    pub fn expire(&self, after: std::time::Duration) {
        let s = self.slot();
        if s.state.load(SeqCst) == DROPPED
            && monotonic_ns().saturating_sub(s.at_ns.load(SeqCst)) > after.as_nanos() as u64
        {
            let _ = s.state.compare_exchange(DROPPED, IDLE, SeqCst, SeqCst);
        }
    }

    /// Segments dropped on this socket so far.
    pub fn drops(&self) -> u64 {
        self.slot().drops.load(SeqCst)
    }
}

impl Drop for DropSlot {
    fn drop(&mut self) {
        let s = self.slot();
        s.state.store(IDLE, SeqCst);
        s.drops.store(0, SeqCst);
        s.seq.store(0, SeqCst);
        s.cookie.store(0, SeqCst);
    }
}

/// CLOCK_MONOTONIC in ns, the filter's `bpf_ktime_get_ns`.
fn monotonic_ns() -> u64 {
    let mut t = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: writes one timespec.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut t) };
    t.tv_sec as u64 * 1_000_000_000 + t.tv_nsec as u64
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};
    use std::net::{TcpListener, TcpStream};

    fn cookie(s: &TcpStream) -> u64 {
        let mut c = 0u64;
        let mut len = std::mem::size_of::<u64>() as libc::socklen_t;
        // SAFETY: c is writable for len bytes.
        unsafe {
            libc::getsockopt(
                s.as_raw_fd(),
                libc::SOL_SOCKET,
                libc::SO_COOKIE,
                &mut c as *mut u64 as *mut libc::c_void,
                &mut len,
            )
        };
        c
    }

    /// Segments the sending socket retransmitted (tcpi_total_retrans).
    fn retransmitted(s: &TcpStream) -> u32 {
        // struct tcp_info: 8 bytes of u8 fields, then u32s; total_retrans is the 24th u32.
        tcp_info_u32(s, 2 + 23)
    }

    /// Segments `s` received out of order (`tcpi_rcv_ooopack`, at byte 224): a segment
    /// dropped on its way leaves a hole; a spurious retransmission (a tail-loss probe on a
    /// loaded machine) does not.
    fn out_of_order(s: &TcpStream) -> u32 {
        tcp_info_u32(s, 56)
    }

    /// The `i`-th u32 of `s`'s `struct tcp_info`.
    fn tcp_info_u32(s: &TcpStream, i: usize) -> u32 {
        let mut info = [0u32; 64];
        let mut len = std::mem::size_of_val(&info) as libc::socklen_t;
        // SAFETY: info is writable for len bytes.
        unsafe {
            libc::getsockopt(
                s.as_raw_fd(),
                libc::IPPROTO_TCP,
                libc::TCP_INFO,
                info.as_mut_ptr() as *mut libc::c_void,
                &mut len,
            )
        };
        info[i]
    }

    /// Sends `n` patterned bytes from `tx` and checks they all arrive at `rx`, in order;
    /// the sender, and how many segments `rx` received out of order.
    fn transfer(mut tx: TcpStream, mut rx: TcpStream, n: usize) -> (TcpStream, u32) {
        let sender = std::thread::spawn(move || {
            let data: Vec<u8> = (0..n).map(|i| (i % 251) as u8).collect();
            tx.write_all(&data).unwrap();
            tx.shutdown(std::net::Shutdown::Write).unwrap();
            let mut rest = Vec::new();
            tx.read_to_end(&mut rest).unwrap();
            tx
        });
        let mut got = Vec::new();
        rx.read_to_end(&mut got).unwrap();
        assert_eq!(got.len(), n, "every byte arrives");
        assert!(
            got.iter().enumerate().all(|(i, &b)| b == (i % 251) as u8),
            "in order and intact"
        );
        let ooo = out_of_order(&rx);
        drop(rx);
        (sender.join().unwrap(), ooo)
    }

    fn pair() -> (TcpStream, TcpStream) {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let tx = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (rx, _) = l.accept().unwrap();
        (tx, rx)
    }

    #[test]
    fn an_armed_socket_loses_one_segment_and_every_byte_arrives() {
        let f = DropFilter::load(1).expect("load (as root)");
        let (tx, rx) = pair();
        f.attach(rx.as_fd()).unwrap();
        let slot = f.claim(cookie(&rx)).expect("a free slot");
        assert!(slot.arm());
        assert!(!slot.arm(), "armed once");
        let (tx, ooo) = transfer(tx, rx, 8 << 20);
        assert_eq!(slot.drops(), 1, "one segment dropped");
        assert!(ooo >= 1, "the hole it left: {ooo} out of order");
        assert_eq!(slot.state(), DropState::Idle, "its retransmission arrived");
        assert!(retransmitted(&tx) >= 1, "the sender retransmitted it");
    }

    #[test]
    fn a_socket_without_a_slot_loses_nothing_and_slots_are_reused() {
        let f = DropFilter::load(1).unwrap();
        let (tx, rx) = pair();
        f.attach(rx.as_fd()).unwrap();
        // No hole (a tail-loss probe may still retransmit a segment on a loaded machine:
        // one did once in a full test run).
        let (_, ooo) = transfer(tx, rx, 4 << 20);
        assert_eq!(ooo, 0, "a segment was dropped");
        // Eight cookies that map to the same first slot take its eight probes; a ninth finds
        // none, and one given back is free again.
        let len = f.len as u64;
        let held: Vec<_> = (1..=8).map(|i| f.claim(i * len).unwrap()).collect();
        assert!(f.claim(9 * len).is_none());
        drop(held);
        assert!(f.claim(9 * len).is_some());
    }
}
