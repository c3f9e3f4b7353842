//! The link corpus: links drawn from seeded distributions, so a benchmark cannot be learnt by
//! heart. A scenario part with `[part.draw]` runs each of its configurations on `links` links
//! drawn with `seed` (the scenario's `seed`, which `lab run --seed` replaces, unless the draw
//! names one): a new seed draws new links, the same seed the same ones.
//!
//! Each link is drawn family by family. Every family's categories are dealt out in turn and
//! then shuffled, so every draw of at least four links holds every category of every family
//! (and about as many of each), whatever the seed:
//!
//! - orbit and path: LEO (a delay schedule with handovers), MEO, GEO, and a terrestrial path
//!   in front of GEO (one-way 14 to 400 ms: RTTs of about 30 to 800 ms);
//! - rate: forward log-uniform 2–500 Mbit/s, return a twentieth to a half of it, within
//!   0.5–50 Mbit/s;
//! - loss: none, a bit error rate log-uniform 1e-8–1e-5 both ways, or Gilbert–Elliott bursts
//!   on the forward link (mean burst 2–50 frames, mean loss 0.05–3 %);
//! - rate changes on the forward link: none, ACM steps (×0.5 to ×2 every 2–5 s, between a
//!   quarter of the rate and all of it), an abrupt fade (to 0.2–0.5 of the rate for 3–8 s and
//!   back at once) or a slow ramp (down to 0.3–0.6 over 5–10 s and back);
//! - buffer: shallow (5–30 ms of the rate), medium (30–300 ms) or bloated (0.3–2 s), and
//!   four full frames at least;
//! - traffic: a download, an upload, a download beside constant-rate UDP (10–40 % of the
//!   forward rate, at most half its lowest rate), or beside an end-to-end TCP download.

use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};
use toml::{Table, Value};

/// `[part.draw]`: how many links to draw, and with which seed.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Draw {
    /// Links drawn (at least 4, so every category of every family is present).
    pub links: usize,
    /// Seed of the draw (default: the scenario's `seed`).
    #[serde(default)]
    pub seed: Option<u64>,
    /// Run the drawn traffic on each link (default); false: only the links are drawn and
    /// the part's own `[traffic]` runs on each (a checked transfer, say).
    #[serde(default = "yes")]
    pub traffic: bool,
}

fn yes() -> bool {
    true
}

/// Orbit and path.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum Orbit {
    /// Low earth orbit: 14–30 ms one way, a handover every 10–20 s.
    Leo,
    /// Medium earth orbit: 60–90 ms one way.
    Meo,
    /// Geostationary: 250–290 ms one way.
    Geo,
    /// A terrestrial path in front of a GEO hop: 290–400 ms one way.
    TerrestrialGeo,
}

/// Loss on the link.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub enum Loss {
    /// No loss but the queue's.
    None,
    /// Independent bit errors, both directions.
    Ber(f64),
    /// Gilbert–Elliott bursts on the forward link: mean loss, mean burst in frames.
    Bursts { loss: f64, burst: f64 },
}

/// How the forward rate changes over time.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum Change {
    /// A fixed rate.
    None,
    /// Adaptive coding and modulation: steps of ×0.5 to ×2 every few seconds.
    Acm,
    /// An abrupt fade and an abrupt recovery.
    Fade,
    /// A slow ramp down and back up.
    Ramp,
}

/// What runs across the link.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum Load {
    /// A bulk download.
    Download,
    /// A bulk upload (across the return link).
    Upload,
    /// A download beside constant-rate UDP.
    BesideUdp,
    /// A download beside an end-to-end TCP download.
    BesideTcp,
}

const ORBITS: [Orbit; 4] = [Orbit::Leo, Orbit::Meo, Orbit::Geo, Orbit::TerrestrialGeo];
const LOSSES: usize = 3;
const CHANGES: [Change; 4] = [Change::None, Change::Acm, Change::Fade, Change::Ramp];
const BUFFERS: [(f64, f64); 3] = [(5.0, 30.0), (30.0, 300.0), (300.0, 2000.0)];
const LOADS: [Load; 4] = [
    Load::Download,
    Load::Upload,
    Load::BesideUdp,
    Load::BesideTcp,
];

/// One drawn link and its traffic.
#[derive(Debug, Clone, Serialize)]
pub struct DrawnLink {
    /// Short name, `L01`…, for tables and plots.
    pub name: String,
    /// Orbit and path.
    pub orbit: Orbit,
    /// One-way propagation delay (the mean of a LEO schedule), ms.
    pub one_way_ms: f64,
    /// Nominal forward rate (a changing rate's highest), bit/s.
    pub forward_bps: f64,
    /// Return rate, bit/s.
    pub return_bps: f64,
    /// Loss.
    pub loss: Loss,
    /// Forward rate changes.
    pub change: Change,
    /// Bottleneck buffer, ms at the nominal rate.
    pub buffer_ms: f64,
    /// Traffic.
    pub load: Load,
    /// Whether the drawn traffic runs (false: the scenario's own; `about` leaves it out).
    pub traffic_drawn: bool,
    /// The cell settings it stands for: `link` and `traffic`, laid over the scenario's.
    #[serde(skip)]
    pub overlay: Table,
}

impl DrawnLink {
    /// One line saying what the link is, for tables.
    pub fn about(&self) -> String {
        let orbit = match self.orbit {
            Orbit::Leo => "LEO",
            Orbit::Meo => "MEO",
            Orbit::Geo => "GEO",
            Orbit::TerrestrialGeo => "terr+GEO",
        };
        let loss = match self.loss {
            Loss::None => "no loss".to_string(),
            Loss::Ber(b) => format!("BER {b:.0e}"),
            Loss::Bursts { loss, burst } => {
                format!("bursts {:.2} % × {:.0} frames", loss * 100.0, burst)
            }
        };
        let change = match self.change {
            Change::None => "steady",
            Change::Acm => "ACM steps",
            Change::Fade => "abrupt fade",
            Change::Ramp => "slow ramp",
        };
        let load = match self.load {
            Load::Download => "download",
            Load::Upload => "upload",
            Load::BesideUdp => "download + UDP",
            Load::BesideTcp => "download + e2e TCP",
        };
        let mut s = format!(
            "{orbit} {}/{} Mbit/s, RTT {:.0} ms, {loss}, {change}, buffer {:.0} ms",
            mbit(self.forward_bps),
            mbit(self.return_bps),
            2.0 * self.one_way_ms,
            self.buffer_ms
        );
        if self.traffic_drawn {
            s.push_str(", ");
            s.push_str(load);
        }
        s
    }
}

/// A rate in Mbit/s with as many digits as it needs.
fn mbit(bps: f64) -> String {
    let m = bps / 1e6;
    if m >= 10.0 {
        format!("{m:.0}")
    } else {
        format!("{m:.1}")
    }
}

/// Log-uniform between `lo` and `hi`.
fn log_uniform(rng: &mut ChaCha8Rng, lo: f64, hi: f64) -> f64 {
    (rng.gen_range(lo.ln()..=hi.ln())).exp()
}

/// `n` picks of `0..k` in which every value appears ⌊n/k⌋ or ⌈n/k⌉ times, shuffled.
fn dealt(rng: &mut ChaCha8Rng, n: usize, k: usize) -> Vec<usize> {
    let mut v: Vec<usize> = (0..n).map(|i| i % k).collect();
    v.shuffle(rng);
    v
}

/// A rate for the emulator, whole bits per second.
fn rate(bps: f64) -> Value {
    Value::String(format!("{:.0}bit", bps.round()))
}

/// Draws `n` links with `seed`.
pub fn draw(seed: u64, n: usize) -> Result<Vec<DrawnLink>, String> {
    if !(4..=1000).contains(&n) {
        return Err(format!(
            "draw.links = {n}: between 4 (every family's categories) and 1000"
        ));
    }
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let orbits = dealt(&mut rng, n, ORBITS.len());
    let losses = dealt(&mut rng, n, LOSSES);
    let changes = dealt(&mut rng, n, CHANGES.len());
    let buffers = dealt(&mut rng, n, BUFFERS.len());
    let loads = dealt(&mut rng, n, LOADS.len());
    (0..n)
        .map(|i| {
            let orbit = ORBITS[orbits[i]];
            let one_way_ms = match orbit {
                Orbit::Leo => rng.gen_range(14.0..30.0),
                Orbit::Meo => rng.gen_range(60.0..90.0),
                Orbit::Geo => rng.gen_range(250.0..290.0),
                Orbit::TerrestrialGeo => rng.gen_range(290.0..400.0),
            };
            let forward_bps = log_uniform(&mut rng, 2e6, 500e6);
            let return_bps = (forward_bps * log_uniform(&mut rng, 0.05, 0.5)).clamp(0.5e6, 50e6);
            let loss = match losses[i] {
                0 => Loss::None,
                1 => Loss::Ber(log_uniform(&mut rng, 1e-8, 1e-5)),
                _ => Loss::Bursts {
                    loss: log_uniform(&mut rng, 0.0005, 0.03),
                    burst: log_uniform(&mut rng, 2.0, 50.0),
                },
            };
            let change = CHANGES[changes[i]];
            let (lo, hi) = BUFFERS[buffers[i]];
            let buffer_ms = log_uniform(&mut rng, lo, hi);
            let load = LOADS[loads[i]];
            let mut link = DrawnLink {
                name: format!("L{:02}", i + 1),
                orbit,
                one_way_ms,
                forward_bps,
                return_bps,
                loss,
                change,
                buffer_ms,
                load,
                traffic_drawn: true,
                overlay: Table::new(),
            };
            link.overlay = overlay(&link, &mut rng);
            Ok(link)
        })
        .collect()
}

/// The cell settings of `l`: its `link` and `traffic` tables.
fn overlay(l: &DrawnLink, rng: &mut ChaCha8Rng) -> Table {
    let mut forward = Table::new();
    let mut ret = Table::new();
    // Delay: fixed, or LEO's passes with a handover step every 10–20 s.
    match l.orbit {
        Orbit::Leo => {
            let schedule = leo_schedule(rng, l.one_way_ms);
            forward.insert("delay_schedule".into(), Value::String(schedule.clone()));
            ret.insert("delay_schedule".into(), Value::String(schedule));
        }
        _ => {
            let d = Value::String(format!("{:.1}ms", l.one_way_ms));
            forward.insert("delay".into(), d.clone());
            ret.insert("delay".into(), d);
        }
    }
    let lowest_bps = match l.change {
        Change::None => {
            forward.insert("rate".into(), rate(l.forward_bps));
            l.forward_bps
        }
        c => {
            let (schedule, lowest) = rate_schedule(rng, c, l.forward_bps);
            forward.insert("rate_schedule".into(), Value::String(schedule));
            lowest
        }
    };
    ret.insert("rate".into(), rate(l.return_bps));
    // The buffer holds buffer_ms of each direction's nominal rate, and four full frames at
    // least (what the smallest modem queue holds: 5 ms of 1 Mbit/s is not one frame).
    for (t, bps) in [(&mut forward, l.forward_bps), (&mut ret, l.return_bps)] {
        let bytes = (bps * l.buffer_ms / 8e3).max(4.0 * 1514.0);
        t.insert("queue".into(), Value::String(format!("{:.0}B", bytes)));
    }
    match l.loss {
        Loss::None => {}
        Loss::Ber(b) => {
            forward.insert("ber".into(), Value::Float(b));
            ret.insert("ber".into(), Value::Float(b));
        }
        Loss::Bursts { loss, burst } => {
            // Mean burst 1/r frames; share of frames in the bad state p/(p+r) = loss.
            let r = 1.0 / burst;
            let p = r * loss / (1.0 - loss);
            let mut g = Table::new();
            g.insert("p".into(), Value::Float(p));
            g.insert("r".into(), Value::Float(r));
            forward.insert("gilbert".into(), Value::Table(g));
        }
    }
    let mut link = Table::new();
    link.insert("forward".into(), Value::Table(forward));
    link.insert("return".into(), Value::Table(ret));
    let mut traffic = Table::new();
    traffic.insert("kind".into(), Value::String("bulk".into()));
    match l.load {
        Load::Download => {}
        Load::Upload => {
            traffic.insert("direction".into(), Value::String("upload".into()));
        }
        Load::BesideUdp => {
            // A tenth to two fifths of the nominal rate, and never above half the schedule's
            // lowest: UDP that fills a trough leaves TCP nothing to be judged on (seed 43's
            // L04 drew 63 Mbit/s beside a 53 Mbit/s trough). The draw is taken either way so
            // the links after this one stay those the seed drew before the cap.
            let drawn = l.forward_bps * rng.gen_range(0.1..0.4);
            let udp = drawn.min(lowest_bps / 2.0);
            traffic.insert("cross_udp".into(), rate(udp));
        }
        Load::BesideTcp => {
            traffic.insert("competing".into(), Value::Boolean(true));
        }
    }
    let mut t = Table::new();
    t.insert("link".into(), Value::Table(link));
    t.insert("traffic".into(), Value::Table(traffic));
    t
}

/// A LEO pass schedule around `one_way_ms`: within a pass the delay rises by up to 4 ms
/// towards the horizon; each handover steps to the next satellite's delay. One minute,
/// repeating.
fn leo_schedule(rng: &mut ChaCha8Rng, one_way_ms: f64) -> String {
    let mut pts = Vec::new();
    let mut t = 0.0;
    // The last pass is at least a second long.
    while t < 59.0 {
        let pass = rng.gen_range(10.0..20.0_f64).min(60.0 - t);
        let base = (one_way_ms + rng.gen_range(-4.0..4.0)).max(10.0);
        let steps = (pass / 0.5).floor() as usize;
        for k in 0..=steps {
            let x = (k as f64 * 0.5).min(pass - 0.001);
            let d = base + 4.0 * ((x - pass / 2.0) / (pass / 2.0)).powi(2);
            pts.push(format!("{:.3} {:.2}ms", t + x, d));
        }
        t += pass;
    }
    // The period closes on the first point's value so the repetition has no extra step.
    let first = pts[0].split_whitespace().nth(1).unwrap().to_string();
    pts.push(format!("60 {first}"));
    pts.push("repeat".into());
    pts.join("; ")
}

/// A forward rate schedule of kind `c` below `nominal` (its highest rate), repeating, and
/// its lowest rate.
fn rate_schedule(rng: &mut ChaCha8Rng, c: Change, nominal: f64) -> (String, f64) {
    let mut lowest = nominal;
    let mut at = |t: f64, bps: f64| {
        lowest = lowest.min(bps);
        format!("{t:.1} {:.0}bit", bps.round())
    };
    let mut pts = Vec::new();
    match c {
        Change::None => pts.push(at(0.0, nominal)),
        Change::Acm => {
            // A walk between a quarter of the rate and all of it, one step every 2–5 s.
            let mut level = 1.0_f64;
            let mut t = 0.0;
            while t < 60.0 {
                pts.push(at(t, nominal * level));
                let f = *[0.5, 0.71, 1.41, 2.0].choose(rng).unwrap();
                level = (level * f).clamp(0.25, 1.0);
                t += rng.gen_range(2.0..5.0);
            }
            pts.push(at(60.0, nominal));
        }
        Change::Fade => {
            let start = rng.gen_range(3.0..12.0);
            let depth = rng.gen_range(0.2..0.5);
            let len = rng.gen_range(3.0..8.0);
            pts.push(at(0.0, nominal));
            pts.push(at(start, nominal * depth));
            pts.push(at(start + len, nominal));
            pts.push(at(30.0, nominal));
        }
        Change::Ramp => {
            let start = rng.gen_range(3.0..8.0);
            let depth = rng.gen_range(0.3..0.6);
            let ramp: f64 = rng.gen_range(5.0..10.0);
            let hold = rng.gen_range(2.0..5.0);
            pts.push(at(0.0, nominal));
            // Steps every half second make the ramp (a modem's rate is a step function).
            let n = (ramp / 0.5).round() as usize;
            for k in 1..=n {
                let f = 1.0 - (1.0 - depth) * k as f64 / n as f64;
                pts.push(at(start + k as f64 * 0.5, nominal * f));
            }
            let up = start + n as f64 * 0.5 + hold;
            for k in 1..=n {
                let f = depth + (1.0 - depth) * k as f64 / n as f64;
                pts.push(at(up + k as f64 * 0.5, nominal * f));
            }
            let end = (up + n as f64 * 0.5 + 5.0).max(30.0);
            pts.push(at(end, nominal));
        }
    }
    pts.push("repeat".into());
    (pts.join("; "), lowest)
}

#[cfg(test)]
mod tests {
    use super::*;
    use satpep_link::config::LinkSpec;

    #[test]
    fn a_seed_draws_the_same_links_and_another_seed_others() {
        let a = draw(14, 12).unwrap();
        let b = draw(14, 12).unwrap();
        let c = draw(15, 12).unwrap();
        let text = |v: &[DrawnLink]| {
            v.iter()
                .map(|l| format!("{} {}", l.about(), toml::to_string(&l.overlay).unwrap()))
                .collect::<Vec<_>>()
        };
        assert_eq!(text(&a), text(&b));
        let same = text(&a)
            .iter()
            .zip(text(&c))
            .filter(|(x, y)| **x == *y)
            .count();
        assert_eq!(same, 0, "seed 15 drew links of seed 14");
    }

    #[test]
    fn every_draw_holds_every_family_and_links_the_emulator_takes() {
        for seed in 0..20 {
            for n in [4, 12, 40] {
                let v = draw(seed, n).unwrap();
                assert_eq!(v.len(), n);
                for o in ORBITS {
                    assert!(v.iter().any(|l| l.orbit == o), "seed {seed}: no {o:?}");
                }
                assert!(v.iter().any(|l| l.loss == Loss::None));
                assert!(v.iter().any(|l| matches!(l.loss, Loss::Ber(_))));
                assert!(v.iter().any(|l| matches!(l.loss, Loss::Bursts { .. })));
                for c in CHANGES {
                    assert!(v.iter().any(|l| l.change == c), "seed {seed}: no {c:?}");
                }
                for (lo, hi) in BUFFERS {
                    assert!(v.iter().any(|l| (lo..=hi).contains(&l.buffer_ms)));
                }
                for d in LOADS {
                    assert!(v.iter().any(|l| l.load == d), "seed {seed}: no {d:?}");
                }
                for l in &v {
                    assert!((2e6..=500e6).contains(&l.forward_bps), "{}", l.about());
                    assert!((0.5e6..=50e6).contains(&l.return_bps), "{}", l.about());
                    assert!((14.0..400.0).contains(&l.one_way_ms));
                    // The emulator takes the link as drawn, with its nominal rate.
                    let spec: LinkSpec = l.overlay["link"].clone().try_into().unwrap();
                    let c = spec
                        .resolve()
                        .unwrap_or_else(|e| panic!("{}: {e}", l.about()));
                    let top = c.forward.rate.max_bps();
                    assert!((top - l.forward_bps).abs() <= 1.0, "{}", l.about());
                }
            }
        }
    }

    /// A drawn part: its first axis is the links, each cell a link's settings laid over the
    /// configuration's; a new `seed` override draws new links; `traffic = false` keeps the
    /// part's own traffic.
    #[test]
    fn a_drawn_part_expands_into_one_cell_per_link_and_configuration() {
        use crate::scenario::Scenario;
        let text = "name = \"c\"\nseed = 4\nduration = \"10s\"\n[[part]]\nname = \"p\"\ndraw = { links = 5 }\n[[part.config]]\nname = \"e2e\"\n[[part.config]]\nname = \"split\"\npep = { mode = \"split\", config = { satellite = { notsent_lowat = \"128KiB\" } } }\n";
        let sc = Scenario::parse(text, false).unwrap();
        assert_eq!(sc.cells.len(), 10);
        let want = draw(4, 5).unwrap();
        for (i, c) in sc.cells.iter().enumerate() {
            let l = &want[i / 2];
            let spec = c.spec.link_spec().unwrap();
            assert_eq!(
                spec.ret.rate.as_deref(),
                Some(format!("{:.0}bit", l.return_bps.round()).as_str())
            );
            let upload = c.spec.traffic.kind().downloads();
            assert_eq!(!upload, l.load == Load::Upload, "{}", l.about());
        }
        // A proxy key from the scenario reaches the lab's proxy file.
        let pep = sc.cells[1].spec.pep().unwrap().unwrap();
        assert_eq!(pep.file.satellite.notsent_lowat.as_deref(), Some("128KiB"));
        // --seed draws other links.
        let mut over = Table::new();
        over.insert("seed".into(), Value::Integer(5));
        let other = Scenario::parse_with(text, false, &over).unwrap();
        assert_ne!(
            other.parts[0].drawn[0].about(),
            sc.parts[0].drawn[0].about()
        );
        assert_eq!(other.cells[0].spec.seed, 5);
        // Only the links: the part's own traffic runs.
        let only = text.replace("links = 5", "links = 5, traffic = false")
            + "[part.traffic]\nkind = \"ping\"\n";
        let sc = Scenario::parse(&only, false).unwrap();
        assert!(sc
            .cells
            .iter()
            .all(|c| c.spec.metric() == crate::scenario::spec::Metric::Rtt));
        let about = sc.parts[0].drawn[0].about();
        assert!(
            !about.contains("download") && !about.contains("upload"),
            "{about}"
        );
    }

    /// Steady state begins after a drawn link's start-up bound where that is later than the
    /// warm-up (at most half the run): seed 39's L02, an upload at 50 Mbit/s over 621 ms,
    /// from 8 s; links whose start ends sooner keep the scenario's 5 s.
    #[test]
    fn a_long_start_is_not_read_as_steady_state() {
        use crate::scenario::Scenario;
        let text = "name = \"c\"\nseed = 39\nduration = \"20s\"\nwarmup = \"5s\"\n[[part]]\nname = \"p\"\ndraw = { links = 12 }\n[[part.config]]\nname = \"e2e\"\n";
        let sc = Scenario::parse(text, false).unwrap();
        let drawn = &sc.parts[0].drawn;
        let warm = |name: &str| {
            let i = drawn.iter().position(|l| l.name == name).unwrap();
            sc.cells[i].spec.warmup_s()
        };
        assert_eq!(drawn[1].load, Load::Upload, "{}", drawn[1].about());
        assert_eq!(warm("L02"), 8.0);
        let mut kept = 0;
        for c in &sc.cells {
            let w = c.spec.warmup_s();
            assert!((5.0..=10.0).contains(&w), "{w}");
            kept += usize::from(w == 5.0);
        }
        assert!(kept >= 8, "{kept} of 12 links kept the warm-up");
    }

    /// A drawn part with two configurations beside a plain part with one.
    const TWO_PARTS: &str = r#"
name = "c"
duration = "10s"
seed = 7
[[part]]
name = "links"
draw = { links = 5 }
[[part.config]]
name = "split"
pep = { mode = "split" }
[[part.config]]
name = "tunnel"
pep = { mode = "tunnel" }
[[part]]
name = "plain"
link = { both = { rate = "10Mbit", delay = "300ms" } }
[[part.config]]
name = "cubic"
"#;

    #[test]
    fn a_scenario_reduced_to_drawn_links_keeps_their_cells_alone() {
        let sc = crate::scenario::Scenario::parse(TWO_PARTS, false).unwrap();
        let l3 = sc.parts[0].drawn[2].clone();
        let only = sc.clone().only_links(&["L03".into()]).unwrap();
        assert_eq!(
            only.parts.len(),
            1,
            "the part that draws no links is left out"
        );
        assert_eq!(only.parts[0].drawn.len(), 1);
        assert_eq!(only.parts[0].drawn[0].name, "L03");
        assert_eq!(only.cells.len(), 2);
        for (i, c) in only.cells.iter().enumerate() {
            assert_eq!((c.index, c.part), (i, 0));
            assert_eq!(c.point[0], toml::Value::Table(l3.overlay.clone()));
        }
        let two = sc
            .clone()
            .only_links(&["L01".into(), "L05".into()])
            .unwrap();
        assert_eq!(two.cells.len(), 4);
        let e = sc.only_links(&["L09".into()]).unwrap_err();
        assert!(
            e.contains("--link L09") && e.contains("L01, L02, L03, L04, L05"),
            "{e}"
        );
    }

    #[test]
    fn a_scenario_reduced_to_configurations_keeps_their_cells_alone() {
        let sc = crate::scenario::Scenario::parse(TWO_PARTS, false).unwrap();
        let tunnel = sc.clone().only_configs(&["tunnel".into()]).unwrap();
        assert_eq!(tunnel.parts.len(), 1, "the part without it is left out");
        assert_eq!(tunnel.parts[0].configs, vec!["tunnel".to_string()]);
        assert_eq!(tunnel.cells.len(), 5);
        for (i, c) in tunnel.cells.iter().enumerate() {
            assert_eq!((c.index, c.part, c.config.as_str()), (i, 0, "tunnel"));
        }
        assert_eq!(tunnel.name, "c-tunnel");
        let both = sc
            .clone()
            .only_configs(&["split".into(), "cubic".into()])
            .unwrap();
        assert_eq!(both.parts.len(), 2);
        assert_eq!(both.cells.len(), 6);
        let e = sc.only_configs(&["bbr".into()]).unwrap_err();
        assert!(
            e.contains("--config bbr") && e.contains("split, tunnel, cubic"),
            "{e}"
        );
        // A name with a comma arrives in pieces (clap splits `--config` on commas).
        let text = crate::scenario::presets::get("corpus").unwrap();
        let corpus = crate::scenario::Scenario::parse(text, true).unwrap();
        let pieces: Vec<String> = "split,end-to-end bbr, tuned"
            .split(',')
            .map(String::from)
            .collect();
        let two = corpus.clone().only_configs(&pieces).unwrap();
        assert_eq!(
            two.parts[0].configs,
            vec!["end-to-end bbr, tuned".to_string(), "split".to_string()]
        );
        let e = corpus
            .only_configs(&["end-to-end bbr".into(), " tumed".into()])
            .unwrap_err();
        assert!(e.contains("--config  tumed: no such"), "{e}");
    }

    /// Constant-rate UDP beside a download takes at most half the link's lowest rate: the
    /// rest is what TCP is judged on, and a trough the UDP fills leaves it nothing.
    #[test]
    fn udp_beside_a_download_leaves_half_the_lowest_rate() {
        let mut capped = 0;
        for seed in 0..60 {
            for l in draw(seed, 12).unwrap() {
                if l.load != Load::BesideUdp {
                    continue;
                }
                let spec: LinkSpec = l.overlay["link"].clone().try_into().unwrap();
                let lowest = spec.resolve().unwrap().forward.rate.min_bps();
                let udp: f64 = l.overlay["traffic"]["cross_udp"]
                    .as_str()
                    .unwrap()
                    .trim_end_matches("bit")
                    .parse()
                    .unwrap();
                assert!(udp <= lowest / 2.0 + 1.0, "seed {seed}: {}", l.about());
                assert!(
                    udp >= 0.1 * l.forward_bps - 1.0,
                    "seed {seed}: {}",
                    l.about()
                );
                if (udp - lowest / 2.0).abs() <= 1.0 {
                    capped += 1;
                }
            }
        }
        assert!(capped > 0, "no draw met the cap: the test reads nothing");
    }

    #[test]
    fn too_few_links_to_hold_every_family_is_an_error() {
        assert!(draw(1, 3).unwrap_err().contains("draw.links = 3"));
    }
}
