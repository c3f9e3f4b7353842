//! satpep's BPF congestion controls, in the kernel, on the emulated link: each grows and
//! reacts to loss as its definition says. A sender in the server namespace selects the
//! controller with TCP_CONGESTION and its TCP_INFO is sampled every 2 ms; the receiver in the
//! client namespace has a fixed 64 MiB window so only the congestion window limits.

mod common;

use common::*;
use satpep_lab::{Host, Lab};
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::time::{Duration, Instant};

/// One TCP_INFO sample of the sender.
#[derive(Debug, Clone, Copy)]
struct Sample {
    /// Seconds since the connection was accepted.
    t: f64,
    cwnd: u32,
    /// u32::MAX while infinite.
    ssthresh: u32,
    rtt_ms: f64,
    min_rtt_ms: f64,
    retrans: u32,
}

/// A controller loaded for one test; tests that load the same name take turns.
struct Held {
    _cc: satpep_cc::Loaded,
    _turn: std::sync::MutexGuard<'static, ()>,
}

/// The lock of controller `name`: the kernel registers a name once, so two tests loading it
/// in parallel (each with its own options) would refuse each other ("already registered").
fn turn(name: &str) -> std::sync::MutexGuard<'static, ()> {
    use std::collections::HashMap;
    use std::sync::{Mutex, OnceLock};
    static LOCKS: OnceLock<Mutex<HashMap<String, &'static Mutex<()>>>> = OnceLock::new();
    let lock = *LOCKS
        .get_or_init(Default::default)
        .lock()
        .unwrap()
        .entry(name.to_string())
        .or_insert_with(|| Box::leak(Box::new(Mutex::new(()))));
    // A test that failed holding it poisoned it; the next one still gets its turn.
    lock.lock().unwrap_or_else(|e| e.into_inner())
}

/// Loads `name` for this test (replacing a pinned copy, so the options here apply).
fn load(name: &str, rtt0_ms: u32) -> Held {
    let turn = turn(name);
    let _ = satpep_cc::unpin(name);
    // A socket may still hold the unpinned one for a moment.
    for _ in 0..50 {
        if !satpep_cc::available().iter().any(|a| a == name) {
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let cc = satpep_cc::load(
        name,
        &satpep_cc::Options {
            rtt0_us: rtt0_ms * 1000,
            capacity_kbps: 0,
        },
    )
    .unwrap_or_else(|e| panic!("{e}"));
    Held {
        _cc: cc,
        _turn: turn,
    }
}

/// A bulk transfer server → client for `secs` with congestion control `cc`; the sender's
/// TCP_INFO every 2 ms.
fn bulk(lab: &Lab, cc: &'static str, secs: f64) -> Vec<Sample> {
    let listener = in_netns(&lab.ns(Host::Server), move || {
        let l = TcpListener::bind("0.0.0.0:9500").unwrap();
        satpep_proxy::sockets::set_congestion(l.as_raw_fd(), cc)
            .unwrap_or_else(|e| panic!("TCP_CONGESTION {cc}: {e}; is it loaded?"));
        // Large enough never to limit these links (4 x their largest BDP).
        satpep_proxy::sockets::setopt_int(
            l.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_SNDBUFFORCE,
            16 << 20,
        )
        .unwrap();
        l
    })
    .join()
    .unwrap();
    let sender = std::thread::spawn(move || {
        let (mut s, _) = listener.accept().unwrap();
        let fd = s.as_raw_fd();
        let start = Instant::now();
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let stop2 = stop.clone();
        let sampler = std::thread::spawn(move || {
            let mut out = Vec::new();
            while !stop2.load(std::sync::atomic::Ordering::Relaxed) {
                if let Some(i) = satpep_proxy::tcpinfo::read(fd) {
                    out.push(Sample {
                        t: start.elapsed().as_secs_f64(),
                        cwnd: i.cwnd,
                        ssthresh: i.ssthresh.unwrap_or(u32::MAX),
                        rtt_ms: i.rtt_ms,
                        min_rtt_ms: i.min_rtt_ms,
                        retrans: i.total_retrans,
                    });
                }
                std::thread::sleep(Duration::from_millis(2));
            }
            out
        });
        let chunk = vec![0x5au8; 1 << 20];
        // Blocking writes wake up at least every 100 ms to look at the clock.
        s.set_write_timeout(Some(Duration::from_millis(100)))
            .unwrap();
        while start.elapsed().as_secs_f64() < secs {
            match s.write(&chunk) {
                Ok(_) => {}
                Err(e)
                    if matches!(
                        e.kind(),
                        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                    ) => {}
                Err(_) => break,
            }
        }
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        let samples = sampler.join().unwrap();
        // A reset, not a FIN: the receiver need not drain the send buffer.
        socket2::SockRef::from(&s)
            .set_linger(Some(Duration::ZERO))
            .unwrap();
        drop(s);
        samples
    });
    let receiver = in_netns(&lab.ns(Host::Client), || {
        let sock =
            socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
        // Fixed, large window: no receive-window autotuning in the way.
        satpep_proxy::sockets::setopt_int(
            sock.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_RCVBUFFORCE,
            128 << 20,
        )
        .unwrap();
        sock.connect(
            &"198.18.3.2:9500"
                .parse::<std::net::SocketAddr>()
                .unwrap()
                .into(),
        )
        .unwrap();
        let mut s: TcpStream = sock.into();
        let mut buf = vec![0u8; 1 << 20];
        while matches!(s.read(&mut buf), Ok(n) if n > 0) {}
    });
    let samples = sender.join().unwrap();
    receiver.join().unwrap();
    assert!(samples.len() > 100, "too few TCP_INFO samples");
    samples
}

/// Runs of at least `min_ms` with the same cwnd: the window between two rounds of ACKs.
fn plateaus(s: &[Sample], min_ms: f64) -> Vec<(f64, u32)> {
    let mut out: Vec<(f64, u32)> = Vec::new();
    let mut i = 0;
    while i < s.len() {
        let mut j = i;
        while j + 1 < s.len() && s[j + 1].cwnd == s[i].cwnd {
            j += 1;
        }
        if (s[j].t - s[i].t) * 1000.0 >= min_ms && out.last().map(|p| p.1) != Some(s[i].cwnd) {
            out.push((s[i].t, s[i].cwnd));
        }
        i = j + 1;
    }
    out
}

/// Loss events: the first retransmission after at least 300 ms without any. Returns (time,
/// largest cwnd in the 300 ms before, ssthresh 20 ms later, when recovery has set it).
fn losses(s: &[Sample]) -> Vec<(f64, u32, u32)> {
    let mut out = Vec::new();
    let mut last_retrans_t = f64::NEG_INFINITY;
    for k in 1..s.len() {
        if s[k].retrans > s[k - 1].retrans {
            if s[k].t - last_retrans_t >= 0.3 {
                let before = s[..k]
                    .iter()
                    .rev()
                    .take_while(|x| s[k].t - x.t < 0.3)
                    .map(|x| x.cwnd)
                    .max()
                    .unwrap_or(s[k - 1].cwnd);
                let after = at(s, s[k].t + 0.02).ssthresh.min(s[k].ssthresh);
                out.push((s[k].t, before, after));
            }
            last_retrans_t = s[k].t;
        }
    }
    out
}

/// RTTs elapsed between two samples, integrating 1 / sRTT.
fn rounds(s: &[Sample], from: f64, to: f64) -> f64 {
    s.windows(2)
        .filter(|w| w[0].t >= from && w[1].t <= to)
        .map(|w| (w[1].t - w[0].t) * 1000.0 / w[0].rtt_ms.max(1.0))
        .sum()
}

fn at(s: &[Sample], t: f64) -> Sample {
    *s.iter().find(|x| x.t >= t).unwrap_or(s.last().unwrap())
}

fn dump(s: &[Sample]) -> String {
    s.iter()
        .step_by((s.len() / 60).max(1))
        .map(|x| {
            format!(
                "{:.2}s cwnd {} ssthresh {} rtt {:.1} retrans {}",
                x.t, x.cwnd, x.ssthresh, x.rtt_ms, x.retrans
            )
        })
        .collect::<Vec<_>>()
        .join("\n")
}

#[test]
fn hybla_multiplies_by_2_to_the_rho_per_rtt_then_adds_rho_squared() {
    // RTT 200 ms and RTT0 100 ms: rho = 2, so slow start x4 per RTT and avoidance +4 per RTT.
    let _cc = load("satpep_hybla", 100);
    let lab = lab(
        "cchy",
        "[both]\nrate='100Mbit'\ndelay='100ms'\nqueue='8MB'\n",
    );
    let mut s = bulk(&lab, "satpep_hybla", 6.0);
    if !(400..=6600).contains(&at(&s, 2.0).ssthresh) {
        // No estimate (every ACK of the initial window came bunched: the designed fallback,
        // Reno's slow start until the first loss), or one read from ACKs the emulator bunched
        // on a loaded machine (7942, 4.8 x the BDP, in a CI run: 25 us a segment, just above
        // the 20 us floor). Each seen once. Once more: a controller that never estimates, or
        // always misreads, still fails below.
        s = bulk(&lab, "satpep_hybla", 6.0);
    }
    let p = plateaus(&s, 25.0);
    // The estimated ssthresh: the path's BDP (100 Mbit/s x 200 ms / 1514-byte frames ~ 1651),
    // within the packet-pair estimate's accuracy: delayed ACKs bunch the window's ACKs, and it
    // has read 1978-2457 here (+20 to +49 %), and in CI runs with this file's labs running
    // side by side 3257 (+97 %), 1008 (-39 %), 723 (-56 %) and once 7942 (+381 %, retried
    // above). The test is that it is within a factor of four of the BDP, not absurd (a few
    // packets, or the initial "infinite" 2^31 - 1); the growth checks below are Hybla's own.
    let ssthresh = at(&s, 2.0).ssthresh;
    assert!(
        (400..=6600).contains(&ssthresh),
        "ssthresh {ssthresh} not the BDP\n{}",
        dump(&s)
    );
    // Hybla's slow start: each round 4x the last (between the first rounds, which are Reno's
    // until the estimate, and ssthresh).
    let growth: Vec<f64> = p
        .windows(2)
        .filter(|w| w[0].1 >= 20 && w[1].1 < ssthresh)
        .map(|w| w[1].1 as f64 / w[0].1 as f64)
        .collect();
    assert!(growth.len() >= 2, "plateaus {p:?}\n{}", dump(&s));
    println!("hybla: ssthresh {ssthresh}, slow start x{growth:.2?} per RTT (want 4)");
    for g in &growth {
        assert!(
            (3.5..=4.5).contains(g),
            "slow start x{g} per RTT, want 4: {p:?}"
        );
    }
    // Congestion avoidance: rho^2 = 4 segments per RTT.
    let (a, b) = (at(&s, 2.5), at(&s, 5.5));
    let per_rtt = (b.cwnd as f64 - a.cwnd as f64) / rounds(&s, 2.5, 5.5);
    assert!(
        (3.2..=4.8).contains(&per_rtt),
        "avoidance +{per_rtt:.2} per RTT, want 4\n{}",
        dump(&s)
    );
    assert_eq!(b.retrans, 0, "no loss expected with an 8 MB queue");
    println!("hybla: avoidance +{per_rtt:.2} segments per RTT (want 4)");
}

/// The last loss event after `after` seconds, or a failure showing the samples.
fn last_loss(s: &[Sample], after: f64) -> (f64, u32, u32) {
    *losses(s)
        .iter()
        .rev()
        .find(|l| l.0 > after)
        .unwrap_or_else(|| panic!("no loss after {after} s\n{}", dump(s)))
}

/// Bandwidth-delay product in segments of a 10 Mbit/s link, RTT 100 ms, 1514-byte frames.
const BDP_10M_100MS: f64 = 10e6 * 0.1 / (1514.0 * 8.0);

/// The longest stretch without retransmissions, less its first 300 ms (recovery ending).
fn quiet_stretch(s: &[Sample]) -> (f64, f64) {
    let mut best = (0.0, 0.0);
    let mut start = 0;
    for k in 1..=s.len() {
        if k == s.len() || s[k].retrans != s[start].retrans {
            let (a, b) = (s[start].t + 0.3, s[k - 1].t);
            if b - a > best.1 - best.0 {
                best = (a, b);
            }
            start = k;
        }
    }
    best
}

/// A small queue (20 frames) on a 10 Mbit/s, 100 ms RTT link: avoidance reaches it every
/// couple of seconds.
const LOSSY_QUEUE: &str = "[both]\nrate='10Mbit'\ndelay='50ms'\nqueue='30KB'\n";

#[test]
fn hybla_halves_the_window_on_loss() {
    let _cc = load("satpep_hybla", 25);
    let lab = lab("cchl", LOSSY_QUEUE);
    let s = bulk(&lab, "satpep_hybla", 6.0);
    let (t, before, ssthresh) = last_loss(&s, 1.0);
    let ratio = ssthresh as f64 / before as f64;
    println!("hybla: loss at cwnd {before} -> ssthresh {ssthresh} ({ratio:.3}, want 0.5)");
    assert!(
        (0.42..=0.58).contains(&ratio),
        "loss at {t:.2}s: ssthresh {ssthresh} from cwnd {before} ({ratio:.2}), want 1/2\n{}",
        dump(&s)
    );
}

#[test]
fn westwood_sets_ssthresh_to_the_measured_pipe() {
    let _cc = load("satpep_westwood", 25);
    // 10 Mbit/s, RTT 40 ms (BDP 33 segments), a 4-frame queue: losses every half second.
    let lab = lab("ccww", "[both]\nrate='10Mbit'\ndelay='20ms'\nqueue='6KB'\n");
    let s = bulk(&lab, "satpep_westwood", 12.0);
    // Once the estimate has settled: ssthresh = BWE x RTTmin, the BDP, where Reno would take
    // half of BDP + queue (~0.56 BDP). Read from 6 s on: a start that collapsed to two
    // segments (losses in the first RTTs at the 4-frame queue) still climbed through 17-22
    // from 3 to 5 s and reached 27-28 by 7 s (a clean-clone CI run: median 0.70 from 4 s).
    let bdp = 10e6 * 0.04 / (1514.0 * 8.0);
    let mut late: Vec<u32> = s.iter().filter(|x| x.t > 6.0).map(|x| x.ssthresh).collect();
    late.sort_unstable();
    let ssthresh = late[late.len() / 2];
    let ratio = ssthresh as f64 / bdp;
    println!(
        "westwood: median ssthresh {ssthresh} = {ratio:.2} x BDP ({bdp:.1}; want 1, Reno ~0.56)"
    );
    // Up to 1.3: on a busy machine ACKs bunch up and the bandwidth samples run high (1.15
    // seen in CI beside a build); Reno's ~0.56 stays far outside.
    assert!(
        (0.75..=1.3).contains(&ratio),
        "median ssthresh {ssthresh} after 6 s is {ratio:.2} x BDP, want ~1\n{}",
        dump(&s)
    );
}

#[test]
fn scalable_grows_one_percent_per_rtt_and_loses_an_eighth() {
    let _cc = load("satpep_scalable", 25);
    // Large enough windows (> 100 segments) for the multiplicative increase.
    let lab = lab(
        "ccsc",
        "[both]\nrate='50Mbit'\ndelay='50ms'\nqueue='300KB'\n",
    );
    let s = bulk(&lab, "satpep_scalable", 8.0);
    let (t, before, ssthresh) = last_loss(&s, 1.0);
    let ratio = ssthresh as f64 / before as f64;
    println!("scalable: loss at cwnd {before} -> ssthresh {ssthresh} ({ratio:.3}, want 0.875)");
    assert!(
        (0.83..=0.92).contains(&ratio),
        "loss at {t:.2}s: ssthresh {ssthresh} from cwnd {before} ({ratio:.3}), want 7/8\n{}",
        dump(&s)
    );
    // Growth between the losses: 1 % of cwnd per RTT (cwnd > 100).
    let gap = quiet_stretch(&s);
    assert!(
        gap.1 - gap.0 > 0.6,
        "no long loss-free stretch\n{}",
        dump(&s)
    );
    let (a, b) = (at(&s, gap.0), at(&s, gap.1));
    let per_rtt = ((b.cwnd as f64 / a.cwnd as f64).ln() / rounds(&s, gap.0, gap.1)).exp() - 1.0;
    println!("scalable: +{:.2} % per RTT (want 1 %)", per_rtt * 100.0);
    assert!(
        (0.006..=0.014).contains(&per_rtt),
        "growth {:.2} % per RTT between {:.2}s and {:.2}s, want 1 %\n{}",
        per_rtt * 100.0,
        gap.0,
        gap.1,
        dump(&s)
    );
}

/// RFC 3649's b(w), the share of the window a loss takes.
fn hstcp_b(w: f64) -> f64 {
    if w <= 38.0 {
        return 0.5;
    }
    (0.1 - 0.5) * (w.ln() - 38f64.ln()) / (83000f64.ln() - 38f64.ln()) + 0.5
}

#[test]
fn highspeed_decreases_by_b_of_w() {
    let _cc = load("satpep_hstcp", 25);
    // 20 Mbit/s, RTT 100 ms (BDP 165 segments), a 20-frame queue: losses in avoidance at
    // ~185 segments, where b(w) = 0.42 (Reno: 0.5).
    let lab = lab(
        "cchs",
        "[both]\nrate='20Mbit'\ndelay='50ms'\nqueue='30KB'\n",
    );
    let s = bulk(&lab, "satpep_hstcp", 10.0);
    let (t, before, ssthresh) = last_loss(&s, 3.0);
    let want = 1.0 - hstcp_b(before as f64);
    let ratio = ssthresh as f64 / before as f64;
    println!("hstcp: loss at cwnd {before} -> ssthresh {ssthresh} ({ratio:.3}, want 1 - b(w) = {want:.3})");
    assert!(
        before > 100 && (ratio - want).abs() < 0.04,
        "loss at {t:.2}s: ssthresh {ssthresh} from cwnd {before} ({ratio:.3}), want 1 - b(w) = {want:.3}\n{}",
        dump(&s)
    );
}

#[test]
fn vegas_keeps_only_a_few_segments_queued() {
    let _cc = load("satpep_vegas", 25);
    // A 20-frame queue (24 ms at 10 Mbit/s) that loss-based controls keep overflowing.
    // (Vegas's slow start overshoots, as everyone's does; the loss that ends it leaves a window
    // Vegas then trims, one segment per RTT, to the BDP plus 2-4 segments.)
    let lab = lab(
        "ccvg",
        "[both]\nrate='10Mbit'\ndelay='50ms'\nqueue='30KB'\n",
    );
    let s = bulk(&lab, "satpep_vegas", 8.0);
    let late: Vec<&Sample> = s.iter().filter(|x| x.t > 4.0).collect();
    let queued_ms = late.iter().map(|x| x.rtt_ms - x.min_rtt_ms).sum::<f64>() / late.len() as f64;
    // alpha..beta = 2..4 segments of 1.2 ms each, plus smoothing.
    println!("vegas: mean queueing delay {queued_ms:.1} ms (want 2.4-4.8)");
    assert!(
        (0.5..=8.0).contains(&queued_ms),
        "mean queueing delay {queued_ms:.1} ms, want 2.4-4.8\n{}",
        dump(&s)
    );
    // And it still fills the link: the window is at least the BDP.
    let cwnd = late.iter().map(|x| x.cwnd as f64).sum::<f64>() / late.len() as f64;
    assert!(
        cwnd >= BDP_10M_100MS * 0.95,
        "mean cwnd {cwnd:.0}\n{}",
        dump(&s)
    );
    assert_eq!(
        at(&s, 3.0).retrans,
        s.last().unwrap().retrans,
        "Vegas should cause no loss once settled\n{}",
        dump(&s)
    );
}

#[test]
fn tarang_keeps_its_window_through_random_losses_where_hybla_halves() {
    // 20 Mbit/s, RTT 200 ms (BDP ~330 segments), BER 1e-6: a frame in 83 is lost at random.
    let link = "[both]\nrate='20Mbit'\ndelay='100ms'\n[forward]\nber=1e-6\n";
    let median_late = |cc: &'static str| {
        let lab = lab(
            if cc.ends_with("tarang") {
                "cctr"
            } else {
                "cctrh"
            },
            link,
        );
        let s = bulk(&lab, cc, 8.0);
        let mut w: Vec<u32> = s.iter().filter(|x| x.t > 3.0).map(|x| x.cwnd).collect();
        w.sort_unstable();
        (w[w.len() / 2], dump(&s))
    };
    let _t = load("satpep_tarang", 25);
    let _h = load("satpep_hybla", 25);
    let bdp = 20e6 * 0.2 / (1514.0 * 8.0);
    let (tarang, dt) = median_late("satpep_tarang");
    let (hybla, _) = median_late("satpep_hybla");
    println!(
        "tarang: median cwnd {tarang} = {:.2} x BDP; hybla {hybla}",
        tarang as f64 / bdp
    );
    assert!(
        tarang as f64 >= 0.6 * bdp,
        "Tarang's median cwnd {tarang} against BDP {bdp:.0}\n{dt}"
    );
    assert!(
        tarang > 2 * hybla,
        "Tarang {tarang} should hold far more than Hybla {hybla}"
    );
}

/// Mean queueing delay (smoothed RTT above the minimum) and mean cwnd of samples in
/// `from..to` seconds.
fn queue_and_cwnd(s: &[Sample], from: f64, to: f64) -> (f64, f64) {
    let w: Vec<&Sample> = s.iter().filter(|x| x.t >= from && x.t < to).collect();
    assert!(!w.is_empty(), "no samples in {from}..{to} s\n{}", dump(s));
    let n = w.len() as f64;
    (
        w.iter().map(|x| x.rtt_ms - x.min_rtt_ms).sum::<f64>() / n,
        w.iter().map(|x| x.cwnd as f64).sum::<f64>() / n,
    )
}

#[test]
fn satellite_keeps_a_short_queue_in_a_deep_buffer_through_random_losses() {
    let _cc = load("satpep_sat", 25);
    // 20 Mbit/s, RTT 200 ms (BDP 330 segments), a 1 MB buffer (400 ms) that loss-based
    // controls fill and kernel BBR keeps about a BDP deep; BER 1e-6, a frame in 83 lost.
    let lab = lab(
        "ccsat",
        "[both]\nrate='20Mbit'\ndelay='100ms'\nqueue='1MB'\n[forward]\nber=1e-6\n",
    );
    let s = bulk(&lab, "satpep_sat", 10.0);
    let bdp = 20e6 * 0.2 / (1514.0 * 8.0);
    let (queue, cwnd) = queue_and_cwnd(&s, 4.0, 10.0);
    println!(
        "satpep_sat: mean queueing delay {queue:.1} ms, mean cwnd {cwnd:.0} = {:.2} x BDP",
        cwnd / bdp
    );
    // The window is rate x (base RTT + slack); slack 15 ms, reaction above 30 ms.
    assert!(
        queue <= 40.0,
        "mean queueing delay {queue:.1} ms\n{}",
        dump(&s)
    );
    // Random losses do not shrink it: Reno-like controls hold a fraction of the BDP here.
    assert!(
        cwnd >= 0.9 * bdp,
        "mean cwnd {cwnd:.0} against BDP {bdp:.0}\n{}",
        dump(&s)
    );
}

/// A `satpep_sat` bulk transfer for `secs` over lab `tag`'s `link` whose forward rate
/// follows `trace` (lines of "<seconds> <rate>").
fn sat_through_forward_trace(tag: &str, link: &str, trace: &str, secs: f64) -> Vec<Sample> {
    let file = std::env::temp_dir().join(format!("satpep-{tag}-{}.trace", std::process::id()));
    std::fs::write(&file, trace).unwrap();
    let lab = lab(
        tag,
        &format!("{link}[forward]\nrate_trace='{}'\n", file.display()),
    );
    let s = bulk(&lab, "satpep_sat", secs);
    let _ = std::fs::remove_file(&file);
    s
}

#[test]
fn satellite_follows_a_rate_drop_and_drains_the_queue() {
    let _cc = load("satpep_sat", 25);
    // 20 Mbit/s, then 8 Mbit/s from 6 s of the emulator's clock (a rain fade's step), RTT
    // 200 ms, a 1 MB buffer: 1 s of queue at the lower rate if the window stayed.
    let s = sat_through_forward_trace(
        "ccsatd",
        "[both]\nrate='20Mbit'\ndelay='100ms'\nqueue='1MB'\n",
        "0 20Mbit\n6 8Mbit\n",
        12.0,
    );
    let bdp_low = 8e6 * 0.2 / (1514.0 * 8.0);
    // The connection starts after the emulator, so the drop comes before 6 s of it: from
    // 9 s on the controller has had more than 2 s (10 RTTs) to see the drop and drain.
    let (queue, cwnd) = queue_and_cwnd(&s, 9.0, 12.0);
    println!(
        "satpep_sat after the drop: mean queueing delay {queue:.1} ms, mean cwnd {cwnd:.0} = {:.2} x BDP",
        cwnd / bdp_low
    );
    assert!(
        queue <= 50.0,
        "mean queueing delay {queue:.1} ms after the drop\n{}",
        dump(&s)
    );
    assert!(
        (0.8 * bdp_low..=1.4 * bdp_low).contains(&cwnd),
        "mean cwnd {cwnd:.0} against the new BDP {bdp_low:.0}\n{}",
        dump(&s)
    );
}

#[test]
fn satellite_grows_into_a_step_up_without_a_deep_queue() {
    let _cc = load("satpep_sat", 25);
    // 12 Mbit/s, then 38 Mbit/s from 10 s of the emulator's clock (a rain fade's end, an ACM
    // step up), GEO's RTT of 560 ms, a buffer of 2 s at the higher rate.
    let s = sat_through_forward_trace(
        "ccsatu",
        "[both]\nrate='38Mbit'\ndelay='280ms'\nqueue='10MB'\n",
        "0 12Mbit\n10 38Mbit\n",
        18.0,
    );
    let bdp_high = 38e6 * 0.56 / (1514.0 * 8.0);
    // The connection starts after the emulator, so the step comes before 10 s of it.
    let late: Vec<&Sample> = s.iter().filter(|x| x.t >= 9.0).collect();
    let peak = late
        .iter()
        .map(|x| x.rtt_ms - x.min_rtt_ms)
        .fold(0.0, f64::max);
    let (_, cwnd) = queue_and_cwnd(&s, 15.0, 18.0);
    println!(
        "satpep_sat after the step up: highest queueing delay {peak:.0} ms, mean cwnd from 15 s {cwnd:.0} = {:.2} x BDP",
        cwnd / bdp_high
    );
    // Growing 1.5 x a round into it, the queue shows an RTT late: ended at the budget (50
    // ms here) the growth left a peak of 253-258 ms here; ended at the slack (22 ms), 161.
    assert!(
        peak <= 200.0,
        "highest queueing delay {peak:.0} ms after the step up\n{}",
        dump(&s)
    );
    assert!(
        cwnd >= 0.9 * bdp_high,
        "mean cwnd {cwnd:.0} against the new BDP {bdp_high:.0}\n{}",
        dump(&s)
    );
}

#[test]
fn satellite_remembers_the_path_and_a_new_connection_starts_at_its_rate() {
    let _cc = load("satpep_sat", 25);
    // 20 Mbit/s, RTT 200 ms (BDP 330 segments), a 1 MB buffer.
    let lab = lab(
        "ccsatw",
        "[both]\nrate='20Mbit'\ndelay='100ms'\nqueue='1MB'\n",
    );
    let bdp = 20e6 * 0.2 / (1514.0 * 8.0);
    let cold = bulk(&lab, "satpep_sat", 6.0);
    // The first connection measured the path; the next one to the same destination starts
    // from it (satpep_sat's per-destination memory), the first from 32 segments.
    let warm = bulk(&lab, "satpep_sat", 3.0);
    let first_round = |s: &[Sample]| {
        s.iter()
            .filter(|x| x.t < 0.15)
            .map(|x| x.cwnd)
            .max()
            .unwrap_or(0) as f64
    };
    let (c, w) = (first_round(&cold), first_round(&warm));
    let peak_queue = warm
        .iter()
        .filter(|x| x.t < 2.0 && x.min_rtt_ms > 0.0)
        .map(|x| x.rtt_ms - x.min_rtt_ms)
        .fold(0.0, f64::max);
    println!(
        "first round's window: cold {c:.0}, warm {w:.0} segments (BDP {bdp:.0}); warm start's highest queueing delay in its first 2 s {peak_queue:.0} ms"
    );
    assert!(
        c < 0.3 * bdp,
        "a cold start's first window {c:.0}\n{}",
        dump(&cold)
    );
    assert!(
        w >= 0.8 * bdp,
        "a warm start's first window {w:.0}\n{}",
        dump(&warm)
    );
    assert!(
        peak_queue <= 100.0,
        "warm start's queueing delay peaked at {peak_queue:.0} ms\n{}",
        dump(&warm)
    );
}
