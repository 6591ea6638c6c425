//! ctrlog: an embedded, replicated job control log on Raft.
//!
//! See `ARCHITECTURE.md` for the map. In short: [`log`] is the data model, [`jobs`] folds the
//! log into the job's state and decides the controller's next steps, [`client`] is what
//! containers link; with the `server` feature, [`raft`] replicates the log (consensus and
//! storage), [`server`] is the replica process around it, [`controller`] runs the job on the
//! leader, and [`tools`] holds what operators run (bench, chaos, demo, certs, the CLI's
//! subcommands, local clusters).

#![cfg_attr(docsrs, feature(doc_cfg))]

pub mod client;
#[cfg(feature = "server")]
#[cfg_attr(docsrs, doc(cfg(feature = "server")))]
pub mod controller;
pub mod jobs;
pub mod log;
#[cfg(feature = "server")]
#[cfg_attr(docsrs, doc(cfg(feature = "server")))]
pub mod raft;
#[cfg(feature = "server")]
#[cfg_attr(docsrs, doc(cfg(feature = "server")))]
pub mod server;
/// What the `ctrlog` binary and the tests are built from (bench, chaos, demo, the CLI's
/// subcommands, local clusters): not part of the library's API, and free to change.
#[cfg(feature = "server")]
#[doc(hidden)]
pub mod tools;

/// A replica's Raft node id.
pub type NodeId = u64;
