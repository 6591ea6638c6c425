//! A replica's configuration: what `ctrlog serve` reads from a TOML file and its flags.
//!
//! The identity and the addresses sit at the top of the file; the rest is in sections, each
//! its own type with a `Default` and a `validate()`: [`raft`] (`[raft]`), [`client_port`]
//! (`[client_port]`), [`security`] (`[tls]`, `[auth]`) and [`job`] (`[job]`). [`load`] reads
//! the file, lifts v0.1.0's top-level spellings into their sections, and lays the flags over
//! it, in one place.

pub mod client_port;
pub(in crate::server) mod error;
pub mod job;
pub mod load;
pub mod raft;
pub mod security;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use crate::log::vocabulary::{LEVEL_INITIAL, LEVEL_MAX};
use crate::log::Level;
use crate::raft::network::FirstContact;
pub use crate::server::config::client_port::{
    ClientPortConfig, COMMAND_BYTES_MAX_LIMIT, SECRET_CONFIG_KEYS_DEFAULT,
};
use crate::server::config::error::refuse;
pub use crate::server::config::error::ConfigError;
use crate::server::config::job::JobConfig;
pub use crate::server::config::load::{LoadError, ServeFlags, V010_TOP_LEVEL_KEYS};
pub use crate::server::config::raft::RaftConfig;
pub use crate::server::config::security::{AuthConfig, TlsFiles};
use crate::wire::Member;
use crate::NodeId;

/// Everything a replica needs to start. Every field has a default except the identity and the
/// data directory, so a TOML file states only what differs. Built in code, or read from TOML
/// by [`ReplicaConfig::from_toml`] (which also reads v0.1.0's spellings); `serde` alone reads
/// only the sectioned form.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ReplicaConfig {
    /// This replica's Raft node id. Unique in the cluster, never reused. Required.
    pub id: NodeId,
    /// Where this replica listens for Raft RPCs from its peers. Port 0 picks a free port.
    /// Default `127.0.0.1:0`.
    pub peer_addr: SocketAddr,
    /// Where this replica listens for clients and containers. Port 0 picks a free port.
    /// Default `127.0.0.1:0`.
    pub client_addr: SocketAddr,
    /// Where this replica serves `/metrics`, `/healthz`, `/readyz` and its status page (HTTP).
    /// Default: off.
    pub http_addr: Option<SocketAddr>,
    /// The gRPC port (`[grpc]`): the public contract of `proto/ctrlog/v1` for containers and
    /// tools in any language, beside the client port. Default: off.
    pub grpc: GrpcConfig,
    /// Host names the observability port answers to, besides IP addresses and `localhost`
    /// (a request naming any other host is refused, so that a web page elsewhere cannot reach
    /// the port through DNS rebinding). E.g. the replica's DNS name, for a browser. Default
    /// none.
    pub http_allowed_hosts: Vec<String>,
    /// The sled database (vote, snapshots) and the WAL (the Raft log) live here. Required.
    pub data_dir: PathBuf,
    /// The founding members, each with its address pair. The lowest id initialises the cluster
    /// once, when its log is empty; every other replica waits to be contacted. Default none
    /// (a replica that joins through `members add`).
    #[serde(with = "members_by_id")]
    pub initial_members: BTreeMap<NodeId, Member>,
    /// For a replica started on an empty directory to be added by `members add`: the members
    /// that may add it. Until its log gives it a membership, a replica takes Raft requests
    /// and introductions only from these nodes (with TLS, the nodes their certificates name)
    /// or from its `initial_members`; any other node certificate the CA signed is refused.
    /// Default none: a replica with neither and no membership in its log is reached by no
    /// one, and says so at start.
    pub join_from: Vec<NodeId>,
    /// The vocabulary level a new cluster runs at: while its log holds no command, its first
    /// leader raises the level to this one, or to the highest every member's build knows if
    /// that is lower (`raft::founding`). `1` founds a cluster as v0.1.0 did, e.g. for
    /// containers on a client that writes `desired-containers` version 1. A log that holds a
    /// command is never raised but by `ctrlog vocabulary raise`. Default: the highest level
    /// this build knows.
    pub initial_vocabulary_level: Option<Level>,
    /// Allows `[auth]` without `[tls]`, for a closed test network only: tokens then cross the
    /// network in clear and the peer port checks no sender. Default false.
    pub insecure_plaintext: bool,
    /// `[raft]`: elections, heartbeats, snapshots, scrubbing.
    pub raft: RaftConfig,
    /// `[client_port]`: what the client port accepts and what its connections may hold.
    pub client_port: ClientPortConfig,
    /// `[tls]`: TLS on the client and peer ports (PEM files). Default: plain TCP.
    pub tls: Option<TlsFiles>,
    /// `[auth]`: who may do what on the client port. Needs `[tls]`: without it tokens would
    /// cross the network in clear and the peer port would accept Raft messages from anyone.
    /// Default: anyone may do anything.
    pub auth: Option<AuthConfig>,
    /// `[job]`: the job this replica coordinates with the others: its controller runs here
    /// and acts while this replica leads. Default: no controller (a bare log).
    pub job: Option<JobConfig>,
}

/// `[grpc]`: where the gRPC port listens. It serves with the client port's TLS, credentials,
/// roles and limits (`[tls]`, `[auth]`, `[client_port]`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct GrpcConfig {
    /// HOST:PORT; port 0 picks a free one. Default: no gRPC port.
    pub addr: Option<SocketAddr>,
}

impl Default for ReplicaConfig {
    fn default() -> Self {
        ReplicaConfig {
            id: 0,
            peer_addr: "127.0.0.1:0".parse().expect("literal address"),
            client_addr: "127.0.0.1:0".parse().expect("literal address"),
            http_addr: None,
            grpc: GrpcConfig::default(),
            http_allowed_hosts: Vec::new(),
            data_dir: PathBuf::new(),
            initial_members: BTreeMap::new(),
            join_from: Vec::new(),
            initial_vocabulary_level: None,
            insecure_plaintext: false,
            raft: RaftConfig::default(),
            client_port: ClientPortConfig::default(),
            tls: None,
            auth: None,
            job: None,
        }
    }
}

impl ReplicaConfig {
    /// The level this replica raises a new log to, should it lead it first.
    pub fn level_of_new_log(&self) -> Level {
        self.initial_vocabulary_level.unwrap_or(LEVEL_MAX)
    }

    /// This replica's address pair as the membership records it.
    pub fn member(&self) -> Member {
        Member {
            peer_addr: self.peer_addr.to_string(),
            client_addr: self.client_addr.to_string(),
        }
    }

    /// Refuses combinations that would misbehave at run time, naming the field: each
    /// section's own rules, then the rules across them.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.data_dir.as_os_str().is_empty() {
            refuse("data_dir", "must be set")?;
        }
        self.raft.validate()?;
        self.client_port.validate()?;
        if let Some(tls) = &self.tls {
            tls.validate()?;
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
            auth.validate()?;
        }
        if let Some(job) = &self.job {
            job.validate()?;
        }
        if let Some(level) = self.initial_vocabulary_level {
            if !(LEVEL_INITIAL..=LEVEL_MAX).contains(&level) {
                refuse(
                    "initial_vocabulary_level",
                    format!(
                        "{level} is not a level this build knows ({LEVEL_INITIAL} to {LEVEL_MAX})"
                    ),
                )?;
            }
        }
        if !self.initial_members.is_empty() && !self.initial_members.contains_key(&self.id) {
            refuse(
                "initial_members",
                format!("does not include this replica's id {}", self.id),
            )?;
        }
        if self.join_from.contains(&self.id) {
            refuse("join_from", "names this replica itself")?;
        }
        if !self.join_from.is_empty() && !self.initial_members.is_empty() {
            refuse(
                "join_from",
                "is for a replica added later by `members add`; a founding member \
                 (initial_members) is reached by the founder",
            )?;
        }
        Ok(())
    }

    /// The nodes this replica takes its first Raft requests from while its log knows no
    /// membership: its fellow founding members, or the members it joins from.
    pub fn first_contact(&self) -> FirstContact {
        FirstContact {
            founders: self.initial_members.keys().copied().collect(),
            joining_from: self.join_from.iter().copied().collect(),
        }
    }
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
        let client_ports = [("client", Some(self.client_addr)), ("gRPC", self.grpc.addr)];
        for (port, addr) in client_ports {
            let Some(addr) = addr.filter(exposed) else {
                continue;
            };
            if self.tls.is_none() {
                warnings.push(format!(
                    "the {port} port {addr} serves without TLS: commands and credentials cross \
                     the network in clear"
                ));
            }
            if self.auth.is_none() {
                warnings.push(format!(
                    "the {port} port {addr} asks for no credentials: anyone who reaches it may \
                     append, change the membership and take snapshots"
                ));
            }
        }
        warnings
    }
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
    use crate::log::LOG_ENTRY_OVERHEAD_BYTES_MAX;
    use crate::wire::ANSWER_ENVELOPE_BYTES_MAX;
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

    #[test]
    fn election_timeout_must_exceed_heartbeat() {
        let config = ReplicaConfig {
            data_dir: "x".into(),
            raft: RaftConfig {
                heartbeat_interval_ms: 500,
                election_timeout_min_ms: 500,
                ..RaftConfig::default()
            },
            ..ReplicaConfig::default()
        };
        assert_eq!(
            config.validate().unwrap_err().field,
            "raft.election_timeout_min_ms"
        );
    }

    /// The byte limits are checked against each other: each case changes one field of a valid
    /// configuration and names the field refused, or `None` where the limit is just met.
    #[test]
    fn byte_limits_are_checked_against_each_other() {
        type Tune = fn(&mut ClientPortConfig);
        let cases: [(&str, Tune, Option<&str>); 6] = [
            ("the defaults", |_| {}, None),
            (
                "a command at the largest size replication allows",
                |c| {
                    c.command_bytes_max = COMMAND_BYTES_MAX_LIMIT;
                    c.frame_bytes_max = 2 * COMMAND_BYTES_MAX_LIMIT;
                    c.append_bytes_in_flight_max = 2 * COMMAND_BYTES_MAX_LIMIT;
                },
                None,
            ),
            (
                "a command too large to replicate to a lagging follower",
                |c| {
                    c.command_bytes_max = COMMAND_BYTES_MAX_LIMIT + 1;
                    c.frame_bytes_max = 2 * COMMAND_BYTES_MAX_LIMIT;
                    c.append_bytes_in_flight_max = 2 * COMMAND_BYTES_MAX_LIMIT;
                },
                Some("client_port.command_bytes_max"),
            ),
            (
                "a frame that admits the command but not its fetch answer",
                |c| c.frame_bytes_max = c.command_bytes_max + 1,
                Some("client_port.frame_bytes_max"),
            ),
            (
                "a frame that admits exactly one command's answer",
                |c| {
                    c.frame_bytes_max = c.command_bytes_max
                        + LOG_ENTRY_OVERHEAD_BYTES_MAX
                        + ANSWER_ENVELOPE_BYTES_MAX
                },
                None,
            ),
            (
                "an append budget below one frame",
                |c| c.append_bytes_in_flight_max = c.frame_bytes_max - 1,
                Some("client_port.append_bytes_in_flight_max"),
            ),
        ];
        for (what, tune, refused) in cases {
            let mut config = ReplicaConfig {
                data_dir: "x".into(),
                ..ReplicaConfig::default()
            };
            tune(&mut config.client_port);
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
        let config = ReplicaConfig::from_toml(
            "id = 2\ndata_dir = \"/var/lib/ctrlog\"\npeer_addr = \"127.0.0.1:7002\"\n",
        )
        .unwrap();
        assert_eq!(config.id, 2);
        assert_eq!(config.raft.heartbeat_interval_ms, 50);
        assert!(ReplicaConfig::from_toml("idd = 2").is_err());
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
            let mut config = ReplicaConfig::from_toml(text).unwrap();
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
        let mut config = ReplicaConfig::from_toml(&text).unwrap();
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
