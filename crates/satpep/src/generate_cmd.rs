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
    /// One man page per command and subcommand (satpep.1, satpep-proxy.1, …) and the
    /// configuration file's, proxy.toml.5, into DIR.
    Man {
        /// Directory for the pages (created if missing).
        dir: PathBuf,
    },
    /// The completion script for SHELL, on stdout.
    Completions {
        /// bash, zsh, fish, elvish or powershell.
        shell: Shell,
    },
    /// The annotated proxy configuration (every key with its default or an example, from
    /// the code's own defaults: what the package installs as /etc/satpep/proxy.toml), on
    /// stdout.
    Config,
}

/// Runs `satpep generate`; `cli` is the whole command line's definition.
pub fn main(c: GenerateCmd, cli: clap::Command) -> Result<(), String> {
    match c.what {
        What::Man { dir } => {
            std::fs::create_dir_all(&dir)
                .map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
            clap_mangen::generate_to(cli, &dir)
                .map_err(|e| format!("cannot write man pages to {}: {e}", dir.display()))?;
            append_sections(&dir)?;
            let page = dir.join("proxy.toml.5");
            std::fs::write(&page, satpep_proxy::reference::man_page())
                .map_err(|e| format!("cannot write {}: {e}", page.display()))
        }
        What::Config => {
            print!("{}", satpep_proxy::reference::toml_text());
            Ok(())
        }
        What::Completions { shell } => {
            let mut cli = cli;
            clap_complete::generate(shell, &mut cli, "satpep", &mut std::io::stdout());
            Ok(())
        }
    }
}

/// Sections clap does not write, added to every page: EXIT STATUS and SEE ALSO; to
/// satpep-proxy(1) also FILES and SIGNALS (what an operator of a service looks for).
fn append_sections(dir: &std::path::Path) -> Result<(), String> {
    const EXIT: &str =
        ".SH \"EXIT STATUS\"\n0 on success (a proxy: a clean stop). 1 on an error, which \
the last line on stderr names (satpep: error: ...). 2 on a usage error in the command line.\n";
    const SEE_ALSO: &str = ".SH \"SEE ALSO\"\n\\fBsatpep\\fR(1), \\fBsatpep-proxy\\fR(1), \
\\fBsatpep-status\\fR(1), \\fBsatpep-keygen\\fR(1), \\fBsatpep-cc\\fR(1), \\fBsatpep-link\\fR(1), \
\\fBsatpep-lab\\fR(1), \\fBproxy.toml\\fR(5), \\fBnft\\fR(8), \\fBsystemctl\\fR(1); /usr/share/doc/satpep/docs/ \
(proxy.md, tunnel.md, cc.md, lab.md).\n";
    const PROXY: &str = ".SH FILES\n.TP\n/etc/satpep/proxy.toml\nThe configuration read when \
\\fB--config\\fR is not given (every key optional; the package installs an annotated example). \
Check a change with \\fBsatpep proxy --check\\fR.\n.TP\n/sys/fs/bpf/satpep/\nsatpep's pinned BPF \
congestion controls (\\fBsatpep cc load --pin\\fR).\n.TP\n/run/satpep/\nThe routes a proxy changed \
(initcwnd, initrwnd, mss), kept to restore them at exit or at the next start after a crash.\n.SH SIGNALS\n.TP\nSIGHUP\nRe-read the configuration and apply what \
can change without dropping connections (interception selection, limits, legs' options for \
new connections); a bad file is refused and the running configuration stays \
(systemctl reload satpep-proxy).\n.TP\nSIGTERM, SIGINT\nStop: new connections bypass the proxy \
and live ones may finish for proxy.drain (default 30 s); a second signal resets them at once. \
Everything installed (nftables table, policy routes) is removed.\n";
    let entries =
        std::fs::read_dir(dir).map_err(|e| format!("cannot read {}: {e}", dir.display()))?;
    for e in entries.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        if !(name.starts_with("satpep") && name.ends_with(".1")) {
            continue;
        }
        let path = e.path();
        let mut text = std::fs::read_to_string(&path)
            .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
        if name == "satpep-proxy.1" {
            text.push_str(PROXY);
        }
        text.push_str(EXIT);
        text.push_str(SEE_ALSO);
        std::fs::write(&path, text).map_err(|e| format!("cannot write {}: {e}", path.display()))?;
    }
    Ok(())
}
