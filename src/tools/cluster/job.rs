//! A [`LocalCluster`] with a controller beside every replica, as each `ctrlog serve` process
//! would run one: what the demo and the controller tests drive.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{oneshot, watch};
use tokio::task::JoinHandle;

use crate::controller::{Controller, ControllerReport};
use crate::jobs::JobState;
use crate::server::{ReplicaHandle, StartError};
use crate::tools::cluster::local::LocalCluster;
use crate::tools::cluster::wait::WaitError;
use crate::NodeId;

/// Builds the controller for one replica.
pub type ControllerFactory = Arc<dyn Fn(ReplicaHandle) -> Controller<ReplicaHandle> + Send + Sync>;

struct Running {
    stop: oneshot::Sender<()>,
    task: JoinHandle<()>,
    report: watch::Receiver<ControllerReport>,
}

pub struct LocalJob {
    pub cluster: LocalCluster,
    factory: ControllerFactory,
    controllers: BTreeMap<NodeId, Running>,
}

impl LocalJob {
    /// Starts a controller beside every running replica of `cluster`.
    pub fn start(cluster: LocalCluster, factory: ControllerFactory) -> LocalJob {
        let mut job = LocalJob {
            cluster,
            factory,
            controllers: BTreeMap::new(),
        };
        for id in job.cluster.running_ids() {
            job.start_controller(id);
        }
        job
    }

    fn start_controller(&mut self, id: NodeId) {
        let controller = (self.factory)(self.cluster.replica(id).clone_handle());
        let report = controller.report();
        let (stop, stopped) = oneshot::channel();
        let task = tokio::spawn(controller.run(async move {
            let _ = stopped.await;
        }));
        self.controllers.insert(id, Running { stop, task, report });
    }

    /// Kills a replica and its controller together, as a process dies; returns what the
    /// controller had reported until then.
    pub async fn kill(&mut self, id: NodeId) -> Option<ControllerReport> {
        let report = self.controllers.remove(&id).map(|running| {
            running.task.abort();
            let report = running.report.borrow().clone();
            report
        });
        self.cluster.stop(id).await;
        report
    }

    /// Restarts a killed replica on its directory, with a fresh controller.
    pub async fn restart(&mut self, id: NodeId) -> Result<(), StartError> {
        self.cluster.restart(id).await?;
        self.start_controller(id);
        Ok(())
    }

    /// Waits until the JobState of a running replica satisfies `condition`, re-checking on
    /// every apply, and returns that state; fails with `what` after `timeout`.
    pub async fn wait_for_state(
        &self,
        what: &str,
        timeout: Duration,
        condition: impl Fn(&JobState) -> bool,
    ) -> Result<JobState, WaitError> {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let Some(id) = self.cluster.running_ids().first().copied() else {
                return Err(WaitError("no replica is running".into()));
            };
            let replica = self.cluster.replica(id);
            let mut applied = replica.applied();
            let state = replica.read_state(JobState::clone);
            if condition(&state) {
                return Ok(state);
            }
            if tokio::time::Instant::now() >= deadline {
                return Err(WaitError(format!(
                    "the job did not reach \"{what}\" within {timeout:?}"
                )));
            }
            // The state changes only when an entry is applied.
            let _ = tokio::time::timeout_at(deadline, applied.changed()).await;
        }
    }

    /// The report of the controller that is active now, if any.
    pub fn active_report(&self) -> Option<ControllerReport> {
        self.controllers
            .values()
            .map(|r| r.report.borrow().clone())
            .find(|r| r.leading)
    }

    /// Every report, by replica (the appended commands of all leaders, for checks).
    pub fn reports(&self) -> BTreeMap<NodeId, ControllerReport> {
        self.controllers
            .iter()
            .map(|(id, r)| (*id, r.report.borrow().clone()))
            .collect()
    }

    /// Stops the controllers, then the replicas.
    pub async fn shutdown(mut self) {
        for (_, running) in std::mem::take(&mut self.controllers) {
            let _ = running.stop.send(());
            let _ = running.task.await;
        }
        self.cluster.shutdown().await;
    }
}
