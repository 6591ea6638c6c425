//! A live job for looking at the status page: three replicas with their HTTP ports on, a
//! controller beside each, and simulated containers running four tasks. Before it prints the
//! leader's status page URL the job has had something to chart: it started on two containers,
//! scaled out to three on lag (a scale event and task moves) and lost its first leader. Then
//! it serves until SIGTERM or Ctrl-C (or for the seconds given), and removes its temporary
//! directory.
//!
//! `cargo run --example status_page [seconds]`; `scripts/check-status-page.sh` renders it in
//! headless Chromium.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use ctrlog::controller::{Capacity, Controller, ControllerConfig, JobDriver, StaticInputs};
use ctrlog::jobs::plan::{settled, GroupByPartition, LagPolicy};
use ctrlog::log::Input;
use ctrlog::tools::chaos::container::{InProcessLauncher, SimOptions};
use ctrlog::tools::cluster::job::{ControllerFactory, LocalJob};
use ctrlog::tools::{poll_until, LocalCluster, POLL_INTERVAL};

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
    let lag_file = dir.path().join("lag");
    std::fs::write(&lag_file, "0")?;
    let launcher = Arc::new(InProcessLauncher::new(
        cluster.client_addrs(),
        SimOptions {
            lag_file: Some(lag_file.clone()),
            ..SimOptions::default()
        },
    ));
    let inputs: BTreeSet<Input> = (0..4)
        .map(|p| Input::new("kafka", "clicks", p))
        .collect::<Result<_, _>>()?;
    let factory: ControllerFactory = Arc::new(move |replica| {
        Controller::new(
            replica,
            JobDriver {
                inputs: Box::new(StaticInputs::new(inputs.clone())),
                grouper: Box::new(GroupByPartition),
                // 2 to 3 containers: out above 1,000 lag per container, never back in.
                policy: Box::new(LagPolicy::new(2, 3, 1_000, 0, Duration::from_secs(1))),
                capacity: Capacity::Launched(launcher.clone()),
            },
            ControllerConfig::default(),
        )
    });
    let mut job = LocalJob::start(cluster, factory);
    job.wait_for_state("four tasks on two containers", WAIT, |s| settled(s, 4, 2))
        .await?;
    std::fs::write(&lag_file, "5000")?;
    job.wait_for_state("four tasks on three containers", WAIT, |s| settled(s, 4, 3))
        .await?;
    job.kill(job.cluster.wait_for_leader(WAIT).await?).await;
    let leader = job.cluster.wait_for_leader(WAIT).await?;
    // Until the new leader's history has sampled it leading, with the containers' lag, twice:
    // the charts then mark the election, and the lag chart (which only a leader hears, and
    // draws a line from two samples) has a line. Its first sample as leader may come before
    // any container's heartbeat reached it.
    let replica = job.cluster.replica(leader);
    poll_until(
        "two samples of the new leader's history with the lag it heard",
        WAIT,
        POLL_INTERVAL,
        || {
            let term = replica.metrics().current_term;
            let samples = replica.history().samples();
            let leading_with_lag = samples
                .iter()
                .rev()
                .take(2)
                .filter(|s| s.term == term && s.leader == Some(leader) && !s.lag.is_empty())
                .count();
            std::future::ready(if leading_with_lag == 2 {
                Ok(())
            } else {
                Err("not yet")
            })
        },
    )
    .await?;
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
