//! A cluster of replicas in this process, on loopback ports: what the demo, the benchmarks and
//! the integration tests run. Replicas can be stopped and restarted on the same data directory
//! and the same ports.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::client::{ClientOptions, Member};
use crate::server::{AuthConfig, Replica, ReplicaConfig, StartError};
use crate::tools::cluster::wait::{poll_until, WaitError, POLL_INTERVAL};
use crate::wire::tls::client_config;
use crate::NodeId;

pub struct LocalCluster {
    dir: PathBuf,
    configs: BTreeMap<NodeId, ReplicaConfig>,
    replicas: BTreeMap<NodeId, Replica>,
    /// TLS and authentication for every replica, when started with [`LocalCluster::start_secure`].
    secure: Option<Secure>,
}

/// What a secure local cluster gives each replica and its clients.
struct Secure {
    pki: PathBuf,
    auth: AuthConfig,
    client: ClientOptions,
}

/// Replica ids a secure local cluster has certificates for (founders and later additions).
const SECURE_IDS_MAX: NodeId = 9;

impl LocalCluster {
    /// Starts replicas `1..=size` under `dir` on `127.0.0.1:0`, lets `tune` adjust each
    /// configuration, and initialises them as one cluster.
    pub async fn start(
        dir: &Path,
        size: u64,
        tune: impl Fn(&mut ReplicaConfig),
    ) -> Result<LocalCluster, StartError> {
        LocalCluster::start_with(dir, size, None, tune).await
    }

    /// Like [`LocalCluster::start`], with TLS on both ports and authentication on: a CA and
    /// certificates for replicas 1 to 9 under `dir/pki`, an admin client identity, which
    /// [`LocalCluster::client_options`] carries, and one for container `c1`
    /// (`certs::client_identity(dir/pki, "c1")`, role `container:c1`).
    pub async fn start_secure(
        dir: &Path,
        size: u64,
        tune: impl Fn(&mut ReplicaConfig),
    ) -> Result<LocalCluster, StartError> {
        let pki = dir.join("pki");
        let ids: Vec<NodeId> = (1..=SECURE_IDS_MAX).collect();
        crate::tools::certs::generate(
            &pki,
            &ids,
            &["127.0.0.1".into()],
            &["admin".into(), "c1".into()],
            1,
            false,
        )
        .map_err(|e| StartError::Tls(e.to_string()))?;
        let (cert, key) = crate::tools::certs::client_identity(&pki, "admin");
        let client_tls = client_config(&crate::tools::certs::ca_file(&pki), Some((&cert, &key)))
            .map_err(|e| StartError::Tls(e.to_string()))?;
        let secure = Secure {
            auth: AuthConfig {
                tokens_file: None,
                certificates: [
                    ("client-admin".to_string(), "admin".to_string()),
                    ("client-c1".to_string(), "container:c1".to_string()),
                ]
                .into(),
            },
            client: ClientOptions {
                tls: Some(client_tls),
                ..ClientOptions::default()
            },
            pki,
        };
        LocalCluster::start_with(dir, size, Some(secure), tune).await
    }

    async fn start_with(
        dir: &Path,
        size: u64,
        secure: Option<Secure>,
        tune: impl Fn(&mut ReplicaConfig),
    ) -> Result<LocalCluster, StartError> {
        let mut cluster = LocalCluster {
            dir: dir.to_path_buf(),
            configs: BTreeMap::new(),
            replicas: BTreeMap::new(),
            secure,
        };
        for id in 1..=size {
            // Each is a founding member, though it learns the others' ports only once all
            // are bound: the founder is initialised below, and the others hear it.
            cluster
                .start_new(id, |config| {
                    config.join_from = (1..=size).filter(|other| *other != id).collect();
                    tune(config);
                })
                .await?;
        }
        let members: BTreeMap<NodeId, Member> = cluster
            .replicas
            .iter()
            .map(|(id, r)| (*id, r.member()))
            .collect();
        for config in cluster.configs.values_mut() {
            config.initial_members = members.clone();
            config.join_from.clear();
        }
        cluster.replicas[&1].initialize(members).await?;
        Ok(cluster)
    }

    /// Starts a new, empty replica `id` that is not yet a member (for membership changes):
    /// any replica started before it may add it (`join_from`), unless `tune` says otherwise.
    pub async fn start_new(
        &mut self,
        id: NodeId,
        tune: impl Fn(&mut ReplicaConfig),
    ) -> Result<&Replica, StartError> {
        let mut config = ReplicaConfig {
            id,
            data_dir: self.dir.join(format!("replica-{id}")),
            join_from: self
                .configs
                .keys()
                .copied()
                .filter(|other| *other != id)
                .collect(),
            ..ReplicaConfig::default()
        };
        // Replicas in one process share its runtime with everything else it runs (a test
        // binary runs its tests at once, in debug builds, on two cores), so a pause of that
        // process silences every replica at once; the deployed timing (50/300/450 ms) then
        // costs spurious elections. Twice the margin here; `ctrlog serve`, the benchmarks and
        // the chaos runs keep the defaults.
        config.raft.heartbeat_interval_ms = 100;
        config.raft.election_timeout_min_ms = 600;
        config.raft.election_timeout_max_ms = 900;
        if let Some(secure) = &self.secure {
            config.tls = Some(crate::tools::certs::replica_files(&secure.pki, id));
            config.auth = Some(secure.auth.clone());
        }
        tune(&mut config);
        let replica = Replica::start(config.clone()).await?;
        // Restarts rebind the same ports, which the membership records.
        config.peer_addr = replica.peer_addr();
        config.client_addr = replica.client_addr();
        self.configs.insert(id, config);
        self.replicas.insert(id, replica);
        Ok(&self.replicas[&id])
    }

    /// How a client connects to this cluster: with TLS and an admin identity when it is
    /// secure, plainly otherwise.
    pub fn client_options(&self) -> ClientOptions {
        self.secure
            .as_ref()
            .map_or_else(ClientOptions::default, |s| s.client.clone())
    }

    /// The configuration replica `id` runs (or last ran) with.
    pub fn config(&self, id: NodeId) -> &ReplicaConfig {
        &self.configs[&id]
    }

    pub fn replica(&self, id: NodeId) -> &Replica {
        self.replicas
            .get(&id)
            .unwrap_or_else(|| panic!("replica {id} is not running"))
    }

    pub fn running(&self) -> impl Iterator<Item = &Replica> {
        self.replicas.values()
    }

    /// Every replica's id, running or not.
    pub fn ids(&self) -> Vec<NodeId> {
        self.configs.keys().copied().collect()
    }

    pub fn running_ids(&self) -> Vec<NodeId> {
        self.replicas.keys().copied().collect()
    }

    /// Some running replica other than `leader`.
    pub fn follower_of(&self, leader: NodeId) -> NodeId {
        *self
            .replicas
            .keys()
            .find(|id| **id != leader)
            .expect("a cluster of one has no follower")
    }

    /// Client addresses of the running replicas.
    pub fn client_addrs(&self) -> Vec<String> {
        self.replicas
            .values()
            .map(|r| r.client_addr().to_string())
            .collect()
    }

    /// Waits until the running replicas agree on one leader among them, and returns it.
    pub async fn wait_for_leader(&self, timeout: Duration) -> Result<NodeId, WaitError> {
        poll_until("an agreed leader", timeout, POLL_INTERVAL, || {
            let leaders: Vec<Option<NodeId>> = self
                .replicas
                .values()
                .map(|r| r.metrics().current_leader)
                .collect();
            let agreed = match leaders.first() {
                Some(Some(leader))
                    if leaders.iter().all(|l| l == &Some(*leader))
                        && self.replicas.get(leader).is_some_and(|r| r.is_leader()) =>
                {
                    Ok(*leader)
                }
                _ => Err(format!("leaders seen: {leaders:?}")),
            };
            std::future::ready(agreed)
        })
        .await
    }

    /// Waits until every running replica has applied at least `offset`.
    pub async fn wait_for_applied(&self, offset: u64, timeout: Duration) -> Result<(), WaitError> {
        let deadline = tokio::time::Instant::now() + timeout;
        for replica in self.replicas.values() {
            let mut applied = replica.applied();
            tokio::time::timeout_at(deadline, applied.wait_for(|a| a.last_offset >= offset))
                .await
                .map_err(|_| {
                    WaitError(format!(
                        "replica {} applied only {} of {offset} within {timeout:?}",
                        replica.id(),
                        replica.applied_offset()
                    ))
                })?
                .map_err(|_| WaitError(format!("replica {} stopped", replica.id())))?;
        }
        Ok(())
    }

    /// Stops replica `id` (its data stays).
    pub async fn stop(&mut self, id: NodeId) {
        if let Some(replica) = self.replicas.remove(&id) {
            replica.shutdown().await;
        }
    }

    /// Starts replica `id` again on its data directory and ports.
    pub async fn restart(&mut self, id: NodeId) -> Result<&Replica, StartError> {
        let config = self.configs[&id].clone();
        let replica = Replica::start(config).await?;
        self.replicas.insert(id, replica);
        Ok(&self.replicas[&id])
    }

    /// Stops every replica.
    pub async fn shutdown(mut self) {
        let ids = self.running_ids();
        for id in ids {
            self.stop(id).await;
        }
    }
}
