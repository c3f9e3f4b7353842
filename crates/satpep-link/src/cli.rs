//! Command-line flags that describe a link, shared by `satpep link` and `satpep lab up`.
//!
//! Each per-direction setting has a form for both directions (`--rate`) and one per direction
//! (`--fwd-rate`, `--ret-rate`); the per-direction form wins. Layers apply in this order:
//! preset, `--config` file, flags.

use crate::config::{DirectionSpec, LinkConfig, LinkSpec, OutageSpec};
use crate::loss::{GilbertSpec, LossSpec, LOSS_KEYS};
use clap::Args;
use std::path::PathBuf;

/// A `--loss NAME:SPEC` flag: that one process, read when the flag is.
#[derive(Debug, Clone, PartialEq)]
pub struct LossFlag(LossSpec);

impl std::str::FromStr for LossFlag {
    type Err = String;
    fn from_str(s: &str) -> Result<LossFlag, String> {
        let (key, spec) = s.split_once(':').ok_or_else(|| {
            format!(
                "'{s}': expected NAME:SPEC, NAME one of {}",
                LOSS_KEYS.join(", ")
            )
        })?;
        let mut one = LossSpec::default();
        one.set(key.trim(), spec.trim())?;
        Ok(LossFlag(one))
    }
}

/// `spec` with `flags` overlaid in order.
fn with_loss_flags(mut spec: LossSpec, flags: &[LossFlag]) -> LossSpec {
    for f in flags {
        spec.overlay(&f.0);
    }
    spec
}

/// Flags describing the emulated link.
#[derive(Args, Debug, Clone, Default)]
pub struct LinkArgs {
    /// Start from a named link: geo, meo, leo, urke2011, bharadwaj1999, lawson2006, shao2002,
    /// vanzara2017 (`satpep link --list-presets` describes them).
    #[arg(long, value_name = "NAME", help_heading = "Link")]
    pub preset: Option<String>,
    /// Read link settings from a TOML file (sections [both], [forward], [return], [outage];
    /// see docs/link.md). Flags override it.
    #[arg(long, value_name = "FILE", help_heading = "Link")]
    pub config: Option<PathBuf>,
    /// Seed of the loss and jitter processes; one seed gives one loss pattern [default: 1].
    #[arg(long, value_name = "N", help_heading = "Link")]
    pub seed: Option<u64>,

    /// Rate of both directions in bit/s over whole frames plus overhead (e.g. 50Mbit, 1.544Mbit,
    /// 500kbit).
    #[arg(long, value_name = "RATE", help_heading = "Rate")]
    pub rate: Option<String>,
    /// Forward (gateway → terminal) rate.
    #[arg(long, value_name = "RATE", help_heading = "Rate")]
    pub fwd_rate: Option<String>,
    /// Return (terminal → gateway) rate.
    #[arg(long, value_name = "RATE", help_heading = "Rate")]
    pub ret_rate: Option<String>,
    /// Rate trace for both directions: lines of "<seconds> <rate>", step-wise, optional
    /// final "repeat".
    #[arg(long, value_name = "FILE", help_heading = "Rate")]
    pub rate_trace: Option<PathBuf>,
    /// Forward rate trace.
    #[arg(long, value_name = "FILE", help_heading = "Rate")]
    pub fwd_rate_trace: Option<PathBuf>,
    /// Return rate trace.
    #[arg(long, value_name = "FILE", help_heading = "Rate")]
    pub ret_rate_trace: Option<PathBuf>,
    /// Bytes added to every frame on the channel for framing/encapsulation [default: 0].
    #[arg(long, value_name = "BYTES", help_heading = "Rate")]
    pub overhead: Option<u32>,
    /// Forward per-frame overhead.
    #[arg(long, value_name = "BYTES", help_heading = "Rate")]
    pub fwd_overhead: Option<u32>,
    /// Return per-frame overhead.
    #[arg(long, value_name = "BYTES", help_heading = "Rate")]
    pub ret_overhead: Option<u32>,

    /// One-way propagation delay of both directions (e.g. 280ms) [default: 0ms].
    #[arg(long, value_name = "TIME", help_heading = "Delay")]
    pub delay: Option<String>,
    /// Forward one-way delay.
    #[arg(long, value_name = "TIME", help_heading = "Delay")]
    pub fwd_delay: Option<String>,
    /// Return one-way delay.
    #[arg(long, value_name = "TIME", help_heading = "Delay")]
    pub ret_delay: Option<String>,
    /// Delay trace for both directions: lines of "<seconds> <delay>", interpolated linearly,
    /// optional final "repeat".
    #[arg(long, value_name = "FILE", help_heading = "Delay")]
    pub delay_trace: Option<PathBuf>,
    /// Forward delay trace.
    #[arg(long, value_name = "FILE", help_heading = "Delay")]
    pub fwd_delay_trace: Option<PathBuf>,
    /// Return delay trace.
    #[arg(long, value_name = "FILE", help_heading = "Delay")]
    pub ret_delay_trace: Option<PathBuf>,
    /// Uniform jitter ± TIME added to the delay; frames keep their order unless --reorder.
    #[arg(long, value_name = "TIME", help_heading = "Delay")]
    pub jitter: Option<String>,
    /// Forward jitter.
    #[arg(long, value_name = "TIME", help_heading = "Delay")]
    pub fwd_jitter: Option<String>,
    /// Return jitter.
    #[arg(long, value_name = "TIME", help_heading = "Delay")]
    pub ret_jitter: Option<String>,
    /// Let jitter reorder frames.
    #[arg(long, help_heading = "Delay")]
    pub reorder: bool,

    /// Bottleneck queue of both directions, drop-tail: bytes (33KB), frames (100p) or share of
    /// the bandwidth-delay product (150%) [default: 100% BDP, at least 64 KiB].
    #[arg(long, value_name = "LIMIT", help_heading = "Queue")]
    pub queue: Option<String>,
    /// Forward queue limit.
    #[arg(long, value_name = "LIMIT", help_heading = "Queue")]
    pub fwd_queue: Option<String>,
    /// Return queue limit.
    #[arg(long, value_name = "LIMIT", help_heading = "Queue")]
    pub ret_queue: Option<String>,

    /// Bit error rate of both directions, in [0, 1); a frame of L bytes is lost with
    /// probability 1 − (1 − BER)^(8·L).
    #[arg(
        long,
        value_name = "BER",
        help_heading = "Loss",
        allow_negative_numbers = true
    )]
    pub ber: Option<f64>,
    /// Forward bit error rate.
    #[arg(
        long,
        value_name = "BER",
        help_heading = "Loss",
        allow_negative_numbers = true
    )]
    pub fwd_ber: Option<f64>,
    /// Return bit error rate.
    #[arg(
        long,
        value_name = "BER",
        help_heading = "Loss",
        allow_negative_numbers = true
    )]
    pub ret_ber: Option<f64>,
    /// Packet error rate of both directions, in [0, 1), whatever the frame size.
    #[arg(
        long,
        value_name = "PER",
        help_heading = "Loss",
        allow_negative_numbers = true
    )]
    pub per: Option<f64>,
    /// Forward packet error rate.
    #[arg(
        long,
        value_name = "PER",
        help_heading = "Loss",
        allow_negative_numbers = true
    )]
    pub fwd_per: Option<f64>,
    /// Return packet error rate.
    #[arg(
        long,
        value_name = "PER",
        help_heading = "Loss",
        allow_negative_numbers = true
    )]
    pub ret_per: Option<f64>,
    /// Gilbert–Elliott burst loss for both directions: p=GOOD→BAD,r=BAD→GOOD per frame,
    /// optional loss_bad= (default 1) and loss_good= (default 0).
    #[arg(long, value_name = "p=P,r=R[,..]", help_heading = "Loss")]
    pub gilbert: Option<GilbertSpec>,
    /// Forward Gilbert–Elliott burst loss.
    #[arg(long, value_name = "p=P,r=R[,..]", help_heading = "Loss")]
    pub fwd_gilbert: Option<GilbertSpec>,
    /// Return Gilbert–Elliott burst loss.
    #[arg(long, value_name = "p=P,r=R[,..]", help_heading = "Loss")]
    pub ret_gilbert: Option<GilbertSpec>,
    /// Any loss process of both directions by its name, as a link file's key: `ber:1e-6`,
    /// `per:0.01`, `gilbert:p=0.01,r=0.2`; repeatable. Applied after the flags above.
    #[arg(long, value_name = "NAME:SPEC", help_heading = "Loss")]
    pub loss: Vec<LossFlag>,
    /// Any forward loss process by its name (see --loss).
    #[arg(long, value_name = "NAME:SPEC", help_heading = "Loss")]
    pub fwd_loss: Vec<LossFlag>,
    /// Any return loss process by its name (see --loss).
    #[arg(long, value_name = "NAME:SPEC", help_heading = "Loss")]
    pub ret_loss: Vec<LossFlag>,

    /// Take the link down (both directions) every TIME ...
    #[arg(long, value_name = "TIME", help_heading = "Outages")]
    pub outage_every: Option<String>,
    /// ... for TIME each time ...
    #[arg(long, value_name = "TIME", help_heading = "Outages")]
    pub outage_duration: Option<String>,
    /// ... the first time at TIME after start [default: one period after start].
    #[arg(long, value_name = "TIME", help_heading = "Outages")]
    pub outage_start: Option<String>,
    /// A one-off outage FROM..TO after start (e.g. 10s..15s); repeatable.
    #[arg(long, value_name = "FROM..TO", help_heading = "Outages")]
    pub down: Vec<String>,
}

impl LinkArgs {
    /// The flags as one spec layer.
    pub fn flags_layer(&self) -> LinkSpec {
        macro_rules! dir {
            ($rate:ident, $rt:ident, $ov:ident, $d:ident, $dt:ident, $j:ident, $q:ident, $b:ident, $p:ident, $g:ident, $l:ident) => {
                DirectionSpec {
                    rate: self.$rate.clone(),
                    rate_trace: self.$rt.clone(),
                    overhead: self.$ov,
                    delay: self.$d.clone(),
                    delay_trace: self.$dt.clone(),
                    jitter: self.$j.clone(),
                    queue: self.$q.clone(),
                    loss: {
                        // Field by field: a process without flags of its own has --loss only.
                        let mut l = LossSpec::default();
                        l.ber = self.$b;
                        l.per = self.$p;
                        l.gilbert = self.$g;
                        with_loss_flags(l, &self.$l)
                    },
                    reorder: None,
                    path: None,
                    rate_schedule: None,
                    delay_schedule: None,
                    builtin_delay_trace: None,
                    builtin_rate_trace: None,
                }
            };
        }
        let mut both = dir!(
            rate,
            rate_trace,
            overhead,
            delay,
            delay_trace,
            jitter,
            queue,
            ber,
            per,
            gilbert,
            loss
        );
        if self.reorder {
            both.reorder = Some(true);
        }
        LinkSpec {
            preset: self.preset.clone(),
            seed: self.seed,
            both,
            forward: dir!(
                fwd_rate,
                fwd_rate_trace,
                fwd_overhead,
                fwd_delay,
                fwd_delay_trace,
                fwd_jitter,
                fwd_queue,
                fwd_ber,
                fwd_per,
                fwd_gilbert,
                fwd_loss
            ),
            ret: dir!(
                ret_rate,
                ret_rate_trace,
                ret_overhead,
                ret_delay,
                ret_delay_trace,
                ret_jitter,
                ret_queue,
                ret_ber,
                ret_per,
                ret_gilbert,
                ret_loss
            ),
            outage: OutageSpec {
                every: self.outage_every.clone(),
                duration: self.outage_duration.clone(),
                start: self.outage_start.clone(),
                down: self.down.clone(),
            },
        }
    }

    /// Preset, file and flags merged into one spec.
    pub fn spec(&self) -> Result<LinkSpec, String> {
        let file = match &self.config {
            Some(p) => {
                let text = std::fs::read_to_string(p)
                    .map_err(|e| format!("cannot read {}: {e}", p.display()))?;
                toml::from_str::<LinkSpec>(&text).map_err(|e| format!("{}: {e}", p.display()))?
            }
            None => LinkSpec::default(),
        };
        LinkSpec::layered(&[&file, &self.flags_layer()])
    }

    /// Validated link configuration.
    pub fn resolve(&self) -> Result<LinkConfig, String> {
        self.spec()?.resolve()
    }
}
