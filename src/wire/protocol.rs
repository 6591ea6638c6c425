//! The wire protocol on every replica's client port: the `ControlLog` tarpc service and the
//! types it carries. Pure serde data, shared by the replica (which serves it) and the client
//! library (which calls it).

use std::collections::BTreeMap;
use std::fmt;

use serde::{Deserialize, Serialize};

use crate::jobs::{JobState, Rejection, RejectionLog};
use crate::log::{
    ContainerId, Epoch, Filter, Kind, Level, LogEntry, Offset, ProducerId, Proposal, Seq, TaskId,
};
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

/// The cluster a replica belongs to: drawn at random by the founder that initialises it,
/// recorded in every replica's data directory, and compared when two replicas' peer
/// connections meet (`introduce` on the peer port), so that a replica of one cluster never
/// takes part in another's elections or log (etcd's cluster ID, KRaft's `cluster.id`).
/// Written as 32 hexadecimal digits.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct ClusterId(pub u128);

impl fmt::Display for ClusterId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:032x}", self.0)
    }
}

impl std::str::FromStr for ClusterId {
    type Err = String;

    fn from_str(text: &str) -> Result<ClusterId, String> {
        if text.len() != 32 || !text.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(format!("`{text}` is not 32 hexadecimal digits"));
        }
        u128::from_str_radix(text, 16)
            .map(ClusterId)
            .map_err(|e| format!("`{text}`: {e}"))
    }
}

impl fmt::Display for Member {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.peer_addr, self.client_addr)
    }
}

/// Every error a caller can act on. Travels over tarpc, so it is plain data.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
// New variants come last (their wire index), and callers outside the crate must allow for
// them.
#[non_exhaustive]
pub enum ApiError {
    /// This replica is not the leader. Retry at the leader, if one is known.
    #[error("not the leader; the leader is {leader_id:?} at {leader_client_addr:?}")]
    NotLeader {
        /// The leader's node id, if this replica knows one.
        leader_id: Option<NodeId>,
        /// Where the leader takes clients, if it is known and in the membership; the client
        /// library retries there.
        leader_client_addr: Option<String>,
    },
    /// The command is larger than the configured limit.
    #[error("command of {size} bytes exceeds the {limit}-byte limit")]
    TooLarge {
        /// The size of the command's body, in bytes.
        size: u64,
        /// The replica's limit on a command's body, in bytes
        /// ([`COMMAND_BYTES_MAX_DEFAULT`](crate::log::COMMAND_BYTES_MAX_DEFAULT) by default).
        limit: u64,
    },
    /// The requested offset is below the first retained one: load the state (`state()`) and
    /// resume after its offset. The client library's subscription does this by itself.
    #[error(
        "offsets below {first_offset} are compacted; a snapshot covers up to {snapshot_offset}"
    )]
    Compacted {
        /// The lowest offset still in this replica's log.
        first_offset: Offset,
        /// The last offset this replica's snapshot covers.
        snapshot_offset: Offset,
    },
    /// The producer's sequence number is too far below its newest one for the replicated
    /// de-duplication table to tell a retry from a late first attempt, so nothing was
    /// appended. The client library's flow control prevents this; callers choosing their own
    /// sequence numbers must keep unanswered ones within the window.
    #[error("sequence {seq} of producer {producer} is below its window, which starts at {lowest}")]
    SequenceOutOfWindow {
        /// The producer that appended.
        producer: ProducerId,
        /// The sequence number refused.
        seq: Seq,
        /// The lowest sequence number of this producer the replicas still decide: its
        /// highest accepted one less [`PRODUCER_WINDOW`](crate::jobs::PRODUCER_WINDOW), plus
        /// one.
        lowest: Seq,
    },
    /// The sender's `(container, epoch)` is not a live session (it expired, deregistered or
    /// registered again). A container that gets this must stop work and register anew.
    #[error("container {container} epoch {epoch} is fenced (current epoch: {current_epoch:?})")]
    Fenced {
        /// The container the request named.
        container: ContainerId,
        /// The epoch the request carried.
        epoch: Epoch,
        /// The container's live epoch if it registered again since; `None` if it has no
        /// live session.
        current_epoch: Option<Epoch>,
    },
    /// The `(kind, version)` is deprecated at the recorded vocabulary level; write its
    /// successor. Entries of it already in the log stay readable.
    #[error("kind {kind} version {version} is deprecated at vocabulary level {level}")]
    Deprecated {
        /// The refused command's kind.
        kind: Kind,
        /// The refused command's version.
        version: u16,
        /// The level the log records, at or above the one that deprecated it.
        level: Level,
    },
    /// The job model refused the command (see the reason); it took no offset.
    #[error("refused: {0}")]
    Refused(Rejection),
    /// This connection already has the maximum number of requests in flight. Retry once some
    /// have been answered, or open another connection.
    #[error("too many requests in flight on this connection (limit {in_flight_max})")]
    Overloaded {
        /// The connection's limit that was reached: requests in flight, or, for a fetch,
        /// fetches waiting for their answer.
        in_flight_max: u32,
    },
    /// The request itself is malformed (an invalid container id, a zero limit, ...); retrying
    /// it unchanged will not help.
    #[error("invalid request: {0}")]
    Invalid(String),
    /// The request was refused for a reason stated in the message; retrying will not help.
    #[error("rejected: {0}")]
    Rejected(String),
    /// The replica could not complete the request now (no quorum, no leader known, storage
    /// trouble); retrying later, possibly elsewhere, may help.
    #[error("unavailable: {0}")]
    Unavailable(String),
    /// The replica is shutting down.
    #[error("the replica is shutting down")]
    ShuttingDown,
    /// The cluster requires credentials and this connection has none that it accepts (no
    /// client certificate it knows, no token, or a wrong one).
    #[error("unauthorized: {0}")]
    Unauthorized(String),
    /// The credentials are known, but their role may not do this.
    #[error("forbidden: {principal} may not {action}")]
    Forbidden {
        /// Who the connection's credentials (client certificate or token) name.
        principal: String,
        /// What it may not do, in words (for example `change the membership`).
        action: String,
    },
    /// The answer would not fit this port's frames. A job state this large is read in pieces
    /// with `state_chunk`, which the client library does by itself. (A replica of v0.1.0
    /// closed the connection instead, so no older client ever receives this.)
    #[error("the answer of {size} bytes exceeds this port's {limit}-byte answers")]
    AnswerTooLarge {
        /// The encoded answer's size, in bytes.
        size: u64,
        /// The most bytes this port's answers carry (its client frame limit less
        /// [`ANSWER_ENVELOPE_BYTES_MAX`]).
        limit: u64,
    },
    /// The replicas no longer remember this producer (more than 65,536 others appended since
    /// its last append) and `seq` is above those a producer begins with, so this may be the
    /// retry of an append that is in the log already; nothing was appended, and retrying
    /// will not help. Whether the earlier attempt committed is unknown: look for it in the
    /// log. Later appends need a new producer (`ControlClient::new_producer`). Answered from
    /// vocabulary level 3 on; below it such an append is taken for new.
    #[error(
        "producer {producer} is no longer remembered; seq {seq} may be a retry of an append \
         in the log already"
    )]
    ProducerForgotten {
        /// The producer the replicas no longer remember.
        producer: ProducerId,
        /// The sequence number of the append, above
        /// [`PRODUCER_WINDOW`](crate::jobs::PRODUCER_WINDOW).
        seq: Seq,
    },
    /// `members add` of a replica whose build knows vocabulary levels only up to
    /// `supported`, below the level the log records: it would stop applying once it caught
    /// up. Nothing was added; upgrade it first.
    #[error(
        "replica {member} knows vocabulary levels up to {supported}, but the log records level \
         {recorded}: upgrade it before adding it (nothing was added)"
    )]
    MemberLevelUnsupported {
        /// The node id of the replica that was not added.
        member: NodeId,
        /// The highest vocabulary level its build knows.
        supported: Level,
        /// The level the log records.
        recorded: Level,
    },
    /// The `hello` of a connection offered only protocol versions this replica does not
    /// speak (a build too new or too old for it). Nothing else is served on the connection
    /// until a `hello` agrees.
    #[error(
        "protocol versions {offered_min}..={offered_max} offered, but this replica speaks \
         {supported_min}..={supported_max}"
    )]
    ProtocolUnsupported {
        /// The lowest version offered.
        offered_min: u16,
        /// The highest version offered.
        offered_max: u16,
        /// The lowest version this replica speaks.
        supported_min: u16,
        /// The highest version this replica speaks.
        supported_max: u16,
    },
    /// The peer port's `introduce`: the calling replica's data directory belongs to another
    /// cluster than this one's. Nothing is served on the connection. A replica started on a
    /// directory of an earlier cluster (or pointed at the wrong cluster's peers) meets this:
    /// give it a directory of its own cluster, or an empty one to join as a new replica.
    #[error("this replica is of cluster {ours}; the caller's directory is of cluster {theirs}")]
    OtherCluster {
        /// The cluster the answering replica belongs to.
        ours: ClusterId,
        /// The cluster the caller said it belongs to.
        theirs: ClusterId,
    },
}

impl ApiError {
    /// Whether the same request may succeed later or at another replica.
    pub fn is_retriable(&self) -> bool {
        matches!(
            self,
            ApiError::NotLeader { .. }
                | ApiError::Overloaded { .. }
                | ApiError::Unavailable(_)
                | ApiError::ShuttingDown
        )
    }
}

impl From<Rejection> for ApiError {
    fn from(rejection: Rejection) -> ApiError {
        match rejection {
            Rejection::Fenced {
                container,
                epoch,
                current_epoch,
            } => ApiError::Fenced {
                container,
                epoch,
                current_epoch,
            },
            Rejection::Deprecated {
                kind,
                version,
                level,
            } => ApiError::Deprecated {
                kind,
                version,
                level,
            },
            other => ApiError::Refused(other),
        }
    }
}

/// How an append was answered.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct AppendAck {
    /// The command's offset in the control log.
    pub offset: Offset,
    /// True when this `(producer, seq)` had been appended before: `offset` is the original
    /// one and nothing new was appended.
    pub duplicate: bool,
}

/// A read of the committed log from an offset: a long poll.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FetchRequest {
    /// The first offset wanted.
    pub from: Offset,
    /// Upper bound on entries returned.
    pub entries_max: u32,
    /// Upper bound on command bytes returned (at least one entry is returned if any matches).
    pub bytes_max: u32,
    /// How long to wait for a matching entry when there is none yet. The replica clamps it
    /// below the request's deadline, so a long poll answers (possibly empty) before the caller
    /// gives up on it.
    pub max_wait_ms: u32,
    /// Once a poll that had to wait is woken by a new entry, wait this much longer to collect
    /// the entries that follow it into the same answer (like Kafka's `fetch.min.bytes` wait):
    /// a little latency for far fewer answers when many subscribers follow the head.
    pub linger_ms: u32,
    /// Which commands to return. Entries that do not match are skipped, and `next_offset`
    /// moves past them.
    pub filter: Filter,
}

impl FetchRequest {
    /// Everything from `from`, with generous limits and no waiting.
    pub fn from(from: Offset) -> FetchRequest {
        FetchRequest {
            from,
            entries_max: 1024,
            bytes_max: 4 << 20,
            max_wait_ms: 0,
            linger_ms: 0,
            filter: Filter::Everything,
        }
    }
}

/// The answer to a fetch: the matching entries, and where to ask next.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FetchResponse {
    /// Matching entries in increasing offset order, none below `from`. Without a filter they
    /// are consecutive, starting at `from`.
    pub entries: Vec<LogEntry>,
    /// The offset to ask for next: every offset below it was either returned or did not match.
    pub next_offset: Offset,
    /// The last offset applied (hence committed) on this replica when the response was built.
    pub applied_offset: Offset,
}

/// The leader's answer to a heartbeat.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct HeartbeatAck {
    /// The leader's applied offset: a container whose subscription is far behind it knows.
    pub applied_offset: Offset,
}

/// The folded job state as of one offset.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct StateAt {
    /// The last offset folded into `state`.
    pub offset: Offset,
    /// The job as the log describes it at `offset`. Shared, not copied: the replica answers
    /// every reader of one offset with the state its state machine holds (encoded as the
    /// state itself, so the wire is that of v0.1.0).
    pub state: std::sync::Arc<JobState>,
    /// The commands the job model refused up to then.
    pub rejections: RejectionLog,
}

/// One replica in a [`Status`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MemberStatus {
    /// The replica's node id.
    pub id: NodeId,
    /// Its peer and client addresses.
    pub member: Member,
    /// True for a voter; false for a learner (a replica being added that has not caught up).
    pub voter: bool,
}

/// A replica's view of the cluster.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Status {
    /// This replica's node id.
    pub id: NodeId,
    /// `Leader`, `Leader without quorum`, `Follower`, `Candidate`, `Learner` or `Shutdown`.
    pub role: String,
    /// The Raft term this replica is in.
    pub term: u64,
    /// The leader this replica knows of; `None` when it knows none (a leader cut off from
    /// its quorum knows none).
    pub leader_id: Option<NodeId>,
    /// Every replica in the membership, voters and learners.
    pub members: Vec<MemberStatus>,
    /// The Raft index of the last entry in this replica's log (`None` while it is empty).
    /// Raft indices count Raft entries (batches of commands, membership changes), not
    /// offsets.
    pub last_log_index: Option<u64>,
    /// The Raft index of the last entry applied here (`None` before the first).
    pub applied_index: Option<u64>,
    /// The last offset applied here. Offsets are numbered when entries are applied, so this is
    /// also the highest offset this replica knows to be committed.
    pub applied_offset: Offset,
    /// The lowest offset still in the log; below it only the snapshot remains.
    pub first_offset: Offset,
    /// The last offset the current snapshot covers (0 without one).
    pub snapshot_offset: Offset,
    /// The vocabulary level recorded in the log.
    pub vocabulary_level: Level,
    /// The highest vocabulary level this replica's build supports
    /// ([`LEVEL_MAX`](crate::log::vocabulary::LEVEL_MAX)).
    pub vocabulary_level_max: Level,
    /// The Raft index the current snapshot covers up to (`None` without one).
    pub snapshot_index: Option<u64>,
    /// The Raft index of the last entry purged from the log, which the snapshot covers
    /// (`None` before the first purge).
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
    /// Appends one command at the leader; answered once it is committed and applied.
    async fn append(proposal: Proposal) -> Result<AppendAck, ApiError>;
    /// Reads committed entries from an offset, waiting up to `max_wait_ms` for one to match.
    async fn fetch(request: FetchRequest) -> Result<FetchResponse, ApiError>;
    /// The JobState as of this replica's applied offset, once that is at least `min_offset`
    /// (waiting up to `max_wait_ms` for it; `Unavailable` if it is not reached).
    async fn state(min_offset: Offset, max_wait_ms: u32) -> Result<StateAt, ApiError>;
    /// This replica's view of the cluster.
    async fn status() -> Result<Status, ApiError>;
    /// A container's session is alive, with its consumer lag per task. Leader only; held in
    /// the leader's memory, never written to the log. `Fenced` once the session has ended.
    async fn heartbeat(
        container: ContainerId,
        epoch: Epoch,
        lag: BTreeMap<TaskId, u64>,
    ) -> Result<HeartbeatAck, ApiError>;
    /// Adds a replica: as a learner first, promoted to voter once it has caught up.
    async fn add_member(id: NodeId, member: Member) -> Result<(), ApiError>;
    /// Removes a replica from the cluster.
    async fn remove_member(id: NodeId) -> Result<(), ApiError>;
    /// Takes a snapshot now (followed by the purge the retention allows); answers with the
    /// last offset it covers.
    async fn snapshot() -> Result<Offset, ApiError>;
    /// Presents a bearer token for the rest of this connection; answers with the principal
    /// it names. (A client certificate the cluster knows needs no token.)
    async fn authenticate(token: String) -> Result<String, ApiError>;
    /// Appends several commands at the leader, each exactly as `append` would (checked,
    /// deduplicated and answered on its own), in one request: what the producers sharing a
    /// connection queued while their earlier appends were in flight. At most
    /// [`APPEND_MANY_PROPOSALS_MAX`] proposals of at most [`APPEND_MANY_BYTES_MAX`] encoded
    /// bytes in all (one larger command goes alone, through `append`).
    async fn append_many(
        proposals: Vec<Proposal>,
    ) -> Result<Vec<Result<AppendAck, ApiError>>, ApiError>;
    /// One piece of a job state too large for one `state` answer (`AnswerTooLarge`). Chunk 0
    /// encodes the state as of this replica's applied offset, which must be at least
    /// `offset`, and says how many chunks it has and which offset it is as of; ask for the
    /// other chunks at that offset, on the same connection. `Invalid` if the connection no
    /// longer holds that state (start again from chunk 0).
    async fn state_chunk(offset: Offset, chunk: u32) -> Result<StateChunk, ApiError>;
    /// The version handshake ([`version`](super::version)): the first request on a
    /// connection, before `authenticate` and without credentials. A connection that sends
    /// none is served as v0.1.0 served it.
    async fn hello(offer: ProtocolOffer) -> Result<Hello, ApiError>;
    /// This replica's storage: whether its log was found damaged and is being repaired from
    /// the leader. Added after protocol 2 and last, so the requests before it keep their wire
    /// form; a replica whose `hello` does not list it repairs nothing.
    async fn storage_status() -> Result<StorageStatus, ApiError>;
    /// The read index, for a linearizable read (leader only, `NotLeader` elsewhere): the
    /// leader confirms with a quorum of voters that it still leads (a round of heartbeats,
    /// openraft's `ensure_linearizable`), waits until it has applied every entry committed
    /// when asked, and answers with its applied offset. A `state` with that `min_offset`, at
    /// any replica, holds every write acknowledged before this call. `Unavailable` when no
    /// quorum confirms. Added last, after `storage_status`, listed in `hello`.
    async fn read_index() -> Result<Offset, ApiError>;
    /// Hands the leadership over to the voter `to` (leader only, `NotLeader` elsewhere): the
    /// leader falls silent once `to` holds its log and tells it to stand, which it does as
    /// the voters' leases lapse; answered with `to` once it leads. Appends meanwhile are
    /// answered `NotLeader` naming `to`. Added last, listed in `hello`.
    async fn transfer_leader(to: NodeId) -> Result<NodeId, ApiError>;
}

/// A replica's storage, as `storage_status` reports it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct StorageStatus {
    /// The replica that answers.
    pub id: NodeId,
    /// The repair of its damaged log under way, if any: until it ends, the replica neither
    /// votes for a candidate less up to date than what it held nor stands for election.
    pub repairing: Option<Repairing>,
}

/// Damage found in a replica's log, which the leader has not yet sent again.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Repairing {
    /// The first Raft index the damage took.
    pub first_damaged: u64,
    /// The Raft index of the last entry the log held before the damage.
    pub held_index: u64,
    /// The segment file where the damage starts.
    pub segment: String,
    /// The byte of that segment where it starts.
    pub byte: u64,
}

impl std::fmt::Display for Repairing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "repairing: entries {}..{} damaged ({} at byte {})",
            self.first_damaged, self.held_index, self.segment, self.byte
        )
    }
}

/// What one side of a connection speaks: the first request's argument (the version
/// handshake's rules are in [`version`](super::version)).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProtocolOffer {
    /// The lowest protocol version the sender speaks.
    pub min: u16,
    /// The highest protocol version the sender speaks.
    pub max: u16,
    /// The sender's build (for example `ctrlog 0.2.0`), for the other side's logs.
    pub build: String,
}

/// The answer to `hello`: how the connection speaks from now on.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Hello {
    /// The version agreed on: the highest both sides speak.
    pub protocol: u16,
    /// What the server speaks, and its build.
    pub server: ProtocolOffer,
    /// The requests the server serves beyond those of
    /// [`PROTOCOL_V010`](super::version::PROTOCOL_V010); a caller sends one of them only if
    /// it is listed.
    pub requests: Vec<String>,
    /// The highest vocabulary level the server's build knows: a leader asks before it adds a
    /// replica or raises the level.
    pub vocabulary_level_max: Level,
}

/// A piece of an encoded [`StateAt`]: the chunks' bytes, in order, decode to it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct StateChunk {
    /// The offset the state is as of.
    pub offset: Offset,
    /// This piece's number, from 0.
    pub chunk: u32,
    /// How many pieces the state is in.
    pub chunks: u32,
    /// This piece's bytes, at most the port's answer size: the pieces' bytes in order are
    /// the [`StateAt`] in the log's codec ([`decode`](crate::log::decode)).
    #[serde(with = "serde_bytes")]
    pub bytes: Vec<u8>,
}

/// What an answer adds around the entries it carries: tarpc's response header, the result and
/// enum tags, the vector length, the offsets. Generous: it only has to be an upper bound. A
/// replica bounds a fetch answer's entries to its client frame limit less this, so that the
/// answer always encodes within the frame limit.
pub const ANSWER_ENVELOPE_BYTES_MAX: usize = 4 << 10;

/// The most proposals one `append_many` carries.
pub const APPEND_MANY_PROPOSALS_MAX: usize = 1024;

/// A command body larger than this is accepted by no replica, whatever its configuration
/// (`command_bytes_max` is at most a little under 4 MiB: a follower catching up must receive
/// a full batch of such commands in one peer frame). A client refuses one at once
/// ([`ApiError::TooLarge`]), without a round trip that would end in a closed connection.
pub const COMMAND_BYTES_MAX_ANY_REPLICA: usize = 4 << 20;

/// The most encoded proposal bytes one `append_many` carries. A replica's client frame limit
/// is at least twice this (`ReplicaConfig::validate`), so a batch always fits.
pub const APPEND_MANY_BYTES_MAX: usize = 64 << 10;
