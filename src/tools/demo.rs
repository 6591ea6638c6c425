//! `ctrlog demo`: the whole SAMZA-237 story on one machine, with no setup.
//!
//! Three replicas run in this process on loopback sockets with real data directories, each with
//! its controller; containers are real `ctrlog container` processes started by the process
//! launcher. The scenario: 4 input partitions on 2 containers; 4 more partitions appear; lag
//! rises and the job scales out to 3 containers, moving tasks by handshake, and the leader is
//! killed in the middle of a move; a schema change is broadcast and acked by every container;
//! lag falls and the job scales back in. The log is printed as a timeline as it commits, then a
//! summary, and the demo fails unless the invariants held.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{ensure, Context};
use futures::StreamExt;

use super::checker::{double_runs, longest_unowned, read_reports};
use super::local_cluster::LocalCluster;
use super::local_job::{ControllerFactory, LocalJob};
use crate::client::{ClientOptions, ControlClient, SubscriptionItem};
use crate::controller::{
    Controller, ControllerConfig, ControllerReport, JobDriver, ProcessLauncher, WatchedFile,
};
use crate::jobs::plan::{settled, GroupByPartition, LagPolicy};
use crate::jobs::{ContainerStatus, JobState, TaskPhase};
use crate::log::{Command, LogEntry, Offset, SchemaChange};
use crate::server::{AuthConfig, TlsFiles};
use crate::NodeId;

/// Each step of the scenario must finish within this.
const STEP: Duration = Duration::from_secs(30);

struct Files {
    inputs: PathBuf,
    lag: PathBuf,
    reports: PathBuf,
    logs: PathBuf,
}

fn write_inputs(path: &Path, partitions: std::ops::Range<u32>) -> anyhow::Result<()> {
    let text: String = partitions.map(|p| format!("kafka/events/{p}\n")).collect();
    std::fs::write(path, text).context("writing the inputs file")
}

/// One committed command as a timeline line.
fn describe(entry: &LogEntry) -> String {
    // Acknowledgements are indented under the commands they answer.
    let summary = entry.summary();
    if summary.starts_with("ack:") {
        format!("   {summary}")
    } else {
        summary
    }
}

/// The demo runs the secure path: a CA and certificates for the replicas and for the demo's
/// own reader (an operator), and a token per container the controllers may launch.
struct Security {
    dir: PathBuf,
    ca: PathBuf,
    auth: AuthConfig,
    /// Container tokens are this secret followed by the container's id.
    secret: String,
}

/// Containers the controllers may launch in the demo (`container-1` ...).
const DEMO_CONTAINERS_MAX: u32 = 32;

impl Security {
    fn create(dir: &Path) -> anyhow::Result<Security> {
        super::certs::generate(dir, &[1, 2, 3], &["127.0.0.1".into()], &["demo".into()], 1)?;
        let secret = format!("{:032x}", rand::random::<u128>());
        let tokens: String = (1..=DEMO_CONTAINERS_MAX)
            .map(|n| format!("{secret}-container-{n} container:container-{n}\n"))
            .collect();
        let tokens_file = dir.join("tokens");
        std::fs::write(&tokens_file, tokens)?;
        Ok(Security {
            dir: dir.to_path_buf(),
            ca: super::certs::ca_file(dir),
            auth: AuthConfig {
                tokens_file: Some(tokens_file),
                certificates: [("client-demo".to_string(), "operator".to_string())].into(),
            },
            secret,
        })
    }

    fn replica_tls(&self, id: NodeId) -> TlsFiles {
        super::certs::replica_files(&self.dir, id)
    }

    /// The token of container `id` (`{id}` is left for the launcher to fill in).
    fn container_token(&self, id: &str) -> String {
        format!("{}-{id}", self.secret)
    }

    /// The demo's own client: an operator by certificate.
    fn operator(&self) -> anyhow::Result<ClientOptions> {
        let (cert, key) = super::certs::client_identity(&self.dir, "demo");
        Ok(ClientOptions {
            tls: Some(crate::client::tls::client_config(
                &self.ca,
                Some((&cert, &key)),
            )?),
            ..ClientOptions::default()
        })
    }
}

fn now_us() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as u64)
}

/// The log as the demo printed it.
struct Timeline {
    seen: Arc<Mutex<Vec<LogEntry>>>,
    /// The last offset printed.
    printed: tokio::sync::watch::Receiver<Offset>,
    task: tokio::task::JoinHandle<()>,
}

/// Prints the log as it commits, and keeps it for the summary.
fn follow_timeline(client: Arc<ControlClient>, started_ms: u64) -> Timeline {
    let seen: Arc<Mutex<Vec<LogEntry>>> = Arc::default();
    let (printed_to, printed) = tokio::sync::watch::channel(0);
    let task = tokio::spawn({
        let seen = seen.clone();
        async move {
            let mut stream = client.subscribe(1, crate::log::Filter::Everything);
            while let Some(item) = stream.next().await {
                if let Ok(SubscriptionItem::Entry(entry)) = item {
                    let at = entry.appended_at_ms.saturating_sub(started_ms) as f64 / 1000.0;
                    println!("  [{at:>6.2}s] #{:<4} {}", entry.offset, describe(&entry));
                    let offset = entry.offset;
                    seen.lock().expect("never poisoned").push(entry);
                    printed_to.send_replace(offset);
                }
            }
        }
    });
    Timeline {
        seen,
        printed,
        task,
    }
}

async fn until(
    job: &LocalJob,
    what: &str,
    condition: impl Fn(&JobState) -> bool,
) -> anyhow::Result<JobState> {
    Ok(job.wait_for_state(what, STEP, condition).await?)
}

fn step(text: &str) {
    println!("\n== {text}");
}

/// Runs the demo. Data goes under `data`, or a fresh temporary directory that is removed after.
pub async fn run(data: Option<PathBuf>) -> anyhow::Result<()> {
    let temporary = data.is_none();
    let dir = data.unwrap_or_else(|| {
        std::env::temp_dir().join(format!("ctrlog-demo-{}", std::process::id()))
    });
    std::fs::create_dir_all(&dir)?;
    let result = scenario(&dir).await;
    if temporary {
        let _ = std::fs::remove_dir_all(&dir);
    }
    result
}

async fn scenario(dir: &Path) -> anyhow::Result<()> {
    let files = Files {
        inputs: dir.join("inputs.txt"),
        lag: dir.join("lag.txt"),
        reports: dir.join("container-reports.jsonl"),
        logs: dir.join("container-logs"),
    };
    std::fs::create_dir_all(&files.logs)?;
    write_inputs(&files.inputs, 0..4)?;
    std::fs::write(&files.lag, "0")?;
    let started = Instant::now();
    let started_ms = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64);

    step(&format!(
        "3 replicas on loopback, data under {}",
        dir.display()
    ));
    let security = Security::create(&dir.join("pki"))?;
    let cluster = LocalCluster::start(&dir.join("replicas"), 3, |c| {
        c.tls = Some(security.replica_tls(c.id));
        c.auth = Some(security.auth.clone());
    })
    .await?;
    let leader = cluster.wait_for_leader(STEP).await?;
    let seeds = cluster.client_addrs();
    println!("   replica {leader} leads; containers run as `ctrlog container` processes");
    println!(
        "   TLS on both ports; the demo reads as an operator (certificate), containers with tokens"
    );

    let launcher = Arc::new(ProcessLauncher::new(
        std::env::current_exe().context("finding this executable")?,
        [
            "container",
            "--cluster",
            &seeds.join(","),
            "--id",
            "{id}",
            "--heartbeat-ms",
            "200",
            "--lease-ms",
            "1500",
            "--stop-delay-ms",
            "300",
            "--lag-file",
            &files.lag.display().to_string(),
            "--report-file",
            &files.reports.display().to_string(),
            "--ca",
            &security.ca.display().to_string(),
            "--token",
            &security.container_token("{id}"),
        ]
        .map(String::from)
        .to_vec(),
        Some(files.logs.clone()),
    ));
    let factory: ControllerFactory = {
        let (inputs, launcher) = (files.inputs.clone(), launcher.clone());
        Arc::new(move |replica| {
            Controller::new(
                replica,
                JobDriver {
                    inputs: Box::new(WatchedFile::new(&inputs)),
                    grouper: Box::new(GroupByPartition),
                    policy: Box::new(LagPolicy::new(2, 3, 1_000, 100, Duration::from_secs(1))),
                    launcher: launcher.clone(),
                },
                ControllerConfig {
                    tick: Duration::from_millis(50),
                    session_timeout: Duration::from_secs(3),
                    ..ControllerConfig::default()
                },
            )
        })
    };
    let mut job = LocalJob::start(cluster, factory);
    let client = Arc::new(ControlClient::connect_with(&seeds, security.operator()?).await?);
    let mut timeline = follow_timeline(client.clone(), started_ms);

    step("start: 4 input partitions, 2 containers");
    until(&job, "4 tasks running on 2 containers", |s| {
        settled(s, 4, 2)
    })
    .await?;

    step("4 new partitions appear in the inputs file");
    write_inputs(&files.inputs, 0..8)?;
    until(&job, "8 tasks running on 2 containers", |s| {
        settled(s, 8, 2)
    })
    .await?;

    step("lag rises: the policy scales out to 3 containers and moves tasks onto the new one");
    std::fs::write(&files.lag, "5000")?;
    let old_leader = job.cluster.wait_for_leader(STEP).await?;
    let mid_move = until(&job, "a task in the middle of a move", |s| {
        crate::jobs::plan::loads(s).len() == 3
            && s.tasks()
                .values()
                .any(|t| matches!(t.phase, TaskPhase::Stopping { .. }))
    })
    .await?;
    let moving: Vec<String> = mid_move
        .tasks()
        .iter()
        .filter(|(_, t)| matches!(t.phase, TaskPhase::Stopping { .. }))
        .map(|(task, _)| task.to_string())
        .collect();
    step(&format!(
        "killing the leader, replica {old_leader}, while {} is being moved",
        moving.join(", ")
    ));
    let killed_at = Instant::now();
    let last_before = job.cluster.replica(old_leader).applied_offset();
    let mut reports = vec![job.kill(old_leader).await.unwrap_or_default()];
    let new_leader = job.cluster.wait_for_leader(STEP).await?;
    until(&job, "a commit under the new leader", |s| {
        s.last_offset() > last_before
    })
    .await?;
    let failover = killed_at.elapsed();
    println!("   replica {new_leader} leads after {failover:.2?}; its controller resumes the move");
    until(&job, "8 tasks running on 3 containers", |s| {
        settled(s, 8, 3)
    })
    .await?;
    let move_done = killed_at.elapsed();
    println!("   the interrupted move completed {move_done:.2?} after the kill");

    step("broadcast a schema change; every live container must ack it");
    let schema = client
        .append(Command::SchemaChange(SchemaChange {
            subject: "events".into(),
            schema: br#"{"type":"record","name":"Event","fields":[{"name":"v","type":"int"}]}"#
                .to_vec(),
        }))
        .await?
        .offset;
    until(&job, "every container acked the schema", |s| {
        !s.pending().contains_key(&schema)
    })
    .await?;

    step("lag falls: the policy scales in, draining one container first");
    std::fs::write(&files.lag, "0")?;
    let end = until(&job, "8 tasks running on 2 containers", |s| {
        settled(s, 8, 2)
            && s.containers()
                .values()
                .any(|r| r.status == ContainerStatus::Deregistered)
    })
    .await?;
    let printed_all = timeline
        .printed
        .wait_for(|printed| *printed >= end.last_offset());
    tokio::time::timeout(STEP, printed_all)
        .await
        .context("the timeline did not reach the end of the log")??;
    reports.extend(job.reports().into_values());
    timeline.task.abort();

    let log = timeline.seen.lock().expect("never poisoned").clone();
    let verdict = check_and_summarise(&end, &log, &reports, &files, failover, move_done, started);
    job.shutdown().await;
    drop(launcher); // kills any container process still running
    verdict
}

fn check_and_summarise(
    end: &JobState,
    log: &[LogEntry],
    reports: &[ControllerReport],
    files: &Files,
    failover: Duration,
    move_done: Duration,
    started: Instant,
) -> anyhow::Result<()> {
    let count = |pred: fn(&Command) -> bool| log.iter().filter(|e| pred(&e.command())).count();
    let acks = count(|c| {
        matches!(
            c,
            Command::TaskStarted(_) | Command::TaskStopped(_) | Command::Ack(_)
        )
    });
    let scale_events = count(|c| {
        matches!(
            c,
            Command::DesiredContainersV1(_) | Command::DesiredContainers(_)
        )
    });
    // A move: a task started on a container other than its previous owner.
    let mut owner: BTreeMap<String, String> = BTreeMap::new();
    let mut moves = 0;
    for entry in log {
        if let Command::TaskStarted(c) = entry.command() {
            if let Some(previous) = owner.insert(c.task.to_string(), c.container.to_string()) {
                moves += usize::from(previous != c.container.to_string());
            }
        }
    }
    let events = read_reports(&files.reports).map_err(anyhow::Error::msg)?;
    let idle = longest_unowned(&events, now_us());

    println!("\n== summary");
    println!("   commands committed       {}", log.len());
    println!("   container acks           {acks}");
    println!("   task moves               {moves}");
    println!("   scale events             {scale_events}");
    println!("   failover (kill → commit) {failover:.2?}");
    println!("   interrupted move done in {move_done:.2?} after the kill");
    println!("   longest a task had no owner  {idle:.2?}");
    println!("   total time               {:.2?}", started.elapsed());

    // Invariants.
    let mut owners: BTreeMap<&crate::log::Input, usize> = BTreeMap::new();
    for task in end.tasks().values() {
        ensure!(
            matches!(task.phase, TaskPhase::Running { .. }),
            "a task is not running at the end"
        );
        for input in &task.inputs {
            *owners.entry(input).or_default() += 1;
        }
    }
    ensure!(
        end.inputs().keys().all(|i| owners.get(i) == Some(&1)),
        "an input is not owned by exactly one running task"
    );
    let doubles = double_runs(&events);
    ensure!(
        doubles.is_empty(),
        "a task ran on two containers: {doubles:?}"
    );
    let by_offset: BTreeMap<Offset, &LogEntry> = log.iter().map(|e| (e.offset, e)).collect();
    let mut acknowledged = BTreeSet::new();
    for report in reports {
        for (offset, command) in &report.appended {
            let entry = by_offset
                .get(offset)
                .with_context(|| format!("acknowledged offset {offset} is missing from the log"))?;
            ensure!(
                entry.frame == command.clone().into_frame(),
                "offset {offset} holds another command than the one acknowledged"
            );
            acknowledged.insert(*offset);
        }
    }
    println!(
        "\n== invariants held: every input in exactly one running task; no task ran on two \
         containers ({} container reports); all {} acknowledged controller commands are in the log",
        events.len(),
        acknowledged.len()
    );
    Ok(())
}
