//! A coordinator of your own: ctrlog embedded in your binary, with your inputs and your way of
//! starting containers. Each process runs one replica (`Replica::start`) and, beside it, the
//! job's `Controller`, which acts only while that replica leads; containers connect to the
//! replicas' client ports.
//!
//! The two parts a deployment writes are here:
//!
//! * `TopicPartitions`, an `InputSource`: it polls what your stream system says the input
//!   topic's partitions are (here a stand-in for a Kafka admin client's metadata call), so a
//!   partition that appears is assigned on the next tick;
//! * `TaskLauncher`, a `ContainerLauncher`: it starts a container (here a tokio task running
//!   your container code with `ContainerSession`; in production a pod, a YARN container or a
//!   process) and stops it.
//!
//! `cargo run --example coordinator` runs three such coordinators in this process, on loopback
//! ports with their data in a temporary folder: the topic grows from 2 to 4 partitions while
//! the job runs, and the example exits once all 4 run on the job's 2 containers (non-zero if
//! that does not happen within a minute). In a deployment each host runs one:
//! `coordinator --id 1 --data /var/lib/my-job --members 1=H1:7001/H1:7000,2=...,3=...`.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::Context;
use futures::StreamExt;
use tokio::task::JoinHandle;

use ctrlog::client::{
    ClientError, ContainerSession, ControlClient, SessionOptions, SubscriptionItem,
};
use ctrlog::controller::{
    Capacity, ContainerLauncher, Controller, ControllerConfig, InputSource, JobDriver,
};
use ctrlog::jobs::plan::{settled, GroupByPartition, LagPolicy};
use ctrlog::log::{Command, ContainerId, Input};
use ctrlog::server::{parse_members, Replica, ReplicaConfig};

/// What your stream system reports about the input topic. A real one asks the brokers.
#[derive(Default)]
struct TopicMetadata {
    partitions: AtomicU32,
}

/// The job's inputs: every partition the topic has now.
struct TopicPartitions(Arc<TopicMetadata>);

impl InputSource for TopicPartitions {
    fn inputs(&mut self) -> Result<Arc<BTreeSet<Input>>, String> {
        (0..self.0.partitions.load(Ordering::Relaxed))
            .map(|p| Input::new("kafka", "clicks", p).map_err(|e| e.to_string()))
            .collect::<Result<BTreeSet<Input>, String>>()
            .map(Arc::new)
    }
}

/// Starts containers as tasks of this process, each running `run_container`.
struct TaskLauncher {
    seeds: Vec<String>,
    running: Mutex<BTreeMap<ContainerId, JoinHandle<()>>>,
}

impl ContainerLauncher for TaskLauncher {
    fn launch(&self, container: &ContainerId) -> Result<(), String> {
        let task = tokio::spawn(run_container(self.seeds.clone(), container.clone()));
        self.running.lock().unwrap().insert(container.clone(), task);
        Ok(())
    }

    fn stop(&self, container: &ContainerId) {
        if let Some(task) = self.running.lock().unwrap().remove(container) {
            task.abort();
        }
    }
}

/// Your container: joins the job, runs what it is assigned, answers every handshake.
async fn run_container(seeds: Vec<String>, me: ContainerId) {
    if let Err(error) = container_loop(seeds, me.clone()).await {
        eprintln!("[{me}] stopped: {error}");
    }
}

async fn container_loop(seeds: Vec<String>, me: ContainerId) -> Result<(), ClientError> {
    let client = Arc::new(ControlClient::connect(&seeds).await?);
    let options = SessionOptions {
        heartbeat_interval: Duration::from_millis(200),
        location: format!("task in pid {}", std::process::id()),
    };
    // No lag to report here; a real container reports each task's consumer lag.
    let session = ContainerSession::join(client, me.clone(), options, BTreeMap::new).await?;
    let mut commands = session.commands();
    while let Some(item) = commands.next().await {
        match item? {
            SubscriptionItem::Entry(entry) => match entry.command() {
                Command::AssignTask(assign) if assign.epoch == session.epoch() => {
                    println!(
                        "[{me}] runs {} ({} inputs)",
                        assign.task,
                        assign.inputs.len()
                    );
                    session.task_started(assign.task).await?;
                }
                Command::StopTask(stop) if stop.epoch == session.epoch() => {
                    println!("[{me}] stops {}", stop.task);
                    session.task_stopped(stop.task, None).await?;
                }
                Command::SchemaChange(_) | Command::ConfigChange(_) => {
                    session.ack(entry.offset).await?;
                }
                _ => {}
            },
            // Far behind the retained log: a real container would restart from the state.
            SubscriptionItem::Reset { offset, .. } => println!("[{me}] reset at {offset}"),
        }
    }
    Ok(())
}

/// The controller for one replica: your inputs, your launcher, the built-in policy.
fn controller(
    replica: &Replica,
    topic: Arc<TopicMetadata>,
    launcher: Arc<TaskLauncher>,
) -> Controller<ctrlog::server::ReplicaHandle> {
    let driver = JobDriver {
        inputs: Box::new(TopicPartitions(topic)),
        grouper: Box::new(GroupByPartition),
        // Two containers at least, four at most, one more when a container lags 10,000 behind.
        policy: Box::new(LagPolicy::new(2, 4, 10_000, 1_000, Duration::from_secs(30))),
        capacity: Capacity::Launched(launcher),
    };
    Controller::new(replica.clone_handle(), driver, ControllerConfig::default())
}

/// One coordinator of a deployment: this host's replica and controller, until Ctrl-C.
async fn run_one(id: u64, data: PathBuf, members: &str) -> anyhow::Result<()> {
    let members = parse_members(members)?;
    let me = members.get(&id).context("--members does not list --id")?;
    let config = ReplicaConfig {
        id,
        peer_addr: me.peer_addr.parse()?,
        client_addr: me.client_addr.parse()?,
        data_dir: data,
        initial_members: members.clone(),
        ..ReplicaConfig::default()
    };
    config.validate()?;
    let replica = Replica::start(config).await?;
    let seeds: Vec<String> = members.values().map(|m| m.client_addr.clone()).collect();
    let topic = Arc::new(TopicMetadata::default());
    topic.partitions.store(8, Ordering::Relaxed);
    let launcher = Arc::new(TaskLauncher {
        seeds,
        running: Mutex::default(),
    });
    controller(&replica, topic, launcher)
        .run(async {
            let _ = tokio::signal::ctrl_c().await;
        })
        .await;
    replica.shutdown().await;
    Ok(())
}

/// Three coordinators in this process, as three hosts would run them.
async fn run_three() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let mut replicas = Vec::new();
    for id in 1..=3 {
        let config = ReplicaConfig {
            id,
            data_dir: dir.path().join(format!("replica-{id}")),
            // Their ports are not known before they start, so no replica is given the founding
            // members; until one initialises the cluster, each hears only the other two.
            join_from: (1..=3).filter(|other| *other != id).collect(),
            ..ReplicaConfig::default()
        };
        replicas.push(Replica::start(config).await?);
    }
    // The ports were picked by the system; a deployment lists them in every replica's config.
    let members = replicas.iter().map(|r| (r.id(), r.member())).collect();
    replicas[0].initialize(members).await?;
    let seeds: Vec<String> = replicas.iter().map(|r| r.member().client_addr).collect();

    let topic = Arc::new(TopicMetadata::default());
    topic.partitions.store(2, Ordering::Relaxed);
    let launcher = Arc::new(TaskLauncher {
        seeds: seeds.clone(),
        running: Mutex::default(),
    });
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let controllers: Vec<_> = replicas
        .iter()
        .map(|replica| {
            let mut stopped = stopped.clone();
            let controller = controller(replica, topic.clone(), launcher.clone());
            tokio::spawn(controller.run(async move {
                let _ = stopped.wait_for(|s| *s).await;
            }))
        })
        .collect();

    let client = ControlClient::connect(&seeds).await?;
    let wait_until = |tasks: usize, containers: usize| {
        let client = &client;
        async move {
            let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
            loop {
                let at = client.state(0).await?;
                if settled(&at.state, tasks, containers) {
                    return Ok::<_, anyhow::Error>(at.offset);
                }
                anyhow::ensure!(
                    tokio::time::Instant::now() < deadline,
                    "the job did not settle with {tasks} tasks on {containers} containers"
                );
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    };
    let offset = wait_until(2, 2).await?;
    println!("2 partitions run on 2 containers (log offset {offset}); the topic grows to 4");
    topic.partitions.store(4, Ordering::Relaxed);
    let offset = wait_until(4, 2).await?;
    println!("4 partitions run on 2 containers (log offset {offset})");
    for (task, record) in client.state(0).await?.state.tasks() {
        let owner = record.phase.owner().map(|o| o.container.to_string());
        println!("  {task}: {}", owner.unwrap_or_default());
    }

    stop.send_replace(true);
    for controller in controllers {
        controller.await?;
    }
    let containers: Vec<ContainerId> = launcher.running.lock().unwrap().keys().cloned().collect();
    for container in containers {
        launcher.stop(&container);
    }
    for replica in replicas {
        replica.shutdown().await;
    }
    Ok(())
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let flag = |name: &str| {
        args.iter()
            .position(|a| a == name)
            .and_then(|i| args.get(i + 1))
            .cloned()
    };
    match (flag("--id"), flag("--data"), flag("--members")) {
        (Some(id), Some(data), Some(members)) => run_one(id.parse()?, data.into(), &members).await,
        (None, None, None) => run_three().await,
        _ => anyhow::bail!("give --id, --data and --members together, or none of them"),
    }
}
