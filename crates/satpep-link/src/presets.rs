//! Named links: generic orbits and the link of each source document (see `docs/link.md`).
//! Flags and config files override any field of a preset.

use crate::config::{DirectionSpec, LinkSpec};
use crate::trace::{Interp, Trace};

/// A preset's name, one-line description and the document section it comes from.
pub struct PresetInfo {
    /// Name used with `--preset`.
    pub name: &'static str,
    /// What it models.
    pub about: &'static str,
}

/// All presets, in the order `--help` lists them.
pub const PRESETS: &[PresetInfo] = &[
    PresetInfo { name: "geo", about: "GEO broadband: 50 Mbit/s forward, 10 Mbit/s return, 280 ms one way, queue 100 % BDP" },
    PresetInfo { name: "geo-fade", about: "geo with a Ku-band rain fade on the forward link every 30 s: 50 Mbit/s for 8 s, then 38, 25 and 12 Mbit/s (8 s), back up by 25 and 38 (ACM steps, 2 s each); mean 34.9 Mbit/s" },
    PresetInfo { name: "meo", about: "MEO (O3b-like): 100 Mbit/s forward, 50 Mbit/s return, 70 ms one way" },
    PresetInfo { name: "leo", about: "LEO (Starlink-like): 100/20 Mbit/s, 14-25 ms one way following a pass, handover every 15 s (60 s trace, repeating)" },
    PresetInfo { name: "urke2011", about: "Urke 2011 Table 6.1: 500 kbit/s each way, 264 ms (RTT 528), queue 33 KB = 100 % BDP" },
    PresetInfo { name: "bharadwaj1999", about: "Bharadwaj 1999 ch. 5: 8 Mbit/s each way, 250 ms one way, queue 100 % BDP" },
    PresetInfo { name: "lawson2006", about: "Lawson 2006 ch. 3: T1 1.544 Mbit/s each way, 285 ms one way (Spanner bridge)" },
    PresetInfo { name: "shao2002", about: "Shao & Zhang 2002 §3: T1 1.544 Mbit/s, 280 ms one way, 50-packet bottleneck queue" },
    PresetInfo { name: "vanzara2017", about: "Vanzara 2017 ch. 3: 100 Mbit/s each way, 300 ms one way (RTT 600)" },
];

fn dir(rate: &str, delay: &str) -> DirectionSpec {
    DirectionSpec {
        rate: Some(rate.into()),
        delay: Some(delay.into()),
        ..Default::default()
    }
}

fn asym(fwd: &str, ret: &str, delay: &str) -> LinkSpec {
    LinkSpec {
        forward: dir(fwd, delay),
        ret: dir(ret, delay),
        ..Default::default()
    }
}

fn sym(rate: &str, delay: &str, queue: Option<&str>) -> LinkSpec {
    LinkSpec {
        both: DirectionSpec {
            queue: queue.map(Into::into),
            ..dir(rate, delay)
        },
        ..Default::default()
    }
}

/// The built-in LEO delay trace: four 15 s passes per minute; within a pass the one-way delay
/// is lowest at mid-pass and rises by 4 ms towards the horizon; each handover is a step to the
/// next satellite's delay.
pub fn leo_delay_trace() -> Trace {
    let bases_ms = [14.0, 19.0, 16.0, 21.0];
    let mut pts = Vec::new();
    for (k, base) in bases_ms.iter().enumerate() {
        let t0 = k as f64 * 15.0;
        for i in 0..=30 {
            // Points every 0.5 s; the last point of a pass sits just before the handover.
            let x = if i == 30 { 14.999 } else { i as f64 * 0.5 };
            let d = base + 4.0 * ((x - 7.5) / 7.5).powi(2);
            pts.push(((t0 + x) * 1e9, d * 1e6));
        }
    }
    // Close the period with the first point's value so `repeat` wraps seamlessly.
    pts.push((60.0 * 1e9, (bases_ms[0] + 4.0) * 1e6));
    Trace::new(pts, true, Interp::Linear).expect("built-in trace is valid")
}

/// The built-in rain fade: adaptive coding and modulation steps a 50 Mbit/s forward link
/// down to 12 Mbit/s and back within each 30 s, so every 30 s run meets one whole fade
/// whenever it starts.
pub fn rain_fade_trace() -> Trace {
    let steps = [
        (0.0, 50e6),
        (8.0, 38e6),
        (10.0, 25e6),
        (12.0, 12e6),
        (20.0, 25e6),
        (22.0, 38e6),
        (24.0, 50e6),
        (30.0, 50e6),
    ];
    let pts = steps.iter().map(|&(t, r)| (t * 1e9, r)).collect();
    Trace::new(pts, true, Interp::Step).expect("built-in trace is valid")
}

/// The spec of preset `name`, or an error listing the valid names.
pub fn spec(name: &str) -> Result<LinkSpec, String> {
    let s = match name {
        "geo" => asym("50Mbit", "10Mbit", "280ms"),
        "geo-fade" => {
            let mut s = asym("50Mbit", "10Mbit", "280ms");
            s.forward.rate = None;
            s.forward.builtin_rate_trace = Some(rain_fade_trace());
            s
        }
        "meo" => asym("100Mbit", "50Mbit", "70ms"),
        "leo" => {
            let mut s = asym("100Mbit", "20Mbit", "20ms");
            for d in [&mut s.forward, &mut s.ret] {
                d.delay = None;
                d.builtin_delay_trace = Some(leo_delay_trace());
            }
            s
        }
        "urke2011" => sym("500kbit", "264ms", Some("33KB")),
        "bharadwaj1999" => sym("8Mbit", "250ms", None),
        "lawson2006" => sym("1.544Mbit", "285ms", None),
        "shao2002" => sym("1.544Mbit", "280ms", Some("50p")),
        "vanzara2017" => sym("100Mbit", "300ms", None),
        _ => {
            let names: Vec<_> = PRESETS.iter().map(|p| p.name).collect();
            return Err(format!(
                "unknown preset '{name}' (known: {})",
                names.join(", ")
            ));
        }
    };
    Ok(LinkSpec {
        preset: Some(name.into()),
        ..s
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{DelaySource, QueueLimit, RateSource};

    #[test]
    fn every_preset_resolves() {
        for p in PRESETS {
            let c = spec(p.name).unwrap().resolve().unwrap();
            let traced = p.name == "geo-fade";
            assert_eq!(
                matches!(c.forward.rate, RateSource::Trace(_)),
                traced,
                "{}",
                p.name
            );
        }
        let u = spec("urke2011").unwrap().resolve().unwrap();
        assert_eq!(u.forward.queue, QueueLimit::Bytes(33_000));
        assert_eq!(u.ret.delay, DelaySource::Fixed(264_000_000));
        let s = spec("shao2002").unwrap().resolve().unwrap();
        assert_eq!(s.ret.queue, QueueLimit::Packets(50));
    }

    #[test]
    fn leo_has_handovers() {
        let t = leo_delay_trace();
        let before = t.value_at(14.999e9);
        let after = t.value_at(15.0e9);
        assert!((before - 18e6).abs() < 1e4 && (after - 23e6).abs() < 1e4);
        assert!((t.value_at(22.5e9) - 19e6).abs() < 1e3);
        // The 29.999→30 s handover drops from 23 ms to 20 ms.
        assert!(t.value_at(29.999e9) - t.value_at(30.0e9) > 2.9e6);
        // Periodic.
        assert!((t.value_at(82.5e9) - t.value_at(22.5e9)).abs() < 1.0);
    }

    #[test]
    fn the_rain_fade_repeats_every_30_s_and_averages_34_9_mbit() {
        let c = spec("geo-fade").unwrap().resolve().unwrap();
        let r = &c.forward.rate;
        assert_eq!(r.at(5e9), 50e6);
        assert_eq!(r.at(15e9), 12e6);
        assert_eq!(r.at(45e9), 12e6);
        let mean = r.mean_bps(0.0, 30e9);
        assert!((mean - 1048e6 / 30.0).abs() < 1e4, "{mean}");
        // Any 30 s span holds one whole fade.
        assert!((r.mean_bps(7e9, 37e9) - mean).abs() < 1e4);
        assert_eq!(c.ret.rate.max_bps(), 10e6);
    }
}
