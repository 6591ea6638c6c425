//! Disaster recovery: a stopped replica's data becomes a one-replica cluster of its own, keeping
//! everything it holds (etcd's `--force-new-cluster`), for when a majority of the replicas is
//! lost for good and the cluster cannot elect a leader any more; or a new cluster is seeded
//! from a backup's job state ([`seed_from_state`], etcdctl's `snapshot restore`).
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

/// What [`seed_from_state`] wrote.
#[derive(Debug)]
pub struct Seeded {
    /// The Raft log id the seeded snapshot stands at (index 1, term 0): every replica seeded
    /// from the same backup and members holds the same one, so any of them may lead.
    pub snapshot: LogId,
    /// The last offset the state holds; the new cluster's first append gets the next one.
    pub offset: crate::log::Offset,
}

/// Seeds the empty data directory of replica `id` of a new cluster of `members` with a job
/// state (a backup's): the state machine gets a snapshot of it at Raft index 1 whose
/// membership is `members`, and the directory records `id` and `cluster`. Every member is
/// seeded alike from the same state; started, they elect a leader among themselves, and their
/// log continues at the state's next offset (a subscription from below it is `Compacted`).
/// Refuses a directory that holds a replica already.
pub async fn seed_from_state(
    data_dir: &Path,
    id: NodeId,
    members: BTreeMap<NodeId, Member>,
    state: &crate::wire::StateAt,
    cluster: crate::wire::ClusterId,
) -> io::Result<Seeded> {
    use crate::raft::state_machine::MachineState;
    use crate::raft::types::{SnapshotMeta, StoredMembership};
    use openraft::storage::RaftStateMachine as _;
    if !members.contains_key(&id) {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("replica {id} is not among the members named"),
        ));
    }
    if meta_dir(data_dir).exists() {
        return Err(io::Error::new(
            io::ErrorKind::AlreadyExists,
            format!(
                "{} holds a replica's data already: restore into an empty directory",
                data_dir.display()
            ),
        ));
    }
    let lowest = *members.keys().next().expect("id is among them");
    let snapshot = LogId::new(CommittedLeaderId::new(0, lowest), 1);
    let voters: BTreeSet<NodeId> = members.keys().copied().collect();
    let membership = StoredMembership::new(Some(snapshot), Membership::new(vec![voters], members));
    let machine = MachineState {
        last_applied: Some(snapshot),
        last_membership: membership.clone(),
        job: state.state.clone(),
        offset_index: BTreeMap::new(),
        rejections: state.rejections.clone(),
    };
    let meta = SnapshotMeta {
        last_log_id: Some(snapshot),
        last_membership: membership,
        snapshot_id: format!("restored-{}", state.offset),
    };
    let storage = super::data_dir::open_storage_of(data_dir, id)?;
    let mut state_machine = storage.state_machine.clone();
    state_machine
        .install_snapshot(
            &meta,
            Box::new(std::io::Cursor::new(crate::log::encode(&machine))),
        )
        .await
        .map_err(io::Error::other)?;
    super::data_dir::ClusterIdentity::load(data_dir)?.restored(cluster)?;
    let closed = storage.closed;
    drop((storage.log, storage.state_machine, state_machine));
    closed.wait().await;
    Ok(Seeded {
        snapshot,
        offset: state.offset,
    })
}
