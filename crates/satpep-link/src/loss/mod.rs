//! Frame loss. A lost frame is one a receiver's FCS check would discard, so it still used the
//! channel; the caller charges its serialization time.
//!
//! Each loss process is one file in this folder, `NAME.rs`, implementing [`LossModel`], and
//! one line, `NAME => Type,`, in the `loss_models!` list below. That line gives it a key in every direction of a link file
//! (`[forward] NAME = …`), a place in scenario sweeps (`link.both.NAME`), the generic
//! `--loss NAME:SPEC` flags, its range checks, its words in the link's description and its
//! share of the long-run loss that the lab's physical limit and its accuracy check use.
//! Processes combine independently: a frame is lost if any of them loses it.

pub use ber::per_from_ber;
pub use gilbert::GilbertSpec;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};

/// One loss process.
pub trait LossModel: Copy + std::fmt::Debug + PartialEq + Serialize {
    /// The process as a user writes it: a TOML value, and (through `FromStr`) the text of a
    /// `--loss NAME:SPEC` flag.
    type Spec: Clone
        + std::fmt::Debug
        + PartialEq
        + Serialize
        + for<'de> Deserialize<'de>
        + std::str::FromStr<Err: std::fmt::Display>;
    /// Random state it keeps from frame to frame (`()` for a memoryless process).
    type State: Default;

    /// The checked process, or None when it would lose nothing; `key` (such as "forward
    /// ber") names it in errors.
    fn resolve(spec: &Self::Spec, key: &str) -> Result<Option<Self>, String>;
    /// Long-run loss probability of a `len`-byte frame.
    fn mean_loss(&self, len: u32) -> f64;
    /// Loss probability of the frame being sent (`len` bytes on the wire), moving `state` on
    /// with `u`, uniform in [0, 1): the frame's one state draw, shared by every process.
    fn frame_loss(&self, state: &mut Self::State, u: f64, len: u32) -> f64;
    /// Words for the link's description, e.g. "BER 1e-6".
    fn describe(&self) -> String;
}

/// `v` checked to be a probability, in [0, 1] or [0, 1); the error names `key`.
pub fn check_prob(key: &str, v: f64, upper_inclusive: bool) -> Result<f64, String> {
    let ok = v >= 0.0 && if upper_inclusive { v <= 1.0 } else { v < 1.0 };
    if !ok || !v.is_finite() {
        let range = if upper_inclusive { "[0, 1]" } else { "[0, 1)" };
        return Err(format!("{key} {v} is outside {range}"));
    }
    Ok(v)
}

/// `NAME => Type`: the process in file `NAME.rs`, its key `NAME`.
macro_rules! loss_models {
    ($($key:ident => $model:ident),+ $(,)?) => {
        $(
            mod $key;
            pub use $key::$model;
        )+

        /// A direction's loss processes as written by a user; every one optional, so layers
        /// (preset, file, flags) can be merged.
        #[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq)]
        pub struct LossSpec {
            $(
                #[doc = concat!("The `", stringify!($key), "` process.")]
                #[serde(skip_serializing_if = "Option::is_none")]
                pub $key: Option<<$model as LossModel>::Spec>,
            )+
        }

        /// The keys of every loss process.
        pub const LOSS_KEYS: &[&str] = &[$(stringify!($key)),+];

        impl LossSpec {
            /// Overlays `o`: each process `o` sets replaces this one's.
            pub fn overlay(&mut self, o: &LossSpec) {
                $( if o.$key.is_some() { self.$key = o.$key.clone(); } )+
            }

            /// Sets process `key` from a flag's text `spec`.
            pub fn set(&mut self, key: &str, spec: &str) -> Result<(), String> {
                match key {
                    $(stringify!($key) => {
                        self.$key = Some(spec.parse().map_err(|e| {
                            format!("{key}: cannot read '{spec}': {e}")
                        })?);
                    })+
                    other => {
                        return Err(format!(
                            "unknown loss process '{other}' (known: {})",
                            LOSS_KEYS.join(", ")
                        ))
                    }
                }
                Ok(())
            }

            /// The checked processes of direction `dir` ("forward" or "return").
            pub fn resolve(&self, dir: &str) -> Result<LossConfig, String> {
                Ok(LossConfig {
                    $($key: match &self.$key {
                        None => None,
                        Some(s) => <$model as LossModel>::resolve(
                            s,
                            &format!("{dir} {}", stringify!($key)),
                        )?,
                    },)+
                })
            }
        }

        /// A direction's checked loss processes (None: not configured).
        #[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
        pub struct LossConfig {
            $(
                #[doc = concat!("The `", stringify!($key), "` process.")]
                pub $key: Option<$model>,
            )+
        }

        impl LossConfig {
            /// Whether no loss process is configured.
            pub fn is_lossless(&self) -> bool {
                true $( && self.$key.is_none() )+
            }

            /// Long-run loss probability of a `len`-byte frame, every process combined.
            pub fn mean_loss(&self, len: u32) -> f64 {
                1.0 - (1.0 $( * (1.0 - self.$key.map_or(0.0, |m| m.mean_loss(len))) )+)
            }

            /// The processes in words, e.g. ", BER 1e-6, PER 0.01" (empty when lossless).
            pub fn describe(&self) -> String {
                let mut s = String::new();
                $( if let Some(m) = &self.$key { s += ", "; s += &m.describe(); } )+
                s
            }

            /// Probability that this frame survives every process.
            fn keep(&self, st: &mut States, u: f64, len: u32) -> f64 {
                1.0 $( * (1.0 - self.$key.map_or(0.0, |m| m.frame_loss(&mut st.$key, u, len))) )+
            }
        }

        /// Every process's state.
        #[derive(Default)]
        struct States {
            $( $key: <$model as LossModel>::State, )+
        }
    };
}

// The loss processes, in the order they are described and combined.
loss_models! {
    ber => Ber,
    per => Per,
    gilbert => Gilbert,
}

/// The random state of one direction's loss processes.
///
/// Exactly two draws are made per frame offered to it, whatever is configured, so one seed
/// gives one loss pattern for a given frame sequence.
pub struct LossState {
    rng: ChaCha8Rng,
    states: States,
}

impl LossState {
    /// A loss state seeded by `seed`; `stream` separates directions.
    pub fn new(seed: u64, stream: u64) -> LossState {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        rng.set_stream(stream);
        LossState {
            rng,
            states: States::default(),
        }
    }

    /// Decides whether a frame of `len` bytes (on the wire) is corrupted.
    pub fn lost(&mut self, cfg: &LossConfig, len: u32) -> bool {
        let u_err: f64 = self.rng.gen();
        let u_state: f64 = self.rng.gen();
        u_err >= cfg.keep(&mut self.states, u_state, len)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn same_seed_same_pattern() {
        let cfg = LossConfig {
            per: Some(Per { per: 0.1 }),
            ..Default::default()
        };
        let run = |seed| {
            let mut s = LossState::new(seed, 0);
            (0..1000).map(|_| s.lost(&cfg, 1000)).collect::<Vec<_>>()
        };
        assert_eq!(run(7), run(7));
        assert_ne!(run(7), run(8));
    }

    #[test]
    fn processes_combine_independently_and_are_set_by_name() {
        let mut spec = LossSpec::default();
        spec.set("ber", "1e-6").unwrap();
        spec.set("per", "0.01").unwrap();
        spec.set("gilbert", "p=0.01,r=0.2").unwrap();
        let e = spec.set("fade", "1").unwrap_err();
        assert!(
            e.contains("'fade'") && e.contains("ber, per, gilbert"),
            "{e}"
        );
        let e = spec.set("ber", "x").unwrap_err();
        assert!(e.starts_with("ber: cannot read 'x'"), "{e}");
        let cfg = spec.resolve("forward").unwrap();
        let want = 1.0 - (1.0 - per_from_ber(1e-6, 1500)) * 0.99 * (1.0 - 0.01 / 0.21);
        assert!((cfg.mean_loss(1500) - want).abs() < 1e-12);
        assert_eq!(
            cfg.describe(),
            ", BER 1e-6, PER 0.01, Gilbert-Elliott p=0.01 r=0.2 loss 0/1"
        );
        assert!(LossSpec::default().resolve("return").unwrap().is_lossless());
        // A zero rate is no process at all.
        let mut zero = LossSpec::default();
        zero.set("ber", "0").unwrap();
        assert!(zero.resolve("forward").unwrap().is_lossless());
    }
}
