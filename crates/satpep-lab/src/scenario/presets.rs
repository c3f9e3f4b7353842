//! Built-in scenarios, one TOML file each in `presets/`, compiled into the binary.

/// (name, what it reproduces, TOML text).
pub const PRESETS: [(&str, &str, &str); 16] = [
    ("demo", "the README's main job: geo link at BER 1e-6, end-to-end against split and tunnel, 3 repetitions (~5 min)", include_str!("presets/demo.toml")),
    ("lawson2006", "Lawson 2006 ch. 4-5: T1, 285 ms, BER 1e-9…1e-5 and bursts; TCP, SACK, WS, WS+SACK against PEPs, with the thesis's ANOVA, Tukey and Kruskal-Wallis", include_str!("presets/lawson2006.toml")),
    ("bharadwaj1999", "Bharadwaj 1999 ch. 5: file and web page transfers, end-to-end against a proxy with IW 1/4/16", include_str!("presets/bharadwaj1999.toml")),
    ("urke2011", "Urke 2011 ch. 6: 500 kbit/s, RTT 528 ms; flavors against PER, friendliness, buffer sizing, UDP beside, IPsec red/black", include_str!("presets/urke2011.toml")),
    ("shao2002", "Shao & Zhang 2002 §4: window, initial window, MSS and bottleneck buffer over a T1", include_str!("presets/shao2002.toml")),
    ("field", "real links (GEO with BER, rain fade, shared, a competitor arriving; MEO; LEO; lossy T1; wrong nominal rate) × end-to-end, split and tunnel told nothing: goodput and queueing delay", include_str!("presets/field.toml")),
    ("corpus", "30 links drawn from seeded distributions (orbit, rate 2-500 Mbit/s, loss and bursts, rate changes, buffer, upload and traffic beside) × end-to-end cubic, bbr, tuned bbr, split and tunnel told nothing: goodput CDFs, queueing delay, the ten worst links, the start-up; issue 5's GEO 100 and 250 Mbit/s links beside the draw (~100 min, --quick 12 links ~30; --seed S draws new links)", include_str!("presets/corpus.toml")),
    ("tunnel", "the tunnel against end-to-end TCP and split: BER sweep at 100 Mbit/s and 600 ms, lossy T1, 100 KB fetch, link overhead, a 60 s outage (~30 min, --quick ~10)", include_str!("presets/tunnel.toml")),
    ("cc-sweep", "every split controller against end-to-end cubic and bbr over 100 Mbit/s, 600 ms, BER 0 to 1e-5 (~40 min, --quick ~10)", include_str!("presets/cc-sweep.toml")),
    ("relay-overhead", "the split proxy's throughput and CPU against plain forwarding on a kernel bridge (~2 min)", include_str!("presets/relay-overhead.toml")),
    ("vanzara2017", "Vanzara 2017 ch. 2-3: 100 Mbit/s, RTT 600 ms; BER, RTT and file-size sweeps; a dumbbell with five 25 ms NewReno flows", include_str!("presets/vanzara2017.toml")),
    ("faults", "the fault matrix: resets, crashes, half-closes, outages, restarts end to end, split and tunnelled; every byte checked (~13 min, --quick ~70 s)", include_str!("presets/faults.toml")),
    ("load", "10 000 concurrent connections end to end, split and tunnelled: connects/s, memory and descriptors per connection, release (~10 min, --quick 1 000 in ~1)", include_str!("presets/load.toml")),
    ("throughput", "line rate: split and the tunnel against plain forwarding at 1 Gbit/s and on a kernel bridge: goodput and the proxies' CPU per GB (~3 min, --quick ~1)", include_str!("presets/throughput.toml")),
    ("hub", "a star of terminals on one carrier: different conditions, a quiet terminal, weights, 50 busy terminals of 60; end to end, split, the tunnel, and the tunnel and split sharing the carrier (~40 min, --quick ~25)", include_str!("presets/hub.toml")),
    ("link-accuracy", "the emulator's rate, delay and loss against its configuration, and its CPU, 1 Mbit/s to 1 Gbit/s and the documents' links (~11 min, --quick ~6)", include_str!("presets/link-accuracy.toml")),
];

/// The TOML text of preset `name`.
pub fn get(name: &str) -> Option<&'static str> {
    PRESETS.iter().find(|p| p.0 == name).map(|p| p.2)
}

/// Names of the presets, for messages.
pub fn names() -> Vec<&'static str> {
    PRESETS.iter().map(|p| p.0).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scenario::Scenario;

    /// docs/presets/README.md indexes every preset, and every page it links to exists.
    #[test]
    fn every_preset_has_a_row_in_the_docs_index_and_its_pages_exist() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/presets");
        let index = std::fs::read_to_string(dir.join("README.md")).unwrap();
        for name in names() {
            let row = index
                .lines()
                .find(|l| l.starts_with(&format!("| `{name}` |")))
                .unwrap_or_else(|| panic!("docs/presets/README.md has no row for `{name}`"));
            let links: Vec<&str> = row
                .split("](")
                .skip(1)
                .map(|l| l.split([')', '#']).next().unwrap())
                .collect();
            assert!(!links.is_empty(), "the row for `{name}` links to no page");
            for l in links {
                assert!(
                    dir.join(l).is_file(),
                    "`{name}` links to {l}, which is missing"
                );
            }
        }
    }

    #[test]
    fn every_preset_parses_full_and_quick() {
        let runs = |sc: &Scenario| -> f64 {
            sc.cells
                .iter()
                .map(|c| c.spec.repetitions as f64 * c.spec.duration.secs())
                .sum()
        };
        for (name, _, text) in PRESETS {
            let full = Scenario::parse(text, false).unwrap();
            let quick = Scenario::parse(text, true).unwrap();
            assert!(runs(&quick) < runs(&full), "{name}: --quick is not shorter");
            for quick in [false, true] {
                let sc = Scenario::parse(text, quick)
                    .unwrap_or_else(|e| panic!("{name} (quick {quick}): {e}"));
                assert_eq!(sc.name, name);
                assert!(!sc.cells.is_empty());
                assert!(sc.reproduces.is_some(), "{name} cites what it reproduces");
            }
        }
    }

    /// Issue 5's links in the corpus are what their title says: 600 ms RTT, BER 1e-6.
    #[test]
    fn the_corpus_fast_geo_links_have_a_600_ms_rtt() {
        let sc = Scenario::parse(get("corpus").unwrap(), true).unwrap();
        let pi = sc.parts.iter().position(|p| p.name == "fast-geo").unwrap();
        let cells: Vec<_> = sc.cells.iter().filter(|c| c.part == pi).collect();
        assert_eq!(cells.len(), 10);
        for c in cells {
            let l = c.spec.link_spec().unwrap().resolve().unwrap();
            let rtt_ms = (l.forward.delay.max_ns() + l.ret.delay.max_ns()) as f64 / 1e6;
            assert_eq!(rtt_ms, 600.0, "{:?}", c.point);
            // BER 1e-6 loses about 1.2 % of 1514-byte frames.
            let per = l.forward.loss.mean_loss(1514);
            assert!((per - 0.0120).abs() < 0.0005, "{per}");
        }
    }

    /// A shared carrier is told the forward link's rate, full and quick (the flows part's
    /// quick run once told its gateway 200 Mbit/s on a 100 Mbit/s carrier: every figure of
    /// it measured a gateway that sent twice what the carrier took).
    #[test]
    fn every_shared_carrier_is_told_its_link_s_rate() {
        for quick in [false, true] {
            let sc = Scenario::parse(get("hub").unwrap(), quick).unwrap();
            let mut shared = 0;
            for c in &sc.cells {
                let pc = &c.spec.pep.config;
                let Some(told) = pc
                    .tunnel
                    .as_ref()
                    .and_then(|t| t.carrier.as_ref())
                    .or(pc.proxy.carrier.as_ref())
                    .and_then(|c| c.rate.as_deref())
                else {
                    continue;
                };
                let told = satpep_link::units::parse_rate(told).unwrap();
                let link = c.spec.link_spec().unwrap().resolve().unwrap();
                assert_eq!(
                    told,
                    link.forward.rate.max_bps(),
                    "part {} (quick {quick}): the carrier told {told} bit/s",
                    sc.parts[c.part].name
                );
                shared += 1;
            }
            assert!(shared >= 9, "{shared} shared-carrier cells");
        }
    }

    #[test]
    fn the_example_scenarios_in_docs_parse() {
        // docs/examples: recipes; docs/scenarios: the runs docs cite figures from.
        for sub in ["examples", "scenarios"] {
            let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("../../docs")
                .join(sub);
            let mut n = 0;
            for e in std::fs::read_dir(&dir).unwrap() {
                let path = e.unwrap().path();
                if path.extension().is_some_and(|x| x == "toml") {
                    let text = std::fs::read_to_string(&path).unwrap();
                    let sc = Scenario::parse(&text, false)
                        .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
                    let stem = path.file_stem().unwrap().to_string_lossy();
                    assert_eq!(sc.name, stem, "{}: name and file differ", path.display());
                    n += 1;
                }
            }
            assert!(n > 0, "no scenario in {}", dir.display());
        }
    }
}
