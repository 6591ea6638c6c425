//! The peer port: Raft RPCs from the other replicas. Each is checked against the nodes the
//! peer's certificate names when TLS is on, and against the membership (`RaftRpcServer::admit`).

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use futures::StreamExt;
use tarpc::context;
use tarpc::server::{BaseChannel, Channel};
use tokio_rustls::TlsAcceptor;

use crate::raft::network::{
    PeerAnswers, RaftRpc, RaftRpcRequest, RaftRpcResponse, PEER_FRAME_BYTES_MAX,
};
use crate::raft::storage::data_dir::{ClusterIdentity, Meeting};
use crate::raft::types::*;
use crate::server::ports::connections::{serve_each_connection, Framing, PortLimits};
use crate::server::ports::tls::named_nodes;
use crate::wire::tls::framed;
use crate::wire::version::{Hello, ProtocolOffer, PEER_REQUESTS_AFTER_V010};
use crate::wire::{ApiError, ClusterId};
use crate::NodeId;
use openraft::error::SnapshotMismatch;

#[derive(Clone)]
struct RaftRpcServer {
    /// The rules every incoming Raft request follows once admitted (shared with the
    /// simulation's network).
    answers: PeerAnswers,
    /// The nodes the calling peer's certificate names (TLS only): each request must claim
    /// to come from one of them.
    peer_nodes: Option<Arc<[NodeId]>>,
    /// What has arrived of the snapshot being received, shared by the port's connections.
    snapshot_chunks: Arc<SnapshotChunks>,
    /// The cluster this replica's directory records, shared by the port's connections.
    cluster: Arc<ClusterIdentity>,
    /// Set once the connection introduced another cluster: its Raft requests are refused.
    other_cluster: Arc<AtomicBool>,
    /// Where this replica serves gRPC, if it does, as `grpc_addr` answers.
    grpc_addr: Option<String>,
    /// The calling peer's address, for the logs.
    peer: SocketAddr,
}

/// Connections the peer port holds at once: a few per peer (one for Raft, a re-dial that
/// overlaps a dying one, a membership change's questions) with room to spare.
pub const PEER_CONNECTIONS_MAX: usize = 256;

/// What the peer port's connections may hold (see `ports::guarded`). A healthy peer sends a
/// heartbeat every few tens of milliseconds, so a minute of silence means a dead or stray
/// connection; a frame is at most [`PEER_FRAME_BYTES_MAX`], which a minute carries over any
/// link a cluster runs on; four frames of that size may arrive at once.
pub fn peer_port_limits() -> PortLimits {
    PortLimits {
        connections_max: PEER_CONNECTIONS_MAX,
        // A peer authenticates in its TLS handshake; a replica dials each peer once or twice.
        unauthenticated_max: PEER_CONNECTIONS_MAX / 4,
        unauthenticated_per_source_max: PEER_CONNECTIONS_MAX / 16,
        receiving_bytes_max: 4 * PEER_FRAME_BYTES_MAX,
        idle_timeout: std::time::Duration::from_secs(60),
        frame_read_timeout: std::time::Duration::from_secs(60),
    }
}

/// The largest snapshot the peer port receives. openraft writes a chunk at the offset its
/// sender names into an in-memory buffer, zero-filling any gap: without this bound, and the
/// no-gap rule below, one request could make the replica allocate whatever it is told.
pub const SNAPSHOT_BYTES_MAX: u64 = 1 << 30;

/// The snapshot being received and how many of its bytes arrived. A chunk may repeat what
/// arrived or continue it, never skip ahead: openraft's sender sends a snapshot in order
/// from offset 0, and starts over from 0 after any error, which a refusal here is.
#[derive(Default)]
struct SnapshotChunks {
    received: std::sync::Mutex<Option<(String, u64)>>,
}

impl SnapshotChunks {
    /// Admits a chunk of `len` bytes at `offset` of snapshot `id`, or names what was
    /// expected.
    fn admit(&self, id: &str, offset: u64, len: u64) -> Result<(), SnapshotMismatch> {
        let mut received = self.received.lock().expect("never poisoned");
        let end = offset.saturating_add(len);
        let expected = match &*received {
            Some((known, bytes)) if known == id => *bytes,
            _ => 0,
        };
        if offset > expected || end > SNAPSHOT_BYTES_MAX {
            return Err(SnapshotMismatch {
                expect: (id, expected.min(SNAPSHOT_BYTES_MAX)).into(),
                got: (id, offset).into(),
            });
        }
        *received = Some((id.to_string(), expected.max(end)));
        Ok(())
    }
}

impl RaftRpcServer {
    /// Admits a Raft request by its sender's certificate and this replica's membership
    /// ([`PeerAnswers::admit`]).
    fn admit<E: std::error::Error>(&self, vote: &Vote) -> Result<(), RaftError<E>> {
        if self.other_cluster.load(Ordering::Relaxed) {
            return Err(RaftError::Fatal(openraft::error::Fatal::Stopped));
        }
        self.answers.admit(vote, self.peer_nodes.as_deref())
    }

    /// Admits a handover notice: it must come from the leader this replica follows (and, with
    /// TLS, a certificate that names it), over a connection of this cluster.
    fn follows(&self, from: NodeId) -> Result<(), ApiError> {
        let named = self
            .peer_nodes
            .as_deref()
            .is_none_or(|nodes| nodes.contains(&from));
        let follows = self.answers.raft.metrics().borrow().current_leader == Some(from);
        if !(named && follows) || self.other_cluster.load(Ordering::Relaxed) {
            if let Some(refused) = self.answers.refusals.refused("a handover") {
                tracing::warn!(peer = %self.peer, from, refused, "refused a handover from a node that does not lead here (one line a second)");
            }
            return Err(ApiError::Rejected(format!(
                "replica {from} does not lead this replica: no handover"
            )));
        }
        Ok(())
    }
}

impl RaftRpc for RaftRpcServer {
    async fn append_entries(
        self,
        _: context::Context,
        request: AppendEntriesRequest,
    ) -> Result<AppendEntriesResponse, RaftError> {
        self.admit(&request.vote)?;
        match self.answers.append_entries(request).await {
            Ok(answer) => answer,
            Err(_divergence) => Err(RaftError::Fatal(openraft::error::Fatal::Stopped)),
        }
    }

    async fn vote(
        self,
        _: context::Context,
        request: VoteRequest,
    ) -> Result<VoteResponse, RaftError> {
        self.admit(&request.vote)?;
        self.answers.vote(request).await
    }

    async fn install_snapshot(
        self,
        _: context::Context,
        request: InstallSnapshotRequest,
    ) -> Result<InstallSnapshotResponse, RaftError<InstallSnapshotError>> {
        self.admit(&request.vote)?;
        let chunk_len = request.data.len() as u64;
        if let Err(mismatch) =
            self.snapshot_chunks
                .admit(&request.meta.snapshot_id, request.offset, chunk_len)
        {
            if let Some(refused) = self.answers.refusals.refused("a snapshot chunk") {
                tracing::warn!(%mismatch, refused, "refused a snapshot chunk (one line a second)");
            }
            return Err(RaftError::APIError(InstallSnapshotError::SnapshotMismatch(
                mismatch,
            )));
        }
        self.answers.install_snapshot(request).await
    }

    /// Names no sender to check: with TLS on, only the cluster's CA's certificates get here.
    /// Nothing this build sends a peer differs by version yet, so the version agreed is only
    /// answered, not kept.
    async fn hello(self, _: context::Context, offer: ProtocolOffer) -> Result<Hello, ApiError> {
        let hello = Hello::answering(&offer, PEER_REQUESTS_AFTER_V010)?;
        tracing::debug!(build = %offer.build, protocol = hello.protocol, "peer said hello");
        Ok(hello)
    }

    /// A stopping leader hands over: accepted from the leader this replica follows
    /// ([`follows`](Self::follows)), never from another node.
    async fn take_over(
        self,
        _: context::Context,
        from: NodeId,
        silent_for_ms: u64,
    ) -> Result<(), ApiError> {
        self.follows(from)?;
        let silent_for = std::time::Duration::from_millis(silent_for_ms);
        tracing::info!(from, silent_for_ms, "the leader hands over to this replica");
        self.answers.elections.handed_over(silent_for);
        Ok(())
    }

    /// Where this replica serves gRPC; not secret, so any peer the port admits may ask.
    async fn grpc_addr(self, _: context::Context) -> Option<String> {
        self.grpc_addr
    }

    /// A stopping leader hands over to another voter: accepted as `take_over` is.
    async fn stand_back(
        self,
        _: context::Context,
        from: NodeId,
        to: NodeId,
        silent_for_ms: u64,
    ) -> Result<(), ApiError> {
        self.follows(from)?;
        let silent_for = std::time::Duration::from_millis(silent_for_ms);
        tracing::info!(
            from,
            to,
            silent_for_ms,
            "the leader hands over to another voter; standing back"
        );
        self.answers.elections.stands_back(silent_for);
        Ok(())
    }

    /// Adopts the caller's cluster if this replica records none (durably, before the
    /// caller's first Raft request, which it sends only once answered), or refuses the
    /// connection's Raft requests if it records another ([`ClusterIdentity`]). Only a node
    /// this replica hears ([`PeerAnswers::trusts`]) gives it a cluster: from any other node
    /// certificate, a made-up id once shut a founding member out of its own cluster for good.
    async fn introduce(
        self,
        _: context::Context,
        theirs: Option<ClusterId>,
    ) -> Result<Option<ClusterId>, ApiError> {
        let trusted = (self.peer_nodes.as_deref())
            .is_none_or(|nodes| nodes.iter().any(|node| self.answers.trusts(*node)));
        if self.cluster.known().is_none() && !trusted {
            if let Some(refused) = self.answers.refusals.refused("an introduction") {
                tracing::warn!(
                    peer = %self.peer,
                    nodes = ?self.peer_nodes,
                    refused,
                    "refused an introduction from a node this replica does not hear: it \
                     records no cluster yet and takes one only from its founding members or \
                     the members it joins from (one line a second)"
                );
            }
            return Err(ApiError::Rejected(
                "this replica takes its cluster only from a member it hears".to_string(),
            ));
        }
        let cluster = self.cluster.clone();
        let meeting = tokio::task::spawn_blocking(move || cluster.meet(theirs))
            .await
            .map_err(|e| ApiError::Unavailable(e.to_string()))?
            .map_err(|e| {
                tracing::error!(error = %e, "could not record the cluster a peer introduced");
                ApiError::Unavailable(format!("recording the cluster id: {e}"))
            })?;
        match meeting {
            Meeting::Same => Ok(self.cluster.known()),
            Meeting::Other { ours, theirs } => {
                self.other_cluster.store(true, Ordering::Relaxed);
                if self.cluster.warn_about(&self.peer.ip().to_string()) {
                    tracing::warn!(
                        peer = %self.peer,
                        nodes = ?self.peer_nodes,
                        %ours,
                        %theirs,
                        "refused a peer of another cluster: this replica belongs to cluster \
                         {ours}, the caller's directory to {theirs} (a replica started on \
                         another cluster's directory, or pointed at this cluster's peers by \
                         mistake?); said again in a minute"
                    );
                }
                Err(ApiError::OtherCluster { ours, theirs })
            }
        }
    }
}

/// A bound, not yet serving, peer listener.
pub type PeerListener = tokio::net::TcpListener;
type ServingRequest = tarpc::ClientMessage<RaftRpcRequest>;
type ServingResponse = tarpc::Response<RaftRpcResponse>;

/// Binds the peer port.
pub async fn bind_peers(addr: SocketAddr) -> std::io::Result<PeerListener> {
    tokio::net::TcpListener::bind(addr).await
}

/// Serves Raft RPCs on every accepted connection until `stop` fires, over mutual TLS when `tls` is
/// given, admitting each and answering it by `answers`. A connection that introduces another
/// cluster than `cluster` is refused its Raft requests; one that sends a malformed frame is
/// closed; the others keep going.
pub async fn serve_peers(
    listener: PeerListener,
    answers: PeerAnswers,
    cluster: Arc<ClusterIdentity>,
    grpc_addr: Option<String>,
    tls: Option<TlsAcceptor>,
    stop: tokio::sync::watch::Receiver<bool>,
) {
    let snapshot_chunks = Arc::new(SnapshotChunks::default());
    serve_each_connection(
        "peer",
        Framing::LengthPrefixed,
        listener,
        tls,
        peer_port_limits(),
        stop,
        move |accepted| {
            // A certificate that names no node (a container's, say: the same CA signs both)
            // is refused before its frames, up to 256 MiB, are read.
            let peer_nodes: Option<Arc<[NodeId]>> = accepted
                .peer_certificate
                .as_ref()
                .map(|der| named_nodes(der).into());
            let server = RaftRpcServer {
                answers: answers.clone(),
                snapshot_chunks: snapshot_chunks.clone(),
                peer_nodes,
                cluster: cluster.clone(),
                other_cluster: Arc::default(),
                grpc_addr: grpc_addr.clone(),
                peer: accepted.peer,
            };
            async move {
                if server
                    .peer_nodes
                    .as_ref()
                    .is_some_and(|nodes| nodes.is_empty())
                {
                    if let Some(refused) = server.answers.refusals.refused("no node named") {
                        tracing::warn!(
                            peer = %accepted.peer,
                            refused,
                            "refused a peer connection: its certificate names no node (one line \
                             a second)"
                        );
                    }
                    return;
                }
                // A peer authenticates in its handshake (its certificate names the node each
                // request is then checked against).
                accepted.admission.authenticated();
                let transport = framed::<_, ServingRequest, ServingResponse>(
                    accepted.stream,
                    PEER_FRAME_BYTES_MAX,
                );
                BaseChannel::with_defaults(transport)
                    .execute(server.serve())
                    // In-flight requests run concurrently inside this connection's task rather
                    // than as a task each: no spawn and no cross-thread wake-up per request.
                    .for_each_concurrent(None, |response| response)
                    .await;
            }
        },
    )
    .await;
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Goal: a snapshot arrives in order or not at all: a chunk may repeat or continue what
    /// arrived, a new snapshot starts at 0, and a chunk past a gap or past
    /// `SNAPSHOT_BYTES_MAX` is refused, naming the offset expected.
    #[test]
    fn snapshot_chunks_arrive_in_order_within_the_bound() {
        let chunks = SnapshotChunks::default();
        assert!(chunks.admit("s1", 0, 100).is_ok());
        assert!(chunks.admit("s1", 100, 100).is_ok());
        assert!(chunks.admit("s1", 50, 100).is_ok(), "a resent chunk");
        let gap = chunks.admit("s1", 1 << 40, 1).unwrap_err();
        assert_eq!(gap.expect.offset, 200);
        assert!(
            chunks.admit("s2", 10, 1).is_err(),
            "a new snapshot starts at 0"
        );
        assert!(chunks.admit("s2", 0, SNAPSHOT_BYTES_MAX + 1).is_err());
        assert!(chunks.admit("s2", 0, 10).is_ok());
    }
}
