//! A packet capture of each run on the satellite side (`pcap = true` in a scenario): tcpdump
//! in the terminal's namespace on its link-facing interface, headers only, one file per run,
//! readable by Wireshark and tcptrace. (Not in the link's namespace: the emulator sends with
//! PACKET_QDISC_BYPASS, which packet taps there do not see, so only one direction showed.)

use crate::topology::{Host, Lab};
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::time::Duration;

/// Bytes kept of each frame: Ethernet, IP and TCP headers with options (QUIC's header in the
/// tunnel), not the payload.
pub const SNAPLEN: u32 = 128;

/// A running capture.
pub struct Capture {
    child: Child,
    path: PathBuf,
}

impl Capture {
    /// Starts capturing into `path` and waits until tcpdump listens (5 s at most).
    pub fn start(lab: &Lab, path: &Path) -> Result<Capture, String> {
        if let Some(d) = path.parent() {
            std::fs::create_dir_all(d)
                .map_err(|e| format!("cannot create {}: {e}", d.display()))?;
        }
        let mut child = lab
            .command(Host::Terminal, "tcpdump")
            // Immediate mode: libpcap's ring otherwise hands packets over a block at a
            // time, and a short run's only block is still pending when tcpdump stops.
            .args([
                "-i",
                "to-link",
                "-s",
                &SNAPLEN.to_string(),
                "-U",
                "--immediate-mode",
                "-n",
                "-Z",
                "root",
                "-w",
            ])
            .arg(path)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| format!("cannot start tcpdump (apt-get install tcpdump): {e}"))?;
        let stderr = child.stderr.take().expect("piped");
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut said = String::new();
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if line.contains("listening on") {
                    let _ = tx.send(Ok(()));
                    return;
                }
                said.push_str(&line);
                said.push(' ');
            }
            let _ = tx.send(Err(said));
        });
        match rx.recv_timeout(Duration::from_secs(5)) {
            Ok(Ok(())) => Ok(Capture {
                child,
                path: path.to_path_buf(),
            }),
            other => {
                let _ = child.kill();
                let _ = child.wait();
                Err(match other {
                    Ok(Err(said)) => format!("tcpdump failed: {}", said.trim()),
                    _ => "tcpdump did not start listening within 5 s".into(),
                })
            }
        }
    }

    /// Stops the capture (tcpdump writes out what it holds on SIGTERM); returns the file.
    pub fn stop(mut self) -> PathBuf {
        // The last frames (the final ACKs) leave the link a moment after the tools end.
        std::thread::sleep(Duration::from_millis(200));
        // SAFETY: signalling our own child, not yet reaped.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        let _ = self.child.wait();
        self.path
    }
}
