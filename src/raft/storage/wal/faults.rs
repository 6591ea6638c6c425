//! The faults a crash or a rotting disk leaves in a replica's log, for the tools and tests
//! that inject them: the storage owns its fault model, so that each injector does not
//! re-derive the segment layout. Each wants the replica stopped but a bad sector, which may go
//! bad under a running one; none is called by a replica itself.

use std::collections::BTreeMap;
use std::fs::OpenOptions;
use std::io;
use std::path::{Path, PathBuf};

use crate::raft::storage::files::faults::invert_byte;

use super::segment::{scan_records, RecordPos, RECORD_HEADER_BYTES, SEGMENT_SUFFIX};
use super::synced_mark::{MarkFound, SyncedMark, SYNCED_MARK_FILE};
use super::Wal;

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
    let (records, _) = scan_records(&std::fs::read(&last)?);
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
