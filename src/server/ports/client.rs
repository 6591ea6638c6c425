//! The `ControlLog` service on the client port, served from a [`ReplicaHandle`].
//!
//! Each connection is its own tarpc channel with a bound on requests in flight, and the port
//! and each connection a bound on the bytes of large answers built and not yet written
//! (excess requests are answered `Overloaded`). Both are held until the transport takes the
//! answer, not only until the handler returns: a client that sends requests and never reads
//! the answers pins at most its budgets in the replica's memory (tarpc queues answers that
//! cannot be written). A `state` answer shares the state machine's job rather than copying
//! it, and `state_chunk` answers of one offset share one encoding port-wide. A connection
//! that sends a frame above the limit or bytes that do not decode is closed by its transport;
//! nothing else is affected, and nothing is applied from it.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::atomic::AtomicU16;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::{SinkExt, StreamExt};
use tarpc::server::{BaseChannel, Channel, Serve};
use tarpc::{context, ClientMessage, Response};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio_rustls::TlsAcceptor;

use crate::log::{ContainerId, Epoch, Offset, Proposal, TaskId};
use crate::raft::refusals::Refusals;
use crate::server::config::ClientPortConfig;
use crate::server::handle::ReplicaHandle;
use crate::server::ports::auth::{authorize, Action, Authenticator, Principal};
use crate::server::ports::connections::{serve_each_connection, Admission, PortLimits};
use crate::wire::protocol::{
    ApiError, AppendAck, ControlLog, ControlLogRequest, ControlLogResponse, FetchRequest,
    FetchResponse, HeartbeatAck, Member, StateAt, StateChunk, Status, StorageStatus,
    APPEND_MANY_PROPOSALS_MAX,
};
use crate::wire::tls::framed;
use crate::wire::version::{
    error_for_protocol, Hello, ProtocolOffer, CLIENT_REQUESTS_AFTER_V010, PROTOCOL_V010,
};
use crate::NodeId;

type Request = ClientMessage<ControlLogRequest>;
type Reply = Response<ControlLogResponse>;

/// An answer on its way to the connection, with what it holds of the connection's request
/// budget and of the answer-byte budgets until the transport takes it.
struct HeldReply {
    answer: ControlLogResponse,
    _held: Vec<OwnedSemaphorePermit>,
}

/// A bound, not yet serving, client listener.
pub struct ClientListener {
    listener: tokio::net::TcpListener,
    frame_bytes_max: usize,
    answer_bytes_max: usize,
}

impl ClientListener {
    pub fn local_addr(&self) -> std::io::Result<SocketAddr> {
        self.listener.local_addr()
    }
}

/// Binds the client port at `addr`, with the frame and answer limits of `[client_port]`.
pub async fn bind_clients(
    addr: SocketAddr,
    port: &ClientPortConfig,
) -> std::io::Result<ClientListener> {
    Ok(ClientListener {
        listener: tokio::net::TcpListener::bind(addr).await?,
        frame_bytes_max: port.frame_bytes_max,
        answer_bytes_max: port.answer_bytes_max(),
    })
}

/// The longest a long poll waits, whatever the request asks.
pub const FETCH_WAIT_MAX: Duration = Duration::from_secs(60);

/// Fetches in flight on one connection. A subscription keeps one; a few let a client share a
/// connection between subscriptions. The bound is what keeps a client that sends fetches but
/// never reads the answers from pinning more than this many answers in the replica's memory.
pub const FETCHES_IN_FLIGHT_MAX: usize = 4;

/// How long the first `state_chunk` waits for the replica to apply the offset asked for.
const STATE_CHUNK_WAIT_MS: u32 = 5_000;

/// A long poll answers this long before the request's deadline, so that the answer (possibly
/// empty) reaches the caller before it gives up on the request.
const DEADLINE_HEADROOM: Duration = Duration::from_millis(250);

/// Failed `authenticate` calls one connection may make; its next request of any kind closes
/// it. Guessing tokens then costs a connection (and a TLS handshake) per few guesses.
pub const AUTHENTICATE_FAILURES_MAX: u32 = 3;

/// What a request in flight is counted to hold of its principal's share and the port's
/// budget until it is answered: its task, its decoded request and its place in the
/// connection's buffers. Measured at about 6.5 KB for a long poll (DEPLOY.md, "Bounds").
pub const REQUEST_HELD_BYTES: u32 = 8 << 10;

/// Each principal's share of what the port holds for its callers
/// ([`ConnectionBudget::principal_held_bytes`]), one per principal name, made at its first
/// connection; connections not yet authenticated share a sixteenth of that.
struct PrincipalShares {
    bytes_max: usize,
    unauthenticated: Arc<Semaphore>,
    by_name: std::sync::Mutex<std::collections::HashMap<String, Arc<Semaphore>>>,
}

impl PrincipalShares {
    fn new(bytes_max: usize) -> PrincipalShares {
        PrincipalShares {
            bytes_max,
            unauthenticated: Arc::new(Semaphore::new(bytes_max / 16)),
            by_name: Default::default(),
        }
    }

    /// The share of `principal` (`None`: not yet authenticated).
    fn of(&self, principal: Option<&Principal>) -> Arc<Semaphore> {
        let Some(principal) = principal else {
            return self.unauthenticated.clone();
        };
        let mut by_name = self.by_name.lock().expect("never poisoned");
        (by_name.entry(principal.name.clone()))
            .or_insert_with(|| Arc::new(Semaphore::new(self.bytes_max)))
            .clone()
    }
}

/// What the client port and each of its connections may hold.
#[derive(Clone, Debug)]
pub struct ConnectionBudget {
    /// What the port holds: connections, bytes being received, idle and read timeouts.
    pub port: PortLimits,
    /// Requests, of any kind.
    pub requests: usize,
    /// Encoded bytes of appends waiting to commit.
    pub append_bytes: usize,
    /// Encoded bytes of large answers (fetches, states, state chunks, statuses) built and not
    /// yet written, on one connection.
    pub answer_bytes: usize,
    /// What the port holds for all its callers: answers not yet written, and
    /// [`REQUEST_HELD_BYTES`] per request in flight.
    pub port_answer_bytes: usize,
    /// Of that, what one principal's connections may hold together.
    pub principal_held_bytes: usize,
    /// With authentication on, how long a connection may go without authenticating.
    pub authenticate_timeout: Duration,
}

/// Serves clients until `stop` fires, over TLS when `tls` is given.
pub async fn serve_clients(
    listener: ClientListener,
    replica: ReplicaHandle,
    budget: ConnectionBudget,
    tls: Option<TlsAcceptor>,
    auth: Option<Arc<Authenticator>>,
    stop: tokio::sync::watch::Receiver<bool>,
) {
    let (frame_bytes_max, answer_bytes_max) = (listener.frame_bytes_max, listener.answer_bytes_max);
    let requests_in_flight_max = budget.requests;
    let port_answer_bytes = Arc::new(Semaphore::new(budget.port_answer_bytes));
    let shares = Arc::new(PrincipalShares::new(budget.principal_held_bytes));
    let refusals = Arc::new(Refusals::default());
    let latest_encoded_state: Arc<std::sync::Mutex<Option<EncodedState>>> = Arc::default();
    serve_each_connection("client", listener.listener, tls, budget.port, stop, move |accepted| {
        let principal = match (&auth, &accepted.peer_certificate) {
            (Some(auth), Some(cert)) => auth.by_certificate(cert),
            _ => None,
        };
        // Authenticated by its certificate, or with nothing to show: it no longer counts
        // among the port's unauthenticated connections. Otherwise it must call `authenticate`
        // within the deadline.
        let must_authenticate = auth.is_some() && principal.is_none();
        if !must_authenticate {
            accepted.admission.authenticated();
        }
        let admission = Arc::new(accepted.admission);
        // Without authentication every caller is the same principal: the port's budget is
        // its share.
        let share = auth.as_ref().map(|_| shares.of(principal.as_ref()));
        let server = ControlLogServer {
            replica: replica.clone(),
            in_flight: Arc::new(Semaphore::new(requests_in_flight_max)),
            in_flight_max: requests_in_flight_max as u32,
            answer_bytes_max,
            encoded_state: Arc::default(),
            latest_encoded_state: latest_encoded_state.clone(),
            append_bytes: Arc::new(Semaphore::new(budget.append_bytes)),
            append_bytes_max: budget.append_bytes,
            fetches: Arc::new(Semaphore::new(FETCHES_IN_FLIGHT_MAX)),
            answer_bytes: Arc::new(Semaphore::new(budget.answer_bytes)),
            port_answer_bytes: port_answer_bytes.clone(),
            shares: shares.clone(),
            share: Arc::new(std::sync::Mutex::new(share)),
            held: Arc::default(),
            admission: admission.clone(),
            authenticated: Arc::default(),
            auth: auth.clone(),
            principal: Arc::new(std::sync::Mutex::new(principal)),
            failed_authentications: Arc::default(),
            hang_up: Arc::default(),
            protocol: Arc::new(AtomicU16::new(PROTOCOL_V010)),
        };
        let hang_up = server.hang_up.clone();
        let authenticated = server.authenticated.clone();
        let protocol = server.protocol.clone();
        let authenticate_timeout = budget.authenticate_timeout;
        let refusals = refusals.clone();
        async move {
            // Every answer leaves in a form the connection's protocol decodes, and gives back
            // what it held of the budgets once the transport has taken it.
            let transport = framed::<_, Request, Reply>(accepted.stream, frame_bytes_max)
                .with(move |reply: Response<HeldReply>| {
                    let reply = Reply {
                        request_id: reply.request_id,
                        message: reply.message.map(|held| held.answer),
                    };
                    futures::future::ready(Ok(for_protocol(reply, protocol.load(Relaxed))))
                });
            // Our own bound answers excess requests with a typed `Overloaded`; tarpc's, at
            // twice the size, only bounds what a client that ignores those answers can queue.
            let serving = BaseChannel::with_defaults(transport)
                .max_concurrent_requests(requests_in_flight_max.saturating_mul(2))
                .execute(tarpc::server::serve(move |ctx, request| {
                    server.clone().serve_held(ctx, request)
                }))
                // In-flight requests run concurrently inside this connection's task rather
                // than as a task each: no spawn and no cross-thread wake-up per request.
                .for_each_concurrent(None, |response| response);
            tokio::select! {
                // Checked first at every wake-up: once a request has called for the hang-up,
                // no later request on the connection is read, let alone answered.
                biased;
                _ = hang_up.notified() => {
                    if let Some(closed) = refusals.refused("failed authentications") {
                        tracing::info!(peer = %accepted.peer, closed, "closing a connection after failed authentications (one line a second)");
                    }
                }
                _ = async {
                    let authenticating = authenticated.notified();
                    if !must_authenticate
                        || tokio::time::timeout(authenticate_timeout, authenticating).await.is_ok()
                    {
                        std::future::pending::<()>().await;
                    }
                } => {
                    if let Some(closed) = refusals.refused("no authentication in time") {
                        tracing::info!(peer = %accepted.peer, ?authenticate_timeout, closed, "closing a connection that did not authenticate in time (one line a second)");
                    }
                }
                _ = serving => {}
            }
            // The channel ends when the peer hangs up or sends a frame that does not decode
            // (or exceeds the limit); only this connection is affected.
            tracing::debug!(peer = %accepted.peer, "client connection closed");
        }
    })
    .await;
}

/// A job state encoded for `state_chunk`, with the offset it is as of.
type EncodedState = (Offset, Arc<Vec<u8>>);

#[derive(Clone)]
struct ControlLogServer {
    replica: ReplicaHandle,
    /// Requests in flight on this connection.
    in_flight: Arc<Semaphore>,
    in_flight_max: u32,
    /// What one answer may carry: the port's frame limit less the envelope
    /// (`ClientPortConfig::answer_bytes_max`).
    answer_bytes_max: usize,
    /// The encoded state this connection is reading in chunks, and the offset it is as of.
    encoded_state: Arc<std::sync::Mutex<Option<EncodedState>>>,
    /// The latest state any connection of the port encoded for `state_chunk`: connections
    /// reading one offset share one encoding instead of one each.
    latest_encoded_state: Arc<std::sync::Mutex<Option<EncodedState>>>,
    /// Encoded bytes of the appends in flight on this connection.
    append_bytes: Arc<Semaphore>,
    append_bytes_max: usize,
    /// Fetches in flight on this connection (see [`FETCHES_IN_FLIGHT_MAX`]).
    fetches: Arc<Semaphore>,
    /// Encoded bytes of this connection's large answers not yet written.
    answer_bytes: Arc<Semaphore>,
    /// What the port holds for all its callers: answers not yet written, and
    /// [`REQUEST_HELD_BYTES`] per request in flight.
    port_answer_bytes: Arc<Semaphore>,
    /// The principals' shares of that.
    shares: Arc<PrincipalShares>,
    /// This connection's principal's share (`None` without authentication).
    share: Arc<std::sync::Mutex<Option<Arc<Semaphore>>>>,
    /// What the request being served holds until its answer is written: its slot of
    /// `in_flight`, and of `fetches`, `answer_bytes` and `port_answer_bytes` for a large
    /// answer. Fresh for each request (see [`ControlLogServer::serve_held`]).
    held: Arc<std::sync::Mutex<Vec<OwnedSemaphorePermit>>>,
    /// The credentials this replica accepts; `None` when authentication is off.
    auth: Option<Arc<Authenticator>>,
    /// Who this connection is: from its client certificate, or from `authenticate`.
    principal: Arc<std::sync::Mutex<Option<Principal>>>,
    /// `authenticate` calls refused on this connection.
    failed_authentications: Arc<std::sync::atomic::AtomicU32>,
    /// Ends the connection (see [`AUTHENTICATE_FAILURES_MAX`]).
    hang_up: Arc<tokio::sync::Notify>,
    /// The connection's place among the port's unauthenticated connections, left once it
    /// authenticates.
    admission: Arc<Admission>,
    /// Told once a token authenticated the connection, which then has no deadline.
    authenticated: Arc<tokio::sync::Notify>,
    /// The protocol version the connection's `hello` agreed on; v0.1.0's until one does.
    protocol: Arc<AtomicU16>,
}

/// `reply` as a client speaking `protocol` decodes it (see [`error_for_protocol`]).
fn for_protocol(reply: Reply, protocol: u16) -> Reply {
    use ControlLogResponse::*;
    if protocol > PROTOCOL_V010 {
        return reply;
    }
    let down = |error| error_for_protocol(error, protocol);
    let message = reply.message.map(|answer| match answer {
        Append(a) => Append(a.map_err(down)),
        Fetch(a) => Fetch(a.map_err(down)),
        State(a) => State(a.map_err(down)),
        Status(a) => Status(a.map_err(down)),
        Heartbeat(a) => Heartbeat(a.map_err(down)),
        AddMember(a) => AddMember(a.map_err(down)),
        RemoveMember(a) => RemoveMember(a.map_err(down)),
        Snapshot(a) => Snapshot(a.map_err(down)),
        Authenticate(a) => Authenticate(a.map_err(down)),
        AppendMany(a) => AppendMany(
            a.map_err(down)
                .map(|acks| acks.into_iter().map(|ack| ack.map_err(down)).collect()),
        ),
        StateChunk(a) => StateChunk(a.map_err(down)),
        // Whoever sends `hello` is newer than v0.1.0 and decodes its refusal; a v0.1.0 client
        // knows none of the requests after `hello` either.
        Hello(a) => Hello(a),
        StorageStatus(a) => StorageStatus(a),
        ReadIndex(a) => ReadIndex(a),
        TransferLeader(a) => TransferLeader(a),
    });
    Reply {
        request_id: reply.request_id,
        message,
    }
}

impl ControlLogServer {
    /// Serves one request, and hands its answer on with everything the request took of the
    /// budgets, to be given back when the transport takes the answer.
    async fn serve_held(
        mut self,
        ctx: context::Context,
        request: ControlLogRequest,
    ) -> Result<HeldReply, tarpc::ServerError> {
        self.held = Arc::default();
        let held = self.held.clone();
        let answer = self.serve().serve(ctx, request).await?;
        let held = std::mem::take(&mut *held.lock().expect("never poisoned"));
        Ok(HeldReply {
            answer,
            _held: held,
        })
    }

    /// Keeps `permit` until this request's answer is written.
    fn hold(&self, permit: OwnedSemaphorePermit) {
        self.held.lock().expect("never poisoned").push(permit);
    }

    /// Holds `bytes` of the connection's answer budget, and of its principal's share and the
    /// port's budget, until this request's answer is written; `Overloaded` when they are not
    /// free now (the answer is dropped, and the client asks again once it has read what it
    /// was sent).
    fn hold_answer(&self, bytes: u64) -> Result<(), ApiError> {
        let bytes = u32::try_from(bytes).unwrap_or(u32::MAX);
        let connection = (self.answer_bytes.clone())
            .try_acquire_many_owned(bytes)
            .map_err(|_| self.overloaded())?;
        self.hold_of_port(bytes)?;
        self.hold(connection);
        Ok(())
    }

    /// Holds `bytes` of the principal's share and of the port's budget until this request's
    /// answer is written; `Overloaded` when they are not free now.
    fn hold_of_port(&self, bytes: u32) -> Result<(), ApiError> {
        let share = self.share.lock().expect("never poisoned").clone();
        let of_share = share
            .map(|share| share.try_acquire_many_owned(bytes))
            .transpose()
            .map_err(|_| self.overloaded())?;
        let of_port = (self.port_answer_bytes.clone())
            .try_acquire_many_owned(bytes)
            .map_err(|_| self.overloaded())?;
        self.hold(of_port);
        if let Some(of_share) = of_share {
            self.hold(of_share);
        }
        Ok(())
    }

    fn overloaded(&self) -> ApiError {
        ApiError::Overloaded {
            in_flight_max: self.in_flight_max,
        }
    }

    /// Admits one request to the connection's budget, held until its answer is written:
    /// refused `Overloaded` when it is full, and `Unauthorized`, closing the connection, once
    /// it failed to authenticate too often.
    fn admit(&self) -> Result<(), ApiError> {
        let failures = self
            .failed_authentications
            .load(std::sync::atomic::Ordering::Relaxed);
        if failures >= AUTHENTICATE_FAILURES_MAX {
            self.hang_up.notify_one();
            return Err(ApiError::Unauthorized(format!(
                "{failures} failed authentications on this connection; closing it"
            )));
        }
        let permit = (self.in_flight.clone())
            .try_acquire_owned()
            .map_err(|_| self.overloaded())?;
        self.hold(permit);
        self.hold_of_port(REQUEST_HELD_BYTES)
    }

    /// `at` encoded, from the port's latest encoding when it is of the same offset.
    fn encoding_of(&self, at: &StateAt) -> Arc<Vec<u8>> {
        let mut latest = self.latest_encoded_state.lock().expect("never poisoned");
        match &*latest {
            Some((offset, encoded)) if *offset == at.offset => encoded.clone(),
            _ => {
                let encoded = Arc::new(crate::log::encode(at));
                *latest = Some((at.offset, encoded.clone()));
                encoded
            }
        }
    }

    /// Holds `bytes` of this connection's append budget until the permit drops; `Overloaded`
    /// when they are not free now.
    fn admit_bytes(&self, bytes: usize) -> Result<OwnedSemaphorePermit, ApiError> {
        let bytes = u32::try_from(bytes.min(self.append_bytes_max)).unwrap_or(u32::MAX);
        self.append_bytes
            .clone()
            .try_acquire_many_owned(bytes)
            .map_err(|_| ApiError::Overloaded {
                in_flight_max: self.in_flight_max,
            })
    }

    /// Whether this connection may do `action` (always, when authentication is off). Refusals
    /// are counted in the metrics.
    fn check(&self, action: Action<'_>) -> Result<(), ApiError> {
        if self.auth.is_none() {
            return Ok(());
        }
        let result = match &*self.principal.lock().expect("never poisoned") {
            None => {
                // A request before authenticating counts toward the hang-up, as a failed
                // `authenticate` does: a connection cannot probe the port for ever.
                self.failed_authentications
                    .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                Err(ApiError::Unauthorized(
                    "present a client certificate the cluster knows, or a token".into(),
                ))
            }
            Some(principal) => authorize(principal, &action),
        };
        if let Err(refusal) = &result {
            self.replica.telemetry().auth_refused(refusal);
        }
        result
    }

    /// Appends `proposal` with its producer id in this connection's principal's own
    /// namespace (see [`Principal::own_producer`]), so that no principal can advance or
    /// replay another's sequences; an answer naming the recorded id names the client's again.
    /// Without authentication the id is recorded as sent.
    async fn append_as_principal(&self, mut proposal: Proposal) -> Result<AppendAck, ApiError> {
        let Some(pair) = proposal.producer.as_mut() else {
            return self.replica.append(proposal).await;
        };
        let sent = pair.producer;
        // Derived under the lock rather than cloning the principal for every append.
        let recorded = (self.principal.lock().expect("never poisoned").as_ref())
            .map(|principal| principal.own_producer(sent));
        let Some(recorded) = recorded else {
            return self.replica.append(proposal).await;
        };
        pair.producer = recorded;
        self.replica
            .append(proposal)
            .await
            .map_err(|error| match error {
                ApiError::SequenceOutOfWindow { seq, lowest, .. } => {
                    ApiError::SequenceOutOfWindow {
                        producer: sent,
                        seq,
                        lowest,
                    }
                }
                ApiError::ProducerForgotten { seq, .. } => ApiError::ProducerForgotten {
                    producer: sent,
                    seq,
                },
                other => other,
            })
    }
}

/// `requested_ms`, clamped below the request's deadline and [`FETCH_WAIT_MAX`].
fn clamp_wait(ctx: &context::Context, requested_ms: u32) -> Duration {
    let until_deadline = ctx
        .deadline
        .saturating_duration_since(Instant::now())
        .saturating_sub(DEADLINE_HEADROOM);
    Duration::from_millis(requested_ms.into())
        .min(until_deadline)
        .min(FETCH_WAIT_MAX)
}

impl ControlLog for ControlLogServer {
    async fn append(self, _: context::Context, proposal: Proposal) -> Result<AppendAck, ApiError> {
        self.admit()?;
        let _bytes = self.admit_bytes(proposal.encoded_len())?;
        self.check(Action::Append(&proposal))?;
        self.append_as_principal(proposal).await
    }

    async fn append_many(
        self,
        _: context::Context,
        proposals: Vec<Proposal>,
    ) -> Result<Vec<Result<AppendAck, ApiError>>, ApiError> {
        self.admit()?;
        let _bytes = self.admit_bytes(proposals.iter().map(Proposal::encoded_len).sum())?;
        if proposals.len() > APPEND_MANY_PROPOSALS_MAX {
            return Err(ApiError::Invalid(format!(
                "{} proposals in one append_many; at most {APPEND_MANY_PROPOSALS_MAX}",
                proposals.len()
            )));
        }
        self.replica
            .telemetry()
            .append_many_received(proposals.len());
        // All are queued at the proposer before any is awaited, so they share a Raft entry.
        let server = &self;
        let appends = proposals.into_iter().map(|proposal| {
            let allowed = server.check(Action::Append(&proposal));
            async move {
                allowed?;
                server.append_as_principal(proposal).await
            }
        });
        Ok(futures::future::join_all(appends).await)
    }

    async fn fetch(
        self,
        ctx: context::Context,
        request: FetchRequest,
    ) -> Result<FetchResponse, ApiError> {
        self.admit()?;
        self.check(Action::Fetch(&request))?;
        let slot = self
            .fetches
            .clone()
            .try_acquire_owned()
            .map_err(|_| ApiError::Overloaded {
                in_flight_max: FETCHES_IN_FLIGHT_MAX as u32,
            })?;
        self.hold(slot);
        let max_wait = clamp_wait(&ctx, request.max_wait_ms);
        let response = self.replica.fetch(&request, max_wait).await?;
        self.hold_answer(bincode::serialized_size(&response).unwrap_or(u64::MAX))?;
        Ok(response)
    }

    async fn state(
        self,
        ctx: context::Context,
        min_offset: Offset,
        max_wait_ms: u32,
    ) -> Result<StateAt, ApiError> {
        self.admit()?;
        self.check(Action::Read)?;
        let at = self
            .replica
            .state(min_offset, clamp_wait(&ctx, max_wait_ms))
            .await?;
        // An answer that cannot be encoded within the frame limit would close the connection
        // and leave the caller retrying; refuse it in words instead. The client reads it in
        // chunks then (a v0.1.0 client, which knows no `state_chunk`, is told `Invalid`).
        let size = bincode::serialized_size(&at).unwrap_or(u64::MAX);
        let limit = self.answer_bytes_max as u64;
        if size > limit {
            return Err(ApiError::AnswerTooLarge { size, limit });
        }
        self.hold_answer(size)?;
        Ok(at)
    }

    async fn state_chunk(
        self,
        ctx: context::Context,
        offset: Offset,
        chunk: u32,
    ) -> Result<StateChunk, ApiError> {
        self.admit()?;
        self.check(Action::Read)?;
        let chunk_bytes = self.answer_bytes_max;
        let (at, encoded) = if chunk == 0 {
            let at = self
                .replica
                .state(offset, clamp_wait(&ctx, STATE_CHUNK_WAIT_MS))
                .await?;
            let encoded = self.encoding_of(&at);
            *self.encoded_state.lock().expect("never poisoned") =
                Some((at.offset, encoded.clone()));
            (at.offset, encoded)
        } else {
            match &*self.encoded_state.lock().expect("never poisoned") {
                Some((at, encoded)) if *at == offset => (*at, encoded.clone()),
                _ => {
                    return Err(ApiError::Invalid(format!(
                        "this connection holds no state as of offset {offset}; \
                         start again from chunk 0"
                    )))
                }
            }
        };
        let chunks = encoded.len().div_ceil(chunk_bytes).max(1) as u32;
        if chunk >= chunks {
            return Err(ApiError::Invalid(format!(
                "chunk {chunk} of a state in {chunks} chunks"
            )));
        }
        let start = chunk as usize * chunk_bytes;
        let end = (start + chunk_bytes).min(encoded.len());
        self.hold_answer((end - start) as u64)?;
        Ok(StateChunk {
            offset: at,
            chunk,
            chunks,
            bytes: encoded[start..end].to_vec(),
        })
    }

    async fn status(self, _: context::Context) -> Result<Status, ApiError> {
        self.admit()?;
        self.check(Action::Read)?;
        let status = self.replica.status();
        self.hold_answer(bincode::serialized_size(&status).unwrap_or(u64::MAX))?;
        Ok(status)
    }

    async fn heartbeat(
        self,
        _: context::Context,
        container: ContainerId,
        epoch: Epoch,
        lag: BTreeMap<TaskId, u64>,
    ) -> Result<HeartbeatAck, ApiError> {
        self.admit()?;
        self.check(Action::Heartbeat(&container))?;
        self.replica.heartbeat(container, epoch, lag)
    }

    async fn add_member(
        self,
        _: context::Context,
        id: NodeId,
        member: Member,
    ) -> Result<(), ApiError> {
        self.admit()?;
        self.check(Action::Membership)?;
        self.replica.add_member(id, member).await
    }

    async fn remove_member(self, _: context::Context, id: NodeId) -> Result<(), ApiError> {
        self.admit()?;
        self.check(Action::Membership)?;
        self.replica.remove_member(id).await
    }

    async fn snapshot(self, _: context::Context) -> Result<Offset, ApiError> {
        self.admit()?;
        self.check(Action::Snapshot)?;
        self.replica.snapshot().await
    }

    async fn hello(self, _: context::Context, offer: ProtocolOffer) -> Result<Hello, ApiError> {
        self.admit()?;
        let hello = Hello::answering(&offer, CLIENT_REQUESTS_AFTER_V010)?;
        self.protocol.store(hello.protocol, Relaxed);
        tracing::debug!(build = %offer.build, protocol = hello.protocol, "client said hello");
        Ok(hello)
    }

    async fn storage_status(self, _: context::Context) -> Result<StorageStatus, ApiError> {
        self.admit()?;
        self.check(Action::Read)?;
        let repairing = self.replica.repairing().map_err(|e| {
            ApiError::Unavailable(format!("this replica cannot read its repair record: {e}"))
        })?;
        Ok(StorageStatus {
            id: self.replica.id(),
            repairing: repairing.map(|r| r.report()),
        })
    }

    async fn transfer_leader(self, _: context::Context, to: NodeId) -> Result<NodeId, ApiError> {
        self.admit()?;
        self.check(Action::Membership)?;
        self.replica.transfer_leader(to).await
    }

    async fn read_index(self, _: context::Context) -> Result<Offset, ApiError> {
        self.admit()?;
        self.check(Action::ConsistentRead)?;
        self.replica.read_index().await
    }

    async fn authenticate(self, _: context::Context, token: String) -> Result<String, ApiError> {
        self.admit()?;
        let Some(auth) = &self.auth else {
            return Ok("anyone (authentication is off)".into());
        };
        match auth.by_token(&token) {
            Some(principal) => {
                let name = principal.name.clone();
                *self.share.lock().expect("never poisoned") =
                    Some(self.shares.of(Some(&principal)));
                *self.principal.lock().expect("never poisoned") = Some(principal);
                self.admission.authenticated();
                self.authenticated.notify_one();
                Ok(name)
            }
            None => {
                let refusal = ApiError::Unauthorized("unknown token".into());
                self.replica.telemetry().auth_refused(&refusal);
                self.failed_authentications
                    .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                Err(refusal)
            }
        }
    }
}
