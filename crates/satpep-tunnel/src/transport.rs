//! The QUIC transport across the hop, sized for a long fat link. quinn's defaults (12 KB
//! initial window, 1.25 MB stream window, 10 MB send window… for a 100 Mbit/s, 600 ms hop
//! whose BDP is 7.5 MB) would cap throughput far below the link; here every window comes from
//! the configured rate × RTT, and the idle timeout from how long an outage flows survive.

use crate::congestion::stop::StopSwitch;
use crate::congestion::{factory, Algorithm, HopInfo, Shared};
use crate::pacing::PacedSocket;
use std::sync::Arc;
use std::time::Duration;

/// The hop as configured at one end.
#[derive(Debug, Clone, Copy)]
pub struct Hop {
    /// This side's sending rate, bits per second, if known.
    pub send_rate: Option<u64>,
    /// The peer's sending rate (what this side receives), bits per second, if known.
    pub receive_rate: Option<u64>,
    /// Round-trip time.
    pub rtt: Duration,
    /// How long the hop may be silent before the tunnel (and its flows) is given up.
    pub outage: Duration,
    /// Congestion control of this side's sending direction.
    pub congestion: Algorithm,
    /// Flows the peer may open at once (streams): the proxy's connection limit. quinn keeps
    /// a slot for every stream the peer may open from the handshake on (about 50 bytes each),
    /// so a hub's gateway holds this many per terminal: 100 000 took 5.3 MB per tunnel.
    pub max_flows: u64,
}

/// Smallest flow-control window, whatever the rate (a fast terrestrial burst must fit).
const MIN_WINDOW: u64 = 4 << 20;

/// Smallest send window of a terminal held to its share of a hub's carrier: what the share
/// holds back waits in it, and what still waits when the terminal's flows end keeps its
/// share busy after them (4 MiB at a 5.7 Mbit/s share is 6 s); a terminal whose share grows
/// gets a larger window within 200 ms.
const SHARED_MIN_WINDOW: u64 = 256 << 10;

/// Flow-control windows in bandwidth-delay products. A lost packet holds a stream's left
/// edge for at least one more RTT while the sender goes on, and a lost retransmission for
/// another: at a packet loss rate of 10 % (BER 1e-5) the window must cover 3 RTTs or more.
pub const WINDOW_BDPS: u64 = 4;

fn bdp(rate_bps: Option<u64>, rtt: Duration) -> u64 {
    rate_bps.map_or(0, |r| (r as u128 * rtt.as_nanos() / 8_000_000_000) as u64)
}

impl Hop {
    /// Bytes this side may have buffered and not had acknowledged: eight BDPs and at least
    /// 4 MiB; 64 MiB without a known rate (a 50 Mbit/s GEO hop at BER 1e-6 needs more than
    /// 16: 4 MiB held it to about 55 %). quinn frees a stream's sent data only up to its
    /// oldest unacknowledged byte, and on a lossy hop a packet lost twice holds that byte
    /// for three RTTs.
    pub fn send_window(&self) -> u64 {
        match self.send_rate {
            Some(_) => (2 * WINDOW_BDPS * bdp(self.send_rate, self.rtt)).max(MIN_WINDOW),
            None => 64 << 20,
        }
    }

    /// The send window of a connection held to `bytes_per_s` (a hub's share of the carrier)
    /// over a path of `rtt`: eight of its BDPs and at least 256 KiB, never above
    /// [`Hop::send_window`]. Data a share holds back waits in this window, so a gateway's
    /// memory per terminal follows its share instead of the whole hop's rate.
    pub fn send_window_at(&self, bytes_per_s: u64, rtt: Duration) -> u64 {
        (2 * WINDOW_BDPS * bdp(Some(bytes_per_s.saturating_mul(8)), rtt))
            .max(SHARED_MIN_WINDOW)
            .min(self.send_window())
    }

    /// Bytes the peer may send ahead of this side's reading, per stream: four BDPs (see
    /// [`WINDOW_BDPS`]), at least 4 MiB (32 MiB without a known rate), so one flow alone
    /// can fill the hop.
    pub fn stream_window(&self) -> u64 {
        match self.receive_rate {
            Some(_) => (WINDOW_BDPS * bdp(self.receive_rate, self.rtt)).max(MIN_WINDOW),
            None => 32 << 20,
        }
    }

    /// The same on the whole connection: four stream windows. quinn counts data against it
    /// as soon as the sender buffers it, so it must stay above the sender's own send window
    /// (eight BDPs): otherwise a bulk flow's buffered data takes all the credit and an
    /// interactive flow's bytes wait for the next window update, an RTT or more.
    pub fn receive_window(&self) -> u64 {
        4 * self.stream_window()
    }

    /// Most bytes of one stream held behind a hole (see [`crate::reorder`]): eight stream
    /// windows, at least 64 MiB. Only a peer that never repairs a hole gets there.
    pub fn reorder_limit(&self) -> usize {
        (8 * self.stream_window())
            .max(64 << 20)
            .min(usize::MAX as u64) as usize
    }

    /// UDP socket buffer bytes: a BDP of either direction, at least 8 MiB, so a burst of
    /// paced datagrams or acknowledgements is not dropped by the host itself.
    pub fn socket_buffer(&self) -> usize {
        bdp(self.send_rate, self.rtt)
            .max(bdp(self.receive_rate, self.rtt))
            .clamp(8 << 20, 1 << 30) as usize
    }

    /// quinn's transport configuration for one connection across this hop; its controller
    /// shares `shared` with the endpoint (a pace, a path memory).
    pub fn transport(&self, switch: &StopSwitch, shared: Shared) -> quinn::TransportConfig {
        let mut t = quinn::TransportConfig::default();
        let var = |v: u64| quinn::VarInt::from_u64(v).unwrap_or(quinn::VarInt::MAX);
        t.stream_receive_window(var(self.stream_window()))
            .receive_window(var(self.receive_window()))
            .send_window(self.send_window())
            // Flows are opened by the terminal; each is one bidirectional stream.
            .max_concurrent_bidi_streams(var(self.max_flows.max(1)))
            .max_concurrent_uni_streams(var(0))
            .initial_rtt(self.rtt)
            // The connection survives an outage of `outage`; keep-alives keep a quiet
            // connection from timing out and give the satellite controller its probes.
            .max_idle_timeout(Some(
                quinn::IdleTimeout::try_from(self.outage + Duration::from_secs(5))
                    .expect("outage is bounded by the config"),
            ))
            .keep_alive_interval(Some(Duration::from_secs(1)))
            // Streams of equal priority take turns packet by packet (round robin).
            .send_fairness(true)
            .congestion_controller_factory(factory(
                self.congestion,
                HopInfo {
                    rate: self.send_rate.map(|r| r / 8),
                    rtt: self.rtt,
                },
                switch,
                shared,
            ));
        t
    }
}

/// A QUIC endpoint on `socket`: a server (gateway) when `server` is given; a terminal
/// connects out with a configuration per connection (`Endpoint::connect_with`).
/// `reset_secret` keys stateless resets (see [`crate::keys::Credentials::reset_secret`]).
/// The socket paces the peers it is asked to ([`PacedSocket::pace`]), returned beside the
/// endpoint.
pub fn endpoint(
    socket: std::net::UdpSocket,
    server: Option<quinn::ServerConfig>,
    reset_secret: [u8; 32],
) -> std::io::Result<(quinn::Endpoint, Arc<PacedSocket>)> {
    let key = ring::hmac::Key::new(ring::hmac::HMAC_SHA256, &reset_secret);
    let mut cfg = quinn::EndpointConfig::new(Arc::new(key));
    // Connection IDs carry a keyed check, and an endpoint drops (without a reset) packets
    // whose ID fails it: the key must also survive a restart for the reset to be sent.
    let cid_key = u64::from_le_bytes(reset_secret[24..].try_into().expect("8 bytes"));
    cfg.cid_generator(move || {
        Box::new(quinn_proto::HashedConnectionIdGenerator::from_key(cid_key))
    });
    let runtime = Arc::new(quinn::TokioRuntime);
    let paced = PacedSocket::new(quinn::Runtime::wrap_udp_socket(&*runtime, socket)?);
    let e = quinn::Endpoint::new_with_abstract_socket(cfg, server, paced.clone(), runtime)?;
    Ok((e, paced))
}

/// The gateway's QUIC server configuration: `tls` and the hop's transport, its controllers
/// sharing nothing (a connection accepted with [`Hop::transport`]'s own gets its pace).
pub fn server_config(
    tls: rustls::ServerConfig,
    hop: &Hop,
    switch: &StopSwitch,
) -> Result<quinn::ServerConfig, String> {
    let crypto = quinn::crypto::rustls::QuicServerConfig::try_from(tls)
        .map_err(|e| format!("TLS configuration unusable for QUIC: {e}"))?;
    let mut s = quinn::ServerConfig::with_crypto(Arc::new(crypto));
    s.transport_config(Arc::new(hop.transport(switch, Shared::default())));
    Ok(s)
}

/// The terminal's QUIC client configuration, its controllers sharing nothing (see
/// [`server_config`]).
pub fn client_config(
    tls: rustls::ClientConfig,
    hop: &Hop,
    switch: &StopSwitch,
) -> Result<quinn::ClientConfig, String> {
    let crypto = quinn::crypto::rustls::QuicClientConfig::try_from(tls)
        .map_err(|e| format!("TLS configuration unusable for QUIC: {e}"))?;
    let mut c = quinn::ClientConfig::new(Arc::new(crypto));
    c.transport_config(Arc::new(hop.transport(switch, Shared::default())));
    Ok(c)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn windows_follow_rate_times_rtt() {
        let h = Hop {
            send_rate: Some(100_000_000),
            receive_rate: Some(10_000_000),
            rtt: Duration::from_millis(600),
            outage: Duration::from_secs(60),
            congestion: Algorithm::Satellite,
            max_flows: 10_000,
        };
        assert_eq!(h.send_window(), 60_000_000);
        // 10 Mbit/s × 600 ms = 750 kB: the 4 MiB floor.
        assert_eq!(h.stream_window(), 4 << 20);
        assert_eq!(h.receive_window(), 16 << 20);
        assert_eq!(h.socket_buffer(), 8 << 20);
        let fast = Hop {
            receive_rate: Some(1_000_000_000),
            ..h
        };
        assert_eq!(fast.stream_window(), 300_000_000);
        assert_eq!(fast.receive_window(), 1_200_000_000);
        assert_eq!(fast.socket_buffer(), 75_000_000);
        // A hub's share of 1 MB/s over 600 ms: 8 × 600 kB.
        assert_eq!(
            h.send_window_at(1_000_000, Duration::from_millis(600)),
            4_800_000
        );
        assert_eq!(
            h.send_window_at(1_000, Duration::from_millis(600)),
            256 << 10
        );
        assert_eq!(
            h.send_window_at(1 << 40, Duration::from_millis(600)),
            h.send_window()
        );
    }
}
