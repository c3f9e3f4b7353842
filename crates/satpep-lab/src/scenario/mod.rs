//! Scenario runner: experiments declared in TOML (link, PEP, hosts, traffic, sweeps,
//! repetitions), run on one lab with real tools, and reported as CSV, JSON, plots, Markdown
//! and HTML. Presets reproduce the source documents' experiments.

pub mod access;
pub mod beside;
pub mod capture;
pub mod compare;
pub mod corpus;
pub mod corpus_report;
pub mod doc;
pub mod hosts;
pub mod kinds;
pub mod plot;
pub mod presets;
pub mod provenance;
pub mod report;
pub mod runner;
pub mod significance;
pub mod spec;
pub mod split_state;
pub mod star;
pub mod stats;
pub mod traffic;
pub mod tunnel_state;

pub use runner::{run, RunOptions};
pub use spec::Scenario;
