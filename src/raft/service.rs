//! The `ControlLog` service on the client port, served from a [`ReplicaHandle`].
//!
//! Each connection is its own tarpc channel with a bound on in-flight requests. A connection
//! that sends a frame above the limit or bytes that do not decode is closed by its transport;
//! nothing else is affected, and nothing is applied from it.

use std::net::SocketAddr;

use futures::StreamExt;
use tarpc::server::{BaseChannel, Channel};
use tarpc::tokio_serde::formats::Bincode;
use tarpc::{context, ClientMessage, Response};

use super::node::ReplicaHandle;
use crate::client::{
    ApiError, AppendResult, ControlLog, ControlLogRequest, ControlLogResponse, FetchRequest,
    FetchResponse, Member, Status,
};
use crate::log::Proposal;
use crate::NodeId;

type Request = ClientMessage<ControlLogRequest>;
type Reply = Response<ControlLogResponse>;

/// A bound, not yet serving, client listener.
pub type ClientListener = tarpc::serde_transport::tcp::Incoming<
    Request,
    Reply,
    Bincode<Request, Reply>,
    fn() -> Bincode<Request, Reply>,
>;

/// Binds the client port with the given frame limit.
pub async fn bind_clients(
    addr: SocketAddr,
    frame_bytes_max: usize,
) -> std::io::Result<ClientListener> {
    let mut listener = tarpc::serde_transport::tcp::listen(
        addr,
        Bincode::default as fn() -> Bincode<Request, Reply>,
    )
    .await?;
    listener.config_mut().max_frame_length(frame_bytes_max);
    Ok(listener)
}

/// Serves clients until aborted.
pub async fn serve_clients(
    listener: ClientListener,
    replica: ReplicaHandle,
    requests_in_flight_max: usize,
) {
    listener
        .filter_map(|conn| async move {
            match conn {
                Ok(conn) => Some(conn),
                Err(error) => {
                    tracing::warn!(%error, "accepting a client connection failed");
                    None
                }
            }
        })
        .for_each_concurrent(None, |transport| {
            let server = ControlLogServer {
                replica: replica.clone(),
            };
            async move {
                BaseChannel::with_defaults(transport)
                    .max_concurrent_requests(requests_in_flight_max)
                    .execute(server.serve())
                    .for_each(|response| async move {
                        tokio::spawn(response);
                    })
                    .await;
            }
        })
        .await;
}

#[derive(Clone)]
struct ControlLogServer {
    replica: ReplicaHandle,
}

impl ControlLog for ControlLogServer {
    async fn append(self, _: context::Context, proposal: Proposal) -> AppendResult {
        self.replica.append(proposal).await
    }

    async fn fetch(
        self,
        _: context::Context,
        request: FetchRequest,
    ) -> Result<FetchResponse, ApiError> {
        self.replica.fetch(&request)
    }

    async fn status(self, _: context::Context) -> Status {
        self.replica.status()
    }

    async fn add_member(
        self,
        _: context::Context,
        id: NodeId,
        member: Member,
    ) -> Result<(), ApiError> {
        self.replica.add_member(id, member).await
    }

    async fn remove_member(self, _: context::Context, id: NodeId) -> Result<(), ApiError> {
        self.replica.remove_member(id).await
    }
}
