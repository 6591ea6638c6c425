//! Reading a replica's configuration: the TOML file, v0.1.0's top-level spellings lifted into
//! their sections, and the `ctrlog serve` flags laid over the file as one patch. Each flag
//! names the field it sets once, in `ServeFlags::lay_over`; the merged table is read and
//! validated once, in [`ServeFlags::load`].

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use serde::Serialize;
use toml::{Table, Value};

use crate::server::config::job::LauncherConfig;
use crate::server::config::{parse_members, ConfigError, ReplicaConfig};
use crate::NodeId;

/// Every field v0.1.0 (and every build before the sections) read at the top level of the
/// file, with the section and the name it has there. A file may still spell them so; the
/// same field given both ways is refused.
pub const V010_TOP_LEVEL_KEYS: &[(&str, &str, &str)] = &[
    ("heartbeat_interval_ms", "raft", "heartbeat_interval_ms"),
    ("election_timeout_min_ms", "raft", "election_timeout_min_ms"),
    ("election_timeout_max_ms", "raft", "election_timeout_max_ms"),
    (
        "snapshot_logs_since_last",
        "raft",
        "snapshot_logs_since_last",
    ),
    ("snapshot_logs_to_keep", "raft", "snapshot_logs_to_keep"),
    ("scrub_mib_per_second", "raft", "scrub_mib_per_second"),
    ("scrub_interval_ms", "raft", "scrub_interval_ms"),
    ("command_bytes_max", "client_port", "command_bytes_max"),
    ("secret_config_keys", "client_port", "secret_config_keys"),
    ("client_frame_bytes_max", "client_port", "frame_bytes_max"),
    ("client_connections_max", "client_port", "connections_max"),
    (
        "client_unauthenticated_connections_max",
        "client_port",
        "unauthenticated_connections_max",
    ),
    (
        "client_unauthenticated_per_source_max",
        "client_port",
        "unauthenticated_per_source_max",
    ),
    (
        "client_authenticate_timeout_ms",
        "client_port",
        "authenticate_timeout_ms",
    ),
    (
        "client_receiving_bytes_max",
        "client_port",
        "receiving_bytes_max",
    ),
    ("client_idle_timeout_ms", "client_port", "idle_timeout_ms"),
    (
        "client_frame_read_timeout_ms",
        "client_port",
        "frame_read_timeout_ms",
    ),
    (
        "client_requests_in_flight_max",
        "client_port",
        "requests_in_flight_max",
    ),
    (
        "client_append_bytes_in_flight_max",
        "client_port",
        "append_bytes_in_flight_max",
    ),
    (
        "client_unwritten_answer_bytes_max",
        "client_port",
        "unwritten_answer_bytes_max",
    ),
    (
        "client_port_unwritten_answer_bytes_max",
        "client_port",
        "port_unwritten_answer_bytes_max",
    ),
];

impl ReplicaConfig {
    /// Reads a configuration from TOML text, in the sectioned form or v0.1.0's (both may
    /// mix); fields it does not state keep their defaults.
    pub fn from_toml(text: &str) -> Result<ReplicaConfig, toml::de::Error> {
        Value::Table(lifted(text)?).try_into()
    }

    /// Reads a TOML file, as [`from_toml`](Self::from_toml) does.
    pub fn from_file(path: &Path) -> Result<ReplicaConfig, LoadError> {
        Value::Table(read_lifted(path)?)
            .try_into()
            .map_err(|source| LoadError::parse(path, source))
    }
}

/// The file's table, v0.1.0's spellings lifted into their sections.
fn read_lifted(path: &Path) -> Result<Table, LoadError> {
    let text = std::fs::read_to_string(path).map_err(|source| LoadError::Read {
        path: path.to_owned(),
        source,
    })?;
    lifted(&text).map_err(|source| LoadError::parse(path, source))
}

/// TOML text as a table, v0.1.0's spellings lifted into their sections.
fn lifted(text: &str) -> Result<Table, toml::de::Error> {
    let mut table: Table = text.parse()?;
    lift_v010_keys(&mut table)?;
    Ok(table)
}

/// Moves each of [`V010_TOP_LEVEL_KEYS`] the table holds at the top level into its section.
fn lift_v010_keys(table: &mut Table) -> Result<(), toml::de::Error> {
    for &(old, section, key) in V010_TOP_LEVEL_KEYS {
        let Some(value) = table.remove(old) else {
            continue;
        };
        let section_table = table
            .entry(section)
            .or_insert_with(|| Value::Table(Table::new()));
        let Value::Table(section_table) = section_table else {
            return Err(serde::de::Error::custom(format!(
                "`{section}` must be a section ([{section}])"
            )));
        };
        if section_table.contains_key(key) {
            return Err(serde::de::Error::custom(format!(
                "`{old}` and `[{section}] {key}` are the same field, given twice: keep one"
            )));
        }
        section_table.insert(key.to_string(), value);
    }
    Ok(())
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
    /// Serve /metrics, /healthz, /readyz and the status page here (`http_addr`, HTTP).
    #[arg(long)]
    pub http_addr: Option<SocketAddr>,
    /// Serve the gRPC port here (`[grpc] addr`), HOST:PORT.
    #[arg(long)]
    pub grpc_addr: Option<SocketAddr>,
    /// TLS on both ports: the CA (`[tls] ca_file`, PEM); with --tls-cert and --tls-key.
    #[arg(long, requires_all = ["tls_cert", "tls_key"])]
    pub tls_ca: Option<PathBuf>,
    /// This replica's certificate (`[tls] cert_file`, PEM), naming it `node-<id>`.
    #[arg(long, requires = "tls_ca")]
    pub tls_cert: Option<PathBuf>,
    /// This replica's private key (`[tls] key_file`, PEM).
    #[arg(long, requires = "tls_ca")]
    pub tls_key: Option<PathBuf>,
    /// The data directory (`data_dir`): the log, snapshots and metadata.
    #[arg(long)]
    pub data: Option<PathBuf>,
    /// The founding members (`initial_members`): 1=PEER/CLIENT,2=PEER/CLIENT,3=PEER/CLIENT.
    #[arg(long)]
    pub initial_members: Option<String>,
    /// For a replica started on an empty directory to be added by `members add`: the ids of
    /// the members that may add it (`join_from`), e.g. 1,2,3.
    #[arg(long, value_delimiter = ',')]
    pub join_from: Option<Vec<crate::NodeId>>,
    /// The vocabulary level a new cluster runs at (`initial_vocabulary_level`); default the
    /// highest this build knows.
    #[arg(long)]
    pub initial_vocabulary_level: Option<crate::log::Level>,
    /// Snapshot after this many entries since the last one (`[raft]
    /// snapshot_logs_since_last`).
    #[arg(long)]
    pub snapshot_logs_since_last: Option<u64>,
    /// Entries kept behind a snapshot for followers to catch up from (`[raft]
    /// snapshot_logs_to_keep`).
    #[arg(long)]
    pub snapshot_logs_to_keep: Option<u64>,
    /// The `[job]` options.
    #[command(flatten)]
    pub job: JobFlags,
}

impl ServeFlags {
    /// The configuration these flags ask for: the file's (or the defaults), the flags given
    /// laid over it, read once and validated.
    pub fn load(self) -> Result<ReplicaConfig, LoadError> {
        if self.id.is_none() && self.config.is_none() {
            return Err(LoadError::NoId);
        }
        let (mut table, origin) = match &self.config {
            Some(path) => (read_lifted(path)?, path.display().to_string()),
            None => (Table::new(), "the flags".to_string()),
        };
        self.lay_over(&mut table)?;
        let config: ReplicaConfig = Value::Table(table)
            .try_into()
            .map_err(|source| LoadError::Parse { origin, source })?;
        config.validate()?;
        Ok(config)
    }

    /// Lays each flag given over the file's table, at the field it names.
    fn lay_over(self, table: &mut Table) -> Result<(), LoadError> {
        set(table, &["id"], self.id)?;
        set(table, &["peer_addr"], self.peer_addr)?;
        set(table, &["client_addr"], self.client_addr)?;
        set(table, &["http_addr"], self.http_addr)?;
        set(table, &["grpc", "addr"], self.grpc_addr)?;
        if let (Some(ca), Some(cert), Some(key)) = (self.tls_ca, self.tls_cert, self.tls_key) {
            let files = crate::server::config::TlsFiles {
                ca_file: ca,
                cert_file: cert,
                key_file: key,
            };
            set(table, &["tls"], Some(files))?;
        }
        set(table, &["data_dir"], self.data)?;
        if let Some(members) = self.initial_members {
            let by_name: std::collections::BTreeMap<String, _> = (parse_members(&members)?)
                .into_iter()
                .map(|(id, member)| (id.to_string(), member))
                .collect();
            set(table, &["initial_members"], Some(by_name))?;
        }
        set(table, &["join_from"], self.join_from)?;
        let level = self.initial_vocabulary_level;
        set(table, &["initial_vocabulary_level"], level)?;
        let since_last = self.snapshot_logs_since_last;
        set(table, &["raft", "snapshot_logs_since_last"], since_last)?;
        set(
            table,
            &["raft", "snapshot_logs_to_keep"],
            self.snapshot_logs_to_keep,
        )?;
        self.job.lay_over(table)
    }
}

/// Sets the field at `path` (creating its sections) to `value`, when it is given.
fn set(table: &mut Table, path: &[&str], value: Option<impl Serialize>) -> Result<(), LoadError> {
    let Some(value) = value else {
        return Ok(());
    };
    let (field, sections) = path.split_last().expect("a field's path is never empty");
    let value = Value::try_from(value).map_err(|source| LoadError::Flag {
        field: path.join("."),
        source,
    })?;
    section(table, sections).insert(field.to_string(), value);
    Ok(())
}

/// The section at `path`, created empty where missing (and where the file gave a value that
/// is not a section: the flag wins, as over any other field).
fn section<'t>(table: &'t mut Table, path: &[&str]) -> &'t mut Table {
    path.iter().fold(table, |table, name| {
        let entry = table
            .entry(name.to_string())
            .or_insert_with(|| Value::Table(Table::new()));
        if !entry.is_table() {
            *entry = Value::Table(Table::new());
        }
        entry.as_table_mut().expect("made a table above")
    })
}

/// The `ctrlog serve` flags for the common fields of `[job]`; any of them given makes the
/// replica run a controller, laid over the file's section (or the defaults).
#[derive(clap::Args, Clone, Debug, Default)]
pub struct JobFlags {
    /// Run the job's controller, its inputs listed in this file (`[job] inputs_file`).
    #[arg(long, conflicts_with = "job_inputs")]
    pub job_inputs_file: Option<PathBuf>,
    /// Run the job's controller with these inputs (`[job] inputs`), e.g. kafka/events/0,kafka/events/1.
    #[arg(long, value_delimiter = ',')]
    pub job_inputs: Option<Vec<String>>,
    /// `[job] session_timeout_ms`.
    #[arg(long)]
    pub job_session_timeout_ms: Option<u64>,
    /// `[job.scaling] min`.
    #[arg(long)]
    pub job_min_containers: Option<u32>,
    /// `[job.scaling] max`.
    #[arg(long)]
    pub job_max_containers: Option<u32>,
    /// `[job.launcher] kind = "external"`: publish the desired count for an orchestrator.
    #[arg(long, conflicts_with = "job_launch_command")]
    pub job_external_launcher: bool,
    /// `[job.launcher] kind = "process"` with this command, split at spaces, e.g.
    /// "ctrlog container --id {id} --cluster {cluster}".
    #[arg(long)]
    pub job_launch_command: Option<String>,
}

impl JobFlags {
    /// Lays the flags given over the file's `[job]` section (made when missing: a flag asks
    /// for a controller).
    fn lay_over(self, table: &mut toml::Table) -> Result<(), LoadError> {
        let given = self.job_inputs_file.is_some()
            || self.job_inputs.is_some()
            || self.job_session_timeout_ms.is_some()
            || self.job_min_containers.is_some()
            || self.job_max_containers.is_some()
            || self.job_external_launcher
            || self.job_launch_command.is_some();
        if !given {
            return Ok(());
        }
        let job = section(table, &["job"]);
        // The inputs come from one place: the one a flag names replaces the file's other.
        if self.job_inputs_file.is_some() {
            job.remove("inputs");
        }
        if self.job_inputs.is_some() {
            job.remove("inputs_file");
        }
        set(job, &["inputs_file"], self.job_inputs_file)?;
        set(job, &["inputs"], self.job_inputs)?;
        set(job, &["session_timeout_ms"], self.job_session_timeout_ms)?;
        set(job, &["scaling", "min"], self.job_min_containers)?;
        set(job, &["scaling", "max"], self.job_max_containers)?;
        if self.job_external_launcher {
            set(job, &["launcher"], Some(LauncherConfig::External {}))?;
        }
        if let Some(command) = self.job_launch_command {
            let command: Vec<String> = command.split_whitespace().map(String::from).collect();
            // A process launcher of the file keeps its other fields; any other is replaced.
            let launcher = section(job, &["launcher"]);
            if launcher.get("kind").and_then(toml::Value::as_str) != Some("process") {
                launcher.clear();
                launcher.insert("kind".into(), "process".into());
            }
            set(launcher, &["command"], Some(command))?;
        }
        Ok(())
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
    /// The file (or the table the flags made) does not parse as a configuration: `origin`
    /// names the file.
    #[error("parsing {origin}: {source}")]
    Parse {
        origin: String,
        source: toml::de::Error,
    },
    #[error("the flag for {field} cannot be written to the configuration: {source}")]
    Flag {
        field: String,
        source: toml::ser::Error,
    },
    #[error("--id is required (or give it in --config)")]
    NoId,
    #[error(transparent)]
    Invalid(#[from] ConfigError),
}

impl LoadError {
    fn parse(path: &Path, source: toml::de::Error) -> LoadError {
        LoadError::Parse {
            origin: path.display().to_string(),
            source,
        }
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;
    use crate::server::config::job::JobConfig;

    /// `ctrlog serve`'s flags, as the binary parses them.
    #[derive(Parser)]
    struct Serve {
        #[command(flatten)]
        flags: ServeFlags,
    }

    fn flags(args: &[&str]) -> ServeFlags {
        Serve::try_parse_from(std::iter::once("serve").chain(args.iter().copied()))
            .unwrap()
            .flags
    }

    /// The configuration a file's text and then `flags` make, unvalidated.
    fn laid_over(text: &str, flags: ServeFlags) -> Result<ReplicaConfig, LoadError> {
        let mut table = lifted(text).map_err(|e| LoadError::parse(Path::new("t"), e))?;
        flags.lay_over(&mut table)?;
        Value::Table(table)
            .try_into()
            .map_err(|e| LoadError::parse(Path::new("t"), e))
    }

    /// Goal: every file that worked before the sections works now. Each top-level spelling
    /// reads into its section's field exactly as the sectioned spelling does, with a value
    /// other than the default (so that a key read into the wrong field, or not at all, fails).
    #[test]
    fn every_top_level_spelling_reads_into_its_section() {
        let defaults = Value::try_from(ReplicaConfig::default()).unwrap();
        for &(old, section, key) in V010_TOP_LEVEL_KEYS {
            let value = match &defaults[section][key] {
                Value::Integer(n) => Value::Integer(n + 1),
                Value::Array(_) => Value::Array(vec!["*pin".into()]),
                other => panic!("{section}.{key}: no test value for {other}"),
            };
            let flat = ReplicaConfig::from_toml(&format!("{old} = {value}")).unwrap();
            let sectioned =
                ReplicaConfig::from_toml(&format!("[{section}]\n{key} = {value}")).unwrap();
            assert_eq!(flat, sectioned, "{old}");
            assert_ne!(flat, ReplicaConfig::default(), "{old} was not read");
            let both = format!("{old} = {value}\n[{section}]\n{key} = {value}");
            let refused = ReplicaConfig::from_toml(&both).unwrap_err().to_string();
            assert!(refused.contains("given twice"), "{old}: {refused}");
        }
        // Every field of the two sections that existed before them has its old spelling;
        // the fields added since have none.
        let added_since = ["principal_held_bytes_max"];
        for section in ["raft", "client_port"] {
            let keys = defaults[section].as_table().unwrap().keys();
            for key in keys.filter(|key| !added_since.contains(&key.as_str())) {
                assert!(
                    V010_TOP_LEVEL_KEYS
                        .iter()
                        .any(|&(_, s, k)| s == section && k == key),
                    "[{section}] {key} has no top-level spelling"
                );
            }
        }
    }

    /// v0.1.0's own example file, its options stated, reads as it did.
    #[test]
    fn the_v010_example_file_reads_into_the_sections() {
        let text = include_str!("../../../tests/fixtures/v0.1.0/replica.toml");
        let config = ReplicaConfig::from_toml(text).unwrap();
        assert_eq!(config.id, 1);
        assert_eq!(config.initial_members.len(), 3);
        let raft = &config.raft;
        assert_eq!(
            (
                raft.heartbeat_interval_ms,
                raft.election_timeout_min_ms,
                raft.election_timeout_max_ms
            ),
            (100, 500, 1000)
        );
        assert_eq!(
            (raft.snapshot_logs_since_last, raft.snapshot_logs_to_keep),
            (10_000, 1_000)
        );
        let port = &config.client_port;
        assert_eq!(
            (
                port.command_bytes_max,
                port.frame_bytes_max,
                port.requests_in_flight_max
            ),
            (1_048_576, 2_162_688, 1024)
        );
        assert!(config.tls.is_some() && config.auth.is_some());
    }

    /// Goal: every flag of `ctrlog serve` still sets the field it always set, now as one
    /// patch over the file.
    #[test]
    fn every_serve_flag_sets_its_field() {
        let given = flags(&[
            "--id=2",
            "--peer-addr=127.0.0.1:7002",
            "--client-addr=127.0.0.1:7102",
            "--http-addr=127.0.0.1:7202",
            "--tls-ca=/pki/ca.pem",
            "--tls-cert=/pki/node-2.pem",
            "--tls-key=/pki/node-2-key.pem",
            "--data=/var/lib/ctrlog",
            "--initial-members=2=127.0.0.1:7002/127.0.0.1:7102",
            "--initial-vocabulary-level=2",
            "--snapshot-logs-since-last=77",
            "--snapshot-logs-to-keep=7",
            "--job-inputs=kafka/events/0,kafka/events/1",
            "--job-session-timeout-ms=9000",
            "--job-min-containers=2",
            "--job-max-containers=6",
            "--job-launch-command=ctrlog container --id {id}",
        ]);
        let config = laid_over("", given).unwrap();
        assert_eq!(config.id, 2);
        assert_eq!(config.peer_addr.port(), 7002);
        assert_eq!(config.client_addr.port(), 7102);
        assert_eq!(config.http_addr.unwrap().port(), 7202);
        let tls = config.tls.unwrap();
        assert_eq!(
            [tls.ca_file, tls.cert_file, tls.key_file].map(|p| p.display().to_string()),
            ["/pki/ca.pem", "/pki/node-2.pem", "/pki/node-2-key.pem"]
        );
        assert_eq!(config.data_dir, Path::new("/var/lib/ctrlog"));
        assert_eq!(config.initial_members[&2].client_addr, "127.0.0.1:7102");
        assert_eq!(config.initial_vocabulary_level, Some(2));
        assert_eq!(config.raft.snapshot_logs_since_last, 77);
        assert_eq!(config.raft.snapshot_logs_to_keep, 7);
        let job = config.job.unwrap();
        assert_eq!(job.inputs.unwrap().len(), 2);
        assert_eq!(job.session_timeout_ms, 9000);
        assert_eq!((job.scaling.min, job.scaling.max), (2, 6));
        assert!(matches!(job.launcher, LauncherConfig::Process { .. }));

        let external = flags(&[
            "--id=1",
            "--job-inputs-file=/etc/inputs",
            "--job-external-launcher",
        ]);
        let job = laid_over("", external).unwrap().job.unwrap();
        assert_eq!(job.inputs_file.unwrap(), Path::new("/etc/inputs"));
        assert_eq!(job.launcher, LauncherConfig::External {});
    }

    /// A flag wins over the file, whichever spelling the file used; what no flag names keeps
    /// the file's value.
    #[test]
    fn flags_win_over_the_file_in_either_spelling() {
        for file in [
            "snapshot_logs_to_keep = 5\nheartbeat_interval_ms = 40",
            "[raft]\nsnapshot_logs_to_keep = 5\nheartbeat_interval_ms = 40",
        ] {
            let config = laid_over(file, flags(&["--snapshot-logs-to-keep=7"])).unwrap();
            assert_eq!(config.raft.snapshot_logs_to_keep, 7, "{file}");
            assert_eq!(config.raft.heartbeat_interval_ms, 40, "{file}");
        }
    }

    /// Without `--id` or a file there is nothing to start; a file that does not parse is
    /// named.
    #[test]
    fn load_refuses_no_id_and_names_the_file() {
        assert!(matches!(ServeFlags::default().load(), Err(LoadError::NoId)));
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("replica.toml");
        std::fs::write(&path, "id = 1\nheartbeat_interval_ms = \"fast\"\n").unwrap();
        let error = flags(&[&format!("--config={}", path.display())])
            .load()
            .unwrap_err()
            .to_string();
        assert!(error.contains("replica.toml"), "{error}");
    }

    /// The `[job]` section the file's text and then the job flags `given` make.
    fn job_laid_over(file: &str, given: JobFlags) -> Option<JobConfig> {
        let flags = ServeFlags {
            job: given,
            ..ServeFlags::default()
        };
        laid_over(file, flags).unwrap().job
    }

    /// Flags lay over the file's section, and any of them alone makes a job.
    #[test]
    fn job_flags_lay_over_the_section() {
        let given = JobFlags {
            job_inputs_file: Some("/etc/ctrlog/inputs".into()),
            job_max_containers: Some(4),
            job_launch_command: Some("ctrlog container --id {id}".into()),
            ..JobFlags::default()
        };
        let job = job_laid_over("[job]\ninputs = [\"kafka/events/0\"]", given).unwrap();
        assert_eq!(job.inputs, None, "the file replaces the inline list");
        assert_eq!(job.scaling.max, 4);
        let command = ["ctrlog", "container", "--id", "{id}"]
            .map(String::from)
            .to_vec();
        assert_eq!(
            job.launcher,
            LauncherConfig::Process {
                command,
                log_dir: None,
                run_as_user: None,
                run_as_user_range: None,
                run_as_group: None,
                pass_env: Vec::new(),
            }
        );
        assert_eq!(
            job_laid_over("", JobFlags::default()),
            None,
            "no flag, no job"
        );
        let external = JobFlags {
            job_external_launcher: true,
            ..JobFlags::default()
        };
        assert_eq!(job_laid_over("", external), Some(JobConfig::default()));
        // A process launcher of the file keeps its log folder when a flag changes its command.
        let file = "[job]\ninputs = []\n[job.launcher]\nkind = \"process\"\ncommand = [\"a\"]\nlog_dir = \"/logs\"";
        let given = JobFlags {
            job_launch_command: Some("b".into()),
            ..JobFlags::default()
        };
        let launcher = job_laid_over(file, given).unwrap().launcher;
        assert!(
            matches!(&launcher, LauncherConfig::Process { command, log_dir: Some(_), .. } if command == &["b"]),
            "{launcher:?}"
        );
    }
}
