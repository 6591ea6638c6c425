//! `examples/container.rs`, the container the README recommends, run as a process against a
//! cluster this test starts.

mod common;

use common::WAIT;
use ctrlog::client::ControlClient;
use ctrlog::log::{Command, ContainerId, SchemaChange, Target};
use ctrlog::tools::{poll_until, LocalCluster, POLL_INTERVAL};

/// The example's binary, which `cargo test` builds beside this test's own.
fn example_binary() -> std::path::PathBuf {
    let deps = std::env::current_exe().unwrap();
    let profile = deps.parent().unwrap().parent().unwrap();
    profile.join("examples").join("container")
}

/// Runs the example as container `c1` of the cluster at `seeds`, obeying up to `commands`
/// commands, its output piped.
fn spawn_example(seeds: &[String], commands: u32) -> tokio::process::Child {
    tokio::process::Command::new(example_binary())
        .args(["--cluster", &seeds.join(","), "--id", "c1"])
        .args(["--commands", &commands.to_string()])
        .env_remove("CTRLOG_CA")
        .env_remove("CTRLOG_TOKEN")
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("the example was built by cargo test")
}

/// Goal: the container example joins the job as a session, answers what it is sent (a
/// schema broadcast is acknowledged, so no handshake stays pending) and leaves the job when
/// done. Steps: one replica; the example runs with `--commands 2`; once it is live, a schema
/// change and a command for it are appended; it exits 0 within the deadline, the schema
/// change awaits nobody, and the container is no longer live.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_container_example_joins_answers_and_leaves() {
    let dir = tempfile::tempdir().unwrap();
    let cluster = LocalCluster::start(dir.path(), 1, |_| {}).await.unwrap();
    cluster.wait_for_leader(WAIT).await.unwrap();
    let seeds = cluster.client_addrs();
    let mut example = spawn_example(&seeds, 2);

    let client = ControlClient::connect(&seeds).await.unwrap();
    let c1 = ContainerId::new("c1").unwrap();
    poll_until("the example to join", WAIT, POLL_INTERVAL, || async {
        let state = client.state(0).await.map_err(|e| e.to_string())?;
        let live = state.state.live_sessions().any(|s| s.container == c1);
        live.then_some(()).ok_or_else(|| "not yet".to_string())
    })
    .await
    .unwrap();
    let schema = client
        .append(Command::SchemaChange(SchemaChange {
            subject: "orders".into(),
            schema: b"v2".to_vec(),
        }))
        .await
        .unwrap();
    client
        .append_to(
            Target::Container(c1.clone()),
            Command::custom(1, 1, b"hello".to_vec()),
        )
        .await
        .unwrap();

    let status = tokio::time::timeout(WAIT, example.wait())
        .await
        .expect("the example finished")
        .unwrap();
    assert!(status.success(), "{status}");
    let state = client.state(0).await.unwrap().state;
    assert!(
        !state.pending().contains_key(&schema.offset),
        "the schema change was acknowledged"
    );
    assert!(
        state.live_sessions().all(|s| s.container != c1),
        "it left the job"
    );
    cluster.shutdown().await;
}

/// Goal: the container example leaves cleanly when the controller drains it: it receives its
/// own deregistration and exits 0 without answering it. 3d7237e's example (and the README's
/// loop) acknowledged it, was refused `Fenced`, and exited with an error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_container_example_exits_cleanly_when_drained() {
    use ctrlog::log::DeregisterContainer;
    let dir = tempfile::tempdir().unwrap();
    let cluster = LocalCluster::start(dir.path(), 1, |_| {}).await.unwrap();
    cluster.wait_for_leader(WAIT).await.unwrap();
    let seeds = cluster.client_addrs();
    let example = spawn_example(&seeds, 5);
    let client = ControlClient::connect(&seeds).await.unwrap();
    let c1 = ContainerId::new("c1").unwrap();
    let epoch = poll_until("the example to join", WAIT, POLL_INTERVAL, || async {
        let state = client.state(0).await.map_err(|e| e.to_string())?;
        let session = state.state.live_sessions().find(|s| s.container == c1);
        session
            .map(|s| s.epoch)
            .ok_or_else(|| "not yet".to_string())
    })
    .await
    .unwrap();
    client
        .append(Command::DeregisterContainer(DeregisterContainer {
            container: c1.clone(),
            epoch,
        }))
        .await
        .unwrap();
    let exited = tokio::time::timeout(WAIT, example.wait_with_output())
        .await
        .expect("the example finished")
        .unwrap();
    let said = String::from_utf8_lossy(&exited.stdout);
    assert!(exited.status.success(), "{}: {said}", exited.status);
    assert!(said.contains("drained: leaving"), "{said}");
    cluster.shutdown().await;
}
