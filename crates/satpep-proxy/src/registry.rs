//! Live connections and totals, for `/metrics`, `/connections` and `satpep status`.

use crate::tcpinfo::{self, LegInfo};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::os::fd::{AsRawFd, OwnedFd};
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
    /// The memory limit, bytes (for `/metrics`).
    pub memory_limit: AtomicU64,
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
    /// None for a tunnel flow: its satellite leg is a QUIC stream.
    satellite: Option<OwnedFd>,
    terrestrial: OwnedFd,
    /// Adaptive congestion control state of the satellite leg.
    pub adaptive: Mutex<Option<Adaptive>>,
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

    /// The satellite leg's descriptor (a duplicate; for TCP_INFO and TCP_CONGESTION); none
    /// for a tunnel flow.
    pub fn satellite_fd(&self) -> Option<std::os::fd::RawFd> {
        self.satellite.as_ref().map(|f| f.as_raw_fd())
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

/// Live connections plus totals.
#[derive(Default)]
pub struct Registry {
    next: AtomicU64,
    conns: Mutex<BTreeMap<u64, Arc<Conn>>>,
    /// Totals.
    pub counters: Counters,
}

impl Registry {
    /// Records a new split connection; `satellite` and `terrestrial` are duplicates of the
    /// two legs' descriptors (kept only to read TCP_INFO); a tunnel flow has no satellite
    /// socket.
    pub fn add(
        &self,
        src: SocketAddr,
        dst: SocketAddr,
        satellite: Option<OwnedFd>,
        terrestrial: OwnedFd,
    ) -> Arc<Conn> {
        let id = self.next.fetch_add(1, Relaxed) + 1;
        let c = Arc::new(Conn {
            id,
            src,
            dst,
            started: Instant::now(),
            up: AtomicU64::new(0),
            down: AtomicU64::new(0),
            satellite,
            terrestrial,
            adaptive: Mutex::new(None),
        });
        self.conns.lock().unwrap().insert(id, c.clone());
        c
    }

    /// Forgets a closed connection, folding its figures into the totals.
    pub fn remove(&self, c: &Conn) {
        self.conns.lock().unwrap().remove(&c.id);
        let k = &self.counters;
        k.bytes_up.fetch_add(c.up.load(Relaxed), Relaxed);
        k.bytes_down.fetch_add(c.down.load(Relaxed), Relaxed);
        if let Some(i) = c.satellite_fd().and_then(tcpinfo::read) {
            k.retrans_satellite
                .fetch_add(i.total_retrans as u64, Relaxed);
        }
        if let Some(i) = tcpinfo::read(c.terrestrial.as_raw_fd()) {
            k.retrans_terrestrial
                .fetch_add(i.total_retrans as u64, Relaxed);
        }
    }

    /// Makes every live connection's sockets send RST when closed; returns how many.
    pub fn reset_all(&self) -> usize {
        let conns = self.conns.lock().unwrap();
        for c in conns.values() {
            for fd in c.satellite.iter().chain([&c.terrestrial]) {
                crate::sockets::reset_on_close(socket2::SockRef::from(fd));
            }
        }
        conns.len()
    }

    /// The live connections.
    pub fn live(&self) -> Vec<Arc<Conn>> {
        self.conns.lock().unwrap().values().cloned().collect()
    }

    /// Every live connection with both legs' TCP_INFO.
    pub fn status(&self) -> Vec<ConnStatus> {
        let conns: Vec<Arc<Conn>> = self.conns.lock().unwrap().values().cloned().collect();
        conns
            .iter()
            .map(|c| ConnStatus {
                id: c.id,
                src: c.src.to_string(),
                dst: c.dst.to_string(),
                age_s: c.started.elapsed().as_secs_f64(),
                bytes_up: c.up.load(Relaxed),
                bytes_down: c.down.load(Relaxed),
                satellite: c.satellite_fd().and_then(tcpinfo::read),
                terrestrial: tcpinfo::read(c.terrestrial.as_raw_fd()),
                adaptive: c.adaptive.lock().unwrap().as_ref().map(|a| AdaptiveStatus {
                    class: a.class.map(|k| k.name()).unwrap_or("").into(),
                    switches: a.switches,
                    reason: a.reason.clone(),
                }),
            })
            .collect()
    }
}
