//! A replica's storage opened and its state machine restored from the stored snapshot: what
//! Raft runs on. The storage opens and repairs itself ([`data_dir::open`]); the state machine
//! is folded from the snapshot it hands over. Also the seeding of a new cluster's replica from
//! a backup of a job's state, which installs that state as the state machine's snapshot.

use std::collections::{BTreeMap, BTreeSet};
use std::io;
use std::path::Path;

use openraft::storage::RaftStateMachine as _;
use openraft::{CommittedLeaderId, Membership};

use super::state_machine::{MachineState, StateMachineStore};
use super::storage::data_dir::{self, claim, meta_dir, ClusterIdentity};
use super::storage::fault::FaultKind;
use super::storage::log_store::{Flushing, LogStore, SEGMENT_BYTES_MAX};
use super::storage::meta_store::Closed;
use super::storage::write_faults;
use super::types::{LogId, SnapshotMeta, StoredMembership};
use crate::wire::Member;
use crate::NodeId;

/// A replica's storage, opened: what Raft runs on.
pub struct Storage {
    pub log: LogStore,
    pub state_machine: StateMachineStore,
    /// Fires once every handle to the storage is gone and sled has released its directory.
    pub closed: Closed,
    /// The faults this open found and began repairing.
    pub found_at_open: Vec<FaultKind>,
}

/// Opens the storage of replica `id` in `data_dir` ([`open_storage`]) once the directory is
/// [claimed](claim) for it.
pub fn open_storage_of(data_dir: &Path, id: NodeId) -> io::Result<Storage> {
    claim(data_dir, id)?;
    open_storage(data_dir)
}

/// Opens a replica's storage in `data_dir`: its metadata and log, and the state machine
/// restored from its latest snapshot.
///
/// Blocking: recovery reads the whole retained log, and opening may wait for the directory's
/// lock. Call it off the async runtime's workers.
pub fn open_storage(data_dir: &Path) -> io::Result<Storage> {
    open_storage_with(data_dir, Flushing::GroupCommit, SEGMENT_BYTES_MAX)
        .map_err(|error| write_faults::naming_the_remedy(data_dir, error))
}

/// [`open_storage`], flushing appends as `flushing` says (the simulation flushes inline), in
/// WAL segments of `segment_bytes_max` bytes (the simulation's are small, so that it purges
/// whole segments).
pub fn open_storage_with(
    data_dir: &Path,
    flushing: Flushing,
    segment_bytes_max: u64,
) -> io::Result<Storage> {
    let opened = data_dir::open(data_dir, flushing, segment_bytes_max)?;
    let state_machine = StateMachineStore::restore(
        opened.snapshots,
        opened.log.clone(),
        opened.current_snapshot,
    )?;
    Ok(Storage {
        log: opened.log,
        state_machine,
        closed: opened.closed,
        found_at_open: opened.found_at_open,
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
    let storage = open_storage_of(data_dir, id)?;
    let mut state_machine = storage.state_machine.clone();
    state_machine
        .install_snapshot(
            &meta,
            Box::new(std::io::Cursor::new(crate::log::encode(&machine))),
        )
        .await
        .map_err(io::Error::other)?;
    ClusterIdentity::load(data_dir)?.restored(cluster)?;
    let closed = storage.closed;
    drop((storage.log, storage.state_machine, state_machine));
    closed.wait().await;
    Ok(Seeded {
        snapshot,
        offset: state.offset,
    })
}
