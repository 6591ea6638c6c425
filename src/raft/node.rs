//! A replica: storage, Raft, the peer and client listeners and the proposer, wired together.

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use openraft::error::{ClientWriteError, RaftError};
use openraft::{ServerState, SnapshotPolicy};
use tokio::task::JoinHandle;

use super::auth::Authenticator;
use super::config::{ConfigError, ReplicaConfig};
use super::http::{bind_http, serve_http, Telemetry};
use super::log_store::LogStore;
use super::meta_store::{Closed, MetaStore};
use super::network::{bind_peers, serve_peers, PeerNetwork};
use super::proposer::{Proposer, BATCH_BYTES_MAX};
use super::service::{bind_clients, serve_clients};
use super::state_machine::{entry_commands, log_entry, StateMachineStore};
use super::tls::ReplicaTls;
use super::types::{Raft, RaftMetrics};
use crate::client::{
    AnswerSlot, ApiError, AppendAck, FetchRequest, FetchResponse, HeartbeatAck, Member,
    MemberStatus, StateAt, Status,
};
use crate::jobs::{Liveness, Outcome, Rejection, Session};
use crate::log::vocabulary::{kinds, LEVEL_MAX};
use crate::log::{Command, ContainerId, Epoch, Filter, Offset, Proposal, Target, TaskId};
use crate::NodeId;

/// Entries per AppendEntries message. With batches of up to [`BATCH_BYTES_MAX`] plus one
/// command, this keeps a message well inside the peer frame limit.
pub const RAFT_PAYLOAD_ENTRIES_MAX: u64 = 64;

/// Raft entries one fetch reads at most, whatever its filter skips: bounds the work of one
/// request (a container filtering for itself may skip thousands of commands per entry read).
pub const FETCH_ENTRIES_SCANNED_MAX: usize = 64;

/// The most command bytes one fetch answer carries, whatever the request asks (beyond one
/// command, which is always returned whole): bounds the memory an answer pins while its
/// reader is slow.
pub const FETCH_ANSWER_BYTES_MAX: usize = 4 << 20;

/// How long `Replica::shutdown` lets its listeners end their connections before aborting them.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(5);

/// How long `snapshot` waits for the snapshot it triggered.
const SNAPSHOT_WAIT_MAX: Duration = Duration::from_secs(30);

/// How long a new learner may take to catch up before `add_member` gives up on promoting it.
pub const MEMBER_CATCH_UP_TIMEOUT: Duration = Duration::from_secs(60);

/// A learner this close to the leader's last entry counts as caught up. Under traffic the
/// leader keeps appending, so demanding exact equality could wait forever.
const MEMBER_CATCH_UP_ENTRIES_MAX: u64 = 64;

/// Why a replica did not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error("storage: {0}")]
    Storage(#[from] std::io::Error),
    #[error("raft: {0}")]
    Raft(String),
    #[error("tls: {0}")]
    Tls(String),
    #[error("auth: {0}")]
    Auth(String),
}

struct Inner {
    id: NodeId,
    raft: Raft,
    log: LogStore,
    state_machine: StateMachineStore,
    proposer: Proposer,
    peer_addr: SocketAddr,
    client_addr: SocketAddr,
    command_bytes_max: usize,
    /// Heartbeats heard while this replica leads (reset when a new term begins).
    liveness: std::sync::Mutex<Liveness>,
    telemetry: Telemetry,
    http_addr: Option<SocketAddr>,
}

/// A cheap, cloneable handle to a running replica: the library API.
#[derive(Clone)]
pub struct ReplicaHandle {
    inner: Arc<Inner>,
}

/// A running replica. Prefer [`Replica::shutdown`]; dropping it also stops it (see `Drop`).
pub struct Replica {
    handle: ReplicaHandle,
    tasks: Vec<JoinHandle<()>>,
    /// Tells the listeners to stop (they then end their connections and return).
    stop: tokio::sync::watch::Sender<bool>,
    /// Set by [`Replica::shutdown`], so that dropping afterwards does not stop Raft twice.
    stopped: bool,
    /// Fires when the storage is closed; taken by [`Replica::shutdown`] to wait for it.
    storage_closed: Option<Closed>,
}

impl std::ops::Deref for Replica {
    type Target = ReplicaHandle;
    fn deref(&self) -> &ReplicaHandle {
        &self.handle
    }
}

/// Dropping a replica without [`Replica::shutdown`] still stops it: the listeners at once, and
/// Raft's core on the runtime, if one is running, rather than leaving it to run unreachable.
impl Drop for Replica {
    fn drop(&mut self) {
        self.stop.send_replace(true);
        for task in &self.tasks {
            task.abort();
        }
        if self.stopped {
            return;
        }
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            let raft = self.handle.inner.raft.clone();
            runtime.spawn(async move {
                let _ = raft.shutdown().await;
            });
        }
    }
}

/// Where a replica keeps sled (metadata and snapshots) inside its data directory.
pub(super) fn meta_dir(data_dir: &std::path::Path) -> std::path::PathBuf {
    data_dir.join("meta")
}

/// Opens the metadata and the log (the WAL) of the replica whose data is in `data_dir`.
pub(super) fn open_log(data_dir: &std::path::Path) -> std::io::Result<(Arc<MetaStore>, LogStore)> {
    let meta = Arc::new(MetaStore::open(&meta_dir(data_dir))?);
    let log = LogStore::open(&data_dir.join("log"), meta.clone())?;
    Ok((meta, log))
}

/// Opens a replica's storage in `data_dir`: its metadata and log, and the state machine
/// restored from its latest snapshot.
fn open_storage(
    data_dir: &std::path::Path,
) -> std::io::Result<(LogStore, StateMachineStore, Closed)> {
    let (meta, log) = open_log(data_dir)?;
    let closed = meta.closed();
    let state_machine = StateMachineStore::open(meta, log.clone())?;
    log.guard_with_snapshots(state_machine.stored_snapshot_last()?);
    Ok((log, state_machine, closed))
}

fn raft_config(config: &ReplicaConfig) -> Result<openraft::Config, StartError> {
    openraft::Config {
        cluster_name: "ctrlog".into(),
        heartbeat_interval: config.heartbeat_interval_ms,
        election_timeout_min: config.election_timeout_min_ms,
        election_timeout_max: config.election_timeout_max_ms,
        // A chunk is applied with an fsync of sled on the receiver; give it time.
        install_snapshot_timeout: 10_000,
        max_payload_entries: RAFT_PAYLOAD_ENTRIES_MAX,
        snapshot_policy: SnapshotPolicy::LogsSinceLast(config.snapshot_logs_since_last),
        max_in_snapshot_log_to_keep: config.snapshot_logs_to_keep,
        ..Default::default()
    }
    .validate()
    .map_err(|e| StartError::Raft(e.to_string()))
}

impl Replica {
    /// Opens storage, binds both ports and starts Raft. Initialises the cluster when this is
    /// the lowest initial member and its log is empty (never on a restart).
    pub async fn start(config: ReplicaConfig) -> Result<Replica, StartError> {
        config.validate()?;
        let data_dir = config.data_dir.clone();
        // Recovery reads the whole retained log, and opening may wait for the directory's lock:
        // blocking work, kept off the runtime's workers.
        let (log, state_machine, storage_closed) =
            tokio::task::spawn_blocking(move || open_storage(&data_dir))
                .await
                .map_err(std::io::Error::other)??;
        let tls = config
            .tls
            .as_ref()
            .map(ReplicaTls::load)
            .transpose()
            .map_err(|e| StartError::Tls(e.to_string()))?;
        let authenticator = config
            .auth
            .as_ref()
            .map(Authenticator::load)
            .transpose()
            .map_err(StartError::Auth)?
            .map(Arc::new);
        let raft = Raft::new(
            config.id,
            Arc::new(raft_config(&config)?),
            PeerNetwork {
                tls: tls.as_ref().map(|t| t.to_peers.clone()),
            },
            log.clone(),
            state_machine.clone(),
        )
        .await
        .map_err(|e| StartError::Raft(e.to_string()))?;

        let peer_listener = bind_peers(config.peer_addr).await?;
        let client_listener =
            bind_clients(config.client_addr, config.client_frame_bytes_max).await?;
        let (peer_addr, client_addr) = (peer_listener.local_addr()?, client_listener.local_addr()?);
        let http_listener = match config.http_addr {
            Some(addr) => Some(bind_http(addr).await?),
            None => None,
        };
        let http_addr = http_listener.as_ref().map(|l| l.local_addr()).transpose()?;
        let handle = ReplicaHandle {
            inner: Arc::new(Inner {
                id: config.id,
                raft: raft.clone(),
                log,
                state_machine,
                proposer: Proposer::start(raft.clone()),
                peer_addr,
                client_addr,
                command_bytes_max: config.command_bytes_max,
                liveness: std::sync::Mutex::new(Liveness::new(0, std::time::Instant::now())),
                telemetry: Telemetry::default(),
                http_addr,
            }),
        };
        let (stop, stopping) = tokio::sync::watch::channel(false);
        let mut tasks = vec![
            tokio::spawn(serve_peers(
                peer_listener,
                raft.clone(),
                tls.as_ref().map(|t| t.peers.clone()),
                stopping.clone(),
            )),
            tokio::spawn(serve_clients(
                client_listener,
                handle.clone(),
                config.client_requests_in_flight_max,
                tls.as_ref().map(|t| t.clients.clone()),
                authenticator,
                stopping.clone(),
            )),
        ];
        if let Some(listener) = http_listener {
            tasks.push(tokio::spawn(serve_http(listener, handle.clone(), stopping)));
        }
        let replica = Replica {
            stopped: false,
            storage_closed: Some(storage_closed),
            tasks,
            stop,
            handle,
        };
        tracing::info!(id = config.id, %peer_addr, %client_addr, ?http_addr, "replica started");

        let lowest = config.initial_members.keys().next().copied();
        let initialized = raft
            .is_initialized()
            .await
            .map_err(|e| StartError::Raft(e.to_string()))?;
        if lowest == Some(config.id) && !initialized {
            replica.initialize(config.initial_members.clone()).await?;
        }
        Ok(replica)
    }

    /// Stops Raft and the listeners, then waits (up to a grace period) for the storage to
    /// close, so that the data directory can be reopened at once. Storage closes when the last
    /// handle is gone: Raft's own tasks that outlive its core (its state-machine worker, a
    /// snapshot build) hold it briefly, and a [`ReplicaHandle`] kept elsewhere holds it until
    /// dropped (then there is nothing to wait for here).
    pub async fn shutdown(mut self) {
        self.stop.send_replace(true);
        for mut task in self.tasks.drain(..) {
            // The listeners end their connections and return; one that does not within the
            // grace period is aborted.
            if tokio::time::timeout(SHUTDOWN_GRACE, &mut task)
                .await
                .is_err()
            {
                task.abort();
                let _ = task.await;
            }
        }
        self.stopped = true;
        if let Err(error) = self.handle.inner.raft.shutdown().await {
            tracing::warn!(%error, "raft did not shut down cleanly");
        }
        // Handles held elsewhere keep the storage open for as long as their holders like; only
        // Raft's leftover tasks are worth waiting for.
        let handles_held_elsewhere = Arc::strong_count(&self.handle.inner) > 1;
        let (id, storage_closed) = (self.handle.id(), self.storage_closed.take());
        drop(self);
        if let (Some(closed), false) = (storage_closed, handles_held_elsewhere) {
            if tokio::time::timeout(SHUTDOWN_GRACE, closed.wait())
                .await
                .is_err()
            {
                tracing::warn!(id, "storage still open after shutdown");
            }
        }
    }
}

/// Maps a failed Raft write (append, membership change) to what the caller can act on.
fn write_error(error: RaftError<NodeId, ClientWriteError<NodeId, Member>>) -> ApiError {
    match error {
        RaftError::APIError(ClientWriteError::ForwardToLeader(forward)) => ApiError::NotLeader {
            leader_id: forward.leader_id,
            leader_client_addr: forward.leader_node.map(|m| m.client_addr),
        },
        RaftError::APIError(ClientWriteError::ChangeMembershipError(e)) => {
            ApiError::Rejected(e.to_string())
        }
        RaftError::Fatal(e) => ApiError::Unavailable(e.to_string()),
    }
}

impl Replica {
    /// A handle that outlives this borrow (it does not keep the listeners alive).
    pub fn clone_handle(&self) -> ReplicaHandle {
        self.handle.clone()
    }
}

impl ReplicaHandle {
    pub fn id(&self) -> NodeId {
        self.inner.id
    }

    pub fn peer_addr(&self) -> SocketAddr {
        self.inner.peer_addr
    }

    pub fn client_addr(&self) -> SocketAddr {
        self.inner.client_addr
    }

    /// This replica's address pair as stored in the membership.
    pub fn member(&self) -> Member {
        Member {
            peer_addr: self.inner.peer_addr.to_string(),
            client_addr: self.inner.client_addr.to_string(),
        }
    }

    /// The underlying Raft handle, for tests and tools that wait on its metrics.
    pub fn raft(&self) -> &Raft {
        &self.inner.raft
    }

    /// Where the observability port (metrics, probes, status page) listens, if it is enabled.
    pub fn http_addr(&self) -> Option<SocketAddr> {
        self.inner.http_addr
    }

    pub(crate) fn telemetry(&self) -> &Telemetry {
        &self.inner.telemetry
    }

    /// Bytes of WAL segments on disk.
    pub fn wal_bytes(&self) -> u64 {
        self.inner.log.disk_bytes()
    }

    /// Commands the job model has refused since the log began.
    pub fn rejected_total(&self) -> u64 {
        self.inner
            .state_machine
            .read(|state| state.rejections.total)
    }

    pub fn snapshot_stats(&self) -> super::state_machine::SnapshotStats {
        self.inner.state_machine.snapshot_stats()
    }

    pub fn metrics(&self) -> RaftMetrics {
        self.inner.raft.metrics().borrow().clone()
    }

    /// Initialises a new cluster with these members. Refused if this replica already has state.
    pub async fn initialize(&self, members: BTreeMap<NodeId, Member>) -> Result<(), StartError> {
        match self.inner.raft.initialize(members).await {
            Ok(()) => Ok(()),
            Err(RaftError::APIError(openraft::error::InitializeError::NotAllowed(_))) => Ok(()),
            Err(e) => Err(StartError::Raft(e.to_string())),
        }
    }

    /// Appends one command through the proposer; answered once committed and applied.
    pub async fn append(&self, proposal: Proposal) -> Result<AppendAck, ApiError> {
        let started = std::time::Instant::now();
        let result = self.append_unmeasured(proposal).await;
        self.inner.telemetry.append_done(&result, started.elapsed());
        result
    }

    async fn append_unmeasured(&self, proposal: Proposal) -> Result<AppendAck, ApiError> {
        let size = proposal.frame.body.len();
        if size > self.inner.command_bytes_max {
            return Err(ApiError::TooLarge {
                size: size as u64,
                limit: self.inner.command_bytes_max as u64,
            });
        }
        if let Target::Container(id) = &proposal.target {
            id.validate()
                .map_err(|e| ApiError::Invalid(e.to_string()))?;
        }
        debug_assert!(self.inner.command_bytes_max <= BATCH_BYTES_MAX * 16);
        // The state machine must stay deterministic across builds, so whether *this* build
        // supports a level is checked here, before the command enters the log.
        let level_change = (proposal.frame.kind == kinds::SET_VOCABULARY_LEVEL)
            .then(|| Command::from_frame(proposal.frame.clone()));
        if let Some(Command::SetVocabularyLevel(c)) = level_change {
            if c.level > LEVEL_MAX {
                return Err(Rejection::LevelUnsupported {
                    requested: c.level,
                    supported: LEVEL_MAX,
                }
                .into());
            }
        }
        let producer = proposal.producer;
        match self.inner.proposer.propose(proposal).await? {
            Outcome::Appended { offset } => Ok(AppendAck {
                offset,
                duplicate: false,
            }),
            Outcome::Duplicate { offset } => Ok(AppendAck {
                offset,
                duplicate: true,
            }),
            Outcome::OutOfWindow { lowest } => {
                let pair = producer.expect("only producer appends are refused by sequence");
                Err(ApiError::SequenceOutOfWindow {
                    producer: pair.producer,
                    seq: pair.seq,
                    lowest,
                })
            }
            Outcome::Rejected(rejection) => Err(rejection.into()),
        }
    }

    /// Reads committed entries matching `request.filter` from `request.from`, from the Raft
    /// log itself, waiting up to `max_wait` for one to be applied if there is none yet.
    ///
    /// An empty answer after the wait means "nothing new" only while this replica knows a
    /// leader; a replica that lost its leader (partitioned, or mid-election) answers
    /// `Unavailable` instead, so that a subscriber moves to a replica that hears the cluster
    /// rather than waiting silently on a stale one.
    pub async fn fetch(
        &self,
        request: &FetchRequest,
        max_wait: Duration,
    ) -> Result<FetchResponse, ApiError> {
        let _counted = self.inner.telemetry.fetch_started();
        let answer = self.fetch_unmeasured(request, max_wait).await;
        if let Ok(response) = &answer {
            self.inner.telemetry.fetch_answered(response);
        }
        answer
    }

    async fn fetch_unmeasured(
        &self,
        request: &FetchRequest,
        max_wait: Duration,
    ) -> Result<FetchResponse, ApiError> {
        if request.entries_max == 0 || request.bytes_max == 0 {
            return Err(ApiError::Invalid(
                "entries_max and bytes_max must be positive".into(),
            ));
        }
        if let Filter::Container(id) = &request.filter {
            id.validate()
                .map_err(|e| ApiError::Invalid(e.to_string()))?;
        }
        let deadline = tokio::time::Instant::now() + max_wait;
        let mut applied = self.applied();
        // Offsets start at 1; a fetch from 0 means "from the beginning".
        let mut from = request.from.max(1);
        loop {
            let response = self.read_committed(from, request)?;
            if !response.entries.is_empty() || response.next_offset <= response.applied_offset {
                // Entries, or a scan that stopped at its bound: the caller continues.
                return Ok(response);
            }
            from = response.next_offset;
            // `Some(woke)`: the wait ended (`woke` false if the state machine closed).
            let waited =
                tokio::time::timeout_at(deadline, applied.wait_for(|a| a.last_offset >= from))
                    .await
                    .ok()
                    .map(|woke| woke.is_ok());
            match waited {
                Some(true) => {
                    let linger = Duration::from_millis(request.linger_ms.into());
                    let until = (tokio::time::Instant::now() + linger).min(deadline);
                    tokio::time::sleep_until(until).await;
                }
                Some(false) => return Err(ApiError::ShuttingDown),
                None if self.metrics().current_leader.is_none() => {
                    return Err(ApiError::Unavailable(format!(
                        "replica {} knows no leader; its log may be stale",
                        self.id()
                    )))
                }
                None => return Ok(response),
            }
        }
    }

    /// One bounded scan of the applied log from `from` (see [`FETCH_ENTRIES_SCANNED_MAX`]).
    fn read_committed(
        &self,
        from: Offset,
        request: &FetchRequest,
    ) -> Result<FetchResponse, ApiError> {
        // Spans of purged entries linger until the next apply prunes them; skip them here.
        let first_log_index = self.inner.log.first_index();
        let (applied_offset, first_offset, spans) = self.inner.state_machine.read(|state| {
            let applied = state.job.last_offset();
            let first_offset = state.first_retained_offset(first_log_index);
            let from_span = state
                .offset_index
                .range(..=from)
                .next_back()
                .map_or(from, |(first, _)| *first);
            let spans: Vec<_> = state
                .offset_index
                .range(from_span.max(first_offset)..)
                .take(FETCH_ENTRIES_SCANNED_MAX.min(request.entries_max as usize))
                .map(|(first, span)| (*first, span.clone()))
                .collect();
            (applied, first_offset, spans)
        });
        let mut response = FetchResponse {
            entries: Vec::new(),
            next_offset: from,
            applied_offset,
            slot: AnswerSlot::default(),
        };
        if from > applied_offset {
            return Ok(response);
        }
        let compacted = ApiError::Compacted {
            first_offset,
            snapshot_offset: self.inner.state_machine.snapshot_offset(),
        };
        if from < first_offset {
            return Err(compacted);
        }
        let mut bytes = 0usize;
        for (span_offset, span) in spans {
            let Some(raft_entry) = self
                .inner
                .state_machine
                .applied_entry(span.log_index)
                .map_err(|e| ApiError::Unavailable(e.to_string()))?
            else {
                // Purged while we read: what was read so far stands.
                if response.next_offset == from {
                    return Err(compacted);
                }
                break;
            };
            for (offset, proposal) in entry_commands(span_offset, &span, &raft_entry) {
                if offset < from {
                    continue;
                }
                if offset > applied_offset {
                    return Ok(response);
                }
                if request.filter.matches(&proposal.target) {
                    let size = proposal.frame.body.len();
                    let bytes_max = (request.bytes_max as usize).min(FETCH_ANSWER_BYTES_MAX);
                    let full = response.entries.len() >= request.entries_max as usize
                        || (!response.entries.is_empty() && bytes + size > bytes_max);
                    if full {
                        return Ok(response);
                    }
                    bytes += size;
                    response
                        .entries
                        .push(log_entry(offset, proposal, &raft_entry));
                }
                response.next_offset = offset + 1;
            }
        }
        Ok(response)
    }

    /// `NotLeader`, naming the leader this replica knows of.
    fn not_leader(&self, metrics: &RaftMetrics) -> ApiError {
        let leader_client_addr = metrics.current_leader.and_then(|leader| {
            metrics
                .membership_config
                .membership()
                .get_node(&leader)
                .map(|m| m.client_addr.clone())
        });
        ApiError::NotLeader {
            leader_id: metrics.current_leader,
            leader_client_addr,
        }
    }

    /// Runs `f` on the heartbeat table of the current term. Only the leader keeps one.
    fn with_liveness<T>(&self, f: impl FnOnce(&mut Liveness) -> T) -> Result<T, ApiError> {
        let metrics = self.metrics();
        if metrics.current_leader != Some(self.inner.id) {
            return Err(self.not_leader(&metrics));
        }
        let mut table = self
            .inner
            .liveness
            .lock()
            .expect("a panic while holding the liveness lock is a bug");
        if table.term() != metrics.current_term {
            // A new term: silence counts from now, not from the last leader's last word.
            *table = Liveness::new(metrics.current_term, std::time::Instant::now());
        }
        Ok(f(&mut table))
    }

    /// Records a container's heartbeat (leader only). `Fenced` unless `(container, epoch)` is
    /// the container's live session.
    pub fn heartbeat(
        &self,
        container: ContainerId,
        epoch: Epoch,
        lag: BTreeMap<TaskId, u64>,
    ) -> Result<HeartbeatAck, ApiError> {
        let (live, applied_offset) = self
            .inner
            .state_machine
            .read(|state| (state.job.live_session(&container), state.job.last_offset()));
        let session = match live {
            Some(session) if session.epoch == epoch => session,
            live => {
                return Err(ApiError::Fenced {
                    container,
                    epoch,
                    current_epoch: live.map(|s| s.epoch),
                })
            }
        };
        self.with_liveness(|table| table.record(&session, lag, std::time::Instant::now()))?;
        Ok(HeartbeatAck { applied_offset })
    }

    /// Live sessions this leader has not heard from for longer than `timeout` (counting from
    /// when it became leader for sessions it never heard). Leader only.
    pub fn overdue_sessions(&self, timeout: Duration) -> Result<Vec<Session>, ApiError> {
        self.with_liveness(|table| {
            self.inner
                .state_machine
                .read(|state| table.overdue(&state.job, std::time::Instant::now(), timeout))
        })
    }

    /// The consumer lag each live container last reported to this leader. Leader only.
    pub fn reported_lag(&self) -> Result<BTreeMap<ContainerId, u64>, ApiError> {
        self.with_liveness(|table| self.inner.state_machine.read(|state| table.lag(&state.job)))
    }

    /// The JobState as of this replica's applied offset, once that reaches `min_offset`.
    pub async fn state(&self, min_offset: Offset, max_wait: Duration) -> Result<StateAt, ApiError> {
        let mut applied = self.applied();
        match tokio::time::timeout(max_wait, applied.wait_for(|a| a.last_offset >= min_offset))
            .await
        {
            Ok(Ok(_)) => {}
            Ok(Err(_)) => return Err(ApiError::ShuttingDown),
            Err(_) => {
                return Err(ApiError::Unavailable(format!(
                    "replica {} has not applied offset {min_offset} yet",
                    self.id()
                )))
            }
        }
        Ok(self.inner.state_machine.read(|state| StateAt {
            offset: state.job.last_offset(),
            state: state.job.clone(),
            rejections: state.rejections.clone(),
        }))
    }

    /// This replica's view of the cluster.
    pub fn status(&self) -> Status {
        let metrics = self.metrics();
        let membership = metrics.membership_config.membership();
        let voters: BTreeSet<NodeId> = membership.voter_ids().collect();
        let first_log_index = self.inner.log.first_index();
        let (applied_offset, first_offset, vocabulary_level) =
            self.inner.state_machine.read(|state| {
                (
                    state.job.last_offset(),
                    state.first_retained_offset(first_log_index),
                    state.job.level(),
                )
            });
        let role = match metrics.state {
            ServerState::Leader => "Leader",
            ServerState::Follower => "Follower",
            ServerState::Candidate => "Candidate",
            ServerState::Learner => "Learner",
            ServerState::Shutdown => "Shutdown",
        };
        Status {
            id: self.inner.id,
            role: role.to_string(),
            term: metrics.current_term,
            leader_id: metrics.current_leader,
            members: membership
                .nodes()
                .map(|(id, member)| MemberStatus {
                    id: *id,
                    member: member.clone(),
                    voter: voters.contains(id),
                })
                .collect(),
            last_log_index: metrics.last_log_index,
            applied_index: metrics.last_applied.map(|l| l.index),
            applied_offset,
            first_offset,
            snapshot_offset: self.inner.state_machine.snapshot_offset(),
            vocabulary_level,
            vocabulary_level_max: LEVEL_MAX,
            snapshot_index: metrics.snapshot.map(|l| l.index),
            purged_index: metrics.purged.map(|l| l.index),
        }
    }

    /// Watches the applied position (log index and offset).
    pub fn applied(&self) -> tokio::sync::watch::Receiver<super::state_machine::Applied> {
        self.inner.state_machine.applied()
    }

    /// Reads the JobState as of the applied offset.
    pub fn read_state<T>(&self, f: impl FnOnce(&crate::jobs::JobState) -> T) -> T {
        self.inner.state_machine.read(|state| f(&state.job))
    }

    /// The last offset applied on this replica.
    pub fn applied_offset(&self) -> Offset {
        self.inner.state_machine.read(|s| s.job.last_offset())
    }

    /// Adds a replica as a learner, waits until it has caught up, then promotes it to voter.
    pub async fn add_member(&self, id: NodeId, member: Member) -> Result<(), ApiError> {
        let raft = &self.inner.raft;
        raft.add_learner(id, member, true)
            .await
            .map_err(write_error)?;
        let mut metrics = raft.metrics();
        let deadline = tokio::time::Instant::now() + MEMBER_CATCH_UP_TIMEOUT;
        loop {
            let caught_up = {
                let m = metrics.borrow_and_update();
                let matched = m
                    .replication
                    .as_ref()
                    .and_then(|r| r.get(&id).copied().flatten())
                    .map(|l| l.index);
                match (matched, m.last_log_index) {
                    (Some(matched), Some(last)) => matched + MEMBER_CATCH_UP_ENTRIES_MAX >= last,
                    _ => false,
                }
            };
            if caught_up {
                break;
            }
            match tokio::time::timeout_at(deadline, metrics.changed()).await {
                Ok(Ok(())) => {}
                Ok(Err(_)) => return Err(ApiError::ShuttingDown),
                Err(_) => {
                    return Err(ApiError::Unavailable(format!(
                        "learner {id} did not catch up within {MEMBER_CATCH_UP_TIMEOUT:?}; it stays a learner"
                    )))
                }
            }
        }
        let mut voters: BTreeSet<NodeId> = self
            .metrics()
            .membership_config
            .membership()
            .voter_ids()
            .collect();
        voters.insert(id);
        raft.change_membership(voters, false)
            .await
            .map_err(write_error)?;
        tracing::info!(member = id, "promoted to voter");
        Ok(())
    }

    /// Removes a replica (voter or learner) from the cluster.
    pub async fn remove_member(&self, id: NodeId) -> Result<(), ApiError> {
        let membership = self.metrics().membership_config.membership().clone();
        let mut voters: BTreeSet<NodeId> = membership.voter_ids().collect();
        if !voters.remove(&id) && membership.get_node(&id).is_none() {
            return Err(ApiError::Rejected(format!("{id} is not a member")));
        }
        if voters.is_empty() {
            return Err(ApiError::Rejected("cannot remove the last voter".into()));
        }
        self.inner
            .raft
            .change_membership(voters, false)
            .await
            .map_err(write_error)?;
        tracing::info!(member = id, "removed");
        Ok(())
    }

    /// Forces a snapshot now (and the purge that follows it) without waiting for it.
    pub async fn snapshot_now(&self) -> Result<(), ApiError> {
        self.inner
            .raft
            .trigger()
            .snapshot()
            .await
            .map_err(|e| ApiError::Unavailable(e.to_string()))
    }

    /// Takes a snapshot of everything applied so far and waits until it is stored; returns
    /// the last offset it covers.
    pub async fn snapshot(&self) -> Result<Offset, ApiError> {
        let Some(applied) = self.metrics().last_applied else {
            return Err(ApiError::Rejected("nothing applied yet to snapshot".into()));
        };
        self.snapshot_now().await?;
        let mut metrics = self.inner.raft.metrics();
        let built = metrics.wait_for(|m| m.snapshot.is_some_and(|s| s.index >= applied.index));
        let stored = match tokio::time::timeout(SNAPSHOT_WAIT_MAX, built).await {
            Ok(Ok(_)) => Ok(self.inner.state_machine.snapshot_offset()),
            Ok(Err(_)) => Err(ApiError::ShuttingDown),
            Err(_) => Err(ApiError::Unavailable(format!(
                "the snapshot was not stored within {SNAPSHOT_WAIT_MAX:?}"
            ))),
        };
        stored
    }

    /// Bytes this replica's log and metadata take on disk.
    pub fn log_disk_bytes(&self) -> u64 {
        self.inner.log.disk_bytes()
    }
}

/// Runs one replica until `shutdown` resolves: what `ctrlog serve` does.
pub async fn serve(
    config: ReplicaConfig,
    shutdown: impl std::future::Future<Output = ()>,
) -> Result<(), StartError> {
    let replica = Replica::start(config).await?;
    // A replica whose Raft core stopped on a fatal (storage) error must not linger as a
    // zombie: exit, so that a supervisor restarts it and recovery runs.
    let mut metrics = replica.raft().metrics();
    let fatal = async move {
        let _ = metrics.wait_for(|m| m.running_state.is_err()).await;
    };
    let result = tokio::select! {
        _ = shutdown => Ok(()),
        _ = fatal => Err(StartError::Raft("the Raft core stopped on a fatal error".into())),
    };
    tracing::info!(id = replica.id(), "shutting down");
    replica.shutdown().await;
    result
}
