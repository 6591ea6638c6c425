//! [`Node`]: one replica's Raft node without its sockets. The rules every request path
//! follows live here, spelled once, and the replica process (`server`) and the deterministic
//! simulation run the same code: who leads ([`Node::is_leader`], by the quorum lease), what
//! an append is refused for and how it reaches the log (through the [`proposer`](super::proposer),
//! whose batches are given up when their term ends), what a fetch or a state read waits for and
//! when a replica must not answer one, the heartbeat table and the rule that accepts a
//! heartbeat, membership changes, and snapshots.
//!
//! What a node needs of its network is given to it: openraft's [`RaftNetworkFactory`] (the
//! tarpc peer port, or the simulation's network) and [`MemberLevels`], the one question it
//! asks its peers outside Raft (which vocabulary levels a member's build knows). Addresses,
//! telemetry, the listeners and the controller's [`ControlPlane`](crate::controller) stay
//! with the replica (`server::ReplicaHandle`), which delegates here.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;
use openraft::network::RaftNetworkFactory;
use openraft::{ChangeMembers, ServerState};
use tokio::sync::watch;
use tokio::task::JoinHandle;

use super::elector::{self, ElectionTimer};
use super::founding;
use super::lease::{self, QuorumLease};
use super::proposer::{Proposer, BATCH_BYTES_MAX};
use super::reader::read_committed;
use super::state_machine::{Applied, StateMachineStore};
use super::storage::log_store::LogStore;
use super::types::{not_leader, not_leader_from, ClientWriteError, Raft, RaftError, RaftMetrics};
use super::TypeConfig;
use crate::jobs::{JobState, Liveness, Outcome, Rejection, ReportedLag, Session};
use crate::log::vocabulary::{LEVEL_KNOWN_TO_EVERY_RELEASE, LEVEL_MAX};
use crate::log::{
    Command, ContainerId, Epoch, Filter, Level, Offset, Proposal, Target, TaskId, CUSTOM_KIND_MIN,
};
use crate::wire::{
    ApiError, AppendAck, FetchRequest, FetchResponse, HeartbeatAck, Member, MemberStatus, StateAt,
    Status,
};
use crate::NodeId;

mod membership;

/// How long `snapshot` waits for the snapshot it triggered.
const SNAPSHOT_WAIT_MAX: Duration = Duration::from_secs(30);

/// How long a new learner may take to catch up before `add_member` gives up on promoting it.
pub const MEMBER_CATCH_UP_TIMEOUT: Duration = Duration::from_secs(60);

/// How long a new learner may stay silent (no entry replicated to it) before `add_member`
/// takes it for unreachable and removes it again.
pub const LEARNER_FIRST_CONTACT_MAX: Duration = Duration::from_secs(10);

/// How long a membership change waits for the membership in effect to be committed (a new
/// leader commits it with its first entry) before it is refused `Unavailable`.
pub const MEMBERSHIP_COMMIT_WAIT: Duration = Duration::from_secs(5);

/// How soon a membership change refused as in progress is asked again, within
/// [`MEMBERSHIP_COMMIT_WAIT`]: a leader's first commit takes a round trip or two.
const MEMBERSHIP_RETRY: Duration = Duration::from_millis(50);

/// How long a replica about to be added may take to say which vocabulary levels it knows.
const MEMBER_LEVEL_ANSWER_MAX: Duration = Duration::from_secs(5);
/// How long a replica being added that did not say which levels it knows is left before it
/// is asked again.
const MEMBER_LEVEL_RETRY: Duration = Duration::from_millis(200);
/// The longest an append to a new log waits for the founding raise on a replica that leads
/// it (one that knows no leader refuses it sooner, `Founding::hold`): beyond the founding's
/// patience with silent members and one round of their answers, so that it is only ever cut
/// short by a founding that is stuck.
const FOUNDING_WAIT_MAX: Duration = Duration::from_secs(30);

/// A learner this close to the leader's last entry counts as caught up. Under traffic the
/// leader keeps appending, so demanding exact equality could wait forever.
const MEMBER_CATCH_UP_ENTRIES_MAX: u64 = 64;

/// The question a node asks its peers outside Raft: the highest vocabulary level the build of
/// replica `id` (at `member`) knows, answered within `within`; the error says why there was
/// no answer. The peer port asks with its `hello` (`PeerNetwork`); the simulation asks the
/// replica over its network.
pub trait MemberLevels: Send + Sync {
    fn level_max<'a>(
        &'a self,
        id: NodeId,
        member: &'a Member,
        within: Duration,
    ) -> BoxFuture<'a, Result<Level, String>>;
}

/// How long a leader handing over waits, after its last entry is committed, for the message
/// that carries the commit to leave: longer than a replication round on a LAN.
const HANDOVER_SETTLE: Duration = Duration::from_millis(20);

/// What a node is started with, besides its network and storage.
pub struct NodeConfig {
    pub id: NodeId,
    /// openraft's configuration (`enable_elect` off: the elector stands for election).
    pub raft: openraft::Config,
    /// The largest command body an append may carry.
    pub command_bytes_max: usize,
    /// The encoded bytes a fetch answer's entries may take, so that every answer can be sent.
    pub fetch_answer_bytes_max: usize,
    /// Configuration keys whose values never enter the log (see
    /// `ConfigChange::first_secret_key`).
    pub secret_config_keys: Vec<String>,
    /// The vocabulary level this node raises a log that holds no command yet to, should it
    /// lead it ([`founding`]); `LEVEL_INITIAL` raises nothing.
    pub level_of_new_log: Level,
}

struct NodeInner {
    id: NodeId,
    raft: Raft,
    log: LogStore,
    state_machine: StateMachineStore,
    proposer: Proposer,
    command_bytes_max: usize,
    fetch_answer_bytes_max: usize,
    secret_config_keys: Vec<String>,
    /// Heartbeats heard while this node leads (reset when a new term begins).
    liveness: std::sync::Mutex<Liveness>,
    /// When a quorum last acknowledged this node as leader (check-quorum and the lease).
    lease: Arc<QuorumLease>,
    /// Held through each membership change, so that changes run one at a time here.
    membership_changes: tokio::sync::Mutex<()>,
    levels: Arc<dyn MemberLevels>,
    /// The voter this leader is handing over to (0: none): appends, membership changes and
    /// read indexes are sent there meanwhile ([`Node::refuse_while_handing_over`]). Set only
    /// while `membership_changes` is held.
    handing_over_to: std::sync::atomic::AtomicU64,
    /// Appends that passed the handover's fence in [`Node::propose`] and are not answered
    /// yet: one may still be in the proposer's queue, on its way to Raft, when a handover
    /// begins, so the handover waits for none to be left ([`Unanswered`]).
    proposals_unanswered: std::sync::atomic::AtomicUsize,
    /// Told whenever `proposals_unanswered` falls to zero.
    proposals_answered: tokio::sync::Notify,
    /// Over once this node's founding raise is ([`founding`]): until then, appends are held
    /// for it, or refused where no leader is known (`Founding::hold`).
    founding: founding::Founding,
}

/// A cheap, cloneable handle to a running Raft node.
#[derive(Clone)]
pub struct Node {
    inner: Arc<NodeInner>,
}

impl Node {
    /// Starts Raft on `log` and `state_machine` over `network`, with its proposer, and the
    /// tasks that stand for election ([`elector::drive`], timed by `elections`, which the
    /// network's traffic moves too) and keep the quorum lease ([`lease::track`]) until `stop`
    /// says so. Returns the node and those two tasks.
    pub async fn start<N: RaftNetworkFactory<TypeConfig>>(
        config: NodeConfig,
        network: N,
        log: LogStore,
        state_machine: StateMachineStore,
        elections: Arc<ElectionTimer>,
        levels: Arc<dyn MemberLevels>,
        stop: watch::Receiver<bool>,
    ) -> Result<(Node, Vec<JoinHandle<()>>), openraft::error::Fatal<NodeId>> {
        let lease = Arc::new(QuorumLease::new(
            Duration::from_millis(config.raft.election_timeout_min),
            Duration::from_millis(config.raft.election_timeout_max),
        ));
        let raft = Raft::new(
            config.id,
            Arc::new(config.raft),
            network,
            log.clone(),
            state_machine.clone(),
        )
        .await?;
        let (founding_pending, founding) = founding::pending();
        let mut tasks = vec![
            tokio::spawn(elector::drive(
                raft.clone(),
                config.id,
                log.clone(),
                elections,
                stop.clone(),
            )),
            tokio::spawn(lease::track(lease.clone(), raft.metrics(), stop.clone())),
        ];
        let node = Node {
            inner: Arc::new(NodeInner {
                id: config.id,
                proposer: Proposer::start(raft.clone(), log.stages()),
                raft,
                log,
                state_machine,
                command_bytes_max: config.command_bytes_max,
                fetch_answer_bytes_max: config.fetch_answer_bytes_max,
                secret_config_keys: config.secret_config_keys,
                // tokio's clock, as every later reading of the table: a paused one in the
                // simulation.
                liveness: std::sync::Mutex::new(Liveness::new(
                    0,
                    tokio::time::Instant::now().into_std(),
                )),
                lease,
                membership_changes: tokio::sync::Mutex::new(()),
                levels,
                handing_over_to: std::sync::atomic::AtomicU64::new(0),
                proposals_unanswered: std::sync::atomic::AtomicUsize::new(0),
                proposals_answered: tokio::sync::Notify::new(),
                founding,
            }),
        };
        tasks.push(tokio::spawn(founding::raise_level_of_new_log(
            node.clone(),
            config.level_of_new_log,
            founding_pending,
            stop,
        )));
        Ok((node, tasks))
    }

    pub fn id(&self) -> NodeId {
        self.inner.id
    }

    /// The underlying Raft handle, for tests and tools that wait on its metrics.
    pub fn raft(&self) -> &Raft {
        &self.inner.raft
    }

    pub fn log(&self) -> &LogStore {
        &self.inner.log
    }

    pub fn state_machine(&self) -> &StateMachineStore {
        &self.inner.state_machine
    }

    pub fn metrics(&self) -> RaftMetrics {
        self.inner.raft.metrics().borrow().clone()
    }

    /// The JobState as of the applied offset, shared with the state machine.
    pub fn job_state(&self) -> Arc<JobState> {
        self.inner.state_machine.read(|state| state.job.clone())
    }

    /// How many live sessions reported their lag to this leader, and its sum: what the
    /// scaling policy reads. Nothing when this node does not lead.
    pub fn reported(&self) -> ReportedLag {
        self.with_liveness(|table| {
            self.inner
                .state_machine
                .read(|state| table.reported(&state.job))
        })
        .unwrap_or_default()
    }

    /// Whether this replica leads now: its Raft core runs, it is in the leader state and names
    /// itself leader, a quorum acknowledged it within the lease ([`QuorumLease::holds`]: no
    /// other leader can exist), and it has applied an entry of its own term (so its JobState
    /// holds everything the previous leaders committed). The one answer to "am I the leader"
    /// that heartbeats, the controller, the observability port and the tools all use.
    pub fn is_leader(&self) -> bool {
        let metrics = self.inner.raft.metrics();
        let metrics = metrics.borrow();
        lease::leads(&metrics, self.inner.id, &self.inner.lease)
    }

    /// Whom this replica's Raft core names leader, for the founding's hold: one that names
    /// another refuses writes itself, naming that leader.
    fn named_leader(&self) -> founding::Leader {
        match self.inner.raft.metrics().borrow().current_leader {
            Some(leader) if leader == self.inner.id => founding::Leader::This,
            Some(_) => founding::Leader::Another,
            None => founding::Leader::Unknown,
        }
    }

    /// Whether this replica believes it leads but has not heard from a quorum for longer than
    /// an election timeout (check-quorum: openraft does not step down by itself). Such a
    /// replica answers appends and fetches at once with a retriable error.
    pub fn leads_without_quorum(&self) -> bool {
        let metrics = self.inner.raft.metrics();
        let metrics = metrics.borrow();
        metrics.current_leader == Some(self.inner.id) && self.inner.lease.lost(metrics.current_term)
    }

    /// Appends one command through the proposer; answered once committed and applied. Refused
    /// before it is proposed: a command over the size limit, a malformed one, a vocabulary
    /// level this build or a member does not know, any while this node leads without
    /// a quorum, and any to a new log while this node has known no leader of it for an
    /// election timeout (`Founding::hold`).
    pub async fn append(&self, proposal: Proposal) -> Result<AppendAck, ApiError> {
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
        // Checked here, before the command enters the log, and never on apply: the state
        // machine must stay deterministic across builds, and a log written before a check
        // existed must replay as it did. Whether *this* build supports a level is one such
        // check; the size of what the job's state would keep of a command is another.
        if proposal.frame.kind < CUSTOM_KIND_MIN {
            let command = Command::from_frame(proposal.frame.clone());
            command.check_limits().map_err(ApiError::Invalid)?;
            if let Command::ConfigChange(change) = &command {
                if let Some(key) = change.first_secret_key(&self.inner.secret_config_keys) {
                    return Err(ApiError::Invalid(format!(
                        "config key {key:?} is marked secret (secret_config_keys): a secret never \
                         enters the log, which every container and every backup reads and which \
                         keeps it; give it to the containers that need it through their \
                         environment or a mounted file instead"
                    )));
                }
            }
            if let Command::SetVocabularyLevel(c) = &command {
                if c.level > LEVEL_MAX {
                    return Err(Rejection::LevelUnsupported {
                        requested: c.level,
                        supported: LEVEL_MAX,
                    }
                    .into());
                }
                // Boxed: this rare path's future (calls to every member) would otherwise make
                // every append's several KiB, moved for each of an `append_many`'s appends.
                Box::pin(self.check_members_know_level(c.level)).await?;
            }
        }
        if !self.inner.founding.is_over() {
            // A new log's first command is its level raise ([`founding`]), so that a
            // cluster's first commands are decided at the level it was founded for. A replica
            // that knows no leader for an election timeout refuses the append, retriable,
            // rather than keep it for the client's whole try.
            let leaderless_max =
                Duration::from_millis(self.inner.raft.config().election_timeout_max);
            let founding = &self.inner.founding;
            founding
                .hold(|| self.named_leader(), leaderless_max, FOUNDING_WAIT_MAX)
                .await?;
        }
        self.propose(proposal).await
    }

    /// Proposes a command that passed the checks of [`append`](Self::append), unless this
    /// node leads without a quorum or is handing over.
    async fn propose(&self, proposal: Proposal) -> Result<AppendAck, ApiError> {
        // Counted before the fence is looked at, so that a handover that begins now either
        // is seen here or waits for this append ([`Unanswered`]).
        let _unanswered = Unanswered::count(&self.inner);
        if self.leads_without_quorum() {
            return Err(not_leader(None, None));
        }
        self.refuse_while_handing_over()?;
        let producer = proposal.producer;
        // An append waiting for a leader that loses its quorum meanwhile is answered then: its
        // fate is unknown, and the client retries it (with its producer pair) elsewhere.
        let decided = tokio::select! {
            biased;
            decided = self.inner.proposer.propose(proposal) => decided?,
            _ = self.inner.lease.wait_lost() => return Err(not_leader(None, None)),
        };
        match decided {
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
            Outcome::ProducerForgotten => {
                let pair = producer.expect("only producer appends can be forgotten");
                Err(ApiError::ProducerForgotten {
                    producer: pair.producer,
                    seq: pair.seq,
                })
            }
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
        if request.entries_max == 0 || request.bytes_max == 0 {
            return Err(ApiError::Invalid(
                "entries_max and bytes_max must be positive".into(),
            ));
        }
        if let Filter::Container(id) = &request.filter {
            id.validate()
                .map_err(|e| ApiError::Invalid(e.to_string()))?;
        }
        self.refuse_stale_reads()?;
        let deadline = tokio::time::Instant::now() + max_wait;
        let mut applied = self.applied();
        // Offsets start at 1; a fetch from 0 means "from the beginning".
        let mut from = request.from.max(1);
        loop {
            let response = read_committed(
                &self.inner.log,
                &self.inner.state_machine,
                from,
                request,
                self.inner.fetch_answer_bytes_max,
            )?;
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

    /// Runs `f` on the heartbeat table of the current term. Only the leader keeps one.
    fn with_liveness<T>(&self, f: impl FnOnce(&mut Liveness) -> T) -> Result<T, ApiError> {
        let metrics = self.metrics();
        if !self.is_leader() {
            return Err(not_leader_from(&metrics));
        }
        let mut table = self
            .inner
            .liveness
            .lock()
            .expect("a panic while holding the liveness lock is a bug");
        table.follow_term(metrics.current_term, tokio::time::Instant::now().into_std());
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
        // Leadership first: only the leader's state is sure to hold the container's latest
        // session; a lagging replica that has not applied its registration must answer
        // `NotLeader` (retried elsewhere), not the terminal `Fenced`.
        self.with_liveness(|table| {
            self.inner.state_machine.read(|state| {
                let job = &state.job;
                match job.live_session(&container) {
                    Some(session) if session.epoch == epoch => {
                        let now = tokio::time::Instant::now().into_std();
                        table.record(job, &session, lag, now);
                        Ok(HeartbeatAck {
                            applied_offset: job.last_offset(),
                        })
                    }
                    live => Err(ApiError::Fenced {
                        container,
                        epoch,
                        current_epoch: live.map(|s| s.epoch),
                    }),
                }
            })
        })?
    }

    /// Live sessions this leader has not heard from for longer than `timeout` (counting from
    /// when it became leader for sessions it never heard). Leader only.
    pub fn overdue_sessions(&self, timeout: Duration) -> Result<Vec<Session>, ApiError> {
        self.with_liveness(|table| {
            self.inner.state_machine.read(|state| {
                table.overdue(&state.job, tokio::time::Instant::now().into_std(), timeout)
            })
        })
    }

    /// The consumer lag each live container last reported to this leader. Leader only.
    pub fn reported_lag(&self) -> Result<BTreeMap<ContainerId, u64>, ApiError> {
        self.with_liveness(|table| self.inner.state_machine.read(|state| table.lag(&state.job)))
    }

    /// `Unavailable` where what this replica holds may have stopped moving: it leads without
    /// a quorum, or it is not a member (not yet added, or removed), so nothing new reaches it.
    /// A reader then moves to another replica instead of waiting here for nothing, or taking
    /// a frozen state for the job's (a removed replica answered `state` with the state it had
    /// at its removal, for good; seen in `ctrlog chaos`, seed 2049).
    pub fn refuse_stale_reads(&self) -> Result<(), ApiError> {
        if self.leads_without_quorum() {
            return Err(ApiError::Unavailable(format!(
                "replica {} leads without a quorum; its log may be stale",
                self.id()
            )));
        }
        let member = self
            .metrics()
            .membership_config
            .membership()
            .get_node(&self.id())
            .is_some();
        if !member {
            return Err(ApiError::Unavailable(format!(
                "replica {} is not a member of the cluster; read from a member",
                self.id()
            )));
        }
        Ok(())
    }

    /// The voter this leader is handing over to, if it is ([`quiesce_for_handover`]).
    ///
    /// [`quiesce_for_handover`]: Self::quiesce_for_handover
    pub fn handing_over_to(&self) -> Option<NodeId> {
        // Sequentially consistent, as the count of unanswered appends it is read beside
        // ([`Unanswered`]): either an append sees the handover, or the handover sees the
        // append.
        match self
            .inner
            .handing_over_to
            .load(std::sync::atomic::Ordering::SeqCst)
        {
            0 => None,
            to => Some(to),
        }
    }

    /// `NotLeader` naming the voter this leader hands over to (and where it takes clients),
    /// while it does: nothing this replica asks of Raft may reach the voters once a handover
    /// began, as their acknowledgements would renew this leader's quorum lease while the
    /// target stands on the lease it was told had lapsed.
    ///
    /// Every path of ctrlog that writes to Raft asks here first: appends, the founding raise
    /// and the controller's commands ([`propose`](Self::propose), the one path to the
    /// proposer's `client_write`), membership changes ([`add_member`](Self::add_member),
    /// [`remove_member`](Self::remove_member): `add_learner` and `change_membership`), and
    /// the heartbeats of a read index ([`read_index`](Self::read_index)). Raft's `initialize`
    /// (`server::Replica::initialize`) does not: it acts only on a replica that holds no
    /// state, which leads nothing to hand over.
    fn refuse_while_handing_over(&self) -> Result<(), ApiError> {
        match self.handing_over_to() {
            None => Ok(()),
            Some(to) => {
                let metrics = self.inner.raft.metrics();
                let metrics = metrics.borrow();
                Err(not_leader(
                    Some(to),
                    metrics.membership_config.membership().get_node(&to),
                ))
            }
        }
    }

    /// Makes this leader fall silent for a handover to the voter `to`: appends, membership
    /// changes and read indexes are answered `NotLeader` naming `to`, heartbeats stop, and it
    /// waits (up to `catch_up_max`) until every append already taken is answered, `to` holds
    /// and the leader has committed its last entry, then for the message carrying that commit
    /// to leave. Then no voter hears it again, and their leases lapse an
    /// `election_timeout_max` later. [`end_handover`](Self::end_handover) undoes it, whether
    /// the handover succeeded or not. `NotLeader` on a follower; `Rejected` for a `to` that is
    /// not another voter; `Unavailable`, with nothing begun, while a membership change runs
    /// past `catch_up_max` (its writes would reach the voters after the handover).
    pub async fn quiesce_for_handover(
        &self,
        to: NodeId,
        catch_up_max: Duration,
    ) -> Result<(), ApiError> {
        let deadline = tokio::time::Instant::now() + catch_up_max;
        // A membership change holds this lock through all its writes to Raft, and looks for a
        // handover once it holds it: so none is under way once the handover is set, and none
        // begins until it ends. Taken before the voters are looked at, which a change under
        // way may change.
        let changes = self.inner.membership_changes.lock();
        let Ok(serialised) = tokio::time::timeout_at(deadline, changes).await else {
            return Err(ApiError::Unavailable(format!(
                "a membership change is under way on replica {} and did not end within \
                 {catch_up_max:?}; no handover was begun (try again once it is over)",
                self.id()
            )));
        };
        let mut metrics = self.raft().metrics();
        {
            let m = metrics.borrow();
            if m.current_leader != Some(self.id()) {
                return Err(not_leader_from(&m));
            }
            let voters: BTreeSet<NodeId> = m.membership_config.membership().voter_ids().collect();
            if to == self.id() || !voters.contains(&to) {
                return Err(ApiError::Rejected(format!(
                    "replica {to} is not another voter: the voters are {voters:?}"
                )));
            }
        }
        self.inner
            .handing_over_to
            .store(to, std::sync::atomic::Ordering::SeqCst);
        drop(serialised);
        self.raft().runtime_config().heartbeat(false);
        loop {
            // Registered before the count is read, so that the last append's answer cannot
            // pass unseen between the two.
            let answered = self.inner.proposals_answered.notified();
            tokio::pin!(answered);
            answered.as_mut().enable();
            let settled = {
                let m = metrics.borrow_and_update();
                let held = (m.replication.as_ref())
                    .and_then(|r| r.get(&to).copied().flatten())
                    .map(|l| l.index);
                let last = m.last_log_index;
                let committed = m.last_applied.map(|l| l.index);
                last.is_some() && held == last && committed == last
            };
            let unanswered =
                (self.inner.proposals_unanswered).load(std::sync::atomic::Ordering::SeqCst);
            if settled && unanswered == 0 {
                break;
            }
            tokio::select! {
                biased;
                changed = metrics.changed() => {
                    if changed.is_err() {
                        return Err(ApiError::ShuttingDown);
                    }
                }
                () = &mut answered => {}
                () = tokio::time::sleep_until(deadline) => {
                    return Err(ApiError::Unavailable(format!(
                        "replica {to} did not catch up within {catch_up_max:?}"
                    )))
                }
            }
        }
        // The commit of the last entry reaches the followers in one more message.
        tokio::time::sleep(HANDOVER_SETTLE).await;
        Ok(())
    }

    /// Ends a handover ([`quiesce_for_handover`](Self::quiesce_for_handover)): appends and
    /// membership changes are taken again, and heartbeats resume should this replica still
    /// lead.
    pub fn end_handover(&self) {
        self.raft().runtime_config().heartbeat(true);
        self.inner
            .handing_over_to
            .store(0, std::sync::atomic::Ordering::SeqCst);
    }

    /// The read index for a linearizable read: confirms with a quorum of voters that this
    /// replica still leads (openraft's `ensure_linearizable`, a round of heartbeats), waits
    /// until it has applied every entry committed when asked, and answers with its applied
    /// offset then. A `state` with that `min_offset`, at any replica, holds every write
    /// acknowledged before the call. Unlike [`state`](Self::state) at the leader, which
    /// trusts the leader lease (a bound on clock drift), it trusts no clock. `NotLeader` on a
    /// follower, and naming the target on a leader handing over, which sends nothing more to
    /// the voters; `Unavailable` when no quorum confirms.
    pub async fn read_index(&self) -> Result<Offset, ApiError> {
        use openraft::error::CheckIsLeaderError;
        // Its round of heartbeats would tell the voters that this leader still leads, after
        // the target was told that their leases lapse.
        self.refuse_while_handing_over()?;
        match self.raft().ensure_linearizable().await {
            Ok(_) => Ok(self.applied().borrow().last_offset),
            Err(RaftError::APIError(CheckIsLeaderError::ForwardToLeader(forward))) => {
                Err(not_leader(forward.leader_id, forward.leader_node.as_ref()))
            }
            Err(RaftError::APIError(CheckIsLeaderError::QuorumNotEnough(e))) => {
                Err(ApiError::Unavailable(format!(
                    "replica {} could not confirm with a quorum that it leads: {e}",
                    self.id()
                )))
            }
            Err(RaftError::Fatal(fatal)) => Err(ApiError::Unavailable(format!(
                "replica {}: {fatal}",
                self.id()
            ))),
        }
    }

    /// The JobState as of this replica's applied offset, once that reaches `min_offset`.
    /// `Unavailable` from a replica whose state may have stopped moving
    /// ([`refuse_stale_reads`](Self::refuse_stale_reads)).
    pub async fn state(&self, min_offset: Offset, max_wait: Duration) -> Result<StateAt, ApiError> {
        self.refuse_stale_reads()?;
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
        // Shared with the state machine, which copies on its next write if this answer is
        // still held then: the answer costs a reference, however many readers ask.
        let (job, rejections) = self
            .inner
            .state_machine
            .read(|state| (state.job.clone(), state.rejections.clone()));
        Ok(StateAt {
            offset: job.last_offset(),
            state: job,
            rejections,
        })
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
        let without_quorum = metrics.state == ServerState::Leader && self.leads_without_quorum();
        let role = match metrics.state {
            ServerState::Leader if without_quorum => "Leader without quorum",
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
            // A leader cut off from its quorum, or one that stepped down when it removed
            // itself from the membership (openraft then leaves `current_leader` naming it),
            // does not know who leads now; naming itself would send clients (`leader_status`,
            // redirects) back to it.
            leader_id: metrics.current_leader.filter(|&leader| {
                leader != self.inner.id || (metrics.state == ServerState::Leader && !without_quorum)
            }),
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
    pub fn applied(&self) -> tokio::sync::watch::Receiver<Applied> {
        self.inner.state_machine.applied()
    }

    /// Reads the JobState as of the applied offset.
    pub fn read_state<T>(&self, f: impl FnOnce(&JobState) -> T) -> T {
        self.inner.state_machine.read(|state| f(&state.job))
    }

    /// The last offset applied on this replica.
    pub fn applied_offset(&self) -> Offset {
        self.inner.state_machine.read(|s| s.job.last_offset())
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
}

/// One append counted in `proposals_unanswered` from before [`Node::propose`] looks at the
/// handover's fence until it is answered, so that [`Node::quiesce_for_handover`] waits for
/// every append that passed the fence: taken just before a handover began, one may still be
/// in the proposer's queue when the leader's last entry looks committed, and reach Raft
/// after the target was told to stand.
///
/// The count ends when the caller's future does: an append whose caller gave up on it (a
/// client's deadline, a dropped connection) leaves its proposal in the proposer's queue
/// uncounted. Only the proposer could count those, by its queue.
struct Unanswered<'a>(&'a NodeInner);

impl<'a> Unanswered<'a> {
    fn count(inner: &'a NodeInner) -> Unanswered<'a> {
        (inner.proposals_unanswered).fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        Unanswered(inner)
    }
}

impl Drop for Unanswered<'_> {
    fn drop(&mut self) {
        let before =
            (self.0.proposals_unanswered).fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
        if before == 1 {
            self.0.proposals_answered.notify_waiters();
        }
    }
}

/// What the founding raise asks of the node it runs on.
impl founding::NewLog for Node {
    fn leads(&self) -> bool {
        self.is_leader()
    }

    fn job_state(&self) -> Arc<JobState> {
        Node::job_state(self)
    }

    async fn member_levels(&self) -> Vec<(NodeId, Result<Level, ApiError>)> {
        Node::member_levels(self).await
    }

    async fn propose(&self, command: Command) -> Result<AppendAck, ApiError> {
        Node::propose(self, Proposal::of_command(command)).await
    }
}
