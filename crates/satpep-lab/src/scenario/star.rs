//! `[star]`: a cell whose lab is a star (`satpep lab up --terminals N`): N terminals, each with
//! its own client and proxy, share the emulated forward carrier to one gateway. Some
//! terminals may have a forward link of their own (`[[star.path]]`): their modulation and
//! coding (a rate, or a fade's schedule), their losses, their delay. The lab turns each into
//! a path of the emulator's shared queue (`[[forward.path]]`) that matches the terminal's
//! addresses, so a scenario names terminals, never addresses.

use crate::topology::{site, MAX_TERMINALS};
use satpep_link::config::PathSpec;
use serde::{Deserialize, Serialize};
use toml::Table;

/// The keys a `[[star.path]]` may set beside `terminals`: a path's own (its `hosts` are the
/// terminals').
const PATH_KEYS: [&str; 3] = ["delay", "rate", "rate_schedule"];

/// A star of terminals on one carrier.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Star {
    /// Terminals, 1 (the line: no star) to [`MAX_TERMINALS`].
    #[serde(default = "one")]
    pub terminals: u16,
    /// Terminals whose forward link is their own.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub path: Vec<StarPath>,
}

/// Some terminals' own forward link.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct StarPath {
    /// The terminals (1 to `star.terminals`) it is for.
    pub terminals: Vec<u16>,
    /// A forward path's keys: `rate` or `rate_schedule` (their modcod), `delay`, and the
    /// loss processes (`ber`, `per`, `gilbert`).
    #[serde(flatten)]
    pub link: Table,
}

fn one() -> u16 {
    1
}

impl Default for Star {
    fn default() -> Self {
        Star {
            terminals: 1,
            path: Vec::new(),
        }
    }
}

impl Star {
    /// The plain line: one terminal, the link as written (left out of plans, so results
    /// directories made before stars existed resume).
    pub fn is_line(&self) -> bool {
        *self == Star::default()
    }

    /// Checks the terminals' count and every path's terminals and keys.
    pub fn check(&self) -> Result<(), String> {
        if !(1..=MAX_TERMINALS).contains(&self.terminals) {
            return Err(format!(
                "star.terminals = {}: between 1 and {MAX_TERMINALS}",
                self.terminals
            ));
        }
        self.paths().map(|_| ())
    }

    /// The emulator's forward paths for the terminals that have their own link: each
    /// matches its terminal's client subnets and satellite addresses (a split or
    /// end-to-end flow is addressed to the client, a tunnel's datagrams to the terminal).
    pub fn paths(&self) -> Result<Vec<PathSpec>, String> {
        let mut out = Vec::new();
        let mut seen = Vec::new();
        for (i, p) in self.path.iter().enumerate() {
            let at = format!("star.path[{i}]");
            if p.terminals.is_empty() {
                return Err(format!("{at}.terminals: name at least one terminal"));
            }
            for key in p.link.keys() {
                let known = PATH_KEYS.contains(&key.as_str())
                    || satpep_link::loss::LOSS_KEYS.contains(&key.as_str());
                if !known {
                    return Err(format!(
                        "{at}.{key}: not a key of a terminal's link (terminals, {}, {})",
                        PATH_KEYS.join(", "),
                        satpep_link::loss::LOSS_KEYS.join(", ")
                    ));
                }
            }
            for &k in &p.terminals {
                if !(1..=self.terminals).contains(&k) {
                    return Err(format!(
                        "{at}.terminals: {k} is not a terminal of this star (1 to {})",
                        self.terminals
                    ));
                }
                if seen.contains(&k) {
                    return Err(format!(
                        "{at}.terminals: terminal {k} already has a link of its own"
                    ));
                }
                seen.push(k);
                let s = site(k);
                let mut t = p.link.clone();
                t.insert(
                    "hosts".into(),
                    toml::Value::Array(
                        [s.client_net_v4, s.client_net_v6, s.sat_v4, s.sat_v6]
                            .into_iter()
                            .map(toml::Value::String)
                            .collect(),
                    ),
                );
                let path: PathSpec = toml::Value::Table(t)
                    .try_into()
                    .map_err(|e: toml::de::Error| format!("{at}: {}", e.message().trim()))?;
                out.push(path);
            }
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn star(text: &str) -> Star {
        toml::from_str(text).unwrap()
    }

    #[test]
    fn a_terminals_own_link_matches_its_addresses_alone() {
        let s = star("terminals = 4\n[[path]]\nterminals = [3, 4]\nrate = '5Mbit'\nber = 1e-6\n");
        s.check().unwrap();
        let p = s.paths().unwrap();
        assert_eq!(p.len(), 2);
        assert_eq!(p[0].rate.as_deref(), Some("5Mbit"));
        assert!(p[0].loss.ber.is_some());
        let t3 = site(3);
        assert_eq!(
            p[0].hosts,
            vec![t3.client_net_v4, t3.client_net_v6, t3.sat_v4, t3.sat_v6]
        );
        assert!(p[1].hosts.contains(&site(4).client_net_v4));
        assert!(Star::default().is_line() && !s.is_line());
    }

    #[test]
    fn bad_star_settings_are_refused_with_the_key_named() {
        let e = star("terminals = 0").check().unwrap_err();
        assert!(e.contains("star.terminals = 0"), "{e}");
        let e = star("terminals = 3\n[[path]]\nterminals = [4]\nrate = '1Mbit'\n")
            .check()
            .unwrap_err();
        assert!(
            e.contains("star.path[0].terminals: 4 is not a terminal"),
            "{e}"
        );
        let e = star("terminals = 3\n[[path]]\nterminals = [2]\nqueue = '10ms'\n")
            .check()
            .unwrap_err();
        assert!(e.contains("star.path[0].queue: not a key"), "{e}");
        let e = star(
            "terminals = 3\n[[path]]\nterminals = [2]\nrate = '1Mbit'\n\
             [[path]]\nterminals = [2]\nber = 1e-6\n",
        )
        .check()
        .unwrap_err();
        assert!(
            e.contains("star.path[1].terminals: terminal 2 already"),
            "{e}"
        );
        let e = star("terminals = 2\n[[path]]\nterminals = [2]\nrate = 5\n")
            .check()
            .unwrap_err();
        assert!(e.contains("star.path[0]"), "{e}");
    }
}
