//! The simulation's storage is the product's: each replica's [`Disk`] is a real data directory
//! (the segmented WAL and sled) opened with `raft::storage`, its log store, its state machine
//! and its read path (`raft::reader`), exactly as a replica opens and reads them.
//!
//! One difference keeps runs deterministic: appends are `fdatasync`ed inline
//! ([`Flushing::Inline`]), instead of on the group-commit thread: a follower's before `append`
//! returns, a leader's own by the next inline `fdatasync`. What is durable is the same, and a
//! crash loses what was not: the leader's appends written after its last `fdatasync`
//! ([`Disk::lose_unsynced`], as a power loss would), never anything acknowledged. It may also
//! tear the end of the last segment (zeros or garbage after the last record, as a power loss leaves it), and
//! recovery must cut it; the test that checks that the simulation catches a careless store
//! makes a crash lose acknowledged entries too ([`Disk::lose_acknowledged_tail`]).

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;

use ctrlog::client::{ApiError, FetchRequest};
use ctrlog::jobs::JobState;
use ctrlog::log::{Filter, LogEntry, Offset};
use ctrlog::raft::reader::read_committed;
use ctrlog::raft::restore::open_storage_with;
use ctrlog::raft::state_machine::StateMachineStore;
use ctrlog::raft::storage::bad_sectors::faults as bad_sectors;
use ctrlog::raft::storage::data_dir::{self, log_dir, meta_dir};
use ctrlog::raft::storage::log_store::faults as sled_vote;
use ctrlog::raft::storage::log_store::{Flushing, LogStore};
use ctrlog::raft::storage::meta_store::{faults as sled_faults, Closed};
use ctrlog::raft::storage::snapshots::faults as snapshot_faults;
use ctrlog::raft::storage::two_copies::{faults as two_copies_faults, Record};
use ctrlog::raft::storage::wal::faults;
use ctrlog::raft::storage::write_faults::{faults as write_faults, Operation};
use ctrlog::raft::types::Vote;

/// The WAL's segment size in the simulation: small, so that a run fills many segments, rots
/// sealed ones as well as the last, and purges whole ones (which a rollback of sled's snapshot
/// then leaves behind a hole).
const SEGMENT_BYTES: u64 = 32 << 10;

/// One replica's data directory, which outlives each of its incarnations.
pub struct Disk {
    dir: PathBuf,
    /// Fires when the running incarnation's storage is closed (every handle dropped).
    closed: Mutex<Option<Closed>>,
    /// Snapshots built by the incarnations before the running one.
    snapshots_built: AtomicU64,
    /// Whether writes under the directory fail ([`Disk::fail_writes`]).
    failing_writes: AtomicBool,
}

/// Writes a disk fails ([`Disk::fail_writes`]): under which folder (0: the whole data
/// directory, 1: the WAL's, 2: sled's), `fdatasync`s rather than writes, a full disk (`ENOSPC`)
/// rather than a failing device (`EIO`).
#[derive(Clone, Copy, Debug)]
pub struct FailingWrites {
    pub folder: u8,
    pub sync: bool,
    pub full: bool,
}

/// The storage of a running replica: handles on its log store and state machine.
#[derive(Clone)]
pub struct Storage {
    pub log: LogStore,
    pub state_machine: StateMachineStore,
}

/// What a subscriber's fetch from a replica returns.
pub enum Fetched {
    Entries(Vec<LogEntry>),
    /// The position is no longer in this replica's log: here is the state as of `offset`.
    Compacted {
        offset: Offset,
        state: Box<JobState>,
    },
    /// The replica could not read its log (a bad sector): ask another.
    Unavailable(String),
}

/// What a crash leaves after the last whole record of the last segment.
#[derive(Clone, Copy, Debug)]
pub enum Tail {
    Clean,
    Zeros(usize),
    Garbage(usize),
}

impl Disk {
    pub fn new(dir: PathBuf) -> Disk {
        Disk {
            dir,
            closed: Mutex::new(None),
            snapshots_built: AtomicU64::new(0),
            failing_writes: AtomicBool::new(false),
        }
    }

    /// Makes the storage's writes under the directory fail as `failing` says, through the
    /// storage's own injector ([`write_faults`]), until [`Disk::heal_writes`]; returns what
    /// fails, for the fault log.
    pub fn fail_writes(&self, failing: FailingWrites) -> String {
        let (folder, name) = match failing.folder {
            0 => (self.dir.clone(), "data directory"),
            1 => (log_dir(&self.dir), "WAL"),
            _ => (meta_dir(&self.dir), "sled"),
        };
        let (operation, verb) = match failing.sync {
            true => (Operation::Sync, "fdatasyncs"),
            false => (Operation::Write, "writes"),
        };
        let (errno, why) = match failing.full {
            true => (libc::ENOSPC, "full"),
            false => (libc::EIO, "failing device"),
        };
        write_faults::fail_under(&folder, operation, errno);
        self.failing_writes.store(true, Ordering::Relaxed);
        format!("{verb} of its {name} ({why})")
    }

    /// Whether writes under the directory fail now.
    pub fn fails_writes(&self) -> bool {
        self.failing_writes.load(Ordering::Relaxed)
    }

    /// Ends [`Disk::fail_writes`]: space freed, the device replaced.
    pub fn heal_writes(&self) {
        if self.failing_writes.swap(false, Ordering::Relaxed) {
            write_faults::heal_under(&self.dir);
        }
    }

    /// Opens the directory as a replica starting on it does.
    pub fn open(&self) -> std::io::Result<Storage> {
        let storage = open_storage_with(&self.dir, Flushing::Inline, SEGMENT_BYTES)?;
        *self.closed.lock().unwrap() = Some(storage.closed);
        Ok(Storage {
            log: storage.log,
            state_machine: storage.state_machine,
        })
    }

    /// Counts the snapshots a crashed incarnation built.
    pub fn add_snapshots_built(&self, built: u64) {
        self.snapshots_built.fetch_add(built, Ordering::Relaxed);
    }

    /// Waits until the crashed incarnation's storage is closed, so that the directory can be
    /// damaged and opened again. `false` if it is still held.
    pub async fn wait_closed(&self) -> bool {
        let Some(closed) = self.closed.lock().unwrap().take() else {
            return true;
        };
        tokio::time::timeout(std::time::Duration::from_secs(10), closed.wait())
            .await
            .is_ok()
    }

    /// Writes `tail` after the last record of the last segment, as a torn write would.
    pub fn tear(&self, tail: Tail) {
        let (bytes, zeros) = match tail {
            Tail::Clean => return,
            Tail::Zeros(n) => (n, true),
            Tail::Garbage(n) => (n, false),
        };
        faults::tear_tail(&log_dir(&self.dir), bytes, zeros).unwrap();
    }

    /// Drops what the crashed incarnation had written after its durable mark, entry `synced`
    /// (`None`: nothing), as a power loss would: a leader's own appends, which the log
    /// acknowledges to openraft before their `fdatasync` (`raft::storage::log_store`).
    pub fn lose_unsynced(&self, synced: Option<u64>) {
        self.beneath_bad_sectors(|| faults::lose_entries_after(&log_dir(&self.dir), synced))
            .unwrap();
    }

    /// Drops the last `entries` of the log, as a crash would if appends were acknowledged
    /// before they were durable. Only the test that shows the simulation catches such a store
    /// calls this.
    pub fn lose_acknowledged_tail(&self, entries: u64) {
        self.beneath_bad_sectors(|| faults::lose_last_entries(&log_dir(&self.dir), entries))
            .unwrap();
    }

    /// Makes the sector of the WAL that holds byte `at` (over all its segments' bytes) fail
    /// every read, as a bad sector does, until the log cuts it away; returns the segment and
    /// the byte, `None` for an empty log.
    pub fn fail_reads_of_a_sector(&self, at: u64) -> Option<(String, u64)> {
        faults::make_sector_unreadable(&log_dir(&self.dir), at).unwrap()
    }

    /// Runs `read` on what the disk holds beneath its bad sectors: for an injector that reads
    /// the log whole (a crash's loss of what was not synced acts on the bytes, readable or
    /// not), and for the end of a run's comparison of the replicas, which a bad sector that no
    /// read has met yet would otherwise hide (scrubbing finds those). The sectors still there
    /// afterwards fail reads again.
    pub fn beneath_bad_sectors<T>(&self, read: impl FnOnce() -> T) -> T {
        let marked = bad_sectors::take_unreadable_under(&self.dir);
        let done = read();
        for (path, byte) in marked {
            if std::fs::metadata(&path).is_ok_and(|file| file.len() > byte) {
                bad_sectors::make_unreadable(&path, byte);
            }
        }
        done
    }

    /// Flips one byte of the WAL at `at` (modulo the bytes its synced mark vouches for, the
    /// final record among them; only in that final record with `in_final_record`), as a
    /// rotting disk would; returns the segment and the byte, `None` for an empty log.
    pub fn rot(&self, at: u64, in_final_record: bool) -> Option<(String, u64)> {
        let log = log_dir(&self.dir);
        match in_final_record {
            true => faults::flip_final_synced_byte(&log, at),
            false => faults::flip_synced_byte(&log, at),
        }
        .unwrap()
    }

    /// Loses the last `records` WAL records the synced mark covers, as a disk that dropped
    /// writes after `fdatasync` reported them done would; returns the first index lost.
    pub fn lose_synced_records(&self, records: usize) -> Option<u64> {
        faults::lose_synced_records(&log_dir(&self.dir), records).unwrap()
    }

    /// Flips one byte (at `at`, modulo a copy's length) of copy `copy` of `record`'s file (the
    /// vote's or the repair's), as a rotting disk would; `false` when there is no such file.
    pub fn rot_record_copy(&self, record: &Record, copy: usize, at: u64) -> bool {
        two_copies_faults::flip_copy_byte(&log_dir(&self.dir), record, copy, at).unwrap()
    }

    /// Puts a vote of the term before into sled's copy of the vote, as sled's recovery would
    /// leave it after dropping its last writes; `false` when sled holds no vote.
    pub fn roll_back_sleds_vote(&self) -> bool {
        sled_vote::replace_sleds_vote(&meta_dir(&self.dir), |vote| {
            vote.map(|v| Vote::new(v.leader_id.term.saturating_sub(1), v.leader_id.node_id))
        })
        .unwrap()
    }

    /// Flips one byte of sled's data file at `at` (modulo its length), under sled's own
    /// checks, as a rotting disk would; returns the byte's offset.
    pub fn rot_sled(&self, at: u64) -> Option<u64> {
        sled_faults::flip_data_file_byte(&meta_dir(&self.dir), at).unwrap()
    }

    /// Flips one byte of the stored snapshot at `at` (modulo its bytes), as rot that sled's
    /// checks miss would; returns the byte's offset, `None` without a snapshot.
    pub fn rot_snapshot(&self, at: u64) -> Option<u64> {
        snapshot_faults::flip_snapshot_byte(&meta_dir(&self.dir), at).unwrap()
    }

    /// How many times sled's files were refused and set aside in `log/damaged/`.
    pub fn sleds_set_aside(&self) -> usize {
        data_dir::sleds_set_aside(&self.dir).unwrap()
    }

    /// `text` with this disk's folder named `DATA`.
    pub fn without_folder(&self, text: &str) -> String {
        text.replace(&*self.dir.to_string_lossy(), "DATA")
    }

    pub fn snapshots_built(&self) -> u64 {
        self.snapshots_built.load(Ordering::Relaxed)
    }
}

impl Storage {
    pub fn job_state(&self) -> std::sync::Arc<JobState> {
        self.state_machine.read(|state| state.job.clone())
    }

    /// Applied commands from `from`, at most `max`, through the product's read path.
    pub fn fetch(&self, from: Offset, max: u32) -> Fetched {
        let request = FetchRequest {
            entries_max: max,
            bytes_max: u32::MAX,
            filter: Filter::Everything,
            ..FetchRequest::from(from)
        };
        match read_committed(
            &self.log,
            &self.state_machine,
            from.max(1),
            &request,
            usize::MAX,
        ) {
            Ok(response) => Fetched::Entries(response.entries),
            Err(ApiError::Compacted { .. }) => {
                let state = self.job_state();
                Fetched::Compacted {
                    offset: state.last_offset(),
                    state: Box::new(JobState::clone(&state)),
                }
            }
            Err(ApiError::Unavailable(why)) => Fetched::Unavailable(why),
            Err(error) => panic!("reading the log of a running replica: {error}"),
        }
    }

    /// Every retained command, for comparing replicas at the end of a run.
    pub fn retained_log(&self) -> Vec<LogEntry> {
        let first_index = self.log.first_index();
        let mut from = self
            .state_machine
            .read(|state| state.first_retained_offset(first_index));
        let mut all = Vec::new();
        loop {
            match self.fetch(from, 4096) {
                Fetched::Entries(entries) if entries.is_empty() => return all,
                Fetched::Entries(entries) => {
                    from = entries.last().map_or(from, |e| e.offset + 1);
                    all.extend(entries);
                }
                // Purged while we read: what was read stands.
                Fetched::Compacted { .. } => return all,
                Fetched::Unavailable(why) => panic!("reading the retained log: {why}"),
            }
        }
    }

    pub fn snapshots_built(&self) -> u64 {
        self.state_machine.snapshot_stats().built
    }

    pub fn last_applied_index(&self) -> Option<u64> {
        self.state_machine
            .read(|state| state.last_applied.map(|l| l.index))
    }

    pub fn last_offset(&self) -> Offset {
        self.state_machine.read(|state| state.job.last_offset())
    }
}
