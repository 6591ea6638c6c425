//! A small record kept where a rollback shows: two checksummed copies in a file of its own.
//! The log keeps three such records: the vote ([`VOTE`]), the repair under way ([`REPAIR`]) and
//! a failed `fdatasync` ([`FAILED_SYNC`]).
//!
//! Why not only sled: Raft's safety rests on a replica never granting two votes in one term,
//! so the vote must never come back older than it was made durable; and a damaged replica
//! must never forget that it is repairing, or it votes with a log that lacks entries it
//! acknowledged. sled's recovery drops a damaged tail of its own log silently, so a record
//! kept only there could come back older after a bad sector. These files are read and checked
//! by our own code, and they are the authority. sled keeps a copy of the vote too, written
//! after the file, which is what a v0.1.0 build (that knows no file) reads when rolled back
//! onto the directory.
//!
//! Layout: two copies, each in a 4 KiB block of its own (so no single sector write touches
//! both), each `[sequence: u64 LE][record length: u32 LE][record (bincode)][crc32 of what
//! precedes]`. A save writes the first copy and `fdatasync`s it, then the second and
//! `fdatasync`s it, with the next sequence number. So a crash leaves at most one copy torn,
//! and the other is either the new record or the one before it, whose save never returned; rot
//! in one copy leaves the other, equal, copy. Open takes the valid copy with the higher
//! sequence, and writes it to both again if the other failed its checks or holds an older
//! record, so that rot accumulating over several restarts never finds both damaged, nor an
//! older record behind the one in use. A file whose copies both fail their checks (two faults
//! between two starts) is damage no crash leaves: the replica refuses to start and says so.
//! The file is created whole (written to a temporary name, synced, renamed), so a crash while
//! creating it leaves no file, never a damaged one.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use serde::de::DeserializeOwned;
use serde::Serialize;

use super::files::create_durably;
use super::write_faults::{attempt, Operation};
use crate::log::{decode, encode};

/// Which record a file keeps: its name in the log's directory (without a `.wal` suffix, so the
/// WAL, and v0.1.0's, passes over it), and what a replica that finds both copies damaged must
/// be told.
pub struct Record {
    pub file_name: &'static str,
    both_damaged: &'static str,
}

/// The vote.
pub const VOTE: Record = Record {
    file_name: "vote",
    both_damaged: "this replica cannot know what it voted, and must not vote again",
};

/// The repair under way (see `log_store::Repair`).
pub const REPAIR: Record = Record {
    file_name: "repair",
    both_damaged: "this replica cannot know whether its log is whole, and must not vote with it",
};

/// A failed `fdatasync` of the log (see `wal::FailedSync`).
pub const FAILED_SYNC: Record = Record {
    file_name: "failed-sync",
    both_damaged: "this replica cannot know whether an fdatasync of its log failed, and so \
                   which of its records are on disk",
};

/// Where each copy starts: a block of its own.
const COPY_AT: [u64; 2] = [0, 4096];

/// Bytes of a copy's header: sequence and length.
const HEADER_BYTES: usize = 12;

/// The longest encoded record: a copy fills at most its block.
const RECORD_BYTES_MAX: usize = COPY_AT[1] as usize - HEADER_BYTES - 4;

/// One record's file, open for saving.
pub struct TwoCopies<T> {
    dir: PathBuf,
    record: &'static Record,
    /// `None` until the first save in a directory that had no file.
    file: Option<File>,
    /// The sequence number of the copies on disk.
    sequence: u64,
    /// The value on disk.
    value: Option<T>,
}

/// One copy as written: sequence, then the record.
fn encode_copy(sequence: u64, record: &[u8]) -> Vec<u8> {
    let mut bytes = Vec::with_capacity(HEADER_BYTES + record.len() + 4);
    bytes.extend_from_slice(&sequence.to_le_bytes());
    bytes.extend_from_slice(&(record.len() as u32).to_le_bytes());
    bytes.extend_from_slice(record);
    let crc = crc32fast::hash(&bytes);
    bytes.extend_from_slice(&crc.to_le_bytes());
    bytes
}

/// The copy at `at` in `file`, if it is whole and its checksum matches.
fn read_copy<T: DeserializeOwned>(file: &File, at: u64) -> io::Result<Option<(u64, T)>> {
    let mut header = [0u8; HEADER_BYTES];
    match file.read_exact_at(&mut header, at) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(None),
        Err(e) => return Err(e),
    }
    let sequence = u64::from_le_bytes(header[..8].try_into().unwrap());
    let len = u32::from_le_bytes(header[8..].try_into().unwrap()) as usize;
    if len == 0 || len > RECORD_BYTES_MAX {
        return Ok(None);
    }
    let mut rest = vec![0u8; len + 4];
    match file.read_exact_at(&mut rest, at + HEADER_BYTES as u64) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(None),
        Err(e) => return Err(e),
    }
    let (record, crc) = rest.split_at(len);
    let mut hasher = crc32fast::Hasher::new();
    hasher.update(&header);
    hasher.update(record);
    if hasher.finalize().to_le_bytes() != crc {
        return Ok(None);
    }
    Ok(decode(record, RECORD_BYTES_MAX as u64)
        .ok()
        .map(|value| (sequence, value)))
}

/// What [`check`] found of a record's two copies.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CopiesFound {
    /// No file: a new directory, or one an older build made.
    Missing,
    /// Both copies whole (one may hold the record before the other's, as a save cut short by
    /// a crash leaves it: the next start writes the newer to both).
    Whole,
    /// One copy fails its checks: rot, or a save torn by a crash. The next start writes the
    /// other to both again.
    OneDamaged,
    /// Both fail their checks: no crash leaves that, and the replica refuses to start.
    BothDamaged,
}

/// Reads `record`'s file in `dir` and reports its copies, changing nothing.
pub fn check<T: DeserializeOwned>(dir: &Path, record: &Record) -> io::Result<CopiesFound> {
    let file = match File::open(dir.join(record.file_name)) {
        Ok(file) => file,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(CopiesFound::Missing),
        Err(e) => return Err(e),
    };
    let whole = [
        read_copy::<T>(&file, COPY_AT[0])?.is_some(),
        read_copy::<T>(&file, COPY_AT[1])?.is_some(),
    ];
    Ok(match whole {
        [true, true] => CopiesFound::Whole,
        [false, false] => CopiesFound::BothDamaged,
        _ => CopiesFound::OneDamaged,
    })
}

/// The value `record`'s file in `dir` holds (the valid copy saved last), read without changing
/// anything: `None` without a file or with both copies damaged, which [`check`] tells apart.
pub fn read_only<T: DeserializeOwned>(dir: &Path, record: &Record) -> io::Result<Option<T>> {
    let file = match File::open(dir.join(record.file_name)) {
        Ok(file) => file,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e),
    };
    let copies = [
        read_copy::<T>(&file, COPY_AT[0])?,
        read_copy::<T>(&file, COPY_AT[1])?,
    ];
    Ok(copies
        .into_iter()
        .flatten()
        .max_by_key(|(sequence, _)| *sequence)
        .map(|(_, value)| value))
}

impl<T: Serialize + DeserializeOwned + Clone + PartialEq> TwoCopies<T> {
    /// Opens `record`'s file in `dir`. Without one (a new directory, or one an older build
    /// made) it holds no value, and the file is created at the first save. Fails with
    /// `InvalidData`, naming the file, if both copies are damaged.
    pub fn open(dir: &Path, record: &'static Record) -> io::Result<TwoCopies<T>> {
        let path = dir.join(record.file_name);
        let mut two_copies = TwoCopies {
            dir: dir.to_path_buf(),
            record,
            file: None,
            sequence: 0,
            value: None,
        };
        let file = match OpenOptions::new().read(true).write(true).open(&path) {
            Ok(file) => file,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(two_copies),
            Err(e) => return Err(e),
        };
        let copies: [Option<(u64, T)>; 2] =
            [read_copy(&file, COPY_AT[0])?, read_copy(&file, COPY_AT[1])?];
        let Some((sequence, value)) = copies
            .iter()
            .flatten()
            .max_by_key(|(sequence, _)| *sequence)
            .cloned()
        else {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!(
                    "both copies of the {} in {} are damaged, which no crash leaves: {}. \
                     Remove it from the cluster and add it back with an empty data directory",
                    record.file_name,
                    path.display(),
                    record.both_damaged,
                ),
            ));
        };
        two_copies.file = Some(file);
        two_copies.sequence = sequence;
        two_copies.value = Some(value.clone());
        if copies[0] != copies[1] {
            // Mended at once, so that rot in the other copy before the next save finds
            // neither both damaged nor, behind it, the record before this one (which a save
            // cut short by a crash leaves in the second copy, and which this replica may act
            // on from now on).
            if copies.iter().any(Option::is_none) {
                tracing::warn!(
                    file = %path.display(),
                    "one copy is damaged; the other's {} is written to both again",
                    record.file_name
                );
            }
            two_copies.save(&value)?;
        }
        Ok(two_copies)
    }

    /// The value on disk.
    pub fn value(&self) -> Option<&T> {
        self.value.as_ref()
    }

    /// Makes `value` durable in both copies, one after the other, before returning. The first
    /// save writes the whole file under a temporary name, syncs it and renames it into place,
    /// so that a crash while creating it leaves no file rather than a damaged one. A value
    /// that does not fit a copy's block is refused with `InvalidInput`, and nothing changes.
    pub fn save(&mut self, value: &T) -> io::Result<()> {
        let record = encode(value);
        if record.len() > RECORD_BYTES_MAX {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "a {} of {} bytes does not fit its file's {RECORD_BYTES_MAX}-byte copies",
                    self.record.file_name,
                    record.len()
                ),
            ));
        }
        let copy = encode_copy(self.sequence + 1, &record);
        match &self.file {
            Some(file) => {
                let path = self.dir.join(self.record.file_name);
                for at in COPY_AT {
                    attempt(&path, Operation::Write, || file.write_all_at(&copy, at))?;
                    attempt(&path, Operation::Sync, || file.sync_data())?;
                }
            }
            None => {
                let file = create_durably(&self.dir, self.record.file_name, |file| {
                    COPY_AT
                        .iter()
                        .try_for_each(|&at| file.write_all_at(&copy, at))
                })?;
                self.file = Some(file);
            }
        }
        self.sequence += 1;
        self.value = Some(value.clone());
        Ok(())
    }
}

/// Rot in a stopped replica's record files, for the tests that inject it.
pub mod faults {
    use std::io;
    use std::path::Path;

    use super::{Record, COPY_AT};
    use crate::raft::storage::files::faults::invert_byte;

    /// Flips byte `at` (modulo the copy's length) of copy `copy` (0 or 1) of `record`'s file
    /// in the log directory `dir`, if there is one; returns whether there was.
    pub fn flip_copy_byte(dir: &Path, record: &Record, copy: usize, at: u64) -> io::Result<bool> {
        let path = dir.join(record.file_name);
        let Ok(bytes) = std::fs::read(&path) else {
            return Ok(false);
        };
        let start = COPY_AT[copy] as usize;
        let Some(header) = bytes.get(start..start + super::HEADER_BYTES) else {
            return Ok(false);
        };
        let len = u32::from_le_bytes(header[8..].try_into().unwrap()) as u64;
        let copy_bytes = super::HEADER_BYTES as u64 + len.min(super::RECORD_BYTES_MAX as u64) + 4;
        invert_byte(&path, COPY_AT[copy] + at % copy_bytes)?;
        Ok(true)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::raft::types::Vote;
    use openraft::Vote as RaftVote;

    fn open(dir: &Path) -> io::Result<Option<Vote>> {
        TwoCopies::open(dir, &VOTE).map(|file| file.value().copied())
    }

    /// A vote file holding `vote`, saved once.
    fn saved(dir: &Path, vote: Vote) -> TwoCopies<Vote> {
        let mut file = TwoCopies::open(dir, &VOTE).unwrap();
        file.save(&vote).unwrap();
        file
    }

    fn flip(dir: &Path, copy: usize, at: u64) {
        assert!(faults::flip_copy_byte(dir, &VOTE, copy, at).unwrap());
    }

    #[test]
    fn a_file_is_made_whole_at_the_first_save_and_keeps_the_last() {
        let dir = tempfile::tempdir().unwrap();
        let mut file = TwoCopies::<Vote>::open(dir.path(), &VOTE).unwrap();
        assert_eq!(file.value(), None);
        assert!(!dir.path().join(VOTE.file_name).exists());
        file.save(&RaftVote::new(4, 2)).unwrap();
        assert!(!dir.path().join(format!("{}.tmp", VOTE.file_name)).exists());
        file.save(&RaftVote::new_committed(4, 2)).unwrap();
        drop(file);
        assert_eq!(
            open(dir.path()).unwrap(),
            Some(RaftVote::new_committed(4, 2))
        );
    }

    /// Rot in either copy, anywhere in it, leaves the other: the vote saved last, which the open
    /// writes to both again. Both copies damaged between two opens is refused.
    #[test]
    fn one_damaged_copy_is_survived_and_two_are_refused() {
        let last = RaftVote::new_committed(7, 3);
        let copy_bytes = encode_copy(2, &encode(&last)).len() as u64;
        for copy in 0..2 {
            for at in 0..copy_bytes {
                let dir = tempfile::tempdir().unwrap();
                let mut file = saved(dir.path(), RaftVote::new(6, 1));
                file.save(&last).unwrap();
                drop(file);
                flip(dir.path(), copy, at);
                let case = format!("copy {copy} byte {at}");
                let vote = open(dir.path()).unwrap_or_else(|e| panic!("{case}: {e}"));
                assert_eq!(vote, Some(last), "{case}");
                // The open mended it: rot in the other copy now leaves this one.
                flip(dir.path(), 1 - copy, at);
                let vote = open(dir.path()).unwrap_or_else(|e| panic!("{case}, mended: {e}"));
                assert_eq!(vote, Some(last), "{case}, mended");
                // Both damaged between two opens is refused.
                flip(dir.path(), 0, at);
                flip(dir.path(), 1, at);
                let refused = open(dir.path()).expect_err("both copies damaged");
                assert_eq!(refused.kind(), io::ErrorKind::InvalidData, "{case}");
                assert!(refused.to_string().contains("what it voted"), "{refused}");
            }
        }
    }

    /// A save cut short after its first copy leaves the new vote there and the previous one in
    /// the second: the newer is used, and written to both at once.
    #[test]
    fn a_save_cut_after_its_first_copy_reads_as_the_newer_vote() {
        let dir = tempfile::tempdir().unwrap();
        let file = saved(dir.path(), RaftVote::new(1, 1));
        let newer = RaftVote::new(2, 2);
        let copy = encode_copy(file.sequence + 1, &encode(&newer));
        file.file
            .as_ref()
            .unwrap()
            .write_all_at(&copy, COPY_AT[0])
            .unwrap();
        drop(file);
        let file = TwoCopies::<Vote>::open(dir.path(), &VOTE).unwrap();
        assert_eq!(file.value(), Some(&newer));
        drop(file);
        // The open wrote the newer vote to the second copy too: rot in the first now finds it
        // there, not the vote before.
        flip(dir.path(), 0, 3);
        let mut file = TwoCopies::<Vote>::open(dir.path(), &VOTE).unwrap();
        assert_eq!(file.value(), Some(&newer));
        file.save(&RaftVote::new(3, 3)).unwrap();
        drop(file);
        assert_eq!(open(dir.path()).unwrap(), Some(RaftVote::new(3, 3)));
    }

    /// A record of variable length (the repair's names a file) keeps to its block: the
    /// longest that fits is saved and read back, one byte longer is refused and changes
    /// nothing.
    #[test]
    fn a_record_fills_at_most_its_block() {
        let dir = tempfile::tempdir().unwrap();
        let mut file = TwoCopies::<String>::open(dir.path(), &REPAIR).unwrap();
        // bincode's string: an 8-byte length, then the bytes.
        let longest = "x".repeat(RECORD_BYTES_MAX - 8);
        file.save(&longest).unwrap();
        let refused = file.save(&format!("{longest}x")).expect_err("too long");
        assert_eq!(refused.kind(), io::ErrorKind::InvalidInput);
        drop(file);
        let file = TwoCopies::<String>::open(dir.path(), &REPAIR).unwrap();
        assert_eq!(file.value(), Some(&longest));
    }
}
