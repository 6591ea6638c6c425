//! The accept loop both ports share: every connection is served on its own task, after its
//! TLS handshake when the port speaks TLS.
//!
//! Why a task each: a connection's bytes are decoded inside its task, and a decoder can panic on
//! input it should have refused (tarpc's request decoder panics on a deadline that overflows the
//! clock). A panic then ends that task, which closes that one connection, while the listener and
//! every other connection carry on. Served inside one shared future, the same panic would stop
//! the port for everyone. The TLS handshake runs in that task too, under a timeout, so a client
//! that stalls or fails it never holds up the accept loop.
//!
//! Until a connection has authenticated (its handshake done, and with authentication on a
//! credential shown), it is one of the port's *unauthenticated* connections, which are held to
//! a pool of their own ([`PortLimits::unauthenticated_max`], and a share per source address):
//! when the pool is full the oldest is closed to make room. So connections that never
//! authenticate cannot fill the port (3d7237e: 4,096 of them locked everyone out), and the
//! rest of the port stays for connections that did. A port without TLS has nothing to
//! authenticate with, and its connections never enter the pool.

use std::collections::{BTreeMap, HashMap};
use std::future::Future;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rustls::pki_types::CertificateDer;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::{AbortHandle, JoinSet};
use tokio_rustls::TlsAcceptor;

use crate::raft::refusals::Refusals;
use crate::server::ports::guarded::PortGuard;
pub use crate::server::ports::guarded::{Framing, PortLimits};
use crate::wire::tls::Io;

/// How long a TLS handshake may take before the connection is dropped.
pub const TLS_HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(5);

/// An accepted connection, ready to serve.
pub struct Accepted {
    /// The connection's bytes (after TLS), under its port's [`PortLimits`].
    pub stream: Box<dyn Io>,
    pub peer: SocketAddr,
    /// The certificate the other side presented, when the port speaks TLS and it gave one.
    pub peer_certificate: Option<CertificateDer<'static>>,
    /// Its place among the port's unauthenticated connections, until
    /// [`Admission::authenticated`].
    pub admission: Admission,
}

/// The port's connections that have not authenticated yet, oldest first.
struct Unauthenticated {
    max: usize,
    per_source_max: usize,
    inner: Mutex<UnauthenticatedInner>,
    /// The port's refusal lines, one a second per cause.
    refusals: Arc<Refusals>,
}

#[derive(Default)]
struct UnauthenticatedInner {
    next_id: u64,
    /// By admission order: the source, and how to close the connection's task.
    by_age: BTreeMap<u64, (IpAddr, Option<AbortHandle>)>,
    per_source: HashMap<IpAddr, usize>,
}

impl UnauthenticatedInner {
    fn remove(&mut self, id: u64) -> Option<(IpAddr, Option<AbortHandle>)> {
        let (source, handle) = self.by_age.remove(&id)?;
        if let Some(count) = self.per_source.get_mut(&source) {
            *count -= 1;
            if *count == 0 {
                self.per_source.remove(&source);
            }
        }
        Some((source, handle))
    }
}

impl Unauthenticated {
    /// Admits a connection from `source`, closing the oldest unauthenticated one if the pool
    /// is full; `None` if `source` already holds its share.
    fn admit(self: &Arc<Self>, port: &'static str, source: IpAddr) -> Option<Admission> {
        let mut inner = self.inner.lock().expect("never poisoned");
        let held = inner.per_source.get(&source).copied().unwrap_or(0);
        if held >= self.per_source_max {
            if let Some(refused) = self.refusals.refused("unauthenticated share") {
                tracing::warn!(port, %source, held, refused, "connection refused: its source holds its share of unauthenticated connections (one line a second)");
            }
            return None;
        }
        if inner.by_age.len() >= self.max {
            let oldest = *inner.by_age.keys().next().expect("the pool is full");
            if let Some((evicted, Some(handle))) = inner.remove(oldest) {
                if let Some(closed) = self.refusals.refused("unauthenticated evicted") {
                    tracing::warn!(port, %evicted, closed, "closed the oldest unauthenticated connection to make room (one line a second)");
                }
                handle.abort();
            }
        }
        let id = inner.next_id;
        inner.next_id += 1;
        inner.by_age.insert(id, (source, None));
        *inner.per_source.entry(source).or_default() += 1;
        Some(Admission {
            pool: self.clone(),
            id,
            authenticated: Arc::default(),
        })
    }

    fn serving(&self, id: u64, handle: AbortHandle) {
        if let Some(entry) = self
            .inner
            .lock()
            .expect("never poisoned")
            .by_age
            .get_mut(&id)
        {
            entry.1 = Some(handle);
        }
    }

    fn leave(&self, id: u64) {
        self.inner.lock().expect("never poisoned").remove(id);
    }
}

/// A connection's place among its port's unauthenticated connections; it leaves them once
/// [`authenticated`](Self::authenticated), or when the connection ends.
pub struct Admission {
    pool: Arc<Unauthenticated>,
    id: u64,
    /// Set once it authenticated; its guard reads it before each frame.
    authenticated: Arc<AtomicBool>,
}

impl Admission {
    /// The connection authenticated: it no longer counts against the unauthenticated pool and
    /// cannot be closed to make room in it, and it may send frames past
    /// [`UNAUTHENTICATED_FRAME_BYTES_MAX`](crate::server::ports::guarded::UNAUTHENTICATED_FRAME_BYTES_MAX).
    pub fn authenticated(&self) {
        self.authenticated.store(true, Ordering::Release);
        self.pool.leave(self.id);
    }
}

impl Drop for Admission {
    fn drop(&mut self) {
        self.pool.leave(self.id);
    }
}

/// Accepts on `listener` and runs `serve` for each connection on its own task, until `stop`
/// fires; then it ends every connection's task and returns once they are gone, so that nothing
/// of the replica they hold outlives its shutdown (a restart can reopen its storage at once).
/// Dropping this future instead also aborts the tasks, but without waiting for them.
///
/// Every connection is held to `limits`. At most `limits.connections_max` are open at once
/// (handshaking ones included): one more is closed as soon as it is accepted, before it costs
/// a handshake or a buffer. Of those, the unauthenticated ones are held to
/// `limits.unauthenticated_max` and `limits.unauthenticated_per_source_max` (see the module's
/// docs); `serve` calls [`Admission::authenticated`] once its connection has.
pub async fn serve_each_connection<F, Fut>(
    port: &'static str,
    framing: Framing,
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
    let refusals = Arc::new(Refusals::default());
    let unauthenticated = Arc::new(Unauthenticated {
        max: limits.unauthenticated_max,
        per_source_max: limits.unauthenticated_per_source_max,
        inner: Mutex::default(),
        refusals: refusals.clone(),
    });
    let guard = PortGuard::new(limits, framing);
    let mut connections = JoinSet::new();
    loop {
        tokio::select! {
            // Stopping is the only change ever sent (or the sender is gone).
            _ = stop.changed() => break,
            accepted = listener.accept() => match accepted {
                Ok((tcp, peer)) => {
                    while connections.try_join_next().is_some() {}
                    if connections.len() >= connections_max {
                        if let Some(refused) = refusals.refused("port full") {
                            tracing::warn!(port, %peer, connections_max, refused, "connection refused: the port is full (one line a second)");
                        }
                        drop(tcp);
                        continue;
                    }
                    let Some(admission) = unauthenticated.admit(port, peer.ip()) else {
                        drop(tcp);
                        continue;
                    };
                    // Without TLS there is nothing to authenticate with (authentication needs
                    // TLS): such a connection is as authenticated as it will ever be.
                    if tls.is_none() {
                        admission.authenticated();
                    }
                    let id = admission.id;
                    let (serve, tls, guard) = (serve.clone(), tls.clone(), guard.clone());
                    let refusals = refusals.clone();
                    let handle = connections.spawn(async move {
                        if let Some(mut accepted) = handshake(port, tcp, peer, tls, admission, &refusals).await {
                            let authenticated = accepted.admission.authenticated.clone();
                            accepted.stream = Box::new(guard.guard(accepted.stream, authenticated));
                            serve(accepted).await;
                        }
                    });
                    unauthenticated.serving(id, handle);
                }
                Err(error) => {
                    // Out of descriptors, say: try again shortly rather than spin.
                    if let Some(failed) = refusals.refused("accept failed") {
                        tracing::warn!(%error, port, failed, "accepting a connection failed (one line a second)");
                    }
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
    admission: Admission,
    refusals: &Refusals,
) -> Option<Accepted> {
    // Requests and answers are small frames: never hold one back for the other side's
    // delayed ACK.
    let _ = tcp.set_nodelay(true);
    let Some(tls) = tls else {
        return Some(Accepted {
            stream: Box::new(tcp),
            peer,
            peer_certificate: None,
            admission,
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
                admission,
            })
        }
        Ok(Err(error)) => {
            if let Some(failed) = refusals.refused("TLS handshake failed") {
                tracing::warn!(%peer, port, %error, failed, "TLS handshake failed (one line a second)");
            }
            None
        }
        Err(_) => {
            if let Some(timed_out) = refusals.refused("TLS handshake timed out") {
                tracing::warn!(%peer, port, timed_out, "TLS handshake timed out (one line a second)");
            }
            None
        }
    }
}

/// Open files a replica needs besides its client and status-port connections: the peer port's
/// connections and dials, WAL segments, sled's files, the launcher's containers' pipes.
pub const OPEN_FILES_BESIDES_CONNECTIONS: u64 = 1024;

/// Raises this process's soft limit on open files to `wanted`, as far as its hard limit
/// allows, and returns the soft limit now in force. Many systems start a process at a soft
/// limit of 1,024: `accept` would then fail (EMFILE) long before the client port's connection
/// cap, and the cap that keeps room for authenticated principals would never be reached. The
/// hard limit is the operator's to raise (`LimitNOFILE=` in a systemd unit); short of
/// `wanted`, this warns and serves with what there is.
pub fn raise_open_files_limit(wanted: u64) -> std::io::Result<u64> {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes one rlimit into the struct passed, which lives for the call.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    // rlim_t is u64 on Linux, the one platform ctrlog runs on.
    let (soft, hard) = (limit.rlim_cur, limit.rlim_max);
    let raised = wanted.min(hard).max(soft);
    if raised > soft {
        limit.rlim_cur = raised;
        // SAFETY: setrlimit reads one rlimit from the struct passed, which lives for the call.
        if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &limit) } != 0 {
            return Err(std::io::Error::last_os_error());
        }
    }
    if raised < wanted {
        tracing::warn!(
            open_files_max = raised,
            wanted,
            "the hard limit on open files is below what the configured connection caps need; \
             raise it (LimitNOFILE= in the service unit, or ulimit -Hn) or lower \
             client_connections_max"
        );
    }
    Ok(raised)
}
