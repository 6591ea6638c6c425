//! A live job for looking at the status page: three replicas with their HTTP ports on, a
//! controller beside each, and two simulated containers running four tasks. Prints the
//! leader's status page URL, then serves until SIGTERM or Ctrl-C (or for the seconds given),
//! and removes its temporary directory.
//!
//! `cargo run --example status_page [seconds]`; `scripts/check-status-page.sh` renders it in
//! headless Chromium.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use ctrlog::controller::{Controller, ControllerConfig, JobDriver, StaticInputs};
use ctrlog::jobs::plan::{GroupByPartition, LagPolicy};
use ctrlog::jobs::TaskPhase;
use ctrlog::log::Input;
use ctrlog::tools::container::{InProcessLauncher, SimOptions};
use ctrlog::tools::local_job::{ControllerFactory, LocalJob};
use ctrlog::tools::LocalCluster;

const WAIT: Duration = Duration::from_secs(30);

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let seconds: Option<u64> = std::env::args().nth(1).map(|s| s.parse()).transpose()?;
    let dir = tempfile::tempdir()?;
    let cluster = LocalCluster::start(dir.path(), 3, |c| {
        c.http_addr = Some("127.0.0.1:0".parse().expect("literal address"));
    })
    .await?;
    cluster.wait_for_leader(WAIT).await?;
    let launcher = Arc::new(InProcessLauncher::new(
        cluster.client_addrs(),
        SimOptions::default(),
    ));
    let inputs: BTreeSet<Input> = (0..4)
        .map(|p| Input::new("kafka", "clicks", p))
        .collect::<Result<_, _>>()?;
    let factory: ControllerFactory = Arc::new(move |replica| {
        Controller::new(
            replica,
            JobDriver {
                inputs: Box::new(StaticInputs(inputs.clone())),
                grouper: Box::new(GroupByPartition),
                policy: Box::new(LagPolicy::new(2, 2, u64::MAX, 0, Duration::from_secs(1))),
                launcher: launcher.clone(),
            },
            ControllerConfig::default(),
        )
    });
    let job = LocalJob::start(cluster, factory);
    job.wait_for_state("four tasks running", WAIT, |state| {
        state.tasks().len() == 4
            && state
                .tasks()
                .values()
                .all(|t| matches!(t.phase, TaskPhase::Running { .. }))
    })
    .await?;
    let leader = job.cluster.wait_for_leader(WAIT).await?;
    let url = job
        .cluster
        .replica(leader)
        .http_addr()
        .expect("the port is on");
    println!("http://{url}/");
    let mut terminate = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    let served = tokio::time::sleep(Duration::from_secs(seconds.unwrap_or(u64::MAX / 4)));
    tokio::select! {
        _ = served => {}
        _ = terminate.recv() => {}
        _ = tokio::signal::ctrl_c() => {}
    }
    job.shutdown().await;
    Ok(())
}
