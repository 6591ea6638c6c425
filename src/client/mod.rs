//! The container's side: the wire protocol, a client that finds the leader by itself, and
//! subscriptions that resume across failures.
//!
//! Builds with `default-features = false, features = ["client"]`: it depends on `log`, `jobs`
//! and tarpc only, never on openraft or sled. See [`ControlClient`] for a container's loop.

mod connection;
mod protocol;
mod sequences;
mod session;
mod subscription;
pub mod tls;

pub use connection::{
    ClientError, ClientOptions, ControlClient, CLIENT_FRAME_BYTES_MAX, REQUEST_TIMEOUT,
    RETRY_DEADLINE,
};
pub use protocol::*;
pub use session::{ContainerSession, SessionOptions};
pub use subscription::{Subscription, SubscriptionItem, LONG_POLL_WAIT};
