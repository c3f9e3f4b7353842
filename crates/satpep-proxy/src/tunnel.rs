//! Distributed mode: intercepted TCP flows cross the satellite hop as streams of one QUIC
//! connection between two satpeps (`satpep-tunnel` has the wire format, credentials,
//! controllers and transport).
//!
//! The terminal intercepts clients exactly as split mode does and opens one bidirectional
//! stream per flow: the flow header, then the client's bytes. The gateway reads the header,
//! connects to the server from the client's address (transparently), answers with one byte
//! (connected, refused, …) and relays. End of stream is a FIN on the other side; a TCP reset
//! resets the stream (and a reset stream resets the TCP connection); a flow cut off by the
//! tunnel's loss is reset, never finished, so a truncated transfer cannot look complete.

use crate::config::{Leg, TunnelConfig};
use crate::registry::Registry;
use crate::relay::End;
use crate::sockets::{reset_on_close, upstream};
use quinn::{RecvStream, SendStream, VarInt};
use satpep_tunnel::admission::{peer_id, Admission, PeerId};
use satpep_tunnel::congestion::satellite::{PathMemory, Readings};
use satpep_tunnel::congestion::stop::StopSwitch;
use satpep_tunnel::congestion::Shared;
use satpep_tunnel::header::{Answer, FlowHeader, HeaderError, MAX_LEN};
use satpep_tunnel::keys::Credentials;
use satpep_tunnel::pacing::PacedSocket;
use satpep_tunnel::reorder::InOrder;
use satpep_tunnel::transport;
use socket2::SockRef;
use std::io;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::Duration;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;
use tracing::{debug, info, warn};

/// Stream error code: the TCP connection on the other side was reset (or failed).
pub const CODE_RESET: VarInt = VarInt::from_u32(1);
/// Stream error code: the flow header was not valid.
pub const CODE_BAD_HEADER: VarInt = VarInt::from_u32(2);
/// Connection close code when a satpep stops.
pub const CODE_SHUTDOWN: VarInt = VarInt::from_u32(3);
/// Connection close code when a reload no longer admits the terminal (revoked, unlisted).
pub const CODE_NOT_ADMITTED: VarInt = VarInt::from_u32(4);

/// How long the gateway waits for a flow header before giving up on the stream.
const HEADER_WAIT: Duration = Duration::from_secs(10);
/// How long the gateway's connect to a server may take (under the terminal's own 60 s).
const GATEWAY_CONNECT: Duration = Duration::from_secs(55);
/// Relay buffer per direction per flow, held only while bytes flow.
const CHUNK: usize = 64 * 1024;
/// How long the terminal waits for the tunnel's handshake.
const HANDSHAKE_WAIT: Duration = Duration::from_secs(15);
/// After a failed attempt to reach the gateway, flows fail at once for this long.
pub const RETRY_AFTER: Duration = Duration::from_secs(2);

/// The QUIC endpoint of this end, the switch that lets its close out when it stops, and
/// what each new connection's configuration is made of.
pub struct Endpoint {
    /// The endpoint.
    pub endpoint: quinn::Endpoint,
    /// Flipped right before closing (see `satpep_tunnel::congestion::stop`).
    pub switch: StopSwitch,
    /// The endpoint's socket, pacing each connection at its controller's rate.
    paced: Arc<PacedSocket>,
    hop: transport::Hop,
    client: Option<quinn::ClientConfig>,
    server: Option<quinn::ServerConfig>,
    /// Kept to build the gateway's configuration again when what it admits changes.
    creds: Credentials,
}

impl Endpoint {
    /// The endpoint's socket (a gateway's shares its carrier through it).
    pub fn paced(&self) -> Arc<PacedSocket> {
        self.paced.clone()
    }

    /// The transport of a new connection with `peer`: its controller paces the datagrams
    /// to `peer`, publishes what it measures in the readings returned and, given a
    /// `memory`, starts from the path the last connection measured.
    fn transport(
        &self,
        peer: SocketAddr,
        memory: Option<PathMemory>,
    ) -> (Arc<quinn::TransportConfig>, Arc<Readings>) {
        let readings = Arc::new(Readings::default());
        let shared = Shared {
            memory,
            pace: Some(self.paced.pace(peer)),
            readings: Some(readings.clone()),
        };
        (Arc::new(self.hop.transport(&self.switch, shared)), readings)
    }

    /// The gateway's configuration for a connection from `peer`.
    fn server_for(&self, peer: SocketAddr) -> (Arc<quinn::ServerConfig>, Arc<Readings>) {
        let mut s = self.server.clone().expect("a gateway's endpoint serves");
        let (t, readings) = self.transport(peer, None);
        s.transport_config(t);
        (Arc::new(s), readings)
    }

    /// The terminal's configuration for its connection to `peer`.
    fn client_for(
        &self,
        peer: SocketAddr,
        memory: &PathMemory,
    ) -> (quinn::ClientConfig, Arc<Readings>) {
        let mut c = self.client.clone().expect("a terminal's endpoint connects");
        let (t, readings) = self.transport(peer, Some(memory.clone()));
        c.transport_config(t);
        (c, readings)
    }

    /// The gateway admits `admission` from now on (connections already made are the
    /// caller's to check).
    fn admit(&mut self, admission: &Arc<Admission>) -> Result<(), String> {
        self.server = Some(transport::server_config(
            self.creds.server_tls(admission)?,
            &self.hop,
            &self.switch,
        )?);
        Ok(())
    }

    /// Closes every connection with `reason` and waits (at most 1 s) until the close left,
    /// also when the congestion window is full.
    pub async fn close(&self, reason: &[u8]) {
        self.switch.stop();
        self.endpoint.close(CODE_SHUTDOWN, reason);
        let _ = tokio::time::timeout(Duration::from_secs(1), self.endpoint.wait_idle()).await;
    }
}

/// Builds the QUIC endpoint of this end from `t` (credentials loaded, UDP socket bound); a
/// gateway admits `admission`.
pub fn endpoint(t: &TunnelConfig, admission: &Arc<Admission>) -> Result<Endpoint, String> {
    let creds = Credentials::load(&t.ca, &t.cert, &t.key)?;
    let switch = StopSwitch::default();
    let sock = crate::sockets::udp_socket(t.listen, t.hop.socket_buffer())
        .map_err(|e| format!("tunnel.listen: cannot bind UDP {}: {e}", t.listen))?;
    let (server, client) = match t.role {
        crate::config::Role::Gateway => (
            Some(transport::server_config(
                creds.server_tls(admission)?,
                &t.hop,
                &switch,
            )?),
            None,
        ),
        crate::config::Role::Terminal => (
            None,
            Some(transport::client_config(
                creds.client_tls()?,
                &t.hop,
                &switch,
            )?),
        ),
    };
    let (endpoint, paced) = transport::endpoint(sock, server.clone(), creds.reset_secret())
        .map_err(|e| format!("tunnel: {e}"))?;
    if let Some(c) = &t.carrier {
        info!(
            rate_bytes_per_s = c.rate,
            share = ?c.by,
            terminals_named = c.terminals.len(),
            "tunnel gateway shares one carrier among its terminals"
        );
        paced.share_carrier(Some(c.clone()));
    }
    Ok(Endpoint {
        endpoint,
        switch,
        paced,
        hop: t.hop,
        client,
        server,
        creds,
    })
}

/// The terminal's end: one connection to the gateway, made on first use and again whenever
/// it was lost.
pub struct Terminal {
    ep: Endpoint,
    peer: SocketAddr,
    peer_name: String,
    conn: tokio::sync::Mutex<Option<quinn::Connection>>,
    reorder_limit: usize,
    /// The path the last connection measured: a new one (after an outage longer than the
    /// idle timeout, a gateway's restart) starts from it.
    memory: PathMemory,
    /// The last failed attempt to reach the gateway, and why: flows arriving soon after it
    /// fail at once instead of queueing behind one handshake timeout each.
    failed: std::sync::Mutex<Option<(std::time::Instant, String)>>,
    /// Where the connection's figures and failures are counted.
    reg: Arc<Registry>,
}

/// One flow's stream pair. Dropped without [`Flow::finished`] set, it resets its stream:
/// quinn would *finish* a dropped stream, and a flow cut short must never look complete.
pub struct Flow {
    /// Toward the peer.
    pub send: SendStream,
    /// From the peer.
    pub recv: RecvStream,
    /// Puts what `recv` gives back in order.
    pub reader: InOrder,
    /// The answer byte was read already (strict mode).
    pub answered: bool,
    /// The send side was finished on purpose (all bytes handed over, then end of stream).
    pub finished: bool,
}

impl Flow {
    fn new(send: SendStream, recv: RecvStream, reorder_limit: usize) -> Flow {
        Flow {
            send,
            recv,
            reader: InOrder::new(CHUNK, reorder_limit),
            answered: false,
            finished: false,
        }
    }
}

impl Drop for Flow {
    fn drop(&mut self) {
        if !self.finished {
            let _ = self.send.reset(CODE_RESET);
            let _ = self.recv.stop(CODE_RESET);
        }
    }
}

impl Terminal {
    /// Binds the terminal's endpoint; connects later, on the first flow or [`Terminal::warm`].
    pub fn start(t: &TunnelConfig, reg: Arc<Registry>) -> Result<Arc<Terminal>, String> {
        Ok(Arc::new(Terminal {
            // A terminal admits nobody: it only connects.
            ep: endpoint(t, &Arc::new(Admission::default()))?,
            peer: t.peer.expect("resolved config has the terminal's peer"),
            peer_name: t.peer_name.clone(),
            conn: tokio::sync::Mutex::new(None),
            reorder_limit: t.hop.reorder_limit(),
            memory: PathMemory::default(),
            failed: std::sync::Mutex::new(None),
            reg,
        }))
    }

    /// The live connection to the gateway, connecting if there is none. After a failed
    /// attempt, flows fail at once for [`RETRY_AFTER`].
    pub async fn connection(&self) -> Result<quinn::Connection, String> {
        let recent_failure = || {
            self.failed
                .lock()
                .unwrap()
                .as_ref()
                .filter(|(t, _)| t.elapsed() < RETRY_AFTER)
                .map(|(_, e)| e.clone())
        };
        if let Some(e) = recent_failure() {
            return Err(e);
        }
        let mut slot = self.conn.lock().await;
        if let Some(c) = slot.as_ref() {
            if c.close_reason().is_none() {
                return Ok(c.clone());
            }
        }
        // Another flow may have failed while this one waited for the lock.
        if let Some(e) = recent_failure() {
            return Err(e);
        }
        let (cfg, readings) = self.ep.client_for(self.peer, &self.memory);
        let attempt = async {
            let connecting = self
                .ep
                .endpoint
                .connect_with(cfg, self.peer, &self.peer_name)
                .map_err(|e| format!("cannot connect to the gateway {}: {e}", self.peer))?;
            match tokio::time::timeout(HANDSHAKE_WAIT, connecting).await {
                Ok(r) => r.map_err(|e| {
                    format!(
                        "the gateway {} ({}) refused or failed the handshake: {e}",
                        self.peer, self.peer_name
                    )
                }),
                Err(_) => Err(format!(
                    "the gateway {} did not answer within {} s",
                    self.peer,
                    HANDSHAKE_WAIT.as_secs()
                )),
            }
        };
        let c = match attempt.await {
            Ok(c) => c,
            Err(e) => {
                self.reg
                    .counters
                    .tunnel_handshake_failures
                    .fetch_add(1, Relaxed);
                *self.failed.lock().unwrap() = Some((std::time::Instant::now(), e.clone()));
                return Err(e);
            }
        };
        info!(gateway = %self.peer, name = %self.peer_name, "tunnel up");
        let t = crate::registry::Tunnel {
            conn: c.clone(),
            readings,
            id: PeerId {
                name: self.peer_name.clone(),
                serial: Vec::new(),
            },
            flows: None,
        };
        tokio::spawn(watch(t, self.reg.clone()));
        *slot = Some(c.clone());
        Ok(c)
    }

    /// Connects ahead of the first flow, logging (not failing) if the gateway is not there.
    pub async fn warm(&self) {
        if let Err(e) = self.connection().await {
            warn!(error = %e, "tunnel not up yet; flows will retry");
        }
    }

    /// Opens a flow's stream and sends its header. The client's bytes follow through the
    /// relay at once, without waiting for the gateway's answer.
    pub async fn open(
        &self,
        client: SocketAddr,
        server: SocketAddr,
        strict: bool,
    ) -> io::Result<Flow> {
        let c = self.connection().await.map_err(io::Error::other)?;
        let (send, recv) = c.open_bi().await.map_err(io::Error::other)?;
        let mut f = Flow::new(send, recv, self.reorder_limit);
        let head = FlowHeader {
            client,
            server,
            strict,
        }
        .encode();
        f.send.write_all(&head).await.map_err(io::Error::other)?;
        Ok(f)
    }

    /// Opens a flow and waits for the gateway's answer: connected, or an error whose kind
    /// says how the server failed (refused: `ConnectionRefused`; no answer: `TimedOut`).
    pub async fn open_strict(&self, client: SocketAddr, server: SocketAddr) -> io::Result<Flow> {
        let mut f = self.open(client, server, true).await?;
        match read_answer(&mut f.recv, &mut f.reader).await {
            Some(Answer::Connected) => {
                f.answered = true;
                Ok(f)
            }
            // Dropping `f` resets the stream.
            a => Err(answer_error(a)),
        }
    }

    /// Closes the connection, and waits (at most 1 s) until the gateway was told: it then
    /// resets the flows still open instead of waiting out an outage.
    pub async fn close(&self) {
        self.ep.close(b"terminal stopping").await;
    }
}

fn answer_error(a: Option<Answer>) -> io::Error {
    match a {
        Some(Answer::Refused) => io::Error::new(io::ErrorKind::ConnectionRefused, "refused"),
        Some(Answer::NoAnswer) => io::Error::new(io::ErrorKind::TimedOut, "no answer"),
        Some(a) => io::Error::new(io::ErrorKind::HostUnreachable, a.to_string()),
        None => io::Error::new(io::ErrorKind::HostUnreachable, "tunnel lost"),
    }
}

/// The gateway's answer byte; `None` if the stream ended, was reset or carried garbage.
/// Flow bytes that came with it stay in `reader`.
async fn read_answer(r: &mut RecvStream, reader: &mut InOrder) -> Option<Answer> {
    Answer::from_byte(reader.read_byte(r).await?)
}

/// Relays a terminal flow: client ↔ stream. Fast mode reads the answer here; a failed
/// server resets the client.
pub async fn relay_terminal(
    client: &mut TcpStream,
    mut flow: Flow,
    src: SocketAddr,
    dst: SocketAddr,
    reg: &Registry,
    conn: &crate::registry::Conn,
) {
    let answered = flow.answered;
    let r = relay(
        client,
        &mut flow.send,
        &mut flow.recv,
        &mut flow.reader,
        &conn.up,
        &conn.down,
        !answered,
        &conn.abort,
    )
    .await;
    flow.finished = r.to_stream == End::Fin;
    if let Err(a) = &r.answer {
        reg.counters.failed.fetch_add(1, Relaxed);
        debug!(target: crate::CONNECTION_LOG, %src, %dst, answer = %a, "server failed behind the tunnel; resetting client");
        return;
    }
    let clean = r.to_stream == End::Fin && r.to_tcp == End::Fin;
    debug!(target: crate::CONNECTION_LOG, %src, %dst, up = r.sent, down = r.received, clean, "tunnel flow closed");
}

/// Most bytes the stream-to-TCP direction gathers for one write: a QUIC packet carries
/// about 1.4 kB of a stream, and a write per piece cost the receiving proxy a system call
/// and a small packet towards its host for each (measured in docs/tunnel.md, "Line rate").
const WRITE_BATCH: usize = 256 * 1024;

/// Writes every piece of `pieces` (emptied) with vectored writes; the bytes written.
async fn write_all_vectored<W: tokio::io::AsyncWrite + Unpin>(
    w: &mut W,
    pieces: &mut Vec<bytes::Bytes>,
) -> io::Result<u64> {
    let mut total = 0u64;
    let mut first = 0;
    loop {
        while pieces.get(first).is_some_and(|b| b.is_empty()) {
            first += 1;
        }
        if first == pieces.len() {
            break;
        }
        let slices: Vec<io::IoSlice> = pieces[first..]
            .iter()
            .map(|b| io::IoSlice::new(b))
            .collect();
        let mut n = w.write_vectored(&slices).await?;
        if n == 0 {
            return Err(io::ErrorKind::WriteZero.into());
        }
        total += n as u64;
        while n > 0 {
            let len = pieces[first].len();
            if n >= len {
                n -= len;
                first += 1;
            } else {
                let rest = pieces[first].slice(n..);
                pieces[first] = rest;
                n = 0;
            }
        }
    }
    pieces.clear();
    Ok(total)
}

/// The result of relaying one flow.
struct FlowEnd {
    sent: u64,
    received: u64,
    to_stream: End,
    to_tcp: End,
    /// The answer, when it was read in the relay; `Err` holds a failure.
    answer: Result<(), String>,
}

/// Relays between a TCP connection and a stream pair until both directions end or one is
/// reset (then everything is reset). `to_stream` and `to_tcp` count bytes as they go. With
/// `await_answer`, the stream's first byte is the gateway's answer and is not relayed.
#[allow(clippy::too_many_arguments)]
async fn relay(
    tcp: &mut TcpStream,
    send: &mut SendStream,
    recv: &mut RecvStream,
    reader: &mut InOrder,
    to_stream: &AtomicU64,
    to_tcp: &AtomicU64,
    await_answer: bool,
    abort: &tokio::sync::Notify,
) -> FlowEnd {
    let (tr, mut tw) = tcp.split();
    // quinn's SendStream is an AsyncWrite whose shutdown is `finish`: split mode's copy
    // relays this direction with the same FIN and reset semantics.
    let up = crate::relay::copy(tr.as_ref(), &mut *send, CHUNK, to_stream);
    let mut answer: Result<(), String> = Ok(());
    let answer_slot = &mut answer;
    let down = async {
        if await_answer {
            match read_answer(recv, reader).await {
                Some(Answer::Connected) => {}
                a => {
                    *answer_slot = Err(a.map_or("tunnel lost".into(), |a| a.to_string()));
                    return (End::ResetIn, 0);
                }
            }
        }
        let mut n_total = 0u64;
        let mut batch = Vec::new();
        loop {
            match reader.read_batch(recv, WRITE_BATCH, &mut batch).await {
                Ok(true) => match write_all_vectored(&mut tw, &mut batch).await {
                    Ok(n) => {
                        n_total += n;
                        to_tcp.fetch_add(n, Relaxed);
                    }
                    Err(_) => return (End::ResetOut, n_total),
                },
                Ok(false) => break,
                Err(e) => {
                    debug!(error = %e, "stream failed");
                    return (End::ResetIn, n_total);
                }
            }
        }
        match tw.shutdown().await {
            Ok(()) => (End::Fin, n_total),
            Err(_) => (End::ResetOut, n_total),
        }
    };
    let (a, b) = tokio::select! {
        r = crate::relay::both_ways(up, down) => r,
        // Reset both ways (the idle timeout).
        _ = abort.notified() => (Some((End::ResetIn, to_stream.load(Relaxed))), None),
    };
    let reset = |e: &Option<(End, u64)>| matches!(e, Some((End::ResetIn | End::ResetOut, _)));
    if reset(&a) || reset(&b) {
        reset_on_close(SockRef::from(&*tcp));
        let _ = send.reset(CODE_RESET);
        let _ = recv.stop(CODE_RESET);
    } else {
        crate::sockets::close_cleanly(SockRef::from(&*tcp));
    }
    // A direction cut off by the other's reset: what it relayed is in its live count.
    let (to_stream_end, sent) = a.unwrap_or((End::ResetOut, to_stream.load(Relaxed)));
    let (to_tcp_end, received) = b.unwrap_or((End::ResetOut, to_tcp.load(Relaxed)));
    FlowEnd {
        sent,
        received,
        to_stream: to_stream_end,
        to_tcp: to_tcp_end,
        answer,
    }
}

/// At most one log line per this interval about refused tunnel handshakes.
const REFUSAL_LOG_INTERVAL: std::time::Duration = std::time::Duration::from_secs(10);

/// Lets one event in per interval be logged and counts those left out.
struct LogBudget {
    every: std::time::Duration,
    /// When a line was last let through, and events left out since.
    state: std::sync::Mutex<(Option<std::time::Instant>, u64)>,
}

impl LogBudget {
    fn new(every: std::time::Duration) -> Self {
        LogBudget {
            every,
            state: std::sync::Mutex::new((None, 0)),
        }
    }

    /// An event at `now`: Some(events left out since the last line) if this one is to be
    /// logged, None if it is left out.
    fn admit(&self, now: std::time::Instant) -> Option<u64> {
        let mut s = self.state.lock().unwrap();
        match s.0 {
            Some(last) if now.duration_since(last) < self.every => {
                s.1 += 1;
                None
            }
            _ => {
                let more = s.1;
                *s = (Some(now), 0);
                Some(more)
            }
        }
    }
}

/// The terminal a connection authenticated as (its certificate's name and serial).
fn terminal_of(c: &quinn::Connection) -> Option<PeerId> {
    let certs = c
        .peer_identity()?
        .downcast::<Vec<quinn::rustls::pki_types::CertificateDer<'static>>>()
        .ok()?;
    peer_id(certs.first()?)
}

/// Runs the gateway's QUIC endpoint until `shutdown`: accepts authenticated terminals and
/// carries their flows to the servers on `leg` (the terrestrial leg), from the clients'
/// addresses, with socket mark `mark`. When `admission` changes (a reload), new handshakes
/// are checked against it and live connections of terminals it no longer admits are closed.
#[allow(clippy::too_many_arguments)]
pub async fn run_gateway(
    mut ep: Endpoint,
    t: &TunnelConfig,
    leg: Arc<Leg>,
    mark: u32,
    keepalive: Option<std::time::Duration>,
    reg: Arc<Registry>,
    mut admission: tokio::sync::watch::Receiver<Arc<Admission>>,
    shutdown: impl std::future::Future<Output = ()>,
) -> Result<(), String> {
    let limit = t.hop.reorder_limit();
    info!(listen = %t.listen, congestion = t.hop.congestion.name(), "tunnel gateway listening");
    tokio::pin!(shutdown);
    let refusals = Arc::new(LogBudget::new(REFUSAL_LOG_INTERVAL));
    let mut admission_open = true;
    loop {
        tokio::select! {
            _ = &mut shutdown => break,
            changed = admission.changed(), if admission_open => {
                if changed.is_err() {
                    // The sender is gone (the proxy stops): admission stays as it is.
                    admission_open = false;
                    continue;
                }
                let now = admission.borrow_and_update().clone();
                if let Err(e) = ep.admit(&now) {
                    warn!(error = %e, "reload: the gateway keeps admitting as before");
                    continue;
                }
                for t in reg.tunnels() {
                    close_unless_admitted(&t, &now);
                }
                info!(lists_names = now.lists_names(), revoked = now.revoked_count(), "tunnel admission reloaded");
            }
            inc = ep.endpoint.accept() => {
                let Some(inc) = inc else { break };
                let (leg, reg, refusals, admits) = (leg.clone(), reg.clone(), refusals.clone(), admission.clone());
                let (paced, hop) = (ep.paced.clone(), ep.hop);
                let (config, readings) = ep.server_for(inc.remote_address());
                tokio::spawn(async move {
                    let from = inc.remote_address();
                    let accepted = inc.accept_with(config);
                    let conn = match async { accepted?.await }.await {
                        Ok(c) => c,
                        Err(e) => {
                            reg.counters.tunnel_handshake_failures.fetch_add(1, Relaxed);
                            // A scanned gateway fails handshakes by the thousand: one line
                            // per interval, the rest counted (and in the metric).
                            if let Some(more) = refusals.admit(std::time::Instant::now()) {
                                warn!(%from, error = %e, more_since_last_line = more, "refused a tunnel peer (handshake failed)");
                            }
                            return;
                        }
                    };
                    let id = terminal_of(&conn).unwrap_or(PeerId { name: "?".into(), serial: Vec::new() });
                    info!(%from, terminal = %id.name, "tunnel peer authenticated");
                    paced.name(from, &id.name);
                    tokio::spawn(follow_share(conn.clone(), paced.clone(), hop, from));
                    let flows = Arc::new(AtomicU64::new(0));
                    paced.count_flows(from, flows.clone());
                    let t = crate::registry::Tunnel { conn: conn.clone(), readings, id, flows: Some(flows.clone()) };
                    tokio::spawn(watch(t.clone(), reg.clone()));
                    // Its handshake was checked against the admission of its accept: a
                    // reload since, whose sweep ran before `watch` registered it, is
                    // checked here.
                    close_unless_admitted(&t, &admits.borrow());
                    loop {
                        match conn.accept_bi().await {
                            Ok((send, recv)) => {
                                let (leg, reg, flows) = (leg.clone(), reg.clone(), flows.clone());
                                tokio::spawn(async move {
                                    flows.fetch_add(1, Relaxed);
                                    gateway_flow(send, recv, leg, mark, keepalive, reg, from, limit).await;
                                    flows.fetch_sub(1, Relaxed);
                                });
                            }
                            Err(e) => {
                                info!(%from, reason = %e, "tunnel peer gone");
                                break;
                            }
                        }
                    }
                });
            }
        }
    }
    // Flows still open are reset at the terminal: the connection closes under them. The
    // close must leave before the process does, or the terminal would wait out an outage.
    ep.close(b"gateway stopping").await;
    Ok(())
}

/// Sizes a terminal's send window from its share of a hub's carrier (the hop's own without
/// one: a reload may set or remove it), from the handshake on and five times a second while
/// its connection lives: what its share holds back waits in that window at the gateway, and
/// the hop's whole-rate window (64 MiB without a told rate) let a gateway carrying 50
/// terminals hold 1.7 GB. A quiet terminal has the least window (256 KiB) until its share
/// is known.
async fn follow_share(
    conn: quinn::Connection,
    paced: Arc<PacedSocket>,
    hop: transport::Hop,
    from: SocketAddr,
) {
    let mut last = 0;
    loop {
        let rtt = conn.rtt().max(hop.rtt);
        let window = if paced.shares_carrier() {
            hop.send_window_at(paced.share_of(from), rtt)
        } else {
            hop.send_window()
        };
        // Grown at once, shrunk only by a quarter or more (a window that shrinks under
        // buffered data only stops new writes until it drains).
        if window > last || window < last - last / 4 {
            conn.set_send_window(window);
            last = window;
        }
        tokio::select! {
            _ = conn.closed() => return,
            _ = tokio::time::sleep(Duration::from_millis(200)) => {}
        }
    }
}

/// A tunnel connection's figures, for logs and `/metrics`.
#[derive(Debug, Clone, Copy, Default)]
pub struct TunnelFigures {
    /// Smoothed RTT.
    pub rtt: Duration,
    /// Lowest RTT seen.
    pub min_rtt: Duration,
    /// Congestion window, bytes.
    pub cwnd: u64,
    /// Packets sent.
    pub sent: u64,
    /// Packets declared lost.
    pub lost: u64,
    /// quinn's congestion events.
    pub events: u64,
    /// The satellite controller's loss events by kind (zero with other controllers).
    pub random: u64,
    /// Loss events the satellite controller took for congestion.
    pub congestion: u64,
    /// The satellite controller's model: bottleneck rate (bytes/s; 0 with other controllers).
    pub model_rate: u64,
    /// The model's base RTT.
    pub model_rtt: Option<Duration>,
    /// The share of packets the satellite controller measured the hop losing to noise.
    pub channel_loss: Option<f64>,
    /// The noise's mean burst, packets (1: independent losses).
    pub loss_burst: Option<u64>,
    /// A buffer shallower than the controller's slack, once losses showed one.
    pub shallow_buffer: Option<Duration>,
    /// Flow-control stalls sent (the window sizing is wrong if these grow).
    pub blocked: u64,
    /// UDP bytes sent.
    pub udp_tx: u64,
    /// UDP bytes received.
    pub udp_rx: u64,
    /// Path MTU in use.
    pub mtu: u16,
    /// The satellite controller's phase (None with other controllers).
    pub phase: Option<satpep_tunnel::congestion::satellite::Phase>,
    /// The rate the controller paces at, bits/s, if it says (its `metrics()`).
    pub pacing_rate: Option<u64>,
}

impl TunnelFigures {
    /// The figures of `c` now: quinn's statistics, its controller's metrics and what a
    /// satellite controller published in `r`.
    pub fn of(c: &quinn::Connection, r: &Readings) -> TunnelFigures {
        let s = c.stats();
        let p = s.path;
        let losses = r.losses();
        TunnelFigures {
            rtt: p.rtt,
            min_rtt: p.min_rtt,
            cwnd: p.cwnd,
            sent: p.sent_packets,
            lost: p.lost_packets,
            events: p.congestion_events,
            random: losses.random,
            congestion: losses.congestion,
            model_rate: r.rate(),
            model_rtt: r.base_rtt(),
            channel_loss: r.channel_loss(),
            loss_burst: r.loss_burst(),
            shallow_buffer: r.shallow_buffer(),
            pacing_rate: c.congestion_state().metrics().pacing_rate,
            blocked: s.frame_tx.data_blocked + s.frame_tx.stream_data_blocked,
            udp_tx: s.udp_tx.bytes,
            udp_rx: s.udp_rx.bytes,
            mtu: p.current_mtu,
            phase: r.phase(),
        }
    }
}

/// The connection's path figures, for logs.
fn log_stats(c: &quinn::Connection, r: &Readings, closing: bool) {
    let f = TunnelFigures::of(c, r);
    let rate_mbit = f.model_rate as f64 * 8e-6;
    let base_rtt_ms = f.model_rtt.map_or(0.0, |d| d.as_secs_f64() * 1e3);
    let (rtt_ms, min_rtt_ms) = (f.rtt.as_secs_f64() * 1e3, f.min_rtt.as_secs_f64() * 1e3);
    let (sent, lost, udp_tx, udp_rx) = (f.sent, f.lost, f.udp_tx, f.udp_rx);
    let (cwnd, events, mtu) = (f.cwnd, f.events, f.mtu);
    let (random, congestion, blocked) = (f.random, f.congestion, f.blocked);
    if closing {
        info!(peer = %c.remote_address(), rtt_ms, min_rtt_ms, cwnd, sent, lost, events, random, congestion, rate_mbit, base_rtt_ms, blocked, udp_tx, udp_rx, mtu, "tunnel closed");
    } else {
        debug!(peer = %c.remote_address(), rtt_ms, min_rtt_ms, cwnd, sent, lost, events, random, congestion, rate_mbit, base_rtt_ms, blocked, udp_tx, udp_rx, mtu, "tunnel stats");
    }
}

/// Closes `t` if `admission` no longer admits its terminal (a reload revoked or unlisted
/// it), saying why in the log and in the close.
fn close_unless_admitted(t: &crate::registry::Tunnel, admission: &Admission) {
    if let Err(why) = admission.check_id(&t.id) {
        warn!(terminal = %t.id.name, from = %t.conn.remote_address(), reason = %why, "closing the connection of a terminal no longer admitted");
        t.conn.close(CODE_NOT_ADMITTED, why.as_bytes());
    }
}

/// Keeps tunnel `t` in `reg` (for `/metrics`, `/connections` and a reload's check) from the
/// call, not from the first poll, while it lives, and logs its figures every 5 s (debug)
/// and when it closes (info).
fn watch(t: crate::registry::Tunnel, reg: Arc<Registry>) -> impl std::future::Future<Output = ()> {
    reg.tunnel_up(t.clone());
    let (c, r) = (t.conn, t.readings);
    async move {
        watching(&c, &r).await;
        reg.tunnel_down(&c);
        log_stats(&c, &r, true);
    }
}

/// Logs `c`'s figures every 5 s until it closes.
async fn watching(c: &quinn::Connection, r: &Readings) {
    loop {
        tokio::select! {
            _ = c.closed() => break,
            _ = tokio::time::sleep(Duration::from_secs(5)) => log_stats(c, r, false),
        }
    }
}

/// Reads a flow header; the flow bytes that came with it stay in `reader`.
async fn read_header(recv: &mut RecvStream, reader: &mut InOrder) -> Result<FlowHeader, String> {
    let mut buf = Vec::with_capacity(MAX_LEN);
    loop {
        match FlowHeader::decode(&buf) {
            Ok((h, n)) => {
                reader.unread(bytes::Bytes::copy_from_slice(&buf[n..]));
                return Ok(h);
            }
            Err(HeaderError::Truncated { .. }) => {}
            Err(e) => return Err(e.to_string()),
        }
        match reader.read(recv).await {
            Ok(Some(b)) => buf.extend_from_slice(&b),
            Ok(None) => {
                return Err(FlowHeader::decode(&buf)
                    .err()
                    .map_or("stream ended".into(), |e| e.to_string()))
            }
            Err(e) => return Err(format!("stream failed before its header: {e}")),
        }
    }
}

#[allow(clippy::too_many_arguments)]
async fn gateway_flow(
    send: SendStream,
    recv: RecvStream,
    leg: Arc<Leg>,
    mark: u32,
    keepalive: Option<std::time::Duration>,
    reg: Arc<Registry>,
    peer: SocketAddr,
    reorder_limit: usize,
) {
    // Every early return drops `f`, which resets the stream.
    let mut f = Flow::new(send, recv, reorder_limit);
    let h = match tokio::time::timeout(HEADER_WAIT, read_header(&mut f.recv, &mut f.reader)).await {
        Ok(Ok(x)) => x,
        Ok(Err(e)) => {
            warn!(%peer, error = %e, "bad flow header; stream reset");
            let _ = f.send.reset(CODE_BAD_HEADER);
            let _ = f.recv.stop(CODE_BAD_HEADER);
            return;
        }
        Err(_) => {
            warn!(%peer, "no flow header within 10 s; stream reset");
            let _ = f.send.reset(CODE_BAD_HEADER);
            let _ = f.recv.stop(CODE_BAD_HEADER);
            return;
        }
    };
    let c = &reg.counters;
    c.total.fetch_add(1, Relaxed);
    let (src, dst) = (h.client, h.server);
    let connect = async {
        let sock = upstream(src, &leg, mark)?;
        tokio::net::TcpSocket::from_std_stream(sock.into())
            .connect(dst)
            .await
    };
    let server = match tokio::time::timeout(GATEWAY_CONNECT, connect).await {
        Ok(Ok(s)) => s,
        failed => {
            let answer = match &failed {
                Ok(Err(e)) => Answer::from_connect_error(e),
                _ => Answer::NoAnswer,
            };
            c.failed.fetch_add(1, Relaxed);
            debug!(target: crate::CONNECTION_LOG, %src, %dst, %answer, "server failed; answering the terminal");
            let _ = f.recv.stop(CODE_RESET);
            if f.send.write_all(&[answer as u8]).await.is_ok() && f.send.finish().is_ok() {
                f.finished = true;
                // The answer must reach the terminal before the stream's state goes.
                let _ = f.send.stopped().await;
            }
            return;
        }
    };
    if let Err(e) = crate::sockets::tune(SockRef::from(&server), &leg) {
        warn!(%src, %dst, error = %e, "tuning the server leg failed");
    }
    crate::sockets::arm(SockRef::from(&server));
    crate::sockets::keepalive(SockRef::from(&server), keepalive);
    if f.send.write_all(&[Answer::Connected as u8]).await.is_err() {
        return;
    }
    c.active.fetch_add(1, Relaxed);
    let conn = {
        use std::os::fd::AsRawFd;
        reg.add(src, dst, None, server.as_raw_fd())
    };
    debug!(target: crate::CONNECTION_LOG, %src, %dst, "tunnel flow");
    let mut server = server;
    let r = relay(
        &mut server,
        &mut f.send,
        &mut f.recv,
        &mut f.reader,
        &conn.down,
        &conn.up,
        false,
        &conn.abort,
    )
    .await;
    f.finished = r.to_stream == End::Fin;
    // Before the socket closes (at the end of this function).
    reg.remove(&conn);
    c.active.fetch_sub(1, Relaxed);
    let clean = r.to_stream == End::Fin && r.to_tcp == End::Fin;
    debug!(target: crate::CONNECTION_LOG, %src, %dst, up = r.received, down = r.sent, clean, "tunnel flow closed");
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, Instant};

    /// A writer that takes at most `most` bytes a call, as a socket with a full buffer does.
    struct Trickle {
        got: Vec<u8>,
        most: usize,
    }

    impl tokio::io::AsyncWrite for Trickle {
        fn poll_write(
            mut self: std::pin::Pin<&mut Self>,
            _: &mut std::task::Context<'_>,
            b: &[u8],
        ) -> std::task::Poll<io::Result<usize>> {
            let n = b.len().min(self.most);
            self.got.extend_from_slice(&b[..n]);
            std::task::Poll::Ready(Ok(n))
        }
        fn poll_flush(
            self: std::pin::Pin<&mut Self>,
            _: &mut std::task::Context<'_>,
        ) -> std::task::Poll<io::Result<()>> {
            std::task::Poll::Ready(Ok(()))
        }
        fn poll_shutdown(
            self: std::pin::Pin<&mut Self>,
            _: &mut std::task::Context<'_>,
        ) -> std::task::Poll<io::Result<()>> {
            std::task::Poll::Ready(Ok(()))
        }
    }

    #[tokio::test]
    async fn a_batch_is_written_whole_and_in_order_through_partial_writes() {
        let want: Vec<u8> = (0..10_000u32).map(|i| (i * 7 % 251) as u8).collect();
        // Pieces of uneven sizes, some empty; writes that stop inside a piece and across.
        let mut pieces = Vec::new();
        let mut at = 0;
        for (i, len) in [0usize, 1, 0, 1400, 3, 2999, 0, 1452, 4145, 0]
            .iter()
            .enumerate()
        {
            pieces.push(bytes::Bytes::copy_from_slice(&want[at..at + len]));
            at += len;
            assert!(at <= want.len(), "piece {i}");
        }
        assert_eq!(at, want.len());
        for most in [1, 7, 1400, 1452, 100_000] {
            let mut w = Trickle { got: vec![], most };
            let mut p = pieces.clone();
            let n = write_all_vectored(&mut w, &mut p).await.unwrap();
            assert_eq!(n, want.len() as u64, "most {most}");
            assert!(w.got == want, "bytes differ with writes of {most}");
            assert!(p.is_empty());
        }
    }

    #[test]
    fn refused_handshakes_log_one_line_per_interval() {
        let b = LogBudget::new(Duration::from_secs(10));
        let t0 = Instant::now();
        assert_eq!(b.admit(t0), Some(0));
        // A scan: a thousand refusals within the interval make no line.
        for i in 1..=1000 {
            assert_eq!(b.admit(t0 + Duration::from_millis(i)), None);
        }
        // The next line says how many were left out.
        assert_eq!(b.admit(t0 + Duration::from_secs(10)), Some(1000));
        assert_eq!(b.admit(t0 + Duration::from_secs(11)), None);
        assert_eq!(b.admit(t0 + Duration::from_secs(25)), Some(1));
    }
}
