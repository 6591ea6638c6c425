//! A replica's TLS, from the files its configuration names: the client port serves TLS (client
//! certificates optional, verified against the CA when given); the peer port requires mutual
//! TLS, and each Raft request must come from the node its certificate names (`node-<id>`,
//! checked in `peer.rs`); the replica dials its peers with its own certificate, expecting
//! the certificate of the node it dials (`raft::network`).

use std::sync::Arc;

use rustls::pki_types::{CertificateDer, ServerName};
use rustls::server::WebPkiClientVerifier;
use tokio_rustls::TlsAcceptor;
use x509_parser::extensions::GeneralName;

use crate::server::config::TlsFiles;
use crate::server::observe::expiry::CertificateExpiry;
use crate::wire::tls::{
    client_config, load_certs, load_key, load_roots, node_name, provider, TlsError,
};
use crate::NodeId;

pub struct ReplicaTls {
    pub clients: TlsAcceptor,
    /// The client port's, offering HTTP/2 by ALPN, which gRPC clients require.
    pub grpc: TlsAcceptor,
    pub peers: TlsAcceptor,
    pub to_peers: Arc<rustls::ClientConfig>,
    /// When the CA and the replica's certificate expire, for the metrics.
    pub expiries: Vec<CertificateExpiry>,
}

/// The expiry of the certificate file at `path`: the earliest `notAfter` of the certificates
/// it holds.
fn read_expiry(path: &std::path::Path, role: &'static str) -> Result<CertificateExpiry, TlsError> {
    let mut not_after = i64::MAX;
    for cert in load_certs(path)? {
        let (_, parsed) =
            x509_parser::parse_x509_certificate(cert.as_ref()).map_err(|e| TlsError::File {
                path: path.display().to_string(),
                reason: e.to_string(),
            })?;
        not_after = not_after.min(parsed.validity().not_after.timestamp());
    }
    Ok(CertificateExpiry {
        file: path.display().to_string(),
        role,
        not_after,
    })
}

impl ReplicaTls {
    /// Loads the files of replica `id`, refusing a certificate that does not name `node-<id>`:
    /// its peers would refuse every request it sent, so it is refused at start, naming whose
    /// it is.
    pub fn load(files: &TlsFiles, id: NodeId) -> Result<ReplicaTls, TlsError> {
        let roots = load_roots(&files.ca_file)?;
        let certs = load_certs(&files.cert_file)?;
        let named = certs.first().map(named_nodes).unwrap_or_default();
        if !named.contains(&id) {
            let whose = match &named[..] {
                [] => "names no node".to_string(),
                nodes => format!(
                    "is {}'s",
                    nodes
                        .iter()
                        .map(|n| node_name(*n))
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            };
            return Err(TlsError::File {
                path: files.cert_file.display().to_string(),
                reason: format!(
                    "the certificate {whose}, and this replica is {} (--id {id}): its peers \
                     would refuse it. Give it its own: one the cluster's CA issued for {}",
                    node_name(id),
                    node_name(id)
                ),
            });
        }
        let acceptor = |client_certificate_required: bool,
                        alpn: &[&[u8]]|
         -> Result<TlsAcceptor, TlsError> {
            let verifier = WebPkiClientVerifier::builder_with_provider(roots.clone(), provider());
            let verifier = if client_certificate_required {
                verifier.build()
            } else {
                verifier.allow_unauthenticated().build()
            }
            .map_err(|e| TlsError::Config(e.to_string()))?;
            let mut config = rustls::ServerConfig::builder_with_provider(provider())
                .with_safe_default_protocol_versions()
                .map_err(|e| TlsError::Config(e.to_string()))?
                .with_client_cert_verifier(verifier)
                .with_single_cert(certs.clone(), load_key(&files.key_file)?)
                .map_err(|e| TlsError::Config(e.to_string()))?;
            config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
            Ok(TlsAcceptor::from(Arc::new(config)))
        };
        Ok(ReplicaTls {
            clients: acceptor(false, &[])?,
            grpc: acceptor(false, &[b"h2"])?,
            peers: acceptor(true, &[])?,
            to_peers: client_config(&files.ca_file, Some((&files.cert_file, &files.key_file)))?,
            expiries: vec![
                read_expiry(&files.ca_file, "ca")?,
                read_expiry(&files.cert_file, "replica")?,
            ],
        })
    }
}

/// Whether `cert` (verified against the CA during the handshake) names `name`: a DNS name among
/// its subject alternative names. How a peer's `node-<id>` and a client's configured
/// certificate name are both checked.
pub fn certificate_names(cert: &webpki::EndEntityCert<'_>, name: &str) -> bool {
    ServerName::try_from(name)
        .is_ok_and(|name| cert.verify_is_valid_for_subject_name(&name).is_ok())
}

/// The nodes a certificate names: every `node-<id>` among its DNS subject alternative names.
/// Read from a certificate the handshake already verified against the CA; empty for one that
/// names none (a client's) or does not parse.
pub fn named_nodes(cert: &CertificateDer<'_>) -> Vec<NodeId> {
    let Ok((_, parsed)) = x509_parser::parse_x509_certificate(cert.as_ref()) else {
        return Vec::new();
    };
    let Ok(Some(names)) = parsed.subject_alternative_name() else {
        return Vec::new();
    };
    names
        .value
        .general_names
        .iter()
        .filter_map(|name| match name {
            GeneralName::DNSName(dns) => {
                dns.to_ascii_lowercase().strip_prefix("node-")?.parse().ok()
            }
            _ => None,
        })
        .collect()
}
