//! What the admin subcommands print, for people (text) and for scripts (JSON). The output
//! formats are an interface: scripts parse `-o json`, one object per line. They are built
//! here, in the library, so that tests exercise the same code the binary runs.

use std::collections::BTreeMap;

use serde_json::{json, Value};

pub use crate::server::observe::json::{entry_json, state_json, status_json};

use crate::client::{Repairing, StateAt, Status};
use crate::log::vocabulary::{kind_label, kind_spec, KindSpec, KINDS, LEVEL_MAX};
use crate::log::{Level, LogEntry, TaskId};
use crate::server::observe::json::{awaiting_parts, phase_parts, status_name};
use crate::NodeId;

/// A time in milliseconds since the Unix epoch as RFC 3339, in UTC to the millisecond.
pub fn rfc3339_ms(ms: u64) -> String {
    let at = time::OffsetDateTime::from_unix_timestamp_nanos(i128::from(ms) * 1_000_000)
        .unwrap_or(time::OffsetDateTime::UNIX_EPOCH);
    let at = at.replace_millisecond((ms % 1000) as u16).unwrap_or(at);
    at.format(&time::format_description::well_known::Rfc3339)
        .unwrap_or_else(|_| format!("{ms} ms"))
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

/// Whether a kind may be written at `level`.
fn allowed_at(spec: &KindSpec, level: Level) -> bool {
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
pub fn check_text(report: &crate::raft::storage::check::Report) -> String {
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
    use crate::log::{Command, ContainerId, ProducerSeq, Target, CUSTOM_KIND_MIN};

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
        assert_eq!(
            crate::tools::admin::parse_kind("custom:1"),
            Ok(entry.frame.kind)
        );
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
