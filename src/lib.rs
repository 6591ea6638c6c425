//! ctrlog: an embedded, replicated job control log on Raft.
//!
//! See `ARCHITECTURE.md` for the map. In short: [`log`] is the data model, [`jobs`] folds the
//! log into the job's state, [`raft`] replicates it (feature `server`), and [`client`] is what
//! containers link.

#[cfg(feature = "server")]
pub mod bench;
#[cfg(feature = "server")]
pub mod certs;
#[cfg(feature = "server")]
pub mod chaos;
#[cfg(feature = "server")]
pub mod checker;
#[cfg(feature = "server")]
pub mod cli;
pub mod client;
#[cfg(feature = "server")]
pub mod controller;
#[cfg(feature = "server")]
pub mod demo;
pub mod jobs;
pub mod log;
#[cfg(feature = "server")]
pub mod raft;

/// A replica's Raft node id.
pub type NodeId = u64;
