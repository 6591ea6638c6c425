//! The one openraft type configuration, and short names for openraft's generic types so that
//! the rest of the crate does not spell out their parameters.

use std::io::Cursor;

use crate::client::Member;
use crate::jobs::Outcome;
use crate::log::Batch;
use crate::NodeId;

openraft::declare_raft_types!(
    /// ctrlog's Raft: an entry carries a [`Batch`] of commands; applying it yields one
    /// [`Outcome`] per command.
    pub TypeConfig:
        D = Batch,
        R = Vec<Outcome>,
        NodeId = NodeId,
        Node = Member,
        Entry = openraft::Entry<TypeConfig>,
        SnapshotData = Cursor<Vec<u8>>,
        AsyncRuntime = openraft::TokioRuntime,
);

pub type Raft = openraft::Raft<TypeConfig>;
pub type Entry = openraft::Entry<TypeConfig>;
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
