//! The property that a snapshot plus the tail gives the state a full replay gives, over
//! random command streams. It stays in Rust because it is a property, not an example: the
//! examples of `JobState::apply` (every kind, every rejection, the handshakes) and of the
//! heartbeat table are the scenario scripts (`scenarios.rs`, `src/jobs/scenarios/`).

use proptest::prelude::*;

use super::*;
use crate::log::*;

fn c(name: &str) -> ContainerId {
    ContainerId::new(name).unwrap()
}

fn t(name: &str) -> TaskId {
    TaskId::new(name).unwrap()
}

fn i(partition: u32) -> Input {
    Input::new("kafka", "events", partition).unwrap()
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

/// Turns random numbers into a plausible command stream: mostly valid commands for the
/// current state, with stale epochs, wrong owners and unknown names mixed in.
fn script(actions: &[(u8, u8, u8, bool)]) -> Vec<(Target, Frame)> {
    let mut state = JobState::default();
    let containers = ["a", "b", "c"];
    let mut out = Vec::new();
    for &(op, x, y, stale) in actions {
        let mut container = containers[x as usize % containers.len()].to_string();
        let mut task = format!("t{}", y % 4);
        // Answers and stops mostly go to a task that has an owner, from that owner.
        let owned: Vec<(TaskId, Session)> = state
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
        let epoch = match state.live_session(&c(container)) {
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
        state.apply(None, &target, &frame, 0);
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
