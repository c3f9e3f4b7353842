//! `satpep status`: live connections of a running proxy.

use clap::Args;
use satpep_link::units::fmt_rate;
use satpep_proxy::control::StatusReply;
use satpep_proxy::tcpinfo::LegInfo;
use std::net::SocketAddr;

/// Show a running proxy's live connections, with both legs' TCP state.
#[derive(Args, Debug)]
#[command(
    long_about = "Show a running proxy's live connections, with both legs' TCP state.

Reads the proxy's status endpoint (its [proxy] metrics address). For each split connection: \
client and server, age, bytes relayed each way, and for the satellite and terrestrial legs the \
congestion control, smoothed RTT, congestion window, delivery rate and retransmissions from \
TCP_INFO. The same endpoint serves Prometheus metrics at /metrics.

Columns per leg: cc = congestion control; rtt ms = smoothed RTT (includes queueing); cwnd = \
congestion window in segments; delivery = the kernel's latest delivery-rate sample; retr = \
segments retransmitted so far. up B / down B = bytes relayed client->server / server->client. \
model (a satellite leg on satpep_sat, the default): the controller's phase, the rate it \
measured, its base RTT and the queue it reads, from the kernel (docs/model.md).

In distributed mode, a table of tunnel connections comes first: the peer by its certificate's \
name (a gateway lists each connected terminal), its address, the flows it carries now, the \
smoothed and lowest RTT, the satellite controller's rate and phase, and packets sent and lost.

A split gateway sharing a carrier ([proxy.carrier]) lists its terminals by name (a listed \
terminal, or its clients' /24 or /64): live and busy connections, what they send and the \
terminal's share now (bits/s of carrier, frames with headers; - while it is quiet), the mean \
RTT of its busy connections, and payload acknowledged and segments retransmitted since the \
proxy started.

With --watch the table is printed again every SECS seconds (default 2) with each \
connection's rates over the interval (up rate, down rate; a connection new since the last sample: \
over its age) and the totals over live connections; with --json, one JSON object per sample \
and line (JSON Lines), each connection with up_bps and down_bps. --count stops after N \
samples.

Exit status: 0, or 1 when the endpoint does not answer (or does not serve /connections: \
see proxy.connections).

In a lab: satpep lab exec NAME gateway -- satpep status"
)]
pub struct StatusCmd {
    /// The proxy's status endpoint (its proxy.connections address, or proxy.metrics).
    #[arg(long, value_name = "ADDR:PORT", default_value = "127.0.0.1:9917")]
    addr: SocketAddr,
    /// Print JSON.
    #[arg(long)]
    json: bool,
    /// Print again every SECS seconds, with rates.
    #[arg(long, value_name = "SECS", num_args = 0..=1, default_missing_value = "2")]
    watch: Option<f64>,
    /// With --watch: stop after N samples.
    #[arg(long, value_name = "N", requires = "watch")]
    count: Option<u64>,
}

/// Bytes each way per connection id at one sample.
type Seen = std::collections::HashMap<u64, (u64, u64)>;

/// Each live connection's rates (bit/s up, down) since `prev` was taken `dt` seconds ago;
/// a connection not in `prev` over its age.
fn rates(r: &StatusReply, prev: &Seen, dt: f64) -> Vec<(f64, f64)> {
    r.connections
        .iter()
        .map(|c| {
            let (up0, down0, span) = match prev.get(&c.id) {
                Some(&(u, d)) => (u, d, dt),
                None => (0, 0, c.age_s),
            };
            let per = |now: u64, before: u64| {
                if span > 0.0 {
                    now.saturating_sub(before) as f64 * 8.0 / span
                } else {
                    0.0
                }
            };
            (per(c.bytes_up, up0), per(c.bytes_down, down0))
        })
        .collect()
}

fn watch(cmd: &StatusCmd, every: f64) -> Result<(), String> {
    if !(every.is_finite() && (0.1..=3600.0).contains(&every)) {
        return Err(format!(
            "--watch {every}: the interval must be between 0.1 and 3600 seconds"
        ));
    }
    let tty = std::io::IsTerminal::is_terminal(&std::io::stdout());
    let mut prev = Seen::new();
    let mut last = std::time::Instant::now();
    let mut n = 0u64;
    loop {
        let r = satpep_proxy::control::fetch_status(cmd.addr)?;
        let now = std::time::Instant::now();
        let dt = now.duration_since(last).as_secs_f64();
        let rs = rates(&r, &prev, dt);
        let (up, down) = rs.iter().fold((0.0, 0.0), |a, b| (a.0 + b.0, a.1 + b.1));
        if cmd.json {
            let mut v = serde_json::to_value(&r).map_err(|e| e.to_string())?;
            for (c, (u, d)) in v["connections"]
                .as_array_mut()
                .into_iter()
                .flatten()
                .zip(&rs)
            {
                c["up_bps"] = (*u).into();
                c["down_bps"] = (*d).into();
            }
            v["time"] = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0.0, |d| d.as_secs_f64())
                .into();
            v["up_bps"] = up.into();
            v["down_bps"] = down.into();
            println!("{v}");
        } else {
            if tty {
                // Home and clear, as watch(1) does.
                print!("\x1b[H\x1b[2J");
            }
            println!(
                "every {every} s: up {}, down {} over live connections",
                fmt_rate(up),
                fmt_rate(down)
            );
            print_table(&r, Some(&rs));
            println!();
        }
        use std::io::Write;
        let _ = std::io::stdout().flush();
        prev = r
            .connections
            .iter()
            .map(|c| (c.id, (c.bytes_up, c.bytes_down)))
            .collect();
        last = now;
        n += 1;
        if cmd.count.is_some_and(|c| n >= c) {
            return Ok(());
        }
        std::thread::sleep(std::time::Duration::from_secs_f64(every));
    }
}

/// The satellite model's phase, rate, base RTT and queue ("-" without one).
fn model(l: &Option<LegInfo>) -> String {
    match l.as_ref().and_then(|l| l.model.as_ref()) {
        Some(m) => format!(
            "{} {} base {} ms queue {:.1} ms",
            m.phase,
            fmt_rate(m.rate_bps as f64),
            m.base_rtt_ms.map_or("-".into(), |b| format!("{b:.1}")),
            m.queue_ms
        ),
        None => "-".into(),
    }
}

fn leg(l: &Option<LegInfo>) -> String {
    match l {
        Some(i) => format!(
            "{:<6} {:>7.1} {:>6} {:>13} {:>6}",
            i.congestion,
            i.rtt_ms,
            i.cwnd,
            fmt_rate(i.delivery_rate_bps as f64),
            i.total_retrans
        ),
        None => format!("{:<6} {:>7} {:>6} {:>13} {:>6}", "-", "-", "-", "-", "-"),
    }
}

pub fn main(cmd: StatusCmd) -> Result<(), String> {
    if let Some(every) = cmd.watch {
        return watch(&cmd, every);
    }
    let r = satpep_proxy::control::fetch_status(cmd.addr)?;
    if cmd.json {
        println!("{}", serde_json::to_string_pretty(&r).unwrap());
        return Ok(());
    }
    print_table(&r, None);
    Ok(())
}

/// The summary line and one row per connection; with `rates`, their up/s and down/s.
fn print_table(r: &StatusReply, rates: Option<&[(f64, f64)]>) {
    println!(
        "{} live, {} accepted, {} failed, {} bypassed",
        r.connections.len(),
        r.total,
        r.failed,
        r.bypassed
    );
    if !r.tunnels.is_empty() {
        println!(
            "{:<24} {:<44} {:>6} {:>8} {:>8} {:>13} {:<8} {:>10} {:>8}",
            "tunnel to",
            "address",
            "flows",
            "rtt ms",
            "min ms",
            "model rate",
            "phase",
            "sent",
            "lost"
        );
        for t in &r.tunnels {
            println!(
                "{:<24} {:<44} {:>6} {:>8.1} {:>8.1} {:>13} {:<8} {:>10} {:>8}",
                t.name,
                t.peer,
                t.flows,
                t.rtt_ms,
                t.min_rtt_ms,
                t.model_rate_bps.map_or("-".into(), |b| fmt_rate(b as f64)),
                t.phase.as_deref().unwrap_or("-"),
                t.sent_packets,
                t.lost_packets
            );
        }
    }
    if !r.carrier.is_empty() {
        println!(
            "{:<24} {:>6} {:>5} {:>13} {:>13} {:>8} {:>14} {:>8}",
            "carrier terminal", "flows", "busy", "sending", "share", "rtt ms", "acked B", "retr"
        );
        for t in &r.carrier {
            println!(
                "{:<24} {:>6} {:>5} {:>13} {:>13} {:>8.1} {:>14} {:>8}",
                t.name,
                t.flows,
                t.busy,
                fmt_rate(t.sending_bps as f64),
                if t.share_bps > 0 {
                    fmt_rate(t.share_bps as f64)
                } else {
                    "-".into()
                },
                t.rtt_ms,
                t.acked_bytes,
                t.retransmitted
            );
        }
    }
    if r.connections.is_empty() {
        return;
    }
    let head = format!(
        "{:<6} {:>7} {:>6} {:>13} {:>6}",
        "cc", "rtt ms", "cwnd", "delivery", "retr"
    );
    let rate_head = if rates.is_some() {
        format!(" {:>13} {:>13}", "up rate", "down rate")
    } else {
        String::new()
    };
    println!(
        "{:>4} {:<44} {:>7} {:>11} {:>11}{rate_head} | sat {head} | ter {head} | model",
        "id", "client -> server", "age s", "up B", "down B"
    );
    for (i, c) in r.connections.iter().enumerate() {
        let rate = rates
            .and_then(|r| r.get(i))
            .map_or(String::new(), |(u, d)| {
                format!(" {:>13} {:>13}", fmt_rate(*u), fmt_rate(*d))
            });
        println!(
            "{:>4} {:<44} {:>7.1} {:>11} {:>11}{rate} |     {} |     {} | {}",
            c.id,
            format!("{} -> {}", c.src, c.dst),
            c.age_s,
            c.bytes_up,
            c.bytes_down,
            leg(&c.satellite),
            leg(&c.terrestrial),
            model(&c.satellite)
        );
    }
}
