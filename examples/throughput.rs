//! Rough durable-commit throughput and restart time of a 3-replica loopback cluster, through
//! the library API (each append waits until it is committed on a majority and applied).
//!
//! `cargo run --release --example throughput [seconds-per-phase]`

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ctrlog::log::{Command, Proposal, Target};
use ctrlog::raft::{LocalCluster, ReplicaHandle};
use hdrhistogram::Histogram;

const WAIT: Duration = Duration::from_secs(120);

fn proposal() -> Proposal {
    Proposal {
        producer: None,
        target: Target::All,
        frame: Command::custom(1, 1, vec![7u8; 256]).into_frame(),
    }
}

/// Runs `writers` sequential appenders for `duration`; returns (commits/s, p50 µs, p99 µs).
async fn run_phase(leader: &ReplicaHandle, writers: usize, duration: Duration) -> (f64, u64, u64) {
    let stop = Arc::new(AtomicBool::new(false));
    let started = Instant::now();
    let tasks: Vec<_> = (0..writers)
        .map(|_| {
            let (leader, stop) = (leader.clone(), stop.clone());
            tokio::spawn(async move {
                let mut histogram = Histogram::<u64>::new(3).unwrap();
                while !stop.load(Ordering::Relaxed) {
                    let sent = Instant::now();
                    leader.append(proposal()).await.expect("append");
                    histogram.record(sent.elapsed().as_micros() as u64).unwrap();
                }
                histogram
            })
        })
        .collect();
    tokio::time::sleep(duration).await;
    stop.store(true, Ordering::Relaxed);
    let mut all = Histogram::<u64>::new(3).unwrap();
    for task in tasks {
        all.add(task.await.unwrap()).unwrap();
    }
    let elapsed = started.elapsed().as_secs_f64();
    (
        all.len() as f64 / elapsed,
        all.value_at_quantile(0.5),
        all.value_at_quantile(0.99),
    )
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let seconds: u64 = std::env::args().nth(1).map_or(Ok(5), |s| s.parse())?;
    let phase = Duration::from_secs(seconds);
    let dir = tempfile::tempdir()?;
    let mut cluster = LocalCluster::start(dir.path(), 3, |_| {}).await?;
    let leader_id = cluster.wait_for_leader(WAIT).await?;
    let leader = cluster.replica(leader_id).clone_handle();

    println!("| writers | commits/s | p50 latency | p99 latency |");
    println!("|---|---|---|---|");
    for writers in [1, 64, 256] {
        let (rate, p50, p99) = run_phase(&leader, writers, phase).await;
        println!(
            "| {writers} | {rate:.0} | {:.2} ms | {:.2} ms |",
            p50 as f64 / 1000.0,
            p99 as f64 / 1000.0
        );
    }

    // Restart: fill to 100,000 Raft entries (one writer, so one command per entry; snapshots
    // every 10,000 entries by default), stop a follower, restart it, and time until it has
    // applied everything the leader has.
    let target = 100_000;
    while leader.metrics().last_log_index.unwrap_or(0) < target {
        run_phase(&leader, 1, Duration::from_millis(500)).await;
    }
    let applied = leader.applied_offset();
    cluster.wait_for_applied(applied, WAIT).await?;
    let follower = cluster.follower_of(leader_id);
    cluster.stop(follower).await;
    let started = Instant::now();
    cluster.restart(follower).await?;
    let opened = started.elapsed();
    cluster.wait_for_applied(applied, WAIT).await?;
    let rejoined = started.elapsed();
    let metrics = cluster.replica(follower).metrics();
    println!(
        "\nrestart with {applied} commands ({} log entries, snapshot at entry {:?}): storage open + Raft start {:.0} ms, applied everything again after {:.0} ms",
        metrics.last_log_index.unwrap_or(0),
        metrics.snapshot.map(|l| l.index),
        opened.as_secs_f64() * 1000.0,
        rejoined.as_secs_f64() * 1000.0
    );
    cluster.shutdown().await;
    Ok(())
}
