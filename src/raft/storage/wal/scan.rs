//! The scan of every segment at open, what it finds damaged and how the log is repaired
//! before it ([`Wal::open_repairing`]), `ctrlog check`'s reading of a stopped log ([`check`]),
//! and the scrubber's verification of synced records while the log is open.

use std::collections::BTreeMap;
use std::fs::{File, OpenOptions};
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::segment::{
    corrupt, last_record_after, record_at, scan_records, segment_path, RecordPos, Segment,
    SegmentFile, RECORD_HEADER_BYTES, SEGMENT_SUFFIX,
};
use super::synced_mark::{FailedSync, MarkFound, SyncedMark};
use super::Wal;
use crate::raft::storage::bad_sectors::{self, Salvaged};
use crate::raft::storage::files::sync_dir;
use crate::raft::storage::two_copies::{self, FAILED_SYNC};
use crate::raft::types::LogId;

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
pub(super) fn describe_damage(
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
pub(super) fn keep_damaged(dir: &Path, segments: &[ScannedSegment]) -> io::Result<PathBuf> {
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
pub(super) struct ScannedSegment {
    pub(super) first_index: u64,
    pub(super) path: PathBuf,
    pub(super) records: Vec<RecordPos>,
    pub(super) valid_len: u64,
    /// Where the first sector that could not be read starts (EIO), if one could not.
    pub(super) unreadable_from: Option<u64>,
    /// The last valid record after the first bad one, when the segment has a bad record.
    pub(super) last_after_damage: Option<RecordPos>,
    pub(super) damaged: bool,
}

/// What reading every segment of the log in `dir` found, before anything is changed.
pub(super) struct Scan {
    /// Every segment, oldest first.
    pub(super) scanned: Vec<ScannedSegment>,
    /// The segment where damage starts, if the log is damaged (the module docs).
    pub(super) damaged_at: Option<usize>,
}

/// Reads every segment in `dir` whole, as far as it reads, and finds where damage starts,
/// given what the synced mark says (`synced_end`: one past the index it holds). Changes
/// nothing: [`Wal::open_repairing`] acts on what it finds, and [`check`] reports it.
pub(super) fn scan(dir: &Path, synced_end: u64) -> io::Result<Scan> {
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
    pub(super) file: Arc<SegmentFile>,
    /// The index of the first listed record.
    pub(super) first: u64,
    pub(super) records: Vec<RecordPos>,
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
    pub(super) fn read_record(&self, n: usize) -> io::Result<bool> {
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
}
