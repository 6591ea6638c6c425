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

#[derive(Clone)]
struct RaftRpcServer {
    raft: Raft,
    /// Told of every leader this replica accepts and every vote it grants.
    elections: Arc<ElectionTimer>,
    /// The certificate the calling peer presented (TLS only): it must name the node that
    /// each request claims to come from.
    peer: Option<Arc<PeerCertificate>>,
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
    serve_each_connection("peer", listener, tls, stop, move |accepted| {
        let server = RaftRpcServer {
            raft: raft.clone(),
            elections: elections.clone(),
            peer: accepted.peer_certificate.map(|der| {
                Arc::new(PeerCertificate {
                    der,
                    verified_sender: std::sync::Mutex::new(None),
                })
            }),
        };
        async move {
            let transport =
                framed::<_, ServingRequest, ServingResponse>(accepted.stream, PEER_FRAME_BYTES_MAX);
            BaseChannel::with_defaults(transport)
                .execute(server.serve())
                // In-flight requests run concurrently inside this connection's task rather
                // than as a task each: no spawn and no cross-thread wake-up per request.
                .for_each_concurrent(None, |response| response)
                .await;
        }
    })
    .await;
}
