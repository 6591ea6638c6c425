//! The controller driven tick by tick against a fake [`ControlPlane`]: a JobState folded in
//! memory, a leadership flag, and the heartbeat observations a leader would have. The tests
//! play the containers themselves, writing their registrations and answers into the same
//! state, so each scenario reads as the log it produces. The real cluster runs the same
//! controller in `tests/controller.rs`; the deterministic simulation runs it too.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use super::*;
use crate::jobs::plan::GroupByPartition;
use crate::jobs::{Outcome, ReportedLag, TaskPhase};
use crate::log::*;

/// What the fake replica holds: the folded log, whether it leads, what its heartbeat table
/// would say, and every command it accepted, in order.
#[derive(Default)]
struct Replica {
    job: JobState,
    leading: bool,
    overdue: Vec<Session>,
    lag: BTreeMap<ContainerId, u64>,
    log: Vec<Command>,
    /// Leadership moves away right after the next launch record commits.
    lose_leadership_after_launch_record: bool,
    /// The next append is never answered (nor written).
    leave_next_append_unanswered: bool,
}

/// A [`ControlPlane`] over an in-memory JobState. Clones share the replica, so a second
/// controller on the same plane plays the next leader reading the same log.
#[derive(Clone, Default)]
struct FakePlane(Arc<Mutex<Replica>>);

impl FakePlane {
    fn leading() -> FakePlane {
        let plane = FakePlane::default();
        plane.lock().leading = true;
        plane
    }

    fn lock(&self) -> MutexGuard<'_, Replica> {
        self.0.lock().expect("never poisoned")
    }

    /// Appends as any writer would; the job model decides.
    fn write(&self, command: Command) -> Outcome {
        let mut replica = self.lock();
        let target = command.default_target();
        let outcome = replica
            .job
            .apply(None, &target, &command.clone().into_frame(), 0);
        if matches!(outcome, Outcome::Appended { .. }) {
            replica.log.push(command);
        }
        outcome
    }

    /// A container's own command, which must be accepted; returns its offset.
    #[track_caller]
    fn container_says(&self, command: Command) -> Offset {
        match self.write(command) {
            Outcome::Appended { offset } => offset,
            other => panic!("a container's command was refused: {other:?}"),
        }
    }

    fn register(&self, name: &str) -> Session {
        let epoch = self.container_says(Command::RegisterContainer(RegisterContainer {
            container: c(name),
            location: "test".into(),
        }));
        self.lock().lag.insert(c(name), 0);
        Session {
            container: c(name),
            epoch,
        }
    }

    /// Every container answers what it was asked: started for each assignment, stopped for
    /// each stop, as containers that obey at once would.
    fn containers_answer(&self) {
        let owed: Vec<Command> = self
            .lock()
            .job
            .tasks()
            .iter()
            .filter_map(|(task, record)| match &record.phase {
                TaskPhase::Starting { owner, .. } => Some(Command::TaskStarted(TaskStarted {
                    task: task.clone(),
                    container: owner.container.clone(),
                    epoch: owner.epoch,
                })),
                TaskPhase::Stopping { owner, .. } => Some(Command::TaskStopped(TaskStopped {
                    task: task.clone(),
                    container: owner.container.clone(),
                    epoch: owner.epoch,
                    checkpoint: None,
                })),
                _ => None,
            })
            .collect();
        for answer in owed {
            self.container_says(answer);
        }
    }

    fn job(&self) -> JobState {
        self.lock().job.clone()
    }

    /// The commands accepted from `from` on (an index into the log), as the controller wrote
    /// them and the containers answered.
    fn log_since(&self, from: usize) -> Vec<Command> {
        self.lock().log[from..].to_vec()
    }

    fn log_len(&self) -> usize {
        self.lock().log.len()
    }
}

impl ControlPlane for FakePlane {
    fn is_leader(&self) -> bool {
        self.lock().leading
    }

    fn job_state(&self) -> Arc<JobState> {
        Arc::new(self.job())
    }

    fn overdue_sessions(&self, _timeout: Duration) -> Vec<Session> {
        let replica = self.lock();
        if replica.leading {
            replica.overdue.clone()
        } else {
            Vec::new()
        }
    }

    fn reported_lag(&self) -> ReportedLag {
        let replica = self.lock();
        if replica.leading {
            ReportedLag {
                containers: replica.lag.len(),
                total: replica.lag.values().sum(),
            }
        } else {
            ReportedLag::default()
        }
    }

    async fn append(&self, command: Command) -> Result<AppendAck, ApiError> {
        if std::mem::take(&mut self.lock().leave_next_append_unanswered) {
            return std::future::pending().await;
        }
        if !self.is_leader() {
            return Err(ApiError::NotLeader {
                leader_id: None,
                leader_client_addr: None,
            });
        }
        let launch_record = matches!(command, Command::LaunchContainer(_));
        match self.write(command) {
            Outcome::Appended { offset } => {
                let mut replica = self.lock();
                if launch_record && replica.lose_leadership_after_launch_record {
                    replica.lose_leadership_after_launch_record = false;
                    replica.leading = false;
                }
                Ok(AppendAck {
                    offset,
                    duplicate: false,
                })
            }
            Outcome::Rejected(rejection) => Err(rejection.into()),
            other => panic!("no producer pairs here: {other:?}"),
        }
    }
}

/// A container count the test sets by hand.
#[derive(Clone, Default)]
struct Wanted(Arc<AtomicU32>);

impl Wanted {
    fn set(&self, count: u32) {
        self.0.store(count, Ordering::Relaxed);
    }
}

impl ScalingPolicy for Wanted {
    fn desired(&mut self, _current: u32, _total_lag: u64, _now: Instant) -> u32 {
        self.0.load(Ordering::Relaxed)
    }
}

/// Remembers what it was asked to launch and stop; the test registers the containers.
#[derive(Default)]
struct Launches {
    launched: Mutex<Vec<ContainerId>>,
    stopped: Mutex<Vec<ContainerId>>,
}

impl ContainerLauncher for Launches {
    fn launch(&self, container: &ContainerId) -> Result<(), String> {
        self.launched.lock().unwrap().push(container.clone());
        Ok(())
    }

    fn stop(&self, container: &ContainerId) {
        self.stopped.lock().unwrap().push(container.clone());
    }
}

/// A launcher that notes, for each launch, whether the log already recorded it as in flight
/// (a `LaunchContainer` committed before the call).
struct RecordCheckingLauncher {
    plane: FakePlane,
    launches: Launches,
    recorded_first: Mutex<Vec<bool>>,
}

impl ContainerLauncher for RecordCheckingLauncher {
    fn launch(&self, container: &ContainerId) -> Result<(), String> {
        let recorded = self
            .plane
            .job()
            .containers()
            .get(container)
            .map(|r| r.status);
        self.recorded_first.lock().unwrap().push(matches!(
            recorded,
            Some(crate::jobs::ContainerStatus::Launching { .. })
        ));
        self.launches.launch(container)
    }

    fn stop(&self, container: &ContainerId) {
        self.launches.stop(container)
    }
}

fn c(name: &str) -> ContainerId {
    ContainerId::new(name).unwrap()
}

fn inputs(partitions: std::ops::Range<u32>) -> BTreeSet<Input> {
    partitions
        .map(|p| Input::new("kafka", "events", p).unwrap())
        .collect()
}

fn controller(
    plane: &FakePlane,
    partitions: u32,
    wanted: &Wanted,
    launches: &Arc<Launches>,
) -> Controller<FakePlane> {
    controller_with(plane, partitions, wanted, launches.clone())
}

fn controller_with(
    plane: &FakePlane,
    partitions: u32,
    wanted: &Wanted,
    launcher: Arc<dyn ContainerLauncher>,
) -> Controller<FakePlane> {
    Controller::new(
        plane.clone(),
        JobDriver {
            inputs: Box::new(StaticInputs::new(inputs(0..partitions))),
            grouper: Box::new(GroupByPartition),
            policy: Box::new(wanted.clone()),
            capacity: Capacity::Launched(launcher),
        },
        ControllerConfig::default(),
    )
}

/// The tasks each container owns, by name.
fn owners(job: &JobState) -> BTreeMap<String, Vec<String>> {
    let mut owners: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for (task, record) in job.tasks() {
        if let Some(owner) = record.phase.owner() {
            owners
                .entry(owner.container.to_string())
                .or_default()
                .push(task.to_string());
        }
    }
    owners
}

fn count(commands: &[Command], kind: fn(&Command) -> bool) -> usize {
    commands.iter().filter(|c| kind(c)).count()
}

/// Ticks, with the containers answering after each, until the controller writes nothing
/// more; returns how many ticks that took. Bounded: a controller that never settles fails.
async fn settle(controller: &mut Controller<FakePlane>, plane: &FakePlane) -> usize {
    for ticks in 1..=50 {
        let before = plane.log_len();
        controller.tick().await;
        plane.containers_answer();
        if plane.log_len() == before {
            return ticks;
        }
    }
    panic!("the controller never settled: {:?}", plane.log_since(0));
}

/// Goal: a job that starts empty records its container count, adds its inputs, launches the
/// containers, and once they register gives every task an owner, evenly.
/// Steps: 4 inputs, 2 containers wanted; tick; register what was launched; settle.
#[tokio::test]
async fn an_empty_job_records_its_count_launches_and_assigns_every_input() {
    let (plane, wanted, launches) = (FakePlane::leading(), Wanted::default(), Arc::default());
    wanted.set(2);
    let mut controller = controller(&plane, 4, &wanted, &launches);

    settle(&mut controller, &plane).await;
    let job = plane.job();
    assert_eq!(job.desired_containers().map(|d| d.count), Some(2));
    assert_eq!(job.inputs().len(), 4);
    assert_eq!(
        *launches.launched.lock().unwrap(),
        vec![c("container-1"), c("container-2")]
    );
    assert!(owners(&job).is_empty(), "nobody to assign to yet");

    plane.register("container-1");
    plane.register("container-2");
    settle(&mut controller, &plane).await;
    let owners = owners(&plane.job());
    assert_eq!(owners.len(), 2, "{owners:?}");
    assert!(owners.values().all(|tasks| tasks.len() == 2), "{owners:?}");
    assert!(controller.report().borrow().leading);
}

/// Goal: a command that is never answered does not stop the controller: it gives the
/// command up after `APPEND_TIMEOUT` and re-plans from the state at its next tick. Steps:
/// the first append (the container count) is left unanswered; a tick ends, counting it
/// refused; the job then settles as if nothing happened. On a paused clock.
#[tokio::test(start_paused = true)]
async fn a_command_never_answered_is_given_up_and_planned_again() {
    let (plane, wanted, launches) = (FakePlane::leading(), Wanted::default(), Arc::default());
    wanted.set(1);
    let mut controller = controller(&plane, 2, &wanted, &launches);
    plane.lock().leave_next_append_unanswered = true;
    let started = tokio::time::Instant::now();
    controller.tick().await;
    assert_eq!(started.elapsed(), APPEND_TIMEOUT);
    assert_eq!(controller.report().borrow().refused, 1);
    assert_eq!(plane.log_len(), 0);

    settle(&mut controller, &plane).await;
    plane.register("container-1");
    settle(&mut controller, &plane).await;
    let job = plane.job();
    assert_eq!(job.desired_containers().map(|d| d.count), Some(1));
    assert_eq!(owners(&job).get("container-1").map(Vec::len), Some(2));
}

/// Goal: the scaling cooldown survives a failover: a new leader that finds a count in the
/// log makes no lag-driven change for one cooldown after it takes over, since the last change
/// may have been a moment before. Steps: leader A scales 2 → 3 on a high lag; B takes over on
/// the same log with the lag still high; B's ticks leave 3. 3d7237e's B scaled again at once.
#[tokio::test]
async fn a_new_leader_keeps_the_scaling_cooldown() {
    use crate::jobs::plan::LagPolicy;
    let plane = FakePlane::leading();
    plane.register("container-1");
    plane.register("container-2");
    plane.lock().lag = [(c("container-1"), 500), (c("container-2"), 500)].into();
    let lag_policy = || Box::new(LagPolicy::new(2, 8, 100, 10, Duration::from_secs(60)));
    let with_policy = |plane: &FakePlane| {
        Controller::new(
            plane.clone(),
            JobDriver {
                inputs: Box::new(StaticInputs::new(inputs(0..4))),
                grouper: Box::new(GroupByPartition),
                policy: lag_policy(),
                capacity: Capacity::Orchestrated,
            },
            ControllerConfig::default(),
        )
    };
    let desired = |plane: &FakePlane| plane.job().desired_containers().map(|d| d.count);
    let mut a = with_policy(&plane);
    a.tick().await; // records 2, the least it wants
    a.tick().await; // 2 → 3 on the lag
    assert_eq!(desired(&plane), Some(3));

    plane.lock().leading = false;
    a.tick().await;
    plane.lock().leading = true;
    let mut b = with_policy(&plane);
    for _ in 0..5 {
        b.tick().await;
    }
    assert_eq!(desired(&plane), Some(3), "no change within the cooldown");
}

/// Goal: scaling out moves work with the handshake in the log: stop, the old owner's
/// acknowledgement, then start on the new container, and never an assignment before the stop
/// was acknowledged.
/// Steps: 4 tasks on 2 containers; want 3; register the launched one; tick with the
/// containers silent, check the task waits; let them answer; settle; check the order.
#[tokio::test]
async fn scaling_out_moves_a_task_only_after_its_stop_is_acknowledged() {
    let (plane, wanted, launches) = (FakePlane::leading(), Wanted::default(), Arc::default());
    wanted.set(2);
    plane.register("container-1");
    plane.register("container-2");
    let mut controller = controller(&plane, 4, &wanted, &launches);
    settle(&mut controller, &plane).await;

    wanted.set(3);
    controller.tick().await; // records 3
    controller.tick().await; // launches one
    assert_eq!(*launches.launched.lock().unwrap(), vec![c("container-3")]);
    plane.register("container-3");
    let mark = plane.log_len();
    controller.tick().await; // asks one container to stop a task
    let stops: Vec<StopTask> = plane
        .log_since(mark)
        .into_iter()
        .filter_map(|c| match c {
            Command::StopTask(stop) => Some(stop),
            _ => None,
        })
        .collect();
    assert_eq!(
        stops.len(),
        1,
        "one move at a time: {:?}",
        plane.log_since(mark)
    );
    let moved = stops[0].task.clone();

    // Until the old owner answers, the task is assigned to nobody else.
    for _ in 0..3 {
        controller.tick().await;
    }
    assert!(
        !plane
            .log_since(mark)
            .iter()
            .any(|c| matches!(c, Command::AssignTask(a) if a.task == moved)),
        "assigned before the stop was acknowledged"
    );

    settle(&mut controller, &plane).await;
    let log = plane.log_since(mark);
    let position = |wanted: fn(&Command, &TaskId) -> bool| {
        log.iter()
            .position(|c| wanted(c, &moved))
            .unwrap_or_else(|| panic!("missing from {log:?}"))
    };
    let stopped = position(|c, t| matches!(c, Command::TaskStopped(s) if &s.task == t));
    let assigned = position(
        |c, t| matches!(c, Command::AssignTask(a) if &a.task == t && a.container.as_str() == "container-3"),
    );
    let started = position(|c, t| matches!(c, Command::TaskStarted(s) if &s.task == t));
    assert!(stopped < assigned && assigned < started, "{log:?}");
    let owners = owners(&plane.job());
    assert_eq!(owners.len(), 3, "{owners:?}");
}

/// Goal: a container the leader has not heard from is expired, its tasks go to the
/// survivors, and a replacement is launched, all through the log.
#[tokio::test]
async fn a_silent_container_is_expired_and_its_tasks_reassigned() {
    let (plane, wanted, launches) = (FakePlane::leading(), Wanted::default(), Arc::default());
    wanted.set(2);
    let first = plane.register("container-1");
    plane.register("container-2");
    let mut controller = controller(&plane, 4, &wanted, &launches);
    settle(&mut controller, &plane).await;

    plane.lock().overdue = vec![first.clone()];
    plane.lock().lag.remove(&first.container);
    let mark = plane.log_len();
    controller.tick().await;
    assert_eq!(
        plane.log_since(mark),
        vec![Command::ExpireContainer(ExpireContainer {
            container: first.container.clone(),
            epoch: first.epoch,
        })]
    );
    plane.lock().overdue.clear();
    settle(&mut controller, &plane).await;

    let owners = owners(&plane.job());
    assert_eq!(owners.keys().collect::<Vec<_>>(), vec!["container-2"]);
    assert_eq!(owners["container-2"].len(), 4);
    assert_eq!(
        *launches.launched.lock().unwrap(),
        vec![c("container-3")],
        "a replacement for the expired container"
    );
}

/// Goal: the controller reports which containers still owe an acknowledgement of a
/// broadcast, until every one has answered.
#[tokio::test]
async fn a_broadcast_is_reported_open_until_every_container_acks() {
    let (plane, wanted, launches) = (FakePlane::leading(), Wanted::default(), Arc::default());
    wanted.set(2);
    let one = plane.register("container-1");
    let two = plane.register("container-2");
    let mut controller = controller(&plane, 2, &wanted, &launches);
    settle(&mut controller, &plane).await;

    let schema = plane.container_says(Command::SchemaChange(SchemaChange {
        subject: "events".into(),
        schema: b"v2".to_vec(),
    }));
    controller.tick().await;
    let owed = |controller: &Controller<FakePlane>| controller.report().borrow().owed_acks.clone();
    assert_eq!(
        owed(&controller),
        BTreeMap::from([(schema, vec![one.container.clone(), two.container.clone()])])
    );

    let ack = |session: &Session| {
        Command::Ack(Ack {
            container: session.container.clone(),
            epoch: session.epoch,
            offset: schema,
        })
    };
    plane.container_says(ack(&one));
    controller.tick().await;
    assert_eq!(
        owed(&controller),
        BTreeMap::from([(schema, vec![two.container.clone()])])
    );
    plane.container_says(ack(&two));
    controller.tick().await;
    assert!(owed(&controller).is_empty());
}

/// Goal: a controller that loses leadership in the middle of a move writes nothing more and
/// stands down; the next leader's controller, reading the same log, finishes the move from
/// the handshake recorded there, repeating nothing that committed.
/// Steps: scale 2 → 3 until a stop is written; leadership moves to a second controller on the
/// same log; the old owner acknowledges; the new controller assigns, the old one stays quiet.
#[tokio::test]
async fn leadership_lost_mid_move_the_next_leader_completes_it() {
    let (plane, wanted, launches) = (FakePlane::leading(), Wanted::default(), Arc::default());
    wanted.set(2);
    plane.register("container-1");
    plane.register("container-2");
    let mut old = controller(&plane, 4, &wanted, &launches);
    settle(&mut old, &plane).await;
    wanted.set(3);
    old.tick().await;
    old.tick().await;
    plane.register("container-3");
    let mark = plane.log_len();
    old.tick().await;
    let moved = match plane.log_since(mark).as_slice() {
        [Command::StopTask(stop)] => stop.task.clone(),
        other => panic!("expected one stop, got {other:?}"),
    };

    plane.lock().leading = false;
    old.tick().await;
    assert!(
        !old.report().borrow().leading,
        "the old controller stood down"
    );
    plane.containers_answer(); // the old owner acknowledges the stop
    let after_ack = plane.log_len();
    old.tick().await;
    assert_eq!(
        plane.log_len(),
        after_ack,
        "a controller that does not lead writes nothing"
    );

    // The next leader: a fresh controller on the same log.
    let mut new = controller(&plane, 4, &wanted, &launches);
    plane.lock().leading = true;
    settle(&mut new, &plane).await;
    let log = plane.log_since(after_ack);
    assert_eq!(
        count(&log, |c| matches!(c, Command::AssignTask(_))),
        1,
        "only the moved task is assigned again: {log:?}"
    );
    assert!(log
        .iter()
        .any(|c| matches!(c, Command::AssignTask(a) if a.task == moved && a.container.as_str() == "container-3")));
    assert_eq!(
        count(&log, |c| matches!(c, Command::StopTask(_))),
        0,
        "the stop that committed is not repeated: {log:?}"
    );
    assert_eq!(
        launches.launched.lock().unwrap().len(),
        1,
        "the launch that registered is not repeated"
    );
    assert_eq!(owners(&plane.job()).len(), 3);
}

/// A plane that leads, at vocabulary level 3 (launches are recorded), with a launcher that
/// checks each launch was recorded first.
fn at_level_3() -> (FakePlane, Wanted, Arc<RecordCheckingLauncher>) {
    let plane = FakePlane::leading();
    for level in 2..=3 {
        plane.container_says(Command::SetVocabularyLevel(SetVocabularyLevel { level }));
    }
    let launcher = Arc::new(RecordCheckingLauncher {
        plane: plane.clone(),
        launches: Launches::default(),
        recorded_first: Mutex::default(),
    });
    (plane, Wanted::default(), launcher)
}

fn launch_records(log: &[Command]) -> Vec<LaunchContainer> {
    log.iter()
        .filter_map(|c| match c {
            Command::LaunchContainer(launch) => Some(launch.clone()),
            _ => None,
        })
        .collect()
}

/// Goal: from level 3 every launch is recorded in the log, and committed, before the
/// launcher is called, and a recorded launch ends when its container registers.
/// Steps: level 3, 4 inputs, 2 containers wanted; settle; the log records both launches and
/// the launcher saw each recorded before it ran; register both; every task gets an owner and
/// nothing is launched again.
#[tokio::test]
async fn at_level_3_each_launch_is_recorded_before_it_is_carried_out() {
    let (plane, wanted, launcher) = at_level_3();
    wanted.set(2);
    let mut controller = controller_with(&plane, 4, &wanted, launcher.clone());
    settle(&mut controller, &plane).await;

    let log = plane.log_since(0);
    assert_eq!(
        launch_records(&log),
        vec![
            LaunchContainer {
                container: c("container-1"),
                attempt: 1
            },
            LaunchContainer {
                container: c("container-2"),
                attempt: 1
            },
        ]
    );
    assert_eq!(
        *launcher.launches.launched.lock().unwrap(),
        vec![c("container-1"), c("container-2")]
    );
    assert_eq!(*launcher.recorded_first.lock().unwrap(), vec![true, true]);

    plane.register("container-1");
    plane.register("container-2");
    settle(&mut controller, &plane).await;
    assert_eq!(owners(&plane.job()).len(), 2);
    assert_eq!(launcher.launches.launched.lock().unwrap().len(), 2);
    assert!(controller.report().borrow().launching.is_empty());
}

/// Goal: leadership that moves between a launch's record and the launch loses nothing and
/// repeats nothing: the old leader does not launch, the next leader waits for the recorded
/// launch to register until its deadline, then cancels it in the log, stops it, and launches
/// a replacement under the next attempt, recorded first.
/// Steps: level 3, 1 container wanted; the old controller records launch 1 and loses
/// leadership before launching; a new controller on the same log ticks for most of the
/// launch timeout (no launch, no new record); past it, it writes `CancelLaunch` and a second
/// `LaunchContainer` (attempt 2), stops container-1 and launches container-2; container-2
/// registers and gets both tasks.
#[tokio::test(start_paused = true)]
async fn leadership_lost_between_a_launch_record_and_the_launch_the_next_leader_relaunches_once() {
    let (plane, wanted, launcher) = at_level_3();
    wanted.set(1);
    plane.lock().lose_leadership_after_launch_record = true;
    let mut old = controller_with(&plane, 2, &wanted, launcher.clone());
    settle(&mut old, &plane).await;
    let recorded = launch_records(&plane.log_since(0));
    assert_eq!(
        recorded,
        vec![LaunchContainer {
            container: c("container-1"),
            attempt: 1
        }]
    );
    assert!(!plane.is_leader());
    assert!(
        launcher.launches.launched.lock().unwrap().is_empty(),
        "a leader that lost leadership after the record does not launch"
    );
    let launch_offset = plane.job().containers()[&c("container-1")].epoch;

    let mut new = controller_with(&plane, 2, &wanted, launcher.clone());
    plane.lock().leading = true;
    let mark = plane.log_len();
    let timeout = ControllerConfig::default().launch_timeout;
    let tick = ControllerConfig::default().tick;
    let waited = tokio::time::Instant::now();
    while waited.elapsed() + tick < timeout {
        new.tick().await;
        old.tick().await;
        tokio::time::advance(tick).await;
    }
    assert!(
        launch_records(&plane.log_since(mark)).is_empty(),
        "the recorded launch is waited on, not repeated: {:?}",
        plane.log_since(mark)
    );
    assert!(launcher.launches.launched.lock().unwrap().is_empty());
    assert_eq!(
        new.report().borrow().launching,
        BTreeSet::from([c("container-1")])
    );

    tokio::time::advance(2 * tick).await;
    new.tick().await;
    assert_eq!(
        plane.log_since(mark),
        vec![
            Command::CancelLaunch(CancelLaunch {
                container: c("container-1"),
                launch: launch_offset,
            }),
            Command::LaunchContainer(LaunchContainer {
                container: c("container-2"),
                attempt: 2,
            }),
        ]
    );
    assert_eq!(
        *launcher.launches.stopped.lock().unwrap(),
        vec![c("container-1")]
    );
    assert_eq!(
        *launcher.launches.launched.lock().unwrap(),
        vec![c("container-2")]
    );
    assert_eq!(*launcher.recorded_first.lock().unwrap(), vec![true]);

    plane.register("container-2");
    settle(&mut new, &plane).await;
    assert_eq!(owners(&plane.job())["container-2"].len(), 2);
    assert_eq!(launcher.launches.launched.lock().unwrap().len(), 1);
    assert!(new.report().borrow().launching.is_empty());
}
