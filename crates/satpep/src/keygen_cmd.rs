//! `satpep keygen`: credentials for the tunnel between satpeps, from one command for a lab to
//! a CA that signs each terminal's own request, with expiry and revocation, for a hub.

use clap::{Args, Subcommand};
use satpep_tunnel::authority::{self, Authority, DEFAULT_DAYS};
use std::path::PathBuf;

/// Make a private CA and certificates for the satpeps of a deployment.
#[derive(Args, Debug)]
#[command(
    args_conflicts_with_subcommands = true,
    subcommand_negates_reqs = true,
    long_about = "Make the credentials a tunnel between satpeps needs.

All in one (a lab, or one terminal and one gateway): a private certificate authority \
(DIR/ca.pem, DIR/ca.key, an empty revocation list DIR/crl.pem, the record DIR/issued.tsv) and, \
for each NAME, a key and a certificate signed by it (DIR/NAME.pem, DIR/NAME.key). Keys are \
written mode 0600. Run again on the same DIR to add satpeps.

    satpep keygen --dir /etc/satpep/tunnel terminal gateway

A hub, where each terminal's key never leaves it: on the terminal, `satpep keygen request \
NAME` writes NAME.key and NAME.csr; on the CA's machine, `satpep keygen sign NAME.csr` writes \
NAME.pem for it (valid --days, 365 unless told); `satpep keygen revoke NAME` revokes what was \
issued to NAME and rewrites crl.pem, which the gateway reads (tunnel.crl) at its start and at \
every reload (SIGHUP), closing that terminal's connection. `satpep keygen list` shows what \
the CA issued.

Each satpep gets ca.pem and its own NAME.pem and NAME.key. Both ends of a tunnel present \
their certificate and accept only a peer whose certificate the CA signed, unexpired and not \
revoked (mutual TLS 1.3); the terminal also checks that the gateway's certificate carries \
`tunnel.peer_name` (default \"gateway\"), and a gateway that lists `tunnel.terminals` admits \
only those names. Keep ca.key off the satpeps. NAME cannot be one of the verbs."
)]
pub struct KeygenCmd {
    #[command(subcommand)]
    verb: Option<Verb>,
    /// Directory for the files (created if missing).
    #[arg(long, default_value = ".")]
    dir: PathBuf,
    /// Names of the satpeps (certificate names; the terminal expects the gateway's to be
    /// "gateway" unless tunnel.peer_name says otherwise).
    #[arg(required = true)]
    names: Vec<String>,
    /// Days the certificates are valid (1 to 3650).
    #[arg(long, default_value_t = DEFAULT_DAYS)]
    days: u32,
    /// Replace existing certificates of these names.
    #[arg(long)]
    force: bool,
}

#[derive(Subcommand, Debug)]
enum Verb {
    /// On a satpep: make its key and a signing request (DIR/NAME.key, DIR/NAME.csr).
    Request {
        /// The satpep's name (its certificate's).
        name: String,
        /// Directory for the files.
        #[arg(long, default_value = ".")]
        dir: PathBuf,
        /// Replace an existing key and request.
        #[arg(long)]
        force: bool,
    },
    /// On the CA's machine: sign requests (writes NAME.pem for each into --out).
    Sign {
        /// Request files (from `satpep keygen request`).
        #[arg(required = true)]
        requests: Vec<PathBuf>,
        /// The CA's directory.
        #[arg(long, default_value = ".")]
        dir: PathBuf,
        /// Where the certificates go (default: the CA's directory).
        #[arg(long)]
        out: Option<PathBuf>,
        /// Days the certificates are valid (1 to 3650).
        #[arg(long, default_value_t = DEFAULT_DAYS)]
        days: u32,
        /// Replace existing certificates of these names.
        #[arg(long)]
        force: bool,
    },
    /// Revoke every certificate issued to each NAME and rewrite DIR/crl.pem.
    Revoke {
        /// Names of the satpeps.
        #[arg(required = true)]
        names: Vec<String>,
        /// The CA's directory.
        #[arg(long, default_value = ".")]
        dir: PathBuf,
    },
    /// List the certificates the CA issued: name, serial, expiry, revocation.
    List {
        /// The CA's directory.
        #[arg(long, default_value = ".")]
        dir: PathBuf,
        /// One JSON object per certificate, in an array.
        #[arg(long)]
        json: bool,
    },
}

/// Runs `satpep keygen`.
pub fn main(c: KeygenCmd) -> Result<(), String> {
    match c.verb {
        None => {
            authority::check_days(c.days)?;
            let g = satpep_tunnel::keys::keygen(&c.dir, &c.names, c.days, c.force)?;
            if g.new_ca {
                println!(
                    "new CA: {} (key {})",
                    g.ca.display(),
                    c.dir.join("ca.key").display()
                );
            } else {
                println!("using the CA in {}", c.dir.display());
            }
            for (n, pem, key) in g.nodes {
                println!("{n}: {} {} ({} days)", pem.display(), key.display(), c.days);
            }
        }
        Some(Verb::Request { name, dir, force }) => {
            let (key, csr) = authority::request(&dir, &name, force)?;
            println!(
                "{name}: key {} (stays here), request {}: have the CA sign it (satpep keygen sign {})",
                key.display(),
                csr.display(),
                csr.file_name().unwrap_or_default().to_string_lossy()
            );
        }
        Some(Verb::Sign {
            requests,
            dir,
            out,
            days,
            force,
        }) => {
            authority::check_days(days)?;
            let ca = Authority::open(&dir)?;
            let out = out.unwrap_or_else(|| dir.clone());
            for r in requests {
                let (name, pem) = ca.sign(&r, &out, days, force)?;
                println!("{name}: {} ({days} days)", pem.display());
            }
        }
        Some(Verb::Revoke { names, dir }) => {
            let ca = Authority::open(&dir)?;
            for n in names {
                let serials = ca.revoke(&n)?;
                println!(
                    "{n}: revoked {} (serial {}); {} lists it: reload the gateway (SIGHUP)",
                    if serials.len() == 1 {
                        "1 certificate".to_string()
                    } else {
                        format!("{} certificates", serials.len())
                    },
                    serials.join(", "),
                    ca.crl_pem().display()
                );
            }
        }
        Some(Verb::List { dir, json }) => {
            let ca = Authority::open(&dir)?;
            let index = ca.index()?;
            if json {
                let v: Vec<_> = index
                    .iter()
                    .map(|i| {
                        serde_json::json!({
                            "name": i.name,
                            "serial": i.serial,
                            "not_after": i.not_after,
                            "revoked": i.revoked,
                        })
                    })
                    .collect();
                println!("{}", serde_json::Value::Array(v));
            } else {
                println!(
                    "{:<24} {:<34} {:<22} revoked",
                    "name", "serial", "not after"
                );
                for i in index {
                    println!(
                        "{:<24} {:<34} {:<22} {}",
                        i.name,
                        i.serial,
                        i.not_after,
                        i.revoked.as_deref().unwrap_or("-")
                    );
                }
            }
        }
    }
    Ok(())
}
