//! Why the job model refused a command.

use std::collections::VecDeque;

use serde::{Deserialize, Serialize};

use crate::log::{ContainerId, Epoch, Input, Kind, Level, Offset, Target, TaskId};

/// How many recent refusals a replica keeps for operators.
pub const REJECTIONS_KEPT: usize = 64;

/// One refused command, as the replicas recorded it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RecordedRejection {
    /// The last offset accepted before it (refused commands take none).
    pub after_offset: Offset,
    pub kind: Kind,
    pub version: u16,
    /// The leader's clock when the batch carrying it was proposed.
    pub appended_at_ms: u64,
    pub rejection: Rejection,
}

/// The replicas' record of refused commands: a count and the most recent few. Derived from the
/// log alone, so identical on every replica and kept in snapshots; not part of JobState, whose
/// fold from the delivered entries alone must equal the replicas' (refusals are not delivered).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RejectionLog {
    pub total: u64,
    pub recent: VecDeque<RecordedRejection>,
}

impl RejectionLog {
    pub fn record(&mut self, rejection: RecordedRejection) {
        self.total += 1;
        self.recent.push_back(rejection);
        while self.recent.len() > REJECTIONS_KEPT {
            self.recent.pop_front();
        }
    }
}

/// A command the replicated state machine refused. Refused commands take no offset, so the
/// command stream holds only commands that were valid when applied; the refusal is that
/// proposal's outcome, identical on every replica, and is returned to the appender.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
pub enum Rejection {
    /// The sender's `(container, epoch)` is not a live session: the container expired,
    /// deregistered or registered again since. `current_epoch` is the live one, if any.
    #[error("container {container} epoch {epoch} is fenced (current epoch: {current_epoch:?})")]
    Fenced {
        container: ContainerId,
        epoch: Epoch,
        current_epoch: Option<Epoch>,
    },
    #[error("unknown task {task}")]
    UnknownTask { task: TaskId },
    /// The task is not in the phase this command needs from this container (an ack from the
    /// wrong container, a stop for a task it does not run, a second start ack).
    #[error("task {task} is {phase}, not awaiting this from {container}")]
    WrongOwnerOrPhase {
        task: TaskId,
        container: ContainerId,
        phase: String,
    },
    /// Assigning a task that another container still owns: stop it first.
    #[error("task {task} is still owned by {owner}")]
    TaskOwned { task: TaskId, owner: ContainerId },
    #[error("input {input} was never added")]
    UnknownInput { input: Input },
    #[error("input {input} belongs to task {task}, which is owned; stop it first")]
    InputInUse { input: Input, task: TaskId },
    /// An ack of an offset the log has not reached.
    #[error("offset {offset} does not exist yet")]
    NoSuchOffset { offset: Offset },
    /// The recorded vocabulary level does not allow this `(kind, version)` yet.
    #[error("kind {kind} version {version} needs a vocabulary level above {level}")]
    NotYetAllowed {
        kind: Kind,
        version: u16,
        level: Level,
    },
    /// The `(kind, version)` is deprecated at the recorded level: write its successor.
    #[error("kind {kind} version {version} is deprecated at vocabulary level {level}")]
    Deprecated {
        kind: Kind,
        version: u16,
        level: Level,
    },
    #[error("kind {kind} version {version} is not part of the vocabulary")]
    UnknownKind { kind: Kind, version: u16 },
    #[error("kind {kind} version {version} does not decode: {reason}")]
    Malformed {
        kind: Kind,
        version: u16,
        reason: String,
    },
    #[error("invalid name {name:?}")]
    InvalidName { name: String },
    /// A built-in command appended with a target other than its own; it would not reach the
    /// container it is for.
    #[error("this command must be addressed to {expected}")]
    WrongTarget { expected: Target },
    /// The level is above what the leader, or another member the leader asked, supports;
    /// upgrade every replica first. (Checked on append by the leader, not by the state
    /// machine.)
    #[error(
        "vocabulary level {requested} is above the {supported} a replica of this cluster \
         supports: upgrade every replica before raising it"
    )]
    LevelUnsupported { requested: Level, supported: Level },
    /// The vocabulary level only goes up.
    #[error("the vocabulary level is {current}; {requested} does not raise it")]
    LevelNotRaised { current: Level, requested: Level },
    // Added after v0.1.0, last, so that the rejections before keep their encoding.
    /// A launch of a container that is live or already being launched.
    #[error("container {container} is live or being launched already")]
    ContainerExists { container: ContainerId },
    /// A launch to cancel that is not in flight: the container registered, or the launch was
    /// cancelled, or replaced, already.
    #[error("no launch of {container} at offset {launch} is in flight")]
    NoSuchLaunch {
        container: ContainerId,
        launch: Offset,
    },
}
