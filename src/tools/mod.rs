//! What operators and developers run around the library: `ctrlog bench`, `ctrlog chaos` and
//! its history [`checker`], `ctrlog demo`, `ctrlog certs`, the client subcommands ([`cli`]),
//! the simulated [`container`], and clusters in one process ([`local_cluster`], with
//! controllers: [`local_job`]) for the demo, the benchmarks and the tests.
//!
//! Tools depend on everything; nothing outside `tools` and the binary depends on them.

pub mod backup;
pub mod bench;
pub mod certs;
pub mod chaos;
pub mod checker;
pub mod cli;
pub mod container;
pub mod demo;
pub mod firewall;
pub mod job_files;
pub mod local_cluster;
pub mod local_job;
pub mod power_loss;
pub mod scale;
pub mod wait;

pub use local_cluster::LocalCluster;
pub use local_job::LocalJob;
pub use wait::{poll_until, WaitError, POLL_INTERVAL};
