//! The replica process around consensus: it opens the storage, starts Raft, and serves the
//! client port ([`service`], tarpc), the peer port ([`peers`]) and the observability port
//! ([`http`]), all through one accept loop ([`connections`]) with TLS ([`tls`]) and
//! credentials ([`auth`]) checked before anything reaches the replica.
//!
//! [`Replica`] is a running replica (start, shutdown, [`serve`]); [`ReplicaHandle`] is its
//! library API and the [`ControlPlane`](crate::controller::ControlPlane) its controller
//! drives; [`ReplicaConfig`] is what `ctrlog serve` reads, flags over a TOML file, and
//! [`job`] the controller it runs when that file has a `[job]` section ([`job_config`]).
//!
//! Invariants:
//!
//! * Every connection is served on its own task: a malformed frame, a failed or stalled TLS
//!   handshake or a panic in a decoder ends that connection only.
//! * Every client request is authorized against its connection's principal before it reaches
//!   the [`ReplicaHandle`]; every peer request comes from the node its certificate names.
//! * The observability port serves the job's data (status, history) only to the credentials
//!   the client port would accept, when `[auth]` is on; probes and metrics carry none of it.
//! * `[auth]` runs only behind `[tls]` (or the explicit `insecure_plaintext`).
//! * `server` may use `raft`; `raft` never uses `server`.

// openraft's errors are large by contract (see `raft`).
#![allow(clippy::result_large_err)]

pub mod auth;
pub mod config;
mod config_error;
mod connections;
mod guarded;
pub mod handle;
pub mod history;
pub mod http;
pub mod job;
pub mod job_config;
pub mod json;
pub mod page_access;
pub mod peers;
pub mod replica;
pub mod service;
mod telemetry;
pub mod tls;

pub use config::{
    parse_members, AuthConfig, ConfigError, LoadError, ReplicaConfig, ServeFlags, TlsFiles,
};
pub use connections::OPEN_FILES_BESIDES_CONNECTIONS;
pub use handle::ReplicaHandle;
pub use job_config::{JobConfig, LauncherConfig, ScalingConfig};
pub use replica::{force_new_cluster, serve, Replica, StartError};
