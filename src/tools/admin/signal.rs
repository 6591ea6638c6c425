//! Stopping on Ctrl-C or SIGTERM: the signal, and the error a command that stopped for it
//! returns (exit code 130).

/// Resolves on SIGINT or SIGTERM.
pub async fn shutdown_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = signal(SignalKind::terminate()).expect("installing the SIGTERM handler");
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
}

/// Interrupted by Ctrl-C or SIGTERM (exit code 130), after what the command started was
/// stopped and removed.
#[derive(Debug, thiserror::Error)]
#[error("interrupted: the replicas this command started were stopped and their folders removed")]
pub struct Interrupted;
