//! The model on simulated links, through the kernel's semantics (`sim::KernelHost`): what
//! `satpep_sat` does in the kernel, without one.

use super::*;
use sim::{goodput, queue_p95, run, KernelHost, Link};

const MSS: u64 = 1448;

/// The link's payload rate, bytes/s (each frame carries 66 bytes of headers).
fn limit(rate_bps: f64) -> f64 {
    rate_bps / 8.0 * MSS as f64 / (MSS + 66) as f64
}

fn link(rate_bps: f64, rtt: f64, buffer_s: f64, loss: f64) -> impl Fn(f64) -> Link {
    move |_| Link::steady(rate_bps, rtt, buffer_s, loss)
}

/// A lossless link of `rate_bps` with `buffer_s` of it as buffer, at `faded_bps` in the
/// spans `fades` (s).
fn faded(
    rate_bps: f64,
    faded_bps: f64,
    fades: &'static [std::ops::Range<f64>],
    rtt: f64,
    buffer_s: f64,
) -> impl Fn(f64) -> Link {
    move |t| Link {
        rate_bps: if fades.iter().any(|f| f.contains(&t)) {
            faded_bps
        } else {
            rate_bps
        },
        rtt,
        buffer: rate_bps / 8.0 * buffer_s,
        loss: 0.0,
        burst: 1.0,
    }
}

fn report(
    name: &str,
    h: &KernelHost,
    p: &[sim::Packet],
    rate: f64,
    from: f64,
    to: f64,
) -> (f64, f64) {
    let g = goodput(p, MSS, from, to) / limit(rate);
    let q = queue_p95(p, from, to) * 1e3;
    println!(
        "{name}: {:.1} % of the limit, queue p95 {q:.1} ms ({from}-{to} s); phase {:?}, model {:.1} Mbit/s, base {:?} us, noise {:?} in bursts of {:?}, shallow {:?}",
        g * 100.0,
        h.model.phase(),
        h.model.bw() as f64 * 8e-6,
        h.model.base_rtt_us(),
        h.model.channel_loss(),
        h.model.loss_burst(),
        h.model.shallow_buffer_us(),
    );
    (g, q)
}

#[test]
fn the_c_layout_fits_the_rust_copy() {
    // SAFETY: a constant.
    let size = unsafe { satm_sizeof() } as usize;
    assert!(
        size <= STATE_WORDS * 4,
        "STATE_WORDS must be {} at least",
        size.div_ceil(4)
    );
}

#[test]
fn geo_with_random_loss_fills_the_link_with_a_short_queue() {
    let mut h = KernelHost::new(MSS as u32);
    let p = run(&mut h, &link(50e6, 0.6, 2.0, 0.01), MSS, 30.0);
    let (g, q) = report("GEO 50 Mbit/s, 1 % loss", &h, &p, 50e6, 10.0, 29.0);
    assert!(g >= 0.9, "goodput {g:.3} of the limit");
    assert!(q <= 80.0, "queue p95 {q:.1} ms");
    assert_eq!(
        h.model.shallow_buffer_us(),
        None,
        "random loss is no shallow buffer"
    );
    let noise = h.model.channel_loss().expect("drains measured the noise");
    assert!((0.005..0.02).contains(&noise), "noise {noise}");
}

#[test]
fn a_rate_drop_drains_the_queue() {
    let mut h = KernelHost::new(MSS as u32);
    let l = |t: f64| Link {
        rate_bps: if t < 10.0 { 20e6 } else { 8e6 },
        rtt: 0.2,
        buffer: 1e6,
        loss: 0.0,
        burst: 1.0,
    };
    let p = run(&mut h, &l, MSS, 20.0);
    let (g, q) = report("20 then 8 Mbit/s", &h, &p, 8e6, 13.0, 19.0);
    assert!(g >= 0.85, "goodput {g:.3} of the lower rate");
    assert!(q <= 60.0, "queue p95 {q:.1} ms after the drop");
}

#[test]
fn a_rate_rise_is_found_without_a_deep_queue() {
    let mut h = KernelHost::new(MSS as u32);
    let l = |t: f64| Link {
        rate_bps: if t < 10.0 { 12e6 } else { 38e6 },
        rtt: 0.56,
        buffer: 38e6 / 8.0 * 2.0,
        loss: 0.0,
        burst: 1.0,
    };
    let p = run(&mut h, &l, MSS, 30.0);
    let (g, q) = report("12 then 38 Mbit/s", &h, &p, 38e6, 18.0, 29.0);
    assert!(g >= 0.85, "goodput {g:.3} of the higher rate");
    assert!(q <= 120.0, "queue p95 {q:.1} ms after the rise");
}

#[test]
fn a_shallow_buffer_is_found_and_not_overflowed() {
    let mut h = KernelHost::new(MSS as u32);
    let p = run(&mut h, &link(100e6, 0.1, 0.005, 0.0), MSS, 20.0);
    let (g, _) = report("100 Mbit/s, 5 ms buffer", &h, &p, 100e6, 8.0, 19.0);
    let lost = p
        .iter()
        .filter(|x| x.sent >= 8.0 && x.sent < 19.0 && x.acked.is_none())
        .count();
    let sent = p.iter().filter(|x| x.sent >= 8.0 && x.sent < 19.0).count();
    println!("lost {lost} of {sent}");
    assert!(
        h.model.shallow_buffer_us().is_some(),
        "the buffer was not found"
    );
    assert!(g >= 0.85, "goodput {g:.3} of the limit");
    assert!((lost as f64) < 0.01 * sent as f64, "lost {lost} of {sent}");
}

#[test]
fn a_warm_start_runs_at_the_path_rate_from_the_first_round_trip() {
    let l = link(50e6, 0.6, 2.0, 0.0);
    let mut cold = KernelHost::new(MSS as u32);
    let pc = run(&mut cold, &l, MSS, 20.0);
    let path = cold.model.path().expect("a path reading after 20 s");
    let mut warm = KernelHost::new(MSS as u32);
    let a = warm.ack_now(0);
    warm.model.resume(&a, &path);
    let pw = run(&mut warm, &l, MSS, 5.0);
    let (gc, _) = report("cold, first 3 s", &cold, &pc, 50e6, 0.0, 3.0);
    let (gw, qw) = report("warm, first 3 s", &warm, &pw, 50e6, 0.0, 3.0);
    assert!(
        gw >= 0.85,
        "warm start: {gw:.3} of the limit in its first 3 s"
    );
    assert!(gw > gc + 0.2, "warm {gw:.3} against cold {gc:.3}");
    assert!(qw <= 60.0, "warm start queue p95 {qw:.1} ms");
}

#[test]
fn bursts_of_loss_are_noise_not_a_shallow_buffer() {
    let mut h = KernelHost::new(MSS as u32);
    let l = |_| Link {
        rate_bps: 50e6,
        rtt: 0.6,
        buffer: 50e6 / 8.0,
        loss: 0.01,
        burst: 10.0,
    };
    let p = run(&mut h, &l, MSS, 30.0);
    let (g, q) = report(
        "GEO 50 Mbit/s, 1 % loss in bursts of 10",
        &h,
        &p,
        50e6,
        10.0,
        29.0,
    );
    assert!(g >= 0.85, "goodput {g:.3} of the limit");
    assert!(q <= 80.0, "queue p95 {q:.1} ms");
    assert_eq!(
        h.model.shallow_buffer_us(),
        None,
        "bursts of loss are no shallow buffer"
    );
}

#[test]
fn a_fast_beam_fills_quickly() {
    let mut h = KernelHost::new(MSS as u32);
    let p = run(&mut h, &link(500e6, 0.6, 0.5, 1e-4), MSS, 20.0);
    let (g, q) = report("GEO 500 Mbit/s, 1e-4 loss", &h, &p, 500e6, 10.0, 19.0);
    assert!(g >= 0.9, "goodput {g:.3} of the limit");
    assert!(q <= 80.0, "queue p95 {q:.1} ms");
}

#[test]
fn a_bottleneck_that_drops_without_queueing_is_not_taken_for_noise() {
    // A policer: 100 Mbit/s, no buffer to speak of (two frames).
    let mut h = KernelHost::new(MSS as u32);
    let l = |_| Link {
        rate_bps: 100e6,
        rtt: 0.17,
        buffer: 3000.0,
        loss: 0.0,
        burst: 1.0,
    };
    let p = run(&mut h, &l, MSS, 15.0);
    let (g, _) = report("100 Mbit/s policer", &h, &p, 100e6, 5.0, 14.0);
    let lost = p
        .iter()
        .filter(|x| x.sent >= 5.0 && x.sent < 14.0 && x.acked.is_none())
        .count();
    let sent = p.iter().filter(|x| x.sent >= 5.0 && x.sent < 14.0).count();
    println!("lost {lost} of {sent}");
    assert!((lost as f64) < 0.05 * sent as f64, "lost {lost} of {sent}");
    assert!(g >= 0.7, "goodput {g:.3} of the limit");
}

#[test]
fn a_thin_link_losing_one_frame_in_nine_is_noise_not_a_shallow_buffer() {
    // LEO's return link: 12 Mbit/s, RTT 41 ms (35 segments a round), BER 1e-5 (a frame
    // in nine lost), a deep buffer.
    let mut h = KernelHost::new(MSS as u32);
    let p = run(&mut h, &link(12e6, 0.041, 0.25, 0.11), MSS, 20.0);
    let (g, _) = report(
        "12 Mbit/s, RTT 41 ms, 11 % loss",
        &h,
        &p,
        12e6 * 0.89,
        5.0,
        19.0,
    );
    assert_eq!(
        h.model.shallow_buffer_us(),
        None,
        "noise is no shallow buffer"
    );
    assert!(g >= 0.85, "goodput {g:.3} of the limit");
}

#[test]
fn a_start_into_a_buffer_shallower_than_the_budget_ends_before_it_overflows() {
    // 369 Mbit/s, RTT 171 ms, a 22 ms buffer: the budget's 30 ms of queue never shows.
    let mut h = KernelHost::new(MSS as u32);
    let p = run(&mut h, &link(369e6, 0.171, 0.022, 0.0), MSS, 8.0);
    let (g, _) = report("369 Mbit/s, 22 ms buffer", &h, &p, 369e6, 3.0, 7.0);
    let lost = p
        .iter()
        .filter(|x| x.sent < 3.0 && x.acked.is_none())
        .count();
    let sent = p.iter().filter(|x| x.sent < 3.0).count();
    println!("lost {lost} of {sent} in the first 3 s");
    // The start's last round leaves at twice the link's rate before any queue can show
    // (6.9 % of the first 3 s here); what matters is that it ends there: before the
    // per-ACK exits, the start went on into losses of 46 %.
    assert!((lost as f64) < 0.1 * sent as f64, "lost {lost} of {sent}");
    // Later, probes and growth into the buffer lose a few % (it is deeper than the slack,
    // shallower than the budget): no meltdown.
    let later = p
        .iter()
        .filter(|x| x.sent >= 3.0 && x.acked.is_none())
        .count();
    let later_sent = p.iter().filter(|x| x.sent >= 3.0).count();
    println!("lost {later} of {later_sent} after 3 s");
    assert!(
        (later as f64) < 0.05 * later_sent as f64,
        "lost {later} of {later_sent} after 3 s"
    );
    assert!(g >= 0.9, "goodput {g:.3} of the limit");
}

/// Seed 39's L05 of the link corpus, simulated: a 325 Mbit/s LEO path losing 1.4 % of its
/// frames in bursts of 25, its RTT rising 6 ms over each 9 s pass. Bursts read as a buffer's
/// overflows made the slack 1.5 ms, too little for the rising RTT: 69 % of the limit by the
/// end, the lab measured 47 % through the tunnel and 62 % through split.
#[test]
fn long_bursts_of_loss_on_a_leo_pass_are_noise() {
    let mut h = KernelHost::new(MSS as u32);
    let l = |t: f64| Link {
        rate_bps: 325e6,
        rtt: 0.055 + 0.006 * ((t % 9.0) / 9.0),
        buffer: 325e6 / 8.0 * 0.78,
        loss: 0.0138,
        burst: 25.0,
    };
    let p = run(&mut h, &l, MSS, 20.0);
    for (from, to) in [(2.0, 6.0), (6.0, 10.0), (10.0, 14.0), (14.0, 19.0)] {
        let (g, q) = report(
            "LEO 325 Mbit/s, 1.4 % loss in bursts of 25",
            &h,
            &p,
            325e6,
            from,
            to,
        );
        assert!(g >= 0.9, "{from}-{to} s: goodput {g:.3} of the limit");
        assert!(q <= 50.0, "{from}-{to} s: queue p95 {q:.1} ms");
    }
    assert_eq!(
        h.model.shallow_buffer_us(),
        None,
        "bursts of loss are no shallow buffer"
    );
}

/// The kernel's host, noting each phase the model enters and when (s).
struct Watch {
    host: KernelHost,
    phases: Vec<(f64, Phase)>,
    /// When the model first knew a shallow buffer, s.
    shallow_at: Option<f64>,
    /// The model's phase now, shared: a simulated link can follow it.
    phase_now: std::rc::Rc<std::cell::Cell<Phase>>,
    /// SIM_TRACE set: print the model every 250 ms, to see what a test's link did to it.
    trace: bool,
    /// The last quarter second traced.
    last_trace: u64,
}

impl Watch {
    fn new() -> Watch {
        Watch {
            host: KernelHost::new(MSS as u32),
            phases: vec![(0.0, Phase::Startup)],
            shallow_at: None,
            phase_now: std::rc::Rc::new(std::cell::Cell::new(Phase::Startup)),
            trace: std::env::var_os("SIM_TRACE").is_some(),
            last_trace: 0,
        }
    }

    /// When the model first entered `phase`, s.
    fn entered(&self, phase: Phase) -> Option<f64> {
        self.phases.iter().find(|p| p.1 == phase).map(|p| p.0)
    }
}

impl sim::Host for Watch {
    fn on_sent(&mut self, now_us: u64, bytes: u64) {
        self.host.on_sent(now_us, bytes)
    }
    fn on_acked(&mut self, now_us: u64, sent_us: u64, bytes: u64) {
        self.host.on_acked(now_us, sent_us, bytes);
        let p = self.host.model.phase();
        self.phase_now.set(p);
        if self.phases.last().is_some_and(|l| l.1 != p) {
            self.phases.push((now_us as f64 * 1e-6, p));
        }
        if self.trace && now_us / 250_000 != self.last_trace {
            self.last_trace = now_us / 250_000;
            let m = &self.host.model;
            eprintln!(
                "{:6.2} {:?} model {:.2} Mbit/s, cwnd {}, queue {} ms",
                now_us as f64 * 1e-6,
                m.phase(),
                m.bw() as f64 * 8e-6,
                m.cwnd(),
                m.queue_us() / 1000
            );
        }
        if self.shallow_at.is_none() && self.host.model.shallow_buffer_us().is_some() {
            self.shallow_at = Some(now_us as f64 * 1e-6);
        }
    }
    fn on_lost(&mut self, now_us: u64, sent_us: u64, bytes: u64) {
        self.host.on_lost(now_us, sent_us, bytes)
    }
    fn on_end_acks(&mut self, now_us: u64) {
        self.host.on_end_acks(now_us)
    }
    fn window(&self) -> u64 {
        self.host.window()
    }
    fn pacing_rate(&self) -> u64 {
        self.host.pacing_rate()
    }
    fn on_handshake(&mut self, rtt_us: u64) {
        self.host.on_handshake(rtt_us)
    }
}

/// The model and a CUBIC download that arrives at `cubic_at` s through one bottleneck: each
/// one's goodput in `from..to` as a share of the limit.
fn beside_cubic(
    name: &str,
    link: &dyn Fn(f64) -> Link,
    rate: f64,
    cubic_at: f64,
    secs: f64,
    windows: &[(f64, f64)],
) -> (Watch, Vec<(f64, f64)>) {
    let mut h = Watch::new();
    let mut c = sim::Cubic::new(MSS).starting_at(cubic_at);
    let p = sim::run_shared(&mut [&mut h, &mut c], link, MSS, secs);
    println!("{name}: phases {:?}", h.phases);
    let shares = windows
        .iter()
        .map(|&(from, to)| {
            let ours = goodput(&p[0], MSS, from, to) / limit(rate);
            let theirs = goodput(&p[1], MSS, from, to) / limit(rate);
            let lost = |p: &[sim::Packet]| {
                let sent = p.iter().filter(|x| x.sent >= from && x.sent < to);
                let n = sent.clone().count().max(1);
                sent.filter(|x| x.acked.is_none()).count() as f64 / n as f64 * 100.0
            };
            println!(
                "{name} {from}-{to} s: model {:.1} % (lost {:.1} %), cubic {:.1} % (lost {:.1} %), queue p95 {:.0} ms",
                ours * 100.0,
                lost(&p[0]),
                theirs * 100.0,
                lost(&p[1]),
                queue_p95(&p[1], from, to) * 1e3,
            );
            (ours, theirs)
        })
        .collect();
    (h, shares)
}

#[test]
fn beside_a_cubic_download_that_arrives_the_model_competes() {
    // Seed 40's L01 without its ACM steps: 3.4 Mbit/s, 617 ms, a 309 ms buffer; the
    // download arrives once the model has found the link. Reaction after reaction to its
    // queue cut the model to 7 % of the link, each drain ending "clean" at one of the
    // competitor's low points, until cuts past any fade's depth meant a competitor.
    let (h, shares) = beside_cubic(
        "GEO 3.4 Mbit/s, cubic from 8 s",
        &link(3.4e6, 0.617, 0.309, 0.0),
        3.4e6,
        8.0,
        90.0,
        &[(30.0, 60.0), (60.0, 90.0)],
    );
    assert!(h.entered(Phase::Compete).is_some(), "{:?}", h.phases);
    for (ours, theirs) in shares {
        assert!(
            ours + theirs >= 0.85,
            "the link idles: {ours:.2} + {theirs:.2}"
        );
        let share = ours / (ours + theirs);
        assert!((0.25..=0.75).contains(&share), "share {share:.2}");
    }
}

#[test]
fn acm_steps_and_an_abrupt_fade_are_no_competitor() {
    // The deepest the corpus's channel goes: ACM steps between a quarter of the rate and
    // all of it, then a fade to a fifth and back at once; alone on the link, the model
    // must never take its own queue for another sender's.
    let steps = [
        1.0, 0.5, 0.25, 0.5, 1.0, 0.5, 0.25, 0.25, 1.0, 0.2, 0.2, 1.0, 1.0,
    ];
    let l = move |t: f64| Link {
        rate_bps: 20e6 * steps[((t / 3.0) as usize).min(steps.len() - 1)],
        rtt: 0.6,
        buffer: 20e6 / 8.0 * 0.5,
        loss: 0.0,
        burst: 1.0,
    };
    let mut h = Watch::new();
    let p = run(&mut h, &l, MSS, 39.0);
    println!("phases {:?}", h.phases);
    let q = queue_p95(&p, 5.0, 39.0) * 1e3;
    println!("queue p95 {q:.0} ms");
    assert_eq!(h.entered(Phase::Compete), None, "{:?}", h.phases);
    // The fade to a fifth comes as the window regrows after the step up before it: the
    // drain that follows must not hold the grown window until half of it is back (702 ms
    // when it did, 1.3 s once regrowth after a fade began a round earlier).
    assert!(q <= 600.0, "queue p95 {q:.0} ms");
}

#[test]
fn two_cubic_downloads_share_the_simulated_bottleneck() {
    // The simulator's competitor against itself, so that what the model gets beside it is
    // read against a fair share the simulator can give.
    let mut a = sim::Cubic::new(MSS);
    let mut b = sim::Cubic::new(MSS).starting_at(8.0);
    let p = sim::run_shared(
        &mut [&mut a, &mut b],
        &link(3.4e6, 0.617, 0.309, 0.0),
        MSS,
        90.0,
    );
    let first = goodput(&p[0], MSS, 60.0, 90.0) / limit(3.4e6);
    let second = goodput(&p[1], MSS, 60.0, 90.0) / limit(3.4e6);
    println!(
        "two cubics 60-90 s: {:.1} % and {:.1} %",
        first * 100.0,
        second * 100.0
    );
    assert!(first + second >= 0.85, "the link idles");
    let share = second / (first + second);
    assert!(
        (0.3..=0.7).contains(&share),
        "the newcomer's share {share:.2}"
    );
}

/// The kernel host's send buffer (`satpep_sat`'s `sndbuf_expand`): the kernel's two windows
/// until a segment is lost; then four of the model's path windows, whatever the window is
/// (a start that overshot leaves it at twice the path's), within 2-16 of the host's windows.
#[test]
fn a_lossy_connection_gets_a_send_buffer_of_four_path_windows() {
    let mut h = KernelHost::new(MSS as u32);
    run(&mut h, &link(50e6, 0.6, 2.0, 0.01), MSS, 20.0);
    let path = h.model.bw() as f64 * h.model.base_rtt_us().unwrap() as f64 / 1e6 / MSS as f64;
    assert!((2000.0..2700.0).contains(&path), "path window {path:.0}");
    let w = |cwnd: u32, lost: bool| h.model.send_windows(cwnd, MSS as u32, lost);
    let at_path = path as u32;
    assert_eq!(w(at_path, false), 2, "nothing lost: the kernel's own");
    let four = w(at_path, true);
    assert!(
        (4..=5).contains(&four),
        "at the path's window: {four} windows"
    );
    assert_eq!(
        w(2 * at_path, true),
        2,
        "the start's window already holds four"
    );
    assert_eq!(w(10, true), 16, "bounded");
    // Before anything is measured, the kernel's two.
    let fresh = KernelHost::new(MSS as u32);
    assert_eq!(fresh.model.send_windows(100, MSS as u32, true), 2);
}

#[test]
fn after_a_fade_on_a_shallow_buffer_the_rate_comes_back_within_seconds() {
    // Seed 39's L07: MEO 78 Mbit/s over 171 ms, faded to a quarter for 6 s; its 16 ms buffer
    // is no shallower than the 15 ms slack (the model finds it only when growth overshoots),
    // so 10 ms here. A shallow buffer shows no queue when the window is too small either: probes,
    // and rounds that lost nothing beyond the noise, find the rate again. The first fade
    // comes before the buffer is known (the simulator finds it after that fade), the
    // second after it.
    let l = faded(78e6, 20e6, &[18.0..24.0, 40.0..46.0], 0.171, 0.010);
    let mut w = Watch::new();
    let p = run(&mut w, &l, MSS, 60.0);
    let known = w.shallow_at.expect("the buffer was not found");
    assert!(known < 40.0, "the buffer found at {known:.1} s");
    report("in the fade", &w.host, &p, 20e6, 41.0, 46.0);
    let (g, q) = report("after the fade", &w.host, &p, 78e6, 48.0, 60.0);
    assert!(
        g >= 0.85,
        "goodput {g:.3} of the limit 2-14 s after the fade"
    );
    assert!(q <= 20.0, "queue p95 {q:.1} ms");
}

/// The model's goodput in `from..to` s as a share of what constant-rate UDP of `udp_bps`
/// leaves of `link` (integrated over its rate changes), printed with the queue's p95;
/// `p` is `run_shared`'s packets, the model's first.
fn share_beside_udp(
    p: &[Vec<sim::Packet>],
    link: &dyn Fn(f64) -> Link,
    udp_bps: f64,
    from: f64,
    to: f64,
) -> f64 {
    let steps = ((to - from) * 100.0).round() as usize;
    let free: f64 = (0..steps)
        .map(|i| limit(link(from + i as f64 * 0.01).rate_bps - udp_bps) * 0.01)
        .sum();
    let g = goodput(&p[0], MSS, from, to) * (to - from) / free;
    let q = queue_p95(&p[1], from, to) * 1e3;
    println!(
        "{from}-{to} s: {:.0} % of what the UDP leaves, queue p95 {q:.0} ms",
        g * 100.0
    );
    g
}

/// The model beside constant-rate UDP of `udp_bps` for `secs` on a link whose rate steps
/// as `sched` says ((from s, bit/s), in order), with `rtt` s and a `buffer` of bytes: its
/// watch and the packets (the model's first), the share of what the UDP leaves printed for
/// each of `spans`.
fn beside_udp_on_steps(
    sched: &[(f64, f64)],
    rtt: f64,
    buffer: f64,
    udp_bps: f64,
    secs: f64,
    spans: &[(f64, f64)],
) -> (Watch, Vec<Vec<sim::Packet>>) {
    let l = |t: f64| Link {
        rate_bps: sched.iter().rev().find(|s| s.0 <= t).unwrap().1,
        rtt,
        buffer,
        loss: 0.0,
        burst: 1.0,
    };
    let mut w = Watch::new();
    let mut c = sim::ConstantRate::new(udp_bps, MSS);
    let p = sim::run_shared(&mut [&mut w, &mut c], &l, MSS, secs);
    println!("phases {:?}", w.phases);
    for &(from, to) in spans {
        share_beside_udp(&p, &l, udp_bps, from, to);
    }
    (w, p)
}

#[test]
fn beside_constant_rate_udp_acm_steps_are_no_competitor() {
    // Seed 39's L11: GEO 5.1 Mbit/s with 1.9 Mbit/s of UDP beside, ACM steps to 3.6 Mbit/s
    // (the TCP's part from 3.2 to 1.7), an 80 KB buffer. The first drains after a step meet
    // the queue built before it, full enough to overflow; read as another sender's, two of
    // them made the model compete with a flow that never yields and kept the buffer full.
    let sched = [
        (0.0, 5.114e6),
        (10.1, 3.631e6),
        (13.5, 5.114e6),
        (20.5, 3.631e6),
    ];
    let spans = [(5.0, 10.1), (12.1, 13.5), (15.5, 20.5), (22.5, 24.0)];
    let (w, _) = beside_udp_on_steps(&sched, 0.558, 80562.0, 1.881e6, 24.0, &spans);
    assert_eq!(w.entered(Phase::Compete), None, "{:?}", w.phases);
}

/// The model on a link that, for its first 10 s, loses a third of what it sends while it
/// drains, one segment here and there (a full buffer that another sender keeps full, or
/// drops the kernel marks late: seed 39's L06 in the lab, where one such drain read a LEO
/// link as losing 50 %, and seed 41's L03, 36-52 % beside UDP on a link that loses
/// nothing), and nothing after. No channel loses that much in separate losses: such drains
/// measure no noise, and the noise does not stand at a third on a clean link.
#[test]
fn a_drain_that_loses_a_third_in_separate_losses_measures_no_noise() {
    let mut h = Watch::new();
    let phase = h.phase_now.clone();
    // The first 10 s: what the drains send loses 35 %; then the link loses nothing.
    let l = move |t: f64| Link {
        rate_bps: 20e6,
        rtt: 0.6,
        buffer: 0.3 * 20e6 / 8.0,
        loss: if phase.get() == Phase::Drain && t < 10.0 {
            0.35
        } else {
            0.0
        },
        burst: 1.0,
    };
    let p = run(&mut h, &l, MSS, 30.0);
    let (g, _) = report("drains losing 35 %", &h.host, &p, 20e6, 15.0, 29.0);
    let drains = h
        .phases
        .iter()
        .filter(|p| p.1 == Phase::Drain && p.0 < 10.0)
        .count();
    assert!(drains >= 1, "{:?}", h.phases);
    let noise = h.host.model.channel_loss().unwrap_or(0.0);
    assert!(noise < 0.05, "noise {noise:.3} after {drains} drains");
    assert!(g >= 0.8, "goodput {g:.3} of the limit");
}

/// Seed 42's L11: 34 Mbit/s over 636 ms with a 517 ms buffer and 10.4 Mbit/s of UDP beside,
/// faded to 15.9 Mbit/s for 5.4 s (the TCP's part from 24.1 to 5.6 Mbit/s) just as the start
/// ends (in the lab the tunnel's drain then held the start's window for 6 s and regrew from
/// a sixth of the link 3 s after the fade ended). Once it ends, the model is back at the rate
/// the UDP leaves within four seconds (six round trips): one round with no queue says so, far
/// below the peak, and the window doubles up to half the peak's.
#[test]
fn after_a_fade_that_met_the_start_s_end_the_rate_is_back_within_seconds() {
    const FADE: (f64, f64) = (4.0, 9.4);
    let l = |t: f64| Link {
        rate_bps: if (FADE.0..FADE.1).contains(&t) {
            15.91e6
        } else {
            34.46e6
        },
        rtt: 0.636,
        buffer: 2228260.0,
        loss: 0.0,
        burst: 1.0,
    };
    let udp = 10.35e6;
    let mut w = Watch::new();
    let mut c = sim::ConstantRate::new(udp, MSS);
    let p = sim::run_shared(&mut [&mut w, &mut c], &l, MSS, 30.0);
    println!("phases {:?}", w.phases);
    let share = |from: f64, to: f64| share_beside_udp(&p, &l, udp, from, to);
    share(FADE.0, FADE.1);
    share(FADE.1, FADE.1 + 4.0);
    let back = share(FADE.1 + 4.0, FADE.1 + 8.0);
    share(FADE.1 + 8.0, 30.0);
    assert!(
        back >= 0.9,
        "{:.3} of what the UDP leaves 4-8 s after the fade",
        back
    );
    assert_eq!(w.entered(Phase::Compete), None, "{:?}", w.phases);
}

/// Seed 43's L04: MEO 214 Mbit/s over 156 ms with a 1.7 s buffer and 26.7 Mbit/s of UDP
/// beside, ACM steps down to a quarter (the TCP's part from 187 to 27 Mbit/s, a seventh).
/// In the lab the tunnel's drains cut its rate below an eighth of its peak at the trough,
/// took that for "beyond any fade" and competed with the UDP: its window grew into the
/// bloated buffer, 5.4 s of queue. Open (docs/corpus.md, "UDP that fits the link"): the
/// model fails it (queue p95 6.7 s); the rules tried for it were reverted.
#[test]
#[ignore = "open: the depth rule takes a deep trough beside UDP for a competitor (docs/corpus.md)"]
fn beside_constant_rate_udp_a_deep_acm_trough_is_no_competitor() {
    let sched = [
        (0.0, 213.6e6),
        (2.6, 106.8e6),
        (4.6, 75.8e6),
        (9.3, 53.8e6),
        (14.1, 53.4e6),
        (18.3, 75.3e6),
        (22.3, 150.6e6),
        (25.8, 213.6e6),
    ];
    let spans = [
        (5.0, 9.3),
        (11.3, 18.3),
        (20.3, 22.3),
        (24.3, 25.8),
        (27.8, 30.0),
    ];
    let buffer = 213.6e6 / 8.0 * 1.684;
    let (w, p) = beside_udp_on_steps(&sched, 0.156, buffer, 26.7e6, 30.0, &spans);
    let q = queue_p95(&p[1], 5.0, 30.0) * 1e3;
    println!("queue p95 5-30 s {q:.0} ms");
    assert_eq!(w.entered(Phase::Compete), None, "{:?}", w.phases);
    // 6.7 s as the model is; 78 ms with a drain whose queue halved draining again uncut
    // (fec2acc, reverted).
    assert!(q <= 200.0, "queue p95 {q:.0} ms");
}

/// An ACM step back up on GEO (the rate halved for 4 s, then whole again): the window
/// at the halved model meets no queue, and one such round, this far under the peak, is
/// enough to grow again (two rounds were: 84.5 % over the 6 s after the step up).
#[test]
fn after_an_acm_step_up_on_geo_the_rate_is_back_within_a_few_round_trips() {
    let rate = 50e6;
    let l = move |t: f64| Link {
        rate_bps: if (10.0..14.0).contains(&t) {
            rate / 2.0
        } else {
            rate
        },
        rtt: 0.56,
        buffer: rate / 8.0 * 0.13,
        loss: 0.0,
        burst: 1.0,
    };
    let mut h = KernelHost::new(MSS as u32);
    let p = run(&mut h, &l, MSS, 22.0);
    let (g, q) = report("GEO 50 Mbit/s, halved for 4 s", &h, &p, rate, 14.0, 20.0);
    assert!(g >= 0.87, "goodput {g:.3} of the limit after the step up");
    assert!(q <= 120.0, "queue p95 {q:.1} ms");
}

/// Seed 42's L02 without its competitor: a fade to a third during the start, then the
/// whole 240 Mbit/s again, over a 6 ms buffer the start's overflow showed. The model never
/// saw the link's rate, and a shallow buffer shows no queue: only lossless rounds with no
/// queue say the window is too small (probes of a few segments held a third of the link
/// for 20 s: 35.2 % from 12 s on).
#[test]
fn a_fade_the_start_met_on_a_shallow_buffer_is_left_within_seconds() {
    let l = faded(240e6, 76e6, &[3.4..10.2], 0.72, 0.006);
    let mut h = Watch::new();
    let p = run(&mut h, &l, MSS, 30.0);
    let (g, q) = report(
        "240 Mbit/s faded during the start, 6 ms buffer",
        &h.host,
        &p,
        240e6,
        12.0,
        29.0,
    );
    assert!(
        h.host.model.shallow_buffer_us().is_some(),
        "the start's overflow showed the buffer"
    );
    assert!(g >= 0.8, "goodput {g:.3} of the limit from 12 s on");
    assert!(q <= 10.0, "queue p95 {q:.1} ms");
    assert_eq!(h.entered(Phase::Compete), None, "{:?}", h.phases);
}

/// The `throughput` preset's link (and proxy_split's test of it): 1 Gbit/s, 5 ms RTT, an
/// 8 ms buffer. A sender paced at the model's rate queues nothing there at the matched
/// rate: rounds that read no queue looked idle, and regrowth overflowed the buffer every
/// few rounds (the lab: 8-9 % of the segments retransmitted from 4 to 7 s).
#[test]
fn a_fast_short_path_over_a_buffer_shallower_than_the_budget_is_not_overflowed() {
    let mut h = KernelHost::new(MSS as u32);
    let p = run(&mut h, &link(1e9, 0.005, 0.008, 0.0), MSS, 8.0);
    let (g, _) = report("1 Gbit/s, 5 ms, 8 ms buffer", &h, &p, 1e9, 4.0, 7.0);
    let sent = p.iter().filter(|x| x.sent >= 4.0 && x.sent < 7.0);
    let (lost, all) = sent.fold((0, 0), |(l, n), x| (l + x.acked.is_none() as usize, n + 1));
    println!("lost {lost} of {all}");
    assert!(
        h.model.shallow_buffer_us().is_some(),
        "the buffer was not found"
    );
    assert!(g >= 0.9, "goodput {g:.3} of the limit");
    assert!((lost as f64) < 0.01 * all as f64, "lost {lost} of {all}");
}

/// Corpus seed 45's L07: LEO 240 Mbit/s over 32 ms, a 1 s buffer, 0.36 % of the segments
/// lost at random. A drain of a few hundred segments that lost none measured no noise, and
/// two rounds after it whose random losses exceeded none, with no queue, made the buffer
/// "0.7 ms": split's model fell from 224 to 32 Mbit/s in the lab. A noise nobody measured
/// yet is no evidence of a shallow buffer.
#[test]
fn random_losses_after_a_clean_drain_are_no_shallow_buffer() {
    let mut h = KernelHost::new(MSS as u32);
    let p = run(&mut h, &link(240e6, 0.032, 1.0, 0.0036), MSS, 20.0);
    let (g, _) = report(
        "240 Mbit/s, 32 ms, 1 s buffer, 0.36 %",
        &h,
        &p,
        240e6,
        5.0,
        20.0,
    );
    assert_eq!(
        h.model.shallow_buffer_us(),
        None,
        "a 1 s buffer read as shallow"
    );
    assert!(g >= 0.9, "goodput {g:.3} of the limit");
}

/// Corpus seed 46's L04: 3.5 Mbit/s over 720 ms, a buffer of four frames. The kernel paces
/// a connection only from its tenth segment on (`sim::KernelHost` does too), so the first
/// ten meet the four-frame buffer at once and six are lost: one burst in the first round, a
/// quarter of what the first ACKs reported. Read as a full pipe it ended the start at the
/// first round's 1.1 Mbit/s (split in the lab: 53-63 % of the limit, every run; BBR 92 %).
/// One burst is not a bottleneck dropping what exceeds it.
#[test]
fn the_unpaced_first_flight_meeting_a_tiny_buffer_does_not_end_the_start() {
    let mut h = Watch::new();
    let buffer = 6056.0 * 8.0 / 3.5e6;
    let p = run(&mut h, &link(3.5e6, 0.72, buffer, 0.0), MSS, 20.0);
    let lost = p
        .iter()
        .filter(|x| x.sent < 0.1 && x.acked.is_none())
        .count();
    println!("first flight: lost {lost}; phases {:?}", h.phases);
    assert!(lost >= 4, "the first flight met the buffer: {lost} lost");
    let (g, _) = report(
        "3.5 Mbit/s, 720 ms, 4 frames",
        &h.host,
        &p,
        3.5e6,
        5.0,
        20.0,
    );
    assert!(g >= 0.9, "goodput {g:.3} of the limit from 5 s on");
    // The start's end: the first drain, which must come from a round that filled the link.
    let drain = h.entered(Phase::Drain).expect("the start ended");
    assert!(
        drain > 2.0 * 0.72,
        "the start ended at {drain:.2} s, in its first round"
    );
}

#[test]
fn a_leo_handover_that_lengthens_the_path_is_no_competitor() {
    // Seed 39's L06: LEO 183 Mbit/s over 28 ms with a 204 kB buffer (9 ms) and BER 2e-7,
    // a handover at 12 s lengthening the path (15-21 ms there; 10 to 60 ms here) while a
    // slow ramp takes the rate to 101 Mbit/s and back. Before the longer path was told from
    // a queue, 21 ms and more cut the rate to 15 Mbit/s and the model competed with the old
    // base RTT (71 % of the limit after the ramp, 37 % with 45 ms); 10-15 ms, within the
    // budget, let the rate filter follow the too-small window down until the base RTT
    // filter's span passed (78 % through the handover with 15 ms).
    for step in [0.010, 0.015, 0.021, 0.045, 0.060] {
        let l = move |t: f64| {
            let rate = if t < 8.0 {
                183e6
            } else if t < 14.0 {
                183e6 - (t - 8.0) / 6.0 * 82e6
            } else if t < 18.0 {
                101e6
            } else if t < 24.0 {
                101e6 + (t - 18.0) / 6.0 * 82e6
            } else {
                183e6
            };
            Link {
                rate_bps: rate,
                rtt: if t < 12.0 { 0.028 } else { 0.028 + step },
                buffer: 204_081.0,
                loss: 0.0024,
                burst: 1.0,
            }
        };
        let mut w = Watch::new();
        let p = run(&mut w, &l, MSS, 40.0);
        println!(
            "{step} s longer: phases {:?}",
            &w.phases[w.phases.len().saturating_sub(8)..]
        );
        // 12-18 s: the link's mean rate is 105.2 Mbit/s (126 -> 101 by 14 s, then 101).
        let name = format!("{:.0} ms longer, through the handover", step * 1e3);
        let (through, _) = report(&name, &w.host, &p, 105.2e6, 12.0, 18.0);
        let name = format!("{:.0} ms longer, after the ramp", step * 1e3);
        let (g, q) = report(&name, &w.host, &p, 183e6, 26.0, 40.0);
        assert_eq!(w.entered(Phase::Compete), None, "{step}: {:?}", w.phases);
        assert!(
            through >= 0.85,
            "{step}: goodput {through:.3} through the handover"
        );
        assert!(g >= 0.85, "{step}: goodput {g:.3}");
        assert!(q <= 20.0, "{step}: queue p95 {q:.1} ms");
    }
}

/// A hub's gateway holds the connection to a share of its carrier and counts the times it
/// freed carrier (`sat_model_follow_share`): a share that grew with the count is run at once,
/// a share within an eighth of the model or a count already seen is not, and a second one
/// waits eight RTTs and a second.
#[test]
fn a_share_that_grew_with_freed_carrier_is_followed_now_and_then() {
    let mut h = KernelHost::new(MSS as u32);
    let p = run(&mut h, &link(20e6, 0.6, 1.0, 0.0), MSS, 20.0);
    report("20 Mbit/s GEO", &h, &p, 20e6, 5.0, 20.0);
    let bw = h.model.bw() as u32;
    let t = 20_000_000;
    h.model.follow_share(&h.ack_now(t), bw + bw / 16, 1);
    assert_eq!(
        h.model.bw() as u32,
        bw,
        "a share within an eighth was followed"
    );
    h.model.follow_share(&h.ack_now(t), 2 * bw, 1);
    assert_eq!(h.model.bw() as u32, bw, "a count already seen was followed");
    h.model.follow_share(&h.ack_now(t), 2 * bw, 2);
    assert_eq!(
        h.model.bw() as u32,
        2 * bw,
        "a grown share with a new count"
    );
    assert_eq!(h.model.phase(), Phase::Cruise);
    // Eight RTTs of about 650 ms: 5.2 s before the next.
    h.model.follow_share(&h.ack_now(t + 4_000_000), 3 * bw, 3);
    assert_eq!(
        h.model.bw() as u32,
        2 * bw,
        "followed again within eight RTTs"
    );
    h.model.follow_share(&h.ack_now(t + 6_000_000), 3 * bw, 3);
    assert_eq!(h.model.bw() as u32, 3 * bw);
}

/// A split gateway's ceiling that came after the start had passed it (the start reaches a
/// 10 Mbit/s share over 30 ms in about 0.1 s, before a gateway's first reading of its
/// terminals, while the two starts queue at the carrier): the start, held there, fills no
/// round, so it ends at the share instead of growing its window for ever (CI's star test:
/// 924 segments 2.4 s in, still starting).
#[test]
fn a_start_held_at_its_share_ends_at_it() {
    let share = 10e6 / 8.0;
    for from_ms in (0..400).step_by(10) {
        let mut a = KernelHost::new(MSS as u32);
        let mut b = KernelHost::new(MSS as u32);
        a.ceiling = vec![(0, 2 * share as u32, 0), (from_ms * 1000, share as u32, 0)];
        b.ceiling = vec![(from_ms * 1000, share as u32, 0)];
        let p = sim::run_shared(
            &mut [&mut a, &mut b],
            &link(20e6, 0.03, 1.0, 0.0),
            MSS,
            10.0,
        );
        for (h, p) in [(&a, &p[0]), (&b, &p[1])] {
            let name = format!("20 Mbit/s, 30 ms, two held to 10 from {from_ms} ms");
            let (g, _) = report(&name, h, p, 10e6, 1.0, 10.0);
            assert_ne!(h.model.phase(), Phase::Startup, "{name}");
            assert!(h.model.cwnd() < 200, "{name}: window {}", h.model.cwnd());
            assert!(g >= 0.9, "{name}: goodput {g:.3} of the share");
        }
    }
}
