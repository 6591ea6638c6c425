//! [`JobState`]: the fold of the control log.

use serde::{Deserialize, Serialize};

use super::producers::{ProducerTable, Seen};
use crate::log::{Batch, Offset, Seq};

/// What applying one proposal did.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Outcome {
    /// Appended at this offset.
    Appended { offset: Offset },
    /// The `(producer, seq)` pair was appended before, at `offset`; nothing new was appended.
    Duplicate { offset: Offset },
    /// The pair's sequence is too far below the producer's newest to tell a retry from a late
    /// first attempt (see [`PRODUCER_WINDOW`](super::PRODUCER_WINDOW)); nothing was appended.
    OutOfWindow { lowest: Seq },
}

impl Outcome {
    /// The offset the command holds, unless it was refused.
    pub fn offset(&self) -> Option<Offset> {
        match self {
            Outcome::Appended { offset } | Outcome::Duplicate { offset } => Some(*offset),
            Outcome::OutOfWindow { .. } => None,
        }
    }
}

/// The whole control log folded into one value.
///
/// Invariants:
/// * `next_offset` starts at 1 and grows by exactly one per appended command, so offsets are
///   contiguous and a pure function of the log.
/// * `apply_batch` is total and deterministic: it reads no clock and never panics on a batch.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct JobState {
    next_offset: Offset,
    producers: ProducerTable,
}

impl Default for JobState {
    fn default() -> Self {
        JobState {
            next_offset: 1,
            producers: ProducerTable::default(),
        }
    }
}

impl JobState {
    /// The offset the next appended command will get.
    pub fn next_offset(&self) -> Offset {
        self.next_offset
    }

    /// The offset of the last appended command, 0 before the first.
    pub fn last_offset(&self) -> Offset {
        self.next_offset - 1
    }

    pub fn producers(&self) -> &ProducerTable {
        &self.producers
    }

    /// Folds one committed batch in, returning one outcome per proposal. The appended
    /// commands' entries are not built here: readers rebuild them from the Raft entry on fetch,
    /// so applying copies no command bodies.
    pub fn apply_batch(&mut self, batch: &Batch) -> Vec<Outcome> {
        let mut outcomes = Vec::with_capacity(batch.proposals.len());
        for proposal in &batch.proposals {
            if let Some(pair) = proposal.producer {
                match self.producers.check(pair) {
                    Seen::New => {}
                    Seen::Duplicate { offset } => {
                        outcomes.push(Outcome::Duplicate { offset });
                        continue;
                    }
                    Seen::OutOfWindow { lowest } => {
                        outcomes.push(Outcome::OutOfWindow { lowest });
                        continue;
                    }
                }
            }
            let offset = self.next_offset;
            self.next_offset += 1;
            if let Some(pair) = proposal.producer {
                self.producers.record(pair, offset);
            }
            outcomes.push(Outcome::Appended { offset });
        }
        outcomes
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::log::{Command, ProducerSeq, Proposal, Target};

    fn proposal(producer: Option<(u64, u64)>) -> Proposal {
        Proposal {
            producer: producer.map(|(producer, seq)| ProducerSeq { producer, seq }),
            target: Target::All,
            frame: Command::custom(1, 1, vec![]).into_frame(),
        }
    }

    #[test]
    fn offsets_are_contiguous_across_batches_and_skip_duplicates() {
        let mut state = JobState::default();
        let first = Batch {
            appended_at_ms: 5,
            proposals: vec![proposal(None), proposal(Some((7, 1)))],
        };
        let outcomes = state.apply_batch(&first);
        assert_eq!(
            outcomes,
            vec![
                Outcome::Appended { offset: 1 },
                Outcome::Appended { offset: 2 }
            ]
        );
        let retry = Batch {
            appended_at_ms: 6,
            proposals: vec![proposal(Some((7, 1))), proposal(Some((7, 2)))],
        };
        let outcomes = state.apply_batch(&retry);
        assert_eq!(
            outcomes,
            vec![
                Outcome::Duplicate { offset: 2 },
                Outcome::Appended { offset: 3 }
            ]
        );
        assert_eq!(state.next_offset(), 4);
    }
}
