//! The last minutes of a replica's job, sampled once a second for the status page's charts:
//! commits per second (from the applied offset), desired against live containers, each
//! container's reported lag, and what the marks show (leader changes, scale events, task
//! moves, counted as tasks whose owner changed between samples). The observability port
//! samples (`http.rs`); the samples live in memory only, so a restart starts afresh.

use std::collections::{BTreeMap, VecDeque};
use std::sync::Mutex;
use std::time::Duration;

use serde::Serialize;

use crate::NodeId;

/// How often a sample is taken.
pub const SAMPLE_INTERVAL: Duration = Duration::from_secs(1);

/// Samples kept: ten minutes at one a second (about 100 KiB of JSON at most).
pub const SAMPLES_KEPT: usize = 600;

/// One second of the job as this replica saw it.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Sample {
    /// Wall clock, milliseconds since the epoch.
    pub at_ms: u64,
    pub applied_offset: u64,
    pub term: u64,
    pub leader: Option<NodeId>,
    /// The committed desired container count, once the controller recorded one.
    pub desired: Option<u32>,
    pub live: usize,
    /// Tasks whose owner changed since the previous sample: moves that completed.
    pub moved: usize,
    /// The lag each container reported, when this replica leads (only the leader hears
    /// heartbeats).
    pub lag: BTreeMap<String, u64>,
}

/// The kept samples, oldest first.
#[derive(Default)]
pub struct History {
    samples: Mutex<VecDeque<Sample>>,
}

impl History {
    pub fn samples(&self) -> Vec<Sample> {
        self.lock().iter().cloned().collect()
    }

    pub(in crate::server) fn push(&self, sample: Sample) {
        let mut samples = self.lock();
        if samples.len() == SAMPLES_KEPT {
            samples.pop_front();
        }
        samples.push_back(sample);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, VecDeque<Sample>> {
        self.samples.lock().expect("never poisoned")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_oldest_sample_goes_first() {
        let history = History::default();
        for at_ms in 0..SAMPLES_KEPT as u64 + 5 {
            history.push(Sample {
                at_ms,
                applied_offset: 0,
                term: 1,
                leader: Some(1),
                desired: None,
                live: 0,
                moved: 0,
                lag: BTreeMap::new(),
            });
        }
        let samples = history.samples();
        assert_eq!(samples.len(), SAMPLES_KEPT);
        assert_eq!(samples[0].at_ms, 5);
    }
}
