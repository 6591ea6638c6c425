//! The replica process around consensus: it opens the storage, starts Raft, and serves its
//! three ports, in three wings and the wiring between them:
//!
//! * [`ports`]: the client port ([`ports::client`], tarpc), the peer port ([`ports::peer`])
//!   and the observability port ([`ports::http`], with who may see the status page), all
//!   through one accept loop (`ports::connections`) with TLS ([`ports::tls`]) and
//!   credentials ([`ports::auth`]) checked before anything reaches the replica;
//! * [`observe`]: what the replica tells about itself (telemetry, the history of its figures,
//!   the status JSON, its certificates' expiry);
//! * [`config`]: what `ctrlog serve` reads, flags over a TOML file, and its `[job]` section;
//! * the wiring: [`Replica`] is a running replica (start, shutdown, [`serve`]);
//!   [`ReplicaHandle`] is its library API and the [`ControlPlane`](crate::controller::ControlPlane)
//!   its controller drives; [`job`] is the controller it runs when the configuration has a
//!   `[job]` section.
//!
//! The wings use each other without a circle: `ports` over `observe` and `config`; the handle
//! uses `observe` only.
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

pub mod config;
pub mod handle;
pub mod job;
pub mod observe;
pub mod ports;
pub mod replica;

pub use config::job::{JobConfig, LauncherConfig, ScalingConfig};
pub use config::{
    parse_members, AuthConfig, ConfigError, LoadError, ReplicaConfig, ServeFlags, TlsFiles,
};
pub use handle::ReplicaHandle;
pub use ports::connections::OPEN_FILES_BESIDES_CONNECTIONS;
pub use replica::{force_new_cluster, serve, Replica, StartError};
