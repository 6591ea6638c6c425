//! A segmented, checksummed write-ahead log file: where the Raft log (= the control log) lives.
//!
//! Layout: a directory of segment files named `{first_index:020}.wal`. A segment holds records
//! for consecutive indexes starting at its name. A record is
//!
//! ```text
//! [payload length: u32 LE][crc32 of payload: u32 LE][payload]
//! ```
//!
//! Why not sled (ARCHITECTURE.md): sled's `flush` is `sync_file_range` (no metadata, no device
//! cache) and its blob files for nodes over 128 KiB are never fsynced, so large batches would be
//! acknowledged before they were durable. A file we append to and `fdatasync` ourselves makes
//! the durability contract easy to see and to test.
//!
//! Durability protocol:
//! * `append` writes records with `pwrite` and returns; the caller hands the segment's file to
//!   the `Syncer`, whose `fdatasync` precedes the acknowledgement.
//! * Rotation `fdatasync`s the full segment before the next one is created, and `fsync`s the
//!   directory after creating or deleting a segment, so only the last segment can ever hold a
//!   torn record.
//! * `truncate_from` cuts the file and `fdatasync`s it before returning.
//! * Recovery scans every segment and verifies each record's checksum. A bad record is a short
//!   record, a checksum that does not match, a length out of bounds, or a zero length (a
//!   zero-filled tail, which some file systems leave after a power loss, and whose all-zero
//!   header matches its empty payload's CRC).
//!
//! Telling a crash from a rotten disk (ARCHITECTURE.md, "The storage fault model"): a crash
//! can damage only the final write, so only the end of the last segment. A bad record with
//! no valid record after it in the last segment is a **torn tail**: it is cut, and nothing
//! it held was acknowledged by this replica (followers acknowledge after the `fdatasync`;
//! the leader's early acknowledgement is never acted on before it, see `log_store`). A bad
//! record that any valid record follows, or any bad record in a sealed (earlier, synced)
//! segment, is **damage**: [`Damage`] says where it starts and what the valid records after
//! it say the log reached. [`Wal::open`] refuses such a log; [`Wal::open_repairing`] hands
//! the damage to its caller first (the log store records that this replica must be repaired
//! from its peers before it votes again) and then cuts the log before it.
//!
//! The final record is the one place where the two look alike: a torn write of a whole-length
//! record and an acknowledged record rotted in place are the same bytes. The [`SyncedMark`]
//! tells them apart: the last index an `fdatasync` covered, written beside the segments after
//! each one. A bad or missing record at or below the mark was on disk once, so it is damage
//! wherever it is.
//!
//! A sector that fails reads (`EIO`, [`super::bad_sectors`]) is bad bytes like any other: at
//! open the records it touches are judged by the rules above, and the segment is kept for
//! the operator as far as it reads. A read while the log is open returns the error; openraft
//! stops on it and the restart's recovery repairs the range from the peers.

use std::collections::BTreeMap;
use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};

use openraft::CommittedLeaderId;

use super::bad_sectors::{self, Salvaged};
use super::files::sync_dir;
use super::two_copies::{self, TwoCopies, FAILED_SYNC};
use super::write_faults::{attempt, Operation};
use crate::raft::types::LogId;

/// Bytes of a record header: payload length and checksum.
const RECORD_HEADER_BYTES: usize = 8;

/// A record larger than this is treated as corrupt on recovery: the largest legitimate record
/// is one proposer batch (a few MiB), so a bigger length prefix is a torn or garbage header.
pub const RECORD_BYTES_MAX: usize = 256 << 20;

const SEGMENT_SUFFIX: &str = "wal";

/// The file in the log's directory that holds the [`SyncedMark`]. It has no `.wal` suffix,
/// so builds that do not know it (v0.1.0 among them) pass over it.
pub const SYNCED_MARK_FILE: &str = "synced";

/// Bytes of the synced mark's index: one past the marked index (0: none), and its CRC32.
const SYNCED_MARK_BYTES: usize = 12;

/// Bytes of the synced mark's file with the marked entry's id: the index, then whether the id
/// is known, its term and node, and a CRC32 of everything before it.
const SYNCED_MARK_WITH_ID_BYTES: usize = SYNCED_MARK_BYTES + 1 + 16 + 4;

/// Where one record sits in its segment.
#[derive(Clone, Copy, Debug)]
struct RecordPos {
    pos: u64,
    len: u32,
}

/// A segment's open file and its path, which names it in errors and its sectors for
/// [`bad_sectors`].
pub struct SegmentFile {
    file: File,
    path: PathBuf,
    /// The log's mark, through which every `fdatasync` of the log runs ([`SyncedMark::sync`]).
    mark: Arc<SyncedMark>,
}

impl SegmentFile {
    /// `fdatasync`s the segment, unless one of the log failed before; a failure is recorded for
    /// the next process ([`SyncedMark::sync`]). The error names the segment.
    pub fn sync(&self) -> io::Result<()> {
        self.mark.sync(&self.path, false, || self.file.sync_data())
    }

    /// The same for the syncs a start runs over what an earlier process wrote, which may have
    /// been acknowledged though the mark does not cover it (a power loss took its last raises).
    pub fn sync_at_open(&self) -> io::Result<()> {
        self.mark.sync(&self.path, true, || self.file.sync_data())
    }

    /// Writes `bytes` at `offset`; the error names the segment.
    fn write_at(&self, bytes: &[u8], offset: u64) -> io::Result<()> {
        attempt(&self.path, Operation::Write, || {
            self.file.write_all_at(bytes, offset)
        })
    }

    /// Reads exactly `buf.len()` bytes at `offset`, failing on a bad sector.
    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        bad_sectors::read_exact_at(&self.file, &self.path, buf, offset)
    }

    pub fn path(&self) -> &Path {
        &self.path
    }
}

struct Segment {
    first_index: u64,
    file: Arc<SegmentFile>,
    records: Vec<RecordPos>,
    /// Bytes in use; the next record is written here.
    len: u64,
}

impl Segment {
    /// One past the last index this segment holds.
    fn end_index(&self) -> u64 {
        self.first_index + self.records.len() as u64
    }
}

/// What the synced mark's file was found to hold.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum MarkFound {
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
/// the failed sync covered is cut at the next open ([`Wal::cut_after_failed_sync`]), before
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
struct MarkState {
    /// One past the index the file holds (0: none): what the log vouches for.
    end: u64,
    /// The first failed `fdatasync` (or write of the mark) of this process: from then on
    /// nothing is synced or raised.
    failed: Option<String>,
    /// Where a failure is recorded for the next process; created at open, so that recording
    /// needs no new block of a failing disk.
    record: TwoCopies<Option<FailedSync>>,
    /// The failure an earlier process recorded, until [`Wal::cut_after_failed_sync`] acts on
    /// it.
    found_at_open: Option<FailedSync>,
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
    file: File,
    path: PathBuf,
    state: Mutex<MarkState>,
}

impl SyncedMark {
    /// Opens the mark and the failed-sync record in the log's directory `dir`; returns it,
    /// the index it holds and that entry's id, if known.
    fn open(dir: &Path) -> io::Result<(SyncedMark, Option<u64>, Option<LogId>)> {
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
    fn read(file: &File) -> io::Result<MarkFound> {
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
    fn read_only(dir: &Path) -> io::Result<MarkFound> {
        match File::open(dir.join(SYNCED_MARK_FILE)) {
            Ok(file) => Self::read(&file),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(MarkFound::Missing),
            Err(e) => Err(e),
        }
    }

    /// Writes the mark: one past `last`'s index, and its id when `known`.
    fn write(&self, last: Option<LogId>, known: bool) -> io::Result<()> {
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

    fn state(&self) -> MutexGuard<'_, MarkState> {
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// The error every sync and raise answers once one failed.
    fn failed_before(first: &str) -> io::Error {
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
    fn fail(
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
    fn set_durably(&self, last: Option<u64>) -> io::Result<()> {
        let mut state = self.state();
        let last = last.map(|index| LogId::new(CommittedLeaderId::default(), index));
        self.write(last, false)?;
        attempt(&self.path, Operation::Sync, || self.file.sync_data())?;
        state.end = last.map_or(0, |id| id.index + 1);
        Ok(())
    }
}

/// The segmented log. Not thread-safe by itself; the log store wraps it in a mutex.
pub struct Wal {
    dir: PathBuf,
    mark: Arc<SyncedMark>,
    /// Keyed by first index. Never empty after `open`: the last one is the active segment.
    segments: BTreeMap<u64, Segment>,
    /// Records below this index are purged, even if their segment still exists.
    first_index: u64,
    segment_bytes_max: u64,
}

fn segment_path(dir: &Path, first_index: u64) -> PathBuf {
    dir.join(format!("{first_index:020}.{SEGMENT_SUFFIX}"))
}

fn corrupt(message: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, message)
}

/// The payload length of a valid record at byte `pos`, if one starts there.
fn record_at(bytes: &[u8], pos: usize) -> Option<usize> {
    let header = bytes.get(pos..pos + RECORD_HEADER_BYTES)?;
    let len = u32::from_le_bytes(header[..4].try_into().unwrap()) as usize;
    let crc = u32::from_le_bytes(header[4..].try_into().unwrap());
    let start = pos + RECORD_HEADER_BYTES;
    // No record is empty (each holds an encoded entry), so a zero length is a zero-filled
    // tail, whose header would otherwise pass: the CRC32 of nothing is 0. An all-0xff header
    // fails the length bound.
    if len == 0 || len > RECORD_BYTES_MAX || bytes.len() - start < len {
        return None;
    }
    (crc32fast::hash(&bytes[start..start + len]) == crc).then_some(len)
}

/// Where the record after the one at `pos` would start by its length field, if that length is
/// plausible: a record whose payload or checksum rotted still says where the next one is.
fn after_declared_length(bytes: &[u8], pos: usize) -> Option<usize> {
    let header = bytes.get(pos..pos + RECORD_HEADER_BYTES)?;
    let len = u32::from_le_bytes(header[..4].try_into().unwrap()) as usize;
    let next = pos + RECORD_HEADER_BYTES + len;
    (len > 0 && len <= RECORD_BYTES_MAX && next <= bytes.len()).then_some(next)
}

/// The last valid record after the bad one at byte `damaged`, if any valid record follows it:
/// first where the bad record's own length points, else at any later byte (a rotten length
/// field hides where the next record starts). Records found are walked to the end, past any
/// further damage the same way.
fn last_record_after(bytes: &[u8], damaged: usize) -> Option<RecordPos> {
    let mut last = None;
    let mut bad = damaged;
    loop {
        let resumed = after_declared_length(bytes, bad)
            .filter(|&next| record_at(bytes, next).is_some())
            .or_else(|| (bad + 1..bytes.len()).find(|&at| record_at(bytes, at).is_some()));
        let Some(mut pos) = resumed else {
            return last;
        };
        while let Some(len) = record_at(bytes, pos) {
            last = Some(RecordPos {
                pos: pos as u64,
                len: len as u32,
            });
            pos += RECORD_HEADER_BYTES + len;
        }
        if pos >= bytes.len() {
            return last;
        }
        bad = pos;
    }
}

/// Damage that recovery found (see the module docs): the log holds nothing from `first` on
/// once [`Wal::open_repairing`] returns, though it had held more.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Damage {
    /// The index of the first damaged record.
    pub first: u64,
    /// The segment file where the damage starts, and the byte in it.
    pub segment: PathBuf,
    pub byte: u64,
    /// The payload of the last valid record after the damage, in any segment: the caller
    /// decodes how far the log reached from it.
    pub last_record: Option<Vec<u8>>,
    /// One past the last index the log is known to have held by the segments alone: the next
    /// segment's name, the valid records of later segments, or the damaged record itself.
    pub end_at_least: u64,
    /// The id of the last entry the synced mark covered, when it knows it: the one source
    /// of a damaged final record's id.
    pub marked: Option<LogId>,
}

impl std::fmt::Display for Damage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "segment {} is damaged at byte {} (record {}), and the log held records after it",
            self.segment.display(),
            self.byte,
            self.first
        )
    }
}

/// The damage that starts in `scanned[at]`: where, and what the rest of the log and the
/// synced mark (`synced_end`: one past the index it holds) say it held.
fn describe_damage(
    scanned: &[ScannedSegment],
    at: usize,
    synced_end: u64,
    marked: Option<LogId>,
) -> io::Result<Damage> {
    let damaged = &scanned[at];
    let first = damaged.first_index + damaged.records.len() as u64;
    let end_at_least = scanned[at + 1..]
        .iter()
        .map(|s| s.first_index + s.records.len() as u64)
        .max()
        .unwrap_or(first + 1)
        .max(synced_end);
    let mut last_record = None;
    for segment in scanned[at..].iter().rev() {
        let record = if segment.first_index == damaged.first_index {
            segment.last_after_damage
        } else {
            segment
                .last_after_damage
                .or(segment.records.last().copied())
        };
        if let Some(record) = record {
            let mut bytes = vec![0u8; record.len as usize];
            let at = record.pos + RECORD_HEADER_BYTES as u64;
            bad_sectors::read_exact_at(&File::open(&segment.path)?, &segment.path, &mut bytes, at)?;
            last_record = Some(bytes);
            break;
        }
    }
    Ok(Damage {
        first,
        segment: damaged.path.clone(),
        byte: damaged.valid_len,
        last_record,
        end_at_least,
        marked,
    })
}

/// The folder in a log's directory where damaged segments are kept (see `keep_damaged`).
pub const DAMAGED_DIR: &str = "damaged";

/// Keeps `segments` (the damaged one first, then every later one) as they were found, in a
/// new numbered folder under [`DAMAGED_DIR`], and leaves in the log only the damaged segment
/// (which the caller cuts); returns the folder. Nothing is deleted: if the peers cannot repair
/// the log, the records after the damage are what an operator recovers by hand.
fn keep_damaged(dir: &Path, segments: &[ScannedSegment]) -> io::Result<PathBuf> {
    let kept = new_damaged_folder(dir)?;
    for (i, segment) in segments.iter().enumerate() {
        let name = segment.path.file_name().expect("a segment has a name");
        if i == 0 {
            // Copied as far as it reads: a bad sector's bytes are kept as zeros.
            let salvaged = bad_sectors::read_salvaging(&segment.path)?;
            let mut copy = File::create(kept.join(name))?;
            io::Write::write_all(&mut copy, &salvaged.bytes)?;
            copy.sync_all()?;
        } else {
            std::fs::rename(&segment.path, kept.join(name))?;
        }
    }
    sync_dir(&kept)?;
    sync_dir(dir)?;
    Ok(kept)
}

/// Creates the next numbered folder under the log's [`DAMAGED_DIR`], durably, for what was
/// found damaged once.
pub fn new_damaged_folder(dir: &Path) -> io::Result<PathBuf> {
    let damaged = dir.join(DAMAGED_DIR);
    std::fs::create_dir_all(&damaged)?;
    let mut number = 1u32;
    let kept = loop {
        let kept = damaged.join(number.to_string());
        match std::fs::create_dir(&kept) {
            Ok(()) => break kept,
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => number += 1,
            Err(e) => return Err(e),
        }
    };
    sync_dir(&damaged)?;
    sync_dir(dir)?;
    Ok(kept)
}

/// What reading one segment found.
struct ScannedSegment {
    first_index: u64,
    path: PathBuf,
    records: Vec<RecordPos>,
    valid_len: u64,
    /// Where the first sector that could not be read starts (EIO), if one could not.
    unreadable_from: Option<u64>,
    /// The last valid record after the first bad one, when the segment has a bad record.
    last_after_damage: Option<RecordPos>,
    damaged: bool,
}

/// Scans one segment's bytes and returns its records, plus the length of the valid prefix.
fn scan_records(bytes: &[u8]) -> (Vec<RecordPos>, u64) {
    let mut records = Vec::new();
    let mut pos = 0usize;
    while let Some(len) = record_at(bytes, pos) {
        records.push(RecordPos {
            pos: pos as u64,
            len: len as u32,
        });
        pos += RECORD_HEADER_BYTES + len;
    }
    (records, pos as u64)
}

/// What reading every segment of the log in `dir` found, before anything is changed.
struct Scan {
    /// Every segment, oldest first.
    scanned: Vec<ScannedSegment>,
    /// The segment where damage starts, if the log is damaged (the module docs).
    damaged_at: Option<usize>,
}

/// Reads every segment in `dir` whole, as far as it reads, and finds where damage starts,
/// given what the synced mark says (`synced_end`: one past the index it holds). Changes
/// nothing: [`Wal::open_repairing`] acts on what it finds, and [`check`] reports it.
fn scan(dir: &Path, synced_end: u64) -> io::Result<Scan> {
    let mut names = Vec::new();
    for entry in std::fs::read_dir(dir)? {
        let path = entry?.path();
        if path.extension().and_then(|e| e.to_str()) != Some(SEGMENT_SUFFIX) {
            continue;
        }
        let first_index = path
            .file_stem()
            .and_then(|s| s.to_str())
            .and_then(|s| s.parse::<u64>().ok())
            .ok_or_else(|| corrupt(format!("unexpected file {}", path.display())))?;
        names.push(first_index);
    }
    names.sort_unstable();

    let mut scanned = Vec::with_capacity(names.len());
    for &name in &names {
        let path = segment_path(dir, name);
        let Salvaged {
            bytes,
            unreadable_from,
        } = bad_sectors::read_salvaging(&path)?;
        // A record is valid only if it was read whole: it ends before the first sector
        // that could not be read.
        let readable = unreadable_from.map_or(bytes.len(), |byte| byte as usize);
        let (records, valid_len) = scan_records(&bytes[..readable]);
        let damaged = valid_len < bytes.len() as u64;
        let last_after_damage = damaged
            .then(|| last_record_after(&bytes, valid_len as usize))
            .flatten();
        scanned.push(ScannedSegment {
            first_index: name,
            path,
            records,
            valid_len,
            unreadable_from,
            last_after_damage,
            damaged,
        });
    }
    let last = scanned.len().saturating_sub(1);
    // Damage: a bad record that a valid one follows, or in a sealed segment; or the log
    // ending (cleanly or not) before what an `fdatasync` covered.
    let damaged_at = scanned.iter().enumerate().position(|(i, s)| {
        let end = s.first_index + s.records.len() as u64;
        s.damaged && (i < last || s.last_after_damage.is_some()) || (i == last && end < synced_end)
    });
    Ok(Scan {
        scanned,
        damaged_at,
    })
}

/// What [`check`] found in a stopped replica's log, changing nothing.
#[derive(Debug, Default)]
pub struct WalCheck {
    /// Segment files.
    pub segments: usize,
    /// The first index the oldest segment holds, and one past the last valid record.
    pub first_index: Option<u64>,
    pub next_index: u64,
    /// The index the synced mark holds.
    pub synced_mark: Option<u64>,
    /// The synced mark fails its checksum (it counts as none).
    pub mark_damaged: bool,
    /// Damage, as the next start would find it and repair it from the peers.
    pub damage: Option<Damage>,
    /// The damage is only the log ending before the synced mark: synced records were lost,
    /// nothing bad was read.
    pub lost_synced_records: bool,
    /// A torn tail past the synced mark (a segment and the byte where it starts), which a
    /// crash leaves and the next start cuts: not a fault.
    pub torn_tail: Option<(PathBuf, u64)>,
    /// Sectors that fail reads (EIO): a segment and where its first one starts.
    pub unreadable: Vec<(PathBuf, u64)>,
    /// A failed `fdatasync` that the process before recorded, and the records past what it
    /// vouched for, which the next start cuts (`None` when there are none): indexes from and
    /// to, included.
    pub failed_sync: Option<(FailedSync, Option<(u64, u64)>)>,
}

/// Reads the log in `dir` as [`Wal::open_repairing`] would, verifying every record, and
/// reports what it finds without changing anything: for `ctrlog check` on a stopped replica.
pub fn check(dir: &Path) -> io::Result<WalCheck> {
    let (synced_mark, marked_id, mark_damaged) = match SyncedMark::read_only(dir)? {
        MarkFound::Holds(marked, id) => (marked, id, false),
        MarkFound::Missing => (None, None, false),
        MarkFound::Damaged => (None, None, true),
    };
    let synced_end = synced_mark.map_or(0, |index| index + 1);
    let Scan {
        scanned,
        damaged_at,
    } = scan(dir, synced_end)?;
    let damage = match damaged_at {
        Some(at) => Some(describe_damage(&scanned, at, synced_end, marked_id)?),
        None => None,
    };
    let next_index = scanned
        .last()
        .map_or(0, |s| s.first_index + s.records.len() as u64);
    let failed_sync = two_copies::read_only::<Option<FailedSync>>(dir, &FAILED_SYNC)?
        .flatten()
        .map(|failed| {
            let first = scanned.first().map_or(0, |s| s.first_index);
            let from = failed.vouched_end.max(first);
            let past = (from < next_index).then(|| (from, next_index - 1));
            (failed, past)
        });
    let lost_synced_records = damaged_at.is_some_and(|at| !scanned[at].damaged);
    let torn_tail = match (damaged_at, scanned.last()) {
        (None, Some(last)) if last.damaged => Some((last.path.clone(), last.valid_len)),
        _ => None,
    };
    Ok(WalCheck {
        segments: scanned.len(),
        first_index: scanned.first().map(|s| s.first_index),
        next_index,
        synced_mark,
        mark_damaged,
        damage,
        lost_synced_records,
        torn_tail,
        unreadable: (scanned.iter())
            .filter_map(|s| Some((s.path.clone(), s.unreadable_from?)))
            .collect(),
        failed_sync,
    })
}

/// A run of a segment's records, listed under the WAL's lock for the scrubber to verify
/// without it ([`Wal::records_to_verify`]).
pub struct RecordsToVerify {
    file: Arc<SegmentFile>,
    /// The index of the first listed record.
    first: u64,
    records: Vec<RecordPos>,
}

/// A record the scrubber found bad.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BadRecord {
    pub index: u64,
    pub segment: PathBuf,
    pub byte: u64,
    /// Its sector fails reads (EIO), rather than its checksum.
    pub unreadable: bool,
}

impl RecordsToVerify {
    /// One past the last listed index: where the next run starts.
    pub fn end(&self) -> u64 {
        self.first + self.records.len() as u64
    }

    /// Bytes the listed records take in the segment.
    pub fn bytes(&self) -> u64 {
        match (self.records.first(), self.records.last()) {
            (Some(first), Some(last)) => {
                last.pos + RECORD_HEADER_BYTES as u64 + last.len as u64 - first.pos
            }
            _ => 0,
        }
    }

    /// Reads the listed records in one read and verifies each: the first that fails its
    /// length or checksum, or whose sector fails reads. What it finds may be a record the log
    /// truncated and wrote again meanwhile: [`Wal::confirm_bad`] tells.
    pub fn verify(&self) -> io::Result<Option<BadRecord>> {
        let Some(start) = self.records.first().map(|r| r.pos) else {
            return Ok(None);
        };
        let mut bytes = vec![0u8; self.bytes() as usize];
        let bad = |n: usize, unreadable| BadRecord {
            index: self.first + n as u64,
            segment: self.file.path.clone(),
            byte: self.records[n].pos,
            unreadable,
        };
        match self.file.read_exact_at(&mut bytes, start) {
            Ok(()) => {}
            Err(error) if bad_sectors::is_medium_error(&error) => {
                // Which record: the first whose own read fails.
                for n in 0..self.records.len() {
                    if self.read_record(n).is_err() {
                        return Ok(Some(bad(n, true)));
                    }
                }
                return Ok(None);
            }
            // The log was cut below the run since it was listed: nothing here to verify.
            Err(error) if error.kind() == io::ErrorKind::UnexpectedEof => return Ok(None),
            Err(error) => return Err(error),
        }
        for (n, record) in self.records.iter().enumerate() {
            let at = (record.pos - start) as usize;
            if record_at(&bytes, at) != Some(record.len as usize) {
                return Ok(Some(bad(n, false)));
            }
        }
        Ok(None)
    }

    /// Reads and verifies the `n`th listed record alone: `Ok(true)` if it is whole.
    fn read_record(&self, n: usize) -> io::Result<bool> {
        let record = self.records[n];
        let mut bytes = vec![0u8; RECORD_HEADER_BYTES + record.len as usize];
        self.file.read_exact_at(&mut bytes, record.pos)?;
        Ok(record_at(&bytes, 0) == Some(record.len as usize))
    }
}

impl Wal {
    /// Lists the records from `from` (or the first present, if later) to before `end`, up to
    /// `bytes_max` bytes of them and within one segment (at least one record): what the
    /// scrubber verifies next, without the lock. `None` when none is left before `end`.
    pub fn records_to_verify(
        &self,
        from: u64,
        end: u64,
        bytes_max: u64,
    ) -> Option<RecordsToVerify> {
        let from = from.max(self.first_index);
        let segment = self
            .segments
            .range(..=from)
            .next_back()
            .map(|(_, s)| s)
            .filter(|s| from < s.end_index())
            .or_else(|| self.segments.range(from..).next().map(|(_, s)| s))?;
        let from = from.max(segment.first_index);
        let end = end.min(segment.end_index());
        if from >= end {
            return None;
        }
        let listed = &segment.records
            [(from - segment.first_index) as usize..(end - segment.first_index) as usize];
        let start = listed[0].pos;
        let count = listed
            .iter()
            .position(|r| r.pos + RECORD_HEADER_BYTES as u64 + r.len as u64 - start > bytes_max)
            .unwrap_or(listed.len())
            .max(1);
        Some(RecordsToVerify {
            file: segment.file.clone(),
            first: from,
            records: listed[..count].to_vec(),
        })
    }

    /// Whether `bad`, found in `listed` without the lock, is damage: the log still holds that
    /// record where it was listed (not purged, truncated or written again), and it is still bad
    /// when read again now, under the lock, where no write can be under way.
    pub fn confirm_bad(&self, listed: &RecordsToVerify, bad: &BadRecord) -> bool {
        let n = (bad.index - listed.first) as usize;
        let Some(segment) = self
            .segments
            .values()
            .find(|s| Arc::ptr_eq(&s.file, &listed.file))
        else {
            return false;
        };
        let still_listed = bad.index >= self.first_index
            && (bad.index.checked_sub(segment.first_index))
                .and_then(|at| segment.records.get(at as usize))
                .is_some_and(|r| r.pos == listed.records[n].pos && r.len == listed.records[n].len);
        still_listed && !matches!(listed.read_record(n), Ok(true))
    }

    /// Opens (or creates) the log in `dir`, recovering from a crash at any point. A damaged log
    /// (see the module docs) is refused, with an error that says where the damage is.
    ///
    /// `purged_upto` is the last index the caller durably recorded as purged: records at or
    /// below it are dropped, and so are segments holding nothing else.
    pub fn open(dir: &Path, purged_upto: Option<u64>, segment_bytes_max: u64) -> io::Result<Wal> {
        let refuse = |damage: &Damage| Err(corrupt(damage.to_string()));
        Self::open_repairing(dir, purged_upto, segment_bytes_max, refuse).map(|(wal, _)| wal)
    }

    /// Opens the log in `dir` as [`Wal::open`] does, except on damage: `before_cut` is told of
    /// it, and once it returned `Ok` the log is cut before the damage (the damaged segment at
    /// the damaged record, every later segment removed), durably. Returns the damage found.
    pub fn open_repairing(
        dir: &Path,
        purged_upto: Option<u64>,
        segment_bytes_max: u64,
        before_cut: impl FnOnce(&Damage) -> io::Result<()>,
    ) -> io::Result<(Wal, Option<Damage>)> {
        std::fs::create_dir_all(dir)?;
        let (mark, marked, marked_id) = SyncedMark::open(dir)?;
        let mark = Arc::new(mark);
        let synced_end = marked.map_or(0, |index| index + 1);
        let Scan {
            mut scanned,
            damaged_at,
        } = scan(dir, synced_end)?;
        for segment in &scanned {
            if let Some(byte) = segment.unreadable_from {
                tracing::error!(
                    segment = %segment.path.display(),
                    byte,
                    "a sector of the log cannot be read (EIO): the records from there on are \
                     damaged"
                );
            }
        }
        let damage = match damaged_at {
            Some(at) => {
                let damage = describe_damage(&scanned, at, synced_end, marked_id)?;
                tracing::error!(
                    segment = %damage.segment.display(),
                    byte = damage.byte,
                    first_damaged = damage.first,
                    "the log is damaged: a bad or missing record that valid records after it \
                     or the synced mark say it held, which no crash leaves"
                );
                before_cut(&damage)?;
                let kept = keep_damaged(dir, &scanned[at..])?;
                tracing::warn!(
                    kept = %kept.display(),
                    "the damaged segment and those after it are kept as they were found"
                );
                scanned.truncate(at + 1);
                Some(damage)
            }
            None => None,
        };

        let first_index = purged_upto.map_or(0, |p| p + 1);
        let mut wal = Wal {
            dir: dir.to_path_buf(),
            mark: mark.clone(),
            segments: BTreeMap::new(),
            first_index,
            segment_bytes_max,
        };
        for segment in scanned {
            let file = OpenOptions::new()
                .read(true)
                .write(true)
                .open(&segment.path)?;
            let file = SegmentFile {
                file,
                path: segment.path,
                mark: mark.clone(),
            };
            if segment.damaged {
                if damage.is_none() {
                    tracing::warn!(
                        segment = %file.path.display(),
                        kept_bytes = segment.valid_len,
                        "cutting a torn tail left by a crash"
                    );
                }
                file.file.set_len(segment.valid_len)?;
                bad_sectors::forget_from(&file.path, segment.valid_len);
                file.sync_at_open()?;
            }
            wal.segments.insert(
                segment.first_index,
                Segment {
                    first_index: segment.first_index,
                    file: Arc::new(file),
                    records: segment.records,
                    len: segment.valid_len,
                },
            );
        }
        wal.finish_an_interrupted_reset();
        wal.drop_purged_segments()?;
        let mut expected = None;
        for segment in wal.segments.values() {
            if expected.is_some_and(|e| segment.first_index < e) {
                return Err(corrupt(format!(
                    "segment {} overlaps the previous one, which ends before {}",
                    segment.first_index,
                    expected.unwrap_or_default()
                )));
            }
            expected = Some(segment.end_index());
        }
        if let Some(oldest) = wal.segments.keys().next() {
            // The log may start later than the purge point says (it began empty at a later
            // index), never earlier.
            wal.first_index = wal.first_index.max(*oldest);
        }
        if wal.next_index() < first_index || wal.segments.is_empty() {
            // Everything on disk is purged (or nothing is there): start a fresh segment where
            // the log continues.
            wal.reset_at(first_index)?;
        }
        if damage.is_some() {
            // The cut log ends below the mark, which must not find the same damage again.
            wal.mark.set_durably(wal.next_index().checked_sub(1))?;
        }
        Ok((wal, damage))
    }

    /// The log's [`SyncedMark`], for whoever `fdatasync`s it.
    pub fn synced_mark(&self) -> Arc<SyncedMark> {
        self.mark.clone()
    }

    /// The failed `fdatasync` an earlier process recorded, until
    /// [`cut_after_failed_sync`](Self::cut_after_failed_sync) acts on it.
    pub fn failed_sync(&self) -> Option<FailedSync> {
        self.mark.state().found_at_open.clone()
    }

    /// Acts on the failed `fdatasync` an earlier process recorded ([`FailedSync`]), before the
    /// log is synced for anything else: cuts every record from the index the mark vouched
    /// for then on, durably, and then forgets the failure. Records below it were on disk
    /// before the failure; those from it on the peers send again, written anew, so that
    /// only a sync of their new writes vouches for them. Does nothing without a failure.
    /// The caller records a repair first when what is cut may have been acknowledged.
    pub fn cut_after_failed_sync(&mut self) -> io::Result<()> {
        let Some(failed) = self.failed_sync() else {
            return Ok(());
        };
        if failed.vouched_end < self.next_index() {
            tracing::warn!(
                from = failed.vouched_end.max(self.first_index),
                to = self.next_index() - 1,
                "cutting the records that only the failed fdatasync covered"
            );
            self.truncate_from(failed.vouched_end)?;
        }
        let mut state = self.mark.state();
        state.record.save(&None)?;
        state.found_at_open = None;
        Ok(())
    }

    /// The first index that is present (and not purged).
    pub fn first_index(&self) -> u64 {
        self.first_index
    }

    /// The index the next append must carry.
    pub fn next_index(&self) -> u64 {
        self.segments
            .values()
            .next_back()
            .map_or(self.first_index, Segment::end_index)
    }

    /// Where the log resumes after its last hole (a segment that does not start where the one
    /// before it ends), if it has one. Only a snapshot install leaves one, until the purge
    /// behind the installed snapshot removes what lies before it.
    pub fn hole_end(&self) -> Option<u64> {
        let mut ends = self
            .segments
            .values()
            .map(|s| (s.first_index, s.end_index()));
        let mut hole_end = None;
        let (_, mut previous_end) = ends.next()?;
        for (first, end) in ends {
            if first > previous_end {
                hole_end = Some(first);
            }
            previous_end = end;
        }
        hole_end
    }

    /// True when no unpurged record is present.
    pub fn is_empty(&self) -> bool {
        self.next_index() <= self.first_index
    }

    fn active(&mut self) -> &mut Segment {
        self.segments
            .values_mut()
            .next_back()
            .expect("the wal always has an active segment")
    }

    /// The file that holds the most recent appends: what the syncer must `fdatasync`.
    pub fn active_file(&self) -> Arc<SegmentFile> {
        self.segments
            .values()
            .next_back()
            .expect("the wal always has an active segment")
            .file
            .clone()
    }

    fn create_segment(&mut self, first_index: u64) -> io::Result<()> {
        let path = segment_path(&self.dir, first_index);
        let file = attempt(&path, Operation::Write, || {
            (OpenOptions::new().read(true).write(true).create(true))
                .truncate(true)
                .open(&path)
        })?;
        sync_dir(&self.dir)?;
        bad_sectors::forget(&path);
        self.segments.insert(
            first_index,
            Segment {
                first_index,
                file: Arc::new(SegmentFile {
                    file,
                    path,
                    mark: self.mark.clone(),
                }),
                records: Vec::new(),
                len: 0,
            },
        );
        Ok(())
    }

    /// Appends records for consecutive indexes starting at [`Wal::next_index`]. The records are
    /// written but not yet durable: `fdatasync` [`Wal::active_file`] before acknowledging.
    pub fn append(&mut self, first: u64, payloads: &[Vec<u8>]) -> io::Result<()> {
        let expected = self.next_index();
        if first < expected {
            // Raft's log matching: an append at `first` replaces everything from there on.
            self.truncate_from(first)?;
        } else if first > expected {
            if self.is_empty() {
                // Nothing is present, so nothing is skipped: the log simply starts later.
                self.reset_at(first)?;
            } else {
                // openraft never asks for this (its storage suite does). Keep the records
                // apart in a segment of their own, so that every segment stays contiguous.
                tracing::warn!(first, expected, "append leaves a hole in the log");
                self.rotate_to(first)?;
            }
        }
        let mut buffer = Vec::new();
        let mut pending = Vec::new();
        for payload in payloads {
            if payload.len() > RECORD_BYTES_MAX {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidInput,
                    format!(
                        "record of {} bytes exceeds {RECORD_BYTES_MAX}",
                        payload.len()
                    ),
                ));
            }
            let active_len = self.active().len;
            if active_len > 0 && active_len + buffer.len() as u64 >= self.segment_bytes_max {
                self.flush_buffer(&mut buffer, &mut pending)?;
                self.rotate()?;
            }
            let pos = self.active().len + buffer.len() as u64;
            buffer.extend_from_slice(&(payload.len() as u32).to_le_bytes());
            buffer.extend_from_slice(&crc32fast::hash(payload).to_le_bytes());
            buffer.extend_from_slice(payload);
            pending.push(RecordPos {
                pos,
                len: payload.len() as u32,
            });
        }
        self.flush_buffer(&mut buffer, &mut pending)
    }

    fn flush_buffer(
        &mut self,
        buffer: &mut Vec<u8>,
        pending: &mut Vec<RecordPos>,
    ) -> io::Result<()> {
        if buffer.is_empty() {
            return Ok(());
        }
        let active = self.active();
        active.file.write_at(buffer, active.len)?;
        active.len += buffer.len() as u64;
        active.records.append(pending);
        buffer.clear();
        Ok(())
    }

    /// Seals the active segment durably and starts the next one.
    fn rotate(&mut self) -> io::Result<()> {
        let next = self.active().end_index();
        self.rotate_to(next)
    }

    /// Seals the active segment durably and starts one at `first_index`.
    fn rotate_to(&mut self, first_index: u64) -> io::Result<()> {
        self.active().file.sync()?;
        self.create_segment(first_index)
    }

    /// Reads the payload at `index`, verifying its checksum again (what was written is checked
    /// on the way back too). `None` if the index is purged or beyond the end.
    pub fn read(&self, index: u64) -> io::Result<Option<Vec<u8>>> {
        if index < self.first_index || index >= self.next_index() {
            return Ok(None);
        }
        let (_, segment) = self
            .segments
            .range(..=index)
            .next_back()
            .expect("an unpurged index lies in some segment");
        let Some(&record) = segment.records.get((index - segment.first_index) as usize) else {
            return Ok(None); // a hole between segments
        };
        let mut bytes = vec![0u8; RECORD_HEADER_BYTES + record.len as usize];
        segment.file.read_exact_at(&mut bytes, record.pos)?;
        let crc = u32::from_le_bytes(bytes[4..8].try_into().unwrap());
        let payload = bytes.split_off(RECORD_HEADER_BYTES);
        if crc32fast::hash(&payload) != crc {
            return Err(corrupt(format!(
                "record {index} fails its checksum on read"
            )));
        }
        Ok(Some(payload))
    }

    /// Removes every record at or after `index`, durably, before returning.
    pub fn truncate_from(&mut self, index: u64) -> io::Result<()> {
        if index >= self.next_index() {
            return Ok(());
        }
        let index = index.max(self.first_index);
        // Whole segments that start at or after `index` go, except that one segment must stay
        // to be the active one.
        // Newest first, so that a crash part-way leaves a log without holes.
        let doomed: Vec<u64> = self.segments.range(index..).map(|(k, _)| *k).collect();
        for first in doomed.into_iter().rev() {
            if self.segments.len() == 1 {
                break;
            }
            self.segments.remove(&first);
            std::fs::remove_file(segment_path(&self.dir, first))?;
        }
        sync_dir(&self.dir)?;
        let active = self.active();
        if index < active.first_index {
            // Only reachable when the single remaining segment starts after `index`, which
            // cannot happen for an index inside the log; keep the log's shape intact anyway.
            self.reset_at(index)?;
            return self.mark.set_durably(index.checked_sub(1));
        }
        let keep = (index - active.first_index) as usize;
        let new_len = active.records.get(keep).map_or(active.len, |r| r.pos);
        active.records.truncate(keep);
        active.len = new_len;
        let file = &active.file;
        attempt(&file.path, Operation::Write, || file.file.set_len(new_len))?;
        bad_sectors::forget_from(&file.path, new_len);
        file.sync()?;
        // Everything kept is synced now, and nothing after it is.
        self.mark.set_durably(index.checked_sub(1))
    }

    /// Marks every record up to and including `index` as purged and deletes the segments that
    /// hold nothing else. The caller must have recorded `index` durably first, so that a
    /// restart does not resurrect what was purged.
    pub fn purge_upto(&mut self, index: u64) -> io::Result<()> {
        if index < self.first_index {
            return Ok(());
        }
        self.first_index = index + 1;
        if self.next_index() < self.first_index {
            // Purged past the end (a snapshot from the leader jumped ahead): continue there.
            return self.reset_at(self.first_index);
        }
        self.drop_purged_segments()
    }

    /// Finishes a reset of the log that a crash or a failed write cut short. An empty last
    /// segment that starts past the end of the one before it is one: [`Wal::reset_at`] creates
    /// the segment where the log continues before it removes the ones in front of it, and an
    /// append past a hole ([`Wal::rotate_to`], after a snapshot install) creates it before it
    /// writes. Either way everything before its name was purged behind a durable snapshot (the
    /// caller records a purge point before the WAL acts on it), so the log starts there. Left
    /// as it was, the log would claim entries up to the segment's name that no segment holds
    /// (found by the simulation: a replica whose directory `fsync` failed in the middle of a
    /// reset, and whose sled then lost the purge point, could not start: "entry 399
    /// vanished").
    fn finish_an_interrupted_reset(&mut self) {
        let mut newest_first = self.segments.values().rev();
        let (Some(last), Some(before)) = (newest_first.next(), newest_first.next()) else {
            return;
        };
        if last.records.is_empty() && before.end_index() < last.first_index {
            tracing::warn!(
                continues_at = last.first_index,
                "the log's last segment is empty and starts past the end of the one before \
                 it: a reset of the log was cut short; everything before it is purged"
            );
            self.first_index = self.first_index.max(last.first_index);
        }
    }

    fn drop_purged_segments(&mut self) -> io::Result<()> {
        let mut removed = false;
        while self.segments.len() > 1 {
            let (&first, segment) = self.segments.iter().next().unwrap();
            if segment.end_index() > self.first_index {
                break;
            }
            self.segments.remove(&first);
            std::fs::remove_file(segment_path(&self.dir, first))?;
            removed = true;
        }
        if removed {
            sync_dir(&self.dir)?;
        }
        Ok(())
    }

    /// Deletes every segment and starts an empty one at `first_index`.
    fn reset_at(&mut self, first_index: u64) -> io::Result<()> {
        let old: Vec<u64> = self.segments.keys().copied().collect();
        self.segments.clear();
        self.create_segment(first_index)?;
        for first in old.into_iter().filter(|f| *f != first_index) {
            std::fs::remove_file(segment_path(&self.dir, first))?;
        }
        sync_dir(&self.dir)?;
        self.first_index = first_index;
        Ok(())
    }

    /// Moves every segment into `kept` (a folder on the same file system) and starts the log
    /// over, empty, at index 0, durably: for a replica that lost its snapshot, whose log
    /// cannot be applied without it.
    pub fn set_aside_everything(&mut self, kept: &Path) -> io::Result<()> {
        for &first in self.segments.keys() {
            let path = segment_path(&self.dir, first);
            std::fs::rename(
                &path,
                kept.join(path.file_name().expect("a segment has a name")),
            )?;
        }
        sync_dir(kept)?;
        self.segments.clear();
        self.reset_at(0)?;
        self.mark.set_durably(None)
    }

    /// Bytes on disk across all segments.
    pub fn disk_bytes(&self) -> u64 {
        self.segments.values().map(|s| s.len).sum()
    }

    /// Number of segment files.
    pub fn segment_count(&self) -> usize {
        self.segments.len()
    }
}

/// The faults a crash or a rotting disk leaves in a replica's log, for the tools and tests
/// that inject them: the storage owns its fault model, so that each injector does not
/// re-derive the segment layout. Each wants the replica stopped but a bad sector, which may go
/// bad under a running one; none is called by a replica itself.
pub mod faults {
    use std::collections::BTreeMap;
    use std::fs::OpenOptions;
    use std::io;
    use std::path::{Path, PathBuf};

    use crate::raft::storage::files::faults::invert_byte;

    use super::{
        MarkFound, RecordPos, SyncedMark, Wal, RECORD_HEADER_BYTES, SEGMENT_SUFFIX,
        SYNCED_MARK_FILE,
    };

    /// The log's segment files in `dir`, oldest first.
    fn segments(dir: &Path) -> io::Result<Vec<PathBuf>> {
        let mut segments: Vec<PathBuf> = std::fs::read_dir(dir)?
            .map(|entry| entry.map(|e| e.path()))
            .collect::<Result<_, _>>()?;
        segments.retain(|p| p.extension().is_some_and(|e| e == SEGMENT_SUFFIX));
        segments.sort();
        Ok(segments)
    }

    fn file_name(path: &Path) -> String {
        path.file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default()
    }

    /// Each segment's file name and size: what a replica about to start holds.
    pub fn segment_sizes(dir: &Path) -> io::Result<BTreeMap<String, u64>> {
        segments(dir)?
            .into_iter()
            .map(|path| Ok((file_name(&path), std::fs::metadata(&path)?.len())))
            .collect()
    }

    /// A power loss: cuts each segment back to `durable[its file name]`, the size its last
    /// completed `fdatasync` covered (0 for a segment that none covered), dropping what was
    /// written after it. Returns the bytes dropped. A segment is never lengthened: the outcome
    /// is always a prefix of what was written, which is what a disk may keep.
    pub fn lose_unsynced(dir: &Path, durable: &BTreeMap<String, u64>) -> io::Result<u64> {
        let mut dropped = 0;
        for path in segments(dir)? {
            let kept = durable.get(&file_name(&path)).copied().unwrap_or(0);
            let file = OpenOptions::new().write(true).open(&path)?;
            let len = file.metadata()?.len();
            if len > kept {
                file.set_len(kept)?;
                dropped += len - kept;
            }
        }
        Ok(dropped)
    }

    /// A power loss measured in entries: drops every entry after `synced`, the last one a
    /// sync covered (`None`: none was), as a disk that kept only what was synced would.
    pub fn lose_entries_after(dir: &Path, synced: Option<u64>) -> io::Result<()> {
        let mut wal = Wal::open(dir, None, u64::MAX)?;
        let first_lost = synced.map_or(0, |index| index + 1);
        if wal.next_index() > first_lost {
            wal.truncate_from(first_lost)?;
        }
        Ok(())
    }

    /// A store that lied about durability: drops the last `entries` of the log, acknowledged or
    /// not (never below its first entry).
    pub fn lose_last_entries(dir: &Path, entries: u64) -> io::Result<()> {
        let mut wal = Wal::open(dir, None, u64::MAX)?;
        let from = wal
            .next_index()
            .saturating_sub(entries)
            .max(wal.first_index());
        wal.truncate_from(from)
    }

    /// One flipped byte: inverts the byte at `at` of the log's bytes counted over its segments
    /// oldest first, `at` taken modulo their total size. Returns the segment's file name and
    /// the offset in it, or `None` for an empty log.
    pub fn flip_byte(dir: &Path, at: u64) -> io::Result<Option<(String, u64)>> {
        let found = locate_byte(dir, at)?;
        if let Some((name, offset)) = &found {
            invert_byte(&dir.join(name), *offset)?;
        }
        Ok(found)
    }

    /// A bad sector: the sector that holds byte `at` of the log's bytes (counted as
    /// [`flip_byte`] counts them) fails every read from now on, while the replica runs or at
    /// its next start, until the log cuts it away ([`super::bad_sectors`]). Returns the
    /// segment's file name and the byte's offset in it, or `None` for an empty log.
    pub fn make_sector_unreadable(dir: &Path, at: u64) -> io::Result<Option<(String, u64)>> {
        let found = locate_byte(dir, at)?;
        if let Some((name, offset)) = &found {
            super::bad_sectors::faults::make_unreadable(&dir.join(name), *offset);
        }
        Ok(found)
    }

    /// The segment's file name and the offset in it of byte `at` of the log's bytes counted
    /// over its segments oldest first, `at` taken modulo their total size; `None` for an
    /// empty log.
    fn locate_byte(dir: &Path, at: u64) -> io::Result<Option<(String, u64)>> {
        let sizes = segment_sizes(dir)?;
        let total: u64 = sizes.values().sum();
        if total == 0 {
            return Ok(None);
        }
        let mut left = at % total;
        for (name, size) in sizes {
            if left < size {
                return Ok(Some((name, left)));
            }
            left -= size;
        }
        unreachable!("the offset is below the total size")
    }

    /// The index the log's synced mark holds, read as a stopped replica left it.
    pub fn synced_mark(dir: &Path) -> io::Result<Option<u64>> {
        Ok(match SyncedMark::read_only(dir)? {
            MarkFound::Holds(marked, _) => marked,
            MarkFound::Missing | MarkFound::Damaged => None,
        })
    }

    /// The id of the entry the log's synced mark holds, when the mark knows it.
    pub fn synced_mark_id(dir: &Path) -> io::Result<Option<crate::raft::types::LogId>> {
        Ok(match SyncedMark::read_only(dir)? {
            MarkFound::Holds(_, id) => id,
            MarkFound::Missing | MarkFound::Damaged => None,
        })
    }

    /// Flips one byte of the synced mark's file, as a rotting disk would.
    pub fn flip_byte_of_synced_mark(dir: &Path) -> io::Result<()> {
        invert_byte(&dir.join(SYNCED_MARK_FILE), 3)
    }

    /// The bytes rot may hit where the log can tell it from a torn write: those of the sealed
    /// segments, and of the last segment's records up to the synced mark.
    struct SyncedBytes {
        /// Bytes of the segments before the last.
        before_last: u64,
        /// Where the last segment's last record the mark covers lies in it.
        last_synced: Option<std::ops::Range<u64>>,
    }

    /// Records of one segment with their indexes.
    type IndexedRecords = Vec<(RecordPos, u64)>;

    /// The last segment, and where each of its records that the synced mark covers starts in
    /// it, with its index; `None` for a log without segments.
    fn synced_in_last_segment(dir: &Path) -> io::Result<Option<(PathBuf, IndexedRecords)>> {
        let Some(last) = segments(dir)?.pop() else {
            return Ok(None);
        };
        let first_index = last
            .file_stem()
            .and_then(|stem| stem.to_str()?.parse::<u64>().ok())
            .unwrap_or(u64::MAX);
        let marked = synced_mark(dir)?;
        let (records, _) = super::scan_records(&std::fs::read(&last)?);
        let synced = records
            .into_iter()
            .zip(first_index..)
            .take_while(|&(_, index)| marked.is_some_and(|m| index <= m))
            .collect();
        Ok(Some((last, synced)))
    }

    fn synced_bytes(dir: &Path) -> io::Result<Option<SyncedBytes>> {
        let Some((last, synced)) = synced_in_last_segment(dir)? else {
            return Ok(None);
        };
        let last_synced = synced
            .last()
            .map(|(r, _)| r.pos..r.pos + (RECORD_HEADER_BYTES as u64) + u64::from(r.len));
        let sizes = segment_sizes(dir)?;
        let before_last = sizes.values().sum::<u64>() - sizes[&file_name(&last)];
        Ok(Some(SyncedBytes {
            before_last,
            last_synced,
        }))
    }

    /// Writes the disk lost after `fdatasync` reported them done: the last segment cut back
    /// before its last `records` records that the synced mark covers (all of them if it
    /// covers fewer), the mark left as it was. Returns the first index lost; `None` when the
    /// mark covers none of the last segment's records.
    pub fn lose_synced_records(dir: &Path, records: usize) -> io::Result<Option<u64>> {
        let Some((last, synced)) = synced_in_last_segment(dir)? else {
            return Ok(None);
        };
        let Some(&(from, index)) = synced.get(synced.len().saturating_sub(records.max(1))) else {
            return Ok(None);
        };
        OpenOptions::new()
            .write(true)
            .open(&last)?
            .set_len(from.pos)?;
        Ok(Some(index))
    }

    /// Rot the log can tell from a torn write: one byte flipped as [`flip_byte`] flips it, at
    /// `at` modulo the bytes of the sealed segments and of the last segment's records up to
    /// the synced mark. A record past the mark, whole in length with a wrong checksum, is what
    /// a torn write leaves (see the module docs).
    pub fn flip_synced_byte(dir: &Path, at: u64) -> io::Result<Option<(String, u64)>> {
        let Some(bytes) = synced_bytes(dir)? else {
            return Ok(None);
        };
        let detectable = bytes.before_last + bytes.last_synced.map_or(0, |r| r.end);
        if detectable == 0 {
            return Ok(None);
        }
        flip_byte(dir, at % detectable)
    }

    /// Rot in the one place where only the synced mark tells it from a torn write: one byte
    /// of the last segment's last record the mark covers (at `at` modulo its bytes); `None`
    /// when the mark covers none of the last segment's records.
    pub fn flip_final_synced_byte(dir: &Path, at: u64) -> io::Result<Option<(String, u64)>> {
        let Some(SyncedBytes {
            before_last,
            last_synced: Some(record),
        }) = synced_bytes(dir)?
        else {
            return Ok(None);
        };
        flip_byte(
            dir,
            before_last + record.start + at % (record.end - record.start),
        )
    }

    /// A torn write: `bytes` of zeros (`zeros`) or garbage after the last record of the last
    /// segment.
    pub fn tear_tail(dir: &Path, bytes: usize, zeros: bool) -> io::Result<()> {
        let last = segments(dir)?.pop().ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::NotFound,
                format!("no wal segment in {}", dir.display()),
            )
        })?;
        let tail: Vec<u8> = if zeros {
            vec![0; bytes]
        } else {
            (0..bytes).map(|i| (i * 131 % 251) as u8 | 1).collect()
        };
        let mut file = OpenOptions::new().append(true).open(&last)?;
        io::Write::write_all(&mut file, &tail)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An entry's id at `index`, of term 1.
    fn entry_id(index: u64) -> crate::raft::types::LogId {
        crate::raft::types::LogId::new(openraft::CommittedLeaderId::new(1, 1), index)
    }

    fn payload(i: u64) -> Vec<u8> {
        format!("record-{i}").into_bytes()
    }

    fn fill(wal: &mut Wal, from: u64, to: u64) {
        for i in from..=to {
            wal.append(i, &[payload(i)]).unwrap();
        }
    }

    /// Goal: the scrubber's reads, made without the lock, take a record the log truncated and
    /// wrote again meanwhile for nothing worse than stale, and confirm real rot; its runs
    /// keep to their byte bound and to one segment.
    #[test]
    fn the_scrubber_tells_rot_from_a_record_written_again() {
        let dir = tempfile::tempdir().unwrap();
        let mut wal = Wal::open(dir.path(), None, 1 << 20).unwrap();
        fill(&mut wal, 0, 9);
        let listed = wal.records_to_verify(0, 10, 1 << 20).unwrap();
        assert_eq!((listed.end(), listed.verify().unwrap()), (10, None));
        let run = wal.records_to_verify(2, 10, 30).unwrap();
        assert_eq!(
            (run.first, run.end()),
            (2, 3),
            "one record of 8 + 8 bytes fits 30"
        );
        assert!(wal.records_to_verify(10, 10, 1 << 20).is_none());

        wal.truncate_from(5).unwrap();
        wal.append(5, &[vec![7u8; 100], vec![8u8; 3]]).unwrap();
        let stale = listed
            .verify()
            .unwrap()
            .expect("the old listing reads as bad");
        assert_eq!(stale.index, 5);
        assert!(
            !wal.confirm_bad(&listed, &stale),
            "written again, not rotten"
        );

        let listed = wal.records_to_verify(0, 7, 1 << 20).unwrap();
        let record = listed.records[3];
        crate::raft::storage::files::faults::invert_byte(listed.file.path(), record.pos + 9)
            .unwrap();
        let rotten = listed.verify().unwrap().expect("rot");
        assert_eq!(
            (rotten.index, rotten.byte, rotten.unreadable),
            (3, record.pos, false)
        );
        assert!(wal.confirm_bad(&listed, &rotten));

        let sector_of_record_1 = listed.records[1].pos;
        crate::raft::storage::files::faults::invert_byte(listed.file.path(), record.pos + 9)
            .unwrap();
        bad_sectors::faults::make_unreadable(listed.file.path(), sector_of_record_1);
        let unreadable = listed.verify().unwrap().expect("a bad sector");
        assert_eq!(
            (unreadable.index, unreadable.unreadable),
            (0, true),
            "the sector holds 0.."
        );
        assert!(wal.confirm_bad(&listed, &unreadable));
        bad_sectors::forget(listed.file.path());
    }

    /// Regression (the simulation, 3 of 1,000 seeds with full disks): a reset cut short after
    /// it created the segment where the log continues leaves that empty segment past a hole.
    /// Opened with no purge point (sled lost it), the log used to claim entries up to the
    /// segment's name that no segment holds, and the log store could not start ("entry 399
    /// vanished"). Now the reset is finished: the log starts at the empty segment.
    #[test]
    fn a_reset_cut_short_is_finished_at_open() {
        let dir = tempfile::tempdir().unwrap();
        let mut wal = Wal::open(dir.path(), None, 1 << 20).unwrap();
        fill(&mut wal, 0, 9);
        drop(wal);
        File::create(segment_path(dir.path(), 400)).unwrap();
        let wal = Wal::open(dir.path(), None, 1 << 20).unwrap();
        assert_eq!((wal.first_index(), wal.next_index()), (400, 400));
        assert!(wal.is_empty());
        assert_eq!(wal.segment_count(), 1);

        // An empty last segment right after the one before it is the usual rotation.
        let dir = tempfile::tempdir().unwrap();
        let mut wal = Wal::open(dir.path(), None, 1 << 20).unwrap();
        fill(&mut wal, 0, 9);
        drop(wal);
        File::create(segment_path(dir.path(), 10)).unwrap();
        let wal = Wal::open(dir.path(), None, 1 << 20).unwrap();
        assert_eq!((wal.first_index(), wal.next_index()), (0, 10));
    }

    #[test]
    fn records_survive_reopen_across_segments() {
        let dir = tempfile::tempdir().unwrap();
        let mut wal = Wal::open(dir.path(), None, 64).unwrap();
        fill(&mut wal, 0, 20);
        assert!(wal.segment_count() > 1);
        drop(wal);
        let wal = Wal::open(dir.path(), None, 64).unwrap();
        assert_eq!(wal.next_index(), 21);
        for i in 1..=20 {
            assert_eq!(wal.read(i).unwrap(), Some(payload(i)));
        }
    }

    /// The fault model's flipped byte inverts exactly one byte, at the offset it names, of the
    /// segment it names, counting over the segments oldest first and wrapping at their end.
    #[test]
    fn a_flipped_byte_is_one_byte_where_it_says() {
        let dir = tempfile::tempdir().unwrap();
        let mut wal = Wal::open(dir.path(), None, 64).unwrap();
        fill(&mut wal, 0, 20);
        drop(wal);
        let sizes: Vec<(String, u64)> = faults::segment_sizes(dir.path())
            .unwrap()
            .into_iter()
            .collect();
        assert!(sizes.len() > 2 && sizes[0].1 > 3);
        let total: u64 = sizes.iter().map(|(_, size)| size).sum();
        let (first, second, last) = (&sizes[0], &sizes[1], &sizes[sizes.len() - 1]);
        let read = |name: &str| std::fs::read(dir.path().join(name)).unwrap();
        for (at, (name, offset)) in [
            (0, (&first.0, 0)),
            (first.1, (&second.0, 0)),
            (total - 1, (&last.0, last.1 - 1)),
            (total + 3, (&first.0, 3)),
        ] {
            let before: Vec<Vec<u8>> = sizes.iter().map(|(name, _)| read(name)).collect();
            let flipped = faults::flip_byte(dir.path(), at).unwrap();
            assert_eq!(flipped, Some((name.clone(), offset)), "flip at {at}");
            for ((segment, _), bytes) in sizes.iter().zip(before) {
                let after = read(segment);
                let changed: Vec<u64> = (0..after.len() as u64)
                    .filter(|&i| after[i as usize] != bytes[i as usize])
                    .collect();
                let expected = if segment == name {
                    vec![offset]
                } else {
                    vec![]
                };
                assert_eq!(changed, expected, "flip at {at}: {segment}");
            }
        }
    }

    #[test]
    fn append_below_the_end_replaces_the_tail() {
        let dir = tempfile::tempdir().unwrap();
        let mut wal = Wal::open(dir.path(), None, 1 << 20).unwrap();
        fill(&mut wal, 0, 5);
        wal.append(3, &[b"new".to_vec()]).unwrap();
        assert_eq!(wal.next_index(), 4);
        assert_eq!(wal.read(3).unwrap(), Some(b"new".to_vec()));
        assert_eq!(wal.read(4).unwrap(), None);
    }

    #[test]
    fn torn_tail_is_cut_at_the_last_whole_record() {
        let dir = tempfile::tempdir().unwrap();
        let mut wal = Wal::open(dir.path(), None, 1 << 20).unwrap();
        fill(&mut wal, 0, 5);
        let path = segment_path(dir.path(), 0);
        drop(wal);
        let len = std::fs::metadata(&path).unwrap().len();
        // Tear the last record in half, then append garbage after it.
        let file = OpenOptions::new().write(true).open(&path).unwrap();
        file.set_len(len - 3).unwrap();
        file.write_all_at(&[0xff; 5], len - 3).unwrap();
        let mut wal = Wal::open(dir.path(), None, 1 << 20).unwrap();
        assert_eq!(wal.next_index(), 5);
        assert_eq!(wal.read(4).unwrap(), Some(payload(4)));
        fill(&mut wal, 5, 6);
        assert_eq!(wal.read(6).unwrap(), Some(payload(6)));
    }

    /// Regression: a zero-filled tail (left by some file systems after a power loss) passed
    /// as empty records, whose CRC is 0, and the replica could not start. Every kind of
    /// damaged tail is cut at the last whole record, and appends continue there.
    #[test]
    fn zeroed_and_garbage_tails_are_cut_at_the_last_whole_record() {
        let tails: [(&str, Vec<u8>); 5] = [
            ("17 zero bytes", vec![0; 17]),
            ("64 KiB of zeros", vec![0; 64 << 10]),
            ("one zero header", vec![0; RECORD_HEADER_BYTES]),
            ("0xff bytes", vec![0xff; 4096]),
            (
                "garbage",
                (0..4096u32).map(|i| (i * 7919 % 251) as u8).collect(),
            ),
        ];
        for (what, tail) in tails {
            let dir = tempfile::tempdir().unwrap();
            let mut wal = Wal::open(dir.path(), None, 1 << 20).unwrap();
            fill(&mut wal, 1, 5);
            drop(wal);
            let path = segment_path(dir.path(), 1);
            let len = std::fs::metadata(&path).unwrap().len();
            let file = OpenOptions::new().write(true).open(&path).unwrap();
            file.write_all_at(&tail, len).unwrap();
            let mut wal = Wal::open(dir.path(), None, 1 << 20)
                .unwrap_or_else(|e| panic!("{what}: the wal did not open: {e}"));
            assert_eq!(wal.next_index(), 6, "{what}");
            assert_eq!(std::fs::metadata(&path).unwrap().len(), len, "{what}: cut");
            fill(&mut wal, 6, 7);
            drop(wal);
            let wal = Wal::open(dir.path(), None, 1 << 20).unwrap();
            assert_eq!(wal.read(7).unwrap(), Some(payload(7)), "{what}");
        }
    }

    #[test]
    fn flipped_bit_in_an_old_segment_is_reported_not_skipped() {
        let dir = tempfile::tempdir().unwrap();
        let mut wal = Wal::open(dir.path(), None, 64).unwrap();
        fill(&mut wal, 0, 20);
        drop(wal);
        let path = segment_path(dir.path(), 0);
        let file = OpenOptions::new().write(true).open(&path).unwrap();
        file.write_all_at(b"X", 10).unwrap();
        let error = Wal::open(dir.path(), None, 64).err().expect("corruption");
        assert_eq!(error.kind(), io::ErrorKind::InvalidData);
    }

    /// What one kind of damage does to a record's bytes (header, then payload).
    type Rot = fn(&mut [u8]);

    /// The kinds of damage a disk does to one record, by name.
    const DAMAGE: [(&str, Rot); 4] = [
        ("a payload byte flipped", |r| {
            r[RECORD_HEADER_BYTES + 2] ^= 0x10
        }),
        ("a checksum byte flipped", |r| r[5] ^= 0x01),
        ("a length byte flipped", |r| r[0] = !r[0]),
        ("the record zeroed", |r| r.fill(0)),
    ];

    /// Damage of every kind to the first, a middle and the last record of the first, a middle
    /// and the last segment: anywhere but the very end it is damage, never a torn tail. The log
    /// is cut before the damaged record, the damage names it and the log's last record, and
    /// the log reopens clean. At the very end (the last record of the last segment) it is what
    /// a torn final write leaves, and is cut as one.
    #[test]
    fn damage_anywhere_is_told_from_a_torn_tail() {
        const LAST: u64 = 20;
        for (kind, damage) in DAMAGE {
            let positions = {
                let dir = tempfile::tempdir().unwrap();
                let mut wal = Wal::open(dir.path(), None, 64).unwrap();
                fill(&mut wal, 1, LAST);
                let segments: Vec<(u64, u64)> = wal
                    .segments
                    .values()
                    .map(|s| (s.first_index, s.end_index()))
                    .collect();
                assert!(segments.len() >= 4, "{segments:?}");
                let mut positions = Vec::new();
                for (first, end) in [
                    segments[0],
                    segments[segments.len() / 2],
                    segments[segments.len() - 1],
                ] {
                    positions.extend([first, (first + end) / 2, end - 1]);
                }
                positions
            };
            for index in positions {
                let dir = tempfile::tempdir().unwrap();
                let mut wal = Wal::open(dir.path(), None, 64).unwrap();
                fill(&mut wal, 1, LAST);
                let (segment, record) = {
                    let (_, segment) = wal.segments.range(..=index).next_back().unwrap();
                    (
                        segment_path(dir.path(), segment.first_index),
                        segment.records[(index - segment.first_index) as usize],
                    )
                };
                drop(wal);
                let file = OpenOptions::new()
                    .read(true)
                    .write(true)
                    .open(&segment)
                    .unwrap();
                let mut bytes = vec![0u8; RECORD_HEADER_BYTES + record.len as usize];
                file.read_exact_at(&mut bytes, record.pos).unwrap();
                damage(&mut bytes);
                file.write_all_at(&bytes, record.pos).unwrap();
                let case = format!("{kind} at record {index}");
                let as_found = faults::segment_sizes(dir.path()).unwrap();

                assert!(
                    Wal::open(dir.path(), None, 64).is_err() || index == LAST,
                    "{case}: opened"
                );
                let mut told = None;
                let (wal, found) = Wal::open_repairing(dir.path(), None, 64, |d| {
                    told = Some(d.clone());
                    Ok(())
                })
                .unwrap_or_else(|e| panic!("{case}: {e}"));
                assert_eq!(found, told, "{case}");
                assert_eq!(wal.next_index(), index, "{case}: cut before the damage");
                for kept in 1..index {
                    assert_eq!(wal.read(kept).unwrap(), Some(payload(kept)), "{case}");
                }
                if index == LAST {
                    assert_eq!(found, None, "{case}: a torn tail");
                } else {
                    let found = found.unwrap_or_else(|| panic!("{case}: taken for a torn tail"));
                    assert_eq!(found.first, index, "{case}");
                    assert_eq!(found.segment, segment, "{case}");
                    assert_eq!(found.byte, record.pos, "{case}");
                    assert_eq!(found.last_record, Some(payload(LAST)), "{case}");
                    assert!(
                        found.end_at_least > index && found.end_at_least <= LAST + 1,
                        "{case}"
                    );
                    let kept = dir.path().join(DAMAGED_DIR).join("1");
                    let kept_sizes = faults::segment_sizes(&kept).unwrap();
                    let from_damaged = as_found.range(kept_sizes.keys().next().unwrap().clone()..);
                    assert!(
                        kept_sizes.iter().eq(from_damaged),
                        "{case}: the damaged segment and the later ones are kept as found"
                    );
                }
                drop(wal);
                let wal = Wal::open(dir.path(), None, 64).unwrap_or_else(|e| panic!("{case}: {e}"));
                assert_eq!(wal.next_index(), index, "{case}: reopened");
            }
        }
    }

    /// A sector that cannot be read (EIO) under the first, a middle and the last record of the
    /// first, a middle and the last segment: a read of it while the log is open fails with the
    /// error (no record is made up); at open the records from the first one it touches on are
    /// damaged, by the rules for damaged bytes (a valid record after them, or a sealed
    /// segment: damage; the very end of the last segment, which the synced mark does not
    /// cover here: a torn tail). The damaged segment is kept as far as it reads, and cutting
    /// it gives the bad sector back, so the log reopens clean.
    #[test]
    fn an_unreadable_sector_anywhere_is_damage_unless_it_is_the_tail() {
        const LAST: u64 = 40;
        const SEGMENT_BYTES: u64 = 12 << 10;
        let big = |i: u64| vec![i as u8; 1500];
        let fill_big = |wal: &mut Wal| {
            for i in 1..=LAST {
                wal.append(i, &[big(i)]).unwrap();
            }
        };
        let positions = {
            let dir = tempfile::tempdir().unwrap();
            let mut wal = Wal::open(dir.path(), None, SEGMENT_BYTES).unwrap();
            fill_big(&mut wal);
            let segments: Vec<(u64, u64)> = (wal.segments.values())
                .map(|s| (s.first_index, s.end_index()))
                .collect();
            assert!(segments.len() >= 4, "{segments:?}");
            let picked = [0, segments.len() / 2, segments.len() - 1].map(|i| segments[i]);
            picked
                .into_iter()
                .flat_map(|(first, end)| [first, (first + end) / 2, end - 1])
                .collect::<Vec<_>>()
        };
        for index in positions {
            let dir = tempfile::tempdir().unwrap();
            let mut wal = Wal::open(dir.path(), None, SEGMENT_BYTES).unwrap();
            fill_big(&mut wal);
            let (_, segment) = wal.segments.range(..=index).next_back().unwrap();
            let record = segment.records[(index - segment.first_index) as usize];
            let path = segment.file.path.clone();
            let is_last_segment = wal.segments.keys().next_back() == Some(&segment.first_index);
            let bad_byte = record.pos + u64::from(record.len) / 2;
            let sector = bad_byte / bad_sectors::SECTOR_BYTES * bad_sectors::SECTOR_BYTES;
            // The first record the sector touches, and whether a whole record follows it.
            let touches = |r: &RecordPos| {
                r.pos + RECORD_HEADER_BYTES as u64 + u64::from(r.len) > sector
                    && r.pos < sector + bad_sectors::SECTOR_BYTES
            };
            let first_bad =
                segment.first_index + segment.records.iter().position(touches).unwrap() as u64;
            let valid_after = segment.records.iter().any(|r| r.pos >= sector + 4096);
            let size_as_found = std::fs::metadata(&path).unwrap().len();
            bad_sectors::faults::make_unreadable(&path, bad_byte);
            let case = format!("a bad sector under record {index}");

            let error = wal.read(index).unwrap_err();
            assert!(bad_sectors::is_medium_error(&error), "{case}: {error}");
            drop(wal);
            let torn_tail = is_last_segment && !valid_after;
            assert!(
                Wal::open(dir.path(), None, SEGMENT_BYTES).is_err() || torn_tail,
                "{case}: opened"
            );
            let (wal, found) = Wal::open_repairing(dir.path(), None, SEGMENT_BYTES, |_| Ok(()))
                .unwrap_or_else(|e| panic!("{case}: {e}"));
            assert_eq!(wal.next_index(), first_bad, "{case}: cut before the sector");
            for kept in 1..first_bad {
                assert_eq!(wal.read(kept).unwrap(), Some(big(kept)), "{case}");
            }
            match torn_tail {
                true => assert_eq!(found, None, "{case}: a torn tail"),
                false => {
                    let found = found.unwrap_or_else(|| panic!("{case}: taken for a torn tail"));
                    assert_eq!((found.first, &found.segment), (first_bad, &path), "{case}");
                    assert_eq!(found.last_record, Some(big(LAST)), "{case}");
                    let kept = dir.path().join(DAMAGED_DIR).join("1");
                    let name = path.file_name().unwrap();
                    let copy = std::fs::read(kept.join(name)).unwrap();
                    assert_eq!(copy.len() as u64, size_as_found, "{case}: kept whole");
                    let sector = sector as usize..(sector as usize + 4096).min(copy.len());
                    assert!(copy[sector].iter().all(|&b| b == 0), "{case}: zeros kept");
                }
            }
            drop(wal);
            let wal = Wal::open(dir.path(), None, SEGMENT_BYTES)
                .unwrap_or_else(|e| panic!("{case}: reopened: {e}"));
            assert_eq!(wal.next_index(), first_bad, "{case}: reopened");
        }
    }

    /// Writes `damage` over record `index` of the log in `dir` (in its last segment).
    fn damage_record(dir: &Path, wal: &Wal, index: u64, damage: Rot) -> RecordPos {
        let (_, segment) = wal.segments.range(..=index).next_back().unwrap();
        let record = segment.records[(index - segment.first_index) as usize];
        let path = segment_path(dir, segment.first_index);
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .open(path)
            .unwrap();
        let mut bytes = vec![0u8; RECORD_HEADER_BYTES + record.len as usize];
        file.read_exact_at(&mut bytes, record.pos).unwrap();
        damage(&mut bytes);
        file.write_all_at(&bytes, record.pos).unwrap();
        record
    }

    /// The final record, damaged in every way, is damage once the synced mark covers it: an
    /// acknowledged record that rotted in place, not a torn write. The damage says the log
    /// held it, and the cut log's mark is lowered so that the next open finds nothing.
    #[test]
    fn a_bad_final_record_under_the_synced_mark_is_damage() {
        const LAST: u64 = 20;
        for (kind, damage) in DAMAGE {
            let dir = tempfile::tempdir().unwrap();
            let mut wal = Wal::open(dir.path(), None, 64).unwrap();
            fill(&mut wal, 1, LAST);
            wal.synced_mark().raise(entry_id(LAST)).unwrap();
            let record = damage_record(dir.path(), &wal, LAST, damage);
            drop(wal);
            assert_eq!(faults::synced_mark(dir.path()).unwrap(), Some(LAST));
            let (wal, found) = Wal::open_repairing(dir.path(), None, 64, |_| Ok(()))
                .unwrap_or_else(|e| panic!("{kind}: {e}"));
            let found = found.unwrap_or_else(|| panic!("{kind}: taken for a torn tail"));
            assert_eq!((found.first, found.byte), (LAST, record.pos), "{kind}");
            assert_eq!(
                found.end_at_least,
                LAST + 1,
                "{kind}: the mark says it held it"
            );
            assert_eq!(found.last_record, None, "{kind}");
            assert_eq!(wal.next_index(), LAST, "{kind}: cut before the damage");
            drop(wal);
            assert_eq!(faults::synced_mark(dir.path()).unwrap(), Some(LAST - 1));
            let wal = Wal::open(dir.path(), None, 64).unwrap_or_else(|e| panic!("{kind}: {e}"));
            assert_eq!(wal.next_index(), LAST, "{kind}: reopened");
        }
    }

    /// Records the synced mark covers that are missing from a log that ends cleanly (a write
    /// the disk lost after `fdatasync` reported it done) are damage too.
    #[test]
    fn synced_records_missing_from_the_end_are_damage() {
        let dir = tempfile::tempdir().unwrap();
        let mut wal = Wal::open(dir.path(), None, 1 << 20).unwrap();
        fill(&mut wal, 1, 10);
        wal.synced_mark().raise(entry_id(10)).unwrap();
        let lost_from = wal.segments[&1].records[7].pos;
        drop(wal);
        let file = OpenOptions::new()
            .write(true)
            .open(segment_path(dir.path(), 1))
            .unwrap();
        file.set_len(lost_from).unwrap();
        assert!(Wal::open(dir.path(), None, 1 << 20).is_err());
        let (wal, found) = Wal::open_repairing(dir.path(), None, 1 << 20, |_| Ok(())).unwrap();
        let found = found.expect("missing synced records are damage");
        assert_eq!((found.first, found.end_at_least), (8, 11));
        assert_eq!(wal.next_index(), 8);
    }

    /// What lowers the mark: a truncation, durably, so that the records written after it are
    /// torn by a crash as any unsynced record is; and a mark that fails its checksum is none.
    #[test]
    fn the_synced_mark_is_lowered_by_truncation_and_ignored_when_rotten() {
        let dir = tempfile::tempdir().unwrap();
        let mut wal = Wal::open(dir.path(), None, 1 << 20).unwrap();
        fill(&mut wal, 1, 10);
        wal.synced_mark().raise(entry_id(10)).unwrap();
        wal.truncate_from(6).unwrap();
        assert_eq!(faults::synced_mark(dir.path()).unwrap(), Some(5));
        fill(&mut wal, 6, 8);
        damage_record(dir.path(), &wal, 8, DAMAGE[0].1);
        drop(wal);
        let wal = Wal::open(dir.path(), None, 1 << 20).expect("a torn tail past the mark");
        assert_eq!(wal.next_index(), 8);
        wal.synced_mark().raise(entry_id(7)).unwrap();
        damage_record(dir.path(), &wal, 7, DAMAGE[0].1);
        drop(wal);
        faults::flip_byte_of_synced_mark(dir.path()).unwrap();
        assert_eq!(faults::synced_mark(dir.path()).unwrap(), None);
        let wal = Wal::open(dir.path(), None, 1 << 20).expect("no mark, a torn tail");
        assert_eq!(wal.next_index(), 7);
    }

    /// A refused `before_cut` (the caller could not record the damage) leaves every file as
    /// it was.
    #[test]
    fn damage_is_not_cut_before_the_caller_recorded_it() {
        let dir = tempfile::tempdir().unwrap();
        let mut wal = Wal::open(dir.path(), None, 64).unwrap();
        fill(&mut wal, 1, 20);
        drop(wal);
        let before = faults::segment_sizes(dir.path()).unwrap();
        let file = OpenOptions::new()
            .write(true)
            .open(segment_path(dir.path(), 1))
            .unwrap();
        file.write_all_at(b"X", 10).unwrap();
        let refused = Wal::open_repairing(dir.path(), None, 64, |_| Err(io::Error::other("no")));
        assert!(refused.is_err());
        assert_eq!(faults::segment_sizes(dir.path()).unwrap(), before);
    }

    #[test]
    fn truncate_removes_the_tail_durably() {
        let dir = tempfile::tempdir().unwrap();
        let mut wal = Wal::open(dir.path(), None, 64).unwrap();
        fill(&mut wal, 0, 20);
        wal.truncate_from(7).unwrap();
        assert_eq!(wal.next_index(), 7);
        assert_eq!(wal.read(7).unwrap(), None);
        fill(&mut wal, 7, 9);
        drop(wal);
        let wal = Wal::open(dir.path(), None, 64).unwrap();
        assert_eq!(wal.next_index(), 10);
        assert_eq!(wal.read(6).unwrap(), Some(payload(6)));
        assert_eq!(wal.read(8).unwrap(), Some(payload(8)));
    }

    #[test]
    fn purge_deletes_whole_segments_and_restart_honours_it() {
        let dir = tempfile::tempdir().unwrap();
        let mut wal = Wal::open(dir.path(), None, 64).unwrap();
        fill(&mut wal, 0, 30);
        let before = wal.segment_count();
        wal.purge_upto(20).unwrap();
        assert!(wal.segment_count() < before);
        assert_eq!(wal.read(20).unwrap(), None);
        assert_eq!(wal.read(21).unwrap(), Some(payload(21)));
        drop(wal);
        let wal = Wal::open(dir.path(), Some(20), 64).unwrap();
        assert_eq!(wal.first_index(), 21);
        assert_eq!(wal.read(20).unwrap(), None);
        assert_eq!(wal.next_index(), 31);
    }

    #[test]
    fn purge_past_the_end_continues_after_the_purge_point() {
        let dir = tempfile::tempdir().unwrap();
        let mut wal = Wal::open(dir.path(), None, 1 << 20).unwrap();
        fill(&mut wal, 0, 5);
        wal.purge_upto(100).unwrap();
        assert!(wal.is_empty());
        assert_eq!(wal.next_index(), 101);
        fill(&mut wal, 101, 102);
        drop(wal);
        let wal = Wal::open(dir.path(), Some(100), 1 << 20).unwrap();
        assert_eq!(wal.read(102).unwrap(), Some(payload(102)));
    }
}
