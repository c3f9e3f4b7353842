//! `satpep status`: live connections of a running proxy.

use clap::Args;
use satpep_link::units::fmt_rate;
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
segments retransmitted so far. up B / down B = bytes relayed client->server / server->client.

In a lab: satpep lab exec NAME gateway -- satpep status"
)]
pub struct StatusCmd {
    /// The proxy's status endpoint.
    #[arg(long, value_name = "ADDR:PORT", default_value = "127.0.0.1:9917")]
    addr: SocketAddr,
    /// Print JSON.
    #[arg(long)]
    json: bool,
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
    let r = satpep_proxy::control::fetch_status(cmd.addr)?;
    if cmd.json {
        println!("{}", serde_json::to_string_pretty(&r).unwrap());
        return Ok(());
    }
    println!(
        "{} live, {} accepted, {} failed, {} bypassed",
        r.connections.len(),
        r.total,
        r.failed,
        r.bypassed
    );
    if r.connections.is_empty() {
        return Ok(());
    }
    let head = format!(
        "{:<6} {:>7} {:>6} {:>13} {:>6}",
        "cc", "rtt ms", "cwnd", "delivery", "retr"
    );
    println!(
        "{:>4} {:<44} {:>7} {:>11} {:>11} | sat {head} | ter {head}",
        "id", "client -> server", "age s", "up B", "down B"
    );
    for c in &r.connections {
        println!(
            "{:>4} {:<44} {:>7.1} {:>11} {:>11} |     {} |     {}",
            c.id,
            format!("{} -> {}", c.src, c.dst),
            c.age_s,
            c.bytes_up,
            c.bytes_down,
            leg(&c.satellite),
            leg(&c.terrestrial)
        );
    }
    Ok(())
}
