//! The replica's listening ports and what guards them: the client port ([`client`]) and the
//! gRPC port ([`grpc`]), which serve callers by one set of rules ([`calls`]), the peer port
//! ([`peer`]), the observability port ([`http`], and [`page_access`], who may see the status
//! page), the one accept loop with its connection limits (`connections`, `guarded`), TLS
//! ([`tls`]) and credentials ([`auth`]).

pub mod auth;
pub mod calls;
pub mod client;
pub(in crate::server) mod connections;
pub mod grpc;
pub(in crate::server) mod guarded;
pub mod http;
pub(in crate::server) mod http_admission;
pub mod page_access;
pub mod peer;
pub mod tls;
