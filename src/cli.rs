//! The client subcommands of `ctrlog` (append, tail, status, state) and their output.
//!
//! The output formats are an interface: scripts parse `--json`, one object per line. They are
//! built here, in the library, so that tests exercise the same code the binary runs.

use std::io::Write;

use anyhow::Context;
use base64::Engine;
use futures::StreamExt;
use serde_json::{json, Value};

use crate::client::{
    ApiError, AppendAck, ClientError, ClientOptions, ControlClient, FetchRequest, StateAt, Status,
    SubscriptionItem,
};
use crate::jobs::{Awaiting, ContainerStatus, Session, TaskPhase};
use crate::log::vocabulary::{KINDS, LEVEL_MAX};
use crate::log::{
    Command, Filter, Frame, Kind, Level, LogEntry, Offset, ProducerSeq, Proposal,
    SetVocabularyLevel, Target, TaskId, CUSTOM_KIND_MIN,
};

/// Parses a command kind: a number as stored (`268435457`) or a user kind (`custom:1`, which
/// is `CUSTOM_KIND_MIN + 1`).
pub fn parse_kind(text: &str) -> Result<Kind, String> {
    let number = |s: &str| s.parse::<Kind>().map_err(|e| format!("kind {text:?}: {e}"));
    match text.strip_prefix("custom:") {
        Some(user) => CUSTOM_KIND_MIN
            .checked_add(number(user)?)
            .ok_or_else(|| format!("user kind {user} is out of range")),
        None => number(text),
    }
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

/// One entry as `ctrlog tail --json` prints it. The payload is UTF-8 text in `payload` when
/// it is valid UTF-8, else base64 in `payload_b64`.
pub fn entry_json(entry: &LogEntry) -> Value {
    let mut object = json!({
        "offset": entry.offset,
        "term": entry.term,
        "appended_at_ms": entry.appended_at_ms,
        "kind": entry.frame.kind,
        "version": entry.frame.version,
        "target": entry.target.to_string(),
        "producer": entry.producer.map(|p| p.producer),
        "seq": entry.producer.map(|p| p.seq),
    });
    match std::str::from_utf8(&entry.frame.body) {
        Ok(text) => object["payload"] = Value::from(text),
        Err(_) => {
            object["payload_b64"] =
                Value::from(base64::engine::general_purpose::STANDARD.encode(&entry.frame.body))
        }
    }
    object
}

/// One entry as `ctrlog tail` prints it for people.
pub fn entry_line(entry: &LogEntry) -> String {
    let producer = entry.producer.map_or("-".to_string(), |p| {
        format!("{:016x}/{}", p.producer, p.seq)
    });
    let payload = match std::str::from_utf8(&entry.frame.body) {
        Ok(text) => format!("{text:?}"),
        Err(_) => format!("<{} bytes>", entry.frame.body.len()),
    };
    format!(
        "{:>8}  term {}  {}  kind {} v{}  -> {}  producer {}  {}",
        entry.offset,
        entry.term,
        entry.appended_at_ms,
        entry.frame.kind,
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

/// `ctrlog status --json`.
pub fn status_json(status: &Status) -> Value {
    json!({
        "id": status.id,
        "role": status.role,
        "term": status.term,
        "leader_id": status.leader_id,
        "leader_client_addr": status.leader_client_addr(),
        "members": status.members.iter().map(|m| json!({
            "id": m.id,
            "voter": m.voter,
            "peer_addr": m.member.peer_addr,
            "client_addr": m.member.client_addr,
        })).collect::<Vec<_>>(),
        "commit_offset": status.applied_offset,
        "applied_offset": status.applied_offset,
        "first_offset": status.first_offset,
        "snapshot_offset": status.snapshot_offset,
        "last_log_index": status.last_log_index,
        "applied_index": status.applied_index,
        "snapshot_index": status.snapshot_index,
        "purged_index": status.purged_index,
    })
}

/// `ctrlog status` for people.
pub fn status_text(status: &Status) -> String {
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
    text
}

/// `ctrlog vocabulary raise`: raises the recorded vocabulary level, after checking that every
/// replica's build supports it (the rule that keeps a rolling upgrade safe).
pub async fn raise_level(client: &ControlClient, level: Level) -> anyhow::Result<AppendAck> {
    let leader = client.leader_status().await?;
    for member in &leader.members {
        let seed = [member.member.client_addr.clone()];
        let options = ClientOptions {
            retry_deadline: std::time::Duration::from_secs(5),
            ..ClientOptions::default()
        };
        let status = async {
            ControlClient::connect_with(&seed, options)
                .await?
                .status()
                .await
        }
        .await
        .with_context(|| format!("asking replica {} which levels it supports", member.id))?;
        if status.vocabulary_level_max < level {
            anyhow::bail!(
                "replica {} supports vocabulary levels up to {}; upgrade it before raising the level to {level}",
                member.id,
                status.vocabulary_level_max
            );
        }
    }
    Ok(client
        .append(Command::SetVocabularyLevel(SetVocabularyLevel { level }))
        .await?)
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
        let allowed = spec.since <= level && spec.deprecated_since.is_none_or(|d| level < d);
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
            "append  clients {:>4}  connections {:>4}  {:>8} commits/s  p50 {:>7.2} ms  p99 {:>7.2} ms  p99.9 {:>7.2} ms  max {:>7.2} ms  errors {}",
            result["clients"], result["connections"], result["ops_per_s"], ms("p50_us"), ms("p99_us"), ms("p999_us"), ms("max_us"), result["errors"]
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
        _ => result.to_string(),
    }
}

/// `ctrlog chaos` figures for people.
pub fn chaos_text(figures: &Value) -> String {
    format!(
        "chaos seed {seed}: {rounds} rounds ({lk} leader kills, {rk} other kills, {p} leader pauses)\n\
         acknowledged appends {acked} (log reached offset {last}); lost {lost}; duplicated {dup}; violations {v}\n\
         failover (fault → first commit under a new leader): p50 {f50} ms, p99 {f99} ms, max {fmax} ms\n\
         subscribers caught up {catch} ms after the load stopped",
        seed = figures["seed"],
        rounds = figures["rounds"],
        lk = figures["leader_kills"],
        rk = figures["replica_kills"],
        p = figures["leader_pauses"],
        acked = figures["acked_appends"],
        last = figures["committed_offsets"],
        lost = figures["lost"],
        dup = figures["duplicates"],
        v = figures["violations"],
        f50 = figures["failover_p50_ms"],
        f99 = figures["failover_p99_ms"],
        fmax = figures["failover_max_ms"],
        catch = figures["subscriber_catch_up_ms"],
    )
}

/// Bytes as JSON: a `key` string when they are UTF-8, else base64 under `key_b64`.
fn put_bytes(object: &mut Value, key: &str, bytes: &[u8]) {
    match std::str::from_utf8(bytes) {
        Ok(text) => object[key] = Value::from(text),
        Err(_) => {
            object[format!("{key}_b64")] =
                Value::from(base64::engine::general_purpose::STANDARD.encode(bytes))
        }
    }
}

fn status_name(status: ContainerStatus) -> &'static str {
    match status {
        ContainerStatus::Live => "live",
        ContainerStatus::Deregistered => "deregistered",
        ContainerStatus::Expired => "expired",
    }
}

/// A task's phase as `(name, owner, the offset it refers to)`.
fn phase_parts(phase: &TaskPhase) -> (&'static str, Option<&Session>, Option<Offset>) {
    match phase {
        TaskPhase::Unassigned => ("unassigned", None, None),
        TaskPhase::Starting { owner, at } => ("starting", Some(owner), Some(*at)),
        TaskPhase::Running { owner, since } => ("running", Some(owner), Some(*since)),
        TaskPhase::Stopping { owner, at } => ("stopping", Some(owner), Some(*at)),
    }
}

fn awaiting_parts(awaiting: &Awaiting) -> (&'static str, Option<&TaskId>) {
    match awaiting {
        Awaiting::TaskStarted { task } => ("task-started", Some(task)),
        Awaiting::TaskStopped { task } => ("task-stopped", Some(task)),
        Awaiting::Acks => ("acks", None),
    }
}

/// `ctrlog state --json`: the whole JobState as of an offset, in a stable JSON shape (inputs
/// as `system/stream/partition` strings, bytes as text or base64).
pub fn state_json(at: &StateAt) -> Value {
    let state = &at.state;
    let containers: Vec<Value> = state
        .containers()
        .iter()
        .map(|(id, record)| {
            json!({
                "id": id.as_str(),
                "epoch": record.epoch,
                "status": status_name(record.status),
                "location": record.location,
                "registered_at_ms": record.registered_at_ms,
            })
        })
        .collect();
    let tasks: Vec<Value> = state
        .tasks()
        .iter()
        .map(|(id, record)| {
            let (phase, owner, offset) = phase_parts(&record.phase);
            let mut task = json!({
                "id": id.as_str(),
                "inputs": record.inputs.iter().map(ToString::to_string).collect::<Vec<_>>(),
                "phase": phase,
                "owner": owner.map(|o| o.container.as_str()),
                "epoch": owner.map(|o| o.epoch),
                "phase_offset": offset,
            });
            if let Some(checkpoint) = &record.checkpoint {
                put_bytes(&mut task, "checkpoint", checkpoint);
            }
            task
        })
        .collect();
    let inputs: serde_json::Map<String, Value> = state
        .inputs()
        .iter()
        .map(|(input, task)| (input.to_string(), json!(task.as_ref().map(TaskId::as_str))))
        .collect();
    let pending: Vec<Value> = state
        .pending()
        .iter()
        .map(|(offset, handshake)| {
            let (awaiting, task) = awaiting_parts(&handshake.awaiting);
            json!({
                "offset": offset,
                "awaiting": awaiting,
                "task": task.map(TaskId::as_str),
                "owed_by": handshake.owed_by.iter()
                    .map(|(c, epoch)| json!({"container": c.as_str(), "epoch": epoch}))
                    .collect::<Vec<_>>(),
            })
        })
        .collect();
    let schemas: Vec<Value> = state
        .schemas()
        .iter()
        .map(|(subject, record)| {
            let mut schema = json!({"subject": subject, "offset": record.offset});
            put_bytes(&mut schema, "schema", &record.schema);
            schema
        })
        .collect();
    json!({
        "offset": at.offset,
        "next_offset": state.next_offset(),
        "vocabulary_level": state.level(),
        "containers": containers,
        "tasks": tasks,
        "inputs": inputs,
        "pending": pending,
        "schemas": schemas,
        "config": state.config(),
        "desired_containers": state.desired_containers().map(|d| json!({
            "count": d.count, "reason": d.reason, "offset": d.offset,
        })),
        "producers": state.producers().len(),
        "rejections": {
            "total": at.rejections.total,
            "recent": at.rejections.recent.iter().map(|r| json!({
                "after_offset": r.after_offset,
                "kind": r.kind,
                "version": r.version,
                "appended_at_ms": r.appended_at_ms,
                "reason": r.rejection.to_string(),
            })).collect::<Vec<_>>(),
        },
    })
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
        "state as of offset {}; vocabulary level {}; desired containers: {desired}",
        at.offset,
        state.level()
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
            crate::log::vocabulary::kind_name(r.kind, r.version),
            r.version,
            r.rejection
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::log::{Command, ContainerId};

    #[test]
    fn kinds_parse_as_numbers_or_user_kinds() {
        assert_eq!(parse_kind("7"), Ok(7));
        assert_eq!(parse_kind("custom:1"), Ok(CUSTOM_KIND_MIN + 1));
        assert!(parse_kind("custom:4294967295").is_err());
        assert!(parse_kind("seven").is_err());
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
