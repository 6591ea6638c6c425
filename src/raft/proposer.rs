//! The leader-side proposer: coalesces concurrent appends into batched Raft entries.
//!
//! openraft 0.9 turns every `client_write` into its own entry and waits for each entry's flush
//! before the next, which caps a 3-replica cluster near 2,000 entries/s. So
//! appends queue here; the proposer task takes everything queued (up to
//! [`BATCH_PROPOSALS_MAX`] proposals and [`BATCH_BYTES_MAX`] bytes, or one proposal larger than
//! that), stamps the batch with the wall clock, and proposes it as one entry. While up to
//! [`BATCHES_IN_FLIGHT_MAX`] batches are in Raft, the next one fills.
//!
//! Budgets: the queue holds at most [`QUEUE_DEPTH`] proposals and [`QUEUE_BYTES_MAX`] encoded
//! bytes (a caller waits for room: back-pressure), and a batch never exceeds
//! `max(BATCH_BYTES_MAX, one proposal)`, which with openraft's entries per message bounds an
//! AppendEntries message (see `ReplicaConfig::validate`).
//!
//! Protocol: each [`Proposer::propose`] sends its proposal with a oneshot sender and awaits the
//! receiver. The task answers every sender exactly once: with the proposal's outcome once the
//! batch is applied, or with an error if Raft refused or lost the batch, or if the term it was
//! proposed in ended before it was applied. Proposals are handed to Raft in arrival order, so
//! one producer's sequential appends are applied in order.
//!
//! The last case is not openraft's: openraft 0.9 answers a write's responder when its entry is
//! applied here or truncated as a conflict, but not when a later snapshot install covers it,
//! and such a responder waits forever. With its batch slot held, four of them stopped a
//! leader's appends for good (seen in `ctrlog chaos`: a leader with a quorum, its log fully
//! applied, every append timing out, after rounds that deposed it and caught it up by
//! snapshot). So a batch is given up as soon as its term is over; its fate is then unknown to
//! this replica, and the caller's idempotent retry learns it.

use std::sync::Arc;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use tokio::sync::{mpsc, oneshot, watch, OwnedSemaphorePermit, Semaphore};

use super::stages::{CommitStages, Stage};
use super::types::{Raft, RaftServerMetrics};
use crate::jobs::Outcome;
use crate::log::{Batch, Proposal};
use crate::wire::batching::{Accumulator, BatchLimits};
use crate::wire::ApiError;

/// What the state machine decided for one proposal, or why Raft did not decide it.
pub type ProposalResult = Result<Outcome, ApiError>;

/// Proposals per batch: bounds one entry's apply time and the latency of the first proposal
/// in it.
pub const BATCH_PROPOSALS_MAX: usize = 4096;
/// Encoded proposal bytes per batch: a batch takes the next proposal only if it still fits,
/// so a batch is at most this, or one proposal larger than this alone. Together with
/// `RAFT_PAYLOAD_ENTRIES_MAX` it bounds an AppendEntries message.
pub const BATCH_BYTES_MAX: usize = 1 << 20;
/// Batches proposed but not yet applied. More than one lets the next batch's proposal overlap
/// with the current batch's replication and fsync.
pub const BATCHES_IN_FLIGHT_MAX: usize = 4;
/// Appends queued before the proposer task; beyond this, callers wait (back-pressure).
pub const QUEUE_DEPTH: usize = 64 * 1024;
/// Encoded proposal bytes queued before the proposer task; beyond this, callers wait. Without
/// it the queue could pin `QUEUE_DEPTH` commands of the full size limit (64 GiB at 1 MiB).
pub const QUEUE_BYTES_MAX: usize = 64 << 20;

struct Pending {
    proposal: Proposal,
    reply: oneshot::Sender<ProposalResult>,
    /// When it was queued, for the `queued` stage.
    queued_at: Instant,
    /// The proposal's share of [`QUEUE_BYTES_MAX`], given back when it leaves the queue.
    _queued_bytes: OwnedSemaphorePermit,
}

/// The handle producers append through.
#[derive(Clone)]
pub struct Proposer {
    queue: mpsc::Sender<Pending>,
    queue_bytes: Arc<Semaphore>,
}

impl Proposer {
    /// Starts the proposer task for `raft`, timing its stages (`queued`, `raft`) into
    /// `stages`. It stops when every handle is dropped.
    pub fn start(raft: Raft, stages: Arc<CommitStages>) -> Proposer {
        let (queue, incoming) = mpsc::channel(QUEUE_DEPTH);
        tokio::spawn(run(raft, incoming, stages));
        Proposer {
            queue,
            queue_bytes: Arc::new(Semaphore::new(QUEUE_BYTES_MAX)),
        }
    }

    /// Appends one proposal and waits until it is committed and applied.
    pub async fn propose(&self, proposal: Proposal) -> ProposalResult {
        // A proposal larger than the whole budget (never, with a valid configuration) waits
        // for all of it rather than forever.
        let bytes = proposal.encoded_len().min(QUEUE_BYTES_MAX) as u32;
        let queued_bytes = self
            .queue_bytes
            .clone()
            .acquire_many_owned(bytes)
            .await
            .map_err(|_| ApiError::ShuttingDown)?;
        let (reply, answer) = oneshot::channel();
        let pending = Pending {
            proposal,
            reply,
            queued_at: Instant::now(),
            _queued_bytes: queued_bytes,
        };
        self.queue
            .send(pending)
            .await
            .map_err(|_| ApiError::ShuttingDown)?;
        answer.await.map_err(|_| ApiError::ShuttingDown)?
    }
}

/// How the proposer batches: see the module docs.
pub const PROPOSER_BATCHES: BatchLimits = BatchLimits {
    items_max: BATCH_PROPOSALS_MAX,
    bytes_max: BATCH_BYTES_MAX,
    in_flight_max: BATCHES_IN_FLIGHT_MAX,
    yield_before_taking: false,
};

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// Resolves once this replica, which led in `term` as the metrics last said before a write,
/// no longer leads in it. Never, if it did not lead then: Raft refuses that write itself, with
/// the leader it knows.
/// The metrics are read at the call, not when the future is first polled.
///
/// It watches openraft's server metrics, which change with the vote, the leader or the
/// membership only. Its full metrics change with every append and apply, and would wake each
/// batch in flight for each of them.
fn term_over(
    mut metrics: watch::Receiver<RaftServerMetrics>,
) -> impl std::future::Future<Output = ()> {
    let (id, term, led) = {
        let m = metrics.borrow_and_update();
        (
            m.id,
            m.vote.leader_id().term,
            m.current_leader == Some(m.id),
        )
    };
    let keeps_ended_terms = keeps_batches_of_ended_terms();
    async move {
        if !led || keeps_ended_terms {
            return std::future::pending().await;
        }
        let _ = metrics
            .wait_for(|m| m.vote.leader_id().term != term || m.current_leader != Some(id))
            .await;
    }
}

/// False, unless the fail point `proposer-keeps-batches-of-ended-terms` (compiled in only with
/// the `failpoints` feature) takes the give-up away: that is how a test shows the simulation
/// catching a proposer without it (`tests/failpoints.rs`).
fn keeps_batches_of_ended_terms() -> bool {
    fail::fail_point!("proposer-keeps-batches-of-ended-terms", |_| true);
    false
}

async fn run(raft: Raft, incoming: mpsc::Receiver<Pending>, stages: Arc<CommitStages>) {
    let metrics = raft.server_metrics();
    // Everything that queued while the batches in flight held every slot goes into the next
    // batch, as far as it fits.
    let mut batches = Accumulator::new(incoming, PROPOSER_BATCHES, |p: &Pending| {
        p.proposal.encoded_len()
    });
    while let Some((pending, permit)) = batches.next().await {
        let handed_over = Instant::now();
        for p in &pending {
            stages.observe(Stage::queued, handed_over - p.queued_at);
        }
        let (proposals, replies): (Vec<Proposal>, Vec<oneshot::Sender<ProposalResult>>) =
            pending.into_iter().map(|p| (p.proposal, p.reply)).unzip();
        let batch = Batch {
            appended_at_ms: now_ms(),
            proposals,
        };
        // Taken before the write: if the term ends before the batch is applied, the batch is
        // given up (see the module docs).
        let term_over = term_over(metrics.clone());
        let receiver = match raft.client_write_ff(Arc::new(batch)).await {
            Ok(receiver) => receiver,
            Err(_fatal) => {
                answer_all(replies, Err(ApiError::ShuttingDown));
                return;
            }
        };
        let stages = stages.clone();
        tokio::spawn(async move {
            let _permit = permit;
            let outcome = tokio::select! {
                biased;
                outcome = receiver => outcome.ok(),
                () = term_over => None,
            };
            if let Some(Ok(_)) = &outcome {
                stages.observe(Stage::raft, handed_over.elapsed());
            }
            match outcome {
                Some(Ok(response)) => {
                    debug_assert_eq!(response.data.len(), replies.len());
                    for (reply, outcome) in replies.into_iter().zip(response.data) {
                        let _ = reply.send(Ok(outcome));
                    }
                }
                Some(Err(refused)) => answer_all(replies, Err(refused.into())),
                // The leader stepped down or stopped before the batch was applied, or its term
                // ended: its fate is unknown, and an idempotent retry is how the caller learns it.
                None => answer_all(
                    replies,
                    Err(ApiError::Unavailable(
                        "leadership changed before the append was applied; retry".into(),
                    )),
                ),
            }
        });
    }
}

fn answer_all(replies: Vec<oneshot::Sender<ProposalResult>>, answer: ProposalResult) {
    for reply in replies {
        let _ = reply.send(answer.clone());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::raft::types::Vote;
    use crate::NodeId;

    fn metrics(term: u64, leader: Option<NodeId>) -> RaftServerMetrics {
        RaftServerMetrics {
            id: 1,
            vote: Vote::new_committed(term, leader.unwrap_or(0)),
            state: openraft::ServerState::Follower,
            current_leader: leader,
            membership_config: Arc::default(),
        }
    }

    /// A batch proposed by the leader of term 5 is given up when term 5 ends or this replica
    /// stops leading, whatever openraft does with its responder; one proposed while not
    /// leading is left for Raft to refuse with the leader it knows.
    #[tokio::test(start_paused = true)]
    async fn a_batch_is_given_up_when_its_term_ends() {
        let settles = |f: &mut (dyn std::future::Future<Output = ()> + Unpin)| {
            futures::FutureExt::now_or_never(f).is_some()
        };
        for (what, next, over) in [
            ("a new term", metrics(6, Some(1)), true),
            ("another leader", metrics(5, Some(2)), true),
            ("no leader known", metrics(5, None), true),
            ("an apply in the same term", metrics(5, Some(1)), false),
        ] {
            let (publish, watched) = watch::channel(metrics(5, Some(1)));
            let mut over_future = Box::pin(term_over(watched));
            assert!(!settles(&mut over_future), "{what}: not before a change");
            publish.send_replace(next);
            assert_eq!(settles(&mut over_future), over, "{what}");
        }

        let (publish, watched) = watch::channel(metrics(5, Some(2)));
        let mut over_future = Box::pin(term_over(watched));
        publish.send_replace(metrics(6, Some(1)));
        assert!(!settles(&mut over_future), "not leading at the write");
    }

    /// A batch takes what is queued while it fits, never more than `BATCH_BYTES_MAX` unless
    /// one proposal alone is larger; what does not fit starts the next batch, in order.
    #[tokio::test]
    async fn a_batch_takes_what_fits_and_carries_the_rest() {
        // (what, proposal sizes in queue order, the batches expected)
        type Case = (&'static str, Vec<usize>, Vec<Vec<usize>>);
        let cases: [Case; 4] = [
            (
                "small ones together",
                vec![10, 20, 30],
                vec![vec![10, 20, 30]],
            ),
            (
                "three at the size limit, one each",
                vec![BATCH_BYTES_MAX; 3],
                vec![vec![BATCH_BYTES_MAX]; 3],
            ),
            (
                "a large one alone, then the rest",
                vec![100, BATCH_BYTES_MAX - 150, 100, 5 * BATCH_BYTES_MAX, 7],
                vec![
                    vec![100, BATCH_BYTES_MAX - 150],
                    vec![100],
                    vec![5 * BATCH_BYTES_MAX],
                    vec![7],
                ],
            ),
            (
                "the count bound",
                vec![1; BATCH_PROPOSALS_MAX + 1],
                vec![vec![1; BATCH_PROPOSALS_MAX], vec![1]],
            ),
        ];
        for (what, sizes, expected) in cases {
            let (sender, incoming) = mpsc::channel(sizes.len());
            for size in &sizes {
                sender.try_send(*size).unwrap();
            }
            drop(sender);
            let mut batches = Vec::new();
            let mut accumulator = Accumulator::new(incoming, PROPOSER_BATCHES, |size| *size);
            while let Some((batch, _slot)) = accumulator.next().await {
                assert!(
                    batch.len() == 1 || batch.iter().sum::<usize>() <= BATCH_BYTES_MAX,
                    "{what}: {batch:?}"
                );
                batches.push(batch);
            }
            assert_eq!(batches, expected, "{what}");
        }
    }
}
