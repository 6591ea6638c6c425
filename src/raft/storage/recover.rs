//! Disaster recovery: a stopped replica's data becomes a one-replica cluster of its own, keeping
//! everything it holds (etcd's `--force-new-cluster`), for when a majority of the replicas is
//! lost for good and the cluster cannot elect a leader any more. (A new cluster seeded from a
//! backup's job state, etcdctl's `snapshot restore`, is the consensus side's:
//! [`seed_from_state`](crate::raft::restore::seed_from_state).)
//!
//! It appends a membership entry naming this replica as the only voter, under a term above any
//! it has seen, and votes for itself in that term (not committed). Started again, the replica
//! is a follower whose membership needs only its own vote: it elects itself and commits the
//! entry and everything before it. New replicas then join with `members add`.
//!
//! Entries the survivor held that the old cluster never committed become committed, as with
//! etcd; and the old replicas must never be started on their directories again, since they
//! still believe in the old membership.

use std::collections::{BTreeMap, BTreeSet};
use std::io;
use std::path::Path;

use openraft::{CommittedLeaderId, EntryPayload, Membership};

use super::data_dir::{meta_dir, open_log};
use crate::raft::types::{Entry, LogId, Vote};
use crate::wire::Member;
use crate::NodeId;

/// What [`force_new_cluster`] wrote.
#[derive(Debug)]
pub struct ForcedMembership {
    /// The entry that makes this replica the only voter; it commits once the replica leads.
    pub entry: LogId,
    /// The last entry the old cluster's log held here.
    pub previous_last: LogId,
}

/// Makes the stopped replica `id`, whose data is in `data_dir`, the only member of its
/// cluster, reachable at `member`'s addresses. Refuses a directory in use (the replica must be
/// stopped) and one without a log.
pub fn force_new_cluster(
    data_dir: &Path,
    id: NodeId,
    member: Member,
) -> io::Result<ForcedMembership> {
    let nothing_to_recover = || {
        io::Error::new(
            io::ErrorKind::NotFound,
            format!(
                "{} holds no log: there is nothing to recover",
                data_dir.display()
            ),
        )
    };
    // Checked before opening, which would create the stores.
    if !meta_dir(data_dir).is_dir() {
        return Err(nothing_to_recover());
    }
    let (_, log) = open_log(data_dir)?;
    let Some(previous_last) = log.last_log_id() else {
        return Err(nothing_to_recover());
    };
    let seen = log
        .vote()
        .map_or(0, |v| v.leader_id.term)
        .max(previous_last.leader_id.term);
    let term = seen + 1;
    let entry = Entry {
        log_id: LogId::new(CommittedLeaderId::new(term, id), previous_last.index + 1),
        payload: EntryPayload::Membership(Membership::new(
            vec![BTreeSet::from([id])],
            BTreeMap::from([(id, member)]),
        )),
    };
    // The vote first: a crash between the two leaves an ordinary candidate's state, and running
    // this again simply goes one term higher.
    log.save_vote_durable(&Vote::new(term, id))?;
    log.append_durable(&entry)?;
    tracing::warn!(
        id = id,
        term,
        index = entry.log_id.index,
        "forced a new one-replica cluster"
    );
    Ok(ForcedMembership {
        entry: entry.log_id,
        previous_last,
    })
}
