//! [`ControlClient`]: finds the leader, follows `NotLeader`, retries with bounded backoff.

use std::collections::BTreeMap;
use std::hash::{BuildHasher, Hasher};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use tarpc::{client, context};
use tokio::sync::{mpsc, oneshot, Mutex, Semaphore};

use super::protocol::*;
use super::sequences::Sequences;
use super::tls::{dial, framed};
use crate::log::{
    Command, ContainerId, Epoch, Offset, ProducerId, ProducerSeq, Proposal, Target, TaskId,
};
use crate::NodeId;

/// How long one call keeps retrying (failover, reconnects) before giving up. An election on
/// the default timeouts takes about a second; this leaves room for several.
pub const RETRY_DEADLINE: Duration = Duration::from_secs(30);
/// The per-request deadline sent with each call (a long poll adds its wait to it).
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);
/// The default subscription linger: small against the delivery lag a control plane tolerates,
/// large enough that a subscriber following a busy head gets several commands per answer.
pub const SUBSCRIPTION_LINGER: Duration = Duration::from_millis(5);
const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
const BACKOFF_MIN: Duration = Duration::from_millis(20);
/// Short enough that a client notices a new leader within a few hundred milliseconds of its
/// election; retries are cheap, one small request each.
const BACKOFF_MAX: Duration = Duration::from_millis(250);
/// Frames this client accepts: a fetch response of many entries.
pub const CLIENT_FRAME_BYTES_MAX: usize = 64 << 20;

/// Batches of appends a connection has in flight at once. While they are out, the appends
/// that arrive queue and go together in the next (see [`Connector::append`]).
const APPEND_BATCHES_IN_FLIGHT_MAX: usize = 2;
/// Appends queued for a connection before their producers wait (back-pressure).
const APPEND_QUEUE_DEPTH: usize = 16 * 1024;

/// Why a client call failed after its retries.
#[derive(Clone, Debug, thiserror::Error)]
pub enum ClientError {
    /// The cluster answered with an error retrying cannot fix.
    #[error(transparent)]
    Api(#[from] ApiError),
    /// No replica could serve the call before the deadline. For an append the outcome is
    /// unknown: it may still commit. Appending the same command again through the same client
    /// is a new append; use [`ControlClient::append_proposal`] with the same pair to retry it.
    #[error("gave up after {elapsed:?}: {last}")]
    GaveUp { elapsed: Duration, last: String },
    /// A replica answered something that breaks the protocol's guarantees (for example a gap
    /// in an unfiltered fetch). The client refuses to pass it on rather than skip silently.
    #[error("protocol violation by {replica}: {detail}")]
    Protocol { replica: String, detail: String },
}

/// How a client retries. The defaults suit a container: ride out several elections, and
/// notice a dead connection within seconds. Its `Debug` never shows the token.
#[derive(Clone)]
pub struct ClientOptions {
    /// How long one call keeps retrying (failover, reconnects) before it gives up.
    pub retry_deadline: Duration,
    /// How long one attempt may take before it counts as failed and is retried elsewhere (a
    /// long poll adds its wait to this).
    pub request_timeout: Duration,
    /// How long a subscription's long poll, once woken by a new command, waits for the
    /// commands that follow it before answering (`FetchRequest::linger_ms`).
    pub subscription_linger: Duration,
    /// Speak TLS to the replicas with this configuration ([`tls::client_config`]): the CA
    /// that signed their certificates and, where the cluster asks for it, this client's own.
    /// Plain TCP when `None`.
    pub tls: Option<Arc<rustls::ClientConfig>>,
    /// A bearer token presented on every connection (`authenticate`), where the cluster
    /// requires credentials and this client has no certificate it knows.
    pub token: Option<String>,
}

impl std::fmt::Debug for ClientOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClientOptions")
            .field("retry_deadline", &self.retry_deadline)
            .field("request_timeout", &self.request_timeout)
            .field("subscription_linger", &self.subscription_linger)
            .field("tls", &self.tls.is_some())
            .field("token", &self.token.as_ref().map(|_| "<redacted>"))
            .finish()
    }
}

impl Default for ClientOptions {
    fn default() -> Self {
        ClientOptions {
            retry_deadline: RETRY_DEADLINE,
            request_timeout: REQUEST_TIMEOUT,
            subscription_linger: SUBSCRIPTION_LINGER,
            tls: None,
            token: None,
        }
    }
}

/// Settings shared by a client and the subscriptions it opens.
#[derive(Clone, Debug)]
pub(crate) struct Settings {
    pub seeds: Arc<Vec<String>>,
    pub options: ClientOptions,
}

/// One connection to one replica at a time, replaced on failure: the retry engine behind
/// every call. A [`Subscription`] owns its own, so that its long polls never queue behind
/// (or count against the in-flight limit of) the client's appends.
pub(crate) struct Connector {
    settings: Settings,
    current: Mutex<Option<(String, ControlLogClient)>>,
    /// Index into the seeds of the next replica to try; starts at a random one so that many
    /// clients spread over the replicas.
    next_seed: std::sync::atomic::AtomicUsize,
    /// Where appends queue for [`send_appends`], started by the first append (and again if
    /// it is gone: the runtime it ran on was shut down while this client lives on).
    appends: std::sync::Mutex<Option<mpsc::Sender<QueuedAppend>>>,
    /// Set once a second producer shares this connection ([`ControlClient::new_producer`]):
    /// from then on appends go out in batches. A connection of its own gains little from
    /// batching and would pay the batch task's extra hand-off on every append.
    shared_by_producers: std::sync::atomic::AtomicBool,
}

/// An append waiting for its batch, and where its answer goes.
struct QueuedAppend {
    proposal: Proposal,
    answer: oneshot::Sender<Result<AppendAck, ClientError>>,
}

/// What to do after a failed attempt.
enum Next {
    /// Try this address next (a `NotLeader` hint).
    Redirect(String),
    /// Back off, then retry on the same connection (the replica is busy, not wrong).
    Wait(String),
    /// Back off, then try the next seed.
    Reconnect(String),
}

/// A random number without a dependency: std's hasher is randomly keyed per process, and the
/// clock makes successive draws differ.
pub(crate) fn random_u64() -> u64 {
    let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
    hasher.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos()),
    );
    hasher.finish()
}

impl Connector {
    pub(crate) fn new(settings: Settings) -> Connector {
        let start = (random_u64() as usize) % settings.seeds.len().max(1);
        Connector {
            settings,
            current: Mutex::new(None),
            next_seed: start.into(),
            appends: std::sync::Mutex::new(None),
            shared_by_producers: false.into(),
        }
    }

    pub(crate) fn settings(&self) -> &Settings {
        &self.settings
    }

    async fn dial(addr: &str, options: &ClientOptions) -> Result<ControlLogClient, String> {
        let client = Self::dial_transport(addr, options.tls.as_ref()).await?;
        if let Some(token) = &options.token {
            let mut ctx = context::current();
            ctx.deadline = std::time::Instant::now() + CONNECT_TIMEOUT;
            client
                .authenticate(ctx, token.clone())
                .await
                .map_err(|e| format!("authenticating to {addr}: {e}"))?
                .map_err(|e| format!("authenticating to {addr}: {e}"))?;
        }
        Ok(client)
    }

    async fn dial_transport(
        addr: &str,
        tls: Option<&Arc<rustls::ClientConfig>>,
    ) -> Result<ControlLogClient, String> {
        let stream = tokio::time::timeout(CONNECT_TIMEOUT, dial(addr, tls))
            .await
            .map_err(|_| format!("connecting to {addr} timed out"))??;
        let transport = framed(stream, CLIENT_FRAME_BYTES_MAX);
        Ok(ControlLogClient::new(client::Config::default(), transport).spawn())
    }

    fn next_seed(&self) -> String {
        let seeds = &self.settings.seeds;
        let i = self
            .next_seed
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        seeds[i % seeds.len()].clone()
    }

    /// Runs `call` against the leader (or any replica when `leader_only` is false), following
    /// redirects and retrying transient failures until the retry deadline. `call` gets the
    /// address of the replica it talks to, for its own checks.
    pub(crate) async fn call<T, F, Fut>(&self, leader_only: bool, call: F) -> Result<T, ClientError>
    where
        F: Fn(ControlLogClient, context::Context, String) -> Fut,
        Fut: std::future::Future<Output = Result<Result<T, ApiError>, tarpc::client::RpcError>>,
    {
        let started = Instant::now();
        let mut backoff = BACKOFF_MIN;
        let mut target: Option<String> = None;
        loop {
            let (addr, rpc) = {
                let mut current = self.current.lock().await;
                let wanted = target.take();
                match (&*current, wanted) {
                    (Some((addr, rpc)), None) => (addr.clone(), rpc.clone()),
                    (Some((addr, rpc)), Some(w)) if *addr == w => (addr.clone(), rpc.clone()),
                    (_, wanted) => {
                        let addr = wanted.unwrap_or_else(|| self.next_seed());
                        match Self::dial(&addr, &self.settings.options).await {
                            Ok(rpc) => {
                                *current = Some((addr.clone(), rpc.clone()));
                                (addr, rpc)
                            }
                            Err(e) => {
                                *current = None;
                                drop(current);
                                self.pause(started, &mut backoff, e).await?;
                                continue;
                            }
                        }
                    }
                }
            };
            let mut ctx = context::current();
            ctx.deadline = Instant::now() + self.settings.options.request_timeout;
            let next = match call(rpc, ctx, addr.clone()).await {
                Ok(Ok(value)) => return Ok(value),
                Ok(Err(ApiError::NotLeader {
                    leader_client_addr: Some(leader),
                    ..
                })) if leader_only && leader != addr => Next::Redirect(leader),
                Ok(Err(ApiError::NotLeader { .. })) if leader_only => {
                    Next::Reconnect(format!("{addr} knows no leader yet"))
                }
                Ok(Err(error @ ApiError::Overloaded { .. })) => Next::Wait(error.to_string()),
                Ok(Err(error)) if error.is_retriable() => {
                    Next::Reconnect(format!("{addr}: {error}"))
                }
                Ok(Err(error)) => return Err(error.into()),
                Err(e) => Next::Reconnect(format!("{addr}: {e}")),
            };
            match next {
                Next::Redirect(leader) => target = Some(leader),
                Next::Wait(reason) => self.pause(started, &mut backoff, reason).await?,
                Next::Reconnect(reason) => {
                    *self.current.lock().await = None;
                    self.pause(started, &mut backoff, reason).await?;
                }
            }
        }
    }

    /// Appends an idempotent proposal (it must carry a producer pair: a batch is retried
    /// whole). Appends that arrive while [`APPEND_BATCHES_IN_FLIGHT_MAX`] batches are out go
    /// together in the next one, so many producers sharing a connection cost the replica one
    /// request per batch rather than one per append; a lone append goes at once, by itself.
    pub(crate) async fn append(
        self: &Arc<Self>,
        proposal: Proposal,
    ) -> Result<AppendAck, ClientError> {
        debug_assert!(
            proposal.producer.is_some(),
            "only idempotent appends are batched"
        );
        let queue = {
            let mut appends = self.appends.lock().expect("never poisoned");
            match &*appends {
                Some(queue) if !queue.is_closed() => queue.clone(),
                _ => {
                    let (queue, queued) = mpsc::channel(APPEND_QUEUE_DEPTH);
                    tokio::spawn(send_appends(Arc::downgrade(self), queued));
                    appends.insert(queue).clone()
                }
            }
        };
        let (answer, answered) = oneshot::channel();
        queue
            .send(QueuedAppend { proposal, answer })
            .await
            .map_err(|_| ApiError::ShuttingDown)?;
        answered.await.unwrap_or(Err(ApiError::ShuttingDown.into()))
    }

    /// Appends one proposal by itself (`append`), following the leader and retrying.
    async fn append_alone(&self, proposal: Proposal) -> Result<AppendAck, ClientError> {
        self.call(true, |rpc, ctx, _| {
            let proposal = proposal.clone();
            async move { rpc.append(ctx, proposal).await }
        })
        .await
    }

    /// Sends one batch of appends and answers each.
    async fn append_batch(&self, mut batch: Vec<QueuedAppend>) {
        if batch.len() == 1 {
            let QueuedAppend { proposal, answer } = batch.pop().expect("one append");
            let _ = answer.send(self.append_alone(proposal).await);
            return;
        }
        let proposals: Vec<Proposal> = batch.iter().map(|q| q.proposal.clone()).collect();
        let answers = self
            .call(true, |rpc, ctx, _| {
                let proposals = proposals.clone();
                async move {
                    let answers = rpc.append_many(ctx, proposals).await?;
                    // An append the replica could not decide (it lost the leadership, say)
                    // sends the whole batch round again: every append in it is idempotent, so
                    // those already decided answer as before.
                    Ok(answers.and_then(|answers| {
                        match answers
                            .iter()
                            .find_map(|a| a.as_ref().err().filter(|e| e.is_retriable()))
                        {
                            Some(retriable) => Err(retriable.clone()),
                            None => Ok(answers),
                        }
                    }))
                }
            })
            .await
            .and_then(|answers| {
                if answers.len() == batch.len() {
                    Ok(answers)
                } else {
                    Err(ClientError::Protocol {
                        replica: "the leader".into(),
                        detail: format!("{} answers to {} appends", answers.len(), batch.len()),
                    })
                }
            });
        match answers {
            Ok(answers) => {
                for (queued, answer) in batch.into_iter().zip(answers) {
                    let _ = queued.answer.send(answer.map_err(ClientError::from));
                }
            }
            Err(error) => {
                for queued in batch {
                    let _ = queued.answer.send(Err(error.clone()));
                }
            }
        }
    }

    async fn pause(
        &self,
        started: Instant,
        backoff: &mut Duration,
        last: String,
    ) -> Result<(), ClientError> {
        if started.elapsed() + *backoff > self.settings.options.retry_deadline {
            return Err(ClientError::GaveUp {
                elapsed: started.elapsed(),
                last,
            });
        }
        tracing::debug!(backoff_ms = backoff.as_millis() as u64, reason = %last, "retrying");
        tokio::time::sleep(*backoff).await;
        *backoff = (*backoff * 2).min(BACKOFF_MAX);
        Ok(())
    }
}

/// The task behind [`Connector::append`]: takes what has queued (up to the
/// [`APPEND_MANY_PROPOSALS_MAX`] and [`APPEND_MANY_BYTES_MAX`] of one request) whenever a batch
/// slot is free, and sends it. It ends when its connector is dropped (the queue closes).
async fn send_appends(connector: Weak<Connector>, mut queued: mpsc::Receiver<QueuedAppend>) {
    let slots = Arc::new(Semaphore::new(APPEND_BATCHES_IN_FLIGHT_MAX));
    // An append that did not fit the previous batch starts the next.
    let mut carried: Option<QueuedAppend> = None;
    loop {
        let first = match carried.take() {
            Some(first) => first,
            None => match queued.recv().await {
                Some(first) => first,
                None => return,
            },
        };
        let Ok(slot) = slots.clone().acquire_owned().await else {
            return;
        };
        // Let the producers woken with this one queue theirs too.
        tokio::task::yield_now().await;
        let mut bytes = first.proposal.encoded_len();
        let mut batch = vec![first];
        while batch.len() < APPEND_MANY_PROPOSALS_MAX {
            let Ok(next) = queued.try_recv() else { break };
            bytes += next.proposal.encoded_len();
            if bytes > APPEND_MANY_BYTES_MAX {
                carried = Some(next);
                break;
            }
            batch.push(next);
        }
        let Some(connector) = connector.upgrade() else {
            return;
        };
        tokio::spawn(async move {
            connector.append_batch(batch).await;
            drop(slot);
        });
    }
}

/// A connection to a ctrlog cluster: appends, reads, subscriptions and administration.
/// Share it behind an `Arc`; concurrent calls are multiplexed over one connection.
///
/// ```no_run
/// # async fn example() -> Result<(), ctrlog::client::ClientError> {
/// use ctrlog::client::{ControlClient, SubscriptionItem};
/// use ctrlog::log::{Command, ContainerId, Filter, Target};
/// use futures::StreamExt;
///
/// let me = ContainerId::new("container-1").expect("a valid id");
/// let client = ControlClient::connect(&["127.0.0.1:7101".to_string()]).await?;
/// let mut commands = client.subscribe(1, Filter::Container(me));
/// while let Some(item) = commands.next().await {
///     match item? {
///         SubscriptionItem::Entry(entry) => {
///             // Obey the command, then answer through the same log.
///             let ack = Command::custom(2, 1, entry.offset.to_be_bytes().to_vec());
///             client.append_to(Target::Coordinator, ack).await?;
///         }
///         SubscriptionItem::Reset { state, offset } => {
///             // Too far behind: the log was compacted. Rebuild from the state as of `offset`.
///             let _ = (state, offset);
///         }
///     }
/// }
/// # Ok(()) }
/// ```
pub struct ControlClient {
    /// Shared by the producers made with [`ControlClient::new_producer`].
    pub(super) connector: Arc<Connector>,
    producer: ProducerId,
    sequences: Sequences,
    /// The highest offset this client's appends were acknowledged at; its subscriptions'
    /// resets read at least this far (read your writes).
    pub(super) own_writes: Arc<AtomicU64>,
}

impl ControlClient {
    /// Connects to the cluster through any of `seeds` (client addresses), with the default
    /// [`ClientOptions`].
    pub async fn connect(seeds: &[String]) -> Result<ControlClient, ClientError> {
        ControlClient::connect_with(seeds, ClientOptions::default()).await
    }

    /// Connects with other options, which then apply to every call of this client and of its
    /// subscriptions.
    pub async fn connect_with(
        seeds: &[String],
        options: ClientOptions,
    ) -> Result<ControlClient, ClientError> {
        if seeds.is_empty() {
            return Err(ClientError::Api(ApiError::Invalid(
                "no cluster addresses given".into(),
            )));
        }
        let client = ControlClient {
            connector: Arc::new(Connector::new(Settings {
                seeds: Arc::new(seeds.to_vec()),
                options,
            })),
            producer: random_u64(),
            sequences: Sequences::new(),
            own_writes: Arc::default(),
        };
        client.status().await?;
        Ok(client)
    }

    /// This client's producer id, which makes its appends idempotent.
    pub fn producer_id(&self) -> ProducerId {
        self.producer
    }

    /// Another producer on this client's connection: its own producer id and sequence window,
    /// the same connection and retry engine. A process with many independent writers (one per
    /// task, say) then holds one connection instead of one per writer. Once a connection is
    /// shared, the appends that queue on it while earlier ones are in flight go out together
    /// in one request (`append_many`), which is most of what a small append costs.
    pub fn new_producer(&self) -> ControlClient {
        self.connector
            .shared_by_producers
            .store(true, Ordering::Relaxed);
        ControlClient {
            connector: self.connector.clone(),
            producer: random_u64(),
            sequences: Sequences::new(),
            own_writes: Arc::default(),
        }
    }

    /// Appends a command idempotently: a retry after a lost answer or a failover returns the
    /// original offset instead of appending twice. Built-in commands go to their own target
    /// ([`Command::target`]); user commands are broadcast (address one with
    /// [`ControlClient::append_to`]). Concurrent appends are pipelined (up to the producer
    /// window, `jobs::PRODUCER_WINDOW`, unanswered at once) and commit in any order.
    ///
    /// Exactly once holds within these limits (RELIABILITY.md, "Guarantees"): the client's
    /// retries reuse the append's `(producer, seq)` until its deadline; after `GaveUp` the
    /// append's fate is unknown, and only [`ControlClient::append_proposal`] with the same pair
    /// retries it safely; and the replicas remember the latest 65,536 producers. From
    /// vocabulary level 3, an append of a producer they forgot (65,536 others appended since
    /// its last) is answered [`ApiError::ProducerForgotten`] rather than appended again, at
    /// once and without retrying; whether its earlier attempt committed is then unknown, and
    /// later appends need a new producer ([`ControlClient::new_producer`]). Below level 3 such
    /// a retry is taken for a new append.
    pub async fn append(&self, command: Command) -> Result<AppendAck, ClientError> {
        let target = command.target().unwrap_or(Target::All);
        self.append_to(target, command).await
    }

    /// Appends a command idempotently to a chosen target.
    pub async fn append_to(
        &self,
        target: Target,
        command: Command,
    ) -> Result<AppendAck, ClientError> {
        let lease = self.sequences.issue().await;
        let result = self
            .append_proposal(Proposal {
                producer: Some(ProducerSeq {
                    producer: self.producer,
                    seq: lease.seq(),
                }),
                target,
                frame: command.into_frame(),
            })
            .await;
        drop(lease);
        result
    }

    /// Appends a proposal exactly as given, with the caller's own `(producer, seq)` if any.
    /// Retries are idempotent only if the proposal carries a producer pair.
    pub async fn append_proposal(&self, proposal: Proposal) -> Result<AppendAck, ClientError> {
        let batched = proposal.producer.is_some()
            && self.connector.shared_by_producers.load(Ordering::Relaxed);
        let ack = if batched {
            self.connector.append(proposal).await?
        } else {
            self.connector.append_alone(proposal).await?
        };
        self.own_writes.fetch_max(ack.offset, Ordering::AcqRel);
        Ok(ack)
    }

    /// One fetch from any replica (without waiting unless `request.max_wait_ms` says so).
    /// Most readers want [`ControlClient::subscribe`].
    pub async fn fetch(&self, request: FetchRequest) -> Result<FetchResponse, ClientError> {
        self.connector
            .call(false, |rpc, mut ctx, _| {
                let request = request.clone();
                ctx.deadline += Duration::from_millis(request.max_wait_ms.into());
                async move { rpc.fetch(ctx, request).await }
            })
            .await
    }

    /// The JobState as of an offset of at least `min_offset`, from any replica.
    pub async fn state(&self, min_offset: Offset) -> Result<StateAt, ClientError> {
        state_at(&self.connector, min_offset).await
    }

    /// The status of whichever replica answers.
    pub async fn status(&self) -> Result<Status, ClientError> {
        self.connector
            .call(false, |rpc, ctx, _| async move { rpc.status(ctx).await })
            .await
    }

    /// Tells the leader a container session is alive, with its lag per task. Most containers
    /// use [`ContainerSession`](super::ContainerSession), which does this in the background.
    pub async fn heartbeat(
        &self,
        container: &ContainerId,
        epoch: Epoch,
        lag: &BTreeMap<TaskId, u64>,
    ) -> Result<HeartbeatAck, ClientError> {
        self.connector
            .call(true, |rpc, ctx, _| {
                let (container, lag) = (container.clone(), lag.clone());
                async move { rpc.heartbeat(ctx, container, epoch, lag).await }
            })
            .await
    }

    /// The leader's status (follows redirects until a leader answers).
    pub async fn leader_status(&self) -> Result<Status, ClientError> {
        self.connector
            .call(true, |rpc, ctx, _| async move {
                rpc.status(ctx).await.map(|answer| {
                    answer.and_then(|status| {
                        if status.leader_id == Some(status.id) {
                            Ok(status)
                        } else {
                            Err(ApiError::NotLeader {
                                leader_id: status.leader_id,
                                leader_client_addr: status.leader_client_addr().map(str::to_string),
                            })
                        }
                    })
                })
            })
            .await
    }

    /// Adds a replica (learner first, voter once caught up).
    pub async fn add_member(&self, id: NodeId, member: Member) -> Result<(), ClientError> {
        self.connector
            .call(true, |rpc, mut ctx, _| {
                let member = member.clone();
                // Catching up can take a while; the server bounds it itself.
                ctx.deadline = Instant::now() + Duration::from_secs(90);
                async move { rpc.add_member(ctx, id, member).await }
            })
            .await
    }

    /// Removes a replica.
    pub async fn remove_member(&self, id: NodeId) -> Result<(), ClientError> {
        self.connector
            .call(true, |rpc, ctx, _| async move {
                rpc.remove_member(ctx, id).await
            })
            .await
    }

    /// Takes a snapshot on the leader now; returns the last offset it covers.
    pub async fn snapshot(&self) -> Result<Offset, ClientError> {
        self.connector
            .call(true, |rpc, mut ctx, _| async move {
                ctx.deadline = Instant::now() + Duration::from_secs(40);
                rpc.snapshot(ctx).await
            })
            .await
    }
}

/// How long a `state` call waits for a lagging replica to reach the wanted offset before the
/// client tries another.
const STATE_WAIT: Duration = Duration::from_secs(5);

pub(crate) async fn state_at(
    connector: &Connector,
    min_offset: Offset,
) -> Result<StateAt, ClientError> {
    let whole = connector
        .call(false, |rpc, mut ctx, _| async move {
            ctx.deadline += STATE_WAIT;
            rpc.state(ctx, min_offset, STATE_WAIT.as_millis() as u32)
                .await
        })
        .await;
    match whole {
        Err(ClientError::Api(ApiError::AnswerTooLarge { .. })) => {
            state_in_chunks(connector, min_offset).await
        }
        answer => answer,
    }
}

/// Attempts at reading a state in chunks before giving up: each restarts when the connection
/// changed under it (the chunks of one state come from one connection).
const STATE_CHUNK_ATTEMPTS: usize = 3;

/// Reads a state too large for one answer, chunk by chunk (`state_chunk`).
async fn state_in_chunks(
    connector: &Connector,
    min_offset: Offset,
) -> Result<StateAt, ClientError> {
    let mut last_error = None;
    for _ in 0..STATE_CHUNK_ATTEMPTS {
        let chunk = |offset: Offset, chunk: u32| {
            connector.call(false, move |rpc, mut ctx, _| async move {
                ctx.deadline += STATE_WAIT;
                rpc.state_chunk(ctx, offset, chunk).await
            })
        };
        let first = chunk(min_offset, 0).await?;
        let mut bytes = first.bytes;
        let mut complete = true;
        for index in 1..first.chunks {
            match chunk(first.offset, index).await {
                Ok(next) => bytes.extend_from_slice(&next.bytes),
                // The connection changed (it holds no such state): start again.
                Err(ClientError::Api(ApiError::Invalid(why))) => {
                    last_error = Some(why);
                    complete = false;
                    break;
                }
                Err(error) => return Err(error),
            }
        }
        if complete {
            return crate::log::decode(&bytes, bytes.len() as u64).map_err(|e| {
                ClientError::Protocol {
                    replica: "a replica".into(),
                    detail: format!("a state in {} chunks does not decode: {e}", first.chunks),
                }
            });
        }
    }
    Err(ClientError::Protocol {
        replica: "a replica".into(),
        detail: format!(
            "a state in chunks kept changing connection: {}",
            last_error.unwrap_or_default()
        ),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn debug_output_never_shows_the_token() {
        let options = ClientOptions {
            token: Some("s3cret-token-value".into()),
            ..ClientOptions::default()
        };
        let shown = format!("{options:?}");
        assert!(!shown.contains("s3cret"), "{shown}");
        assert!(shown.contains("<redacted>"), "{shown}");
    }
}
