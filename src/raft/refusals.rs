//! Refusal log lines, at most one per interval and cause, each with how many refusals it
//! stands for: for the peer answers here (a node outside the membership, per node) and for
//! every port of the server (per cause). A port refuses by the thousand under a flood: one
//! WARN line per refused connection once wrote 18 MB of log in 25 s from one host, filling
//! the disk the log sits on and hiding every other line.

use std::collections::HashMap;
use std::hash::Hash;
use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;

/// The least time between two log lines of one cause on a port.
pub const REFUSAL_LINE_INTERVAL: Duration = Duration::from_secs(1);

/// Refusals counted by cause (`K`): a line at most once an `interval` per cause.
pub struct Refusals<K = &'static str> {
    interval: Duration,
    /// Per cause: when its last line was written, and the refusals since.
    by_cause: Mutex<HashMap<K, (Instant, u64)>>,
}

impl<K> Default for Refusals<K> {
    /// A line at most once a [`REFUSAL_LINE_INTERVAL`] per cause.
    fn default() -> Self {
        Refusals::every(REFUSAL_LINE_INTERVAL)
    }
}

impl<K> Refusals<K> {
    /// A line at most once an `interval` per cause.
    pub fn every(interval: Duration) -> Self {
        Refusals {
            interval,
            by_cause: Mutex::default(),
        }
    }
}

impl<K: Hash + Eq> Refusals<K> {
    /// Counts a refusal for `cause`; `Some(refusals the line stands for)` (this one and those
    /// since the last line) when a line may be written now, `None` when one was written less
    /// than the interval ago.
    pub fn refused(&self, cause: K) -> Option<u64> {
        let now = Instant::now();
        let mut by_cause = self.by_cause.lock().unwrap_or_else(|e| e.into_inner());
        match by_cause.get_mut(&cause) {
            Some((at, since)) if now.duration_since(*at) < self.interval => {
                *since += 1;
                None
            }
            Some((at, since)) => {
                let refused = *since + 1;
                (*at, *since) = (now, 0);
                Some(refused)
            }
            None => {
                by_cause.insert(cause, (now, 0));
                Some(1)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Goal: a flood of one cause writes one line a second, each counting the refusals it
    /// stands for, while another cause keeps its own line.
    #[tokio::test(start_paused = true)]
    async fn one_line_a_second_per_cause_with_a_count() {
        let refusals = Refusals::default();
        assert_eq!(refusals.refused("full"), Some(1));
        for _ in 0..999 {
            assert_eq!(refusals.refused("full"), None);
        }
        assert_eq!(
            refusals.refused("share"),
            Some(1),
            "another cause has its own line"
        );
        tokio::time::advance(REFUSAL_LINE_INTERVAL).await;
        assert_eq!(refusals.refused("full"), Some(1_000));
        assert_eq!(refusals.refused("full"), None);
    }
}
