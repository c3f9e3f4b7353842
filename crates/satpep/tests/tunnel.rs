//! Distributed mode in a lab: the terminal carries every flow to the gateway in one QUIC
//! connection. Integrity and transparency, encryption on the hop, refused and unreachable
//! servers (fast and strict), wrong credentials, outages, and an interactive flow beside a
//! bulk one. Client and server are threads of this test inside the lab's namespaces.

mod common;

use common::*;
use satpep_lab::topology::Pep;
use satpep_lab::{Host, Lab};
use sha2::{Digest, Sha256};
use std::io::{ErrorKind, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::time::{Duration, Instant};

fn tunnel_lab(tag: &str, link: &str, handshake: Option<&str>) -> Lab {
    lab_with(
        tag,
        link,
        Some(Pep {
            tunnel: Some("satellite".into()),
            handshake: handshake.map(String::from),
            ..Default::default()
        }),
    )
}

fn log(lab: &Lab, host: &str) -> String {
    std::fs::read_to_string(
        satpep_lab::topology::state_dir(&lab.name).join(format!("proxy-{host}.log")),
    )
    .unwrap_or_default()
}

/// Starts `satpep proxy --config CONFIG` in `host`, logging to `log`.
fn proxy_in(lab: &Lab, host: Host, config: &str, log: &str) -> std::process::Child {
    lab.command(host, bin())
        .args(["proxy", "--config", config])
        .stdout(std::process::Stdio::null())
        .stderr(std::fs::File::create(log).unwrap())
        .spawn()
        .unwrap()
}

fn listen(lab: &Lab, addr: &'static str) -> TcpListener {
    in_netns(&lab.ns(Host::Server), move || {
        TcpListener::bind(addr).unwrap()
    })
    .join()
    .unwrap()
}

#[test]
fn flows_cross_the_tunnel_intact_transparent_and_encrypted() {
    let lab = tunnel_lab("tint", "[both]\nrate='200Mbit'\ndelay='5ms'\n", None);
    // Everything the gateway receives from the hop, for the plaintext check below.
    let pcap = satpep_lab::topology::state_dir(&lab.name)
        .join("hop.pcap")
        .display()
        .to_string();
    let mut dump = lab
        .command(Host::Gateway, "tcpdump")
        .args(["-i", "to-link", "-s", "0", "-U", "-w", &pcap, "udp"])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(500));
    let marker = b"SATPEP-PLAINTEXT-MARKER-0123456789".repeat(64);
    for (server_ip, client_ip, port) in [
        ("198.18.3.2", "198.18.1.2", 9100),
        ("2001:2:0:3::2", "2001:2:0:1::2", 9101),
    ] {
        let listener = listen(
            &lab,
            if port == 9100 {
                "[::]:9100"
            } else {
                "[::]:9101"
            },
        );
        let mut data = marker.clone();
        data.extend(pattern(32 << 20, 3));
        let addr = if server_ip.contains(':') {
            format!("[{server_ip}]:{port}")
        } else {
            format!("{server_ip}:{port}")
        };
        assert_exchange_intact(&lab, listener, addr, data, pattern(8 << 20, 7), client_ip);
    }
    std::thread::sleep(Duration::from_millis(500));
    let _ = dump.kill();
    let _ = dump.wait();
    let cap = std::fs::read(&pcap).unwrap();
    assert!(
        cap.len() > 32 << 20,
        "the flows crossed the hop as UDP: {} bytes",
        cap.len()
    );
    assert!(
        !cap.windows(24).any(|w| w == &marker[..24]),
        "flow bytes crossed the hop in clear"
    );
    // Both flows went through one tunnel, and nothing was split as TCP.
    let gw = log(&lab, "gateway");
    assert_eq!(gw.matches("tunnel peer authenticated").count(), 1, "{gw}");
    assert!(gw.matches("tunnel flow ").count() >= 2, "{gw}");
    // Both ends export the live tunnel: one connection, its RTT on this 10 ms path, the
    // packets it carried (more than 40 MB's worth one way), and no failed handshake.
    for (host, sent_at_least) in [(Host::Terminal, 20_000.0), (Host::Gateway, 1_000.0)] {
        let m = metrics(&lab, host);
        let value = |name: &str| -> f64 {
            m.lines()
                .find(|l| l.starts_with(name) && !l.starts_with('#'))
                .and_then(|l| l.rsplit(' ').next()?.parse().ok())
                .unwrap_or_else(|| panic!("no {name} in\n{m}"))
        };
        // A terminal says its one tunnel is up; a gateway how many terminals it has.
        match host {
            Host::Terminal => assert_eq!(value("satpep_tunnel_connected "), 1.0, "{m}"),
            _ => {
                assert_eq!(value("satpep_tunnel_peers "), 1.0, "{m}");
                assert!(!m.contains("satpep_tunnel_connected "), "{m}");
            }
        }
        // The peer is named by its address alone: a reconnection from a new port keeps
        // the dashboards' series.
        assert!(
            m.contains("satpep_tunnel_window_bytes{peer=\"198.18."),
            "{m}"
        );
        assert!(!m.contains(":7701\""), "{m}");
        // And by its certificate's name, which stays when the address changes.
        let name = if matches!(host, Host::Terminal) {
            "gateway"
        } else {
            "terminal"
        };
        assert!(m.contains(&format!(",name=\"{name}\"}}")), "{m}");
        assert!(m.contains("satpep_tunnel_flows{peer="), "{m}");
        assert_eq!(value("satpep_tunnel_connections_total "), 1.0, "{m}");
        assert_eq!(value("satpep_tunnel_handshake_failures_total "), 0.0, "{m}");
        let rtt = value("satpep_tunnel_min_rtt_seconds{");
        assert!((0.009..0.05).contains(&rtt), "{rtt} in\n{m}");
        assert!(
            value("satpep_tunnel_sent_packets_total{") >= sent_at_least,
            "{m}"
        );
        assert!(value("satpep_tunnel_window_bytes{") > 0.0, "{m}");
        // The satellite controller's own figures (published by it, not read by a downcast)
        // and its pacing rate (quinn's `Controller::metrics()`).
        assert!(
            value("satpep_tunnel_model_rate_bytes_per_second{") > 0.0,
            "{m}"
        );
        assert!(value("satpep_tunnel_model_base_rtt_seconds{") > 0.0, "{m}");
        assert!(
            value("satpep_tunnel_pacing_rate_bytes_per_second{") > 0.0,
            "{m}"
        );
        assert!(m.contains("satpep_tunnel_controller_phase{"), "{m}");
        assert!(m.contains("satpep_tunnel_loss_events_total{peer="), "{m}");
        // No split connection is live at either end: no per-leg means (they printed -0.0).
        assert!(
            !m.contains("satpep_leg_rtt_seconds{") && !m.contains("-0.0"),
            "{m}"
        );
    }
}

#[test]
fn refused_and_unreachable_servers_reset_fast_clients_and_refuse_strict_ones() {
    // 200 ms RTT.
    let link = "[both]\nrate='20Mbit'\ndelay='100ms'\n";
    let lab = tunnel_lab("tref", link, None);
    let listener = listen(&lab, "0.0.0.0:9110");
    let server = std::thread::spawn(move || {
        let (s, _) = listener.accept().unwrap();
        let mut b = [0u8; 4];
        (&s).read_exact(&mut b).unwrap();
        socket2::SockRef::from(&s)
            .set_linger(Some(Duration::ZERO))
            .unwrap();
        drop(s);
    });
    let (reset, refused) = in_netns(&lab.ns(Host::Client), || {
        let read_one = |dst: &str, send: bool| {
            let mut s = TcpStream::connect(dst)?;
            if send {
                s.write_all(b"ping")?;
            }
            s.set_read_timeout(Some(Duration::from_secs(5)))?;
            let mut b = [0u8; 4];
            s.read(&mut b)
        };
        (
            read_one("198.18.3.2:9110", true).map_err(|e| e.kind()),
            read_one("198.18.3.2:9111", false).map_err(|e| e.kind()),
        )
    })
    .join()
    .unwrap();
    server.join().unwrap();
    assert_eq!(reset, Err(ErrorKind::ConnectionReset), "server RST relayed");
    assert_eq!(
        refused,
        Err(ErrorKind::ConnectionReset),
        "fast mode: a refused server resets the accepted client"
    );
    drop(lab);

    let lab = tunnel_lab("tstr", link, Some("strict"));
    let listener = listen(&lab, "[::]:9112");
    let server = std::thread::spawn(move || {
        let (mut s, peer) = listener.accept().unwrap();
        s.write_all(b"hello").unwrap();
        peer
    });
    let (kinds, times) = in_netns(&lab.ns(Host::Client), || {
        let timed = |dst: &str| {
            let t = Instant::now();
            let r = TcpStream::connect_timeout(&dst.parse().unwrap(), Duration::from_secs(10));
            (r, t.elapsed())
        };
        let (open, t_open) = timed("198.18.3.2:9112");
        let mut hello = [0u8; 5];
        open.expect("open port").read_exact(&mut hello).unwrap();
        assert_eq!(&hello, b"hello");
        let (refused, t_refused) = timed("198.18.3.2:9113");
        let (unreach, t_unreach) = timed("198.18.4.1:80");
        let kinds: Vec<Option<i32>> = [refused, unreach]
            .into_iter()
            .map(|r| r.err().and_then(|e| e.raw_os_error()))
            .collect();
        (kinds, [t_open, t_refused, t_unreach])
    })
    .join()
    .unwrap();
    assert_eq!(
        kinds,
        vec![Some(libc::ECONNREFUSED), Some(libc::EHOSTUNREACH)],
        "strict mode: the client sees the server's own answer"
    );
    for t in times {
        assert!(
            (Duration::from_millis(195)..Duration::from_millis(1500)).contains(&t),
            "each answer takes the hop's round trip: {times:?}"
        );
    }
    let peer = server.join().unwrap();
    assert_eq!(peer.ip().to_canonical().to_string(), "198.18.1.2");
}

#[test]
fn a_peer_with_wrong_credentials_is_refused_and_logged() {
    let mut lab = tunnel_lab("tkey", "[both]\nrate='50Mbit'\ndelay='10ms'\n", None);
    let dir = satpep_lab::topology::state_dir(&lab.name)
        .display()
        .to_string();
    // Stop the lab's terminal; start one whose certificate another CA signed.
    let gateway_log = log(&lab, "gateway");
    assert!(
        gateway_log.contains("tunnel gateway listening"),
        "{gateway_log}"
    );
    let foreign = format!("{dir}/foreign");
    satpep_ok(&["keygen", "--dir", &foreign, "terminal"]);
    let terminal_cfg = std::fs::read_to_string(format!("{dir}/proxy-terminal.toml")).unwrap();
    lab.stop_proxies();
    let gw = proxy_in(
        &lab,
        Host::Gateway,
        &format!("{dir}/proxy-gateway.toml"),
        &format!("{dir}/gw2.log"),
    );
    let bad = terminal_cfg
        .replace(
            &format!("{dir}/keys/terminal."),
            &format!("{foreign}/terminal."),
        )
        .replace(&format!("{dir}/keys/ca.pem"), &format!("{foreign}/ca.pem"));
    std::fs::write(format!("{dir}/bad.toml"), bad).unwrap();
    let term = proxy_in(
        &lab,
        Host::Terminal,
        &format!("{dir}/bad.toml"),
        &format!("{dir}/term2.log"),
    );
    std::thread::sleep(Duration::from_secs(2));
    let listener = listen(&lab, "0.0.0.0:9120");
    listener.set_nonblocking(true).unwrap();
    let r = in_netns(&lab.ns(Host::Client), || {
        let mut s = TcpStream::connect("198.18.3.2:9120")?;
        s.write_all(b"secret")?;
        s.set_read_timeout(Some(Duration::from_secs(5)))?;
        let mut b = [0u8; 4];
        s.read(&mut b)
    })
    .join()
    .unwrap();
    for mut c in [term, gw] {
        unsafe { libc::kill(c.id() as i32, libc::SIGTERM) };
        let _ = c.wait();
    }
    assert_eq!(
        r.map_err(|e| e.kind()),
        Err(ErrorKind::ConnectionReset),
        "a flow with no authenticated tunnel is reset"
    );
    assert!(
        listener.accept().is_err(),
        "nothing reached the server through an unauthenticated peer"
    );
    let gw = std::fs::read_to_string(format!("{dir}/gw2.log")).unwrap();
    assert!(gw.contains("refused a tunnel peer"), "{gw}");
    assert!(!gw.contains("tunnel peer authenticated"), "{gw}");
    let term = std::fs::read_to_string(format!("{dir}/term2.log")).unwrap();
    assert!(term.contains("refused or failed the handshake"), "{term}");
}

#[test]
fn flows_survive_an_outage_of_the_hop() {
    let link = "[both]\nrate='20Mbit'\ndelay='50ms'\n";
    let mut lab = tunnel_lab("tout", link, None);
    let listener = listen(&lab, "0.0.0.0:9130");
    const FLOWS: usize = 5;
    const SIZE: usize = 4 << 20;
    let server = std::thread::spawn(move || {
        let mut hs = Vec::new();
        for i in 0..FLOWS {
            let (mut s, _) = listener.accept().unwrap();
            hs.push(std::thread::spawn(move || {
                let mut seed = [0u8; 1];
                s.read_exact(&mut seed).unwrap();
                s.write_all(&pattern(SIZE, seed[0])).unwrap();
                i
            }));
        }
        let done: Vec<usize> = hs.into_iter().map(|h| h.join().unwrap()).collect();
        done.len()
    });
    // The link goes down 1 s after the emulator restarts, for 10 s, mid-transfer.
    let spec: satpep_link::config::LinkSpec =
        toml::from_str(&format!("{link}[outage]\ndown=['1s..11s']\n")).unwrap();
    let spec = satpep_link::config::LinkSpec::layered(&[&spec]).unwrap();
    lab.start_emulator(&spec).unwrap();
    let t0 = Instant::now();
    let results = in_netns(&lab.ns(Host::Client), || {
        let hs: Vec<_> = (0..FLOWS as u8)
            .map(|i| {
                std::thread::spawn(move || {
                    let mut s = TcpStream::connect("198.18.3.2:9130").unwrap();
                    s.write_all(&[i + 1]).unwrap();
                    let mut got = Vec::new();
                    s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
                    let r = s.read_to_end(&mut got).map_err(|e| e.kind());
                    (
                        i,
                        r.map(|_| Sha256::digest(&got) == Sha256::digest(pattern(SIZE, i + 1))),
                    )
                })
            })
            .collect();
        hs.into_iter()
            .map(|h| h.join().unwrap())
            .collect::<Vec<_>>()
    })
    .join()
    .unwrap();
    let took = t0.elapsed();
    assert_eq!(server.join().unwrap(), FLOWS);
    for (i, r) in results {
        assert_eq!(
            r,
            Ok(true),
            "flow {i}: complete and intact after the outage"
        );
    }
    // 20 MB at 20 Mbit/s is 8 s; with the 10 s outage the flows must have waited it out.
    assert!(
        took > Duration::from_secs(11),
        "{took:?}: the outage did not happen"
    );
    let stats = lab.link_stats().unwrap();
    assert!(stats.forward.dropped_outage + stats.ret.dropped_outage > 0);
}

#[test]
fn an_interactive_flow_is_not_stuck_behind_a_bulk_download() {
    // 20 Mbit/s, RTT 200 ms.
    let lab = tunnel_lab("tfair", "[both]\nrate='20Mbit'\ndelay='100ms'\n", None);
    let bulk_l = listen(&lab, "0.0.0.0:9140");
    let echo_l = listen(&lab, "0.0.0.0:9141");
    let bulk = std::thread::spawn(move || {
        let (mut s, _) = bulk_l.accept().unwrap();
        let chunk = pattern(1 << 20, 1);
        // As much as the client takes for 12 s.
        let t = Instant::now();
        while t.elapsed() < Duration::from_secs(12) {
            if s.write_all(&chunk).is_err() {
                break;
            }
        }
    });
    let echo = std::thread::spawn(move || {
        let (mut s, _) = echo_l.accept().unwrap();
        s.set_nodelay(true).unwrap();
        let mut b = [0u8; 100];
        while s.read_exact(&mut b).is_ok() {
            if s.write_all(&b).is_err() {
                break;
            }
        }
    });
    let (times, bulk_bytes) = in_netns(&lab.ns(Host::Client), || {
        let reader = std::thread::spawn(|| {
            let mut s = TcpStream::connect("198.18.3.2:9140").unwrap();
            let mut n = 0u64;
            let mut buf = vec![0u8; 1 << 16];
            while let Ok(k) = s.read(&mut buf) {
                if k == 0 {
                    break;
                }
                n += k as u64;
            }
            n
        });
        // Let the bulk flow fill the hop first.
        std::thread::sleep(Duration::from_secs(4));
        let mut s = TcpStream::connect("198.18.3.2:9141").unwrap();
        s.set_nodelay(true).unwrap();
        let mut times = Vec::new();
        let mut b = [7u8; 100];
        for _ in 0..10 {
            let t = Instant::now();
            s.write_all(&b).unwrap();
            s.read_exact(&mut b).unwrap();
            times.push(t.elapsed());
        }
        drop(s);
        (times, reader.join().unwrap())
    })
    .join()
    .unwrap();
    bulk.join().unwrap();
    echo.join().unwrap();
    let mut sorted = times.clone();
    sorted.sort();
    let median = sorted[sorted.len() / 2];
    // The bulk flow had the hop: at least 8 s of 20 Mbit/s at a third of the rate.
    assert!(bulk_bytes > 8 << 20, "bulk moved {bulk_bytes} bytes");
    // One RTT plus the small queue the tunnel keeps; a TCP flow sharing a full 1-BDP
    // bottleneck queue would wait a second RTT.
    assert!(
        median < Duration::from_millis(300),
        "request/response behind a bulk download: {times:?}"
    );
}

#[test]
fn keygen_refuses_bad_names_and_overwrites_only_with_force() {
    let dir = std::env::temp_dir().join(format!("satpep-keygen-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let d = dir.to_str().unwrap();
    let run = |args: &[&str]| satpep().arg("keygen").args(args).output().unwrap();
    let bad = run(&["--dir", d, "not a name"]);
    assert!(!bad.status.success());
    assert!(
        String::from_utf8_lossy(&bad.stderr).contains("'not a name' is not a usable name"),
        "{}",
        String::from_utf8_lossy(&bad.stderr)
    );
    let ok = run(&["--dir", d, "terminal", "gateway"]);
    assert!(
        ok.status.success(),
        "{}",
        String::from_utf8_lossy(&ok.stderr)
    );
    assert!(String::from_utf8_lossy(&ok.stdout).contains("new CA"));
    let again = run(&["--dir", d, "gateway"]);
    assert!(
        !again.status.success(),
        "overwrote a certificate without --force"
    );
    assert!(run(&["--dir", d, "gateway", "--force"]).status.success());
    // A config naming files that do not exist is refused with the key named.
    let cfg = dir.join("t.toml");
    std::fs::write(
        &cfg,
        format!("[tunnel]\nrole='gateway'\nca='{d}/nope.pem'\ncert='{d}/gateway.pem'\nkey='{d}/gateway.key'\nlisten='127.0.0.1:0'\n[proxy]\nmetrics=''\n"),
    )
    .unwrap();
    let out = satpep()
        .args(["proxy", "--config", cfg.to_str().unwrap()])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(err.contains("tunnel.ca: cannot read"), "{err}");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn after_a_gateway_restart_new_flows_reconnect() {
    // Stopped idle: the terminal is told, and new flows reconnect to the restarted gateway.
    let mut lab = tunnel_lab("trst", "[both]\nrate='20Mbit'\ndelay='50ms'\n", None);
    let dir = satpep_lab::topology::state_dir(&lab.name)
        .display()
        .to_string();
    let listener = listen(&lab, "0.0.0.0:9150");
    let server = std::thread::spawn(move || {
        for greeting in [&b"before"[..], &b"after restart"[..]] {
            let (mut s, _) = listener.accept().unwrap();
            s.write_all(greeting).unwrap();
        }
    });
    let get = |lab: &Lab| {
        in_netns(&lab.ns(Host::Client), || {
            let mut s = TcpStream::connect("198.18.3.2:9150").unwrap();
            s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
            let mut b = Vec::new();
            s.read_to_end(&mut b).map(|_| b).map_err(|e| e.kind())
        })
        .join()
        .unwrap()
    };
    assert_eq!(get(&lab).as_deref(), Ok(&b"before"[..]));
    // The gateway started first, so it is the first recorded proxy.
    let gw_pid = lab.state().proxy_pids[0];
    unsafe { libc::kill(gw_pid as i32, libc::SIGTERM) };
    let t = Instant::now();
    while !log(&lab, "terminal").contains("tunnel closed") {
        assert!(
            t.elapsed() < Duration::from_secs(3),
            "the terminal was not told: {}",
            log(&lab, "terminal")
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    // The old gateway may still hold the UDP port while it exits: retry until it is free.
    let t = Instant::now();
    let mut gw = loop {
        let mut c = proxy_in(
            &lab,
            Host::Gateway,
            &format!("{dir}/proxy-gateway.toml"),
            &format!("{dir}/gw2.log"),
        );
        let up = loop {
            let l = std::fs::read_to_string(format!("{dir}/gw2.log")).unwrap_or_default();
            if l.contains("tunnel gateway listening") {
                break true;
            }
            if c.try_wait().unwrap().is_some() {
                assert!(l.contains("Address already in use"), "gateway failed: {l}");
                break false;
            }
            std::thread::sleep(Duration::from_millis(50));
        };
        if up {
            break c;
        }
        assert!(
            t.elapsed() < Duration::from_secs(10),
            "port 7701 never freed"
        );
        std::thread::sleep(Duration::from_millis(200));
    };
    let after = get(&lab);
    unsafe { libc::kill(gw.id() as i32, libc::SIGTERM) };
    let _ = gw.wait();
    server.join().unwrap();
    assert_eq!(after.as_deref(), Ok(&b"after restart"[..]));
    let term = log(&lab, "terminal");
    assert_eq!(term.matches("tunnel up").count(), 2, "{term}");
    lab.stop_proxies();
}

/// A server on `port` that sends for 40 s, and a client thread downloading from it until the
/// connection ends; the thread returns (bytes read, how it ended, when).
fn endless_download(
    lab: &Lab,
    port: u16,
    seed: u8,
) -> std::thread::JoinHandle<(u64, Result<(), ErrorKind>, Instant)> {
    download_for(lab, port, seed, 40)
}

/// A download the server writes for `secs` seconds (unless its connection fails first): the
/// bytes the client read, how the stream ended, and when.
fn download_for(
    lab: &Lab,
    port: u16,
    seed: u8,
    secs: u64,
) -> std::thread::JoinHandle<(u64, Result<(), ErrorKind>, Instant)> {
    let listener = in_netns(&lab.ns(Host::Server), move || {
        TcpListener::bind(("0.0.0.0", port)).unwrap()
    })
    .join()
    .unwrap();
    std::thread::spawn(move || {
        let (mut s, _) = listener.accept().unwrap();
        let chunk = pattern(1 << 20, seed);
        let t = Instant::now();
        while t.elapsed() < Duration::from_secs(secs) && s.write_all(&chunk).is_ok() {}
    });
    in_netns(&lab.ns(Host::Client), move || {
        let mut s = TcpStream::connect(("198.18.3.2", port)).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
        let mut n = 0u64;
        let mut buf = vec![0u8; 1 << 16];
        let end = loop {
            match s.read(&mut buf) {
                Ok(0) => break Ok(()),
                Ok(k) => n += k as u64,
                Err(e) => break Err(e.kind()),
            }
        };
        (n, end, Instant::now())
    })
}

#[test]
fn a_gateway_stopped_under_load_resets_live_flows_at_once() {
    // Stopped while a download fills the congestion window, the gateway's close must still
    // leave (quinn holds it behind the window otherwise; see congestion::stop).
    let mut lab = tunnel_lab("tstp", "[both]\nrate='20Mbit'\ndelay='50ms'\n", None);
    let client = endless_download(&lab, 9170, 6);
    std::thread::sleep(Duration::from_secs(3));
    let gw_pid = lab.state().proxy_pids[0];
    let stopped = Instant::now();
    unsafe { libc::kill(gw_pid as i32, libc::SIGTERM) };
    let (n, end, at) = client.join().unwrap();
    assert!(n > 1 << 20, "the download was running: {n} bytes");
    assert_eq!(
        end,
        Err(ErrorKind::ConnectionReset),
        "{}",
        log(&lab, "terminal")
    );
    let waited = at.saturating_duration_since(stopped);
    assert!(
        waited < Duration::from_secs(2),
        "reset {waited:?} after the stop: {}",
        log(&lab, "terminal")
    );
    lab.stop_proxies();
}

#[test]
fn a_crashed_and_restarted_gateway_resets_live_flows_at_once() {
    let mut lab = tunnel_lab("tcrs", "[both]\nrate='20Mbit'\ndelay='50ms'\n", None);
    let dir = satpep_lab::topology::state_dir(&lab.name)
        .display()
        .to_string();
    let client = endless_download(&lab, 9160, 5);
    std::thread::sleep(Duration::from_secs(3));
    // A crash: no close reaches the terminal.
    let gw_pid = lab.state().proxy_pids[0];
    unsafe { libc::kill(gw_pid as i32, libc::SIGKILL) };
    // The restarted gateway removes what the crashed one left installed, by itself.
    std::thread::sleep(Duration::from_secs(1));
    let restarted = Instant::now();
    let mut gw = proxy_in(
        &lab,
        Host::Gateway,
        &format!("{dir}/proxy-gateway.toml"),
        &format!("{dir}/gw3.log"),
    );
    let (n, end, at) = client.join().unwrap();
    unsafe { libc::kill(gw.id() as i32, libc::SIGTERM) };
    let _ = gw.wait();
    assert!(n > 1 << 20, "the download was running: {n} bytes");
    assert_eq!(
        end,
        Err(ErrorKind::ConnectionReset),
        "a flow whose gateway crashed is reset, never ended cleanly"
    );
    // The restarted gateway's stateless reset ends the dead tunnel at once, not after the
    // 65 s outage tolerance.
    let waited = at.saturating_duration_since(restarted);
    assert!(
        waited < Duration::from_secs(5),
        "reset {waited:?} after the restart"
    );
    let term = log(&lab, "terminal");
    assert!(term.contains("tunnel closed"), "{term}");
    lab.stop_proxies();
}

/// Bytes a client receives in its first `mark` and `secs` seconds from connecting to `addr`
/// (the server sends without end).
fn received_in(lab: &Lab, addr: &'static str, mark: f64, secs: f64) -> (usize, usize) {
    in_netns(&lab.ns(Host::Client), move || {
        let mut s = TcpStream::connect(addr).unwrap();
        s.set_read_timeout(Some(Duration::from_millis(50))).unwrap();
        let start = Instant::now();
        let mut buf = vec![0u8; 1 << 16];
        let (mut n, mut at_mark) = (0, None);
        while start.elapsed().as_secs_f64() < secs {
            match s.read(&mut buf) {
                Ok(0) => break,
                Ok(k) => n += k,
                Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
                Err(e) => panic!("read: {e}"),
            }
            if at_mark.is_none() && start.elapsed().as_secs_f64() >= mark {
                at_mark = Some(n);
            }
        }
        (at_mark.unwrap_or(n), n)
    })
    .join()
    .unwrap()
}

#[test]
fn a_new_flow_through_a_tunnel_that_carried_traffic_starts_at_the_path_rate() {
    // 20 Mbit/s, RTT 200 ms: a BDP of 500 kB, which a cold start reaches in five rounds.
    let lab = tunnel_lab(
        "twarm",
        "[both]\nrate='20Mbit'\ndelay='100ms'\nqueue='1MB'\n",
        None,
    );
    let listener = listen(&lab, "[::]:9200");
    let server = std::thread::spawn(move || {
        let chunk = pattern(1 << 20, 5);
        for _ in 0..2 {
            let (mut s, _) = listener.accept().unwrap();
            while s.write_all(&chunk).is_ok() {}
        }
    });
    let secs = 1.5;
    let (cold, _) = received_in(&lab, "198.18.3.2:9200", secs, 6.0);
    // Idle for a while: the tunnel (and its model) stays up; the next flow is new.
    std::thread::sleep(Duration::from_secs(3));
    let (warm, _) = received_in(&lab, "198.18.3.2:9200", secs, secs);
    server.join().unwrap();
    let link = 20e6 / 8.0 * 1448.0 / 1514.0;
    let warm_share = warm as f64 / (link * secs);
    println!(
        "in their first {secs} s: the first flow {:.2} MB, a second one after 3 s idle {:.2} MB = {:.0} % of the link's rate",
        cold as f64 / 1e6,
        warm as f64 / 1e6,
        warm_share * 100.0
    );
    assert!(
        warm as f64 > 1.3 * cold as f64,
        "the second flow ({warm} B) started no faster than the first ({cold} B)"
    );
    // A cold start from 32 packets doubling per 200 ms round delivers about a third of this
    // in 1.5 s (the flow's own setup takes a round trip too).
    assert!(
        warm_share >= 0.6,
        "a warm flow got {:.0} % of the link in its first {secs} s",
        warm_share * 100.0
    );
}

/// A QUIC handshake with the lab's gateway from the terminal's namespace, presenting the
/// certificate `name` has from the lab's CA (in `keys`). Connected, it tells `connected` and
/// waits (20 s at most) for the gateway to close the connection: the close's code and reason.
/// Refused, the handshake's error.
fn quic_as(
    lab: &Lab,
    keys: &str,
    name: &str,
    connected: std::sync::mpsc::Sender<()>,
) -> std::thread::JoinHandle<Result<String, String>> {
    let (keys, name) = (std::path::PathBuf::from(keys), name.to_string());
    in_netns(&lab.ns(Host::Terminal), move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async move {
            let creds = satpep_tunnel::keys::Credentials::load(
                &keys.join("ca.pem"),
                &keys.join(format!("{name}.pem")),
                &keys.join(format!("{name}.key")),
            )?;
            let tls = quinn::crypto::rustls::QuicClientConfig::try_from(creds.client_tls()?)
                .map_err(|e| e.to_string())?;
            let mut ep =
                quinn::Endpoint::client("0.0.0.0:0".parse().unwrap()).map_err(|e| e.to_string())?;
            ep.set_default_client_config(quinn::ClientConfig::new(std::sync::Arc::new(tls)));
            let conn = ep
                .connect("198.18.2.2:7701".parse().unwrap(), "gateway")
                .map_err(|e| e.to_string())?;
            let conn = tokio::time::timeout(Duration::from_secs(10), conn)
                .await
                .map_err(|_| "handshake timed out".to_string())?
                .map_err(|e| format!("refused: {e}"))?;
            // quinn finishes the handshake before the server has checked the client's
            // certificate: a refusal shows as the connection's close right after.
            let early = tokio::time::timeout(Duration::from_secs(2), conn.closed()).await;
            if let Ok(e) = early {
                return Err(format!("refused: {e}"));
            }
            let _ = connected.send(());
            match tokio::time::timeout(Duration::from_secs(20), conn.closed()).await {
                Ok(quinn::ConnectionError::ApplicationClosed(c)) => Ok(format!(
                    "closed {}: {}",
                    c.error_code,
                    String::from_utf8_lossy(&c.reason)
                )),
                Ok(e) => Ok(format!("lost: {e}")),
                Err(_) => Ok("still open".into()),
            }
        })
    })
}

#[test]
fn an_unlisted_or_revoked_terminal_is_refused_and_a_reload_closes_only_its_connection() {
    let mut lab = tunnel_lab("tadm", "[both]\nrate='50Mbit'\ndelay='10ms'\n", None);
    let dir = satpep_lab::topology::state_dir(&lab.name)
        .display()
        .to_string();
    let keys = format!("{dir}/keys");
    // Two more satpeps from the lab's CA: one the gateway does not list, one it does.
    satpep_ok(&["keygen", "--dir", &keys, "intruder", "spare"]);
    let mut cfg: toml::Table =
        toml::from_str(&std::fs::read_to_string(format!("{dir}/proxy-gateway.toml")).unwrap())
            .unwrap();
    let t = cfg["tunnel"].as_table_mut().unwrap();
    t.insert(
        "terminals".into(),
        toml::Value::Array(vec!["terminal".into(), "spare".into()]),
    );
    t.insert("crl".into(), format!("{keys}/crl.pem").into());
    let gw_cfg = format!("{dir}/admitting.toml");
    std::fs::write(&gw_cfg, toml::to_string(&cfg).unwrap()).unwrap();
    lab.stop_proxies();
    let gw_log = format!("{dir}/gw-adm.log");
    let mut gw = proxy_in(&lab, Host::Gateway, &gw_cfg, &gw_log);
    std::thread::sleep(Duration::from_secs(1));
    let mut term = proxy_in(
        &lab,
        Host::Terminal,
        &format!("{dir}/proxy-terminal.toml"),
        &format!("{dir}/term-adm.log"),
    );
    std::thread::sleep(Duration::from_secs(2));
    // The lab's own terminal carries a download through it all.
    let download = download_for(&lab, 9190, 9, 20);
    let (tx, rx) = std::sync::mpsc::channel();
    let intruder = quic_as(&lab, &keys, "intruder", tx.clone()).join().unwrap();
    let spare = quic_as(&lab, &keys, "spare", tx);
    rx.recv_timeout(Duration::from_secs(15))
        .expect("a listed terminal is admitted");
    // The gateway's status lists its terminals by name, with the flows each carries.
    let out = lab
        .command(Host::Gateway, bin())
        .args(["status", "--json"])
        .output()
        .unwrap();
    let status: serde_json::Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&out.stdout)));
    let tunnels = status["tunnels"].as_array().unwrap();
    let flows_of = |name: &str| {
        tunnels
            .iter()
            .find(|t| t["name"] == name)
            .unwrap_or_else(|| panic!("no tunnel to {name}: {status}"))["flows"]
            .as_u64()
            .unwrap()
    };
    assert_eq!(tunnels.len(), 2, "{status}");
    assert_eq!(flows_of("terminal"), 1, "the download: {status}");
    assert_eq!(flows_of("spare"), 0, "{status}");
    // The spare is out: revoked, and the gateway reloaded.
    satpep_ok(&["keygen", "revoke", "spare", "--dir", &keys]);
    unsafe { libc::kill(gw.id() as i32, libc::SIGHUP) };
    let spare = spare.join().unwrap();
    let (tx, _rx) = std::sync::mpsc::channel();
    let spare_again = quic_as(&lab, &keys, "spare", tx).join().unwrap();
    let (n, end, _) = download.join().unwrap();
    for c in [&mut term, &mut gw] {
        unsafe { libc::kill(c.id() as i32, libc::SIGTERM) };
        let _ = c.wait();
    }
    let gw_text = std::fs::read_to_string(&gw_log).unwrap();
    assert!(
        intruder.is_err(),
        "an unlisted terminal was admitted: {intruder:?}"
    );
    assert!(
        gw_text.contains("'intruder' is not among tunnel.terminals"),
        "{gw_text}"
    );
    assert_eq!(
        spare.as_deref(),
        Ok("closed 4: terminal 'spare': its certificate is revoked"),
        "{gw_text}"
    );
    assert!(
        spare_again.is_err(),
        "a revoked terminal was admitted again"
    );
    assert!(gw_text.contains("its certificate is revoked"), "{gw_text}");
    // The lab's terminal kept its flow: the download ran to the server's end (20 s), no
    // reset, tens of MB through.
    assert_eq!(end, Ok(()), "{gw_text}");
    assert!(n > 10 << 20, "{n} bytes");
}
