//! The records JobState is made of: containers, tasks and the handshakes still open.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use serde::{Deserialize, Serialize};

use crate::log::{ContainerId, Epoch, Input, Offset, TaskId};

/// Where a container is in its life, as the log records it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum ContainerStatus {
    /// Registered, and its session at the record's epoch not ended: the only status whose
    /// commands and heartbeats are accepted.
    Live,
    /// Left cleanly.
    Deregistered,
    /// Declared dead by the coordinator, or its launch given up (`CancelLaunch`).
    Expired,
    /// Launched by the coordinator (`LaunchContainer`, from level 3) and not registered yet.
    /// Added after v0.1.0, last, so that the statuses before it keep their encoding.
    Launching {
        /// Which launch of its container slot this is, from 1 (as in `LaunchContainer`).
        attempt: u32,
    },
}

/// A container as the log knows it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ContainerRecord {
    /// The offset of its latest registration; while it is `Launching`, of its launch.
    pub epoch: Epoch,
    /// Whether it is live, launching, or gone and how.
    pub status: ContainerStatus,
    /// Free text for operators from its registration: where it runs (host, pid, pod). Empty
    /// while it is `Launching`.
    pub location: String,
    /// The leader's clock when it registered.
    pub registered_at_ms: u64,
}

/// One incarnation of a container: who owns a task, or owes an ack.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Session {
    /// The container's id.
    pub container: ContainerId,
    /// The offset of the registration that began this incarnation; a later registration of
    /// the same container is a new session, and this one is fenced.
    pub epoch: Epoch,
}

impl fmt::Display for Session {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}@{}", self.container, self.epoch)
    }
}

/// Where a task is in its life. At most one session owns a task at any offset: a task is
/// assigned only while `Unassigned`, and leaves a session only through `TaskStopped` or that
/// session's end.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum TaskPhase {
    /// No session owns the task: never assigned, stopped, or its owner's session ended. Only
    /// now may it be assigned.
    Unassigned,
    /// Assigned at `at`; the owner has not acked `TaskStarted` yet.
    Starting {
        /// The session it was assigned to.
        owner: Session,
        /// The offset of the `AssignTask`.
        at: Offset,
    },
    /// The owner acked `TaskStarted`: the task runs there until it is told to stop or the
    /// session ends.
    Running {
        /// The session that runs it.
        owner: Session,
        /// The offset of the owner's `TaskStarted`.
        since: Offset,
    },
    /// Told to stop at `at`; the owner has not acked `TaskStopped` yet.
    Stopping {
        /// The session told to stop it, which still owns it.
        owner: Session,
        /// The offset of the `StopTask`.
        at: Offset,
    },
}

impl TaskPhase {
    /// The session that owns the task in this phase; `None` only when `Unassigned`.
    pub fn owner(&self) -> Option<&Session> {
        match self {
            TaskPhase::Unassigned => None,
            TaskPhase::Starting { owner, .. }
            | TaskPhase::Running { owner, .. }
            | TaskPhase::Stopping { owner, .. } => Some(owner),
        }
    }
}

impl fmt::Display for TaskPhase {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TaskPhase::Unassigned => f.write_str("unassigned"),
            TaskPhase::Starting { owner, at } => {
                write!(f, "starting on {owner} (assigned at {at})")
            }
            TaskPhase::Running { owner, since } => write!(f, "running on {owner} (since {since})"),
            TaskPhase::Stopping { owner, at } => write!(f, "stopping on {owner} (told at {at})"),
        }
    }
}

/// A task as the log knows it: its inputs, where it is in its life, and where the last owner
/// left off.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TaskRecord {
    /// The inputs it holds: those its latest `AssignTask` gave it, less any removed or given
    /// to another task since.
    pub inputs: BTreeSet<Input>,
    /// Whether it is unassigned, starting, running or stopping, and on which session.
    pub phase: TaskPhase,
    /// What the last owner reported when it stopped; the next owner resumes from it.
    pub checkpoint: Option<Vec<u8>>,
}

/// What the command at a pending offset waits for.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Awaiting {
    /// An `AssignTask`: the owner's `TaskStarted`.
    TaskStarted {
        /// The task assigned.
        task: TaskId,
    },
    /// A `StopTask`: the owner's `TaskStopped`.
    TaskStopped {
        /// The task told to stop.
        task: TaskId,
    },
    /// A broadcast (schema or config change): an `Ack` from every container live when it was
    /// applied.
    Acks,
}

/// A handshake still open: the command at its offset, and who still owes an answer.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Handshake {
    /// What answers the command.
    pub awaiting: Awaiting,
    /// The sessions that still owe an answer, as container → epoch: the task's owner, or
    /// every session live when a broadcast was applied. A session leaves when it answers or
    /// ends, and the handshake closes once none is left.
    pub owed_by: BTreeMap<ContainerId, Epoch>,
}

/// The latest schema of one subject.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SchemaRecord {
    /// The offset of the `SchemaChange` that set it.
    pub offset: Offset,
    /// The schema, opaque to ctrlog.
    pub schema: Vec<u8>,
}

/// The latest desired container count.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DesiredCount {
    /// How many containers the job should have.
    pub count: u32,
    /// Why, as the coordinator wrote it; empty when it came from `desired-containers`
    /// version 1, which has no reason.
    pub reason: String,
    /// The offset of the command that set it.
    pub offset: Offset,
}
