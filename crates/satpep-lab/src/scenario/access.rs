//! The client's access link: the terrestrial hop between the client and its router (the
//! terminal), which the lab otherwise leaves as fast as a veth goes. A cell may give it a
//! rate (a token bucket on both of its ends) and congest it with flood pings from the client
//! to the terminal, as Bharadwaj 1999 §5.2 did to put the bottleneck downstream of the
//! satellite hop (Tables 5.11-5.12: two flood pings of 1500-byte packets on 10 Mbit/s
//! Ethernet). The thesis's Ethernet was a shared medium: `duplex = "half"` gives both
//! directions one token bucket (an `ifb` device in the terminal that both directions of its
//! client-side interface are redirected through), so echo replies and requests take the
//! data's and the ACKs' time as they did there.

use super::spec::Size;
use crate::topology::{Host, Lab, CLIENT_DEV, TERMINAL_CLIENT_DEV, TERMINAL_CLIENT_V4};
use serde::{Deserialize, Serialize};
use std::process::{Child, Stdio};

/// Echo payload that makes 1500-byte IP packets (the thesis's).
const PING_PAYLOAD: &str = "1472";

/// The terminal's `ifb` device that carries both directions of a half-duplex access link.
const SHARED_DEV: &str = "access0";

/// Whether the access link's two directions have a rate each or share one.
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum Duplex {
    /// Each direction has the whole rate (switched Ethernet, a modem's two directions).
    #[default]
    Full,
    /// Both directions share the rate (a shared medium: hub Ethernet, Wi-Fi).
    Half,
}

impl Duplex {
    fn is_full(&self) -> bool {
        *self == Duplex::Full
    }
}

/// The client's access link in a cell (`access = { rate = "10Mbit", pings = 2 }`).
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Access {
    /// Rate each way, e.g. "10Mbit"; unset, the link is a plain veth.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rate: Option<String>,
    /// Its queue each way (default 100 full frames, a router's interface queue); in half
    /// duplex, the one queue both directions share.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub queue: Option<Size>,
    /// "full" (default): the rate each way; "half": both directions share it.
    #[serde(default, skip_serializing_if = "Duplex::is_full")]
    pub duplex: Duplex,
    /// Flood pings (`ping -f`, 1500-byte packets) from the client to the terminal while
    /// each run lasts: they congest the access link.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub pings: u32,
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

impl Access {
    /// Nothing set: the lab's plain access link (left out of plans).
    pub fn is_none(&self) -> bool {
        *self == Access::default()
    }

    /// Whether `other` sets the link itself (rate, queue and duplex) as this does; the
    /// pings are each run's own.
    pub fn same_link(&self, other: &Access) -> bool {
        self.rate == other.rate && self.queue == other.queue && self.duplex == other.duplex
    }

    /// The rate in bit/s, if set.
    pub fn rate_bps(&self) -> Result<Option<f64>, String> {
        self.rate
            .as_deref()
            .map(|r| satpep_link::units::parse_rate(r).map_err(|e| format!("access.rate: {e}")))
            .transpose()
    }

    /// Checks what can be checked before a lab exists.
    pub fn check(&self) -> Result<(), String> {
        if let Some(bps) = self.rate_bps()? {
            if !(64e3..=10e9).contains(&bps) {
                return Err(format!(
                    "access.rate '{}': between 64 kbit/s and 10 Gbit/s",
                    self.rate.as_deref().unwrap_or_default()
                ));
            }
        }
        if let Some(q) = &self.queue {
            if self.rate.is_none() {
                return Err("access.queue: only with access.rate (a veth has no queue)".into());
            }
            if !(3028..=1 << 30).contains(&q.bytes()) {
                return Err(format!("access.queue '{q}': between two frames and 1 GB"));
            }
        }
        if self.duplex == Duplex::Half && self.rate.is_none() {
            return Err("access.duplex = \"half\": only with access.rate".into());
        }
        if self.pings > 8 {
            return Err(format!("access.pings = {}: at most 8", self.pings));
        }
        Ok(())
    }

    /// Sets the access link's rate on both its ends (or on the terminal's shared device in
    /// half duplex), or takes it away: a lab serves cells with and without one (the runner
    /// calls it when a cell's link differs from the last).
    pub fn apply(&self, lab: &Lab) -> Result<(), String> {
        // From the plain veth each time: the last cell may have set either kind.
        let quiet = |host, args: &[&str]| {
            let _ = lab
                .command(host, args[0])
                .args(&args[1..])
                .stderr(Stdio::null())
                .status();
        };
        quiet(
            Host::Client,
            &["tc", "qdisc", "del", "dev", CLIENT_DEV, "root"],
        );
        quiet(
            Host::Terminal,
            &["tc", "qdisc", "del", "dev", TERMINAL_CLIENT_DEV, "root"],
        );
        quiet(
            Host::Terminal,
            &["tc", "qdisc", "del", "dev", TERMINAL_CLIENT_DEV, "clsact"],
        );
        quiet(Host::Terminal, &["ip", "link", "del", SHARED_DEV]);
        let Some(bps) = self.rate_bps()? else {
            return Ok(());
        };
        let limit = self
            .queue
            .as_ref()
            .map_or(100 * 1514, Size::bytes)
            .to_string();
        // A burst of a few frames at least, or what the rate sends in 1 ms: tbf refuses a
        // burst below one frame, and GSO bursts are split by it.
        let burst = ((bps / 8e3) as u64).max(4 * 1514).to_string();
        let rate = format!("{}bit", bps.round() as u64);
        let words = |t: String| t.split(' ').map(String::from).collect::<Vec<_>>();
        let tbf = |dev: &str| {
            words(format!(
                "qdisc replace dev {dev} root tbf rate {rate} burst {burst} limit {limit}"
            ))
        };
        let steps: Vec<(Host, &str, Vec<String>)> = match self.duplex {
            Duplex::Full => vec![
                (Host::Client, "tc", tbf(CLIENT_DEV)),
                (Host::Terminal, "tc", tbf(TERMINAL_CLIENT_DEV)),
            ],
            Duplex::Half => {
                // u32 matching everything: the one classifier every kernel here has.
                let redirect = |hook: &str| {
                    words(format!(
                        "filter add dev {TERMINAL_CLIENT_DEV} {hook} protocol all u32 match u32 0 0 action mirred egress redirect dev {SHARED_DEV}"
                    ))
                };
                vec![
                    (
                        Host::Terminal,
                        "ip",
                        words(format!("link add {SHARED_DEV} type ifb")),
                    ),
                    (
                        Host::Terminal,
                        "ip",
                        words(format!("link set {SHARED_DEV} up")),
                    ),
                    (Host::Terminal, "tc", tbf(SHARED_DEV)),
                    (
                        Host::Terminal,
                        "tc",
                        words(format!("qdisc add dev {TERMINAL_CLIENT_DEV} clsact")),
                    ),
                    (Host::Terminal, "tc", redirect("ingress")),
                    (Host::Terminal, "tc", redirect("egress")),
                ]
            }
        };
        for (host, prog, args) in steps {
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            lab.run_in(host, prog, &args)
                .map_err(|e| format!("access.rate: {e}"))?;
        }
        Ok(())
    }

    /// Starts the flood pings; they stop when the returned value is dropped.
    pub fn start_pings(&self, lab: &Lab) -> Result<Pings, String> {
        let mut children = Pings(Vec::new());
        for _ in 0..self.pings {
            let child = lab
                .command(Host::Client, "ping")
                .args(["-f", "-q", "-s", PING_PAYLOAD, TERMINAL_CLIENT_V4])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .map_err(|e| format!("access.pings: cannot start ping: {e}"))?;
            children.0.push(child);
        }
        Ok(children)
    }
}

/// Running flood pings, stopped on drop.
pub struct Pings(Vec<Child>);

impl Pings {
    /// Pings that ended on their own (a flood ping runs until stopped: one that ended
    /// could not send).
    pub fn ended(&mut self) -> usize {
        self.0
            .iter_mut()
            .map(|c| c.try_wait())
            .filter(|w| matches!(w, Ok(Some(_))))
            .count()
    }
}

impl Drop for Pings {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bad_access_settings_are_named() {
        let a = |t: &str| -> Access { toml::from_str(t).unwrap() };
        assert!(a("rate = \"10Mbit\"\npings = 2").check().is_ok());
        let e = a("rate = \"fast\"").check().unwrap_err();
        assert!(e.contains("access.rate"), "{e}");
        let e = a("rate = \"10kbit\"").check().unwrap_err();
        assert!(e.contains("between 64 kbit/s"), "{e}");
        let e = a("queue = \"100KB\"").check().unwrap_err();
        assert!(e.contains("only with access.rate"), "{e}");
        let e = a("duplex = \"half\"").check().unwrap_err();
        assert!(e.contains("only with access.rate"), "{e}");
        assert!(toml::from_str::<Access>("rate = \"1Mbit\"\nduplex = \"quarter\"").is_err());
        let half = a("rate = \"1Mbit\"\nduplex = \"half\"");
        assert!(half.check().is_ok() && !half.same_link(&a("rate = \"1Mbit\"")));
        let e = a("pings = 9").check().unwrap_err();
        assert!(e.contains("at most 8"), "{e}");
        assert!(toml::from_str::<Access>("speed = \"1Mbit\"").is_err());
        assert!(Access::default().is_none());
    }

    /// A part's access link reaches its cells, and a slower one than the satellite link is
    /// the physical limit.
    #[test]
    fn a_part_s_access_link_reaches_its_cells_and_their_limit() {
        let text = "name = \"a\"\nduration = \"10s\"\nlink.both = { rate = \"20Mbit\", delay = \"250ms\" }\n[[part]]\nname = \"p\"\naccess = { rate = \"10Mbit\", pings = 2 }\n[[part.config]]\nname = \"e2e\"\n[[part]]\nname = \"q\"\n[[part.config]]\nname = \"e2e\"\n";
        let sc = crate::scenario::Scenario::parse(text, false).unwrap();
        let (with, without) = (&sc.cells[0].spec, &sc.cells[1].spec);
        assert_eq!(with.access.pings, 2);
        assert!(without.access.is_none());
        let limit = |s| crate::scenario::runner::tcp_limit_bps(s).unwrap().unwrap();
        let (a, b) = (limit(with), limit(without));
        assert!((9.4e6..9.6e6).contains(&a), "{a}");
        assert!((18.8e6..19.2e6).contains(&b), "{b}");
        // Half duplex: the ACKs share the rate (a 66-byte frame per two 1514-byte ones).
        let mut half = with.clone();
        half.access.duplex = Duplex::Half;
        let h = limit(&half);
        assert!((a * 0.975..a * 0.985).contains(&h), "{h} against {a}");
    }
}
