//! The container's side: the wire protocol, a client that finds the leader by itself, and
//! subscriptions that resume across failures.
//!
//! Builds with `default-features = false, features = ["client"]`: it depends on `log`, `jobs`
//! and tarpc only, never on openraft or sled. See [`ControlClient`] for a container's loop.

mod connection;
mod sequences;
mod session;
mod subscription;

pub use crate::wire::{tls, version};

pub use crate::wire::protocol::{
    ApiError, AppendAck, FetchRequest, FetchResponse, HeartbeatAck, Member, MemberStatus,
    Repairing, StateAt, StateChunk, Status, StorageStatus, ANSWER_ENVELOPE_BYTES_MAX,
    APPEND_MANY_BYTES_MAX, APPEND_MANY_PROPOSALS_MAX, COMMAND_BYTES_MAX_ANY_REPLICA,
};
/// The wire service and tarpc's generated stubs, for the replica that serves it and for
/// tests that speak the raw protocol; not part of the client's API.
#[doc(hidden)]
pub use crate::wire::protocol::{
    ControlLog, ControlLogClient, ControlLogRequest, ControlLogResponse, ServeControlLog,
};
pub use connection::{
    ClientError, ClientOptions, ControlClient, CLIENT_FRAME_BYTES_MAX, CONNECT_TIMEOUT,
    OPTION_DURATION_MAX, REQUEST_TIMEOUT, RETRY_DEADLINE,
};
pub use session::{ContainerSession, SessionOptions};
pub use subscription::{Subscription, SubscriptionItem, LONG_POLL_WAIT};
