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
use std::fs::OpenOptions;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::bad_sectors;
use super::files::sync_dir;
use super::write_faults::{attempt, Operation};

pub mod faults;
mod scan;
mod segment;
mod synced_mark;

pub use scan::{
    check, new_damaged_folder, BadRecord, Damage, RecordsToVerify, WalCheck, DAMAGED_DIR,
};
use segment::{corrupt, segment_path, RecordPos, Segment, RECORD_HEADER_BYTES};
pub use segment::{SegmentFile, RECORD_BYTES_MAX};
pub use synced_mark::{FailedSync, SyncedMark, SYNCED_MARK_FILE};

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

impl Wal {
    /// Opens (or creates) the log in `dir`, recovering from a crash at any point. A damaged log
    /// (see the module docs) is refused, with an error that says where the damage is.
    ///
    /// `purged_upto` is the last index the caller durably recorded as purged: records at or
    /// below it are dropped, and so are segments holding nothing else.
    pub fn open(dir: &Path, purged_upto: Option<u64>, segment_bytes_max: u64) -> io::Result<Wal> {
        let refuse = |damage: &Damage| Err(corrupt(damage.to_string()));
        Self::open_repairing(dir, purged_upto, segment_bytes_max, refuse).map(|(wal, _)| wal)
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs::File;
    use std::os::unix::fs::FileExt;

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
