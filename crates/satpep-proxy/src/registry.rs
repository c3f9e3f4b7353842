//! Live connections and totals, for `/metrics`, `/connections` and `satpep status`.

use crate::tcpinfo::{self, LegInfo};
use satpep_tunnel::congestion::satellite::Readings;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::os::fd::RawFd;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::Instant;

/// Totals over the proxy's life.
#[derive(Default, Debug)]
pub struct Counters {
    /// Connections accepted and not yet closed.
    pub active: AtomicU64,
    /// Connections accepted.
    pub total: AtomicU64,
    /// Connections whose server could not be reached.
    pub failed: AtomicU64,
    /// Connections whose bytes were copied through user space instead of spliced (by
    /// configuration, or because the kernel gave no pipe).
    pub copied: AtomicU64,
    /// The memory limit, bytes: the live value (a reload changes it) that admission reads.
    pub memory_limit: AtomicU64,
    /// The connection limit in force: `proxy.max_connections`, or fewer if the descriptor
    /// limit holds fewer (0: none, as at a gateway). A reload changes it.
    pub max_connections: AtomicU64,
    /// `proxy.idle_timeout` in milliseconds (0: off). A reload changes it.
    pub idle_timeout_ms: AtomicU64,
    /// Times the proxy reached its connection limit and started bypassing.
    pub overloads: AtomicU64,
    /// Client → server bytes of closed connections.
    pub bytes_up: AtomicU64,
    /// Server → client bytes of closed connections.
    pub bytes_down: AtomicU64,
    /// Retransmitted segments on the satellite legs of closed connections.
    pub retrans_satellite: AtomicU64,
    /// Retransmitted segments on the terrestrial legs of closed connections.
    pub retrans_terrestrial: AtomicU64,
    /// Tunnel connections established since start (more than one: reconnections).
    pub tunnel_connections: AtomicU64,
    /// Tunnel handshakes that failed (a peer refused, or not answering).
    pub tunnel_handshake_failures: AtomicU64,
    /// 1 while the interception rules are installed (checked every few seconds).
    pub interception_installed: AtomicU64,
    /// Times the rules were found removed and installed again.
    pub interception_reinstalls: AtomicU64,
    /// Configuration reloads (SIGHUP) applied.
    pub reloads: AtomicU64,
    /// Configuration reloads refused (an invalid file, rules that did not install).
    pub reload_failures: AtomicU64,
    /// Connections forwarded unsplit: nft's bypass counter, kept monotonic.
    pub bypassed: Monotonic,
}

/// A count read from outside the process (nft's bypass counter) as a counter that never
/// decreases: when the source cannot be read the last reading stands, and when it restarts
/// from zero (the table was reinstalled) counting goes on from what it had reached.
/// Prometheus reads any decrease as a restart and turns it into a spike in `rate()`.
#[derive(Default, Debug)]
pub struct Monotonic {
    /// (sum of the readings before the source's restarts, the source's last reading)
    state: Mutex<(u64, u64)>,
}

impl Monotonic {
    /// Takes a new reading of the source (`None`: it could not be read); the count.
    pub fn observe(&self, reading: Option<u64>) -> u64 {
        let mut s = self.state.lock().unwrap();
        if let Some(r) = reading {
            if r < s.1 {
                s.0 += s.1;
            }
            s.1 = r;
        }
        s.0 + s.1
    }
}

/// One split connection.
pub struct Conn {
    /// Registry id.
    pub id: u64,
    /// Client address.
    pub src: SocketAddr,
    /// Server address.
    pub dst: SocketAddr,
    started: Instant,
    /// Client → server bytes so far.
    pub up: AtomicU64,
    /// Server → client bytes so far.
    pub down: AtomicU64,
    /// The legs' descriptors (satellite: none for a tunnel flow, whose satellite leg is a QUIC
    /// stream), borrowed from the connection's owner, which closes the sockets only after
    /// [`Registry::remove`] has emptied this under its lock. So every use through
    /// [`Conn::with_satellite`] and [`Conn::with_terrestrial`] sees an open socket, and no
    /// descriptor is spent on duplicates (a proxy at 10 000 connections is near the
    /// descriptor limit).
    fds: Mutex<Option<(Option<RawFd>, RawFd)>>,
    /// Adaptive congestion control state of the satellite leg.
    pub adaptive: Mutex<Option<Adaptive>>,
    /// Woken to reset the connection (idle timeout).
    pub abort: tokio::sync::Notify,
    /// Bytes relayed either way when last looked at, and since when that has not changed.
    activity: Mutex<(u64, Instant)>,
}

/// What the adaptive selection knows and did for one connection.
#[derive(Debug, Clone)]
pub struct Adaptive {
    /// The path classifier.
    pub classifier: crate::adaptive::Classifier,
    /// Current class.
    pub class: Option<crate::adaptive::Class>,
    /// The leg's controller when the proxy opened it (the policy's "default").
    pub initial_cc: String,
    /// When the controller last changed (or the connection began).
    pub since: Instant,
    /// Switches made.
    pub switches: u32,
    /// Why the current controller was chosen.
    pub reason: String,
}

/// The adaptive selection as `satpep status` shows it.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct AdaptiveStatus {
    /// Path class (Table 4.2 name).
    pub class: String,
    /// Controller switches so far.
    pub switches: u32,
    /// Why the current controller was chosen.
    pub reason: String,
}

impl Conn {
    /// Time since the split.
    pub fn age(&self) -> std::time::Duration {
        self.started.elapsed()
    }

    /// How long no byte has moved either way (as of this call).
    pub fn idle(&self) -> std::time::Duration {
        let total = self.up.load(Relaxed) + self.down.load(Relaxed);
        let mut a = self.activity.lock().unwrap();
        if a.0 != total {
            *a = (total, Instant::now());
        }
        a.1.elapsed()
    }

    /// Runs `f` on the satellite leg's socket (for TCP_INFO and TCP_CONGESTION) while the
    /// connection is live; `None` for a tunnel flow or once it is closed.
    pub fn with_satellite<T>(&self, f: impl FnOnce(RawFd) -> T) -> Option<T> {
        let fds = self.fds.lock().unwrap();
        fds.and_then(|(sat, _)| sat).map(f)
    }

    /// Runs `f` on the terrestrial leg's socket while the connection is live.
    pub fn with_terrestrial<T>(&self, f: impl FnOnce(RawFd) -> T) -> Option<T> {
        let fds = self.fds.lock().unwrap();
        fds.map(|(_, ter)| f(ter))
    }
}

/// A connection as `satpep status` shows it.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct ConnStatus {
    /// Registry id.
    pub id: u64,
    /// Client address.
    pub src: String,
    /// Server address.
    pub dst: String,
    /// Seconds since the split.
    pub age_s: f64,
    /// Client → server bytes relayed.
    pub bytes_up: u64,
    /// Server → client bytes relayed.
    pub bytes_down: u64,
    /// The satellite leg's TCP_INFO.
    pub satellite: Option<LegInfo>,
    /// The terrestrial leg's TCP_INFO.
    pub terrestrial: Option<LegInfo>,
    /// Adaptive selection, when the satellite leg is adaptive.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub adaptive: Option<AdaptiveStatus>,
}

/// What this proxy is, which decides the figures it exports (a split proxy has no tunnel,
/// a gateway many).
#[derive(Default, Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Split mode: no tunnel.
    #[default]
    Split,
    /// A tunnel's terminal: one tunnel, to its gateway.
    Terminal,
    /// A tunnel's gateway: one tunnel per connected terminal, none while all are quiet.
    Gateway,
}

/// A live tunnel connection: the QUIC connection, its controller's readings, the peer's name
/// and the flows it carries.
#[derive(Clone)]
pub struct Tunnel {
    /// The connection.
    pub conn: quinn::Connection,
    /// What its satellite controller publishes.
    pub readings: Arc<Readings>,
    /// The peer by its certificate: at a gateway the terminal's name and serial (what a
    /// reload checks), at a terminal the gateway's name (`tunnel.peer_name`; no serial).
    /// The name is stable across reconnections, unlike the address.
    pub id: satpep_tunnel::admission::PeerId,
    /// Flows it carries now (a gateway's count per terminal; `None` at a terminal, whose one
    /// tunnel carries every live connection).
    pub flows: Option<Arc<AtomicU64>>,
}

impl Tunnel {
    /// The peer's address without its port (a terminal's changes at every reconnection)
    /// and, for an IPv4 peer of the dual-stack socket, without its `::ffff:` prefix.
    pub fn peer_ip(&self) -> std::net::IpAddr {
        self.conn.remote_address().ip().to_canonical()
    }

    /// The flows it carries now; at a terminal, every live connection of `reg`.
    pub fn flows_now(&self, reg: &Registry) -> u64 {
        self.flows
            .as_ref()
            .map_or(reg.live().len() as u64, |n| n.load(Relaxed))
    }
}

/// Live connections plus totals.
#[derive(Default)]
pub struct Registry {
    /// What this proxy is.
    pub mode: Mode,
    next: AtomicU64,
    conns: Mutex<BTreeMap<u64, Arc<Conn>>>,
    /// Live tunnel connections, for `/metrics` and `/connections`.
    tunnels: Mutex<Vec<Tunnel>>,
    /// A split gateway's terminals on its shared carrier, as the last share computation saw
    /// them (`crate::share`), for `/metrics` and `/connections`.
    carrier: Mutex<Vec<CarrierTerminal>>,
    /// Totals.
    pub counters: Counters,
    /// A leader's worker processes' page (`proxy.workers`): their figures join this
    /// process's in `/metrics` and `/connections`.
    pub workers: std::sync::OnceLock<Arc<crate::workers::Shared>>,
}

/// One terminal of a split gateway's shared carrier (`[proxy.carrier]`) at the last share
/// computation: its connections, what they send, its share, and its totals since the proxy
/// started (connections gone included).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct CarrierTerminal {
    /// Its name: a `[proxy.carrier.terminal.NAME]`, or its clients' /24 or /64 prefix.
    pub name: String,
    /// Its live connections (each a satellite leg from this gateway).
    pub flows: u64,
    /// Those that sent lately or wait with data in flight: the ones sharing its share.
    pub busy: u64,
    /// What they send, bits/s of carrier (frames with their headers), smoothed over about
    /// 200 ms.
    pub sending_bps: u64,
    /// Its share of the carrier now, bits/s of carrier (0 while it is quiet).
    pub share_bps: u64,
    /// TCP payload its clients acknowledged since the proxy started, bytes.
    pub acked_bytes: u64,
    /// Segments its connections retransmitted since the proxy started.
    pub retransmitted: u64,
    /// The mean smoothed RTT of its busy connections, ms (0: none busy).
    pub rtt_ms: f64,
}

impl Registry {
    /// An empty registry for a proxy of `mode`.
    pub fn new(mode: Mode) -> Self {
        Registry {
            mode,
            ..Default::default()
        }
    }

    /// The shared carrier's terminals as the last share computation saw them (none where
    /// no carrier is shared).
    pub fn carrier(&self) -> Vec<CarrierTerminal> {
        self.carrier.lock().unwrap().clone()
    }

    /// Replaces the shared carrier's terminals (the share computation, every time).
    pub fn set_carrier(&self, terminals: Vec<CarrierTerminal>) {
        *self.carrier.lock().unwrap() = terminals;
    }

    /// A tunnel connection came up.
    pub fn tunnel_up(&self, t: Tunnel) {
        self.counters.tunnel_connections.fetch_add(1, Relaxed);
        self.tunnels.lock().unwrap().push(t);
    }

    /// A tunnel connection closed.
    pub fn tunnel_down(&self, c: &quinn::Connection) {
        let id = c.stable_id();
        self.tunnels
            .lock()
            .unwrap()
            .retain(|t| t.conn.stable_id() != id);
    }

    /// Live tunnel connections.
    pub fn tunnels(&self) -> Vec<Tunnel> {
        self.tunnels.lock().unwrap().clone()
    }

    /// Records a new split connection with its two legs' descriptors (a tunnel flow has no
    /// satellite socket). The caller must [`Registry::remove`] it before closing them.
    pub fn add(
        &self,
        src: SocketAddr,
        dst: SocketAddr,
        satellite: Option<RawFd>,
        terrestrial: RawFd,
    ) -> Arc<Conn> {
        let id = self.next.fetch_add(1, Relaxed) + 1;
        let c = Arc::new(Conn {
            id,
            src,
            dst,
            started: Instant::now(),
            up: AtomicU64::new(0),
            down: AtomicU64::new(0),
            fds: Mutex::new(Some((satellite, terrestrial))),
            adaptive: Mutex::new(None),
            abort: tokio::sync::Notify::new(),
            activity: Mutex::new((0, Instant::now())),
        });
        self.conns.lock().unwrap().insert(id, c.clone());
        c
    }

    /// Forgets a closed connection, folding its figures into the totals. The fold and the
    /// removal happen under the map's lock, which every reader of a total ([`Registry::relayed`],
    /// [`Registry::status_and_retransmitted`]) also holds: a scrape in between would otherwise count the
    /// connection twice or not at all, and a counter that goes back reads as a restart.
    pub fn remove(&self, c: &Conn) {
        let mut conns = self.conns.lock().unwrap();
        let k = &self.counters;
        k.bytes_up.fetch_add(c.up.load(Relaxed), Relaxed);
        k.bytes_down.fetch_add(c.down.load(Relaxed), Relaxed);
        if let Some(i) = c.with_satellite(tcpinfo::read).flatten() {
            k.retrans_satellite
                .fetch_add(i.total_retrans as u64, Relaxed);
        }
        if let Some(i) = c.with_terrestrial(tcpinfo::read).flatten() {
            k.retrans_terrestrial
                .fetch_add(i.total_retrans as u64, Relaxed);
        }
        conns.remove(&c.id);
        drop(conns);
        // From here the owner may close the sockets.
        *c.fds.lock().unwrap() = None;
    }

    /// Connections forwarded unsplit since start (reads nft's counter: a process).
    pub fn bypassed(&self) -> u64 {
        self.counters
            .bypassed
            .observe(crate::netfilter::bypassed().ok())
    }

    /// Resets every connection idle for `limit` or more; returns how many.
    pub fn reset_idle(&self, limit: std::time::Duration) -> usize {
        let conns = self.conns.lock().unwrap();
        let mut n = 0;
        for c in conns.values() {
            if c.idle() >= limit {
                c.abort.notify_one();
                n += 1;
            }
        }
        n
    }

    /// The live connections.
    pub fn live(&self) -> Vec<Arc<Conn>> {
        self.conns.lock().unwrap().values().cloned().collect()
    }

    /// Bytes relayed since start, (up, down): those of closed connections plus the live
    /// ones' counts so far.
    pub fn relayed(&self) -> (u64, u64) {
        let k = &self.counters;
        let conns = self.conns.lock().unwrap();
        let live = |f: fn(&Conn) -> u64| conns.values().map(|c| f(c)).sum::<u64>();
        (
            k.bytes_up.load(Relaxed) + live(|c| c.up.load(Relaxed)),
            k.bytes_down.load(Relaxed) + live(|c| c.down.load(Relaxed)),
        )
    }

    /// Every live connection with both legs' TCP_INFO.
    /// Every live connection with both legs' TCP_INFO, and on a satellite leg that runs
    /// `satpep_sat` the model it holds (what `/connections` shows).
    pub fn status(&self) -> Vec<ConnStatus> {
        // Through the controller's pinned iterator: this proxy has dropped the right to call
        // bpf(), and a missing or unreadable pin only leaves the models out.
        let states = satpep_cc::ModelStates::read_pinned()
            .inspect_err(|e| tracing::debug!("satellite models: {e}"))
            .ok();
        self.list(states.as_ref()).0
    }

    /// Every live connection with both legs' TCP_INFO, and the segments retransmitted since
    /// start per leg (satellite, terrestrial): those of closed connections plus the live
    /// ones' so far. One pass under the map's lock: each socket's TCP_INFO is read once per
    /// scrape, and the totals agree with the list (see [`Registry::remove`]).
    pub fn status_and_retransmitted(&self) -> (Vec<ConnStatus>, (u64, u64)) {
        self.list(None)
    }

    /// [`Registry::status_and_retransmitted`], with the satellite legs' models read from
    /// `models` when given.
    fn list(&self, models: Option<&satpep_cc::ModelStates>) -> (Vec<ConnStatus>, (u64, u64)) {
        let k = &self.counters;
        let conns = self.conns.lock().unwrap();
        let (mut sat, mut ter) = (
            k.retrans_satellite.load(Relaxed),
            k.retrans_terrestrial.load(Relaxed),
        );
        let live = conns
            .values()
            .map(|c| {
                let satellite = c
                    .with_satellite(|fd| {
                        let mut i = tcpinfo::read(fd)?;
                        if i.congestion == "satpep_sat" {
                            i.model = models.and_then(|m| tcpinfo::model(m, fd));
                        }
                        Some(i)
                    })
                    .flatten();
                let terrestrial = c.with_terrestrial(tcpinfo::read).flatten();
                sat += satellite.as_ref().map_or(0, |i| i.total_retrans as u64);
                ter += terrestrial.as_ref().map_or(0, |i| i.total_retrans as u64);
                ConnStatus {
                    id: c.id,
                    src: c.src.to_string(),
                    dst: c.dst.to_string(),
                    age_s: c.started.elapsed().as_secs_f64(),
                    bytes_up: c.up.load(Relaxed),
                    bytes_down: c.down.load(Relaxed),
                    satellite,
                    terrestrial,
                    adaptive: c.adaptive.lock().unwrap().as_ref().map(|a| AdaptiveStatus {
                        class: a.class.map(|k| k.name()).unwrap_or("").into(),
                        switches: a.switches,
                        reason: a.reason.clone(),
                    }),
                }
            })
            .collect();
        (live, (sat, ter))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_outside_count_never_goes_back() {
        let m = Monotonic::default();
        assert_eq!(m.observe(Some(3)), 3);
        // nft could not be read: the last count stands, not 0.
        assert_eq!(m.observe(None), 3);
        assert_eq!(m.observe(Some(5)), 5);
        // The table was reinstalled and its counter starts again.
        assert_eq!(m.observe(Some(0)), 5);
        assert_eq!(m.observe(Some(2)), 7);
        assert_eq!(m.observe(None), 7);
    }

    /// Connections come and go on other threads while totals are read: no read is smaller
    /// than the one before it.
    #[test]
    fn totals_never_decrease_while_connections_close() {
        let reg = Arc::new(Registry::default());
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let workers: Vec<_> = (0..2)
            .map(|w| {
                let (reg, stop) = (reg.clone(), stop.clone());
                std::thread::spawn(move || {
                    let addr: SocketAddr = format!("198.18.0.{}:80", w + 1).parse().unwrap();
                    let mut n = 0u64;
                    while !stop.load(Relaxed) {
                        // -1: no socket; the legs' TCP_INFO reads find none.
                        let c = reg.add(addr, addr, None, -1);
                        c.up.fetch_add(1000, Relaxed);
                        c.down.fetch_add(7, Relaxed);
                        reg.remove(&c);
                        n += 1;
                    }
                    n
                })
            })
            .collect();
        let mut last = (0, 0);
        let t = Instant::now();
        let mut reads = 0;
        while t.elapsed() < std::time::Duration::from_millis(500) {
            let now = reg.relayed();
            assert!(
                now.0 >= last.0 && now.1 >= last.1,
                "relayed went back: {last:?} -> {now:?} after {reads} reads"
            );
            last = now;
            reads += 1;
        }
        stop.store(true, Relaxed);
        let closed: u64 = workers.into_iter().map(|w| w.join().unwrap()).sum();
        assert_eq!(reg.relayed(), (closed * 1000, closed * 7));
    }
}
