//! `ctrlog serve` runs the job: three replica processes, started from one `deploy/`-style file
//! with a `[job]` section and no other code, coordinate real `ctrlog container` processes.
//! Inputs added to the watched file are assigned, the lag the containers report scales the
//! job out and in, a leader killed in the middle of a task move hands the move to the next
//! leader, and the containers' own reports show no task run on two containers at once. Both
//! launchers: `process` (the leader runs the containers) and `external` (an orchestrator
//! played by this file reads `ctrlog_desired_containers` and starts and stops them).

mod common;

use std::path::PathBuf;
use std::process::{Child, Command as Process, Stdio};
use std::time::Duration;

use common::{http_get, metric_sample};
use ctrlog::client::ControlClient;
use ctrlog::jobs::plan::settled;
use ctrlog::jobs::{ContainerStatus, JobState, TaskPhase};
use ctrlog::tools::admin::state_text;
use ctrlog::tools::chaos::checker::{double_runs, read_reports};
use ctrlog::tools::cluster::wait::job_state_until;
use ctrlog::tools::cluster::{processes_mentioning, ProcessCluster};
use ctrlog::tools::{poll_until, POLL_INTERVAL};

/// Each step's deadline: a debug build of four processes on a shared 2-core machine.
const STEP: Duration = Duration::from_secs(60);

const EXE: &str = env!("CARGO_BIN_EXE_ctrlog");

/// The files of one job, in a folder of its own that names every process it started.
struct JobFiles {
    dir: tempfile::TempDir,
}

impl JobFiles {
    fn new() -> JobFiles {
        let dir = tempfile::Builder::new()
            .prefix("ctrlog-job-")
            .tempdir()
            .unwrap();
        std::fs::create_dir(dir.path().join("containers")).unwrap();
        let files = JobFiles { dir };
        files.set_partitions(0..2);
        files.set_lag(0);
        files
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// Rewrites the inputs file as an operator would, atomically.
    fn set_partitions(&self, partitions: std::ops::Range<u32>) {
        let text: String = partitions.map(|p| format!("kafka/events/{p}\n")).collect();
        let next = self.path("inputs.next");
        std::fs::write(&next, text).unwrap();
        std::fs::rename(next, self.path("inputs")).unwrap();
    }

    /// The lag every running task reports.
    fn set_lag(&self, lag: u64) {
        std::fs::write(self.path("lag"), lag.to_string()).unwrap();
    }

    /// The arguments every container runs with, after its name and the cluster.
    fn container_args(&self) -> Vec<String> {
        [
            "--heartbeat-ms",
            "100",
            "--lease-ms",
            "1500",
            // A stop takes a second, so that a move is in flight long enough to kill the
            // leader in the middle of it.
            "--stop-delay-ms",
            "1000",
            "--lag-file",
            &self.path("lag").display().to_string(),
            "--report-file",
            &self.path("reports.jsonl").display().to_string(),
        ]
        .map(String::from)
        .to_vec()
    }

    /// The replicas' shared configuration file: only the job; identity and addresses come
    /// from the flags, as they would from each host's own file.
    fn write_config(&self, launcher: &str) -> PathBuf {
        let path = self.path("job.toml");
        std::fs::write(&path, self.job_config(launcher, 1)).unwrap();
        path
    }

    /// The `[job]` section: this job's inputs, its launcher, and 1,000 offsets of lag per
    /// container to scale out, from `min` containers up to 3.
    fn job_config(&self, launcher: &str, min: u32) -> String {
        format!(
            r#"# What every replica of this job is started with (see deploy/replica-1.toml).
[job]
inputs_file = "{inputs}"
session_timeout_ms = 3000

[job.scaling]
min = {min}
max = 3
scale_out_lag = 1000
scale_in_lag = 100
cooldown_ms = 1000

[job.launcher]
{launcher}
"#,
            inputs = self.path("inputs").display(),
        )
    }

    fn reports_hold_no_double_run(&self) {
        let events = read_reports(&self.path("reports.jsonl")).unwrap();
        assert!(!events.is_empty(), "the containers reported nothing");
        let violations = double_runs(&events);
        assert!(violations.is_empty(), "{violations:#?}");
    }

    /// The container processes of this job, by a replica or by the orchestrator here (the
    /// replicas name the folder too, in `--config`).
    fn container_pids(&self) -> Vec<i32> {
        processes_mentioning(self.dir.path())
            .into_iter()
            .filter(|pid| {
                let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
                cmdline.split(|b| *b == 0).nth(1) == Some(b"container".as_slice())
            })
            .collect()
    }
}

/// Containers outlive the replicas that launched them (`ProcessLauncher::
/// keep_running_on_drop`); the test's own end must not leave them behind.
impl Drop for JobFiles {
    fn drop(&mut self) {
        for pid in self.container_pids() {
            // SAFETY: kill(2) on a process this test's job started; no memory involved.
            unsafe { libc::kill(pid, libc::SIGKILL) };
        }
    }
}

/// Waits until the job state satisfies `condition`; on failure shows the state and each
/// replica's last words.
async fn wait_for_state(
    client: &ControlClient,
    cluster: &ProcessCluster,
    what: &str,
    condition: impl Fn(&JobState) -> bool,
) -> JobState {
    let found = job_state_until(client, what, STEP, condition).await;
    found.unwrap_or_else(|error| {
        let logs: String = (0..3)
            .map(|i| format!("--- replica {}:\n{}\n", i + 1, cluster.log_tail(i, 40)))
            .collect();
        panic!("{error}\n{logs}")
    })
}

/// Three `ctrlog serve` processes, each started with `--config` naming the job's file (and
/// its observability port on), and a client of theirs.
async fn start_replicas(files: &JobFiles, launcher: &str) -> (ProcessCluster, ControlClient) {
    let config = files.write_config(launcher);
    let config_flag = ["--config".to_string(), config.display().to_string()];
    let cluster = ProcessCluster::start_with_http(EXE.into(), 3, &config_flag)
        .await
        .unwrap();
    let client = ControlClient::connect(&cluster.client_addrs())
        .await
        .unwrap();
    (cluster, client)
}

fn desired(state: &JobState) -> Option<u32> {
    state.desired_containers().map(|d| d.count)
}

fn leader_index(status: &ctrlog::client::Status) -> usize {
    status.leader_id.expect("a leader") as usize - 1
}

/// Goal: with `kind = "process"`, the leader's host runs the containers: it launches the
/// minimum, scales out on lag and in without it, assigns inputs added to the file, and a
/// leader killed while a task is moving leaves the move to the next leader; the containers
/// the dead leader launched keep working and leave when the new leader drains them.
/// Steps: 2 inputs, then 4; lag up (scale out to 3, killing the leader once a move is in
/// flight); the killed replica restarted; lag down (scale in to 1). Then the containers'
/// reports show no double run and one container process is left.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_process_launcher_runs_the_job_through_a_leader_kill() {
    let files = JobFiles::new();
    let mut command = vec![
        EXE.to_string(),
        "container".into(),
        "--id".into(),
        "{id}".into(),
        "--cluster".into(),
        "{cluster}".into(),
    ];
    command.extend(files.container_args());
    let launcher = format!(
        "kind = \"process\"\ncommand = {}\nlog_dir = \"{}\"",
        toml::Value::from(command),
        files.path("containers").display()
    );
    let (mut cluster, client) = start_replicas(&files, &launcher).await;

    wait_for_state(&client, &cluster, "2 tasks on the minimum of 1", |s| {
        settled(s, 2, 1)
    })
    .await;
    files.set_partitions(0..4);
    wait_for_state(&client, &cluster, "the 2 new inputs assigned", |s| {
        settled(s, 4, 1)
    })
    .await;

    files.set_lag(1000);
    let mid_move = wait_for_state(&client, &cluster, "a task moving to a new container", |s| {
        s.tasks()
            .values()
            .any(|t| matches!(t.phase, TaskPhase::Stopping { .. }))
    })
    .await;
    let killed = leader_index(&client.leader_status().await.unwrap());
    cluster.kill(killed);
    let scaled_out = wait_for_state(&client, &cluster, "4 tasks on 3 containers", |s| {
        desired(s) == Some(3) && settled(s, 4, 3)
    })
    .await;
    // The containers the killed leader launched kept working through its death: the same
    // sessions are live, none was expired and replaced.
    for session in mid_move.live_sessions() {
        assert_eq!(
            scaled_out.live_session(&session.container),
            Some(session.clone()),
            "{} outlived the replica that launched it",
            session.container
        );
    }
    let new_leader = leader_index(&client.leader_status().await.unwrap());
    assert_ne!(new_leader, killed);
    cluster.restart(killed).unwrap();

    files.set_lag(0);
    let scaled_in = wait_for_state(&client, &cluster, "4 tasks back on 1 container", |s| {
        desired(s) == Some(1) && settled(s, 4, 1)
    })
    .await;
    let drained: Vec<_> = scaled_out
        .live_sessions()
        .filter(|s| scaled_in.live_session(&s.container).is_none())
        .map(|s| s.container)
        .collect();
    assert_eq!(drained.len(), 2, "{}", scaled_in.containers().len());
    for container in &drained {
        assert_eq!(
            scaled_in.containers()[container].status,
            ContainerStatus::Deregistered,
            "{container} was drained, not expired"
        );
    }
    poll_until(
        "the drained containers' processes to end",
        STEP,
        Duration::from_millis(50),
        || {
            let pids = files.container_pids();
            std::future::ready(if pids.len() == 1 {
                Ok(())
            } else {
                Err(format!("{pids:?}"))
            })
        },
    )
    .await
    .unwrap();
    files.reports_hold_no_double_run();
}

/// The orchestrator's side of the `external` launcher, as a Kubernetes Deployment under an
/// autoscaler would be: it reads the desired count from a replica's `/metrics`, starts
/// `ctrlog container` processes under names of its own, and stops the newest with SIGTERM.
struct Orchestrator {
    running: Vec<(String, Child)>,
    started: u32,
}

impl Orchestrator {
    /// One reconcile: returns the count it scaled to, if the metric was readable.
    async fn reconcile(&mut self, cluster: &ProcessCluster, files: &JobFiles) -> Option<usize> {
        let mut desired = None;
        for i in 0..3 {
            let Some(addr) = cluster.http_addr(i) else {
                continue;
            };
            // A killed replica's port refuses; `http_get` would panic on it.
            if tokio::net::TcpStream::connect(addr).await.is_err() {
                continue;
            }
            let (200, text) = http_get(addr, "/metrics").await else {
                continue;
            };
            desired = metric_sample(&text, "ctrlog_desired_containers");
            if desired.is_some() {
                break;
            }
        }
        let desired = desired? as usize;
        self.running
            .retain_mut(|(_, child)| child.try_wait().ok().flatten().is_none());
        while self.running.len() < desired {
            self.started += 1;
            let name = format!("worker-{}", self.started);
            let child = Process::new(EXE)
                .args(["container", "--id", &name, "--cluster"])
                .arg(cluster.client_addrs().join(","))
                .args(files.container_args())
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .unwrap();
            self.running.push((name, child));
        }
        while self.running.len() > desired {
            let (_, child) = self.running.pop().expect("more than desired");
            // SAFETY: kill(2) on a child this orchestrator started; no memory involved.
            unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
        }
        Some(desired)
    }
}

/// Goal: with `kind = "external"`, the controller launches nothing: it publishes the desired
/// count as `ctrlog_desired_containers`, an orchestrator scales containers to it, and the
/// job follows whatever containers register, out and back in; a container the orchestrator
/// stops leaves the job cleanly (deregistered, not expired). Steps: 4 inputs; lag up to
/// scale out to 3; lag down to scale in to 1; the reports show no double run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_orchestrator_scales_an_external_job_on_the_published_count() {
    let files = JobFiles::new();
    files.set_partitions(0..4);
    let (cluster, client) = start_replicas(&files, "kind = \"external\"").await;
    let mut orchestrator = Orchestrator {
        running: Vec::new(),
        started: 0,
    };
    type Condition = fn(&JobState) -> bool;
    let steps: [(&str, Condition); 3] = [
        ("4 tasks on the minimum of 1", |s| settled(s, 4, 1)),
        ("scaled out to 3", |s| {
            desired(s) == Some(3) && settled(s, 4, 3)
        }),
        ("scaled back in to 1", |s| {
            desired(s) == Some(1) && settled(s, 4, 1)
        }),
    ];
    let mut last = JobState::default();
    for (n, (what, condition)) in steps.into_iter().enumerate() {
        match n {
            1 => files.set_lag(1000),
            2 => files.set_lag(0),
            _ => {}
        }
        // The orchestrator reconciles between the checks, as a scaler polls on its period.
        let deadline = tokio::time::Instant::now() + STEP;
        loop {
            orchestrator.reconcile(&cluster, &files).await;
            let at = client.state(0).await.unwrap();
            if condition(&at.state) {
                last = std::sync::Arc::unwrap_or_clone(at.state);
                break;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "the job did not reach \"{what}\":\n{}",
                state_text(&at)
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
    let left: Vec<_> = last
        .containers()
        .iter()
        .filter(|(_, r)| r.status != ContainerStatus::Live)
        .map(|(c, r)| (c.to_string(), r.status))
        .collect();
    assert_eq!(
        left,
        vec![
            ("worker-2".to_string(), ContainerStatus::Deregistered),
            ("worker-3".to_string(), ContainerStatus::Deregistered),
        ],
        "the containers the orchestrator stopped left the job cleanly"
    );
    files.reports_hold_no_double_run();
}

/// The task ids a container's own reports say it runs now.
fn running_on(files: &JobFiles, container: &str) -> std::collections::BTreeSet<String> {
    let mut running = std::collections::BTreeSet::new();
    for event in read_reports(&files.path("reports.jsonl")).unwrap() {
        if event.container == container {
            match event.running {
                true => running.insert(event.task),
                false => running.remove(&event.task),
            };
        }
    }
    running
}

/// Goal: a container stops its work when its lease lapses even while it is waiting on an
/// answer to the log: the wait may last until the client gives up (30 s), long after the
/// coordinator may have expired the container and given its tasks to another. Steps: a
/// container that takes 4 s to stop a task runs 2 tasks; a second container joins, so one
/// task is moved off the first; while the first is stopping it, every replica is paused
/// (SIGSTOP): its heartbeats and its coming answer hang. Its report must show its other task
/// stopped while it still runs; after SIGCONT the job recovers, and no task ran twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_container_stops_work_when_its_lease_lapses_while_it_waits_on_an_answer() {
    let files = JobFiles::new();
    let (cluster, client) = start_replicas(&files, "kind = \"external\"").await;
    let start_container = |name: &str, stop_delay_ms: &str| {
        let mut args = files.container_args();
        let delay = args.iter().position(|a| a == "--stop-delay-ms").unwrap() + 1;
        args[delay] = stop_delay_ms.into();
        Process::new(EXE)
            .args(["container", "--id", name, "--cluster"])
            .arg(cluster.client_addrs().join(","))
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap()
    };
    let mut slow = start_container("slow", "4000");
    wait_for_state(&client, &cluster, "2 tasks on the slow container", |s| {
        settled(s, 2, 1)
    })
    .await;
    assert_eq!(running_on(&files, "slow").len(), 2);
    let mut quick = start_container("quick", "0");
    // The slow container got the stop (it reports the task stopped at once, then takes 4 s
    // before it answers).
    poll_until(
        "the slow container to stop one task",
        STEP,
        Duration::from_millis(10),
        || {
            std::future::ready(match running_on(&files, "slow").len() {
                1 => Ok(()),
                n => Err(format!("it runs {n}")),
            })
        },
    )
    .await
    .unwrap();
    for i in 0..3 {
        cluster.signal(i, libc::SIGSTOP).unwrap();
    }
    let stopped = poll_until(
        "the slow container's own report to show all its work stopped",
        Duration::from_secs(20),
        Duration::from_millis(50),
        || {
            let running = running_on(&files, "slow");
            std::future::ready(if running.is_empty() {
                Ok(())
            } else {
                Err(format!("it still runs {running:?}"))
            })
        },
    )
    .await;
    let exited = slow.try_wait().unwrap();
    for i in 0..3 {
        cluster.signal(i, libc::SIGCONT).unwrap();
    }
    stopped.unwrap();
    assert_eq!(exited, None, "it stopped work only by exiting");
    // Whether the pause outlasted the slow container's session is the machine's timing.
    wait_for_state(&client, &cluster, "both tasks running again", |s| {
        settled(s, 2, 2) || settled(s, 2, 1)
    })
    .await;
    for child in [&mut slow, &mut quick] {
        let _ = child.kill();
        let _ = child.wait();
    }
    files.reports_hold_no_double_run();
}

/// Goal (issue 32): the lag a container reports counts only for the tasks it owns, so that
/// one container's credentials cannot steer the scaling. Steps: three `ctrlog serve`
/// processes with TLS and authentication and an external job of 4 inputs on at least 2
/// containers; containers `c1` and `c2` (this process's, with their own certificates) run
/// it, 2 tasks each, each reporting 7 for each task it runs. Then `c1` reports 8 for its own
/// and claims 2^62 for each of `c2`'s tasks and for one there is none of. Once the leader has
/// heard that, it holds 8 for each of `c1`'s tasks and nothing more, still 7 for `c2`'s, and
/// the count stays 2. On 3d7237e the claims were summed into `c1`'s lag (3 * 2^62 + 16).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lag_reported_for_another_containers_tasks_is_ignored() {
    use ctrlog::client::tls::client_config;
    use ctrlog::client::ClientOptions;
    use ctrlog::log::{ContainerId, TaskId};
    use ctrlog::tools::certs;
    use ctrlog::tools::chaos::container::{run_simulated_container, SimOptions};

    const CLAIMED: u64 = 1 << 62;
    let files = JobFiles::new();
    files.set_partitions(0..4);
    let config = files.job_config("kind = \"external\"", 2);
    let cluster = ProcessCluster::start_secure(common::replica_exe(), 3, &config, true, &[])
        .await
        .unwrap();
    let admin = ControlClient::connect_with(&cluster.client_addrs(), cluster.client_options())
        .await
        .unwrap();
    let pki = cluster.pki().unwrap();
    let lag_file = |name: &str| files.path(&format!("lag-{name}"));
    let c1_claims = std::sync::Arc::default();
    let mut containers = Vec::new();
    for name in ["c1", "c2"] {
        std::fs::write(lag_file(name), "7").unwrap();
        let (cert, key) = certs::client_identity(pki, name);
        let tls = client_config(&certs::ca_file(pki), Some((&cert, &key))).unwrap();
        let options = SimOptions {
            heartbeat_interval: Duration::from_millis(100),
            lease: Duration::from_millis(1500),
            lag_file: Some(lag_file(name)),
            client: ClientOptions::default().tls(tls),
            claimed_lag: match name {
                "c1" => std::sync::Arc::clone(&c1_claims),
                _ => Default::default(),
            },
            ..SimOptions::default()
        };
        let container = ContainerId::new(name).unwrap();
        containers.push(tokio::spawn(run_simulated_container(
            cluster.client_addrs(),
            container,
            options,
            std::future::pending(),
        )));
    }
    let state = wait_for_state(&admin, &cluster, "4 tasks on c1 and c2", |s| {
        settled(s, 4, 2) && desired(s) == Some(2)
    })
    .await;
    let tasks_of = |name: &str| -> Vec<TaskId> {
        let tasks = state.tasks().iter();
        tasks
            .filter(|(_, t)| {
                t.phase
                    .owner()
                    .is_some_and(|o| o.container.as_str() == name)
            })
            .map(|(task, _)| task.clone())
            .collect()
    };
    // Only now: a task c1 owns, even one on its way to c2, is c1's to report.
    let claims = tasks_of("c2")
        .into_iter()
        .chain([TaskId::new("partition-99").unwrap()]);
    *c1_claims.lock().unwrap() = claims.map(|task| (task, CLAIMED)).collect();
    std::fs::write(lag_file("c1"), "8").unwrap();

    let leader = leader_index(&admin.leader_status().await.unwrap());
    let http = cluster.http_addr(leader).unwrap();
    let token = cluster.token("operator").unwrap();
    let headers = format!("Host: {http}\r\nAuthorization: Bearer {token}\r\n");
    let own = |name: &str, per_task: u64| per_task * tasks_of(name).len() as u64;
    let heard = poll_until(
        "the leader to hear c1's new report",
        STEP,
        POLL_INTERVAL,
        || async {
            let (code, body) = common::http_get_with(http, "/status.json", &headers).await;
            let page: serde_json::Value =
                serde_json::from_str(&body).map_err(|e| format!("{code}: {e}"))?;
            let lag = |name: &str| page["lag"][name].as_u64();
            match (lag("c1"), lag("c2")) {
                // Above anything c1 reported before, and c2 heard on each of its tasks.
                (Some(c1), Some(c2)) if c1 > own("c1", 7) && c2 >= own("c2", 7) => Ok((c1, c2)),
                _ => Err(format!("{code}: {}", page["lag"])),
            }
        },
    )
    .await
    .unwrap();
    assert_eq!(
        heard,
        (own("c1", 8), own("c2", 7)),
        "the leader's view of (c1, c2)'s lag"
    );
    let state = admin.state(0).await.unwrap().state;
    assert_eq!(desired(&state), Some(2), "no scaling on claimed lag");
    for container in containers {
        container.abort();
    }
}
