//! Traffic kinds, one file each: what a cell runs across the link. Each kind is a struct of its
//! own keys (read from `[traffic]` with `kind = "NAME"`), its checks, its main metric and how
//! it runs. Adding a kind is adding its file and one line to the list below (CONTRIBUTING.md).

use super::spec::{CellSpec, Metric};
use super::traffic::RunRecord;
use crate::topology::Lab;
use serde::{Deserialize, Serialize};
use std::ops::Range;

/// What every traffic kind provides.
pub trait Kind {
    /// The figure its tables show and plots draw.
    fn metric(&self) -> Metric;
    /// Checks its keys against the rest of the cell, before any lab is built; an error
    /// names the key (without the `traffic.` prefix).
    fn check(&self, cell: &CellSpec) -> Result<(), String>;
    /// Server ports of its TCP connections (whose senders' sockets are sampled); by
    /// default HTTP's, which the lab's nginx serves. Empty: no TCP, nothing is sampled.
    fn ports(&self) -> Range<u16> {
        80..81
    }
    /// Whether it downloads (the server sends across the forward link).
    fn downloads(&self) -> bool {
        true
    }
    /// Runs one repetition on `lab` (set up for `cell`), filling `rec`: samples of the
    /// metric, failures and errors. `limit_bps` is the physical limit of the direction it
    /// uses (None on a bridged link); `tick(elapsed s)` reports progress. Only an interrupt is an `Err`.
    fn run(
        &self,
        lab: &mut Lab,
        cell: &CellSpec,
        rec: &mut RunRecord,
        limit_bps: Option<f64>,
        tick: &mut dyn FnMut(f64),
    ) -> Result<(), String>;
}

/// Declares the kinds: each `Variant => module` is a file `module.rs` holding the struct
/// `Variant`, which implements [`Kind`] and is named `kind = "variant"` in scenarios.
macro_rules! kinds {
    ($($variant:ident => $module:ident),* $(,)?) => {
        $(pub mod $module;)*

        /// Traffic of a cell: `[traffic]` with `kind` naming one of these (default bulk),
        /// and that kind's own keys; a key of another kind is an error.
        #[derive(Debug, Clone, PartialEq, Serialize)]
        #[serde(tag = "kind", rename_all = "lowercase")]
        pub enum Traffic {
            $(
                #[doc = concat!("`kind = \"", stringify!($module), "\"`.")]
                $variant($module::$variant),
            )*
        }

        impl Traffic {
            /// The kind, to run and check it.
            pub fn kind(&self) -> &dyn Kind {
                match self {
                    $(Traffic::$variant(k) => k,)*
                }
            }

            /// The kind's name in scenario files.
            pub fn name(&self) -> &'static str {
                match self {
                    $(Traffic::$variant(_) => stringify!($module),)*
                }
            }
        }

        // By hand, not serde's internally tagged enum: that buffers the table and loses the
        // path of a bad key inside it (`traffic: '2XB'` instead of `objects[1]: '2XB'`).
        impl<'de> Deserialize<'de> for Traffic {
            fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                use serde::de::Error;
                let mut t = toml::Table::deserialize(d)?;
                let kind = match t.remove("kind") {
                    None => "bulk".to_string(),
                    Some(toml::Value::String(s)) => s,
                    Some(v) => {
                        return Err(D::Error::custom(format!(
                            "kind: expected a string, found {}",
                            v.type_str()
                        )))
                    }
                };
                let located = |e: serde_path_to_error::Error<toml::de::Error>| {
                    let msg = e.inner().message().trim().to_string();
                    D::Error::custom(match e.path().to_string().as_str() {
                        "." => format!("{msg} (kind = \"{kind}\")"),
                        p => format!("{p}: {msg} (kind = \"{kind}\")"),
                    })
                };
                let rest = toml::Value::Table(t);
                match kind.as_str() {
                    $(stringify!($module) => serde_path_to_error::deserialize(rest)
                        .map(Traffic::$variant)
                        .map_err(located),)*
                    other => Err(D::Error::custom(format!(
                        "kind: unknown kind `{other}` (one of: {})",
                        [$(stringify!($module)),*].join(", ")
                    ))),
                }
            }
        }
    };
}

kinds! {
    Bulk => bulk,
    Http => http,
    Page => page,
    Interactive => interactive,
    Udp => udp,
    Ping => ping,
    Connections => connections,
    Fault => fault,
    Hub => hub,
}

impl Default for Traffic {
    fn default() -> Self {
        Traffic::Bulk(bulk::Bulk::default())
    }
}

impl Traffic {
    /// The bulk transfer's settings, if this is one.
    pub fn bulk(&self) -> Option<&bulk::Bulk> {
        match self {
            Traffic::Bulk(b) => Some(b),
            _ => None,
        }
    }
}

/// What a run does with an error: an interrupt ends the scenario (Err); anything else is
/// this run's failure, recorded with its reason.
pub(crate) fn failed_unless_interrupted(rec: &mut RunRecord, e: String) -> Result<(), String> {
    if e == "interrupted" {
        return Err(e);
    }
    rec.failures += 1;
    rec.errors.push(e);
    Ok(())
}

/// A count key within `lo..=hi`.
pub(crate) fn check_count(key: &str, v: u32, lo: u32, hi: u32) -> Result<(), String> {
    if !(lo..=hi).contains(&v) {
        return Err(format!("{key} = {v}: between {lo} and {hi}"));
    }
    Ok(())
}

fn one() -> u32 {
    1
}
