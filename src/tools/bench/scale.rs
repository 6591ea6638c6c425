//! `ctrlog bench scale`: what a job's size costs. Three `ctrlog serve` replicas run the job's
//! controller over `M` inputs; this process plays `N` containers that register, answer every
//! assignment (`TaskStarted`, `TaskStopped`) and heartbeat once a second each, over a few
//! shared connections, as a node agent hosting many containers would. The inputs appear in
//! the job's watched inputs file once every container registered; `settled_ms` is the time
//! from then until every task runs. Then the bench measures, while the heartbeats go on:
//!
//! * the leader's CPU per heartbeat, and each replica's cores busy;
//! * heartbeat latency (p50, p99) as the containers see it;
//! * the controller's tick time at the leader (`ctrlog_controller_tick_seconds`);
//! * the `state` answer's time and size;
//! * a snapshot's build time (asked of the leader), and a follower's restart: until it
//!   answers and until it has applied everything again;
//! * each replica's resident memory.
//!
//! The inputs are `bench/s{j}/{p}` over [`STREAMS`] streams, so the partition grouper makes
//! `M / STREAMS` tasks, spread over the `N` containers.

use crate::controller::NO_INPUTS;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Context;
use futures::StreamExt;
use serde_json::json;

use crate::client::{ControlClient, SubscriptionItem};
use crate::jobs::{plan, JobState, TaskPhase};
use crate::log::{
    Command, ContainerId, Epoch, Filter, RegisterContainer, TaskId, TaskStarted, TaskStopped,
};
use crate::tools::bench::{
    cpu_time, dir_bytes, fdatasync_floor, histogram, scrape_histograms, time_restart,
    window_quantile, FDATASYNC_PROBE_WRITES, OWN_CLUSTER_REPLICAS,
};
use crate::tools::cluster::ProcessCluster;

/// Streams the inputs are spread over: the partition grouper makes one task per partition
/// number, so `M` inputs make `M / STREAMS` tasks.
pub const STREAMS: usize = 10;

/// Registrations in flight at once while the containers join.
const REGISTRATIONS_IN_FLIGHT: usize = 256;

/// How long the job may take to settle (every task running) before the bench gives up.
const SETTLE_TIMEOUT: Duration = Duration::from_secs(900);

/// One run's shape.
#[derive(Clone, Debug)]
pub struct ScaleRun {
    /// Containers (`N`), each heartbeating once a second.
    pub containers: usize,
    /// Inputs (`M`) of the job.
    pub inputs: usize,
    /// Connections the containers share.
    pub connections: usize,
    /// The measured window, after the job settled.
    pub duration: Duration,
}

/// What the containers played here share: their epochs once registered, the tasks each runs
/// (reported as lag 0 in its heartbeats), and the heartbeat figures.
struct Containers {
    names: Vec<ContainerId>,
    index: HashMap<ContainerId, usize>,
    epochs: Mutex<Vec<Option<Epoch>>>,
    running: Mutex<Vec<BTreeSet<TaskId>>>,
    /// Whether each container's last heartbeat is still unanswered: a container sends its
    /// next only after, as `ContainerSession` does, so a slow leader is not sent a backlog.
    in_flight: Vec<AtomicBool>,
    measuring: AtomicBool,
    latencies: Mutex<hdrhistogram::Histogram<u64>>,
    answered: AtomicU64,
    failed: AtomicU64,
    /// Heartbeats not sent because the container's last was still unanswered.
    skipped: AtomicU64,
}

impl Containers {
    fn new(count: usize) -> Containers {
        let names: Vec<ContainerId> = (0..count)
            .map(|i| ContainerId::new(format!("bench-{i}")).expect("a valid name"))
            .collect();
        Containers {
            index: names
                .iter()
                .cloned()
                .enumerate()
                .map(|(i, c)| (c, i))
                .collect(),
            epochs: Mutex::new(vec![None; count]),
            running: Mutex::new(vec![BTreeSet::new(); count]),
            in_flight: (0..count).map(|_| AtomicBool::new(false)).collect(),
            names,
            measuring: AtomicBool::new(false),
            latencies: Mutex::new(histogram()),
            answered: AtomicU64::new(0),
            failed: AtomicU64::new(0),
            skipped: AtomicU64::new(0),
        }
    }

    /// Container `container`'s index, if it is one of these at `epoch`.
    fn ours(&self, container: &ContainerId, epoch: Epoch) -> Option<usize> {
        let i = *self.index.get(container)?;
        (self.epochs.lock().expect("never poisoned")[i] == Some(epoch)).then_some(i)
    }

    fn set_running(&self, i: usize, task: &TaskId, running: bool) {
        let mut tasks = self.running.lock().expect("never poisoned");
        match running {
            true => tasks[i].insert(task.clone()),
            false => tasks[i].remove(task),
        };
    }
}

/// The inputs file of a job of `inputs` inputs (see the module docs).
fn inputs_file(inputs: usize) -> String {
    if inputs == 0 {
        return format!("{NO_INPUTS}\n");
    }
    let per_stream = inputs.div_ceil(STREAMS);
    (0..inputs)
        .map(|i| format!("bench/s{}/{}\n", i / per_stream, i % per_stream))
        .collect()
}

/// Registers every container, `REGISTRATIONS_IN_FLIGHT` at a time over `clients`.
async fn register(clients: &[Arc<ControlClient>], containers: &Containers) -> anyhow::Result<()> {
    let registrations = containers.names.iter().enumerate().map(|(i, name)| {
        let client = clients[i % clients.len()].clone();
        let command = Command::RegisterContainer(RegisterContainer {
            container: name.clone(),
            location: "ctrlog bench scale".into(),
        });
        async move { (i, client.append(command).await) }
    });
    let mut registered =
        futures::stream::iter(registrations).buffer_unordered(REGISTRATIONS_IN_FLIGHT);
    while let Some((i, ack)) = registered.next().await {
        let ack = ack.with_context(|| format!("registering {}", containers.names[i]))?;
        containers.epochs.lock().expect("never poisoned")[i] = Some(ack.offset);
    }
    Ok(())
}

/// Heartbeats every registered container once a second, spread evenly over the second, until
/// `stop`.
async fn heartbeat(
    clients: Vec<Arc<ControlClient>>,
    containers: Arc<Containers>,
    stop: Arc<AtomicBool>,
) {
    const SLICES: usize = 100;
    let mut ticker = tokio::time::interval(Duration::from_secs(1) / SLICES as u32);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
    let count = containers.names.len();
    let mut slice = 0;
    while !stop.load(Ordering::Relaxed) {
        ticker.tick().await;
        for i in (slice * count / SLICES)..((slice + 1) * count / SLICES) {
            let Some(epoch) = containers.epochs.lock().expect("never poisoned")[i] else {
                continue;
            };
            if containers.in_flight[i].swap(true, Ordering::AcqRel) {
                containers.skipped.fetch_add(1, Ordering::Relaxed);
                continue;
            }
            let lag: BTreeMap<TaskId, u64> = containers.running.lock().expect("never poisoned")[i]
                .iter()
                .map(|task| (task.clone(), 0))
                .collect();
            let (client, containers) = (clients[i % clients.len()].clone(), containers.clone());
            tokio::spawn(async move {
                let sent = Instant::now();
                let answer = client.heartbeat(&containers.names[i], epoch, &lag).await;
                let took = sent.elapsed();
                containers.in_flight[i].store(false, Ordering::Release);
                match answer {
                    Ok(_) if containers.measuring.load(Ordering::Relaxed) => {
                        containers.answered.fetch_add(1, Ordering::Relaxed);
                        let _ = containers
                            .latencies
                            .lock()
                            .expect("never poisoned")
                            .record(took.as_micros() as u64);
                    }
                    Ok(_) => {}
                    Err(_) => {
                        containers.failed.fetch_add(1, Ordering::Relaxed);
                    }
                }
            });
        }
        slice = (slice + 1) % SLICES;
    }
}

/// Answers each assignment to one of `containers` as a container would: `TaskStarted` for an
/// `AssignTask`, `TaskStopped` for a `StopTask`. Reads the log from its start until aborted.
async fn answer_assignments(client: Arc<ControlClient>, containers: Arc<Containers>) {
    let mut log = client.subscribe(1, Filter::Everything);
    while let Some(item) = log.next().await {
        let answers: Vec<(usize, Command)> = match item {
            Ok(SubscriptionItem::Entry(entry)) => {
                let owed = match entry.command() {
                    Command::AssignTask(c) => Some((c.task, c.container, c.epoch, true)),
                    Command::StopTask(c) => Some((c.task, c.container, c.epoch, false)),
                    _ => None,
                };
                owed.and_then(|(task, container, epoch, assigned)| {
                    let i = containers.ours(&container, epoch)?;
                    Some((i, answer_to(task, container, epoch, assigned)))
                })
                .into_iter()
                .collect()
            }
            // Fallen behind compaction: answer what the state says is owed.
            Ok(SubscriptionItem::Reset { state, .. }) => owed_answers(&state, &containers),
            Err(error) => {
                tracing::warn!(%error, "the bench's subscription failed; retrying");
                continue;
            }
        };
        for (i, answer) in answers {
            match &answer {
                Command::TaskStarted(c) => containers.set_running(i, &c.task, true),
                Command::TaskStopped(c) => containers.set_running(i, &c.task, false),
                _ => {}
            }
            let client = client.clone();
            tokio::spawn(async move {
                if let Err(error) = client.append(answer).await {
                    tracing::warn!(%error, "the bench's answer to an assignment failed");
                }
            });
        }
    }
}

/// What a container answers about `task`: `TaskStarted` once `assigned` it, else (told to
/// stop it) `TaskStopped`.
fn answer_to(task: TaskId, container: ContainerId, epoch: Epoch, assigned: bool) -> Command {
    match assigned {
        true => Command::TaskStarted(TaskStarted {
            task,
            container,
            epoch,
        }),
        false => Command::TaskStopped(TaskStopped {
            task,
            container,
            epoch,
            checkpoint: None,
        }),
    }
}

/// The answers `state` says the containers owe: each handshake open on one of theirs.
fn owed_answers(state: &JobState, containers: &Containers) -> Vec<(usize, Command)> {
    let mut owed = Vec::new();
    for (task, record) in state.tasks() {
        let Some(owner) = record.phase.owner() else {
            continue;
        };
        let Some(i) = containers.ours(&owner.container, owner.epoch) else {
            continue;
        };
        let assigned = match record.phase {
            TaskPhase::Starting { .. } => true,
            TaskPhase::Stopping { .. } => false,
            _ => continue,
        };
        let (task, container) = (task.clone(), owner.container.clone());
        owed.push((i, answer_to(task, container, owner.epoch, assigned)));
    }
    owed
}

/// Milliseconds with a tenth, for the report.
fn ms(took: Duration) -> f64 {
    (took.as_secs_f64() * 10_000.0).round() / 10.0
}

/// `ctrlog bench scale`: one run of `run.containers` containers on a job of `run.inputs`
/// inputs, on a cluster of its own (see the module docs); returns the result as JSON.
pub async fn scale(run: &ScaleRun) -> anyhow::Result<serde_json::Value> {
    let scratch = tempfile::Builder::new().prefix("ctrlog-scale-").tempdir()?;
    let inputs_path = scratch.path().join("inputs.txt");
    // The inputs appear once every container has registered (the file is watched), so that
    // the first plan spreads the tasks over all of them: tasks given to the first few would
    // then be moved one at a time, a task's move being four commits and a tick.
    std::fs::write(&inputs_path, format!("{NO_INPUTS}\n"))?;
    let tasks = run.inputs.div_ceil(STREAMS);
    let count = run.containers.to_string();
    let extra: Vec<String> = [
        "--job-inputs-file",
        &inputs_path.display().to_string(),
        "--job-external-launcher",
        "--job-min-containers",
        &count,
        "--job-max-containers",
        &count,
    ]
    .map(String::from)
    .to_vec();
    let exe = std::env::current_exe().context("finding this executable")?;
    let mut cluster = ProcessCluster::start_with_http(exe, OWN_CLUSTER_REPLICAS, &extra).await?;
    // The disk's floor where the replicas write, beside the latencies that touch the disk
    // (settling, the snapshot, the restart).
    let (fdatasync_p50_us, _) = fdatasync_floor(cluster.data_dir(), FDATASYNC_PROBE_WRITES)?;
    let seeds = cluster.client_addrs();
    let mut clients = Vec::new();
    for _ in 0..run.connections.max(1) {
        clients.push(Arc::new(ControlClient::connect(&seeds).await?));
    }
    let containers = Arc::new(Containers::new(run.containers));
    let stop = Arc::new(AtomicBool::new(false));
    let started = Instant::now();
    // Heartbeats start with the first registration: a container silent for the session
    // timeout is expired, and registering ten thousand takes seconds.
    let heartbeats = tokio::spawn(heartbeat(clients.clone(), containers.clone(), stop.clone()));
    register(&clients, &containers).await?;
    let registered = started.elapsed();
    let written = scratch.path().join("inputs.new");
    std::fs::write(&written, inputs_file(run.inputs))?;
    std::fs::rename(&written, &inputs_path)?;
    let inputs_appeared = Instant::now();
    let answers = tokio::spawn(answer_assignments(clients[0].clone(), containers.clone()));

    let probe = &clients[0];
    loop {
        let at = probe.state(0).await?;
        if plan::settled(&at.state, tasks, run.containers) {
            break;
        }
        let live = at.state.live_epochs().count();
        anyhow::ensure!(
            live == run.containers,
            "{} of {} containers were expired while the job settled: the leader fell behind \
             their heartbeats",
            run.containers - live,
            run.containers,
        );
        let running = at.state.tasks().values();
        let running = running.filter(|t| matches!(t.phase, TaskPhase::Running { .. }));
        anyhow::ensure!(
            inputs_appeared.elapsed() < SETTLE_TIMEOUT,
            "the job did not settle within {SETTLE_TIMEOUT:?}: {} of {tasks} tasks running at \
             offset {}",
            running.count(),
            at.offset
        );
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    let settled = inputs_appeared.elapsed();

    // The measured window: heartbeats and ticks only.
    let leader = probe.leader_status().await?.id as usize - 1;
    let http = cluster
        .http_addr(leader)
        .context("the bench's replicas serve their metrics")?;
    let pids: Vec<Option<u32>> = (0..OWN_CLUSTER_REPLICAS as usize)
        .map(|i| cluster.pid(i))
        .collect();
    let cpu_now = || {
        pids.iter()
            .map(|pid| pid.and_then(cpu_time))
            .collect::<Vec<_>>()
    };
    let ticks_before = scrape_histograms(http, "ctrlog_controller_tick_seconds", None).await?;
    let cpu_before = cpu_now();
    let window = Instant::now();
    containers.measuring.store(true, Ordering::Relaxed);
    tokio::time::sleep(run.duration).await;
    containers.measuring.store(false, Ordering::Relaxed);
    let elapsed = window.elapsed();
    let cpu_after = cpu_now();
    let ticks_after = scrape_histograms(http, "ctrlog_controller_tick_seconds", None).await?;
    let beats = containers.answered.load(Ordering::Relaxed);
    let busy: Vec<Option<Duration>> = cpu_before
        .iter()
        .zip(&cpu_after)
        .map(|(before, after)| after.zip(*before).map(|(a, b)| a.saturating_sub(b)))
        .collect();
    let cores: Vec<Option<f64>> = busy
        .iter()
        .map(|busy| {
            busy.map(|busy| (busy.as_secs_f64() / elapsed.as_secs_f64() * 1000.0).round() / 1000.0)
        })
        .collect();
    let leader_cpu = busy[leader];
    let (before, after) = (
        ticks_before.get("").cloned().unwrap_or_default(),
        ticks_after.get("").cloned().unwrap_or_default(),
    );
    let tick_us = |q| window_quantile(&before, &after, q).map(|us| us.round() as u64);

    // The state, as a late reader or a dashboard reads it.
    let mut state_ms = Vec::new();
    let mut last_state = None;
    for _ in 0..3 {
        let asked = Instant::now();
        last_state = Some(probe.state(0).await?);
        state_ms.push(ms(asked.elapsed()));
    }
    let state_bytes = last_state.map_or(0, |at| crate::log::encode(&at).len());
    state_ms.sort_by(f64::total_cmp);

    let rss: Vec<Option<u64>> = (0..OWN_CLUSTER_REPLICAS as usize)
        .map(|i| cluster.rss_bytes(i))
        .collect();
    let asked = Instant::now();
    let snapshot_offset = probe.snapshot().await?;
    let snapshot_build = asked.elapsed();
    let follower = (0..OWN_CLUSTER_REPLICAS as usize)
        .find(|i| *i != leader)
        .expect("three replicas");
    let applied = probe.leader_status().await?.applied_offset;
    let (answering, caught_up) = time_restart(&mut cluster, follower, applied).await?;
    let follower_disk = dir_bytes(&cluster.replica_dir(follower));

    stop.store(true, Ordering::Relaxed);
    heartbeats.await?;
    answers.abort();
    let latencies = containers.latencies.lock().expect("never poisoned").clone();
    Ok(json!({
        "workload": "scale",
        "containers": run.containers,
        "inputs": run.inputs,
        "tasks": tasks,
        "connections": run.connections,
        "fdatasync_p50_us": fdatasync_p50_us,
        "registered_ms": registered.as_millis() as u64,
        "settled_ms": settled.as_millis() as u64,
        "heartbeats_per_s": (beats as f64 / elapsed.as_secs_f64()).round(),
        "heartbeat_p50_us": latencies.value_at_quantile(0.5),
        "heartbeat_p99_us": latencies.value_at_quantile(0.99),
        "heartbeat_errors": containers.failed.load(Ordering::Relaxed),
        "heartbeats_skipped": containers.skipped.load(Ordering::Relaxed),
        "leader": format!("replica-{}", leader + 1),
        "leader_cpu_per_heartbeat_us": leader_cpu.map(|cpu| (cpu.as_secs_f64() * 1e7 / beats.max(1) as f64).round() / 10.0),
        "cores": cores,
        "controller_tick_p50_us": tick_us(0.5),
        "controller_tick_p99_us": tick_us(0.99),
        "state_ms_median": state_ms[1],
        "state_bytes": state_bytes,
        "snapshot_offset": snapshot_offset,
        "snapshot_build_ms": ms(snapshot_build),
        "restart_answering_ms": ms(answering),
        "restart_caught_up_ms": ms(caught_up),
        "follower_disk_bytes": follower_disk,
        "rss_bytes": rss,
    }))
}

/// Draws `ctrlog bench scale` results into an SVG at `path`: one panel per cost, each against
/// the container count N (log scale), one line per input count M.
pub fn plot(results: &[serde_json::Value], path: &std::path::Path) -> anyhow::Result<()> {
    use plotters::prelude::*;

    anyhow::ensure!(!results.is_empty(), "nothing to plot");
    let number = |r: &serde_json::Value, key: &str| r[key].as_f64().unwrap_or(0.0);
    // The leader's share of the per-replica figures.
    let leaders = |r: &serde_json::Value, key: &str| {
        let leader = r["leader"]
            .as_str()
            .and_then(|name| name.strip_prefix("replica-"))
            .and_then(|n| n.parse::<usize>().ok())
            .unwrap_or(1);
        r[key][leader - 1].as_f64().unwrap_or(0.0)
    };
    type Pick = Box<dyn Fn(&serde_json::Value) -> f64>;
    let panels: [(&str, Pick); 9] = [
        (
            "leader CPU per heartbeat (µs)",
            Box::new(move |r| number(r, "leader_cpu_per_heartbeat_us")),
        ),
        ("leader cores busy", Box::new(move |r| leaders(r, "cores"))),
        (
            "heartbeat p99 (ms)",
            Box::new(move |r| number(r, "heartbeat_p99_us") / 1000.0),
        ),
        (
            "controller tick p99 (ms)",
            Box::new(move |r| number(r, "controller_tick_p99_us") / 1000.0),
        ),
        (
            "state answer (ms)",
            Box::new(move |r| number(r, "state_ms_median")),
        ),
        (
            "state answer (MB)",
            Box::new(move |r| number(r, "state_bytes") / 1e6),
        ),
        (
            "snapshot build (ms)",
            Box::new(move |r| number(r, "snapshot_build_ms")),
        ),
        (
            "restarted follower answering (ms)",
            Box::new(move |r| number(r, "restart_answering_ms")),
        ),
        (
            "leader RSS (MiB)",
            Box::new(move |r| leaders(r, "rss_bytes") / f64::from(1 << 20)),
        ),
    ];
    let mut input_counts: Vec<u64> = results
        .iter()
        .filter_map(|r| r["inputs"].as_u64())
        .collect();
    input_counts.sort_unstable();
    input_counts.dedup();
    const COLORS: [RGBColor; 4] = [BLUE, RED, GREEN, MAGENTA];
    let root = SVGBackend::new(path, (1200, 960)).into_drawing_area();
    root.fill(&WHITE)?;
    for (area, (label, pick)) in root.split_evenly((3, 3)).iter().zip(&panels) {
        let series: Vec<crate::tools::bench::PlotSeries> = input_counts
            .iter()
            .zip(COLORS.iter().cycle())
            .map(|(&inputs, &color)| crate::tools::bench::PlotSeries {
                name: Some(format!("M = {} inputs", thousands(inputs))),
                points: results
                    .iter()
                    .filter(|r| r["inputs"].as_u64() == Some(inputs))
                    .map(|r| (number(r, "containers"), pick(r)))
                    .collect(),
                color,
            })
            .collect();
        crate::tools::bench::plot_panel(area, label, "N containers", &series)?;
    }
    root.present()?;
    Ok(())
}

/// `n` with its thousands grouped by commas, as the tables in BENCHMARKS.md write them.
fn thousands(n: u64) -> String {
    let digits = n.to_string();
    let mut grouped = String::new();
    for (i, digit) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            grouped.push(',');
        }
        grouped.push(digit);
    }
    grouped
}

#[cfg(test)]
mod tests {
    #[test]
    fn thousands_are_grouped() {
        for (n, written) in [
            (0, "0"),
            (999, "999"),
            (1000, "1,000"),
            (100_000, "100,000"),
        ] {
            assert_eq!(super::thousands(n), written);
        }
    }
}
