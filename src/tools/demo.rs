//! `ctrlog demo`: the whole SAMZA-237 story on one machine, with no setup.
//!
//! Three replicas run in this process on loopback sockets with real data directories, each with
//! its controller; containers are real `ctrlog container` processes started by the process
//! launcher. The scenario: 4 input partitions on 2 containers; 4 more partitions appear; lag
//! rises and the job scales out to 3 containers, moving tasks by handshake, and the leader is
//! killed in the middle of a move; a schema change is broadcast and acked by every container;
//! lag falls and the job scales back in. The log is printed as a timeline as it commits, then a
//! summary, and the demo fails unless the invariants held.
//!
//! `--serve` runs the same story on three `ctrlog serve` processes instead, configured only by
//! the `[job]` section of their TOML file (the process launcher): what a deployment runs.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{ensure, Context};
use futures::StreamExt;

use crate::client::{ClientOptions, ControlClient, SubscriptionItem};
use crate::controller::{
    Capacity, Controller, ControllerReport, JobDriver, LaunchSettings, ProcessLauncher, SettingsFn,
    WatchedFile,
};
use crate::jobs::plan::{settled, GroupByPartition};
use crate::jobs::{ContainerStatus, JobState, TaskPhase};
use crate::log::{Command, LogEntry, Offset, SchemaChange};
use crate::server::ports::auth::container_token;
use crate::server::{AuthConfig, JobConfig, LauncherConfig, TlsFiles};
use crate::tools::chaos::checker::{double_runs, longest_unowned};
use crate::tools::chaos::job_files::JobFiles;
use crate::tools::cluster::job::{ControllerFactory, LocalJob};
use crate::tools::cluster::local::LocalCluster;
use crate::tools::cluster::wait::job_state_until;
use crate::tools::cluster::{processes_mentioning, Cluster, ProcessCluster};
use crate::NodeId;

/// Each step of the scenario must finish within this.
const STEP: Duration = Duration::from_secs(30);

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
}

/// Containers the controllers may launch in the demo (`container-1` ...).
const DEMO_CONTAINERS_MAX: u32 = 32;

impl Security {
    fn create(dir: &Path) -> anyhow::Result<Security> {
        crate::tools::certs::generate(
            dir,
            &[1, 2, 3],
            &["127.0.0.1".into()],
            &["demo".into()],
            1,
            false,
        )?;
        // Each container's token is a secret of its own: knowing one tells nothing of another.
        let tokens: String = (1..=DEMO_CONTAINERS_MAX)
            .map(|n| {
                let token = format!("{:032x}", rand::random::<u128>());
                format!("{token} container:container-{n}\n")
            })
            .collect();
        let tokens_file = dir.join("tokens");
        std::fs::write(&tokens_file, tokens)?;
        let private = std::os::unix::fs::PermissionsExt::from_mode(0o600);
        std::fs::set_permissions(&tokens_file, private)?;
        Ok(Security {
            dir: dir.to_path_buf(),
            ca: crate::tools::certs::ca_file(dir),
            auth: AuthConfig {
                tokens_file: Some(tokens_file),
                certificates: [("client-demo".to_string(), "operator".to_string())].into(),
            },
        })
    }

    fn replica_tls(&self, id: NodeId) -> TlsFiles {
        crate::tools::certs::replica_files(&self.dir, id)
    }

    /// What a launched container connects with: its own token, in `CTRLOG_TOKEN` (as
    /// `ctrlog serve`'s process launcher hands it out), never on its command line.
    fn launch_settings(&self) -> SettingsFn {
        let tokens_file = self.auth.tokens_file.clone().expect("the demo's tokens");
        Box::new(move |container| {
            let token = container_token(&tokens_file, container)?
                .ok_or_else(|| format!("the demo has no token for {container}"))?;
            Ok(LaunchSettings {
                placeholders: Vec::new(),
                env: vec![("CTRLOG_TOKEN".into(), token)],
            })
        })
    }

    /// The demo's own client: an operator by certificate.
    fn operator(&self) -> anyhow::Result<ClientOptions> {
        let (cert, key) = crate::tools::certs::client_identity(&self.dir, "demo");
        Ok(ClientOptions {
            tls: Some(crate::wire::tls::client_config(
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

/// What the story needs of the replicas running the job: in this process ([`LocalJob`]) or as
/// `ctrlog serve` processes ([`ServedJob`]).
trait DemoCluster {
    /// Waits until the job state satisfies `condition`.
    async fn until(
        &self,
        what: &str,
        condition: impl Fn(&JobState) -> bool,
    ) -> anyhow::Result<JobState>;
    async fn leader(&self) -> anyhow::Result<NodeId>;
    /// Kills replica `id` as a crash would; returns what its controller reported, when the
    /// controller ran in this process.
    async fn kill(&mut self, id: NodeId) -> Option<ControllerReport>;
    /// What the controllers in this process reported (none when they run in the replicas').
    fn reports(&self) -> Vec<ControllerReport>;
}

impl DemoCluster for LocalJob {
    async fn until(
        &self,
        what: &str,
        condition: impl Fn(&JobState) -> bool,
    ) -> anyhow::Result<JobState> {
        Ok(self.wait_for_state(what, STEP, condition).await?)
    }

    async fn leader(&self) -> anyhow::Result<NodeId> {
        self.cluster.leader(STEP).await
    }

    async fn kill(&mut self, id: NodeId) -> Option<ControllerReport> {
        LocalJob::kill(self, id).await
    }

    fn reports(&self) -> Vec<ControllerReport> {
        LocalJob::reports(self).into_values().collect()
    }
}

/// Three `ctrlog serve` processes whose `[job]` section runs the job.
struct ServedJob {
    cluster: ProcessCluster,
    client: Arc<ControlClient>,
}

impl DemoCluster for ServedJob {
    async fn until(
        &self,
        what: &str,
        condition: impl Fn(&JobState) -> bool,
    ) -> anyhow::Result<JobState> {
        Ok(job_state_until(&self.client, what, STEP, condition).await?)
    }

    async fn leader(&self) -> anyhow::Result<NodeId> {
        self.cluster.leader(STEP).await
    }

    async fn kill(&mut self, id: NodeId) -> Option<ControllerReport> {
        Cluster::stop(&mut self.cluster, id).await;
        None
    }

    fn reports(&self) -> Vec<ControllerReport> {
        Vec::new()
    }
}

fn step(text: &str) {
    println!("\n== {text}");
}

/// Runs the demo, its replicas in this process or, with `serve`, as `ctrlog serve` processes.
/// Data goes under `data`, or a fresh temporary directory that is removed after.
pub async fn run(data: Option<PathBuf>, serve: bool) -> anyhow::Result<()> {
    let temporary = data.is_none();
    let dir = data.unwrap_or_else(|| {
        std::env::temp_dir().join(format!("ctrlog-demo-{}", std::process::id()))
    });
    std::fs::create_dir_all(&dir)?;
    let result = match serve {
        false => in_process(&dir).await,
        true => on_serve_processes(&dir).await,
    };
    // Containers outlive the replicas that launched them (as in a deployment); the demo's
    // end is theirs too.
    for pid in processes_mentioning(&dir) {
        // SAFETY: kill(2) on a container process of this demo; no memory is involved.
        unsafe { libc::kill(pid, libc::SIGKILL) };
    }
    if temporary {
        let _ = std::fs::remove_dir_all(&dir);
    }
    result
}

/// The demo's job: 2 to 3 containers (see [`JobFiles::job`]).
fn demo_job(files: &JobFiles, launcher: LauncherConfig) -> JobConfig {
    files.job(2, 3, launcher)
}

fn started_clock() -> (Instant, u64) {
    let started_ms = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64);
    (Instant::now(), started_ms)
}

async fn in_process(dir: &Path) -> anyhow::Result<()> {
    let files = JobFiles::create(dir, 0..4)?;
    let (started, started_ms) = started_clock();

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

    let launcher = Arc::new(
        ProcessLauncher::new(
            std::env::current_exe().context("finding this executable")?,
            [
                "container",
                "--cluster",
                &seeds.join(","),
                "--id",
                "{id}",
                "--ca",
                &security.ca.display().to_string(),
            ]
            .map(String::from)
            .into_iter()
            .chain(files.container_args())
            .collect(),
            Some(files.logs.clone()),
        )
        .with_settings(security.launch_settings()),
    );
    let factory: ControllerFactory = {
        // The launcher is this process's own, not the configuration's.
        let job = demo_job(&files, LauncherConfig::External {});
        let (inputs, launcher) = (files.inputs.clone(), launcher.clone());
        Arc::new(move |replica| {
            Controller::new(
                replica,
                JobDriver {
                    inputs: Box::new(WatchedFile::new(&inputs)),
                    grouper: Box::new(GroupByPartition),
                    policy: Box::new(job.scaling.policy()),
                    capacity: Capacity::Launched(launcher.clone()),
                },
                job.controller_config(),
            )
        })
    };
    let mut job = LocalJob::start(cluster, factory);
    let client = Arc::new(ControlClient::connect_with(&seeds, security.operator()?).await?);
    let verdict = story(&mut job, client, &files, started, started_ms).await;
    job.shutdown().await;
    drop(launcher); // kills any container process still running
    verdict
}

async fn on_serve_processes(dir: &Path) -> anyhow::Result<()> {
    let files = JobFiles::create(dir, 0..4)?;
    let (started, started_ms) = started_clock();
    let config = dir.join("job.toml");
    JobFiles::write_serve_config(&config, demo_job(&files, files.process_launcher()?))?;
    step(&format!(
        "3 `ctrlog serve` processes, each started with --config {}",
        config.display()
    ));
    let exe = std::env::current_exe().context("finding this executable")?;
    let cluster =
        ProcessCluster::start_with(exe, 3, &["--config".into(), config.display().to_string()])
            .await?;
    let seeds = cluster.client_addrs();
    let client = Arc::new(ControlClient::connect(&seeds).await?);
    let leader = client
        .leader_status()
        .await?
        .leader_id
        .context("no leader")?;
    println!(
        "   replica {leader} leads; the controller in each replica runs the job, the leader's \
         launching `ctrlog container` processes (plain TCP: the in-process demo shows TLS)"
    );
    let mut job = ServedJob { cluster, client };
    let client = job.client.clone();
    story(&mut job, client, &files, started, started_ms).await
}

/// The scenario, on either kind of cluster.
async fn story(
    job: &mut impl DemoCluster,
    client: Arc<ControlClient>,
    files: &JobFiles,
    started: Instant,
    started_ms: u64,
) -> anyhow::Result<()> {
    let mut timeline = follow_timeline(client.clone(), started_ms);

    step("start: 4 input partitions, 2 containers");
    job.until("4 tasks running on 2 containers", |s| settled(s, 4, 2))
        .await?;

    step("4 new partitions appear in the inputs file");
    files.set_inputs(0..8)?;
    job.until("8 tasks running on 2 containers", |s| settled(s, 8, 2))
        .await?;

    step("lag rises: the policy scales out to 3 containers and moves tasks onto the new one");
    files.set_lag(5000)?;
    let old_leader = job.leader().await?;
    let mid_move = job
        .until("a task in the middle of a move", |s| {
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
    let last_before = mid_move.last_offset();
    let mut reports: Vec<ControllerReport> = job.kill(old_leader).await.into_iter().collect();
    let new_leader = job.leader().await?;
    job.until("a commit under the new leader", |s| {
        s.last_offset() > last_before
    })
    .await?;
    let failover = killed_at.elapsed();
    println!("   replica {new_leader} leads after {failover:.2?}; its controller resumes the move");
    job.until("8 tasks running on 3 containers", |s| settled(s, 8, 3))
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
    job.until("every container acked the schema", |s| {
        !s.pending().contains_key(&schema)
    })
    .await?;

    step("lag falls: the policy scales in, draining one container first");
    files.set_lag(0)?;
    let end = job
        .until("8 tasks running on 2 containers", |s| {
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
    reports.extend(job.reports());
    timeline.task.abort();

    let log = timeline.seen.lock().expect("never poisoned").clone();
    check_and_summarise(&end, &log, &reports, files, failover, move_done, started)
}

fn check_and_summarise(
    end: &JobState,
    log: &[LogEntry],
    reports: &[ControllerReport],
    files: &JobFiles,
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
    let events = files.reports()?;
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
    let controllers = match reports.is_empty() {
        // Their acknowledgements are in the replicas' processes, not here.
        true => "the controllers ran in the replicas".to_string(),
        false => format!(
            "all {} acknowledged controller commands are in the log",
            acknowledged.len()
        ),
    };
    println!(
        "\n== invariants held: every input in exactly one running task; no task ran on two \
         containers ({} container reports); {controllers}",
        events.len(),
    );
    Ok(())
}
