//! Credentials for the tunnel: a private certificate authority per deployment, and one
//! certificate per satpep, signed by it. Both ends present their certificate and accept only
//! a peer whose certificate chains to the deployment's CA (mutual TLS 1.3); the terminal
//! also checks the gateway's name. Nothing else is trusted: not the system's roots.

use crate::admission::Admission;
use crate::authority::Authority;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use std::fs;
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// ALPN protocol of the tunnel; a peer speaking anything else is refused in the handshake.
pub const ALPN: &[u8] = b"satpep/1";

/// Whether `name` can be a certificate name (a DNS-style label sequence).
pub fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 63
        && name
            .split('.')
            .all(|l| !l.is_empty() && l.chars().all(|c| c.is_ascii_alphanumeric() || c == '-'))
}

pub(crate) fn write_private(path: &Path, text: &str) -> Result<(), String> {
    let mut f = fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)
        .map_err(|e| format!("cannot write {}: {e}", path.display()))?;
    f.write_all(text.as_bytes())
        .map_err(|e| format!("cannot write {}: {e}", path.display()))
}

pub(crate) fn write_public(path: &Path, text: &str) -> Result<(), String> {
    fs::write(path, text).map_err(|e| format!("cannot write {}: {e}", path.display()))
}

/// Files written by [`keygen`].
#[derive(Debug, Clone)]
pub struct Generated {
    /// The CA certificate (give it to every satpep).
    pub ca: PathBuf,
    /// Certificate and key per name.
    pub nodes: Vec<(String, PathBuf, PathBuf)>,
    /// A new CA was made (rather than an existing one used).
    pub new_ca: bool,
}

/// Writes into `dir` a CA (`ca.pem`, `ca.key`, an empty `crl.pem`), unless one is there
/// already, and for each name a key and a certificate signed by it for `days` (`NAME.pem`,
/// `NAME.key`). Keys are mode 0600. Existing node files are not overwritten unless `force`.
pub fn keygen(dir: &Path, names: &[String], days: u32, force: bool) -> Result<Generated, String> {
    if names.is_empty() {
        return Err("name at least one satpep (e.g. terminal gateway)".into());
    }
    for n in names {
        crate::authority::check_name(n)?;
    }
    let (ca, new_ca) = Authority::open_or_make(dir)?;
    let mut nodes = Vec::new();
    for n in names {
        let (pem, key) = ca.make_node(n, days, force)?;
        nodes.push((n.clone(), pem, key));
    }
    Ok(Generated {
        ca: ca.ca_pem(),
        nodes,
        new_ca,
    })
}

/// One satpep's credentials, loaded.
#[derive(Debug)]
pub struct Credentials {
    /// Certificates that peers must chain to.
    pub roots: Arc<rustls::RootCertStore>,
    /// This satpep's certificate chain.
    pub chain: Vec<CertificateDer<'static>>,
    /// Its private key.
    pub key: PrivateKeyDer<'static>,
}

fn certs(path: &Path, key: &str) -> Result<Vec<CertificateDer<'static>>, String> {
    let text = fs::read(path).map_err(|e| format!("{key}: cannot read {}: {e}", path.display()))?;
    let v: Result<Vec<_>, _> = rustls_pemfile::certs(&mut text.as_slice()).collect();
    let v = v.map_err(|e| format!("{key}: {}: {e}", path.display()))?;
    if v.is_empty() {
        return Err(format!(
            "{key}: {} holds no PEM certificate",
            path.display()
        ));
    }
    Ok(v)
}

impl Credentials {
    /// Loads the CA certificate, this satpep's certificate and its key; errors name the
    /// config key (`tunnel.ca`, `tunnel.cert`, `tunnel.key`) and the file.
    pub fn load(ca: &Path, cert: &Path, key: &Path) -> Result<Credentials, String> {
        let mut roots = rustls::RootCertStore::empty();
        for c in certs(ca, "tunnel.ca")? {
            roots
                .add(c)
                .map_err(|e| format!("tunnel.ca: {}: {e}", ca.display()))?;
        }
        let chain = certs(cert, "tunnel.cert")?;
        let text =
            fs::read(key).map_err(|e| format!("tunnel.key: cannot read {}: {e}", key.display()))?;
        let key = rustls_pemfile::private_key(&mut text.as_slice())
            .map_err(|e| format!("tunnel.key: {}: {e}", key.display()))?
            .ok_or_else(|| format!("tunnel.key: {} holds no PEM private key", key.display()))?;
        Ok(Credentials {
            roots: Arc::new(roots),
            chain,
            key,
        })
    }

    /// A secret derived from this satpep's private key, stable across restarts: the key of
    /// QUIC's stateless resets. A gateway that restarted (or crashed and came back) answers
    /// packets of a connection it no longer knows with a reset the terminal can verify, so the
    /// terminal drops the dead connection at once instead of waiting out an outage.
    pub fn reset_secret(&self) -> [u8; 32] {
        let mut ctx = ring::digest::Context::new(&ring::digest::SHA256);
        ctx.update(b"satpep stateless reset v1");
        ctx.update(self.key.secret_der());
        ctx.finish()
            .as_ref()
            .try_into()
            .expect("SHA-256 is 32 bytes")
    }

    fn provider() -> Arc<rustls::crypto::CryptoProvider> {
        Arc::new(rustls::crypto::ring::default_provider())
    }

    /// TLS for the gateway: TLS 1.3 only, a client certificate from the CA required and
    /// admitted by `admission` (not revoked, listed if names are listed), no 0-RTT (early
    /// data could be replayed into a new flow).
    pub fn server_tls(&self, admission: &Arc<Admission>) -> Result<rustls::ServerConfig, String> {
        let verifier = admission.verifier(self.roots.clone(), Self::provider())?;
        let mut c = rustls::ServerConfig::builder_with_provider(Self::provider())
            .with_protocol_versions(&[&rustls::version::TLS13])
            .map_err(|e| e.to_string())?
            .with_client_cert_verifier(verifier)
            .with_single_cert(self.chain.clone(), self.key.clone_key())
            .map_err(|e| format!("tunnel.cert/tunnel.key: {e}"))?;
        c.alpn_protocols = vec![ALPN.to_vec()];
        c.max_early_data_size = 0;
        Ok(c)
    }

    /// TLS for the terminal: TLS 1.3 only, the gateway's certificate must chain to the CA and
    /// carry the expected name; this satpep's certificate is presented. No 0-RTT.
    pub fn client_tls(&self) -> Result<rustls::ClientConfig, String> {
        let mut c = rustls::ClientConfig::builder_with_provider(Self::provider())
            .with_protocol_versions(&[&rustls::version::TLS13])
            .map_err(|e| e.to_string())?
            .with_root_certificates(self.roots.clone())
            .with_client_auth_cert(self.chain.clone(), self.key.clone_key())
            .map_err(|e| format!("tunnel.cert/tunnel.key: {e}"))?;
        c.alpn_protocols = vec![ALPN.to_vec()];
        c.enable_early_data = false;
        Ok(c)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::authority::DEFAULT_DAYS;
    use rustls::client::danger::ServerCertVerifier;

    fn tmp(tag: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("satpep-keys-{tag}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&d);
        d
    }

    #[test]
    fn keygen_writes_a_ca_and_nodes_and_adds_nodes_later() {
        let d = tmp("gen");
        let g = keygen(
            &d,
            &["terminal".into(), "gateway".into()],
            DEFAULT_DAYS,
            false,
        )
        .unwrap();
        assert!(g.new_ca);
        let mode = |p: &Path| fs::metadata(p).unwrap().permissions().mode() & 0o777;
        use std::os::unix::fs::PermissionsExt;
        assert_eq!(mode(&d.join("ca.key")), 0o600);
        assert_eq!(mode(&d.join("terminal.key")), 0o600);
        let c = Credentials::load(&g.ca, &d.join("gateway.pem"), &d.join("gateway.key")).unwrap();
        // The gateway's certificate carries its name, and only it.
        let sv = rustls::client::WebPkiServerVerifier::builder_with_provider(
            c.roots.clone(),
            Arc::new(rustls::crypto::ring::default_provider()),
        )
        .build()
        .unwrap();
        let name = |n: &str| rustls::pki_types::ServerName::try_from(n.to_string()).unwrap();
        let now = rustls::pki_types::UnixTime::now();
        sv.verify_server_cert(&c.chain[0], &[], &name("gateway"), &[], now)
            .unwrap();
        assert!(sv
            .verify_server_cert(&c.chain[0], &[], &name("terminal"), &[], now)
            .is_err());
        c.server_tls(&Arc::new(Admission::default())).unwrap();
        c.client_tls().unwrap();
        // A second run reuses the CA and refuses to overwrite.
        let e = keygen(&d, &["gateway".into()], DEFAULT_DAYS, false).unwrap_err();
        assert!(e.contains("exists already"), "{e}");
        let g2 = keygen(&d, &["terminal2".into()], DEFAULT_DAYS, false).unwrap();
        assert!(!g2.new_ca);
        // A node added later chains to the original CA.
        let later = certs(&d.join("terminal2.pem"), "x").unwrap();
        let roots = Credentials::load(&g.ca, &g.ca, &d.join("ca.key"))
            .unwrap()
            .roots;
        let v = rustls::server::WebPkiClientVerifier::builder_with_provider(
            roots,
            Arc::new(rustls::crypto::ring::default_provider()),
        )
        .build()
        .unwrap();
        v.verify_client_cert(&later[0], &[], rustls::pki_types::UnixTime::now())
            .unwrap();
        fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn bad_names_and_files_are_reported() {
        let d = tmp("bad");
        assert!(keygen(&d, &["a b".into()], DEFAULT_DAYS, false)
            .unwrap_err()
            .contains("'a b'"));
        assert!(keygen(&d, &[], DEFAULT_DAYS, false).is_err());
        assert!(keygen(&d, &["ca".into()], DEFAULT_DAYS, false).is_err());
        fs::create_dir_all(&d).unwrap();
        fs::write(d.join("junk.pem"), "not pem").unwrap();
        let e = Credentials::load(&d.join("junk.pem"), &d.join("x"), &d.join("y")).unwrap_err();
        assert!(
            e.starts_with("tunnel.ca:") && e.contains("no PEM certificate"),
            "{e}"
        );
        let e = Credentials::load(&d.join("none.pem"), &d.join("x"), &d.join("y")).unwrap_err();
        assert!(e.starts_with("tunnel.ca: cannot read"), "{e}");
        fs::remove_dir_all(&d).unwrap();
    }
}
