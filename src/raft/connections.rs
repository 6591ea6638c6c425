//! The accept loop both ports share: every connection is served on its own task.
//!
//! Why a task each: a connection's bytes are decoded inside its task, and a decoder can panic on
//! input it should have refused (tarpc's request decoder panics on a deadline that overflows the
//! clock). A panic then ends that task, which closes that one connection, while the listener and
//! every other connection carry on. Served inside one shared future, the same panic would stop
//! the port for everyone.

use std::future::Future;
use std::io;

use futures::{Stream, StreamExt};
use tokio::task::JoinSet;

/// Accepts from `incoming` and runs `serve` for each connection on its own task, until the
/// listener ends or this future is dropped (which aborts every connection's task).
pub async fn serve_each_connection<T, S, F, Fut>(port: &'static str, incoming: S, mut serve: F)
where
    S: Stream<Item = io::Result<T>>,
    F: FnMut(T) -> Fut,
    Fut: Future<Output = ()> + Send + 'static,
{
    let mut connections = JoinSet::new();
    let mut incoming = std::pin::pin!(incoming);
    loop {
        tokio::select! {
            accepted = incoming.next() => match accepted {
                Some(Ok(connection)) => {
                    connections.spawn(serve(connection));
                }
                Some(Err(error)) => {
                    tracing::warn!(%error, port, "accepting a connection failed");
                }
                None => break,
            },
            Some(finished) = connections.join_next() => {
                if finished.is_err_and(|e| e.is_panic()) {
                    tracing::error!(port, "a connection's task panicked; that connection is closed");
                }
            }
        }
    }
}
