//! A real web server in a lab host (nginx, Debian's `nginx-light`), serving generated files,
//! and curl as the client. Used for fetch times and for checksummed downloads. Its send
//! timeout is 600 s (nginx's default is 60 s), so the lab's outages test the path, not the
//! server's patience.

use crate::topology::{state_dir, Host, Lab};
use sha2::{Digest, Sha256};
use std::path::PathBuf;
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

/// An nginx serving `files` from the lab's state directory; stopped when dropped.
pub struct HttpServer {
    child: Child,
    /// Directory served.
    pub root: PathBuf,
}

/// Deterministic content of a served file: `len` bytes from `seed`.
pub fn content(len: usize, seed: u32) -> Vec<u8> {
    let mut x = seed.wrapping_mul(2654435761).wrapping_add(1);
    (0..len)
        .map(|_| {
            // xorshift32: incompressible enough that no layer can shortcut it.
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            x as u8
        })
        .collect()
}

impl HttpServer {
    /// Starts nginx in `host` on port 80 (IPv4 and IPv6), serving `files` (name, size); each
    /// file's content is [`content`] with the file's index as seed.
    pub fn start(lab: &Lab, host: Host, files: &[(&str, usize)]) -> Result<HttpServer, String> {
        let dir = state_dir(&lab.name).join(format!("www-{}", host.name()));
        let root = dir.join("root");
        std::fs::create_dir_all(&root).map_err(|e| format!("{}: {e}", root.display()))?;
        for (i, (name, size)) in files.iter().enumerate() {
            std::fs::write(root.join(name), content(*size, i as u32))
                .map_err(|e| format!("cannot write {name}: {e}"))?;
        }
        let d = dir.display();
        let conf = format!(
            "user root;\nworker_processes 1;\npid {d}/nginx.pid;\nerror_log {d}/error.log;\n\
             events {{ worker_connections 4096; }}\n\
             http {{\n access_log off;\n sendfile on;\n tcp_nodelay on;\n keepalive_requests 100000;\n\
             send_timeout 600s;\n keepalive_timeout 600s;\n\
             client_body_temp_path {d}/body;\n proxy_temp_path {d}/proxy;\n fastcgi_temp_path {d}/fcgi;\n\
             uwsgi_temp_path {d}/uwsgi;\n scgi_temp_path {d}/scgi;\n\
             server {{\n  listen 80;\n  listen [::]:80;\n  root {root};\n }}\n}}\n",
            root = root.display()
        );
        let conf_path = dir.join("nginx.conf");
        std::fs::write(&conf_path, conf).map_err(|e| e.to_string())?;
        let child = lab
            .command(host, "nginx")
            .args(["-c", conf_path.to_str().unwrap(), "-g", "daemon off;"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| format!("cannot start nginx (apt-get install nginx-light): {e}"))?;
        let mut s = HttpServer { child, root };
        let t = Instant::now();
        loop {
            let ok = lab
                .command(host, "curl")
                .args(["-s", "-o", "/dev/null", "http://127.0.0.1/"])
                .status()
                .map(|st| st.code().is_some_and(|c| c == 0))
                .unwrap_or(false);
            if ok {
                return Ok(s);
            }
            if let Ok(Some(st)) = s.child.try_wait() {
                let log = std::fs::read_to_string(dir.join("error.log")).unwrap_or_default();
                return Err(format!("nginx exited ({st}): {log}"));
            }
            if t.elapsed() > Duration::from_secs(10) {
                return Err("nginx did not start listening within 10 s".into());
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// SHA-256 of the served file `name`.
    pub fn sha256(&self, name: &str) -> Result<[u8; 32], String> {
        let b = std::fs::read(self.root.join(name)).map_err(|e| e.to_string())?;
        Ok(Sha256::digest(&b).into())
    }
}

impl Drop for HttpServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// One download with curl.
#[derive(Debug, Clone)]
pub struct Fetch {
    /// Seconds from the start of the connection to the last byte.
    pub total_s: f64,
    /// Bytes received.
    pub bytes: u64,
    /// HTTP status (0 when the transfer failed).
    pub status: u32,
    /// curl's exit code (0: complete).
    pub exit: i32,
    /// SHA-256 of what arrived, if it was kept.
    pub sha256: Option<[u8; 32]>,
}

/// Starts `curl` in `host` fetching `url`; keeps the body in `out` if given.
pub fn spawn_fetch(lab: &Lab, host: Host, url: &str, out: Option<&PathBuf>, max_s: u32) -> Child {
    spawn_fetch_at(lab, host, url, out, max_s, None)
}

/// [`spawn_fetch`], reading at most `read_bps` bytes per second (curl's `--limit-rate`: a
/// slow reader, whose receive window closes as its buffer fills).
pub fn spawn_fetch_at(
    lab: &Lab,
    host: Host,
    url: &str,
    out: Option<&PathBuf>,
    max_s: u32,
    read_bps: Option<u64>,
) -> Child {
    let o = out.map_or("/dev/null".to_string(), |p| p.display().to_string());
    let mut c = lab.command(host, "curl");
    c.args([
        "-s",
        "-o",
        &o,
        "--max-time",
        &max_s.to_string(),
        "-w",
        "%{time_total} %{size_download} %{http_code}",
        url,
    ]);
    if let Some(r) = read_bps {
        c.args(["--limit-rate", &r.max(1).to_string()]);
    }
    c.stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("curl is installed")
}

/// Waits for a fetch started by [`spawn_fetch`].
pub fn finish_fetch(child: Child, out: Option<&PathBuf>) -> Fetch {
    let o = child.wait_with_output();
    let (text, exit) = match &o {
        Ok(o) => (
            String::from_utf8_lossy(&o.stdout).into_owned(),
            o.status.code().unwrap_or(-1),
        ),
        Err(_) => (String::new(), -1),
    };
    let mut it = text.split_whitespace();
    let total_s = it.next().and_then(|x| x.parse().ok()).unwrap_or(0.0);
    let bytes = it.next().and_then(|x| x.parse().ok()).unwrap_or(0);
    let status = it.next().and_then(|x| x.parse().ok()).unwrap_or(0);
    let sha256 = out
        .and_then(|p| std::fs::read(p).ok())
        .map(|b| Sha256::digest(&b).into());
    Fetch {
        total_s,
        bytes,
        status,
        exit,
        sha256,
    }
}

/// Fetches `url` from `host` and waits.
pub fn fetch(lab: &Lab, host: Host, url: &str, max_s: u32) -> Fetch {
    finish_fetch(spawn_fetch(lab, host, url, None, max_s), None)
}
