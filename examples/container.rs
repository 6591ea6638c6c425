//! A container's side of the control log, in a few lines: connect, subscribe to its own
//! commands plus broadcasts, obey each one, and answer through the same log.
//!
//! `cargo run --example container -- 127.0.0.1:7101,127.0.0.1:7102,127.0.0.1:7103`
//!
//! Without addresses it starts a three-replica cluster in this process and plays the
//! coordinator too, so it runs on its own.

use std::time::Duration;

use ctrlog::client::{ControlClient, SubscriptionItem};
use ctrlog::log::{Command, ContainerId, Filter, Target};
use ctrlog::tools::LocalCluster;
use futures::StreamExt;

/// The user kinds this example speaks: the coordinator's instruction and the container's ack.
const INSTRUCTION: u32 = 1;
const ACK: u32 = 2;

async fn run_container(seeds: Vec<String>, me: ContainerId, commands: usize) -> anyhow::Result<()> {
    let client = ControlClient::connect(&seeds).await?;
    let mut stream = client.subscribe(1, Filter::Container(me.clone()));
    let mut obeyed = 0;
    while obeyed < commands {
        let Some(item) = stream.next().await else {
            break;
        };
        match item? {
            SubscriptionItem::Entry(entry) => {
                if let Command::Custom { payload, .. } = entry.command() {
                    println!(
                        "[{me}] offset {} ({}): {}",
                        entry.offset,
                        entry.target,
                        String::from_utf8_lossy(&payload)
                    );
                }
                let ack = format!("{me} did offset {}", entry.offset).into_bytes();
                let answer = client
                    .append_to(Target::Coordinator, Command::custom(ACK, 1, ack))
                    .await?;
                println!("[{me}]   acked at offset {}", answer.offset);
                obeyed += 1;
            }
            SubscriptionItem::Reset { offset, .. } => {
                println!("[{me}] compacted: restarting from the job state as of {offset}");
            }
        }
    }
    Ok(())
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let me = ContainerId::new("container-1")?;
    if let Some(addrs) = std::env::args().nth(1) {
        let seeds = addrs.split(',').map(str::to_string).collect();
        return run_container(seeds, me, usize::MAX).await;
    }

    let dir = tempfile::tempdir()?;
    let cluster = LocalCluster::start(dir.path(), 3, |_| {}).await?;
    cluster.wait_for_leader(Duration::from_secs(20)).await?;
    let seeds = cluster.client_addrs();
    let container = tokio::spawn(run_container(seeds.clone(), me.clone(), 3));

    let coordinator = ControlClient::connect(&seeds).await?;
    let other = ContainerId::new("container-2")?;
    for (target, text) in [
        (Target::Container(me.clone()), "start task 0"),
        (
            Target::Container(other),
            "start task 1 (not for container-1)",
        ),
        (Target::All, "schema v2 is live"),
        (Target::Container(me), "stop task 0"),
    ] {
        let body = text.as_bytes().to_vec();
        coordinator
            .append_to(target, Command::custom(INSTRUCTION, 1, body))
            .await?;
    }
    container.await??;
    cluster.shutdown().await;
    Ok(())
}
