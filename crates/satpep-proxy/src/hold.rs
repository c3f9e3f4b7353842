//! The strict handshake: a client's SYN is held until the server has answered the proxy's
//! own SYN, so the client sees the server's answer (Bharadwaj 1999 §3.2).
//!
//! nftables marks selected new SYNs HOLD; an xtables rule queues HOLD-marked packets to
//! NFQUEUE (with `--queue-bypass`: if nobody listens they pass). Here a thread reads each held
//! SYN, starts the upstream connect from the client's address, and when it completes re-injects
//! the SYN (`NF_REPEAT`) with a verdict mark:
//! - connected: the local mark, and the SYN meets the TPROXY rule; the listener's accept then
//!   takes the ready upstream socket from [`Holder::take`];
//! - refused: the SYN is rejected in `forward` with a TCP reset, as the server did;
//! - unreachable or no answer within the connect timeout: rejected with ICMP host-unreachable.
//!
//! While a SYN is held, the client's retransmissions of it are dropped. The upstream leg lives
//! in its own conntrack zone, or its SYN (same addresses as the client's) would clash with the
//! held SYN's conntrack entry and the kernel would drop the re-injected SYN.

use crate::netfilter::Marks;
use crate::registry::Counters;
use socket2::SockRef;
use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::net::TcpStream;
use tracing::{debug, warn};

/// (client, server) of a connection.
pub type Key = (SocketAddr, SocketAddr);

/// How long a connected upstream socket waits for its client's accept before it is reset.
const ACCEPT_WAIT: Duration = Duration::from_secs(10);

/// Most SYNs held, plus upstream connections made for them and not yet taken, at once. Each
/// costs a connection to the server, so without a cap a flood of spoofed SYNs would become as
/// many connections to the servers (each kept for ACCEPT_WAIT); past it, SYNs go on unheld and
/// meet the fast handshake (the kernel's SYN cookies).
pub const MAX_HELD: usize = 1024;

/// An upstream made for a held SYN.
pub enum Ready {
    /// A connected TCP socket (split mode).
    Tcp(TcpStream),
    /// A tunnel flow the gateway answered "connected" (distributed mode).
    Flow(crate::tunnel::Flow),
}

impl Ready {
    fn reset(self) {
        match self {
            Ready::Tcp(s) => crate::sockets::reset_on_close(SockRef::from(&s)),
            Ready::Flow(mut f) => {
                let _ = f.send.reset(crate::tunnel::CODE_RESET);
                let _ = f.recv.stop(crate::tunnel::CODE_RESET);
            }
        }
    }
}

/// Where held SYNs' connections go.
#[derive(Clone)]
pub enum Upstream {
    /// Straight to the server, on the connecting leg as the last reload left it.
    Tcp(tokio::sync::watch::Receiver<crate::lifecycle::Legs>),
    /// Through the tunnel.
    Tunnel(Arc<crate::tunnel::Terminal>),
}

/// Upstream connections made for held SYNs, waiting for the listener to accept their clients.
#[derive(Default)]
pub struct Holder {
    ready: Mutex<HashMap<Key, Ready>>,
    stop: AtomicBool,
}

impl Holder {
    /// The connected upstream for `key`, if its SYN was held.
    pub fn take(&self, key: &Key) -> Option<Ready> {
        self.ready.lock().unwrap().remove(key)
    }

    /// Upstream connections made and not yet taken by their clients.
    fn waiting(&self) -> usize {
        self.ready.lock().unwrap().len()
    }

    /// Ends the queue thread; held SYNs are dropped (the clients retransmit them).
    pub fn stop(&self) {
        self.stop.store(true, Relaxed);
    }
}

/// The client and server of a queued IPv4 or IPv6 TCP packet.
pub fn parse(p: &[u8]) -> Option<Key> {
    let (src, dst, tcp): (IpAddr, IpAddr, &[u8]) = match p.first()? >> 4 {
        4 => {
            let ihl = (p[0] & 0x0f) as usize * 4;
            if ihl < 20 || p.len() < ihl + 4 || p[9] != 6 {
                return None;
            }
            let a: [u8; 4] = p[12..16].try_into().ok()?;
            let b: [u8; 4] = p[16..20].try_into().ok()?;
            (a.into(), b.into(), &p[ihl..])
        }
        6 => {
            // Extension headers before TCP are not expected on a SYN; such a packet passes.
            if p.len() < 44 || p[6] != 6 {
                return None;
            }
            let a: [u8; 16] = p[8..24].try_into().ok()?;
            let b: [u8; 16] = p[24..40].try_into().ok()?;
            (a.into(), b.into(), &p[40..])
        }
        _ => return None,
    };
    let sport = u16::from_be_bytes([tcp[0], tcp[1]]);
    let dport = u16::from_be_bytes([tcp[2], tcp[3]]);
    Some((SocketAddr::new(src, sport), SocketAddr::new(dst, dport)))
}

/// Opens queue `num` and starts the thread that holds SYNs. Connects run on `rt`.
pub fn start(
    num: u16,
    mark: u32,
    leg: Upstream,
    connect_timeout: Duration,
    counters: Arc<crate::registry::Registry>,
    rt: tokio::runtime::Handle,
) -> Result<Arc<Holder>, String> {
    let err = |e: std::io::Error| format!("proxy.queue: cannot use NFQUEUE {num}: {e}");
    let mut q = nfq::Queue::open().map_err(err)?;
    q.bind(num).map_err(err)?;
    // Headers are all we read.
    q.set_copy_range(num, 128).map_err(err)?;
    // A full queue lets SYNs pass (to be split the fast way) instead of dropping them.
    q.set_fail_open(num, true).map_err(err)?;
    q.set_queue_max_len(num, 4096).map_err(err)?;
    q.set_nonblocking(true);
    let holder = Arc::new(Holder::default());
    let h = holder.clone();
    std::thread::Builder::new()
        .name("satpep-hold".into())
        .spawn(move || run(q, h, Marks::new(mark), leg, connect_timeout, counters, rt))
        .map_err(|e| format!("cannot start the SYN queue thread: {e}"))?;
    Ok(holder)
}

/// Outcome of one upstream connect, as the verdict mark of its held SYN.
type Outcome = (Key, u32);

fn run(
    mut q: nfq::Queue,
    holder: Arc<Holder>,
    marks: Marks,
    leg: Upstream,
    timeout: Duration,
    reg: Arc<crate::registry::Registry>,
    rt: tokio::runtime::Handle,
) {
    let (tx, rx) = mpsc::channel::<Outcome>();
    let mut held: HashMap<Key, nfq::Message> = HashMap::new();
    let (mut overflow, mut last_warn) = (0u64, std::time::Instant::now() - Duration::from_secs(10));
    while !holder.stop.load(Relaxed) {
        let mut busy = false;
        // Verdicts must go out on the socket the packets came from, so from this thread.
        while let Ok((key, mark)) = rx.try_recv() {
            busy = true;
            if let Some(mut m) = held.remove(&key) {
                m.set_nfmark(mark);
                m.set_verdict(nfq::Verdict::Repeat);
                if let Err(e) = q.verdict(m) {
                    warn!(error = %e, "cannot release a held SYN");
                }
            }
        }
        match q.recv() {
            Ok(mut m) => {
                busy = true;
                match parse(m.get_payload()) {
                    Some(key) if held.contains_key(&key) => {
                        // The client retransmitted a SYN we still hold.
                        m.set_verdict(nfq::Verdict::Drop);
                        let _ = q.verdict(m);
                    }
                    Some(_) if held.len() + holder.waiting() >= MAX_HELD => {
                        m.set_verdict(nfq::Verdict::Accept);
                        let _ = q.verdict(m);
                        overflow += 1;
                        if last_warn.elapsed() > Duration::from_secs(5) {
                            warn!(
                                held = held.len(),
                                unheld = overflow,
                                "too many SYNs held (a flood?): new ones take the fast handshake"
                            );
                            last_warn = std::time::Instant::now();
                        }
                    }
                    Some(key) => {
                        held.insert(key, m);
                        let (tx, leg, holder, reg) =
                            (tx.clone(), leg.clone(), holder.clone(), reg.clone());
                        let marks = Marks::new(marks.local);
                        rt.spawn(async move {
                            let mark = connect(key, &leg, &marks, timeout, &holder, &reg).await;
                            let _ = tx.send((key, mark));
                        });
                    }
                    None => {
                        // Not something we can hold: it goes on to be split the fast way.
                        m.set_verdict(nfq::Verdict::Accept);
                        let _ = q.verdict(m);
                    }
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            Err(e) => {
                warn!(error = %e, "reading the SYN queue failed");
                std::thread::sleep(Duration::from_millis(100));
            }
        }
        if !busy {
            // nfq gives no descriptor to poll; 1 ms is small next to any handshake.
            std::thread::sleep(Duration::from_millis(1));
        }
    }
}

/// Connects upstream for a held SYN; returns the verdict mark.
async fn connect(
    key: Key,
    leg: &Upstream,
    marks: &Marks,
    timeout: Duration,
    holder: &Arc<Holder>,
    reg: &crate::registry::Registry,
) -> u32 {
    let (src, dst) = key;
    let attempt = async {
        match leg {
            Upstream::Tcp(legs) => {
                let leg = legs.borrow().1.clone();
                let sock = crate::sockets::upstream(src, &leg, marks.upstream)?;
                tokio::net::TcpSocket::from_std_stream(sock.into())
                    .connect(dst)
                    .await
                    .map(Ready::Tcp)
            }
            Upstream::Tunnel(t) => t.open_strict(src, dst).await.map(Ready::Flow),
        }
    };
    let c: &Counters = &reg.counters;
    match tokio::time::timeout(timeout, attempt).await {
        Ok(Ok(stream)) => {
            // Unclaimed when the proxy stops or dies: a reset, not a FIN (and no orphan).
            if let Ready::Tcp(s) = &stream {
                crate::sockets::arm(SockRef::from(s));
            }
            holder.ready.lock().unwrap().insert(key, stream);
            // A client that gave up meanwhile never comes to take it.
            let holder = holder.clone();
            tokio::spawn(async move {
                tokio::time::sleep(ACCEPT_WAIT).await;
                if let Some(r) = holder.take(&key) {
                    r.reset();
                }
            });
            marks.local
        }
        Ok(Err(e)) if e.kind() == std::io::ErrorKind::ConnectionRefused => {
            c.total.fetch_add(1, Relaxed);
            c.failed.fetch_add(1, Relaxed);
            debug!(target: crate::CONNECTION_LOG, %src, %dst, "server refused; refusing the client");
            marks.refused
        }
        Ok(Err(e)) => {
            c.total.fetch_add(1, Relaxed);
            c.failed.fetch_add(1, Relaxed);
            debug!(target: crate::CONNECTION_LOG, %src, %dst, error = %e, "server unreachable; client gets host-unreachable");
            marks.unreachable
        }
        Err(_) => {
            c.total.fetch_add(1, Relaxed);
            c.failed.fetch_add(1, Relaxed);
            debug!(target: crate::CONNECTION_LOG, %src, %dst, "server did not answer; client gets host-unreachable");
            marks.unreachable
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_v4_and_v6_syns() {
        let mut v4 = vec![
            0x45u8, 0, 0, 44, 0, 0, 0, 0, 64, 6, 0, 0, 198, 18, 1, 2, 198, 18, 3, 2,
        ];
        v4.extend([0x1f, 0x90, 0x00, 0x50]);
        assert_eq!(
            parse(&v4),
            Some((
                "198.18.1.2:8080".parse().unwrap(),
                "198.18.3.2:80".parse().unwrap()
            ))
        );
        let mut v6 = vec![0x60u8, 0, 0, 0, 0, 20, 6, 64];
        v6.extend(
            "2001:2:0:1::2"
                .parse::<std::net::Ipv6Addr>()
                .unwrap()
                .octets(),
        );
        v6.extend(
            "2001:2:0:3::2"
                .parse::<std::net::Ipv6Addr>()
                .unwrap()
                .octets(),
        );
        v6.extend([0x1f, 0x90, 0x00, 0x50]);
        assert_eq!(
            parse(&v6),
            Some((
                "[2001:2:0:1::2]:8080".parse().unwrap(),
                "[2001:2:0:3::2]:80".parse().unwrap()
            ))
        );
        // UDP, truncated, garbage: not held.
        v4[9] = 17;
        assert_eq!(parse(&v4), None);
        assert_eq!(parse(&[0x45, 0]), None);
        assert_eq!(parse(&[]), None);
    }
}
