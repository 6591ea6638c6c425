//! Raft's log matching, checked where openraft does not: an entry sent under a log id this
//! replica holds must be the entry it holds.
//!
//! openraft 0.9 compares incoming entries with its log by log id only
//! (`first_conflicting_index`) and never hands the store an entry whose id it already holds,
//! so a store cannot see the difference. Log matching makes the comparison redundant in a
//! correct cluster; it is here for the clusters that are not: a leader that lost entries to a
//! power loss and wrote others under their ids (what `log_store::as_restarted` now prevents),
//! a damaged disk, a peer that lies. Answering `Success` there would count this replica as
//! holding an entry it does not hold. So the peer port (and the simulation's network) calls
//! [`stop_on_divergence`] before openraft sees an `AppendEntries`: a replica that finds a
//! [`Divergence`] stops instead of answering.

use super::storage::log_store::LogStore;
use super::types::{Entry, LogId, Raft};
use crate::log::encode;
use crate::NodeId;

/// An entry sent under a log id this replica holds, with other contents: the replicas' logs
/// have forked, and no answer this replica could give would be true.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error(
    "log matching broken: {sender} sent a different entry under log id {log_id}, which this \
     replica holds (held {held_bytes} bytes, sent {sent_bytes}); stopping rather than answer"
)]
pub struct Divergence {
    pub log_id: LogId,
    /// The replica the entry came from.
    pub sender: NodeId,
    pub held_bytes: usize,
    pub sent_bytes: usize,
}

/// Checks `entries`, sent by `sender`, against what `log` holds at their indexes: an entry at an
/// index the log holds under the same log id must encode to the same bytes. Entries beyond the
/// log's end, or under other log ids (a conflict openraft resolves by truncating), pass.
///
/// Cost: nothing for the ordinary message, whose entries all follow the log's end; a resent
/// message reads its held entries from the log's window of newest entries. An entry the log
/// cannot read is left to openraft, which reads it too and stops on the error.
fn check_held(log: &LogStore, sender: NodeId, entries: &[Entry]) -> Result<(), Divergence> {
    let Some(last_held) = log.last_log_id().map(|id| id.index) else {
        return Ok(());
    };
    let first_held = log.first_index();
    for sent in entries
        .iter()
        .filter(|e| (first_held..=last_held).contains(&e.log_id.index))
    {
        let held = match log.entry(sent.log_id.index) {
            Ok(Some(held)) if held.log_id == sent.log_id => held,
            Ok(_) => continue,
            Err(error) => {
                tracing::warn!(%error, index = sent.log_id.index, "could not read a held entry to compare");
                continue;
            }
        };
        let (held_bytes, sent_bytes) = (encode(&*held), encode(sent));
        if held_bytes != sent_bytes {
            return Err(Divergence {
                log_id: sent.log_id,
                sender,
                held_bytes: held_bytes.len(),
                sent_bytes: sent_bytes.len(),
            });
        }
    }
    Ok(())
}

/// `check_held`, and on a [`Divergence`] the stop: the error is logged and `raft`'s core is
/// shut down (its metrics then report it stopped, and `ctrlog serve` exits on that), so the
/// caller answers the sender with the returned error instead of passing the request on.
pub fn stop_on_divergence(
    raft: &Raft,
    log: &LogStore,
    sender: NodeId,
    entries: &[Entry],
) -> Result<(), Divergence> {
    check_held(log, sender, entries).inspect_err(|divergence| {
        tracing::error!(%divergence, "stopping this replica's Raft core");
        let raft = raft.clone();
        tokio::spawn(async move { raft.shutdown().await });
    })
}
