//! `[client_port]`: what the port clients and containers use accepts, and what each
//! connection and the port as a whole may hold.

use serde::{Deserialize, Serialize};

use crate::log::{COMMAND_BYTES_MAX_DEFAULT, LOG_ENTRY_OVERHEAD_BYTES_MAX};
use crate::raft::network::{PEER_FRAME_BYTES_MAX, RAFT_PAYLOAD_ENTRIES_MAX};
use crate::raft::proposer::BATCH_BYTES_MAX;
use crate::server::config::error::{refuse, ConfigError};
use crate::wire::{
    ANSWER_ENVELOPE_BYTES_MAX, APPEND_MANY_BYTES_MAX, COMMAND_BYTES_MAX_ANY_REPLICA,
};

/// The `[client_port]` section. Every field has a default, so a file states only what
/// differs. v0.1.0 spelled each at the top level, `client_` before the names that have no
/// prefix here (`client_frame_bytes_max`); that spelling is still read.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ClientPortConfig {
    /// The largest command body accepted on append. At most [`COMMAND_BYTES_MAX_LIMIT`].
    /// Default 1 MiB.
    pub command_bytes_max: usize,
    /// Configuration keys marked secret: a `ConfigChange` setting one is refused before it
    /// enters the log, because every container and every backup reads the log, and the job's
    /// state keeps the value. An entry names a key, or, starting with `*`, every key ending
    /// with the rest; case does not matter. `[]` marks none. Default:
    /// [`SECRET_CONFIG_KEYS_DEFAULT`].
    pub secret_config_keys: Vec<String>,
    /// The largest frame accepted (and sent): at least `command_bytes_max` plus a fetch
    /// answer's overhead, so that a command of the full size can be fetched. Default 2 MiB +
    /// 64 KiB.
    pub frame_bytes_max: usize,
    /// Connections the port holds at once; one more is closed as soon as it is accepted.
    /// Bounds what clients that never authenticate, or never send, can pin. Default 4,096.
    pub connections_max: usize,
    /// Of those, connections that have not authenticated yet (handshaking, or with
    /// authentication on, not yet shown a certificate the cluster knows or a token); when
    /// full, the oldest is closed to make room. The rest of the port stays for connections
    /// that authenticated, so connections that never do cannot lock everyone out. Above
    /// `connections_max` it is that. Default 1,024.
    pub unauthenticated_connections_max: usize,
    /// Unauthenticated connections one source address may hold; one more is closed at once.
    /// Default 256.
    pub unauthenticated_per_source_max: usize,
    /// With authentication on, a connection that has not authenticated this long after its
    /// TLS handshake is closed. Default 10,000.
    pub authenticate_timeout_ms: u64,
    /// Bytes of large frames (over 64 KiB) the port receives at once over all its
    /// connections; a frame that does not fit closes its connection. Bounds what many
    /// connections each announcing a frame of the full size can make the replica allocate.
    /// Default 256 MiB.
    pub receiving_bytes_max: usize,
    /// A connection that sends nothing for this long is closed (Kafka's
    /// `connections.max.idle.ms`). Clients re-dial on their next call. Default 600,000.
    pub idle_timeout_ms: u64,
    /// A frame must arrive whole within this long of its first byte, or its connection is
    /// closed: a sender that trickles a frame cannot hold a buffer for ever. Default 30,000.
    pub frame_read_timeout_ms: u64,
    /// Requests one connection may have in flight; more are refused until some finish.
    /// Default 1,024.
    pub requests_in_flight_max: usize,
    /// Encoded bytes of the appends one connection may have in flight (waiting to commit);
    /// more are refused (`Overloaded`) until some finish. Bounds what one connection pins in
    /// bytes, where the count alone allows that many frames of the full size. Default 64 MiB.
    pub append_bytes_in_flight_max: usize,
    /// Encoded bytes of large answers (fetches, states, state chunks, statuses) one
    /// connection may have built and not yet written; more are refused (`Overloaded`) until
    /// it reads. Held until the answer is written, so a client that asks and never reads pins
    /// at most this much. Default 16 MiB.
    pub unwritten_answer_bytes_max: usize,
    /// What the port holds for all its callers together: their answers built and not yet
    /// written, and [`REQUEST_HELD_BYTES`](crate::server::ports::calls::REQUEST_HELD_BYTES)
    /// for each request in flight (a long poll's task and buffers); more are refused
    /// (`Overloaded`). What all the clients that do not read, or that hold long polls by the
    /// thousand, can pin together. Default 256 MiB.
    pub port_unwritten_answer_bytes_max: usize,
    /// Of that, what the connections of one principal may hold together (with
    /// authentication on; a sixteenth of it for connections not yet authenticated), so that
    /// one token cannot take the port's budget from the others: 90 connections of one
    /// container token once held 604 MiB in long polls. Default 64 MiB.
    pub principal_held_bytes_max: usize,
}

impl Default for ClientPortConfig {
    fn default() -> Self {
        ClientPortConfig {
            command_bytes_max: COMMAND_BYTES_MAX_DEFAULT,
            secret_config_keys: SECRET_CONFIG_KEYS_DEFAULT
                .iter()
                .map(|key| key.to_string())
                .collect(),
            frame_bytes_max: 2 * COMMAND_BYTES_MAX_DEFAULT + (64 << 10),
            connections_max: 4096,
            unauthenticated_connections_max: 1024,
            unauthenticated_per_source_max: 256,
            authenticate_timeout_ms: 10_000,
            receiving_bytes_max: 256 << 20,
            idle_timeout_ms: 600_000,
            frame_read_timeout_ms: 30_000,
            requests_in_flight_max: 1024,
            append_bytes_in_flight_max: 64 << 20,
            unwritten_answer_bytes_max: 16 << 20,
            port_unwritten_answer_bytes_max: 256 << 20,
            principal_held_bytes_max: 64 << 20,
        }
    }
}

/// The keys marked secret unless `secret_config_keys` says otherwise: the usual names of
/// credentials, and Kafka's `sasl.jaas.config`, which holds a password.
pub const SECRET_CONFIG_KEYS_DEFAULT: &[&str] = &[
    "*password",
    "*passwd",
    "*secret",
    "*token",
    "*credentials",
    "*private_key",
    "*api_key",
    "sasl.jaas.config",
];

/// What one Raft entry adds around its commands at most: its log id and payload tags, the
/// batch's header, and one proposal's producer pair, target and frame header.
const RAFT_ENTRY_OVERHEAD_BYTES: usize = 1 << 10;

/// The largest `command_bytes_max` a replica accepts (a little under 4 MiB). A follower that
/// catches up receives up to [`RAFT_PAYLOAD_ENTRIES_MAX`] entries in one AppendEntries message,
/// each one batch of at most `BATCH_BYTES_MAX` or one command alone, and the message must fit
/// the peer port's frame limit, or replication to it could never succeed.
pub const COMMAND_BYTES_MAX_LIMIT: usize = (PEER_FRAME_BYTES_MAX - ANSWER_ENVELOPE_BYTES_MAX)
    / RAFT_PAYLOAD_ENTRIES_MAX as usize
    - RAFT_ENTRY_OVERHEAD_BYTES;

// A batch of the full size must fit where one command of the largest size does.
const _: () = assert!(BATCH_BYTES_MAX <= COMMAND_BYTES_MAX_LIMIT);
// Clients refuse what exceeds this at once, and must never refuse what a replica accepts.
const _: () = assert!(COMMAND_BYTES_MAX_LIMIT <= COMMAND_BYTES_MAX_ANY_REPLICA);

impl ClientPortConfig {
    /// The encoded bytes one answer's body may take: a frame less the answer's envelope. The
    /// one place the bound is derived; the node sizes fetches and state chunks by it and the
    /// port refuses larger answers by it.
    pub fn answer_bytes_max(&self) -> usize {
        self.frame_bytes_max - ANSWER_ENVELOPE_BYTES_MAX
    }

    /// Refuses limits that would misbehave at run time, or refuse every request of the full
    /// size, naming the field.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let at_least_one = [
            (
                "client_port.command_bytes_max",
                self.command_bytes_max as u64,
            ),
            ("client_port.connections_max", self.connections_max as u64),
            (
                "client_port.unauthenticated_connections_max",
                self.unauthenticated_connections_max as u64,
            ),
            (
                "client_port.unauthenticated_per_source_max",
                self.unauthenticated_per_source_max as u64,
            ),
            (
                "client_port.authenticate_timeout_ms",
                self.authenticate_timeout_ms,
            ),
            ("client_port.idle_timeout_ms", self.idle_timeout_ms),
            (
                "client_port.frame_read_timeout_ms",
                self.frame_read_timeout_ms,
            ),
        ];
        for (field, value) in at_least_one {
            if value == 0 {
                refuse(field, "must be at least 1")?;
            }
        }
        let one_command_answer =
            self.command_bytes_max + LOG_ENTRY_OVERHEAD_BYTES_MAX + ANSWER_ENVELOPE_BYTES_MAX;
        if self.frame_bytes_max < one_command_answer {
            refuse(
                "client_port.frame_bytes_max",
                format!(
                    "must be at least command_bytes_max + {} = {one_command_answer} bytes, or a \
                     command of the full size cannot be sent or fetched",
                    LOG_ENTRY_OVERHEAD_BYTES_MAX + ANSWER_ENVELOPE_BYTES_MAX
                ),
            )?;
        }
        if self.command_bytes_max > COMMAND_BYTES_MAX_LIMIT {
            refuse(
                "client_port.command_bytes_max",
                format!(
                    "must be at most {COMMAND_BYTES_MAX_LIMIT} bytes: a follower catching up \
                     receives up to {RAFT_PAYLOAD_ENTRIES_MAX} entries of this size in one \
                     message, which must fit the peer port's {PEER_FRAME_BYTES_MAX}-byte frames"
                ),
            )?;
        }
        let at_least_one_frame = [
            (
                "client_port.append_bytes_in_flight_max",
                self.append_bytes_in_flight_max,
                "a request of the full size is always refused",
            ),
            (
                "client_port.unwritten_answer_bytes_max",
                self.unwritten_answer_bytes_max,
                "an answer of the full size is always refused",
            ),
            (
                "client_port.port_unwritten_answer_bytes_max",
                self.port_unwritten_answer_bytes_max,
                "an answer of the full size is always refused",
            ),
            (
                "client_port.principal_held_bytes_max",
                self.principal_held_bytes_max,
                "an answer of the full size is always refused",
            ),
            (
                "client_port.receiving_bytes_max",
                self.receiving_bytes_max,
                "a frame of the full size is always refused",
            ),
        ];
        for (field, value, otherwise) in at_least_one_frame {
            if value < self.frame_bytes_max {
                refuse(
                    field,
                    format!("must be at least frame_bytes_max, or {otherwise}"),
                )?;
            }
        }
        if self.frame_bytes_max < 2 * APPEND_MANY_BYTES_MAX {
            refuse(
                "client_port.frame_bytes_max",
                format!(
                    "must be at least {} bytes, or a client's batch of appends cannot be sent",
                    2 * APPEND_MANY_BYTES_MAX
                ),
            )?;
        }
        if (self.secret_config_keys.iter()).any(|key| key.is_empty() || key == "*") {
            refuse(
                "client_port.secret_config_keys",
                "an entry is empty or `*`, which would mark every key (use [] to mark none)",
            )?;
        }
        Ok(())
    }
}
