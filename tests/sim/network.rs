//! The simulated network: every message between two parties (replicas, producers, subscribers,
//! containers) crosses one hop per direction, which can be cut (one-way or both ways), lose the
//! message, or delay it. Lost messages cost the caller its whole timeout, as on a real network.
//!
//! All randomness comes from one seeded generator, and time is tokio's paused clock, so a run
//! is a function of its seed.

use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use ctrlog::client::Member;
use ctrlog::raft::elector::ElectionTimer;
use ctrlog::raft::network::{
    FirstContact, PeerAnswers, PeerLayer, PeerTransport, RefusedOutsiders,
};
use ctrlog::raft::stages::CommitStages;
use ctrlog::raft::storage::log_store::Durable;
use ctrlog::raft::types::*;
use ctrlog::raft::TypeConfig;
use ctrlog::NodeId;
use openraft::error::{NetworkError, RPCError, RemoteError, Unreachable};
use openraft::network::{RPCOption, RaftNetworkFactory};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tokio::sync::watch;
use tokio::time::Instant;

use super::store::Storage;

/// A party on the network: replicas are 1..=N, clients get their own ids.
pub type Party = u64;

/// Why a call produced no answer.
#[derive(Debug)]
pub enum Failure {
    /// Nobody listens there (the replica is down): refused at once.
    Refused,
    /// The request or its answer was lost, or the callee did not answer in time.
    TimedOut,
}

/// A running replica, as a call reaches it.
#[derive(Clone)]
pub struct Incarnation {
    pub raft: Raft,
    pub storage: Storage,
    /// Its election timer, which the peer traffic it answers moves (as the real peer port's).
    pub elections: Arc<ElectionTimer>,
    /// The outsiders it warned about.
    outsiders: Arc<RefusedOutsiders>,
    /// Whom it hears before its log knows a membership: the simulation's founding members.
    first_contact: Arc<FirstContact>,
    generation: u64,
}

impl Incarnation {
    /// What answers the peer requests that reach it: the peer port's own rules.
    fn answers(&self) -> PeerAnswers {
        PeerAnswers {
            raft: self.raft.clone(),
            log: self.storage.log.clone(),
            elections: self.elections.clone(),
            outsiders: self.outsiders.clone(),
            first_contact: self.first_contact.clone(),
            refusals: Default::default(),
        }
    }
}

struct NetState {
    up: BTreeMap<NodeId, Incarnation>,
    /// Messages from `.0` to `.1` are lost.
    cut: BTreeSet<(Party, Party)>,
    loss_per_mille: u32,
    delay_ms_max: u64,
    rng: StdRng,
    generations: u64,
    /// What replicas found when sent a different entry under a log id they held; each of
    /// them stopped.
    divergences: Vec<String>,
}

pub struct Net {
    state: Mutex<NetState>,
}

/// What one hop does to a message.
enum Hop {
    Lost,
    Delayed(Duration),
}

impl Net {
    pub fn new(seed: u64) -> Arc<Net> {
        Arc::new(Net {
            state: Mutex::new(NetState {
                up: BTreeMap::new(),
                cut: BTreeSet::new(),
                loss_per_mille: 0,
                delay_ms_max: 2,
                rng: StdRng::seed_from_u64(seed),
                generations: 0,
                divergences: Vec::new(),
            }),
        })
    }

    fn lock(&self) -> MutexGuard<'_, NetState> {
        self.state
            .lock()
            .expect("simulation locks are never poisoned")
    }

    /// Draws from the simulation's one generator.
    pub fn random<T>(&self, draw: impl FnOnce(&mut StdRng) -> T) -> T {
        draw(&mut self.lock().rng)
    }

    pub fn bring_up(
        &self,
        id: NodeId,
        raft: Raft,
        storage: Storage,
        elections: Arc<ElectionTimer>,
        first_contact: Arc<FirstContact>,
    ) {
        let mut state = self.lock();
        state.generations += 1;
        let generation = state.generations;
        state.up.insert(
            id,
            Incarnation {
                raft,
                storage,
                elections,
                outsiders: Default::default(),
                first_contact,
                generation,
            },
        );
    }

    /// Takes a replica off the network; the caller shuts its Raft down and closes its
    /// storage.
    pub fn take_down(&self, id: NodeId) -> Option<(Raft, Storage)> {
        self.lock().up.remove(&id).map(|i| (i.raft, i.storage))
    }

    pub fn is_up(&self, id: NodeId) -> bool {
        self.lock().up.contains_key(&id)
    }

    pub fn running(&self) -> Vec<(NodeId, Raft, Storage)> {
        self.lock()
            .up
            .iter()
            .map(|(id, i)| (*id, i.raft.clone(), i.storage.clone()))
            .collect()
    }

    pub fn cut(&self, from: Party, to: Party) {
        self.lock().cut.insert((from, to));
    }

    pub fn restore(&self, from: Party, to: Party) {
        self.lock().cut.remove(&(from, to));
    }

    pub fn heal(&self) {
        let mut state = self.lock();
        state.cut.clear();
        state.loss_per_mille = 0;
        state.delay_ms_max = 2;
    }

    /// What replicas found when sent a different entry under a log id they held.
    pub fn divergences(&self) -> Vec<String> {
        self.lock().divergences.clone()
    }

    pub fn set_loss(&self, per_mille: u32) {
        self.lock().loss_per_mille = per_mille;
    }

    pub fn set_delay(&self, ms_max: u64) {
        self.lock().delay_ms_max = ms_max;
    }

    fn hop(&self, from: Party, to: Party) -> Hop {
        let mut state = self.lock();
        if state.cut.contains(&(from, to)) {
            return Hop::Lost;
        }
        let loss = state.loss_per_mille;
        if loss > 0 && state.rng.gen_range(0..1000) < loss {
            return Hop::Lost;
        }
        let max = state.delay_ms_max;
        Hop::Delayed(Duration::from_micros(state.rng.gen_range(0..=max * 1000)))
    }

    /// Sends a request from `from` to replica `to`, runs `call` there, and carries the answer
    /// back, within `timeout`.
    pub async fn call<T, F, Fut>(
        &self,
        from: Party,
        to: NodeId,
        timeout: Duration,
        call: F,
    ) -> Result<T, Failure>
    where
        F: FnOnce(Incarnation) -> Fut,
        Fut: Future<Output = T>,
    {
        let deadline = Instant::now() + timeout;
        match self.hop(from, to) {
            Hop::Lost => {
                tokio::time::sleep_until(deadline).await;
                return Err(Failure::TimedOut);
            }
            Hop::Delayed(delay) => tokio::time::sleep(delay).await,
        }
        let Some(callee) = self.lock().up.get(&to).cloned() else {
            return Err(Failure::Refused);
        };
        let generation = callee.generation;
        let answer = tokio::time::timeout_at(deadline, call(callee))
            .await
            .map_err(|_| Failure::TimedOut)?;
        let same_incarnation = self
            .lock()
            .up
            .get(&to)
            .is_some_and(|i| i.generation == generation);
        if !same_incarnation {
            // The process died while handling the call: the connection broke.
            return Err(Failure::Refused);
        }
        match self.hop(to, from) {
            Hop::Lost => {
                tokio::time::sleep_until(deadline).await;
                Err(Failure::TimedOut)
            }
            Hop::Delayed(delay) => {
                tokio::time::sleep(delay).await;
                Ok(answer)
            }
        }
    }
}

/// openraft's network factory for replica `from`: the product's [`PeerLayer`] (every rule an
/// outgoing peer request follows, the 1 MiB AppendEntries cut among them) over the simulated
/// network instead of a tarpc connection.
pub struct SimNetwork {
    pub net: Arc<Net>,
    pub from: NodeId,
    /// The sender's election timer, told when a voter refuses it for a shorter log.
    pub elections: Arc<ElectionTimer>,
    /// How far the sender's log is on disk: as a leader it tells of no commit beyond it.
    pub durable: watch::Receiver<Durable>,
    /// Where the sender's `replicated` stage is timed.
    pub stages: Arc<CommitStages>,
}

/// The simulated network's carriage of the peer protocol to one replica. The network knows
/// who sends, as the peer port's mutual TLS does: each request is admitted on that identity
/// and the receiver's membership by the product's own rule (`PeerAnswers::admit`).
pub struct SimPeer {
    net: Arc<Net>,
    from: NodeId,
    to: NodeId,
}

impl RaftNetworkFactory<TypeConfig> for SimNetwork {
    type Network = PeerLayer<SimPeer>;

    async fn new_client(&mut self, target: NodeId, _: &Member) -> PeerLayer<SimPeer> {
        PeerLayer {
            target,
            transport: SimPeer {
                net: self.net.clone(),
                from: self.from,
                to: target,
            },
            elections: Some(self.elections.clone()),
            stages: Some(self.stages.clone()),
            durable: Some(self.durable.clone()),
        }
    }
}

impl SimPeer {
    async fn rpc<T, E, F, Fut>(
        &self,
        option: &RPCOption,
        call: F,
    ) -> Result<T, RPCError<NodeId, Member, openraft::error::RaftError<NodeId, E>>>
    where
        E: std::error::Error,
        F: FnOnce(Incarnation) -> Fut,
        Fut: Future<Output = Result<T, openraft::error::RaftError<NodeId, E>>>,
    {
        let answer = self
            .net
            .call(self.from, self.to, option.hard_ttl(), call)
            .await;
        match answer {
            Ok(Ok(response)) => Ok(response),
            Ok(Err(remote)) => Err(RPCError::RemoteError(RemoteError::new(self.to, remote))),
            Err(Failure::Refused) => Err(RPCError::Unreachable(Unreachable::new(
                &std::io::Error::from(std::io::ErrorKind::ConnectionRefused),
            ))),
            Err(Failure::TimedOut) => Err(RPCError::Network(NetworkError::new(
                &std::io::Error::from(std::io::ErrorKind::TimedOut),
            ))),
        }
    }
}

impl PeerTransport for SimPeer {
    async fn append_entries(
        &mut self,
        request: AppendEntriesRequest,
        option: &RPCOption,
    ) -> Result<AppendEntriesResponse, RpcError> {
        let (net, from, to) = (self.net.clone(), self.from, self.to);
        self.rpc(option, |callee| async move {
            let answers = callee.answers();
            answers.admit(&request.vote, Some(&[from]))?;
            match answers.append_entries(request).await {
                Ok(answer) => answer,
                // It stopped, as the peer port's replica does; the finding is the run's.
                Err(divergence) => {
                    let found = format!("replica {to}: {divergence}");
                    let mut state = net.lock();
                    if !state.divergences.contains(&found) {
                        state.divergences.push(found);
                    }
                    Err(openraft::error::RaftError::Fatal(
                        openraft::error::Fatal::Stopped,
                    ))
                }
            }
        })
        .await
    }

    async fn install_snapshot(
        &mut self,
        request: InstallSnapshotRequest,
        option: &RPCOption,
    ) -> Result<InstallSnapshotResponse, RpcError<InstallSnapshotError>> {
        let from = self.from;
        self.rpc(option, |callee| async move {
            let answers = callee.answers();
            answers.admit(&request.vote, Some(&[from]))?;
            answers.install_snapshot(request).await
        })
        .await
    }

    async fn vote(
        &mut self,
        request: VoteRequest,
        option: &RPCOption,
    ) -> Result<VoteResponse, RpcError> {
        let from = self.from;
        self.rpc(option, |callee| async move {
            let answers = callee.answers();
            answers.admit(&request.vote, Some(&[from]))?;
            answers.vote(request).await
        })
        .await
    }
}
