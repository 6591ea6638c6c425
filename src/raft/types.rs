//! The one openraft type configuration, and short names for openraft's generic types so that
//! the rest of the crate does not spell out their parameters.

use std::io::Cursor;
use std::sync::Arc;

use crate::jobs::Outcome;
use crate::log::Batch;
use crate::wire::{ApiError, Member};
use crate::NodeId;

openraft::declare_raft_types!(
    /// ctrlog's Raft: an entry carries a [`Batch`] of commands; applying it yields one
    /// [`Outcome`] per command. The batch is shared (`Arc`, encoded exactly as the batch
    /// itself), so that the copies openraft makes of an entry, for each follower and for the
    /// state machine, and the log's window of recent entries cost a reference count each.
    pub TypeConfig:
        D = Arc<Batch>,
        R = Vec<Outcome>,
        NodeId = NodeId,
        Node = Member,
        Entry = openraft::Entry<TypeConfig>,
        SnapshotData = Cursor<Vec<u8>>,
        AsyncRuntime = openraft::TokioRuntime,
);

pub type Raft = openraft::Raft<TypeConfig>;
pub type Entry = openraft::Entry<TypeConfig>;

/// The encoded bytes of the commands an entry carries (blank and membership entries carry
/// none to speak of): what bounds the recent-entries window and an AppendEntries message.
pub fn payload_bytes(entry: &Entry) -> usize {
    match &entry.payload {
        openraft::EntryPayload::Normal(batch) => {
            batch.proposals.iter().map(|p| p.encoded_len()).sum()
        }
        openraft::EntryPayload::Blank | openraft::EntryPayload::Membership(_) => 0,
    }
}
pub type LogId = openraft::LogId<NodeId>;
pub type Vote = openraft::Vote<NodeId>;
pub type StorageError = openraft::StorageError<NodeId>;
pub type StorageIOError = openraft::StorageIOError<NodeId>;
pub type StoredMembership = openraft::StoredMembership<NodeId, Member>;
pub type SnapshotMeta = openraft::SnapshotMeta<NodeId, Member>;
pub type Snapshot = openraft::Snapshot<TypeConfig>;
pub type RaftError<E = openraft::error::Infallible> = openraft::error::RaftError<NodeId, E>;
pub type RpcError<E = openraft::error::Infallible> =
    openraft::error::RPCError<NodeId, Member, RaftError<E>>;
pub type ClientWriteError = openraft::error::ClientWriteError<NodeId, Member>;
pub type AppendEntriesRequest = openraft::raft::AppendEntriesRequest<TypeConfig>;
pub type AppendEntriesResponse = openraft::raft::AppendEntriesResponse<NodeId>;
pub type VoteRequest = openraft::raft::VoteRequest<NodeId>;
pub type VoteResponse = openraft::raft::VoteResponse<NodeId>;
pub type InstallSnapshotRequest = openraft::raft::InstallSnapshotRequest<TypeConfig>;
pub type InstallSnapshotResponse = openraft::raft::InstallSnapshotResponse<NodeId>;
pub type InstallSnapshotError = openraft::error::InstallSnapshotError;
pub type RaftMetrics = openraft::RaftMetrics<NodeId, Member>;
pub type RaftServerMetrics = openraft::metrics::RaftServerMetrics<NodeId, Member>;

/// `NotLeader`, naming the leader (and its client address) where it is known. The one place
/// that spells out a redirect, whether Raft refused a write or a replica knows it does not
/// lead.
pub fn not_leader(leader_id: Option<NodeId>, leader: Option<&Member>) -> ApiError {
    ApiError::NotLeader {
        leader_id,
        leader_client_addr: leader.map(|m| m.client_addr.clone()),
    }
}

/// `NotLeader` as this replica's metrics know the leader.
pub fn not_leader_from(metrics: &RaftMetrics) -> ApiError {
    let leader = metrics
        .current_leader
        .and_then(|id| metrics.membership_config.membership().get_node(&id));
    not_leader(metrics.current_leader, leader)
}

/// What a write Raft refused (an append, a membership change) means to the client.
impl From<ClientWriteError> for ApiError {
    fn from(error: ClientWriteError) -> ApiError {
        match error {
            ClientWriteError::ForwardToLeader(forward) => {
                not_leader(forward.leader_id, forward.leader_node.as_ref())
            }
            ClientWriteError::ChangeMembershipError(e) => ApiError::Rejected(e.to_string()),
        }
    }
}

impl From<RaftError<ClientWriteError>> for ApiError {
    fn from(error: RaftError<ClientWriteError>) -> ApiError {
        match error {
            RaftError::APIError(e) => e.into(),
            RaftError::Fatal(e) => ApiError::Unavailable(e.to_string()),
        }
    }
}
