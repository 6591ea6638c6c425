//! How long a task move takes through the log: from the moment the coordinator appends
//! `StopTask` on one container to the moment the `TaskStarted` ack of the new container is
//! applied. Three replicas on loopback, two simulated containers (real clients over TCP),
//! every command durable on a majority.
//!
//! `cargo run --release --example moves [moves]`

use std::time::{Duration, Instant};

use ctrlog::controller::ContainerLauncher;
use ctrlog::jobs::{JobState, Session, TaskPhase};
use ctrlog::log::*;
use ctrlog::server::ReplicaHandle;
use ctrlog::tools::chaos::container::{InProcessLauncher, SimOptions};
use ctrlog::tools::LocalCluster;
use hdrhistogram::Histogram;

const WAIT: Duration = Duration::from_secs(30);

/// Waits until the leader's JobState satisfies `condition`.
async fn until(
    leader: &ReplicaHandle,
    condition: impl Fn(&JobState) -> bool,
) -> anyhow::Result<()> {
    let mut applied = leader.applied();
    let deadline = tokio::time::Instant::now() + WAIT;
    while !leader.read_state(&condition) {
        tokio::time::timeout_at(deadline, applied.changed()).await??;
    }
    Ok(())
}

async fn append(leader: &ReplicaHandle, command: Command) -> anyhow::Result<Offset> {
    let target = command.default_target();
    let proposal = Proposal {
        producer: None,
        target,
        frame: command.into_frame(),
    };
    Ok(leader.append(proposal).await?.offset)
}

fn running_on(state: &JobState, task: &TaskId, container: &ContainerId) -> bool {
    matches!(&state.tasks()[task].phase, TaskPhase::Running { owner, .. } if &owner.container == container)
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let moves: usize = std::env::args().nth(1).map_or(Ok(100), |s| s.parse())?;
    let dir = tempfile::tempdir()?;
    let cluster = LocalCluster::start(dir.path(), 3, |_| {}).await?;
    let leader_id = cluster.wait_for_leader(WAIT).await?;
    let leader = cluster.replica(leader_id).clone_handle();
    let launcher = InProcessLauncher::new(cluster.client_addrs(), SimOptions::default());
    let names = [ContainerId::new("a")?, ContainerId::new("b")?];
    for name in &names {
        launcher.launch(name).map_err(anyhow::Error::msg)?;
    }
    until(&leader, |s| {
        names.iter().all(|n| s.live_session(n).is_some())
    })
    .await?;
    let sessions: Vec<Session> = names
        .iter()
        .map(|n| {
            leader
                .read_state(|s| s.live_session(n))
                .expect("registered")
        })
        .collect();

    let task = TaskId::new("t0")?;
    let input = Input::new("kafka", "events", 0)?;
    append(
        &leader,
        Command::AddInputs(AddInputs {
            inputs: vec![input.clone()],
        }),
    )
    .await?;
    let assign = |to: &Session| {
        Command::AssignTask(AssignTask {
            task: task.clone(),
            container: to.container.clone(),
            epoch: to.epoch,
            inputs: vec![input.clone()],
        })
    };
    append(&leader, assign(&sessions[0])).await?;
    until(&leader, |s| running_on(s, &task, &names[0])).await?;

    let mut histogram = Histogram::<u64>::new(3)?;
    for i in 0..moves {
        let (from, to) = (&sessions[i % 2], &sessions[(i + 1) % 2]);
        let started = Instant::now();
        append(
            &leader,
            Command::StopTask(StopTask {
                task: task.clone(),
                container: from.container.clone(),
                epoch: from.epoch,
            }),
        )
        .await?;
        until(&leader, |s| s.tasks()[&task].phase == TaskPhase::Unassigned).await?;
        append(&leader, assign(to)).await?;
        until(&leader, |s| running_on(s, &task, &to.container)).await?;
        histogram.record(started.elapsed().as_micros() as u64)?;
    }
    let ms = |q: f64| histogram.value_at_quantile(q) as f64 / 1000.0;
    println!(
        "{moves} moves (stop → stopped ack → assign → started ack): median {:.2} ms, p90 {:.2} ms, p99 {:.2} ms, max {:.2} ms",
        ms(0.5),
        ms(0.9),
        ms(0.99),
        histogram.max() as f64 / 1000.0
    );
    drop(launcher);
    cluster.shutdown().await;
    Ok(())
}
