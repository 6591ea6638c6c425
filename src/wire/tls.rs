//! TLS for ctrlog's connections (rustls with the `ring` provider): loading PEM files, the
//! client's configuration, and a framed tarpc transport over any byte stream.
//!
//! Identities: a replica's certificate names it `node-<id>` (a DNS name in its subject
//! alternative names) next to the addresses it serves on; clients verify a replica by the
//! address they dialled. Peers verify each other's `node-<id>`.

use std::path::Path;
use std::sync::Arc;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio_util::codec::LengthDelimitedCodec;

/// Why TLS material could not be used.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// A PEM file could not be read, or does not hold what it should (no certificate, no
    /// key, a certificate the trust store refuses): fix the file.
    #[error("{path}: {reason}")]
    File {
        /// The file, as given.
        path: String,
        /// What was wrong with it.
        reason: String,
    },
    /// rustls refused the configuration built from the files (a key that does not suit its
    /// certificate, for example), or a name to check a certificate against is not a valid
    /// host name: fix the configuration.
    #[error("TLS configuration: {0}")]
    Config(String),
}

fn file_error(path: &Path, reason: impl ToString) -> TlsError {
    TlsError::File {
        path: path.display().to_string(),
        reason: reason.to_string(),
    }
}

/// Every certificate in a PEM file (a chain, or a CA bundle).
pub fn load_certs(path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let certs = CertificateDer::pem_file_iter(path)
        .map_err(|e| file_error(path, e))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| file_error(path, e))?;
    if certs.is_empty() {
        return Err(file_error(path, "holds no certificate"));
    }
    Ok(certs)
}

/// The private key in a PEM file.
pub fn load_key(path: &Path) -> Result<PrivateKeyDer<'static>, TlsError> {
    PrivateKeyDer::from_pem_file(path).map_err(|e| file_error(path, e))
}

/// The trust anchors of a CA file.
pub fn load_roots(ca: &Path) -> Result<Arc<rustls::RootCertStore>, TlsError> {
    let mut roots = rustls::RootCertStore::empty();
    for cert in load_certs(ca)? {
        roots.add(cert).map_err(|e| file_error(ca, e))?;
    }
    Ok(Arc::new(roots))
}

pub(crate) fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// A client configuration trusting `ca`, presenting `identity` (certificate chain and key
/// files) if given.
pub fn client_config(
    ca: &Path,
    identity: Option<(&Path, &Path)>,
) -> Result<Arc<rustls::ClientConfig>, TlsError> {
    let builder = rustls::ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| TlsError::Config(e.to_string()))?
        .with_root_certificates(load_roots(ca)?);
    let config = match identity {
        Some((cert, key)) => builder
            .with_client_auth_cert(load_certs(cert)?, load_key(key)?)
            .map_err(|e| TlsError::Config(e.to_string()))?,
        None => builder.with_no_client_auth(),
    };
    Ok(Arc::new(config))
}

/// The name a client checks a replica's certificate against: the host part of the address
/// it dialled (an IP address or a DNS name).
pub fn server_name(addr: &str) -> Result<ServerName<'static>, TlsError> {
    let host = addr
        .rsplit_once(':')
        .map_or(addr, |(host, _)| host)
        .trim_start_matches('[')
        .trim_end_matches(']');
    ServerName::try_from(host.to_string())
        .map_err(|e| TlsError::Config(format!("`{host}` is not a host name: {e}")))
}

/// A byte stream a connection runs over: plain TCP or TLS.
pub trait Io: AsyncRead + AsyncWrite + Send + Unpin {}
impl<T: AsyncRead + AsyncWrite + Send + Unpin> Io for T {}

/// The name a replica's certificate carries: `node-<id>`.
pub fn node_name(id: crate::NodeId) -> String {
    format!("node-{id}")
}

/// Why dialling a replica failed.
#[derive(Debug, thiserror::Error)]
pub enum DialError {
    /// No TCP connection (refused, unreachable, reset): the replica may be down.
    #[error("connecting to {addr}: {source}")]
    Connect {
        /// The address dialled.
        addr: String,
        /// Why the connection failed.
        source: std::io::Error,
    },
    /// The TLS handshake failed.
    #[error("TLS with {addr}: {source}")]
    Tls {
        /// The address dialled.
        addr: String,
        /// Why the handshake failed; it wraps a [`rustls::Error`] when TLS refused a
        /// certificate, which [`DialError::is_permanent`] reports.
        source: std::io::Error,
    },
    /// The name to check the certificate against is not one.
    #[error("{0}")]
    Name(TlsError),
}

impl DialError {
    /// Whether dialling again cannot help: TLS refused a certificate (the replica's, or this
    /// side's), which a configuration change fixes and a retry does not. A handshake cut short
    /// by the network is not permanent.
    pub fn is_permanent(&self) -> bool {
        match self {
            DialError::Connect { .. } => false,
            DialError::Name(_) => true,
            DialError::Tls { source, .. } => source
                .get_ref()
                .is_some_and(|inner| inner.downcast_ref::<rustls::Error>().is_some()),
        }
    }
}

/// Opens a connection to `addr`: TCP with `TCP_NODELAY`, then TLS when `tls` is given,
/// checking the replica's certificate against the host part of `addr`. How clients dial the
/// client port.
pub async fn dial(
    addr: &str,
    tls: Option<&Arc<rustls::ClientConfig>>,
) -> Result<Box<dyn Io>, DialError> {
    dial_expecting(addr, tls, None).await
}

/// [`dial`], checking the certificate against `expected` (when given) instead of the host
/// part of `addr`. A replica dials its peer `id` expecting [`node_name`]`(id)`, with its own
/// certificate in `tls`, so that an address that leads to another replica (a stale DNS
/// record, a swapped configuration) fails the handshake instead of reaching the wrong node.
pub async fn dial_expecting(
    addr: &str,
    tls: Option<&Arc<rustls::ClientConfig>>,
    expected: Option<&str>,
) -> Result<Box<dyn Io>, DialError> {
    let tcp = tokio::net::TcpStream::connect(addr)
        .await
        .map_err(|source| DialError::Connect {
            addr: addr.to_string(),
            source,
        })?;
    // Requests and answers are small frames: without this, Nagle's algorithm can hold one back
    // until the peer's delayed ACK, tens of milliseconds later.
    let _ = tcp.set_nodelay(true);
    match tls {
        None => Ok(Box::new(tcp)),
        Some(tls) => {
            let name = match expected {
                Some(expected) => ServerName::try_from(expected.to_string()).map_err(|e| {
                    DialError::Name(TlsError::Config(format!(
                        "`{expected}` is not a certificate name: {e}"
                    )))
                })?,
                None => server_name(addr).map_err(DialError::Name)?,
            };
            let stream = tokio_rustls::TlsConnector::from(tls.clone())
                .connect(name, tcp)
                .await
                .map_err(|source| DialError::Tls {
                    addr: addr.to_string(),
                    source,
                })?;
            Ok(Box::new(stream))
        }
    }
}

/// Why a replica refused a client, when the refusal arrives as bytes rather than as an
/// answer; shared between a [`WatchedStream`] and its dialler.
pub(crate) type Refusal = Arc<std::sync::Mutex<Option<String>>>;

/// A client's stream that records in its [`Refusal`] a refusal retrying cannot fix: a
/// plaintext client reading a TLS record (the replica speaks TLS), or a TLS alert (TLS 1.3
/// lets a replica refuse the client's certificate after the client finished its handshake).
/// Either ends the connection as a read error; the dialler then reads why. No v0.1.0 answer
/// starts with a TLS record's first byte: its length prefix would claim over 300 MB.
pub(crate) struct WatchedStream<S> {
    inner: S,
    plaintext: bool,
    answered: bool,
    refusal: Refusal,
}

impl<S> WatchedStream<S> {
    pub(crate) fn new(inner: S, plaintext: bool, refusal: Refusal) -> WatchedStream<S> {
        WatchedStream {
            inner,
            plaintext,
            answered: false,
            refusal,
        }
    }

    fn refused(&self, why: String) {
        self.refusal
            .lock()
            .expect("never poisoned")
            .get_or_insert(why);
    }
}

/// The first byte of a TLS alert record and of a handshake record.
const TLS_RECORD_FIRST_BYTES: [u8; 2] = [0x15, 0x16];

impl<S: AsyncRead + Unpin> AsyncRead for WatchedStream<S> {
    fn poll_read(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        use std::task::Poll;
        let before = buf.filled().len();
        let read = std::pin::Pin::new(&mut self.inner).poll_read(cx, buf);
        match &read {
            Poll::Ready(Ok(())) if self.plaintext && !self.answered => {
                if let Some(first) = buf.filled().get(before) {
                    self.answered = true;
                    if TLS_RECORD_FIRST_BYTES.contains(first) {
                        self.refused(
                            "the replica speaks TLS and this client does not: give it the \
                             cluster's CA (--ca or CTRLOG_CA)"
                                .into(),
                        );
                        let error = "the replica answered with TLS";
                        return Poll::Ready(Err(std::io::Error::new(
                            std::io::ErrorKind::InvalidData,
                            error,
                        )));
                    }
                }
            }
            Poll::Ready(Err(error)) => {
                let alert = error
                    .get_ref()
                    .and_then(|e| e.downcast_ref::<rustls::Error>());
                if let Some(rustls::Error::AlertReceived(alert)) = alert {
                    self.refused(format!(
                        "the replica refused this client's TLS ({alert:?}): is its certificate \
                         signed by the cluster's CA?"
                    ));
                }
            }
            _ => {}
        }
        read
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for WatchedStream<S> {
    fn poll_write(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        std::pin::Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_flush(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

/// A length-delimited bincode tarpc transport over `stream`, with a frame limit: what
/// `tarpc::serde_transport::tcp` builds, for any stream (plain TCP or TLS).
pub fn framed<S, Item, SinkItem>(
    stream: S,
    frame_bytes_max: usize,
) -> tarpc::serde_transport::Transport<
    S,
    Item,
    SinkItem,
    tarpc::tokio_serde::formats::Bincode<Item, SinkItem>,
>
where
    S: AsyncRead + AsyncWrite,
    Item: for<'de> serde::Deserialize<'de>,
    SinkItem: serde::Serialize,
{
    let framed = LengthDelimitedCodec::builder()
        .max_frame_length(frame_bytes_max)
        .new_framed(stream);
    tarpc::serde_transport::new(framed, tarpc::tokio_serde::formats::Bincode::default())
}
