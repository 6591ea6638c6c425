//! Consensus and storage: openraft over a segmented WAL and sled, the peer network, and the
//! read path by offset. Nothing here knows of the replica process around it (`server`), the
//! controller, the tools or the CLI.
//!
//! Two sides. The storage and its fault model are the wing [`storage`], which uses nothing of
//! the consensus side but [`types`] and [`stages`]. The consensus around openraft is the rest:
//! the [`node`] (and its membership changes), the [`elector`] and the [`lease`], the
//! [`founding`] level raise, the [`proposer`], the [`network`], [`log_matching`], the
//! [`state_machine`] and the [`reader`]; [`restore`] joins the two, opening a replica's
//! storage and folding the state machine from the snapshot it hands over.
//!
//! Data flow of one append:
//!
//! 1. An append reaches the leader (through `server`) and queues in the [`proposer`], which
//!    coalesces concurrent appends into one [`Batch`](crate::log::Batch) and proposes it as
//!    one Raft entry.
//! 2. openraft appends the entry to the [`log_store`](storage::log_store) (the
//!    [`wal`](storage::wal): written, handed to the sync thread, acknowledged after
//!    `fdatasync`) and replicates it over [`network`].
//! 3. Once a majority has it durably, openraft applies it to the [`state_machine`], which
//!    gives every command its offset in [`JobState`](crate::jobs::JobState) and answers the
//!    proposer, which answers each client.
//! 4. Readers fetch through the [`reader`]: the state machine's offset index leads to the
//!    entry in the WAL (or the log store's window of recent entries), up to the applied
//!    offset. Snapshots (in sled, via [`snapshots`](storage::snapshots)) let the log be purged
//!    up to a retained tail.
//!
//! Invariants:
//!
//! * Nothing is acknowledged before it is on stable storage: entries (`fdatasync` of the WAL),
//!   the vote, the purge point and snapshots (`fdatasync` of sled's data file).
//! * Only this module and `server` touch openraft and sled.
//! * Committed entries are never changed or removed except by purge behind a durable snapshot.
//! * One log id, one entry: a replica never leads a term it led before it restarted
//!   (`storage::log_store::as_restarted`), and one that is sent a different entry under a log
//!   id it holds stops instead of answering (`log_matching`).

// openraft's trait methods return its `StorageError` (over 200 bytes) by contract; boxing it
// in our helpers would only add a conversion at every call.
#![allow(clippy::result_large_err)]

pub mod elector;
pub mod founding;
pub mod lease;
pub mod log_matching;
pub mod network;
pub mod node;
pub mod proposer;
pub mod reader;
pub mod refusals;
pub mod restore;
pub mod stages;
pub mod state_machine;
pub mod storage;
pub mod types;

pub use types::TypeConfig;
