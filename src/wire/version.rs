//! The version handshake both ports share (after Kafka's ApiVersions): the first request on a
//! connection, `hello`, offers the range of protocol versions its sender speaks; the answer
//! names the version the connection then speaks (the highest both know), the optional
//! requests the server serves and the server's build.
//!
//! v0.1.0 has no `hello`. It closes a connection that sends one (the request does not decode),
//! so a caller whose `hello` finds its connection closed dials again and speaks
//! [`PROTOCOL_V010`] without it; and a server serves a connection that sent no `hello` at
//! [`PROTOCOL_V010`], which is how a v0.1.0 client or peer is recognised. A version this build
//! does not know is refused with [`ApiError::ProtocolUnsupported`], naming both ranges.
//!
//! What each version adds, per port:
//!
//! | version | client port | peer port |
//! |---|---|---|
//! | 1 | v0.1.0's requests and answers | v0.1.0's Raft requests |
//! | 2 | `hello`, `state_chunk`; `ApiError` variants from `AnswerTooLarge` on | `hello` (which says the build's highest vocabulary level) |
//!
//! Requests added since without a new version, listed in `hello`'s answer (a caller asks a
//! server for one only if its `hello` offers it): `storage_status`, `read_index` and
//! `transfer_leader` on the client port;
//! `introduce` on the peer port (the caller's cluster id, compared with the server's), and
//! `take_over` (a stopping leader hands over to a follower) and `stand_back` (it tells the
//! other voters whom it hands over to).

use std::ops::RangeInclusive;

use super::protocol::ApiError;
pub use super::protocol::{Hello, ProtocolOffer};
use crate::log::vocabulary::LEVEL_MAX;
use crate::log::Level;

/// The protocol of v0.1.0 on either port: what a connection that sends no `hello` speaks.
pub const PROTOCOL_V010: u16 = 1;

/// The protocol versions this build speaks on either port.
pub const PROTOCOLS: RangeInclusive<u16> = PROTOCOL_V010..=2;

/// The highest vocabulary level v0.1.0 knows: what a peer that answers no `hello` supports.
pub const V010_LEVEL_MAX: Level = 2;

/// The client port's requests added after v0.1.0, which a `hello` answer lists.
pub const CLIENT_REQUESTS_AFTER_V010: &[&str] = &[
    "state_chunk",
    "hello",
    "storage_status",
    "read_index",
    "transfer_leader",
];

/// The peer port's requests added after v0.1.0, which a `hello` answer lists.
pub const PEER_REQUESTS_AFTER_V010: &[&str] =
    &["hello", "introduce", "take_over", "stand_back", "grpc_addr"];

/// This build, as a `hello` names it.
pub const BUILD: &str = concat!("ctrlog ", env!("CARGO_PKG_VERSION"));

impl ProtocolOffer {
    /// What this build offers.
    pub fn ours() -> ProtocolOffer {
        ProtocolOffer {
            min: *PROTOCOLS.start(),
            max: *PROTOCOLS.end(),
            build: BUILD.to_string(),
        }
    }

    /// The version a connection between this offer and `theirs` speaks: the highest both
    /// know. `ProtocolUnsupported` (naming both ranges) when the ranges do not meet.
    pub fn agree(&self, theirs: &ProtocolOffer) -> Result<u16, ApiError> {
        let version = self.max.min(theirs.max);
        if version < self.min.max(theirs.min) || theirs.min > theirs.max {
            return Err(ApiError::ProtocolUnsupported {
                offered_min: theirs.min,
                offered_max: theirs.max,
                supported_min: self.min,
                supported_max: self.max,
            });
        }
        Ok(version)
    }
}

impl Hello {
    /// This build's answer to `offer` on a port whose requests added after v0.1.0 are
    /// `requests`; `ProtocolUnsupported` when the offer's range does not meet this build's.
    pub fn answering(offer: &ProtocolOffer, requests: &[&str]) -> Result<Hello, ApiError> {
        let ours = ProtocolOffer::ours();
        Ok(Hello {
            protocol: ours.agree(offer)?,
            server: ours,
            requests: requests.iter().map(|r| r.to_string()).collect(),
            vocabulary_level_max: LEVEL_MAX,
        })
    }

    /// What a server that answered no `hello` (v0.1.0) speaks.
    pub fn v010() -> Hello {
        Hello {
            protocol: PROTOCOL_V010,
            server: ProtocolOffer {
                min: PROTOCOL_V010,
                max: PROTOCOL_V010,
                build: "ctrlog 0.1.0".into(),
            },
            requests: Vec::new(),
            vocabulary_level_max: V010_LEVEL_MAX,
        }
    }

    /// Whether the server offered `request`.
    pub fn offers(&self, request: &str) -> bool {
        self.requests.iter().any(|r| r == request)
    }
}

/// How opening a connection and saying `hello` on it failed.
#[derive(Debug)]
pub enum HandshakeError<E> {
    /// The connection could not be opened: the caller's own error.
    Open(E),
    /// The other side answered `hello` with an error (`ProtocolUnsupported`, or a refusal).
    Refused(ApiError),
    /// No answer to `hello` by the caller's deadline.
    Silent,
}

/// The one dial-and-handshake engine of both ports' callers (the client's `Connector`, the
/// Raft network's `PeerClient`): opens a connection to `addr`, says `hello` on it
/// (`say_hello`, on a clone of the connection's handle, sets the deadline), and, where the
/// other side closed the connection on the request it could not decode (v0.1.0, which knows
/// no `hello`), opens another and speaks v0.1.0's protocol on it without a handshake. What a
/// failure means (retry, another replica, an operator's problem) and what follows the
/// handshake (a token, the cluster's id) are each caller's.
pub async fn open_and_agree<C: Clone, E, OpenFut, HelloFut>(
    addr: &str,
    mut open: impl FnMut() -> OpenFut,
    say_hello: impl FnOnce(C) -> HelloFut,
) -> Result<(C, Hello), HandshakeError<E>>
where
    OpenFut: std::future::Future<Output = Result<C, E>>,
    HelloFut:
        std::future::Future<Output = Result<Result<Hello, ApiError>, tarpc::client::RpcError>>,
{
    let connection = open().await.map_err(HandshakeError::Open)?;
    match say_hello(connection.clone()).await {
        Ok(Ok(hello)) => Ok((connection, hello)),
        Ok(Err(refused)) => Err(HandshakeError::Refused(refused)),
        Err(tarpc::client::RpcError::DeadlineExceeded) => Err(HandshakeError::Silent),
        Err(closed) => {
            tracing::debug!(addr, error = %closed, "no hello: speaking v0.1.0's protocol");
            let connection = open().await.map_err(HandshakeError::Open)?;
            Ok((connection, Hello::v010()))
        }
    }
}

/// `error` as a client speaking `protocol` can decode it: a v0.1.0 client knows none of the
/// variants added after it, and a variant it cannot decode would cost it the connection and
/// the retries of a request that can only fail again. Each new variant stands in as the
/// nearest v0.1.0 one that a v0.1.0 client also does not retry, with the same message.
pub fn error_for_protocol(error: ApiError, protocol: u16) -> ApiError {
    if protocol > PROTOCOL_V010 {
        return error;
    }
    use ApiError::*;
    match error {
        // Every variant is named, so that a new one must be placed here.
        known_to_v010 @ (NotLeader { .. }
        | TooLarge { .. }
        | Compacted { .. }
        | SequenceOutOfWindow { .. }
        | Fenced { .. }
        | Deprecated { .. }
        | Overloaded { .. }
        | Invalid(_)
        | Rejected(_)
        | Unavailable(_)
        | ShuttingDown
        | Unauthorized(_)
        | Forbidden { .. }) => known_to_v010,
        Refused(rejection) if rejection.known_to_v010() => Refused(rejection),
        Refused(rejection) => Rejected(format!("refused: {rejection}")),
        AnswerTooLarge { .. } | ProducerForgotten { .. } | ProtocolUnsupported { .. } => {
            Invalid(error.to_string())
        }
        MemberLevelUnsupported { .. } | OtherCluster { .. } => Rejected(error.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn offer(min: u16, max: u16) -> ProtocolOffer {
        ProtocolOffer {
            min,
            max,
            build: "test".into(),
        }
    }

    /// Goal: two builds agree on the highest version both speak, at each end of their ranges,
    /// and ranges that do not meet (or an upside-down one) are refused naming both.
    #[test]
    fn versions_are_agreed_at_the_highest_both_speak() {
        assert_eq!(offer(1, 2).agree(&offer(1, 2)), Ok(2));
        assert_eq!(offer(1, 2).agree(&offer(1, 1)), Ok(1));
        assert_eq!(offer(1, 2).agree(&offer(2, 7)), Ok(2));
        assert_eq!(offer(1, 3).agree(&offer(2, 2)), Ok(2));
        assert_eq!(
            offer(1, 2).agree(&offer(3, 4)),
            Err(ApiError::ProtocolUnsupported {
                offered_min: 3,
                offered_max: 4,
                supported_min: 1,
                supported_max: 2,
            })
        );
        assert!(offer(2, 3).agree(&offer(1, 1)).is_err());
        assert!(offer(1, 2).agree(&offer(2, 1)).is_err());
        let refusal = offer(1, 2).agree(&offer(9, 9)).unwrap_err().to_string();
        assert!(
            refusal.contains("9..=9") && refusal.contains("1..=2"),
            "{refusal}"
        );
    }

    /// Goal: a v0.1.0 client is never sent a variant it cannot decode, and loses nothing of
    /// the message; a client of this build gets every variant as it is.
    #[test]
    fn errors_a_v010_client_cannot_decode_are_stood_in_for() {
        let new = [
            ApiError::AnswerTooLarge { size: 9, limit: 8 },
            ApiError::ProducerForgotten {
                producer: 7,
                seq: 70_000,
            },
            ApiError::MemberLevelUnsupported {
                member: 4,
                supported: 2,
                recorded: 3,
            },
            ApiError::ProtocolUnsupported {
                offered_min: 3,
                offered_max: 3,
                supported_min: 1,
                supported_max: 2,
            },
        ];
        for error in new {
            let message = error.to_string();
            let old = error_for_protocol(error.clone(), PROTOCOL_V010);
            assert!(
                matches!(&old, ApiError::Invalid(m) | ApiError::Rejected(m) if *m == message),
                "{old:?}"
            );
            assert!(!old.is_retriable());
            assert_eq!(error_for_protocol(error.clone(), 2), error);
        }
        let known = ApiError::Unavailable("no quorum".into());
        assert_eq!(error_for_protocol(known.clone(), PROTOCOL_V010), known);
    }
}
