//! `ctrlog certs generate`: a certificate authority and certificates for replicas and clients
//! (rcgen), for a test or a small deployment. A larger one uses its own PKI; what ctrlog needs
//! of it is in DEPLOY.md: replicas named `node-<id>` plus the addresses they serve on.
//!
//! Files written (PEM): `ca.pem` and `ca-key.pem` (keep this one offline), `node-<id>.pem` and
//! `node-<id>-key.pem`, `client-<name>.pem` and `client-<name>-key.pem`. Keys are written
//! readable by their owner only.

use std::path::{Path, PathBuf};

use anyhow::Context;
use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, KeyPair,
    KeyUsagePurpose,
};
use time::{Duration, OffsetDateTime};

use crate::NodeId;

/// The CA certificate `generate` writes into `dir`.
pub fn ca_file(dir: &Path) -> PathBuf {
    dir.join("ca.pem")
}

/// The TLS files of replica `id` among those `generate` wrote into `dir`.
pub fn replica_files(dir: &Path, id: NodeId) -> crate::server::TlsFiles {
    let name = crate::server::tls::node_name(id);
    crate::server::TlsFiles {
        ca_file: ca_file(dir),
        cert_file: dir.join(format!("{name}.pem")),
        key_file: dir.join(format!("{name}-key.pem")),
    }
}

/// The certificate and key of client `name` among those `generate` wrote into `dir`.
pub fn client_identity(dir: &Path, name: &str) -> (PathBuf, PathBuf) {
    (
        dir.join(format!("client-{name}.pem")),
        dir.join(format!("client-{name}-key.pem")),
    )
}

/// A certificate authority that signs replica and client certificates.
pub struct Authority {
    cert: rcgen::Certificate,
    key: KeyPair,
}

impl Authority {
    /// A new authority, valid for `days`.
    pub fn new(days: i64) -> anyhow::Result<Authority> {
        let mut params = CertificateParams::new(Vec::<String>::new())?;
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params
            .distinguished_name
            .push(DnType::CommonName, "ctrlog CA");
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let now = OffsetDateTime::now_utc();
        params.not_before = now - Duration::days(1);
        params.not_after = now + Duration::days(days);
        let key = KeyPair::generate()?;
        let cert = params.self_signed(&key)?;
        Ok(Authority { cert, key })
    }

    /// Writes `ca.pem` and `ca-key.pem` into `dir`.
    pub fn write(&self, dir: &Path) -> anyhow::Result<PathBuf> {
        write_pem(dir, "ca", &self.cert.pem(), &self.key.serialize_pem())
    }

    /// Issues a certificate named `name` (its common name) for the subject alternative names
    /// `sans` (DNS names or IP addresses), valid from `not_before` to `not_after`, usable as a
    /// server and as a client; writes `<file>.pem` and `<file>-key.pem` into `dir` and returns
    /// the certificate's path.
    pub fn issue(
        &self,
        dir: &Path,
        file: &str,
        name: &str,
        sans: Vec<String>,
        not_before: OffsetDateTime,
        not_after: OffsetDateTime,
    ) -> anyhow::Result<PathBuf> {
        let mut params = CertificateParams::new(sans)?;
        params.distinguished_name.push(DnType::CommonName, name);
        params.key_usages = vec![
            KeyUsagePurpose::DigitalSignature,
            KeyUsagePurpose::KeyEncipherment,
        ];
        params.extended_key_usages = vec![
            ExtendedKeyUsagePurpose::ServerAuth,
            ExtendedKeyUsagePurpose::ClientAuth,
        ];
        params.not_before = not_before;
        params.not_after = not_after;
        let key = KeyPair::generate()?;
        let cert = params.signed_by(&key, &self.cert, &self.key)?;
        write_pem(dir, file, &cert.pem(), &key.serialize_pem())
    }
}

fn write_pem(dir: &Path, file: &str, cert: &str, key: &str) -> anyhow::Result<PathBuf> {
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let cert_path = dir.join(format!("{file}.pem"));
    std::fs::write(&cert_path, cert).with_context(|| format!("writing {}", cert_path.display()))?;
    let key_path = dir.join(format!("{file}-key.pem"));
    let mut out = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&key_path)
        .with_context(|| format!("writing {}", key_path.display()))?;
    std::io::Write::write_all(&mut out, key.as_bytes())?;
    Ok(cert_path)
}

/// Generates a CA, a certificate per replica (`node-<id>` plus `hosts`, the names and addresses
/// clients and peers dial) and one per client name, all valid for `days`. Returns the files
/// written.
pub fn generate(
    out: &Path,
    nodes: &[NodeId],
    hosts: &[String],
    clients: &[String],
    days: i64,
) -> anyhow::Result<Vec<PathBuf>> {
    let authority = Authority::new(days)?;
    let mut written = vec![authority.write(out)?];
    let now = OffsetDateTime::now_utc();
    let (from, until) = (now - Duration::days(1), now + Duration::days(days));
    for id in nodes {
        let name = crate::server::tls::node_name(*id);
        let mut sans = vec![name.clone()];
        sans.extend(hosts.iter().cloned());
        written.push(authority.issue(out, &name, &name, sans, from, until)?);
    }
    for client in clients {
        let file = format!("client-{client}");
        written.push(authority.issue(out, &file, client, vec![file.clone()], from, until)?);
    }
    Ok(written)
}
