//! Which terminals a gateway admits: those whose certificate the deployment's CA signed and
//! has not revoked (`tunnel.crl`, the list `satpep keygen revoke` writes), and, if the gateway
//! lists names (`tunnel.terminals`), only those. Checked in the TLS handshake, so a refused
//! terminal never opens a flow; read again on a reload, when live connections of terminals no
//! longer admitted are closed and the others go on.

use rustls::client::danger::HandshakeSignatureValid;
use rustls::pki_types::{CertificateDer, CertificateRevocationListDer, UnixTime};
use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use rustls::{
    CertificateError, DigitallySignedStruct, DistinguishedName, OtherError, SignatureScheme,
};
use std::collections::{BTreeSet, HashSet};
use std::fs;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// A terminal as its certificate names it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PeerId {
    /// Its name (the certificate's DNS name, else its common name).
    pub name: String,
    /// Its certificate's serial number.
    pub serial: Vec<u8>,
}

/// The name and serial number of the certificate `der`, if it parses.
pub fn peer_id(der: &[u8]) -> Option<PeerId> {
    let (_, cert) = x509_parser::parse_x509_certificate(der).ok()?;
    let from_san = cert
        .subject_alternative_name()
        .ok()
        .flatten()
        .and_then(|san| {
            san.value.general_names.iter().find_map(|n| match n {
                x509_parser::extensions::GeneralName::DNSName(d) => Some(d.to_string()),
                _ => None,
            })
        });
    let name = from_san.or_else(|| {
        cert.subject()
            .iter_common_name()
            .next()
            .and_then(|cn| cn.as_str().ok())
            .map(str::to_string)
    })?;
    Some(PeerId {
        name,
        serial: cert.raw_serial().to_vec(),
    })
}

/// What a gateway admits.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Admission {
    /// The names admitted (`None`: any the CA signed).
    names: Option<BTreeSet<String>>,
    /// The revocation list's file and its contents (DER).
    crl: Option<(PathBuf, Vec<u8>)>,
    /// Serial numbers it revokes.
    revoked: HashSet<Vec<u8>>,
}

impl Admission {
    /// Reads the revocation list at `crl` (PEM or DER, as `tunnel.crl`); errors name the key.
    pub fn load(names: Option<&[String]>, crl: Option<&Path>) -> Result<Admission, String> {
        let mut a = Admission {
            names: names.map(|n| n.iter().cloned().collect()),
            ..Admission::default()
        };
        if let Some(path) = crl {
            let bytes = fs::read(path)
                .map_err(|e| format!("tunnel.crl: cannot read {}: {e}", path.display()))?;
            let der = if bytes.starts_with(b"-----") {
                rustls_pemfile::crls(&mut bytes.as_slice())
                    .next()
                    .ok_or_else(|| {
                        format!(
                            "tunnel.crl: {} holds no PEM revocation list",
                            path.display()
                        )
                    })?
                    .map_err(|e| format!("tunnel.crl: {}: {e}", path.display()))?
                    .as_ref()
                    .to_vec()
            } else {
                bytes
            };
            let (_, list) = x509_parser::parse_x509_crl(&der).map_err(|e| {
                format!(
                    "tunnel.crl: {} is not a revocation list: {e}",
                    path.display()
                )
            })?;
            a.revoked = list
                .iter_revoked_certificates()
                .map(|r| r.raw_serial().to_vec())
                .collect();
            a.crl = Some((path.to_path_buf(), der));
        }
        Ok(a)
    }

    /// Whether a list of names restricts admission.
    pub fn lists_names(&self) -> bool {
        self.names.is_some()
    }

    /// Revoked certificates in the list.
    pub fn revoked_count(&self) -> usize {
        self.revoked.len()
    }

    /// The revocation list, for the TLS verifier.
    fn crls(&self) -> Vec<CertificateRevocationListDer<'static>> {
        self.crl
            .iter()
            .map(|(_, der)| CertificateRevocationListDer::from(der.clone()))
            .collect()
    }

    /// Whether `id` is admitted; if not, why (for the log).
    pub fn check_id(&self, id: &PeerId) -> Result<(), String> {
        if self.revoked.contains(&id.serial) {
            return Err(format!(
                "terminal '{}': its certificate is revoked",
                id.name
            ));
        }
        if let Some(names) = &self.names {
            if !names.contains(&id.name) {
                return Err(format!(
                    "terminal '{}' is not among tunnel.terminals",
                    id.name
                ));
            }
        }
        Ok(())
    }

    /// Whether the certificate `der` is admitted (its chain checked elsewhere): its name.
    pub fn check(&self, der: &[u8]) -> Result<String, String> {
        let id = peer_id(der).ok_or("a certificate with no name")?;
        self.check_id(&id)?;
        Ok(id.name)
    }

    /// A client certificate verifier that checks the chain against `roots` and the
    /// revocation list, then this admission.
    pub fn verifier(
        self: &Arc<Self>,
        roots: Arc<rustls::RootCertStore>,
        provider: Arc<rustls::crypto::CryptoProvider>,
    ) -> Result<Arc<dyn ClientCertVerifier>, String> {
        let inner = rustls::server::WebPkiClientVerifier::builder_with_provider(roots, provider)
            .with_crls(self.crls())
            .build()
            .map_err(|e| format!("tunnel.ca/tunnel.crl: {e}"))?;
        Ok(Arc::new(Admitting {
            inner,
            admission: self.clone(),
        }))
    }
}

/// Why a terminal was refused, carried in the handshake's error.
#[derive(Debug)]
struct Refused(String);

impl std::fmt::Display for Refused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Refused {}

#[derive(Debug)]
struct Admitting {
    inner: Arc<dyn ClientCertVerifier>,
    admission: Arc<Admission>,
}

impl ClientCertVerifier for Admitting {
    fn offer_client_auth(&self) -> bool {
        self.inner.offer_client_auth()
    }

    fn client_auth_mandatory(&self) -> bool {
        self.inner.client_auth_mandatory()
    }

    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        self.inner.root_hint_subjects()
    }

    fn verify_client_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        now: UnixTime,
    ) -> Result<ClientCertVerified, rustls::Error> {
        let verified = self
            .inner
            .verify_client_cert(end_entity, intermediates, now)?;
        self.admission.check(end_entity).map_err(|why| {
            rustls::Error::InvalidCertificate(CertificateError::Other(OtherError(Arc::new(
                Refused(why),
            ))))
        })?;
        Ok(verified)
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.inner.supported_verify_schemes()
    }
}
