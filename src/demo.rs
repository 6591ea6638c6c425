//! `ctrlog demo`: three replicas in this process, on loopback, with real files and sockets.
//!
//! It appends commands through the client library, kills the leader, shows that a new leader
//! takes over with every acknowledged command intact, restarts the old leader and shows it
//! catch up. The SAMZA-237 job controller joins this demo once it exists.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use crate::client::{ControlClient, FetchRequest};
use crate::log::{Command, Target};
use crate::raft::LocalCluster;

const WAIT: Duration = Duration::from_secs(20);

async fn append_some(client: &ControlClient, from: u32, count: u32) -> anyhow::Result<Vec<u64>> {
    let mut offsets = Vec::new();
    for i in from..from + count {
        let payload = format!("config-change #{i}").into_bytes();
        let ack = client
            .append_to(Target::All, Command::custom(1, 1, payload))
            .await?;
        offsets.push(ack.offset);
    }
    Ok(offsets)
}

/// Runs the demo. Data goes under `data`, or a fresh temporary directory that is removed after.
pub async fn run(data: Option<PathBuf>) -> anyhow::Result<()> {
    let (dir, temporary) = match data {
        Some(dir) => (dir, false),
        None => {
            let dir = std::env::temp_dir().join(format!("ctrlog-demo-{}", std::process::id()));
            (dir, true)
        }
    };
    std::fs::create_dir_all(&dir)?;
    println!("== starting 3 replicas under {}", dir.display());
    let mut cluster = LocalCluster::start(&dir, 3, |_| {}).await?;
    let leader = cluster.wait_for_leader(WAIT).await?;
    println!("== replica {leader} is the leader");

    let client = ControlClient::connect(&cluster.client_addrs()).await?;
    let started = Instant::now();
    let offsets = append_some(&client, 1, 5).await?;
    println!(
        "== appended 5 commands at offsets {offsets:?} in {:?}",
        started.elapsed()
    );

    println!("== killing the leader, replica {leader}");
    cluster.stop(leader).await;
    let started = Instant::now();
    let offsets = append_some(&client, 6, 5).await?;
    let new_leader = cluster.wait_for_leader(WAIT).await?;
    println!(
        "== replica {new_leader} took over; 5 more commands at offsets {offsets:?} ({:?} including the election)",
        started.elapsed()
    );

    println!("== restarting replica {leader}; it catches up from its own disk and the new leader");
    cluster.restart(leader).await?;
    let last = *offsets.last().expect("appended five");
    cluster.wait_for_applied(last, WAIT).await?;
    let response = cluster
        .replica(leader)
        .fetch(&FetchRequest::from(1), Duration::ZERO)
        .await?;
    println!("== the control log as replica {leader} has it now:");
    for entry in &response.entries {
        if let Command::Custom { payload, .. } = entry.command() {
            println!(
                "   offset {:>2}  term {}  {}",
                entry.offset,
                entry.term,
                String::from_utf8_lossy(&payload)
            );
        }
    }
    cluster.shutdown().await;
    if temporary {
        std::fs::remove_dir_all(&dir)?;
    }
    println!("== done: every acknowledged command survived the leader's death, in order");
    Ok(())
}
