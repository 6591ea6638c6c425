//! A container's side of the control log: join the job as a [`ContainerSession`], obey the
//! commands addressed to it plus broadcasts, in order, and answer each through the same log.
//! It links only the client (`--no-default-features --features client`: no openraft, no sled).
//!
//! ```sh
//! ctrlog demo --serve &    # or any cluster
//! cargo run --no-default-features --features client --example container -- \
//!     --cluster 127.0.0.1:7101,127.0.0.1:7102,127.0.0.1:7103 --id container-1
//! ```
//!
//! `--cluster` also comes from `CTRLOG_CLUSTER`, a token from `CTRLOG_TOKEN` and a CA from
//! `CTRLOG_CA`, as for `ctrlog container`. `--commands N` leaves the job after N commands
//! (tests/example_container.rs runs it so against a cluster it starts).

use std::collections::BTreeMap;
use std::path::PathBuf;

use ctrlog::client::{
    tls, ClientError, ClientOptions, ContainerSession, ControlClient, SessionOptions,
    SubscriptionItem,
};
use ctrlog::log::vocabulary::kind_label;
use ctrlog::log::{Command, ContainerId};
use futures::StreamExt;

/// What the example is told on its command line and in its environment.
struct Args {
    cluster: Vec<String>,
    id: String,
    commands: usize,
}

fn args() -> Result<Args, String> {
    let mut args = Args {
        cluster: std::env::var("CTRLOG_CLUSTER")
            .map(|c| c.split(',').map(String::from).collect())
            .unwrap_or_default(),
        id: "container-1".into(),
        commands: usize::MAX,
    };
    let mut given = std::env::args().skip(1);
    while let Some(flag) = given.next() {
        let value = given.next().ok_or(format!("{flag} needs a value"))?;
        match flag.as_str() {
            "--cluster" => args.cluster = value.split(',').map(String::from).collect(),
            "--id" => args.id = value,
            "--commands" => args.commands = value.parse().map_err(|e| format!("{flag}: {e}"))?,
            other => return Err(format!("unknown flag {other}")),
        }
    }
    Ok(args)
}

/// TLS and a token from the environment, as a launcher hands them to a container.
fn options() -> Result<ClientOptions, Box<dyn std::error::Error>> {
    let mut options = ClientOptions::new();
    if let Ok(ca) = std::env::var("CTRLOG_CA") {
        options = options.tls(tls::client_config(&PathBuf::from(ca), None)?);
    }
    if let Ok(token) = std::env::var("CTRLOG_TOKEN") {
        options = options.token(token);
    }
    Ok(options)
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args = args()?;
    let me = ContainerId::new(args.id)?;
    // Fails at once on a wrong token or CA (`Api(Unauthorized)`, `Tls`); retries an
    // unreachable cluster until the options' deadline (`GaveUp`).
    let client = ControlClient::connect_with(&args.cluster, options()?).await?;
    // Registers (the registration's offset is this container's epoch) and heartbeats in the
    // background with the lag the callback reports per task; here there is none to report.
    let session =
        ContainerSession::join(client, me.clone(), SessionOptions::default(), BTreeMap::new)
            .await?;
    println!("[{me}] joined at epoch {}", session.epoch());
    let mut commands = session.commands();
    let mut obeyed = 0;
    while obeyed < args.commands {
        let item = tokio::select! {
            item = commands.next() => item,
            // Expired (missed heartbeats) or registered again elsewhere: every answer is
            // refused from now on. Stop all work; a real container would join again.
            fenced = session.fenced() => return Err(fenced.into()),
        };
        let Some(item) = item else { break };
        match item? {
            SubscriptionItem::Entry(entry) => {
                let answered = match entry.command() {
                    Command::AssignTask(assign) => {
                        println!("[{me}] start {}", assign.task);
                        session.task_started(assign.task).await
                    }
                    Command::StopTask(stop) => {
                        println!("[{me}] stop {}", stop.task);
                        // A real task flushes its state and names its checkpoint here.
                        session.task_stopped(stop.task, None).await
                    }
                    // Drained (the job scaled in): the controller moved every task off this
                    // container first, and the session is over; there is nothing to answer.
                    Command::DeregisterContainer(drained) if drained.epoch == session.epoch() => {
                        println!("[{me}] drained: leaving");
                        return Ok(());
                    }
                    _ => {
                        let kind = kind_label(entry.frame.kind, entry.frame.version);
                        println!("[{me}] offset {}: {kind}", entry.offset);
                        session.ack(entry.offset).await
                    }
                };
                match answered {
                    Ok(ack) => println!("[{me}]   answered at offset {}", ack.offset),
                    Err(ClientError::Api(refusal)) => return Err(refusal.into()),
                    // The client retried through failovers for its whole deadline.
                    Err(gave_up) => return Err(gave_up.into()),
                }
                obeyed += 1;
            }
            // This container fell behind the retained log: rebuild what it runs from the job
            // state as of `offset`; the stream continues after it.
            SubscriptionItem::Reset { offset, .. } => {
                println!("[{me}] compacted: resuming from the job state as of {offset}");
            }
        }
    }
    session.leave().await?;
    println!("[{me}] left the job after {obeyed} commands");
    Ok(())
}
