//! `satpep lab run link-accuracy`: how exact the emulator is, measured with real tools across
//! a lab (iperf3 UDP for rate and loss, ping for delay), and what it costs in CPU.
//!
//! Two tables:
//! 1. **Scale**: rate from 1 Mbit/s to 1 Gbit/s. iperf3 overdrives the link by 2 % with
//!    full-size datagrams; the receiver's steady-state intervals give the delivered frame rate.
//!    The emulator's CPU time over the run is read from /proc.
//! 2. **Presets**: for `geo` and each document's link, configured vs measured rate (both
//!    directions), RTT (ping; min/avg/max against 2 × delay + serialization of the ping frame)
//!    and PER at a BER from the document's range (UDP at half the rate, so the queue never
//!    drops; the measured PER is checked against the 99 % binomial interval).

use crate::experiment::RunArgs;
use crate::iperf::{ping, tcp_download, udp_forward, udp_return, UDP_FRAME_OVERHEAD};
use crate::progress::Progress;
use crate::scenario::runner::{tcp_limit_in, HOST_MSS};
use crate::sink::Sink;
use crate::topology::Host;
use crate::topology::{Lab, UpOptions, SERVER_V4};
use satpep_link::config::{DelaySource, LinkSpec, RateSource};
use satpep_link::loss::per_from_ber;
use satpep_link::units::fmt_rate;
use serde::Serialize;
use std::time::Duration;
use std::time::Instant;

/// ICMP echo of 56 payload bytes as a frame: 56 + 8 + 20 + 14.
const PING_FRAME: u32 = 98;

/// One row of the scale table.
#[derive(Debug, Clone, Serialize)]
pub struct ScaleRow {
    /// Configured rate, bit/s.
    pub configured_bps: f64,
    /// Frame rate arriving at the terminal (nftables ingress counter), bit/s.
    pub measured_bps: f64,
    /// (measured − configured) / configured.
    pub error: f64,
    /// Emulator user CPU time / wall time (1.0 = one core).
    pub emulator_cpu_user: f64,
    /// Emulator system CPU time / wall time. Includes the receiving hosts' network stacks,
    /// which the kernel runs inside the emulator's send calls.
    pub emulator_cpu_sys: f64,
    /// The emulator's release lateness p99 during the UDP run, ms.
    pub late_p99_ms: f64,
    /// iperf3 TCP (cubic) goodput end to end, bit/s.
    pub tcp_goodput_bps: f64,
    /// That goodput as a share of rate × 1448/1514.
    pub tcp_share: f64,
}

/// One row of the presets table.
#[derive(Debug, Clone, Serialize)]
pub struct PresetRow {
    /// Preset name.
    pub preset: String,
    /// Configured forward rate, bit/s.
    pub fwd_rate_bps: f64,
    /// Measured forward frame rate, bit/s.
    pub fwd_measured_bps: f64,
    /// Configured return rate, bit/s.
    pub ret_rate_bps: f64,
    /// Measured return frame rate, bit/s.
    pub ret_measured_bps: f64,
    /// Expected RTT of a ping: both delays plus serialization of its frame each way, ms.
    pub rtt_expected_ms: f64,
    /// Ping RTT minimum minus the kernel-bridge baseline, ms (likewise avg, max, p99).
    pub rtt_min_ms: f64,
    /// Ping RTT mean, ms.
    pub rtt_avg_ms: f64,
    /// Ping RTT maximum, ms.
    pub rtt_max_ms: f64,
    /// The emulator's own release lateness p99, worse direction, ms.
    pub late_p99_ms: f64,
    /// Pings answered.
    pub pings: usize,
    /// BER configured for the loss test.
    pub ber: f64,
    /// PER that BER gives for the test frames.
    pub per_expected: f64,
    /// Measured PER.
    pub per_measured: f64,
    /// 99 % binomial interval around the expected PER for the number of frames sent.
    pub per_interval: (f64, f64),
    /// Frames sent in the loss test.
    pub frames: u64,
}

fn fixed_rate(r: &RateSource) -> f64 {
    match r {
        RateSource::Fixed(v) => *v,
        RateSource::Trace(t) => t.max(),
    }
}

fn fixed_delay(d: &DelaySource) -> f64 {
    match d {
        DelaySource::Fixed(v) => *v as f64,
        DelaySource::Trace(t) => t.value_at(0.0),
    }
}

/// A reading of the sink counter and the emulator's CPU time.
struct Sample {
    packets: u64,
    bytes: u64,
    at: Instant,
    cpu: (f64, f64),
}

/// (user, system) CPU seconds of process `pid`.
fn cpu_seconds(pid: u32) -> (f64, f64) {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let after = stat.rsplit(')').next().unwrap_or("");
    let f: Vec<&str> = after.split_whitespace().collect();
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    // Fields 14 and 15 (utime, stime) are at 11 and 12 after the ')' split.
    let get = |i: usize| f.get(i).and_then(|x| x.parse::<f64>().ok()).unwrap_or(0.0) / hz;
    (get(11), get(12))
}

fn datagram_len(rate: f64) -> u32 {
    // Small links get smaller datagrams so a run holds enough of them to measure finely.
    if rate < 5e6 {
        472
    } else {
        1472
    }
}

fn spec_with(base: &LinkSpec, f: impl FnOnce(&mut LinkSpec)) -> LinkSpec {
    let mut s = base.clone();
    f(&mut s);
    s
}

/// Runs the benchmark and prints (or emits as JSON) both tables.
pub fn run(args: &RunArgs) -> Result<(), String> {
    let secs = args.duration.unwrap_or(if args.quick { 5 } else { 10 });
    let rates: &[f64] = &[1e6, 10e6, 100e6, 1e9];
    let presets: &[(&str, f64)] = &[
        ("geo", 1e-6),
        ("urke2011", 1e-5),
        ("bharadwaj1999", 1e-6),
        ("lawson2006", 1e-5),
        ("shao2002", 1e-5),
        ("vanzara2017", 1e-6),
    ];
    let steps = rates.len() + presets.len() * 4 + 1;
    let progress = Progress::new(steps, secs as f64 + 2.0, false);
    let name = format!("acc-{}", std::process::id());
    let first = LinkSpec::layered(&[
        &toml::from_str("[both]\nrate='1Mbit'\ndelay='10ms'").map_err(|e| e.to_string())?
    ])?;
    let mut lab = Lab::up(&name, &first, &UpOptions::default())?;
    let mut step = 0;

    // Baseline: the same path through a kernel bridge, so "added RTT" excludes the hosts.
    lab.bridge_link()?;
    progress.tick(step, "baseline ping through a kernel bridge", 0.0);
    let base_ping = ping(&lab, SERVER_V4, if args.quick { 40 } else { 200 }, 0.05, 56)?;
    let baseline_ms = base_ping.avg;
    if !baseline_ms.is_finite() {
        return Err("baseline ping through a kernel bridge got no reply".into());
    }
    progress.done(
        step,
        "baseline",
        &format!("ping through a kernel bridge: {baseline_ms:.3} ms"),
    );
    step += 1;

    let mut scale = Vec::new();
    for &rate in rates {
        let spec: LinkSpec = toml::from_str(&format!("[both]\nrate='{rate}'\ndelay='10ms'\n"))
            .map_err(|e| e.to_string())?;
        lab.start_emulator(&spec)?;
        let pid = lab.emulator_pid().ok_or("emulator not running")?;
        let len = 1472;
        let payload = rate * 1.02 * len as f64 / (len + UDP_FRAME_OVERHEAD) as f64;
        let what = format!("scale {} UDP", fmt_rate(rate));
        let sink = Sink::install(&lab, Host::Terminal, 5202)?;
        // iperf3 overdrives the link for secs + 4 s; the window measured is the middle secs.
        let sample = |sink: &Sink| -> Result<Sample, String> {
            let t0 = Instant::now();
            let (packets, bytes) = sink.read()?;
            let t1 = Instant::now();
            Ok(Sample {
                packets,
                bytes,
                at: t0 + (t1 - t0) / 2,
                cpu: cpu_seconds(pid),
            })
        };
        let (a, b) = std::thread::scope(|sc| -> Result<_, String> {
            let tx = sc.spawn(|| udp_forward(&lab, payload, len, secs + 4, &mut |_| {}));
            let t = Instant::now();
            while t.elapsed() < Duration::from_secs(2) {
                progress.tick(step, &what, t.elapsed().as_secs_f64());
                std::thread::sleep(Duration::from_millis(200));
            }
            let a = sample(&sink)?;
            while t.elapsed() < Duration::from_secs(2 + secs as u64) {
                progress.tick(step, &what, t.elapsed().as_secs_f64());
                std::thread::sleep(Duration::from_millis(200));
            }
            let b = sample(&sink)?;
            tx.join().map_err(|_| "iperf3 thread panicked")??;
            Ok((a, b))
        })?;
        drop(sink);
        let dt = (b.at - a.at).as_secs_f64();
        let (dp, db) = (b.packets - a.packets, b.bytes - a.bytes);
        let measured = (db + 14 * dp) as f64 * 8.0 / dt;
        let late = lab.link_stats()?.forward.late_p99_ms;
        let what_tcp = format!("scale {} TCP", fmt_rate(rate));
        progress.tick(step, &what_tcp, 0.0);
        lab.start_emulator(&spec)?;
        let tcp = tcp_download(&lab, "cubic", secs, false, &mut |t| {
            progress.tick(step, &what_tcp, t)
        })?;
        let row = ScaleRow {
            configured_bps: rate,
            measured_bps: measured,
            error: measured / rate - 1.0,
            emulator_cpu_user: (b.cpu.0 - a.cpu.0) / dt,
            emulator_cpu_sys: (b.cpu.1 - a.cpu.1) / dt,
            late_p99_ms: late,
            tcp_goodput_bps: tcp.goodput_bps,
            tcp_share: tcp.goodput_bps / tcp_limit_in(&spec.resolve()?.forward, HOST_MSS, true),
        };
        progress.done(
            step,
            &format!("scale {}", fmt_rate(rate)),
            &format!(
                "{} ({:+.3} %), CPU {:.0} %, TCP {:.1} % of limit",
                fmt_rate(measured),
                row.error * 100.0,
                (row.emulator_cpu_user + row.emulator_cpu_sys) * 100.0,
                row.tcp_share * 100.0
            ),
        );
        step += 1;
        scale.push(row);
    }

    let mut rows = Vec::new();
    for &(preset, ber) in presets {
        let base = satpep_link::presets::spec(preset)?;
        let cfg = base.resolve()?;
        let (fr, rr) = (fixed_rate(&cfg.forward.rate), fixed_rate(&cfg.ret.rate));
        lab.start_emulator(&base)?;
        let measure = |dir: &str, rate: f64, step: usize| -> Result<f64, String> {
            let len = datagram_len(rate);
            let payload = rate * 1.02 * len as f64 / (len + UDP_FRAME_OVERHEAD) as f64;
            let what = format!("{preset} {dir} rate");
            let mut tick = |t| progress.tick(step, &what, t);
            let r = if dir == "forward" {
                udp_forward(&lab, payload, len, secs, &mut tick)?
            } else {
                udp_return(&lab, payload, len, secs, &mut tick)?
            };
            let m = r.frame_rate(len);
            progress.done(
                step,
                &what,
                &format!("{} of {}", fmt_rate(m), fmt_rate(rate)),
            );
            Ok(m)
        };
        let fm = measure("forward", fr, step)?;
        let rm = measure("return", rr, step + 1)?;
        step += 2;

        // Delay: a fresh emulator so the queues are empty.
        lab.start_emulator(&base)?;
        let what = format!("{preset} ping");
        progress.tick(step, &what, 0.0);
        let count = if args.quick { 40 } else { 200 };
        let rtts = ping(&lab, SERVER_V4, count, 0.05, 56)?;
        let ser = |r: f64| PING_FRAME as f64 * 8.0 / r * 1e3;
        let expected = (fixed_delay(&cfg.forward.delay) + fixed_delay(&cfg.ret.delay)) / 1e6
            + ser(fr)
            + ser(rr);
        let late = lab.link_stats()?;
        let (min, max, avg) = (
            rtts.min - baseline_ms,
            rtts.max - baseline_ms,
            rtts.avg - baseline_ms,
        );
        progress.done(
            step,
            &what,
            &format!("avg {avg:.3} ms, expected {expected:.3} ms"),
        );
        step += 1;

        // Loss: at half the rate so only the error process drops.
        let lossy = spec_with(&base, |s| s.forward.ber = Some(ber));
        lab.start_emulator(&lossy)?;
        let len = datagram_len(fr);
        let frame = len + UDP_FRAME_OVERHEAD;
        let what = format!("{preset} loss at BER {ber:e}");
        let loss_secs = secs * 2;
        let r = udp_forward(
            &lab,
            fr * 0.5 * len as f64 / frame as f64,
            len,
            loss_secs,
            &mut |t| progress.tick(step, &what, t),
        )?;
        let p = per_from_ber(ber, frame);
        let n = r.packets.max(1) as f64;
        let half = 2.576 * (p * (1.0 - p) / n).sqrt();
        let measured = r.lost as f64 / n;
        progress.done(
            step,
            &what,
            &format!("PER {:.4} expected {:.4} ± {:.4}", measured, p, half),
        );
        step += 1;
        rows.push(PresetRow {
            preset: preset.into(),
            fwd_rate_bps: fr,
            fwd_measured_bps: fm,
            ret_rate_bps: rr,
            ret_measured_bps: rm,
            rtt_expected_ms: expected,
            rtt_min_ms: min,
            rtt_avg_ms: avg,
            rtt_max_ms: max,
            late_p99_ms: late.forward.late_p99_ms.max(late.ret.late_p99_ms),
            pings: rtts.received,
            ber,
            per_expected: p,
            per_measured: measured,
            per_interval: ((p - half).max(0.0), p + half),
            frames: r.packets,
        });
    }
    drop(lab);
    if args.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&serde_json::json!({ "baseline_rtt_ms": baseline_ms, "scale": scale, "presets": rows }))
                .unwrap()
        );
    } else {
        print_tables(&scale, &rows, secs, baseline_ms);
    }
    Ok(())
}

fn print_tables(scale: &[ScaleRow], rows: &[PresetRow], secs: u32, baseline_ms: f64) {
    println!("\nsatpep link accuracy ({secs} s per rate measurement)\n");
    println!("Scale: delay 10 ms each way. UDP: iperf3 overdrives by 2 %; the terminal's nftables ingress counter");
    println!(
        "measures frames/s over {secs} s of steady state. TCP: iperf3 cubic, {secs} s, end to end."
    );
    println!(
        "| {:>12} | {:>15} | {:>8} | {:>9} | {:>9} | {:>9} | {:>15} | {:>9} |",
        "configured",
        "measured",
        "error",
        "CPU user",
        "CPU sys",
        "late p99",
        "TCP goodput",
        "of limit"
    );
    println!(
        "|{:->14}|{:->17}|{:->10}|{:->11}|{:->11}|{:->11}|{:->17}|{:->11}|",
        "", "", "", "", "", "", "", ""
    );
    for r in scale {
        println!(
            "| {:>12} | {:>15} | {:>+7.3}% | {:>7.0} % | {:>7.0} % | {:>6.3} ms | {:>15} | {:>7.1} % |",
            fmt_rate(r.configured_bps),
            fmt_rate(r.measured_bps),
            r.error * 100.0,
            r.emulator_cpu_user * 100.0,
            r.emulator_cpu_sys * 100.0,
            r.late_p99_ms,
            fmt_rate(r.tcp_goodput_bps),
            r.tcp_share * 100.0
        );
    }
    println!(
        "CPU: emulator process time / wall time (100 % = one core), both directions; system time"
    );
    println!("includes the kernel's delivery of each frame to the next namespace.");
    println!("\nPresets: configured vs measured. Rate: iperf3 UDP frames/s. RTT added: ping (98-byte frames)");
    println!("minus the same path through a kernel bridge ({baseline_ms:.3} ms); expected = 2 delays + serialization.");
    println!("PER: iperf3 UDP at half the rate, against the 99 % binomial interval of the configured PER.");
    println!(
        "| {:<13} | {:>23} | {:>23} | {:>9} | {:>25} | {:>8} | {:>7} | {:>24} | {:>8} |",
        "preset",
        "forward rate conf/meas",
        "return rate conf/meas",
        "RTT exp",
        "added RTT min/avg/max",
        "late p99",
        "BER",
        "PER exp [99 % interval]",
        "PER meas"
    );
    println!(
        "|{:-<15}|{:->25}|{:->25}|{:->11}|{:->27}|{:->10}|{:->9}|{:->26}|{:->10}|",
        "", "", "", "", "", "", "", "", ""
    );
    for r in rows {
        println!(
            "| {:<13} | {:>23} | {:>23} | {:>9.3} | {:>25} | {:>8.3} | {:>7} | {:>24} | {:>8.4} |",
            r.preset,
            format!(
                "{} / {}",
                short_rate(r.fwd_rate_bps),
                short_rate(r.fwd_measured_bps)
            ),
            format!(
                "{} / {}",
                short_rate(r.ret_rate_bps),
                short_rate(r.ret_measured_bps)
            ),
            r.rtt_expected_ms,
            format!(
                "{:.3}/{:.3}/{:.3}",
                r.rtt_min_ms, r.rtt_avg_ms, r.rtt_max_ms
            ),
            r.late_p99_ms,
            format!("{:e}", r.ber),
            format!(
                "{:.4} [{:.4}, {:.4}]",
                r.per_expected, r.per_interval.0, r.per_interval.1
            ),
            r.per_measured
        );
    }
}

fn short_rate(bps: f64) -> String {
    format!("{:.4} M", bps / 1e6)
}
