//! The client subcommands of `ctrlog` (append, tail, status, state) and their output.
//!
//! The output formats are an interface: scripts parse `--json`, one object per line. They are
//! built here, in the library, so that tests exercise the same code the binary runs.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use futures::StreamExt;
use serde_json::{json, Value};

pub use crate::server::observe::json::{entry_json, state_json, status_json};

use crate::client::{
    ApiError, AppendAck, ClientError, ClientOptions, ControlClient, FetchRequest, Repairing,
    StateAt, Status, SubscriptionItem,
};
use crate::log::vocabulary::{kind_by_name, kind_label, kind_spec, KINDS, LEVEL_MAX};
use crate::log::{
    Command, Filter, Frame, Kind, Level, LogEntry, Offset, ProducerSeq, Proposal,
    SetVocabularyLevel, Target, TaskId, CUSTOM_KIND_MIN,
};
use crate::server::observe::json::{awaiting_parts, phase_parts, status_name};
use crate::NodeId;

/// The flags the client subcommands connect with: only those subcommands take them (a
/// `serve --ca ...` is refused by the parser instead of starting a plaintext replica), under
/// their own heading in `--help`, and after a nested subcommand too (`members list --cluster`).
#[derive(clap::Args, Clone, Debug)]
#[command(next_help_heading = "Connecting to the cluster")]
pub struct ClientFlags {
    /// Client addresses of any replicas of the cluster.
    #[arg(long, global = true, env = "CTRLOG_CLUSTER", value_delimiter = ',')]
    pub cluster: Vec<String>,
    /// Speak TLS to the cluster, trusting this CA (PEM).
    #[arg(long, global = true, env = "CTRLOG_CA")]
    pub ca: Option<PathBuf>,
    /// This client's certificate (PEM), where the cluster asks for one; with --key.
    #[arg(long, global = true, env = "CTRLOG_CERT", requires = "key")]
    pub cert: Option<PathBuf>,
    /// This client's private key (PEM); with --cert.
    #[arg(long, global = true, env = "CTRLOG_KEY", requires = "cert")]
    pub key: Option<PathBuf>,
    /// A bearer token, where the cluster requires credentials: from the environment only.
    /// Typed as `--token` it would be visible to every user of the machine through `ps`, so
    /// that spelling is refused (exit code 2), naming --token-file and CTRLOG_TOKEN.
    #[arg(
        long,
        global = true,
        env = "CTRLOG_TOKEN",
        hide = true,
        hide_env_values = true
    )]
    pub token: Option<String>,
    /// A file holding the bearer token (its first line), where the cluster requires
    /// credentials; or the token itself in CTRLOG_TOKEN.
    #[arg(
        long,
        global = true,
        env = "CTRLOG_TOKEN_FILE",
        conflicts_with = "token"
    )]
    pub token_file: Option<PathBuf>,
    /// How long dialling one replica may take (`2s`, `500ms`) before the next is tried.
    #[arg(long, global = true, value_parser = humantime::parse_duration, default_value = "2s")]
    pub dial_timeout: Duration,
    /// How long a command keeps trying (failover, other replicas) before it gives up
    /// (exit code 3).
    #[arg(long, global = true, value_parser = humantime::parse_duration, default_value = "10s")]
    pub command_timeout: Duration,
}

/// How a subcommand prints: `-o json` (or v0.1.0's `--json`) for scripts.
#[derive(clap::Args, Clone, Copy, Debug, Default)]
pub struct OutputFlags {
    /// `text` for people, `json` for scripts: one JSON object per line, whose field names
    /// stay stable across releases.
    #[arg(
        short = 'o',
        long = "output",
        global = true,
        value_enum,
        default_value_t = OutputFormat::Text
    )]
    pub output: OutputFormat,
    /// The same as `-o json` (the flag of v0.1.0).
    #[arg(long, global = true)]
    pub json: bool,
}

/// What [`OutputFlags`] asks for.
#[derive(clap::ValueEnum, Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum OutputFormat {
    #[default]
    Text,
    Json,
}

impl OutputFlags {
    /// Whether to print JSON.
    pub fn json(&self) -> bool {
        self.json || self.output == OutputFormat::Json
    }

    /// Prints one result: `json` as one line, or `text` (ended with a newline if it has none).
    pub fn print(
        &self,
        out: &mut dyn std::io::Write,
        text: impl std::fmt::Display,
        json: impl FnOnce() -> Value,
    ) -> std::io::Result<()> {
        if self.json() {
            return writeln!(out, "{}", json());
        }
        let text = text.to_string();
        if text.ends_with('\n') {
            write!(out, "{text}")
        } else {
            writeln!(out, "{text}")
        }
    }
}

impl ClientFlags {
    /// The client options the flags ask for (TLS, when `--ca` is given).
    pub fn options(&self) -> anyhow::Result<ClientOptions> {
        if self.ca.is_none() && self.cert.is_some() {
            // Half a TLS configuration would silently speak plaintext.
            anyhow::bail!(
                "--cert and --key need --ca (or CTRLOG_CA): the CA to check the cluster's \
                 certificates against"
            );
        }
        let tls = match &self.ca {
            Some(ca) => {
                let identity = self.cert.as_deref().zip(self.key.as_deref());
                Some(crate::wire::tls::client_config(ca, identity)?)
            }
            None => None,
        };
        let token = match &self.token_file {
            Some(path) => {
                let text = std::fs::read_to_string(path)
                    .with_context(|| format!("reading the token file {}", path.display()))?;
                let token = text.lines().next().unwrap_or("").trim().to_string();
                anyhow::ensure!(!token.is_empty(), "{} holds no token", path.display());
                Some(token)
            }
            None => self.token.clone(),
        };
        let mut options = ClientOptions::new()
            .connect_timeout(self.dial_timeout)
            .retry_deadline(self.command_timeout)
            .request_timeout(self.command_timeout.min(crate::client::REQUEST_TIMEOUT));
        if let Some(tls) = tls {
            options = options.tls(tls);
        }
        if let Some(token) = token {
            options = options.token(token);
        }
        Ok(options)
    }

    /// The cluster's seeds, or an error saying how to give them.
    pub fn seeds(&self) -> Result<&[String], ClientError> {
        if self.cluster.is_empty() {
            return Err(ClientError::Config {
                option: "--cluster",
                reason: "no cluster given: use --cluster ADDR,ADDR,... or set CTRLOG_CLUSTER"
                    .into(),
            });
        }
        Ok(&self.cluster)
    }

    /// A client connected to the cluster the flags name.
    pub async fn connect(&self) -> anyhow::Result<ControlClient> {
        ControlClient::connect_with(self.seeds()?, self.options()?)
            .await
            .context("connecting to the cluster")
    }
}

/// Parses a command kind: a number as stored (`268435457`) or a user kind (`custom:1`, which
/// is `CUSTOM_KIND_MIN + 1`).
pub fn parse_kind(text: &str) -> Result<Kind, String> {
    let number = |s: &str| {
        s.parse::<Kind>().map_err(|e| {
            format!(
                "kind {text:?}: {e}; a kind is a number, `custom:N`, or a name `ctrlog \
                 vocabulary show` lists"
            )
        })
    };
    if let Some(kind) = kind_by_name(text) {
        return Ok(kind);
    }
    match text.strip_prefix("custom:") {
        Some(user) => CUSTOM_KIND_MIN
            .checked_add(number(user)?)
            .ok_or_else(|| format!("user kind {user} is out of range")),
        None => number(text),
    }
}

/// A time in milliseconds since the Unix epoch as RFC 3339, in UTC to the millisecond.
pub fn rfc3339_ms(ms: u64) -> String {
    let at = time::OffsetDateTime::from_unix_timestamp_nanos(i128::from(ms) * 1_000_000)
        .unwrap_or(time::OffsetDateTime::UNIX_EPOCH);
    let at = at.replace_millisecond((ms % 1000) as u16).unwrap_or(at);
    at.format(&time::format_description::well_known::Rfc3339)
        .unwrap_or_else(|_| format!("{ms} ms"))
}

/// `ctrlog append`: appends one command and returns its acknowledgement. With a
/// `(producer, seq)` the append is idempotent across invocations; without one the client
/// draws a fresh producer id (idempotent across its own retries only).
pub async fn append(
    client: &ControlClient,
    target: Target,
    frame: Frame,
    producer: Option<ProducerSeq>,
) -> Result<AppendAck, ClientError> {
    match producer {
        Some(pair) => {
            client
                .append_proposal(Proposal {
                    producer: Some(pair),
                    target,
                    frame,
                })
                .await
        }
        None => client.append_to(target, Command::from_frame(frame)).await,
    }
}

/// One entry as `ctrlog tail` prints it for people.
pub fn entry_line(entry: &LogEntry) -> String {
    let producer = entry.producer.map_or("-".to_string(), |p| {
        format!("{:016x}/{}", p.producer, p.seq)
    });
    // A built-in command reads as what it does; a custom one as its payload.
    let payload = match (
        kind_spec(entry.frame.kind, entry.frame.version),
        std::str::from_utf8(&entry.frame.body),
    ) {
        (Some(_), _) => entry.summary(),
        (None, Ok(text)) => format!("{text:?}"),
        (None, Err(_)) => format!("<{} bytes>", entry.frame.body.len()),
    };
    format!(
        "{:>8}  term {}  {}  {} v{}  -> {}  producer {}  {}",
        entry.offset,
        entry.term,
        rfc3339_ms(entry.appended_at_ms),
        kind_label(entry.frame.kind, entry.frame.version),
        entry.frame.version,
        entry.target,
        producer,
        payload
    )
}

/// What `tail` should read.
pub struct TailOptions {
    pub from: Offset,
    /// Keep waiting for new commands instead of stopping at the end of the committed log.
    pub follow: bool,
    /// Stop after this many entries.
    pub max: Option<u64>,
    pub filter: Filter,
    pub json: bool,
}

fn reset_line(offset: Offset, json: bool) -> String {
    if json {
        json!({ "reset": { "offset": offset } }).to_string()
    } else {
        format!("-- offsets up to {offset} were compacted; resuming after the state as of {offset}")
    }
}

/// `ctrlog tail`: prints committed entries, one per line. Without `follow` it stops at the
/// leader's applied offset as of the start. A compacted position prints a `reset` line and
/// continues after the state's offset, as a subscription does.
pub async fn tail(
    client: &ControlClient,
    options: &TailOptions,
    out: &mut impl Write,
) -> anyhow::Result<()> {
    let mut printed = 0u64;
    let done = |printed: u64| options.max.is_some_and(|max| printed >= max);
    if done(printed) {
        return Ok(());
    }
    let print = |out: &mut dyn Write, entry: &LogEntry| -> std::io::Result<()> {
        if options.json {
            writeln!(out, "{}", entry_json(entry))
        } else {
            writeln!(out, "{}", entry_line(entry))
        }
    };
    if options.follow {
        let mut stream = client.subscribe(options.from, options.filter.clone());
        while let Some(item) = stream.next().await {
            match item? {
                SubscriptionItem::Entry(entry) => {
                    print(out, &entry)?;
                    out.flush()?;
                    printed += 1;
                    if done(printed) {
                        break;
                    }
                }
                SubscriptionItem::Reset { offset, .. } => {
                    writeln!(out, "{}", reset_line(offset, options.json))?;
                }
            }
        }
        return Ok(());
    }
    let end = client
        .leader_status()
        .await
        .context("asking the leader where the log ends")?
        .applied_offset;
    let mut from = options.from.max(1);
    while from <= end && !done(printed) {
        let request = FetchRequest {
            filter: options.filter.clone(),
            ..FetchRequest::from(from)
        };
        match client.fetch(request).await {
            Ok(response) => {
                for entry in response.entries.iter().take_while(|e| e.offset <= end) {
                    print(out, entry)?;
                    printed += 1;
                    if done(printed) {
                        break;
                    }
                }
                from = response.next_offset;
            }
            Err(ClientError::Api(ApiError::Compacted { .. })) => {
                let at = client.state(from - 1).await?;
                writeln!(out, "{}", reset_line(at.offset, options.json))?;
                from = at.offset + 1;
            }
            Err(error) => return Err(error.into()),
        }
    }
    Ok(())
}

/// `ctrlog status` for people.
pub fn status_text(status: &Status, repairing: Option<&Repairing>) -> String {
    let leader = match (status.leader_id, status.leader_client_addr()) {
        (Some(id), Some(addr)) => format!("{id} at {addr}"),
        (Some(id), None) => id.to_string(),
        (None, _) => "unknown".into(),
    };
    let mut text = format!(
        "replica {} is {} in term {}; leader: {leader}\n\
         offsets: first retained {}, committed and applied {}, snapshot {}\n\
         members:\n",
        status.id,
        status.role,
        status.term,
        status.first_offset,
        status.applied_offset,
        status.snapshot_offset,
    );
    for m in &status.members {
        text.push_str(&format!(
            "  {} {} peer={} client={}\n",
            m.id,
            if m.voter { "voter  " } else { "learner" },
            m.member.peer_addr,
            m.member.client_addr
        ));
    }
    if let Some(repairing) = repairing {
        text.push_str(&format!(
            "{repairing}: this replica neither votes nor stands until the leader has sent them again\n"
        ));
    }
    text
}

/// One replica's own view on one line, for `ctrlog status --all-replicas`.
pub fn status_line(status: &Status, repairing: Option<&Repairing>, build: &str) -> String {
    format!(
        "{:<3} {:<21} {:<9} term {:<4} leader {:<4} applied {:<8} first {:<8} snapshot {:<8} {build}{}",
        status.id,
        status
            .members
            .iter()
            .find(|m| m.id == status.id)
            .map_or("?", |m| m.member.client_addr.as_str()),
        status.role,
        status.term,
        status.leader_id.map_or("-".into(), |id| id.to_string()),
        status.applied_offset,
        status.first_offset,
        status.snapshot_offset,
        repairing.map_or(String::new(), |r| format!("  {r}")),
    )
}

/// `ctrlog members list` for people: one replica per line, the leader marked, with the build
/// each runs (`builds`, by id; a rolling upgrade's progress).
pub fn members_text(status: &Status, builds: &BTreeMap<NodeId, String>) -> String {
    let mut text =
        String::from("ID  ROLE     LEADER  PEER                   CLIENT                 BUILD\n");
    for m in &status.members {
        text.push_str(&format!(
            "{:<2}  {}  {:<6}  {:<21}  {:<21}  {}\n",
            m.id,
            if m.voter { "voter  " } else { "learner" },
            if status.leader_id == Some(m.id) {
                "yes"
            } else {
                "-"
            },
            m.member.peer_addr,
            m.member.client_addr,
            builds.get(&m.id).map_or("-", String::as_str),
        ));
    }
    text
}

/// `ctrlog members list -o json`: `{"leader_id":…,"members":[{"id","voter","leader",
/// "peer_addr","client_addr","build"}]}`.
pub fn members_json(status: &Status, builds: &BTreeMap<NodeId, String>) -> Value {
    let members: Vec<Value> = status
        .members
        .iter()
        .map(|m| {
            json!({
                "id": m.id,
                "voter": m.voter,
                "leader": status.leader_id == Some(m.id),
                "peer_addr": m.member.peer_addr,
                "client_addr": m.member.client_addr,
                "build": builds.get(&m.id),
            })
        })
        .collect();
    json!({ "leader_id": status.leader_id, "members": members })
}

/// `ctrlog vocabulary show -o json`: the recorded level, this build's highest, and every
/// built-in kind with what the level allows.
pub fn vocabulary_json(level: Level) -> Value {
    let kinds: Vec<Value> = KINDS
        .iter()
        .map(|spec| {
            json!({
                "kind": spec.kind,
                "version": spec.version,
                "name": spec.name,
                "since": spec.since,
                "deprecated_since": spec.deprecated_since,
                "allowed": allowed_at(spec, level),
            })
        })
        .collect();
    json!({ "level": level, "level_max": LEVEL_MAX, "kinds": kinds })
}

/// `ctrlog vocabulary raise`: raises the recorded vocabulary level. The leader first asks
/// every member whether its build knows the level (the rule that keeps a rolling upgrade
/// safe) and refuses with `LevelUnsupported` if one does not; an admin's right.
pub async fn raise_level(client: &ControlClient, level: Level) -> Result<AppendAck, ClientError> {
    client
        .append(Command::SetVocabularyLevel(SetVocabularyLevel { level }))
        .await
}

/// Whether a kind may be written at `level`.
fn allowed_at(spec: &crate::log::vocabulary::KindSpec, level: Level) -> bool {
    spec.since <= level && spec.deprecated_since.is_none_or(|d| level < d)
}

/// `ctrlog vocabulary show`: the built-in kinds and what the recorded level allows.
pub fn vocabulary_text(level: Level) -> String {
    use std::fmt::Write as _;
    let mut out = format!(
        "recorded vocabulary level {level}; this build supports up to {LEVEL_MAX}\n\nKIND  VERSION  NAME                   SINCE  DEPRECATED  ALLOWED NOW\n"
    );
    for spec in KINDS {
        let deprecated = spec
            .deprecated_since
            .map_or("-".to_string(), |since| format!("at {since}"));
        let allowed = allowed_at(spec, level);
        let _ = writeln!(
            out,
            "{:>4}  {:>7}  {:<21}  {:>5}  {:<10}  {}",
            spec.kind,
            spec.version,
            spec.name,
            spec.since,
            deprecated,
            if allowed { "yes" } else { "no" }
        );
    }
    out
}

/// One `ctrlog bench` result as a line for people.
pub fn bench_line(result: &Value) -> String {
    let ms = |key: &str| result[key].as_u64().unwrap_or(0) as f64 / 1000.0;
    match result["workload"].as_str() {
        Some("append") => format!(
            "append  clients {:>4}  connections {:>4}  {:>8} commits/s  p50 {:>7.2} ms  p99 {:>7.2} ms  p99.9 {:>7.2} ms  max {:>7.2} ms  errors {}  (disk fdatasync p50 {:.3} ms)  CPU per commit: {}  leader stages p50/p99: {}",
            result["clients"], result["connections"], result["ops_per_s"], ms("p50_us"), ms("p99_us"), ms("p999_us"), ms("max_us"), result["errors"], ms("fdatasync_p50_us"),
            cpu_line(result), stages_line(result)
        ),
        Some("fanout") => format!(
            "fanout  subscribers {}  rate {}/s  delivered {}/{}  lag p50 {:.2} ms  p99 {:.2} ms  max {:.2} ms  append p99 {:.2} ms",
            result["subscribers"], result["rate"], result["delivered"], result["expected"],
            ms("lag_p50_us"), ms("lag_p99_us"), ms("lag_max_us"), ms("append_p99_us")
        ),
        Some("recovery") => format!(
            "recovery  {} commands, snapshots {}: answering after {} ms, caught up after {} ms; before the kill: RSS {} MiB, disk {} MiB",
            result["commands"], result["snapshots"], result["answering_ms"], result["caught_up_ms"],
            result["rss_before_kill_bytes"].as_u64().unwrap_or(0) >> 20,
            result["disk_bytes"].as_u64().unwrap_or(0) >> 20
        ),
        Some("scale") => format!(
            "scale  {} containers, {} inputs ({} tasks): settled after {:.1} s; {} heartbeats/s p50 {:.2} ms p99 {:.2} ms, leader CPU {} µs per heartbeat, cores {}; controller tick p50 {:.2} ms p99 {:.2} ms; state {} ms, {} KiB; snapshot {} ms; follower restart answering {} ms, caught up {} ms; RSS {} MiB (disk fdatasync p50 {:.3} ms)",
            result["containers"], result["inputs"], result["tasks"], ms("settled_ms"),
            result["heartbeats_per_s"], ms("heartbeat_p50_us"), ms("heartbeat_p99_us"),
            result["leader_cpu_per_heartbeat_us"], result["cores"],
            ms("controller_tick_p50_us"), ms("controller_tick_p99_us"),
            result["state_ms_median"], result["state_bytes"].as_u64().unwrap_or(0) >> 10,
            result["snapshot_build_ms"], result["restart_answering_ms"], result["restart_caught_up_ms"],
            result["rss_bytes"].as_array().map_or(String::new(), |all| all.iter().map(|b| (b.as_u64().unwrap_or(0) >> 20).to_string()).collect::<Vec<_>>().join("/")),
            ms("fdatasync_p50_us")
        ),
        _ => result.to_string(),
    }
}

/// `cpu_per_commit_us` for people: each process's µs per commit (the leader marked), then the
/// total.
fn cpu_line(result: &Value) -> String {
    let Some(figures) = result["cpu_per_commit_us"].as_object() else {
        return "not measured".into();
    };
    let leader = result["leader"].as_str().unwrap_or_default();
    let mut parts: Vec<String> = figures
        .iter()
        .filter(|(name, _)| *name != "total")
        .map(|(name, us)| match name == leader {
            true => format!("{name} (leader) {us} µs"),
            false => format!("{name} {us} µs"),
        })
        .collect();
    parts.push(format!("total {} µs", figures["total"]));
    parts.join(", ")
}

/// `leader_stages` for people: each stage's p50 / p99 in milliseconds, in the commit path's
/// order.
fn stages_line(result: &Value) -> String {
    let stages = &result["leader_stages"];
    if !stages.is_object() {
        return "not measured".into();
    }
    ["queued", "raft", "log_sync", "replicated", "applied"]
        .iter()
        .filter(|stage| stages[**stage].is_object())
        .map(|stage| {
            let ms = |q: &str| {
                stages[*stage][q]
                    .as_f64()
                    .map_or("-".into(), |us| format!("{:.2}", us / 1000.0))
            };
            format!("{stage} {} / {} ms", ms("p50_us"), ms("p99_us"))
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// `ctrlog chaos` figures for people.
pub fn chaos_text(figures: &Value) -> String {
    let counts = |object: &Value, render: &dyn Fn(&str, &Value) -> String| {
        object
            .as_object()
            .map(|o| {
                o.iter()
                    .map(|(k, v)| render(k, v))
                    .collect::<Vec<_>>()
                    .join(", ")
            })
            .unwrap_or_default()
    };
    let quantiles = |q: &Value| {
        format!(
            "p50 {} ms, p99 {} ms, max {} ms ({})",
            q["p50"], q["p99"], q["max"], q["count"]
        )
    };
    format!(
        "chaos seed {seed}: {rounds} rounds ({faults})\n\
         acknowledged appends {acked} (log reached offset {last}); lost {lost}; duplicated {dup}; violations {v}\n\
         log ids holding different entries {forks} (of {compared} WAL entries compared); tasks run twice {double}\n\
         power losses in the window {in_window}; back on the peer port {back}\n\
         failover (fault → first commit under a new leader): {all}\n  {kinds}\n\
         subscribers caught up {catch} ms after the load stopped",
        seed = figures["seed"],
        rounds = figures["rounds"],
        faults = counts(&figures["faults"], &|k, v| format!("{v} {k}")),
        acked = figures["acked_appends"],
        last = figures["committed_offsets"],
        lost = figures["lost"],
        dup = figures["duplicates"],
        v = figures["violations"],
        forks = figures["forked_log_ids"],
        compared = figures["log_entries_compared"],
        double = figures["double_runs"],
        in_window = figures["power_losses_in_window"],
        back = quantiles(&figures["power_loss_back_ms"]),
        all = quantiles(&figures["failover_all_ms"]),
        kinds = counts(&figures["failover_ms"], &|k, q| format!("{k}: {}", quantiles(q))),
        catch = figures["subscriber_catch_up_ms"],
    )
}

/// `ctrlog state` for people: one table per part of the job.
pub fn state_text(at: &StateAt) -> String {
    use std::fmt::Write as _;
    let state = &at.state;
    let mut out = String::new();
    let desired = state
        .desired_containers()
        .map_or("not set".to_string(), |d| {
            format!(
                "{} (offset {}{}{})",
                d.count,
                d.offset,
                if d.reason.is_empty() { "" } else { ": " },
                d.reason
            )
        });
    let _ = writeln!(
        out,
        "state as of offset {}; vocabulary level {}; desired containers: {desired}; live: {}",
        at.offset,
        state.level(),
        state.live_sessions().count()
    );
    let _ = writeln!(out, "\nCONTAINER             EPOCH  STATUS        LOCATION");
    for (id, record) in state.containers() {
        let _ = writeln!(
            out,
            "{:<20}  {:>5}  {:<12}  {}",
            id.as_str(),
            record.epoch,
            status_name(record.status),
            record.location
        );
    }
    let _ = writeln!(
        out,
        "\nTASK                  PHASE       OWNER                 AT     INPUTS"
    );
    for (id, record) in state.tasks() {
        let (phase, owner, offset) = phase_parts(&record.phase);
        let inputs: Vec<String> = record.inputs.iter().map(ToString::to_string).collect();
        let _ = writeln!(
            out,
            "{:<20}  {:<10}  {:<20}  {:>5}  {}",
            id.as_str(),
            phase,
            owner.map_or("-".to_string(), ToString::to_string),
            offset.map_or("-".to_string(), |o| o.to_string()),
            inputs.join(" ")
        );
    }
    let unassigned: Vec<String> = state
        .inputs()
        .iter()
        .filter(|(_, task)| task.is_none())
        .map(|(input, _)| input.to_string())
        .collect();
    let _ = writeln!(
        out,
        "\ninputs: {} ({} in no task{}{})",
        state.inputs().len(),
        unassigned.len(),
        if unassigned.is_empty() { "" } else { ": " },
        unassigned.join(" ")
    );
    let _ = writeln!(
        out,
        "\nPENDING  AWAITING      TASK                  OWED BY"
    );
    for (offset, handshake) in state.pending() {
        let (awaiting, task) = awaiting_parts(&handshake.awaiting);
        let owed: Vec<String> = handshake
            .owed_by
            .iter()
            .map(|(c, epoch)| format!("{c}@{epoch}"))
            .collect();
        let _ = writeln!(
            out,
            "{:>7}  {:<12}  {:<20}  {}",
            offset,
            awaiting,
            task.map_or("-", TaskId::as_str),
            owed.join(" ")
        );
    }
    for (subject, record) in state.schemas() {
        let _ = writeln!(
            out,
            "schema {subject}: {} bytes (offset {})",
            record.schema.len(),
            record.offset
        );
    }
    for (key, value) in state.config() {
        let _ = writeln!(out, "config {key} = {value}");
    }
    let _ = writeln!(out, "\nrefused commands: {}", at.rejections.total);
    for r in at.rejections.recent.iter().rev().take(10) {
        let _ = writeln!(
            out,
            "  after offset {}: {} v{}: {}",
            r.after_offset,
            kind_label(r.kind, r.version),
            r.version,
            r.rejection
        );
    }
    out
}

/// `ctrlog check`'s report for people: each fault, then the notes, then a count.
pub fn check_text(report: &crate::raft::check::Report) -> String {
    let mut lines: Vec<String> = (report.faults.iter())
        .map(|f| format!("FAULT {} {}: {}", f.kind, f.file.display(), f.detail))
        .collect();
    lines.extend(report.notes.iter().map(|note| format!("note: {note}")));
    lines.push(match report.faults.len() {
        0 => "no faults found".into(),
        n => format!("{n} fault(s) found"),
    });
    lines.join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::log::{Command, ContainerId};

    #[test]
    fn kinds_parse_as_numbers_names_or_user_kinds() {
        assert_eq!(parse_kind("7"), Ok(7));
        assert_eq!(parse_kind("custom:1"), Ok(CUSTOM_KIND_MIN + 1));
        assert_eq!(
            parse_kind("schema-change"),
            Ok(crate::log::kinds::SCHEMA_CHANGE)
        );
        assert!(parse_kind("custom:4294967295").is_err());
        assert!(parse_kind("seven").unwrap_err().contains("vocabulary show"));
        for spec in KINDS {
            assert_eq!(
                parse_kind(&kind_label(spec.kind, spec.version)),
                Ok(spec.kind)
            );
        }
    }

    /// Goal: `ctrlog tail` shows people the kind's name and an RFC 3339 time, not numbers.
    #[test]
    fn entry_lines_name_the_kind_and_the_time() {
        let entry = LogEntry {
            offset: 3,
            term: 2,
            appended_at_ms: 1_700_000_000_123,
            producer: None,
            target: Target::All,
            frame: Command::custom(1, 2, b"hello".to_vec()).into_frame(),
        };
        let line = entry_line(&entry);
        assert!(line.contains("2023-11-14T22:13:20.123Z"), "{line}");
        assert!(line.contains("custom:1 v2"), "{line}");
        assert_eq!(parse_kind("custom:1"), Ok(entry.frame.kind));
    }

    #[test]
    fn json_entries_carry_text_or_base64_payloads() {
        let mut entry = LogEntry {
            offset: 3,
            term: 2,
            appended_at_ms: 1_700_000_000_000,
            producer: Some(ProducerSeq {
                producer: 9,
                seq: 4,
            }),
            target: Target::Container(ContainerId::new("c1").unwrap()),
            frame: Command::custom(1, 2, b"hello".to_vec()).into_frame(),
        };
        let text = entry_json(&entry);
        assert_eq!(text["offset"], 3);
        assert_eq!(text["kind"], CUSTOM_KIND_MIN + 1);
        assert_eq!(text["version"], 2);
        assert_eq!(text["target"], "container:c1");
        assert_eq!(text["producer"], 9);
        assert_eq!(text["seq"], 4);
        assert_eq!(text["payload"], "hello");
        assert!(text.get("payload_b64").is_none());

        entry.frame.body = vec![0xff, 0x00];
        let binary = entry_json(&entry);
        assert_eq!(binary["payload_b64"], "/wA=");
        assert!(binary.get("payload").is_none());
    }
}
