//! The idempotent-producer table: which `(producer, seq)` pairs were already appended, and at
//! which offsets.

use std::collections::{BTreeMap, VecDeque};

use serde::{Deserialize, Serialize};

use crate::log::{Offset, ProducerId, ProducerSeq, Seq};

/// How many producers the table remembers. When a new producer arrives at a full table, the
/// producer that appended least recently is forgotten; its retries would then append again.
/// 65,536 producers × a 16-entry window is a few MiB of snapshot at most, while a job has far
/// fewer live containers and coordinators than that.
pub const PRODUCERS_MAX: usize = 65_536;

/// How many recent appends per producer keep their offset, so a retry of any of them learns
/// the original offset. A retry older than the window is still recognised as a duplicate (its
/// sequence is not above the last), only without its offset.
pub const PRODUCER_WINDOW: usize = 16;

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
struct ProducerWindow {
    /// Most recent last; sequences strictly increase.
    recent: VecDeque<(Seq, Offset)>,
}

impl ProducerWindow {
    fn last(&self) -> Option<(Seq, Offset)> {
        self.recent.back().copied()
    }
}

/// Decides, deterministically and as part of the replicated state, whether an append is new.
///
/// Invariants:
/// * A producer's accepted sequence numbers strictly increase in log order.
/// * A pair at or below a producer's last accepted sequence is never appended again.
/// * At most [`PRODUCERS_MAX`] producers are remembered; eviction is by least recent offset,
///   which every replica computes identically.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProducerTable {
    windows: BTreeMap<ProducerId, ProducerWindow>,
    /// Last offset of each producer → producer, to find the least recent in O(log n).
    by_recency: BTreeMap<Offset, ProducerId>,
}

/// What the table says about one pair.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Seen {
    New,
    /// Already appended. `offset` is known while the pair is within the producer's window.
    Duplicate {
        offset: Option<Offset>,
    },
}

impl ProducerTable {
    pub fn check(&self, pair: ProducerSeq) -> Seen {
        let Some(window) = self.windows.get(&pair.producer) else {
            return Seen::New;
        };
        match window.last() {
            Some((last_seq, _)) if pair.seq <= last_seq => Seen::Duplicate {
                offset: window
                    .recent
                    .iter()
                    .find(|(seq, _)| *seq == pair.seq)
                    .map(|(_, offset)| *offset),
            },
            _ => Seen::New,
        }
    }

    /// Records that `pair` was appended at `offset`. The caller has checked it is [`Seen::New`].
    pub fn record(&mut self, pair: ProducerSeq, offset: Offset) {
        let window = self.windows.entry(pair.producer).or_default();
        if let Some((_, previous_offset)) = window.last() {
            self.by_recency.remove(&previous_offset);
        }
        window.recent.push_back((pair.seq, offset));
        if window.recent.len() > PRODUCER_WINDOW {
            window.recent.pop_front();
        }
        self.by_recency.insert(offset, pair.producer);
        while self.windows.len() > PRODUCERS_MAX {
            let (_, oldest) = self
                .by_recency
                .pop_first()
                .expect("by_recency holds one entry per producer");
            self.windows.remove(&oldest);
        }
    }

    pub fn len(&self) -> usize {
        self.windows.len()
    }

    pub fn is_empty(&self) -> bool {
        self.windows.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pair(producer: u64, seq: u64) -> ProducerSeq {
        ProducerSeq { producer, seq }
    }

    #[test]
    fn retry_of_a_recent_append_returns_its_offset() {
        let mut table = ProducerTable::default();
        table.record(pair(1, 1), 10);
        table.record(pair(1, 2), 11);
        assert_eq!(
            table.check(pair(1, 1)),
            Seen::Duplicate { offset: Some(10) }
        );
        assert_eq!(table.check(pair(1, 3)), Seen::New);
        assert_eq!(table.check(pair(2, 1)), Seen::New);
    }

    #[test]
    fn retry_older_than_the_window_is_still_a_duplicate() {
        let mut table = ProducerTable::default();
        for seq in 1..=(PRODUCER_WINDOW as u64 + 5) {
            table.record(pair(1, seq), 100 + seq);
        }
        assert_eq!(table.check(pair(1, 1)), Seen::Duplicate { offset: None });
    }

    #[test]
    fn least_recent_producer_is_evicted_when_full() {
        let mut table = ProducerTable::default();
        for producer in 0..=(PRODUCERS_MAX as u64) {
            table.record(pair(producer, 1), producer + 1);
        }
        assert_eq!(table.len(), PRODUCERS_MAX);
        assert_eq!(table.check(pair(0, 1)), Seen::New, "producer 0 was evicted");
        assert_eq!(table.check(pair(1, 1)), Seen::Duplicate { offset: Some(2) });
    }
}
