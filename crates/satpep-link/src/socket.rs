//! AF_PACKET sockets that read and write whole Ethernet frames on one interface.
//!
//! Each socket is bound to one interface with `ETH_P_ALL`, promiscuous, and:
//! - `PACKET_VNET_HDR`: every frame carries a virtio-net header. A frame whose sender left its
//!   checksum for hardware (`CHECKSUM_PARTIAL`, the veth default) arrives with `NEEDS_CSUM` and
//!   the checksum position; writing the header back out keeps that metadata, so the receiver
//!   still gets a frame it accepts. Without it, TCP across the emulator fails silently while
//!   ping works. The header also reveals GSO super-frames, which are not wire frames.
//! - `PACKET_IGNORE_OUTGOING`: the socket does not read back the frames the emulator writes.
//! - `PACKET_QDISC_BYPASS`: frames go straight to the driver; the emulator is the queue.
//! - `SO_TIMESTAMPNS`: the kernel stamps each frame when the interface received it, so a frame
//!   that waited in the socket while the emulator's thread was not running still reaches the
//!   link when it arrived.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

const PACKET_VNET_HDR: libc::c_int = 15;
const PACKET_QDISC_BYPASS: libc::c_int = 20;
const PACKET_IGNORE_OUTGOING: libc::c_int = 23;
/// Size of `struct virtio_net_hdr` that precedes each frame.
pub const VNET_HDR_LEN: usize = 10;
/// Largest batch read or written in one system call.
pub const BATCH: usize = 64;

/// 64-bit words of control buffer per frame: one `SCM_TIMESTAMPNS` message (32 bytes).
const CONTROL_WORDS: usize = 8;

/// The `SCM_TIMESTAMPNS` stamp among `hdr`'s control messages, ns since the Unix epoch (0:
/// none).
///
/// # Safety
/// `hdr`'s control buffer must hold what the kernel wrote in it (or nothing).
unsafe fn received_at(hdr: &libc::msghdr) -> u64 {
    let mut c = libc::CMSG_FIRSTHDR(hdr);
    while !c.is_null() {
        if (*c).cmsg_level == libc::SOL_SOCKET && (*c).cmsg_type == libc::SCM_TIMESTAMPNS {
            let ts = std::ptr::read_unaligned(libc::CMSG_DATA(c) as *const libc::timespec);
            return (ts.tv_sec as u64)
                .saturating_mul(1_000_000_000)
                .saturating_add(ts.tv_nsec as u64);
        }
        c = libc::CMSG_NXTHDR(hdr, c);
    }
    0
}

/// A frame buffer with room for the virtio-net header and a maximum-size frame.
pub type FrameBuf = Box<[u8]>;

/// One interface's raw socket.
pub struct PacketSocket {
    fd: OwnedFd,
    /// Interface name.
    pub name: String,
    /// Interface MTU (largest IP packet).
    pub mtu: u32,
}

fn cvt(r: libc::c_int) -> io::Result<libc::c_int> {
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(r)
    }
}

fn setopt(fd: RawFd, level: libc::c_int, opt: libc::c_int, val: libc::c_int) -> io::Result<()> {
    // SAFETY: passes a pointer to a live c_int with its size.
    cvt(unsafe {
        libc::setsockopt(
            fd,
            level,
            opt,
            &val as *const _ as *const libc::c_void,
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    })
    .map(|_| ())
}

/// The index of interface `name` in the current network namespace, if it exists.
pub fn ifindex(name: &str) -> Option<u32> {
    let c = std::ffi::CString::new(name).ok()?;
    // SAFETY: c is a valid NUL-terminated string.
    let i = unsafe { libc::if_nametoindex(c.as_ptr()) };
    (i != 0).then_some(i)
}

/// `struct ifreq` with the one union member we use as an int or a pointer.
#[repr(C)]
pub(crate) struct IfReq {
    pub name: [libc::c_char; libc::IFNAMSIZ],
    pub data: usize,
    _pad: [u8; 16],
}

impl IfReq {
    pub(crate) fn new(name: &str) -> io::Result<IfReq> {
        if name.len() >= libc::IFNAMSIZ || name.is_empty() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("'{name}' is not a valid interface name"),
            ));
        }
        let mut r = IfReq {
            name: [0; libc::IFNAMSIZ],
            data: 0,
            _pad: [0; 16],
        };
        for (d, s) in r.name.iter_mut().zip(name.bytes()) {
            *d = s as libc::c_char;
        }
        Ok(r)
    }
}

/// Runs an interface ioctl on a throwaway datagram socket.
pub(crate) fn if_ioctl(req: libc::c_ulong, ifr: &mut IfReq) -> io::Result<()> {
    // SAFETY: plain socket creation; the fd is owned right away.
    let s = cvt(unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) })?;
    // SAFETY: s is a fresh, valid fd.
    let s = unsafe { OwnedFd::from_raw_fd(s) };
    // SAFETY: ifr is a properly laid out ifreq for the requests we issue.
    cvt(unsafe { libc::ioctl(s.as_raw_fd(), req as _, ifr as *mut IfReq) }).map(|_| ())
}

fn if_mtu(name: &str) -> io::Result<u32> {
    let mut r = IfReq::new(name)?;
    if_ioctl(libc::SIOCGIFMTU, &mut r)?;
    Ok((r.data & 0xffff_ffff) as u32)
}

impl PacketSocket {
    /// Opens and binds a raw socket on `name`.
    pub fn open(name: &str) -> io::Result<PacketSocket> {
        let idx = ifindex(name).ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::NotFound,
                format!("interface '{name}' does not exist in this network namespace"),
            )
        })?;
        let mtu = if_mtu(name)?;
        let proto = (libc::ETH_P_ALL as u16).to_be() as libc::c_int;
        // Protocol 0 until bound: no frame from another interface slips in before bind().
        // SAFETY: plain socket creation.
        let fd = cvt(unsafe {
            libc::socket(
                libc::AF_PACKET,
                libc::SOCK_RAW | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC,
                0,
            )
        })
        .map_err(|e| {
            if e.raw_os_error() == Some(libc::EPERM) {
                io::Error::new(
                    io::ErrorKind::PermissionDenied,
                    "raw sockets need root or CAP_NET_RAW",
                )
            } else {
                e
            }
        })?;
        // SAFETY: fd is fresh and valid.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        let raw = fd.as_raw_fd();
        setopt(raw, libc::SOL_PACKET, PACKET_VNET_HDR, 1)?;
        setopt(raw, libc::SOL_PACKET, PACKET_IGNORE_OUTGOING, 1)?;
        setopt(raw, libc::SOL_PACKET, PACKET_QDISC_BYPASS, 1)?;
        // Without stamps (refused), frames count from when they are read.
        let _ = setopt(raw, libc::SOL_SOCKET, libc::SO_TIMESTAMPNS, 1);
        // Deep buffers absorb bursts while the thread is busy; FORCE works as root.
        let _ = setopt(raw, libc::SOL_SOCKET, libc::SO_RCVBUFFORCE, 64 << 20)
            .or_else(|_| setopt(raw, libc::SOL_SOCKET, libc::SO_RCVBUF, 64 << 20));
        let _ = setopt(raw, libc::SOL_SOCKET, libc::SO_SNDBUFFORCE, 16 << 20)
            .or_else(|_| setopt(raw, libc::SOL_SOCKET, libc::SO_SNDBUF, 16 << 20));
        // SAFETY: zeroed sockaddr_ll is a valid starting point.
        let mut sll: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
        sll.sll_family = libc::AF_PACKET as u16;
        sll.sll_protocol = proto as u16;
        sll.sll_ifindex = idx as i32;
        // SAFETY: sll is a valid sockaddr_ll of the given size.
        cvt(unsafe {
            libc::bind(
                raw,
                &sll as *const _ as *const libc::sockaddr,
                std::mem::size_of::<libc::sockaddr_ll>() as libc::socklen_t,
            )
        })?;
        // SAFETY: zeroed packet_mreq, then filled.
        let mut mr: libc::packet_mreq = unsafe { std::mem::zeroed() };
        mr.mr_ifindex = idx as i32;
        mr.mr_type = libc::PACKET_MR_PROMISC as u16;
        // SAFETY: mr is a valid packet_mreq.
        cvt(unsafe {
            libc::setsockopt(
                raw,
                libc::SOL_PACKET,
                libc::PACKET_ADD_MEMBERSHIP,
                &mr as *const _ as *const libc::c_void,
                std::mem::size_of::<libc::packet_mreq>() as libc::socklen_t,
            )
        })?;
        Ok(PacketSocket {
            fd,
            name: name.to_string(),
            mtu,
        })
    }

    /// Raw descriptor, for polling.
    pub fn raw_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }

    /// Buffer size that holds the header plus the largest frame this interface carries.
    pub fn buf_len(&self) -> usize {
        (VNET_HDR_LEN + 14 + 4 + self.mtu as usize + 64).max(2048)
    }

    /// Reads up to `bufs.len()` frames without blocking. For each, `lens` gets the length
    /// including the virtio-net header, `oversize` whether it was truncated or a GSO frame,
    /// and `stamps` when the interface received it (ns since the Unix epoch, `CLOCK_REALTIME`;
    /// 0 where the kernel gave no stamp).
    pub fn recv_batch(
        &self,
        bufs: &mut [FrameBuf],
        lens: &mut [usize],
        oversize: &mut [bool],
        stamps: &mut [u64],
    ) -> io::Result<usize> {
        let n = bufs.len().min(BATCH);
        let mut iov: [libc::iovec; BATCH] = unsafe { std::mem::zeroed() };
        let mut msgs: [libc::mmsghdr; BATCH] = unsafe { std::mem::zeroed() };
        // Room for one SCM_TIMESTAMPNS message per frame (u64s: cmsghdr's alignment).
        let mut control = [[0u64; CONTROL_WORDS]; BATCH];
        for i in 0..n {
            iov[i] = libc::iovec {
                iov_base: bufs[i].as_mut_ptr() as *mut libc::c_void,
                iov_len: bufs[i].len(),
            };
            msgs[i].msg_hdr.msg_iov = &mut iov[i];
            msgs[i].msg_hdr.msg_iovlen = 1;
            msgs[i].msg_hdr.msg_control = control[i].as_mut_ptr() as *mut libc::c_void;
            msgs[i].msg_hdr.msg_controllen = std::mem::size_of_val(&control[i]) as _;
        }
        // SAFETY: msgs/iov point into live buffers of the stated lengths.
        let r = unsafe {
            libc::recvmmsg(
                self.raw_fd(),
                msgs.as_mut_ptr(),
                n as u32,
                libc::MSG_DONTWAIT,
                std::ptr::null_mut(),
            )
        };
        if r < 0 {
            let e = io::Error::last_os_error();
            return if e.kind() == io::ErrorKind::WouldBlock {
                Ok(0)
            } else {
                Err(e)
            };
        }
        for i in 0..r as usize {
            let len = msgs[i].msg_len as usize;
            lens[i] = len;
            let truncated = msgs[i].msg_hdr.msg_flags & libc::MSG_TRUNC != 0;
            // virtio_net_hdr.gso_type is byte 1; 0 = not a GSO frame.
            let gso = len >= VNET_HDR_LEN && bufs[i][1] != 0;
            oversize[i] = truncated || gso || len < VNET_HDR_LEN + 14;
            // SAFETY: the kernel filled msg_control within msg_controllen.
            stamps[i] = unsafe { received_at(&msgs[i].msg_hdr) };
        }
        Ok(r as usize)
    }

    /// Writes frames (each including its virtio-net header) in order. Returns how many were
    /// written and whether the next one was refused (e.g. the interface is down). The frames
    /// after those were not touched: the socket would block, or they follow a refused one.
    pub fn send_batch(&self, frames: &[&[u8]]) -> (usize, bool) {
        let n = frames.len().min(BATCH);
        let mut iov: [libc::iovec; BATCH] = unsafe { std::mem::zeroed() };
        let mut msgs: [libc::mmsghdr; BATCH] = unsafe { std::mem::zeroed() };
        for i in 0..n {
            iov[i] = libc::iovec {
                iov_base: frames[i].as_ptr() as *mut libc::c_void,
                iov_len: frames[i].len(),
            };
            msgs[i].msg_hdr.msg_iov = &mut iov[i];
            msgs[i].msg_hdr.msg_iovlen = 1;
        }
        let mut sent = 0;
        while sent < n {
            // SAFETY: as above; the kernel only reads the buffers.
            let r = unsafe {
                libc::sendmmsg(
                    self.raw_fd(),
                    msgs[sent..].as_mut_ptr(),
                    (n - sent) as u32,
                    libc::MSG_DONTWAIT,
                )
            };
            if r > 0 {
                sent += r as usize;
                continue;
            }
            let e = io::Error::last_os_error();
            return (sent, e.kind() != io::ErrorKind::WouldBlock);
        }
        (sent, false)
    }

    /// Frames the kernel dropped for this socket since the last call.
    pub fn kernel_drops(&self) -> u64 {
        let mut st = [0u32; 2];
        let mut len = std::mem::size_of_val(&st) as libc::socklen_t;
        // SAFETY: st is a tpacket_stats-sized buffer.
        let r = unsafe {
            libc::getsockopt(
                self.raw_fd(),
                libc::SOL_PACKET,
                libc::PACKET_STATISTICS,
                st.as_mut_ptr() as *mut libc::c_void,
                &mut len,
            )
        };
        if r == 0 {
            st[1] as u64
        } else {
            0
        }
    }
}
