//! A star (`lab up --terminals N`): several terminals, each with its own client, share one
//! emulated carrier to the gateway. Checked with real downloads: the carrier's time is what
//! they share (a faded terminal's bits cost more of it), traffic between terminals goes
//! through the gateway, every terminal's proxy tunnels under its own name, and nothing of
//! the star is left after the lab goes.

mod common;

use common::*;
use satpep_lab::topology::{site, Lab, Pep, UpOptions};
use satpep_link::config::LinkSpec;
use std::process::{Child, Stdio};

/// A star lab of `terminals` terminals on the link `toml_text`.
fn star(tag: &str, terminals: u16, toml_text: &str, pep: Option<Pep>) -> Lab {
    require_root();
    let spec: LinkSpec = toml::from_str(toml_text).expect("test link spec");
    Lab::up(
        &name(tag),
        &LinkSpec::layered(&[&spec]).unwrap(),
        &UpOptions {
            satpep_bin: bin().into(),
            check: true,
            pep,
            terminals,
        },
    )
    .unwrap_or_else(|e| panic!("lab up: {e}"))
}

/// Tunnel mode with the gateway sharing the carrier `carrier` says (a `[tunnel.carrier]`
/// section's keys).
fn sharing(carrier: &str) -> Pep {
    let carrier: satpep_proxy::config::CarrierFile = toml::from_str(carrier).unwrap();
    let mut pep = Pep {
        tunnel: Some("satellite".into()),
        ..Default::default()
    };
    pep.file.tunnel = Some(satpep_proxy::config::TunnelFile {
        carrier: Some(carrier),
        ..Default::default()
    });
    pep
}

/// Starts a download of `secs` seconds from the server to every client at once (iperf3 -R,
/// one server port per client) and returns each client's goodput over the last
/// `secs - skip` seconds, Mbit/s, and bytes received.
fn downloads(lab: &Lab, secs: u32, skip: f64) -> Vec<(f64, u64)> {
    let n = lab.sites().len();
    let t = secs.to_string();
    downloads_for(lab, &vec![["-t", t.as_str()]; n])
        .iter()
        .map(|(iv, bytes)| {
            let mbit = satpep_lab::iperf::goodput_after(iv, skip).unwrap_or(0.0) / 1e6;
            (mbit, *bytes)
        })
        .collect()
}

/// Starts a download from the server to every client at once, client K's as long as
/// `amount[K-1]` says (iperf3's `-t SECS` or `-n BYTES`), and returns each one's intervals
/// (end s, bytes) and bytes received.
fn downloads_for(lab: &Lab, amount: &[[&str; 2]]) -> Vec<(Vec<(f64, u64)>, u64)> {
    let sites = lab.sites();
    let servers: Vec<Child> = sites
        .iter()
        .map(|st| {
            satpep_lab::sys::in_ns(&lab.ns(satpep_lab::Host::Server), "iperf3")
                .args(["-s", "-1", "-p", &(5210 + st.index).to_string()])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .unwrap()
        })
        .collect();
    let _kill: Vec<KillOnDrop> = servers.iter().map(|c| KillOnDrop(c.id() as i32)).collect();
    std::thread::sleep(std::time::Duration::from_millis(500));
    let clients: Vec<Child> = sites
        .iter()
        .zip(amount)
        .map(|(st, amount)| {
            satpep_lab::sys::in_ns(&lab.node_ns(&st.client), "iperf3")
                .args([
                    "-c",
                    satpep_lab::topology::SERVER_V4,
                    "-p",
                    &(5210 + st.index).to_string(),
                    "-R",
                    amount[0],
                    amount[1],
                    "-J",
                ])
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    clients
        .into_iter()
        .zip(&sites)
        .map(|(c, st)| {
            let out = c.wait_with_output().unwrap();
            let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
            assert!(
                out.status.success(),
                "{}'s download failed: {} {}",
                st.client,
                v["error"],
                String::from_utf8_lossy(&out.stderr)
            );
            let bytes = v["end"]["sum_received"]["bytes"].as_u64().unwrap_or(0);
            (satpep_lab::iperf::intervals(&v), bytes)
        })
        .collect()
}

/// Goodput of `intervals` from `from` to `to` s, Mbit/s.
fn goodput_between(intervals: &[(f64, u64)], from: f64, to: f64) -> f64 {
    match satpep_lab::iperf::bytes_within(intervals, from, to) {
        (bytes, secs) if secs > 0.0 => bytes as f64 * 8.0 / secs / 1e6,
        _ => 0.0,
    }
}

/// Three terminals on a 20 Mbit/s carrier, the third faded to 5 Mbit/s (its frames take four
/// times the carrier's time): with all three downloading, the shares of carrier time add up
/// to the whole carrier and no more, and the faded one never gets more than its own rate.
#[test]
fn a_stars_terminals_share_the_carriers_time() {
    let t3 = site(3);
    let lab = star(
        "star",
        3,
        &format!(
            "[forward]\nrate='20Mbit'\ndelay='20ms'\nqueue='100%'\n\
             [return]\nrate='10Mbit'\ndelay='20ms'\n\
             [[forward.path]]\nhosts=['{}', '{}']\nrate='5Mbit'\n",
            t3.client_net_v4, t3.sat_v4
        ),
        None,
    );
    assert_eq!(
        lab.state().star.len(),
        4,
        "client2, terminal2, client3, terminal3"
    );
    // Between terminals, through the gateway: two satellite hops each way (80 ms at least).
    let out = satpep_lab::sys::run_in(
        &lab.node_ns("client2"),
        "ping",
        &["-c", "2", "-i", "0.2", "-q", &t3.client_v4],
    )
    .unwrap();
    let avg: f64 = out
        .split(" = ")
        .nth(1)
        .and_then(|s| s.split('/').nth(1))
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no RTT in {out}"));
    assert!((80.0..200.0).contains(&avg), "client2 to client3: {avg} ms");

    let got = downloads(&lab, 10, 3.0);
    let rates = [20.0, 20.0, 5.0];
    let time: f64 = got.iter().zip(rates).map(|((g, _), r)| g / r).sum();
    eprintln!(
        "goodput {got:?} Mbit/s; carrier time used {:.1} %",
        time * 100.0
    );
    for (k, (g, bytes)) in got.iter().enumerate() {
        assert!(
            *g > 0.5 && *bytes > 500_000,
            "terminal {}: {g} Mbit/s",
            k + 1
        );
    }
    // Goodput is payload, 1448 of every 1514 bytes on the wire (95.6 %), read from one-second
    // intervals whose edges let a few percent more through.
    assert!(
        (0.80..=1.0).contains(&time),
        "carrier time used {:.3} by {got:?}",
        time
    );
    assert!(got[2].0 <= 5.0 * 0.97, "the faded terminal: {got:?}");
    let name = lab.name.clone();
    drop(lab);
    assert!(namespaces_with(&format!("sp-{name}-")).is_empty());
}

/// Three terminals in tunnel mode: each runs its own proxy with a certificate of its own
/// name, all three download at once through their tunnels, and the gateway shows each
/// terminal's tunnel under that name.
#[test]
fn every_terminal_of_a_star_tunnels_under_its_own_name() {
    let pep = Pep {
        tunnel: Some("satellite".into()),
        ..Default::default()
    };
    let lab = star(
        "startun",
        3,
        "[forward]\nrate='30Mbit'\ndelay='15ms'\n[return]\nrate='10Mbit'\ndelay='15ms'\n",
        Some(pep),
    );
    let got = downloads(&lab, 6, 2.0);
    let q = lab.link_stats().unwrap().forward;
    eprintln!(
        "goodput {got:?} Mbit/s; forward queue p50 {} ms, p99 {} ms",
        q.queue_delay_p50_ms, q.queue_delay_p99_ms
    );
    // Each tunnel carried its terminal's download (unshared, the three controllers need not
    // split the carrier evenly: one got under 1 Mbit/s of 30 in one CI-sized run).
    for (k, (g, bytes)) in got.iter().enumerate() {
        assert!(*g > 0.1 && *bytes > 100_000, "terminal {}: {got:?}", k + 1);
    }
    let total: f64 = got.iter().map(|(g, _)| g).sum();
    assert!(total <= 30.0, "{got:?}");
    let m = metrics(&lab, satpep_lab::Host::Gateway);
    for st in lab.sites() {
        assert!(
            m.contains(&format!(",name=\"{}\"}}", st.terminal)),
            "no tunnel named {} in\n{m}",
            st.terminal
        );
        let log = lab.node_proxy_log(&st.terminal);
        assert!(log.contains(&st.client_v4), "{}'s log:\n{log}", st.terminal);
    }
}

/// The gateway shares a 30 Mbit/s carrier by weight: terminal2 weighs 2, terminal3 may have
/// 3 Mbit/s at most; all three busy, terminal3 gets its maximum and the other two share the
/// rest 1 : 2, with the satellite's queue short (the gateway holds what would queue there).
#[test]
fn a_gateway_shares_its_carrier_by_weight_within_maximum_rates() {
    let pep = sharing(
        "rate = '30Mbit'\nshare = 'bits'\n\
         [terminal.terminal2]\nweight = 2\n[terminal.terminal3]\nmir = '3Mbit'\n",
    );
    let lab = star(
        "starhub",
        3,
        "[forward]\nrate='30Mbit'\ndelay='15ms'\n[return]\nrate='10Mbit'\ndelay='15ms'\n",
        Some(pep),
    );
    weights_then_reload(&lab, "tunnel carrier", |f| {
        let c = f.tunnel.as_mut().unwrap().carrier.as_mut().unwrap();
        let w = c.terminal.remove("terminal2").unwrap();
        c.terminal.insert("terminal".into(), w);
    });
}

/// Shared in time: terminal3's link is faded to a quarter of the carrier's rate, and the
/// gateway knows it. Each busy terminal gets a third of the carrier's time, so terminal3 a
/// quarter of the others' bits; once terminal3's download (a fixed 1 MB: a timed one goes
/// on after its end with what the gateway had already taken from the server) is complete,
/// the two others take its time.
#[test]
fn shared_in_time_a_faded_terminal_gets_its_time_and_a_quiet_ones_share_is_taken() {
    let t3 = site(3);
    let pep = sharing("rate = '24Mbit'\nshare = 'time'\n[terminal.terminal3]\nrate = '6Mbit'\n");
    let lab = star(
        "startime",
        3,
        &format!(
            "[forward]\nrate='24Mbit'\ndelay='15ms'\n[return]\nrate='10Mbit'\ndelay='15ms'\n\
             [[forward.path]]\nhosts=['{}', '{}']\nrate='6Mbit'\n",
            t3.client_net_v4, t3.sat_v4
        ),
        Some(pep),
    );
    let got = downloads_for(&lab, &[["-t", "12"], ["-t", "12"], ["-n", "1000K"]]);
    // terminal3's last interval ends when its last byte arrived.
    let end3 = got[2].0.last().map_or(0.0, |i| i.0);
    let busy: Vec<f64> = got
        .iter()
        .map(|(iv, _)| goodput_between(iv, 1.0, 3.0))
        .collect();
    let from = end3.ceil() + 1.0;
    let after: Vec<f64> = got[..2]
        .iter()
        .map(|(iv, _)| goodput_between(iv, from, from + 2.0))
        .collect();
    let q = lab.link_stats().unwrap().forward;
    let second: Vec<String> = (2..11)
        .map(|t| {
            format!(
                "{:.1}",
                goodput_between(&got[0].0, t as f64, t as f64 + 1.0)
            )
        })
        .collect();
    eprintln!(
        "1-3 s {busy:?} Mbit/s; terminal3 done at {end3:.1} s; {from}-{} s {after:?}; terminal 1 from 2 s, by the second: {second:?}; forward queue p50 {} ms, p99 {} ms",
        from + 2.0,
        q.queue_delay_p50_ms,
        q.queue_delay_p99_ms
    );
    // A third of the time each: 8, 8 and 2 Mbit/s of carrier (payload a few % less).
    for (k, want) in [(0, 8.0), (1, 8.0), (2, 2.0)] {
        assert!(
            (busy[k] / want - 0.95).abs() < 0.15,
            "terminal {}: {busy:?} (want about {want} Mbit/s of carrier)",
            k + 1
        );
    }
    assert!((3.0..9.0).contains(&end3), "terminal3's 1 MB took {end3} s");
    // terminal3 quiet: 12 Mbit/s each, from the second after.
    for (k, g) in after.iter().enumerate() {
        assert!(
            (g / 12.0 - 0.95).abs() < 0.15,
            "terminal {} after terminal3 ended: {after:?}",
            k + 1
        );
    }
}

/// A committed rate holds against weights: terminal3 weighs a tenth of the others but is
/// committed 12 of the 30 Mbit/s carrier; the other two share the remaining 18.
#[test]
fn a_committed_rate_holds_against_the_weights() {
    let pep = sharing(
        "rate = '30Mbit'\nshare = 'bits'\n[terminal.terminal3]\nweight = 0.1\ncir = '12Mbit'\n",
    );
    let lab = star(
        "starcir",
        3,
        "[forward]\nrate='30Mbit'\ndelay='15ms'\n[return]\nrate='10Mbit'\ndelay='15ms'\n",
        Some(pep),
    );
    let got = downloads(&lab, 8, 3.0);
    eprintln!("goodput {got:?} Mbit/s");
    // Shares are of UDP payload: goodput is a few percent below them.
    let want = [9.0, 9.0, 12.0];
    for (k, ((g, _), w)) in got.iter().zip(want).enumerate() {
        assert!(
            (g / w - 0.95).abs() < 0.1,
            "terminal {}: {got:?} (share {w} Mbit/s)",
            k + 1
        );
    }
}

/// Split mode: the gateway's `[proxy.carrier]` shares a 30 Mbit/s carrier among the
/// terminals' connections by weight (terminal2 weighs 2; terminal3 may have 3 Mbit/s at
/// most; terminal's clients, in no listed subnet, form a terminal of their own), through each
/// connection's pacing ceiling. A reload moves the weight of 2 to terminal.
#[test]
fn a_split_gateway_shares_its_carrier_by_weight_within_maximum_rates() {
    let (t1, t2, t3) = (site(1), site(2), site(3));
    let carrier = format!(
        "rate = '30Mbit'\nshare = 'bits'\n\
         [terminal.terminal2]\nweight = 2\nsubnets = ['{}']\n\
         [terminal.terminal3]\nmir = '3Mbit'\nsubnets = ['{}']\n",
        t2.client_net_v4, t3.client_net_v4
    );
    let mut pep = Pep::default();
    pep.file.proxy.carrier = Some(toml::from_str(&carrier).unwrap());
    let lab = star(
        "starsplit",
        3,
        "[forward]\nrate='30Mbit'\ndelay='15ms'\n[return]\nrate='10Mbit'\ndelay='15ms'\n",
        Some(pep),
    );
    assert!(!lab
        .node_proxy_log("terminal")
        .contains("shares one carrier"));
    // Per terminal, as `satpep status` shows it while all three download: terminal's clients
    // under their /24, shares 1 : 2 and terminal3's maximum (bits of carrier).
    let prefix = t1.client_net_v4.clone();
    let live = std::thread::scope(|s| {
        let d = s.spawn(|| downloads(&lab, 6, 0.0));
        std::thread::sleep(std::time::Duration::from_secs(4));
        let v = gateway_status(&lab);
        d.join().unwrap();
        v
    });
    let by_name = |v: &serde_json::Value, name: &str| {
        v["carrier"]
            .as_array()
            .and_then(|a| a.iter().find(|t| t["name"] == name).cloned())
            .unwrap_or_else(|| panic!("no terminal {name} in {v}"))
    };
    let share = |name: &str| by_name(&live, name)["share_bps"].as_f64().unwrap();
    eprintln!("carrier terminals: {}", live["carrier"]);
    for name in [prefix.as_str(), "terminal2", "terminal3"] {
        let t = by_name(&live, name);
        assert!(t["busy"].as_u64() >= Some(1), "{name} not busy: {t}");
        assert!(t["sending_bps"].as_u64() > Some(1_000_000), "{name}: {t}");
        assert!(t["rtt_ms"].as_f64() > Some(30.0), "{name}: {t}");
    }
    assert!(
        (share("terminal3") - 3e6).abs() < 0.05e6,
        "terminal3's share is its maximum: {}",
        live["carrier"]
    );
    let ratio = share("terminal2") / share(&prefix);
    assert!(
        (1.9..=2.1).contains(&ratio),
        "shares 2 : 1 gave {ratio:.2}: {}",
        live["carrier"]
    );
    let t1 = t1.client_net_v4;
    weights_then_reload(&lab, "proxy carrier", move |f| {
        let c = f.proxy.carrier.as_mut().unwrap();
        let mut w = c.terminal.remove("terminal2").unwrap();
        w.subnets = Some(vec![t1]);
        c.terminal.insert("terminal".into(), w);
    });
    // Totals since the start, under the names the terminals had: terminal's clients under
    // their prefix before the reload and as "terminal" after; terminal3 never above its
    // 3 Mbit/s of carrier (about 2.9 of payload) over its 24 s of downloads.
    let after = gateway_status(&lab);
    let acked = |name: &str| by_name(&after, name)["acked_bytes"].as_f64().unwrap();
    for name in [prefix.as_str(), "terminal", "terminal2", "terminal3"] {
        assert!(acked(name) > 1e6, "{name}: {}", after["carrier"]);
    }
    assert!(
        acked("terminal3") < 3e6 / 8.0 * 26.0,
        "terminal3 beyond its maximum: {}",
        after["carrier"]
    );
    let m = metrics(&lab, satpep_lab::Host::Gateway);
    assert!(
        m.contains("satpep_carrier_terminal_acked_bytes_total{terminal=\"terminal3\"}"),
        "{m}"
    );
    assert!(
        m.contains("satpep_carrier_terminal_share_bits_per_second{terminal=\"terminal2\"}"),
        "{m}"
    );
}

/// Split mode, two terminals on a 20 Mbit/s carrier shared at the gateway: each connection's
/// `satpep_sat` model runs at its share (it reads it from its pacing ceiling: a warm start,
/// not a start held by the ceiling with an ever growing window), and when terminal's
/// download ends the carrier it freed lifts terminal2's model to the whole carrier at once.
#[test]
fn split_models_run_at_their_shares_and_take_a_freed_share_at_once() {
    let mut pep = Pep::default();
    pep.file.proxy.carrier = Some(toml::from_str("rate = '20Mbit'").unwrap());
    let lab = star(
        "starfree",
        2,
        "[forward]\nrate='20Mbit'\ndelay='15ms'\n[return]\nrate='10Mbit'\ndelay='15ms'\n",
        Some(pep),
    );
    // The busiest satellite leg of terminal K's client (its iperf3 data connection).
    let leg = |v: &serde_json::Value, k: u16| -> serde_json::Value {
        let prefix = site(k).client_net_v4;
        let prefix = prefix.trim_end_matches("0/24");
        v["connections"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|c| c["src"].as_str().is_some_and(|s| s.starts_with(prefix)))
            .max_by_key(|c| c["bytes_down"].as_u64().unwrap_or(0))
            .map(|c| c["satellite"].clone())
            .unwrap_or_else(|| panic!("no connection of terminal {k} in {v}"))
    };
    let (held, freed, got) = std::thread::scope(|s| {
        let d = s.spawn(|| downloads_for(&lab, &[["-t", "4"], ["-t", "12"]]));
        std::thread::sleep(std::time::Duration::from_secs(3));
        let held = gateway_status(&lab);
        std::thread::sleep(std::time::Duration::from_secs(5));
        let freed = gateway_status(&lab);
        (held, freed, d.join().unwrap())
    });
    for k in [1, 2] {
        let l = leg(&held, k);
        eprintln!("terminal {k} held to its share: {l}");
        // 10 Mbit/s over 30 ms is 26 segments: a window of a few paths, not a start's.
        assert_ne!(l["model"]["phase"], "startup", "{l}");
        assert!(l["cwnd"].as_u64() < Some(200), "{l}");
    }
    let l = leg(&freed, 2);
    eprintln!("terminal2 after terminal's end: {l}");
    // The carrier's 20 Mbit/s hold 19.1 of TCP payload: the model's rate where the kernel
    // took its state iterator, and the pacing rate it sets always.
    assert!(
        !common::models_readable() || l["model"]["rate_bps"].as_f64() > Some(0.8 * 19.1e6),
        "terminal2's model did not take the freed share: {l}"
    );
    assert!(
        l["pacing_rate_bps"].as_f64() > Some(0.8 * 19.1e6),
        "terminal2's pacing did not take the freed share: {l}"
    );
    let late = goodput_between(&got[1].0, 8.0, 12.0);
    assert!(late > 0.85 * 19.1, "terminal2 alone: {late} Mbit/s");
}

/// `satpep status --json` of the gateway's proxy.
fn gateway_status(lab: &Lab) -> serde_json::Value {
    let out = lab
        .command(satpep_lab::Host::Gateway, env!("CARGO_BIN_EXE_satpep"))
        .args(["status", "--json"])
        .output()
        .unwrap();
    serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&out.stdout)))
}

/// The carrier of 30 Mbit/s shared by weight (terminal2 weighs 2, terminal3 may have 3
/// Mbit/s at most): with all three busy, terminal3 gets its maximum and the other two share
/// the rest 1 : 2, with the satellite's queue short (the gateway holds what would queue
/// there). Then `move_weight` edits the gateway's configuration to give the weight of 2 to
/// terminal instead, a reload applies it live (its log says `applied`), and terminal gets
/// twice terminal2's.
fn weights_then_reload(
    lab: &Lab,
    applied: &str,
    move_weight: impl FnOnce(&mut satpep_proxy::config::ProxyFile),
) {
    let got = downloads(lab, 10, 4.0);
    let q = lab.link_stats().unwrap().forward;
    eprintln!(
        "goodput {got:?} Mbit/s; forward queue p50 {} ms, p99 {} ms",
        q.queue_delay_p50_ms, q.queue_delay_p99_ms
    );
    let [(g1, _), (g2, _), (g3, _)] = got[..] else {
        panic!("{got:?}")
    };
    // 3 Mbit/s of carrier, less the headers and the framing.
    assert!(
        (2.0..=3.0).contains(&g3),
        "terminal3 beyond its maximum: {got:?}"
    );
    let ratio = g2 / g1;
    assert!(
        (1.6..=2.4).contains(&ratio),
        "weights 1 : 2 gave {ratio:.2}: {got:?}"
    );
    let total = g1 + g2 + g3;
    assert!(
        total >= 0.8 * 30.0 * 1448.0 / 1514.0,
        "the carrier was left idle: {got:?}"
    );
    let log = lab.node_proxy_log("gateway");
    assert!(log.contains("shares one carrier"), "{log}");

    let file = satpep_lab::topology::state_dir(&lab.name).join("proxy-gateway.toml");
    let mut f =
        satpep_proxy::config::ProxyFile::parse(&std::fs::read_to_string(&file).unwrap()).unwrap();
    move_weight(&mut f);
    std::fs::write(&file, toml::to_string(&f).unwrap()).unwrap();
    // SAFETY: signalling the lab's gateway proxy.
    unsafe { libc::kill(proxy_pid(lab, "gateway"), libc::SIGHUP) };
    let reloaded = (0..50).any(|_| {
        std::thread::sleep(std::time::Duration::from_millis(100));
        lab.node_proxy_log("gateway").contains(applied)
    });
    assert!(reloaded, "{}", lab.node_proxy_log("gateway"));
    let got = downloads(lab, 8, 3.0);
    eprintln!("after the reload: goodput {got:?} Mbit/s");
    let ratio = got[0].0 / got[1].0;
    assert!(
        (1.6..=2.4).contains(&ratio),
        "weights 2 : 1 gave {ratio:.2}: {got:?}"
    );
    assert!(!lab
        .node_proxy_log("gateway")
        .contains("take effect at the next start"));
}
