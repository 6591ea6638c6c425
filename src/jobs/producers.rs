//! The idempotent-producer table: which `(producer, seq)` pairs were already appended, and at
//! which offsets.

use std::collections::{BTreeMap, VecDeque};

use serde::{Deserialize, Serialize};

use crate::log::{Offset, ProducerId, ProducerSeq, Seq};

/// How many producers the table remembers. When a new producer arrives at a full table, the
/// producer that appended least recently is forgotten (see
/// [`Outcome::ProducerForgotten`](super::Outcome::ProducerForgotten) for what its later
/// appends get). 65,536 producers × a full window is at most a few tens of MiB of snapshot,
/// while a job has far fewer live containers and coordinators than that.
pub const PRODUCERS_MAX: usize = 65_536;

/// The span of sequence numbers below a producer's highest accepted one that the table still
/// decides exactly. Within it a retry learns its original offset and a late, never-appended
/// sequence (concurrent appends may commit out of order) is appended. Below it the table cannot
/// tell the two apart, so such an append is refused
/// ([`Outcome::OutOfWindow`](super::Outcome::OutOfWindow)) rather than guessed. The client
/// library never lets one of its unanswered sequence numbers fall that far behind the newest
/// it has issued, so a well-behaved producer never meets that refusal.
pub const PRODUCER_WINDOW: u64 = 32;

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
struct ProducerWindow {
    /// Accepted sequences within [`PRODUCER_WINDOW`] of the highest, sorted by sequence, with
    /// their offsets. Never empty once created.
    recent: VecDeque<(Seq, Offset)>,
    /// The offset of this producer's latest append, its key in `by_recency`.
    last_offset: Offset,
}

impl ProducerWindow {
    fn highest(&self) -> Seq {
        self.recent.back().map_or(0, |(seq, _)| *seq)
    }
}

/// Decides, deterministically and as part of the replicated state, whether an append is new.
///
/// Invariants:
/// * A pair is appended at most once while its producer is remembered.
/// * For a remembered producer with highest accepted sequence `h`, every sequence in
///   `(h - PRODUCER_WINDOW, h]` is decided exactly (duplicate with its offset, or new); every
///   sequence at or below `h - PRODUCER_WINDOW` is refused.
/// * At most [`PRODUCERS_MAX`] producers are remembered; eviction is by least recent offset,
///   which every replica computes identically.
/// * A producer it does not remember is new only at a sequence up to [`PRODUCER_WINDOW`]
///   (where every producer starts); above that it is `Seen::UnknownProducer`, which
///   `JobState` answers with [`Outcome::ProducerForgotten`](super::Outcome::ProducerForgotten).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProducerTable {
    windows: BTreeMap<ProducerId, ProducerWindow>,
    /// Last offset of each producer → producer, to find the least recent in O(log n).
    by_recency: BTreeMap<Offset, ProducerId>,
}

/// What the table says about one pair.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Seen {
    /// Not appended yet.
    New,
    /// Already appended at `offset`.
    Duplicate {
        /// Where the first append of the pair is.
        offset: Offset,
    },
    /// Too far below the producer's highest sequence to decide; `lowest` is the lowest
    /// sequence still decidable.
    OutOfWindow {
        /// The lowest sequence still decidable.
        lowest: Seq,
    },
    /// The producer is not remembered, and the sequence is above [`PRODUCER_WINDOW`], so it is
    /// not how a producer begins: the producer was forgotten (evicted by [`PRODUCERS_MAX`]
    /// newer ones) and this may be the retry of an append already in the log.
    ///
    /// The table keeps nothing of a forgotten producer (a record of each would be the
    /// unbounded table the limit exists to avoid), so it tells the two cases apart by where
    /// producers start instead: the client library numbers a producer's appends from 1 and
    /// keeps at most [`PRODUCER_WINDOW`] unanswered, so a producer's first accepted sequence
    /// is at most [`PRODUCER_WINDOW`]. This is decided from the table alone, hence the same on
    /// every replica. What stays undetected is a producer forgotten within its first
    /// [`PRODUCER_WINDOW`] sequences that retries one of them (65,536 other producers would
    /// have to append between an attempt and its retry). `JobState` refuses this only from
    /// vocabulary level 3 and takes it for [`Seen::New`] below, as older builds did.
    UnknownProducer,
}

impl ProducerTable {
    /// What the table says about `pair`: new, a duplicate with its original offset, below
    /// its producer's window, or from a producer it does not remember. Changes nothing;
    /// [`ProducerTable::record`] records an append.
    pub fn check(&self, pair: ProducerSeq) -> Seen {
        let Some(window) = self.windows.get(&pair.producer) else {
            return if pair.seq <= PRODUCER_WINDOW {
                Seen::New
            } else {
                Seen::UnknownProducer
            };
        };
        let lowest = window.highest().saturating_sub(PRODUCER_WINDOW - 1);
        if pair.seq < lowest {
            return Seen::OutOfWindow { lowest };
        }
        match window
            .recent
            .binary_search_by_key(&pair.seq, |(seq, _)| *seq)
        {
            Ok(found) => Seen::Duplicate {
                offset: window.recent[found].1,
            },
            Err(_) => Seen::New,
        }
    }

    /// Records that `pair` was appended at `offset`. The caller has checked that it is new
    /// ([`ProducerTable::check`]); offsets only grow.
    pub fn record(&mut self, pair: ProducerSeq, offset: Offset) {
        let window = self.windows.entry(pair.producer).or_default();
        if !window.recent.is_empty() {
            self.by_recency.remove(&window.last_offset);
        }
        window.last_offset = offset;
        let at = window.recent.partition_point(|(seq, _)| *seq < pair.seq);
        window.recent.insert(at, (pair.seq, offset));
        let lowest = window.highest().saturating_sub(PRODUCER_WINDOW - 1);
        while window.recent.front().is_some_and(|(seq, _)| *seq < lowest) {
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

    /// How many producers the table remembers, at most [`PRODUCERS_MAX`].
    pub fn len(&self) -> usize {
        self.windows.len()
    }

    /// Whether the table remembers no producer (no idempotent append yet).
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
        assert_eq!(table.check(pair(1, 1)), Seen::Duplicate { offset: 10 });
        assert_eq!(table.check(pair(1, 3)), Seen::New);
        assert_eq!(table.check(pair(2, 1)), Seen::New);
    }

    #[test]
    fn sequences_committed_out_of_order_are_each_appended_once() {
        let mut table = ProducerTable::default();
        table.record(pair(1, 5), 10);
        assert_eq!(table.check(pair(1, 3)), Seen::New, "3 was never appended");
        table.record(pair(1, 3), 11);
        assert_eq!(table.check(pair(1, 3)), Seen::Duplicate { offset: 11 });
        assert_eq!(table.check(pair(1, 5)), Seen::Duplicate { offset: 10 });
        assert_eq!(table.check(pair(1, 4)), Seen::New);
    }

    #[test]
    fn a_sequence_below_the_window_is_refused_not_guessed() {
        let mut table = ProducerTable::default();
        for seq in 1..=(PRODUCER_WINDOW + 5) {
            table.record(pair(1, seq), 100 + seq);
        }
        let lowest = 6;
        assert_eq!(
            table.check(pair(1, lowest - 1)),
            Seen::OutOfWindow { lowest }
        );
        assert_eq!(
            table.check(pair(1, lowest)),
            Seen::Duplicate {
                offset: 100 + lowest
            }
        );
    }

    #[test]
    fn least_recent_producer_is_evicted_when_full() {
        let mut table = ProducerTable::default();
        for producer in 0..=(PRODUCERS_MAX as u64) {
            table.record(pair(producer, 1), producer + 1);
        }
        assert_eq!(table.len(), PRODUCERS_MAX);
        assert_eq!(table.check(pair(0, 1)), Seen::New, "producer 0 was evicted");
        assert_eq!(table.check(pair(1, 1)), Seen::Duplicate { offset: 2 });
    }

    #[test]
    fn an_unknown_producer_begins_only_within_the_first_window() {
        let table = ProducerTable::default();
        assert_eq!(table.check(pair(1, 0)), Seen::New);
        assert_eq!(table.check(pair(1, PRODUCER_WINDOW)), Seen::New);
        assert_eq!(
            table.check(pair(1, PRODUCER_WINDOW + 1)),
            Seen::UnknownProducer
        );
    }
}
