//! openraft's `RaftLogStorage` over the segmented [`Wal`], with the vote and purge point in
//! sled ([`MetaStore`]).
//!
//! Concurrency: one mutex guards the WAL. Appends write under it and hand the active segment's
//! file to the `Syncer` thread, which `fdatasync`s it (taking every append queued meanwhile
//! in one `fdatasync`) and then calls openraft's flush callback.
//!
//! # The leader's own appends
//!
//! openraft 0.9's core awaits each append's flush callback before it runs the next command,
//! and the leader's command to replicate an entry comes after the one to append it. Answered
//! only once durable, a leader's own `fdatasync` and the round trip to its followers (with
//! their `fdatasync`) would run one after the other. So the leader's own appends of ordinary
//! entries are acknowledged as soon as they are written, and are replicated while the sync
//! thread makes them durable. What the leader then counts as its own copy may not be on its
//! disk yet, so nothing may act on a commit until it is: the log keeps a [`Durable`] mark, and
//!
//! * [`save_committed`](RaftLogStorage::save_committed), which openraft runs before it applies
//!   anything, waits until the mark covers what is committed. Nothing is applied, answered or
//!   snapshotted before the entry is on the leader's disk and a follower's: a majority.
//! * the leader tells followers of no commit beyond the mark (the network clamps
//!   `leader_commit`, see [`hold_to_durable`]), so no follower applies one earlier either.
//!
//! A commit that openraft counted early and that a power loss then takes from the leader was
//! never acted on anywhere; it is as if it had not been committed. Followers acknowledge only
//! what is on their disk, as Raft requires (their acknowledgement is another replica's copy).
//! Membership entries are acknowledged only once durable: openraft acts on their commit
//! itself, by moving a joint configuration on to the next.

use std::fmt::Debug;
use std::io;
use std::ops::{Bound, RangeBounds};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

use openraft::storage::{LogFlushed, LogState, RaftLogStorage};
use openraft::{EntryPayload, OptionalSend, RaftLogReader};
use tokio::sync::watch;

use super::meta_store::{MetaStore, VALUE_BYTES_MAX};
use super::recent::RecentEntries;
use super::two_copies::{TwoCopies, REPAIR, VOTE};
use super::wal::{
    BadRecord, Damage, FailedSync, RecordsToVerify, SegmentFile, SyncedMark, Wal, RECORD_BYTES_MAX,
};
use crate::log::{decode, encode};
use crate::raft::stages::{CommitStages, Stage};
use crate::raft::types::{
    AppendEntriesRequest, Entry, LogId, StorageError, StorageIOError, TypeConfig, Vote,
};
use crate::NodeId;

mod repair;
mod syncer;

pub use repair::{as_restarted, Repair};
use repair::{later_vote, no_older_than_the_log, unfinished, vote_leader, REPAIR_KEY};
pub use syncer::Durable;
use syncer::{
    index_of, mark_failed, mark_snapshotted, mark_synced, sync_file, SyncFailed, Syncer, Written,
};

const VOTE_KEY: &str = "vote";
const PURGED_KEY: &str = "purged";
const COMMITTED_KEY: &str = "committed";
/// Bytes per WAL segment. Purge frees whole segments, so this is also the granularity of disk
/// reclamation: big enough that rotation (an extra `fdatasync`) is rare, small enough that a
/// purged prefix is given back soon.
pub const SEGMENT_BYTES_MAX: u64 = 64 << 20;

struct WalState {
    wal: Wal,
    last_log_id: Option<LogId>,
    last_purged: Option<LogId>,
}

struct Shared {
    wal: Mutex<WalState>,
    meta: Arc<MetaStore>,
    /// Who `fdatasync`s appends and acknowledges them; `None` when that is done inline.
    syncer: Option<Syncer>,
    /// The WAL's synced mark, raised after each `fdatasync` with the durable mark.
    mark: Arc<SyncedMark>,
    /// The first log index still present, for the state machine's offset index.
    first_index: AtomicU64,
    /// The commit path's stage timings on this replica (its `log_sync` is timed here).
    stages: Arc<CommitStages>,
    /// What the durable snapshot allows purging, once a replica wires the state machine in
    /// with [`LogStore::guard_with_snapshots`].
    snapshots: Mutex<Option<SnapshotGuard>>,
    /// How far the log is on disk (see the module docs).
    durable: Arc<watch::Sender<Durable>>,
    /// This replica's node id, once [`LogStore::serve_as`] said it; until then every append is
    /// acknowledged only once durable.
    own_id: OnceLock<NodeId>,
    /// The vote as last saved, to recognise the leader's own appends.
    vote: Mutex<Option<Vote>>,
    /// Where the vote is durable first (see [`super::two_copies`]); sled keeps a copy.
    vote_file: Mutex<TwoCopies<Vote>>,
    /// The newest entries, changed only with the WAL under its lock (see
    /// [`RecentEntries`]).
    recent: RecentEntries,
    /// The repair under way, if the log was found damaged (see [`LogStore::repairing`]), kept
    /// where a rollback shows (see [`super::two_copies`]).
    repair: Mutex<TwoCopies<Option<Repair>>>,
    /// The damage this open found (and began repairing), for `ctrlog_storage_faults_total`.
    damage_found_at_open: Option<Damage>,
    /// The failed `fdatasync` an earlier process recorded, which this open acted on.
    failed_sync_found_at_open: Option<FailedSync>,
    /// The first failed `fdatasync`'s message, naming the segment (see [`mark_failed`]).
    first_sync_failure: Arc<OnceLock<String>>,
}

/// Holds a leader's AppendEntries `request` to what its own log has on disk: it tells of no
/// commit beyond the `durable` mark (see the module docs; the mark does not go backwards, so
/// neither does what a follower is told). One that carries no entries, sent to tell of a
/// commit or as a heartbeat, first waits up to `wait` for the mark to cover its commit, so
/// that followers learn of the commit as soon as it may be acted on rather than with the next
/// message. One that carries entries never waits: that would put the leader's `fdatasync`
/// back in front of replication.
pub async fn hold_to_durable(
    request: &mut AppendEntriesRequest,
    durable: &mut watch::Receiver<Durable>,
    wait: Duration,
) {
    if request.entries.is_empty() {
        let wanted = request.leader_commit;
        let covered = durable.wait_for(|d| d.failed.is_some() || d.covers(wanted));
        let _ = tokio::time::timeout(wait, covered).await;
    }
    let durable = *durable.borrow();
    if !durable.covers(request.leader_commit) {
        request.leader_commit = durable.synced;
    }
}

/// The log's view of the durable snapshot.
#[derive(Clone, Copy, Debug, Default)]
struct SnapshotGuard {
    /// The last entry the durable snapshot covers; `None` while there is no snapshot.
    durable: Option<LogId>,
    /// The furthest purge openraft asked for: a purge past the durable snapshot waits here
    /// until a snapshot that covers it is stored.
    wanted: Option<LogId>,
}

/// How appends become durable before they are acknowledged.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Flushing {
    /// A thread `fdatasync`s what was appended and then acknowledges it, taking every append
    /// that queued meanwhile in one `fdatasync` (group commit). What a replica runs.
    GroupCommit,
    /// `append` `fdatasync`s and acknowledges before it returns: the same files and the same
    /// durability, with no thread, so that the seeded simulation stays deterministic. A
    /// leader's own appends are acknowledged at once here too, and made durable by the next
    /// inline `fdatasync`: another append's, or at the latest that of the `save_committed`
    /// which would act on them. So the simulation runs them written but not yet durable, as
    /// the sync thread leaves them.
    Inline,
}

/// The Raft log store. Clones share one log; a clone is also the log reader.
#[derive(Clone)]
pub struct LogStore {
    shared: Arc<Shared>,
}

fn read_err(e: impl std::error::Error + 'static) -> StorageError {
    StorageIOError::read_logs(&e).into()
}

fn write_err(e: impl std::error::Error + 'static) -> StorageError {
    StorageIOError::write_logs(&e).into()
}

impl LogStore {
    /// The commit path's stage timings on this replica, which its other parts (proposer,
    /// network, state machine) record into too.
    pub fn stages(&self) -> Arc<CommitStages> {
        self.shared.stages.clone()
    }

    /// Opens the log in `dir` (the WAL) with its metadata in `meta`.
    pub fn open(dir: &Path, meta: Arc<MetaStore>) -> io::Result<LogStore> {
        Self::open_with(dir, meta, SEGMENT_BYTES_MAX, Flushing::GroupCommit)
    }

    /// Opens the log with segments of `segment_bytes_max` bytes, flushing appends as
    /// `flushing` says.
    pub fn open_with(
        dir: &Path,
        meta: Arc<MetaStore>,
        segment_bytes_max: u64,
        flushing: Flushing,
    ) -> io::Result<LogStore> {
        let last_purged: Option<LogId> = read_meta(&meta, PURGED_KEY)?;
        std::fs::create_dir_all(dir)?;
        let mut vote_file = TwoCopies::open(dir, &VOTE)?;
        let in_sled: Option<Vote> = read_meta(&meta, VOTE_KEY)?;
        let vote = later_vote(vote_file.value().copied(), in_sled);
        let mut repair = TwoCopies::open(dir, &REPAIR)?;
        if let Some(in_sled) = read_meta::<Repair>(&meta, REPAIR_KEY)? {
            let merged = in_sled.merged(unfinished(&repair));
            repair.save(&Some(merged))?;
            meta.remove_durable(REPAIR_KEY)?;
        }
        // Recorded before the log is cut: a crash right after the cut must not leave a
        // replica that forgot it had held more.
        let record_repair = |damage: &Damage| {
            let needed = Repair::of(damage, vote).merged(unfinished(&repair));
            repair.save(&Some(needed.clone()))?;
            tracing::error!(
                %needed,
                "this replica's log is damaged; it neither votes nor stands until the leader \
                 has sent it the damaged entries again"
            );
            Ok(())
        };
        let (mut wal, damage_found_at_open) = Wal::open_repairing(
            dir,
            last_purged.map(|l| l.index),
            segment_bytes_max,
            record_repair,
        )?;
        let failed_sync_found_at_open = wal.failed_sync();
        if let Some(failed) = &failed_sync_found_at_open {
            // Before any sync: one would vouch for records that only the failed one covered.
            let cut_from = failed.vouched_end.max(wal.first_index());
            if failed.beyond_acknowledged && cut_from < wal.next_index() {
                let held = last_log_id(&wal, last_purged)?
                    .expect("a log with records past the cut has a last entry");
                let needed = Repair {
                    first_damaged: cut_from,
                    held,
                    segment: failed.file.clone(),
                    byte: 0,
                }
                .merged(unfinished(&repair));
                repair.save(&Some(needed.clone()))?;
                tracing::error!(
                    %needed,
                    "the records a start failed to sync may have been acknowledged; this replica \
                     neither votes nor stands until the leader has sent them again"
                );
            }
            wal.cut_after_failed_sync()?;
        }
        // A crash of the process (not of the machine) can leave written but unsynced entries
        // in the page cache, which the log would now count as durable: sync them first.
        wal.active_file().sync_at_open()?;
        let last_log_id = last_log_id(&wal, last_purged)?;
        let mark = wal.synced_mark();
        if let Some(last) = last_log_id {
            mark.raise(last)?;
        }
        let vote = no_older_than_the_log(vote, last_log_id);
        if let Some(vote) = vote.filter(|v| Some(v) != vote_file.value()) {
            vote_file.save(&vote)?;
        }
        if let Some(vote) = vote.filter(|v| Some(*v) != in_sled) {
            meta.put_durable(VOTE_KEY, &encode(&vote))?;
        }
        let durable = Arc::new(watch::Sender::new(Durable {
            synced: last_log_id,
            failed: None,
            truncations: 0,
        }));
        let first_index = wal.first_index();
        let stages = Arc::<CommitStages>::default();
        let first_sync_failure = Arc::<OnceLock<String>>::default();
        Ok(LogStore {
            shared: Arc::new(Shared {
                wal: Mutex::new(WalState {
                    wal,
                    last_log_id,
                    last_purged,
                }),
                meta,
                mark: mark.clone(),
                syncer: match flushing {
                    Flushing::GroupCommit => Some(Syncer::start(
                        stages.clone(),
                        durable.clone(),
                        mark.clone(),
                        first_sync_failure.clone(),
                    )),
                    Flushing::Inline => None,
                },
                first_index: AtomicU64::new(first_index),
                stages,
                snapshots: Mutex::new(None),
                durable,
                own_id: OnceLock::new(),
                vote: Mutex::new(vote),
                vote_file: Mutex::new(vote_file),
                recent: RecentEntries::default(),
                repair: Mutex::new(repair),
                damage_found_at_open,
                failed_sync_found_at_open,
                first_sync_failure,
            }),
        })
    }

    /// The damage this open of the log found, if any: the repair it began.
    pub fn damage_found_at_open(&self) -> Option<&Damage> {
        self.shared.damage_found_at_open.as_ref()
    }

    /// The failed `fdatasync` an earlier process recorded, if this open found one and cut what
    /// only it covered.
    pub fn failed_sync_found_at_open(&self) -> Option<&FailedSync> {
        self.shared.failed_sync_found_at_open.as_ref()
    }

    /// The repair still under way, if the log was found damaged (see [`Repair`]); `None` once
    /// the log is on disk up to what it held again, which ends the repair, durably.
    pub fn repairing(&self) -> io::Result<Option<Repair>> {
        let mut repair = self.shared.repair.lock().expect("never poisoned");
        let Some(needed) = unfinished(&repair) else {
            return Ok(None);
        };
        if !self.shared.durable.borrow().covers(Some(needed.held)) {
            return Ok(Some(needed));
        }
        repair.save(&None)?;
        tracing::info!(
            repaired = %needed,
            "the damaged entries are on disk again, from the leader; this replica votes again"
        );
        Ok(None)
    }

    /// Starts the log over, empty, for a replica whose stored snapshot is damaged or gone
    /// (`lost`: what it covered, if its header still says; `damaged`: where what was lost was
    /// set aside, which names the repair; `kept`: the folder that holds it). Without the
    /// snapshot the retained log cannot be applied, so the replica must be sent the leader's
    /// snapshot and log again, and it must not vote before it holds what it held: a [`Repair`]
    /// up to the latest of the log's last entry, the snapshot's and the entry before the WAL's
    /// first (what its segments' names show it held, should sled have lost its purge point
    /// too) is recorded durably first, then the segments are set aside in `kept` and the purge
    /// and commit points forgotten. Called at open, before Raft runs on the log.
    pub fn start_over_for_lost_snapshot(
        &self,
        lost: Option<LogId>,
        damaged: &Path,
        kept: &Path,
    ) -> io::Result<()> {
        let mut state = self.lock();
        let mut repair = self.shared.repair.lock().expect("never poisoned");
        let vote = *self.shared.vote.lock().expect("never poisoned");
        let reached = (state.wal.next_index().checked_sub(1))
            .map(|index| LogId::new(vote_leader(vote), index));
        // Of equal indexes, the last is kept: a real entry's id over one that stands in.
        let held = [reached, lost, state.last_log_id]
            .into_iter()
            .flatten()
            .max_by_key(|id| id.index);
        if let Some(held) = held {
            let needed = Repair {
                first_damaged: 0,
                held,
                segment: damaged.display().to_string(),
                byte: 0,
            }
            .merged(unfinished(&repair));
            repair.save(&Some(needed.clone()))?;
            tracing::error!(
                %needed,
                "this replica's stored snapshot is damaged; it starts over from the leader's \
                 snapshot and neither votes nor stands until it holds what it held"
            );
        }
        state.wal.set_aside_everything(kept)?;
        self.shared.meta.remove_durable(COMMITTED_KEY)?;
        self.shared.meta.remove_durable(PURGED_KEY)?;
        state.last_log_id = None;
        state.last_purged = None;
        self.shared.first_index.store(0, Ordering::Release);
        self.shared.durable.send_replace(Durable::default());
        Ok(())
    }

    fn lock(&self) -> MutexGuard<'_, WalState> {
        self.shared
            .wal
            .lock()
            .expect("a panic while holding the wal lock is a bug")
    }

    /// Makes the log respect the durable snapshot, whose last entry is `last` now: from here
    /// on a purge never removes an entry the durable snapshot does not cover, and the
    /// committed point read at start is one this log and snapshot can re-apply. Called at
    /// open; it also repairs a log left with a hole by a crash (see
    /// [`LogStore::snapshot_stored`]).
    ///
    /// openraft 0.9 issues the purge that follows a snapshot install without waiting for the
    /// install to be durable; a crash in between would otherwise leave a replica with neither
    /// the entries nor the snapshot (found by the `snapshot-install` fail point).
    pub fn guard_with_snapshots(&self, last: Option<LogId>) -> io::Result<()> {
        mark_snapshotted(&self.shared.durable, last);
        *self.snapshot_guard() = Some(SnapshotGuard {
            durable: last,
            wanted: None,
        });
        self.purge_behind_snapshot()
    }

    /// Records that a snapshot up to `last` is durable (no effect before the guard is on), and
    /// carries out what it now allows: the purge openraft asked for that had to wait for it,
    /// and the removal of a stale prefix that a snapshot install left in front of the log.
    ///
    /// Invariant restored here: the log is contiguous from the purge point to its end. A
    /// replica that installs a snapshot at `S` while its log ends at `L < S` continues at
    /// `S + 1`; until the entries up to `S` are purged, the log would hold `..=L`, a hole, and
    /// `S + 1..`, which openraft cannot start on.
    pub fn snapshot_stored(&self, last: Option<LogId>) -> io::Result<()> {
        mark_snapshotted(&self.shared.durable, last);
        match self.snapshot_guard().as_mut() {
            Some(guard) => guard.durable = guard.durable.max(last),
            None => return Ok(()),
        }
        self.purge_behind_snapshot()
    }

    /// Purges what the durable snapshot allows of what is wanted: the purge openraft asked
    /// for, or everything up to the snapshot when the log has a hole before its next entry,
    /// ends behind the snapshot or starts past its purge point.
    fn purge_behind_snapshot(&self) -> io::Result<()> {
        let Some(SnapshotGuard {
            durable: Some(snapshot),
            wanted,
        }) = *self.snapshot_guard()
        else {
            return Ok(());
        };
        let (hole_end, ends_behind, starts_past_the_purge_point) = {
            let state = self.lock();
            let ends_behind = index_of(state.last_log_id) < Some(snapshot.index);
            let after_purge_point = index_of(state.last_purged).map_or(0, |p| p + 1);
            let starts_past_the_purge_point =
                !state.wal.is_empty() && state.wal.first_index() > after_purge_point;
            (
                state.wal.hole_end(),
                ends_behind,
                starts_past_the_purge_point,
            )
        };
        let target = match (hole_end, wanted) {
            (Some(end), _) if end <= snapshot.index + 1 => Some(snapshot),
            (Some(end), _) => {
                // Not something a snapshot install leaves; purging cannot mend it.
                tracing::error!(
                    hole_end = end,
                    snapshot = snapshot.index,
                    "the log has a hole past the durable snapshot"
                );
                None
            }
            // A log that ends behind the snapshot (one cut before damage, at open) would
            // continue after the snapshot and so leave the hole above: purge it first.
            (None, _) if ends_behind => Some(snapshot),
            // The log starts past the entry after the purge point: sled lost a purge point
            // whose segments the WAL had removed, and openraft would look for the entries in
            // between. The snapshot covers them (`storage::short_of_the_log` checked that):
            // purge up to it, which records a purge point again.
            (None, _) if starts_past_the_purge_point => Some(snapshot),
            (None, Some(wanted)) => Some(wanted.min(snapshot)),
            (None, None) => None,
        };
        match target {
            Some(target) => self.purge_durable(target),
            None => Ok(()),
        }
    }

    fn snapshot_guard(&self) -> MutexGuard<'_, Option<SnapshotGuard>> {
        self.shared
            .snapshots
            .lock()
            .expect("a panic while holding the snapshot guard is a bug")
    }

    /// Purges the log up to `log_id`, the purge point durable before any segment goes.
    fn purge_durable(&self, log_id: LogId) -> io::Result<()> {
        if self
            .lock()
            .last_purged
            .is_some_and(|p| p.index >= log_id.index)
        {
            return Ok(());
        }
        // Durable first: a restart must not bring back what the WAL is about to delete.
        self.shared.meta.put_durable(PURGED_KEY, &encode(&log_id))?;
        let mut state = self.lock();
        self.shared.recent.purge_upto(log_id.index);
        state.wal.purge_upto(log_id.index)?;
        state.last_purged = Some(log_id);
        if state
            .last_log_id
            .is_none_or(|last| last.index < log_id.index)
        {
            state.last_log_id = Some(log_id);
        }
        self.shared
            .first_index
            .store(state.wal.first_index(), Ordering::Release);
        // What is purged is covered by the durable snapshot.
        mark_snapshotted(&self.shared.durable, Some(log_id));
        Ok(())
    }

    /// The first log index still on disk (entries before it are purged).
    pub fn first_index(&self) -> u64 {
        self.shared.first_index.load(Ordering::Acquire)
    }

    /// One entry, from the window of recent entries or else the WAL; `None` if it is purged
    /// or not yet written.
    pub fn entry(&self, index: u64) -> io::Result<Option<Arc<Entry>>> {
        if let Some(entry) = self.shared.recent.get(index) {
            return Ok(Some(entry));
        }
        Ok(read_entry(&self.lock().wal, index)?.map(Arc::new))
    }

    /// Bytes the log takes on disk.
    pub fn disk_bytes(&self) -> u64 {
        self.lock().wal.disk_bytes()
    }

    /// The id of the last entry, or of the purge point when the log holds none after it.
    pub fn last_log_id(&self) -> Option<LogId> {
        self.lock().last_log_id
    }

    /// The vote as last made durable.
    pub fn vote(&self) -> Option<Vote> {
        let vote_file = self.shared.vote_file.lock().expect("never poisoned");
        vote_file.value().copied()
    }

    /// Makes `vote` durable before returning: in the vote file, which is the authority, then
    /// in sled, which older builds read.
    pub fn save_vote_durable(&self, vote: &Vote) -> io::Result<()> {
        let mut vote_file = self.shared.vote_file.lock().expect("never poisoned");
        vote_file.save(vote)?;
        self.shared.meta.put_durable(VOTE_KEY, &encode(vote))?;
        drop(vote_file);
        *self.shared.vote.lock().expect("never poisoned") = Some(*vote);
        Ok(())
    }

    /// `fdatasync`s `file` here, without the sync thread, and raises the durable mark to
    /// `last`, the last entry written to it after `written_after` truncations, or marks the
    /// failure.
    fn sync_inline(
        &self,
        file: &SegmentFile,
        last: LogId,
        written_after: u64,
    ) -> Result<(), SyncFailed> {
        let synced = sync_file(file, &self.shared.durable).and_then(|()| {
            mark_synced(&self.shared.durable, &self.shared.mark, last, written_after)
        });
        if let Err(failure) = &synced {
            mark_failed(
                &self.shared.durable,
                failure,
                &self.shared.first_sync_failure,
            );
        }
        synced
    }

    /// Tells the log which replica it is, so that it can tell the leader's own appends from
    /// a leader's entries replicated to it (see the module docs). Without it, every append is
    /// acknowledged only once durable.
    pub fn serve_as(&self, id: NodeId) {
        let _ = self.shared.own_id.set(id);
    }

    /// Truncations so far; read under the WAL lock, it says which truncations an entry written
    /// there came after.
    fn truncations(&self) -> u64 {
        self.shared.durable.borrow().truncations
    }

    /// One past the last index an `fdatasync` covered (0: none): how far the scrubber reads.
    pub fn synced_end(&self) -> u64 {
        self.shared
            .durable
            .borrow()
            .synced
            .map_or(0, |last| last.index + 1)
    }

    /// The records from `from` to before `end` that the scrubber verifies next, up to
    /// `bytes_max` bytes ([`Wal::records_to_verify`]).
    pub fn records_to_verify(
        &self,
        from: u64,
        end: u64,
        bytes_max: u64,
    ) -> Option<RecordsToVerify> {
        let end = end.min(self.synced_end());
        self.lock().wal.records_to_verify(from, end, bytes_max)
    }

    /// Whether a bad record the scrubber found is damage ([`Wal::confirm_bad`]).
    pub fn confirm_bad(&self, listed: &RecordsToVerify, bad: &BadRecord) -> bool {
        self.lock().wal.confirm_bad(listed, bad)
    }

    /// How far the log is on disk, as it changes.
    pub fn durable(&self) -> watch::Receiver<Durable> {
        self.shared.durable.subscribe()
    }

    /// Whether `entries` are this replica's own appends as the leader it is now, all of them
    /// ordinary: those may be acknowledged before they are durable (see the module docs).
    fn leaders_own(&self, entries: &[Entry]) -> bool {
        let (Some(own), Some(first)) = (self.shared.own_id.get(), entries.first()) else {
            return false;
        };
        let leads = self
            .shared
            .vote
            .lock()
            .expect("never poisoned")
            .is_some_and(|vote| {
                vote.committed
                    && vote.leader_id.node_id == *own
                    && first.log_id.leader_id == vote.leader_id
            });
        leads
            && entries
                .iter()
                .all(|e| !matches!(e.payload, EntryPayload::Membership(_)))
    }

    /// Writes `entries` (at least one) after the last one, and adds them to the window of
    /// recent entries; returns the WAL still locked, for the caller's bookkeeping. They are
    /// encoded before the lock is taken, so that readers wait only for the write. A failed
    /// write may have written some of them, so the window forgets all it holds.
    fn write(&self, entries: &[Entry]) -> io::Result<MutexGuard<'_, WalState>> {
        let payloads: Vec<Vec<u8>> = entries.iter().map(encode).collect();
        let first = entries.first().map_or(0, |e| e.log_id.index);
        let mut state = self.lock();
        if let Err(e) = state.wal.append(first, &payloads) {
            self.shared.recent.clear();
            return Err(e);
        }
        self.shared
            .recent
            .push(entries.iter().map(|e| Arc::new(e.clone())));
        Ok(state)
    }

    /// Appends one entry after the last and makes it durable before returning: for tools that
    /// edit a stopped replica's log (`raft::storage::recover`), where no Raft core waits on the sync
    /// thread.
    pub fn append_durable(&self, entry: &Entry) -> io::Result<()> {
        let mut state = self.write(std::slice::from_ref(entry))?;
        state.wal.active_file().sync()?;
        state.last_log_id = Some(entry.log_id);
        let truncations = self.truncations();
        mark_synced(
            &self.shared.durable,
            &self.shared.mark,
            entry.log_id,
            truncations,
        )?;
        Ok(())
    }
}

/// sled's copy of a stopped replica's vote, for the tests that roll it back as sled's recovery
/// could. None of this is called by a running replica.
pub mod faults {
    use std::io;
    use std::path::Path;

    use super::{encode, read_meta, Vote, VOTE_KEY};
    use crate::raft::storage::meta_store::MetaStore;

    /// Replaces sled's copy of the vote in the sled database in `meta_dir` with what `replace`
    /// makes of it (nothing is written for `None`); returns whether it wrote one.
    pub fn replace_sleds_vote(
        meta_dir: &Path,
        replace: impl FnOnce(Option<Vote>) -> Option<Vote>,
    ) -> io::Result<bool> {
        let meta = MetaStore::open(meta_dir)?;
        let Some(vote) = replace(read_meta(&meta, VOTE_KEY)?) else {
            return Ok(false);
        };
        meta.put_durable(VOTE_KEY, &encode(&vote))?;
        Ok(true)
    }
}

/// The value at `key` in `meta`, decoded; `None` if there is none.
fn read_meta<T: serde::de::DeserializeOwned>(meta: &MetaStore, key: &str) -> io::Result<Option<T>> {
    match meta.get(key)? {
        Some(bytes) => Ok(Some(
            decode(&bytes, VALUE_BYTES_MAX as u64).map_err(io::Error::other)?,
        )),
        None => Ok(None),
    }
}

/// Reads and checks one entry; `None` if the index holds nothing.
fn read_entry(wal: &Wal, index: u64) -> io::Result<Option<Entry>> {
    let Some(bytes) = wal.read(index)? else {
        return Ok(None);
    };
    let entry: Entry = decode(&bytes, RECORD_BYTES_MAX as u64)
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, format!("entry {index}: {e}")))?;
    if entry.log_id.index != index {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("record {index} holds entry {}", entry.log_id.index),
        ));
    }
    Ok(Some(entry))
}

/// The id of the last entry present, or the purge point when none is.
fn last_log_id(wal: &Wal, last_purged: Option<LogId>) -> io::Result<Option<LogId>> {
    if wal.is_empty() {
        return Ok(last_purged);
    }
    let last = wal.next_index() - 1;
    let entry =
        read_entry(wal, last)?.ok_or_else(|| io::Error::other(format!("entry {last} vanished")))?;
    Ok(Some(entry.log_id))
}

impl RaftLogReader<TypeConfig> for LogStore {
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug + OptionalSend>(
        &mut self,
        range: RB,
    ) -> Result<Vec<Entry>, StorageError> {
        let state = self.lock();
        let start = match range.start_bound() {
            Bound::Included(&i) => i,
            Bound::Excluded(&i) => i + 1,
            Bound::Unbounded => 0,
        }
        .max(state.wal.first_index());
        let end = match range.end_bound() {
            Bound::Included(&i) => i.saturating_add(1),
            Bound::Excluded(&i) => i,
            Bound::Unbounded => u64::MAX,
        }
        .min(state.wal.next_index());
        // Entries in the window are served from it, the rest (a follower catching up, the
        // first reads after a restart) from the WAL.
        (start..end)
            .filter_map(|index| match self.shared.recent.get(index) {
                Some(entry) => Some(Ok(Entry::clone(&entry))),
                None => read_entry(&state.wal, index).map_err(read_err).transpose(),
            })
            .collect()
    }
}

impl RaftLogStorage<TypeConfig> for LogStore {
    type LogReader = LogStore;

    async fn get_log_state(&mut self) -> Result<LogState<TypeConfig>, StorageError> {
        let state = self.lock();
        Ok(LogState {
            last_purged_log_id: state.last_purged,
            last_log_id: state.last_log_id,
        })
    }

    async fn get_log_reader(&mut self) -> Self::LogReader {
        self.clone()
    }

    async fn save_vote(&mut self, vote: &Vote) -> Result<(), StorageError> {
        self.save_vote_durable(vote)
            .map_err(|e| StorageIOError::write_vote(&e).into())
    }

    /// The vote openraft starts from: the durable one, except that this replica's own
    /// committed vote is handed over as not committed (see [`as_restarted`]).
    async fn read_vote(&mut self) -> Result<Option<Vote>, StorageError> {
        let durable = self.vote();
        let Some(own) = self.shared.own_id.get() else {
            return Ok(durable);
        };
        let vote = durable.map(|vote| as_restarted(vote, *own));
        *self.shared.vote.lock().expect("never poisoned") = vote;
        Ok(vote)
    }

    async fn save_committed(&mut self, committed: Option<LogId>) -> Result<(), StorageError> {
        // openraft applies what is committed right after this: not before the leader's own
        // copy is on disk (see the module docs). A follower's entries are durable already.
        if self.shared.syncer.is_none() && !self.shared.durable.borrow().covers(committed) {
            let (file, last, truncations) = {
                let state = self.lock();
                (
                    state.wal.active_file(),
                    state.last_log_id,
                    self.truncations(),
                )
            };
            if let Some(last) = last {
                let _ = self.sync_inline(&file, last, truncations);
            }
        }
        let durable = *self
            .durable()
            .wait_for(|d| d.failed.is_some() || d.covers(committed))
            .await
            .map_err(write_err)?;
        if let Some(kind) = durable.failed {
            let failure = self.shared.first_sync_failure.get();
            return Err(write_err(io::Error::new(
                kind,
                format!(
                    "an fdatasync of the log failed, so this replica can vouch for nothing \
                     written since: {}",
                    failure.map_or("(no message)", String::as_str)
                ),
            )));
        }
        // Advisory: it only lets a restart re-apply up to here at once, so it need not be
        // durable, and a stale value only means less is re-applied at start.
        self.shared
            .meta
            .put(COMMITTED_KEY, &encode(&committed))
            .map_err(write_err)
    }

    async fn read_committed(&mut self) -> Result<Option<LogId>, StorageError> {
        let saved: Option<LogId> = match self.shared.meta.get(COMMITTED_KEY).map_err(read_err)? {
            Some(bytes) => decode(&bytes, 1024).map_err(read_err)?,
            None => None,
        };
        let snapshot = self.snapshot_guard().map(|guard| guard.durable);
        let (Some(committed), Some(snapshot)) = (saved, snapshot) else {
            return Ok(saved);
        };
        if snapshot.is_some_and(|s| s.index >= committed.index) {
            return Ok(saved);
        }
        // Re-applying up to `committed` at start needs every entry after the snapshot, ending
        // in `committed` itself (which, by log matching, vouches for those before it). A
        // committed point learned from a snapshot that never became durable fails this, and
        // the snapshot's own point is what can be re-applied.
        let state = self.lock();
        let contiguous = state.wal.first_index() <= snapshot.map_or(0, |s| s.index + 1);
        let ends_in_it = read_entry(&state.wal, committed.index)
            .map_err(read_err)?
            .is_some_and(|e| e.log_id == committed);
        Ok(if contiguous && ends_in_it {
            saved
        } else {
            snapshot
        })
    }

    async fn append<I>(
        &mut self,
        entries: I,
        callback: LogFlushed<TypeConfig>,
    ) -> Result<(), StorageError>
    where
        I: IntoIterator<Item = Entry> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        let entries: Vec<Entry> = entries.into_iter().collect();
        let Some(last) = entries.last().map(|e| e.log_id) else {
            callback.log_io_completed(Ok(()));
            return Ok(());
        };
        let written = Instant::now();
        let acknowledge_now = self.leaders_own(&entries);
        let (file, truncations) = {
            let mut state = self.write(&entries).map_err(write_err)?;
            state.last_log_id = Some(last);
            (state.wal.active_file(), self.truncations())
        };
        let written = Written {
            at: written,
            last,
            truncations,
        };
        match &self.shared.syncer {
            Some(syncer) if acknowledge_now => {
                callback.log_io_completed(Ok(()));
                syncer.sync(file, None, written)
            }
            Some(syncer) => syncer.sync(file, Some(callback), written),
            None if acknowledge_now => callback.log_io_completed(Ok(())),
            None => {
                let synced = self.sync_inline(&file, last, truncations);
                (self.shared.stages).observe(Stage::log_sync, written.at.elapsed());
                callback.log_io_completed(synced.map_err(io::Error::from))
            }
        }
        Ok(())
    }

    async fn truncate(&mut self, log_id: LogId) -> Result<(), StorageError> {
        let mut state = self.lock();
        if log_id.index >= state.wal.next_index() {
            return Ok(());
        }
        if let Some(kind) = self.durable().borrow().failed {
            // The truncation's own `fdatasync` would vouch for what is kept: after a failed
            // one, it cannot (see `sync_file`).
            return Err(write_err(io::Error::new(
                kind,
                "not truncating the log: an fdatasync of it failed before",
            )));
        }
        self.shared.recent.truncate_from(log_id.index);
        // Whatever the outcome, an `fdatasync` of what was written before no longer vouches
        // for the log's end; on success, the truncation's own `fdatasync` vouches for all
        // that is left (see `Durable`). Counted first, so that no such `fdatasync` raises the
        // synced mark on disk after the truncation lowered it.
        self.shared.durable.send_modify(|d| d.truncations += 1);
        state.wal.truncate_from(log_id.index).map_err(write_err)?;
        state.last_log_id = last_log_id(&state.wal, state.last_purged).map_err(read_err)?;
        let kept = state.last_log_id;
        self.shared.durable.send_modify(|d| d.synced = kept);
        Ok(())
    }

    async fn purge(&mut self, log_id: LogId) -> Result<(), StorageError> {
        // Never past the durable snapshot (see `guard_with_snapshots`): what goes beyond it is
        // remembered and purged once a snapshot that covers it is stored.
        let allowed = match self.snapshot_guard().as_mut() {
            None => Some(log_id),
            Some(guard) => {
                guard.wanted = guard.wanted.max(Some(log_id));
                guard.durable.map(|snapshot| snapshot.min(log_id))
            }
        };
        match allowed {
            Some(allowed) => self.purge_durable(allowed).map_err(write_err),
            None => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use openraft::CommittedLeaderId;

    use super::*;
    use crate::raft::storage::write_faults::{faults, Operation};

    /// Goal: a replica whose final record rotted, after it stood for election unanswered (its
    /// vote's term above its last entry's), repairs toward the log it really held: the synced
    /// mark names the final entry's id, so the repair does not outrank a candidate whose log
    /// is exactly that one. Before, the vote's term stood in for the entry's.
    #[test]
    fn a_rotted_final_record_is_repaired_toward_the_id_the_synced_mark_names() {
        let dir = tempfile::tempdir().unwrap();
        let (log_dir, meta_dir) = (dir.path().join("log"), dir.path().join("meta"));
        let open = || {
            let meta = Arc::new(MetaStore::open(&meta_dir).unwrap());
            LogStore::open_with(&log_dir, meta, 1 << 20, Flushing::Inline).unwrap()
        };
        let held = LogId::new(CommittedLeaderId::new(2, 1), 5);
        let store = open();
        for index in 1..=held.index {
            let log_id = LogId::new(held.leader_id, index);
            let entry = Entry {
                log_id,
                payload: EntryPayload::Blank,
            };
            store.append_durable(&entry).unwrap();
        }
        // It stood alone in term 7: no entry of that term was ever written.
        store.save_vote_durable(&Vote::new(7, 3)).unwrap();
        drop(store);
        let flipped = super::super::wal::faults::flip_final_synced_byte(&log_dir, 3).unwrap();
        assert!(flipped.is_some(), "the final record is flipped");

        let store = open();
        let repair = store.repairing().unwrap().expect("a repair under way");
        assert_eq!(repair.held, held, "the repair knows the entry the log held");
        assert_eq!(repair.first_damaged, held.index);
    }

    /// Goal: once an `fdatasync` of the log failed, none is attempted again and the durable
    /// mark never rises, though the device answers again: the page cache may have dropped
    /// what the failed one was asked to write, and a second one would not say so.
    #[test]
    fn an_fdatasync_that_failed_is_never_retried_and_raises_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let mut wal = Wal::open(dir.path(), None, 1 << 20).unwrap();
        wal.append(0, &[b"entry".to_vec()]).unwrap();
        let (file, mark) = (wal.active_file(), wal.synced_mark());
        let durable = watch::Sender::new(Durable::default());
        let entry = LogId::new(CommittedLeaderId::new(1, 1), 0);

        faults::fail_under(dir.path(), Operation::Sync, libc::EIO);
        let failed = sync_file(&file, &durable).unwrap_err();
        assert!(
            failed.message.contains(&*file.path().to_string_lossy()),
            "{}",
            failed.message
        );
        mark_failed(&durable, &failed, &OnceLock::new());
        faults::heal_under(dir.path());

        let retried = sync_file(&file, &durable).unwrap_err();
        assert!(
            retried.message.contains("failed before"),
            "{}",
            retried.message
        );
        mark_synced(&durable, &mark, entry, 0).unwrap();
        assert!(
            mark.raise(entry).is_err(),
            "the mark refuses a raise after a failure"
        );
        let recorded = crate::raft::storage::two_copies::read_only::<
            Option<super::super::wal::FailedSync>,
        >(dir.path(), &crate::raft::storage::two_copies::FAILED_SYNC);
        let recorded = recorded
            .unwrap()
            .flatten()
            .expect("the failure is recorded");
        assert_eq!(
            recorded.vouched_end, 0,
            "nothing was vouched for: {recorded}"
        );
        assert_eq!(durable.borrow().synced, None, "nothing is vouched for");
        assert_eq!(
            super::super::wal::faults::synced_mark(dir.path()).unwrap(),
            None
        );
    }
}
