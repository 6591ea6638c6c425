//! The container's side: the wire protocol and a client that finds the leader by itself.
//!
//! Builds with `default-features = false, features = ["client"]`: it depends on `log`, `jobs`
//! and tarpc only, never on openraft or sled.
//!
//! ```no_run
//! # async fn example() -> Result<(), ctrlog::client::ClientError> {
//! use ctrlog::client::ControlClient;
//! use ctrlog::log::Command;
//!
//! let client = ControlClient::connect(&["127.0.0.1:7101".to_string()]).await?;
//! let outcome = client.append(Command::custom(1, 1, b"hello".to_vec())).await?;
//! println!("appended: {outcome:?}");
//! # Ok(()) }
//! ```

mod connection;
mod protocol;

pub use connection::{ClientError, ControlClient};
pub use protocol::*;
