//! The peer port: Raft RPCs from the other replicas, each checked against the sender that the
//! peer's certificate names when TLS is on.

use std::net::SocketAddr;
use std::sync::Arc;

use futures::StreamExt;
use rustls::pki_types::CertificateDer;
use tarpc::context;
use tarpc::server::{BaseChannel, Channel};
use tokio_rustls::TlsAcceptor;

use super::connections::serve_each_connection;
use super::tls::certificate_names_node;
use crate::client::tls::framed;
use crate::log::vocabulary::LEVEL_MAX;
use crate::log::Level;
use crate::raft::elector::ElectionTimer;
use crate::raft::network::{RaftRpc, RaftRpcRequest, RaftRpcResponse, PEER_FRAME_BYTES_MAX};
use crate::raft::types::*;
use crate::NodeId;
use openraft::error::SnapshotMismatch;

#[derive(Clone)]
struct RaftRpcServer {
    raft: Raft,
    /// Told of every leader this replica accepts and every vote it grants.
    elections: Arc<ElectionTimer>,
    /// The certificate the calling peer presented (TLS only): it must name the node that
    /// each request claims to come from.
    peer: Option<Arc<PeerCertificate>>,
    /// What has arrived of the snapshot being received, shared by the port's connections.
    snapshot_chunks: Arc<SnapshotChunks>,
}

/// Connections the peer port holds at once: a few per peer (one for Raft, a re-dial that
/// overlaps a dying one, a membership change's questions) with room to spare.
pub const PEER_CONNECTIONS_MAX: usize = 256;

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

/// A peer connection's certificate, and the node it was last found to name. A connection
/// comes from one peer, so its requests all claim the same sender: the certificate is parsed
/// once per connection rather than once per Raft request. A refused claim is never cached.
struct PeerCertificate {
    der: CertificateDer<'static>,
    verified_sender: std::sync::Mutex<Option<NodeId>>,
}

impl RaftRpcServer {
    /// Refuses a request whose claimed sender is not the node the peer's certificate names.
    fn check_sender<E: std::error::Error>(&self, claimed: NodeId) -> Result<(), RaftError<E>> {
        let Some(peer) = &self.peer else {
            return Ok(());
        };
        let mut verified = peer.verified_sender.lock().expect("never poisoned");
        if *verified != Some(claimed) {
            if !certificate_names_node(&peer.der, claimed) {
                tracing::warn!(
                    claimed,
                    "a peer's certificate does not name the node it claims to be"
                );
                return Err(RaftError::Fatal(openraft::error::Fatal::Stopped));
            }
            *verified = Some(claimed);
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
        self.check_sender(request.vote.leader_id().voted_for().unwrap_or_default())?;
        let answer = self.raft.append_entries(request).await?;
        self.elections.answered_append_entries(&answer);
        Ok(answer)
    }

    async fn vote(
        self,
        _: context::Context,
        request: VoteRequest,
    ) -> Result<VoteResponse, RaftError> {
        self.check_sender(request.vote.leader_id().voted_for().unwrap_or_default())?;
        let answer = self.raft.vote(request).await?;
        self.elections.answered_vote(&answer);
        Ok(answer)
    }

    async fn install_snapshot(
        self,
        _: context::Context,
        request: InstallSnapshotRequest,
    ) -> Result<InstallSnapshotResponse, RaftError<InstallSnapshotError>> {
        self.check_sender(request.vote.leader_id().voted_for().unwrap_or_default())?;
        let chunk_len = request.data.len() as u64;
        if let Err(mismatch) =
            self.snapshot_chunks
                .admit(&request.meta.snapshot_id, request.offset, chunk_len)
        {
            tracing::warn!(%mismatch, "refused a snapshot chunk");
            return Err(RaftError::APIError(InstallSnapshotError::SnapshotMismatch(
                mismatch,
            )));
        }
        let sender_vote = request.vote;
        let answer = self.raft.install_snapshot(request).await?;
        self.elections
            .answered_install_snapshot(&sender_vote, &answer);
        Ok(answer)
    }

    /// Names no sender to check: with TLS on, only the cluster's CA's certificates get here.
    async fn vocabulary_level_max(self, _: context::Context) -> Level {
        LEVEL_MAX
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
/// given. A connection that sends a malformed frame is closed; the others keep going.
pub async fn serve_peers(
    listener: PeerListener,
    raft: Raft,
    elections: Arc<ElectionTimer>,
    tls: Option<TlsAcceptor>,
    stop: tokio::sync::watch::Receiver<bool>,
) {
    let snapshot_chunks = Arc::new(SnapshotChunks::default());
    serve_each_connection(
        "peer",
        listener,
        tls,
        PEER_CONNECTIONS_MAX,
        stop,
        move |accepted| {
            let server = RaftRpcServer {
                raft: raft.clone(),
                elections: elections.clone(),
                snapshot_chunks: snapshot_chunks.clone(),
                peer: accepted.peer_certificate.map(|der| {
                    Arc::new(PeerCertificate {
                        der,
                        verified_sender: std::sync::Mutex::new(None),
                    })
                }),
            };
            async move {
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
