//! A replica: storage, Raft, the peer and client listeners and the proposer, wired together.

use std::sync::Arc;
use std::time::Duration;

use std::collections::BTreeMap;

use openraft::error::InitializeError;
use openraft::SnapshotPolicy;
use tokio::task::JoinHandle;

use crate::raft::elector::{ElectionTimer, ElectionTiming};
use crate::raft::network::{PeerAnswers, PeerNetwork, RAFT_PAYLOAD_ENTRIES_MAX};
use crate::raft::node::{Node, NodeConfig};
use crate::raft::restore::{open_storage_of, Storage};
use crate::raft::storage::data_dir::ClusterIdentity;
use crate::raft::storage::meta_store::Closed;
use crate::raft::storage::recover::ForcedMembership;
use crate::raft::storage::scrub::{self, ScrubConfig, StorageFaults};
use crate::raft::types::{Raft, RaftError};
use crate::server::config::{ClientPortConfig, ConfigError, ReplicaConfig};
use crate::server::handle::{Inner, ReplicaHandle, HANDOVER_DIAL_TIMEOUT, HANDOVER_SEND_TIMEOUT};
use crate::server::observe::telemetry::Telemetry;
use crate::server::ports::auth::Authenticator;
use crate::server::ports::client::{bind_clients, serve_clients, ConnectionBudget};
use crate::server::ports::connections::PortLimits;
use crate::server::ports::grpc::{bind_grpc, serve_grpc, GrpcPortConfig};
use crate::server::ports::http::{bind_http, serve_http};
use crate::server::ports::page_access::PageAccess;
use crate::server::ports::peer::{bind_peers, serve_peers};
use crate::server::ports::tls::ReplicaTls;
use crate::wire::Member;
use crate::NodeId;

/// How long `Replica::shutdown` lets its listeners end their connections before aborting them.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(5);

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
    /// The job's controller's thread or runtime could not be started.
    #[error("the job's controller: {0}")]
    Controller(std::io::Error),
    /// A port could not be bound (in use, or not this host's address). Nothing on disk was
    /// touched: ports are bound before storage opens.
    #[error("binding the {port} port {addr}: {error}")]
    Bind {
        port: &'static str,
        addr: std::net::SocketAddr,
        error: std::io::Error,
    },
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
            let raft = self.handle.inner.node.raft().clone();
            runtime.spawn(async move {
                let _ = raft.shutdown().await;
            });
        }
    }
}

/// How long a stopping leader, its appends refused, waits for the voter it hands over to to
/// hold and commit its last entry before it gives up the handover.
const HANDOVER_CATCH_UP_MAX: Duration = Duration::from_millis(300);

/// Says once, at start, that this replica's own log no longer counts it a member: it was
/// removed, and serves nothing (`/readyz` answers 503, its peers refuse it) until it is
/// stopped and its directory wiped. A removed replica that did not receive its removal cannot
/// know it; its peers then say it (`raft::network::RefusedOutsiders`). Waits for the first
/// membership Raft reports (none on a new replica until it is added), or for `stopping`.
async fn warn_if_removed(raft: Raft, id: NodeId, mut stopping: tokio::sync::watch::Receiver<bool>) {
    let mut metrics = raft.metrics();
    let members = tokio::select! {
        reported = metrics.wait_for(|m| m.membership_config.membership().nodes().next().is_some()) => {
            match reported {
                Ok(metrics) => (metrics.membership_config.membership().nodes())
                    .map(|(id, _)| *id)
                    .collect::<Vec<NodeId>>(),
                Err(_) => return,
            }
        }
        _ = stopping.wait_for(|stop| *stop) => return,
    };
    if !members.contains(&id) {
        tracing::warn!(
            replica = id,
            ?members,
            "this replica was removed from the cluster: its log's membership does not name \
             it. It serves nothing; stop it and wipe its directory (to bring the host back, \
             add it as a new id)"
        );
    }
}

fn raft_config(config: &ReplicaConfig) -> Result<openraft::Config, StartError> {
    openraft::Config {
        cluster_name: "ctrlog".into(),
        heartbeat_interval: config.raft.heartbeat_interval_ms,
        election_timeout_min: config.raft.election_timeout_min_ms,
        election_timeout_max: config.raft.election_timeout_max_ms,
        // ctrlog stands for election itself (raft::elector), re-drawing the timeout each time.
        enable_elect: false,
        // A chunk is applied with an fsync of sled on the receiver; give it time.
        install_snapshot_timeout: 10_000,
        max_payload_entries: RAFT_PAYLOAD_ENTRIES_MAX,
        snapshot_policy: SnapshotPolicy::LogsSinceLast(config.raft.snapshot_logs_since_last),
        max_in_snapshot_log_to_keep: config.raft.snapshot_logs_to_keep,
        ..Default::default()
    }
    .validate()
    .map_err(|e| StartError::Raft(e.to_string()))
}

/// How often a replica serving gRPC asks the members whose gRPC port it does not know yet.
const GRPC_ADDRS_ASKED_EVERY: Duration = Duration::from_secs(2);

/// Learns where the other members serve gRPC (the peer port's `grpc_addr`), so that this
/// replica's gRPC `NotLeader` names the leader's gRPC port and its `Status` lists every
/// member's: each member not known yet is asked every [`GRPC_ADDRS_ASKED_EVERY`], and one
/// that answers is not asked again (a member's address is fixed for its life, as its peer and
/// client addresses are).
async fn learn_grpc_addrs(replica: ReplicaHandle, mut stop: tokio::sync::watch::Receiver<bool>) {
    loop {
        let members: Vec<(NodeId, Member)> = {
            let metrics = replica.metrics();
            let membership = metrics.membership_config.membership();
            (membership.nodes())
                .filter(|(id, _)| **id != replica.id() && replica.grpc_addr_of(**id).is_none())
                .map(|(id, member)| (*id, member.clone()))
                .collect()
        };
        for (id, member) in members {
            match (replica.inner.peers)
                .grpc_addr(id, &member, GRPC_ADDRS_ASKED_EVERY)
                .await
            {
                Ok(Some(addr)) => replica.learned_grpc_addr(id, addr),
                Ok(None) => {}
                Err(why) => tracing::debug!(id, %why, "could not ask a member for its gRPC port"),
            }
        }
        tokio::select! {
            _ = tokio::time::sleep(GRPC_ADDRS_ASKED_EVERY) => {}
            _ = stop.changed() => return,
        }
    }
}

/// What the client port and each of its connections may hold, from `[client_port]`.
fn connection_budget(port: &ClientPortConfig) -> ConnectionBudget {
    ConnectionBudget {
        port: PortLimits {
            connections_max: port.connections_max,
            unauthenticated_max: port
                .unauthenticated_connections_max
                .min(port.connections_max),
            unauthenticated_per_source_max: port.unauthenticated_per_source_max,
            receiving_bytes_max: port.receiving_bytes_max,
            idle_timeout: Duration::from_millis(port.idle_timeout_ms),
            frame_read_timeout: Duration::from_millis(port.frame_read_timeout_ms),
        },
        requests: port.requests_in_flight_max,
        append_bytes: port.append_bytes_in_flight_max,
        answer_bytes: port.unwritten_answer_bytes_max,
        authenticate_timeout: Duration::from_millis(port.authenticate_timeout_ms),
        port_answer_bytes: port.port_unwritten_answer_bytes_max,
        principal_held_bytes: port.principal_held_bytes_max,
    }
}

impl Replica {
    /// Opens storage, binds both ports and starts Raft. Initialises the cluster when this is
    /// the lowest initial member and its log is empty (never on a restart).
    pub async fn start(config: ReplicaConfig) -> Result<Replica, StartError> {
        config.validate()?;
        // Bound first: a port in use must not leave a data directory initialised behind it.
        let bind_error = |port, addr| move |error| StartError::Bind { port, addr, error };
        let peer_listener = bind_peers(config.peer_addr)
            .await
            .map_err(bind_error("peer", config.peer_addr))?;
        let client_listener = bind_clients(config.client_addr, &config.client_port)
            .await
            .map_err(bind_error("client", config.client_addr))?;
        let grpc_listener = match config.grpc.addr {
            Some(addr) => Some(bind_grpc(addr).await.map_err(bind_error("gRPC", addr))?),
            None => None,
        };
        let http_listener = match config.http_addr {
            Some(addr) => Some(bind_http(addr).await.map_err(bind_error("HTTP", addr))?),
            None => None,
        };
        // The certificate is checked before the directory is touched too: another node's is
        // refused at start, not by every peer afterwards.
        let tls = config
            .tls
            .as_ref()
            .map(|files| ReplicaTls::load(files, config.id))
            .transpose()
            .map_err(|e| StartError::Tls(e.to_string()))?;
        let (data_dir, id) = (config.data_dir.clone(), config.id);
        // Recovery reads the whole retained log, and opening may wait for the directory's lock:
        // blocking work, kept off the runtime's workers.
        let (
            Storage {
                log,
                state_machine,
                closed: storage_closed,
                found_at_open,
            },
            cluster,
        ) = tokio::task::spawn_blocking(move || -> std::io::Result<_> {
            let storage = open_storage_of(&data_dir, id)?;
            Ok((storage, Arc::new(ClusterIdentity::load(&data_dir)?)))
        })
        .await
        .map_err(std::io::Error::other)??;
        let identity = cluster.clone();
        state_machine.on_cluster_derived(Box::new(move |id| identity.derived(id)));
        let storage_faults = Arc::new(StorageFaults::default());
        for kind in found_at_open {
            storage_faults.found(kind);
        }
        log.serve_as(config.id);
        let authenticator = config
            .auth
            .as_ref()
            .map(Authenticator::load)
            .transpose()
            .map_err(StartError::Auth)?
            .map(Arc::new);
        let elections = Arc::new(ElectionTimer::new(
            ElectionTiming {
                timeout_min: Duration::from_millis(config.raft.election_timeout_min_ms),
                timeout_max: Duration::from_millis(config.raft.election_timeout_max_ms),
                heartbeat: Duration::from_millis(config.raft.heartbeat_interval_ms),
            },
            rand::random(),
        ));
        let stages = log.stages();
        let peers = PeerNetwork {
            tls: tls.as_ref().map(|t| t.to_peers.clone()),
            elections: Some(elections.clone()),
            stages: Some(stages.clone()),
            durable: Some(log.durable()),
            cluster: Some(cluster.clone()),
        };
        let (stop, stopping) = tokio::sync::watch::channel(false);
        let node_config = NodeConfig {
            id: config.id,
            raft: raft_config(&config)?,
            command_bytes_max: config.client_port.command_bytes_max,
            fetch_answer_bytes_max: config.client_port.answer_bytes_max(),
            secret_config_keys: config.client_port.secret_config_keys.clone(),
            level_of_new_log: config.level_of_new_log(),
        };
        let handover_peers = peers.clone();
        let (node, node_tasks) = Node::start(
            node_config,
            peers.clone(),
            log,
            state_machine,
            elections.clone(),
            Arc::new(peers),
            stopping.clone(),
        )
        .await
        .map_err(|e| StartError::Raft(e.to_string()))?;
        let raft = node.raft().clone();

        let (peer_addr, client_addr) = (peer_listener.local_addr()?, client_listener.local_addr()?);
        let http_addr = http_listener.as_ref().map(|l| l.local_addr()).transpose()?;
        let grpc_addr = grpc_listener.as_ref().map(|l| l.local_addr()).transpose()?;
        let handle = ReplicaHandle {
            inner: Arc::new(Inner {
                node,
                peer_addr,
                client_addr,
                telemetry: Telemetry::default(),
                http_addr,
                grpc_addr,
                grpc_addrs: Default::default(),
                history: Default::default(),
                certificate_expiries: tls.as_ref().map(|t| t.expiries.clone()).unwrap_or_default(),
                storage_faults,
                cluster: cluster.clone(),
                peers: handover_peers,
            }),
        };
        let first_contact = Arc::new(config.first_contact());
        let knows_members = raft
            .metrics()
            .borrow()
            .membership_config
            .nodes()
            .next()
            .is_some();
        if !knows_members && config.initial_members.is_empty() && config.join_from.is_empty() {
            tracing::warn!(
                "this replica's log knows no membership, and it was given neither founding \
                 members (initial_members) nor the members that will add it (join_from): it \
                 refuses every peer until it is initialised here; give --join-from the \
                 members' ids to have it added by `members add`"
            );
        }
        let mut tasks = node_tasks;
        let scrub = ScrubConfig {
            bytes_per_second: config.raft.scrub_mib_per_second << 20,
            interval: Duration::from_millis(config.raft.scrub_interval_ms),
        };
        tasks.extend([
            tokio::spawn(warn_if_removed(raft.clone(), config.id, stopping.clone())),
            tokio::spawn(scrub_until_fault(handle.clone(), scrub, stopping.clone())),
            tokio::spawn(serve_peers(
                peer_listener,
                PeerAnswers {
                    raft: raft.clone(),
                    log: handle.node().log().clone(),
                    elections,
                    outsiders: Default::default(),
                    first_contact: first_contact.clone(),
                    refusals: Default::default(),
                },
                cluster.clone(),
                grpc_addr.map(|addr| addr.to_string()),
                tls.as_ref().map(|t| t.peers.clone()),
                stopping.clone(),
            )),
            tokio::spawn(serve_clients(
                client_listener,
                handle.clone(),
                connection_budget(&config.client_port),
                tls.as_ref().map(|t| t.clients.clone()),
                authenticator.clone(),
                stopping.clone(),
            )),
        ]);
        if let Some(listener) = grpc_listener {
            tasks.push(tokio::spawn(learn_grpc_addrs(
                handle.clone(),
                stopping.clone(),
            )));
            tasks.push(tokio::spawn(serve_grpc(
                listener,
                handle.clone(),
                GrpcPortConfig {
                    budget: connection_budget(&config.client_port),
                    message_bytes_max: config.client_port.frame_bytes_max,
                },
                tls.as_ref().map(|t| t.grpc.clone()),
                authenticator.clone(),
                stopping.clone(),
            )));
        }
        if let Some(listener) = http_listener {
            let access = PageAccess::new(authenticator, &config.http_allowed_hosts);
            tasks.push(tokio::spawn(serve_http(
                listener,
                handle.clone(),
                access,
                stopping,
            )));
        }
        let replica = Replica {
            stopped: false,
            storage_closed: Some(storage_closed),
            tasks,
            stop,
            handle,
        };
        tracing::info!(id = config.id, %peer_addr, %client_addr, ?grpc_addr, ?http_addr, "replica started");
        for warning in config.exposure_warnings() {
            tracing::warn!("INSECURE: {warning}");
        }

        let lowest = config.initial_members.keys().next().copied();
        if lowest == Some(config.id) {
            replica.initialize(config.initial_members.clone()).await?;
        }
        Ok(replica)
    }

    /// Stops as [`shutdown`](Self::shutdown) does; a leader first hands over to its most
    /// caught-up voter (`ctrlog serve` on SIGTERM), as `transfer_leader` does: it dials that
    /// voter and the others, falls silent once the voter holds its last entry and that entry
    /// is committed (appends meanwhile are answered `NotLeader` naming the voter, so the log
    /// stops growing), stops its Raft core, and tells the voter, which stands as soon as the
    /// voters' leases from the core's last message lapse, instead of a heartbeat and a random
    /// spread after (`raft::elector`). If no voter's build takes a handover, or none catches
    /// up within `HANDOVER_CATCH_UP_MAX`, it stops as before and the voters elect on their
    /// timeouts.
    pub async fn shutdown_handing_over(self) {
        if let Some(handover) = self.prepare_handover().await {
            let to = handover.to();
            let node = self.handle.node();
            let handed_over = match node.quiesce_for_handover(to, HANDOVER_CATCH_UP_MAX).await {
                Err(refused) => Err(refused.to_string()),
                Ok(()) => {
                    if let Err(error) = self.raft().shutdown().await {
                        tracing::warn!(%error, "raft did not shut down cleanly");
                    }
                    let silent_since = std::time::Instant::now();
                    (handover.send(self.id(), silent_since, HANDOVER_SEND_TIMEOUT)).await
                }
            };
            match handed_over {
                Ok(()) => tracing::info!(to, "handed the leadership over to replica {to}"),
                Err(why) => tracing::warn!(
                    %why,
                    "no handover; the voters elect a leader on their election timeouts"
                ),
            }
        }
        self.shutdown().await
    }

    /// The voter this leader hands over to, the one that holds the most of its log, dialled
    /// with the other voters. `None` on a follower, a lone voter, or a peer that takes no
    /// handover.
    async fn prepare_handover(&self) -> Option<crate::raft::network::Handover> {
        let id = self.id();
        let (membership, to) = {
            let metrics = self.raft().metrics();
            let m = metrics.borrow();
            if m.current_leader != Some(id) {
                return None;
            }
            let membership = m.membership_config.membership().clone();
            let matched = |voter: NodeId| {
                let index = m
                    .replication
                    .as_ref()?
                    .get(&voter)
                    .copied()
                    .flatten()?
                    .index;
                Some((index, voter))
            };
            let best = membership
                .voter_ids()
                .filter(|v| *v != id)
                .filter_map(matched)
                .max();
            (membership, best?.1)
        };
        match (self.handle.inner.peers)
            .prepare_handover(id, to, &membership, HANDOVER_DIAL_TIMEOUT)
            .await
        {
            Ok(handover) => Some(handover),
            Err(why) => {
                tracing::warn!(%why, "no handover; the voters elect a leader on their election timeouts");
                None
            }
        }
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
        if let Err(error) = self.handle.inner.node.raft().shutdown().await {
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

impl Replica {
    /// A handle that outlives this borrow (it does not keep the listeners alive).
    pub fn clone_handle(&self) -> ReplicaHandle {
        self.handle.clone()
    }

    /// Initialises a new cluster with these members, after drawing and recording its cluster
    /// id. Does nothing if this replica already has state (a restart, or a cluster that
    /// another founder initialised): nothing is drawn for a replica with state, whose cluster
    /// may have an id it has not met yet. The other members hear this replica only if they
    /// were started with it among their `initial_members` or their `join_from`: until its log
    /// gives it a membership, a replica refuses every other node.
    pub async fn initialize(&self, members: BTreeMap<NodeId, Member>) -> Result<(), StartError> {
        let raft = self.raft();
        let initialized =
            (raft.is_initialized().await).map_err(|e| StartError::Raft(e.to_string()))?;
        if initialized {
            return Ok(());
        }
        let cluster = self.handle.inner.cluster.clone();
        let drawn = tokio::task::spawn_blocking(move || cluster.found())
            .await
            .map_err(std::io::Error::other)??;
        tracing::info!(cluster = %drawn, "initialising cluster {drawn}");
        match raft.initialize(members).await {
            Ok(()) => Ok(()),
            Err(RaftError::APIError(InitializeError::NotAllowed(_))) => Ok(()),
            Err(e) => Err(StartError::Raft(e.to_string())),
        }
    }
}

/// Scrubs the replica's storage (on a thread of its own) until it stops, or until the
/// scrubber finds a fault: then the replica stops its Raft core, and `serve` exits naming the
/// fault, so that the restart repairs it ([`crate::raft::storage::scrub`]).
async fn scrub_until_fault(
    replica: ReplicaHandle,
    config: ScrubConfig,
    stopping: tokio::sync::watch::Receiver<bool>,
) {
    let node = replica.node();
    let (log, state_machine) = (node.log().clone(), node.state_machine().clone());
    let faults = replica.storage_faults().clone();
    let found = tokio::task::spawn_blocking(move || {
        scrub::run(&log, state_machine.snapshots(), config, &faults, &stopping)
    })
    .await;
    if let Ok(Some(fault)) = found {
        tracing::error!(
            kind = %fault.kind,
            file = %fault.file.display(),
            detail = %fault.detail,
            "the scrubber found damage; the replica stops so that its restart repairs it from \
             the peers"
        );
        replica.storage_faults().stop_for(fault);
        if let Err(error) = node.raft().shutdown().await {
            tracing::warn!(%error, "raft did not shut down cleanly");
        }
    }
}

/// Runs one replica until `shutdown` resolves: what `ctrlog serve` does.
pub async fn serve(
    config: ReplicaConfig,
    shutdown: impl std::future::Future<Output = ()>,
) -> Result<(), StartError> {
    let wanted = config.client_port.connections_max as u64
        + crate::server::ports::http::HTTP_CONNECTIONS_MAX as u64
        + crate::server::ports::connections::OPEN_FILES_BESIDES_CONNECTIONS;
    match crate::server::ports::connections::raise_open_files_limit(wanted) {
        Ok(open_files_max) => tracing::info!(open_files_max, "open files"),
        Err(error) => tracing::warn!(%error, "could not read or raise the open files limit"),
    }
    let job = config.job.clone();
    let controller_config = config.clone();
    let replica = Replica::start(config).await?;
    // Every replica with a job runs its controller; only the leader's acts.
    let (stop_controller, controller_stopped) = tokio::sync::oneshot::channel::<()>();
    let controller = match job {
        Some(job) => {
            let controller =
                crate::server::job::controller(&controller_config, &job, replica.clone_handle());
            tracing::info!(launcher = ?job.launcher, "running the job's controller");
            Some(run_on_own_thread(controller.run(async move {
                let _ = controller_stopped.await;
            }))?)
        }
        None => None,
    };
    // A replica whose Raft core stopped on a fatal (storage) error must not linger as a
    // zombie: exit, so that a supervisor restarts it and recovery runs.
    // The error names what failed: for a storage error, the file and the operation.
    let mut metrics = replica.raft().metrics();
    let storage_faults = replica.storage_faults().clone();
    let fatal = async move {
        let stopped = match metrics.wait_for(|m| m.running_state.is_err()).await {
            Ok(stopped) => match &stopped.running_state {
                Err(fatal) => fatal.to_string(),
                Ok(()) => "no error".into(),
            },
            Err(_) => "its metrics are gone".into(),
        };
        match storage_faults.stopped_for() {
            Some(fault) => format!(
                "{stopped}: the scrubber found {} in {}: {}; restart the replica to repair it \
                 from the peers",
                fault.kind,
                fault.file.display(),
                fault.detail
            ),
            None => stopped,
        }
    };
    let result = tokio::select! {
        _ = shutdown => Ok(()),
        fatal = fatal => Err(StartError::Raft(format!(
            "the Raft core stopped on a fatal error: {fatal}"
        ))),
    };
    tracing::info!(id = replica.id(), "shutting down");
    let _ = stop_controller.send(());
    if let Some(controller) = controller {
        let _ = controller.await;
    }
    match result {
        // Stopping as asked (SIGTERM): a leader hands over first.
        Ok(()) => replica.shutdown_handing_over().await,
        Err(_) => replica.shutdown().await,
    }
    result
}

/// Runs `controller` on a thread of its own, with a runtime of its own; the receiver
/// resolves when it has returned.
///
/// A tick over a large job is milliseconds of CPU between two awaits (about 10 ms at 10,000
/// containers, every 100 ms by default). On the replica's runtime it held a worker thread for
/// all of it, and with one worker (a bench replica on a shared machine) every heartbeat,
/// append and Raft message waited behind it; a long plan cost a leader its Raft heartbeats.
/// On its own thread, the kernel shares the cores between the two instead. It talks to the
/// replica only through `ReplicaHandle`, whose channels work from any runtime.
fn run_on_own_thread(
    controller: impl std::future::Future<Output = ()> + Send + 'static,
) -> Result<tokio::sync::oneshot::Receiver<()>, StartError> {
    let (returned, finished) = tokio::sync::oneshot::channel();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(StartError::Controller)?;
    std::thread::Builder::new()
        .name("ctrlog-controller".into())
        .spawn(move || {
            runtime.block_on(controller);
            let _ = returned.send(());
        })
        .map_err(StartError::Controller)?;
    Ok(finished)
}

/// `ctrlog force-new-cluster`: makes the stopped replica that `config` describes the only
/// member of its cluster, reachable at its configured addresses (see
/// [`raft::storage::recover`](crate::raft::storage::recover)).
pub fn force_new_cluster(config: &ReplicaConfig) -> std::io::Result<ForcedMembership> {
    crate::raft::storage::recover::force_new_cluster(&config.data_dir, config.id, config.member())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A controller that holds its thread does not hold the replica's runtime. Steps: on a
    /// runtime of one thread (as a bench replica has), the controller blocks its thread until
    /// the replica's runtime sends it a word, which that runtime can do only while the
    /// controller is still blocked. Spawned on the replica's runtime, as it was, the
    /// controller waited out its 5 s and heard nothing.
    #[tokio::test(flavor = "current_thread")]
    async fn a_blocked_controller_leaves_the_replicas_runtime_running() {
        let (word, waiting) = std::sync::mpsc::channel::<()>();
        let (heard, hearing) = tokio::sync::oneshot::channel();
        let finished = run_on_own_thread(async move {
            let _ = heard.send(waiting.recv_timeout(Duration::from_secs(5)).is_ok());
        })
        .unwrap();
        tokio::task::yield_now().await;
        // Fails only if the controller gave up waiting, which the assertion reports.
        let _ = word.send(());
        assert!(
            hearing.await.unwrap(),
            "the replica's runtime ran while the controller held its thread"
        );
        finished
            .await
            .expect("the controller's thread said it returned");
    }
}
