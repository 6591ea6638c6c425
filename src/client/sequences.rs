//! Sequence numbers for an idempotent producer, with the flow control that keeps retries
//! decidable.
//!
//! The replicated producer table decides a `(producer, seq)` exactly only within
//! [`PRODUCER_WINDOW`] of the producer's highest accepted sequence (see `jobs::ProducerTable`).
//! Concurrent appends from one client commit in any order, and one of them may be stuck
//! retrying through a failover while later ones succeed. So a new sequence is issued only while
//! the oldest unanswered one is less than [`PRODUCER_WINDOW`] below it: then every unanswered
//! sequence stays inside the window of anything the cluster can have accepted, and its retry is
//! answered exactly (its original offset, or appended now) instead of refused.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};

use tokio::sync::Notify;

use crate::jobs::PRODUCER_WINDOW;
use crate::log::Seq;

#[derive(Default)]
struct Issued {
    next: Seq,
    unanswered: BTreeSet<Seq>,
}

/// Issues sequence numbers 1, 2, 3, … and holds back a new one while the window is full.
#[derive(Clone)]
pub(crate) struct Sequences {
    issued: Arc<Mutex<Issued>>,
    answered: Arc<Notify>,
}

/// One issued sequence number; dropping it marks the sequence answered.
pub(crate) struct SeqLease {
    seq: Seq,
    sequences: Sequences,
}

impl SeqLease {
    pub(crate) fn seq(&self) -> Seq {
        self.seq
    }
}

impl Drop for SeqLease {
    fn drop(&mut self) {
        self.sequences.lock().unanswered.remove(&self.seq);
        self.sequences.answered.notify_waiters();
    }
}

impl Sequences {
    pub(crate) fn new() -> Sequences {
        Sequences {
            issued: Arc::new(Mutex::new(Issued {
                next: 1,
                unanswered: BTreeSet::new(),
            })),
            answered: Arc::new(Notify::new()),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Issued> {
        self.issued
            .lock()
            .expect("the sequence lock is never held across a panic")
    }

    /// The next sequence number, once issuing it keeps every unanswered one in the window.
    pub(crate) async fn issue(&self) -> SeqLease {
        loop {
            let answered = self.answered.notified();
            tokio::pin!(answered);
            // Register before checking, so an answer between the check and the wait is seen.
            answered.as_mut().enable();
            {
                let mut issued = self.lock();
                let seq = issued.next;
                let fits = issued
                    .unanswered
                    .first()
                    .is_none_or(|oldest| seq - oldest < PRODUCER_WINDOW);
                if fits {
                    issued.next += 1;
                    issued.unanswered.insert(seq);
                    return SeqLease {
                        seq,
                        sequences: self.clone(),
                    };
                }
            }
            answered.await;
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[tokio::test]
    async fn a_stuck_sequence_holds_back_only_those_a_window_ahead_of_it() {
        let sequences = Sequences::new();
        let stuck = sequences.issue().await;
        assert_eq!(stuck.seq(), 1);
        for expected in 2..=PRODUCER_WINDOW {
            let lease = sequences.issue().await;
            assert_eq!(lease.seq(), expected); // answered at once
        }
        let blocked = tokio::spawn({
            let sequences = sequences.clone();
            async move { sequences.issue().await.seq() }
        });
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(
            !blocked.is_finished(),
            "seq {} would leave 1 behind the window",
            PRODUCER_WINDOW + 1
        );
        drop(stuck);
        let issued = tokio::time::timeout(Duration::from_secs(5), blocked)
            .await
            .expect("answering the stuck sequence frees the window")
            .unwrap();
        assert_eq!(issued, PRODUCER_WINDOW + 1);
    }
}
