//! Example tests of `JobState::apply` (every kind, every rejection, the handshakes) and the
//! property that a snapshot plus the tail gives the state a full replay gives. The scenario
//! scripts (`scenarios.rs`) trace the fold and the plan as readable scripts.

use std::collections::BTreeMap;

use proptest::prelude::*;

use super::*;
use crate::log::vocabulary::{kinds, LEVEL_MAX};
use crate::log::*;

/// A JobState driven one command at a time, as the state machine drives it.
#[derive(Default)]
struct Job {
    state: JobState,
}

fn c(name: &str) -> ContainerId {
    ContainerId::new(name).unwrap()
}

fn t(name: &str) -> TaskId {
    TaskId::new(name).unwrap()
}

fn i(partition: u32) -> Input {
    Input::new("kafka", "events", partition).unwrap()
}

impl Job {
    fn apply_to(&mut self, target: Target, command: Command) -> Outcome {
        self.state
            .apply(None, &target, &command.into_frame(), 1_000)
    }

    fn apply(&mut self, command: Command) -> Outcome {
        let target = command.default_target();
        self.apply_to(target, command)
    }

    /// Applies a command that must be accepted; returns its offset.
    #[track_caller]
    fn ok(&mut self, command: Command) -> Offset {
        match self.apply(command) {
            Outcome::Appended { offset } => offset,
            other => panic!("expected the command to be accepted, got {other:?}"),
        }
    }

    /// Applies a command that must be refused; checks nothing changed and returns why.
    #[track_caller]
    fn refused(&mut self, command: Command) -> Rejection {
        let before = self.state.clone();
        match self.apply(command) {
            Outcome::Rejected(rejection) => {
                assert_eq!(self.state, before, "a refusal changes nothing");
                rejection
            }
            other => panic!("expected a refusal, got {other:?}"),
        }
    }

    fn register(&mut self, container: &str) -> Epoch {
        self.ok(Command::RegisterContainer(RegisterContainer {
            container: c(container),
            location: format!("{container}-host"),
        }))
    }

    fn task(&self, task: &str) -> &TaskRecord {
        &self.state.tasks()[&t(task)]
    }
}

fn assign(task: &str, container: &str, epoch: Epoch, inputs: &[u32]) -> Command {
    Command::AssignTask(AssignTask {
        task: t(task),
        container: c(container),
        epoch,
        inputs: inputs.iter().map(|p| i(*p)).collect(),
    })
}

fn stop(task: &str, container: &str, epoch: Epoch) -> Command {
    Command::StopTask(StopTask {
        task: t(task),
        container: c(container),
        epoch,
    })
}

fn started(task: &str, container: &str, epoch: Epoch) -> Command {
    Command::TaskStarted(TaskStarted {
        task: t(task),
        container: c(container),
        epoch,
    })
}

fn stopped(task: &str, container: &str, epoch: Epoch, checkpoint: Option<&[u8]>) -> Command {
    Command::TaskStopped(TaskStopped {
        task: t(task),
        container: c(container),
        epoch,
        checkpoint: checkpoint.map(<[u8]>::to_vec),
    })
}

fn ack(container: &str, epoch: Epoch, offset: Offset) -> Command {
    Command::Ack(Ack {
        container: c(container),
        epoch,
        offset,
    })
}

fn expire(container: &str, epoch: Epoch) -> Command {
    Command::ExpireContainer(ExpireContainer {
        container: c(container),
        epoch,
    })
}

fn add_inputs(partitions: &[u32]) -> Command {
    Command::AddInputs(AddInputs {
        inputs: partitions.iter().map(|p| i(*p)).collect(),
    })
}

fn fenced(container: &str, epoch: Epoch, current_epoch: Option<Epoch>) -> Rejection {
    Rejection::Fenced {
        container: c(container),
        epoch,
        current_epoch,
    }
}

#[test]
fn registration_gives_the_epoch_and_a_new_one_fences_the_old() {
    let mut job = Job::default();
    let first = job.register("a");
    assert_eq!(first, 1);
    assert_eq!(job.state.live_session(&c("a")).unwrap().epoch, 1);
    let second = job.register("a");
    assert_eq!(second, 2);
    assert_eq!(
        job.refused(ack("a", first, 1)),
        fenced("a", first, Some(second))
    );
    job.ok(ack("a", second, 1));

    job.ok(Command::DeregisterContainer(DeregisterContainer {
        container: c("a"),
        epoch: second,
    }));
    assert_eq!(
        job.state.containers()[&c("a")].status,
        ContainerStatus::Deregistered
    );
    assert_eq!(job.refused(expire("a", second)), fenced("a", second, None));
    assert_eq!(job.refused(ack("nobody", 1, 1)), fenced("nobody", 1, None));

    let third = job.register("a");
    job.ok(expire("a", third));
    assert_eq!(
        job.state.containers()[&c("a")].status,
        ContainerStatus::Expired
    );
    assert_eq!(job.refused(expire("a", third)), fenced("a", third, None));
}

#[test]
fn only_so_many_dead_containers_are_remembered() {
    let mut job = Job::default();
    for n in 0..=DEAD_CONTAINERS_KEPT {
        let name = format!("c{n}");
        let epoch = job.register(&name);
        job.ok(expire(&name, epoch));
    }
    assert_eq!(job.state.containers().len(), DEAD_CONTAINERS_KEPT);
    assert!(
        !job.state.containers().contains_key(&c("c0")),
        "the oldest went first"
    );
    assert_eq!(
        job.refused(ack("c0", 1, 1)),
        fenced("c0", 1, None),
        "still fenced"
    );
}

#[test]
fn a_task_moves_only_through_stop_then_assign() {
    let mut job = Job::default();
    let a = job.register("a");
    let b = job.register("b");
    job.ok(add_inputs(&[0, 1]));

    let assigned = job.ok(assign("t0", "a", a, &[0, 1]));
    assert_eq!(
        job.state.pending()[&assigned].awaiting,
        Awaiting::TaskStarted { task: t("t0") }
    );
    assert_eq!(
        job.refused(assign("t0", "b", b, &[0, 1])),
        Rejection::TaskOwned {
            task: t("t0"),
            owner: c("a")
        }
    );
    assert!(matches!(
        job.refused(started("t0", "b", b)),
        Rejection::WrongOwnerOrPhase { .. }
    ));
    let running = job.ok(started("t0", "a", a));
    assert!(job.state.pending().is_empty());
    assert_eq!(
        job.task("t0").phase,
        TaskPhase::Running {
            owner: Session {
                container: c("a"),
                epoch: a
            },
            since: running
        }
    );
    assert!(matches!(
        job.refused(started("t0", "a", a)),
        Rejection::WrongOwnerOrPhase { .. }
    ));
    assert!(matches!(
        job.refused(stopped("t0", "a", a, None)),
        Rejection::WrongOwnerOrPhase { .. }
    ));

    let stopping = job.ok(stop("t0", "a", a));
    assert_eq!(
        job.state.pending()[&stopping].owed_by,
        BTreeMap::from([(c("a"), a)])
    );
    assert!(matches!(
        job.refused(assign("t0", "b", b, &[0, 1])),
        Rejection::TaskOwned { .. }
    ));
    job.ok(stopped("t0", "a", a, Some(b"position 42")));
    assert_eq!(job.task("t0").phase, TaskPhase::Unassigned);
    assert_eq!(
        job.task("t0").checkpoint.as_deref(),
        Some(&b"position 42"[..])
    );
    assert!(job.state.pending().is_empty());

    job.ok(assign("t0", "b", b, &[0, 1]));
    job.ok(started("t0", "b", b));
    assert_eq!(job.task("t0").phase.owner().unwrap().container, c("b"));
    assert_eq!(
        job.task("t0").checkpoint.as_deref(),
        Some(&b"position 42"[..]),
        "kept for the new owner"
    );
}

#[test]
fn inputs_belong_to_one_task_and_are_revoked_before_removal() {
    let mut job = Job::default();
    let a = job.register("a");
    assert_eq!(
        job.refused(assign("t0", "a", a, &[0])),
        Rejection::UnknownInput { input: i(0) }
    );
    job.ok(add_inputs(&[0, 1, 2]));
    job.ok(add_inputs(&[2])); // adding again is harmless
    job.ok(assign("t0", "a", a, &[0, 1]));
    assert_eq!(
        job.refused(assign("t1", "a", a, &[1, 2])),
        Rejection::InputInUse {
            input: i(1),
            task: t("t0")
        }
    );
    assert_eq!(
        job.refused(Command::RemoveInputs(RemoveInputs { inputs: vec![i(1)] })),
        Rejection::InputInUse {
            input: i(1),
            task: t("t0")
        }
    );
    assert_eq!(
        job.refused(Command::RemoveInputs(RemoveInputs { inputs: vec![i(9)] })),
        Rejection::UnknownInput { input: i(9) }
    );
    job.ok(Command::RemoveInputs(RemoveInputs { inputs: vec![i(2)] }));
    assert!(!job.state.inputs().contains_key(&i(2)));

    // Revoke input 1 from t0: stop, remove, reassign with what is left.
    job.ok(stop("t0", "a", a));
    job.ok(stopped("t0", "a", a, None));
    job.ok(Command::RemoveInputs(RemoveInputs { inputs: vec![i(1)] }));
    assert_eq!(job.task("t0").inputs.len(), 1);
    job.ok(assign("t0", "a", a, &[0]));
    assert_eq!(job.state.inputs()[&i(0)], Some(t("t0")));

    // An input of an unowned task can be regrouped into another task.
    job.ok(stop("t0", "a", a));
    job.ok(stopped("t0", "a", a, None));
    job.ok(assign("t1", "a", a, &[0]));
    assert_eq!(job.state.inputs()[&i(0)], Some(t("t1")));
    assert!(
        !job.state.tasks().contains_key(&t("t0")),
        "a task left without inputs is dropped"
    );
}

#[test]
fn expiry_releases_tasks_cancels_handshakes_and_fences_the_zombie() {
    let mut job = Job::default();
    let a = job.register("a");
    let b = job.register("b");
    job.ok(add_inputs(&[0, 1]));
    job.ok(assign("t0", "a", a, &[0]));
    job.ok(started("t0", "a", a));
    let stopping = job.ok(stop("t0", "a", a));
    job.ok(assign("t1", "a", a, &[1]));
    let schema = job.ok(Command::SchemaChange(SchemaChange {
        subject: "events".into(),
        schema: b"v2".to_vec(),
    }));
    assert_eq!(job.state.pending().len(), 3);

    job.ok(expire("a", a));
    assert_eq!(job.task("t0").phase, TaskPhase::Unassigned);
    assert_eq!(job.task("t1").phase, TaskPhase::Unassigned);
    assert!(!job.state.pending().contains_key(&stopping));
    assert_eq!(
        job.state.pending()[&schema].owed_by,
        BTreeMap::from([(c("b"), b)]),
        "the broadcast now waits for b alone"
    );
    // The zombie can neither finish its handshake nor be given work.
    assert_eq!(
        job.refused(stopped("t0", "a", a, None)),
        fenced("a", a, None)
    );
    assert_eq!(
        job.refused(assign("t0", "a", a, &[0])),
        fenced("a", a, None)
    );
    assert_eq!(
        job.refused(Command::StopTask(StopTask {
            task: t("t9"),
            container: c("b"),
            epoch: b
        })),
        Rejection::UnknownTask { task: t("t9") }
    );
    job.ok(assign("t0", "b", b, &[0]));
}

#[test]
fn broadcasts_complete_when_every_live_container_acked() {
    let mut job = Job::default();
    let a = job.register("a");
    let b = job.register("b");
    let change = job.ok(Command::ConfigChange(ConfigChange {
        set: BTreeMap::from([
            ("batch.size".into(), "500".into()),
            ("old".into(), "x".into()),
        ]),
        remove: vec![],
    }));
    assert_eq!(job.state.config()["batch.size"], "500");
    assert_eq!(job.state.pending()[&change].awaiting, Awaiting::Acks);
    job.ok(ack("a", a, change));
    assert_eq!(job.state.pending()[&change].owed_by.len(), 1);
    job.ok(ack("a", a, change)); // a second ack changes nothing
    job.ok(ack("b", b, change));
    assert!(job.state.pending().is_empty());
    assert_eq!(
        job.refused(ack("a", a, 1_000)),
        Rejection::NoSuchOffset { offset: 1_000 }
    );
    job.ok(Command::ConfigChange(ConfigChange {
        set: BTreeMap::new(),
        remove: vec!["old".into()],
    }));
    assert!(!job.state.config().contains_key("old"));

    let schema = job.ok(Command::SchemaChange(SchemaChange {
        subject: "events".into(),
        schema: b"v3".to_vec(),
    }));
    assert_eq!(job.state.schemas()["events"].offset, schema);
    // A container registered after a broadcast does not owe it: it reads the state instead.
    job.register("late");
    assert_eq!(job.state.pending()[&schema].owed_by.len(), 2);
}

#[test]
fn the_vocabulary_level_gates_new_kinds_and_deprecates_old_ones() {
    let mut job = Job::default();
    let v2 = Command::DesiredContainers(DesiredContainers {
        count: 4,
        reason: "lag 12,000 > 10,000".into(),
    });
    let v1 = Command::DesiredContainersV1(DesiredContainersV1 { count: 3 });
    assert_eq!(
        job.refused(v2.clone()),
        Rejection::NotYetAllowed {
            kind: kinds::DESIRED_CONTAINERS,
            version: 2,
            level: 1
        }
    );
    job.ok(v1.clone());
    assert_eq!(job.state.desired_containers().unwrap().count, 3);
    assert_eq!(
        job.refused(Command::SetVocabularyLevel(SetVocabularyLevel { level: 1 })),
        Rejection::LevelNotRaised {
            current: 1,
            requested: 1
        }
    );
    job.ok(Command::SetVocabularyLevel(SetVocabularyLevel { level: 2 }));
    assert_eq!(job.state.level(), 2);
    assert_eq!(
        job.refused(v1),
        Rejection::Deprecated {
            kind: kinds::DESIRED_CONTAINERS,
            version: 1,
            level: 2
        }
    );
    job.ok(v2);
    assert_eq!(
        job.state.desired_containers().unwrap().reason,
        "lag 12,000 > 10,000"
    );
}

#[test]
fn unknown_malformed_misaddressed_and_misnamed_commands_are_refused() {
    let mut job = Job::default();
    let unknown = Frame {
        kind: 999,
        version: 1,
        body: vec![],
    };
    assert_eq!(
        job.refused(Command::Unknown(unknown.clone())),
        Rejection::UnknownKind {
            kind: 999,
            version: 1
        }
    );
    let malformed = Frame {
        kind: kinds::ASSIGN_TASK,
        version: 1,
        body: vec![0xff; 5],
    };
    assert!(matches!(
        job.state.apply(None, &Target::All, &malformed, 0),
        Outcome::Rejected(Rejection::Malformed { .. })
    ));
    let epoch = job.register("a");
    assert_eq!(
        job.apply_to(Target::All, started("t0", "a", epoch)),
        Outcome::Rejected(Rejection::WrongTarget {
            expected: Target::Coordinator
        })
    );
    let bad_name: ContainerId = serde_json::from_str("\"has space\"").unwrap();
    assert_eq!(
        job.refused(Command::RegisterContainer(RegisterContainer {
            container: bad_name,
            location: String::new()
        })),
        Rejection::InvalidName {
            name: "has space".into()
        }
    );
    // User commands are never interpreted.
    job.ok(Command::custom(1, 9, vec![0xff; 5]));

    // At a level above this build's, a kind it does not know passes through: a newer replica
    // decides it. (A replica's state machine stops before: `raft::state_machine`.)
    job.ok(Command::SetVocabularyLevel(SetVocabularyLevel {
        level: LEVEL_MAX + 1,
    }));
    assert!(!job.state.level_understood());
    job.ok(Command::Unknown(unknown));
}

#[test]
fn duplicates_and_out_of_window_sequences_take_no_offset() {
    let mut state = JobState::default();
    let frame = Command::custom(1, 1, vec![]).into_frame();
    let mut append = |seq: u64| {
        let pair = ProducerSeq { producer: 7, seq };
        state.apply(Some(pair), &Target::All, &frame, 0)
    };
    assert_eq!(append(1), Outcome::Appended { offset: 1 });
    assert_eq!(append(1), Outcome::Duplicate { offset: 1 });
    assert_eq!(append(100), Outcome::Appended { offset: 2 });
    assert_eq!(append(2), Outcome::OutOfWindow { lowest: 69 });
    assert_eq!(append(99), Outcome::Appended { offset: 3 });
    assert_eq!(state.next_offset(), 4);
}

/// Goal: from level 3 the log records the coordinator's launches: a launch makes the
/// container `Launching` until it registers or the launch is cancelled, a second launch of a
/// live or launching container is refused, and only a launch in flight can be cancelled.
#[test]
fn launches_are_recorded_until_the_container_registers_or_the_launch_is_cancelled() {
    let mut job = Job::default();
    let launch = |name: &str, attempt| {
        Command::LaunchContainer(LaunchContainer {
            container: c(name),
            attempt,
        })
    };
    let cancel = |name: &str, launch| {
        Command::CancelLaunch(CancelLaunch {
            container: c(name),
            launch,
        })
    };
    assert!(matches!(
        job.refused(launch("a", 1)),
        Rejection::NotYetAllowed { level: 1, .. }
    ));
    job.ok(Command::SetVocabularyLevel(SetVocabularyLevel { level: 3 }));

    let a = job.ok(launch("a", 1));
    let status = |job: &Job, name: &str| job.state.containers()[&c(name)].status;
    assert_eq!(status(&job, "a"), ContainerStatus::Launching { attempt: 1 });
    assert!(job.state.live_session(&c("a")).is_none());
    assert_eq!(
        job.refused(launch("a", 2)),
        Rejection::ContainerExists { container: c("a") }
    );
    assert_eq!(
        job.refused(cancel("a", a + 1)),
        Rejection::NoSuchLaunch {
            container: c("a"),
            launch: a + 1
        }
    );
    let epoch = job.register("a");
    assert_eq!(job.state.live_session(&c("a")).unwrap().epoch, epoch);
    assert!(matches!(
        job.refused(cancel("a", a)),
        Rejection::NoSuchLaunch { .. }
    ));
    assert_eq!(
        job.refused(launch("a", 1)),
        Rejection::ContainerExists { container: c("a") }
    );

    let b = job.ok(launch("b", 2));
    job.ok(cancel("b", b));
    assert_eq!(status(&job, "b"), ContainerStatus::Expired);
    assert!(matches!(
        job.refused(cancel("b", b)),
        Rejection::NoSuchLaunch { .. }
    ));
}

/// Goal: a retry from a producer the table forgot is refused from vocabulary level 3 instead
/// of being appended a second time, and appended below level 3 exactly as older builds do.
/// Steps: producer 7 appends sequences 1..=40; `PRODUCERS_MAX` other producers append once
/// each, which evicts 7; 7 retries sequence 40. A new producer starting at 1 is still new.
#[test]
fn a_forgotten_producers_retry_is_refused_from_level_3_and_appended_below_it() {
    for level in [2, 3] {
        let mut job = Job::default();
        for raised in 2..=level {
            job.ok(Command::SetVocabularyLevel(SetVocabularyLevel {
                level: raised,
            }));
        }
        let frame = Command::custom(1, 1, vec![]).into_frame();
        let append = |state: &mut JobState, producer: u64, seq: u64| {
            state.apply(Some(ProducerSeq { producer, seq }), &Target::All, &frame, 0)
        };
        let mut original = 0;
        for seq in 1..=40 {
            original = append(&mut job.state, 7, seq).offset().unwrap();
        }
        for producer in 1_000..1_000 + PRODUCERS_MAX as u64 {
            append(&mut job.state, producer, 1);
        }
        assert_eq!(
            append(&mut job.state, 1_000, 1),
            Outcome::Duplicate {
                offset: original + 1
            },
            "the others are remembered"
        );
        let next = job.state.next_offset();
        let retry = append(&mut job.state, 7, 40);
        if level >= 3 {
            assert_eq!(retry, Outcome::ProducerForgotten);
            assert_eq!(job.state.next_offset(), next, "nothing appended");
        } else {
            assert_eq!(
                retry,
                Outcome::Appended { offset: next },
                "as before level 3"
            );
        }
        assert_eq!(
            append(&mut job.state, 8, 1).offset(),
            Some(job.state.next_offset() - 1),
            "a new producer begins at 1 at level {level}"
        );
    }
}

/// Turns random numbers into a plausible command stream: mostly valid commands for the
/// current state, with stale epochs, wrong owners and unknown names mixed in.
fn script(actions: &[(u8, u8, u8, bool)]) -> Vec<(Target, Frame)> {
    let mut job = Job::default();
    let containers = ["a", "b", "c"];
    let mut out = Vec::new();
    for &(op, x, y, stale) in actions {
        let mut container = containers[x as usize % containers.len()].to_string();
        let mut task = format!("t{}", y % 4);
        // Answers and stops mostly go to a task that has an owner, from that owner.
        let owned: Vec<(TaskId, Session)> = job
            .state
            .tasks()
            .iter()
            .filter_map(|(task, record)| Some((task.clone(), record.phase.owner()?.clone())))
            .collect();
        if matches!(op % 12, 5..=7) && !owned.is_empty() {
            let (owned_task, owner) = &owned[y as usize % owned.len()];
            task = owned_task.to_string();
            container = owner.container.to_string();
        }
        let container = container.as_str();
        let epoch = match job.state.live_session(&c(container)) {
            Some(session) if !stale => session.epoch,
            _ => u64::from(x) + 1,
        };
        let partition = u32::from(y % 6);
        let command = match op % 12 {
            0 => Command::RegisterContainer(RegisterContainer {
                container: c(container),
                location: String::new(),
            }),
            1 => expire(container, epoch),
            2 => add_inputs(&[partition, partition + 1]),
            3 => Command::RemoveInputs(RemoveInputs {
                inputs: vec![i(partition)],
            }),
            4 => assign(&task, container, epoch, &[partition]),
            5 => stop(&task, container, epoch),
            6 => started(&task, container, epoch),
            7 => stopped(&task, container, epoch, Some(&[y])),
            8 => Command::SchemaChange(SchemaChange {
                subject: "s".into(),
                schema: vec![y],
            }),
            9 => ack(container, epoch, u64::from(y)),
            10 => Command::SetVocabularyLevel(SetVocabularyLevel {
                level: u16::from(y % 3),
            }),
            _ => Command::DesiredContainers(DesiredContainers {
                count: u32::from(y),
                reason: String::new(),
            }),
        };
        let target = command.default_target();
        let frame = command.into_frame();
        job.state.apply(None, &target, &frame, 0);
        out.push((target, frame));
    }
    out
}

proptest! {
    /// A snapshot (the serialised state) at any point plus the rest of the log gives exactly
    /// the state of a full replay; so does a subscriber's replay of the delivered entries
    /// after a `Reset` to that snapshot.
    #[test]
    fn snapshot_plus_tail_equals_full_replay(
        actions in proptest::collection::vec((any::<u8>(), any::<u8>(), any::<u8>(), any::<bool>()), 0..120),
        split in any::<prop::sample::Index>(),
    ) {
        let log = script(&actions);
        let split = if log.is_empty() { 0 } else { split.index(log.len() + 1) };
        let fold = |state: &mut JobState, part: &[(Target, Frame)]| -> Vec<Outcome> {
            part.iter().map(|(target, frame)| state.apply(None, target, frame, 0)).collect()
        };
        let mut full = JobState::default();
        let outcomes = fold(&mut full, &log);

        let mut prefix = JobState::default();
        fold(&mut prefix, &log[..split]);
        let snapshot: JobState = decode(&encode(&prefix), 1 << 24).unwrap();
        prop_assert_eq!(&snapshot, &prefix);

        let mut restored = snapshot.clone();
        fold(&mut restored, &log[split..]);
        prop_assert_eq!(&restored, &full);

        // A subscriber sees only the accepted commands, at their offsets.
        let mut subscriber = snapshot;
        for ((target, frame), outcome) in log[split..].iter().zip(&outcomes[split..]) {
            if let Outcome::Appended { offset } = outcome {
                let entry = LogEntry {
                    offset: *offset,
                    term: 1,
                    appended_at_ms: 0,
                    producer: None,
                    target: target.clone(),
                    frame: frame.clone(),
                };
                prop_assert_eq!(subscriber.apply_entry(&entry), Ok(()));
            }
        }
        prop_assert_eq!(&subscriber, &full);
    }
}

/// Regression (a leader's heartbeat table counted a session's silence from the start of the
/// term, so a container that registered later was overdue at the controller's next tick,
/// before its first heartbeat could arrive, and was expired at once). Steps: a table tracking
/// since t0; a container registers at t0 + 10 s; at t0 + 10 s it is not overdue, nor 1 s
/// later with a 2 s timeout; 2.5 s after it was first seen, silent, it is; a heartbeat makes
/// it current again.
#[test]
fn a_session_registered_during_a_term_counts_its_silence_from_when_it_was_first_seen() {
    let t0 = std::time::Instant::now();
    let at = |ms: u64| t0 + std::time::Duration::from_millis(ms);
    let timeout = std::time::Duration::from_secs(2);
    let mut table = Liveness::new(3, t0);
    let mut job = Job::default();
    job.ok(Command::RegisterContainer(RegisterContainer {
        container: c("late"),
        location: "here".into(),
    }));
    assert!(table.overdue(&job.state, at(10_000), timeout).is_empty());
    assert!(table.overdue(&job.state, at(11_000), timeout).is_empty());
    let overdue = table.overdue(&job.state, at(12_500), timeout);
    assert_eq!(overdue.len(), 1, "silent for 2.5 s since first seen");
    table.record(&job.state, &overdue[0], BTreeMap::new(), at(12_600));
    assert!(table.overdue(&job.state, at(13_000), timeout).is_empty());
}

/// Regression (issue 32: a container steered scaling by the lag it reported for tasks it does
/// not own, and a sum that wrapped read as no lag). Steps: containers a and b, task t1 on a;
/// b reports lag for t1 and for a task nobody has: neither counts; a reports `u64::MAX` and 5
/// for t1 and a task it does not own: its total is t1's, and the totals saturate; t1 moves to
/// b, and a's report for it no longer counts.
#[test]
fn lag_counts_only_for_the_reporters_own_tasks_and_saturates() {
    let now = std::time::Instant::now();
    let mut job = Job::default();
    let a = job.register("a");
    job.register("b");
    job.ok(assign("t1", "a", a, &[]));
    let (session_a, session_b) = (
        job.state.live_session(&c("a")).unwrap(),
        job.state.live_session(&c("b")).unwrap(),
    );
    let mut table = Liveness::new(1, now);
    table.record(
        &job.state,
        &session_b,
        BTreeMap::from([(t("t1"), 1_000_000), (t("unowned"), 7)]),
        now,
    );
    assert_eq!(table.lag(&job.state).get(&c("b")), Some(&0));
    assert_eq!(table.reported(&job.state).total, 0);
    table.record(
        &job.state,
        &session_a,
        BTreeMap::from([(t("t1"), u64::MAX), (t("t2"), 5)]),
        now,
    );
    assert_eq!(table.lag(&job.state).get(&c("a")), Some(&u64::MAX));
    assert_eq!(table.reported(&job.state).total, u64::MAX);

    // t1 moves to b: a's report, made while t1 was a's, stops counting.
    let b = session_b.epoch;
    job.ok(stop("t1", "a", a));
    job.ok(stopped("t1", "a", a, None));
    job.ok(assign("t1", "b", b, &[]));
    assert_eq!(table.lag(&job.state).get(&c("a")), Some(&0));
    assert_eq!(table.reported(&job.state).total, 0);
}
