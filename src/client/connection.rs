//! [`ControlClient`]: finds the leader, follows `NotLeader`, retries with bounded backoff.

use std::collections::BTreeMap;
use std::hash::{BuildHasher, Hasher};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use tarpc::{client, context};
use tokio::sync::{mpsc, oneshot, Mutex};

use super::sequences::Sequences;
use crate::log::{
    Command, ContainerId, Epoch, Offset, ProducerId, ProducerSeq, Proposal, Target, TaskId,
};
use crate::wire::batching::{Accumulator, BatchLimits};
use crate::wire::protocol::*;
use crate::wire::tls::{dial, framed, Refusal, WatchedStream};
use crate::wire::version::{open_and_agree, HandshakeError, Hello, ProtocolOffer};
use crate::NodeId;

/// How long one call keeps retrying (failover, reconnects) before giving up. An election on
/// the default timeouts takes about a second; this leaves room for several.
pub const RETRY_DEADLINE: Duration = Duration::from_secs(30);
/// The per-request deadline sent with each call (a long poll adds its wait to it).
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);
/// The default subscription linger: small against the delivery lag a control plane tolerates,
/// large enough that a subscriber following a busy head gets several commands per answer.
pub const SUBSCRIPTION_LINGER: Duration = Duration::from_millis(5);
/// How long dialling one replica may take by default.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
const BACKOFF_MIN: Duration = Duration::from_millis(20);
/// Short enough that a client notices a new leader within a few hundred milliseconds of its
/// election; retries are cheap, one small request each.
const BACKOFF_MAX: Duration = Duration::from_millis(250);
/// Frames this client accepts: a fetch response of many entries.
pub const CLIENT_FRAME_BYTES_MAX: usize = 64 << 20;

/// Batches of appends a connection has in flight at once. While they are out, the appends
/// that arrive queue and go together in the next (see [`Connector::append`]).
const APPEND_BATCHES_IN_FLIGHT_MAX: usize = 2;
/// How a connection batches its appends: one `append_many` request's bounds, and a yield
/// before taking, so that the producers woken with the first append queue theirs too.
const APPEND_BATCHES: BatchLimits = BatchLimits {
    items_max: APPEND_MANY_PROPOSALS_MAX,
    bytes_max: APPEND_MANY_BYTES_MAX,
    in_flight_max: APPEND_BATCHES_IN_FLIGHT_MAX,
    yield_before_taking: true,
};
/// Appends queued for a connection before their producers wait (back-pressure).
const APPEND_QUEUE_DEPTH: usize = 16 * 1024;

/// Why a client call failed after its retries.
///
/// What to do about each: [`ClientError::Api`] is the cluster's answer (see
/// [`ApiError::is_retriable`]; the client already retried those that are); [`ClientError::GaveUp`]
/// means no replica served the call in time, so retry later (an append with the same
/// `(producer, seq)`, see the variant); [`ClientError::Config`] and [`ClientError::Tls`] come at
/// once, before any retry, and need the configuration fixed.
#[derive(Clone, Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ClientError {
    /// The cluster answered with an error retrying cannot fix (a wrong token answers
    /// [`ApiError::Unauthorized`] here, at once).
    #[error(transparent)]
    Api(#[from] ApiError),
    /// No replica could serve the call before the deadline. For an append the outcome is
    /// unknown: it may still commit. `append` names the append's `(producer, seq)`:
    /// [`ControlClient::append_proposal`] with that pair retries it without appending twice.
    #[error("gave up after {elapsed:?}: {last}")]
    GaveUp {
        /// How long the call tried.
        elapsed: Duration,
        /// Why the last attempt failed.
        last: String,
        /// The append's producer pair, when the call was an idempotent append.
        append: Option<ProducerSeq>,
    },
    /// A replica answered something that breaks the protocol's guarantees (for example a gap
    /// in an unfiltered fetch). The client refuses to pass it on rather than skip silently.
    #[error("protocol violation by {replica}: {detail}")]
    Protocol {
        /// The replica that answered (its client address), or who, when not one.
        replica: String,
        /// What broke the guarantee.
        detail: String,
    },
    /// The options or the seeds cannot work (no seeds, a zero timeout, one too long for the
    /// clock); nothing was sent.
    #[error("client option {option}: {reason}")]
    Config {
        /// The option at fault (`request_timeout`, `seeds`, ...).
        option: &'static str,
        /// What is wrong with its value.
        reason: String,
    },
    /// TLS with a replica failed in a way retrying cannot fix: its certificate is not signed
    /// by the CA this client trusts, or does not name the address dialled, or this client's
    /// own certificate was refused.
    #[error("TLS with {replica}: {reason}")]
    Tls {
        /// The address dialled.
        replica: String,
        /// What TLS refused, in rustls's words.
        reason: String,
    },
}

impl ClientError {
    /// Names the append whose outcome a `GaveUp` left unknown.
    fn for_append(self, pair: Option<ProducerSeq>) -> ClientError {
        match self {
            ClientError::GaveUp { elapsed, last, .. } => ClientError::GaveUp {
                elapsed,
                last,
                append: pair,
            },
            other => other,
        }
    }
}

/// The longest timeout or deadline an option may hold: far beyond any use, and far inside
/// what the clock can add to `Instant::now()` without overflowing.
pub const OPTION_DURATION_MAX: Duration = Duration::from_secs(24 * 3600);

/// How a client connects and retries, built in the style of etcd-client's `ConnectOptions`:
///
/// ```
/// use std::time::Duration;
/// use ctrlog::client::ClientOptions;
///
/// let options = ClientOptions::new()
///     .request_timeout(Duration::from_secs(5))
///     .retry_deadline(Duration::from_secs(10))
///     .token("s3cret");
/// assert!(!format!("{options:?}").contains("s3cret"));
/// ```
///
/// The defaults suit a container: ride out several elections, and notice a dead connection
/// within seconds. Values that cannot work (a zero timeout, one longer than
/// [`OPTION_DURATION_MAX`]) are refused by [`ControlClient::connect_with`] with
/// [`ClientError::Config`]. Its `Debug` never shows the token.
#[derive(Clone)]
#[non_exhaustive]
pub struct ClientOptions {
    pub(crate) retry_deadline: Duration,
    pub(crate) request_timeout: Duration,
    pub(crate) connect_timeout: Duration,
    pub(crate) subscription_linger: Duration,
    pub(crate) tls: Option<Arc<rustls::ClientConfig>>,
    pub(crate) token: Option<String>,
}

impl std::fmt::Debug for ClientOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClientOptions")
            .field("retry_deadline", &self.retry_deadline)
            .field("request_timeout", &self.request_timeout)
            .field("connect_timeout", &self.connect_timeout)
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
            connect_timeout: CONNECT_TIMEOUT,
            subscription_linger: SUBSCRIPTION_LINGER,
            tls: None,
            token: None,
        }
    }
}

impl ClientOptions {
    /// The defaults: [`RETRY_DEADLINE`], [`REQUEST_TIMEOUT`], [`CONNECT_TIMEOUT`],
    /// plain TCP, no token.
    pub fn new() -> ClientOptions {
        ClientOptions::default()
    }

    /// How long one call keeps retrying (failover, reconnects) before it gives up with
    /// [`ClientError::GaveUp`]. Zero makes one attempt.
    pub fn retry_deadline(mut self, deadline: Duration) -> Self {
        self.retry_deadline = deadline;
        self
    }

    /// How long one attempt may take before it counts as failed and is retried elsewhere (a
    /// long poll adds its wait to this).
    pub fn request_timeout(mut self, timeout: Duration) -> Self {
        self.request_timeout = timeout;
        self
    }

    /// How long dialling one replica (TCP, TLS and the token) may take before the client
    /// tries the next.
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }

    /// How long a subscription's long poll, once woken by a new command, waits for the
    /// commands that follow it before answering (`FetchRequest::linger_ms`).
    pub fn subscription_linger(mut self, linger: Duration) -> Self {
        self.subscription_linger = linger;
        self
    }

    /// Speak TLS to the replicas with this configuration ([`tls::client_config`](crate::wire::tls::client_config)): the CA
    /// that signed their certificates and, where the cluster asks for it, this client's own.
    pub fn tls(mut self, config: Arc<rustls::ClientConfig>) -> Self {
        self.tls = Some(config);
        self
    }

    /// Present this bearer token on every connection, where the cluster requires
    /// credentials and this client has no certificate it knows.
    pub fn token(mut self, token: impl Into<String>) -> Self {
        self.token = Some(token.into());
        self
    }

    /// Whether these options can work: every timeout above zero (the retry deadline may be
    /// zero: one attempt) and at most [`OPTION_DURATION_MAX`], and the linger within the
    /// request timeout.
    pub fn check(&self) -> Result<(), ClientError> {
        let refuse = |option, reason: String| Err(ClientError::Config { option, reason });
        for (option, value, zero_allowed) in [
            ("retry_deadline", self.retry_deadline, true),
            ("request_timeout", self.request_timeout, false),
            ("connect_timeout", self.connect_timeout, false),
            ("subscription_linger", self.subscription_linger, true),
        ] {
            if value.is_zero() && !zero_allowed {
                return refuse(option, "must be above zero".into());
            }
            if value > OPTION_DURATION_MAX {
                return refuse(
                    option,
                    format!("{value:?} is longer than the {OPTION_DURATION_MAX:?} allowed"),
                );
            }
        }
        if self.subscription_linger >= self.request_timeout {
            return refuse(
                "subscription_linger",
                "must be shorter than request_timeout, or every long poll times out".into(),
            );
        }
        if self.token.as_ref().is_some_and(|t| t.is_empty()) {
            return refuse("token", "is empty".into());
        }
        Ok(())
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
    /// The replica spoken to, its connection, and what its `hello` agreed.
    current: Mutex<Option<(String, ControlLogClient, Arc<Hello>)>>,
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

/// Why dialling a replica failed.
enum DialFailure {
    /// Another attempt (at this replica or another) may succeed.
    Transient(String),
    /// Refused for the configuration or the credentials: every replica would refuse the same.
    Refused(ClientError),
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

/// Whether `addr` is `HOST:PORT` (`[V6]:PORT` for an IPv6 address), as a dial needs it.
fn is_host_and_port(addr: &str) -> bool {
    addr.rsplit_once(':').is_some_and(|(host, port)| {
        let host = host.trim_start_matches('[').trim_end_matches(']');
        !host.is_empty() && port.parse::<u16>().is_ok_and(|port| port != 0)
    })
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

    /// The build of the replica spoken to now, as its `hello` named it (`ctrlog 0.1.0` for a
    /// replica that knows no `hello`). `None` before the first connection.
    async fn server_build(&self) -> Option<String> {
        (self.current.lock().await.as_ref()).map(|(_, _, hello)| hello.server.build.clone())
    }

    /// Whether the replica spoken to now offered `request` in its `hello` (a request added
    /// after v0.1.0 is sent only where it was). False before the first connection.
    async fn offered(&self, request: &str) -> bool {
        (self.current.lock().await.as_ref()).is_some_and(|(_, _, hello)| hello.offers(request))
    }

    /// Dials `addr`, agrees on the protocol version (`hello`) and presents the token. A
    /// failure retrying cannot fix (TLS refused a certificate, no protocol version in
    /// common, the token is refused) is `DialFailure::Refused`, ended at once.
    async fn dial(
        addr: &str,
        options: &ClientOptions,
    ) -> Result<(ControlLogClient, Arc<Hello>), DialFailure> {
        // Where a refusal that arrives as bytes (TLS spoken to a plaintext client, a TLS
        // alert) is recorded, by whichever connection the handshake ends on: it ends the dial
        // at once, whatever error the call itself saw.
        let refusal = Refusal::default();
        let refused = |refusal: &Refusal| {
            let why = refusal.lock().expect("never poisoned").clone()?;
            Some(DialFailure::Refused(ClientError::Tls {
                replica: addr.to_string(),
                reason: why,
            }))
        };
        let agreed = open_and_agree(
            addr,
            || Self::open(addr, options, refusal.clone()),
            |client: ControlLogClient| {
                let mut ctx = context::current();
                ctx.deadline = Instant::now() + options.connect_timeout;
                async move { client.hello(ctx, ProtocolOffer::ours()).await }
            },
        )
        .await;
        if let Some(refusal) = refused(&refusal) {
            return Err(refusal);
        }
        let (client, hello) = match agreed {
            Ok((client, hello)) => {
                tracing::debug!(replica = addr, protocol = hello.protocol, build = %hello.server.build, "hello");
                (client, hello)
            }
            Err(HandshakeError::Open(failure)) => return Err(failure),
            Err(HandshakeError::Refused(error @ ApiError::ProtocolUnsupported { .. })) => {
                return Err(DialFailure::Refused(error.into()))
            }
            Err(HandshakeError::Refused(error)) => {
                return Err(DialFailure::Transient(format!("hello to {addr}: {error}")))
            }
            Err(HandshakeError::Silent) => {
                return Err(DialFailure::Transient(format!(
                    "{addr} did not answer hello within {:?}",
                    options.connect_timeout
                )))
            }
        };
        if let Some(token) = &options.token {
            let mut ctx = context::current();
            ctx.deadline = Instant::now() + options.connect_timeout;
            let answer = client.authenticate(ctx, token.clone()).await;
            if let Some(refusal) = refused(&refusal) {
                return Err(refusal);
            }
            match answer {
                Ok(Ok(_)) => {}
                Ok(Err(error)) if !error.is_retriable() => {
                    return Err(DialFailure::Refused(error.into()))
                }
                Ok(Err(error)) => {
                    return Err(DialFailure::Transient(format!(
                        "authenticating to {addr}: {error}"
                    )))
                }
                Err(error) => {
                    return Err(DialFailure::Transient(format!(
                        "authenticating to {addr}: {error}"
                    )))
                }
            }
        }
        Ok((client, Arc::new(hello)))
    }

    /// A connection to `addr` (over TLS when the options say so), not yet introduced; a
    /// refusal that arrives on it as bytes is recorded in `refusal` ([`WatchedStream`]).
    async fn open(
        addr: &str,
        options: &ClientOptions,
        refusal: Refusal,
    ) -> Result<ControlLogClient, DialFailure> {
        let stream =
            match tokio::time::timeout(options.connect_timeout, dial(addr, options.tls.as_ref()))
                .await
            {
                Err(_) => {
                    return Err(DialFailure::Transient(format!(
                        "connecting to {addr} timed out"
                    )))
                }
                Ok(Err(error)) if error.is_permanent() => {
                    // `ClientError::Tls` names the replica itself: say only why.
                    let reason = match error {
                        crate::wire::tls::DialError::Tls { source, .. } => source.to_string(),
                        other => other.to_string(),
                    };
                    return Err(DialFailure::Refused(ClientError::Tls {
                        replica: addr.to_string(),
                        reason,
                    }));
                }
                Ok(Err(error)) => return Err(DialFailure::Transient(error.to_string())),
                Ok(Ok(stream)) => stream,
            };
        let stream = WatchedStream::new(stream, options.tls.is_none(), refusal);
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
        let mut attempt = 0u32;
        loop {
            let (addr, rpc) = {
                let mut current = self.current.lock().await;
                let wanted = target.take();
                match (&*current, wanted) {
                    (Some((addr, rpc, _)), None) => (addr.clone(), rpc.clone()),
                    (Some((addr, rpc, _)), Some(w)) if *addr == w => (addr.clone(), rpc.clone()),
                    (_, wanted) => {
                        let addr = wanted.unwrap_or_else(|| self.next_seed());
                        match Self::dial(&addr, &self.settings.options).await {
                            Ok((rpc, hello)) => {
                                *current = Some((addr.clone(), rpc.clone(), hello));
                                (addr, rpc)
                            }
                            Err(DialFailure::Refused(error)) => {
                                *current = None;
                                return Err(error);
                            }
                            Err(DialFailure::Transient(reason)) => {
                                *current = None;
                                drop(current);
                                self.pause(started, &mut backoff, reason).await?;
                                continue;
                            }
                        }
                    }
                }
            };
            attempt += 1;
            tracing::debug!(attempt, replica = %addr, leader_only, "calling");
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
                append: None,
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
async fn send_appends(connector: Weak<Connector>, queued: mpsc::Receiver<QueuedAppend>) {
    let mut batches = Accumulator::new(queued, APPEND_BATCHES, |append: &QueuedAppend| {
        append.proposal.encoded_len()
    });
    while let Some((batch, slot)) = batches.next().await {
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
/// Concurrent calls are multiplexed over one connection. It is a cheap handle: a clone is the
/// same producer on the same connection (share it freely between tasks);
/// [`ControlClient::new_producer_sharing_connection`] makes another producer on it.
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
#[derive(Clone)]
pub struct ControlClient {
    /// Shared by the producers made with [`ControlClient::new_producer_sharing_connection`].
    pub(super) connector: Arc<Connector>,
    producer: ProducerId,
    /// Shared by this producer's clones (its clones share the window): one sequence window
    /// per producer id.
    sequences: Sequences,
    /// The highest offset this client's appends were acknowledged at; its subscriptions'
    /// resets read at least this far (read your writes).
    pub(super) own_writes: Arc<AtomicU64>,
    /// This handle's own deadline per call ([`ControlClient::with_deadline`]), within the
    /// options' retry deadline.
    deadline: Option<Duration>,
}

impl std::fmt::Debug for ControlClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ControlClient")
            .field("seeds", &self.connector.settings.seeds)
            .field("options", &self.connector.settings.options)
            .field("producer", &self.producer)
            .field("deadline", &self.deadline)
            .finish_non_exhaustive()
    }
}

/// For callers that shared a client behind an `Arc` (before it was a cheap handle).
impl From<Arc<ControlClient>> for ControlClient {
    fn from(client: Arc<ControlClient>) -> ControlClient {
        (*client).clone()
    }
}

impl ControlClient {
    /// Connects to the cluster through any of `seeds` (client addresses, `host:port`), with the
    /// default [`ClientOptions`]. See [`ControlClient::connect_with`].
    pub async fn connect(
        seeds: impl IntoIterator<Item = impl AsRef<str>>,
    ) -> Result<ControlClient, ClientError> {
        ControlClient::connect_with(seeds, ClientOptions::default()).await
    }

    /// Connects with other options, which then apply to every call of this client and of its
    /// subscriptions, and asks a replica for its status. Fails at once, without retrying, on
    /// options that cannot work or no seeds ([`ClientError::Config`]), a certificate TLS
    /// refuses ([`ClientError::Tls`]) or a refused token ([`ApiError::Unauthorized`]); retries
    /// unreachable replicas until the options' retry deadline ([`ClientError::GaveUp`]).
    ///
    /// Cancel safe: dropping the future drops the half-made client.
    pub async fn connect_with(
        seeds: impl IntoIterator<Item = impl AsRef<str>>,
        options: ClientOptions,
    ) -> Result<ControlClient, ClientError> {
        options.check()?;
        let seeds: Vec<String> = seeds.into_iter().map(|s| s.as_ref().to_string()).collect();
        let span = tracing::debug_span!("ctrlog.connect", seeds = ?seeds);
        if seeds.is_empty() {
            return Err(ClientError::Config {
                option: "seeds",
                reason: "no cluster addresses given".into(),
            });
        }
        if let Some(seed) = seeds.iter().find(|seed| !is_host_and_port(seed)) {
            return Err(ClientError::Config {
                option: "seeds",
                reason: format!("`{seed}` is not HOST:PORT (the client port's number is needed)"),
            });
        }
        let client = ControlClient {
            connector: Arc::new(Connector::new(Settings {
                seeds: Arc::new(seeds),
                options,
            })),
            producer: random_u64(),
            sequences: Sequences::new(),
            own_writes: Arc::default(),
            deadline: None,
        };
        tracing::Instrument::instrument(client.status(), span).await?;
        Ok(client)
    }

    /// This client's producer id, which makes its appends idempotent.
    pub fn producer_id(&self) -> ProducerId {
        self.producer
    }

    /// Another producer on this client's connection: its own producer id and sequence window,
    /// the same connection and retry engine. A process with many independent writers (one per
    /// task, say) then holds one connection instead of one per writer.
    ///
    /// It changes the connection for every producer on it: from then on, the appends that
    /// queue while earlier ones are in flight go out together in one request (`append_many`),
    /// which is most of what a small append costs when many share a connection, and costs a
    /// lone producer a hand-off per append. (A clone, by contrast, is the same producer.)
    pub fn new_producer_sharing_connection(&self) -> ControlClient {
        self.connector
            .shared_by_producers
            .store(true, Ordering::Relaxed);
        ControlClient {
            connector: self.connector.clone(),
            producer: random_u64(),
            sequences: Sequences::new(),
            own_writes: Arc::default(),
            deadline: self.deadline,
        }
    }

    /// This client (the same producer, on the same connection) with a deadline of its own for
    /// each call: a call not done within `deadline` ends with [`ClientError::GaveUp`], which for
    /// an append names its `(producer, seq)`, so that it can be retried with
    /// [`ControlClient::append_proposal`] without appending twice. The options' retry deadline
    /// still applies when it is shorter. `deadline` is clamped to [`OPTION_DURATION_MAX`].
    ///
    /// ```no_run
    /// # async fn example(client: ctrlog::client::ControlClient) {
    /// use std::time::Duration;
    /// use ctrlog::client::ClientError;
    /// use ctrlog::log::Command;
    ///
    /// let quick = client.with_deadline(Duration::from_millis(500));
    /// match quick.append(Command::custom(1, 1, b"hello".to_vec())).await {
    ///     Ok(ack) => println!("at offset {}", ack.offset),
    ///     Err(ClientError::GaveUp { append: Some(pair), .. }) => println!("retry {pair:?} later"),
    ///     Err(other) => println!("refused: {other}"),
    /// }
    /// # }
    /// ```
    pub fn with_deadline(&self, deadline: Duration) -> ControlClient {
        ControlClient {
            deadline: Some(deadline.min(OPTION_DURATION_MAX)),
            ..self.clone()
        }
    }

    /// Runs `call` within this handle's deadline, if it has one. (An append's `GaveUp` gets
    /// its pair from `append_proposal`, as one at the retry deadline does.)
    async fn within<T>(
        &self,
        call: impl std::future::Future<Output = Result<T, ClientError>>,
    ) -> Result<T, ClientError> {
        let Some(deadline) = self.deadline else {
            return call.await;
        };
        tokio::time::timeout(deadline, call)
            .await
            .unwrap_or_else(|_| {
                Err(ClientError::GaveUp {
                    elapsed: deadline,
                    last: format!("the call's deadline ({deadline:?}) passed"),
                    append: None,
                })
            })
    }

    /// The name of [`ControlClient::new_producer_sharing_connection`] in v0.1.0.
    #[deprecated(note = "renamed new_producer_sharing_connection, which says what it changes")]
    pub fn new_producer(&self) -> ControlClient {
        self.new_producer_sharing_connection()
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
    /// later appends need a new producer
    /// ([`ControlClient::new_producer_sharing_connection`]). Below level 3 such a retry is
    /// taken for a new append.
    ///
    /// Cancel safety: dropping the future abandons the wait, not the append, which may still
    /// commit; its `(producer, seq)` is then unknown to the caller. To bound an append and
    /// still retry it exactly, use [`ControlClient::with_deadline`] (its `GaveUp` names the
    /// pair) or [`ControlClient::append_proposal`] with a pair of your own.
    pub async fn append(&self, command: Command) -> Result<AppendAck, ClientError> {
        let target = command.default_target();
        self.append_to(target, command).await
    }

    /// Appends a command idempotently to a chosen target.
    ///
    /// Cancel safety: dropping the future abandons the wait, not the append, which may still
    /// commit; its `(producer, seq)` is then unknown to the caller. To bound an append and
    /// still retry it exactly, use [`ControlClient::with_deadline`] (its `GaveUp` names the
    /// pair) or [`ControlClient::append_proposal`] with a pair of your own.
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
    ///
    /// Cancel safe for retrying: the proposal carries its pair, so sending it again after a
    /// dropped future appends it at most once.
    #[tracing::instrument(
        name = "ctrlog.append",
        level = "debug",
        skip_all,
        fields(producer = ?proposal.producer, target = %proposal.target)
    )]
    pub async fn append_proposal(&self, proposal: Proposal) -> Result<AppendAck, ClientError> {
        let size = proposal.frame.body.len();
        if size > COMMAND_BYTES_MAX_ANY_REPLICA {
            return Err(ApiError::TooLarge {
                size: size as u64,
                limit: COMMAND_BYTES_MAX_ANY_REPLICA as u64,
            }
            .into());
        }
        let batched = proposal.producer.is_some()
            && self.connector.shared_by_producers.load(Ordering::Relaxed);
        let pair = proposal.producer;
        let appended = async {
            if batched {
                self.connector.append(proposal).await
            } else {
                self.connector.append_alone(proposal).await
            }
        };
        let ack = self
            .within(appended)
            .await
            .map_err(|error| error.for_append(pair))?;
        self.own_writes.fetch_max(ack.offset, Ordering::AcqRel);
        Ok(ack)
    }

    /// One fetch from any replica (without waiting unless `request.max_wait_ms` says so).
    /// Most readers want [`ControlClient::subscribe`].
    ///
    /// Cancel safe: dropping the future abandons the call and changes nothing.
    #[tracing::instrument(name = "ctrlog.fetch", level = "debug", skip_all, fields(from = request.from))]
    pub async fn fetch(&self, request: FetchRequest) -> Result<FetchResponse, ClientError> {
        let fetched = self.connector.call(false, |rpc, mut ctx, _| {
            let request = request.clone();
            ctx.deadline += Duration::from_millis(request.max_wait_ms.into());
            async move { rpc.fetch(ctx, request).await }
        });
        self.within(fetched).await
    }

    /// The JobState as of an offset of at least `min_offset`, from any replica.
    ///
    /// Cancel safe: dropping the future abandons the call and changes nothing.
    pub async fn state(&self, min_offset: Offset) -> Result<StateAt, ClientError> {
        self.within(state_at(&self.connector, min_offset)).await
    }

    /// The job state as of a linearizable read: it holds every write acknowledged, to any
    /// client, before this call. The leader confirms its leadership with a quorum and names
    /// its applied offset (the read index, [`read_index`](Self::read_index)); any replica
    /// then answers once it has applied that far. [`state`](Self::state) instead reads what
    /// the replica it speaks to has applied, at least `min_offset`: this client's own writes
    /// when given their offset (read-your-writes), not necessarily others'.
    ///
    /// Cancel safe: dropping the future abandons the call and changes nothing.
    pub async fn consistent_state(&self) -> Result<StateAt, ClientError> {
        let offset = self.read_index().await?;
        self.state(offset).await
    }

    /// The read index: the leader's applied offset once a quorum confirmed it leads and it
    /// applied every entry committed when asked (follows redirects to the leader). A replica
    /// whose build has no `read_index` closes the connection on it, and the call gives up at
    /// the client's deadline.
    ///
    /// Cancel safe: dropping the future abandons the call and changes nothing.
    pub async fn read_index(&self) -> Result<Offset, ClientError> {
        let call =
            (self.connector).call(true, |rpc, ctx, _| async move { rpc.read_index(ctx).await });
        self.within(call).await
    }

    /// Hands the leadership over to the voter `to` (follows redirects to the leader);
    /// answered once `to` leads. About an election timeout, during which appends wait.
    ///
    /// Cancel safe: dropping the future abandons the call; the leader still hands over.
    pub async fn transfer_leader(&self, to: NodeId) -> Result<NodeId, ClientError> {
        let call = (self.connector).call(true, |rpc, ctx, _| async move {
            rpc.transfer_leader(ctx, to).await
        });
        self.within(call).await
    }

    /// The status of whichever replica answers.
    ///
    /// Cancel safe: dropping the future abandons the call and changes nothing.
    pub async fn status(&self) -> Result<Status, ClientError> {
        let status = self
            .connector
            .call(false, |rpc, ctx, _| async move { rpc.status(ctx).await });
        self.within(status).await
    }

    /// The build of the replica this client speaks to now (`ctrlog 0.2.0`), as its `hello`
    /// named it; `None` before the first request. A rolling restart's progress, replica by
    /// replica.
    pub async fn server_build(&self) -> Option<String> {
        self.connector.server_build().await
    }

    /// The status of whichever replica answers, with its storage's: whether its log is being
    /// repaired from the leader (`None` from a replica whose build has no such request, which
    /// never repairs). Both come over one connection, so from one replica; should the
    /// connection change between the two calls, the storage part is left out rather than
    /// told of another replica.
    ///
    /// Cancel safe: dropping the future abandons the call and changes nothing.
    pub async fn status_with_storage(
        &self,
    ) -> Result<(Status, Option<StorageStatus>), ClientError> {
        let status = self.status().await?;
        if !self.connector.offered("storage_status").await {
            return Ok((status, None));
        }
        let storage =
            self.connector.call(
                false,
                |rpc, ctx, _| async move { rpc.storage_status(ctx).await },
            );
        let storage = self.within(storage).await?;
        let same_replica = storage.id == status.id;
        Ok((status, same_replica.then_some(storage)))
    }

    /// Tells the leader a container session is alive, with its lag per task. Most containers
    /// use [`ContainerSession`](super::ContainerSession), which does this in the background.
    ///
    /// Cancel safe: dropping the future abandons the call and changes nothing.
    pub async fn heartbeat(
        &self,
        container: &ContainerId,
        epoch: Epoch,
        lag: &BTreeMap<TaskId, u64>,
    ) -> Result<HeartbeatAck, ClientError> {
        let call = self.connector.call(true, |rpc, ctx, _| {
            let (container, lag) = (container.clone(), lag.clone());
            async move { rpc.heartbeat(ctx, container, epoch, lag).await }
        });
        self.within(call).await
    }

    /// The leader's status (follows redirects until a leader answers).
    ///
    /// Cancel safe: dropping the future abandons the call and changes nothing.
    pub async fn leader_status(&self) -> Result<Status, ClientError> {
        let call = self.connector.call(true, |rpc, ctx, _| async move {
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
        });
        self.within(call).await
    }

    /// Adds a replica (learner first, voter once caught up).
    ///
    /// Cancel safe in that dropping the future stops waiting; the change may still happen
    /// (check with `leader_status`).
    pub async fn add_member(&self, id: NodeId, member: Member) -> Result<(), ClientError> {
        let call = self.connector.call(true, |rpc, mut ctx, _| {
            let member = member.clone();
            // Catching up can take a while; the server bounds it itself.
            ctx.deadline = Instant::now() + Duration::from_secs(90);
            async move { rpc.add_member(ctx, id, member).await }
        });
        self.within(call).await
    }

    /// Removes a replica.
    ///
    /// Cancel safe in that dropping the future stops waiting; the change may still happen
    /// (check with `leader_status`).
    pub async fn remove_member(&self, id: NodeId) -> Result<(), ClientError> {
        let call = self.connector.call(true, |rpc, ctx, _| async move {
            rpc.remove_member(ctx, id).await
        });
        self.within(call).await
    }

    /// Takes a snapshot on the leader now; returns the last offset it covers.
    ///
    /// Cancel safe in that dropping the future stops waiting; the change may still happen
    /// (check with `leader_status`).
    pub async fn snapshot(&self) -> Result<Offset, ClientError> {
        let call = self.connector.call(true, |rpc, mut ctx, _| async move {
            ctx.deadline = Instant::now() + Duration::from_secs(40);
            rpc.snapshot(ctx).await
        });
        self.within(call).await
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
        Err(ClientError::Api(ApiError::AnswerTooLarge { .. }))
            if connector.offered("state_chunk").await =>
        {
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

    /// Goal: the options builder sets what it says, and values that cannot work are refused
    /// with the option named, before anything is sent (a `Duration::MAX` timeout used to
    /// panic later, in a task, when added to the clock).
    #[test]
    fn options_are_built_and_checked() {
        let options = ClientOptions::new()
            .retry_deadline(Duration::from_secs(3))
            .request_timeout(Duration::from_secs(2))
            .connect_timeout(Duration::from_millis(500))
            .subscription_linger(Duration::from_millis(1))
            .token("t");
        assert_eq!(options.retry_deadline, Duration::from_secs(3));
        assert_eq!(options.request_timeout, Duration::from_secs(2));
        assert_eq!(options.connect_timeout, Duration::from_millis(500));
        assert!(options.check().is_ok());
        assert!(ClientOptions::new()
            .retry_deadline(Duration::ZERO)
            .check()
            .is_ok());
        for (options, named) in [
            (
                ClientOptions::new().request_timeout(Duration::MAX),
                "request_timeout",
            ),
            (
                ClientOptions::new().request_timeout(Duration::ZERO),
                "request_timeout",
            ),
            (
                ClientOptions::new().connect_timeout(Duration::ZERO),
                "connect_timeout",
            ),
            (
                ClientOptions::new().retry_deadline(Duration::MAX),
                "retry_deadline",
            ),
            (
                ClientOptions::new().subscription_linger(Duration::from_secs(60)),
                "subscription_linger",
            ),
            (ClientOptions::new().token(""), "token"),
        ] {
            match options.check() {
                Err(ClientError::Config { option, .. }) => assert_eq!(option, named),
                other => panic!("{named}: {other:?}"),
            }
        }
    }

    /// Goal: `connect` refuses what cannot work at once: no seeds, bad options.
    #[tokio::test]
    async fn connect_refuses_no_seeds_and_bad_options_at_once() {
        let none: [&str; 0] = [];
        assert!(matches!(
            ControlClient::connect(none).await,
            Err(ClientError::Config {
                option: "seeds",
                ..
            })
        ));
        let bad = ClientOptions::new().request_timeout(Duration::MAX);
        assert!(matches!(
            ControlClient::connect_with(["127.0.0.1:1"], bad).await,
            Err(ClientError::Config {
                option: "request_timeout",
                ..
            })
        ));
    }

    #[test]
    fn debug_output_never_shows_the_token() {
        let options = ClientOptions::new().token("s3cret-token-value");
        let shown = format!("{options:?}");
        assert!(!shown.contains("s3cret"), "{shown}");
        assert!(shown.contains("<redacted>"), "{shown}");
    }
}
