//! Where a commit's time goes on this replica: each stage of the commit path, timed where it
//! happens, into a histogram per stage. Exported on the observability port as
//! `ctrlog_commit_stage_seconds{stage=...}`; `ctrlog bench append` reads the leader's over its measured
//! window to say what bounds a run.
//!
//! The stages, in the order a command meets them at the leader:
//! * `queued`: in the proposer's queue, from the append's arrival to its batch's hand-off to
//!   Raft (waiting for one of the batches in flight to finish);
//! * `raft`: from that hand-off until the batch is applied: the leader's own write and
//!   `fdatasync` and the replication to a majority, which overlap (`log_sync` and
//!   `replicated` show each), then commit and apply;
//! * `log_sync`: this replica's WAL write and `fdatasync` of one append (on every replica);
//! * `replicated`: one AppendEntries that carries entries, from the leader's send to the
//!   follower's answer, which it gives once the entries are durable there;
//! * `applied`: the state machine applying one run of entries.
//!
//! A command's time at the leader is `queued + raft` plus its answer's way back to the client
//! (the `append_seconds` histogram has the whole).

use std::time::Duration;

use prometheus_client::encoding::{EncodeLabelSet, EncodeLabelValue};
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;

/// One stage of the commit path (see the module docs).
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, EncodeLabelValue)]
#[allow(non_camel_case_types)] // the label values, as exported
pub enum Stage {
    queued,
    raft,
    log_sync,
    replicated,
    applied,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StageLabel {
    stage: Stage,
}

/// The stages' histograms: 20 µs to about 0.5 s, each bucket 1.5 times the last, fine enough
/// to tell a 0.15 ms `fdatasync` from a 0.25 ms one.
fn stage_histogram() -> Histogram {
    Histogram::new(exponential_buckets(20e-6, 1.5, 26))
}

/// The commit path's stage timings on one replica; cheap to share (`Arc`) and to record into.
pub struct CommitStages {
    seconds: Family<StageLabel, Histogram, fn() -> Histogram>,
}

impl Default for CommitStages {
    fn default() -> CommitStages {
        CommitStages {
            seconds: Family::new_with_constructor(stage_histogram),
        }
    }
}

impl CommitStages {
    /// Records that one pass through `stage` took `took`.
    pub fn observe(&self, stage: Stage, took: Duration) {
        self.seconds
            .get_or_create(&StageLabel { stage })
            .observe(took.as_secs_f64());
    }

    /// Registers the histograms, for one scrape.
    pub fn register(&self, registry: &mut Registry) {
        registry.register(
            "commit_stage_seconds",
            "Time spent in each stage of the commit path here (queued, raft, log_sync, \
             replicated, applied)",
            self.seconds.clone(),
        );
    }
}
