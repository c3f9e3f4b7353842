//! A counting sink on a lab router: an nftables `netdev` ingress rule that counts and drops
//! test datagrams the moment they leave the link. Rates measured there are the link's alone,
//! not limited by how fast a receiving application can read on a small machine.

use crate::sys::{run_in, run_stdin_in};
use crate::topology::{Host, Lab};

const TABLE: &str = "satpep_sink";

/// An installed sink; removed when dropped.
pub struct Sink {
    ns: String,
}

impl Sink {
    /// Counts and drops UDP datagrams to `port` longer than 100 bytes arriving on `host`'s
    /// `to-link` interface (short ones, such as iperf3's few-byte handshake, pass).
    pub fn install(lab: &Lab, host: Host, port: u16) -> Result<Sink, String> {
        let ns = lab.ns(host);
        let rules = format!(
            "table netdev {TABLE} {{\n counter sink {{}}\n chain ingress {{ type filter hook ingress device \"to-link\" priority -500; udp dport {port} udp length > 100 counter name sink drop; }}\n}}\n"
        );
        run_stdin_in(&ns, "nft", &["-f", "-"], &rules, &format!("nft in {ns}"))?;
        Ok(Sink { ns })
    }

    /// (packets, bytes) counted so far; bytes exclude the 14-byte Ethernet header.
    pub fn read(&self) -> Result<(u64, u64), String> {
        let out = run_in(
            &self.ns,
            "nft",
            &["-j", "list", "counter", "netdev", TABLE, "sink"],
        )?;
        let v: serde_json::Value =
            serde_json::from_str(&out).map_err(|e| format!("nft output: {e}"))?;
        v["nftables"]
            .as_array()
            .and_then(|a| a.iter().find_map(|o| o.get("counter")))
            .and_then(|c| Some((c["packets"].as_u64()?, c["bytes"].as_u64()?)))
            .ok_or_else(|| "nft printed no counter".to_string())
    }
}

impl Drop for Sink {
    fn drop(&mut self) {
        let _ = run_in(&self.ns, "nft", &["delete", "table", "netdev", TABLE]);
    }
}
