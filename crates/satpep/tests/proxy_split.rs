//! The split proxy in a lab: transparency, integrity, half-close, reset relay, refused
//! servers, and clean-up of what it installs. Client and server here are threads of this test
//! that enter the lab's namespaces, so every byte can be checked.

mod common;

use common::*;
use satpep_lab::topology::Pep;
use satpep_lab::{Host, Lab};
use satpep_proxy::config::{LegFile, ProxyFile, ProxySection};
use std::io::{ErrorKind, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::time::Duration;

fn split_lab(tag: &str, link: &str) -> Lab {
    split_lab_with(tag, link, None)
}

fn split_lab_with(tag: &str, link: &str, max_connections: Option<u32>) -> Lab {
    lab_with(
        tag,
        link,
        Some(Pep {
            cc: Some("cubic".into()),
            max_connections,
            ..Default::default()
        }),
    )
}

#[test]
fn server_sees_the_client_and_bytes_arrive_intact_both_ways_with_half_close() {
    let lab = split_lab("pint", "[both]\nrate='1Gbit'\ndelay='2ms'\n");
    for (server_ip, client_ip) in [
        ("198.18.3.2", "198.18.1.2"),
        ("2001:2:0:3::2", "2001:2:0:1::2"),
    ] {
        let listener = in_netns(&lab.ns(Host::Server), || {
            TcpListener::bind("[::]:9000").unwrap()
        })
        .join()
        .unwrap();
        let addr = format!(
            "{}:9000",
            if server_ip.contains(':') {
                format!("[{server_ip}]")
            } else {
                server_ip.into()
            }
        );
        assert_exchange_intact(
            &lab,
            listener,
            addr,
            pattern(64 << 20, 3),
            pattern(8 << 20, 7),
            client_ip,
        );
    }
    // Both connections went through the proxies.
    let log = std::fs::read_to_string(
        satpep_lab::topology::state_dir(&lab.name).join("proxy-gateway.log"),
    )
    .unwrap();
    assert!(log.matches(" split").count() >= 2, "{log}");
}

#[test]
fn a_reset_is_relayed_and_a_refused_server_resets_the_client() {
    let lab = split_lab("prst", "[both]\nrate='100Mbit'\ndelay='5ms'\n");
    let listener = in_netns(&lab.ns(Host::Server), || {
        TcpListener::bind("0.0.0.0:9001").unwrap()
    })
    .join()
    .unwrap();
    let server = std::thread::spawn(move || {
        let (s, _) = listener.accept().unwrap();
        let mut b = [0u8; 4];
        (&s).read_exact(&mut b).unwrap();
        // Abort: linger 0 makes close send RST.
        socket2::SockRef::from(&s)
            .set_linger(Some(Duration::ZERO))
            .unwrap();
        drop(s);
    });
    let client = in_netns(&lab.ns(Host::Client), || {
        let mut s = TcpStream::connect("198.18.3.2:9001").unwrap();
        s.write_all(b"ping").unwrap();
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let mut b = [0u8; 16];
        let first = s.read(&mut b).map_err(|e| e.kind());
        // Port 9002 has no listener: refused at the server.
        let refused = TcpStream::connect("198.18.3.2:9002").and_then(|mut s| {
            s.set_read_timeout(Some(Duration::from_secs(5)))?;
            s.read(&mut b)
        });
        (first, refused.map_err(|e| e.kind()))
    });
    server.join().unwrap();
    let (first, refused) = client.join().unwrap();
    assert_eq!(
        first,
        Err(ErrorKind::ConnectionReset),
        "the server's RST must reach the client as RST"
    );
    assert!(
        matches!(
            refused,
            Err(ErrorKind::ConnectionReset | ErrorKind::ConnectionRefused)
        ),
        "a refused server must not look like an empty stream: {refused:?}"
    );
}

/// Whether satpep's table is installed in `host` (the lab's own `satpep_lab` is not it).
fn has_table(lab: &Lab, host: Host) -> bool {
    let out = lab
        .command(host, "nft")
        .args(["list", "tables"])
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .any(|l| l.trim() == "table inet satpep")
}

fn rules(lab: &Lab, host: Host) -> String {
    let out = lab.command(host, "ip").args(["rule"]).output().unwrap();
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn interception_is_removed_on_exit_and_after_a_crash() {
    let mut lab = split_lab("pcln", "[both]\nrate='10Mbit'\n");
    let pids = lab.state().proxy_pids.clone();
    assert_eq!(pids.len(), 2);
    assert!(has_table(&lab, Host::Gateway));
    assert!(rules(&lab, Host::Gateway).contains("0x5350"));
    // Crash: SIGKILL leaves everything installed ...
    // SAFETY: killing the proxy this test started.
    unsafe { libc::kill(pids[1] as i32, libc::SIGKILL) };
    std::thread::sleep(Duration::from_millis(200));
    assert!(has_table(&lab, Host::Gateway));
    // ... and --cleanup removes it.
    let out = lab
        .command(Host::Gateway, bin())
        .args(["proxy", "--cleanup"])
        .output()
        .unwrap();
    assert!(out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("removed nftables table inet satpep"));
    assert!(!has_table(&lab, Host::Gateway));
    assert!(!rules(&lab, Host::Gateway).contains("0x5350"));
    // A clean exit (SIGTERM) removes it too.
    lab.stop_proxies();
    assert!(!has_table(&lab, Host::Terminal));
    assert!(!rules(&lab, Host::Terminal).contains("0x5350"));
}

#[test]
fn bad_proxy_config_names_the_key() {
    let dir = std::env::temp_dir().join(format!("satpep-pcfg-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let f = dir.join("p.toml");
    for (text, key) in [
        ("[proxy]\nport = 0\n", "proxy.port"),
        (
            "[intercept]\nsources = ['1.2.3.4/40']\n",
            "intercept.sources",
        ),
        ("[satellite]\nrate = '1Mbit'\n", "satellite.rate"),
        ("[proxy]\nbogus = 1\n", "bogus"),
    ] {
        std::fs::write(&f, text).unwrap();
        let out = satpep()
            .args(["proxy", "--check", "--config"])
            .arg(&f)
            .output()
            .unwrap();
        assert!(!out.status.success(), "{text}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(key) && err.contains("p.toml"), "{text}: {err}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn check_catches_what_a_start_would_refuse_or_degrade() {
    require_root();
    let dir = std::env::temp_dir().join(format!("satpep-pchk-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let d = dir.to_str().unwrap();
    let keygen = satpep()
        .args(["keygen", "--dir", d, "terminal", "gateway"])
        .output()
        .unwrap();
    assert!(keygen.status.success());
    let check = |name: &str, text: &str, nofile: Option<u32>| {
        let f = dir.join(name);
        std::fs::write(&f, text).unwrap();
        let mut c = match nofile {
            Some(n) => {
                let mut c = std::process::Command::new("prlimit");
                c.arg(format!("--nofile={n}:{n}")).arg(bin());
                c
            }
            None => satpep(),
        };
        let out = c
            .args(["proxy", "--check", "--config"])
            .arg(&f)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr).into_owned();
        let ruleset = String::from_utf8_lossy(&out.stdout).into_owned();
        (out.status.success(), err, ruleset)
    };
    // A controller nobody has: named with its key and what there is instead.
    let (ok, err, _) = check(
        "cc.toml",
        "[satellite]\ncongestion = 'satpep_nosuch'\n",
        None,
    );
    assert!(
        !ok && err.contains("satellite.congestion: 'satpep_nosuch'"),
        "{err}"
    );
    assert!(err.contains("satpep_hybla"), "{err}");
    // satpep's own controllers load (and unload again): a valid config passes, and the
    // ruleset it prints is the one nftables accepted.
    let (ok, err, rules) = check(
        "good.toml",
        "[satellite]\ncongestion = 'satpep_vegas'\n",
        None,
    );
    assert!(ok && err.contains("check passed"), "{err}");
    assert!(rules.contains("table inet satpep"), "{rules}");
    assert!(
        !std::fs::read_to_string("/proc/sys/net/ipv4/tcp_available_congestion_control")
            .unwrap()
            .contains("satpep_vegas")
            || std::path::Path::new("/sys/fs/bpf/satpep/satpep_vegas").exists(),
        "the check left satpep_vegas registered"
    );
    // A key that is not the certificate's.
    let tunnel = |key: &str| {
        format!("[tunnel]\nrole = 'terminal'\npeer = '198.18.2.2:4433'\nca = '{d}/ca.pem'\ncert = '{d}/terminal.pem'\nkey = '{d}/{key}'\n")
    };
    let (ok, err, _) = check("right.toml", &tunnel("terminal.key"), None);
    assert!(ok, "{err}");
    let (ok, err, _) = check("wrong.toml", &tunnel("gateway.key"), None);
    assert!(!ok && err.contains("tunnel.cert/tunnel.key"), "{err}");
    // A descriptor limit that cannot hold the default 10 000 connections: both what bypasses
    // and that splice would copy are said (it used to copy silently).
    let (ok, err, _) = check("fds.toml", "", Some(8000));
    assert!(ok, "{err}");
    assert!(err.contains("fits 3360 connections"), "{err}");
    assert!(err.contains("pipes for 0 of 3360"), "{err}");
    // /metrics opened to a Prometheus elsewhere would hand out every client's address.
    let (ok, err, _) = check("open.toml", "[proxy]\nmetrics = '0.0.0.0:9917'\n", None);
    assert!(ok && err.contains("proxy.connections"), "{err}");
    let (ok, err, _) = check(
        "apart.toml",
        "[proxy]\nmetrics = '0.0.0.0:9917'\nconnections = '127.0.0.1:9918'\n",
        None,
    );
    assert!(ok && !err.contains("proxy.connections"), "{err}");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// What a start refuses, `--check` refuses, with the same words: interfaces that are not
/// there, strict handshakes without iptables; `--json` gives the same findings to scripts.
/// In a lab's namespace, so a start that wrongly went ahead would touch only the lab.
#[test]
fn check_refuses_what_a_start_refuses() {
    let lab = lab("prefuse", "[both]\nrate='10Mbit'\ndelay='5ms'\n");
    let dir = std::env::temp_dir().join(format!("satpep-prefuse-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    // A PATH with nft but not iptables, as on a host without the iptables package.
    let bin_dir = dir.join("bin");
    std::fs::create_dir_all(&bin_dir).unwrap();
    for tool in ["nft", "ip", "sysctl"] {
        let found = std::process::Command::new("sh")
            .args(["-c", &format!("command -v {tool}")])
            .output()
            .unwrap();
        let path = String::from_utf8_lossy(&found.stdout).trim().to_string();
        std::os::unix::fs::symlink(path, bin_dir.join(tool)).unwrap();
    }
    let no_iptables = format!("{}:/usr/bin:/bin", bin_dir.display());
    let run = |name: &str, text: &str, args: &[&str], path: Option<&str>| {
        let f = dir.join(name);
        std::fs::write(&f, text).unwrap();
        let mut c = lab.command(Host::Terminal, bin());
        c.args(["proxy", "--config"]).arg(&f).args(args);
        if let Some(p) = path {
            c.env("PATH", p);
        }
        let out = c.output().unwrap();
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    for (name, text, path, said) in [
        (
            "ghost.toml",
            "[intercept]\ninterfaces = ['ghost0']\n",
            None,
            "intercept.interfaces: 'ghost0' is not an interface of this host",
        ),
        (
            "leg.toml",
            "[satellite]\ninterface = 'ghost1'\n",
            None,
            "satellite.interface: 'ghost1' is not an interface of this host",
        ),
        (
            "strict.toml",
            "[proxy]\nhandshake = 'strict'\n",
            Some(no_iptables.as_str()),
            "holds SYNs with iptables's NFQUEUE target, and iptables is not installed",
        ),
    ] {
        let (ok, _, err) = run(name, text, &["--check"], path);
        assert!(!ok && err.contains(said), "--check of {name}: {err}");
        let (ok, out, _) = run(name, text, &["--check", "--json"], path);
        let v: serde_json::Value =
            serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}"));
        assert!(!ok && v["passed"] == false, "{out}");
        assert!(
            v["findings"]
                .as_array()
                .unwrap()
                .iter()
                .any(|f| f["severity"] == "error" && f["message"].as_str().unwrap().contains(said)),
            "{out}"
        );
        // A start refuses with the same words, before it installs anything.
        let (ok, _, err) = run(name, text, &[], path);
        assert!(!ok && err.contains(said), "a start of {name}: {err}");
        let tables = lab
            .command(Host::Terminal, "nft")
            .args(["list", "tables"])
            .output()
            .unwrap();
        assert!(
            !String::from_utf8_lossy(&tables.stdout).contains("table inet satpep\n"),
            "a refused start of {name} left its table"
        );
    }
    // An interface that is there passes, and --json says so.
    let (ok, out, _) = run(
        "real.toml",
        "[intercept]\ninterfaces = ['lo']\n",
        &["--check", "--json"],
        None,
    );
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert!(ok && v["passed"] == true && v["errors"] == 0, "{out}");
    assert!(
        v["ruleset"].as_str().unwrap().contains("table inet satpep"),
        "{out}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn check_warns_of_host_buffers_that_hold_a_long_path_back() {
    // The lab's PEP hosts have what satpep asks of a host; the kernel's own defaults (a
    // 128 KiB receive default, 6 MiB maximum) draw a warning naming the setting and the fix.
    let lab = lab("phost", "[both]\nrate='10Mbit'\ndelay='5ms'\n");
    let f = std::env::temp_dir().join(format!("satpep-phost-{}.toml", std::process::id()));
    std::fs::write(&f, "").unwrap();
    let check = || {
        let out = lab
            .command(Host::Terminal, bin())
            .args(["proxy", "--check", "--config"])
            .arg(&f)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr).into_owned();
        assert!(out.status.success(), "{err}");
        err
    };
    let err = check();
    assert!(
        !err.contains("tcp_rmem") && !err.contains("tcp_wmem"),
        "{err}"
    );
    lab.run_in(
        Host::Terminal,
        "sysctl",
        &["-qw", "net.ipv4.tcp_rmem=4096 131072 6291456"],
    )
    .unwrap();
    let err = check();
    std::fs::remove_file(&f).unwrap();
    assert!(
        err.contains(
            "net.ipv4.tcp_rmem = \"4096 131072 6291456\": its default and maximum are below"
        ),
        "{err}"
    );
    assert!(
        err.contains("sysctl -w net.ipv4.tcp_rmem=\"4096 4194304 134217728\""),
        "{err}"
    );
    assert!(!err.contains("tcp_wmem"), "{err}");
}

/// One byte out, the same byte back: proves a connection still works end to end.
fn echo(s: &mut TcpStream, b: u8) {
    s.write_all(&[b]).unwrap();
    let mut r = [0u8; 1];
    s.read_exact(&mut r).unwrap();
    assert_eq!(r[0], b);
}

/// Connections the gateway's proxy has split so far (one log line each).
fn gateway_splits(lab: &Lab) -> usize {
    lab.proxy_log(Host::Gateway).matches(" split ").count()
}

#[test]
fn past_the_limit_connections_bypass_and_keep_working() {
    let lab = split_lab_with("plim", "[both]\nrate='100Mbit'\ndelay='5ms'\n", Some(2));
    echo_server(&lab, 9003);
    let splits = || gateway_splits(&lab);
    let conns = in_netns(&lab.ns(Host::Client), move || {
        let connect = || {
            let s = TcpStream::connect("198.18.3.2:9003").unwrap();
            s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
            s
        };
        let mut a = connect();
        let mut b = connect();
        echo(&mut a, 1);
        echo(&mut b, 2);
        std::thread::sleep(Duration::from_millis(300));
        // At the limit: this one is forwarded end to end, not refused.
        let mut c = connect();
        echo(&mut c, 3);
        drop(a);
        drop(b);
        std::thread::sleep(Duration::from_millis(500));
        // Below the limit again: split as before; the bypassed one still works.
        let mut d = connect();
        echo(&mut d, 4);
        echo(&mut c, 5);
        (c, d)
    })
    .join()
    .unwrap();
    drop(conns);
    assert_eq!(
        splits(),
        3,
        "a, b and d split, c bypassed:\n{}",
        lab.proxy_log(Host::Gateway)
    );
    let log = lab.proxy_log(Host::Gateway);
    assert!(log.contains("connection limit reached"), "{log}");
    assert!(log.contains("below the limits again"), "{log}");
    let out = lab
        .command(Host::Gateway, "nft")
        .args(["list", "counter", "inet", "satpep", "bypassed"])
        .output()
        .unwrap();
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("packets 1 "),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
}

/// An echo server on `port` in the lab's server host, one thread per connection.
fn echo_server(lab: &Lab, port: u16) {
    let listener = in_netns(&lab.ns(Host::Server), move || {
        TcpListener::bind(("0.0.0.0", port)).unwrap()
    })
    .join()
    .unwrap();
    std::thread::spawn(move || {
        for s in listener.incoming() {
            let mut s = s.unwrap();
            std::thread::spawn(move || {
                let mut b = [0u8; 1];
                while s.read_exact(&mut b).is_ok() {
                    if s.write_all(&b).is_err() {
                        break;
                    }
                }
            });
        }
    });
}

#[test]
fn past_the_memory_limit_connections_bypass_and_keep_working() {
    // A client that never reads makes every buffer on the path fill up (about 12 MB of
    // kernel TCP memory here), past the 6 MiB limit.
    let lab = lab_with(
        "pmem",
        "[both]\nrate='100Mbit'\ndelay='5ms'\n",
        Some(Pep {
            cc: Some("cubic".into()),
            // 6 MiB above what the host's TCP sockets hold now (the kernel's count is
            // host-wide, and earlier tests may have left sockets draining).
            max_memory: Some(format!(
                "{}KiB",
                satpep_proxy::server::kernel_tcp_memory() / 1024 + 6 * 1024
            )),
            ..Default::default()
        }),
    );
    echo_server(&lab, 9003);
    let firehose = in_netns(&lab.ns(Host::Server), || {
        TcpListener::bind("0.0.0.0:9004").unwrap()
    })
    .join()
    .unwrap();
    std::thread::spawn(move || {
        if let Ok((mut s, _)) = firehose.accept() {
            let chunk = vec![7u8; 65536];
            while s.write_all(&chunk).is_ok() {}
        }
    });
    let gw_log = satpep_lab::topology::state_dir(&lab.name).join("proxy-gateway.log");
    let term_log = satpep_lab::topology::state_dir(&lab.name).join("proxy-terminal.log");
    let log = move || std::fs::read_to_string(&gw_log).unwrap();
    let splits = {
        let log = log.clone();
        move || log().matches(" split ").count()
    };
    let wait_for = |what: &str| {
        for _ in 0..100 {
            if log().contains(what) {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        panic!(
            "no '{what}' in the gateway's log:\n{}\nterminal:\n{}\n{}",
            log(),
            std::fs::read_to_string(&term_log).unwrap_or_default(),
            std::fs::read_to_string("/proc/net/sockstat").unwrap()
        );
    };
    let client = lab.ns(Host::Client);
    let slow = in_netns(&client, || TcpStream::connect("198.18.3.2:9004").unwrap())
        .join()
        .unwrap();
    wait_for("memory limit reached");
    let before = splits();
    // Over the limit: forwarded end to end, and it works.
    let bypassed = in_netns(&client, || {
        let mut c = TcpStream::connect("198.18.3.2:9003").unwrap();
        c.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        echo(&mut c, 1);
        c
    })
    .join()
    .unwrap();
    assert_eq!(splits(), before, "split past the memory limit:\n{}", log());
    // The slow reader goes; memory falls below the limit and new connections split again.
    drop(slow);
    wait_for("below the limits again");
    let bypassed = in_netns(&client, move || {
        let mut bypassed = bypassed;
        let mut d = TcpStream::connect("198.18.3.2:9003").unwrap();
        d.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        echo(&mut d, 2);
        echo(&mut bypassed, 3);
        bypassed
    })
    .join()
    .unwrap();
    drop(bypassed);
    assert_eq!(splits(), before + 1, "{}", log());
}

/// `satpep status --json` of the gateway's proxy.
fn gateway_status(lab: &Lab) -> serde_json::Value {
    let out = lab
        .command(Host::Gateway, bin())
        .args(["status", "--json"])
        .output()
        .unwrap();
    serde_json::from_slice(&out.stdout).unwrap()
}

/// A download through the lab: the server streams on `port` for `secs` seconds, the client
/// reads it all; the handle gives the bytes read.
fn download(lab: &Lab, port: u16, secs: u64) -> std::thread::JoinHandle<usize> {
    let listener = in_netns(&lab.ns(Host::Server), move || {
        TcpListener::bind(("0.0.0.0", port)).unwrap()
    })
    .join()
    .unwrap();
    std::thread::spawn(move || {
        let (mut s, _) = listener.accept().unwrap();
        let chunk = vec![0u8; 64 * 1024];
        let t = std::time::Instant::now();
        while t.elapsed() < Duration::from_secs(secs) {
            if s.write_all(&chunk).is_err() {
                break;
            }
        }
    });
    in_netns(&lab.ns(Host::Client), move || {
        let mut s = TcpStream::connect(("198.18.3.2", port)).unwrap();
        let mut sink = Vec::new();
        s.read_to_end(&mut sink).unwrap();
        sink.len()
    })
}

#[test]
fn status_and_metrics_show_live_connections_with_both_legs() {
    let lab = split_lab("psta", "[both]\nrate='20Mbit'\ndelay='100ms'\n");
    let reader = download(&lab, 9004, 4);
    std::thread::sleep(Duration::from_millis(2500));
    let out = lab
        .command(Host::Gateway, bin())
        .args(["status", "--json"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let st: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let conns = st["connections"].as_array().unwrap();
    assert_eq!(conns.len(), 1, "{st}");
    let c = &conns[0];
    assert_eq!(
        c["src"].as_str().unwrap().split(':').next(),
        Some("198.18.1.2")
    );
    assert_eq!(c["dst"], "198.18.3.2:9004");
    assert!(c["bytes_down"].as_u64().unwrap() > 1_000_000, "{c}");
    // The gateway's satellite leg crosses 200 ms of path RTT (plus up to 200 ms of queue
    // once cubic fills the 100 % BDP buffer); its terrestrial leg none.
    let sat_min = c["satellite"]["min_rtt_ms"].as_f64().unwrap();
    let sat = c["satellite"]["rtt_ms"].as_f64().unwrap();
    let ter = c["terrestrial"]["rtt_ms"].as_f64().unwrap();
    assert!(
        (199.0..210.0).contains(&sat_min),
        "satellite min RTT {sat_min}"
    );
    assert!((199.0..420.0).contains(&sat), "satellite RTT {sat}");
    assert!(ter < 20.0, "terrestrial RTT {ter}");
    assert_eq!(c["satellite"]["congestion"], "cubic");
    assert!(c["satellite"]["cwnd"].as_u64().unwrap() > 10, "{c}");
    // --watch: one JSON line per sample, the connection's rate over the interval.
    let out = lab
        .command(Host::Gateway, bin())
        .args(["status", "--json", "--watch", "0.5", "--count", "2"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let samples: Vec<serde_json::Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(samples.len(), 2, "{text}");
    let second = &samples[1]["connections"][0];
    let down = second["down_bps"].as_f64().unwrap();
    // The server sends as fast as the 20 Mbit/s link takes it.
    assert!((1e6..60e6).contains(&down), "down {down} bit/s: {text}");
    assert!(samples[1]["down_bps"].as_f64().unwrap() >= down, "{text}");
    let got = reader.join().unwrap();
    assert!(got > 2_000_000);
    // Metrics count it, with the bytes of the closed connection folded in.
    let m = metrics(&lab, Host::Gateway);
    assert!(m.contains("satpep_connections_total 1"), "{m}");
    let down: u64 = m
        .lines()
        .find(|l| l.starts_with("satpep_relayed_bytes_total{direction=\"down\"}"))
        .and_then(|l| l.rsplit(' ').next()?.parse().ok())
        .unwrap_or(0);
    assert_eq!(down, got as u64, "{m}");
    // Spliced (the default; on a machine whose descriptor limit cannot be raised the lab
    // keeps max_connections low enough to leave kernel pipes), and the memory figures are
    // there.
    for host in [Host::Terminal, Host::Gateway] {
        assert_eq!(
            metric(&lab, host, "satpep_connections_copied_total"),
            0.0,
            "{host:?} copied instead of splicing"
        );
    }
    // Prometheus's conventions: OpenMetrics served as such, counters end in _total, no
    // -0.0 (a mean over no connections printed it), the version.
    assert!(
        m.contains("Content-Type: application/openmetrics-text; version=1.0.0"),
        "{m}"
    );
    assert!(
        m.contains("# TYPE satpep_leg_retransmitted_segments counter"),
        "{m}"
    );
    assert!(!m.contains("-0.0"), "{m}");
    assert!(m.contains("satpep_build_info{version=\""), "{m}");
    let gauge = |name: &str| -> u64 {
        m.lines()
            .find(|l| l.starts_with(&format!("{name} ")))
            .and_then(|l| l.rsplit(' ').next()?.parse().ok())
            .unwrap_or_else(|| panic!("no {name} in\n{m}"))
    };
    // Nothing is buffered once the connection has closed, so any value will do.
    gauge("satpep_memory_bytes");
    assert!(gauge("satpep_memory_limit_bytes") > 1 << 20, "{m}");
}

/// With the default controller, `satpep status` shows what the satellite model holds for
/// each connection in the kernel: read through the controller's pinned iterator by a proxy
/// that has dropped the right to call bpf().
#[test]
fn status_shows_the_satellite_model_the_kernel_holds() {
    let lab = lab_with(
        "pmod",
        "[both]\nrate='20Mbit'\ndelay='100ms'\n",
        Some(Pep::default()),
    );
    let reader = download(&lab, 9005, 5);
    std::thread::sleep(Duration::from_millis(3500));
    let st = gateway_status(&lab);
    let c = &st["connections"][0];
    assert_eq!(c["satellite"]["congestion"], "satpep_sat", "{st}");
    if !common::models_readable() {
        eprintln!("SKIPPED: this kernel refused satpep_sat's state iterator; no model to show");
        return;
    }
    let m = &c["satellite"]["model"];
    let phases = ["startup", "drain", "cruise", "probe", "compete"];
    assert!(phases.contains(&m["phase"].as_str().unwrap_or("")), "{m}");
    // 20 Mbit/s of frames carry about 19 of payload; a start may still read it low.
    let rate = m["rate_bps"].as_f64().unwrap();
    assert!((5e6..25e6).contains(&rate), "model rate {rate}: {m}");
    let base = m["base_rtt_ms"].as_f64().unwrap();
    assert!((199.0..215.0).contains(&base), "base RTT {base}: {m}");
    // The leg's send buffer is shown (what satpep_sat sizes on lossy paths): at least what
    // it holds unacknowledged.
    let leg = &c["satellite"];
    assert!(
        leg["sndbuf"].as_u64().unwrap() >= leg["send_queue"].as_u64().unwrap(),
        "{leg}"
    );
    // The table has it too.
    let out = lab
        .command(Host::Gateway, bin())
        .arg("status")
        .output()
        .unwrap();
    let table = String::from_utf8_lossy(&out.stdout);
    assert!(
        table.contains("| model") && table.contains(" base 2"),
        "{table}"
    );
    assert!(reader.join().unwrap() > 1_000_000);
}

/// The `throughput` preset's link: 1 Gbit/s, 5 ms RTT, an 8 ms buffer, shallower than the
/// model's budget, so only losses show it full. The kernel marks the last drops of a window
/// that overflowed it on the ACKs of what the drain after it sent; counted as the channel's
/// noise (7 % in bursts of 20), they hid the buffer and split retransmitted 17-30 % of what
/// it sent. Read through `/connections`: the model's noise, the buffer, and the leg's
/// retransmissions once the model had a few seconds.
#[test]
fn a_fast_link_with_a_buffer_below_the_budget_is_found_and_not_overflowed() {
    let lab = lab_with(
        "pfst",
        "[both]\nrate='1Gbit'\ndelay='2.5ms'\nqueue='1MB'\n",
        Some(Pep::default()),
    );
    let reader = download(&lab, 9006, 8);
    let status = || gateway_status(&lab)["connections"][0]["satellite"].clone();
    std::thread::sleep(Duration::from_secs(4));
    let a = status();
    std::thread::sleep(Duration::from_secs(3));
    let b = status();
    let m = &b["model"];
    // The model's readings need its state iterator; the retransmissions below do not.
    let readable = common::models_readable();
    assert!(
        !readable || m["channel_loss"].as_f64().unwrap_or(0.0) < 0.005,
        "a buffer's overflows read as the channel's noise: {b}"
    );
    // The round's highest queue is the buffer plus the emulator's own scheduling delay at
    // 1 Gbit/s on a loaded 2-core machine (10.06 ms seen in CI); what matters is that it is
    // found and read below the 15 ms slack the window would otherwise keep.
    let buffer = m["shallow_buffer_ms"].as_f64();
    assert!(
        !readable || buffer.is_some_and(|ms| (2.0..=12.0).contains(&ms)),
        "the 8 ms buffer was not found: {b}"
    );
    // From 4 to 7 s: retransmissions against segments acknowledged.
    let n = |v: &serde_json::Value, k: &str| v[k].as_f64().unwrap();
    let retrans = n(&b, "total_retrans") - n(&a, "total_retrans");
    let acked = (n(&b, "bytes_acked") - n(&a, "bytes_acked")) / n(&b, "mss");
    println!("from 4 to 7 s: {retrans} segments retransmitted beside {acked:.0} acknowledged");
    assert!(
        retrans < 0.01 * acked,
        "{retrans} segments retransmitted beside {acked:.0} acknowledged from 4 to 7 s: {b}"
    );
    assert!(reader.join().unwrap() > 100_000_000);
}

#[test]
fn stopping_the_proxy_resets_live_connections_instead_of_ending_them_cleanly() {
    let mut lab = split_lab("pstop", "[both]\nrate='20Mbit'\ndelay='20ms'\n");
    let listener = in_netns(&lab.ns(Host::Server), || {
        TcpListener::bind("0.0.0.0:9005").unwrap()
    })
    .join()
    .unwrap();
    std::thread::spawn(move || {
        let (mut s, _) = listener.accept().unwrap();
        let chunk = vec![0u8; 64 * 1024];
        while s.write_all(&chunk).is_ok() {}
    });
    let reader = in_netns(&lab.ns(Host::Client), || {
        let mut s = TcpStream::connect("198.18.3.2:9005").unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        read_to_the_end(&mut s)
    });
    std::thread::sleep(Duration::from_millis(1500));
    lab.stop_proxies();
    let (n, end) = reader.join().unwrap();
    assert!(n > 100_000, "{n} bytes before the stop");
    assert_eq!(
        end,
        Some(ErrorKind::ConnectionReset),
        "a cut transfer must not end with a clean EOF"
    );
}

/// Reads `s` until it ends: the bytes read, and how it ended (`None`: a clean EOF).
fn read_to_the_end(s: &mut TcpStream) -> (usize, Option<ErrorKind>) {
    let mut buf = vec![0u8; 1 << 16];
    let mut n = 0usize;
    loop {
        match s.read(&mut buf) {
            Ok(0) => return (n, None),
            Ok(k) => n += k,
            Err(e) => return (n, Some(e.kind())),
        }
    }
}

/// A counter from `nstat` in `host`'s namespace.
fn nstat(lab: &Lab, host: Host, name: &str) -> u64 {
    let out = lab
        .command(host, "nstat")
        .args(["-az", name])
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .find(|l| l.starts_with(name))
        .and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
        .unwrap_or(0)
}

/// The routes out of the routers' link-facing interface, both families.
fn link_routes(lab: &Lab, host: Host) -> String {
    let mut s = String::new();
    for fam in ["-4", "-6"] {
        let out = lab
            .command(host, "ip")
            .args([fam, "route", "show", "dev", "to-link"])
            .output()
            .unwrap();
        s += &String::from_utf8_lossy(&out.stdout);
    }
    s
}

#[test]
fn satellite_leg_gets_its_initial_windows_mss_and_fast_open() {
    let link = "[both]\nrate='100Mbit'\ndelay='20ms'\n";
    let mut lab = lab("ptune", link);
    for host in [Host::Terminal, Host::Gateway] {
        let ok = lab
            .command(host, "sysctl")
            .args(["-qw", "net.ipv4.tcp_fastopen=3"])
            .status()
            .unwrap();
        assert!(ok.success());
    }
    let spec: satpep_link::config::LinkSpec = toml::from_str(link).unwrap();
    let spec = satpep_link::config::LinkSpec::layered(&[&spec]).unwrap();
    lab.start_proxies(
        &spec,
        &Pep {
            cc: Some("cubic".into()),
            file: ProxyFile {
                satellite: LegFile {
                    interface: Some("to-link".into()),
                    initcwnd: Some(40),
                    initrwnd: Some(40),
                    mss: Some(1200),
                    fastopen: Some(true),
                    ..Default::default()
                },
                ..Default::default()
            },
            ..Default::default()
        },
    )
    .unwrap();
    for host in [Host::Terminal, Host::Gateway] {
        let r = link_routes(&lab, host);
        assert_eq!(
            r.matches("initcwnd 40").count(),
            r.lines().filter(|l| !l.starts_with("fe80")).count(),
            "every route out of the satellite interface of the {host:?}:\n{r}"
        );
        let out = lab
            .command(host, "nft")
            .args(["list", "table", "inet", "satpep"])
            .output()
            .unwrap();
        let t = String::from_utf8_lossy(&out.stdout);
        assert_eq!(t.matches("maxseg size set 1200").count(), 2, "{t}");
    }
    echo_server(&lab, 9006);
    // The first connection learns the gateway's Fast Open cookie; the next ones use it.
    let kept = in_netns(&lab.ns(Host::Client), || {
        let mut last = None;
        for i in 0..3 {
            let mut s = TcpStream::connect("198.18.3.2:9006").unwrap();
            s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
            echo(&mut s, i);
            last = Some(s);
        }
        last.unwrap()
    })
    .join()
    .unwrap();
    assert!(nstat(&lab, Host::Terminal, "TcpExtTCPFastOpenActive") >= 1);
    assert!(nstat(&lab, Host::Gateway, "TcpExtTCPFastOpenPassive") >= 1);
    for host in [Host::Terminal, Host::Gateway] {
        let out = lab
            .command(host, bin())
            .args(["status", "--json"])
            .output()
            .unwrap();
        let st: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        let c = &st["connections"][0];
        // One byte each way is not enough to grow or shrink either window.
        assert_eq!(c["satellite"]["cwnd"], 40, "{host:?}: {st}");
        // The terrestrial leg starts from the kernel's 10, not the satellite's 40 (bbr grows
        // by the segments acknowledged: CI read 12 after three).
        assert!(
            c["terrestrial"]["cwnd"].as_u64().unwrap() <= 15,
            "{host:?}: {st}"
        );
        let mss = c["satellite"]["mss"].as_u64().unwrap();
        assert!(mss <= 1200, "{host:?}: {st}");
        assert!(c["terrestrial"]["mss"].as_u64().unwrap() > 1200, "{st}");
    }
    drop(kept);
    lab.stop_proxies();
    for host in [Host::Terminal, Host::Gateway] {
        let r = link_routes(&lab, host);
        assert!(!r.contains("initcwnd"), "routes restored on exit:\n{r}");
    }
}

#[test]
fn strict_handshake_answers_the_client_as_the_server_did() {
    // 200 ms RTT across the link; both proxies hold the client's SYN until the server answers.
    let lab = lab_with(
        "pstr",
        "[both]\nrate='20Mbit'\ndelay='100ms'\n",
        Some(Pep {
            cc: Some("cubic".into()),
            handshake: Some("strict".into()),
            ..Default::default()
        }),
    );
    let listener = in_netns(&lab.ns(Host::Server), || {
        TcpListener::bind("[::]:9010").unwrap()
    })
    .join()
    .unwrap();
    let server = std::thread::spawn(move || {
        let (mut s, peer) = listener.accept().unwrap();
        s.write_all(b"hello").unwrap();
        peer
    });
    let results = in_netns(&lab.ns(Host::Client), || {
        let timed = |dst: &str| {
            let t = std::time::Instant::now();
            let r = TcpStream::connect_timeout(&dst.parse().unwrap(), Duration::from_secs(10));
            (r, t.elapsed())
        };
        let (open, t_open) = timed("198.18.3.2:9010");
        let mut open = open.expect("open port");
        let mut hello = [0u8; 5];
        open.read_exact(&mut hello).unwrap();
        assert_eq!(&hello, b"hello");
        let (refused, t_refused) = timed("198.18.3.2:9011");
        let (unreach4, t_unreach4) = timed("198.18.4.1:80");
        let (unreach6, t_unreach6) = timed("[2001:2:0:4::1]:80");
        let kinds: Vec<Option<i32>> = [refused, unreach4, unreach6]
            .into_iter()
            .map(|r| r.err().and_then(|e| e.raw_os_error()))
            .collect();
        (kinds, [t_open, t_refused, t_unreach4, t_unreach6])
    })
    .join()
    .unwrap();
    let (kinds, times) = results;
    assert_eq!(
        kinds,
        vec![
            Some(libc::ECONNREFUSED),
            Some(libc::EHOSTUNREACH),
            Some(libc::EHOSTUNREACH)
        ],
        "refused, then unreachable over IPv4 and IPv6"
    );
    // Every answer took the server's round trip: nothing was answered on its behalf.
    for t in times {
        assert!(
            (Duration::from_millis(195)..Duration::from_millis(1000)).contains(&t),
            "{times:?}"
        );
    }
    // Transparent as in fast mode.
    let peer = server.join().unwrap();
    assert_eq!(peer.ip().to_canonical().to_string(), "198.18.1.2");
    let log = std::fs::read_to_string(
        satpep_lab::topology::state_dir(&lab.name).join("proxy-terminal.log"),
    )
    .unwrap();
    assert!(log.contains("server refused"), "{log}");
    // The queueing is removed with the rest.
    let mut lab = lab;
    lab.stop_proxies();
    for host in [Host::Terminal, Host::Gateway] {
        let out = lab
            .command(host, "nft")
            .args(["list", "tables"])
            .output()
            .unwrap();
        let t = String::from_utf8_lossy(&out.stdout);
        assert!(
            !t.contains("mangle") && !t.contains("satpep\n"),
            "{host:?}: {t}"
        );
    }
}

/// Downloads from the server for `secs` while polling the gateway's status; returns the
/// satellite leg's controllers and adaptive classes seen, in order, without repeats.
fn adaptive_run(lab: &Lab, port: u16, secs: u64) -> (Vec<String>, Vec<String>) {
    let listener = in_netns(&lab.ns(Host::Server), move || {
        TcpListener::bind(("0.0.0.0", port)).unwrap()
    })
    .join()
    .unwrap();
    std::thread::spawn(move || {
        let (mut s, _) = listener.accept().unwrap();
        let chunk = vec![1u8; 1 << 16];
        let t = std::time::Instant::now();
        while t.elapsed() < Duration::from_secs(secs) && s.write_all(&chunk).is_ok() {}
        // A reset ends the test at once instead of draining every buffer on the path.
        let _ = socket2::SockRef::from(&s).set_linger(Some(Duration::ZERO));
    });
    let reader = in_netns(&lab.ns(Host::Client), move || {
        let mut s = TcpStream::connect(("198.18.3.2", port)).unwrap();
        let mut sink = vec![0u8; 1 << 16];
        while matches!(s.read(&mut sink), Ok(n) if n > 0) {}
    });
    let (mut ccs, mut classes) = (Vec::<String>::new(), Vec::<String>::new());
    let t = std::time::Instant::now();
    while t.elapsed() < Duration::from_secs(secs) {
        std::thread::sleep(Duration::from_millis(500));
        let out = lab
            .command(Host::Gateway, bin())
            .args(["status", "--json"])
            .output()
            .unwrap();
        let Ok(st) = serde_json::from_slice::<serde_json::Value>(&out.stdout) else {
            continue;
        };
        if let Some(c) = st["connections"].as_array().and_then(|a| a.first()) {
            let cc = c["satellite"]["congestion"]
                .as_str()
                .unwrap_or("")
                .to_string();
            if !cc.is_empty() && ccs.last() != Some(&cc) {
                ccs.push(cc);
            }
            let class = c["adaptive"]["class"].as_str().unwrap_or("").to_string();
            if !class.is_empty() && classes.last() != Some(&class) {
                classes.push(class);
            }
        }
    }
    reader.join().unwrap();
    (ccs, classes)
}

#[test]
fn adaptive_picks_hybla_on_a_clean_long_path_and_tarang_on_a_lossy_one() {
    let pep = || {
        Some(Pep {
            cc: Some("adaptive".into()),
            ..Default::default()
        })
    };
    // RTT 300 ms, 20 Mbit/s: a long fat connection.
    let clean = lab_with("pad", "[both]\nrate='20Mbit'\ndelay='150ms'\n", pep());
    let (ccs, classes) = adaptive_run(&clean, 9020, 8);
    assert_eq!(
        classes.first().map(String::as_str),
        Some("long_fat"),
        "{classes:?}"
    );
    assert_eq!(
        ccs.last().map(String::as_str),
        Some("satpep_hybla"),
        "{ccs:?}"
    );
    drop(clean);
    // The same with BER 1e-6: losses with no queue behind them are the link's.
    let lossy = lab_with(
        "padl",
        "[both]\nrate='20Mbit'\ndelay='150ms'\n[forward]\nber=1e-6\n",
        pep(),
    );
    let (ccs, classes) = adaptive_run(&lossy, 9021, 8);
    // Long and lossy. (Fat or thin: the rate is the flow's own best delivery rate, which
    // losses may keep under 10 Mbit/s at first; Tarang either way.)
    let first = classes.first().cloned().unwrap_or_default();
    assert!(
        first.starts_with("long_") && first.ends_with("_lossy"),
        "{classes:?}"
    );
    assert_eq!(
        ccs.last().map(String::as_str),
        Some("satpep_tarang"),
        "{ccs:?}"
    );
    let log = std::fs::read_to_string(
        satpep_lab::topology::state_dir(&lossy.name).join("proxy-gateway.log"),
    )
    .unwrap();
    assert!(
        log.contains("congestion control switched") && log.contains("to=satpep_tarang"),
        "{log}"
    );
}

#[test]
fn after_setup_every_proxy_thread_keeps_only_the_capabilities_it_needs() {
    let lab = split_lab("pcap", "[both]\nrate='20Mbit'\ndelay='10ms'\n");
    echo_server(&lab, 9006);
    // It still splits, and relays, with what it kept.
    let mut c = in_netns(&lab.ns(Host::Client), || {
        let mut c = TcpStream::connect("198.18.3.2:9006").unwrap();
        c.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        echo(&mut c, 9);
        c
    })
    .join()
    .unwrap();
    assert_eq!(
        satpep_proxy::privileges::kept_bits(),
        (1 << 12) | (1 << 13) | (1 << 24)
    );
    // Less what this machine withholds from root to begin with (a container may).
    let own = satpep_proxy::privileges::thread_caps(std::process::id())[0];
    let kept = satpep_proxy::privileges::kept_bits() & own.1;
    let pids = lab.state().proxy_pids.clone();
    assert_eq!(pids.len(), 2);
    for pid in pids {
        let threads = satpep_proxy::privileges::thread_caps(pid);
        // The runtime's workers, the blocking pool, the main thread.
        assert!(threads.len() >= 3, "{threads:?}");
        for (eff, prm, bnd) in &threads {
            assert_eq!(
                (*eff, *prm, *bnd),
                (kept, kept, kept),
                "pid {pid}: {threads:x?}"
            );
        }
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
        assert!(status.contains("NoNewPrivs:\t1"), "{status}");
    }
    echo(&mut c, 10);
    // The rules still go at exit: `nft` runs with the bounding set's CAP_NET_ADMIN.
    let mut lab = lab;
    lab.stop_proxies();
    for host in [Host::Terminal, Host::Gateway] {
        assert!(!has_table(&lab, host), "{host:?} kept its table");
    }
}

fn split_lab_proxy_keys(tag: &str, proxy: ProxySection) -> Lab {
    lab_with(
        tag,
        "[both]\nrate='20Mbit'\ndelay='10ms'\n",
        Some(Pep {
            cc: Some("cubic".into()),
            file: ProxyFile {
                proxy,
                ..Default::default()
            },
            ..Default::default()
        }),
    )
}

/// GET `path` from the gateway's proxy on `port`: the whole reply, head included.
fn http_get(lab: &Lab, port: u16, path: &str) -> String {
    let script = format!(
        "exec 3<>/dev/tcp/127.0.0.1/{port}; printf 'GET {path} HTTP/1.0\\r\\n\\r\\n' >&3; cat <&3"
    );
    let out = lab
        .command(Host::Gateway, "bash")
        .args(["-c", &script])
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn connections_can_be_served_apart_from_metrics() {
    // Prometheus may scrape /metrics from elsewhere; the client addresses stay on loopback.
    let lab = split_lab_proxy_keys(
        "pconn",
        ProxySection {
            connections: "127.0.0.1:9918".into(),
            ..Default::default()
        },
    );
    let m = http_get(&lab, 9917, "/metrics");
    assert!(m.starts_with("HTTP/1.0 200"), "{m}");
    assert!(m.contains("satpep_connections_total"), "{m}");
    let c = http_get(&lab, 9917, "/connections");
    assert!(c.starts_with("HTTP/1.0 404"), "{c}");
    assert!(c.contains("proxy.connections"), "{c}");
    let c = http_get(&lab, 9918, "/connections");
    assert!(c.starts_with("HTTP/1.0 200"), "{c}");
    assert!(c.contains("\"connections\""), "{c}");
    assert!(http_get(&lab, 9918, "/metrics").starts_with("HTTP/1.0 404"));
    // `satpep status` at the metrics address says where to look.
    let out = lab
        .command(Host::Gateway, bin())
        .arg("status")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("proxy.connections"),
        "{err}"
    );
    let out = lab
        .command(Host::Gateway, bin())
        .args(["status", "--addr", "127.0.0.1:9918"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("0 live"));
}

#[test]
fn connections_log_at_debug_and_a_summary_at_info() {
    // As an operator runs it (RUST_LOG unset: info): no line per connection, and the
    // summary counts them.
    let lab = lab_with(
        "plog",
        "[both]\nrate='20Mbit'\ndelay='10ms'\n",
        Some(Pep {
            cc: Some("cubic".into()),
            file: ProxyFile {
                proxy: ProxySection {
                    log_summary: "1s".into(),
                    ..Default::default()
                },
                ..Default::default()
            },
            log_filter: Some("info".into()),
            ..Default::default()
        }),
    );
    echo_server(&lab, 9330);
    in_netns(&lab.ns(Host::Client), || {
        for i in 0..3 {
            let mut s = TcpStream::connect("198.18.3.2:9330").unwrap();
            s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
            echo(&mut s, i);
        }
    })
    .join()
    .unwrap();
    std::thread::sleep(Duration::from_millis(2500));
    let log = lab.proxy_log(Host::Gateway);
    assert!(!log.contains(" split "), "{log}");
    assert!(!log.contains("satpep::connection"), "{log}");
    let accepted: u64 = log
        .lines()
        .filter(|l| l.contains(" summary "))
        .filter_map(|l| {
            l.split("accepted=")
                .nth(1)?
                .split(' ')
                .next()?
                .parse::<u64>()
                .ok()
        })
        .sum();
    assert_eq!(accepted, 3, "{log}");
    assert!(log.contains("up_bytes="), "{log}");
}

#[test]
fn idle_connections_are_reset_after_the_idle_timeout_and_busy_ones_are_not() {
    let lab = split_lab_proxy_keys(
        "pidle",
        ProxySection {
            idle_timeout: "2s".into(),
            ..Default::default()
        },
    );
    echo_server(&lab, 9007);
    let (idle_end, busy_ok) = in_netns(&lab.ns(Host::Client), || {
        let mut idle = TcpStream::connect("198.18.3.2:9007").unwrap();
        let mut busy = TcpStream::connect("198.18.3.2:9007").unwrap();
        for s in [&mut idle, &mut busy] {
            s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        }
        echo(&mut idle, 1);
        // 4 s: the busy one echoes every 300 ms, the idle one says nothing.
        for i in 0..13 {
            echo(&mut busy, i);
            std::thread::sleep(Duration::from_millis(300));
        }
        let mut b = [0u8; 1];
        let end = idle.read(&mut b).map_err(|e| e.kind());
        echo(&mut busy, 99);
        (end, true)
    })
    .join()
    .unwrap();
    assert_eq!(
        idle_end,
        Err(ErrorKind::ConnectionReset),
        "an idle connection must be reset, not closed"
    );
    assert!(busy_ok);
}

#[test]
fn a_client_that_vanishes_is_found_by_keepalive_and_the_server_reset() {
    // A half-open connection: the client's host goes silent (no FIN, no RST). Without
    // keepalive the server's side would be held for ever.
    let lab = split_lab_proxy_keys(
        "pka",
        ProxySection {
            keepalive: "2s".into(),
            ..Default::default()
        },
    );
    let listener = in_netns(&lab.ns(Host::Server), || {
        TcpListener::bind("0.0.0.0:9008").unwrap()
    })
    .join()
    .unwrap();
    let server = std::thread::spawn(move || {
        let (mut s, _) = listener.accept().unwrap();
        s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
        let mut b = [0u8; 1];
        s.read_exact(&mut b).unwrap();
        let t = std::time::Instant::now();
        let end = s.read(&mut b).map_err(|e| e.kind());
        (end, t.elapsed())
    });
    let _client = in_netns(&lab.ns(Host::Client), || {
        let mut c = TcpStream::connect("198.18.3.2:9008").unwrap();
        c.write_all(&[1]).unwrap();
        c
    })
    .join()
    .unwrap();
    std::thread::sleep(Duration::from_millis(300));
    // The client host drops everything from now on.
    let ns = lab.ns(Host::Client);
    for cmd in [
        "add table inet vanish",
        "add chain inet vanish in { type filter hook input priority -300; policy drop; }",
        "add chain inet vanish out { type filter hook output priority -300; policy drop; }",
    ] {
        let st = std::process::Command::new("ip")
            .args(["netns", "exec", &ns, "nft"])
            .args(cmd.split(' '))
            .status()
            .unwrap();
        assert!(st.success(), "{cmd}");
    }
    let (end, after) = server.join().unwrap();
    eprintln!("the vanished client's server was reset after {after:?}");
    assert_eq!(end, Err(ErrorKind::ConnectionReset), "after {after:?}");
    // 2 s idle, then 4 probes 1 s apart.
    assert!(after < Duration::from_secs(15), "{after:?}");
}

#[test]
fn a_client_that_never_reads_holds_a_bounded_amount_in_the_proxies() {
    // The server writes as fast as it can to a client that never reads. Back-pressure must
    // stop the server once the buffers on the path are full: the proxies read no further
    // ahead than their socket buffers and one relay buffer per direction.
    let lab = split_lab("pslow", "[both]\nrate='100Mbit'\ndelay='5ms'\n");
    let listener = in_netns(&lab.ns(Host::Server), || {
        TcpListener::bind("0.0.0.0:9009").unwrap()
    })
    .join()
    .unwrap();
    let written = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
    let w = written.clone();
    std::thread::spawn(move || {
        let (mut s, _) = listener.accept().unwrap();
        let chunk = vec![5u8; 65536];
        while s.write_all(&chunk).is_ok() {
            w.fetch_add(chunk.len() as u64, std::sync::atomic::Ordering::Relaxed);
        }
    });
    let _client = in_netns(&lab.ns(Host::Client), || {
        TcpStream::connect("198.18.3.2:9009").unwrap()
    })
    .join()
    .unwrap();
    let read = || written.load(std::sync::atomic::Ordering::Relaxed);
    std::thread::sleep(Duration::from_secs(4));
    let at4 = read();
    let rss4: u64 = lab.state().proxy_pids.iter().map(|p| rss_kib(*p)).sum();
    std::thread::sleep(Duration::from_secs(4));
    let (at8, rss8): (u64, u64) = (
        read(),
        lab.state().proxy_pids.iter().map(|p| rss_kib(*p)).sum(),
    );
    assert!(at4 > 1 << 20, "{at4} bytes: the transfer never started");
    assert!(
        at8 <= at4 + (1 << 20),
        "the server could keep writing ({at4} then {at8} bytes): nothing holds it back"
    );
    // Socket buffers here are at most a few MB per socket, four sockets on the way.
    assert!(at8 < 64 << 20, "{at8} bytes held on the path");
    assert!(
        rss8 < rss4 + 4096,
        "proxy memory grew from {rss4} to {rss8} KiB"
    );
    eprintln!(
        "held on the path: {:.1} MB; proxies' RSS {rss8} KiB",
        at8 as f64 / 1e6
    );
}

fn rss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find(|l| l.starts_with("VmRSS:"))
        .and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
        .unwrap_or(0)
}

/// Floods the intercepted port with spoofed SYNs for 6 s while real clients connect; returns
/// (SYNs sent, real connections that worked, the slowest connect, proxy RSS growth KiB, the
/// server's connections from spoofed addresses at the end of the flood).
fn syn_flood(handshake: &str, tag: &str) -> (u64, usize, Duration, i64, usize) {
    let lab = lab_with(
        tag,
        "[both]\nrate='20Mbit'\ndelay='10ms'\n",
        Some(Pep {
            cc: Some("cubic".into()),
            handshake: Some(handshake.into()),
            ..Default::default()
        }),
    );
    echo_server(&lab, 9010);
    let pids = lab.state().proxy_pids.clone();
    let rss = || pids.iter().map(|p| rss_kib(*p)).sum::<u64>() as i64;
    let rss0 = rss();
    let flood = in_netns(&lab.ns(Host::Client), || {
        satpep_lab::synflood::flood(
            "198.18.1.100".parse().unwrap(),
            100,
            "198.18.3.2".parse().unwrap(),
            9010,
            6.0,
            0,
        )
    });
    std::thread::sleep(Duration::from_secs(1));
    let real = in_netns(&lab.ns(Host::Client), || {
        let mut worked = 0;
        let mut slowest = Duration::ZERO;
        for i in 0..10u8 {
            let t = std::time::Instant::now();
            match TcpStream::connect_timeout(
                &"198.18.3.2:9010".parse().unwrap(),
                Duration::from_secs(5),
            ) {
                Ok(mut c) => {
                    c.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
                    let mut b = [0u8; 1];
                    match c.write_all(&[i]).and_then(|_| c.read_exact(&mut b)) {
                        Ok(()) if b[0] == i => worked += 1,
                        r => eprintln!("connection {i}: {r:?}"),
                    }
                }
                Err(e) => eprintln!("connection {i}: connect: {e}"),
            }
            slowest = slowest.max(t.elapsed());
            std::thread::sleep(Duration::from_millis(300));
        }
        (worked, slowest)
    })
    .join()
    .unwrap();
    let spoofed = String::from_utf8_lossy(
        &lab.command(Host::Server, "ss")
            .args(["-tnH", "state", "all", "sport", "= :9010"])
            .output()
            .unwrap()
            .stdout,
    )
    .lines()
    .filter(|l| {
        // Peers 198.18.1.101 … .200: the spoofed sources.
        l.split_whitespace().nth(4).is_some_and(|peer| {
            peer.strip_prefix("198.18.1.")
                .and_then(|r| r.split(':').next()?.parse::<u8>().ok())
                .is_some_and(|h| (101..=200).contains(&h))
        })
    })
    .count();
    let sent = flood.join().unwrap().unwrap();
    let grew = rss() - rss0;
    // After the flood, the proxy is as it was: a new connection works.
    let after = in_netns(&lab.ns(Host::Client), || {
        let mut c = TcpStream::connect("198.18.3.2:9010").unwrap();
        c.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        echo(&mut c, 42);
    })
    .join();
    assert!(after.is_ok(), "no new connection after the flood");
    eprintln!(
        "{handshake}: {sent} spoofed SYNs in 6 s; {}/10 real connections worked, slowest {:?}; proxies' RSS grew {grew} KiB; server saw {spoofed} connections from spoofed addresses",
        real.0, real.1
    );
    (sent, real.0, real.1, grew, spoofed)
}

#[test]
fn a_syn_flood_leaves_memory_bounded_and_real_clients_served() {
    for (handshake, tag) in [("fast", "pflf"), ("strict", "pfls")] {
        let (sent, worked, slowest, grew, spoofed) = syn_flood(handshake, tag);
        assert!(sent > 50_000, "{handshake}: only {sent} SYNs sent");
        assert_eq!(
            worked, 10,
            "{handshake}: real clients failed during the flood"
        );
        assert!(slowest < Duration::from_secs(4), "{handshake}: {slowest:?}");
        assert!(grew < 64 * 1024, "{handshake}: proxies grew {grew} KiB");
        // Fast: nothing reaches the server. Strict: at most the held SYNs' connections.
        let cap = if handshake == "fast" {
            0
        } else {
            satpep_proxy::hold::MAX_HELD
        };
        assert!(
            spoofed <= cap,
            "{handshake}: {spoofed} spoofed connections at the server"
        );
    }
}

#[test]
fn adaptive_picks_bbr_on_a_short_lossy_path() {
    // A LEO-like path: 50 Mbit/s, RTT 30 ms, BER 1e-6 (about one frame in 80 lost).
    let lab = lab_with(
        "pads",
        "[both]\nrate='50Mbit'\ndelay='15ms'\nber=1e-6\n",
        Some(Pep {
            cc: Some("adaptive".into()),
            ..Default::default()
        }),
    );
    let (ccs, classes) = adaptive_run(&lab, 9022, 8);
    let first = classes.first().cloned().unwrap_or_default();
    assert!(
        !first.starts_with("long_"),
        "a 30 ms path is not long: {classes:?}"
    );
    // Westwood+ was the thesis's pick here; it fell far behind end-to-end BBR.
    assert_eq!(ccs.last().map(String::as_str), Some("bbr"), "{ccs:?}");
}

#[test]
fn connections_to_the_pep_box_itself_are_never_intercepted() {
    let lab = split_lab("pself", "[both]\nrate='100Mbit'\ndelay='5ms'\n");
    // The terminal's address on the intercepted interface, and its address on another one
    // (the satellite side), in both families: a listener on the box (sshd, a local web UI).
    for (addr, port) in [
        ("198.18.1.1", 9310),
        ("2001:2:0:1::1", 9311),
        ("198.18.2.1", 9312),
    ] {
        let bind = if addr.contains(':') {
            format!("[{addr}]:{port}")
        } else {
            format!("{addr}:{port}")
        };
        let b = bind.clone();
        let listener = in_netns(&lab.ns(Host::Terminal), move || {
            TcpListener::bind(&b).unwrap()
        })
        .join()
        .unwrap();
        let server = std::thread::spawn(move || {
            let (mut s, peer) = listener.accept().unwrap();
            let mut b = [0u8; 5];
            s.read_exact(&mut b).unwrap();
            s.write_all(&b).unwrap();
            peer.ip().to_canonical().to_string()
        });
        let client = in_netns(&lab.ns(Host::Client), move || {
            let mut s = TcpStream::connect_timeout(&bind.parse().unwrap(), Duration::from_secs(5))
                .unwrap_or_else(|e| panic!("connect to {bind}: {e}"));
            s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
            s.write_all(b"hello").unwrap();
            let mut b = [0u8; 5];
            s.read_exact(&mut b)
                .unwrap_or_else(|e| panic!("echo from {bind}: {e}"));
            b
        });
        assert_eq!(&client.join().unwrap(), b"hello");
        let peer = server.join().unwrap();
        assert!(
            peer.starts_with("198.18.1.2") || peer == "2001:2:0:1::2",
            "{peer}"
        );
    }
    // None of them went through the proxy.
    let log = std::fs::read_to_string(
        satpep_lab::topology::state_dir(&lab.name).join("proxy-terminal.log"),
    )
    .unwrap();
    assert!(!log.contains(":931"), "{log}");
}

/// The proxy's nftables table in `host`.
fn nft_table(lab: &Lab, host: Host) -> String {
    let out = lab
        .command(host, "nft")
        .args(["list", "table", "inet", "satpep"])
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// A value of `/metrics` in `host`.
fn metric(lab: &Lab, host: Host, name: &str) -> f64 {
    let m = metrics(lab, host);
    m.lines()
        .find(|l| l.starts_with(&format!("{name} ")))
        .and_then(|l| l.rsplit(' ').next()?.parse().ok())
        .unwrap_or_else(|| panic!("no {name} in\n{m}"))
}

/// A connection from the lab's client to the server's `port`, with a 5 s read timeout.
fn connect_from_client(lab: &Lab, port: u16) -> TcpStream {
    in_netns(&lab.ns(Host::Client), move || {
        let s = TcpStream::connect(("198.18.3.2", port)).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        s
    })
    .join()
    .unwrap()
}

#[test]
fn flushed_rules_come_back_and_sighup_reloads_without_dropping_flows() {
    let lab = split_lab("preload", "[both]\nrate='100Mbit'\ndelay='5ms'\n");
    echo_server(&lab, 9320);
    echo_server(&lab, 9321);
    let connect = |port: u16| connect_from_client(&lab, port);
    let log = || {
        std::fs::read_to_string(
            satpep_lab::topology::state_dir(&lab.name).join("proxy-terminal.log"),
        )
        .unwrap()
    };
    // An nftables reload (Debian's nftables.service starts from `flush ruleset`).
    assert_eq!(
        metric(&lab, Host::Terminal, "satpep_interception_installed"),
        1.0
    );
    let out = lab
        .command(Host::Terminal, "nft")
        .args(["flush", "ruleset"])
        .output()
        .unwrap();
    assert!(out.status.success());
    assert!(!has_table(&lab, Host::Terminal));
    let back = (0..40).any(|_| {
        std::thread::sleep(Duration::from_millis(250));
        has_table(&lab, Host::Terminal)
    });
    assert!(back, "the table was not installed again\n{}", log());
    assert_eq!(
        metric(&lab, Host::Terminal, "satpep_interception_reinstalls_total"),
        1.0
    );
    // New connections are split again.
    let mut s = connect(9320);
    echo(&mut s, 1);
    assert!(log().contains("198.18.3.2:9320"), "{}", log());
    // SIGHUP with a new selection: port 9321 excluded. The live connection goes on.
    let file = satpep_lab::topology::state_dir(&lab.name).join("proxy-terminal.toml");
    let text = std::fs::read_to_string(&file).unwrap();
    let pid = proxy_pid(&lab, "terminal");
    std::fs::write(
        &file,
        text.replace("[intercept]\n", "[intercept]\nports_reloaded = 1\n"),
    )
    .unwrap();
    // An invalid file is refused, and the proxy runs on as it was.
    unsafe { libc::kill(pid, libc::SIGHUP) };
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(
        metric(&lab, Host::Terminal, "satpep_config_reload_failures_total"),
        1.0
    );
    echo(&mut s, 2);
    let excluded = if text.contains("exclude_ports = [") {
        text.replace("exclude_ports = [", "exclude_ports = [9321, ")
    } else {
        text.replace("[intercept]\n", "[intercept]\nexclude_ports = [9321]\n")
    };
    std::fs::write(&file, &excluded).unwrap();
    unsafe { libc::kill(pid, libc::SIGHUP) };
    let applied = (0..20).any(|_| {
        std::thread::sleep(Duration::from_millis(100));
        nft_table(&lab, Host::Terminal).contains("9321")
    });
    assert!(applied, "{}", nft_table(&lab, Host::Terminal));
    assert_eq!(
        metric(&lab, Host::Terminal, "satpep_config_reloads_total"),
        1.0
    );
    echo(&mut s, 3);
    // The excluded port is forwarded, not split; the proxy still runs.
    let mut t = connect(9321);
    echo(&mut t, 4);
    assert!(!log().contains("198.18.3.2:9321"), "{}", log());
    assert!(log().contains("configuration reloaded"), "{}", log());
    echo(&mut s, 5);
}

#[test]
fn a_reload_changes_the_limits_of_the_running_proxy() {
    let lab = split_lab_with("plimr", "[both]\nrate='100Mbit'\ndelay='5ms'\n", Some(2));
    echo_server(&lab, 9340);
    let splits = || gateway_splits(&lab);
    let connect = || {
        in_netns(&lab.ns(Host::Client), || {
            let s = TcpStream::connect("198.18.3.2:9340").unwrap();
            s.set_read_timeout(Some(Duration::from_secs(8))).unwrap();
            s
        })
        .join()
        .unwrap()
    };
    let (mut a, mut b) = (connect(), connect());
    echo(&mut a, 1);
    echo(&mut b, 2);
    std::thread::sleep(Duration::from_millis(300));
    // At the limit of 2: the third bypasses.
    let mut c = connect();
    echo(&mut c, 3);
    assert_eq!(splits(), 2);
    // Both proxies reload with room for a third connection and a 2 s idle timeout.
    for host in ["terminal", "gateway"] {
        let file = satpep_lab::topology::state_dir(&lab.name).join(format!("proxy-{host}.toml"));
        let text = std::fs::read_to_string(&file).unwrap();
        // The lab writes every [proxy] key.
        assert!(text.contains("max_connections = 2\n"), "{text}");
        assert!(text.contains("idle_timeout = \"0s\"\n"), "{text}");
        std::fs::write(
            &file,
            text.replace("max_connections = 2\n", "max_connections = 3\n")
                .replace("idle_timeout = \"0s\"\n", "idle_timeout = \"2s\"\n"),
        )
        .unwrap();
        unsafe { libc::kill(proxy_pid(&lab, host), libc::SIGHUP) };
    }
    let applied = (0..30).any(|_| {
        std::thread::sleep(Duration::from_millis(100));
        [Host::Terminal, Host::Gateway]
            .iter()
            .all(|h| metric(&lab, *h, "satpep_connections_limit") == 3.0)
    });
    assert!(applied, "{}", metrics(&lab, Host::Gateway));
    // Below 90 % of the new limit: the bypass is lifted (within a memory sample) and a new
    // connection is split.
    std::thread::sleep(Duration::from_millis(600));
    let mut d = connect();
    echo(&mut d, 4);
    assert_eq!(splits(), 3);
    // The idle timeout applies to connections made before the reload: a, idle since its
    // echo, is reset; c, bypassed, is not the proxy's and stays.
    echo(&mut c, 5);
    std::thread::sleep(Duration::from_millis(3000));
    let mut buf = [0u8; 1];
    let ended = a.write_all(&[6]).is_err() || !matches!(a.read(&mut buf), Ok(1));
    assert!(
        ended,
        "an idle split connection outlived the reloaded idle timeout"
    );
    echo(&mut c, 7);
    let log = lab.proxy_log(Host::Gateway);
    assert!(log.contains("proxy.max_connections 2 -> 3"), "{log}");
    assert!(!log.contains("take effect at the next start"), "{log}");
}

/// The satellite leg's controller of each live connection of the proxy in `host`, by the
/// server port, from `satpep status --json`.
fn satellite_cc(lab: &Lab, host: Host) -> Vec<(u16, String)> {
    let out = lab
        .command(host, bin())
        .args(["status", "--json"])
        .output()
        .unwrap();
    let v: serde_json::Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&out.stdout)));
    let mut r: Vec<(u16, String)> = v["connections"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| {
            let port = c["dst"].as_str().unwrap().rsplit(':').next().unwrap();
            (
                port.parse().unwrap(),
                c["satellite"]["congestion"].as_str().unwrap_or("").into(),
            )
        })
        .collect();
    r.sort();
    r
}

#[test]
fn a_reload_gives_new_connections_the_new_controller_and_live_ones_keep_theirs() {
    let lab = split_lab("pccr", "[both]\nrate='100Mbit'\ndelay='5ms'\n");
    echo_server(&lab, 9360);
    echo_server(&lab, 9361);
    let connect = |port: u16| connect_from_client(&lab, port);
    let mut a = connect(9360);
    echo(&mut a, 1);
    // The terminal's satellite leg connects upstream, the gateway's is the accepted one:
    // both paths of a reload (the connecting socket, the accepted socket and its listener).
    for host in [Host::Terminal, Host::Gateway] {
        assert_eq!(satellite_cc(&lab, host), vec![(9360, "cubic".into())]);
    }
    // A controller that is not registered is refused, naming the key; nothing changes.
    let reload = |from: &str, to: &str| {
        for host in ["terminal", "gateway"] {
            let file =
                satpep_lab::topology::state_dir(&lab.name).join(format!("proxy-{host}.toml"));
            let text = std::fs::read_to_string(&file).unwrap();
            assert!(text.contains(from), "{text}");
            std::fs::write(&file, text.replace(from, to)).unwrap();
            unsafe { libc::kill(proxy_pid(&lab, host), libc::SIGHUP) };
        }
        std::thread::sleep(Duration::from_millis(500));
    };
    reload("congestion = \"cubic\"", "congestion = \"no_such_cc\"");
    assert_eq!(
        metric(&lab, Host::Gateway, "satpep_config_reload_failures_total"),
        1.0
    );
    let log = lab.proxy_log(Host::Gateway);
    assert!(
        log.contains("satellite.congestion: 'no_such_cc' is not registered"),
        "{log}"
    );
    // A registered one applies to connections made after the reload.
    reload("congestion = \"no_such_cc\"", "congestion = \"bbr\"");
    let mut b = connect(9361);
    echo(&mut b, 2);
    for host in [Host::Terminal, Host::Gateway] {
        assert_eq!(
            satellite_cc(&lab, host),
            vec![(9360, "cubic".into()), (9361, "bbr".into())],
            "{host:?}"
        );
    }
    echo(&mut a, 3);
    let log = lab.proxy_log(Host::Gateway);
    assert!(log.contains("satellite: congestion=cubic"), "{log}");
    assert!(!log.contains("take effect at the next start"), "{log}");
}

/// Whether process `pid` still runs (an exited child not yet reaped does not).
fn alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| {
        s.rsplit(')')
            .next()
            .and_then(|r| r.split_whitespace().next())
            != Some("Z")
    })
}

#[test]
fn a_stop_lets_live_connections_finish_bypasses_new_ones_and_resets_the_rest() {
    let lab = lab_with(
        "pdrn",
        "[both]\nrate='100Mbit'\ndelay='10ms'\n",
        Some(Pep {
            cc: Some("cubic".into()),
            // Long enough for the 8 MB transfer beside the endless one on a loaded machine:
            // with 4 s, a CI run reset it 110 KB short.
            drain: Some("8s".into()),
            ..Default::default()
        }),
    );
    let listener = in_netns(&lab.ns(Host::Server), || {
        TcpListener::bind("0.0.0.0:9008").unwrap()
    })
    .join()
    .unwrap();
    // 'f': 8 MB, then a clean end; 'i': bytes until the connection fails.
    std::thread::spawn(move || {
        for s in listener.incoming() {
            let mut s = s.unwrap();
            std::thread::spawn(move || {
                let mut cmd = [0u8];
                s.read_exact(&mut cmd).unwrap();
                let chunk = vec![1u8; 64 * 1024];
                if cmd[0] == b'f' {
                    for _ in 0..128 {
                        s.write_all(&chunk).unwrap();
                    }
                } else {
                    while s.write_all(&chunk).is_ok() {}
                }
            });
        }
    });
    let get = |cmd: u8| {
        in_netns(&lab.ns(Host::Client), move || {
            let mut s = TcpStream::connect("198.18.3.2:9008").unwrap();
            s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
            s.write_all(&[cmd]).unwrap();
            let (n, end) = read_to_the_end(&mut s);
            (n, end, std::time::Instant::now())
        })
    };
    let endless = get(b'i');
    std::thread::sleep(Duration::from_millis(300));
    let finite = get(b'f');
    std::thread::sleep(Duration::from_millis(200));
    let pids = lab.state().proxy_pids.clone();
    let stopped = std::time::Instant::now();
    for pid in &pids {
        // SAFETY: signalling the proxies this test started.
        unsafe { libc::kill(*pid as i32, libc::SIGTERM) };
    }
    // A connection opened while they drain bypasses them, and works.
    std::thread::sleep(Duration::from_millis(500));
    let before = metric(&lab, Host::Gateway, "satpep_connections_total");
    let (n, end, _) = get(b'f').join().unwrap();
    assert_eq!(
        (n, end),
        (8 << 20, None),
        "a connection opened while draining"
    );
    assert_eq!(
        metric(&lab, Host::Gateway, "satpep_connections_total"),
        before,
        "the draining gateway took a new connection"
    );
    // The live transfer finishes, whole and with a clean end.
    let (n, end, _) = finite.join().unwrap();
    assert_eq!((n, end), (8 << 20, None), "the transfer live at the stop");
    // The endless one is reset when the drain time is over, not before.
    let (n, end, at) = endless.join().unwrap();
    assert!(n > 1_000_000, "{n}");
    assert_eq!(end, Some(ErrorKind::ConnectionReset));
    let after = at.duration_since(stopped);
    assert!(
        after >= Duration::from_millis(7500) && after < Duration::from_secs(11),
        "reset {after:?} after the stop, the drain is 8 s"
    );
    // Then the proxies exit and take their rules with them.
    let t = std::time::Instant::now();
    while pids.iter().any(|p| alive(*p)) {
        assert!(
            t.elapsed() < Duration::from_secs(5),
            "the proxies did not exit"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    for host in [Host::Terminal, Host::Gateway] {
        assert!(!has_table(&lab, host), "{host:?} kept its table");
    }
}

#[test]
fn under_systemd_it_is_ready_once_intercepting_feeds_the_watchdog_and_says_it_stops() {
    // systemd is not PID 1 here: the test is the service manager, with its notify socket.
    let lab = lab("pntf", "[both]\nrate='20Mbit'\n");
    let dir = std::env::temp_dir().join(format!("satpep-ntf-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let sock = dir.join("notify.sock");
    let manager = std::os::unix::net::UnixDatagram::bind(&sock).unwrap();
    manager
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let cfg = dir.join("proxy.toml");
    std::fs::write(
        &cfg,
        "[intercept]\ninterfaces = [\"to-client\"]\n[proxy]\nmetrics = \"\"\n",
    )
    .unwrap();
    // systemd names the PID the watchdog is for; exec keeps the shell's.
    let mut proxy = lab
        .command(Host::Terminal, "sh")
        .arg("-c")
        .arg(format!(
            "WATCHDOG_PID=$$ exec {} proxy --config {}",
            bin(),
            cfg.display()
        ))
        .env("NOTIFY_SOCKET", &sock)
        .env("WATCHDOG_USEC", "400000")
        .stdout(std::process::Stdio::null())
        .stderr(std::fs::File::create(dir.join("proxy.log")).unwrap())
        .spawn()
        .unwrap();
    let _kill = KillOnDrop(proxy.id() as i32);
    let next = || {
        let mut b = [0u8; 512];
        let n = manager.recv(&mut b).unwrap_or_else(|e| {
            panic!(
                "no notification within 10 s ({e}); the proxy's log:\n{}",
                std::fs::read_to_string(dir.join("proxy.log")).unwrap_or_default()
            )
        });
        String::from_utf8_lossy(&b[..n]).into_owned()
    };
    // Ready only once interception is installed.
    let first = next();
    assert!(first.contains("READY=1"), "{first}");
    assert!(has_table(&lab, Host::Terminal), "ready before intercepting");
    // The watchdog is fed at half its 400 ms.
    let t = std::time::Instant::now();
    let mut pings = 0;
    while pings < 3 {
        if next().contains("WATCHDOG=1") {
            pings += 1;
        }
    }
    assert!(
        t.elapsed() < Duration::from_millis(1500),
        "{:?}",
        t.elapsed()
    );
    // A SIGHUP reload says so, and ready again.
    // SAFETY: signalling the proxy this test started.
    unsafe { libc::kill(proxy.id() as i32, libc::SIGHUP) };
    let mut seen = Vec::new();
    while !seen.iter().any(|m: &String| m.contains("READY=1")) {
        seen.push(next());
    }
    assert!(seen.iter().any(|m| m.contains("RELOADING=1")), "{seen:?}");
    // Stopping is announced before the rules go.
    // SAFETY: as above.
    unsafe { libc::kill(proxy.id() as i32, libc::SIGTERM) };
    while !next().contains("STOPPING=1") {}
    proxy.wait().unwrap();
    assert!(!has_table(&lab, Host::Terminal));
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Counters never go back while connections come and go: 300 short connections through the
/// split proxies (each echoes a few bytes and closes) while the terminal's /metrics is read
/// again and again. Every `_total` series of each scrape is at least what the scrape before
/// it read (a closed connection's bytes used to leave the live set before they reached the
/// totals, and Prometheus reads a smaller total as a restart).
#[test]
fn counters_never_decrease_while_connections_churn() {
    let lab = lab_with(
        "pchurn",
        "[both]\nrate='50Mbit'\ndelay='2ms'\n",
        Some(satpep_lab::topology::Pep::default()),
    );
    echo_server(&lab, 9010);
    let client = lab.ns(Host::Client);
    let churn = in_netns(&client, || {
        for i in 0..300u32 {
            let mut c = TcpStream::connect("198.18.3.2:9010").unwrap();
            c.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
            for k in 0..4 {
                echo(&mut c, (i + k) as u8);
            }
        }
    });
    let totals = |text: &str| -> std::collections::BTreeMap<String, f64> {
        text.lines()
            .filter(|l| !l.starts_with('#'))
            .filter_map(|l| {
                let (k, v) = l.rsplit_once(' ')?;
                let v: f64 = v.parse().ok()?;
                k.contains("_total").then(|| (k.to_string(), v))
            })
            .collect()
    };
    let mut last = totals(&metrics(&lab, Host::Terminal));
    let mut scrapes = 0;
    while !churn.is_finished() {
        let now = totals(&metrics(&lab, Host::Terminal));
        for (k, v) in &now {
            if let Some(before) = last.get(k) {
                assert!(
                    v >= before,
                    "{k} went back from {before} to {v} after {scrapes} scrapes"
                );
            }
        }
        last = now;
        scrapes += 1;
    }
    churn.join().unwrap();
    assert!(
        scrapes >= 10,
        "only {scrapes} scrapes while connections churned"
    );
    let end = totals(&metrics(&lab, Host::Terminal));
    let up = end
        .get("satpep_relayed_bytes_total{direction=\"up\"}")
        .copied()
        .unwrap_or(0.0);
    // 300 connections × 4 bytes up, all closed and folded into the totals.
    assert!(up >= 1200.0, "{end:?}");
}

#[test]
fn a_small_exchange_is_answered_beside_a_download_faster_than_the_cpu() {
    // On a kernel bridge the link is faster than this machine: the relay of a bulk download
    // finds data ready on every pass. It once never yielded its worker then, and another
    // connection's bytes sat unread in the proxy (iperf3's end-of-test message, 9 of 12
    // downloads hung).
    let mut lab = split_lab("pcpu", "[both]\nrate='1Gbit'\ndelay='1ms'\n");
    lab.bridge_link().unwrap();
    let (bulk, echo) = in_netns(&lab.ns(Host::Server), || {
        (
            TcpListener::bind("0.0.0.0:9010").unwrap(),
            TcpListener::bind("0.0.0.0:9011").unwrap(),
        )
    })
    .join()
    .unwrap();
    let secs = Duration::from_secs(6);
    let sender = std::thread::spawn(move || {
        let (mut s, _) = bulk.accept().unwrap();
        let chunk = pattern(1 << 20, 1);
        let t0 = std::time::Instant::now();
        while t0.elapsed() < secs {
            if s.write_all(&chunk).is_err() {
                break;
            }
        }
    });
    let echoer = std::thread::spawn(move || {
        let (mut s, _) = echo.accept().unwrap();
        let mut b = [0u8; 1];
        while s.read_exact(&mut b).is_ok() {
            if s.write_all(&b).is_err() {
                break;
            }
        }
    });
    let reader = in_netns(&lab.ns(Host::Client), || {
        let mut s = TcpStream::connect("198.18.3.2:9010").unwrap();
        let mut buf = vec![0u8; 1 << 20];
        let mut n = 0u64;
        loop {
            match s.read(&mut buf) {
                Ok(0) | Err(_) => return n,
                Ok(k) => n += k as u64,
            }
        }
    });
    let pinger = in_netns(&lab.ns(Host::Client), move || {
        let mut s = TcpStream::connect("198.18.3.2:9011").unwrap();
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let t0 = std::time::Instant::now();
        let mut took = Vec::new();
        while t0.elapsed() < secs {
            let t = std::time::Instant::now();
            s.write_all(&[7]).unwrap();
            let mut b = [0u8; 1];
            if let Err(e) = s.read_exact(&mut b) {
                return Err(format!("no answer after {} answers: {e}", took.len()));
            }
            took.push(t.elapsed());
            std::thread::sleep(Duration::from_millis(50));
        }
        took.sort();
        Ok(took)
    });
    let pings = pinger.join().unwrap();
    sender.join().unwrap();
    let got = reader.join().unwrap();
    echoer.join().unwrap();
    let took = pings.unwrap();
    let (median, worst) = (took[took.len() / 2], took[took.len() - 1]);
    println!(
        "download {:.2} Gbit/s; {} answers, median {median:?}, worst {worst:?}",
        got as f64 * 8.0 / 6e9,
        took.len()
    );
    assert!(got > 100 << 20, "the download moved only {got} bytes");
    // Measured here: worst 99-126 ms; a relay that never yielded: 0.6-1.5 s, or no answer
    // within 5 s.
    assert!(
        worst < Duration::from_millis(400),
        "an answer took {worst:?}"
    );
}

/// What the terminal held for a slow reader (`slow_reader`).
#[derive(Debug)]
struct Held {
    /// The terrestrial leg's unsent bytes, median and most of the samples.
    unsent_p50: u64,
    unsent_max: u64,
    /// The gateway's terrestrial leg's smallest receive buffer seen (sizing's B1 there: a
    /// LAN sender feeding a satellite leg).
    rcvbuf_min: u64,
    /// Segments the terminal's flow control dropped.
    drops: u64,
    /// Segments the gateway retransmitted on the satellite leg.
    gateway_retrans: u64,
}

/// A 6 MB download through a terminal whose client reads slowly (4 Mbit/s of a 20 Mbit/s
/// link): what the proxies hold for it, sampled from their `/connections` every 0.5 s from
/// 2 s on, with every byte the client read checked.
fn slow_reader(tag: &str, proxy: ProxySection) -> Held {
    let lab = lab_with(
        tag,
        "[both]\nrate='20Mbit'\ndelay='100ms'\n",
        Some(Pep {
            file: ProxyFile {
                proxy,
                ..Default::default()
            },
            ..Default::default()
        }),
    );
    const TOTAL: usize = 6 << 20;
    let listener = in_netns(&lab.ns(Host::Server), || {
        TcpListener::bind("0.0.0.0:9010").unwrap()
    })
    .join()
    .unwrap();
    std::thread::spawn(move || {
        let (mut s, _) = listener.accept().unwrap();
        let data: Vec<u8> = (0..TOTAL).map(|i| (i % 251) as u8).collect();
        let _ = s.write_all(&data);
        let _ = s.shutdown(std::net::Shutdown::Write);
        let _ = s.read(&mut [0u8; 1]);
    });
    let reader = in_netns(&lab.ns(Host::Client), || {
        let mut s = TcpStream::connect("198.18.3.2:9010").unwrap();
        s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        let (mut got, mut buf) = (Vec::new(), vec![0u8; 16 << 10]);
        let t = std::time::Instant::now();
        loop {
            // 4 Mbit/s: 16 KiB every 32 ms.
            let due = Duration::from_millis(32 * (got.len() / (16 << 10)) as u64);
            if let Some(w) = due.checked_sub(t.elapsed()) {
                std::thread::sleep(w);
            }
            match s.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => got.extend_from_slice(&buf[..n]),
            }
        }
        let intact = got.iter().enumerate().all(|(i, &b)| b == (i % 251) as u8);
        // The stream comes back open: the proxies list the connection until it closes.
        (got.len(), intact, s)
    });
    std::thread::sleep(Duration::from_secs(2));
    let (mut unsent, mut rcvbuf_min) = (Vec::new(), u64::MAX);
    let first = |host: Host| {
        let st = lab
            .command(host, bin())
            .args(["status", "--json"])
            .output()
            .unwrap();
        let st: serde_json::Value = serde_json::from_slice(&st.stdout).unwrap();
        st["connections"]
            .as_array()
            .and_then(|c| c.first().cloned())
    };
    for _ in 0..8 {
        if let Some(c) = first(Host::Terminal) {
            unsent.push(c["terrestrial"]["notsent_bytes"].as_u64().unwrap_or(0));
        }
        if let Some(c) = first(Host::Gateway) {
            rcvbuf_min = rcvbuf_min.min(c["terrestrial"]["rcvbuf"].as_u64().unwrap_or(u64::MAX));
        }
        std::thread::sleep(Duration::from_millis(500));
    }
    let (read, intact, stream) = reader.join().unwrap();
    assert_eq!(read, TOTAL, "{tag}: every byte arrives");
    assert!(intact, "{tag}: in order and intact");
    let m = metrics(&lab, Host::Terminal);
    let drops = m
        .lines()
        .find_map(|l| l.strip_prefix("satpep_flow_control_drops_total "))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0);
    let gateway_retrans = gateway_status(&lab)["connections"]
        .as_array()
        .and_then(|c| c.first().map(|c| c["satellite"]["total_retrans"].as_u64()))
        .flatten()
        .unwrap_or(0);
    // Read while the connection was still listed (closed, it showed no retransmissions).
    drop(stream);
    assert!(unsent.len() >= 4, "{tag}: the connection was not listed");
    unsent.sort();
    Held {
        unsent_p50: unsent[unsent.len() / 2],
        unsent_max: *unsent.last().unwrap(),
        rcvbuf_min,
        drops,
        gateway_retrans,
    }
}

/// Bharadwaj 1999's flow control (issue 41), at a terminal feeding a client that reads at a
/// fifth of the link's rate. Improved back-pressure holds the terrestrial leg's unsent bytes
/// to its low-water mark (measured 0.23-0.28 MB; plain lets the send buffer fill: 0.8-0.9
/// MB); drop-based flow control drops a segment on the satellite leg, which the gateway
/// retransmits; buffer sizing lowers the receive buffer of the gateway's leg from the server.
/// No byte is lost or reordered either way.
#[test]
fn flow_control_holds_back_a_fast_sender_for_a_slow_reader() {
    let plain = slow_reader(
        "pfc1",
        ProxySection {
            back_pressure: "plain".into(),
            ..Default::default()
        },
    );
    let all = slow_reader(
        "pfc2",
        ProxySection {
            back_pressure: "improved".into(),
            drop_flow_control: true,
            buffer_sizing: true,
            ..Default::default()
        },
    );
    eprintln!("plain {plain:?}\nimproved, drops, sizing {all:?}");
    assert_eq!(plain.drops, 0, "drops without drop-based flow control");
    let lowat = satpep_proxy::flow_control::LOWAT as u64;
    assert!(
        plain.unsent_p50 > 2 * lowat,
        "plain back-pressure held little unsent: {plain:?}"
    );
    assert!(
        all.unsent_max <= 2 * lowat,
        "improved back-pressure held more than its low-water mark allows: {all:?}"
    );
    assert!(all.drops >= 1 && all.gateway_retrans >= 1, "{all:?}");
    assert!(
        all.rcvbuf_min < plain.rcvbuf_min / 2,
        "buffer sizing did not lower the receive buffer: plain {plain:?}, sized {all:?}"
    );
}

/// `proxy.workers`: the connections are spread over the proxy's processes, which its
/// `/metrics` adds up; past a process's share of `max_connections` new connections bypass
/// (and work); a stop ends every process and removes the rules and the shared page.
#[test]
fn worker_processes_share_the_connections_and_stop_with_the_proxy() {
    let mut lab = lab_with(
        "pwrk",
        "[both]\nrate='20Mbit'\ndelay='10ms'\n",
        Some(Pep {
            cc: Some("cubic".into()),
            max_connections: Some(30),
            file: ProxyFile {
                proxy: ProxySection {
                    workers: 3,
                    ..Default::default()
                },
                ..Default::default()
            },
            ..Default::default()
        }),
    );
    echo_server(&lab, 9031);
    let workers_of = |pid: u32| -> Vec<u32> {
        std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children"))
            .unwrap_or_default()
            .split_whitespace()
            .filter_map(|p| p.parse().ok())
            .collect()
    };
    let leaders = lab.state().proxy_pids.clone();
    for &p in &leaders {
        assert_eq!(workers_of(p).len(), 3, "proxy {p}: {:?}", workers_of(p));
    }
    let gateway_workers = workers_of(leaders[1]);
    // 24 connections, echoed: about 8 a process, each process's share is 10.
    let mut conns: Vec<TcpStream> = (0..24).map(|_| connect_from_client(&lab, 9031)).collect();
    for (i, c) in conns.iter_mut().enumerate() {
        echo(c, i as u8);
    }
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(metric(&lab, Host::Gateway, "satpep_workers"), 3.0);
    let m = metrics(&lab, Host::Gateway);
    let per_worker: Vec<f64> = m
        .lines()
        .filter(|l| l.starts_with("satpep_worker_connections_active{"))
        .filter_map(|l| l.rsplit(' ').next()?.parse().ok())
        .collect();
    assert_eq!(per_worker.len(), 3, "{m}");
    assert!(
        per_worker.iter().all(|&n| n > 0.0),
        "every worker relays: {m}"
    );
    let active = metric(&lab, Host::Gateway, "satpep_connections_active");
    assert!(
        (20.0..=24.0).contains(&active),
        "{active} connections active (24 opened, a few may bypass a full process):\n{m}"
    );
    // 24 more: the processes fill their shares; the rest bypass, and work.
    let more: Vec<TcpStream> = (0..24)
        .map(|i| {
            let mut c = connect_from_client(&lab, 9031);
            echo(&mut c, 100 + i as u8);
            c
        })
        .collect();
    let log = lab.proxy_log(Host::Gateway);
    assert!(log.contains("connection limit reached"), "{log}");
    let active = metric(&lab, Host::Gateway, "satpep_connections_active");
    assert!(active <= 33.0, "{active} active past a limit of 30:\n{log}");
    for (i, c) in conns.iter_mut().enumerate() {
        echo(c, 200 + i as u8);
    }
    drop(more);
    drop(conns);
    lab.stop_proxies();
    std::thread::sleep(Duration::from_millis(300));
    for p in gateway_workers {
        assert!(!alive(p), "worker {p} outlived its proxy");
    }
    assert!(!has_table(&lab, Host::Gateway));
    let pages: Vec<_> = std::fs::read_dir("/run/satpep")
        .map(|d| {
            d.filter_map(|e| e.ok())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| {
                    leaders
                        .iter()
                        .any(|p| n.starts_with(&format!("workers-{p}-")))
                })
                .collect()
        })
        .unwrap_or_default();
    assert!(pages.is_empty(), "shared pages left: {pages:?}");
}
