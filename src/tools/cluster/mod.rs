//! Replicas to run things against: a cluster in this process ([`local`], with controllers:
//! [`job`]), `ctrlog serve` processes ([`process`]) and the power loss they can be put
//! through ([`power_loss`]), both behind one [`Cluster`] trait by node id ([`replicas`]), and
//! waiting on a cluster's state ([`wait`]).

pub mod job;
pub mod local;
pub mod power_loss;
pub mod process;
pub mod replicas;
pub mod wait;

pub use job::{ControllerFactory, LocalJob};
pub use local::LocalCluster;
pub use process::{
    processes_mentioning, worker_threads_each, ProcessCluster, SpawnHook, Spawning, SECURE_CLIENTS,
    SECURE_NODE_IDS_MAX,
};
pub use replicas::Cluster;
