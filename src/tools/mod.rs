//! What operators and developers run around the library, in three wings and the wiring of the
//! binary's commands:
//!
//! * [`cluster`]: replicas to run things against, in one process ([`LocalCluster`], with
//!   controllers: [`LocalJob`]) or as `ctrlog serve` processes ([`cluster::ProcessCluster`],
//!   with the power-loss shim), and waiting on them;
//! * [`bench`]: `ctrlog bench` (append, fan-out, recovery, scale), its probes and plots;
//! * [`chaos`]: `ctrlog chaos`, its history [`checker`](chaos::checker), the firewall of its
//!   partitions, the job files of its replicas and the simulated container;
//! * the wiring: the client subcommands ([`cli`]), `ctrlog certs`, `ctrlog snapshot
//!   save|restore` ([`backup`]) and `ctrlog demo`.
//!
//! Tools depend on everything; nothing outside `tools` and the binary depends on them. They are
//! the `tools` feature, which `server` does not imply.

pub mod backup;
pub mod bench;
pub mod certs;
pub mod chaos;
pub mod cli;
pub mod cluster;
pub mod demo;

pub use cluster::wait::{poll_until, WaitError, POLL_INTERVAL};
pub use cluster::{LocalCluster, LocalJob};
