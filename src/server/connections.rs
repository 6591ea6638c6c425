//! The accept loop both ports share: every connection is served on its own task, after its
//! TLS handshake when the port speaks TLS.
//!
//! Why a task each: a connection's bytes are decoded inside its task, and a decoder can panic on
//! input it should have refused (tarpc's request decoder panics on a deadline that overflows the
//! clock). A panic then ends that task, which closes that one connection, while the listener and
//! every other connection carry on. Served inside one shared future, the same panic would stop
//! the port for everyone. The TLS handshake runs in that task too, under a timeout, so a client
//! that stalls or fails it never holds up the accept loop.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use rustls::pki_types::CertificateDer;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinSet;
use tokio_rustls::TlsAcceptor;

use super::guarded::PortGuard;
pub use super::guarded::PortLimits;
use crate::client::tls::Io;

/// How long a TLS handshake may take before the connection is dropped.
pub const TLS_HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(5);

/// An accepted connection, ready to serve.
pub struct Accepted {
    /// The connection's bytes (after TLS), under its port's [`PortLimits`].
    pub stream: Box<dyn Io>,
    pub peer: SocketAddr,
    /// The certificate the other side presented, when the port speaks TLS and it gave one.
    pub peer_certificate: Option<CertificateDer<'static>>,
}

/// Accepts on `listener` and runs `serve` for each connection on its own task, until `stop`
/// fires; then it ends every connection's task and returns once they are gone, so that nothing
/// of the replica they hold outlives its shutdown (a restart can reopen its storage at once).
/// Dropping this future instead also aborts the tasks, but without waiting for them.
///
/// Every connection is held to `limits`. At most `limits.connections_max` are open at once
/// (handshaking ones included): one more is closed as soon as it is accepted, before it costs
/// a handshake or a buffer.
pub async fn serve_each_connection<F, Fut>(
    port: &'static str,
    listener: TcpListener,
    tls: Option<TlsAcceptor>,
    limits: PortLimits,
    mut stop: watch::Receiver<bool>,
    serve: F,
) where
    F: Fn(Accepted) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = ()> + Send + 'static,
{
    let serve = Arc::new(serve);
    let connections_max = limits.connections_max;
    let guard = PortGuard::new(limits);
    let mut connections = JoinSet::new();
    loop {
        tokio::select! {
            // Stopping is the only change ever sent (or the sender is gone).
            _ = stop.changed() => break,
            accepted = listener.accept() => match accepted {
                Ok((tcp, peer)) => {
                    while connections.try_join_next().is_some() {}
                    if connections.len() >= connections_max {
                        tracing::warn!(port, %peer, connections_max, "connection refused: the port is full");
                        drop(tcp);
                        continue;
                    }
                    let (serve, tls, guard) = (serve.clone(), tls.clone(), guard.clone());
                    connections.spawn(async move {
                        if let Some(mut accepted) = handshake(port, tcp, peer, tls).await {
                            accepted.stream = Box::new(guard.guard(accepted.stream));
                            serve(accepted).await;
                        }
                    });
                }
                Err(error) => {
                    // Out of descriptors, say: try again shortly rather than spin.
                    tracing::warn!(%error, port, "accepting a connection failed");
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
            },
            Some(finished) = connections.join_next() => {
                if finished.is_err_and(|e| e.is_panic()) {
                    tracing::error!(port, "a connection's task panicked; that connection is closed");
                }
            }
        }
    }
    drop(listener);
    connections.shutdown().await;
}

/// Readies an accepted connection: `TCP_NODELAY`, then the TLS handshake under
/// [`TLS_HANDSHAKE_TIMEOUT`] when the port speaks TLS. `None` when the handshake fails or
/// stalls (logged; the connection is dropped).
async fn handshake(
    port: &'static str,
    tcp: TcpStream,
    peer: SocketAddr,
    tls: Option<TlsAcceptor>,
) -> Option<Accepted> {
    // Requests and answers are small frames: never hold one back for the other side's
    // delayed ACK.
    let _ = tcp.set_nodelay(true);
    let Some(tls) = tls else {
        return Some(Accepted {
            stream: Box::new(tcp),
            peer,
            peer_certificate: None,
        });
    };
    match tokio::time::timeout(TLS_HANDSHAKE_TIMEOUT, tls.accept(tcp)).await {
        Ok(Ok(stream)) => {
            let peer_certificate = stream
                .get_ref()
                .1
                .peer_certificates()
                .and_then(|chain| chain.first())
                .map(|c| c.clone().into_owned());
            Some(Accepted {
                stream: Box::new(stream),
                peer,
                peer_certificate,
            })
        }
        Ok(Err(error)) => {
            tracing::warn!(%peer, port, %error, "TLS handshake failed");
            None
        }
        Err(_) => {
            tracing::warn!(%peer, port, "TLS handshake timed out");
            None
        }
    }
}
