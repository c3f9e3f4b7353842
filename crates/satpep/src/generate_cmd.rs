//! `satpep generate`: man pages and shell completions, written from the command line's own
//! definition so they never drift from `--help` (the `.deb` ships them; scripts/package.sh).

use clap::{Args, Subcommand};
use clap_complete::Shell;
use std::path::PathBuf;

/// Write man pages or shell completions.
#[derive(Args, Debug)]
#[command(
    long_about = "Write satpep's man pages or shell completions, generated from the same \
definition as --help. Packagers run it; scripts/package.sh does for the .deb.

    satpep generate man /usr/share/man/man1
    satpep generate completions bash > /usr/share/bash-completion/completions/satpep"
)]
pub struct GenerateCmd {
    #[command(subcommand)]
    what: What,
}

#[derive(Subcommand, Debug)]
enum What {
    /// One man page per command and subcommand (satpep.1, satpep-proxy.1, …) into DIR.
    Man {
        /// Directory for the pages (created if missing).
        dir: PathBuf,
    },
    /// The completion script for SHELL, on stdout.
    Completions {
        /// bash, zsh, fish, elvish or powershell.
        shell: Shell,
    },
}

/// Runs `satpep generate`; `cli` is the whole command line's definition.
pub fn main(c: GenerateCmd, cli: clap::Command) -> Result<(), String> {
    match c.what {
        What::Man { dir } => {
            std::fs::create_dir_all(&dir)
                .map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
            clap_mangen::generate_to(cli, &dir)
                .map_err(|e| format!("cannot write man pages to {}: {e}", dir.display()))
        }
        What::Completions { shell } => {
            let mut cli = cli;
            clap_complete::generate(shell, &mut cli, "satpep", &mut std::io::stdout());
            Ok(())
        }
    }
}
