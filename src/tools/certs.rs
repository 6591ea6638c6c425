//! `ctrlog certs generate`: a certificate authority and certificates for replicas and clients
//! (rcgen), for a test or a small deployment; `certs issue` and `certs renew`: more leaves,
//! and fresh ones for the leaves in the folder, under the CA already there. A larger one uses its own PKI; what ctrlog needs
//! of it is in DEPLOY.md: replicas named `node-<id>` plus the addresses they serve on.
//!
//! Files written (PEM): `ca.pem` and `ca-key.pem` (keep this one offline), `node-<id>.pem` and
//! `node-<id>-key.pem`, `client-<name>.pem` and `client-<name>-key.pem`. Keys are made
//! readable by their owner only, even when the file existed. An existing CA is kept unless
//! `force` says otherwise: overwriting it would orphan every certificate it signed. The CA
//! outlives its leaves ([`ca_days`]), so leaves can be renewed under it. Replica certificates
//! serve and dial; client certificates only dial (no ServerAuth).

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
    let name = crate::wire::tls::node_name(id);
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

/// How long a CA issued with leaves of `days` lives: ten times as long and at least ten years,
/// so that the leaves are renewed many times under it.
pub fn ca_days(days: i64) -> i64 {
    (days.saturating_mul(10)).max(3650)
}

/// What an issued certificate may be used for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Usage {
    /// A replica: it serves both ports and dials its peers.
    Replica,
    /// A client: it dials only.
    Client,
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

    /// The authority whose certificate and key are `ca.pem` and `ca-key.pem` in `dir` (as
    /// [`generate`] writes them, or a CA of your own in those files), to sign more leaves.
    /// Refused if the key is not the certificate's.
    pub fn load(dir: &Path) -> anyhow::Result<Authority> {
        let (cert_path, key_path) = (ca_file(dir), dir.join("ca-key.pem"));
        let read = |path: &Path| {
            std::fs::read_to_string(path).with_context(|| {
                format!(
                    "reading {}: issuing under a CA needs its certificate and its key \
                     (ca.pem and ca-key.pem, as `certs generate` wrote them)",
                    path.display()
                )
            })
        };
        let (cert_pem, key_pem) = (read(&cert_path)?, read(&key_path)?);
        let key = KeyPair::from_pem(&key_pem)
            .with_context(|| format!("{} holds no private key rcgen reads", key_path.display()))?;
        let params = CertificateParams::from_ca_cert_pem(&cert_pem)
            .with_context(|| format!("{} holds no CA certificate", cert_path.display()))?;
        let (_, pem) = x509_parser::pem::parse_x509_pem(cert_pem.as_bytes())
            .map_err(|e| anyhow::anyhow!("{}: {e}", cert_path.display()))?;
        let parsed = pem
            .parse_x509()
            .map_err(|e| anyhow::anyhow!("{}: {e}", cert_path.display()))?;
        if parsed.public_key().subject_public_key.data.as_ref() != key.public_key_raw() {
            anyhow::bail!(
                "{} is not the key of {}: a leaf it signed would not be trusted",
                key_path.display(),
                cert_path.display()
            );
        }
        let cert = params.self_signed(&key)?;
        Ok(Authority { cert, key })
    }

    /// When the CA stops being valid: no leaf is issued to outlive it.
    fn not_after(&self) -> OffsetDateTime {
        self.cert.params().not_after
    }

    /// Writes `ca.pem` and `ca-key.pem` into `dir`.
    pub fn write(&self, dir: &Path) -> anyhow::Result<PathBuf> {
        write_pem(dir, "ca", &self.cert.pem(), &self.key.serialize_pem())
    }

    /// Issues a certificate named `name` (its common name) for the subject alternative names
    /// `sans` (DNS names or IP addresses), valid from `not_before` to `not_after`, usable as a
    /// `usage` allows; writes `<file>.pem` and `<file>-key.pem` into `dir` and returns the
    /// certificate's path.
    #[allow(clippy::too_many_arguments)]
    pub fn issue(
        &self,
        dir: &Path,
        file: &str,
        name: &str,
        sans: Vec<String>,
        usage: Usage,
        not_before: OffsetDateTime,
        not_after: OffsetDateTime,
    ) -> anyhow::Result<PathBuf> {
        let mut params = CertificateParams::new(sans)?;
        params.distinguished_name.push(DnType::CommonName, name);
        params.key_usages = vec![
            KeyUsagePurpose::DigitalSignature,
            KeyUsagePurpose::KeyEncipherment,
        ];
        params.extended_key_usages = match usage {
            Usage::Replica => vec![
                ExtendedKeyUsagePurpose::ServerAuth,
                ExtendedKeyUsagePurpose::ClientAuth,
            ],
            Usage::Client => vec![ExtendedKeyUsagePurpose::ClientAuth],
        };
        params.not_before = not_before;
        params.not_after = not_after;
        let key = KeyPair::generate()?;
        let cert = params.signed_by(&key, &self.cert, &self.key)?;
        write_pem(dir, file, &cert.pem(), &key.serialize_pem())
    }
}

fn write_pem(dir: &Path, file: &str, cert: &str, key: &str) -> anyhow::Result<PathBuf> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    // Both whole or not at all, the key mode 0600, and never written through a link planted
    // at either name (`files::create_durably`).
    let write = |name: String, text: &str| {
        crate::raft::storage::files::create_durably(dir, &name, |mut out| {
            std::io::Write::write_all(&mut out, text.as_bytes())
        })
        .with_context(|| format!("writing {}", dir.join(&name).display()))
    };
    write(format!("{file}-key.pem"), key)?;
    // A certificate is public: readable by all, as a container needs the CA's.
    let public = std::os::unix::fs::PermissionsExt::from_mode(0o644);
    write(format!("{file}.pem"), cert)?.set_permissions(public)?;
    Ok(dir.join(format!("{file}.pem")))
}

/// Generates a CA (refusing to replace one in `out` unless `force`), a certificate per replica
/// (`node-<id>` plus `hosts`, the names and addresses clients and peers dial) and one per
/// client name, the leaves valid for `days`. Returns the files written.
pub fn generate(
    out: &Path,
    nodes: &[NodeId],
    hosts: &[String],
    clients: &[String],
    days: i64,
    force: bool,
) -> anyhow::Result<Vec<PathBuf>> {
    if ca_file(out).exists() && !force {
        anyhow::bail!(
            "{} exists: a new CA would orphan every certificate the old one signed (use --force \
             to replace it)",
            ca_file(out).display()
        );
    }
    let authority = Authority::new(ca_days(days))?;
    let mut written = vec![authority.write(out)?];
    let now = OffsetDateTime::now_utc();
    let (from, until) = (now - Duration::days(1), now + Duration::days(days));
    for id in nodes {
        let name = crate::wire::tls::node_name(*id);
        let mut sans = vec![name.clone()];
        sans.extend(hosts.iter().cloned());
        written.push(authority.issue(out, &name, &name, sans, Usage::Replica, from, until)?);
    }
    for client in clients {
        let file = format!("client-{client}");
        let sans = vec![file.clone()];
        written.push(authority.issue(out, &file, client, sans, Usage::Client, from, until)?);
    }
    Ok(written)
}

/// A leaf certificate in a folder `generate` wrote: a replica's or a client's.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Leaf {
    /// `node-<id>.pem`.
    Node(NodeId),
    /// `client-<name>.pem`.
    Client(String),
}

impl Leaf {
    /// The file name without `.pem`.
    fn file(&self) -> String {
        match self {
            Leaf::Node(id) => crate::wire::tls::node_name(*id),
            Leaf::Client(name) => format!("client-{name}"),
        }
    }

    /// A leaf as people name it: `node-N` or `client-NAME`.
    pub fn parse(name: &str) -> anyhow::Result<Leaf> {
        Leaf::of_file(&format!("{name}.pem"))
            .ok_or_else(|| anyhow::anyhow!("`{name}`: name a leaf node-N or client-NAME"))
    }

    /// The leaf a `<file>.pem` in the folder is, if it is one.
    fn of_file(name: &str) -> Option<Leaf> {
        let stem = name.strip_suffix(".pem").filter(|s| !s.ends_with("-key"))?;
        match stem.strip_prefix("node-") {
            Some(id) => id.parse().ok().map(Leaf::Node),
            None => (stem.strip_prefix("client-")).map(|name| Leaf::Client(name.to_string())),
        }
    }
}

impl std::fmt::Display for Leaf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.file())
    }
}

/// The validity of a leaf issued now for `days` under `authority`: never past the CA's own
/// end, which would make it fail early with a confusing error.
fn validity(authority: &Authority, days: i64) -> anyhow::Result<(OffsetDateTime, OffsetDateTime)> {
    let now = OffsetDateTime::now_utc();
    let until = now + Duration::days(days);
    if until > authority.not_after() {
        anyhow::bail!(
            "a leaf valid for {days} days would outlive the CA, which expires {}: issue a \
             shorter one, or replace the CA (`certs generate --force`) and every certificate",
            authority.not_after().date()
        );
    }
    Ok((now - Duration::days(1), until))
}

/// Issues a new leaf under the CA in `dir` (`ca.pem`, `ca-key.pem`): a replica's named
/// `node-<id>` plus `hosts`, or a client's; valid for `days`. Refuses to replace a leaf that
/// exists ([`renew`] does that). Returns the certificate written.
pub fn issue(dir: &Path, leaf: &Leaf, hosts: &[String], days: i64) -> anyhow::Result<PathBuf> {
    let authority = Authority::load(dir)?;
    let file = leaf.file();
    let existing = dir.join(format!("{file}.pem"));
    if existing.exists() {
        anyhow::bail!(
            "{} exists: renew it with `certs renew --dir {} --only {leaf}`",
            existing.display(),
            dir.display()
        );
    }
    let (from, until) = validity(&authority, days)?;
    match leaf {
        Leaf::Node(_) => {
            let mut sans = vec![file.clone()];
            sans.extend(hosts.iter().cloned());
            authority.issue(dir, &file, &file, sans, Usage::Replica, from, until)
        }
        Leaf::Client(name) => {
            let sans = vec![file.clone()];
            authority.issue(dir, &file, name, sans, Usage::Client, from, until)
        }
    }
}

/// What a leaf certificate names: its common name, subject alternative names (DNS names and
/// IP addresses, as text) and whether it may serve.
fn names_of(path: &Path) -> anyhow::Result<(String, Vec<String>, Usage)> {
    use x509_parser::extensions::GeneralName;
    let pem_text = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
    let (_, pem) = x509_parser::pem::parse_x509_pem(&pem_text)
        .map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
    let cert = pem
        .parse_x509()
        .map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
    let name = (cert.subject().iter_common_name().next())
        .and_then(|cn| cn.as_str().ok())
        .ok_or_else(|| anyhow::anyhow!("{} has no common name", path.display()))?
        .to_string();
    let mut sans = Vec::new();
    if let Ok(Some(extension)) = cert.subject_alternative_name() {
        for general in &extension.value.general_names {
            match general {
                GeneralName::DNSName(dns) => sans.push(dns.to_string()),
                GeneralName::IPAddress(bytes) => match bytes.len() {
                    4 => sans
                        .push(std::net::Ipv4Addr::from(<[u8; 4]>::try_from(*bytes)?).to_string()),
                    16 => sans
                        .push(std::net::Ipv6Addr::from(<[u8; 16]>::try_from(*bytes)?).to_string()),
                    _ => {
                        anyhow::bail!("{}: an IP address of {} bytes", path.display(), bytes.len())
                    }
                },
                other => anyhow::bail!(
                    "{}: a name this tool does not renew: {other:?}",
                    path.display()
                ),
            }
        }
    }
    let serves = matches!(cert.extended_key_usage(), Ok(Some(usage)) if usage.value.server_auth);
    Ok((
        name,
        sans,
        if serves {
            Usage::Replica
        } else {
            Usage::Client
        },
    ))
}

/// Renews leaves in `dir` under its CA: each gets a fresh key and a certificate with the names
/// the current one carries, valid for `days` from now. `only` names the leaves to renew;
/// empty renews every `node-*.pem` and `client-*.pem` there. The CA is unchanged, so every
/// peer and client trusts the new leaves at once; a replica reads its files at start, so
/// restart each one in turn after its files are replaced. Returns the certificates written.
pub fn renew(dir: &Path, only: &[Leaf], days: i64) -> anyhow::Result<Vec<PathBuf>> {
    let authority = Authority::load(dir)?;
    let (from, until) = validity(&authority, days)?;
    let mut leaves: Vec<Leaf> = only.to_vec();
    if leaves.is_empty() {
        for item in std::fs::read_dir(dir).with_context(|| format!("reading {}", dir.display()))? {
            if let Some(leaf) = Leaf::of_file(&item?.file_name().to_string_lossy()) {
                leaves.push(leaf);
            }
        }
        leaves.sort_by_key(Leaf::file);
        if leaves.is_empty() {
            anyhow::bail!(
                "{} holds no node-*.pem or client-*.pem to renew",
                dir.display()
            );
        }
    }
    let mut written = Vec::new();
    for leaf in leaves {
        let file = leaf.file();
        let (name, sans, usage) = names_of(&dir.join(format!("{file}.pem")))?;
        written.push(authority.issue(dir, &file, &name, sans, usage, from, until)?);
    }
    Ok(written)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::tls::{client_config, load_certs, load_key, provider};

    fn mode(path: &Path) -> u32 {
        std::os::unix::fs::PermissionsExt::mode(&std::fs::metadata(path).unwrap().permissions())
            & 0o777
    }

    /// Goal: a second `generate` into a folder with a CA refuses rather than orphan every
    /// certificate the CA signed; with `force` it replaces it, and a key file that existed
    /// readable by others, or as a link to another file, ends up a file readable by its
    /// owner only (the other file untouched); certificates stay readable by all.
    #[test]
    fn an_existing_ca_is_kept_and_keys_are_private() {
        let dir = tempfile::tempdir().unwrap();
        generate(dir.path(), &[1], &["127.0.0.1".into()], &[], 30, false).unwrap();
        let error = generate(dir.path(), &[1], &[], &[], 30, false).unwrap_err();
        assert!(error.to_string().contains("--force"), "{error}");
        let key = replica_files(dir.path(), 1).key_file;
        std::fs::set_permissions(&key, std::os::unix::fs::PermissionsExt::from_mode(0o644))
            .unwrap();
        generate(dir.path(), &[1], &["127.0.0.1".into()], &[], 30, true).unwrap();
        assert_eq!(mode(&key), 0o600);
        // A link planted at the key's name (issue 59): replaced, never written through.
        let elsewhere = dir.path().join("elsewhere");
        std::fs::write(&elsewhere, "not a key").unwrap();
        std::fs::remove_file(&key).unwrap();
        std::os::unix::fs::symlink(&elsewhere, &key).unwrap();
        generate(dir.path(), &[1], &["127.0.0.1".into()], &[], 30, true).unwrap();
        assert_eq!(mode(&key), 0o600);
        assert!(!std::fs::symlink_metadata(&key).unwrap().is_symlink());
        assert_eq!(std::fs::read_to_string(&elsewhere).unwrap(), "not a key");
        assert_eq!(mode(&dir.path().join("ca-key.pem")), 0o600);
        assert_eq!(mode(&replica_files(dir.path(), 1).cert_file), 0o644);
        assert!(
            ca_days(30) >= 10 * 30 && ca_days(3650) > 3650,
            "the CA outlives its leaves"
        );
    }

    /// Goal: leaves are issued only under the CA as it is: a key that is not the CA
    /// certificate's is refused by name, and so is a leaf that would outlive the CA; a leaf
    /// named twice is refused, naming `renew`.
    #[test]
    fn issuing_needs_the_cas_own_key_and_stays_within_its_life() {
        let dir = tempfile::tempdir().unwrap();
        generate(dir.path(), &[1], &[], &[], 30, false).unwrap();
        let too_long = issue(dir.path(), &Leaf::Node(2), &[], ca_days(30) + 2).unwrap_err();
        assert!(
            too_long.to_string().contains("outlive the CA"),
            "{too_long}"
        );
        issue(dir.path(), &Leaf::Node(2), &[], 30).unwrap();
        let twice = issue(dir.path(), &Leaf::Node(2), &[], 30).unwrap_err();
        assert!(twice.to_string().contains("certs renew"), "{twice}");

        let other = tempfile::tempdir().unwrap();
        generate(other.path(), &[1], &[], &[], 30, false).unwrap();
        std::fs::copy(
            other.path().join("ca-key.pem"),
            dir.path().join("ca-key.pem"),
        )
        .unwrap();
        let foreign = issue(dir.path(), &Leaf::Node(3), &[], 30).unwrap_err();
        assert!(
            foreign.to_string().contains("is not the key of"),
            "{foreign}"
        );
        assert_eq!(
            Leaf::parse("client-ops").unwrap(),
            Leaf::Client("ops".into())
        );
        assert!(Leaf::parse("node-1-key").is_err() && Leaf::parse("ca").is_err());
    }

    /// Goal: a client certificate cannot pose as a replica: it lacks ServerAuth, so a client
    /// that trusts the CA refuses a server presenting it. Steps: a TLS handshake in memory with
    /// the client certificate on the server side fails; with a replica's it succeeds.
    #[tokio::test]
    async fn a_client_certificate_cannot_serve() {
        let dir = tempfile::tempdir().unwrap();
        generate(
            dir.path(),
            &[1],
            &["127.0.0.1".into()],
            &["ops".into()],
            30,
            false,
        )
        .unwrap();
        let handshake = |cert: PathBuf, key: PathBuf, name: &'static str| {
            let ca = ca_file(dir.path());
            async move {
                let server = rustls::ServerConfig::builder_with_provider(provider())
                    .with_safe_default_protocol_versions()
                    .unwrap()
                    .with_no_client_auth()
                    .with_single_cert(load_certs(&cert).unwrap(), load_key(&key).unwrap())
                    .unwrap();
                let client = client_config(&ca, None).unwrap();
                let (near, far) = tokio::io::duplex(64 << 10);
                let accept = tokio_rustls::TlsAcceptor::from(std::sync::Arc::new(server));
                let served = tokio::spawn(async move { accept.accept(far).await.is_ok() });
                let name = rustls::pki_types::ServerName::try_from(name).unwrap();
                let dialled = tokio_rustls::TlsConnector::from(client)
                    .connect(name, near)
                    .await;
                let _ = served.await;
                dialled.is_ok()
            }
        };
        let replica = replica_files(dir.path(), 1);
        assert!(handshake(replica.cert_file, replica.key_file, "node-1").await);
        let (cert, key) = client_identity(dir.path(), "ops");
        assert!(!handshake(cert, key, "client-ops").await);
    }
}
