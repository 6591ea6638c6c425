//! The records JobState is made of: containers, tasks and the handshakes still open.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use serde::{Deserialize, Serialize};

use crate::log::{ContainerId, Epoch, Input, Offset, TaskId};

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum ContainerStatus {
    Live,
    /// Left cleanly.
    Deregistered,
    /// Declared dead by the coordinator, or its launch given up (`CancelLaunch`).
    Expired,
    /// Launched by the coordinator (`LaunchContainer`, from level 3) and not registered yet.
    /// Added after v0.1.0, last, so that the statuses before it keep their encoding.
    Launching {
        attempt: u32,
    },
}

/// A container as the log knows it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ContainerRecord {
    /// The offset of its latest registration; while it is `Launching`, of its launch.
    pub epoch: Epoch,
    pub status: ContainerStatus,
    pub location: String,
    /// The leader's clock when it registered.
    pub registered_at_ms: u64,
}

/// One incarnation of a container: who owns a task, or owes an ack.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Session {
    pub container: ContainerId,
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
    Unassigned,
    /// Assigned at `at`; the owner has not acked `TaskStarted` yet.
    Starting {
        owner: Session,
        at: Offset,
    },
    Running {
        owner: Session,
        since: Offset,
    },
    /// Told to stop at `at`; the owner has not acked `TaskStopped` yet.
    Stopping {
        owner: Session,
        at: Offset,
    },
}

impl TaskPhase {
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

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TaskRecord {
    pub inputs: BTreeSet<Input>,
    pub phase: TaskPhase,
    /// What the last owner reported when it stopped; the next owner resumes from it.
    pub checkpoint: Option<Vec<u8>>,
}

/// What the command at a pending offset waits for.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Awaiting {
    TaskStarted {
        task: TaskId,
    },
    TaskStopped {
        task: TaskId,
    },
    /// A broadcast (schema or config change): an `Ack` from every container live when it was
    /// applied.
    Acks,
}

/// A handshake still open: the command at its offset, and who still owes an answer.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Handshake {
    pub awaiting: Awaiting,
    pub owed_by: BTreeMap<ContainerId, Epoch>,
}

/// The latest schema of one subject.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SchemaRecord {
    pub offset: Offset,
    pub schema: Vec<u8>,
}

/// The latest desired container count.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DesiredCount {
    pub count: u32,
    pub reason: String,
    pub offset: Offset,
}
