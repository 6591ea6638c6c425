//! The segment files and their records: a record is `[payload length: u32 LE][crc32 of
//! payload: u32 LE][payload]`, for consecutive indexes from the segment's name on. What a
//! valid record is, read from bytes, is decided here alone, for the open-time scan, the reads
//! and the scrubber alike.

use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::synced_mark::SyncedMark;
use crate::raft::storage::bad_sectors;
use crate::raft::storage::write_faults::{attempt, Operation};

/// Bytes of a record header: payload length and checksum.
pub(super) const RECORD_HEADER_BYTES: usize = 8;

/// A record larger than this is treated as corrupt on recovery: the largest legitimate record
/// is one proposer batch (a few MiB), so a bigger length prefix is a torn or garbage header.
pub const RECORD_BYTES_MAX: usize = 256 << 20;

pub(super) const SEGMENT_SUFFIX: &str = "wal";

/// Where one record sits in its segment.
#[derive(Clone, Copy, Debug)]
pub(super) struct RecordPos {
    pub(super) pos: u64,
    pub(super) len: u32,
}

/// A segment's open file and its path, which names it in errors and its sectors for
/// [`bad_sectors`].
pub struct SegmentFile {
    pub(super) file: File,
    pub(super) path: PathBuf,
    /// The log's mark, through which every `fdatasync` of the log runs ([`SyncedMark::sync`]).
    pub(super) mark: Arc<SyncedMark>,
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
    pub(super) fn write_at(&self, bytes: &[u8], offset: u64) -> io::Result<()> {
        attempt(&self.path, Operation::Write, || {
            self.file.write_all_at(bytes, offset)
        })
    }

    /// Reads exactly `buf.len()` bytes at `offset`, failing on a bad sector.
    pub(super) fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        bad_sectors::read_exact_at(&self.file, &self.path, buf, offset)
    }

    pub fn path(&self) -> &Path {
        &self.path
    }
}

pub(super) struct Segment {
    pub(super) first_index: u64,
    pub(super) file: Arc<SegmentFile>,
    pub(super) records: Vec<RecordPos>,
    /// Bytes in use; the next record is written here.
    pub(super) len: u64,
}

impl Segment {
    /// One past the last index this segment holds.
    pub(super) fn end_index(&self) -> u64 {
        self.first_index + self.records.len() as u64
    }
}

pub(super) fn segment_path(dir: &Path, first_index: u64) -> PathBuf {
    dir.join(format!("{first_index:020}.{SEGMENT_SUFFIX}"))
}

pub(super) fn corrupt(message: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, message)
}

/// The payload length of a valid record at byte `pos`, if one starts there.
pub(super) fn record_at(bytes: &[u8], pos: usize) -> Option<usize> {
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
pub(super) fn after_declared_length(bytes: &[u8], pos: usize) -> Option<usize> {
    let header = bytes.get(pos..pos + RECORD_HEADER_BYTES)?;
    let len = u32::from_le_bytes(header[..4].try_into().unwrap()) as usize;
    let next = pos + RECORD_HEADER_BYTES + len;
    (len > 0 && len <= RECORD_BYTES_MAX && next <= bytes.len()).then_some(next)
}

/// The last valid record after the bad one at byte `damaged`, if any valid record follows it:
/// first where the bad record's own length points, else at any later byte (a rotten length
/// field hides where the next record starts). Records found are walked to the end, past any
/// further damage the same way.
pub(super) fn last_record_after(bytes: &[u8], damaged: usize) -> Option<RecordPos> {
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

/// Scans one segment's bytes and returns its records, plus the length of the valid prefix.
pub(super) fn scan_records(bytes: &[u8]) -> (Vec<RecordPos>, u64) {
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
