//! Helpers shared by the integration tests: labs with unique names that tear themselves
//! down, and the satpep binary under test.

#![allow(dead_code)]

use satpep_lab::{Lab, UpOptions};
use satpep_link::config::LinkSpec;
use std::process::Command;

/// The satpep binary built for these tests.
pub fn bin() -> &'static str {
    env!("CARGO_BIN_EXE_satpep")
}

/// A command running the satpep binary.
pub fn satpep() -> Command {
    Command::new(bin())
}

/// Runs `satpep ARGS`, which must succeed: its standard output.
#[allow(dead_code)]
pub fn satpep_ok(args: &[&str]) -> String {
    let out = satpep().args(args).output().unwrap();
    assert!(
        out.status.success(),
        "satpep {}: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// A lab name unique to this test process and `tag`.
pub fn name(tag: &str) -> String {
    format!("t{}{tag}", std::process::id() % 100_000)
}

/// Fails loudly (not silently passing) when the tests cannot do what they must.
pub fn require_root() {
    // SAFETY: no preconditions.
    assert_eq!(
        unsafe { libc::geteuid() },
        0,
        "these tests build network namespaces and need root"
    );
}

/// Builds a lab named after `tag` with the link described by `toml_text` (a LinkSpec).
/// Dropping the returned lab removes it, also when the test fails.
pub fn lab(tag: &str, toml_text: &str) -> Lab {
    lab_with(tag, toml_text, None)
}

/// Like [`lab`], with the split proxy on terminal and gateway when `pep` is given.
pub fn lab_with(tag: &str, toml_text: &str, pep: Option<satpep_lab::topology::Pep>) -> Lab {
    require_root();
    let spec: LinkSpec = toml::from_str(toml_text).expect("test link spec");
    let spec = LinkSpec::layered(&[&spec]).unwrap();
    Lab::up(
        &name(tag),
        &spec,
        &UpOptions {
            satpep_bin: bin().into(),
            check: false,
            pep,
            terminals: 1,
        },
    )
    .unwrap_or_else(|e| panic!("lab up: {e}"))
}

/// Namespaces whose name starts with `prefix`.
pub fn namespaces_with(prefix: &str) -> Vec<String> {
    let out = Command::new("ip").args(["netns", "list"]).output().unwrap();
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .filter(|n| n.starts_with(prefix))
        .map(String::from)
        .collect()
}

/// Whether satpep_sat's state iterator is pinned beside it (a proxy loaded it): a kernel may
/// take the controller and refuse the iterator (a sandbox's LSM), and then no model is shown.
pub fn models_readable() -> bool {
    satpep_cc::states_pin("satpep_sat").exists()
}

/// Scenario labs' namespaces (`sp-sc-PID-…`) whose process is gone: what a finished run
/// left behind. Labs of runs still going (another test, a background run) are not counted.
pub fn orphaned_scenario_namespaces() -> Vec<String> {
    namespaces_with("sp-sc-")
        .into_iter()
        .filter(|n| {
            n["sp-sc-".len()..]
                .split('-')
                .next()
                .and_then(|p| p.parse::<u32>().ok())
                .is_none_or(|pid| !std::path::Path::new(&format!("/proc/{pid}")).exists())
        })
        .collect()
}

/// Sequence numbers of ping replies received, from `ping -n` output.
pub fn ping_seqs(lab: &Lab, args: &[&str]) -> (Vec<u32>, String) {
    let out = lab
        .command(satpep_lab::Host::Client, "ping")
        .args(args)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let seqs = text
        .lines()
        .filter_map(|l| l.split("icmp_seq=").nth(1))
        .filter_map(|s| s.split_whitespace().next()?.parse().ok())
        .collect();
    (seqs, text)
}

/// Runs `f` on a thread inside network namespace `ns`.
pub fn in_netns<T: Send + 'static>(
    ns: &str,
    f: impl FnOnce() -> T + Send + 'static,
) -> std::thread::JoinHandle<T> {
    let path = format!("/run/netns/{ns}");
    std::thread::spawn(move || {
        let fd = std::fs::File::open(&path).unwrap();
        use std::os::fd::AsRawFd;
        // SAFETY: setns on this thread only, with a valid namespace fd.
        assert_eq!(
            unsafe { libc::setns(fd.as_raw_fd(), libc::CLONE_NEWNET) },
            0,
            "setns {path}"
        );
        f()
    })
}

/// `n` bytes of a pattern that differs with `seed`.
pub fn pattern(n: usize, seed: u8) -> Vec<u8> {
    (0..n)
        .map(|i| (i as u32).wrapping_mul(2654435761).to_le_bytes()[0] ^ seed)
        .collect()
}

/// One connection from the client host to `addr`, answered on `listener` (bound in the
/// server host), checked end to end: the client sends `data` and half-closes; the server
/// reads to the FIN, hashing, then sends the SHA-256 of what it got followed by `reply` over
/// the half still open, and half-closes. Asserts that the server saw `client_ip` as the
/// client, that every byte arrived intact both ways, and that the half-close held.
pub fn assert_exchange_intact(
    lab: &satpep_lab::Lab,
    listener: std::net::TcpListener,
    addr: String,
    data: Vec<u8>,
    reply: Vec<u8>,
    client_ip: &str,
) {
    use sha2::{Digest, Sha256};
    use std::io::{Read, Write};
    use std::net::{Shutdown, TcpStream};
    let (sent_len, sent_hash) = (data.len(), Sha256::digest(&data));
    let (reply_len, reply_hash) = (reply.len(), Sha256::digest(&reply));
    let server = std::thread::spawn(move || {
        let (mut s, peer) = listener.accept().unwrap();
        let mut h = Sha256::new();
        let mut buf = vec![0u8; 1 << 16];
        let mut n = 0usize;
        loop {
            let k = s.read(&mut buf).unwrap();
            if k == 0 {
                break;
            }
            h.update(&buf[..k]);
            n += k;
        }
        s.write_all(&h.finalize()).unwrap();
        s.write_all(&reply).unwrap();
        s.shutdown(Shutdown::Write).unwrap();
        (peer.ip().to_canonical().to_string(), n)
    });
    let client = in_netns(&lab.ns(satpep_lab::Host::Client), move || {
        let mut s = TcpStream::connect(&addr).unwrap();
        s.write_all(&data).unwrap();
        s.shutdown(Shutdown::Write).unwrap();
        let mut back = Vec::new();
        s.read_to_end(&mut back).unwrap();
        back
    });
    let back = client.join().unwrap();
    let (seen_peer, n) = server.join().unwrap();
    assert_eq!(
        seen_peer, client_ip,
        "the server must see the client's own address"
    );
    assert_eq!(n, sent_len, "bytes received by the server");
    assert_eq!(
        &back[..32],
        sent_hash.as_slice(),
        "client→server data corrupted"
    );
    assert_eq!(
        back.len(),
        32 + reply_len,
        "server→client length after half-close"
    );
    assert_eq!(
        Sha256::digest(&back[32..]),
        reply_hash,
        "server→client data corrupted"
    );
}

/// `/metrics` of the proxy in `host` (its default endpoint), with the HTTP head.
#[allow(dead_code)]
pub fn metrics(lab: &Lab, host: satpep_lab::Host) -> String {
    let out = lab
        .command(host, "bash")
        .args(["-c", "exec 3<>/dev/tcp/127.0.0.1/9917; printf 'GET /metrics HTTP/1.0\\r\\n\\r\\n' >&3; cat <&3"])
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The pid of the proxy on node `host` ("terminal", "gateway", a star's "terminal3"), found
/// by its config file.
#[allow(dead_code)]
pub fn proxy_pid(lab: &Lab, host: &str) -> i32 {
    let file = satpep_lab::topology::state_dir(&lab.name).join(format!("proxy-{host}.toml"));
    let out = std::process::Command::new("pgrep")
        .args(["-f", file.to_str().unwrap()])
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .next()
        .and_then(|l| l.trim().parse().ok())
        .unwrap_or_else(|| panic!("no {host} proxy runs"))
}

/// SIGKILLs process `.0` when dropped, so a failing test leaves no process of its own
/// running; harmless once it has exited.
pub struct KillOnDrop(pub i32);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        // SAFETY: signalling a process the test started.
        unsafe { libc::kill(self.0, libc::SIGKILL) };
    }
}
