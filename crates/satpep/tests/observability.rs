//! The dashboard and alert rules in `dist/` against a real Prometheus (Debian's package)
//! scraping a lab's terminal proxy in tunnel mode while a transfer runs both ways: the rules pass
//! `promtool check rules` and evaluate without error, every dashboard query and the series
//! part of every alert expression return data, and stopping the proxy raises `SatpepDown`.

mod common;
use common::*;
use satpep_lab::topology::Pep;
use satpep_lab::Host;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

const PROMETHEUS: &str = "127.0.0.1:9590";

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// Percent-encodes a query for a form body.
fn form(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// One HTTP/1.0 request to Prometheus inside `ns`; the reply's body, or why there is none.
fn http(ns: &str, method: &str, path: &str, body: &str) -> Result<String, String> {
    let req = format!(
        "{method} {path} HTTP/1.0\r\nContent-Type: application/x-www-form-urlencoded\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    in_netns(ns, move || -> Result<String, String> {
        let mut s = TcpStream::connect(PROMETHEUS).map_err(|e| e.to_string())?;
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        s.write_all(req.as_bytes()).map_err(|e| e.to_string())?;
        let mut out = String::new();
        s.read_to_string(&mut out).map_err(|e| e.to_string())?;
        Ok(out
            .split_once("\r\n\r\n")
            .map_or(String::new(), |(_, b)| b.to_string()))
    })
    .join()
    .unwrap()
}

/// Evaluates `expr` now; the result vector.
fn query(ns: &str, expr: &str) -> Vec<serde_json::Value> {
    let body = http(
        ns,
        "POST",
        "/api/v1/query",
        &format!("query={}", form(expr)),
    )
    .unwrap();
    let v: serde_json::Value =
        serde_json::from_str(&body).unwrap_or_else(|e| panic!("{expr}: {e}: {body}"));
    assert_eq!(v["status"], "success", "{expr}: {body}");
    v["data"]["result"].as_array().cloned().unwrap_or_default()
}

/// The series part of an alert expression "<series> <comparison> <threshold>".
fn series_of(expr: &str) -> String {
    let e = expr.trim();
    for op in [" == ", " != ", " >= ", " <= ", " > ", " < "] {
        if let Some(i) = e.rfind(op) {
            let rest = e[i + op.len()..].trim();
            if rest.parse::<f64>().is_ok() {
                return e[..i].trim().to_string();
            }
        }
    }
    panic!("alert expression '{expr}' is not '<series> <comparison> <number>'");
}

/// Kills the child when dropped: a failed assertion must not leave Prometheus running.
struct Killed(std::process::Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Prometheus in `host`'s namespace of `lab`, scraping that proxy every second with the
/// rules of `dist/`, started and ready (killed when dropped).
struct Prom {
    _child: Killed,
    ns: String,
    dir: PathBuf,
}

impl Prom {
    fn start(lab: &satpep_lab::topology::Lab, host: Host, tag: &str) -> Prom {
        let rules = repo().join("dist/prometheus/satpep-alerts.yml");
        let dir = std::env::temp_dir().join(format!("satpep-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let cfg = dir.join("prometheus.yml");
        std::fs::write(
            &cfg,
            format!(
                "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\nrule_files:\n  - {}\nscrape_configs:\n  - job_name: satpep\n    static_configs:\n      - targets: ['127.0.0.1:9917']\n",
                rules.canonicalize().unwrap().display()
            ),
        )
        .unwrap();
        let log = std::fs::File::create(dir.join("prometheus.log")).unwrap();
        let child = lab
            .command(host, "prometheus")
            .arg(format!("--config.file={}", cfg.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.join("data").display()
            ))
            .arg(format!("--web.listen-address={PROMETHEUS}"))
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .unwrap();
        let p = Prom {
            _child: Killed(child),
            ns: lab.ns(host),
            dir,
        };
        let t = Instant::now();
        while http(&p.ns, "GET", "/-/ready", "").is_err() {
            assert!(
                t.elapsed() < Duration::from_secs(30),
                "Prometheus not ready: {}",
                p.log()
            );
            std::thread::sleep(Duration::from_millis(200));
        }
        p
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("prometheus.log")).unwrap_or_default()
    }
}

impl Drop for Prom {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A transfer between the lab's server and its client that lasts `secs` seconds, both ways
/// at once: the tunnel's model measures the rate of the side that sends, and a terminal that
/// only acknowledges a download may not have measured one by the time the dashboard is read.
fn transfer(lab: &satpep_lab::topology::Lab, secs: u64) -> std::thread::JoinHandle<()> {
    let listener = in_netns(&lab.ns(Host::Server), || {
        TcpListener::bind("0.0.0.0:9600").unwrap()
    })
    .join()
    .unwrap();
    // Writes for `secs` seconds, then closes the sending half.
    let send = move |mut s: TcpStream| {
        let chunk = vec![7u8; 64 * 1024];
        let t = Instant::now();
        while t.elapsed() < Duration::from_secs(secs) && s.write_all(&chunk).is_ok() {}
        let _ = s.shutdown(std::net::Shutdown::Write);
    };
    let drain = |mut s: TcpStream| {
        let mut buf = vec![0u8; 64 * 1024];
        while matches!(s.read(&mut buf), Ok(n) if n > 0) {}
    };
    std::thread::spawn(move || {
        if let Ok((s, _)) = listener.accept() {
            let r = s.try_clone().unwrap();
            let reader = std::thread::spawn(move || drain(r));
            send(s);
            let _ = reader.join();
        }
    });
    in_netns(&lab.ns(Host::Client), move || {
        let s = TcpStream::connect("198.18.3.2:9600").unwrap();
        let w = s.try_clone().unwrap();
        let writer = std::thread::spawn(move || send(w));
        drain(s);
        let _ = writer.join();
    })
}

fn require_prometheus() {
    require_root();
    for tool in ["prometheus", "promtool"] {
        assert!(
            std::process::Command::new("sh")
                .args(["-c", &format!("command -v {tool}")])
                .output()
                .unwrap()
                .status
                .success(),
            "{tool} is not installed (apt install prometheus; .ci/run does)"
        );
    }
}

/// A healthy split proxy has no tunnel: no alert is pending or firing on it (a
/// `satpep_tunnel_connected` of 0 once paged on every split proxy), and it exports no
/// tunnel figures at all.
#[test]
fn alert_rules_stay_silent_on_a_healthy_split_proxy() {
    require_prometheus();
    let lab = lab_with(
        "obss",
        "[both]\nrate='20Mbit'\ndelay='50ms'\n",
        Some(Pep::default()),
    );
    let _traffic = transfer(&lab, 40);
    let prom = Prom::start(&lab, Host::Terminal, "obss");
    // Long enough for every rule to be evaluated on data (rates over a few scrapes).
    std::thread::sleep(Duration::from_secs(12));
    assert!(
        !query(&prom.ns, "satpep_connections_active").is_empty(),
        "no scrape of the split proxy: {}",
        prom.log()
    );
    assert!(
        query(&prom.ns, "{__name__=~\"satpep_tunnel_.*\"}").is_empty(),
        "a split proxy exports tunnel figures"
    );
    let v: serde_json::Value =
        serde_json::from_str(&http(&prom.ns, "GET", "/api/v1/alerts", "").unwrap()).unwrap();
    let alerts = v["data"]["alerts"].as_array().cloned().unwrap_or_default();
    assert!(
        alerts.is_empty(),
        "alerts pending or firing on a healthy split proxy: {alerts:?}"
    );
}

#[test]
fn the_dashboard_and_alert_rules_work_against_a_real_prometheus() {
    require_prometheus();
    let rules = repo().join("dist/prometheus/satpep-alerts.yml");
    let check = std::process::Command::new("promtool")
        .args(["check", "rules"])
        .arg(&rules)
        .output()
        .unwrap();
    assert!(
        check.status.success(),
        "promtool check rules: {}{}",
        String::from_utf8_lossy(&check.stdout),
        String::from_utf8_lossy(&check.stderr)
    );
    let rules_text = std::fs::read_to_string(&rules).unwrap();
    let alerts: Vec<(String, String)> = rules_text
        .lines()
        .filter_map(|l| l.trim().strip_prefix("- alert: ").map(str::to_string))
        .zip(
            rules_text
                .lines()
                .filter_map(|l| l.trim().strip_prefix("expr: ").map(str::to_string)),
        )
        .collect();
    assert!(alerts.len() >= 8, "{alerts:?}");
    let dash: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(repo().join("dist/grafana/satpep-dashboard.json")).unwrap(),
    )
    .unwrap();
    let queries: Vec<(String, String)> = dash["panels"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|p| {
            let title = p["title"].as_str().unwrap().to_string();
            p["targets"]
                .as_array()
                .unwrap()
                .iter()
                .map(move |t| (title.clone(), t["expr"].as_str().unwrap().to_string()))
        })
        .collect();
    assert!(queries.len() >= 20, "{queries:?}");

    // The lab: a tunnel (the terminal has connection, leg, memory and tunnel metrics), and
    // a transfer both ways that lasts the whole test.
    let mut lab = lab_with(
        "obs",
        "[both]\nrate='20Mbit'\ndelay='50ms'\n",
        Some(Pep {
            tunnel: Some("satellite".into()),
            ..Default::default()
        }),
    );
    let _traffic = transfer(&lab, 60);

    // Prometheus in the terminal's namespace, scraping its proxy every second.
    let prom = Prom::start(&lab, Host::Terminal, "obs");
    let ns = prom.ns.clone();
    // Enough scrapes for the rate windows.
    std::thread::sleep(Duration::from_secs(12));

    let mut missing = Vec::new();
    for (title, expr) in &queries {
        let e = expr
            .replace("$__rate_interval", "10s")
            .replace("$instance", ".*");
        if query(&ns, &e).is_empty() {
            missing.push(format!("dashboard panel '{title}': {e}"));
        }
    }
    for (name, expr) in &alerts {
        let e = series_of(expr);
        if query(&ns, &e).is_empty() {
            missing.push(format!("alert {name}: {e}"));
        }
    }
    let rules_now: serde_json::Value =
        serde_json::from_str(&http(&ns, "GET", "/api/v1/rules", "").unwrap()).unwrap();
    let evaluated: Vec<&serde_json::Value> = rules_now["data"]["groups"][0]["rules"]
        .as_array()
        .unwrap()
        .iter()
        .collect();
    assert_eq!(evaluated.len(), alerts.len(), "{rules_now}");
    for r in &evaluated {
        assert_eq!(r["health"], "ok", "{r}");
    }
    // Healthy, nothing fires but the informational flow-control one may.
    let alerts_now = http(&ns, "GET", "/api/v1/alerts", "").unwrap();
    for name in [
        "SatpepDown",
        "SatpepInterceptionMissing",
        "SatpepTunnelDown",
    ] {
        assert!(
            !alerts_now.contains(name),
            "{name} while healthy: {alerts_now}"
        );
    }

    // The proxy stops: its scrapes fail and SatpepDown is raised (pending for its 1 min).
    lab.signal_proxy(Host::Terminal, libc::SIGTERM);
    let t = Instant::now();
    let raised = loop {
        let a = http(&ns, "GET", "/api/v1/alerts", "").unwrap();
        if a.contains("\"SatpepDown\"") {
            break true;
        }
        if t.elapsed() > Duration::from_secs(20) {
            break false;
        }
        std::thread::sleep(Duration::from_millis(500));
    };
    let plog = prom.log();
    drop(prom);
    assert!(missing.is_empty(), "no data for:\n{}", missing.join("\n"));
    assert!(
        raised,
        "SatpepDown not raised after the proxy stopped: {plog}"
    );
}
