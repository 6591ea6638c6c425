//! The job controller: SAMZA-237's "user code on the AM".
//!
//! It runs on every replica and acts only while that replica leads. Each tick it reads the
//! JobState, what the leader observes (heartbeats, the input source, the scaling policy) and
//! asks [`jobs::plan`](crate::jobs::plan) for the next steps, which it carries out as commands
//! in the log (and container launches and stops). Planning is level-triggered from JobState,
//! where every handshake in flight is recorded, so a new leader's controller resumes the old
//! one's work exactly; the only state kept here (launch deadlines, the policy's cooldown) is
//! advisory and rebuilt safely after a failover.
//!
//! Side effects follow the log. From vocabulary level 3 a launch is recorded
//! (`LaunchContainer`) and committed before the launcher is called, and a launch given up is
//! recorded (`CancelLaunch`) before its container is stopped; a container drained is stopped
//! only after its `DeregisterContainer` committed (at every level). A commit needs a quorum,
//! so a stale leader's controller carries nothing out; and a new leader finds every launch
//! that may be running in the JobState, waits for it to register until a launch deadline
//! counted from when it first saw it, then cancels it and launches again under the next
//! attempt: it neither repeats a launch nor forgets one. Below level 3 launches are not
//! recorded, as before (a new leader does not know of them).

mod inputs;
mod launcher;
#[cfg(test)]
mod tests;

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio::time::Instant;

pub use inputs::{InputSource, StaticInputs, WatchedFile, NO_INPUTS};
pub use launcher::{ContainerLauncher, LaunchSettings, ProcessLauncher, SettingsFn, STOP_GRACE};

use crate::jobs::plan::{owed_acks, plan, Action, Grouper, Observed, ScalingPolicy};
use crate::jobs::{ContainerStatus, JobState, ReportedLag, Session};
use crate::log::vocabulary::{kinds, LEVEL_LAUNCHES_RECORDED};
use crate::log::{
    CancelLaunch, Command, ContainerId, DesiredContainers, DesiredContainersV1, LaunchContainer,
    Offset,
};
use crate::wire::{ApiError, AppendAck};

/// What the controller needs from the replica it runs on. `server` implements it for its
/// `ReplicaHandle`; the unit tests below and the deterministic simulation implement it over
/// their own clusters. Keeping it small keeps the controller free of openraft.
///
/// Its clock is tokio's, so a controller on a paused clock (the simulation) runs in virtual
/// time.
pub trait ControlPlane: Send + Sync + 'static {
    /// Whether this replica is the leader now.
    fn is_leader(&self) -> bool;
    /// The JobState as of the applied offset, shared: the controller reads it every tick.
    fn job_state(&self) -> Arc<JobState>;
    /// Live sessions silent for longer than `timeout` (empty when not leading).
    fn overdue_sessions(&self, timeout: Duration) -> Vec<Session>;
    /// The lag each live container last reported (empty when not leading).
    fn reported_lag(&self) -> ReportedLag;
    /// Appends a command; answered once it is committed and applied.
    fn append(&self, command: Command) -> impl Future<Output = Result<AppendAck, ApiError>> + Send;
    /// Records how long one tick of the leading controller took (its reads, its plan, and
    /// the commits it waited for). Nothing by default.
    fn observe_tick(&self, _took: Duration) {}
}

/// How long the controller waits for one of its commands to be committed. A write that is
/// never answered must not stop the controller for good (openraft 0.9 can leave a write
/// unanswered, see `raft::proposer`, and a leader whose followers cannot take its messages
/// commits nothing while it keeps its lease, as `ctrlog chaos` once found). The controller
/// then re-plans from the state at its next tick, and every command it writes is checked
/// against that state, so one whose fate it never learned is at worst refused when written
/// again.
pub const APPEND_TIMEOUT: Duration = Duration::from_secs(5);

/// Timing and limits of the controller.
#[derive(Clone, Debug)]
pub struct ControllerConfig {
    /// How often it re-plans.
    pub tick: Duration,
    /// A container silent for longer is expired. Containers should stop work after about half
    /// of this without an accepted heartbeat (their lease).
    pub session_timeout: Duration,
    /// A launched container that has not registered by then is stopped and launched again.
    pub launch_timeout: Duration,
    /// Launches per container slot before the failure is reported and the slot given up.
    pub launch_attempts: u32,
    /// New containers are named `{prefix}-{n}`.
    pub container_prefix: String,
}

impl Default for ControllerConfig {
    fn default() -> Self {
        ControllerConfig {
            tick: Duration::from_millis(100),
            session_timeout: Duration::from_secs(6),
            launch_timeout: Duration::from_secs(15),
            launch_attempts: 3,
            container_prefix: "container".into(),
        }
    }
}

/// How many of its acknowledged commands a controller's report keeps: enough for a test or
/// the demo to check every one of a run, without a long-lived leader's report growing with
/// every command it ever wrote (ten thousand assignments at a job's start alone).
pub const APPENDED_KEPT: usize = 4096;

/// What the controller reports about itself, for operators and tests.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ControllerReport {
    /// Whether this replica's controller is the active one.
    pub leading: bool,
    /// Launched containers that have not registered yet.
    pub launching: BTreeSet<ContainerId>,
    /// Launches that never registered within the attempts allowed.
    pub failed_launches: Vec<ContainerId>,
    /// Open broadcasts and the containers that still owe an ack.
    pub owed_acks: BTreeMap<Offset, Vec<ContainerId>>,
    /// The last [`APPENDED_KEPT`] commands this controller appended and had acknowledged, with
    /// their offsets, oldest first.
    pub appended: VecDeque<(Offset, Command)>,
    /// Commands the log refused (the state moved under the plan; it re-plans).
    pub refused: u64,
}

/// A launch this controller waits on.
struct Launch {
    /// When it is given up if the container has not registered.
    deadline: Instant,
    attempt: u32,
    /// The offset of its `LaunchContainer` (level 3 on), which `CancelLaunch` names.
    recorded_at: Option<Offset>,
}

/// The pluggable parts a controller drives a job with.
pub struct JobDriver {
    /// Where the inputs come from.
    pub inputs: Box<dyn InputSource>,
    /// How inputs group into tasks.
    pub grouper: Box<dyn Grouper>,
    /// How many containers the job should have.
    pub policy: Box<dyn ScalingPolicy>,
    /// Who starts and stops containers.
    pub capacity: Capacity,
}

/// Who starts and stops the job's containers.
#[derive(Clone)]
pub enum Capacity {
    /// The controller, through this launcher: it launches what the desired count lacks, and
    /// drains and stops the newest containers beyond it.
    Launched(Arc<dyn ContainerLauncher>),
    /// An orchestrator outside ctrlog (a Kubernetes Deployment scaled on the
    /// `ctrlog_desired_containers` gauge): the controller records the desired count and
    /// spreads the tasks over whichever containers registered; it never launches, drains or
    /// stops one. Containers that leave (`ContainerSession::leave`) or fall silent give their
    /// tasks up to the others.
    Orchestrated,
}

impl Capacity {
    fn launcher(&self) -> Option<&Arc<dyn ContainerLauncher>> {
        match self {
            Capacity::Launched(launcher) => Some(launcher),
            Capacity::Orchestrated => None,
        }
    }
}

/// The controller of one replica. Build it, then [`Controller::run`] it.
pub struct Controller<P: ControlPlane> {
    plane: P,
    driver: JobDriver,
    config: ControllerConfig,
    report: watch::Sender<ControllerReport>,
    launching: BTreeMap<ContainerId, Launch>,
    /// The state's next offset and what was observed when the last plan came out empty.
    quiet: Option<(Offset, Observed)>,
}

impl<P: ControlPlane> Controller<P> {
    pub fn new(plane: P, driver: JobDriver, config: ControllerConfig) -> Controller<P> {
        Controller {
            plane,
            driver,
            config,
            report: watch::Sender::new(ControllerReport::default()),
            launching: BTreeMap::new(),
            quiet: None,
        }
    }

    /// Watches what the controller reports.
    pub fn report(&self) -> watch::Receiver<ControllerReport> {
        self.report.subscribe()
    }

    /// Runs until `shutdown` resolves: plans and acts each tick while this replica leads.
    pub async fn run(mut self, shutdown: impl Future<Output = ()>) {
        tokio::pin!(shutdown);
        let mut ticker = tokio::time::interval(self.config.tick);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            // Biased: shutdown first when both are ready, the same way every run (a seeded
            // simulation stops its controller on the tick's own schedule).
            tokio::select! {
                biased;
                _ = &mut shutdown => return,
                _ = ticker.tick() => {}
            }
            self.tick().await;
        }
    }

    /// One tick, timed for [`ControlPlane::observe_tick`] when this replica leads.
    async fn tick(&mut self) {
        let started = std::time::Instant::now();
        self.tick_once().await;
        if self.report.borrow().leading {
            self.plane.observe_tick(started.elapsed());
        }
    }

    /// Lets the launcher stop what the log ended, then stands down if this replica no
    /// longer leads, else reconciles once.
    async fn tick_once(&mut self) {
        let Some(launcher) = self.driver.capacity.launcher() else {
            return self.lead_or_stand_down(None).await;
        };
        // On every replica: a container this one launched is stopped once the log ends it,
        // whoever leads by then.
        let state = self.plane.job_state();
        launcher.stop_ended(&state);
        self.lead_or_stand_down(Some(state)).await;
    }

    /// Stands down if this replica no longer leads, else reconciles once, from `state` when
    /// the tick already read it.
    async fn lead_or_stand_down(&mut self, state: Option<Arc<JobState>>) {
        if !self.plane.is_leader() {
            if self.report.borrow().leading {
                tracing::info!("controller stands down: leadership lost");
                // Launches by this leader are the next leader's to notice (or retry).
                self.launching.clear();
                self.report.send_modify(|r| {
                    r.leading = false;
                    r.launching.clear();
                });
            }
            return;
        }
        let state = state.unwrap_or_else(|| self.plane.job_state());
        if !self.report.borrow().leading {
            tracing::info!("controller active: this replica leads");
            self.report.send_modify(|r| r.leading = true);
            if state.desired_containers().is_some() {
                (self.driver.policy).took_over(Instant::now().into_std());
            }
        }
        self.reconcile(state).await;
    }

    /// One round from `state`, read once for it: launch bookkeeping and the report, the
    /// desired count, then the plan.
    async fn reconcile(&mut self, state: Arc<JobState>) {
        let now = Instant::now();
        if records_launches(&state) {
            self.follow_recorded_launches(&state, now);
        } else {
            self.launching
                .retain(|container, _| state.live_session(container).is_none());
        }
        if !self.retry_overdue_launches(&state, now).await {
            return; // the state moved under the retry: re-plan next tick
        }
        // The state read for this round already holds everything the last round appended.
        self.report.send_modify(|r| {
            r.owed_acks = owed_acks(&state);
            r.launching = self.launching.keys().cloned().collect();
        });

        let inputs = match self.driver.inputs.inputs() {
            Ok(inputs) => inputs,
            Err(error) => {
                tracing::warn!(%error, "the input source failed; waiting");
                return;
            }
        };
        let recorded = state.desired_containers().map(|d| d.count);
        let current = recorded.unwrap_or(0);
        let lag = self.plane.reported_lag();
        let total_lag = lag.total;
        let live = state.live_epochs().count();
        // A new leader knows no lag until every container has heartbeated to it; deciding on
        // that silence would scale in and straight back out after every failover.
        let desired = if lag.containers < live && recorded.is_some() {
            current
        } else {
            self.driver
                .policy
                .desired(current, total_lag, now.into_std())
        };
        if recorded != Some(desired) {
            let reason = format!("total lag {total_lag} over {current} containers");
            let command = if state.level() >= 2 {
                Command::DesiredContainers(DesiredContainers {
                    count: desired,
                    reason,
                })
            } else {
                Command::DesiredContainersV1(DesiredContainersV1 { count: desired })
            };
            tracing::info!(from = current, to = desired, total_lag, "scaling");
            self.append(command).await;
            return;
        }
        let observed = Observed {
            inputs,
            overdue: self.plane.overdue_sessions(self.config.session_timeout),
            launching: self.launching.len(),
            desired_containers: desired,
            orchestrated: self.driver.capacity.launcher().is_none(),
        };
        // The plan is a function of the state and of what is observed alone, and the state
        // changes only with an offset taken: a settled job that has not moved since the last
        // empty plan is not planned again (20 ms a tick for ten thousand containers).
        let quiet = (state.next_offset(), observed);
        if self.quiet.as_ref() == Some(&quiet) {
            return;
        }
        let (_, observed) = &quiet;
        let actions = plan(&state, observed, self.driver.grouper.as_ref());
        self.quiet = actions.is_empty().then_some(quiet);
        for action in actions {
            let done = match action {
                Action::Append(command) => self.append(command).await,
                Action::Launch(count) => {
                    let mut launched = true;
                    for _ in 0..count {
                        let name = self.next_name(&state);
                        launched = self.launch(&state, name, 1, now).await;
                        if !launched {
                            break;
                        }
                    }
                    launched
                }
                Action::Stop(container) => {
                    if let Some(launcher) = self.driver.capacity.launcher() {
                        launcher.stop(&container);
                    }
                    true
                }
            };
            if !done {
                break; // the state moved under the plan: re-plan next tick
            }
        }
    }

    /// Appends one command; false if it was refused or failed.
    async fn append(&mut self, command: Command) -> bool {
        self.append_at(command).await.is_some()
    }

    /// Appends one command; its offset, or `None` if it was refused, failed or went
    /// unanswered for [`APPEND_TIMEOUT`].
    async fn append_at(&mut self, command: Command) -> Option<Offset> {
        let kind = command.kind_version().0;
        let answer = tokio::time::timeout(APPEND_TIMEOUT, self.plane.append(command.clone()))
            .await
            .unwrap_or_else(|_| {
                tracing::warn!(?command, "a command went unanswered; re-planning");
                Err(ApiError::Unavailable(format!(
                    "no answer within {APPEND_TIMEOUT:?}"
                )))
            });
        match answer {
            Ok(ack) => {
                if kind == kinds::EXPIRE_CONTAINER {
                    tracing::warn!(offset = ack.offset, ?command, "expired a silent container");
                } else {
                    tracing::debug!(offset = ack.offset, ?command, "appended");
                }
                self.report.send_modify(|r| {
                    if r.appended.len() == APPENDED_KEPT {
                        r.appended.pop_front();
                    }
                    r.appended.push_back((ack.offset, command));
                });
                Some(ack.offset)
            }
            Err(error) => {
                tracing::info!(%error, ?command, "command not appended");
                self.report.send_modify(|r| r.refused += 1);
                None
            }
        }
    }

    fn next_name(&self, state: &JobState) -> ContainerId {
        let prefix = format!("{}-", self.config.container_prefix);
        let report = self.report.borrow();
        let used = state
            .containers()
            .keys()
            .chain(self.launching.keys())
            .chain(report.failed_launches.iter())
            .filter_map(|c| c.as_str().strip_prefix(&prefix)?.parse::<u64>().ok())
            .max()
            .unwrap_or(0);
        ContainerId::new(format!("{prefix}{}", used + 1)).expect("a valid container name")
    }

    /// Launches a container, first recording the launch when the level asks for it; false if
    /// the record was refused or leadership was lost before the launch could be carried out
    /// (the next leader finds the record and waits for it: see the module's docs).
    async fn launch(
        &mut self,
        state: &JobState,
        container: ContainerId,
        attempt: u32,
        now: Instant,
    ) -> bool {
        let Some(launcher) = self.driver.capacity.launcher().cloned() else {
            return false; // the plan launches nothing for an orchestrated job
        };
        let recorded_at = if records_launches(state) {
            let record = Command::LaunchContainer(LaunchContainer {
                container: container.clone(),
                attempt,
            });
            let Some(offset) = self.append_at(record).await else {
                return false;
            };
            if !self.plane.is_leader() {
                tracing::info!(%container, "leadership lost after recording a launch; not launching");
                return false;
            }
            Some(offset)
        } else {
            None
        };
        tracing::info!(%container, attempt, "launching a container");
        if let Err(error) = launcher.launch(&container) {
            tracing::error!(%container, %error, "launch failed");
        }
        self.launching.insert(
            container,
            Launch {
                deadline: now + self.config.launch_timeout,
                attempt,
                recorded_at,
            },
        );
        true
    }

    /// Waits on the launches the log records as in flight: those a previous leader recorded
    /// are waited on from now (whether it carried them out is unknown, so they get a whole
    /// launch timeout to register), and those that registered or were cancelled are done.
    /// A launch this controller made unrecorded, before the level was raised, is waited on
    /// until its container registers, as below level 3.
    fn follow_recorded_launches(&mut self, state: &JobState, now: Instant) {
        let recorded: BTreeMap<&ContainerId, (Offset, u32)> = state
            .containers()
            .iter()
            .filter_map(|(container, record)| match record.status {
                ContainerStatus::Launching { attempt } => {
                    Some((container, (record.epoch, attempt)))
                }
                _ => None,
            })
            .collect();
        self.launching.retain(|container, launch| {
            match (launch.recorded_at, recorded.get(container)) {
                (Some(at), Some((recorded_at, _))) => at == *recorded_at,
                (Some(_), None) => false,
                (None, _) => state.live_session(container).is_none(),
            }
        });
        for (container, (at, attempt)) in recorded {
            self.launching
                .entry(container.clone())
                .or_insert_with(|| Launch {
                    deadline: now + self.config.launch_timeout,
                    attempt,
                    recorded_at: Some(at),
                });
        }
    }

    /// Launches that did not register in time are stopped, and retried under a new name until
    /// the attempts run out; then they are reported. A recorded launch is cancelled in the log
    /// before its container is stopped. False if a record was refused (re-plan next tick).
    async fn retry_overdue_launches(&mut self, state: &JobState, now: Instant) -> bool {
        let overdue: Vec<(ContainerId, u32, Option<Offset>)> = self
            .launching
            .iter()
            .filter(|(_, launch)| launch.deadline <= now)
            .map(|(c, launch)| (c.clone(), launch.attempt, launch.recorded_at))
            .collect();
        for (container, attempt, recorded_at) in overdue {
            if let Some(launch) = recorded_at {
                let cancel = Command::CancelLaunch(CancelLaunch {
                    container: container.clone(),
                    launch,
                });
                if self.append_at(cancel).await.is_none() {
                    return false;
                }
            }
            self.launching.remove(&container);
            let Some(launcher) = self.driver.capacity.launcher() else {
                // Recorded while the job launched its own containers: the orchestrator that
                // owns them now starts its own.
                continue;
            };
            launcher.stop(&container);
            if attempt < self.config.launch_attempts {
                tracing::warn!(%container, attempt, "launch never registered; retrying");
                let name = self.next_name(state);
                if !self.launch(state, name, attempt + 1, now).await {
                    return false;
                }
            } else {
                tracing::error!(%container, attempt, "launch never registered; giving up");
                self.report
                    .send_modify(|r| r.failed_launches.push(container.clone()));
            }
        }
        true
    }
}

/// Whether the recorded level has the controller record its launches
/// ([`LEVEL_LAUNCHES_RECORDED`]).
fn records_launches(state: &JobState) -> bool {
    state.level() >= LEVEL_LAUNCHES_RECORDED
}
