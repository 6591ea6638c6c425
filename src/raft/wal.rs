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
//!   the [`Syncer`], whose `fdatasync` precedes the acknowledgement.
//! * Rotation `fdatasync`s the full segment before the next one is created, and `fsync`s the
//!   directory after creating or deleting a segment, so only the last segment can ever hold a
//!   torn record.
//! * `truncate_from` cuts the file and `fdatasync`s it before returning.
//! * Recovery scans every segment, verifies each record's checksum, and cuts the last segment
//!   at the first torn or corrupt record: a short record, a checksum that does not match, a
//!   length out of bounds, and a zero length (a zero-filled tail, which some file systems
//!   leave after a power loss, and whose all-zero header matches its empty payload's CRC). A bad record in any *earlier* segment is corruption of
//!   durable data and is reported, never skipped.

use std::collections::BTreeMap;
use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// Bytes of a record header: payload length and checksum.
const RECORD_HEADER_BYTES: usize = 8;

/// A record larger than this is treated as corrupt on recovery: the largest legitimate record
/// is one proposer batch (a few MiB), so a bigger length prefix is a torn or garbage header.
pub const RECORD_BYTES_MAX: usize = 256 << 20;

const SEGMENT_SUFFIX: &str = "wal";

/// Where one record sits in its segment.
#[derive(Clone, Copy, Debug)]
struct RecordPos {
    pos: u64,
    len: u32,
}

struct Segment {
    first_index: u64,
    file: Arc<File>,
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

/// The segmented log. Not thread-safe by itself; the log store wraps it in a mutex.
pub struct Wal {
    dir: PathBuf,
    /// Keyed by first index. Never empty after `open`: the last one is the active segment.
    segments: BTreeMap<u64, Segment>,
    /// Records below this index are purged, even if their segment still exists.
    first_index: u64,
    segment_bytes_max: u64,
}

fn segment_path(dir: &Path, first_index: u64) -> PathBuf {
    dir.join(format!("{first_index:020}.{SEGMENT_SUFFIX}"))
}

fn sync_dir(dir: &Path) -> io::Result<()> {
    File::open(dir)?.sync_all()
}

fn corrupt(message: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, message)
}

/// Scans one segment's bytes and returns its records, plus the length of the valid prefix.
fn scan_records(bytes: &[u8]) -> (Vec<RecordPos>, u64) {
    let mut records = Vec::new();
    let mut pos = 0usize;
    while bytes.len() - pos >= RECORD_HEADER_BYTES {
        let len = u32::from_le_bytes(bytes[pos..pos + 4].try_into().unwrap()) as usize;
        let crc = u32::from_le_bytes(bytes[pos + 4..pos + 8].try_into().unwrap());
        let start = pos + RECORD_HEADER_BYTES;
        // No record is empty (each holds an encoded entry), so a zero length is a zero-filled
        // tail, whose header would otherwise pass: the CRC32 of nothing is 0. An all-0xff
        // header fails the length bound.
        if len == 0 || len > RECORD_BYTES_MAX || bytes.len() - start < len {
            break;
        }
        if crc32fast::hash(&bytes[start..start + len]) != crc {
            break;
        }
        records.push(RecordPos {
            pos: pos as u64,
            len: len as u32,
        });
        pos = start + len;
    }
    (records, pos as u64)
}

impl Wal {
    /// Opens (or creates) the log in `dir`, recovering from a crash at any point.
    ///
    /// `purged_upto` is the last index the caller durably recorded as purged: records at or
    /// below it are dropped, and so are segments holding nothing else.
    pub fn open(dir: &Path, purged_upto: Option<u64>, segment_bytes_max: u64) -> io::Result<Wal> {
        std::fs::create_dir_all(dir)?;
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

        let first_index = purged_upto.map_or(0, |p| p + 1);
        let mut wal = Wal {
            dir: dir.to_path_buf(),
            segments: BTreeMap::new(),
            first_index,
            segment_bytes_max,
        };
        let count = names.len();
        for (i, &name) in names.iter().enumerate() {
            let is_last = i + 1 == count;
            let path = segment_path(dir, name);
            let bytes = std::fs::read(&path)?;
            let (records, valid_len) = scan_records(&bytes);
            let file = OpenOptions::new().read(true).write(true).open(&path)?;
            if valid_len < bytes.len() as u64 {
                if !is_last {
                    return Err(corrupt(format!(
                        "segment {} is damaged at byte {valid_len} but is not the last segment",
                        path.display()
                    )));
                }
                tracing::warn!(
                    segment = %path.display(),
                    kept_bytes = valid_len,
                    dropped_bytes = bytes.len() as u64 - valid_len,
                    "cutting a torn tail left by a crash"
                );
                file.set_len(valid_len)?;
                file.sync_data()?;
            }
            wal.segments.insert(
                name,
                Segment {
                    first_index: name,
                    file: Arc::new(file),
                    records,
                    len: valid_len,
                },
            );
        }
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
        Ok(wal)
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
    pub fn active_file(&self) -> Arc<File> {
        self.segments
            .values()
            .next_back()
            .expect("the wal always has an active segment")
            .file
            .clone()
    }

    fn create_segment(&mut self, first_index: u64) -> io::Result<()> {
        let path = segment_path(&self.dir, first_index);
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&path)?;
        sync_dir(&self.dir)?;
        self.segments.insert(
            first_index,
            Segment {
                first_index,
                file: Arc::new(file),
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
        active.file.write_all_at(buffer, active.len)?;
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
        self.active().file.sync_data()?;
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
            return self.reset_at(index);
        }
        let keep = (index - active.first_index) as usize;
        let new_len = active.records.get(keep).map_or(active.len, |r| r.pos);
        active.records.truncate(keep);
        active.len = new_len;
        active.file.set_len(new_len)?;
        active.file.sync_data()
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

    /// Bytes on disk across all segments.
    pub fn disk_bytes(&self) -> u64 {
        self.segments.values().map(|s| s.len).sum()
    }

    /// Number of segment files.
    pub fn segment_count(&self) -> usize {
        self.segments.len()
    }
}

/// The faults a crash leaves in a stopped replica's log, for the tools and tests that inject
/// them: the storage owns its fault model, so that each injector does not re-derive the
/// segment layout. None of these is called by a running replica.
pub mod faults {
    use std::collections::BTreeMap;
    use std::fs::OpenOptions;
    use std::io;
    use std::path::{Path, PathBuf};

    use super::{Wal, SEGMENT_SUFFIX};

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
        let sizes = segment_sizes(dir)?;
        let total: u64 = sizes.values().sum();
        if total == 0 {
            return Ok(None);
        }
        let mut left = at % total;
        for (name, size) in sizes {
            if left < size {
                use std::os::unix::fs::FileExt;
                let file = OpenOptions::new()
                    .read(true)
                    .write(true)
                    .open(dir.join(&name))?;
                let mut byte = [0u8];
                file.read_exact_at(&mut byte, left)?;
                file.write_all_at(&[!byte[0]], left)?;
                return Ok(Some((name, left)));
            }
            left -= size;
        }
        unreachable!("the offset is below the total size")
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

    fn payload(i: u64) -> Vec<u8> {
        format!("record-{i}").into_bytes()
    }

    fn fill(wal: &mut Wal, from: u64, to: u64) {
        for i in from..=to {
            wal.append(i, &[payload(i)]).unwrap();
        }
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
