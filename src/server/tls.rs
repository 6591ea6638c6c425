//! A replica's TLS, from the files its configuration names: the client port serves TLS (client
//! certificates optional, verified against the CA when given); the peer port requires mutual
//! TLS, and each Raft request must come from the node its certificate names (`node-<id>`,
//! checked in `peers.rs`); the replica dials its peers with its own certificate.

use std::sync::Arc;

use rustls::pki_types::{CertificateDer, ServerName};
use rustls::server::WebPkiClientVerifier;
use tokio_rustls::TlsAcceptor;

use super::config::TlsFiles;
use crate::client::tls::{client_config, load_certs, load_key, load_roots, provider, TlsError};
use crate::NodeId;

pub struct ReplicaTls {
    pub clients: TlsAcceptor,
    pub peers: TlsAcceptor,
    pub to_peers: Arc<rustls::ClientConfig>,
}

impl ReplicaTls {
    pub fn load(files: &TlsFiles) -> Result<ReplicaTls, TlsError> {
        let roots = load_roots(&files.ca_file)?;
        let acceptor = |client_certificate_required: bool| -> Result<TlsAcceptor, TlsError> {
            let verifier = WebPkiClientVerifier::builder_with_provider(roots.clone(), provider());
            let verifier = if client_certificate_required {
                verifier.build()
            } else {
                verifier.allow_unauthenticated().build()
            }
            .map_err(|e| TlsError::Config(e.to_string()))?;
            let config = rustls::ServerConfig::builder_with_provider(provider())
                .with_safe_default_protocol_versions()
                .map_err(|e| TlsError::Config(e.to_string()))?
                .with_client_cert_verifier(verifier)
                .with_single_cert(load_certs(&files.cert_file)?, load_key(&files.key_file)?)
                .map_err(|e| TlsError::Config(e.to_string()))?;
            Ok(TlsAcceptor::from(Arc::new(config)))
        };
        Ok(ReplicaTls {
            clients: acceptor(false)?,
            peers: acceptor(true)?,
            to_peers: client_config(&files.ca_file, Some((&files.cert_file, &files.key_file)))?,
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

/// The name a replica's certificate carries: `node-<id>`.
pub fn node_name(id: NodeId) -> String {
    format!("node-{id}")
}

/// Whether `cert` names node `id` (`node-<id>`).
pub fn certificate_names_node(cert: &CertificateDer<'_>, id: NodeId) -> bool {
    webpki::EndEntityCert::try_from(cert).is_ok_and(|end| certificate_names(&end, &node_name(id)))
}
