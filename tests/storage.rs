//! A replica's real storage (the WAL, sled and the state machine, over temporary directories)
//! driven through openraft's storage traits in the orders openraft uses them, then closed and
//! opened again: every catch-up path must leave a directory a replica can start on.

mod common;

use std::path::Path;

use common::copy_dir;
use ctrlog::log::{Batch, Command, Proposal, Target};
use ctrlog::raft::restore::{open_storage, open_storage_with, Storage};
use ctrlog::raft::storage::data_dir::{log_dir, meta_dir};
use ctrlog::raft::storage::log_store::faults as sled_vote;
use ctrlog::raft::storage::log_store::Flushing;
use ctrlog::raft::storage::two_copies::{faults as two_copies_faults, REPAIR, VOTE};
use ctrlog::raft::storage::wal::faults as wal_faults;
use ctrlog::raft::types::{Entry, LogId, Snapshot, Vote};
use openraft::storage::{RaftLogReader, RaftLogStorage, RaftSnapshotBuilder, RaftStateMachine};
use openraft::{CommittedLeaderId, EntryPayload};

fn entry(index: u64) -> Entry {
    entry_of_term(index, 1)
}

fn entry_of_term(index: u64, term: u64) -> Entry {
    Entry {
        log_id: LogId::new(CommittedLeaderId::new(term, 1), index),
        payload: EntryPayload::Normal(std::sync::Arc::new(Batch {
            appended_at_ms: 0,
            proposals: vec![Proposal {
                producer: None,
                target: Target::All,
                frame: Command::custom(1, 1, format!("command {index}").into_bytes()).into_frame(),
            }],
        })),
    }
}

/// Appends (durably) and applies entries `from..=to`, as a replica that committed them.
async fn append_and_apply(storage: &mut Storage, from: u64, to: u64) {
    for index in from..=to {
        storage.log.append_durable(&entry(index)).unwrap();
    }
    let entries: Vec<Entry> = (from..=to).map(entry).collect();
    storage.state_machine.apply(entries).await.unwrap();
}

/// Builds (and stores) a snapshot of what the storage applied.
async fn build_snapshot(storage: &mut Storage) -> Snapshot {
    let mut builder = storage.state_machine.get_snapshot_builder().await;
    builder.build_snapshot().await.unwrap()
}

/// A stopped replica of this build in `dir`: entries 1..=200 in segments of 4 KiB, a snapshot
/// at 200, entries up to 220, a purge up to 195, a vote.
async fn stopped_replica(dir: &Path) {
    let mut storage = open_storage_with(dir, Flushing::GroupCommit, 4 << 10).unwrap();
    append_and_apply(&mut storage, 1, 200).await;
    build_snapshot(&mut storage).await;
    append_and_apply(&mut storage, 201, 220).await;
    storage.log.purge(entry(195).log_id).await.unwrap();
    storage.log.save_vote(&Vote::new(3, 2)).await.unwrap();
    close(storage).await;
}

/// Closes the storage, waiting until sled has released the directory.
async fn close(storage: Storage) {
    let Storage {
        log,
        state_machine,
        closed,
        ..
    } = storage;
    drop((log, state_machine));
    closed.wait().await;
}

/// Closes the storage (waiting until sled has released the directory) and opens it again.
async fn reopen(storage: Storage, dir: &Path) -> Storage {
    close(storage).await;
    open_storage(dir).unwrap()
}

/// What openraft checks when it starts: every entry from the purge point to the last one is
/// there. Returns the log's `(last purged, last)` indexes.
async fn assert_contiguous_log(storage: &mut Storage) -> (u64, u64) {
    let state = storage.log.get_log_state().await.unwrap();
    let purged = state.last_purged_log_id.map_or(0, |l| l.index);
    let last = state.last_log_id.map_or(0, |l| l.index);
    let indexes: Vec<u64> = storage
        .log
        .try_get_log_entries(purged + 1..=last)
        .await
        .unwrap()
        .iter()
        .map(|e| e.log_id.index)
        .collect();
    assert_eq!(
        indexes,
        (purged + 1..=last).collect::<Vec<_>>(),
        "the log from its purge point ({purged}) to its end ({last}) has a hole"
    );
    (purged, last)
}

/// The leader's snapshot of 50 applied entries (built by a store of its own), and a follower
/// whose store holds entries 1 to 5, with its directory.
async fn a_follower_behind_a_snapshot(dir: &Path) -> (Snapshot, std::path::PathBuf, Storage) {
    let mut leader = open_storage(&dir.join("leader")).unwrap();
    append_and_apply(&mut leader, 1, 50).await;
    let snapshot = build_snapshot(&mut leader).await;
    let follower_dir = dir.join("follower");
    let mut follower = open_storage(&follower_dir).unwrap();
    append_and_apply(&mut follower, 1, 5).await;
    (snapshot, follower_dir, follower)
}

/// Regression (a follower that caught up by snapshot install could not start again): openraft
/// asks for the purge behind an installed snapshot before the install is durable. The store
/// may not purge past its durable snapshot then, and it used to drop that purge for good, so
/// the log kept its old prefix and continued after the snapshot with a hole in between, which
/// openraft refuses at start ("try to get log at index N but got None").
/// Steps: a follower holds entries 1..=5; openraft purges up to 50, then installs the leader's
/// snapshot at 50; entry 51 arrives; the follower's storage is closed and opened again, and
/// again after one more entry: each time its log runs without a hole from the purge point.
#[tokio::test]
async fn a_purge_asked_before_an_install_is_durable_leaves_no_hole_after_restart() {
    let dir = tempfile::tempdir().unwrap();
    let (snapshot, follower_dir, mut follower) = a_follower_behind_a_snapshot(dir.path()).await;
    let installed = snapshot.meta.last_log_id.unwrap();
    follower.log.purge(installed).await.unwrap();
    follower
        .state_machine
        .install_snapshot(&snapshot.meta, snapshot.snapshot)
        .await
        .unwrap();
    append_and_apply(&mut follower, 51, 51).await;
    assert_contiguous_log(&mut follower).await;

    let mut follower = reopen(follower, &follower_dir).await;
    assert_eq!(assert_contiguous_log(&mut follower).await, (50, 51));
    append_and_apply(&mut follower, 52, 52).await;
    let mut follower = reopen(follower, &follower_dir).await;
    assert_eq!(assert_contiguous_log(&mut follower).await, (50, 52));
    let (applied, _) = follower.state_machine.applied_state().await.unwrap();
    assert_eq!(
        applied.map(|l| l.index),
        Some(50),
        "restored from the snapshot"
    );
}

/// The other order openraft may use: the install is stored first and the purge follows. No
/// hole either, and the purge is not held back.
#[tokio::test]
async fn a_purge_after_a_durable_install_leaves_no_hole_after_restart() {
    let dir = tempfile::tempdir().unwrap();
    let (snapshot, follower_dir, mut follower) = a_follower_behind_a_snapshot(dir.path()).await;
    let installed = snapshot.meta.last_log_id.unwrap();
    follower
        .state_machine
        .install_snapshot(&snapshot.meta, snapshot.snapshot)
        .await
        .unwrap();
    follower.log.purge(installed).await.unwrap();
    append_and_apply(&mut follower, 51, 53).await;
    let mut follower = reopen(follower, &follower_dir).await;
    assert_eq!(assert_contiguous_log(&mut follower).await, (50, 53));
}

/// The log serves its newest entries from memory (`raft::recent`); what a truncation removed
/// must not be served from there, to readers of one entry or of a range, and what replaced it
/// must be. Steps: entries 1..=5 of term 1; a new leader's entries conflict from 4 on, so the
/// log is truncated at 4 and entry 4 of term 2 is written.
#[tokio::test]
async fn a_truncated_entry_is_not_served_from_memory() {
    let dir = tempfile::tempdir().unwrap();
    let mut storage = open_storage(dir.path()).unwrap();
    for index in 1..=5 {
        storage.log.append_durable(&entry(index)).unwrap();
    }
    assert_eq!(
        storage.log.entry(4).unwrap().unwrap().log_id.leader_id.term,
        1
    );

    storage.log.truncate(entry(4).log_id).await.unwrap();
    assert!(
        storage.log.entry(4).unwrap().is_none(),
        "entry 4 was truncated"
    );
    assert!(
        storage.log.entry(5).unwrap().is_none(),
        "entry 5 was truncated"
    );
    let left = storage.log.try_get_log_entries(1..=5).await.unwrap();
    assert_eq!(
        left.iter().map(|e| e.log_id.index).collect::<Vec<_>>(),
        [1, 2, 3]
    );

    storage.log.append_durable(&entry_of_term(4, 2)).unwrap();
    assert_eq!(
        storage.log.entry(4).unwrap().unwrap().log_id,
        entry_of_term(4, 2).log_id
    );
    let read = storage.log.try_get_log_entries(3..=4).await.unwrap();
    assert_eq!(read, [entry(3), entry_of_term(4, 2)]);
}

/// Regression (issue 31): the durable mark compares log ids, which order entries along one
/// log only. After a truncation a follower may be sent, at the truncated indexes, entries of
/// an *older* term than those it dropped (an older leader's, through the new one): the mark
/// of the dropped entries vouched for them before they were written. Steps: entries 1..=5 of
/// term 3 on disk; truncated from 3; the mark is at entry 2 and does not cover entry 3 of
/// term 2.
#[tokio::test]
async fn a_truncation_lowers_the_durable_mark_to_what_the_log_keeps() {
    let dir = tempfile::tempdir().unwrap();
    let mut storage = open_storage(dir.path()).unwrap();
    for index in 1..=5 {
        storage
            .log
            .append_durable(&entry_of_term(index, 3))
            .unwrap();
    }
    let durable = storage.log.durable();
    let mark = || durable.borrow().synced;
    assert_eq!(mark(), Some(entry_of_term(5, 3).log_id));
    storage
        .log
        .truncate(entry_of_term(3, 3).log_id)
        .await
        .unwrap();
    assert_eq!(mark(), Some(entry_of_term(2, 3).log_id));
    assert!(
        !durable.borrow().covers(Some(entry_of_term(3, 2).log_id)),
        "the mark vouches for an entry of an older term not yet written"
    );
}

/// Puts `vote` in sled's copy of a closed replica's vote, as sled's recovery would leave it
/// after dropping the writes since (a damaged tail of its own log).
fn roll_back_sleds_vote(dir: &Path, vote: Vote) {
    sled_vote::replace_sleds_vote(&meta_dir(dir), |_| Some(vote)).unwrap();
}

/// Goal: a vote that sled's recovery rolled back is not the vote the replica restarts with
/// (it could then vote a second time in a term it had voted in): the vote file's copy stands.
/// On the build before the vote file, the replica restarted with sled's older vote.
#[tokio::test]
async fn a_vote_sled_rolled_back_is_kept_by_the_vote_file() {
    let dir = tempfile::tempdir().unwrap();
    let mut storage = open_storage(dir.path()).unwrap();
    storage.log.save_vote(&Vote::new(4, 1)).await.unwrap();
    storage.log.save_vote(&Vote::new(5, 2)).await.unwrap();
    close(storage).await;
    roll_back_sleds_vote(dir.path(), Vote::new(4, 1));
    let mut storage = open_storage(dir.path()).unwrap();
    assert_eq!(
        storage.log.read_vote().await.unwrap(),
        Some(Vote::new(5, 2))
    );
    close(storage).await;
    // And sled's copy was mended at the open: it holds the vote again.
    std::fs::remove_file(log_dir(dir.path()).join(VOTE.file_name)).unwrap();
    let mut storage = open_storage(dir.path()).unwrap();
    assert_eq!(
        storage.log.read_vote().await.unwrap(),
        Some(Vote::new(5, 2))
    );
}

/// Goal: a vote that both stores lost (no vote file, sled rolled back) is still never older
/// than the log: entries of term 6 from leader 3 mean the replica followed 3 in term 6.
#[tokio::test]
async fn a_vote_older_than_the_log_is_raised_to_its_last_entrys_leader() {
    let dir = tempfile::tempdir().unwrap();
    let mut storage = open_storage(dir.path()).unwrap();
    storage
        .log
        .save_vote(&Vote::new_committed(6, 3))
        .await
        .unwrap();
    for index in 1..=3 {
        let mut entry = entry_of_term(index, 6);
        entry.log_id.leader_id = CommittedLeaderId::new(6, 3);
        storage.log.append_durable(&entry).unwrap();
    }
    close(storage).await;
    std::fs::remove_file(log_dir(dir.path()).join(VOTE.file_name)).unwrap();
    roll_back_sleds_vote(dir.path(), Vote::new(2, 1));
    let mut storage = open_storage(dir.path()).unwrap();
    assert_eq!(
        storage.log.read_vote().await.unwrap(),
        Some(Vote::new_committed(6, 3))
    );
}

/// Goal: a vote file whose two copies are both damaged (rot no crash leaves) stops the replica
/// with an error that names the file, rather than a replica that forgot its vote.
#[tokio::test]
async fn a_vote_file_damaged_in_both_copies_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let mut storage = open_storage(dir.path()).unwrap();
    storage.log.save_vote(&Vote::new(4, 1)).await.unwrap();
    close(storage).await;
    for copy in 0..2 {
        assert!(two_copies_faults::flip_copy_byte(&log_dir(dir.path()), &VOTE, copy, 9).unwrap());
    }
    let refused = open_storage(dir.path()).err().expect("refused");
    assert_eq!(refused.kind(), std::io::ErrorKind::InvalidData);
    assert!(refused.to_string().contains(VOTE.file_name), "{refused}");
}

/// Goal: a replica repairing a damaged log never forgets it is repairing (it would vote with a
/// log that lacks entries it acknowledged): sled losing its latest writes takes nothing from
/// the repair, which is kept in a file of two checksummed copies; one damaged copy leaves the
/// other; both damaged is refused; and the repair's end is as durable as its start. On the
/// build that kept the repair in sled, sled losing the write forgot it.
#[tokio::test]
async fn a_repair_under_way_survives_sled_losing_writes_and_one_damaged_copy() {
    let dir = tempfile::tempdir().unwrap();
    let storage = open_storage(dir.path()).unwrap();
    for index in 1..=10 {
        storage.log.append_durable(&entry(index)).unwrap();
    }
    close(storage).await;
    let log = log_dir(dir.path());
    ctrlog::raft::storage::wal::faults::flip_synced_byte(&log, 200)
        .unwrap()
        .expect("a byte to flip");
    let storage = open_storage(dir.path()).unwrap();
    let repair = storage
        .log
        .repairing()
        .unwrap()
        .expect("the damage is found");
    assert_eq!(repair.held.index, 10);
    close(storage).await;

    // sled's recovery drops its latest writes: whatever it held of the repair is gone.
    let meta = ctrlog::raft::storage::meta_store::MetaStore::open(&meta_dir(dir.path())).unwrap();
    meta.remove_durable("repair").unwrap();
    drop(meta);
    let storage = open_storage(dir.path()).unwrap();
    assert_eq!(storage.log.repairing().unwrap(), Some(repair.clone()));
    close(storage).await;

    for copy in 0..2 {
        assert!(two_copies_faults::flip_copy_byte(&log, &REPAIR, copy, 30).unwrap());
        let storage = open_storage(dir.path()).unwrap();
        let case = format!("copy {copy} damaged");
        assert_eq!(
            storage.log.repairing().unwrap(),
            Some(repair.clone()),
            "{case}"
        );
        close(storage).await;
    }
    for copy in 0..2 {
        assert!(two_copies_faults::flip_copy_byte(&log, &REPAIR, copy, 30).unwrap());
    }
    let refused = open_storage(dir.path()).err().expect("both copies damaged");
    assert_eq!(refused.kind(), std::io::ErrorKind::InvalidData);
    assert!(refused.to_string().contains(REPAIR.file_name), "{refused}");

    // Mended by hand for the rest of the test: the repair ends once the log holds entry 10
    // again, and stays ended.
    for copy in 0..2 {
        assert!(two_copies_faults::flip_copy_byte(&log, &REPAIR, copy, 30).unwrap());
    }
    let storage = open_storage(dir.path()).unwrap();
    let next = storage.log.last_log_id().map_or(1, |id| id.index + 1);
    assert!(next < 10, "the damage cut the log");
    for index in next..=10 {
        storage.log.append_durable(&entry(index)).unwrap();
    }
    assert_eq!(storage.log.repairing().unwrap(), None);
    let storage = reopen(storage, dir.path()).await;
    assert_eq!(storage.log.repairing().unwrap(), None);
}

/// Goal: sled losing its latest writes (its recovery drops a damaged tail of its own log) can
/// take a snapshot the WAL was purged behind, leaving an older snapshot that stops short of
/// the log: the entries between are in neither. The replica must start over from the
/// leader's snapshot as for a damaged one, repairing (no vote, no candidacy) until it holds
/// what it held, rather than come up unable to rebuild its state. Seen on d818a4e: it
/// opened as if whole, with a snapshot at 60 and a log from 153.
#[tokio::test]
async fn a_snapshot_sled_lost_behind_a_purged_log_starts_the_replica_over() {
    const SEGMENT_BYTES: u64 = 4 << 10;
    let dir = tempfile::tempdir().unwrap();
    let open = |dir: &Path| open_storage_with(dir, Flushing::GroupCommit, SEGMENT_BYTES).unwrap();
    let mut storage = open(dir.path());
    append_and_apply(&mut storage, 1, 60).await;
    build_snapshot(&mut storage).await;
    close(storage).await;
    let sled_then = dir.path().join("sled then");
    copy_dir(&meta_dir(dir.path()), &sled_then);

    let mut storage = open(dir.path());
    append_and_apply(&mut storage, 61, 200).await;
    build_snapshot(&mut storage).await;
    storage.log.purge(entry(195).log_id).await.unwrap();
    let first = storage.log.first_index();
    assert!(
        first > 61,
        "the purge removed whole segments (the log starts at {first})"
    );
    close(storage).await;

    std::fs::remove_dir_all(meta_dir(dir.path())).unwrap();
    copy_dir(&sled_then, &meta_dir(dir.path()));
    let mut storage = open(dir.path());
    let repair = storage.log.repairing().unwrap().expect("a repair begins");
    assert_eq!(repair.held.index, 200, "{repair}");
    assert!(repair.segment.contains("damaged"), "{repair}");
    assert_eq!(storage.state_machine.stored_snapshot_last().unwrap(), None);
    assert_contiguous_log(&mut storage).await;
}

/// Regression (seed 315 of the five-replica rotting-disk scan: "try to get log at index 2425 but
/// got None" at restart): sled lost the purge point after the WAL had removed the segments it
/// allowed, while the snapshot that covers them survived. The log then started past the entry
/// after its purge point, and openraft, which reads the log from there, found nothing.
/// Steps: entries 1..=200 and a snapshot at 200 (sled copied then, before any purge); entries
/// up to 220 and a purge up to 195, which removes whole segments; sled put back as copied.
/// Opened, the log is contiguous from its purge point, no repair begins (nothing is lost: the
/// snapshot covers the gap), and it keeps entries 201..=220.
#[tokio::test]
async fn a_purge_point_sled_lost_after_the_segments_went_is_recorded_again() {
    const SEGMENT_BYTES: u64 = 4 << 10;
    let dir = tempfile::tempdir().unwrap();
    let open = |dir: &Path| open_storage_with(dir, Flushing::GroupCommit, SEGMENT_BYTES).unwrap();
    let mut storage = open(dir.path());
    append_and_apply(&mut storage, 1, 200).await;
    build_snapshot(&mut storage).await;
    append_and_apply(&mut storage, 201, 220).await;
    close(storage).await;
    let sled_then = dir.path().join("sled then");
    copy_dir(&meta_dir(dir.path()), &sled_then);

    let mut storage = open(dir.path());
    storage.log.purge(entry(195).log_id).await.unwrap();
    let first = storage.log.first_index();
    assert!(
        first > 1,
        "the purge removed whole segments (the log starts at {first})"
    );
    close(storage).await;

    std::fs::remove_dir_all(meta_dir(dir.path())).unwrap();
    copy_dir(&sled_then, &meta_dir(dir.path()));
    let mut storage = open(dir.path());
    assert_eq!(storage.log.repairing().unwrap(), None, "nothing is lost");
    assert_eq!(assert_contiguous_log(&mut storage).await, (200, 220));
    let mut storage = reopen(storage, dir.path()).await;
    assert_eq!(assert_contiguous_log(&mut storage).await, (200, 220));
}

/// Goal: sled refusing to open its own damaged files does not stop the replica (before, it
/// stayed down until its operator replaced the directory): the files are set aside, as found,
/// in a `log/damaged/` folder, sled starts over empty, and the replica starts over from the
/// leader's snapshot, neither voting nor standing until it holds its last entry again. The
/// vote, kept outside sled, survives.
/// Steps: entries 1..=200, a snapshot at 200, entries up to 220, a purge up to 195 (whole
/// segments go), a vote; closed; a bit of sled's `conf` file flipped (sled then reports
/// corruption: a refusal). Opened twice: one repair up to 220, one damaged folder.
#[tokio::test]
async fn a_sled_refusing_its_files_is_set_aside_and_the_replica_starts_over() {
    const SEGMENT_BYTES: u64 = 4 << 10;
    let dir = tempfile::tempdir().unwrap();
    let open = |dir: &Path| open_storage_with(dir, Flushing::GroupCommit, SEGMENT_BYTES).unwrap();
    stopped_replica(dir.path()).await;
    let sled_conf = meta_dir(dir.path()).join("conf");
    let mut bytes = std::fs::read(&sled_conf).unwrap();
    bytes[0] ^= 1;
    std::fs::write(&sled_conf, &bytes).unwrap();

    for _ in 0..2 {
        let mut storage = open(dir.path());
        let repair = storage
            .log
            .repairing()
            .unwrap()
            .expect("a repair is under way");
        assert_eq!(repair.held.index, 220, "{repair}");
        assert!(repair.segment.ends_with("meta"), "{repair}");
        assert_eq!(storage.state_machine.stored_snapshot_last().unwrap(), None);
        assert_eq!(
            storage.log.read_vote().await.unwrap(),
            Some(Vote::new(3, 2))
        );
        assert_contiguous_log(&mut storage).await;
        close(storage).await;
    }
    let damaged: Vec<_> = std::fs::read_dir(log_dir(dir.path()).join("damaged"))
        .unwrap()
        .map(|folder| folder.unwrap().path())
        .collect();
    assert_eq!(damaged.len(), 1, "{damaged:?}");
    assert_eq!(
        std::fs::read(damaged[0].join("meta").join("conf")).unwrap(),
        bytes,
        "sled's files are kept as found"
    );
}

/// Goal: on the first start over a v0.1.0 directory, whose vote lives only in sled, sled
/// refusing its files is not answered by setting them aside: that would forget the vote, and
/// the replica could vote twice in one term. The start refuses, names why and what to do,
/// and changes nothing, so every later start refuses too until an operator acts. Before, the
/// replica started with the last entry's term standing in for its vote.
#[tokio::test]
async fn sled_refused_on_a_v0_1_0_directory_whose_vote_only_it_held_refuses_the_start() {
    let fixture =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/v0.1.0/single-replica");
    let dir = tempfile::tempdir().unwrap();
    copy_dir(&fixture, dir.path());
    ctrlog::raft::storage::files::faults::invert_byte(&meta_dir(dir.path()).join("conf"), 0)
        .unwrap();
    for start in 0..2 {
        let refused = open_storage(dir.path())
            .err()
            .expect("the start is refused");
        let message = refused.to_string();
        assert!(
            message.contains("vote only in sled") && message.contains("members remove"),
            "start {start}: {message}"
        );
        assert!(
            meta_dir(dir.path()).join("conf").exists(),
            "nothing is set aside"
        );
        assert!(!log_dir(dir.path()).join("damaged").exists());
    }
}

/// Regression: sled answers one inverted byte of its `conf` with `Unsupported` ("created
/// using a sled version earlier than 0.29"), which the start took for an error and did not
/// start on. It is a refusal like any other: sled's files are set aside, and the replica
/// starts over with a repair up to what its log held.
#[tokio::test]
async fn sled_reading_its_conf_as_another_versions_is_a_refusal_too() {
    let dir = tempfile::tempdir().unwrap();
    stopped_replica(dir.path()).await;
    ctrlog::raft::storage::files::faults::invert_byte(&meta_dir(dir.path()).join("conf"), 0)
        .unwrap();
    let storage = open_storage_with(dir.path(), Flushing::GroupCommit, 4 << 10).unwrap();
    let repair = (storage.log.repairing().unwrap()).expect("a repair is under way");
    assert_eq!(repair.held.index, 220, "{repair}");
    assert_eq!(
        storage.found_at_open,
        vec![ctrlog::raft::storage::fault::FaultKind::SledRefused]
    );
    close(storage).await;
}

/// Goal: a replica whose sled is gone (deleted, or lost whole to a crash while it was being
/// set aside) and whose log holds no entry does not vote as an empty replica: the name of its
/// WAL segment says where its log stood, and it repairs up to there.
/// Steps: a follower holding entries 1..=5 installs the leader's snapshot at 50 (its log
/// starts over, empty, at 51); closed; sled's folder removed; opened: a repair up to 50.
/// On the build before, it opened with an empty log and no repair.
#[tokio::test]
async fn a_replica_whose_sled_is_gone_with_an_empty_log_repairs_up_to_its_segment() {
    let dir = tempfile::tempdir().unwrap();
    let (snapshot, follower_dir, mut follower) = a_follower_behind_a_snapshot(dir.path()).await;
    follower
        .state_machine
        .install_snapshot(&snapshot.meta, snapshot.snapshot)
        .await
        .unwrap();
    assert_eq!(follower.log.first_index(), 51, "the log starts over at 51");
    close(follower).await;
    std::fs::remove_dir_all(meta_dir(&follower_dir)).unwrap();
    let mut follower = open_storage(&follower_dir).unwrap();
    let repair = follower.log.repairing().unwrap().expect("a repair begins");
    assert_eq!(repair.held.index, 50, "{repair}");
    assert_contiguous_log(&mut follower).await;
}

// The offline check (`ctrlog check --data DIR`).

/// Every file under `dir` and its bytes: to show that the check changes nothing.
fn contents(dir: &Path) -> std::collections::BTreeMap<std::path::PathBuf, Vec<u8>> {
    let mut files = std::collections::BTreeMap::new();
    for item in std::fs::read_dir(dir).unwrap() {
        let path = item.unwrap().path();
        match path.is_dir() {
            true => files.extend(contents(&path)),
            false => drop(files.insert(path.clone(), std::fs::read(&path).unwrap())),
        }
    }
    files
}

/// Runs `ctrlog check --data dir`; returns its exit code and what it printed.
fn ctrlog_check(dir: &Path) -> (i32, String) {
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_ctrlog"))
        .args(["check", "--data"])
        .arg(dir)
        .output()
        .unwrap();
    let printed = String::from_utf8_lossy(&output.stdout).into_owned()
        + &String::from_utf8_lossy(&output.stderr);
    (output.status.code().unwrap_or(-1), printed)
}

/// Goal: `ctrlog check` finds no fault in a healthy directory, of v0.1.0 or of this build,
/// exits 0 and changes no byte; a torn tail (what a crash leaves) is a note, not a fault.
#[tokio::test]
async fn check_finds_no_fault_in_a_healthy_directory_of_v0_1_0_or_of_this_build() {
    let fixture =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/v0.1.0/single-replica");
    let dir = tempfile::tempdir().unwrap();
    let old = dir.path().join("v0.1.0");
    copy_dir(&fixture, &old);
    let current = dir.path().join("current");
    stopped_replica(&current).await;
    for data in [&old, &current] {
        let before = contents(data);
        let (code, printed) = ctrlog_check(data);
        assert_eq!(code, 0, "{}: {printed}", data.display());
        assert!(printed.contains("no faults found"), "{printed}");
        assert!(
            before == contents(data),
            "the check changed {}",
            data.display()
        );
    }

    wal_faults::tear_tail(&log_dir(&current), 5, false).unwrap();
    let (code, printed) = ctrlog_check(&current);
    assert_eq!(code, 0, "{printed}");
    assert!(printed.contains("torn write"), "{printed}");
}

/// Goal: `ctrlog check` reports each fault the storage's injectors make (the simulation's and
/// chaos's), with its kind and file, and exits 6; the directory is left as found, so that the
/// next start still finds it and repairs it.
#[tokio::test]
async fn check_reports_every_fault_the_injectors_make() {
    use ctrlog::raft::storage::check::check_data_dir;
    use ctrlog::raft::storage::fault::FaultKind;
    use ctrlog::raft::storage::snapshots::faults as snapshot_faults;

    type Inject = fn(&Path);
    let faults: [(&str, Inject, FaultKind); 10] = [
        (
            "a flipped byte in a synced record",
            |d| {
                assert!(wal_faults::flip_synced_byte(&log_dir(d), 77)
                    .unwrap()
                    .is_some())
            },
            FaultKind::LogDamaged,
        ),
        (
            "a flipped byte in the final synced record",
            |d| {
                assert!(wal_faults::flip_final_synced_byte(&log_dir(d), 3)
                    .unwrap()
                    .is_some())
            },
            FaultKind::LogDamaged,
        ),
        (
            "synced records lost",
            |d| {
                assert!(wal_faults::lose_synced_records(&log_dir(d), 2)
                    .unwrap()
                    .is_some())
            },
            FaultKind::LostSyncedRecords,
        ),
        (
            "a flipped byte in the synced mark",
            |d| wal_faults::flip_byte_of_synced_mark(&log_dir(d)).unwrap(),
            FaultKind::SyncedMarkDamaged,
        ),
        (
            "a flipped byte in one copy of the vote",
            |d| assert!(two_copies_faults::flip_copy_byte(&log_dir(d), &VOTE, 1, 5).unwrap()),
            FaultKind::RecordCopyDamaged,
        ),
        (
            "a flipped byte in both copies of the vote",
            |d| {
                for copy in [0, 1] {
                    assert!(
                        two_copies_faults::flip_copy_byte(&log_dir(d), &VOTE, copy, 5).unwrap()
                    );
                }
            },
            FaultKind::RecordLost,
        ),
        (
            "a flipped byte in the stored snapshot",
            |d| {
                assert!(snapshot_faults::flip_snapshot_byte(&meta_dir(d), 11)
                    .unwrap()
                    .is_some())
            },
            FaultKind::SnapshotDamaged,
        ),
        (
            "sled's files refused",
            |d| {
                ctrlog::raft::storage::files::faults::invert_byte(&meta_dir(d).join("conf"), 0)
                    .unwrap()
            },
            FaultKind::SledRefused,
        ),
        (
            "a format file that names no format",
            |d| std::fs::write(d.join("format"), "format = two\n").unwrap(),
            FaultKind::Format,
        ),
        (
            "a sector of the log that fails reads",
            |d| {
                assert!(wal_faults::make_sector_unreadable(&log_dir(d), 4100)
                    .unwrap()
                    .is_some())
            },
            FaultKind::UnreadableSector,
        ),
    ];
    for (fault, inject, kind) in faults {
        let dir = tempfile::tempdir().unwrap();
        stopped_replica(dir.path()).await;
        inject(dir.path());
        let before = contents(dir.path());
        let report = check_data_dir(dir.path()).unwrap();
        assert!(
            report.faults.iter().any(|f| f.kind == kind),
            "{fault}: {kind} not reported: {report:?}"
        );
        if kind != FaultKind::UnreadableSector {
            // Bad sectors are marked in this process only, so the command cannot see them.
            let (code, printed) = ctrlog_check(dir.path());
            assert_eq!(code, 6, "{fault}: {printed}");
            assert!(
                printed.contains(&format!("FAULT {kind}")),
                "{fault}: {printed}"
            );
        }
        assert!(
            before == contents(dir.path()),
            "{fault}: the check changed the directory"
        );
    }
}

/// Goal: a stored snapshot that stops short of the log (sled lost a later snapshot's writes
/// after the log was purged behind it, as the rotting-disk scan's seed 315 found) is reported.
#[tokio::test]
async fn check_reports_a_snapshot_that_stops_short_of_the_log() {
    use ctrlog::raft::storage::check::check_data_dir;
    use ctrlog::raft::storage::fault::FaultKind;
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    stopped_replica(&data).await;
    let sled_then = dir.path().join("sled then");
    copy_dir(&meta_dir(&data), &sled_then);
    let mut storage = open_storage_with(&data, Flushing::GroupCommit, 4 << 10).unwrap();
    append_and_apply(&mut storage, 221, 400).await;
    build_snapshot(&mut storage).await;
    storage.log.purge(entry(395).log_id).await.unwrap();
    close(storage).await;
    std::fs::remove_dir_all(meta_dir(&data)).unwrap();
    copy_dir(&sled_then, &meta_dir(&data));

    let report = check_data_dir(&data).unwrap();
    assert!(
        (report.faults.iter()).any(|f| f.kind == FaultKind::SnapshotShortOfLog),
        "{report:?}"
    );
}
