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
use tokio::sync::OwnedSemaphorePermit;
use tokio_rustls::TlsAcceptor;

use crate::log::{ContainerId, Epoch, Offset, Proposal, TaskId};
use crate::server::config::ClientPortConfig;
use crate::server::handle::ReplicaHandle;
use crate::server::ports::auth::{Action, Authenticator};
pub use crate::server::ports::calls::ConnectionBudget;
use crate::server::ports::calls::{Caller, CallerPort, FETCH_WAIT_MAX};
use crate::server::ports::connections::{serve_each_connection, Framing};
use crate::wire::protocol::{
    ApiError, AppendAck, ControlLog, ControlLogRequest, ControlLogResponse, FetchRequest,
    FetchResponse, HeartbeatAck, Member, StateAt, StateChunk, Status, StorageStatus,
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

/// How long the first `state_chunk` waits for the replica to apply the offset asked for.
const STATE_CHUNK_WAIT_MS: u32 = 5_000;

/// A long poll answers this long before the request's deadline, so that the answer (possibly
/// empty) reaches the caller before it gives up on the request.
const DEADLINE_HEADROOM: Duration = Duration::from_millis(250);

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
    let port = Arc::new(CallerPort::new(replica, budget, auth));
    let latest_encoded_state: Arc<std::sync::Mutex<Option<EncodedState>>> = Arc::default();
    let limits = port.budget().port.clone();
    serve_each_connection(
        "client",
        Framing::LengthPrefixed,
        listener.listener,
        tls,
        limits,
        stop,
        move |accepted| {
            let caller = port.caller(
                accepted.peer,
                accepted.peer_certificate.as_ref(),
                accepted.admission,
            );
            let server = ControlLogServer {
                caller: caller.clone(),
                answer_bytes_max,
                encoded_state: Arc::default(),
                latest_encoded_state: latest_encoded_state.clone(),
                protocol: Arc::new(AtomicU16::new(PROTOCOL_V010)),
            };
            let protocol = server.protocol.clone();
            let port = port.clone();
            async move {
                // Every answer leaves in a form the connection's protocol decodes, and gives back
                // what it held of the budgets once the transport has taken it.
                let transport = framed::<_, Request, Reply>(accepted.stream, frame_bytes_max).with(
                    move |reply: Response<HeldReply>| {
                        let reply = Reply {
                            request_id: reply.request_id,
                            message: reply.message.map(|held| held.answer),
                        };
                        futures::future::ready(Ok(for_protocol(reply, protocol.load(Relaxed))))
                    },
                );
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
                    _ = port.refused(&caller) => {}
                    _ = serving => {}
                }
                // The connection ends when the peer hangs up or sends what does not decode (or
                // exceeds a limit); only this connection is affected.
                tracing::debug!(peer = %accepted.peer, "client connection closed");
            }
        },
    )
    .await;
}

/// A job state encoded for `state_chunk`, with the offset it is as of.
type EncodedState = (Offset, Arc<Vec<u8>>);

/// The tarpc face of one connection's [`Caller`], with what only this port has: bincode
/// frames (the answer limit, `state_chunk`'s encodings) and the `hello` that picks a protocol.
#[derive(Clone)]
struct ControlLogServer {
    caller: Caller,
    /// What one answer may carry: the port's frame limit less the envelope
    /// (`ClientPortConfig::answer_bytes_max`).
    answer_bytes_max: usize,
    /// The encoded state this connection is reading in chunks, and the offset it is as of.
    encoded_state: Arc<std::sync::Mutex<Option<EncodedState>>>,
    /// The latest state any connection of the port encoded for `state_chunk`: connections
    /// reading one offset share one encoding instead of one each.
    latest_encoded_state: Arc<std::sync::Mutex<Option<EncodedState>>>,
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
        self.caller = self.caller.for_request();
        let caller = self.caller.clone();
        let answer = self.serve().serve(ctx, request).await?;
        Ok(HeldReply {
            answer,
            _held: caller.take_held(),
        })
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
        self.caller.append(proposal).await
    }

    async fn append_many(
        self,
        _: context::Context,
        proposals: Vec<Proposal>,
    ) -> Result<Vec<Result<AppendAck, ApiError>>, ApiError> {
        self.caller.append_many(proposals).await
    }

    async fn fetch(
        self,
        ctx: context::Context,
        request: FetchRequest,
    ) -> Result<FetchResponse, ApiError> {
        let max_wait = clamp_wait(&ctx, request.max_wait_ms);
        let response = self.caller.fetch(&request, max_wait).await?;
        (self.caller).hold_answer(bincode::serialized_size(&response).unwrap_or(u64::MAX))?;
        Ok(response)
    }

    async fn state(
        self,
        ctx: context::Context,
        min_offset: Offset,
        max_wait_ms: u32,
    ) -> Result<StateAt, ApiError> {
        let at = (self.caller)
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
        self.caller.hold_answer(size)?;
        Ok(at)
    }

    async fn state_chunk(
        self,
        ctx: context::Context,
        offset: Offset,
        chunk: u32,
    ) -> Result<StateChunk, ApiError> {
        let chunk_bytes = self.answer_bytes_max;
        let (at, encoded) = if chunk == 0 {
            let at = (self.caller)
                .state(offset, clamp_wait(&ctx, STATE_CHUNK_WAIT_MS))
                .await?;
            let encoded = self.encoding_of(&at);
            *self.encoded_state.lock().expect("never poisoned") =
                Some((at.offset, encoded.clone()));
            (at.offset, encoded)
        } else {
            self.caller.admit()?;
            self.caller.check(Action::Read)?;
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
        self.caller.hold_answer((end - start) as u64)?;
        Ok(StateChunk {
            offset: at,
            chunk,
            chunks,
            bytes: encoded[start..end].to_vec(),
        })
    }

    async fn status(self, _: context::Context) -> Result<Status, ApiError> {
        let status = self.caller.status()?;
        (self.caller).hold_answer(bincode::serialized_size(&status).unwrap_or(u64::MAX))?;
        Ok(status)
    }

    async fn heartbeat(
        self,
        _: context::Context,
        container: ContainerId,
        epoch: Epoch,
        lag: BTreeMap<TaskId, u64>,
    ) -> Result<HeartbeatAck, ApiError> {
        self.caller.heartbeat(container, epoch, lag)
    }

    async fn add_member(
        self,
        _: context::Context,
        id: NodeId,
        member: Member,
    ) -> Result<(), ApiError> {
        self.caller.add_member(id, member).await
    }

    async fn remove_member(self, _: context::Context, id: NodeId) -> Result<(), ApiError> {
        self.caller.remove_member(id).await
    }

    async fn snapshot(self, _: context::Context) -> Result<Offset, ApiError> {
        self.caller.snapshot().await
    }

    async fn hello(self, _: context::Context, offer: ProtocolOffer) -> Result<Hello, ApiError> {
        self.caller.admit()?;
        let hello = Hello::answering(&offer, CLIENT_REQUESTS_AFTER_V010)?;
        self.protocol.store(hello.protocol, Relaxed);
        tracing::debug!(build = %offer.build, protocol = hello.protocol, "client said hello");
        Ok(hello)
    }

    async fn storage_status(self, _: context::Context) -> Result<StorageStatus, ApiError> {
        self.caller.storage_status()
    }

    async fn transfer_leader(self, _: context::Context, to: NodeId) -> Result<NodeId, ApiError> {
        self.caller.transfer_leader(to).await
    }

    async fn read_index(self, _: context::Context) -> Result<Offset, ApiError> {
        self.caller.read_index().await
    }

    async fn authenticate(self, _: context::Context, token: String) -> Result<String, ApiError> {
        self.caller.admit()?;
        self.caller.authenticate(&token)
    }
}
