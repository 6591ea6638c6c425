//! The synced mark (the last index an `fdatasync` of the log covered, and that entry's id),
//! through which every `fdatasync` of the log runs, and the record of a failed one: what tells
//! a torn final write from an acknowledged record rotted in place, and what keeps a failed
//! sync from being trusted by a later process (ARCHITECTURE.md, "The storage fault model").

use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard};

use openraft::CommittedLeaderId;

use crate::raft::storage::two_copies::{TwoCopies, FAILED_SYNC};
use crate::raft::storage::write_faults::{attempt, Operation};
use crate::raft::types::LogId;

/// The file in the log's directory that holds the [`SyncedMark`]. It has no `.wal` suffix,
/// so builds that do not know it (v0.1.0 among them) pass over it.
pub const SYNCED_MARK_FILE: &str = "synced";

/// Bytes of the synced mark's index: one past the marked index (0: none), and its CRC32.
pub(super) const SYNCED_MARK_BYTES: usize = 12;

/// Bytes of the synced mark's file with the marked entry's id: the index, then whether the id
/// is known, its term and node, and a CRC32 of everything before it.
pub(super) const SYNCED_MARK_WITH_ID_BYTES: usize = SYNCED_MARK_BYTES + 1 + 16 + 4;

/// What the synced mark's file was found to hold.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum MarkFound {
    /// No mark: a new log, or one a build before the mark wrote.
    Missing,
    /// The last index an `fdatasync` covered (`None`: none yet), and that entry's full id
    /// when the mark knows it (`None` for a mark written by a build before the id, or right
    /// after a truncation).
    Holds(Option<u64>, Option<LogId>),
    /// A mark that fails its checksum, which counts as none.
    Damaged,
}

/// An `fdatasync` of the log that failed, recorded where the next process reads it (the
/// two-copy file [`FAILED_SYNC`]) before the replica stops.
///
/// Why: on a device error Linux keeps the pages it could not write in the page cache, marked
/// clean, and reports the error once. A restarted replica reads those records back valid, and
/// an `fdatasync` of its own succeeds without writing them (PostgreSQL's "fsyncgate"). So what
/// the failed sync covered is cut at the next open ([`Wal::cut_after_failed_sync`](super::Wal::cut_after_failed_sync)), before
/// any sync of the new process could vouch for it; the peers send it again.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct FailedSync {
    /// One past the last index the synced mark vouched for when the sync failed: every record
    /// from here on may have reached only the page cache.
    pub vouched_end: u64,
    /// Whether records from `vouched_end` on may have been acknowledged: true only for the
    /// sync a start runs over what an earlier process wrote, which a mark that a power loss
    /// left behind does not cover. A running replica acknowledges only what the mark covers.
    pub beyond_acknowledged: bool,
    /// The file whose sync failed, and the error, for the operator.
    pub file: String,
    pub error: String,
}

impl std::fmt::Display for FailedSync {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "an fdatasync of {} failed ({}) with the log vouched for below index {}",
            self.file, self.error, self.vouched_end
        )
    }
}

/// What the mark's file holds, and how the log's syncs have fared, under one lock so that no
/// raise lands after a failure or a truncation that came first.
pub(super) struct MarkState {
    /// One past the index the file holds (0: none): what the log vouches for.
    pub(super) end: u64,
    /// The first failed `fdatasync` (or write of the mark) of this process: from then on
    /// nothing is synced or raised.
    pub(super) failed: Option<String>,
    /// Where a failure is recorded for the next process; created at open, so that recording
    /// needs no new block of a failing disk.
    pub(super) record: TwoCopies<Option<FailedSync>>,
    /// The failure an earlier process recorded, until [`Wal::cut_after_failed_sync`] acts on
    /// it.
    pub(super) found_at_open: Option<FailedSync>,
}

/// The last index an `fdatasync` of the log covered, and that entry's id, kept in its own
/// small file: what tells an acknowledged final record that rotted from a torn final write
/// (module docs), and what a repair of a rotted final record knows it held. It also keeps the
/// log's rule for failed syncs ([`FailedSync`]): every `fdatasync` of the log goes through
/// [`SyncedMark::sync`].
///
/// Why it costs no second `fdatasync`: it is raised with a plain write after each one, which a
/// killed process does not lose (the page cache survives it). A power loss may take the last
/// raises with it, and then rot in the records written just before it is taken for a torn
/// tail, as it was before the mark: that needs two faults at once, and it is the window
/// ARCHITECTURE.md states. The mark never claims too much: it is raised only after an
/// `fdatasync`, and lowered durably by a truncation before anything is written again. A mark
/// that fails its checksum is no mark. A raise that cannot be written stops the log as a
/// failed `fdatasync` does: a mark left low would make rot in the synced records above it
/// look like a torn tail.
///
/// Layout: `[end: u64 LE][crc32 of end]` (what builds before the id read), then `[1][term:
/// u64 LE][node: u64 LE][crc32 of all before]` when the id is known (a 0 byte when not).
pub struct SyncedMark {
    pub(super) file: File,
    pub(super) path: PathBuf,
    pub(super) state: Mutex<MarkState>,
}

impl SyncedMark {
    /// Opens the mark and the failed-sync record in the log's directory `dir`; returns it,
    /// the index it holds and that entry's id, if known.
    pub(super) fn open(dir: &Path) -> io::Result<(SyncedMark, Option<u64>, Option<LogId>)> {
        let path = dir.join(SYNCED_MARK_FILE);
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)?;
        let (marked, id) = match Self::read(&file)? {
            MarkFound::Holds(marked, id) => (marked, id),
            MarkFound::Missing => (None, None),
            MarkFound::Damaged => {
                tracing::warn!(
                    file = %path.display(),
                    "the synced mark fails its checksum and is ignored: until it is written \
                     again, rot in the log's final record looks like a torn write"
                );
                (None, None)
            }
        };
        let mut record = TwoCopies::<Option<FailedSync>>::open(dir, &FAILED_SYNC)?;
        let found_at_open = record.value().cloned().flatten();
        if record.value().is_none() {
            record.save(&None)?;
        }
        if let Some(failed) = &found_at_open {
            tracing::error!(
                %failed,
                "an earlier process of this replica saw an fdatasync of its log fail: the \
                 records it covered may be only in the page cache, and are cut before anything \
                 is synced"
            );
        }
        let state = MarkState {
            end: marked.map_or(0, |index| index + 1),
            failed: None,
            record,
            found_at_open,
        };
        let mark = SyncedMark {
            file,
            path,
            state: Mutex::new(state),
        };
        Ok((mark, marked, id))
    }

    /// What the mark in `file` holds.
    pub(super) fn read(file: &File) -> io::Result<MarkFound> {
        let mut bytes = [0u8; SYNCED_MARK_WITH_ID_BYTES];
        let read = match file.read_exact_at(&mut bytes, 0) {
            Ok(()) => SYNCED_MARK_WITH_ID_BYTES,
            Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => {
                match file.read_exact_at(&mut bytes[..SYNCED_MARK_BYTES], 0) {
                    Ok(()) => SYNCED_MARK_BYTES,
                    // New, or made by a build before the mark.
                    Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => {
                        return Ok(MarkFound::Missing)
                    }
                    Err(e) => return Err(e),
                }
            }
            Err(e) => return Err(e),
        };
        let (end, crc) = bytes[..SYNCED_MARK_BYTES].split_at(8);
        if crc32fast::hash(end).to_le_bytes() != crc {
            return Ok(MarkFound::Damaged);
        }
        let last = u64::from_le_bytes(end.try_into().unwrap()).checked_sub(1);
        let with_id = &bytes[..read];
        let id = match (last, with_id.get(SYNCED_MARK_BYTES)) {
            (Some(index), Some(1)) => {
                let (covered, crc) = with_id.split_at(SYNCED_MARK_WITH_ID_BYTES - 4);
                let u64_at =
                    |at: usize| u64::from_le_bytes(covered[at..at + 8].try_into().unwrap());
                (crc32fast::hash(covered).to_le_bytes() == crc).then(|| {
                    let leader = CommittedLeaderId::new(u64_at(13), u64_at(21));
                    LogId::new(leader, index)
                })
            }
            _ => None,
        };
        Ok(MarkFound::Holds(last, id))
    }

    /// What the mark in the log's directory `dir` holds, read without changing anything.
    pub(super) fn read_only(dir: &Path) -> io::Result<MarkFound> {
        match File::open(dir.join(SYNCED_MARK_FILE)) {
            Ok(file) => Self::read(&file),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(MarkFound::Missing),
            Err(e) => Err(e),
        }
    }

    /// Writes the mark: one past `last`'s index, and its id when `known`.
    pub(super) fn write(&self, last: Option<LogId>, known: bool) -> io::Result<()> {
        let end = last.map_or(0, |id| id.index + 1).to_le_bytes();
        let mut bytes = [0u8; SYNCED_MARK_WITH_ID_BYTES];
        bytes[..8].copy_from_slice(&end);
        bytes[8..12].copy_from_slice(&crc32fast::hash(&end).to_le_bytes());
        if let Some(id) = last.filter(|_| known) {
            bytes[12] = 1;
            bytes[13..21].copy_from_slice(&id.leader_id.term.to_le_bytes());
            bytes[21..29].copy_from_slice(&id.leader_id.node_id.to_le_bytes());
            let crc = crc32fast::hash(&bytes[..29]);
            bytes[29..].copy_from_slice(&crc.to_le_bytes());
        }
        attempt(&self.path, Operation::Write, || {
            self.file.write_all_at(&bytes, 0)
        })
    }

    pub(super) fn state(&self) -> MutexGuard<'_, MarkState> {
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// The error every sync and raise answers once one failed.
    pub(super) fn failed_before(first: &str) -> io::Error {
        io::Error::other(format!(
            "an fdatasync of the log failed before ({first}), so nothing written since can be \
             vouched for"
        ))
    }

    /// Marks every record up to `synced` as covered by an `fdatasync` that has completed. The
    /// caller orders raises after the truncations they follow (`log_store::mark_synced`).
    /// Refused once a sync failed; a failed write of the mark is recorded as a failed sync,
    /// and both stop the log.
    pub fn raise(&self, synced: LogId) -> io::Result<()> {
        let mut state = self.state();
        if let Some(first) = &state.failed {
            return Err(Self::failed_before(first));
        }
        match self.write(Some(synced), true) {
            Ok(()) => {
                state.end = state.end.max(synced.index + 1);
                Ok(())
            }
            Err(error) => {
                self.fail(&mut state, &self.path, &error, false);
                Err(error)
            }
        }
    }

    /// Runs `sync`, an `fdatasync` of the log's file at `path`, unless one failed before: then
    /// nothing written since can be vouched for, and another `fdatasync` that succeeds would
    /// say it is on disk when the page cache may have dropped it. A failure is recorded for the
    /// next process ([`FailedSync`]); `beyond_acknowledged` says whether what it covered may
    /// have been acknowledged. The error names the file.
    pub fn sync(
        &self,
        path: &Path,
        beyond_acknowledged: bool,
        sync: impl FnOnce() -> io::Result<()>,
    ) -> io::Result<()> {
        if let Some(first) = &self.state().failed {
            return Err(Self::failed_before(first));
        }
        attempt(path, Operation::Sync, sync).inspect_err(|error| {
            self.fail(&mut self.state(), path, error, beyond_acknowledged);
        })
    }

    /// Records the first failure of this process, durably if the disk lets it. The record's
    /// copies are written before each is synced, so that even when the disk refuses the
    /// syncs, the next process of the same boot reads the failure from the page cache; after a
    /// reboot, the cache that "fsyncgate" is about is gone.
    pub(super) fn fail(
        &self,
        state: &mut MarkState,
        path: &Path,
        error: &io::Error,
        beyond_acknowledged: bool,
    ) {
        if state.failed.is_some() {
            return;
        }
        state.failed = Some(error.to_string());
        let failed = FailedSync {
            vouched_end: state.end,
            beyond_acknowledged,
            file: path.display().to_string(),
            error: error.to_string(),
        };
        match state.record.save(&Some(failed.clone())) {
            Ok(()) => tracing::error!(
                %failed,
                "recorded: the next start cuts the records past what the log vouched for"
            ),
            Err(record_error) => tracing::error!(
                %failed,
                error = %record_error,
                "the failed fdatasync could not be recorded durably: do not restart this \
                 replica before `ctrlog check` shows its log, and move its records from index \
                 {} on aside if the device lost them",
                failed.vouched_end
            ),
        }
    }

    /// Sets the mark to `last` durably: after a truncation, before anything is written again.
    /// The id is not known there (the WAL does not read its entries), so the mark holds the
    /// index alone until the next raise.
    pub(super) fn set_durably(&self, last: Option<u64>) -> io::Result<()> {
        let mut state = self.state();
        let last = last.map(|index| LogId::new(CommittedLeaderId::default(), index));
        self.write(last, false)?;
        attempt(&self.path, Operation::Sync, || self.file.sync_data())?;
        state.end = last.map_or(0, |id| id.index + 1);
        Ok(())
    }
}
