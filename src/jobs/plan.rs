//! The controller's decisions: given the JobState and what the leader observes, which commands
//! to write next.
//!
//! Planning is level-triggered, as a Kubernetes controller reconciles: it compares the state
//! the log describes with the wanted state and emits the next steps, never remembering what it
//! did. Every handshake in flight is in JobState, so a new leader's first plan resumes exactly
//! where the old leader stopped, repeating nothing that committed and losing nothing that did
//! not. Pure and deterministic: same inputs, same plan.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet, BinaryHeap};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::model::{Awaiting, Session, TaskPhase};
use super::state::JobState;
use crate::log::{
    AddInputs, AssignTask, Command, ContainerId, DeregisterContainer, ExpireContainer, Input,
    Offset, RemoveInputs, StopTask, TaskId,
};

/// Groups inputs into tasks.
pub trait Grouper: Send + Sync {
    /// The task `input` belongs to. It should depend on the input alone, so that every plan,
    /// on every leader, groups the inputs the same way.
    fn task_for(&self, input: &Input) -> TaskId;
}

/// Samza's default: task `partition-N` holds partition N of every input stream.
#[derive(Clone, Copy, Debug, Default)]
pub struct GroupByPartition;

impl Grouper for GroupByPartition {
    fn task_for(&self, input: &Input) -> TaskId {
        TaskId::new(format!("partition-{}", input.partition)).expect("a valid task name")
    }
}

/// Decides how many containers the job should have.
pub trait ScalingPolicy: Send {
    /// The wanted count, given the current one and the total lag the live containers reported.
    fn desired(&mut self, current: u32, total_lag: u64, now: Instant) -> u32;

    /// This replica took over a job whose log records a count: the previous leader may have
    /// changed it just before, at a time no clock here knows, so a policy that paces its
    /// changes starts its pause at `now`.
    fn took_over(&mut self, _now: Instant) {}
}

/// The default policy: scale out by one while the lag per container is above
/// `scale_out_lag`, in by one while it is below `scale_in_lag`, within `[min, max]`, at most
/// once per `cooldown`.
#[derive(Clone, Debug)]
pub struct LagPolicy {
    /// The fewest containers wanted; a count below it is raised to it at once.
    pub min: u32,
    /// The most containers wanted, at least `min`; a count above it is lowered to it at once.
    pub max: u32,
    /// Scale out while the lag per container (the total reported lag divided by the current
    /// count) is above this, in the unit the containers report lag in.
    pub scale_out_lag: u64,
    /// Scale in while the lag per container is below this; keep it below `scale_out_lag`.
    pub scale_in_lag: u64,
    /// The least time between two changes made for lag; bringing the count back within
    /// `[min, max]` does not wait for it.
    pub cooldown: Duration,
    last_change: Option<Instant>,
}

impl LagPolicy {
    /// A policy with these bounds, thresholds and cooldown, whose first change is not held
    /// back by the cooldown. A `max` below `min` is taken as `min`.
    pub fn new(
        min: u32,
        max: u32,
        scale_out_lag: u64,
        scale_in_lag: u64,
        cooldown: Duration,
    ) -> LagPolicy {
        LagPolicy {
            min,
            max: max.max(min),
            scale_out_lag,
            scale_in_lag,
            cooldown,
            last_change: None,
        }
    }
}

impl ScalingPolicy for LagPolicy {
    fn desired(&mut self, current: u32, total_lag: u64, now: Instant) -> u32 {
        let clamped = current.clamp(self.min, self.max);
        if clamped != current || current == 0 {
            return clamped.max(self.min);
        }
        if self
            .last_change
            .is_some_and(|at| now.saturating_duration_since(at) < self.cooldown)
        {
            return current;
        }
        let per_container = total_lag / u64::from(current);
        let wanted = if per_container > self.scale_out_lag && current < self.max {
            current + 1
        } else if per_container < self.scale_in_lag && current > self.min {
            current - 1
        } else {
            current
        };
        if wanted != current {
            self.last_change = Some(now);
        }
        wanted
    }

    /// The cooldown starts over: a new leader scaled again 1.3 s after its predecessor
    /// (3d7237e), when the count had just changed and the lag not yet followed.
    fn took_over(&mut self, now: Instant) {
        self.last_change = Some(now);
    }
}

/// The most inputs one `AddInputs` or `RemoveInputs` of a plan names. A job's first plan
/// adds every input at once, and a hundred thousand in one command (2.5 MB) would be refused
/// as larger than `command_bytes_max` at every tick, for good. 1,024 inputs of the longest
/// names allowed encode to under 300 KB, within the default limit of 1 MiB.
pub const INPUTS_PER_COMMAND_MAX: usize = 1024;

/// What the controller observes besides JobState.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Observed {
    /// The inputs the job should have now (from the input source), shared with it: a job
    /// of a hundred thousand inputs is not copied every tick.
    pub inputs: Arc<BTreeSet<Input>>,
    /// Live sessions the leader has not heard from within the session timeout.
    pub overdue: Vec<Session>,
    /// Containers launched that have not registered yet.
    pub launching: usize,
    /// The container count wanted (recorded in the log before it is acted on).
    pub desired_containers: u32,
    /// Containers are started and stopped by an orchestrator outside ctrlog, which scales them
    /// on the desired count: the plan neither launches nor drains, and spreads the tasks over
    /// whichever containers registered.
    pub orchestrated: bool,
}

/// One step of a plan.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Action {
    /// Append this command to the log; what it asks for happens once it is applied.
    Append(Command),
    /// Start this many new containers.
    Launch(usize),
    /// Stop a container's process (after its deregistration is written).
    Stop(ContainerId),
}

/// At most this many task moves (stops for rebalancing) are in flight at once, so that a
/// rebalance never leaves much of the job without an owner.
pub const MOVES_IN_FLIGHT_MAX: usize = 1;

/// The containers to drain when there are more live ones than wanted: the most recently
/// registered first (the last in is the first out).
pub fn draining(state: &JobState, desired: u32) -> BTreeSet<ContainerId> {
    let mut live: Vec<Session> = state.live_sessions().collect();
    live.sort_by_key(|s| std::cmp::Reverse(s.epoch));
    let excess = live.len().saturating_sub(desired as usize);
    live.into_iter().take(excess).map(|s| s.container).collect()
}

/// Live containers and how many tasks each owns.
pub fn loads(state: &JobState) -> BTreeMap<ContainerId, usize> {
    let mut loads: BTreeMap<ContainerId, usize> =
        state.live_sessions().map(|s| (s.container, 0)).collect();
    for task in state.tasks().values() {
        if let Some(n) = task.phase.owner().and_then(|o| loads.get_mut(&o.container)) {
            *n += 1;
        }
    }
    loads
}

/// Whether the job is at rest with `tasks` tasks on `containers` live containers: every input
/// in a running task, loads within one of each other, no handshake open.
pub fn settled(state: &JobState, tasks: usize, containers: usize) -> bool {
    let loads = loads(state);
    let (min, max) = (loads.values().min(), loads.values().max());
    state.tasks().len() == tasks
        && state
            .tasks()
            .values()
            .all(|t| matches!(t.phase, TaskPhase::Running { .. }))
        && state.inputs().values().all(Option::is_some)
        && loads.len() == containers
        && min.zip(max).is_some_and(|(min, max)| max - min <= 1)
        && state.pending().is_empty()
}

/// Which containers still owe an ack for each open broadcast.
pub fn owed_acks(state: &JobState) -> BTreeMap<Offset, Vec<ContainerId>> {
    state
        .pending()
        .iter()
        .filter(|(_, h)| h.awaiting == Awaiting::Acks)
        .map(|(offset, h)| (*offset, h.owed_by.keys().cloned().collect()))
        .collect()
}

/// The next steps towards the wanted state. Each step is valid against `state`, and an
/// empty plan means the job is where it should be (or waits on a container's answer).
pub fn plan(state: &JobState, observed: &Observed, grouper: &dyn Grouper) -> Vec<Action> {
    // 1. Failures first: a silent container is expired, which releases its tasks.
    if !observed.overdue.is_empty() {
        return observed
            .overdue
            .iter()
            .map(|s| {
                Action::Append(Command::ExpireContainer(ExpireContainer {
                    container: s.container.clone(),
                    epoch: s.epoch,
                }))
            })
            .collect();
    }
    let mut actions = Vec::new();

    // 2. Inputs that appeared, and inputs that went away (revoked before removal).
    let added: Vec<Input> = observed
        .inputs
        .iter()
        .filter(|i| !state.inputs().contains_key(i))
        .cloned()
        .collect();
    for inputs in added.chunks(INPUTS_PER_COMMAND_MAX) {
        actions.push(Action::Append(Command::AddInputs(AddInputs {
            inputs: inputs.to_vec(),
        })));
    }
    let mut removable = Vec::new();
    let mut revoke: BTreeSet<&TaskId> = BTreeSet::new();
    for (input, task) in state.inputs() {
        if observed.inputs.contains(input) {
            continue;
        }
        match task.as_ref().map(|t| (t, &state.tasks()[t].phase)) {
            Some((task, TaskPhase::Running { .. })) => {
                revoke.insert(task);
            }
            Some((_, TaskPhase::Starting { .. } | TaskPhase::Stopping { .. })) => {}
            _ => removable.push(input.clone()),
        }
    }
    for inputs in removable.chunks(INPUTS_PER_COMMAND_MAX) {
        actions.push(Action::Append(Command::RemoveInputs(RemoveInputs {
            inputs: inputs.to_vec(),
        })));
    }

    // 3. Who should work: live containers minus the ones being drained. An orchestrator
    //    picks the containers it stops; draining others as well would stop one container too
    //    many, and the orchestrator would start it again.
    let drain = if observed.orchestrated {
        BTreeSet::new()
    } else {
        draining(state, observed.desired_containers)
    };
    let mut load: BTreeMap<ContainerId, (usize, Offset)> = state
        .live_sessions()
        .filter(|s| !drain.contains(&s.container))
        .map(|s| (s.container, (0, s.epoch)))
        .collect();
    for task in state.tasks().values() {
        if let Some(owner) = task.phase.owner() {
            if let Some((n, _)) = load.get_mut(&owner.container) {
                *n += 1;
            }
        }
    }

    // 4. What each task should hold: the grouping of the inputs that stay.
    let mut wanted: BTreeMap<TaskId, BTreeSet<Input>> = BTreeMap::new();
    for input in state.inputs().keys() {
        if observed.inputs.contains(input) && !removable.contains(input) {
            wanted
                .entry(grouper.task_for(input))
                .or_default()
                .insert(input.clone());
        }
    }
    let mut stops: Vec<(TaskId, Session)> = Vec::new();
    let mut moving = 0;
    for (task, record) in state.tasks() {
        match &record.phase {
            TaskPhase::Running { owner, .. } => {
                let regroup = wanted.get(task) != Some(&record.inputs);
                if revoke.contains(task) || regroup || drain.contains(&owner.container) {
                    stops.push((task.clone(), owner.clone()));
                }
            }
            TaskPhase::Stopping { .. } => moving += 1,
            _ => {}
        }
    }
    // The least-loaded container first (ties: the oldest session, then the name), kept in a
    // heap: a job's first plan assigns every task, ten thousand over ten thousand containers.
    let mut least_loaded: BinaryHeap<Reverse<(usize, Offset, &ContainerId)>> = load
        .iter()
        .map(|(c, &(n, epoch))| Reverse((n, epoch, c)))
        .collect();
    let mut assigned: Vec<ContainerId> = Vec::new();
    for (task, inputs) in &wanted {
        let phase = state.tasks().get(task).map(|t| &t.phase);
        if !matches!(phase, None | Some(TaskPhase::Unassigned)) {
            continue;
        }
        let Some(Reverse((n, epoch, container))) = least_loaded.pop() else {
            break;
        };
        least_loaded.push(Reverse((n + 1, epoch, container)));
        assigned.push(container.clone());
        actions.push(Action::Append(Command::AssignTask(AssignTask {
            task: task.clone(),
            container: container.clone(),
            epoch,
            inputs: inputs.iter().cloned().collect(),
        })));
    }
    drop(least_loaded);
    for container in &assigned {
        if let Some((n, _)) = load.get_mut(container) {
            *n += 1;
        }
    }

    // 5. Balance: move one task from the busiest to the idlest container when they differ by
    //    two or more, one move at a time.
    if stops.is_empty() && moving < MOVES_IN_FLIGHT_MAX && !actions.iter().any(is_assign) {
        let busiest = load
            .iter()
            .max_by_key(|&(c, &(n, _))| (n, std::cmp::Reverse(c)));
        let idlest = load.values().map(|(n, _)| *n).min();
        if let (Some((busiest, (most, _))), Some(least)) = (busiest, idlest) {
            if most >= &(least + 2) {
                let victim = state
                    .tasks()
                    .iter()
                    .find_map(|(task, record)| match &record.phase {
                        TaskPhase::Running { owner, .. } if owner.container == *busiest => {
                            Some((task.clone(), owner.clone()))
                        }
                        _ => None,
                    });
                stops.extend(victim);
            }
        }
    }
    for (task, owner) in stops {
        actions.push(Action::Append(Command::StopTask(StopTask {
            task,
            container: owner.container,
            epoch: owner.epoch,
        })));
    }

    // 6. A drained container that owns nothing leaves: deregistered, then stopped.
    for container in &drain {
        let owns_nothing = state
            .tasks()
            .values()
            .all(|t| t.phase.owner().is_none_or(|o| o.container != *container));
        if owns_nothing {
            let session = state
                .live_session(container)
                .expect("drained containers are live");
            actions.push(Action::Append(Command::DeregisterContainer(
                DeregisterContainer {
                    container: container.clone(),
                    epoch: session.epoch,
                },
            )));
            actions.push(Action::Stop(container.clone()));
        }
    }

    // 7. Capacity: launch what is missing (an orchestrator starts its own).
    if observed.orchestrated {
        return actions;
    }
    let live = state.live_sessions().count();
    let missing = (observed.desired_containers as usize).saturating_sub(live + observed.launching);
    if missing > 0 {
        actions.push(Action::Launch(missing));
    }
    actions
}

fn is_assign(action: &Action) -> bool {
    matches!(action, Action::Append(Command::AssignTask(_)))
}

// The plan's examples are the scenario scripts (`scenarios.rs`). This test stays in Rust: it
// counts thousands of inputs and measures a command in bytes.
#[cfg(test)]
mod tests {
    use super::*;
    use crate::jobs::Outcome;
    use crate::log::*;

    /// A JobState built from commands that must all be accepted.
    fn state_after(commands: Vec<Command>) -> JobState {
        let mut state = JobState::default();
        for command in commands {
            let target = command.default_target();
            let outcome = state.apply(None, &target, &command.clone().into_frame(), 0);
            assert!(
                matches!(outcome, Outcome::Appended { .. }),
                "{command:?}: {outcome:?}"
            );
        }
        state
    }

    fn c(name: &str) -> ContainerId {
        ContainerId::new(name).unwrap()
    }

    fn input(p: u32) -> Input {
        Input::new("kafka", "events", p).unwrap()
    }

    fn register(name: &str) -> Command {
        Command::RegisterContainer(RegisterContainer {
            container: c(name),
            location: String::new(),
        })
    }

    fn observed(partitions: std::ops::Range<u32>, desired: u32) -> Observed {
        Observed {
            inputs: Arc::new(partitions.map(input).collect()),
            desired_containers: desired,
            ..Observed::default()
        }
    }

    fn appended(actions: &[Action]) -> Vec<&Command> {
        actions
            .iter()
            .filter_map(|a| match a {
                Action::Append(c) => Some(c),
                _ => None,
            })
            .collect()
    }

    /// Goal: a job's first plan adds any number of inputs in commands the log accepts.
    /// Steps: plan 2,500 new inputs: three `AddInputs`, of at most `INPUTS_PER_COMMAND_MAX`
    /// each, that name every input once; the largest such command, with names of the longest
    /// length allowed, encodes within the default `command_bytes_max`; and once the state
    /// holds them, the inputs are removed in chunks alike. (Before, one command named them
    /// all: 100,000 inputs were refused as too large at every tick.)
    #[test]
    fn many_inputs_are_added_and_removed_in_commands_of_bounded_size() {
        let state = state_after(vec![register("a")]);
        let actions = plan(&state, &observed(0..2_500, 1), &GroupByPartition);
        let added: Vec<&Vec<Input>> = appended(&actions)
            .into_iter()
            .map(|c| match c {
                Command::AddInputs(add) => &add.inputs,
                other => panic!("not an AddInputs: {other:?}"),
            })
            .collect();
        assert_eq!(
            added.iter().map(|inputs| inputs.len()).collect::<Vec<_>>(),
            [1024, 1024, 452]
        );
        let named: BTreeSet<&Input> = added.iter().flat_map(|inputs| inputs.iter()).collect();
        assert_eq!(named.len(), 2_500);

        let longest = "n".repeat(crate::log::NAME_BYTES_MAX);
        let largest = Command::AddInputs(AddInputs {
            inputs: (0..INPUTS_PER_COMMAND_MAX as u32)
                .map(|p| Input::new(&longest, &longest, u32::MAX - p).unwrap())
                .collect(),
        });
        assert!(largest.into_frame().encoded_len() < crate::log::COMMAND_BYTES_MAX_DEFAULT);

        let all: Vec<Input> = (0..2_500).map(input).collect();
        let state = state_after(vec![
            register("a"),
            Command::AddInputs(AddInputs { inputs: all }),
        ]);
        let actions = plan(&state, &observed(0..0, 1), &GroupByPartition);
        let removed: Vec<usize> = appended(&actions)
            .into_iter()
            .map(|c| match c {
                Command::RemoveInputs(remove) => remove.inputs.len(),
                other => panic!("not a RemoveInputs: {other:?}"),
            })
            .collect();
        assert_eq!(removed, [1024, 1024, 452]);
    }
}
