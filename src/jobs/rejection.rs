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
    /// The refused command's kind.
    pub kind: Kind,
    /// The refused command's version.
    pub version: u16,
    /// The leader's clock when the batch carrying it was proposed.
    pub appended_at_ms: u64,
    /// Why it was refused.
    pub rejection: Rejection,
}

/// The replicas' record of refused commands: a count and the most recent few. Derived from the
/// log alone, so identical on every replica and kept in snapshots; not part of JobState, whose
/// fold from the delivered entries alone must equal the replicas' (refusals are not delivered).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RejectionLog {
    /// How many commands were refused since the log began.
    pub total: u64,
    /// The last [`REJECTIONS_KEPT`] refusals, oldest first.
    pub recent: VecDeque<RecordedRejection>,
}

impl RejectionLog {
    /// Counts one refusal and keeps it, dropping the oldest kept beyond [`REJECTIONS_KEPT`].
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
    #[error(
        "container {container} epoch {epoch} is fenced ({})",
        live_epoch(current_epoch)
    )]
    Fenced {
        /// The container the command named.
        container: ContainerId,
        /// The epoch the command carried.
        epoch: Epoch,
        /// The container's live epoch if it registered again since; `None` if it has no
        /// live session.
        current_epoch: Option<Epoch>,
    },
    /// A stop, or a container's answer, names a task the job does not have: never assigned,
    /// or dropped after losing its last input while unassigned. The sender's view of the job
    /// is stale: reload the state rather than resend.
    #[error("unknown task {task}")]
    UnknownTask {
        /// The task named.
        task: TaskId,
    },
    /// The task is not in the phase this command needs from this container (an ack from the
    /// wrong container, a stop for a task it does not run, a second start ack).
    #[error("task {task} is {phase}, not awaiting this from {container}")]
    WrongOwnerOrPhase {
        /// The task named.
        task: TaskId,
        /// The container that sent the command, or that it was addressed to.
        container: ContainerId,
        /// The task's phase when the command was applied, in words (for example
        /// `running on c1@4 (since 9)`).
        phase: String,
    },
    /// Assigning a task that another container still owns: stop it first.
    #[error("task {task} is still owned by {owner}")]
    TaskOwned {
        /// The task to assign.
        task: TaskId,
        /// The container that owns it now (starting, running or stopping it).
        owner: ContainerId,
    },
    /// An input to assign or remove is not one of the job's: it was never added, or was
    /// removed since. Add it first (`AddInputs`), or leave it out.
    #[error("input {input} was never added")]
    UnknownInput {
        /// The input the job does not have.
        input: Input,
    },
    /// An input to remove, or to assign to a task, belongs to another task that is owned:
    /// stop that task first (revoke before reassign).
    #[error("input {input} belongs to task {task}, which is owned; stop it first")]
    InputInUse {
        /// The input asked for.
        input: Input,
        /// The owned task it belongs to.
        task: TaskId,
    },
    /// An ack of an offset the log has not reached.
    #[error("offset {offset} does not exist yet")]
    NoSuchOffset {
        /// The offset acked: at or after the ack's own.
        offset: Offset,
    },
    /// The recorded vocabulary level does not allow this `(kind, version)` yet.
    #[error("kind {kind} version {version} needs a vocabulary level above {level}")]
    NotYetAllowed {
        /// The refused command's kind.
        kind: Kind,
        /// The refused command's version.
        version: u16,
        /// The level the log records, below the one the kind needs.
        level: Level,
    },
    /// The `(kind, version)` is deprecated at the recorded level: write its successor.
    #[error("kind {kind} version {version} is deprecated at vocabulary level {level}")]
    Deprecated {
        /// The refused command's kind.
        kind: Kind,
        /// The refused command's version.
        version: u16,
        /// The level the log records, at or above the one that deprecated it.
        level: Level,
    },
    /// A `(kind, version)` in the built-in range (below
    /// [`CUSTOM_KIND_MIN`](crate::log::CUSTOM_KIND_MIN)) that the vocabulary does not have:
    /// the appender is mistaken or newer than the cluster. User commands take kinds from
    /// `CUSTOM_KIND_MIN` up ([`Command::custom`](crate::log::Command::custom)).
    #[error("kind {kind} version {version} is not part of the vocabulary")]
    UnknownKind {
        /// The refused command's kind.
        kind: Kind,
        /// The refused command's version.
        version: u16,
    },
    /// A built-in `(kind, version)` whose body does not decode as that command: the
    /// appender's bug; resending it unchanged will not help.
    #[error("kind {kind} version {version} does not decode: {reason}")]
    Malformed {
        /// The refused command's kind.
        kind: Kind,
        /// The refused command's version.
        version: u16,
        /// What the decoder reported.
        reason: String,
    },
    /// A container id, task name or input in the command breaks the naming rules (1 to
    /// [`NAME_BYTES_MAX`](crate::log::NAME_BYTES_MAX) characters from `[A-Za-z0-9._:-]`).
    #[error("invalid name {name:?}")]
    InvalidName {
        /// The refused name (an input in its `system/stream/partition` form).
        name: String,
    },
    /// A built-in command appended with a target other than its own; it would not reach the
    /// container it is for.
    #[error("this command must be addressed to {expected}")]
    WrongTarget {
        /// The target the command must carry
        /// ([`Command::target`](crate::log::Command::target)).
        expected: Target,
    },
    /// The level is above what the leader, or another member the leader asked, supports;
    /// upgrade every replica first. (Checked on append by the leader, not by the state
    /// machine.)
    #[error(
        "vocabulary level {requested} is above the {supported} a replica of this cluster \
         supports: upgrade every replica before raising it"
    )]
    LevelUnsupported {
        /// The level asked for.
        requested: Level,
        /// The highest level the replica that refused knows: the leader's build, or the
        /// first member found that does not know `requested`.
        supported: Level,
    },
    /// The vocabulary level only goes up.
    #[error("the vocabulary level is {current}; {requested} does not raise it")]
    LevelNotRaised {
        /// The level the log records.
        current: Level,
        /// The level asked for, at or below `current`.
        requested: Level,
    },
    // Added after v0.1.0, last, so that the rejections before keep their encoding.
    /// A launch of a container that is live or already being launched.
    #[error("container {container} is live or being launched already")]
    ContainerExists {
        /// The container the launch named.
        container: ContainerId,
    },
    /// A launch to cancel that is not in flight: the container registered, or the launch was
    /// cancelled, or replaced, already.
    #[error("no launch of {container} at offset {launch} is in flight")]
    NoSuchLaunch {
        /// The container the cancellation named.
        container: ContainerId,
        /// The launch offset it named, which is not this container's launch in flight.
        launch: Offset,
    },
}

/// The live epoch of a fenced container, as its refusal says it.
fn live_epoch(current: &Option<Epoch>) -> String {
    match current {
        Some(epoch) => format!("its live epoch is {epoch}"),
        None => "it has no live session".to_string(),
    }
}

impl Rejection {
    /// Whether v0.1.0 knows this variant (it decodes none added after it): a replica answers a
    /// v0.1.0 client's refusal of any other as a message instead.
    pub fn known_to_v010(&self) -> bool {
        !matches!(
            self,
            Rejection::ContainerExists { .. } | Rejection::NoSuchLaunch { .. }
        )
    }
}
