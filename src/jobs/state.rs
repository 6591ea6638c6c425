//! [`JobState`]: the fold of the control log.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use super::model::*;
use super::producers::{ProducerTable, Seen};
use super::rejection::Rejection;
use crate::log::vocabulary::{
    kind_spec, Undecodable, Vocabulary, LEVEL_FORGOTTEN_PRODUCERS_REFUSED, LEVEL_INITIAL, LEVEL_MAX,
};
use crate::log::{
    Ack, AddInputs, AssignTask, Batch, CancelLaunch, Command, ConfigChange, ContainerId, Epoch,
    Frame, Input, LaunchContainer, Level, LogEntry, Offset, ProducerSeq, RegisterContainer,
    RemoveInputs, SchemaChange, Seq, StopTask, Target, TaskId, TaskStarted, TaskStopped,
    CUSTOM_KIND_MIN,
};

/// Records of containers that left or expired are kept (so that their zombies are told
/// `Fenced` with the epoch that replaced them) up to this many; the oldest go first. Past
/// that, a zombie is still fenced, without the detail.
pub const DEAD_CONTAINERS_KEPT: usize = 1024;

/// What applying one proposal did.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Outcome {
    /// Appended at this offset.
    Appended {
        /// The offset the command now holds.
        offset: Offset,
    },
    /// The `(producer, seq)` pair was appended before, at `offset`; nothing new was appended.
    Duplicate {
        /// The offset of the original append, which answers the retry.
        offset: Offset,
    },
    /// The pair's sequence is too far below the producer's newest to tell a retry from a late
    /// first attempt (see [`PRODUCER_WINDOW`](super::PRODUCER_WINDOW)); nothing was appended.
    OutOfWindow {
        /// The lowest sequence of this producer still decided; every one below is refused.
        lowest: Seq,
    },
    /// The job model refused the command; it took no offset.
    Rejected(Rejection),
    /// The producer is not remembered and the sequence is not one a producer begins with, so
    /// this may be the retry of an append made before the producer was forgotten (see
    /// [`LEVEL_FORGOTTEN_PRODUCERS_REFUSED`]); nothing was appended. From vocabulary level 3
    /// only.
    ProducerForgotten,
}

impl Outcome {
    /// The offset the command holds, unless it was refused.
    pub fn offset(&self) -> Option<Offset> {
        match self {
            Outcome::Appended { offset } | Outcome::Duplicate { offset } => Some(*offset),
            Outcome::OutOfWindow { .. } | Outcome::Rejected(_) | Outcome::ProducerForgotten => None,
        }
    }
}

/// Why a subscriber's replay of delivered entries does not fit its state.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ReplayError {
    /// The entry is not the next one this state expects: entries were missed (a filtered
    /// subscription) or repeated, or the state is not of this log. Load a state from a
    /// replica and replay from its offset.
    #[error("entry at offset {got} where {expected} was due")]
    Gap {
        /// The offset this state expects next ([`JobState::next_offset`]).
        expected: Offset,
        /// The offset of the entry given.
        got: Offset,
    },
    /// The entry did not fold here as it did on the replicas: this state is not the one the
    /// log had at that offset. Load a state from a replica and replay from its offset.
    #[error("entry at offset {offset} does not apply here: {outcome:?}")]
    Diverged {
        /// The entry's offset.
        offset: Offset,
        /// What folding it here gave instead of [`Outcome::Appended`].
        outcome: Outcome,
    },
}

/// The whole control log folded into one value: the job as the log describes it.
///
/// Invariants:
/// * Offsets start at 1 and grow by exactly one per accepted command, so they are contiguous
///   and a pure function of the log. Duplicates and refused commands take none.
/// * `apply_*` are total and deterministic: they read no clock and never panic; an invalid
///   command becomes an [`Outcome::Rejected`] and changes nothing.
/// * At most one session owns a task at any offset (see [`TaskPhase`]); an input belongs to at
///   most one task, and `inputs` and the tasks' input sets agree.
/// * Every open handshake is owed only by live sessions: a session's end (expiry,
///   deregistration, re-registration) releases its tasks and cancels what it owed.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct JobState {
    next_offset: Offset,
    producers: ProducerTable,
    level: Level,
    containers: BTreeMap<ContainerId, ContainerRecord>,
    /// Every input of the job → the task it belongs to, if any.
    inputs: BTreeMap<Input, Option<TaskId>>,
    tasks: BTreeMap<TaskId, TaskRecord>,
    schemas: BTreeMap<String, SchemaRecord>,
    config: BTreeMap<String, String>,
    desired: Option<DesiredCount>,
    /// Offset of the command awaiting answers → who owes them.
    pending: BTreeMap<Offset, Handshake>,
}

impl Default for JobState {
    fn default() -> Self {
        JobState {
            next_offset: 1,
            producers: ProducerTable::default(),
            level: LEVEL_INITIAL,
            containers: BTreeMap::new(),
            inputs: BTreeMap::new(),
            tasks: BTreeMap::new(),
            schemas: BTreeMap::new(),
            config: BTreeMap::new(),
            desired: None,
            pending: BTreeMap::new(),
        }
    }
}

fn check(condition: bool, rejection: impl FnOnce() -> Rejection) -> Result<(), Rejection> {
    if condition {
        Ok(())
    } else {
        Err(rejection())
    }
}

/// The names a command carries, all of which must be valid.
fn check_names(command: &Command) -> Result<(), Rejection> {
    let container = |c: &ContainerId| check(c.is_valid(), || invalid(c.as_str()));
    let task = |t: &TaskId| check(t.is_valid(), || invalid(t.as_str()));
    let inputs = |inputs: &[Input]| {
        inputs
            .iter()
            .try_for_each(|i| check(i.is_valid(), || invalid(&i.to_string())))
    };
    match command {
        Command::RegisterContainer(c) => container(&c.container),
        Command::DeregisterContainer(c) => container(&c.container),
        Command::ExpireContainer(c) => container(&c.container),
        Command::AddInputs(c) => inputs(&c.inputs),
        Command::RemoveInputs(c) => inputs(&c.inputs),
        Command::AssignTask(c) => container(&c.container)
            .and(task(&c.task))
            .and(inputs(&c.inputs)),
        Command::StopTask(c) => container(&c.container).and(task(&c.task)),
        Command::TaskStarted(c) => container(&c.container).and(task(&c.task)),
        Command::TaskStopped(c) => container(&c.container).and(task(&c.task)),
        Command::Ack(c) => container(&c.container),
        Command::LaunchContainer(c) => container(&c.container),
        Command::CancelLaunch(c) => container(&c.container),
        _ => Ok(()),
    }
}

fn invalid(name: &str) -> Rejection {
    Rejection::InvalidName {
        name: name.to_string(),
    }
}

impl JobState {
    /// The offset the next appended command will get.
    pub fn next_offset(&self) -> Offset {
        self.next_offset
    }

    /// The offset of the last appended command, 0 before the first.
    pub fn last_offset(&self) -> Offset {
        self.next_offset - 1
    }

    /// The idempotent-producer table: which `(producer, seq)` pairs were appended, and at
    /// which offsets.
    pub fn producers(&self) -> &ProducerTable {
        &self.producers
    }

    /// The recorded vocabulary level.
    pub fn level(&self) -> Level {
        self.level
    }

    /// Whether this build understands the recorded level. If not, `apply` passes the kinds it
    /// does not know through unchecked, which a reader replaying a newer log may do; a
    /// replica's state machine instead stops applying (fail-stop, `raft::state_machine`),
    /// since it would accept what replicas knowing the level refuse.
    pub fn level_understood(&self) -> bool {
        self.level <= LEVEL_MAX
    }

    /// Every container the log knows, by id: live, launching, or gone (the records of gone
    /// ones are kept up to [`DEAD_CONTAINERS_KEPT`], the oldest forgotten first).
    pub fn containers(&self) -> &BTreeMap<ContainerId, ContainerRecord> {
        &self.containers
    }

    /// The live session of a container, if it has one.
    pub fn live_session(&self, container: &ContainerId) -> Option<Session> {
        self.containers
            .get(container)
            .filter(|r| r.status == ContainerStatus::Live)
            .map(|r| Session {
                container: container.clone(),
                epoch: r.epoch,
            })
    }

    /// Every live session's container and epoch, by container name, borrowed: for a pass
    /// over ten thousand sessions every controller tick, which must not copy each name.
    pub fn live_epochs(&self) -> impl Iterator<Item = (&ContainerId, Epoch)> + '_ {
        self.containers
            .iter()
            .filter(|(_, r)| r.status == ContainerStatus::Live)
            .map(|(container, r)| (container, r.epoch))
    }

    /// Every live session, by container name.
    pub fn live_sessions(&self) -> impl Iterator<Item = Session> + '_ {
        self.containers
            .iter()
            .filter(|(_, r)| r.status == ContainerStatus::Live)
            .map(|(container, r)| Session {
                container: container.clone(),
                epoch: r.epoch,
            })
    }

    /// Every input of the job, with the task it belongs to (`None` until one is assigned it).
    pub fn inputs(&self) -> &BTreeMap<Input, Option<TaskId>> {
        &self.inputs
    }

    /// Every task of the job, by name: its inputs, phase and last checkpoint. A task appears
    /// when first assigned, and is dropped after losing its last input while unassigned.
    pub fn tasks(&self) -> &BTreeMap<TaskId, TaskRecord> {
        &self.tasks
    }

    /// The latest schema of each subject, by subject.
    pub fn schemas(&self) -> &BTreeMap<String, SchemaRecord> {
        &self.schemas
    }

    /// The job's configuration: every key a `ConfigChange` set and none removed since.
    pub fn config(&self) -> &BTreeMap<String, String> {
        &self.config
    }

    /// The container count the coordinator recorded last (`DesiredContainers`), `None`
    /// before the first.
    pub fn desired_containers(&self) -> Option<&DesiredCount> {
        self.desired.as_ref()
    }

    /// Open handshakes by the offset of the command awaiting answers.
    pub fn pending(&self) -> &BTreeMap<Offset, Handshake> {
        &self.pending
    }

    /// Folds one committed batch in, returning one outcome per proposal. The appended
    /// commands' entries are not built here: readers rebuild them from the Raft entry on fetch,
    /// so applying copies no command bodies.
    pub fn apply_batch(&mut self, batch: &Batch) -> Vec<Outcome> {
        batch
            .proposals
            .iter()
            .map(|p| self.apply(p.producer, &p.target, &p.frame, batch.appended_at_ms))
            .collect()
    }

    /// Folds one entry a subscriber received, as a replica folded the proposal it came from.
    /// Entries must come in offset order with no gap (an unfiltered subscription).
    pub fn apply_entry(&mut self, entry: &LogEntry) -> Result<(), ReplayError> {
        if entry.offset != self.next_offset {
            return Err(ReplayError::Gap {
                expected: self.next_offset,
                got: entry.offset,
            });
        }
        match self.apply(
            entry.producer,
            &entry.target,
            &entry.frame,
            entry.appended_at_ms,
        ) {
            Outcome::Appended { .. } => Ok(()),
            outcome => Err(ReplayError::Diverged {
                offset: entry.offset,
                outcome,
            }),
        }
    }

    /// Folds one proposal: de-duplicates it, checks it, and gives it the next offset.
    pub fn apply(
        &mut self,
        producer: Option<ProducerSeq>,
        target: &Target,
        frame: &Frame,
        appended_at_ms: u64,
    ) -> Outcome {
        if let Some(pair) = producer {
            match self.producers.check(pair) {
                Seen::New => {}
                Seen::Duplicate { offset } => return Outcome::Duplicate { offset },
                Seen::OutOfWindow { lowest } => return Outcome::OutOfWindow { lowest },
                // Decided by the recorded level, never by the build, so that a replica still on
                // a build before level 3 decides exactly as the others do.
                Seen::UnknownProducer if self.level >= LEVEL_FORGOTTEN_PRODUCERS_REFUSED => {
                    return Outcome::ProducerForgotten
                }
                Seen::UnknownProducer => {}
            }
        }
        let offset = self.next_offset;
        if let Err(rejection) = self.apply_command(target, frame, offset, appended_at_ms) {
            return Outcome::Rejected(rejection);
        }
        self.next_offset += 1;
        if let Some(pair) = producer {
            self.producers.record(pair, offset);
        }
        Outcome::Appended { offset }
    }

    /// Checks a command against the vocabulary gate, its target and the job, and applies its
    /// effects at `offset`. Every check precedes every change, so a refusal changes nothing.
    fn apply_command(
        &mut self,
        target: &Target,
        frame: &Frame,
        offset: Offset,
        at_ms: u64,
    ) -> Result<(), Rejection> {
        if frame.kind >= CUSTOM_KIND_MIN {
            return Ok(()); // the users' own: ordered and replicated, never interpreted
        }
        let (kind, version, level) = (frame.kind, frame.version, self.level);
        let Some(spec) = kind_spec(kind, version) else {
            if self.level_understood() {
                // Every kind allowed at a level this build understands is known to it.
                return Err(Rejection::UnknownKind { kind, version });
            }
            // A level newer than this build: a newer replica decides it; pass it through (a
            // replica's state machine never gets here: it stops at such a level).
            return Ok(());
        };
        check(spec.since <= level, || Rejection::NotYetAllowed {
            kind,
            version,
            level,
        })?;
        check(
            spec.deprecated_since.is_none_or(|since| level < since),
            || Rejection::Deprecated {
                kind,
                version,
                level,
            },
        )?;
        let command = Vocabulary::CURRENT
            .decode_builtin(frame)
            .map_err(|e| match e {
                Undecodable::UnknownKind => Rejection::UnknownKind { kind, version },
                Undecodable::Malformed(reason) => Rejection::Malformed {
                    kind,
                    version,
                    reason,
                },
            })?;
        let expected = command
            .target()
            .expect("every built-in command has a target");
        check(*target == expected, || Rejection::WrongTarget {
            expected: expected.clone(),
        })?;
        check_names(&command)?;
        match command {
            Command::RegisterContainer(c) => {
                self.register(c, offset, at_ms);
                Ok(())
            }
            Command::DeregisterContainer(c) => {
                self.end(&c.container, c.epoch, ContainerStatus::Deregistered)
            }
            Command::ExpireContainer(c) => {
                self.end(&c.container, c.epoch, ContainerStatus::Expired)
            }
            Command::AddInputs(c) => {
                self.add_inputs(c);
                Ok(())
            }
            Command::RemoveInputs(c) => self.remove_inputs(c),
            Command::AssignTask(c) => self.assign(c, offset),
            Command::StopTask(c) => self.stop(c, offset),
            Command::TaskStarted(c) => self.started(c, offset),
            Command::TaskStopped(c) => self.stopped(c),
            Command::DesiredContainersV1(c) => {
                self.desired = Some(DesiredCount {
                    count: c.count,
                    reason: String::new(),
                    offset,
                });
                Ok(())
            }
            Command::DesiredContainers(c) => {
                self.desired = Some(DesiredCount {
                    count: c.count,
                    reason: c.reason,
                    offset,
                });
                Ok(())
            }
            Command::SchemaChange(c) => {
                self.schema_change(c, offset);
                Ok(())
            }
            Command::ConfigChange(c) => {
                self.config_change(c, offset);
                Ok(())
            }
            Command::Ack(c) => self.ack(c, offset),
            Command::SetVocabularyLevel(c) => {
                check(c.level > level, || Rejection::LevelNotRaised {
                    current: level,
                    requested: c.level,
                })?;
                self.level = c.level;
                Ok(())
            }
            Command::LaunchContainer(c) => self.launch(c, offset, at_ms),
            Command::CancelLaunch(c) => self.cancel_launch(c),
            Command::Custom { .. } | Command::Unknown(_) => {
                unreachable!("decode_builtin returns built-in commands only")
            }
        }
    }

    /// Checks that `(container, epoch)` is the container's live session.
    fn live(&self, container: &ContainerId, epoch: Epoch) -> Result<Session, Rejection> {
        match self.live_session(container) {
            Some(session) if session.epoch == epoch => Ok(session),
            live => Err(Rejection::Fenced {
                container: container.clone(),
                epoch,
                current_epoch: live.map(|s| s.epoch),
            }),
        }
    }

    fn register(&mut self, c: RegisterContainer, offset: Offset, at_ms: u64) {
        if let Some(previous) = self.live_session(&c.container) {
            self.end_session(&previous);
        }
        self.containers.insert(
            c.container,
            ContainerRecord {
                epoch: offset,
                status: ContainerStatus::Live,
                location: c.location,
                registered_at_ms: at_ms,
            },
        );
    }

    fn end(
        &mut self,
        container: &ContainerId,
        epoch: Epoch,
        status: ContainerStatus,
    ) -> Result<(), Rejection> {
        let session = self.live(container, epoch)?;
        self.end_session(&session);
        if let Some(record) = self.containers.get_mut(container) {
            record.status = status;
        }
        self.forget_oldest_dead();
        Ok(())
    }

    /// A session ended: its tasks become unassigned and what it owed is cancelled.
    fn end_session(&mut self, session: &Session) {
        for task in self.tasks.values_mut() {
            if task.phase.owner() == Some(session) {
                task.phase = TaskPhase::Unassigned;
            }
        }
        self.pending.retain(|_, handshake| {
            let owed = handshake.owed_by.get(&session.container) == Some(&session.epoch);
            if owed {
                handshake.owed_by.remove(&session.container);
            }
            // A task handshake dies with its session; a broadcast completes without it.
            let task_handshake_of_session = owed && handshake.awaiting != Awaiting::Acks;
            !task_handshake_of_session && !handshake.owed_by.is_empty()
        });
    }

    /// Records a launch about to be carried out: the container is `Launching` until it
    /// registers or the launch is cancelled.
    fn launch(&mut self, c: LaunchContainer, offset: Offset, at_ms: u64) -> Result<(), Rejection> {
        let taken = self.containers.get(&c.container).is_some_and(|r| {
            matches!(
                r.status,
                ContainerStatus::Live | ContainerStatus::Launching { .. }
            )
        });
        check(!taken, || Rejection::ContainerExists {
            container: c.container.clone(),
        })?;
        self.containers.insert(
            c.container,
            ContainerRecord {
                epoch: offset,
                status: ContainerStatus::Launching { attempt: c.attempt },
                location: String::new(),
                registered_at_ms: at_ms,
            },
        );
        Ok(())
    }

    fn cancel_launch(&mut self, c: CancelLaunch) -> Result<(), Rejection> {
        let record = self.containers.get_mut(&c.container).filter(|r| {
            r.epoch == c.launch && matches!(r.status, ContainerStatus::Launching { .. })
        });
        let Some(record) = record else {
            return Err(Rejection::NoSuchLaunch {
                container: c.container,
                launch: c.launch,
            });
        };
        record.status = ContainerStatus::Expired;
        self.forget_oldest_dead();
        Ok(())
    }

    fn forget_oldest_dead(&mut self) {
        let mut dead: Vec<(Epoch, ContainerId)> = self
            .containers
            .iter()
            .filter(|(_, r)| {
                matches!(
                    r.status,
                    ContainerStatus::Deregistered | ContainerStatus::Expired
                )
            })
            .map(|(c, r)| (r.epoch, c.clone()))
            .collect();
        if dead.len() > DEAD_CONTAINERS_KEPT {
            dead.sort();
            for (_, container) in dead.drain(..dead.len() - DEAD_CONTAINERS_KEPT) {
                self.containers.remove(&container);
            }
        }
    }

    fn add_inputs(&mut self, c: AddInputs) {
        for input in c.inputs {
            self.inputs.entry(input).or_insert(None);
        }
    }

    /// The task an input belongs to, if that task is owned.
    fn owned_task_of(&self, input: &Input) -> Option<&TaskId> {
        let task = self.inputs.get(input)?.as_ref()?;
        self.tasks.get(task)?.phase.owner().map(|_| task)
    }

    fn remove_inputs(&mut self, c: RemoveInputs) -> Result<(), Rejection> {
        for input in &c.inputs {
            check(self.inputs.contains_key(input), || {
                Rejection::UnknownInput {
                    input: input.clone(),
                }
            })?;
            if let Some(task) = self.owned_task_of(input) {
                return Err(Rejection::InputInUse {
                    input: input.clone(),
                    task: task.clone(),
                });
            }
        }
        for input in c.inputs {
            if let Some(Some(task)) = self.inputs.remove(&input) {
                self.take_input_from(&task, &input);
            }
        }
        Ok(())
    }

    /// Removes an input from an unowned task, dropping the task once it has none left.
    fn take_input_from(&mut self, task: &TaskId, input: &Input) {
        if let Some(record) = self.tasks.get_mut(task) {
            record.inputs.remove(input);
            if record.inputs.is_empty() && record.phase == TaskPhase::Unassigned {
                self.tasks.remove(task);
            }
        }
    }

    fn assign(&mut self, c: AssignTask, offset: Offset) -> Result<(), Rejection> {
        let owner = self.live(&c.container, c.epoch)?;
        if let Some(current) = self.tasks.get(&c.task).and_then(|t| t.phase.owner()) {
            return Err(Rejection::TaskOwned {
                task: c.task,
                owner: current.container.clone(),
            });
        }
        for input in &c.inputs {
            match self.inputs.get(input) {
                None => {
                    return Err(Rejection::UnknownInput {
                        input: input.clone(),
                    })
                }
                Some(Some(task)) if *task != c.task => {
                    if let Some(task) = self.owned_task_of(input) {
                        return Err(Rejection::InputInUse {
                            input: input.clone(),
                            task: task.clone(),
                        });
                    }
                }
                Some(_) => {}
            }
        }
        let wanted: BTreeSet<Input> = c.inputs.into_iter().collect();
        let previous = self
            .tasks
            .get(&c.task)
            .map(|t| t.inputs.clone())
            .unwrap_or_default();
        for input in previous.difference(&wanted) {
            self.inputs.insert(input.clone(), None);
        }
        for input in &wanted {
            if let Some(Some(other)) = self.inputs.insert(input.clone(), Some(c.task.clone())) {
                if other != c.task {
                    self.take_input_from(&other, input);
                }
            }
        }
        let record = self.tasks.entry(c.task.clone()).or_insert(TaskRecord {
            inputs: BTreeSet::new(),
            phase: TaskPhase::Unassigned,
            checkpoint: None,
        });
        record.inputs = wanted;
        record.phase = TaskPhase::Starting {
            owner: owner.clone(),
            at: offset,
        };
        self.pending.insert(
            offset,
            Handshake {
                awaiting: Awaiting::TaskStarted { task: c.task },
                owed_by: BTreeMap::from([(owner.container, owner.epoch)]),
            },
        );
        Ok(())
    }

    /// The task, checked to be owned by `session` in a phase `accept` allows.
    fn owned_task(
        &self,
        task: &TaskId,
        session: &Session,
        accept: impl Fn(&TaskPhase) -> bool,
    ) -> Result<&TaskRecord, Rejection> {
        let record = self
            .tasks
            .get(task)
            .ok_or_else(|| Rejection::UnknownTask { task: task.clone() })?;
        check(
            record.phase.owner() == Some(session) && accept(&record.phase),
            || Rejection::WrongOwnerOrPhase {
                task: task.clone(),
                container: session.container.clone(),
                phase: record.phase.to_string(),
            },
        )?;
        Ok(record)
    }

    fn stop(&mut self, c: StopTask, offset: Offset) -> Result<(), Rejection> {
        let session = self.live(&c.container, c.epoch)?;
        let record = self.owned_task(&c.task, &session, |phase| {
            matches!(
                phase,
                TaskPhase::Starting { .. } | TaskPhase::Running { .. }
            )
        })?;
        if let TaskPhase::Starting { at, .. } = record.phase {
            self.pending.remove(&at);
        }
        let record = self.tasks.get_mut(&c.task).expect("checked above");
        record.phase = TaskPhase::Stopping {
            owner: session.clone(),
            at: offset,
        };
        self.pending.insert(
            offset,
            Handshake {
                awaiting: Awaiting::TaskStopped { task: c.task },
                owed_by: BTreeMap::from([(session.container, session.epoch)]),
            },
        );
        Ok(())
    }

    fn started(&mut self, c: TaskStarted, offset: Offset) -> Result<(), Rejection> {
        let session = self.live(&c.container, c.epoch)?;
        let record = self.owned_task(&c.task, &session, |phase| {
            matches!(phase, TaskPhase::Starting { .. })
        })?;
        if let TaskPhase::Starting { at, .. } = record.phase {
            self.pending.remove(&at);
        }
        let record = self.tasks.get_mut(&c.task).expect("checked above");
        record.phase = TaskPhase::Running {
            owner: session,
            since: offset,
        };
        Ok(())
    }

    fn stopped(&mut self, c: TaskStopped) -> Result<(), Rejection> {
        let session = self.live(&c.container, c.epoch)?;
        let record = self.owned_task(&c.task, &session, |phase| {
            matches!(phase, TaskPhase::Stopping { .. })
        })?;
        if let TaskPhase::Stopping { at, .. } = record.phase {
            self.pending.remove(&at);
        }
        let record = self.tasks.get_mut(&c.task).expect("checked above");
        record.phase = TaskPhase::Unassigned;
        if c.checkpoint.is_some() {
            record.checkpoint = c.checkpoint;
        }
        Ok(())
    }

    /// Opens a broadcast handshake owed by every live container.
    fn broadcast(&mut self, offset: Offset) {
        let owed_by: BTreeMap<ContainerId, Epoch> = self
            .live_sessions()
            .map(|s| (s.container, s.epoch))
            .collect();
        if !owed_by.is_empty() {
            self.pending.insert(
                offset,
                Handshake {
                    awaiting: Awaiting::Acks,
                    owed_by,
                },
            );
        }
    }

    fn schema_change(&mut self, c: SchemaChange, offset: Offset) {
        self.schemas.insert(
            c.subject,
            SchemaRecord {
                offset,
                schema: c.schema,
            },
        );
        self.broadcast(offset);
    }

    fn config_change(&mut self, c: ConfigChange, offset: Offset) {
        for key in c.remove {
            self.config.remove(&key);
        }
        self.config.extend(c.set);
        self.broadcast(offset);
    }

    fn ack(&mut self, c: Ack, offset: Offset) -> Result<(), Rejection> {
        let session = self.live(&c.container, c.epoch)?;
        check(c.offset < offset, || Rejection::NoSuchOffset {
            offset: c.offset,
        })?;
        if let Some(handshake) = self.pending.get_mut(&c.offset) {
            let owed = handshake.owed_by.get(&session.container) == Some(&session.epoch);
            if handshake.awaiting == Awaiting::Acks && owed {
                handshake.owed_by.remove(&session.container);
                if handshake.owed_by.is_empty() {
                    self.pending.remove(&c.offset);
                }
            }
        }
        // An ack of anything else (a user command, a finished broadcast) is recorded in the
        // log and changes nothing here.
        Ok(())
    }
}
