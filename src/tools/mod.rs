//! What operators and developers run around the library, in four wings and the wiring of the
//! binary's commands:
//!
//! * [`cluster`](crate::tools::cluster): replicas to run things against, in one process ([`LocalCluster`](crate::tools::LocalCluster), with
//!   controllers: [`LocalJob`](crate::tools::LocalJob)) or as `ctrlog serve` processes ([`cluster::ProcessCluster`](crate::tools::cluster::ProcessCluster),
//!   with the power-loss shim), and waiting on them;
//! * [`bench`](crate::tools::bench): `ctrlog bench` (append, fan-out, recovery, scale), its probes and plots;
//! * [`chaos`](crate::tools::chaos): `ctrlog chaos`, its history [`checker`](crate::tools::chaos::checker), the firewall of its
//!   partitions, the job files of its replicas and the simulated container;
//! * [`admin`](crate::tools::admin): the subcommands that talk to a running cluster (append, tail, status, state,
//!   snapshot, broadcast, vocabulary, members), their flags, output and backups;
//! * the wiring: the command line ([`cli`](crate::tools::cli): arguments, one call per subcommand, exit codes),
//!   `ctrlog certs` and `ctrlog demo`.
//!
//! Tools depend on everything; nothing outside `tools` and the binary depends on them. They are
//! the `tools` feature, which `server` does not imply.

pub mod admin;
pub mod bench;
pub mod certs;
pub mod chaos;
pub mod cli;
pub mod cluster;
pub mod demo;

pub use cluster::wait::{poll_until, WaitError, POLL_INTERVAL};
pub use cluster::{LocalCluster, LocalJob};
