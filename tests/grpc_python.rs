//! A container ctrlog did not write: `examples/python/container.py`, on grpcio with stubs that
//! grpcio-tools generates from `proto/ctrlog/v1`, launched by three real `ctrlog serve`
//! processes through a `[job]`'s process launcher. It joins, runs its tasks through the
//! stop → stopped → assign → started handshakes, acks a schema broadcast, rides out a leader
//! killed in the middle of a task move, and leaves when drained; its own reports show no task
//! run twice at once. And grpcio's reflection client lists the services a replica serves.
//!
//! The test makes its Python environment itself, under `target/`: a virtual environment with
//! the pinned packages of `examples/python/requirements.txt`, and the stubs generated anew.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command as Process;
use std::sync::OnceLock;
use std::time::Duration;

use common::WAIT;
use ctrlog::client::ControlClient;
use ctrlog::jobs::plan::settled;
use ctrlog::jobs::{ContainerStatus, JobState, TaskPhase};
use ctrlog::log::{Command, SchemaChange};
use ctrlog::tools::chaos::checker::{double_runs, read_reports};
use ctrlog::tools::cluster::wait::job_state_until;
use ctrlog::tools::cluster::{processes_mentioning, ProcessCluster};
use ctrlog::tools::LocalCluster;

const EXE: &str = env!("CARGO_BIN_EXE_ctrlog");

/// Each step's deadline: a debug build of three replicas and Python containers on 2 cores.
const STEP: Duration = Duration::from_secs(90);

const POLL: Duration = Duration::from_millis(50);

fn repository() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// The virtual environment and the generated stubs.
struct Python {
    interpreter: PathBuf,
    stubs: PathBuf,
}

/// Makes (once per run of this file) the virtual environment under `target/`, installing the
/// pinned requirements when they changed since it was made, and generates the stubs.
fn python() -> &'static Python {
    static PYTHON: OnceLock<Python> = OnceLock::new();
    PYTHON.get_or_init(|| {
        let home = Path::new(env!("CARGO_TARGET_TMPDIR")).join("grpc-python");
        let venv = home.join("venv");
        let interpreter = venv.join("bin/python");
        let run = |process: &mut Process, what: &str| {
            let output = process.output().unwrap_or_else(|e| panic!("{what}: {e}"));
            assert!(
                output.status.success(),
                "{what}: {}\n{}",
                String::from_utf8_lossy(&output.stdout),
                String::from_utf8_lossy(&output.stderr)
            );
        };
        if !interpreter.exists() {
            run(
                Process::new("python3").args(["-m", "venv"]).arg(&venv),
                "python3 -m venv",
            );
        }
        let requirements = repository().join("examples/python/requirements.txt");
        let wanted = std::fs::read_to_string(&requirements).unwrap();
        let installed = home.join("installed-requirements.txt");
        if std::fs::read_to_string(&installed).ok().as_deref() != Some(wanted.as_str()) {
            run(
                Process::new(&interpreter)
                    .args([
                        "-m",
                        "pip",
                        "install",
                        "--quiet",
                        "--disable-pip-version-check",
                        "-r",
                    ])
                    .arg(&requirements),
                "pip install -r examples/python/requirements.txt",
            );
            std::fs::write(&installed, &wanted).unwrap();
        }
        let stubs = home.join("stubs");
        let _ = std::fs::remove_dir_all(&stubs);
        std::fs::create_dir_all(&stubs).unwrap();
        let proto = repository().join("proto");
        run(
            Process::new(&interpreter)
                .args(["-m", "grpc_tools.protoc"])
                .arg("-I")
                .arg(&proto)
                .arg(format!("--python_out={}", stubs.display()))
                .arg(format!("--grpc_python_out={}", stubs.display()))
                .args(
                    ["commands", "errors", "control"]
                        .map(|file| proto.join(format!("ctrlog/v1/{file}.proto"))),
                ),
            "grpc_tools.protoc",
        );
        Python { interpreter, stubs }
    })
}

async fn wait_for_state(
    client: &ControlClient,
    cluster: &ProcessCluster,
    containers_log: &Path,
    what: &str,
    condition: impl Fn(&JobState) -> bool,
) -> JobState {
    let found = job_state_until(client, what, STEP, condition).await;
    found.unwrap_or_else(|error| {
        let replicas: String = (0..3)
            .map(|i| format!("--- replica {}:\n{}\n", i + 1, cluster.log_tail(i, 30)))
            .collect();
        let containers: String = std::fs::read_dir(containers_log)
            .into_iter()
            .flatten()
            .flatten()
            .map(|f| {
                let text = std::fs::read_to_string(f.path()).unwrap_or_default();
                let tail: Vec<&str> = text.lines().rev().take(20).collect();
                format!(
                    "--- {}:\n{}\n",
                    f.path().display(),
                    tail.into_iter().rev().collect::<Vec<_>>().join("\n")
                )
            })
            .collect();
        panic!("{error}\n{replicas}{containers}")
    })
}

/// Containers outlive the replicas that launched them; the test's end must not leave them
/// behind (every process of the job names its folder).
struct EndProcessesOnDrop(PathBuf);

impl Drop for EndProcessesOnDrop {
    fn drop(&mut self) {
        for pid in processes_mentioning(&self.0) {
            // SAFETY: kill(2) on a process this test's job started; no memory involved.
            unsafe { libc::kill(pid, libc::SIGKILL) };
        }
    }
}

/// Goal: Python containers, launched by the leader through `[job.launcher] kind = "process"`,
/// run the job as `ctrlog container` does: two inputs settle on one container, a schema
/// broadcast is acked by it, lag scales the job out to two (a task moves, and the leader is
/// killed while it is in flight: the next leader finishes the move), and, the lag gone, back
/// in to one, the drained container deregistered (not expired) and its process gone. No task
/// ran on two containers at once, by their own reports.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_containers_run_a_job_through_a_leader_kill() {
    let python = python();
    let dir = tempfile::Builder::new()
        .prefix("ctrlog-python-job-")
        .tempdir()
        .unwrap();
    let _containers = EndProcessesOnDrop(dir.path().to_path_buf());
    let path = |name: &str| dir.path().join(name);
    std::fs::write(path("inputs"), "kafka/events/0\nkafka/events/1\n").unwrap();
    std::fs::write(path("lag"), "0").unwrap();
    std::fs::create_dir(path("containers")).unwrap();
    let reports = path("reports.jsonl");
    let (job, containers_log) = (path("job.toml"), path("containers"));
    let command: Vec<String> = [
        python.interpreter.display().to_string(),
        repository()
            .join("examples/python/container.py")
            .display()
            .to_string(),
        "--stubs".into(),
        python.stubs.display().to_string(),
        "--id".into(),
        "{id}".into(),
        // The gRPC ports the leader knows of when it launches the container; the container
        // learns the others from any of them.
        "--grpc".into(),
        "{grpc}".into(),
        "--heartbeat-ms".into(),
        "100".into(),
        "--lease-ms".into(),
        "1500".into(),
        // A stop takes a second, so that the leader can be killed in the middle of it.
        "--stop-delay-ms".into(),
        "1000".into(),
        "--lag-file".into(),
        path("lag").display().to_string(),
        "--report-file".into(),
        reports.display().to_string(),
    ]
    .into();
    let config = format!(
        r#"[job]
inputs_file = "{inputs}"
session_timeout_ms = 3000

[job.scaling]
min = 1
max = 2
scale_out_lag = 1000
scale_in_lag = 100
cooldown_ms = 1000

[job.launcher]
kind = "process"
command = {command}
log_dir = "{logs}"
"#,
        inputs = path("inputs").display(),
        command = toml::Value::from(command),
        logs = containers_log.display(),
    );
    std::fs::write(&job, config).unwrap();
    let config_flag = ["--config".to_string(), job.display().to_string()];
    let mut cluster = ProcessCluster::start_with_grpc(EXE.into(), 3, &config_flag)
        .await
        .unwrap();
    let client = ControlClient::connect(&cluster.client_addrs())
        .await
        .unwrap();

    let one = wait_for_state(
        &client,
        &cluster,
        &containers_log,
        "2 tasks on one Python container",
        |s| settled(s, 2, 1),
    )
    .await;
    let schema = client
        .append(Command::SchemaChange(SchemaChange {
            subject: "events".into(),
            schema: b"v2".to_vec(),
        }))
        .await
        .unwrap()
        .offset;
    let acked = job_state_until(&client, "the schema acked", STEP, |s| {
        !s.pending().contains_key(&schema)
    })
    .await
    .unwrap();
    assert_eq!(acked.live_sessions().count(), one.live_sessions().count());

    std::fs::write(path("lag"), "1000").unwrap();
    wait_for_state(
        &client,
        &cluster,
        &containers_log,
        "a task moving to the new container",
        |s| {
            s.tasks()
                .values()
                .any(|t| matches!(t.phase, TaskPhase::Stopping { .. }))
        },
    )
    .await;
    let killed = client.leader_status().await.unwrap().leader_id.unwrap() as usize - 1;
    cluster.kill(killed);
    let two = wait_for_state(
        &client,
        &cluster,
        &containers_log,
        "2 tasks on 2 Python containers",
        |s| settled(s, 2, 2),
    )
    .await;
    cluster.restart(killed).unwrap();

    std::fs::write(path("lag"), "0").unwrap();
    let back = wait_for_state(
        &client,
        &cluster,
        &containers_log,
        "2 tasks back on one container",
        |s| settled(s, 2, 1),
    )
    .await;
    let drained: Vec<_> = two
        .live_sessions()
        .filter(|s| back.live_session(&s.container).is_none())
        .collect();
    assert_eq!(drained.len(), 1, "{drained:?}");
    let left = job_state_until(&client, "the drained container deregistered", STEP, |s| {
        s.containers()[&drained[0].container].status == ContainerStatus::Deregistered
    })
    .await;
    assert!(left.is_ok(), "{left:?}: drained, not expired");
    let python_containers = || {
        let pids = processes_mentioning(dir.path()).into_iter().filter(|pid| {
            let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
            String::from_utf8_lossy(&cmdline).contains("container.py")
        });
        pids.count()
    };
    ctrlog::tools::poll_until("the drained container's process to end", STEP, POLL, || {
        let running = python_containers();
        std::future::ready(if running == 1 {
            Ok(())
        } else {
            Err(format!("{running} running"))
        })
    })
    .await
    .unwrap();

    let events = read_reports(&reports).unwrap();
    assert!(events.len() >= 4, "the containers reported {events:?}");
    let violations = double_runs(&events);
    assert!(violations.is_empty(), "{violations:#?}");
}

/// Goal: grpcio's reflection client (what `grpcurl list` does) lists the services a replica's
/// gRPC port serves.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reflection_lists_the_services() {
    let python = python();
    let data = tempfile::tempdir().unwrap();
    let cluster = LocalCluster::start(data.path(), 1, |c| {
        c.grpc.addr = Some("127.0.0.1:0".parse().unwrap());
    })
    .await
    .unwrap();
    cluster.wait_for_leader(WAIT).await.unwrap();
    let addr = cluster.replica(1).grpc_addr().unwrap().to_string();
    let interpreter = python.interpreter.clone();
    let output = tokio::task::spawn_blocking(move || {
        Process::new(interpreter)
            .arg(repository().join("examples/python/list_services.py"))
            .arg(addr)
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    let listed = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "{listed}{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let listed: Vec<&str> = listed.lines().collect();
    for service in [
        "ctrlog.v1.ControlLog",
        "ctrlog.v1.Operator",
        "grpc.health.v1.Health",
    ] {
        assert!(listed.contains(&service), "{service} not in {listed:?}");
    }
    cluster.shutdown().await;
}
