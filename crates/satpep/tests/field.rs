//! Real links, as the field benchmark runs them (`satpep lab run field`): the PEPs are told
//! nothing about the link, and the tunnel's controller must find it, fill it and keep its
//! queue short, also when the rate drops under it.

mod common;

use common::{require_root, satpep};
use satpep_lab::scenario::beside::percentile;
use satpep_lab::scenario::traffic::RunRecord;
use std::path::PathBuf;

/// Runs a one-cell scenario and returns its run record.
fn run_cell(tag: &str, text: &str) -> RunRecord {
    let dir = std::env::temp_dir().join(format!("satpep-field-{}-{tag}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let f = dir.join("s.toml");
    std::fs::write(&f, text).unwrap();
    let out = satpep()
        .args(["lab", "run", f.to_str().unwrap(), "--fresh", "--out"])
        .arg(dir.join("out"))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let run: PathBuf = dir.join("out/runs/c0000-r000.json");
    let rec: RunRecord = serde_json::from_str(&std::fs::read_to_string(&run).unwrap()).unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    rec
}

#[test]
fn the_tunnel_told_nothing_fills_a_geo_link() {
    require_root();
    let rec = run_cell(
        "geo",
        "name = \"fgeo\"\nduration = \"35s\"\nwarmup = \"12s\"\n[link]\npreset = \"geo\"\n\
         [pep]\nmode = \"tunnel\"\n[traffic]\nprobe = true\n",
    );
    assert!(rec.errors.is_empty(), "{:?}", rec.errors);
    let util = rec.utilization.unwrap();
    // The old controller, without a configured rate, grew like Hybla from ten packets and
    // reached 55 % of this link (at BER 1e-6) in the field benchmark.
    assert!(util >= 0.90, "{:.1} % of the limit", util * 100.0);
    let b = rec.beside.unwrap();
    let after = b.queue_after(12.0);
    let q = percentile(&after, 95.0);
    let high: Vec<(f64, f64)> = b.queue.iter().filter(|s| s.1 > 100.0).copied().collect();
    eprintln!(
        "geo: {:.1} % of the limit, queue p95 {q:.1} ms; samples over 100 ms (s, ms): {high:?}",
        util * 100.0
    );
    // The target is 10 % of the base RTT, 56 ms. A new tunnel's start doubles its
    // window until the queue shows, a round late: the buffer fills (560 ms) and drains
    // within about a second, 4.1-5.0 s after the first data in five runs here. In 25 s with
    // 8 s of warm-up one CI run read 121.9 ms (fewer samples: one later excursion weighs
    // more); five runs here of this 35 s form read 94.3-95.1 % and 36-45 ms. The bound
    // catches a standing queue (BBR v1 keeps ~560 ms on this link), not one excursion.
    assert!(
        q <= 100.0,
        "queueing delay p95 {q:.1} ms (target: 10 % of 560 ms)"
    );
    // The tunnel's own controller, read from the gateway's /metrics every half second: it
    // started, found the link's rate (50 Mbit/s of frames, ~48 of payload) and base RTT
    // (560 ms), and cruised at them.
    let t = &rec.tunnel;
    assert!(t.len() >= 40, "{} tunnel samples in 35 s", t.len());
    let phases: std::collections::BTreeSet<&str> = t.iter().map(|s| s.phase.as_str()).collect();
    assert!(phases.contains("cruise"), "phases seen: {phases:?}");
    let last = t.last().unwrap();
    let rate = last.model_rate_bps.unwrap() / 1e6;
    assert!((42.0..52.0).contains(&rate), "rate model {rate} Mbit/s");
    let base = last.model_base_rtt_ms.unwrap();
    assert!((559.0..575.0).contains(&base), "base RTT model {base} ms");
    assert!(
        last.window_bytes > 1_000_000,
        "window {} B",
        last.window_bytes
    );
    // Its packet counters: on a loss-free link only the start's overshoot loses packets
    // (the buffer overflows once, a round before the queue shows), and what it put on the
    // link is about what the transfer delivered (the goodput is the measured span's, after
    // the start; half of it tells bytes sent from the acknowledgements received).
    let (sent, lost) = (last.sent_packets.unwrap(), last.lost_packets.unwrap());
    assert!(sent > 100_000, "{sent} packets sent in 35 s");
    assert!(lost * 20 < sent, "{lost} of {sent} packets lost");
    let delivered = rec.samples[0] * 35.0 / 8.0;
    let on_link = last.udp_tx_bytes.unwrap() as f64;
    assert!(
        on_link >= delivered * 0.5,
        "{on_link} B on the link for {delivered} B delivered"
    );
}

#[test]
fn after_a_rain_fade_steps_the_rate_down_the_queue_comes_back_within_three_seconds() {
    require_root();
    // geo-fade: 50 Mbit/s, then 38, 25 and 12 from 8, 10 and 12 s of every 30 s, back up
    // from 20 s. 40 s of download meet at least one whole fade.
    let rec = run_cell(
        "fade",
        "name = \"ffade\"\nduration = \"40s\"\nwarmup = \"8s\"\n[link]\npreset = \"geo-fade\"\n\
         [pep]\nmode = \"tunnel\"\n[traffic]\nprobe = true\n",
    );
    assert!(rec.errors.is_empty(), "{:?}", rec.errors);
    let b = rec.beside.unwrap();
    let u0 = b.link_uptime_s.unwrap();
    // Probe samples in the deep fade, from 3 s after its last step down (12 s) to its end.
    // (From 2 s on, the target, one run gave a p95 of 57.9 ms: the controller
    // reacts at 50 ms of queue on this path, and drains within about two RTTs.)
    let deep: Vec<f64> = b
        .queue
        .iter()
        .filter(|(t, _)| *t >= 8.0)
        .filter(|(t, _)| (15.0..20.0).contains(&((u0 + t) % 30.0)))
        .map(|&(_, q)| q)
        .collect();
    assert!(deep.len() >= 25, "{} samples in the fade", deep.len());
    let q = percentile(&deep, 95.0);
    let util = rec.utilization.unwrap();
    eprintln!(
        "fade: {:.1} % of the mean rate, deep-fade queue p95 {q:.1} ms",
        util * 100.0
    );
    // Without the new controller the queue stayed near full (p95 2325 ms in the field
    // benchmark). The target is 56 ms; runs here gave 45 to 75 ms, so this checks
    // the order of magnitude until the controller meets it (docs/field.md).
    assert!(q <= 100.0, "queueing delay p95 in the fade {q:.1} ms");
    // (87 % in runs here: the climb back after the fade and the steps down cost the
    // rest; this guards against a short queue bought by starving the link.)
    assert!(
        util >= 0.80,
        "{:.1} % of the fade's mean rate",
        util * 100.0
    );
}

#[test]
fn split_drains_the_queue_each_step_of_a_rain_fade_builds_within_two_seconds() {
    require_root();
    // geo-fade steps down at 8, 10 and 12 s of every 30 s (50 -> 38 -> 25 -> 12 Mbit/s).
    let rec = run_cell(
        "fade-split",
        "name = \"ffades\"\nduration = \"45s\"\nwarmup = \"8s\"\n[link]\npreset = \"geo-fade\"\n\
         [pep]\nmode = \"split\"\n[traffic]\nprobe = true\n",
    );
    assert!(rec.errors.is_empty(), "{:?}", rec.errors);
    let b = rec.beside.unwrap();
    let u0 = b.link_uptime_s.unwrap();
    // The probe samples from 1.4 to 1.7 s after each step down: the queue the step built
    // (one RTT before it shows) should be drained by then. The probe's reply crosses the
    // forward queue about 0.3 s after it is sent, so the next step shows from 1.7 s on.
    // From 6 s on: the start's overshoot is drained by then, and the ~37 s of probing left
    // hold a whole 30 s fade cycle, three steps down.
    let end = b.queue.last().unwrap().0;
    let steps: Vec<f64> = satpep_link::presets::rain_fade_trace()
        .drops((u0 + 6.0) * 1e9, (u0 + end - 1.7) * 1e9)
        .into_iter()
        .map(|d| d / 1e9 - u0)
        .collect();
    let late: Vec<f64> = b
        .queue
        .iter()
        .filter(|(t, _)| steps.iter().any(|d| (d + 1.4..d + 1.7).contains(t)))
        .map(|&(_, q)| q)
        .collect();
    assert!(steps.len() >= 3, "{} steps down in the run", steps.len());
    let q = percentile(&late, 50.0);
    let util = rec.utilization.unwrap();
    eprintln!(
        "split, fade: {:.1} % of the mean rate; queue 1.4-1.7 s after {} steps down: median {q:.1} ms, {late:?}",
        util * 100.0,
        steps.len()
    );
    // Before each drain read the rate the link serves now (cc.md), the first drain after a
    // step used the faster link's rate and left 60-100 ms of queue for another RTT. The
    // issue's bound on this path is 56 ms.
    assert!(q <= 56.0, "queue {q:.1} ms 1.4-1.7 s after a step down");
    assert!(
        util >= 0.85,
        "{:.1} % of the fade's mean rate",
        util * 100.0
    );
}

#[test]
fn split_told_nothing_fills_a_lossy_geo_link_with_a_short_queue() {
    require_root();
    // Split's default satellite controller (satpep_sat). With kernel BBR there, as before,
    // the field benchmark measured 74 % of this link and a queue p95 of 558 ms: BBR v1 keeps
    // about a BDP queued where the buffer allows it. (35 s: in 25 s with 8 s of warm-up, one
    // run in four read 69 %, a start that ended low and climbed back slowly.)
    let rec = run_cell(
        "split",
        "name = \"fsplit\"\nduration = \"35s\"\nwarmup = \"10s\"\n[link]\npreset = \"geo\"\n\
         both.ber = 1e-6\n[pep]\nmode = \"split\"\n[traffic]\nprobe = true\n",
    );
    assert!(rec.errors.is_empty(), "{:?}", rec.errors);
    let util = rec.utilization.unwrap();
    let b = rec.beside.unwrap();
    let q = percentile(&b.queue_after(10.0), 95.0);
    eprintln!(
        "split, geo BER 1e-6: {:.1} % of the limit, queue p95 {q:.1} ms",
        util * 100.0
    );
    assert!(util >= 0.80, "{:.1} % of the limit", util * 100.0);
    assert!(q <= 120.0, "queueing delay p95 {q:.1} ms");
}

/// Split on GEO beside an end-to-end cubic download (arriving `after` into the transfer, if
/// given): (the transfer's share %, the transfer's and the competitor's goodput over the same
/// span and the transfer's over the whole run, bit/s).
fn split_beside_cubic(tag: &str, duration: &str, after: Option<&str>) -> (f64, f64, f64, f64) {
    let after_key = after.map_or(String::new(), |a| format!("competing_after = \"{a}\"\n"));
    let rec = run_cell(
        tag,
        &format!(
            "name = \"f{tag}\"\nduration = \"{duration}\"\nwarmup = \"5s\"\n[link]\npreset = \"geo\"\n\
             [pep]\nmode = \"split\"\n[traffic]\ncompeting = true\n{after_key}"
        ),
    );
    assert!(rec.errors.is_empty(), "{:?}", rec.errors);
    let b = rec.beside.unwrap();
    // A competitor arriving later is compared over its span: from its arrival plus the
    // warm-up.
    let whole = rec.samples[0];
    let mine = b.transfer_beside_competing_bps.unwrap_or(whole);
    let theirs = b.competing_bps.unwrap();
    let share = 100.0 * mine / (mine + theirs);
    eprintln!(
        "split beside end-to-end cubic on geo ({}): share {share:.1} % ({:.1} and {:.1} Mbit/s)",
        after.map_or("started together".into(), |a| format!("arriving at {a}")),
        mine / 1e6,
        theirs / 1e6
    );
    (share, mine, theirs, whole)
}

#[test]
fn split_keeps_a_share_beside_a_competing_cubic_flow() {
    require_root();
    // A loss-based flow (the hosts' cubic, end to end, started at the same time) keeps the
    // GEO buffer full. satpep_sat's competitive mode grows as CUBIC does and undoes the cuts
    // made for that foreign queue; before it (Reno growth above half the rate it had measured)
    // it kept about 10 % (two runs: 10.4 ± 0.6 %), now about 25-35 %.
    let (share, ..) = split_beside_cubic("compete", "25s", None);
    assert!(share >= 16.0, "share {share:.1} %");
}

#[test]
fn split_holds_a_share_when_a_cubic_download_arrives() {
    require_root();
    // Split's flow runs alone for 15 s (the controller knows the link), then the hosts'
    // cubic arrives end to end and fills the GEO buffer. The competitive mode's floor is half
    // the link's rate; the drains' rate samples used to lower it to a quarter at the
    // competitor's first overflow, and every later loss by what a paced sender loses at a
    // full buffer: 28.9 and 30.4 % before; after, 38.3-49.4 % in five runs of this cell and
    // 34.1 % in the field benchmark's (with requests beside it). One of the mode's first
    // back-offs still halved the floor in half of the runs (33.5-36.1 %, and 29.2 % in CI);
    // since it takes two in a row, 41.3-47.8 % in eight runs.
    let (share, mine, _, whole) = split_beside_cubic("arrive", "45s", Some("15s"));
    assert!(share >= 33.0, "share {share:.1} %");
    // Before the competitor came the transfer had the link: the whole run's goodput is
    // above the share's.
    assert!(whole > mine, "{whole} <= {mine}");
}

#[test]
fn split_fills_what_constant_rate_udp_leaves_without_costing_it_packets() {
    require_root();
    // 20 Mbit/s of UDP on the 50 Mbit/s GEO forward link. satpep_sat used to read a rate
    // of zero when a queue showed on the ACK that ended a round (a probe's end did that
    // here), cut its model to half of what the window delivered and crawled back: 74 % of
    // what the UDP leaves in seven runs of seven, 97 % in four of four since.
    let rec = run_cell(
        "udp",
        "name = \"fudp\"\nduration = \"30s\"\nwarmup = \"5s\"\n[link]\npreset = \"geo\"\n\
         [pep]\nmode = \"split\"\n[traffic]\nprobe = true\ncross_udp = \"20Mbit\"\n",
    );
    assert!(rec.errors.is_empty(), "{:?}", rec.errors);
    let util = rec.utilization.unwrap();
    let b = rec.beside.unwrap();
    let loss = 100.0 * b.cross_loss.unwrap();
    let q = percentile(&b.queue_after(5.0), 95.0);
    eprintln!(
        "split beside 20 Mbit/s UDP: {:.1} % of what it leaves, UDP loss {loss:.2} %, queue p95 {q:.1} ms",
        util * 100.0
    );
    assert!(util >= 0.88, "{:.1} % of what the UDP leaves", util * 100.0);
    assert!(loss <= 1.0, "the UDP lost {loss:.2} % of its packets");
}
