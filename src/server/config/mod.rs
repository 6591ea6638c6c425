//! A replica's configuration: what `ctrlog serve` reads from flags or a TOML file.

pub(in crate::server) mod error;
pub mod job;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::log::{COMMAND_BYTES_MAX_DEFAULT, LOG_ENTRY_OVERHEAD_BYTES_MAX};
use crate::raft::network::{PEER_FRAME_BYTES_MAX, RAFT_PAYLOAD_ENTRIES_MAX};
use crate::raft::proposer::BATCH_BYTES_MAX;
use crate::server::config::error::refuse;
pub use crate::server::config::error::ConfigError;
use crate::server::config::job::{JobConfig, JobFlags};
use crate::wire::{
    Member, ANSWER_ENVELOPE_BYTES_MAX, APPEND_MANY_BYTES_MAX, COMMAND_BYTES_MAX_ANY_REPLICA,
};
use crate::NodeId;

/// Everything a replica needs to start. Every field has a default except the identity and the
/// data directory, so a TOML file states only what differs.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ReplicaConfig {
    /// This replica's Raft node id. Unique in the cluster, never reused.
    pub id: NodeId,
    /// Where this replica listens for Raft RPCs from its peers. Port 0 picks a free port.
    pub peer_addr: SocketAddr,
    /// Where this replica listens for clients and containers. Port 0 picks a free port.
    pub client_addr: SocketAddr,
    /// Where this replica serves `/metrics`, `/healthz`, `/readyz` and its status page (HTTP).
    /// Off when unset.
    pub http_addr: Option<SocketAddr>,
    /// Host names the observability port answers to, besides IP addresses and `localhost`
    /// (a request naming any other host is refused, so that a web page elsewhere cannot reach
    /// the port through DNS rebinding). E.g. the replica's DNS name, for a browser.
    pub http_allowed_hosts: Vec<String>,
    /// TLS on the client and peer ports (PEM files). Plain TCP when unset.
    pub tls: Option<TlsFiles>,
    /// Who may do what on the client port. Anyone may do anything when unset. Needs `tls`:
    /// without it tokens would cross the network in clear and the peer port would accept Raft
    /// messages from anyone.
    pub auth: Option<AuthConfig>,
    /// Allows `auth` without `tls`, for a closed test network only: tokens then cross the
    /// network in clear and the peer port checks no sender. Refused unless set.
    pub insecure_plaintext: bool,
    /// The sled database (vote, snapshots) and the WAL (the Raft log) live here.
    pub data_dir: PathBuf,
    /// The founding members, each with its address pair. The lowest id initialises the cluster
    /// once, when its log is empty; every other replica waits to be contacted.
    #[serde(with = "members_by_id")]
    pub initial_members: BTreeMap<NodeId, Member>,
    /// Leader heartbeat period. Small enough to detect a dead leader quickly; each one costs an
    /// RPC per follower. openraft checks its timers every 1.5 heartbeats.
    pub heartbeat_interval_ms: u64,
    /// A follower that hears nothing for a random time in this range starts an election. Must
    /// exceed the heartbeat by a wide margin so that one slow fsync does not depose a leader.
    ///
    /// openraft 0.9 adds a leader lease of `election_timeout_max_ms` before a follower that
    /// knew a leader votes, so a follower stands (`raft::elector`) after `max + heartbeat +
    /// random(0, max - min)` of silence, with a fresh draw at each try: with the defaults (50,
    /// 300, 450) between 0.5 and 0.65 s, which keeps kill → first commit under 1.2 s
    /// (RELIABILITY.md) while needing 0.5 s of silence, 10 heartbeats, before an election.
    pub election_timeout_min_ms: u64,
    pub election_timeout_max_ms: u64,
    /// Build a snapshot once this many entries were applied since the last one.
    pub snapshot_logs_since_last: u64,
    /// Entries kept in the log after a snapshot (openraft's `max_in_snapshot_log_to_keep`), so
    /// that recent history can still be fetched and slightly lagging followers catch up from
    /// the log rather than by snapshot.
    pub snapshot_logs_to_keep: u64,
    /// The largest command body accepted on append.
    pub command_bytes_max: usize,
    /// Configuration keys marked secret: a `ConfigChange` setting one is refused before it
    /// enters the log, because every container and every backup reads the log, and the job's
    /// state keeps the value. An entry names a key, or, starting with `*`, every key ending
    /// with the rest; case does not matter. `[]` marks none. Default:
    /// [`SECRET_CONFIG_KEYS_DEFAULT`].
    pub secret_config_keys: Vec<String>,
    /// The largest frame accepted on the client port.
    pub client_frame_bytes_max: usize,
    /// Connections the client port holds at once; one more is closed as soon as it is
    /// accepted. Bounds what clients that never authenticate, or never send, can pin.
    pub client_connections_max: usize,
    /// Of those, connections that have not authenticated yet (handshaking, or with
    /// authentication on, not yet shown a certificate the cluster knows or a token); when
    /// full, the oldest is closed to make room. The rest of the port stays for connections
    /// that authenticated, so connections that never do cannot lock everyone out. Above
    /// `client_connections_max` it is that.
    pub client_unauthenticated_connections_max: usize,
    /// Unauthenticated connections one source address may hold; one more is closed at once.
    pub client_unauthenticated_per_source_max: usize,
    /// With authentication on, a connection that has not authenticated this long after its
    /// TLS handshake is closed.
    pub client_authenticate_timeout_ms: u64,
    /// Bytes of large frames (over 64 KiB) the client port receives at once over all its
    /// connections; a frame that does not fit closes its connection. Bounds what many
    /// connections each announcing a frame of the full size can make the replica allocate.
    pub client_receiving_bytes_max: usize,
    /// A client connection that sends nothing for this long is closed (Kafka's
    /// `connections.max.idle.ms`). Clients re-dial on their next call.
    pub client_idle_timeout_ms: u64,
    /// A frame must arrive whole within this long of its first byte, or its connection is
    /// closed: a sender that trickles a frame cannot hold a buffer for ever.
    pub client_frame_read_timeout_ms: u64,
    /// Requests one client connection may have in flight; more are refused until some finish.
    pub client_requests_in_flight_max: usize,
    /// Encoded bytes of the appends one client connection may have in flight (waiting to
    /// commit); more are refused (`Overloaded`) until some finish. Bounds what one connection
    /// pins in bytes, where the count alone allows that many frames of the full size.
    pub client_append_bytes_in_flight_max: usize,
    /// Encoded bytes of large answers (fetches, states, state chunks, statuses) one client
    /// connection may have built and not yet written; more are refused (`Overloaded`) until
    /// it reads. Held until the answer is written, so a client that asks and never reads pins
    /// at most this much.
    pub client_unwritten_answer_bytes_max: usize,
    /// The same over every connection of the client port: what all the clients that do not
    /// read can pin together.
    pub client_port_unwritten_answer_bytes_max: usize,
    /// How fast the background scrubber reads back the WAL and the stored snapshot to verify
    /// them, in MiB per second on average; 0 turns it off. Default 8.
    pub scrub_mib_per_second: u64,
    /// How often a scrub pass starts, in ms: every synced record of the log and the stored
    /// snapshot are verified at least once per this period plus the time a pass takes at the
    /// rate (retained bytes / rate). Default 3,600,000 (an hour).
    pub scrub_interval_ms: u64,
    /// The job this replica coordinates with the others: its controller runs here and acts
    /// while this replica leads. No controller runs when unset.
    pub job: Option<JobConfig>,
}

impl Default for ReplicaConfig {
    fn default() -> Self {
        ReplicaConfig {
            id: 0,
            peer_addr: "127.0.0.1:0".parse().expect("literal address"),
            client_addr: "127.0.0.1:0".parse().expect("literal address"),
            http_addr: None,
            http_allowed_hosts: Vec::new(),
            tls: None,
            auth: None,
            insecure_plaintext: false,
            data_dir: PathBuf::new(),
            initial_members: BTreeMap::new(),
            heartbeat_interval_ms: 50,
            election_timeout_min_ms: 300,
            election_timeout_max_ms: 450,
            snapshot_logs_since_last: 10_000,
            snapshot_logs_to_keep: 1_000,
            command_bytes_max: COMMAND_BYTES_MAX_DEFAULT,
            secret_config_keys: SECRET_CONFIG_KEYS_DEFAULT
                .iter()
                .map(|key| key.to_string())
                .collect(),
            client_frame_bytes_max: 2 * COMMAND_BYTES_MAX_DEFAULT + (64 << 10),
            client_connections_max: 4096,
            client_unauthenticated_connections_max: 1024,
            client_unauthenticated_per_source_max: 256,
            client_authenticate_timeout_ms: 10_000,
            client_receiving_bytes_max: 256 << 20,
            client_idle_timeout_ms: 600_000,
            client_frame_read_timeout_ms: 30_000,
            client_requests_in_flight_max: 1024,
            client_append_bytes_in_flight_max: 64 << 20,
            client_unwritten_answer_bytes_max: 16 << 20,
            client_port_unwritten_answer_bytes_max: 256 << 20,
            scrub_mib_per_second: 8,
            scrub_interval_ms: 3_600_000,
            job: None,
        }
    }
}

impl ReplicaConfig {
    /// This replica's address pair as the membership records it.
    pub fn member(&self) -> Member {
        Member {
            peer_addr: self.peer_addr.to_string(),
            client_addr: self.client_addr.to_string(),
        }
    }

    /// Reads a TOML file; fields it does not state keep their defaults.
    pub fn from_file(path: &Path) -> Result<ReplicaConfig, LoadError> {
        let text = std::fs::read_to_string(path).map_err(|source| LoadError::Read {
            path: path.to_owned(),
            source,
        })?;
        toml::from_str(&text).map_err(|source| LoadError::Parse {
            path: path.to_owned(),
            source,
        })
    }
}

/// The options of `ctrlog serve` (and `force-new-cluster`): a TOML file, and flags that
/// override what it says. Every flag is optional so that the file can say it instead.
#[derive(clap::Args, Clone, Debug, Default)]
pub struct ServeFlags {
    /// A TOML file with any of the options; flags override it.
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// This replica's node id (`id`): the data directory records it and refuses another.
    #[arg(long)]
    pub id: Option<NodeId>,
    /// Listen for the other replicas here (`peer_addr`), HOST:PORT.
    #[arg(long)]
    pub peer_addr: Option<SocketAddr>,
    /// Listen for clients and containers here (`client_addr`), HOST:PORT.
    #[arg(long)]
    pub client_addr: Option<SocketAddr>,
    /// Serve /metrics, /healthz, /readyz and the status page here (HTTP).
    #[arg(long)]
    pub http_addr: Option<SocketAddr>,
    /// TLS on both ports: the CA (PEM); with --tls-cert and --tls-key.
    #[arg(long, requires_all = ["tls_cert", "tls_key"])]
    pub tls_ca: Option<PathBuf>,
    /// This replica's certificate (PEM), naming it `node-<id>`.
    #[arg(long, requires = "tls_ca")]
    pub tls_cert: Option<PathBuf>,
    /// This replica's private key (PEM).
    #[arg(long, requires = "tls_ca")]
    pub tls_key: Option<PathBuf>,
    /// The data directory (`data_dir`): the log, snapshots and metadata.
    #[arg(long)]
    pub data: Option<PathBuf>,
    /// The founding members: 1=PEER/CLIENT,2=PEER/CLIENT,3=PEER/CLIENT.
    #[arg(long)]
    pub initial_members: Option<String>,
    /// Snapshot after this many entries since the last one (`snapshot_logs_since_last`).
    #[arg(long)]
    pub snapshot_logs_since_last: Option<u64>,
    /// Entries kept behind a snapshot for followers to catch up from (`snapshot_logs_to_keep`).
    #[arg(long)]
    pub snapshot_logs_to_keep: Option<u64>,
    /// The `[job]` options.
    #[command(flatten)]
    pub job: JobFlags,
}

impl ServeFlags {
    /// The configuration these flags ask for: the file's (or the defaults), each flag given
    /// laid over it, then validated.
    pub fn load(self) -> Result<ReplicaConfig, LoadError> {
        let mut config = match &self.config {
            Some(path) => ReplicaConfig::from_file(path)?,
            None => ReplicaConfig::default(),
        };
        let no_id = self.id.is_none() && self.config.is_none();
        if let Some(id) = self.id {
            config.id = id;
        }
        if let Some(addr) = self.peer_addr {
            config.peer_addr = addr;
        }
        if let Some(addr) = self.client_addr {
            config.client_addr = addr;
        }
        if let Some(addr) = self.http_addr {
            config.http_addr = Some(addr);
        }
        if let (Some(ca_file), Some(cert_file), Some(key_file)) =
            (self.tls_ca, self.tls_cert, self.tls_key)
        {
            config.tls = Some(TlsFiles {
                ca_file,
                cert_file,
                key_file,
            });
        }
        if let Some(dir) = self.data {
            config.data_dir = dir;
        }
        if let Some(members) = self.initial_members {
            config.initial_members = parse_members(&members)?;
        }
        if let Some(n) = self.snapshot_logs_since_last {
            config.snapshot_logs_since_last = n;
        }
        if let Some(n) = self.snapshot_logs_to_keep {
            config.snapshot_logs_to_keep = n;
        }
        self.job.lay_over(&mut config.job);
        if no_id {
            return Err(LoadError::NoId);
        }
        config.validate()?;
        Ok(config)
    }
}

/// Why a replica's configuration could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error("reading {}: {source}", path.display())]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("parsing {}: {source}", path.display())]
    Parse {
        path: PathBuf,
        source: toml::de::Error,
    },
    #[error("--id is required (or give it in --config)")]
    NoId,
    #[error(transparent)]
    Invalid(#[from] ConfigError),
}

/// What one Raft entry adds around its commands at most: its log id and payload tags, the
/// batch's header, and one proposal's producer pair, target and frame header.
const RAFT_ENTRY_OVERHEAD_BYTES: usize = 1 << 10;

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

/// The shortest scrub period accepted: passes over a small log end at once, so a shorter one
/// would have the scrubber spin.
const SCRUB_INTERVAL_MS_MIN: u64 = 100;

impl ReplicaConfig {
    /// Refuses combinations that would misbehave at run time, naming the field.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.data_dir.as_os_str().is_empty() {
            refuse("data_dir", "must be set")?;
        }
        if self.election_timeout_min_ms <= self.heartbeat_interval_ms {
            refuse(
                "election_timeout_min_ms",
                "must exceed heartbeat_interval_ms, or followers start elections between heartbeats",
            )?;
        }
        if self.election_timeout_max_ms <= self.election_timeout_min_ms {
            refuse(
                "election_timeout_max_ms",
                "must exceed election_timeout_min_ms",
            )?;
        }
        if self.scrub_interval_ms < SCRUB_INTERVAL_MS_MIN {
            refuse(
                "scrub_interval_ms",
                "must be at least 100: a shorter period spins over a small log (turn scrubbing \
                 off with scrub_mib_per_second = 0)",
            )?;
        }
        let at_least_one = [
            ("snapshot_logs_since_last", self.snapshot_logs_since_last),
            ("command_bytes_max", self.command_bytes_max as u64),
            ("client_connections_max", self.client_connections_max as u64),
            (
                "client_unauthenticated_connections_max",
                self.client_unauthenticated_connections_max as u64,
            ),
            (
                "client_unauthenticated_per_source_max",
                self.client_unauthenticated_per_source_max as u64,
            ),
            (
                "client_authenticate_timeout_ms",
                self.client_authenticate_timeout_ms,
            ),
            ("client_idle_timeout_ms", self.client_idle_timeout_ms),
            (
                "client_frame_read_timeout_ms",
                self.client_frame_read_timeout_ms,
            ),
        ];
        for (field, value) in at_least_one {
            if value == 0 {
                refuse(field, "must be at least 1")?;
            }
        }
        let one_command_answer =
            self.command_bytes_max + LOG_ENTRY_OVERHEAD_BYTES_MAX + ANSWER_ENVELOPE_BYTES_MAX;
        if self.client_frame_bytes_max < one_command_answer {
            refuse(
                "client_frame_bytes_max",
                format!(
                    "must be at least command_bytes_max + {} = {one_command_answer} bytes, or a \
                     command of the full size cannot be sent or fetched",
                    LOG_ENTRY_OVERHEAD_BYTES_MAX + ANSWER_ENVELOPE_BYTES_MAX
                ),
            )?;
        }
        if self.command_bytes_max > COMMAND_BYTES_MAX_LIMIT {
            refuse(
                "command_bytes_max",
                format!(
                    "must be at most {COMMAND_BYTES_MAX_LIMIT} bytes: a follower catching up \
                     receives up to {RAFT_PAYLOAD_ENTRIES_MAX} entries of this size in one \
                     message, which must fit the peer port's {PEER_FRAME_BYTES_MAX}-byte frames"
                ),
            )?;
        }
        if self.client_append_bytes_in_flight_max < self.client_frame_bytes_max {
            refuse(
                "client_append_bytes_in_flight_max",
                "must be at least client_frame_bytes_max, or a request of the full size is \
                 always refused",
            )?;
        }
        for (field, value) in [
            (
                "client_unwritten_answer_bytes_max",
                self.client_unwritten_answer_bytes_max,
            ),
            (
                "client_port_unwritten_answer_bytes_max",
                self.client_port_unwritten_answer_bytes_max,
            ),
        ] {
            if value < self.client_frame_bytes_max {
                refuse(
                    field,
                    "must be at least client_frame_bytes_max, or an answer of the full size is \
                     always refused",
                )?;
            }
        }
        if self.client_receiving_bytes_max < self.client_frame_bytes_max {
            refuse(
                "client_receiving_bytes_max",
                "must be at least client_frame_bytes_max, or a frame of the full size is always \
                 refused",
            )?;
        }
        if self.client_frame_bytes_max < 2 * APPEND_MANY_BYTES_MAX {
            refuse(
                "client_frame_bytes_max",
                format!(
                    "must be at least {} bytes, or a client's batch of appends cannot be sent",
                    2 * APPEND_MANY_BYTES_MAX
                ),
            )?;
        }
        if self
            .secret_config_keys
            .iter()
            .any(|key| key.is_empty() || key == "*")
        {
            refuse(
                "secret_config_keys",
                "an entry is empty or `*`, which would mark every key (use [] to mark none)",
            )?;
        }
        if let Some(tls) = &self.tls {
            for (field, path) in [
                ("tls.ca_file", &tls.ca_file),
                ("tls.cert_file", &tls.cert_file),
                ("tls.key_file", &tls.key_file),
            ] {
                if !path.is_file() {
                    refuse(field, format!("{} is not a readable file", path.display()))?;
                }
            }
            refuse_unless_private(
                "tls.key_file",
                &tls.key_file,
                "its key is this replica's identity",
            )?;
        }
        if let Some(auth) = &self.auth {
            if self.tls.is_none() && !self.insecure_plaintext {
                refuse(
                    "auth",
                    "needs [tls]: without it tokens cross the network in clear and the peer \
                     port accepts Raft messages from anyone who reaches it (set \
                     insecure_plaintext = true only on a closed test network)",
                )?;
            }
            if !auth.certificates.is_empty() && self.tls.is_none() {
                refuse("auth.certificates", "client certificates need tls")?;
            }
            if let Some(path) = &auth.tokens_file {
                if !path.is_file() {
                    refuse(
                        "auth.tokens_file",
                        format!("{} is not a readable file", path.display()),
                    )?;
                }
                refuse_unless_private("auth.tokens_file", path, "its tokens are credentials")?;
            }
            if auth.tokens_file.is_none() && auth.certificates.is_empty() {
                refuse(
                    "auth",
                    "names no tokens file and no certificates: nobody could connect",
                )?;
            }
        }
        if let Some(job) = &self.job {
            job.validate()?;
        }
        if !self.initial_members.is_empty() && !self.initial_members.contains_key(&self.id) {
            refuse(
                "initial_members",
                format!("does not include this replica's id {}", self.id),
            )?;
        }
        Ok(())
    }
}

/// Refuses a secret file (`what` says why it is one) that others may read. Allowed: no access
/// for group or others, whoever owns it; or owned by root, readable (not writable) by its
/// group, which is how a Kubernetes Secret volume with an `fsGroup` arrives (root:fsGroup,
/// 0440) and the rule PostgreSQL applies to its key.
fn refuse_unless_private(field: &'static str, path: &Path, what: &str) -> Result<(), ConfigError> {
    use std::os::unix::fs::MetadataExt as _;
    let metadata = std::fs::metadata(path).map_err(|e| ConfigError {
        field,
        reason: format!("{}: {e}", path.display()),
    })?;
    if is_private(metadata.mode(), metadata.uid()) {
        return Ok(());
    }
    refuse(
        field,
        format!(
            "{} is readable by others than its owner (mode {:o}, owner uid {}): {what}; chmod \
             600 it (a file owned by root may also be read by its group: mode 440 or 640)",
            path.display(),
            metadata.mode() & 0o777,
            metadata.uid()
        ),
    )
}

/// Whether a file of `mode` owned by `owner` keeps its contents from other users: see
/// [`refuse_unless_private`].
fn is_private(mode: u32, owner: u32) -> bool {
    let no_group_or_others = mode & 0o077 == 0;
    let root_and_its_group_reads = owner == 0 && mode & 0o037 == 0;
    no_group_or_others || root_and_its_group_reads
}

impl ReplicaConfig {
    /// What this configuration leaves open, one sentence each, for a prominent warning at
    /// start: a port not bound to loopback that serves without TLS or without credentials.
    pub fn exposure_warnings(&self) -> Vec<String> {
        let exposed = |addr: &SocketAddr| !addr.ip().is_loopback();
        let mut warnings = Vec::new();
        if self.insecure_plaintext {
            warnings.push(
                "insecure_plaintext = true: tokens cross the network in clear and the peer port \
                 checks no sender"
                    .to_string(),
            );
        }
        if self.tls.is_none() && exposed(&self.peer_addr) {
            warnings.push(format!(
                "the peer port {} serves without TLS: anyone who reaches it can send Raft \
                 messages (AppendEntries, InstallSnapshot) and rewrite the log",
                self.peer_addr
            ));
        }
        if exposed(&self.client_addr) {
            if self.tls.is_none() {
                warnings.push(format!(
                    "the client port {} serves without TLS: commands and credentials cross the \
                     network in clear",
                    self.client_addr
                ));
            }
            if self.auth.is_none() {
                warnings.push(format!(
                    "the client port {} asks for no credentials: anyone who reaches it may \
                     append, change the membership and take snapshots",
                    self.client_addr
                ));
            }
        }
        warnings
    }
}

/// The PEM files of a replica's TLS: the CA that signs every replica and client certificate,
/// and this replica's own certificate (naming it `node-<id>`) and key.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TlsFiles {
    pub ca_file: PathBuf,
    pub cert_file: PathBuf,
    pub key_file: PathBuf,
}

/// Client authentication (see `raft::auth`): bearer tokens from a file and client
/// certificates by name, each mapped to a role (`admin`, `operator` or `container:ID`).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AuthConfig {
    /// Lines of `TOKEN ROLE`.
    pub tokens_file: Option<PathBuf>,
    /// Certificate name (a DNS name in the client certificate) → role.
    pub certificates: BTreeMap<String, String>,
}

/// `initial_members` as a TOML table: TOML keys are strings, so ids are written `[initial_members.1]`
/// and parsed back into numbers here.
mod members_by_id {
    use std::collections::BTreeMap;

    use serde::de::Error;
    use serde::{Deserialize, Deserializer, Serialize, Serializer};

    use crate::wire::Member;
    use crate::NodeId;

    pub fn serialize<S: Serializer>(
        members: &BTreeMap<NodeId, Member>,
        serializer: S,
    ) -> Result<S::Ok, S::Error> {
        let by_name: BTreeMap<String, &Member> =
            members.iter().map(|(id, m)| (id.to_string(), m)).collect();
        by_name.serialize(serializer)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(
        deserializer: D,
    ) -> Result<BTreeMap<NodeId, Member>, D::Error> {
        BTreeMap::<String, Member>::deserialize(deserializer)?
            .into_iter()
            .map(|(id, member)| {
                id.parse()
                    .map(|id| (id, member))
                    .map_err(|_| D::Error::custom(format!("`{id}` is not a node id")))
            })
            .collect()
    }
}

/// Parses `1=PEER/CLIENT,2=PEER/CLIENT,...`.
pub fn parse_members(text: &str) -> Result<BTreeMap<NodeId, Member>, ConfigError> {
    let bad = |reason: String| ConfigError {
        field: "initial_members",
        reason,
    };
    let mut members = BTreeMap::new();
    for item in text.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        let (id, addrs) = item
            .split_once('=')
            .ok_or_else(|| bad(format!("`{item}` is not ID=PEER/CLIENT")))?;
        let id: NodeId = id
            .trim()
            .parse()
            .map_err(|_| bad(format!("`{id}` is not a node id")))?;
        let (peer, client) = addrs
            .split_once('/')
            .ok_or_else(|| bad(format!("`{addrs}` is not PEER/CLIENT")))?;
        for addr in [peer, client] {
            addr.parse::<SocketAddr>()
                .map_err(|_| bad(format!("`{addr}` is not HOST:PORT")))?;
        }
        if members
            .insert(
                id,
                Member {
                    peer_addr: peer.to_string(),
                    client_addr: client.to_string(),
                },
            )
            .is_some()
        {
            return Err(bad(format!("id {id} appears twice")));
        }
    }
    Ok(members)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn members_parse_and_errors_name_the_field() {
        let members =
            parse_members("1=127.0.0.1:1/127.0.0.1:2, 2=127.0.0.1:3/127.0.0.1:4").unwrap();
        assert_eq!(members[&2].client_addr, "127.0.0.1:4");
        assert_eq!(
            parse_members("1=nope").unwrap_err().field,
            "initial_members"
        );
        assert!(parse_members("1=127.0.0.1:1/127.0.0.1:2,1=127.0.0.1:1/127.0.0.1:2").is_err());
    }

    /// Owner-only files pass whoever owns them; a root-owned file may be read by its group
    /// (a Kubernetes Secret volume with `fsGroup`), never written by it or read by others.
    #[test]
    fn secret_files_are_private_to_their_owner_or_to_root_and_its_group() {
        let cases = [
            (0o600, 1000, true),
            (0o400, 1000, true),
            (0o440, 1000, false),
            (0o640, 1000, false),
            (0o604, 1000, false),
            (0o400, 0, true),
            (0o440, 0, true),
            (0o640, 0, true),
            (0o460, 0, false),
            (0o444, 0, false),
            (0o441, 0, false),
        ];
        for (mode, owner, private) in cases {
            assert_eq!(
                is_private(mode, owner),
                private,
                "mode {mode:o}, owner {owner}"
            );
        }
    }

    /// The same rule on a real file, as `validate` reads it: a tokens file of mode 440 passes
    /// only when root owns it (CI runs as root, so there it does).
    #[test]
    fn a_tokens_file_of_mode_440_is_accepted_only_from_root() {
        use std::os::unix::fs::PermissionsExt as _;
        let dir = tempfile::tempdir().unwrap();
        let tokens = dir.path().join("tokens");
        std::fs::write(&tokens, "secret operator\n").unwrap();
        let set_mode = |mode| {
            std::fs::set_permissions(&tokens, std::fs::Permissions::from_mode(mode)).unwrap()
        };
        let root = unsafe { libc::geteuid() } == 0;
        set_mode(0o440);
        assert_eq!(
            refuse_unless_private("auth.tokens_file", &tokens, "x").is_ok(),
            root
        );
        set_mode(0o444);
        let refused = refuse_unless_private("auth.tokens_file", &tokens, "x").unwrap_err();
        assert_eq!(refused.field, "auth.tokens_file");
        assert!(refused.reason.contains("mode 444"), "{}", refused.reason);
        set_mode(0o600);
        assert!(refuse_unless_private("auth.tokens_file", &tokens, "x").is_ok());
    }

    #[test]
    fn election_timeout_must_exceed_heartbeat() {
        let config = ReplicaConfig {
            data_dir: "x".into(),
            heartbeat_interval_ms: 500,
            election_timeout_min_ms: 500,
            ..ReplicaConfig::default()
        };
        assert_eq!(
            config.validate().unwrap_err().field,
            "election_timeout_min_ms"
        );
    }

    /// The byte limits are checked against each other: each case changes one field of a valid
    /// configuration and names the field refused, or `None` where the limit is just met.
    #[test]
    fn byte_limits_are_checked_against_each_other() {
        type Tune = fn(&mut ReplicaConfig);
        let cases: [(&str, Tune, Option<&str>); 6] = [
            ("the defaults", |_| {}, None),
            (
                "a command at the largest size replication allows",
                |c| {
                    c.command_bytes_max = COMMAND_BYTES_MAX_LIMIT;
                    c.client_frame_bytes_max = 2 * COMMAND_BYTES_MAX_LIMIT;
                    c.client_append_bytes_in_flight_max = 2 * COMMAND_BYTES_MAX_LIMIT;
                },
                None,
            ),
            (
                "a command too large to replicate to a lagging follower",
                |c| {
                    c.command_bytes_max = COMMAND_BYTES_MAX_LIMIT + 1;
                    c.client_frame_bytes_max = 2 * COMMAND_BYTES_MAX_LIMIT;
                    c.client_append_bytes_in_flight_max = 2 * COMMAND_BYTES_MAX_LIMIT;
                },
                Some("command_bytes_max"),
            ),
            (
                "a frame that admits the command but not its fetch answer",
                |c| c.client_frame_bytes_max = c.command_bytes_max + 1,
                Some("client_frame_bytes_max"),
            ),
            (
                "a frame that admits exactly one command's answer",
                |c| {
                    c.client_frame_bytes_max = c.command_bytes_max
                        + LOG_ENTRY_OVERHEAD_BYTES_MAX
                        + ANSWER_ENVELOPE_BYTES_MAX
                },
                None,
            ),
            (
                "an append budget below one frame",
                |c| c.client_append_bytes_in_flight_max = c.client_frame_bytes_max - 1,
                Some("client_append_bytes_in_flight_max"),
            ),
        ];
        for (what, tune, refused) in cases {
            let mut config = ReplicaConfig {
                data_dir: "x".into(),
                ..ReplicaConfig::default()
            };
            tune(&mut config);
            assert_eq!(config.validate().err().map(|e| e.field), refused, "{what}");
        }
    }

    /// Goal: a lock without a door is refused: `[auth]` without `[tls]` would check tokens
    /// sent in clear while the peer port takes Raft messages from anyone. Only the loudly
    /// named escape allows it, and every open port is named in the start-up warnings.
    #[test]
    fn auth_without_tls_is_refused_unless_insecure_plaintext() {
        let dir = tempfile::tempdir().unwrap();
        let tokens = dir.path().join("tokens");
        std::fs::write(&tokens, "0123456789abcdef0123 admin\n").unwrap();
        let private = std::os::unix::fs::PermissionsExt::from_mode(0o600);
        std::fs::set_permissions(&tokens, private).unwrap();
        let mut config = ReplicaConfig {
            data_dir: "x".into(),
            auth: Some(AuthConfig {
                tokens_file: Some(tokens.clone()),
                certificates: BTreeMap::new(),
            }),
            ..ReplicaConfig::default()
        };
        let error = config.validate().unwrap_err();
        assert_eq!(error.field, "auth");
        assert!(error.reason.contains("needs [tls]"), "{error}");
        assert!(config.exposure_warnings().is_empty(), "loopback ports only");

        config.insecure_plaintext = true;
        config.validate().unwrap();
        // Its tokens are credentials: a file others may read is refused.
        let shared = std::os::unix::fs::PermissionsExt::from_mode(0o644);
        std::fs::set_permissions(&tokens, shared).unwrap();
        let error = config.validate().unwrap_err();
        assert_eq!(error.field, "auth.tokens_file");
        assert!(error.reason.contains("chmod 600"), "{error}");
        config.peer_addr = "10.0.0.1:7001".parse().unwrap();
        config.client_addr = "0.0.0.0:7000".parse().unwrap();
        let warnings = config.exposure_warnings().join("\n");
        assert!(warnings.contains("insecure_plaintext"), "{warnings}");
        assert!(warnings.contains("peer port 10.0.0.1:7001"), "{warnings}");
        assert!(
            warnings.contains("client port 0.0.0.0:7000 serves without TLS"),
            "{warnings}"
        );
        config.auth = None;
        assert!(config
            .exposure_warnings()
            .join("\n")
            .contains("asks for no credentials"));
    }

    #[test]
    fn toml_file_needs_only_what_differs() {
        let config: ReplicaConfig = toml::from_str(
            "id = 2\ndata_dir = \"/var/lib/ctrlog\"\npeer_addr = \"127.0.0.1:7002\"\n",
        )
        .unwrap();
        assert_eq!(config.id, 2);
        assert_eq!(config.heartbeat_interval_ms, 50);
        assert!(toml::from_str::<ReplicaConfig>("idd = 2").is_err());
    }
}

#[cfg(test)]
mod shipped_examples {
    use super::*;
    use crate::server::LauncherConfig;

    /// The example configurations in `deploy/` parse, cover TLS, auth and a job, and validate
    /// once their files exist; a missing file is refused by its field's name.
    #[test]
    fn the_example_configs_parse_and_validate() {
        let examples = [
            include_str!("../../../deploy/replica-1.toml"),
            include_str!("../../../deploy/replica-2.toml"),
            include_str!("../../../deploy/replica-3.toml"),
        ];
        let dir = tempfile::tempdir().unwrap();
        let file = |name: &str| {
            let path = dir.path().join(name);
            std::fs::write(&path, "x").unwrap();
            path
        };
        for (i, text) in examples.into_iter().enumerate() {
            let mut config: ReplicaConfig = toml::from_str(text).unwrap();
            assert_eq!(config.id, i as u64 + 1);
            assert_eq!(config.initial_members.len(), 3);
            let error = config.validate().unwrap_err();
            assert_eq!(error.field, "tls.ca_file", "{error}");
            let tls = config.tls.as_mut().unwrap();
            (tls.ca_file, tls.cert_file) = (file("ca"), file("cert"));
            let private = |path: PathBuf| {
                let owner_only = std::os::unix::fs::PermissionsExt::from_mode(0o600);
                std::fs::set_permissions(&path, owner_only).unwrap();
                path
            };
            tls.key_file = private(file("key"));
            let tokens = private(file("tokens"));
            config.auth.as_mut().unwrap().tokens_file = Some(tokens);
            assert_eq!(config.validate().unwrap_err().field, "job.inputs_file");
            let inputs = dir.path().join("inputs");
            std::fs::write(&inputs, "kafka/events/0\n").unwrap();
            config
                .job
                .as_mut()
                .expect("the examples show a job")
                .inputs_file = Some(inputs);
            config.validate().unwrap();
        }
    }

    /// The replica configuration in the Kubernetes manifest (a ConfigMap's `ctrlog.toml` key)
    /// is one this build accepts, with the `--id` flag its StatefulSets pass, turns TLS and
    /// tokens on with files from the replica's Secret, and runs its job in external mode.
    /// (scripts/build-image.sh --check runs a replica on it, with the Secret's files.)
    #[test]
    fn the_kubernetes_config_map_holds_a_valid_replica_config() {
        let manifest = include_str!("../../../deploy/kubernetes/ctrlog.yaml");
        let text: String = manifest
            .lines()
            .skip_while(|line| line.trim() != "ctrlog.toml: |")
            .skip(1)
            .take_while(|line| line.is_empty() || line.starts_with("    "))
            .map(|line| format!("{}\n", line.get(4..).unwrap_or("")))
            .collect();
        let mut config: ReplicaConfig = toml::from_str(&text).unwrap();
        config.id = 2;
        assert_eq!(config.initial_members.len(), 3);
        let dir = tempfile::tempdir().unwrap();
        let mounted = |path: &mut PathBuf| {
            assert!(
                path.starts_with("/etc/ctrlog-secrets"),
                "{}",
                path.display()
            );
            *path = dir.path().join(path.file_name().unwrap());
            std::fs::write(&path, "x").unwrap();
            let owner_only = std::os::unix::fs::PermissionsExt::from_mode(0o400);
            std::fs::set_permissions(&path, owner_only).unwrap();
        };
        let tls = config.tls.as_mut().expect("the manifest turns TLS on");
        mounted(&mut tls.ca_file);
        mounted(&mut tls.cert_file);
        mounted(&mut tls.key_file);
        let auth = config.auth.as_mut().expect("the manifest turns tokens on");
        mounted(auth.tokens_file.as_mut().expect("a tokens file"));
        let job = config.job.as_mut().expect("the manifest runs a job");
        assert_eq!(job.launcher, LauncherConfig::External {});
        let inputs = dir.path().join("inputs");
        std::fs::write(&inputs, "kafka/events/0\n").unwrap();
        job.inputs_file = Some(inputs);
        config.validate().unwrap();
    }
}
