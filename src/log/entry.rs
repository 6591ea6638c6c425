//! The entry model: proposals, the batch a Raft entry carries, and the per-command log entry.

use serde::{Deserialize, Serialize};

use super::{Command, Frame, Offset, ProducerId, Seq, Target, Term, CONTAINER_ID_BYTES_MAX};

/// Identifies one append of an idempotent producer. A retry carries the same pair, and the
/// replicated state machine answers it with the original offset instead of appending again.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct ProducerSeq {
    /// The producer's id, which the client library draws at random.
    pub producer: ProducerId,
    /// The producer's number for this append, from 1; a retry reuses it.
    pub seq: Seq,
}

/// One command as a producer proposes it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Proposal {
    /// The idempotent producer's pair, de-duplicated by the replicas; `None` for an append
    /// that is not, which a retry may then append twice.
    pub producer: Option<ProducerSeq>,
    /// Who the command is for; subscribers filter on it.
    pub target: Target,
    /// The command; its body is at most the replica's command size limit
    /// ([`COMMAND_BYTES_MAX_DEFAULT`](super::COMMAND_BYTES_MAX_DEFAULT) by default).
    pub frame: Frame,
}

impl Proposal {
    /// `command` to the target it takes when none is named ([`Command::default_target`]),
    /// with no producer pair: what a replica appends of its own (the controller's commands,
    /// a new log's founding raise).
    pub fn of_command(command: Command) -> Proposal {
        Proposal {
            producer: None,
            target: command.default_target(),
            frame: command.into_frame(),
        }
    }

    /// The bytes this proposal adds to a batch, for the proposer's size bound.
    pub fn encoded_len(&self) -> usize {
        // Option tag (1) + producer id and seq (16) + target + frame.
        17 + self.target.encoded_len() + self.frame.encoded_len()
    }
}

/// The application data of one Raft entry: the proposals the leader coalesced into it.
///
/// `appended_at_ms` is stamped by the leader *before* proposing, so that applying the entry
/// never reads a clock and stays deterministic.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Batch {
    /// The leader's wall clock when it proposed the batch, in milliseconds since the Unix
    /// epoch; every command of the batch carries it.
    pub appended_at_ms: u64,
    /// The proposals in the order they are applied: each accepted one takes the next offset,
    /// while duplicates and refused ones take none.
    pub proposals: Vec<Proposal>,
}

impl std::fmt::Display for Batch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "Batch(commands: {}, appended_at_ms: {})",
            self.proposals.len(),
            self.appended_at_ms
        )
    }
}

/// One command of the control log as subscribers see it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LogEntry {
    /// The command's position in the control log.
    pub offset: Offset,
    /// The Raft term of the entry that carried this command.
    pub term: Term,
    /// The leader's wall clock when the batch was proposed.
    pub appended_at_ms: u64,
    /// The `(producer, seq)` pair it was appended with, if its producer was idempotent.
    pub producer: Option<ProducerSeq>,
    /// Who the command is for, as appended; for a built-in command always
    /// [`Command::target`].
    pub target: Target,
    /// The command as written. Decode it with [`LogEntry::command`] so that the reader's own
    /// vocabulary decides what is `Unknown`.
    pub frame: Frame,
}

/// The most an encoded [`LogEntry`] adds to its frame: offset, term and timestamp (24), the
/// producer pair (17) and the largest target.
pub const LOG_ENTRY_OVERHEAD_BYTES_MAX: usize = 24 + 17 + 12 + CONTAINER_ID_BYTES_MAX;

impl LogEntry {
    /// The bytes this entry takes encoded, for the size bound of a fetch answer.
    pub fn encoded_len(&self) -> usize {
        // Offset, term and timestamp (24), the producer pair (17), target and frame.
        24 + 17 + self.target.encoded_len() + self.frame.encoded_len()
    }

    /// The command, decoded against this build's vocabulary.
    pub fn command(&self) -> Command {
        Command::from_frame(self.frame.clone())
    }

    /// One line saying what the command does, for people (the demo's timeline, the status
    /// page).
    pub fn summary(&self) -> String {
        match self.command() {
            Command::RegisterContainer(c) => {
                format!("register {} (epoch {})", c.container, self.offset)
            }
            Command::DeregisterContainer(c) => format!("deregister {}@{}", c.container, c.epoch),
            Command::ExpireContainer(c) => format!("expire {}@{}", c.container, c.epoch),
            Command::AddInputs(c) => {
                let inputs: Vec<String> = c.inputs.iter().map(ToString::to_string).collect();
                format!("add inputs {}", inputs.join(" "))
            }
            Command::RemoveInputs(c) => format!("remove {} inputs", c.inputs.len()),
            Command::AssignTask(c) => format!("assign {} → {}@{}", c.task, c.container, c.epoch),
            Command::StopTask(c) => format!("stop {} on {}@{}", c.task, c.container, c.epoch),
            Command::TaskStarted(c) => format!("ack: {} started by {}", c.task, c.container),
            Command::TaskStopped(c) => format!("ack: {} stopped by {}", c.task, c.container),
            Command::DesiredContainersV1(c) => format!("desired containers = {}", c.count),
            Command::DesiredContainers(c) => {
                format!("desired containers = {} ({})", c.count, c.reason)
            }
            Command::SchemaChange(c) => format!("schema change of {:?} (broadcast)", c.subject),
            Command::ConfigChange(_) => "config change (broadcast)".to_string(),
            Command::Ack(c) => format!("ack: #{} by {}", c.offset, c.container),
            Command::SetVocabularyLevel(c) => format!("vocabulary level {}", c.level),
            Command::Custom { kind, .. } => format!("custom command kind {kind}"),
            Command::Unknown(frame) => format!("unknown kind {}", frame.kind),
            Command::LaunchContainer(c) => {
                format!("launch {} (attempt {})", c.container, c.attempt)
            }
            Command::CancelLaunch(c) => format!("cancel launch #{} of {}", c.launch, c.container),
        }
    }
}
