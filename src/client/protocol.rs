//! The wire protocol on every replica's client port: the `ControlLog` tarpc service and the
//! types it carries. Pure serde data, shared by the replica (which serves it) and the client
//! library (which calls it).

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::jobs::Outcome;
use crate::log::{LogEntry, Offset, Proposal};
use crate::NodeId;

/// The addresses of one replica, stored in the Raft membership so that any replica can tell a
/// client where the leader's client port is.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Member {
    /// Where peers send Raft RPCs.
    pub peer_addr: String,
    /// Where clients and containers connect.
    pub client_addr: String,
}

impl fmt::Display for Member {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.peer_addr, self.client_addr)
    }
}

/// Every error a caller can act on. Travels over tarpc, so it is plain data.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
pub enum ApiError {
    /// This replica is not the leader. Retry at the leader, if one is known.
    #[error("not the leader; the leader is {leader_id:?} at {leader_client_addr:?}")]
    NotLeader {
        leader_id: Option<NodeId>,
        leader_client_addr: Option<String>,
    },
    /// The command is larger than the configured limit.
    #[error("command of {size} bytes exceeds the {limit}-byte limit")]
    TooLarge { size: u64, limit: u64 },
    /// The requested offset is below the first retained one: load the snapshot and resume at
    /// `snapshot_offset + 1`.
    #[error(
        "offsets below {first_offset} are compacted; a snapshot covers up to {snapshot_offset}"
    )]
    Compacted {
        first_offset: Offset,
        snapshot_offset: Offset,
    },
    /// The request was refused for a reason stated in the message; retrying will not help.
    #[error("rejected: {0}")]
    Rejected(String),
    /// The replica could not complete the request now (no quorum, storage trouble); retrying
    /// later may help.
    #[error("unavailable: {0}")]
    Unavailable(String),
    /// The replica is shutting down.
    #[error("the replica is shutting down")]
    ShuttingDown,
}

/// What an append was answered with.
pub type AppendResult = Result<Outcome, ApiError>;

/// A read of the committed log from an offset.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FetchRequest {
    /// The first offset wanted.
    pub from: Offset,
    /// Upper bound on entries returned.
    pub entries_max: u32,
    /// Upper bound on body bytes returned (at least one entry is returned if any is available).
    pub bytes_max: u32,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FetchResponse {
    /// Consecutive entries starting at `from`.
    pub entries: Vec<LogEntry>,
    /// The offset to ask for next.
    pub next_offset: Offset,
    /// The last offset applied on this replica when the response was built.
    pub applied_offset: Offset,
}

/// One replica in a [`Status`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MemberStatus {
    pub id: NodeId,
    pub member: Member,
    pub voter: bool,
}

/// A replica's view of the cluster.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Status {
    pub id: NodeId,
    /// `Leader`, `Follower`, `Candidate` or `Learner`.
    pub role: String,
    pub term: u64,
    pub leader_id: Option<NodeId>,
    pub members: Vec<MemberStatus>,
    pub last_log_index: Option<u64>,
    pub applied_index: Option<u64>,
    pub applied_offset: Offset,
    pub snapshot_index: Option<u64>,
    pub purged_index: Option<u64>,
}

impl Status {
    /// The leader's client address, if the leader is known and in the membership.
    pub fn leader_client_addr(&self) -> Option<&str> {
        let leader = self.leader_id?;
        self.members
            .iter()
            .find(|m| m.id == leader)
            .map(|m| m.member.client_addr.as_str())
    }
}

/// The service on every replica's client port.
#[tarpc::service]
pub trait ControlLog {
    /// Appends one command; answered once it is committed and applied.
    async fn append(proposal: Proposal) -> AppendResult;
    /// Reads committed entries from an offset.
    async fn fetch(request: FetchRequest) -> Result<FetchResponse, ApiError>;
    /// This replica's view of the cluster.
    async fn status() -> Status;
    /// Adds a replica: as a learner first, promoted to voter once it has caught up.
    async fn add_member(id: NodeId, member: Member) -> Result<(), ApiError>;
    /// Removes a replica from the cluster.
    async fn remove_member(id: NodeId) -> Result<(), ApiError>;
}
