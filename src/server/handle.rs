//! [`ReplicaHandle`]: the library API of a running replica, what the client port, the
//! observability port and an embedding program call. The rules of every request path are the
//! socket-free [`Node`]'s, which the simulation runs too; the handle adds what only a process
//! with sockets has (its addresses, telemetry, the status page's history, its certificates)
//! and the [`ControlPlane`] the controller reaches the replica through.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use crate::controller::ControlPlane;
use crate::jobs::{JobState, ReportedLag, Session};
use crate::log::{Command, ContainerId, Epoch, Offset, Proposal, TaskId};
use crate::raft::network::PeerNetwork;
use crate::raft::node::Node;
use crate::raft::state_machine::{Applied, SnapshotStats};
use crate::raft::storage::data_dir::ClusterIdentity;
use crate::raft::storage::scrub::StorageFaults;
use crate::raft::types::{Raft, RaftMetrics};
use crate::server::observe::expiry::CertificateExpiry;
use crate::server::observe::history::History;
use crate::server::observe::telemetry::Telemetry;
use crate::wire::{
    ApiError, AppendAck, ClusterId, FetchRequest, FetchResponse, HeartbeatAck, Member, StateAt,
    Status,
};
use crate::NodeId;

pub use crate::raft::node::{
    LEARNER_FIRST_CONTACT_MAX, MEMBERSHIP_COMMIT_WAIT, MEMBER_CATCH_UP_TIMEOUT,
};

pub(in crate::server) struct Inner {
    pub(in crate::server) node: Node,
    pub(in crate::server) peer_addr: SocketAddr,
    pub(in crate::server) client_addr: SocketAddr,
    pub(in crate::server) telemetry: Telemetry,
    pub(in crate::server) http_addr: Option<SocketAddr>,
    pub(in crate::server) grpc_addr: Option<SocketAddr>,
    /// The other members' gRPC ports, as they said (see `replica::learn_grpc_addrs`).
    pub(in crate::server) grpc_addrs: std::sync::Mutex<BTreeMap<NodeId, String>>,
    /// The last minutes, for the status page's charts (sampled while the HTTP port runs).
    pub(in crate::server) history: History,
    /// When the TLS certificates this replica loaded expire (none without TLS).
    pub(in crate::server) certificate_expiries: Vec<CertificateExpiry>,
    /// Storage faults found at open and by the scrubber.
    pub(in crate::server) storage_faults: Arc<StorageFaults>,
    /// The cluster this replica's directory records.
    pub(in crate::server) cluster: Arc<ClusterIdentity>,
    /// The peers, as Raft dials them: a leader dials one more to hand over.
    pub(in crate::server) peers: PeerNetwork,
}

/// How long a leader may take to dial the voter it hands over to.
pub(in crate::server) const HANDOVER_DIAL_TIMEOUT: Duration = Duration::from_millis(500);

/// How long the handover message may take once the leader is silent: the voter stands a
/// lease after the leader's last message whatever it is told, so a late message only loses
/// the handover.
pub(in crate::server) const HANDOVER_SEND_TIMEOUT: Duration = Duration::from_millis(200);

/// How long `transfer_leader` waits for the voter it hands over to to hold the leader's
/// last entry (appends are refused meanwhile, so it stops growing).
const TRANSFER_CATCH_UP_MAX: Duration = Duration::from_secs(2);

/// How long `transfer_leader` waits for the voter to lead once told: a lease, a vote round,
/// and room for a slow disk.
const TRANSFER_MAX: Duration = Duration::from_secs(5);

/// A cheap, cloneable handle to a running replica: the library API.
#[derive(Clone)]
pub struct ReplicaHandle {
    pub(in crate::server) inner: Arc<Inner>,
}

/// How far applied may trail the log for a replica to say it is ready.
pub const READY_APPLY_LAG_MAX: u64 = 1_000;

impl ReplicaHandle {
    /// The last minutes of the job as this replica sampled them.
    pub fn history(&self) -> &History {
        &self.inner.history
    }

    pub fn id(&self) -> NodeId {
        self.inner.node.id()
    }

    /// The cluster this replica's directory records: `None` until its founder drew one or a
    /// peer introduced one (a cluster that v0.1.0 initialised has none).
    pub fn cluster_id(&self) -> Option<ClusterId> {
        self.inner.cluster.known()
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
        self.inner.node.raft()
    }

    /// Where the observability port (metrics, probes, status page) listens, if it is enabled.
    pub fn http_addr(&self) -> Option<SocketAddr> {
        self.inner.http_addr
    }

    /// Where the gRPC port listens, if it is on (`[grpc] addr`).
    pub fn grpc_addr(&self) -> Option<SocketAddr> {
        self.inner.grpc_addr
    }

    /// The gRPC port of replica `id`, as far as this replica knows: its own, and those the
    /// other members told it.
    pub fn grpc_addr_of(&self, id: NodeId) -> Option<String> {
        if id == self.id() {
            return self.grpc_addr().map(|addr| addr.to_string());
        }
        let learned = self.inner.grpc_addrs.lock().expect("never poisoned");
        learned.get(&id).cloned()
    }

    pub(in crate::server) fn learned_grpc_addr(&self, id: NodeId, addr: String) {
        tracing::info!(id, %addr, "learned a member's gRPC port");
        let mut learned = self.inner.grpc_addrs.lock().expect("never poisoned");
        learned.insert(id, addr);
    }

    /// When the TLS certificates this replica loaded expire (none without TLS).
    pub fn certificate_expiries(&self) -> &[CertificateExpiry] {
        &self.inner.certificate_expiries
    }

    pub(crate) fn telemetry(&self) -> &Telemetry {
        &self.inner.telemetry
    }

    /// Storage faults found at open and by the scrubber, and the scrubber's progress.
    pub fn storage_faults(&self) -> &Arc<StorageFaults> {
        &self.inner.storage_faults
    }

    /// The commit path's stage timings on this replica ([`crate::raft::stages`]).
    pub(crate) fn commit_stages(&self) -> Arc<crate::raft::stages::CommitStages> {
        self.inner.node.log().stages()
    }

    /// Bytes of WAL segments on disk.
    pub fn wal_bytes(&self) -> u64 {
        self.inner.node.log().disk_bytes()
    }

    /// The repair of a damaged log under way on this replica, if any
    /// ([`Repair`](crate::raft::storage::log_store::Repair)): until it ends, the replica neither votes
    /// nor stands.
    pub fn repairing(&self) -> std::io::Result<Option<crate::raft::storage::log_store::Repair>> {
        self.inner.node.log().repairing()
    }

    /// Commands the job model has refused since the log began.
    pub fn rejected_total(&self) -> u64 {
        self.inner
            .node
            .state_machine()
            .read(|state| state.rejections.total)
    }

    pub fn snapshot_stats(&self) -> SnapshotStats {
        self.inner.node.state_machine().snapshot_stats()
    }

    pub fn metrics(&self) -> RaftMetrics {
        self.inner.node.metrics()
    }

    /// Whether this replica answers reads with current data: Raft runs, it is a member that
    /// knows a leader (or leads with a quorum), and it has applied all but
    /// [`READY_APPLY_LAG_MAX`] entries of its log; otherwise why not. What `/readyz` and the
    /// gRPC port's health service both say.
    pub fn readiness(&self) -> Result<(), String> {
        let raft = self.metrics();
        if let Err(fatal) = &raft.running_state {
            return Err(format!("raft stopped: {fatal}"));
        }
        // A replica that leads without a quorum, or is no member, holds what may have stopped
        // moving: not ready, though its metrics may name a leader (itself, or the one it had).
        self.node()
            .refuse_stale_reads()
            .map_err(|stale| stale.to_string())?;
        if raft.current_leader.is_none() {
            return Err("no leader known".into());
        }
        let applied = raft.last_applied.map_or(0, |l| l.index);
        let known = raft.last_log_index.unwrap_or(0);
        if known.saturating_sub(applied) > READY_APPLY_LAG_MAX {
            return Err(format!("applied index {applied} trails the log at {known}"));
        }
        Ok(())
    }

    /// The socket-free node this replica runs: every rule of its request paths.
    pub fn node(&self) -> &Node {
        &self.inner.node
    }

    /// Whether this replica leads now ([`Node::is_leader`]): the one answer to "am I the
    /// leader" that heartbeats, the controller, the observability port and the tools all use.
    pub fn is_leader(&self) -> bool {
        self.inner.node.is_leader()
    }

    /// Appends one command ([`Node::append`]), counted in the telemetry.
    pub async fn append(&self, proposal: Proposal) -> Result<AppendAck, ApiError> {
        let started = std::time::Instant::now();
        let result = self.inner.node.append(proposal).await;
        self.inner.telemetry.append_done(&result, started.elapsed());
        result
    }

    /// Reads committed entries ([`Node::fetch`]), counted in the telemetry.
    pub async fn fetch(
        &self,
        request: &FetchRequest,
        max_wait: Duration,
    ) -> Result<FetchResponse, ApiError> {
        let _counted = self.inner.telemetry.fetch_started();
        let answer = self.inner.node.fetch(request, max_wait).await;
        if let Ok(response) = &answer {
            self.inner.telemetry.fetch_answered(response);
        }
        answer
    }

    /// Records a container's heartbeat ([`Node::heartbeat`]).
    pub fn heartbeat(
        &self,
        container: ContainerId,
        epoch: Epoch,
        lag: BTreeMap<TaskId, u64>,
    ) -> Result<HeartbeatAck, ApiError> {
        self.inner.node.heartbeat(container, epoch, lag)
    }

    /// Sessions this leader has not heard from ([`Node::overdue_sessions`]).
    pub fn overdue_sessions(&self, timeout: Duration) -> Result<Vec<Session>, ApiError> {
        self.inner.node.overdue_sessions(timeout)
    }

    /// The lag each live container last reported to this leader ([`Node::reported_lag`]).
    pub fn reported_lag(&self) -> Result<BTreeMap<ContainerId, u64>, ApiError> {
        self.inner.node.reported_lag()
    }

    /// Hands the leadership over to the voter `to` (`ctrlog members transfer-leader`): this
    /// leader dials it, falls silent ([`Node::quiesce_for_handover`]) and tells it so, and `to`
    /// stands as the voters' leases lapse (an `election_timeout_max`). Answers once `to`
    /// leads; appends meanwhile are answered `NotLeader` naming `to`. `Unavailable` if it
    /// did not happen within `TRANSFER_MAX`, when this replica takes appends again.
    pub async fn transfer_leader(&self, to: NodeId) -> Result<NodeId, ApiError> {
        let membership = self.metrics().membership_config.membership().clone();
        if membership.get_node(&to).is_none() {
            return Err(ApiError::Rejected(format!("replica {to} is not a member")));
        }
        if !self.is_leader() {
            return Err(crate::raft::types::not_leader_from(&self.metrics()));
        }
        let handover = (self.inner.peers)
            .prepare_handover(self.id(), to, &membership, HANDOVER_DIAL_TIMEOUT)
            .await
            .map_err(ApiError::Unavailable)?;
        let node = &self.inner.node;
        let moved = async {
            node.quiesce_for_handover(to, TRANSFER_CATCH_UP_MAX).await?;
            (handover.send(self.id(), std::time::Instant::now(), HANDOVER_SEND_TIMEOUT))
                .await
                .map_err(ApiError::Unavailable)?;
            let mut metrics = self.raft().metrics();
            let leads =
                async { (metrics.wait_for(|m| m.current_leader == Some(to)).await).map(drop) };
            match tokio::time::timeout(TRANSFER_MAX, leads).await {
                Ok(Ok(())) => Ok(to),
                Ok(Err(_)) => Err(ApiError::ShuttingDown),
                Err(_) => Err(ApiError::Unavailable(format!(
                    "replica {to} did not take the lead within {TRANSFER_MAX:?}; this replica \
                     takes appends again"
                ))),
            }
        }
        .await;
        node.end_handover();
        if moved.is_ok() {
            tracing::info!(to, "handed the leadership over to replica {to}");
        }
        moved
    }

    /// The read index for a linearizable read ([`Node::read_index`]).
    pub async fn read_index(&self) -> Result<Offset, ApiError> {
        self.inner.node.read_index().await
    }

    /// The JobState once applied to `min_offset` ([`Node::state`]).
    pub async fn state(&self, min_offset: Offset, max_wait: Duration) -> Result<StateAt, ApiError> {
        self.inner.node.state(min_offset, max_wait).await
    }

    /// This replica's view of the cluster.
    pub fn status(&self) -> Status {
        self.inner.node.status()
    }

    /// Watches the applied position (log index and offset).
    pub fn applied(&self) -> tokio::sync::watch::Receiver<Applied> {
        self.inner.node.applied()
    }

    /// Reads the JobState as of the applied offset.
    pub fn read_state<T>(&self, f: impl FnOnce(&JobState) -> T) -> T {
        self.inner.node.read_state(f)
    }

    /// The last offset applied on this replica.
    pub fn applied_offset(&self) -> Offset {
        self.inner.node.applied_offset()
    }

    /// Adds a replica ([`Node::add_member`]).
    pub async fn add_member(&self, id: NodeId, member: Member) -> Result<(), ApiError> {
        self.inner.node.add_member(id, member).await
    }

    /// Removes a replica ([`Node::remove_member`]).
    pub async fn remove_member(&self, id: NodeId) -> Result<(), ApiError> {
        self.inner.node.remove_member(id).await
    }

    /// Forces a snapshot now, without waiting for it.
    pub async fn snapshot_now(&self) -> Result<(), ApiError> {
        self.inner.node.snapshot_now().await
    }

    /// Takes a snapshot and waits until it is stored ([`Node::snapshot`]).
    pub async fn snapshot(&self) -> Result<Offset, ApiError> {
        self.inner.node.snapshot().await
    }

    /// Bytes this replica's log and metadata take on disk.
    pub fn log_disk_bytes(&self) -> u64 {
        self.inner.node.log().disk_bytes()
    }
}

/// The controller reaches its replica through this, and nothing else: it leads while
/// [`ReplicaHandle::is_leader`] says so, and writes only through the proposer.
impl ControlPlane for ReplicaHandle {
    fn is_leader(&self) -> bool {
        ReplicaHandle::is_leader(self)
    }

    fn job_state(&self) -> Arc<JobState> {
        self.inner.node.job_state()
    }

    fn overdue_sessions(&self, timeout: Duration) -> Vec<Session> {
        ReplicaHandle::overdue_sessions(self, timeout).unwrap_or_default()
    }

    fn reported_lag(&self) -> ReportedLag {
        self.inner.node.reported()
    }

    fn observe_tick(&self, took: Duration) {
        self.telemetry().controller_ticked(took);
    }

    async fn append(&self, command: Command) -> Result<AppendAck, ApiError> {
        ReplicaHandle::append(self, Proposal::of_command(command)).await
    }
}
