//! What every kind of cluster offers, by node id: [`Cluster`], over [`LocalCluster`]
//! (replicas in this process) and [`ProcessCluster`] (`ctrlog serve` processes), so that a
//! story (the demo) or a test runs on either.

use std::time::Duration;

use crate::client::{ClientError, ClientOptions, ControlClient};
use crate::tools::cluster::local::LocalCluster;
use crate::tools::cluster::process::ProcessCluster;
use crate::tools::cluster::wait::{poll_until, POLL_INTERVAL};
use crate::NodeId;

/// A cluster of replicas, each named by its node id.
// The tools and tests call it on their own runtimes; none needs a `Send` bound spelled out.
#[allow(async_fn_in_trait)]
pub trait Cluster {
    /// Every replica's id, running or not, in order.
    fn ids(&self) -> Vec<NodeId>;
    /// Where replica `id` serves clients.
    fn client_addr(&self, id: NodeId) -> String;
    /// How a client connects: with TLS and an admin identity on a secure cluster.
    fn client_options(&self) -> ClientOptions;
    /// The leader the running replicas agree on, once they do, within `timeout`.
    async fn leader(&self, timeout: Duration) -> anyhow::Result<NodeId>;
    /// Stops replica `id`, its data kept: SIGKILL for a process (a crash); in this process,
    /// its tasks are shut down.
    async fn stop(&mut self, id: NodeId);
    /// Starts replica `id` again on its data directory and addresses.
    async fn restart(&mut self, id: NodeId) -> anyhow::Result<()>;

    /// A client of the whole cluster.
    async fn connect(&self) -> Result<ControlClient, ClientError> {
        let seeds: Vec<String> = self
            .ids()
            .into_iter()
            .map(|id| self.client_addr(id))
            .collect();
        ControlClient::connect_with(&seeds, self.client_options()).await
    }

    /// A client of replica `id` alone (its own view: status, applied offset).
    async fn connect_to(&self, id: NodeId) -> Result<ControlClient, ClientError> {
        ControlClient::connect_with(&[self.client_addr(id)], self.client_options()).await
    }
}

impl Cluster for LocalCluster {
    fn ids(&self) -> Vec<NodeId> {
        LocalCluster::ids(self)
    }

    fn client_addr(&self, id: NodeId) -> String {
        self.config(id).client_addr.to_string()
    }

    fn client_options(&self) -> ClientOptions {
        LocalCluster::client_options(self)
    }

    async fn leader(&self, timeout: Duration) -> anyhow::Result<NodeId> {
        Ok(self.wait_for_leader(timeout).await?)
    }

    async fn stop(&mut self, id: NodeId) {
        LocalCluster::stop(self, id).await
    }

    async fn restart(&mut self, id: NodeId) -> anyhow::Result<()> {
        LocalCluster::restart(self, id).await?;
        Ok(())
    }
}

impl Cluster for ProcessCluster {
    fn ids(&self) -> Vec<NodeId> {
        (1..=self.replica_count() as NodeId).collect()
    }

    fn client_addr(&self, id: NodeId) -> String {
        self.client_addrs()[index(id)].clone()
    }

    fn client_options(&self) -> ClientOptions {
        ProcessCluster::client_options(self)
    }

    async fn leader(&self, timeout: Duration) -> anyhow::Result<NodeId> {
        let leader = poll_until("a leader", timeout, POLL_INTERVAL, || async {
            self.leader_index()
                .await
                .map_err(|error| format!("{error:#}"))
        })
        .await?;
        Ok(leader as NodeId + 1)
    }

    async fn stop(&mut self, id: NodeId) {
        ProcessCluster::kill(self, index(id));
    }

    async fn restart(&mut self, id: NodeId) -> anyhow::Result<()> {
        ProcessCluster::restart(self, index(id))
    }
}

/// A process cluster's replica `id` sits at index `id - 1`.
fn index(id: NodeId) -> usize {
    (id as usize).checked_sub(1).expect("node ids start at 1")
}
