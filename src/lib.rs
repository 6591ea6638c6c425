//! ctrlog: an embedded, replicated job control log on Raft.
//!
//! A job coordinator writes the commands that change a running stream-processing job (new
//! input partitions, more or fewer containers, task moves, schema and config broadcasts) into
//! one ordered, durable log that three replicas keep with Raft. Containers read the commands
//! for them from an offset, in order, and answer through the same log.
//!
//! # For container authors
//!
//! Depend on the client alone, which builds without openraft or sled:
//!
//! ```toml
//! ctrlog = { version = "0.1", default-features = false, features = ["client"] }
//! ```
//!
//! A container joins the job as a [`ContainerSession`](client::ContainerSession): it registers
//! (the registration's offset is its **epoch**), heartbeats in the background with the lag of
//! each task it runs, reads its commands plus broadcasts in offset order, and answers each one.
//!
//! ```no_run
//! use std::collections::BTreeMap;
//! use std::path::Path;
//!
//! use ctrlog::client::{
//!     tls, ClientError, ClientOptions, ContainerSession, ControlClient, SessionOptions,
//!     SubscriptionItem,
//! };
//! use ctrlog::log::{Command, ContainerId};
//! use futures::StreamExt;
//!
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! // TLS trusting the cluster's CA, and this container's own token (a launcher passes it in
//! // CTRLOG_TOKEN). A wrong token or CA fails here at once; an unreachable cluster is
//! // retried until the retry deadline.
//! let options = ClientOptions::new()
//!     .tls(tls::client_config(Path::new("/etc/ctrlog/ca.pem"), None)?)
//!     .token(std::env::var("CTRLOG_TOKEN")?);
//! let client = ControlClient::connect_with(["10.0.0.1:7000", "10.0.0.2:7000"], options).await?;
//!
//! let me = ContainerId::new("container-1")?;
//! let lag = BTreeMap::new; // this container's lag per task, asked at every heartbeat
//! let session = ContainerSession::join(client, me, SessionOptions::default(), lag).await?;
//! let mut commands = session.commands();
//! loop {
//!     let item = tokio::select! {
//!         item = commands.next() => item,
//!         // Expired (missed heartbeats) or registered again elsewhere: the cluster refuses
//!         // this session's answers from now on, and may have given its tasks to another
//!         // container. Stop every task, then join again.
//!         fenced = session.fenced() => return Err(fenced.into()),
//!     };
//!     let Some(item) = item else { break };
//!     match item {
//!         Ok(SubscriptionItem::Entry(entry)) => match entry.command() {
//!             Command::AssignTask(assign) => {
//!                 // Start the task, then say so.
//!                 session.task_started(assign.task).await?;
//!             }
//!             Command::StopTask(stop) => {
//!                 // Flush its state, then hand over the checkpoint.
//!                 session.task_stopped(stop.task, Some(b"checkpoint-42".to_vec())).await?;
//!             }
//!             // A schema or config broadcast, or a command of your own kinds: obey, then ack.
//!             _ => {
//!                 session.ack(entry.offset).await?;
//!             }
//!         },
//!         // The commands up to `offset` were compacted into a snapshot while this container
//!         // was away: rebuild what it runs from `state`; the stream goes on after `offset`.
//!         Ok(SubscriptionItem::Reset { state, offset }) => {
//!             let _ = (state, offset);
//!         }
//!         // No replica answered for the whole retry deadline; the subscription resumes
//!         // where it was when polled again.
//!         Err(ClientError::GaveUp { elapsed, .. }) => eprintln!("cluster away for {elapsed:?}"),
//!         Err(other) => return Err(other.into()),
//!     }
//! }
//! session.leave().await?;
//! # Ok(()) }
//! ```
//!
//! Appends are idempotent: the client numbers them, and a retry after a lost answer or a
//! failover returns the original offset. [`ControlClient::append`](client::ControlClient::append)
//! writes a command of your own ([`Command::custom`](log::Command::custom)) to the coordinator, a
//! container or everyone. When a call gives up ([`ClientError::GaveUp`](client::ClientError)),
//! an append's outcome is unknown; the error names its `(producer, seq)`, and
//! [`append_proposal`](client::ControlClient::append_proposal) with that pair retries it without
//! appending twice.
//!
//! # The crate
//!
//! [`log`] is the data model (commands, entries, the versioned vocabulary), [`jobs`] folds the
//! log into the job's state and decides the controller's next steps, [`wire`] is the protocol
//! both ports speak and its transport, and [`client`] is what containers link. With the
//! `server` feature (the default), `raft` replicates the log (consensus and storage),
//! `server` is the replica process around it and `controller`
//! runs the job on the leader; with `tools` (also the default, and not implied by `server`),
//! the `ctrlog` binary serves replicas and holds the operator's commands. `ARCHITECTURE.md` maps the code and its invariants.

#![cfg_attr(docsrs, feature(doc_cfg))]

// What a container links is documented item by item; the replica's modules are documented
// for their maintainers (ARCHITECTURE.md), not held to the lint.
#[warn(missing_docs, missing_debug_implementations)]
pub mod client;
#[cfg(feature = "server")]
#[cfg_attr(docsrs, doc(cfg(feature = "server")))]
pub mod controller;
#[warn(missing_docs)]
pub mod jobs;
#[warn(missing_docs)]
pub mod log;
#[cfg(feature = "server")]
#[cfg_attr(docsrs, doc(cfg(feature = "server")))]
pub mod raft;
#[cfg(feature = "server")]
#[cfg_attr(docsrs, doc(cfg(feature = "server")))]
pub mod server;
/// What the `ctrlog` binary and the tests are built from (bench, chaos, demo, the CLI's
/// subcommands, local clusters): not part of the library's API, and free to change.
#[cfg(feature = "tools")]
#[doc(hidden)]
pub mod tools;
#[warn(missing_docs, missing_debug_implementations)]
pub mod wire;

/// A replica's Raft node id.
pub type NodeId = u64;
