//! A simulated container: what `ctrlog container` runs and the launchers start
//! ([`InProcessLauncher`] runs them as tasks of this process). It joins the
//! job, "consumes" the inputs of the tasks it is given, reports their lag, obeys every command
//! addressed to it, and writes what it believes it runs to a report file, so that the demo and
//! the tests can check from the containers' own words that no task ever ran twice at once.

use std::collections::{BTreeMap, BTreeSet};
use std::io::Write;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use futures::StreamExt;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

use crate::client::{
    ClientError, ClientOptions, ContainerSession, ControlClient, SessionOptions, SubscriptionItem,
};
use crate::controller::ContainerLauncher;
use crate::jobs::TaskPhase;
use crate::log::{Command, ContainerId, Epoch, TaskId};
use crate::tools::chaos::checker::TaskEvent;

/// How a simulated container behaves.
#[derive(Clone, Debug)]
pub struct SimOptions {
    pub heartbeat_interval: Duration,
    /// Work stops when no heartbeat was accepted for this long; keep it below the
    /// controller's session timeout, so that a container stops before it can be expired.
    pub lease: Duration,
    /// A file holding the lag each running task reports (one number); 0 when absent.
    pub lag_file: Option<PathBuf>,
    /// Where to append what this container runs, one JSON [`TaskEvent`] per line.
    pub report_file: Option<PathBuf>,
    /// How long a stopping task takes to flush its state before the container says it
    /// stopped (it stops processing at once).
    pub stop_delay: Duration,
    /// How it connects: TLS and credentials.
    pub client: ClientOptions,
    /// Lag it reports besides its own tasks', for tasks it does not own (another
    /// container's, or none at all): a container that lies, which the leader must not
    /// believe. Empty for an honest one; shared, so that a test can start lying mid-run.
    pub claimed_lag: Arc<Mutex<BTreeMap<TaskId, u64>>>,
}

impl Default for SimOptions {
    fn default() -> Self {
        SimOptions {
            heartbeat_interval: Duration::from_millis(500),
            lease: Duration::from_secs(3),
            lag_file: None,
            report_file: None,
            stop_delay: Duration::ZERO,
            client: ClientOptions::default(),
            claimed_lag: Arc::default(),
        }
    }
}

struct Worker {
    container: ContainerId,
    epoch: Epoch,
    report_file: Option<PathBuf>,
    /// Tasks this container owns.
    owned: BTreeSet<TaskId>,
    /// Whether its lease is valid, i.e. it actually runs what it owns.
    working: bool,
}

impl Worker {
    fn report(&self, task: &TaskId, running: bool) {
        let Some(path) = &self.report_file else {
            return;
        };
        let event = TaskEvent {
            container: self.container.to_string(),
            epoch: self.epoch,
            task: task.to_string(),
            running,
            at_us: SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0, |d| d.as_micros() as u64),
        };
        let line = format!("{}\n", serde_json::to_string(&event).expect("plain data"));
        // One short O_APPEND write per event, so concurrent containers do not interleave.
        let written = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .and_then(|mut f| f.write_all(line.as_bytes()));
        if let Err(error) = written {
            tracing::warn!(%error, "could not write the container report");
        }
    }

    fn start(&mut self, task: TaskId) {
        if self.working {
            self.report(&task, true);
        }
        self.owned.insert(task);
    }

    fn stop(&mut self, task: &TaskId) {
        if self.owned.remove(task) && self.working {
            self.report(task, false);
        }
    }

    fn set_working(&mut self, working: bool) {
        if working != self.working {
            self.working = working;
            for task in &self.owned {
                self.report(task, working);
            }
        }
    }

    fn stop_all(&mut self) {
        self.set_working(false);
        self.owned.clear();
    }
}

fn read_lag(path: &Option<PathBuf>) -> u64 {
    path.as_ref()
        .and_then(|p| std::fs::read_to_string(p).ok())
        .and_then(|text| text.trim().parse().ok())
        .unwrap_or(0)
}

/// Runs a simulated container `container` against the cluster at `seeds` until `shutdown`
/// resolves, it is fenced, or it is deregistered.
pub async fn run_simulated_container(
    seeds: Vec<String>,
    container: ContainerId,
    options: SimOptions,
    shutdown: impl std::future::Future<Output = ()>,
) -> Result<(), ClientError> {
    let client = Arc::new(ControlClient::connect_with(&seeds, options.client.clone()).await?);
    let owned_now: Arc<Mutex<BTreeSet<TaskId>>> = Arc::default();
    let lag = {
        let (owned_now, lag_file) = (owned_now.clone(), options.lag_file.clone());
        let claimed = options.claimed_lag.clone();
        move || {
            let per_task = read_lag(&lag_file);
            let owned = owned_now.lock().expect("never poisoned");
            let mut lag: BTreeMap<_, _> = owned.iter().map(|t| (t.clone(), per_task)).collect();
            for (task, claimed) in claimed.lock().expect("never poisoned").iter() {
                lag.entry(task.clone()).or_insert(*claimed);
            }
            lag
        }
    };
    let session_options = SessionOptions {
        heartbeat_interval: options.heartbeat_interval,
        location: format!("pid {}", std::process::id()),
    };
    let session = ContainerSession::join(client, container.clone(), session_options, lag).await?;
    // Never locked across an await.
    let shared_worker = Mutex::new(Worker {
        container: container.clone(),
        epoch: session.epoch(),
        report_file: options.report_file.clone(),
        owned: BTreeSet::new(),
        working: true,
    });
    let worker = || shared_worker.lock().expect("never poisoned");
    // The lease is checked on a clock of its own, not between commands: an answer may wait a
    // long time on a leader this container cannot reach (until the client gives up), and
    // work must stop when the lease lapses whatever the container is waiting on.
    let watchdog = async {
        let mut tick = tokio::time::interval(LEASE_CHECK_INTERVAL);
        loop {
            tick.tick().await;
            worker().set_working(session.heartbeat_age() < options.lease);
        }
    };
    let epoch = session.epoch();
    let mut commands = session.commands();
    tokio::pin!(shutdown);
    // Asked to stop (SIGTERM from a launcher or an orchestrator scaling in): leave the job
    // after stopping work, so that the tasks move now rather than after the session timeout.
    let mut leave = false;
    let obey = async {
        loop {
            tokio::select! {
                _ = &mut shutdown => {
                    leave = true;
                    break Ok(());
                }
                refusal = session.fenced() => {
                    tracing::warn!(%container, %refusal, "fenced; stopping all work");
                    break Ok(());
                }
                item = commands.next() => {
                    let entry = match item {
                        Some(Ok(SubscriptionItem::Entry(entry))) => entry,
                        Some(Ok(SubscriptionItem::Reset { state, .. })) => {
                            // Far behind: do exactly what the state says this session owes.
                            worker().stop_all();
                            let mine = |phase: &TaskPhase| {
                                phase.owner().is_some_and(|o| o.container == container && o.epoch == epoch)
                            };
                            let mut answered = Ok(());
                            for (task, record) in state.tasks().iter().filter(|(_, r)| mine(&r.phase)) {
                                answered = match record.phase {
                                    TaskPhase::Starting { .. } => {
                                        worker().start(task.clone());
                                        session.task_started(task.clone()).await.map(drop)
                                    }
                                    TaskPhase::Stopping { .. } => {
                                        session.task_stopped(task.clone(), None).await.map(drop)
                                    }
                                    _ => {
                                        worker().start(task.clone());
                                        Ok(())
                                    }
                                };
                                if answered.is_err() {
                                    break;
                                }
                            }
                            *owned_now.lock().expect("never poisoned") = worker().owned.clone();
                            match answered {
                                Ok(()) => continue,
                                Err(error) => break Err(error),
                            }
                        }
                        Some(Err(error)) => {
                            tracing::warn!(%error, "subscription trouble; retrying");
                            continue;
                        }
                        None => break Ok(()),
                    };
                    let answered = match entry.command() {
                        Command::AssignTask(assign) if assign.epoch == epoch => {
                            worker().start(assign.task.clone());
                            session.task_started(assign.task).await.map(drop)
                        }
                        Command::StopTask(stop) if stop.epoch == epoch => {
                            // Stop first, then say so: the next owner starts only after this.
                            worker().stop(&stop.task);
                            tokio::time::sleep(options.stop_delay).await;
                            let checkpoint = format!("stopped at offset {}", entry.offset).into_bytes();
                            session.task_stopped(stop.task, Some(checkpoint)).await.map(drop)
                        }
                        Command::SchemaChange(_) | Command::ConfigChange(_) => {
                            session.ack(entry.offset).await.map(drop)
                        }
                        Command::ExpireContainer(c) if c.epoch == epoch => break Ok(()),
                        Command::DeregisterContainer(c) if c.epoch == epoch => break Ok(()),
                        _ => Ok(()),
                    };
                    *owned_now.lock().expect("never poisoned") = worker().owned.clone();
                    if let Err(error) = answered {
                        tracing::warn!(%container, %error, "answer refused; stopping");
                        break Err(error);
                    }
                }
            }
        }
    };
    let result = tokio::select! {
        result = obey => result,
        _ = watchdog => unreachable!("the watchdog never ends"),
    };
    worker().stop_all();
    if leave {
        // Refused if the controller deregistered it first (a drain), which is as good.
        match tokio::time::timeout(LEAVE_TIMEOUT, session.leave()).await {
            Ok(Ok(ack)) => tracing::info!(%container, offset = ack.offset, "left the job"),
            Ok(Err(error)) => tracing::info!(%container, %error, "not left"),
            Err(_) => tracing::warn!(%container, "leaving timed out; the session will expire"),
        }
    }
    result
}

/// How often a container checks its lease.
const LEASE_CHECK_INTERVAL: Duration = Duration::from_millis(50);

/// How long a container asked to stop tries to leave the job before it exits anyway; within
/// the launchers' grace period ([`STOP_GRACE`](crate::controller::STOP_GRACE)).
const LEAVE_TIMEOUT: Duration = Duration::from_secs(3);

/// A container running as a task: how to ask it to stop, and the task.
type Running = (oneshot::Sender<()>, JoinHandle<()>);

/// Runs simulated containers as tasks in this process.
pub struct InProcessLauncher {
    seeds: Vec<String>,
    options: SimOptions,
    running: Mutex<BTreeMap<ContainerId, Running>>,
}

impl InProcessLauncher {
    pub fn new(seeds: Vec<String>, options: SimOptions) -> InProcessLauncher {
        InProcessLauncher {
            seeds,
            options,
            running: Mutex::new(BTreeMap::new()),
        }
    }

    /// Kills a container without a word, like a crashed process: its heartbeats stop.
    pub fn crash(&self, container: &ContainerId) {
        if let Some((_, task)) = self.lock().remove(container) {
            task.abort();
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<ContainerId, Running>> {
        self.running.lock().expect("never poisoned")
    }
}

impl ContainerLauncher for InProcessLauncher {
    fn launch(&self, container: &ContainerId) -> Result<(), String> {
        let (stop, stopped) = oneshot::channel();
        let run = run_simulated_container(
            self.seeds.clone(),
            container.clone(),
            self.options.clone(),
            async move {
                let _ = stopped.await;
            },
        );
        let name = container.clone();
        let task = tokio::spawn(async move {
            if let Err(error) = run.await {
                tracing::warn!(container = %name, %error, "simulated container ended");
            }
        });
        self.lock().insert(container.clone(), (stop, task));
        Ok(())
    }

    fn stop(&self, container: &ContainerId) {
        if let Some((stop, _)) = self.lock().remove(container) {
            let _ = stop.send(());
        }
    }
}

impl Drop for InProcessLauncher {
    fn drop(&mut self) {
        for (_, (_, task)) in std::mem::take(&mut *self.lock()) {
            task.abort();
        }
    }
}
