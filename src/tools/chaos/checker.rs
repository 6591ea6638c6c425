//! The history checker: given what producers, subscribers, replicas and containers recorded,
//! verifies the stream guarantees ctrlog makes (RELIABILITY.md), and says exactly which one
//! broke, so that tests and chaos runs can assert "no violation" and print evidence otherwise.
//!
//! It checks that:
//! * every replica's log agrees with one canonical sequence, offset by offset, with no gap in
//!   what it retains;
//! * every acknowledged append is at its acknowledged offset, with its command;
//! * nothing was committed that no producer tried to append;
//! * no `(producer, seq)` is in the log, or delivered to a subscriber, twice;
//! * each subscription's offsets strictly increase and match the canonical log; an
//!   unfiltered subscription skips nothing except across an explicit `Reset`, and a filtered
//!   one skips only entries its filter excludes; after a resume the first entry is the one
//!   asked for;
//! * no two containers ran the same task at once (from the containers' own reports).

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::log::{Epoch, Filter, Frame, LogEntry, Offset, ProducerSeq};
use crate::raft::types::{Entry, LogId};

/// One line of a container's report: it began or ceased to run a task.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TaskEvent {
    pub container: String,
    pub epoch: Epoch,
    pub task: String,
    pub running: bool,
    /// Wall clock, microseconds since the epoch.
    pub at_us: u64,
}

/// An append a producer had acknowledged.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Acked {
    pub pair: ProducerSeq,
    pub offset: Offset,
    pub frame: Frame,
}

/// What a subscriber saw, in order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Delivery {
    Entry(LogEntry),
    /// The position was compacted; the state covered everything up to `offset`.
    Reset {
        offset: Offset,
    },
    /// The subscriber was recreated, asking for entries from `from`.
    Resumed {
        from: Offset,
    },
}

/// One subscription's record.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SubscriptionRecord {
    pub name: String,
    pub filter: Filter,
    /// The offset it started from.
    pub from: Offset,
    pub deliveries: Vec<Delivery>,
}

/// Everything recorded during a run.
#[derive(Clone, Debug, Default)]
pub struct History {
    /// Each replica's retained log at the end, in offset order.
    pub replica_logs: Vec<(String, Vec<LogEntry>)>,
    /// Every `(producer, seq)` any producer tried to append, acknowledged or not.
    pub attempted: BTreeSet<ProducerSeq>,
    pub acked: Vec<Acked>,
    pub subscriptions: Vec<SubscriptionRecord>,
    pub task_events: Vec<TaskEvent>,
}

/// One broken guarantee.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Violation {
    #[error("replicas disagree at offset {offset}: {first} and {second}")]
    Diverged {
        offset: Offset,
        first: String,
        second: String,
    },
    #[error("replica {replica} has a gap before offset {offset}")]
    ReplicaGap { replica: String, offset: Offset },
    #[error("acknowledged {pair:?} at offset {offset} is missing or different")]
    LostAck { pair: ProducerSeq, offset: Offset },
    #[error("offset {offset} holds {pair:?}, which no producer appended")]
    Phantom { pair: ProducerSeq, offset: Offset },
    #[error("{pair:?} is in the log at offsets {first} and {second}")]
    DuplicateInLog {
        pair: ProducerSeq,
        first: Offset,
        second: Offset,
    },
    #[error("subscription {name} got {pair:?} twice")]
    DuplicateDelivery { name: String, pair: ProducerSeq },
    #[error("subscription {name} got offset {got} after {after}")]
    OutOfOrder {
        name: String,
        after: Offset,
        got: Offset,
    },
    #[error("subscription {name} skipped from {expected} to {got} without a Reset")]
    SilentSkip {
        name: String,
        expected: Offset,
        got: Offset,
    },
    #[error("subscription {name} got offset {offset} unlike the log")]
    Mismatch { name: String, offset: Offset },
    #[error("subscription {name} resumed from {from} but got {got} first")]
    BadResume {
        name: String,
        from: Offset,
        got: Offset,
    },
    #[error("{0}")]
    DoubleRun(String),
    #[error("log id {log_id} holds different entries on {first} and {second}")]
    ForkedLogId {
        log_id: String,
        first: String,
        second: String,
    },
}

/// Raft's log matching across replicas, entry by entry as they are seen: every entry seen
/// under one log id, on any replica at any time, encodes to the same bytes. (The offsets
/// check above compares applied commands; this catches a fork before anything is applied,
/// and in entries that carry none.)
#[derive(Default)]
pub struct LogMatching {
    /// Log id → a digest of the first entry seen under it, and the replica it was seen on.
    seen: BTreeMap<LogId, (u64, String)>,
    /// Forked log ids already reported, so that each is reported once.
    forked: BTreeSet<LogId>,
}

impl LogMatching {
    /// Records that `replica` holds `entry`; a violation if another replica (or this one
    /// earlier) held a different entry under its log id.
    pub fn observe(&mut self, replica: &str, entry: &Entry) -> Option<Violation> {
        let mut hasher = std::collections::hash_map::DefaultHasher::new();
        std::hash::Hash::hash(&crate::log::encode(entry), &mut hasher);
        let digest = std::hash::Hasher::finish(&hasher);
        let (first_digest, first) = self
            .seen
            .entry(entry.log_id)
            .or_insert_with(|| (digest, replica.to_string()));
        if *first_digest == digest || !self.forked.insert(entry.log_id) {
            return None;
        }
        Some(Violation::ForkedLogId {
            log_id: entry.log_id.to_string(),
            first: first.clone(),
            second: replica.to_string(),
        })
    }
}

/// Checks a history; empty when every guarantee held.
pub fn check(history: &History) -> Vec<Violation> {
    let mut violations = Vec::new();
    let canonical = canonical_log(history, &mut violations);
    check_acks(history, &canonical, &mut violations);
    check_log_pairs(history, &canonical, &mut violations);
    for subscription in &history.subscriptions {
        check_subscription(subscription, &canonical, &mut violations);
    }
    violations.extend(
        double_runs(&history.task_events)
            .into_iter()
            .map(Violation::DoubleRun),
    );
    violations
}

/// What an entry is, for comparing replicas and deliveries (the term is part of it).
fn same(a: &LogEntry, b: &LogEntry) -> bool {
    a == b
}

fn canonical_log(history: &History, violations: &mut Vec<Violation>) -> BTreeMap<Offset, LogEntry> {
    let mut canonical: BTreeMap<Offset, (String, LogEntry)> = BTreeMap::new();
    for (replica, log) in &history.replica_logs {
        let mut previous: Option<Offset> = None;
        for entry in log {
            if previous.is_some_and(|p| entry.offset != p + 1) {
                violations.push(Violation::ReplicaGap {
                    replica: replica.clone(),
                    offset: entry.offset,
                });
            }
            previous = Some(entry.offset);
            match canonical.get(&entry.offset) {
                Some((first, known)) if !same(known, entry) => {
                    violations.push(Violation::Diverged {
                        offset: entry.offset,
                        first: first.clone(),
                        second: replica.clone(),
                    })
                }
                Some(_) => {}
                None => {
                    canonical.insert(entry.offset, (replica.clone(), entry.clone()));
                }
            }
        }
    }
    canonical.into_iter().map(|(o, (_, e))| (o, e)).collect()
}

fn check_acks(
    history: &History,
    canonical: &BTreeMap<Offset, LogEntry>,
    violations: &mut Vec<Violation>,
) {
    let first_retained = canonical.keys().next().copied().unwrap_or(Offset::MAX);
    for ack in &history.acked {
        if ack.offset < first_retained {
            continue; // compacted everywhere: the snapshot holds it, the entry is gone
        }
        let present = canonical
            .get(&ack.offset)
            .is_some_and(|e| e.producer == Some(ack.pair) && e.frame == ack.frame);
        if !present {
            violations.push(Violation::LostAck {
                pair: ack.pair,
                offset: ack.offset,
            });
        }
    }
}

fn check_log_pairs(
    history: &History,
    canonical: &BTreeMap<Offset, LogEntry>,
    violations: &mut Vec<Violation>,
) {
    // Only the recorded producers' pairs can be phantoms: others in the log (a job's
    // containers answering through the client) were never the history's to record.
    let recorded: BTreeSet<_> = history.attempted.iter().map(|p| p.producer).collect();
    let mut seen: BTreeMap<ProducerSeq, Offset> = BTreeMap::new();
    for (offset, entry) in canonical {
        let Some(pair) = entry.producer else { continue };
        if recorded.contains(&pair.producer) && !history.attempted.contains(&pair) {
            violations.push(Violation::Phantom {
                pair,
                offset: *offset,
            });
        }
        if let Some(first) = seen.insert(pair, *offset) {
            violations.push(Violation::DuplicateInLog {
                pair,
                first,
                second: *offset,
            });
        }
    }
}

fn check_subscription(
    subscription: &SubscriptionRecord,
    canonical: &BTreeMap<Offset, LogEntry>,
    violations: &mut Vec<Violation>,
) {
    let name = subscription.name.clone();
    let mut expected = subscription.from.max(1);
    let mut last: Option<Offset> = None;
    let mut resumed_from: Option<Offset> = None;
    let mut pairs = BTreeSet::new();
    for delivery in &subscription.deliveries {
        match delivery {
            Delivery::Reset { offset } => {
                // A reset answers the resume: the stream goes on after the reset's state.
                resumed_from = None;
                expected = offset + 1;
                last = Some(*offset);
            }
            Delivery::Resumed { from } => resumed_from = Some(*from),
            Delivery::Entry(entry) => {
                // Only where the replicas still hold `from` can the checker tell what came next.
                let retained_from = canonical.keys().next().copied().unwrap_or(Offset::MAX);
                if let Some(from) = resumed_from.take().filter(|from| *from >= retained_from) {
                    let first_match = canonical
                        .range(from..)
                        .find(|(_, e)| subscription.filter.matches(&e.target))
                        .map(|(o, _)| *o);
                    if first_match.is_some_and(|o| o != entry.offset) {
                        violations.push(Violation::BadResume {
                            name: name.clone(),
                            from,
                            got: entry.offset,
                        });
                    }
                    expected = from;
                }
                if last.is_some_and(|l| entry.offset <= l) {
                    violations.push(Violation::OutOfOrder {
                        name: name.clone(),
                        after: last.unwrap_or(0),
                        got: entry.offset,
                    });
                }
                // Everything between `expected` and this entry must be excluded by the filter.
                let skipped_match = expected < entry.offset
                    && canonical
                        .range(expected..entry.offset)
                        .any(|(_, e)| subscription.filter.matches(&e.target));
                let unknown_gap =
                    subscription.filter == Filter::Everything && entry.offset > expected;
                if skipped_match || unknown_gap {
                    violations.push(Violation::SilentSkip {
                        name: name.clone(),
                        expected,
                        got: entry.offset,
                    });
                }
                if canonical
                    .get(&entry.offset)
                    .is_some_and(|e| !same(e, entry))
                    || !subscription.filter.matches(&entry.target)
                {
                    violations.push(Violation::Mismatch {
                        name: name.clone(),
                        offset: entry.offset,
                    });
                }
                if let Some(pair) = entry.producer {
                    if !pairs.insert(pair) {
                        violations.push(Violation::DuplicateDelivery {
                            name: name.clone(),
                            pair,
                        });
                    }
                }
                last = Some(entry.offset);
                expected = entry.offset + 1;
            }
        }
    }
}

/// Reads a report file written by simulated containers (a missing file is an empty report).
pub fn read_reports(path: &std::path::Path) -> Result<Vec<TaskEvent>, String> {
    let text = match std::fs::read_to_string(path) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(format!("{}: {e}", path.display())),
    };
    text.lines()
        .map(|line| serde_json::from_str(line).map_err(|e| format!("{line:?}: {e}")))
        .collect()
}

/// Every moment at which two containers both said they ran the same task, from their own
/// reports. Empty when the handshakes held.
pub fn double_runs(events: &[TaskEvent]) -> Vec<String> {
    let mut sorted: Vec<&TaskEvent> = events.iter().collect();
    sorted.sort_by_key(|e| e.at_us);
    let mut running: BTreeMap<&str, BTreeSet<(&str, Epoch)>> = BTreeMap::new();
    let mut violations = Vec::new();
    for event in sorted {
        let runners = running.entry(&event.task).or_default();
        let me = (event.container.as_str(), event.epoch);
        if event.running {
            if let Some(other) = runners.iter().find(|r| **r != me) {
                violations.push(format!(
                    "task {} started on {}@{} at {} µs while {}@{} ran it",
                    event.task, me.0, me.1, event.at_us, other.0, other.1
                ));
            }
            runners.insert(me);
        } else {
            runners.remove(&me);
        }
    }
    violations
}

/// The longest time any task was run by nobody, between the first start of any task and
/// `until_us` (wall clock, µs), from the containers' reports.
pub fn longest_unowned(events: &[TaskEvent], until_us: u64) -> Duration {
    let mut sorted: Vec<&TaskEvent> = events.iter().collect();
    sorted.sort_by_key(|e| e.at_us);
    let mut runners: BTreeMap<&str, usize> = BTreeMap::new();
    let mut idle_since: BTreeMap<&str, u64> = BTreeMap::new();
    let mut longest = 0u64;
    for event in sorted {
        let count = runners.entry(&event.task).or_default();
        if event.running {
            *count += 1;
            if let Some(since) = idle_since.remove(event.task.as_str()) {
                longest = longest.max(event.at_us.saturating_sub(since));
            }
        } else {
            *count = count.saturating_sub(1);
            if *count == 0 {
                idle_since.insert(&event.task, event.at_us);
            }
        }
    }
    for since in idle_since.values() {
        longest = longest.max(until_us.saturating_sub(*since));
    }
    Duration::from_micros(longest)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::log::{Command, ContainerId, Target};

    fn event(container: &str, task: &str, running: bool, at_us: u64) -> TaskEvent {
        TaskEvent {
            container: container.into(),
            epoch: 1,
            task: task.into(),
            running,
            at_us,
        }
    }

    #[test]
    fn a_handover_is_fine_and_an_overlap_is_caught() {
        let handover = [
            event("a", "t", true, 1),
            event("a", "t", false, 5),
            event("b", "t", true, 9),
        ];
        assert!(double_runs(&handover).is_empty());
        assert_eq!(longest_unowned(&handover, 20), Duration::from_micros(4));
        let overlap = [event("a", "t", true, 1), event("b", "t", true, 3)];
        assert_eq!(double_runs(&overlap).len(), 1);
    }

    fn entry(offset: Offset, seq: u64, target: Target) -> LogEntry {
        LogEntry {
            offset,
            term: 1,
            appended_at_ms: 0,
            producer: Some(ProducerSeq { producer: 1, seq }),
            target,
            frame: Command::custom(1, 1, vec![seq as u8]).into_frame(),
        }
    }

    /// A healthy run: three replicas with the same five entries (one compacted on a replica),
    /// every append acknowledged, one unfiltered and one filtered subscription.
    fn healthy() -> History {
        let c1 = ContainerId::new("c1").unwrap();
        let log: Vec<LogEntry> = (1..=5)
            .map(|o| {
                let target = if o % 2 == 0 {
                    Target::Container(c1.clone())
                } else {
                    Target::Coordinator
                };
                entry(o, o, target)
            })
            .collect();
        History {
            replica_logs: vec![
                ("r1".into(), log.clone()),
                ("r2".into(), log.clone()),
                ("r3".into(), log[2..].to_vec()),
            ],
            attempted: (1..=5)
                .map(|seq| ProducerSeq { producer: 1, seq })
                .collect(),
            acked: log
                .iter()
                .map(|e| Acked {
                    pair: e.producer.unwrap(),
                    offset: e.offset,
                    frame: e.frame.clone(),
                })
                .collect(),
            subscriptions: vec![
                SubscriptionRecord {
                    name: "all".into(),
                    filter: Filter::Everything,
                    from: 1,
                    deliveries: log.iter().cloned().map(Delivery::Entry).collect(),
                },
                SubscriptionRecord {
                    name: "c1".into(),
                    filter: Filter::Container(c1),
                    from: 1,
                    deliveries: vec![
                        Delivery::Entry(log[1].clone()),
                        Delivery::Entry(log[3].clone()),
                    ],
                },
            ],
            task_events: vec![
                event("a", "t", true, 1),
                event("a", "t", false, 2),
                event("b", "t", true, 3),
            ],
        }
    }

    #[track_caller]
    fn caught(history: &History, expected: impl Fn(&Violation) -> bool) {
        let violations = check(history);
        assert!(
            violations.iter().any(expected),
            "not caught; found {violations:?}"
        );
    }

    #[test]
    fn a_healthy_history_passes() {
        assert_eq!(check(&healthy()), vec![]);
    }

    /// The log also holds what others appended idempotently (a job's containers answering):
    /// their pairs are no phantoms, but their duplicates are still caught.
    #[test]
    fn pairs_of_producers_not_recorded_are_checked_only_for_duplicates() {
        let mut h = healthy();
        let container = ProducerSeq {
            producer: 7,
            seq: 1,
        };
        for (_, log) in &mut h.replica_logs {
            for e in log.iter_mut().filter(|e| e.offset == 5) {
                e.producer = Some(container);
            }
        }
        h.acked.retain(|a| a.offset != 5);
        for s in &mut h.subscriptions {
            for d in &mut s.deliveries {
                if let Delivery::Entry(e) = d {
                    if e.offset == 5 {
                        e.producer = Some(container);
                    }
                }
            }
        }
        assert_eq!(check(&h), vec![]);
        for (_, log) in &mut h.replica_logs {
            for e in log.iter_mut().filter(|e| e.offset == 4) {
                e.producer = Some(container);
            }
        }
        caught(&h, |v| matches!(v, Violation::DuplicateInLog { .. }));
    }

    #[test]
    fn diverged_replicas_and_replica_gaps_are_caught() {
        let mut h = healthy();
        h.replica_logs[1].1[2].frame.body = vec![99];
        caught(&h, |v| matches!(v, Violation::Diverged { offset: 3, .. }));
        let mut h = healthy();
        h.replica_logs[0].1.remove(2);
        caught(&h, |v| matches!(v, Violation::ReplicaGap { offset: 4, .. }));
    }

    #[test]
    fn lost_acks_phantoms_and_duplicates_are_caught() {
        let mut h = healthy();
        h.acked.push(Acked {
            pair: ProducerSeq {
                producer: 1,
                seq: 9,
            },
            offset: 5,
            frame: Command::custom(1, 1, vec![9]).into_frame(),
        });
        caught(&h, |v| matches!(v, Violation::LostAck { offset: 5, .. }));
        let mut h = healthy();
        h.attempted.remove(&ProducerSeq {
            producer: 1,
            seq: 4,
        });
        caught(&h, |v| matches!(v, Violation::Phantom { offset: 4, .. }));
        let mut h = healthy();
        for (_, log) in &mut h.replica_logs {
            for e in log.iter_mut().filter(|e| e.offset == 5) {
                e.producer = Some(ProducerSeq {
                    producer: 1,
                    seq: 1,
                });
            }
        }
        caught(&h, |v| {
            matches!(
                v,
                Violation::DuplicateInLog {
                    first: 1,
                    second: 5,
                    ..
                }
            )
        });
    }

    fn all(h: &mut History) -> &mut Vec<Delivery> {
        &mut h.subscriptions[0].deliveries
    }

    #[test]
    fn subscription_faults_are_caught() {
        let mut h = healthy();
        all(&mut h).remove(2);
        caught(&h, |v| {
            matches!(
                v,
                Violation::SilentSkip {
                    expected: 3,
                    got: 4,
                    ..
                }
            )
        });
        let mut h = healthy();
        all(&mut h).swap(1, 2);
        caught(&h, |v| matches!(v, Violation::OutOfOrder { .. }));
        let mut h = healthy();
        let repeated = all(&mut h)[1].clone();
        all(&mut h).insert(2, repeated);
        caught(&h, |v| matches!(v, Violation::DuplicateDelivery { .. }));
        let mut h = healthy();
        if let Delivery::Entry(e) = &mut all(&mut h)[3] {
            e.frame.body = vec![42];
        }
        caught(&h, |v| matches!(v, Violation::Mismatch { offset: 4, .. }));
        // A filtered subscription that misses one of its own entries.
        let mut h = healthy();
        h.subscriptions[1].deliveries.remove(0);
        caught(&h, |v| matches!(v, Violation::SilentSkip { .. }));
        // A resume that does not start where it asked.
        let mut h = healthy();
        all(&mut h).insert(2, Delivery::Resumed { from: 3 });
        all(&mut h).remove(3);
        caught(&h, |v| {
            matches!(
                v,
                Violation::BadResume {
                    from: 3,
                    got: 4,
                    ..
                }
            )
        });
        // A compacted position must come with a Reset: with one, skipping is fine.
        let mut h = healthy();
        all(&mut h).drain(0..3);
        caught(&h, |v| {
            matches!(
                v,
                Violation::SilentSkip {
                    expected: 1,
                    got: 4,
                    ..
                }
            )
        });
        all(&mut h).insert(0, Delivery::Reset { offset: 3 });
        assert_eq!(check(&h), vec![]);
    }

    /// Found by the simulation: a subscriber resumed, its position had been compacted in the
    /// meantime, and the replica answered with a reset. That is the protocol working.
    #[test]
    fn a_reset_right_after_a_resume_is_not_a_bad_resume() {
        let mut h = healthy();
        let rest = all(&mut h).split_off(1);
        all(&mut h).push(Delivery::Resumed { from: 2 });
        all(&mut h).push(Delivery::Reset { offset: 3 });
        all(&mut h).extend(rest.into_iter().skip(2));
        assert_eq!(check(&h), vec![]);
    }

    /// Found by the simulation: replicas compact, so at the end of a long run their logs start
    /// well after where early resumes happened. What they no longer hold cannot be judged.
    #[test]
    fn a_resume_below_every_retained_log_is_not_judged() {
        let mut h = healthy();
        for (_, log) in &mut h.replica_logs {
            log.retain(|e| e.offset >= 3);
        }
        all(&mut h).insert(1, Delivery::Resumed { from: 2 });
        assert_eq!(check(&h), vec![]);
    }

    #[test]
    fn two_containers_running_one_task_is_caught() {
        let mut h = healthy();
        h.task_events = vec![event("a", "t", true, 1), event("b", "t", true, 2)];
        caught(&h, |v| matches!(v, Violation::DoubleRun(_)));
    }
}
