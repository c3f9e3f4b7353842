//! The deployment's certificate authority as an operator runs it: a terminal makes its own
//! key and a signing request (`satpep keygen request`), the CA's keeper signs it for a limited
//! time (`satpep keygen sign`) and can revoke it (`satpep keygen revoke`), which rewrites the
//! revocation list the gateway reads (`tunnel.crl`). What the CA issued is on record in
//! `issued.tsv` beside its key, so a certificate is revoked by its terminal's name.
//!
//! The CA directory holds `ca.key` (keep it off the satpeps), `ca.pem`, `crl.pem` and
//! `issued.tsv`; `satpep keygen NAME...` (the all-in-one form, for a lab) writes node keys
//! there too.

use crate::keys::{valid_name, write_private, write_public};
use rcgen::{
    BasicConstraints, Certificate, CertificateParams, CertificateRevocationListParams,
    CertificateSigningRequestParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyIdMethod, KeyPair, KeyUsagePurpose, PublicKeyData, RevocationReason, RevokedCertParams,
    SerialNumber,
};
use std::fs;
use std::path::{Path, PathBuf};
use time::{Duration, OffsetDateTime};

/// A certificate's life when none is asked for: a year, renewed by signing a new request
/// (the key may stay).
pub const DEFAULT_DAYS: u32 = 365;
/// The longest life `sign` gives: ten years, the CA's own.
pub const MAX_DAYS: u32 = 3650;

/// The CA's files in its directory.
const CA_KEY: &str = "ca.key";
const CA_PEM: &str = "ca.pem";
const CRL_PEM: &str = "crl.pem";
const INDEX: &str = "issued.tsv";

/// Names the CA's files use for itself.
const RESERVED: [&str; 3] = ["ca", "crl", "issued"];

/// The CA's subject; a CA certificate regenerated from the same key and subject signs
/// certificates that chain to the original.
fn ca_params() -> CertificateParams {
    let mut p = CertificateParams::default();
    let mut dn = DistinguishedName::new();
    dn.push(DnType::CommonName, "satpep tunnel CA");
    p.distinguished_name = dn;
    p.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    p.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    p
}

/// `name` as a satpep's certificate name, or why not.
pub fn check_name(name: &str) -> Result<(), String> {
    if !valid_name(name) {
        return Err(format!(
            "'{name}' is not a usable name (letters, digits, '-' and '.', up to 63)"
        ));
    }
    if RESERVED.contains(&name) {
        return Err(format!(
            "'{name}' is one of the authority's own file names; pick another name"
        ));
    }
    Ok(())
}

/// `days` as a certificate's life, or why not.
pub fn check_days(days: u32) -> Result<(), String> {
    if days == 0 || days > MAX_DAYS {
        return Err(format!("--days {days}: from 1 to {MAX_DAYS}"));
    }
    Ok(())
}

/// One certificate the CA issued, as `issued.tsv` records it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Issued {
    /// Its serial number, hex.
    pub serial: String,
    /// The satpep's name.
    pub name: String,
    /// When it expires (RFC 3339).
    pub not_after: String,
    /// When it was revoked (RFC 3339), if it was.
    pub revoked: Option<String>,
}

fn rfc3339(t: OffsetDateTime) -> String {
    t.replace_nanosecond(0)
        .expect("0 is a valid nanosecond")
        .format(&time::format_description::well_known::Rfc3339)
        .expect("a UTC time formats as RFC 3339")
}

/// A certificate authority opened from its directory.
pub struct Authority {
    dir: PathBuf,
    cert: Certificate,
    key: KeyPair,
}

impl std::fmt::Debug for Authority {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the key.
        f.debug_struct("Authority").field("dir", &self.dir).finish()
    }
}

impl Authority {
    /// Opens the CA in `dir`, or makes one there (a key, a self-signed certificate, an empty
    /// revocation list) if `dir` has none. The flag says whether it was made.
    pub fn open_or_make(dir: &Path) -> Result<(Authority, bool), String> {
        if dir.join(CA_KEY).exists() {
            return Authority::open(dir).map(|a| (a, false));
        }
        // A satpep's copy of the CA (its certificate without the key, as it should be): a new
        // CA here would replace the deployment's certificate and cut this satpep off.
        if dir.join(CA_PEM).exists() {
            return Err(format!(
                "{} has the CA's certificate but not its key ({CA_KEY}): run this where the CA's key is, or give another --dir for a new CA",
                dir.display()
            ));
        }
        fs::create_dir_all(dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
        let key = KeyPair::generate().map_err(|e| e.to_string())?;
        let mut p = ca_params();
        let now = OffsetDateTime::now_utc();
        p.not_before = now - Duration::hours(1);
        p.not_after = now + Duration::days(MAX_DAYS as i64);
        let cert = p.self_signed(&key).map_err(|e| e.to_string())?;
        write_private(&dir.join(CA_KEY), &key.serialize_pem())?;
        write_public(&dir.join(CA_PEM), &cert.pem())?;
        let a = Authority {
            dir: dir.to_path_buf(),
            cert: ca_params().self_signed(&key).map_err(|e| e.to_string())?,
            key,
        };
        a.write_crl(&[])?;
        Ok((a, true))
    }

    /// Opens the CA in `dir`; an error if there is none.
    pub fn open(dir: &Path) -> Result<Authority, String> {
        let path = dir.join(CA_KEY);
        let text = fs::read_to_string(&path).map_err(|e| {
            format!(
                "{}: cannot read the CA's key ({e}); `satpep keygen --dir {} NAME` makes a CA",
                path.display(),
                dir.display()
            )
        })?;
        let key = KeyPair::from_pem(&text).map_err(|e| format!("{}: {e}", path.display()))?;
        let cert = ca_params().self_signed(&key).map_err(|e| e.to_string())?;
        Ok(Authority {
            dir: dir.to_path_buf(),
            cert,
            key,
        })
    }

    /// The CA's certificate file.
    pub fn ca_pem(&self) -> PathBuf {
        self.dir.join(CA_PEM)
    }

    /// The revocation list's file.
    pub fn crl_pem(&self) -> PathBuf {
        self.dir.join(CRL_PEM)
    }

    /// A certificate for `name` on `public_key`, valid `days` from now, recorded in the
    /// index: usable by either end of a tunnel (server and client authentication), never a
    /// CA, whatever a request asked for.
    fn issue(
        &self,
        name: &str,
        public_key: &impl PublicKeyData,
        days: u32,
    ) -> Result<String, String> {
        check_name(name)?;
        check_days(days)?;
        let mut p = CertificateParams::new(vec![name.to_string()]).map_err(|e| e.to_string())?;
        p.distinguished_name.push(DnType::CommonName, name);
        p.extended_key_usages = vec![
            ExtendedKeyUsagePurpose::ServerAuth,
            ExtendedKeyUsagePurpose::ClientAuth,
        ];
        p.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        let now = OffsetDateTime::now_utc();
        // An hour back: a satpep whose clock is a little behind accepts it at once.
        p.not_before = now - Duration::hours(1);
        let not_after = now + Duration::days(days as i64);
        p.not_after = not_after;
        let mut serial = [0u8; 16];
        ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut serial)
            .map_err(|_| "no randomness for a serial number".to_string())?;
        // Positive, and never shortened by a leading zero.
        serial[0] = (serial[0] & 0x7f) | 0x40;
        p.serial_number = Some(SerialNumber::from_slice(&serial));
        let cert = p
            .signed_by(public_key, &self.cert, &self.key)
            .map_err(|e| e.to_string())?;
        let mut index = self.index()?;
        index.push(Issued {
            serial: hex(&serial),
            name: name.to_string(),
            not_after: rfc3339(not_after),
            revoked: None,
        });
        self.write_index(&index)?;
        Ok(cert.pem())
    }

    /// A new key and certificate for `name` (`NAME.key`, `NAME.pem` in the CA's directory),
    /// valid `days`. Existing files are kept unless `force`.
    pub fn make_node(
        &self,
        name: &str,
        days: u32,
        force: bool,
    ) -> Result<(PathBuf, PathBuf), String> {
        check_name(name)?;
        let (pem, key) = (
            self.dir.join(format!("{name}.pem")),
            self.dir.join(format!("{name}.key")),
        );
        if !force && (pem.exists() || key.exists()) {
            return Err(format!(
                "{} exists already (--force replaces it)",
                pem.display()
            ));
        }
        let kp = KeyPair::generate().map_err(|e| e.to_string())?;
        let cert = self.issue(name, &kp, days)?;
        write_private(&key, &kp.serialize_pem())?;
        write_public(&pem, &cert)?;
        Ok((pem, key))
    }

    /// Signs the request in `csr` for `days`: writes `NAME.pem` into `out` (the request's
    /// name, checked; only that name and the request's key are taken from it). An existing
    /// certificate file is kept unless `force`.
    pub fn sign(
        &self,
        csr: &Path,
        out: &Path,
        days: u32,
        force: bool,
    ) -> Result<(String, PathBuf), String> {
        let text =
            fs::read_to_string(csr).map_err(|e| format!("cannot read {}: {e}", csr.display()))?;
        let req = CertificateSigningRequestParams::from_pem(&text).map_err(|e| {
            format!(
                "{}: not a signing request satpep can read ({e}); make one with `satpep keygen request NAME`",
                csr.display()
            )
        })?;
        let names: Vec<String> = req
            .params
            .subject_alt_names
            .iter()
            .filter_map(|n| match n {
                rcgen::SanType::DnsName(d) => Some(d.to_string()),
                _ => None,
            })
            .collect();
        let name = match names.as_slice() {
            [one] => one.clone(),
            [] => {
                return Err(format!(
                    "{}: the request names no satpep (a DNS name)",
                    csr.display()
                ))
            }
            many => {
                return Err(format!(
                    "{}: the request names {} satpeps ({}); one per request",
                    csr.display(),
                    many.len(),
                    many.join(", ")
                ))
            }
        };
        check_name(&name).map_err(|e| format!("{}: {e}", csr.display()))?;
        let pem = out.join(format!("{name}.pem"));
        if !force && pem.exists() {
            return Err(format!(
                "{} exists already (--force replaces it)",
                pem.display()
            ));
        }
        let cert = self.issue(&name, &req.public_key, days)?;
        fs::create_dir_all(out).map_err(|e| format!("cannot create {}: {e}", out.display()))?;
        write_public(&pem, &cert)?;
        Ok((name, pem))
    }

    /// Revokes every certificate issued to `name` that is not revoked yet and rewrites the
    /// revocation list; returns their serial numbers. An error if none is on record.
    pub fn revoke(&self, name: &str) -> Result<Vec<String>, String> {
        let mut index = self.index()?;
        let now = rfc3339(OffsetDateTime::now_utc());
        let mut serials = Vec::new();
        for i in index
            .iter_mut()
            .filter(|i| i.name == name && i.revoked.is_none())
        {
            i.revoked = Some(now.clone());
            serials.push(i.serial.clone());
        }
        if serials.is_empty() {
            let known = index.iter().any(|i| i.name == name);
            return Err(if known {
                format!("every certificate issued to '{name}' is revoked already")
            } else {
                format!(
                    "no certificate issued to '{name}' is on record in {} (certificates made before the CA kept one are not: issue new ones)",
                    self.dir.join(INDEX).display()
                )
            });
        }
        self.write_index(&index)?;
        self.write_crl(&index)?;
        Ok(serials)
    }

    /// The certificates on record.
    pub fn index(&self) -> Result<Vec<Issued>, String> {
        let path = self.dir.join(INDEX);
        let text = match fs::read_to_string(&path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(format!("cannot read {}: {e}", path.display())),
        };
        let mut out = Vec::new();
        for (n, line) in text.lines().enumerate() {
            if line.starts_with('#') || line.trim().is_empty() {
                continue;
            }
            let f: Vec<&str> = line.split('\t').collect();
            let bad = || {
                format!(
                    "{}:{}: expected serial, name, expiry and revocation (or -) separated by tabs",
                    path.display(),
                    n + 1
                )
            };
            if f.len() != 4 || unhex(f[0]).is_none() || f[1].is_empty() {
                return Err(bad());
            }
            out.push(Issued {
                serial: f[0].to_string(),
                name: f[1].to_string(),
                not_after: f[2].to_string(),
                revoked: (f[3] != "-").then(|| f[3].to_string()),
            });
        }
        Ok(out)
    }

    fn write_index(&self, index: &[Issued]) -> Result<(), String> {
        let mut text = String::from("# serial\tname\tnot after\trevoked\n");
        for i in index {
            text.push_str(&format!(
                "{}\t{}\t{}\t{}\n",
                i.serial,
                i.name,
                i.not_after,
                i.revoked.as_deref().unwrap_or("-")
            ));
        }
        // Written aside and renamed: a crash never leaves half a record.
        let (path, tmp) = (self.dir.join(INDEX), self.dir.join(".issued.tsv.new"));
        write_public(&tmp, &text)?;
        fs::rename(&tmp, &path).map_err(|e| format!("cannot write {}: {e}", path.display()))
    }

    /// Writes `crl.pem`: every revoked certificate of `index`, signed by the CA. It states
    /// a next update a year on; the gateway does not hold a list to it (rustls's default).
    fn write_crl(&self, index: &[Issued]) -> Result<(), String> {
        let now = OffsetDateTime::now_utc();
        let revoked = index
            .iter()
            .filter(|i| i.revoked.is_some())
            .map(|i| RevokedCertParams {
                serial_number: SerialNumber::from_slice(&unhex(&i.serial).expect("checked")),
                revocation_time: now,
                reason_code: Some(RevocationReason::CessationOfOperation),
                invalidity_date: None,
            })
            .collect();
        let crl = CertificateRevocationListParams {
            this_update: now,
            next_update: now + Duration::days(365),
            // Later lists carry larger numbers.
            crl_number: SerialNumber::from_slice(&(now.unix_timestamp() as u64).to_be_bytes()),
            issuing_distribution_point: None,
            revoked_certs: revoked,
            key_identifier_method: KeyIdMethod::Sha256,
        }
        .signed_by(&self.cert, &self.key)
        .map_err(|e| e.to_string())?;
        let pem = crl.pem().map_err(|e| e.to_string())?;
        let (path, tmp) = (self.crl_pem(), self.dir.join(".crl.pem.new"));
        write_public(&tmp, &pem)?;
        fs::rename(&tmp, &path).map_err(|e| format!("cannot write {}: {e}", path.display()))
    }
}

/// Lower-case hex.
pub fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn unhex(s: &str) -> Option<Vec<u8>> {
    if s.is_empty() || s.len() % 2 != 0 {
        return None;
    }
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(s.get(i..i + 2)?, 16).ok())
        .collect()
}

/// Makes a key for `name` and a request the CA signs (`NAME.key`, mode 0600, and `NAME.csr`
/// in `dir`), for a satpep whose key never leaves it. Existing files are kept unless `force`.
pub fn request(dir: &Path, name: &str, force: bool) -> Result<(PathBuf, PathBuf), String> {
    check_name(name)?;
    let (key, csr) = (
        dir.join(format!("{name}.key")),
        dir.join(format!("{name}.csr")),
    );
    if !force && (key.exists() || csr.exists()) {
        return Err(format!(
            "{} exists already (--force replaces it)",
            key.display()
        ));
    }
    fs::create_dir_all(dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    let kp = KeyPair::generate().map_err(|e| e.to_string())?;
    let mut p = CertificateParams::new(vec![name.to_string()]).map_err(|e| e.to_string())?;
    p.distinguished_name.push(DnType::CommonName, name);
    let req = p.serialize_request(&kp).map_err(|e| e.to_string())?;
    write_private(&key, &kp.serialize_pem())?;
    write_public(&csr, &req.pem().map_err(|e| e.to_string())?)?;
    Ok((key, csr))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::admission::{peer_id, Admission};
    use crate::keys::Credentials;
    use std::sync::Arc;

    fn tmp(tag: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("satpep-ca-{tag}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&d);
        d
    }

    fn client_verifier(
        ca: &Path,
        crl: Option<&Path>,
        names: Option<&[String]>,
    ) -> Arc<dyn rustls::server::danger::ClientCertVerifier> {
        let roots = Credentials::load(ca, ca, &ca.with_file_name("ca.key"))
            .unwrap()
            .roots;
        Arc::new(Admission::load(names, crl).unwrap())
            .verifier(roots, Arc::new(rustls::crypto::ring::default_provider()))
            .unwrap()
    }

    fn cert(path: &Path) -> rustls::pki_types::CertificateDer<'static> {
        let text = fs::read(path).unwrap();
        let c = rustls_pemfile::certs(&mut text.as_slice())
            .next()
            .unwrap()
            .unwrap();
        c
    }

    #[test]
    fn a_request_made_elsewhere_is_signed_for_its_name_only_and_expires() {
        let (ca_dir, term) = (tmp("sign-ca"), tmp("sign-term"));
        let (ca, new) = Authority::open_or_make(&ca_dir).unwrap();
        assert!(new);
        assert!(
            ca.crl_pem().exists(),
            "a new CA writes an empty revocation list"
        );
        let (key, csr) = request(&term, "terminal-7", false).unwrap();
        use std::os::unix::fs::PermissionsExt;
        assert_eq!(
            fs::metadata(&key).unwrap().permissions().mode() & 0o777,
            0o600
        );
        assert!(request(&term, "terminal-7", false)
            .unwrap_err()
            .contains("exists already"));
        let (name, pem) = ca.sign(&csr, &term, 30, false).unwrap();
        assert_eq!(name, "terminal-7");
        // The certificate and the key made on the terminal belong together, and it chains.
        let creds = Credentials::load(&ca.ca_pem(), &pem, &key).unwrap();
        creds.client_tls().unwrap();
        let v = client_verifier(&ca.ca_pem(), Some(&ca.crl_pem()), None);
        let now = rustls::pki_types::UnixTime::now();
        v.verify_client_cert(&creds.chain[0], &[], now).unwrap();
        // It expires in 30 days, as asked: valid in 29, refused in 31.
        let day = 86_400;
        let at = |d: u64| {
            rustls::pki_types::UnixTime::since_unix_epoch(std::time::Duration::from_secs(
                now.as_secs() + d * day,
            ))
        };
        v.verify_client_cert(&creds.chain[0], &[], at(29)).unwrap();
        let e = v
            .verify_client_cert(&creds.chain[0], &[], at(31))
            .unwrap_err();
        assert!(format!("{e}").contains("expired"), "{e}");
        // Never a CA, whatever the request asked for.
        let (_, x509) = x509_parser::parse_x509_certificate(&creds.chain[0]).unwrap();
        assert!(!x509.is_ca());
        // On record.
        let index = ca.index().unwrap();
        assert_eq!(index.len(), 1);
        assert_eq!(index[0].name, "terminal-7");
        assert_eq!(
            peer_id(&creds.chain[0]).unwrap().serial,
            unhex(&index[0].serial).unwrap()
        );
        // Bad input: no request, a bad --days, an existing certificate.
        fs::write(
            term.join("junk.csr"),
            "-----BEGIN CERTIFICATE REQUEST-----\nAAAA\n-----END CERTIFICATE REQUEST-----\n",
        )
        .unwrap();
        let e = ca
            .sign(&term.join("junk.csr"), &term, 30, false)
            .unwrap_err();
        assert!(
            e.contains("junk.csr") && e.contains("not a signing request"),
            "{e}"
        );
        assert!(ca
            .sign(&csr, &term, 0, true)
            .unwrap_err()
            .contains("--days 0"));
        assert!(ca
            .sign(&csr, &term, 30, false)
            .unwrap_err()
            .contains("exists already"));
        assert!(Authority::open(&term)
            .unwrap_err()
            .contains("cannot read the CA's key"));
        // A satpep's copy of the CA is never replaced by a new one.
        fs::copy(ca.ca_pem(), term.join("ca.pem")).unwrap();
        let e = Authority::open_or_make(&term).unwrap_err();
        assert!(e.contains("not its key"), "{e}");
        for d in [ca_dir, term] {
            fs::remove_dir_all(d).unwrap();
        }
    }

    #[test]
    fn a_revoked_or_unlisted_terminal_is_refused_and_the_others_admitted() {
        let d = tmp("revoke");
        let (ca, _) = Authority::open_or_make(&d).unwrap();
        for n in ["t1", "t2", "t3"] {
            ca.make_node(n, DEFAULT_DAYS, false).unwrap();
        }
        let serials = ca.revoke("t2").unwrap();
        assert_eq!(serials.len(), 1);
        assert!(ca.revoke("t2").unwrap_err().contains("revoked already"));
        assert!(ca
            .revoke("t9")
            .unwrap_err()
            .contains("no certificate issued to 't9'"));
        let now = rustls::pki_types::UnixTime::now();
        let names = ["t1".to_string(), "t2".to_string()];
        let v = client_verifier(&ca.ca_pem(), Some(&ca.crl_pem()), Some(&names));
        v.verify_client_cert(&cert(&d.join("t1.pem")), &[], now)
            .unwrap();
        let e = v
            .verify_client_cert(&cert(&d.join("t2.pem")), &[], now)
            .unwrap_err();
        assert!(format!("{e}").to_lowercase().contains("revoked"), "{e}");
        let e = v
            .verify_client_cert(&cert(&d.join("t3.pem")), &[], now)
            .unwrap_err();
        assert!(
            format!("{e}").contains("'t3' is not among tunnel.terminals"),
            "{e}"
        );
        // The admission a reload checks live connections with says the same.
        let a = Admission::load(Some(&names), Some(&ca.crl_pem())).unwrap();
        assert_eq!(a.revoked_count(), 1);
        assert!(a.check(&cert(&d.join("t1.pem"))).is_ok());
        assert!(a
            .check(&cert(&d.join("t2.pem")))
            .unwrap_err()
            .contains("revoked"));
        // A certificate issued to t2 again is admitted: only the old one is revoked.
        ca.make_node("t2", DEFAULT_DAYS, true).unwrap();
        let a = Admission::load(Some(&names), Some(&ca.crl_pem())).unwrap();
        assert!(a.check(&cert(&d.join("t2.pem"))).is_ok());
        // Bad lists are named.
        let e = Admission::load(None, Some(&d.join("t1.pem"))).unwrap_err();
        assert!(e.starts_with("tunnel.crl:"), "{e}");
        let e = Admission::load(None, Some(&d.join("none.pem"))).unwrap_err();
        assert!(e.starts_with("tunnel.crl: cannot read"), "{e}");
        fs::write(d.join("issued.tsv"), "zz\tt1\n").unwrap();
        let e = ca.index().unwrap_err();
        assert!(e.contains("issued.tsv:1"), "{e}");
        fs::remove_dir_all(&d).unwrap();
    }
}
