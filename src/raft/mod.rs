//! The replicated control log: openraft over a segmented WAL and sled, with tarpc between
//! replicas and to clients.
//!
//! Data flow of one append:
//!
//! 1. A client's `append` reaches the leader's client port ([`service`]) or the library API
//!    ([`ReplicaHandle::append`]) and queues in the [`proposer`], which coalesces concurrent
//!    appends into one [`Batch`](crate::log::Batch) and proposes it as one Raft entry.
//! 2. openraft appends the entry to the [`log_store`] (the [`wal`]: written, handed to the
//!    sync thread, acknowledged after `fdatasync`) and replicates it over [`network`].
//! 3. Once a majority has it durably, openraft applies it to the [`state_machine`], which
//!    gives every command its offset in [`JobState`](crate::jobs::JobState) and answers the
//!    proposer, which answers each client.
//! 4. Readers fetch from the WAL, up to the applied offset, through the state machine's offset
//!    index. Snapshots (in sled, via [`meta_store`]) let the log be purged up to a retained tail.
//!
//! Invariants:
//!
//! * Nothing is acknowledged before it is on stable storage: entries (`fdatasync` of the WAL),
//!   the vote, the purge point and snapshots (`fdatasync` of sled's data file).
//! * Only this module touches openraft and sled.
//! * Committed entries are never changed or removed except by purge behind a durable snapshot.

// openraft's trait methods return its `StorageError` (over 200 bytes) by contract; boxing it
// in our helpers would only add a conversion at every call.
#![allow(clippy::result_large_err)]

pub mod auth;
pub mod config;
mod connections;
pub mod http;
pub mod local_cluster;
pub mod log_store;
pub mod meta_store;
pub mod network;
pub mod node;
pub mod proposer;
mod recent;
pub mod recover;
pub mod service;
pub mod state_machine;
pub mod tls;
pub mod types;
pub mod wal;

pub use config::{parse_members, AuthConfig, ConfigError, ReplicaConfig, TlsFiles};
pub use local_cluster::LocalCluster;
pub use node::{serve, Replica, ReplicaHandle, StartError};
pub use types::TypeConfig;
