//! A replica's observability port (HTTP): Prometheus metrics, liveness and readiness probes,
//! and a status page.
//!
//! * `GET /metrics`: Prometheus text format (prometheus-client). Counters and histograms that
//!   need the request path (`Telemetry`) are kept as the requests happen; everything that is
//!   a reading of state (term, offsets, storage, the job) is read at scrape time, so a scrape
//!   always agrees with `ctrlog status` and `ctrlog state`.
//! * `GET /healthz`: 200 while the Raft core runs (503 once it stopped on a fatal error).
//! * `GET /readyz`: 200 when this replica is a member, knows a leader (or leads with a quorum
//!   that acknowledged it within `election_timeout_max`) and has applied within
//!   `handle::READY_APPLY_LAG_MAX` entries of its log, so it answers reads with current data; 503
//!   otherwise, with the reason. A replica cut off from its quorum turns 503 within about
//!   `election_timeout_max` plus a heartbeat and the elector's spread (0.7 s with the
//!   defaults): a leader once its lease is lost, a follower once it stands for election.
//! * `GET /`: the status page, one self-contained HTML document (no external assets and no
//!   data: it asks for a token when the replica requires one) that
//!   polls `GET /status.json` (this replica's status, the job, and the recent log tail,
//!   payloads only with `?payloads=true`) and
//!   `GET /history.json` (the last ten minutes, sampled each second by
//!   [`history`](crate::server::observe::history), which the page draws as charts).
//!
//! Who may read the job's pages, and from which host names, is
//! [`page_access`](crate::server::ports::page_access)'s; every request's headers must arrive within
//! [`HEADER_READ_TIMEOUT`].

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use std::sync::atomic::AtomicU64;
use std::sync::Arc;

use axum::extract::{FromRef, Query, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{Html, IntoResponse, Response};
use axum::routing::get;
use axum::{Extension, Router};
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use prometheus_client::encoding::text::encode;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::info::Info;
use prometheus_client::registry::Registry;
use serde_json::json;

use crate::jobs::{ContainerStatus, TaskPhase};
use crate::log::{ContainerId, Filter, TaskId};
use crate::raft::storage::fault::FaultKind;
use crate::raft::storage::scrub::StorageFaults;
use crate::server::handle::ReplicaHandle;
use crate::server::observe::history::{Sample, SAMPLE_INTERVAL};
use crate::server::observe::json;
use crate::server::ports::http_admission::{HttpConnection, HttpConnections};
pub use crate::server::ports::http_admission::{
    HTTP_CONNECTIONS_MAX, HTTP_CONNECTIONS_PER_SOURCE_MAX,
};
use crate::server::ports::page_access::PageAccess;
use crate::wire::FetchRequest;

/// Entries the status page shows from the end of the log.
const TAIL_ENTRIES: u32 = 20;

/// Binds the observability port.
pub async fn bind_http(addr: SocketAddr) -> std::io::Result<tokio::net::TcpListener> {
    tokio::net::TcpListener::bind(addr).await
}

/// How long a client may take to send a request's headers, and a connection may wait between
/// requests (a slow-loris defence): a probe or a scrape sends them at once.
pub const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(2);

/// The address a request came from, for the failed-token throttle.
#[derive(Clone, Copy)]
struct Source(std::net::IpAddr);

/// What the handlers share: the replica, and who may read what.
#[derive(Clone)]
struct Port {
    replica: ReplicaHandle,
    access: Arc<PageAccess>,
}

impl FromRef<Port> for ReplicaHandle {
    fn from_ref(port: &Port) -> ReplicaHandle {
        port.replica.clone()
    }
}

/// Serves the observability port until `stop` fires, each connection on a task of its own.
pub async fn serve_http(
    listener: tokio::net::TcpListener,
    replica: ReplicaHandle,
    access: PageAccess,
    mut stop: tokio::sync::watch::Receiver<bool>,
) {
    let port = Port {
        replica: replica.clone(),
        access: Arc::new(access),
    };
    let app = Router::new()
        .route("/", get(status_page))
        .route("/status.json", get(status_json))
        .route("/history.json", get(history_json))
        .route("/metrics", get(metrics))
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .layer(axum::middleware::from_fn_with_state(
            port.clone(),
            check_host,
        ))
        .with_state(port);
    let sampling = tokio::spawn(record_history(replica, stop.clone()));
    let admission = Arc::new(HttpConnections::default());
    let mut connections = tokio::task::JoinSet::new();
    loop {
        let (stream, peer) = tokio::select! {
            _ = stop.changed() => break,
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(error) => {
                    // Out of descriptors, most likely: let some connections end first.
                    if let Some(failed) = admission.refusals.refused("accept failed") {
                        tracing::warn!(%error, failed, "the observability port could not accept (one line a second)");
                    }
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
        };
        while connections.try_join_next().is_some() {}
        let Some(connection) = admission.admit(peer.ip()) else {
            continue;
        };
        let connection = Arc::new(connection);
        let app = app
            .clone()
            .layer(axum::middleware::from_fn(mark_answering))
            .layer(Extension(Source(peer.ip())))
            .layer(Extension(connection.clone()));
        let service = TowerToHyperService::new(app);
        let task = connections.spawn(async move {
            let served = hyper::server::conn::http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(HEADER_READ_TIMEOUT)
                .serve_connection(TokioIo::new(stream), service)
                .await;
            if let Err(error) = served {
                tracing::debug!(%error, "observability connection ended");
            }
        });
        connection.serving(task);
    }
    connections.shutdown().await;
    sampling.abort();
}

/// Marks the connection as answering while its request is served, so that it is not closed
/// to make room ([`http_admission`](crate::server::ports::http_admission)).
async fn mark_answering(
    Extension(connection): Extension<Arc<HttpConnection>>,
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    connection.answering();
    let response = next.run(request).await;
    connection.answered();
    response
}

/// Refuses a request for a host name this port does not answer to (DNS rebinding).
async fn check_host(
    State(port): State<Port>,
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    let host = request
        .headers()
        .get(header::HOST)
        .and_then(|v| v.to_str().ok());
    if !port.access.host_allowed(host) {
        return (
            StatusCode::MISDIRECTED_REQUEST,
            "this port answers to IP addresses, localhost and http_allowed_hosts only\n",
        )
            .into_response();
    }
    next.run(request).await
}

/// Each task's owner, by container name (a task between owners has none).
type Owners = BTreeMap<TaskId, ContainerId>;

/// What the replica shows now; `owners` holds the previous sample's task owners and is
/// brought up to date.
fn sample(replica: &ReplicaHandle, owners: &mut Owners) -> Sample {
    let metrics = replica.metrics();
    let (applied_offset, desired, live, now_owned) = replica.read_state(|job| {
        let owned: Owners = job
            .tasks()
            .iter()
            .filter_map(|(task, t)| Some((task.clone(), t.phase.owner()?.container.clone())))
            .collect();
        (
            job.last_offset(),
            job.desired_containers().map(|d| d.count),
            job.live_sessions().count(),
            owned,
        )
    });
    let moved = now_owned
        .iter()
        .filter(|(task, owner)| owners.get(*task).is_some_and(|before| before != *owner))
        .count();
    // A task between owners keeps its last one, so that a move spanning samples counts once.
    owners.extend(now_owned);
    let lag = replica
        .reported_lag()
        .unwrap_or_default()
        .into_iter()
        .map(|(container, lag)| (container.to_string(), lag))
        .collect();
    Sample {
        at_ms: SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64),
        applied_offset,
        term: metrics.current_term,
        leader: metrics.current_leader,
        desired,
        live,
        moved,
        lag,
    }
}

/// Samples `replica` into its history every [`SAMPLE_INTERVAL`] until `stop` fires.
async fn record_history(replica: ReplicaHandle, mut stop: tokio::sync::watch::Receiver<bool>) {
    let mut ticker = tokio::time::interval(SAMPLE_INTERVAL);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut owners = Owners::new();
    loop {
        tokio::select! {
            _ = stop.changed() => return,
            _ = ticker.tick() => replica.history().push(sample(&replica, &mut owners)),
        }
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct FaultLabel {
    kind: &'static str,
}

/// `storage_faults_total{kind}` (every kind, 0 included, so that an alert on its increase
/// sees the first one), `scrub_passes_total` and `scrubbed_bytes_total`.
fn register_storage_faults(registry: &mut Registry, faults: &StorageFaults) {
    let found = faults.counts();
    let by_kind = Family::<FaultLabel, Counter>::default();
    for kind in FaultKind::ALL {
        let counter = by_kind.get_or_create(&FaultLabel { kind: kind.label() });
        counter.inc_by(found.get(&kind).copied().unwrap_or(0));
    }
    registry.register(
        "storage_faults",
        "Storage faults this process found, at open or by scrubbing, by kind (each is repaired \
         from the peers, or stops the replica so that its restart repairs it)",
        by_kind,
    );
    let counter = |value: u64| {
        let counter: Counter = Counter::default();
        counter.inc_by(value);
        counter
    };
    registry.register(
        "scrub_passes",
        "Scrub passes completed: the WAL's synced records and the stored snapshot read back \
         and verified",
        counter(faults.passes()),
    );
    registry.register(
        "scrubbed_bytes",
        "Bytes the scrubber read back and verified",
        counter(faults.scrubbed_bytes()),
    );
}

fn gauge(registry: &mut Registry, name: &str, help: &str, value: i64) {
    let gauge: Gauge = Gauge::default();
    gauge.set(value);
    registry.register(name, help, gauge);
}

async fn metrics(State(replica): State<ReplicaHandle>) -> Response {
    let mut registry = Registry::with_prefix("ctrlog");
    let raft = replica.metrics();
    let status = replica.status();
    let telemetry = replica.telemetry();
    let leader = replica.is_leader();
    registry.register(
        "build",
        "This replica's build: 1, labelled with its version (a rolling restart's progress)",
        Info::new(vec![("version", env!("CARGO_PKG_VERSION"))]),
    );
    gauge(
        &mut registry,
        "term",
        "Current Raft term",
        raft.current_term as i64,
    );
    gauge(
        &mut registry,
        "is_leader",
        "1 while this replica leads",
        leader as i64,
    );
    gauge(
        &mut registry,
        "leader_id",
        "The leader this replica knows of (0: none)",
        raft.current_leader.unwrap_or(0) as i64,
    );
    gauge(
        &mut registry,
        "last_log_index",
        "Last Raft log index on this replica",
        raft.last_log_index.unwrap_or(0) as i64,
    );
    gauge(
        &mut registry,
        "applied_index",
        "Last Raft log index applied",
        raft.last_applied.map_or(0, |l| l.index) as i64,
    );
    gauge(
        &mut registry,
        "applied_offset",
        "Last command offset applied",
        status.applied_offset as i64,
    );
    gauge(
        &mut registry,
        "first_retained_offset",
        "Lowest command offset still in this replica's log",
        status.first_offset as i64,
    );
    gauge(
        &mut registry,
        "snapshot_offset",
        "Last command offset the current snapshot covers",
        status.snapshot_offset as i64,
    );
    gauge(
        &mut registry,
        "wal_bytes",
        "Bytes of WAL segments on disk",
        replica.wal_bytes() as i64,
    );
    // Damaged entries this replica must get back from the leader before it votes again; an
    // unreadable repair record counts as one, as the replica then votes for no one.
    let damaged = match replica.repairing() {
        Ok(repair) => repair.map_or(0, |r| r.held.index + 1 - r.first_damaged),
        Err(_) => 1,
    };
    gauge(
        &mut registry,
        "damaged_entries",
        "Entries of this replica's log found damaged and not yet repaired from the leader \
         (while above 0 it neither votes nor stands for election)",
        damaged as i64,
    );
    register_storage_faults(&mut registry, replica.storage_faults());
    gauge(
        &mut registry,
        "vocabulary_level",
        "Recorded vocabulary level",
        status.vocabulary_level as i64,
    );

    let job = replica.read_state(|job| {
        let live = job
            .containers()
            .values()
            .filter(|c| c.status == ContainerStatus::Live)
            .count();
        let mut phases = [0i64; 4];
        for task in job.tasks().values() {
            let i = match task.phase {
                TaskPhase::Unassigned => 0,
                TaskPhase::Starting { .. } => 1,
                TaskPhase::Running { .. } => 2,
                TaskPhase::Stopping { .. } => 3,
            };
            phases[i] += 1;
        }
        let desired = job.desired_containers().map(|d| i64::from(d.count));
        (live, phases, job.pending().len(), desired)
    });
    gauge(
        &mut registry,
        "containers_live",
        "Live container sessions",
        job.0 as i64,
    );
    // Absent until the controller first records a count: an autoscaler reading 0 would stop
    // every container of a job that has not decided yet.
    if let Some(desired) = job.3 {
        gauge(
            &mut registry,
            "desired_containers",
            "Containers the job's controller wants, as last committed (what an autoscaler \
             scales the containers' Deployment to when the launcher is external)",
            desired,
        );
    }
    let tasks = Family::<PhaseLabel, Gauge>::default();
    for (phase, count) in ["unassigned", "starting", "running", "stopping"]
        .into_iter()
        .zip(job.1)
    {
        tasks.get_or_create(&PhaseLabel { phase }).set(count);
    }
    registry.register("tasks", "Tasks by phase of their handshake", tasks);
    gauge(
        &mut registry,
        "pending_handshakes",
        "Commands still awaiting acknowledgements (moves, broadcasts)",
        job.2 as i64,
    );
    gauge(
        &mut registry,
        "rejected_commands",
        "Commands the job model refused since the log began (the same on every replica)",
        replica.rejected_total() as i64,
    );
    let snapshots = replica.snapshot_stats();
    gauge(
        &mut registry,
        "snapshots_built",
        "Snapshots built by this replica since it started",
        snapshots.built as i64,
    );
    gauge(
        &mut registry,
        "snapshot_bytes",
        "Size of the last snapshot this replica built",
        snapshots.last_bytes as i64,
    );
    gauge(
        &mut registry,
        "snapshot_build_milliseconds",
        "How long building and storing the last snapshot took",
        snapshots.last_millis as i64,
    );
    let expiry_days = Family::<CertificateLabel, Gauge<f64, AtomicU64>>::default();
    for expiry in replica.certificate_expiries() {
        expiry_days
            .get_or_create(&CertificateLabel {
                certificate: expiry.role,
                file: expiry.file.clone(),
            })
            .set(expiry.days_left());
    }
    registry.register(
        "certificate_expiry_days",
        "Days until each TLS certificate file this replica loaded expires (the earliest in the \
         file); negative once expired",
        expiry_days,
    );
    telemetry.register(&mut registry);
    replica.commit_stages().register(&mut registry);
    let mut text = String::new();
    if let Err(error) = encode(&mut text, &registry) {
        return (StatusCode::INTERNAL_SERVER_ERROR, error.to_string()).into_response();
    }
    (
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        text,
    )
        .into_response()
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct CertificateLabel {
    /// `ca` or `replica`.
    certificate: &'static str,
    file: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PhaseLabel {
    phase: &'static str,
}

async fn healthz(State(replica): State<ReplicaHandle>) -> Response {
    match &replica.metrics().running_state {
        Ok(()) => (StatusCode::OK, "ok\n").into_response(),
        Err(fatal) => (
            StatusCode::SERVICE_UNAVAILABLE,
            format!("raft stopped: {fatal}\n"),
        )
            .into_response(),
    }
}

async fn readyz(State(replica): State<ReplicaHandle>) -> Response {
    match replica.readiness() {
        Ok(()) => (StatusCode::OK, "ready\n").into_response(),
        Err(why) => (StatusCode::SERVICE_UNAVAILABLE, why + "\n").into_response(),
    }
}

/// What a page asks for besides the default.
#[derive(serde::Deserialize)]
struct PageQuery {
    /// Show the recent commands' payloads (an operator's or admin's right with `[auth]`).
    #[serde(default)]
    payloads: bool,
}

async fn status_json(
    State(port): State<Port>,
    Extension(source): Extension<Source>,
    headers: HeaderMap,
    Query(query): Query<PageQuery>,
) -> Response {
    let reader = match port.access.reader(&headers, source.0) {
        Ok(reader) => reader,
        Err(refusal) => return refusal.into_response(),
    };
    if query.payloads && !reader.may_see_payloads() {
        return (
            StatusCode::FORBIDDEN,
            "payloads are shown to an operator or admin only\n",
        )
            .into_response();
    }
    let replica = &port.replica;
    let status = replica.status();
    // Unreadable, the record counts as a repair: the replica then votes for no one.
    let repairing = match replica.repairing() {
        Ok(repair) => repair.map(|r| r.to_string()),
        Err(e) => Some(format!("repairing: the repair record is unreadable: {e}")),
    };
    let job = match replica.state(0, Duration::ZERO).await {
        Ok(at) => json::state_json(&at),
        Err(error) => json!({ "error": error.to_string() }),
    };
    let from = status
        .applied_offset
        .saturating_sub(u64::from(TAIL_ENTRIES) - 1)
        .max(status.first_offset);
    let request = FetchRequest {
        from,
        entries_max: TAIL_ENTRIES,
        bytes_max: 1 << 20,
        max_wait_ms: 0,
        linger_ms: 0,
        filter: Filter::Everything,
    };
    let tail = match replica.fetch(&request, Duration::ZERO).await {
        Ok(answer) => answer
            .entries
            .iter()
            .map(|entry| {
                let mut rendered = json::entry_json(entry);
                rendered["summary"] = entry.summary().into();
                if !query.payloads {
                    if let Some(object) = rendered.as_object_mut() {
                        object.remove("payload");
                        object.remove("payload_b64");
                    }
                }
                rendered
            })
            .collect(),
        Err(_) => Vec::new(),
    };
    // Only the leader hears heartbeats; elsewhere the lag is unknown here.
    let lag: serde_json::Map<String, serde_json::Value> = replica
        .reported_lag()
        .unwrap_or_default()
        .into_iter()
        .map(|(container, lag)| (container.to_string(), lag.into()))
        .collect();
    let mut this_replica = json::status_json(&status, repairing);
    this_replica["build"] = crate::wire::version::BUILD.into();
    this_replica["cluster_id"] = (replica.cluster_id()).map(|id| id.to_string()).into();
    axum::Json(json!({
        "replica": this_replica,
        "lag": lag,
        "healthy": replica.metrics().running_state.is_ok(),
        "job": job,
        "tail": tail,
    }))
    .into_response()
}

async fn history_json(
    State(port): State<Port>,
    Extension(source): Extension<Source>,
    headers: HeaderMap,
) -> Response {
    if let Err(refusal) = port.access.reader(&headers, source.0) {
        return refusal.into_response();
    }
    axum::Json(port.replica.history().samples()).into_response()
}

async fn status_page() -> Html<&'static str> {
    Html(include_str!("status_page.html"))
}
