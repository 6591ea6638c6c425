//! The gRPC port: `proto/ctrlog/v1`'s `ControlLog` and `Operator` services, with the standard
//! `grpc.health.v1.Health` and server reflection, on HTTP/2.
//!
//! Its connections come through the same accept loop as the client port's
//! (`connections::serve_each_connection`: TLS, the port's connection and unauthenticated-connection
//! limits, idle timeouts), and each is one [`Caller`] ([`calls`](super::calls)): the same
//! credentials, roles, budgets and leader-only rules as the tarpc port, by the same code.
//! What this module adds is the translation: messages to ctrlog's types and back
//! ([`crate::wire::grpc`]), refusals to gRPC status codes with their typed detail, a token
//! read from each call's `authorization: Bearer` metadata, and `Subscribe` as a server stream
//! of long polls.
//!
//! What a request holds of the budgets is given back once its answer has been handed to
//! HTTP/2; a subscription's next fetch is made only once its previous reply was taken, and
//! HTTP/2 flow control takes no more than the stream's window from a reader that stops
//! reading, so such a reader pins one reply and a window, never the log.

use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use futures::{Stream, StreamExt};
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use tokio_rustls::TlsAcceptor;
use tonic::{Request, Response, Status};

use crate::log::Offset;
use crate::server::handle::ReplicaHandle;
use crate::server::ports::auth::Authenticator;
use crate::server::ports::calls::{Caller, CallerPort, ConnectionBudget};
use crate::server::ports::connections::{serve_each_connection, Framing};
use crate::wire::grpc::{self, pb};
use crate::wire::protocol::{ApiError, FetchRequest, Member, APPEND_MANY_PROPOSALS_MAX};

/// A bound, not yet serving, gRPC listener.
pub struct GrpcListener {
    listener: tokio::net::TcpListener,
}

impl GrpcListener {
    pub fn local_addr(&self) -> std::io::Result<SocketAddr> {
        self.listener.local_addr()
    }
}

/// Binds the gRPC port at `addr`.
pub async fn bind_grpc(addr: SocketAddr) -> std::io::Result<GrpcListener> {
    Ok(GrpcListener {
        listener: tokio::net::TcpListener::bind(addr).await?,
    })
}

/// What the gRPC port may hold: the client port's budgets, and the largest message it
/// decodes (the client port's frame limit).
#[derive(Clone, Debug)]
pub struct GrpcPortConfig {
    pub budget: ConnectionBudget,
    pub message_bytes_max: usize,
}

/// Most entries a `Subscribe` reply carries, whatever the request asks.
pub const SUBSCRIBE_ENTRIES_MAX: u32 = 4_096;

/// How long each fetch of a subscription waits for a new entry before it asks again; the
/// stream itself lasts as long as the call.
const SUBSCRIBE_POLL: Duration = Duration::from_secs(30);

/// How often the health service looks at the replica's readiness.
const HEALTH_INTERVAL: Duration = Duration::from_millis(500);

/// The name of the `ControlLog` service in the health service (`grpc.health.v1`); the empty
/// name says the same.
const HEALTH_SERVICE: &str = "ctrlog.v1.ControlLog";

/// Serves gRPC until `stop` fires, over TLS when `tls` is given (it must offer `h2` by ALPN).
pub async fn serve_grpc(
    listener: GrpcListener,
    replica: ReplicaHandle,
    config: GrpcPortConfig,
    tls: Option<TlsAcceptor>,
    auth: Option<Arc<Authenticator>>,
    stop: tokio::sync::watch::Receiver<bool>,
) {
    let port = Arc::new(CallerPort::new(replica.clone(), config.budget, auth));
    let (health_reporter, health) = tonic_health::server::health_reporter();
    tokio::spawn(report_health(replica, health_reporter, stop.clone()));
    // Both versions of the reflection protocol: grpcurl speaks v1, older clients v1alpha.
    let reflection = || {
        tonic_reflection::server::Builder::configure()
            .register_encoded_file_descriptor_set(pb::FILE_DESCRIPTOR_SET)
            .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
    };
    let reflection_v1 = (reflection().build_v1()).expect("descriptors generated at build time");
    let reflection_v1alpha =
        (reflection().build_v1alpha()).expect("descriptors generated at build time");
    let message_bytes_max = config.message_bytes_max;
    let limits = port.budget().port.clone();
    // A subscriber of a quiet log sends nothing, and the port closes a connection idle for
    // `idle_timeout`: HTTP/2 pings, which it answers, keep a live one open.
    let ping_every = limits.idle_timeout / 3;
    serve_each_connection(
        "gRPC",
        Framing::Http2,
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
            let calls = GrpcCalls {
                caller: caller.clone(),
            };
            let routes = tonic::service::Routes::new(
                pb::control_log_server::ControlLogServer::new(calls.clone())
                    .max_decoding_message_size(message_bytes_max)
                    .max_encoding_message_size(usize::MAX),
            )
            .add_service(
                pb::operator_server::OperatorServer::new(calls)
                    .max_decoding_message_size(message_bytes_max),
            )
            .add_service(health.clone())
            .add_service(reflection_v1.clone())
            .add_service(reflection_v1alpha.clone())
            .prepare();
            let port = port.clone();
            async move {
                let service = hyper_util::service::TowerToHyperService::new(routes);
                let connection = hyper::server::conn::http2::Builder::new(TokioExecutor::new())
                    .timer(TokioTimer::new())
                    .keep_alive_interval(ping_every)
                    .keep_alive_timeout(ping_every)
                    .serve_connection(TokioIo::new(accepted.stream), service);
                tokio::select! {
                    // Checked first at every wake-up: once a request has called for the hang-up,
                    // no later request on the connection is read, let alone answered.
                    biased;
                    _ = port.refused(&caller) => {}
                    _ = connection => {}
                }
                // The connection ends when the peer hangs up or sends what does not decode (or
                // exceeds a limit); only this connection is affected.
                tracing::debug!(peer = %accepted.peer, "gRPC connection closed");
            }
        },
    )
    .await;
}

/// Keeps the health service's answer to the replica's readiness (the same as `/readyz`).
async fn report_health(
    replica: ReplicaHandle,
    reporter: tonic_health::server::HealthReporter,
    mut stop: tokio::sync::watch::Receiver<bool>,
) {
    let mut serving = None;
    loop {
        let ready = replica.readiness().is_ok();
        if serving != Some(ready) {
            let status = if ready {
                tonic_health::ServingStatus::Serving
            } else {
                tonic_health::ServingStatus::NotServing
            };
            for service in ["", HEALTH_SERVICE] {
                reporter.set_service_status(service, status).await;
            }
            serving = Some(ready);
        }
        tokio::select! {
            _ = tokio::time::sleep(HEALTH_INTERVAL) => {}
            _ = stop.changed() => return,
        }
    }
}

/// One connection's gRPC services, over its [`Caller`].
#[derive(Clone)]
struct GrpcCalls {
    caller: Caller,
}

type Answer<T> = Result<Response<T>, Status>;

impl GrpcCalls {
    /// The caller for one call: a clone holding nothing yet, authenticated by the call's
    /// token if it carries one (a wrong one is refused, and counts toward the hang-up).
    fn caller_of<T>(&self, request: &Request<T>) -> Result<Caller, Status> {
        let caller = self.caller.for_request();
        if let Some(value) = request.metadata().get("authorization") {
            let token = value
                .to_str()
                .ok()
                .and_then(|value| value.strip_prefix("Bearer "))
                .ok_or_else(|| {
                    refusal(
                        &caller,
                        ApiError::Unauthorized(
                            "the `authorization` metadata is not `Bearer <token>`".into(),
                        ),
                    )
                })?;
            caller
                .authenticate(token.trim())
                .map_err(|e| refusal(&caller, e))?;
        }
        Ok(caller)
    }
}

/// `error` as a gRPC status; a `NotLeader` names the leader's gRPC port when this replica
/// knows it.
fn refusal(caller: &Caller, error: ApiError) -> Status {
    let leader_grpc_addr = match &error {
        ApiError::NotLeader {
            leader_id: Some(leader),
            ..
        } => caller.replica().grpc_addr_of(*leader),
        _ => None,
    };
    grpc::status_of(&error, leader_grpc_addr)
}

/// Answers `result` as a call's reply or its refusal.
fn answer<T, U: From<T>>(caller: &Caller, result: Result<T, ApiError>) -> Answer<U> {
    result
        .map(|ok| Response::new(U::from(ok)))
        .map_err(|error| refusal(caller, error))
}

type Parts<T> = Pin<Box<dyn Stream<Item = Result<T, Status>> + Send>>;

#[tonic::async_trait]
impl pb::control_log_server::ControlLog for GrpcCalls {
    async fn join(&self, request: Request<pb::JoinRequest>) -> Answer<pb::JoinReply> {
        let caller = self.caller_of(&request)?;
        let result = match grpc::join(request.into_inner()) {
            Ok(proposal) => caller.append(proposal).await,
            Err(invalid) => Err(invalid),
        };
        let result = result.map(|ack| pb::JoinReply {
            epoch: ack.offset,
            duplicate: ack.duplicate,
        });
        answer(&caller, result)
    }

    async fn heartbeat(
        &self,
        request: Request<pb::HeartbeatRequest>,
    ) -> Answer<pb::HeartbeatReply> {
        let caller = self.caller_of(&request)?;
        let request = request.into_inner();
        let result = (|| {
            let container = grpc::container(request.container)?;
            caller.heartbeat(container, request.epoch, grpc::lag(request.lag)?)
        })();
        let result = result.map(|ack| pb::HeartbeatReply {
            applied_offset: ack.applied_offset,
        });
        answer(&caller, result)
    }

    type SubscribeStream = Parts<pb::SubscribeReply>;

    async fn subscribe(
        &self,
        request: Request<pb::SubscribeRequest>,
    ) -> Answer<Self::SubscribeStream> {
        let caller = self.caller_of(&request)?;
        let request = request.into_inner();
        let filter = grpc::filter(request.container).map_err(|e| refusal(&caller, e))?;
        let fetch = FetchRequest {
            from: request.from.max(1),
            entries_max: match request.entries_max {
                0 => 1_024,
                n => n.min(SUBSCRIBE_ENTRIES_MAX),
            },
            bytes_max: match request.bytes_max {
                0 => u32::MAX,
                n => n,
            },
            max_wait_ms: SUBSCRIBE_POLL.as_millis() as u32,
            linger_ms: 0,
            filter,
        };
        // The first fetch answers here, so that a refusal (compacted, forbidden) is the
        // call's status rather than the first item of a stream.
        let (first, held) = fetch_once(&caller, &fetch, Duration::ZERO).await;
        let first = first.map_err(|e| refusal(&caller, e))?;
        let stream = futures::stream::unfold(
            Subscription {
                caller,
                fetch,
                first: Some(first),
                held,
                ended: false,
            },
            |mut at| async move {
                if at.ended {
                    return None;
                }
                // What the previous reply held is given back now: HTTP/2 has taken it.
                at.held.clear();
                let reply = match at.first.take() {
                    Some(first) => Ok(first),
                    None => {
                        let (reply, held) = fetch_once(&at.caller, &at.fetch, SUBSCRIBE_POLL).await;
                        at.held = held;
                        reply
                    }
                };
                match reply {
                    Ok(reply) => {
                        at.fetch.from = reply.next_offset;
                        Some((Ok(reply), at))
                    }
                    // Too much in flight: ask again shortly rather than end the stream.
                    Err(ApiError::Overloaded { .. }) => {
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        let from = at.fetch.from;
                        let empty = pb::SubscribeReply {
                            entries: Vec::new(),
                            next_offset: from,
                            applied_offset: at.caller.replica().applied_offset(),
                        };
                        Some((Ok(empty), at))
                    }
                    Err(error) => {
                        at.ended = true;
                        let status = refusal(&at.caller, error);
                        Some((Err(status), at))
                    }
                }
            },
        );
        Ok(Response::new(Box::pin(stream)))
    }

    async fn append(&self, request: Request<pb::AppendRequest>) -> Answer<pb::AppendReply> {
        let caller = self.caller_of(&request)?;
        let result = match crate::log::Proposal::try_from(request.into_inner()) {
            Ok(proposal) => caller.append(proposal).await,
            Err(invalid) => Err(invalid),
        };
        answer(&caller, result)
    }

    async fn append_many(
        &self,
        request: Request<pb::AppendManyRequest>,
    ) -> Answer<pb::AppendManyReply> {
        let caller = self.caller_of(&request)?;
        let appends = request.into_inner().appends;
        if appends.len() > APPEND_MANY_PROPOSALS_MAX {
            let error = ApiError::Invalid(format!(
                "{} appends in one AppendMany; at most {APPEND_MANY_PROPOSALS_MAX}",
                appends.len()
            ));
            return Err(refusal(&caller, error));
        }
        // A malformed append is refused on its own; the others are appended together.
        let converted: Vec<Result<crate::log::Proposal, ApiError>> = appends
            .into_iter()
            .map(crate::log::Proposal::try_from)
            .collect();
        let proposals = converted
            .iter()
            .filter_map(|c| c.as_ref().ok().cloned())
            .collect();
        let mut acks = caller
            .append_many(proposals)
            .await
            .map_err(|e| refusal(&caller, e))?
            .into_iter();
        let results = converted
            .into_iter()
            .map(|converted| {
                let result = match converted {
                    Ok(_) => acks.next().expect("one answer per proposal"),
                    Err(invalid) => Err(invalid),
                };
                pb::AppendResult {
                    result: Some(match result {
                        Ok(ack) => pb::append_result::Result::Appended(ack.into()),
                        Err(error) => {
                            pb::append_result::Result::Refused(grpc::error_detail(&error))
                        }
                    }),
                }
            })
            .collect();
        Ok(Response::new(pb::AppendManyReply { results }))
    }

    async fn leave(&self, request: Request<pb::LeaveRequest>) -> Answer<pb::AppendReply> {
        let caller = self.caller_of(&request)?;
        let result = match grpc::leave(request.into_inner()) {
            Ok(proposal) => caller.append(proposal).await,
            Err(invalid) => Err(invalid),
        };
        answer(&caller, result)
    }

    type StateStream = Parts<pb::StatePart>;

    async fn state(&self, request: Request<pb::StateRequest>) -> Answer<Self::StateStream> {
        let caller = self.caller_of(&request)?;
        let request = request.into_inner();
        let mut min_offset: Offset = request.min_offset;
        if request.consistent {
            let read_index = caller.read_index().await.map_err(|e| refusal(&caller, e))?;
            min_offset = min_offset.max(read_index);
            // One request's budget each: the read index's is given back before the state's.
            drop(caller.take_held());
        }
        let wait = Duration::from_millis(request.max_wait_ms.into());
        let at = caller
            .state(
                min_offset,
                wait.min(crate::server::ports::calls::FETCH_WAIT_MAX),
            )
            .await
            .map_err(|e| refusal(&caller, e))?;
        let parts = grpc::state_parts(at.offset, &at.state);
        let held = caller.take_held();
        // What the request holds is given back once the stream is done with.
        let stream = futures::stream::iter(parts).map(move |part| {
            let _held = &held;
            Ok(part)
        });
        Ok(Response::new(Box::pin(stream)))
    }

    async fn read_index(
        &self,
        request: Request<pb::ReadIndexRequest>,
    ) -> Answer<pb::ReadIndexReply> {
        let caller = self.caller_of(&request)?;
        let result = caller
            .read_index()
            .await
            .map(|offset| pb::ReadIndexReply { offset });
        answer(&caller, result)
    }

    async fn status(&self, request: Request<pb::StatusRequest>) -> Answer<pb::StatusReply> {
        let caller = self.caller_of(&request)?;
        let result = caller.status().map(|status| {
            let mut reply = pb::StatusReply::from(status);
            for member in &mut reply.members {
                member.grpc_addr = caller.replica().grpc_addr_of(member.id);
            }
            reply
        });
        answer(&caller, result)
    }
}

/// A `Subscribe` stream between two replies.
struct Subscription {
    caller: Caller,
    fetch: FetchRequest,
    first: Option<pb::SubscribeReply>,
    held: Vec<tokio::sync::OwnedSemaphorePermit>,
    ended: bool,
}

/// One fetch of a subscription, as its reply, with what it holds of the budgets until the
/// reply has been taken.
async fn fetch_once(
    caller: &Caller,
    fetch: &FetchRequest,
    wait: Duration,
) -> (
    Result<pb::SubscribeReply, ApiError>,
    Vec<tokio::sync::OwnedSemaphorePermit>,
) {
    let caller = caller.for_request();
    let reply = async {
        let response = caller.fetch(fetch, wait).await?;
        let reply = pb::SubscribeReply {
            entries: response.entries.iter().map(pb::Entry::from).collect(),
            next_offset: response.next_offset,
            applied_offset: response.applied_offset,
        };
        caller.hold_answer(prost::Message::encoded_len(&reply) as u64)?;
        Ok(reply)
    }
    .await;
    (reply, caller.take_held())
}

#[tonic::async_trait]
impl pb::operator_server::Operator for GrpcCalls {
    async fn storage_status(
        &self,
        request: Request<pb::StorageStatusRequest>,
    ) -> Answer<pb::StorageStatusReply> {
        let caller = self.caller_of(&request)?;
        answer(&caller, caller.storage_status())
    }

    async fn add_member(
        &self,
        request: Request<pb::AddMemberRequest>,
    ) -> Answer<pb::MembershipReply> {
        let caller = self.caller_of(&request)?;
        let request = request.into_inner();
        let member = Member {
            peer_addr: request.peer_addr,
            client_addr: request.client_addr,
        };
        let result = caller.add_member(request.id, member).await;
        answer(&caller, result.map(|()| pb::MembershipReply {}))
    }

    async fn remove_member(
        &self,
        request: Request<pb::RemoveMemberRequest>,
    ) -> Answer<pb::MembershipReply> {
        let caller = self.caller_of(&request)?;
        let result = caller.remove_member(request.into_inner().id).await;
        answer(&caller, result.map(|()| pb::MembershipReply {}))
    }

    async fn transfer_leader(
        &self,
        request: Request<pb::TransferLeaderRequest>,
    ) -> Answer<pb::TransferLeaderReply> {
        let caller = self.caller_of(&request)?;
        let result = caller.transfer_leader(request.into_inner().to).await;
        answer(
            &caller,
            result.map(|leader| pb::TransferLeaderReply { leader }),
        )
    }

    async fn snapshot(&self, request: Request<pb::SnapshotRequest>) -> Answer<pb::SnapshotReply> {
        let caller = self.caller_of(&request)?;
        let result = caller.snapshot().await;
        answer(&caller, result.map(|offset| pb::SnapshotReply { offset }))
    }
}
