//! The control log's data model: what a command is, how it is framed, and what a subscriber
//! receives.
//!
//! Data flows through three shapes:
//!
//! 1. A producer builds a [`Proposal`]: one [`Frame`], the [`Target`] it is addressed to, and an
//!    optional `(producer, seq)` pair.
//! 2. The leader's proposer coalesces concurrent proposals into one [`Batch`], stamps it with its
//!    wall clock, and proposes the batch as **one** Raft entry (one command per Raft
//!    entry caps a 3-replica cluster near 2,000 entries/s).
//! 3. When the entry is applied, every accepted proposal becomes a [`LogEntry`] with its own
//!    contiguous [`Offset`]. That is the unit subscribers see.
//!
//! Invariants:
//!
//! * Nothing here knows openraft, sled or tarpc; the types are plain serde data.
//! * Decoding bytes never panics: every failure is a [`DecodeError`], and every length prefix is
//!   bounded before anything is allocated.
//! * A frame whose `(kind, version)` a reader does not know decodes to [`Command::Unknown`]; it
//!   never fails the stream, so an old reader keeps going across a newer writer's commands.

mod codec;
mod command;
mod entry;
pub mod kinds;
mod names;
mod target;
pub mod vocabulary;

pub use codec::{decode, encode, DecodeError};
pub use command::*;
pub use entry::{Batch, LogEntry, ProducerSeq, Proposal, LOG_ENTRY_OVERHEAD_BYTES_MAX};
pub use kinds::{Kind, CUSTOM_KIND_MIN};
pub use names::{Input, InvalidName, TaskId, NAME_BYTES_MAX};
pub use target::{ContainerId, Filter, InvalidContainerId, Target, CONTAINER_ID_BYTES_MAX};

/// The position of one command in the control log: 1, 2, 3, … with no gaps.
pub type Offset = u64;
/// A Raft term.
pub type Term = u64;
/// The id a producer picks for itself (the client library draws it at random).
pub type ProducerId = u64;
/// A producer's own sequence number for one append; retries reuse it.
pub type Seq = u64;

/// The largest command body accepted by default, as etcd and Kafka do: 1 MiB. Control commands
/// are small; a command this large is almost always a bug, and bounding it bounds every frame
/// built from it.
pub const COMMAND_BYTES_MAX_DEFAULT: usize = 1 << 20;
