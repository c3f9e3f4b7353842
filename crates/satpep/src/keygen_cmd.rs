//! `satpep keygen`: credentials for the tunnel between two satpeps.

use clap::Args;
use std::path::PathBuf;

/// Make a private CA and certificates for the satpeps of one tunnel.
#[derive(Args, Debug)]
#[command(
    long_about = "Make the credentials a tunnel between satpeps needs: a private certificate \
authority for the deployment (DIR/ca.pem, DIR/ca.key) and, for each NAME, a certificate signed \
by it (DIR/NAME.pem, DIR/NAME.key). Keys are written mode 0600.

Each satpep gets ca.pem, its own NAME.pem and NAME.key. Both ends of a tunnel present their \
certificate and accept only a peer whose certificate the CA signed (mutual TLS 1.3); the \
terminal also checks that the gateway's certificate carries `tunnel.peer_name` (default \
\"gateway\"). Keep ca.key off the satpeps: it is only needed to add satpeps later, by running \
keygen again on the same DIR with new names.

    satpep keygen --dir /etc/satpep/tunnel terminal gateway"
)]
pub struct KeygenCmd {
    /// Directory for the files (created if missing).
    #[arg(long, default_value = ".")]
    dir: PathBuf,
    /// Names of the satpeps (certificate names; the terminal expects the gateway's to be
    /// "gateway" unless tunnel.peer_name says otherwise).
    #[arg(required = true)]
    names: Vec<String>,
    /// Replace existing certificates of these names.
    #[arg(long)]
    force: bool,
}

/// Runs `satpep keygen`.
pub fn main(c: KeygenCmd) -> Result<(), String> {
    let g = satpep_tunnel::keys::keygen(&c.dir, &c.names, c.force)?;
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
        println!("{n}: {} {}", pem.display(), key.display());
    }
    Ok(())
}
