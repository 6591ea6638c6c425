//! Raft RPC between replicas over tarpc (bincode over TCP): the service every replica serves
//! on its peer port (served by `server::ports::peer`), and openraft's `RaftNetworkFactory` that
//! calls it.
//!
//! Every call carries a deadline derived from openraft's `RPCOption` (its hard TTL), so a dead
//! or partitioned peer costs at most that long. A broken connection is dropped and re-dialled
//! on the next call; openraft's backoff paces the retries. So is a connection that has gone
//! silent: after a partition heals, TCP resends what the partition swallowed only on its
//! retransmission backoff (seconds to minutes), and every call queued behind it would wait as
//! long; a fresh connection works at once. An AppendEntries message is cut to
//! [`APPEND_ENTRIES_BYTES_MAX`] so that it can be answered within openraft's short deadline.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use openraft::error::{NetworkError, RemoteError, Unreachable};
use openraft::network::{RPCOption, RaftNetwork, RaftNetworkFactory};
use tarpc::{client, context};
use tokio::sync::watch;

use super::elector::ElectionTimer;
use super::log_matching::{stop_on_divergence, Divergence};
use super::proposer::BATCH_BYTES_MAX;
use super::refusals::Refusals;
use super::stages::{CommitStages, Stage};
use super::storage::data_dir::{ClusterIdentity, Meeting};
use super::storage::log_store::{hold_to_durable, Durable, LogStore};
use super::types::*;
use crate::log::Level;
use crate::wire::tls::{dial_expecting, framed, node_name};
use crate::wire::version::{open_and_agree, HandshakeError, Hello, ProtocolOffer};
use crate::wire::{ApiError, ClusterId, Member};
use crate::NodeId;

/// The largest frame on the peer port. It must exceed the biggest AppendEntries message
/// ([`RAFT_PAYLOAD_ENTRIES_MAX`] entries) and openraft's snapshot chunk.
pub const PEER_FRAME_BYTES_MAX: usize = 256 << 20;

/// Entries per AppendEntries message (openraft's `max_payload_entries`). Each is one batch of
/// at most [`BATCH_BYTES_MAX`] or one command alone, so with
/// `command_bytes_max` bounded by the configuration's check a message always fits
/// [`PEER_FRAME_BYTES_MAX`].
pub const RAFT_PAYLOAD_ENTRIES_MAX: u64 = 64;

/// The encoded command bytes one AppendEntries message carries at most (always at least one
/// entry, however large). openraft 0.9 gives each AppendEntries only the heartbeat interval
/// (50 ms by default) to be answered, and a follower behind a stretch of large commands was
/// sent up to [`RAFT_PAYLOAD_ENTRIES_MAX`] of them, tens of MiB, at every try: each try timed
/// out and was sent again, the follower never caught up, and the leader, whose heartbeats
/// still got through, kept its quorum and could commit nothing (found by `ctrlog chaos` with
/// its job, seeds 2028 and 2049). A longer message is cut here, and the follower's
/// acceptance of the part sent is answered to openraft as `PartialSuccess`, after which it
/// sends the rest.
pub const APPEND_ENTRIES_BYTES_MAX: usize = BATCH_BYTES_MAX;

/// How long the leader waits before it tries again to reach a peer it could not reach
/// (openraft's default is 500 ms). A restarted follower stands for election once it has gone
/// `election_timeout_max + heartbeat` without hearing a leader (`elector`, 500 ms at the
/// least with the defaults): the leader's next try must reach it well before that, or the
/// follower bumps the term and deposes a healthy leader. A refused dial costs a round trip.
pub const UNREACHABLE_RETRY: Duration = Duration::from_millis(100);

/// openraft's backoff after an unreachable peer: [`UNREACHABLE_RETRY`], again and again. The
/// simulation's network uses it too.
pub fn unreachable_backoff() -> openraft::network::Backoff {
    openraft::network::Backoff::new(std::iter::repeat(UNREACHABLE_RETRY))
}

/// How long dialling a peer may take before the call counts as unreachable.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);

/// A connection that has answered none of the calls sent on it for this long is presumed
/// wedged (see the module docs) and dialled afresh. Long against a healthy peer's slowest
/// answer (an fsync stall), short against an election timeout's worth of lost heartbeats.
const SILENT_CONNECTION_MAX: Duration = Duration::from_millis(1_000);

/// The service on every replica's peer port.
#[tarpc::service]
pub trait RaftRpc {
    async fn append_entries(
        request: AppendEntriesRequest,
    ) -> Result<AppendEntriesResponse, RaftError>;
    async fn vote(request: VoteRequest) -> Result<VoteResponse, RaftError>;
    async fn install_snapshot(
        request: InstallSnapshotRequest,
    ) -> Result<InstallSnapshotResponse, RaftError<InstallSnapshotError>>;
    /// The version handshake ([`version`](crate::wire::version)), sent first on every
    /// connection a replica dials; its answer also says the highest vocabulary level the
    /// peer's build knows, which a leader asks before adding a replica or raising the level
    /// (a build that does not know the recorded level stops applying). Not a Raft request.
    /// Added after v0.1.0 and last, so that the requests before it keep their wire form; a
    /// replica of v0.1.0 closes the connection on it, and is then spoken to as v0.1.0 spoke.
    async fn hello(offer: ProtocolOffer) -> Result<Hello, ApiError>;
    /// The caller's cluster, if its directory records one, sent after `hello` (when the
    /// answer lists `introduce`) and before any Raft request; answered with the server's,
    /// which adopts the caller's if it records none, or refused with
    /// [`ApiError::OtherCluster`], after which the connection serves no Raft request
    /// ([`ClusterIdentity`]). Added after `hello` and last, for the same reason.
    async fn introduce(cluster: Option<ClusterId>) -> Result<Option<ClusterId>, ApiError>;
    /// The leader `from`, stopping, hands over to this replica: its Raft core has been silent
    /// for `silent_for_ms`, and this replica stands once the voters' leases from its last
    /// message lapse ([`ElectionTimer::handed_over`]). Refused unless this replica follows
    /// `from`. Sent only to a peer whose `hello` lists `take_over`; added after `introduce`.
    async fn take_over(from: NodeId, silent_for_ms: u64) -> Result<(), ApiError>;
    /// The leader `from`, stopping, hands over to the voter `to`, not to this replica: this
    /// replica stands no earlier than an election timeout after `to` does
    /// ([`ElectionTimer::stands_back`]), so that `to`'s vote request, which may wait on a
    /// dial, finds it still a voter and not a rival candidate of the same term. Refused unless
    /// this replica follows `from`. Sent only to a peer whose `hello` lists `stand_back`;
    /// added last.
    async fn stand_back(from: NodeId, to: NodeId, silent_for_ms: u64) -> Result<(), ApiError>;
    /// Where this replica serves gRPC (`[grpc] addr`), if it does: what another replica
    /// names in a `NotLeader` answered over gRPC, and lists in a gRPC `Status`. Asked only
    /// of a peer whose `hello` lists `grpc_addr`; added last.
    async fn grpc_addr() -> Option<String>;
}

/// The rules every incoming Raft request follows, whatever carried it (the peer port's tarpc
/// service, `server::ports::peer`, or the simulation's network): its sender is admitted by the
/// identity the transport vouches for and by this replica's membership ([`admit`](Self::admit),
/// which the carrier calls first), an AppendEntries is checked against the entries this replica holds
/// under the same log ids before openraft sees it, and a different one stops this replica
/// ([`log_matching`](super::log_matching)); the election timer hears every answer given.
#[derive(Clone)]
pub struct PeerAnswers {
    pub raft: Raft,
    /// This replica's log, which every AppendEntries is checked against.
    pub log: LogStore,
    /// Told of every leader this replica accepts and every vote it grants.
    pub elections: Arc<ElectionTimer>,
    /// When each node outside the membership was last warned about.
    pub outsiders: Arc<RefusedOutsiders>,
    /// Whom this replica hears while its log knows no membership.
    pub first_contact: Arc<FirstContact>,
    /// The peer port's refusal lines, one a second per cause (shared with the port).
    pub refusals: Arc<Refusals>,
}

/// The nodes a replica whose log knows no membership yet takes Raft requests from. Any node
/// certificate the CA signed would do otherwise: one that was never a member once sent two
/// founding members, before the founder reached them, a first membership naming itself a
/// voter, and they formed a cluster with it that refused the founder for good.
#[derive(Clone, Debug, Default)]
pub struct FirstContact {
    /// The founding members (`initial_members`), this replica among them. The first
    /// membership it takes must be exactly these voters: the one the founder initialises.
    pub founders: BTreeSet<NodeId>,
    /// The members that will add this replica (`join_from`).
    pub joining_from: BTreeSet<NodeId>,
}

impl FirstContact {
    /// Whether `node` may speak to this replica before its log knows a membership.
    pub fn trusts(&self, node: NodeId) -> bool {
        self.founders.contains(&node) || self.joining_from.contains(&node)
    }

    /// Refuses the first membership a founding member is sent unless it is the founding one;
    /// `Ok` for a joining replica, whose first entries are the founders' membership (which
    /// does not name it) when it catches up from the start of the log. A snapshot is not
    /// checked: a joiner added after a purge is sent one whose membership predates it (the
    /// entry adding it follows the snapshot), so only its sender's identity vouches for it.
    fn check_first_membership(&self, entries: &[Entry]) -> Result<(), String> {
        if self.founders.is_empty() {
            return Ok(());
        }
        let first = entries.iter().find_map(|entry| match &entry.payload {
            openraft::EntryPayload::Membership(membership) => Some((entry.log_id, membership)),
            _ => None,
        });
        let Some((log_id, membership)) = first else {
            return Ok(());
        };
        let voters: BTreeSet<NodeId> = membership.voter_ids().collect();
        let nodes: BTreeSet<NodeId> = membership.nodes().map(|(id, _)| *id).collect();
        if voters == self.founders && nodes == self.founders {
            return Ok(());
        }
        Err(format!(
            "the first membership sent ({log_id}: voters {voters:?}, nodes {nodes:?}) is not \
             the founding members {:?} this replica was started with",
            self.founders
        ))
    }
}

/// How often a node outside the membership that keeps asking is warned about: a removed
/// replica restarted on its old directory stands for election every few seconds, for good.
const OUTSIDER_WARNING_INTERVAL: Duration = Duration::from_secs(60);

/// The nodes outside the membership whose requests were refused, each warned about once an
/// `OUTSIDER_WARNING_INTERVAL` with how many were refused since, the rest at debug level.
pub struct RefusedOutsiders(Refusals<NodeId>);

impl Default for RefusedOutsiders {
    fn default() -> Self {
        RefusedOutsiders(Refusals::every(OUTSIDER_WARNING_INTERVAL))
    }
}

impl PeerAnswers {
    /// Admits a Raft request or refuses it. Its sender is the node its vote names (the
    /// candidate of a vote request, the leader of the rest).
    ///
    /// `identity` is the nodes the transport knows the caller to be (the node ids its TLS
    /// certificate names; the simulation's network knows its sender): the claimed node must be
    /// one of them. And the node must be a member (voter or learner) of the membership this
    /// replica's own log gives. Nothing the request
    /// carries stands in for that: its vote, its log position and its entries are the
    /// sender's word, and any holder of a certificate the cluster's CA signed can claim
    /// them (a forged committed vote of a higher term from a non-member's certificate once
    /// rewrote the log). A replica that knows no membership yet hears only its
    /// [`FirstContact`]: its fellow founding members, or the members it joins from.
    ///
    /// The price (ARCHITECTURE.md, "Who may speak on the peer port"): a replica that was down
    /// while a member was added neither votes for nor follows that member until a member its
    /// log names leads and sends it the change.
    pub fn admit<E: std::error::Error>(
        &self,
        vote: &Vote,
        identity: Option<&[NodeId]>,
    ) -> Result<(), RaftError<E>> {
        let node = vote.leader_id().voted_for().unwrap_or_default();
        if let Some(nodes) = identity {
            if !nodes.contains(&node) {
                if let Some(refused) = self
                    .refusals
                    .refused("a node its certificate does not name")
                {
                    tracing::warn!(
                        claimed = node,
                        named = ?nodes,
                        refused,
                        "refused a Raft request: the peer's certificate does not name the node it claims to be (one line a second)"
                    );
                }
                return Err(RaftError::Fatal(openraft::error::Fatal::Stopped));
            }
        }
        if !self.trusts(node) {
            let members = self.members();
            match self.outsiders.0.refused(node) {
                Some(refused) if members.is_empty() => tracing::warn!(
                    sender = node,
                    %vote,
                    founders = ?self.first_contact.founders,
                    joining_from = ?self.first_contact.joining_from,
                    refused,
                    "refused Raft requests from a node this replica does not know: its log \
                     knows no membership yet, and it hears only its founding members \
                     (initial_members) or the members it joins from (join_from); said again \
                     in a minute if it keeps asking"
                ),
                Some(refused) => tracing::warn!(
                    sender = node,
                    %vote,
                    ?members,
                    refused,
                    "refused Raft requests from a node outside the membership this replica's \
                     log gives (a removed replica restarted? it is refused for good: stop it and \
                     wipe its directory); said again in a minute if it keeps asking"
                ),
                None => tracing::debug!(sender = node, %vote, "refused an outsider again"),
            }
            return Err(RaftError::Fatal(openraft::error::Fatal::Stopped));
        }
        Ok(())
    }

    /// Whether `node` may speak to this replica: a member of the membership its log gives,
    /// or, while it knows none, one of its [`FirstContact`].
    pub fn trusts(&self, node: NodeId) -> bool {
        let metrics = self.raft.metrics();
        let metrics = metrics.borrow();
        let membership = metrics.membership_config.membership();
        let trusted = match membership.nodes().next() {
            None => self.first_contact.trusts(node),
            Some(_) => membership.get_node(&node).is_some(),
        };
        trusted
    }

    /// The nodes of the membership this replica's log gives (none before its first).
    fn members(&self) -> Vec<NodeId> {
        let metrics = self.raft.metrics();
        let metrics = metrics.borrow();
        let membership = metrics.membership_config.membership();
        membership.nodes().map(|(id, _)| *id).collect()
    }

    /// Whether to refuse what would give this replica, while it knows no membership, a first
    /// one it was not started to take (`check` says why).
    fn refuses_first_membership(
        &self,
        check: impl FnOnce(&FirstContact) -> Result<(), String>,
    ) -> bool {
        if !self.members().is_empty() {
            return false;
        }
        match check(&self.first_contact) {
            Ok(()) => false,
            Err(why) => {
                if let Some(refused) = self.refusals.refused("a first membership") {
                    tracing::warn!(%why, refused, "refused a first membership (one line a second)");
                }
                true
            }
        }
    }

    /// openraft's answer to an admitted AppendEntries, or the divergence it carried: this
    /// replica then stops, and the sender is answered that it did.
    pub async fn append_entries(
        &self,
        request: AppendEntriesRequest,
    ) -> Result<Result<AppendEntriesResponse, RaftError>, Divergence> {
        let sender = request.vote.leader_id().voted_for().unwrap_or_default();
        if self.refuses_first_membership(|first| first.check_first_membership(&request.entries)) {
            return Ok(Err(RaftError::Fatal(openraft::error::Fatal::Stopped)));
        }
        stop_on_divergence(&self.raft, &self.log, sender, &request.entries)?;
        let answer = self.raft.append_entries(request).await;
        if let Ok(answer) = &answer {
            self.elections.answered_append_entries(answer);
        }
        Ok(answer)
    }

    /// openraft's answer to an admitted vote request, unless this replica's log is being
    /// repaired: then it is refused for any candidate whose log is less up to date than what
    /// the damaged log held, and the answer says how far that was (see
    /// [`Repair`](super::storage::log_store::Repair)).
    pub async fn vote(&self, request: VoteRequest) -> Result<VoteResponse, RaftError> {
        if let Some(held) = self.held_while_repairing()? {
            if request.last_log_id < Some(held) {
                tracing::warn!(
                    candidate = %request.vote,
                    candidate_last = ?request.last_log_id,
                    held = %held,
                    "refused a vote: this replica's log is being repaired, and the candidate's \
                     log is less up to date than what it held"
                );
                let vote = self.raft.metrics().borrow().vote;
                return Ok(VoteResponse::new(vote, Some(held), false));
            }
        }
        let candidate = request.vote;
        let answer = self.raft.vote(request).await?;
        tracing::info!(%candidate, granted = answer.vote_granted, vote = %answer.vote, "answered a vote request");
        self.elections.answered_vote(&answer);
        Ok(answer)
    }

    /// The last entry the damaged log held, while it is being repaired.
    fn held_while_repairing(&self) -> Result<Option<LogId>, RaftError> {
        match self.log.repairing() {
            Ok(repair) => Ok(repair.map(|r| r.held)),
            Err(e) => {
                // It cannot tell whether it is whole: as if it were not, it votes for no one.
                tracing::error!(error = %e, "could not read this replica's repair record");
                Err(RaftError::Fatal(openraft::error::Fatal::Stopped))
            }
        }
    }

    pub async fn install_snapshot(
        &self,
        request: InstallSnapshotRequest,
    ) -> Result<InstallSnapshotResponse, RaftError<InstallSnapshotError>> {
        let sender_vote = request.vote;
        let answer = self.raft.install_snapshot(request).await?;
        self.elections
            .answered_install_snapshot(&sender_vote, &answer);
        Ok(answer)
    }
}

/// Creates one [`PeerClient`] per target; openraft asks for a new one when it needs to.
#[derive(Clone, Default)]
pub struct PeerNetwork {
    /// Mutual TLS to the peers: the CA and this replica's own certificate.
    pub tls: Option<Arc<rustls::ClientConfig>>,
    /// The replica's election timer, told when a voter refuses it for a shorter log.
    pub elections: Option<Arc<ElectionTimer>>,
    /// Where the `replicated` stage is timed (see [`stages`](super::stages)).
    pub stages: Option<Arc<CommitStages>>,
    /// How far this replica's own log is on disk: a leader tells its followers of no commit
    /// beyond it (see [`log_store`](super::storage::log_store), "The leader's own appends").
    pub durable: Option<watch::Receiver<Durable>>,
    /// The cluster this replica's directory records, introduced to every peer it dials; a
    /// peer of another cluster is not spoken to. `None`: no introductions (tools and tests
    /// that speak to one peer).
    pub cluster: Option<Arc<ClusterIdentity>>,
}

impl PeerNetwork {
    /// Asks the replica `id` at `member`'s peer port for the highest vocabulary level its
    /// build knows, within `timeout` (its `hello` says; a v0.1.0 replica, which has none,
    /// knows [`V010_LEVEL_MAX`](crate::wire::version::V010_LEVEL_MAX)). The error says
    /// why there was no answer.
    pub async fn vocabulary_level_max(
        &self,
        id: NodeId,
        member: &Member,
        timeout: Duration,
    ) -> Result<Level, String> {
        let mut peer = self.client_for(id, member);
        let (_, hello) = peer
            .connected(timeout)
            .await
            .map_err(CallError::into_message)?;
        Ok(hello.vocabulary_level_max)
    }
}

impl PeerNetwork {
    /// Asks the replica `id` at `member`'s peer port where it serves gRPC, within `timeout`:
    /// `Ok(None)` if it serves none or its build cannot say (it does not list `grpc_addr`).
    pub async fn grpc_addr(
        &self,
        id: NodeId,
        member: &Member,
        timeout: Duration,
    ) -> Result<Option<String>, String> {
        let mut peer = self.client_for(id, member);
        let (client, hello) = peer
            .connected(timeout)
            .await
            .map_err(CallError::into_message)?;
        if !hello.requests.iter().any(|request| request == "grpc_addr") {
            return Ok(None);
        }
        let mut ctx = context::current();
        ctx.deadline = Instant::now() + timeout;
        client.grpc_addr(ctx).await.map_err(|e| e.to_string())
    }
}

/// The connections a stopping leader hands over on, dialled and introduced while its Raft
/// core still runs, so that the handover waits on no dial once the core is silent: to the
/// voter it hands over to, and to the other voters whose builds can be told to stand back.
pub struct Handover {
    to: NodeId,
    client: RaftRpcClient,
    bystanders: Vec<(NodeId, RaftRpcClient)>,
}

impl PeerNetwork {
    /// Dials the voter `to` of `membership` for a handover from the leader `from`, and the
    /// other voters to tell them to stand back, all within `timeout`; `Err` names why not
    /// (`to` is no member, or its build takes no handover: a v0.1.0 peer, or one before
    /// handovers). A bystander that cannot be reached, or whose build cannot be told, is left
    /// to its own timer.
    pub async fn prepare_handover(
        &self,
        from: NodeId,
        to: NodeId,
        membership: &openraft::Membership<NodeId, Member>,
        timeout: Duration,
    ) -> Result<Handover, String> {
        let member = (membership.get_node(&to)).ok_or(format!("replica {to} is not a member"))?;
        let bystanders = (membership.voter_ids())
            .filter(|voter| ![from, to].contains(voter))
            .filter_map(|voter| Some((voter, membership.get_node(&voter)?)));
        let dial = |id: NodeId, member: &Member, request: &'static str| {
            let mut peer = self.client_for(id, member);
            async move {
                let (client, hello) = peer
                    .connected(timeout)
                    .await
                    .map_err(CallError::into_message)?;
                if !hello.requests.iter().any(|offered| offered == request) {
                    return Err(format!("replica {id}'s build takes no {request}"));
                }
                Ok((id, client))
            }
        };
        let (target, bystanders) = futures::future::join(
            dial(to, member, "take_over"),
            futures::future::join_all(
                bystanders.map(|(id, member)| dial(id, member, "stand_back")),
            ),
        )
        .await;
        let (to, client) = target?;
        let bystanders = (bystanders.into_iter())
            .filter_map(|dialled| {
                dialled
                    .inspect_err(
                        |why| tracing::info!(%why, "a voter will not be told to stand back"),
                    )
                    .ok()
            })
            .collect();
        Ok(Handover {
            to,
            client,
            bystanders,
        })
    }
}

impl Handover {
    /// The replica handed over to.
    pub fn to(&self) -> NodeId {
        self.to
    }

    /// Tells the peer that `from`, whose core has been silent since `silent_since`, hands
    /// over to it, and the bystanders to stand back, within `timeout`. The answer is the
    /// peer's; a bystander's refusal is only logged.
    pub async fn send(
        self,
        from: NodeId,
        silent_since: Instant,
        timeout: Duration,
    ) -> Result<(), String> {
        let mut ctx = context::current();
        ctx.deadline = Instant::now() + timeout;
        let silent_for = silent_since.elapsed().as_millis() as u64;
        let to = self.to;
        let stand_back = (self.bystanders.iter()).map(|(id, client)| async move {
            match client.stand_back(ctx, from, to, silent_for).await {
                Ok(Ok(())) => {}
                Ok(Err(refused)) => tracing::info!(%refused, "replica {id} did not stand back"),
                Err(error) => tracing::info!(%error, "replica {id} was not told to stand back"),
            }
        });
        let (taken, _) = futures::future::join(
            self.client.take_over(ctx, from, silent_for),
            futures::future::join_all(stand_back),
        )
        .await;
        match taken {
            Ok(Ok(())) => Ok(()),
            Ok(Err(refused)) => Err(format!("replica {to} refused: {refused}")),
            Err(error) => Err(format!("replica {to}: {error}")),
        }
    }
}

impl super::node::MemberLevels for PeerNetwork {
    fn level_max<'a>(
        &'a self,
        id: NodeId,
        member: &'a Member,
        within: Duration,
    ) -> futures::future::BoxFuture<'a, Result<Level, String>> {
        Box::pin(self.vocabulary_level_max(id, member, within))
    }
}

impl PeerNetwork {
    fn client_for(&self, target: NodeId, node: &Member) -> PeerClient {
        PeerClient {
            target,
            addr: node.peer_addr.clone(),
            tls: self.tls.clone(),
            cluster: self.cluster.clone(),
            client: None,
            unanswered_since: None,
        }
    }
}

impl RaftNetworkFactory<TypeConfig> for PeerNetwork {
    type Network = PeerLayer<PeerClient>;

    async fn new_client(&mut self, target: NodeId, node: &Member) -> PeerLayer<PeerClient> {
        PeerLayer {
            target,
            transport: self.client_for(target, node),
            elections: self.elections.clone(),
            stages: self.stages.clone(),
            durable: self.durable.clone(),
        }
    }
}

/// What carries the peer protocol's Raft requests to one peer and brings its answers back:
/// the peer port's tarpc connection ([`PeerClient`]), or the simulation's network. Below
/// [`PeerLayer`], which holds every rule an outgoing request follows, so that both run them.
pub trait PeerTransport: Send + Sync + 'static {
    fn append_entries(
        &mut self,
        request: AppendEntriesRequest,
        option: &RPCOption,
    ) -> impl std::future::Future<Output = Result<AppendEntriesResponse, RpcError>> + Send;

    fn install_snapshot(
        &mut self,
        request: InstallSnapshotRequest,
        option: &RPCOption,
    ) -> impl std::future::Future<
        Output = Result<InstallSnapshotResponse, RpcError<InstallSnapshotError>>,
    > + Send;

    fn vote(
        &mut self,
        request: VoteRequest,
        option: &RPCOption,
    ) -> impl std::future::Future<Output = Result<VoteResponse, RpcError>> + Send;
}

/// openraft's network to one peer over a [`PeerTransport`], with the rules every outgoing
/// Raft request follows whatever carries it: a leader tells of no commit beyond its own
/// durable log (`hold_to_durable`), an AppendEntries message is cut to
/// [`APPEND_ENTRIES_BYTES_MAX`] and the part sent answered as `PartialSuccess`, the
/// `replicated` stage is timed, and the election timer hears how votes were answered.
pub struct PeerLayer<T> {
    pub target: NodeId,
    pub transport: T,
    /// The sender's election timer, told when a voter refuses it for a shorter log.
    pub elections: Option<Arc<ElectionTimer>>,
    /// Where the `replicated` stage is timed (see [`stages`](super::stages)).
    pub stages: Option<Arc<CommitStages>>,
    /// How far the sender's own log is on disk.
    pub durable: Option<watch::Receiver<Durable>>,
}

/// A tarpc connection to one peer's port, dialled lazily and re-dialled after it breaks.
pub struct PeerClient {
    target: NodeId,
    addr: String,
    tls: Option<Arc<rustls::ClientConfig>>,
    /// This replica's cluster, introduced on each new connection.
    cluster: Option<Arc<ClusterIdentity>>,
    /// The connection, and what its `hello` agreed.
    client: Option<(RaftRpcClient, Arc<Hello>)>,
    /// When the oldest call not answered on this connection was sent, if any is; calls that
    /// openraft abandoned at their TTL count, since their answers never came.
    unanswered_since: Option<Instant>,
}

/// Why a call did not produce the peer's answer.
enum CallError {
    /// Could not connect, or the connection broke: the peer may be down.
    Unreachable(String),
    /// Connected, but the call failed (deadline exceeded and the like).
    Network(String),
}

#[derive(Debug, thiserror::Error)]
#[error("{0}")]
struct Message(String);

impl CallError {
    fn into_message(self) -> String {
        match self {
            CallError::Unreachable(m) | CallError::Network(m) => m,
        }
    }

    fn into_rpc<E: std::error::Error>(self) -> openraft::error::RPCError<NodeId, Member, E> {
        match self {
            CallError::Unreachable(m) => {
                openraft::error::RPCError::Unreachable(Unreachable::new(&Message(m)))
            }
            CallError::Network(m) => {
                openraft::error::RPCError::Network(NetworkError::new(&Message(m)))
            }
        }
    }
}

impl PeerClient {
    /// The connection to the peer, dialled and introduced (`hello`) within `ttl` if there is
    /// none, with what its `hello` agreed.
    async fn connected(&mut self, ttl: Duration) -> Result<(RaftRpcClient, Arc<Hello>), CallError> {
        if self
            .unanswered_since
            .is_some_and(|since| since.elapsed() > SILENT_CONNECTION_MAX)
        {
            tracing::info!(peer = self.target, addr = %self.addr, "re-dialling a silent peer connection");
            self.client = None;
        }
        if let Some(client) = &self.client {
            return Ok(client.clone());
        }
        self.unanswered_since = None;
        let deadline = Instant::now() + ttl.min(CONNECT_TIMEOUT);
        let agreed = open_and_agree(
            &self.addr,
            || self.open(deadline),
            |client: RaftRpcClient| {
                let mut ctx = context::current();
                ctx.deadline = deadline;
                async move { client.hello(ctx, ProtocolOffer::ours()).await }
            },
        )
        .await;
        let connection = match agreed {
            Ok((client, hello)) => (client, Arc::new(hello)),
            Err(HandshakeError::Open(unreachable)) => return Err(unreachable),
            Err(HandshakeError::Refused(refused)) => {
                return Err(CallError::Network(format!(
                    "peer {} refused hello: {refused}",
                    self.target
                )))
            }
            Err(HandshakeError::Silent) => {
                return Err(CallError::Network(format!(
                    "peer {} did not answer hello",
                    self.target
                )))
            }
        };
        self.introduce(&connection, deadline).await?;
        self.client = Some(connection.clone());
        Ok(connection)
    }

    /// Introduces this replica's cluster on a new connection whose `hello` lists
    /// `introduce`, and refuses the connection if the peer's directory is of another cluster
    /// ([`ClusterIdentity`]). Such a peer is warned about once a minute, and treated as
    /// unreachable, so that openraft backs off: it does not heal without an operator.
    async fn introduce(
        &self,
        (client, hello): &(RaftRpcClient, Arc<Hello>),
        deadline: Instant,
    ) -> Result<(), CallError> {
        let Some(identity) = &self.cluster else {
            return Ok(());
        };
        if !hello.requests.iter().any(|request| request == "introduce") {
            return Ok(());
        }
        let mut ctx = context::current();
        ctx.deadline = deadline;
        let meeting = match client.introduce(ctx, identity.known()).await {
            Ok(Ok(theirs)) => identity.compare(theirs),
            Ok(Err(ApiError::OtherCluster { ours, theirs })) => Meeting::Other {
                ours: theirs,
                theirs: ours,
            },
            Ok(Err(refused)) => {
                return Err(CallError::Network(format!(
                    "peer {} refused introduce: {refused}",
                    self.target
                )))
            }
            Err(error) => {
                return Err(CallError::Network(format!(
                    "peer {} did not answer introduce: {error}",
                    self.target
                )))
            }
        };
        match meeting {
            Meeting::Same => Ok(()),
            Meeting::Other { ours, theirs } => {
                let why = format!(
                    "peer {} at {} belongs to cluster {theirs}, and this replica to cluster \
                     {ours}: not spoken to (a replica started on another cluster's directory, \
                     or pointed at another cluster's peers?)",
                    self.target, self.addr
                );
                if identity.warn_about(&self.addr) {
                    tracing::warn!(peer = self.target, addr = %self.addr, %ours, %theirs, "{why}; said again in a minute");
                }
                Err(CallError::Unreachable(why))
            }
        }
    }

    /// A new connection to the peer, dialled by `deadline`, expecting its certificate.
    async fn open(&self, deadline: Instant) -> Result<RaftRpcClient, CallError> {
        let expected = node_name(self.target);
        let stream = tokio::time::timeout_at(
            deadline.into(),
            dial_expecting(&self.addr, self.tls.as_ref(), Some(&expected)),
        )
        .await
        .map_err(|_| CallError::Unreachable(format!("connecting to {} timed out", self.addr)))?
        .map_err(|e| CallError::Unreachable(e.to_string()))?;
        let transport = framed(stream, PEER_FRAME_BYTES_MAX);
        Ok(RaftRpcClient::new(client::Config::default(), transport).spawn())
    }

    fn context(option: &RPCOption) -> context::Context {
        let mut ctx = context::current();
        ctx.deadline = Instant::now() + option.hard_ttl();
        ctx
    }

    fn failed(&mut self, error: tarpc::client::RpcError) -> CallError {
        use tarpc::client::RpcError;
        match error {
            RpcError::DeadlineExceeded => CallError::Network(format!("{} timed out", self.target)),
            other => {
                // The connection is unusable; dial again next time.
                self.client = None;
                CallError::Unreachable(format!("peer {}: {other}", self.target))
            }
        }
    }
}

impl PeerClient {
    /// One RPC: dial if needed, send with the TTL's deadline, and sort the failure into what
    /// openraft distinguishes (unreachable, network, the peer's own Raft error).
    async fn call<T, E, F, Fut>(
        &mut self,
        option: &RPCOption,
        send: F,
    ) -> Result<T, openraft::error::RPCError<NodeId, Member, RaftError<E>>>
    where
        E: std::error::Error,
        F: FnOnce(RaftRpcClient, context::Context) -> Fut,
        Fut: std::future::Future<Output = Result<Result<T, RaftError<E>>, tarpc::client::RpcError>>,
    {
        let (client, _) = self
            .connected(option.hard_ttl())
            .await
            .map_err(CallError::into_rpc)?;
        self.unanswered_since.get_or_insert_with(Instant::now);
        let answer = send(client, Self::context(option)).await;
        if !matches!(answer, Err(tarpc::client::RpcError::DeadlineExceeded)) {
            self.unanswered_since = None;
        }
        match answer {
            Ok(Ok(response)) => Ok(response),
            Ok(Err(remote)) => Err(openraft::error::RPCError::RemoteError(RemoteError::new(
                self.target,
                remote,
            ))),
            Err(e) => Err(self.failed(e).into_rpc()),
        }
    }
}

/// Keeps the longest prefix of `request`'s entries within `bytes_max` (at least one entry);
/// returns the log id of the last entry kept if any were cut.
fn cut_to_bytes(request: &mut AppendEntriesRequest, bytes_max: usize) -> Option<LogId> {
    let mut bytes = 0;
    let within = request
        .entries
        .iter()
        .take_while(|entry| {
            bytes += payload_bytes(entry);
            bytes <= bytes_max
        })
        .count();
    let keep = within.max(1);
    if keep >= request.entries.len() {
        return None;
    }
    request.entries.truncate(keep);
    Some(request.entries[keep - 1].log_id)
}

impl PeerTransport for PeerClient {
    async fn append_entries(
        &mut self,
        request: AppendEntriesRequest,
        option: &RPCOption,
    ) -> Result<AppendEntriesResponse, RpcError> {
        self.call(option, |client, ctx| async move {
            client.append_entries(ctx, request).await
        })
        .await
    }

    async fn install_snapshot(
        &mut self,
        request: InstallSnapshotRequest,
        option: &RPCOption,
    ) -> Result<InstallSnapshotResponse, RpcError<InstallSnapshotError>> {
        self.call(option, |client, ctx| async move {
            client.install_snapshot(ctx, request).await
        })
        .await
    }

    async fn vote(
        &mut self,
        request: VoteRequest,
        option: &RPCOption,
    ) -> Result<VoteResponse, RpcError> {
        self.call(option, |client, ctx| async move {
            client.vote(ctx, request).await
        })
        .await
    }
}

impl<T: PeerTransport> RaftNetwork<TypeConfig> for PeerLayer<T> {
    fn backoff(&self) -> openraft::network::Backoff {
        unreachable_backoff()
    }

    async fn append_entries(
        &mut self,
        mut request: AppendEntriesRequest,
        option: RPCOption,
    ) -> Result<AppendEntriesResponse, RpcError> {
        if let Some(durable) = &mut self.durable {
            hold_to_durable(&mut request, durable, option.soft_ttl() / 2).await;
        }
        let cut_after = cut_to_bytes(&mut request, APPEND_ENTRIES_BYTES_MAX);
        let (sent, carries_entries) = (Instant::now(), !request.entries.is_empty());
        let answer = self.transport.append_entries(request, &option).await?;
        if let (Some(stages), true) = (&self.stages, carries_entries) {
            stages.observe(Stage::replicated, sent.elapsed());
        }
        Ok(match (answer, cut_after) {
            (AppendEntriesResponse::Success, Some(last_sent)) => {
                AppendEntriesResponse::PartialSuccess(Some(last_sent))
            }
            (answer, _) => answer,
        })
    }

    async fn install_snapshot(
        &mut self,
        request: InstallSnapshotRequest,
        option: RPCOption,
    ) -> Result<InstallSnapshotResponse, RpcError<InstallSnapshotError>> {
        self.transport.install_snapshot(request, &option).await
    }

    async fn vote(
        &mut self,
        request: VoteRequest,
        option: RPCOption,
    ) -> Result<VoteResponse, RpcError> {
        let sent = request.clone();
        let answer = self.transport.vote(request, &option).await;
        match &answer {
            Ok(answer) => tracing::info!(
                voter = self.target,
                candidate = %sent.vote,
                granted = answer.vote_granted,
                their_vote = %answer.vote,
                their_last = ?answer.last_log_id.map(|id| id.index),
                "a voter answered"
            ),
            Err(error) => {
                tracing::info!(voter = self.target, candidate = %sent.vote, %error, "a vote request failed")
            }
        }
        if let (Some(elections), Ok(answer)) = (&self.elections, &answer) {
            elections.received_vote(self.target, &sent, answer);
        }
        answer
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;
    use crate::log::{Batch, Command, Proposal, Target};
    use openraft::EntryPayload;

    /// Goal: a founding member takes as its first membership only the founding one, and
    /// only where it first appears: a membership with another voter, a learner more, or a
    /// voter fewer is refused; entries without a membership, and a joining replica (which
    /// catches up through the founders' membership, not naming it), pass.
    #[test]
    fn a_founding_member_takes_only_the_founding_membership_first() {
        let membership = |voters: &[NodeId], learners: &[NodeId]| Entry {
            log_id: LogId::new(openraft::CommittedLeaderId::new(0, 0), 0),
            payload: EntryPayload::Membership(openraft::Membership::new(
                vec![voters.iter().copied().collect()],
                (voters.iter().chain(learners))
                    .map(|id| (*id, Member::default()))
                    .collect::<std::collections::BTreeMap<_, _>>(),
            )),
        };
        let founding = FirstContact {
            founders: [1, 2, 3].into(),
            joining_from: BTreeSet::new(),
        };
        let commands = request_of(&[10, 10]).entries;
        assert!(founding.check_first_membership(&commands).is_ok());
        let founded = [membership(&[1, 2, 3], &[]), membership(&[1, 2, 4], &[])];
        assert!(
            founding.check_first_membership(&founded).is_ok(),
            "only the first counts"
        );
        for other in [
            membership(&[2, 3, 4], &[]),
            membership(&[1, 2, 3], &[4]),
            membership(&[1, 2], &[]),
        ] {
            let entries = [commands[0].clone(), other];
            let refused = founding.check_first_membership(&entries).unwrap_err();
            assert!(refused.contains("founding members"), "{refused}");
        }
        let joining = FirstContact {
            founders: BTreeSet::new(),
            joining_from: [1, 2, 3].into(),
        };
        assert!(joining
            .check_first_membership(&[membership(&[1, 2, 3], &[])])
            .is_ok());
        assert!(joining.trusts(2) && !joining.trusts(4) && founding.trusts(3));
    }

    /// An AppendEntries request of entries 1.. carrying commands of these sizes.
    fn request_of(sizes: &[usize]) -> AppendEntriesRequest {
        let entries = sizes
            .iter()
            .zip(1..)
            .map(|(&size, index)| Entry {
                log_id: LogId::new(openraft::CommittedLeaderId::new(1, 1), index),
                payload: EntryPayload::Normal(std::sync::Arc::new(Batch {
                    appended_at_ms: 0,
                    proposals: vec![Proposal {
                        producer: None,
                        target: Target::All,
                        frame: Command::custom(1, 1, vec![0; size]).into_frame(),
                    }],
                })),
            })
            .collect();
        AppendEntriesRequest {
            vote: Vote::new_committed(1, 1),
            prev_log_id: None,
            leader_commit: None,
            entries,
        }
    }

    /// A message keeps the entries that fit the byte bound, and always its first entry, and
    /// says where it was cut; one that fits is sent whole.
    #[test]
    fn append_entries_are_cut_to_the_byte_bound() {
        const KIB: usize = 1 << 10;
        // (what, command sizes, entries kept, cut)
        let cases: [(&str, Vec<usize>, usize, bool); 4] = [
            ("all fit", vec![100 * KIB; 3], 3, false),
            (
                "cut after what fits",
                vec![400 * KIB, 400 * KIB, 400 * KIB, 2048 * KIB],
                2,
                true,
            ),
            (
                "a large first entry goes alone",
                vec![2048 * KIB, 1],
                1,
                true,
            ),
            (
                "one large entry alone is not cut",
                vec![4096 * KIB],
                1,
                false,
            ),
        ];
        for (what, sizes, kept, cut) in cases {
            let mut request = request_of(&sizes);
            let last = cut_to_bytes(&mut request, 1 << 20);
            assert_eq!(request.entries.len(), kept, "{what}");
            assert_eq!(
                last.map(|id| id.index),
                cut.then_some(kept as u64),
                "{what}"
            );
        }
    }

    /// A test peer: it answers the connection's `hello`, never a vote or a snapshot, and an
    /// AppendEntries only when it keeps their `leader_commit`s (otherwise it stays silent).
    #[derive(Clone, Default)]
    struct TestPeer {
        leader_commits: Option<Arc<std::sync::Mutex<Vec<Option<LogId>>>>>,
    }

    impl RaftRpc for TestPeer {
        async fn append_entries(
            self,
            _: context::Context,
            request: AppendEntriesRequest,
        ) -> Result<AppendEntriesResponse, RaftError> {
            let Some(leader_commits) = self.leader_commits else {
                return std::future::pending().await;
            };
            leader_commits.lock().unwrap().push(request.leader_commit);
            Ok(AppendEntriesResponse::Success)
        }

        async fn vote(
            self,
            _: context::Context,
            _: VoteRequest,
        ) -> Result<VoteResponse, RaftError> {
            std::future::pending().await
        }

        async fn install_snapshot(
            self,
            _: context::Context,
            _: InstallSnapshotRequest,
        ) -> Result<InstallSnapshotResponse, RaftError<InstallSnapshotError>> {
            std::future::pending().await
        }

        async fn hello(self, _: context::Context, offer: ProtocolOffer) -> Result<Hello, ApiError> {
            Hello::answering(&offer, &[])
        }

        async fn introduce(
            self,
            _: context::Context,
            cluster: Option<ClusterId>,
        ) -> Result<Option<ClusterId>, ApiError> {
            Ok(cluster)
        }

        async fn take_over(self, _: context::Context, _: NodeId, _: u64) -> Result<(), ApiError> {
            Ok(())
        }

        async fn stand_back(
            self,
            _: context::Context,
            _: NodeId,
            _: NodeId,
            _: u64,
        ) -> Result<(), ApiError> {
            Ok(())
        }

        async fn grpc_addr(self, _: context::Context) -> Option<String> {
            None
        }
    }

    /// Serves `peer` on a port of 127.0.0.1, counting the connections it accepts; returns
    /// the peer's address as a member.
    async fn serve(peer: TestPeer, accepted: Arc<AtomicUsize>) -> Member {
        use futures::StreamExt;
        use tarpc::server::{BaseChannel, Channel};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                accepted.fetch_add(1, Ordering::SeqCst);
                let serving = BaseChannel::with_defaults(framed(stream, PEER_FRAME_BYTES_MAX))
                    .execute(peer.clone().serve())
                    .for_each_concurrent(None, |answer| answer);
                tokio::spawn(serving);
            }
        });
        Member {
            peer_addr: addr.clone(),
            client_addr: addr,
        }
    }

    /// Goal: a peer connection that stops answering (as one does whose packets a partition
    /// swallowed, until TCP's retransmission backoff resends them) is replaced by a fresh
    /// connection, instead of holding every later call. Steps: a "peer" that answers the
    /// connection's `hello` and nothing after; votes with a short TTL, until a second
    /// connection arrives. Before the fix the first connection was kept for good.
    #[tokio::test]
    async fn a_silent_connection_is_dialled_afresh() {
        let accepted = Arc::new(AtomicUsize::new(0));
        let member = serve(TestPeer::default(), accepted.clone()).await;
        let mut peer = PeerNetwork::default().new_client(2, &member).await;
        let started = Instant::now();
        while accepted.load(Ordering::SeqCst) < 2 {
            assert!(
                started.elapsed() < SILENT_CONNECTION_MAX * 5,
                "still on the silent connection"
            );
            let request = VoteRequest::new(openraft::Vote::new(1, 1), None);
            let answer = peer
                .vote(request, RPCOption::new(Duration::from_millis(50)))
                .await;
            assert!(answer.is_err(), "nothing answers");
        }
        assert!(started.elapsed() >= SILENT_CONNECTION_MAX);
    }

    /// Goal: a leader tells its followers of no commit beyond what its own log holds on disk
    /// (see `log_store`, "The leader's own appends"), over a real connection. Steps: the
    /// durable mark at entry 3; an AppendEntries committing up to 5 leaves committing up to
    /// 3; the mark raised to 7, the same request leaves committing up to 5.
    #[tokio::test]
    async fn leader_commit_is_held_to_the_durable_mark() {
        let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
        let recording = TestPeer {
            leader_commits: Some(seen.clone()),
        };
        let member = serve(recording, Arc::default()).await;
        let id = |index| Some(LogId::new(openraft::CommittedLeaderId::new(1, 1), index));
        let (mark, durable) = watch::channel(Durable {
            synced: id(3),
            ..Durable::default()
        });
        let network = PeerNetwork {
            durable: Some(durable),
            ..PeerNetwork::default()
        };
        let mut client = network.clone().new_client(2, &member).await;
        let committing_up_to_5 = || {
            let mut request = request_of(&[10; 5]);
            request.leader_commit = id(5);
            request
        };
        let option = || RPCOption::new(Duration::from_secs(5));
        client
            .append_entries(committing_up_to_5(), option())
            .await
            .unwrap();
        mark.send_replace(Durable {
            synced: id(7),
            ..Durable::default()
        });
        client
            .append_entries(committing_up_to_5(), option())
            .await
            .unwrap();
        assert_eq!(*seen.lock().unwrap(), vec![id(3), id(5)]);
    }
}
