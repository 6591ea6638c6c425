//! The controller on a real cluster with simulated containers: inputs from a watched file,
//! scale out and in with task moves, broadcasts, the leader killed mid-move, a silent
//! container expired and its zombie fenced, and a launch that never registers.

mod common;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ctrlog::client::{ApiError, ClientError, ControlClient};
use ctrlog::controller::{
    Capacity, ContainerLauncher, Controller, ControllerConfig, JobDriver, WatchedFile,
};
use ctrlog::jobs::plan::{loads, settled, GroupByPartition, LagPolicy};
use ctrlog::jobs::{ContainerStatus, JobState, TaskPhase};
use ctrlog::log::*;
use ctrlog::tools::chaos::checker::{double_runs, read_reports, TaskEvent};
use ctrlog::tools::chaos::container::{InProcessLauncher, SimOptions};
use ctrlog::tools::cluster::job::{ControllerFactory, LocalJob};
use ctrlog::tools::{poll_until, LocalCluster, POLL_INTERVAL};

const WAIT: Duration = Duration::from_secs(40);

struct Harness {
    job: LocalJob,
    launcher: Arc<InProcessLauncher>,
    inputs: PathBuf,
    lag: PathBuf,
    reports: PathBuf,
    _dir: tempfile::TempDir,
}

fn write_inputs(path: &Path, partitions: std::ops::Range<u32>) {
    let text: String = partitions.map(|p| format!("kafka/events/{p}\n")).collect();
    std::fs::write(path, text).unwrap();
}

/// A secure 3-replica cluster at vocabulary `level` with a controller beside each replica.
async fn harness(
    partitions: u32,
    level: Level,
    launcher_of: impl FnOnce(Vec<String>, SimOptions) -> Arc<dyn ContainerLauncher>,
) -> (LocalJob, PathBuf, PathBuf, PathBuf, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let (inputs, lag, reports) = (
        dir.path().join("inputs"),
        dir.path().join("lag"),
        dir.path().join("reports.jsonl"),
    );
    write_inputs(&inputs, 0..partitions);
    std::fs::write(&lag, "0").unwrap();
    let cluster = LocalCluster::start_secure(&dir.path().join("replicas"), 3, |config| {
        config.initial_vocabulary_level = Some(level)
    })
    .await
    .unwrap();
    cluster.wait_for_leader(WAIT).await.unwrap();
    let options = SimOptions {
        heartbeat_interval: Duration::from_millis(100),
        lease: Duration::from_millis(1000),
        lag_file: Some(lag.clone()),
        report_file: Some(reports.clone()),
        stop_delay: Duration::ZERO,
        // The containers connect as the cluster's admin: this file tests the controller over
        // TLS and authentication; the container role's limits are tests/auth.rs's.
        client: cluster.client_options(),
        claimed_lag: Default::default(),
    };
    let launcher = launcher_of(cluster.client_addrs(), options);
    let inputs_path = inputs.clone();
    let factory: ControllerFactory = Arc::new(move |replica| {
        Controller::new(
            replica,
            JobDriver {
                inputs: Box::new(WatchedFile::new(&inputs_path)),
                grouper: Box::new(GroupByPartition),
                policy: Box::new(LagPolicy::new(2, 3, 1000, 100, Duration::from_millis(300))),
                capacity: Capacity::Launched(launcher.clone()),
            },
            ControllerConfig {
                tick: Duration::from_millis(50),
                session_timeout: Duration::from_secs(2),
                launch_timeout: Duration::from_millis(1500),
                launch_attempts: 2,
                container_prefix: "container".into(),
            },
        )
    });
    (LocalJob::start(cluster, factory), inputs, lag, reports, dir)
}

async fn start(partitions: u32) -> Harness {
    let mut launcher = None;
    let (job, inputs, lag, reports, dir) =
        harness(partitions, vocabulary::LEVEL_MAX, |seeds, options| {
            let l = Arc::new(InProcessLauncher::new(seeds, options));
            launcher = Some(l.clone());
            l
        })
        .await;
    Harness {
        job,
        launcher: launcher.unwrap(),
        inputs,
        lag,
        reports,
        _dir: dir,
    }
}

/// Waits until `condition` holds for the JobState, failing after `WAIT`.
async fn until(job: &LocalJob, what: &str, condition: impl Fn(&JobState) -> bool) -> JobState {
    job.wait_for_state(what, WAIT, condition).await.unwrap()
}

fn live(state: &JobState) -> usize {
    loads(state).len()
}

/// A crashed container cannot report that it stopped: its work ended when it died. Writes
/// that into the report for every task it was running.
fn record_crash(reports: &Path, container: &ContainerId) {
    let events = read_reports(reports).unwrap();
    let now_us = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_micros() as u64;
    let mut running = std::collections::BTreeMap::new();
    for event in events.iter().filter(|e| e.container == container.as_str()) {
        running.insert((event.task.clone(), event.epoch), event.running);
    }
    let mut lines = String::new();
    for ((task, epoch), _) in running.into_iter().filter(|(_, running)| *running) {
        let stop = TaskEvent {
            container: container.to_string(),
            epoch,
            task,
            running: false,
            at_us: now_us,
        };
        lines.push_str(&format!("{}\n", serde_json::to_string(&stop).unwrap()));
    }
    use std::io::Write;
    std::fs::OpenOptions::new()
        .append(true)
        .open(reports)
        .unwrap()
        .write_all(lines.as_bytes())
        .unwrap();
}

fn assert_no_double_runs(reports: &Path) {
    let events = read_reports(reports).unwrap();
    assert!(!events.is_empty(), "the containers reported their work");
    let violations = double_runs(&events);
    assert!(violations.is_empty(), "{violations:#?}");
}

/// Goal: inputs from the watched file are grouped and assigned; the job scales out when lag
/// rises (tasks move onto the new container by handshake), scales in when it falls (a
/// container is drained, deregistered and stopped), broadcasts complete when every container
/// acked, and removed inputs are revoked; no task ever runs on two containers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inputs_scaling_broadcasts_and_revocation() {
    let h = start(4).await;
    until(&h.job, "4 tasks on 2 containers", |s| settled(s, 4, 2)).await;

    write_inputs(&h.inputs, 0..8);
    until(&h.job, "8 tasks on 2 containers", |s| settled(s, 8, 2)).await;

    std::fs::write(&h.lag, "5000").unwrap();
    let state = until(&h.job, "8 tasks on 3 containers", |s| settled(s, 8, 3)).await;
    assert_eq!(state.desired_containers().unwrap().count, 3);

    let client = ControlClient::connect_with(
        &h.job.cluster.client_addrs(),
        h.job.cluster.client_options(),
    )
    .await
    .unwrap();
    let schema = client
        .append(Command::SchemaChange(SchemaChange {
            subject: "events".into(),
            schema: b"v2".to_vec(),
        }))
        .await
        .unwrap()
        .offset;
    until(&h.job, "every container acked the schema", |s| {
        !s.pending().contains_key(&schema)
    })
    .await;

    std::fs::write(&h.lag, "0").unwrap();
    let state = until(&h.job, "8 tasks back on 2 containers", |s| settled(s, 8, 2)).await;
    let gone: Vec<_> = state
        .containers()
        .iter()
        .filter(|(_, r)| r.status == ctrlog::jobs::ContainerStatus::Deregistered)
        .collect();
    assert_eq!(gone.len(), 1, "one container was drained and deregistered");

    write_inputs(&h.inputs, 0..6);
    until(&h.job, "6 tasks after revoking 2 inputs", |s| {
        settled(s, 6, 2) && s.inputs().len() == 6
    })
    .await;
    assert_no_double_runs(&h.reports);
    h.job.shutdown().await;
}

/// Goal: a task move interrupted by the leader's death completes under the new leader, with
/// no task run twice.
/// Steps: 4 tasks on 2 containers; lag rises so a third container is launched and tasks move
/// to it; the moment a task is between `StopTask` and its new `TaskStarted`, the leader and its
/// controller are killed; the new leader's controller finishes the moves.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leader_killed_mid_move_and_the_move_completes() {
    let mut h = start(4).await;
    until(&h.job, "4 tasks on 2 containers", |s| settled(s, 4, 2)).await;
    std::fs::write(&h.lag, "5000").unwrap();
    until(&h.job, "a task in the middle of a move", |s| {
        live(s) == 3
            && s.tasks()
                .values()
                .any(|t| matches!(t.phase, TaskPhase::Stopping { .. } | TaskPhase::Unassigned))
    })
    .await;
    let leader = h.job.cluster.wait_for_leader(WAIT).await.unwrap();
    let killed = Instant::now();
    h.job.kill(leader).await;
    until(
        &h.job,
        "4 tasks on 3 containers under the new leader",
        |s| settled(s, 4, 3),
    )
    .await;
    let new_leader = h.job.cluster.wait_for_leader(WAIT).await.unwrap();
    assert_ne!(new_leader, leader);
    println!(
        "move completed {:?} after the leader was killed",
        killed.elapsed()
    );
    assert_no_double_runs(&h.reports);
    h.job.shutdown().await;
}

/// Goal: a container that stops heartbeating is expired in the log, its tasks are reassigned,
/// a replacement is launched, and the zombie's late answers are fenced.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_container_is_expired_and_its_zombie_fenced() {
    let h = start(4).await;
    let state = until(&h.job, "4 tasks on 2 containers", |s| settled(s, 4, 2)).await;
    let (victim, record) = state
        .containers()
        .iter()
        .find(|(_, r)| r.status == ctrlog::jobs::ContainerStatus::Live)
        .map(|(c, r)| (c.clone(), r.clone()))
        .unwrap();
    let victim_task = state
        .tasks()
        .iter()
        .find(|(_, t)| t.phase.owner().is_some_and(|o| o.container == victim))
        .map(|(task, _)| task.clone())
        .unwrap();
    h.launcher.crash(&victim);
    record_crash(&h.reports, &victim);
    let state = until(&h.job, "the silent container expired and replaced", |s| {
        s.containers()[&victim].status == ctrlog::jobs::ContainerStatus::Expired && settled(s, 4, 2)
    })
    .await;
    assert_ne!(
        state.tasks()[&victim_task].phase.owner().unwrap().container,
        victim
    );

    // The zombie wakes up and answers with its old epoch.
    let zombie = ControlClient::connect_with(
        &h.job.cluster.client_addrs(),
        h.job.cluster.client_options(),
    )
    .await
    .unwrap();
    let late = zombie
        .append(Command::TaskStopped(TaskStopped {
            task: victim_task,
            container: victim.clone(),
            epoch: record.epoch,
            checkpoint: None,
        }))
        .await;
    assert!(
        matches!(late, Err(ClientError::Api(ApiError::Fenced { ref container, .. })) if *container == victim),
        "{late:?}"
    );
    assert!(matches!(
        zombie
            .heartbeat(&victim, record.epoch, &Default::default())
            .await,
        Err(ClientError::Api(ApiError::Fenced { .. }))
    ));
    assert_no_double_runs(&h.reports);
    h.job.shutdown().await;
}

/// A launcher whose containers never come up.
struct Dud;

impl ContainerLauncher for Dud {
    fn launch(&self, _: &ContainerId) -> Result<(), String> {
        Ok(())
    }
    fn stop(&self, _: &ContainerId) {}
}

/// Goal: a launch that never registers is retried within the limit, then reported.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_launch_that_never_registers_is_retried_then_reported() {
    let (job, _inputs, _lag, _reports, _dir) = harness(2, 1, |_, _| Arc::new(Dud)).await;
    poll_until("two launch failures reported", WAIT, POLL_INTERVAL, || {
        let report = job.active_report();
        let reported = report
            .as_ref()
            .is_some_and(|r| r.failed_launches.len() == 2);
        std::future::ready(if reported {
            Ok(())
        } else {
            Err(format!("{report:?}"))
        })
    })
    .await
    .unwrap();
    // Two slots, each tried twice: four launches, the two last attempts reported.
    let report = job.active_report().unwrap();
    assert!(report
        .failed_launches
        .iter()
        .all(|c| c.as_str().starts_with("container-")));
    job.shutdown().await;
}

/// Goal: at vocabulary level 3 on a real cluster, each launch is in the log before it is
/// carried out, and a launch that never registers is cancelled in the log before it is
/// retried; after the attempts, it is reported as before.
/// Steps: level 3; containers that never come up; two failed launches are reported; the
/// log holds, for each of the four launches, its `LaunchContainer` (attempts 1 and 2 per
/// slot) followed by its `CancelLaunch` naming that record's offset, and JobState holds each
/// as given up (expired), none still launching.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn at_level_3_launches_and_their_cancellations_are_recorded_in_the_log() {
    let (job, _inputs, _lag, _reports, _dir) = harness(2, 3, |_, _| Arc::new(Dud)).await;
    poll_until("two launch failures reported", WAIT, POLL_INTERVAL, || {
        let report = job.active_report();
        let reported = report
            .as_ref()
            .is_some_and(|r| r.failed_launches.len() == 2);
        std::future::ready(if reported {
            Ok(())
        } else {
            Err(format!("{report:?}"))
        })
    })
    .await
    .unwrap();
    let failed = job.active_report().unwrap().failed_launches;
    let leader = job.cluster.wait_for_leader(WAIT).await.unwrap();
    let log = common::read_all(&job.cluster.replica(leader).clone_handle()).await;
    let mut launches: Vec<(Offset, LaunchContainer)> = Vec::new();
    let mut cancels: Vec<(Offset, CancelLaunch)> = Vec::new();
    for entry in &log {
        match entry.command() {
            Command::LaunchContainer(launch) => launches.push((entry.offset, launch)),
            Command::CancelLaunch(cancel) => cancels.push((entry.offset, cancel)),
            _ => {}
        }
    }
    let slots: Vec<(Offset, LaunchContainer)> = launches.iter().take(4).cloned().collect();
    assert_eq!(
        slots.iter().map(|(_, l)| l.attempt).collect::<Vec<_>>(),
        vec![1, 1, 2, 2],
        "{launches:?}"
    );
    for (at, launch) in &slots {
        let cancelled = cancels
            .iter()
            .find(|(_, c)| c.container == launch.container)
            .unwrap_or_else(|| panic!("{} was never cancelled: {cancels:?}", launch.container));
        assert_eq!(cancelled.1.launch, *at);
        assert!(cancelled.0 > *at, "cancelled after it was recorded");
    }
    let retried: Vec<&ContainerId> = slots[2..].iter().map(|(_, l)| &l.container).collect();
    assert_eq!(failed.iter().collect::<Vec<_>>(), retried);
    let state = job
        .cluster
        .replica(leader)
        .clone_handle()
        .read_state(JobState::clone);
    for (_, launch) in &slots {
        assert_eq!(
            state.containers()[&launch.container].status,
            ContainerStatus::Expired
        );
    }
    job.shutdown().await;
}
