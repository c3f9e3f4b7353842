//! Running the system tools the lab is glued from (`ip`, `ethtool`), with errors that say
//! which command failed and what it printed. Arguments are passed as a vector, never through a
//! shell.

use std::process::{Command, Output, Stdio};

/// A command that runs `prog` inside the network namespace `ns` (`ip netns exec`): the one
/// place the lab builds such a command line.
pub fn in_ns(ns: &str, prog: impl AsRef<std::ffi::OsStr>) -> Command {
    let mut c = Command::new("ip");
    c.args(["netns", "exec", ns]).arg(prog);
    c
}

/// [`run`] inside the network namespace `ns`.
pub fn run_in(ns: &str, prog: &str, args: &[&str]) -> Result<String, String> {
    let mut a = vec!["netns", "exec", ns, prog];
    a.extend_from_slice(args);
    run("ip", &a)
}

/// [`run_stdin`] inside the network namespace `ns`.
pub fn run_stdin_in(
    ns: &str,
    prog: &str,
    args: &[&str],
    input: &str,
    what: &str,
) -> Result<(), String> {
    let mut a = vec!["netns", "exec", ns, prog];
    a.extend_from_slice(args);
    run_stdin("ip", &a, input, what)
}

/// Runs `prog args…` and returns stdout; an error names the command and quotes its stderr.
pub fn run(prog: &str, args: &[&str]) -> Result<String, String> {
    let out = output(prog, args)?;
    if !out.status.success() {
        return Err(format!(
            "`{} {}` failed: {}",
            prog,
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Runs `prog args…` and returns its output whatever the exit status.
pub fn output(prog: &str, args: &[&str]) -> Result<Output, String> {
    Command::new(prog)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| {
            if e.kind() == std::io::ErrorKind::NotFound {
                format!("`{prog}` is not installed (run scripts/install-deps.sh)")
            } else {
                format!("cannot run `{prog}`: {e}")
            }
        })
}

/// Runs `prog args…` with `input` on stdin; an error names `what` and quotes stderr.
pub fn run_stdin(prog: &str, args: &[&str], input: &str, what: &str) -> Result<(), String> {
    use std::io::Write;
    let mut child = Command::new(prog)
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("cannot run `{prog}` (run scripts/install-deps.sh): {e}"))?;
    child
        .stdin
        .take()
        .unwrap()
        .write_all(input.as_bytes())
        .map_err(|e| e.to_string())?;
    let out = child.wait_with_output().map_err(|e| e.to_string())?;
    if !out.status.success() {
        return Err(format!(
            "{what} failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    Ok(())
}

/// Runs `ip -n NS -batch -` with `lines` on stdin: one process for many changes.
pub fn ip_batch(ns: Option<&str>, lines: &[String]) -> Result<(), String> {
    let mut args = vec![];
    if let Some(ns) = ns {
        args.extend(["-n", ns]);
    }
    args.extend(["-batch", "-"]);
    let what = format!("configuring {}", ns.unwrap_or("the host"));
    run_stdin("ip", &args, &lines.join("\n"), &what)
}

/// Whether we are root (the lab needs namespaces and raw sockets).
pub fn require_root() -> Result<(), String> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return Err(
            "the lab needs root (network namespaces, raw sockets): run it with sudo".into(),
        );
    }
    Ok(())
}

/// CPU time (user + system) a process has used, seconds (0 if it is gone).
pub fn cpu_seconds(pid: u32) -> f64 {
    let (user, system) = cpu_user_system(pid);
    user + system
}

/// CPU seconds the whole machine has been busy, all CPUs together (user, nice, system, irq
/// and softirq time of /proc/stat; not idle, I/O wait or time stolen by the hypervisor).
/// A proxy's own figure leaves out kernel work done for it in another task's context (a
/// veth delivers a frame in its sender's softirq), and charges it with work done for others;
/// the machine's figure counts every cost once. `None` without /proc/stat.
pub fn machine_busy_seconds() -> Option<f64> {
    let stat = std::fs::read_to_string("/proc/stat").ok()?;
    let cpu = stat.lines().next()?.strip_prefix("cpu ")?;
    let f: Vec<f64> = cpu
        .split_whitespace()
        .map(|v| v.parse::<f64>().unwrap_or(0.0))
        .collect();
    // user nice system idle iowait irq softirq steal ...
    let busy: f64 = [0, 1, 2, 5, 6].iter().filter_map(|&i| f.get(i)).sum();
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    Some(busy / hz)
}

/// Resident memory of process `pid`, kB (None if it is gone).
pub fn rss_kb(pid: u32) -> Option<u64> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let l = s.lines().find(|l| l.starts_with("VmRSS:"))?;
    l.split_whitespace().nth(1)?.parse().ok()
}

/// (user, system) CPU seconds process `pid` has used; zeros if it is gone.
pub fn cpu_user_system(pid: u32) -> (f64, f64) {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return (0.0, 0.0);
    };
    // Fields after the parenthesised command name; utime and stime are the 12th and 13th.
    let rest = stat.rsplit_once(')').map(|(_, r)| r).unwrap_or("");
    let f: Vec<&str> = rest.split_whitespace().collect();
    let get = |i: usize| f.get(i).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    (get(11) / hz, get(12) / hz)
}

/// Raises this process's descriptor limit to `want` (the hard limit too, as root; failure
/// leaves the limit as it was): the lab's many-connection ends each need their own.
pub fn raise_fd_limit(want: u64) {
    let r = libc::rlimit {
        rlim_cur: want,
        rlim_max: want,
    };
    // SAFETY: setrlimit reads one rlimit.
    unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &r) };
}

/// A TCP listener on `port` of every address, with room for a burst of connections (a
/// backlog of 65 535): the lab's helper servers'.
pub fn listen_any(port: u16) -> Result<std::net::TcpListener, String> {
    let s = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None)
        .map_err(|e| e.to_string())?;
    let _ = s.set_reuse_address(true);
    s.bind(&std::net::SocketAddr::from(([0, 0, 0, 0], port)).into())
        .and_then(|_| s.listen(65535))
        .map_err(|e| format!("cannot listen on port {port}: {e}"))?;
    Ok(s.into())
}

/// Starts `cmd` (one of this program's hidden helper servers) with its output piped and
/// waits for the `ready` line it prints once listening; the `what` names it in errors. A
/// helper that says anything else is killed.
pub fn spawn_ready(mut cmd: Command, what: &str) -> Result<std::process::Child, String> {
    use std::io::BufRead;
    let mut c = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .map_err(|e| format!("cannot start the {what}: {e}"))?;
    let mut line = String::new();
    let out = c.stdout.take().expect("piped");
    std::io::BufReader::new(out)
        .read_line(&mut line)
        .map_err(|e| format!("the {what}: {e}"))?;
    if line.trim() != "ready" {
        let _ = c.kill();
        let _ = c.wait();
        return Err(format!("the {what} did not start: {line:?}"));
    }
    Ok(c)
}
