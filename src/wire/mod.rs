//! What both ports and both sides speak: the client port's protocol (the `ControlLog` tarpc
//! service and the types it carries, [`protocol`]), the version handshake both ports open with
//! ([`version`]), and the framed transport, TLS or plain, with the certificates both ends load
//! ([`tls`]), and the batching accumulator both ends gather appends with ([`batching`]). Below
//! `client` and `raft`: the container library calls this protocol and the
//! replica serves it, and the replica's Raft network dials its peers through the same
//! transport and handshake, so neither has to reach into the other's room for them.
//!
//! The peer port's own service stays in `raft::network`: its messages are openraft's, which a
//! container's build never compiles. No replica's permits or budgets ride in its types (the
//! client port's reply path holds those).
//!
//! The gRPC contract's generated code and its conversions (`grpc`) come with the `server`
//! feature, which serves it and whose tools call it.
//!
//! Builds with the `client` feature alone: no openraft, no sled, no gRPC.

pub mod batching;
#[cfg(feature = "server")]
pub mod grpc;
pub mod protocol;
pub mod tls;
pub mod version;

pub use protocol::{
    ApiError, AppendAck, ClusterId, FetchRequest, FetchResponse, HeartbeatAck, Member,
    MemberStatus, StateAt, StateChunk, Status, ANSWER_ENVELOPE_BYTES_MAX, APPEND_MANY_BYTES_MAX,
    APPEND_MANY_PROPOSALS_MAX, COMMAND_BYTES_MAX_ANY_REPLICA,
};
