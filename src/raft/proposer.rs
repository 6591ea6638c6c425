//! The leader-side proposer: coalesces concurrent appends into batched Raft entries.
//!
//! openraft 0.9 turns every `client_write` into its own entry and waits for each entry's flush
//! before the next, which caps a 3-replica cluster near 2,000 entries/s (DESIGN.md §4). So
//! appends queue here; the proposer task takes everything queued (up to
//! [`BATCH_PROPOSALS_MAX`] proposals and [`BATCH_BYTES_MAX`] bytes), stamps the batch with the
//! wall clock, and proposes it as one entry. While up to [`BATCHES_IN_FLIGHT_MAX`] batches are
//! in Raft, the next one fills.
//!
//! Protocol: each [`Proposer::propose`] sends its proposal with a oneshot sender and awaits the
//! receiver. The task answers every sender exactly once: with the proposal's outcome once the
//! batch is applied, or with an error if Raft refused or lost the batch. Proposals are handed
//! to Raft in arrival order, so one producer's sequential appends are applied in order.

use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use tokio::sync::{mpsc, oneshot, Semaphore};

use super::types::Raft;
use crate::client::ApiError;
use crate::jobs::Outcome;
use crate::log::{Batch, Proposal};

/// What the state machine decided for one proposal, or why Raft did not decide it.
pub type ProposalResult = Result<Outcome, ApiError>;

/// Proposals per batch: bounds one entry's apply time and the latency of the first proposal
/// in it.
pub const BATCH_PROPOSALS_MAX: usize = 4096;
/// Bytes per batch (a batch closes once past this, so one command of the full size limit still
/// fits). Together with `RAFT_PAYLOAD_ENTRIES_MAX` it bounds an AppendEntries message.
pub const BATCH_BYTES_MAX: usize = 1 << 20;
/// Batches proposed but not yet applied. More than one lets the next batch's proposal overlap
/// with the current batch's replication and fsync.
pub const BATCHES_IN_FLIGHT_MAX: usize = 4;
/// Appends queued before the proposer task; beyond this, callers wait (back-pressure).
const QUEUE_DEPTH: usize = 64 * 1024;

struct Pending {
    proposal: Proposal,
    reply: oneshot::Sender<ProposalResult>,
}

/// The handle producers append through.
#[derive(Clone)]
pub struct Proposer {
    queue: mpsc::Sender<Pending>,
}

impl Proposer {
    /// Starts the proposer task for `raft`. It stops when every handle is dropped.
    pub fn start(raft: Raft) -> Proposer {
        let (queue, incoming) = mpsc::channel(QUEUE_DEPTH);
        tokio::spawn(run(raft, incoming));
        Proposer { queue }
    }

    /// Appends one proposal and waits until it is committed and applied.
    pub async fn propose(&self, proposal: Proposal) -> ProposalResult {
        let (reply, answer) = oneshot::channel();
        self.queue
            .send(Pending { proposal, reply })
            .await
            .map_err(|_| ApiError::ShuttingDown)?;
        answer.await.map_err(|_| ApiError::ShuttingDown)?
    }
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

async fn run(raft: Raft, mut incoming: mpsc::Receiver<Pending>) {
    let in_flight = Arc::new(Semaphore::new(BATCHES_IN_FLIGHT_MAX));
    while let Some(first) = incoming.recv().await {
        let Ok(permit) = in_flight.clone().acquire_owned().await else {
            return;
        };
        // Everything that queued while we waited for a slot goes into this batch.
        let mut bytes = first.proposal.encoded_len();
        let mut pending = vec![first];
        while pending.len() < BATCH_PROPOSALS_MAX && bytes < BATCH_BYTES_MAX {
            match incoming.try_recv() {
                Ok(next) => {
                    bytes += next.proposal.encoded_len();
                    pending.push(next);
                }
                Err(_) => break,
            }
        }
        let (proposals, replies): (Vec<Proposal>, Vec<oneshot::Sender<ProposalResult>>) =
            pending.into_iter().map(|p| (p.proposal, p.reply)).unzip();
        let batch = Batch {
            appended_at_ms: now_ms(),
            proposals,
        };
        let receiver = match raft.client_write_ff(batch).await {
            Ok(receiver) => receiver,
            Err(_fatal) => {
                answer_all(replies, Err(ApiError::ShuttingDown));
                return;
            }
        };
        tokio::spawn(async move {
            let _permit = permit;
            match receiver.await {
                Ok(Ok(response)) => {
                    debug_assert_eq!(response.data.len(), replies.len());
                    for (reply, outcome) in replies.into_iter().zip(response.data) {
                        let _ = reply.send(Ok(outcome));
                    }
                }
                Ok(Err(refused)) => answer_all(replies, Err(refused.into())),
                // The leader stepped down or stopped before the batch was applied: its fate is
                // unknown, and an idempotent retry is how the caller learns it.
                Err(_) => answer_all(
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
