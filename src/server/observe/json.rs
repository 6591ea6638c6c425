//! The JSON renderings of wire types that both the CLI (`ctrlog tail --json`, `status --json`,
//! `state --json`) and the observability port (`/status.json`) print. They are an interface:
//! scripts and the status page parse them, so they are written once, here.

use base64::Engine;
use serde_json::{json, Value};

use crate::jobs::{Awaiting, ContainerStatus, Session, TaskPhase};
use crate::log::vocabulary::{kind_label, kind_spec};
use crate::log::{LogEntry, Offset, TaskId};
use crate::wire::{StateAt, Status};

/// One entry as `ctrlog tail --json` prints it. The payload is UTF-8 text in `payload` when
/// it is valid UTF-8, else base64 in `payload_b64`. v0.1.0's fields keep their meaning;
/// `producer_id` (the producer as text), `kind_name` and, for a built-in command, `summary`
/// (what it does, as the status page says it) came after.
pub fn entry_json(entry: &LogEntry) -> Value {
    let mut object = json!({
        "offset": entry.offset,
        "term": entry.term,
        "appended_at_ms": entry.appended_at_ms,
        "kind": entry.frame.kind,
        "version": entry.frame.version,
        "target": entry.target.to_string(),
        "producer": entry.producer.map(|p| p.producer),
        // As text too: jq and JavaScript read integers above 2^53 rounded.
        "producer_id": entry.producer.map(|p| p.producer.to_string()),
        "seq": entry.producer.map(|p| p.seq),
        "kind_name": kind_label(entry.frame.kind, entry.frame.version),
    });
    if kind_spec(entry.frame.kind, entry.frame.version).is_some() {
        object["summary"] = Value::from(entry.summary());
    }
    match std::str::from_utf8(&entry.frame.body) {
        Ok(text) => object["payload"] = Value::from(text),
        Err(_) => {
            object["payload_b64"] =
                Value::from(base64::engine::general_purpose::STANDARD.encode(&entry.frame.body))
        }
    }
    object
}

/// `ctrlog status --json`.
/// A replica's status as JSON, with the repair of its log under way if there is one
/// (`repairing: entries a..b damaged ...`).
pub fn status_json(status: &Status, repairing: Option<String>) -> Value {
    json!({
        "repairing": repairing,
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

/// Bytes as JSON: a `key` string when they are UTF-8, else base64 under `key_b64`.
pub fn put_bytes(object: &mut Value, key: &str, bytes: &[u8]) {
    match std::str::from_utf8(bytes) {
        Ok(text) => object[key] = Value::from(text),
        Err(_) => {
            object[format!("{key}_b64")] =
                Value::from(base64::engine::general_purpose::STANDARD.encode(bytes))
        }
    }
}

pub fn status_name(status: ContainerStatus) -> &'static str {
    match status {
        ContainerStatus::Live => "live",
        ContainerStatus::Deregistered => "deregistered",
        ContainerStatus::Expired => "expired",
        ContainerStatus::Launching { .. } => "launching",
    }
}

/// A task's phase as `(name, owner, the offset it refers to)`.
pub fn phase_parts(phase: &TaskPhase) -> (&'static str, Option<&Session>, Option<Offset>) {
    match phase {
        TaskPhase::Unassigned => ("unassigned", None, None),
        TaskPhase::Starting { owner, at } => ("starting", Some(owner), Some(*at)),
        TaskPhase::Running { owner, since } => ("running", Some(owner), Some(*since)),
        TaskPhase::Stopping { owner, at } => ("stopping", Some(owner), Some(*at)),
    }
}

pub fn awaiting_parts(awaiting: &Awaiting) -> (&'static str, Option<&TaskId>) {
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
