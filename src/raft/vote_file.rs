//! The vote, kept where a rollback shows: two checksummed copies in a file of its own.
//!
//! Why not only sled: Raft's safety rests on a replica never granting two votes in one term,
//! so the vote must never come back older than it was made durable. sled's recovery drops a
//! damaged tail of its own log silently, so a vote kept only there could return older after a
//! bad sector, and the replica vote again in a term it had voted in: two leaders. This file is
//! read and checked by our own code, and it is the authority; sled keeps a copy of the vote
//! too, written after the file, which is what a v0.1.0 build (that knows no file) reads when
//! rolled back onto the directory.
//!
//! Layout: two copies, each in a 4 KiB block of its own (so no single sector write touches
//! both), each `[sequence: u64 LE][vote length: u32 LE][vote (bincode)][crc32 of what precedes]`.
//! A save writes the first copy and `fdatasync`s it, then the second and `fdatasync`s it, with
//! the next sequence number. So a crash leaves at most one copy torn, and the other is either
//! the new vote or the one before it, whose save never returned; rot in one copy leaves the
//! other, equal, copy. Open takes the valid copy with the higher sequence, and writes it to
//! both again if the other failed its checks or holds an older vote, so that rot accumulating
//! over several restarts never finds both damaged, nor an older vote behind the one in use. A file whose copies both fail their checks (two faults between
//! two starts) is damage no crash leaves: the replica refuses to start and says so.
//! The file is created whole (written to a temporary name, synced, renamed), so a crash while
//! creating it leaves no file, never a damaged one.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use super::types::Vote;
use super::wal::create_durably;
use crate::log::{decode, encode};

/// The file's name in the log's directory. Without a `.wal` suffix, so the WAL (and v0.1.0's)
/// passes over it.
pub const VOTE_FILE: &str = "vote";

/// Where each copy starts: a block of its own.
const COPY_AT: [u64; 2] = [0, 4096];

/// Bytes of a copy's header: sequence and length.
const HEADER_BYTES: usize = 12;

/// An encoded vote is 17 bytes; anything longer than this is not one.
const VOTE_BYTES_MAX: usize = 64;

/// The vote file of one replica, open for saving.
pub struct VoteFile {
    dir: PathBuf,
    /// `None` until the first vote is saved in a directory that had no file.
    file: Option<File>,
    /// The sequence number of the copies on disk.
    sequence: u64,
    /// The vote on disk.
    vote: Option<Vote>,
}

/// One copy as written: sequence, then the vote.
fn encode_copy(sequence: u64, vote: &Vote) -> Vec<u8> {
    let vote = encode(vote);
    let mut bytes = Vec::with_capacity(HEADER_BYTES + vote.len() + 4);
    bytes.extend_from_slice(&sequence.to_le_bytes());
    bytes.extend_from_slice(&(vote.len() as u32).to_le_bytes());
    bytes.extend_from_slice(&vote);
    let crc = crc32fast::hash(&bytes);
    bytes.extend_from_slice(&crc.to_le_bytes());
    bytes
}

/// The copy at `at` in `file`, if it is whole and its checksum matches.
fn read_copy(file: &File, at: u64) -> io::Result<Option<(u64, Vote)>> {
    let mut header = [0u8; HEADER_BYTES];
    match file.read_exact_at(&mut header, at) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(None),
        Err(e) => return Err(e),
    }
    let sequence = u64::from_le_bytes(header[..8].try_into().unwrap());
    let len = u32::from_le_bytes(header[8..].try_into().unwrap()) as usize;
    if len == 0 || len > VOTE_BYTES_MAX {
        return Ok(None);
    }
    let mut rest = vec![0u8; len + 4];
    match file.read_exact_at(&mut rest, at + HEADER_BYTES as u64) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(None),
        Err(e) => return Err(e),
    }
    let (vote, crc) = rest.split_at(len);
    let mut hasher = crc32fast::Hasher::new();
    hasher.update(&header);
    hasher.update(vote);
    if hasher.finalize().to_le_bytes() != crc {
        return Ok(None);
    }
    Ok(decode(vote, VOTE_BYTES_MAX as u64)
        .ok()
        .map(|vote| (sequence, vote)))
}

impl VoteFile {
    /// Opens the vote file in `dir`. Without one (a new directory, or one an older build
    /// made) it holds no vote, and the file is created at the first save. Fails with
    /// `InvalidData`, naming the file, if both copies are damaged.
    pub fn open(dir: &Path) -> io::Result<VoteFile> {
        let path = dir.join(VOTE_FILE);
        let file = match OpenOptions::new().read(true).write(true).open(&path) {
            Ok(file) => file,
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                return Ok(VoteFile {
                    dir: dir.to_path_buf(),
                    file: None,
                    sequence: 0,
                    vote: None,
                });
            }
            Err(e) => return Err(e),
        };
        let copies = [read_copy(&file, COPY_AT[0])?, read_copy(&file, COPY_AT[1])?];
        let newest = copies
            .iter()
            .flatten()
            .max_by_key(|(sequence, _)| *sequence);
        let Some(&(sequence, vote)) = newest else {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!(
                    "both copies of the vote in {} are damaged, which no crash leaves: this \
                     replica cannot know what it voted, and must not vote again. Remove it from \
                     the cluster and add it back with an empty data directory",
                    path.display()
                ),
            ));
        };
        let mut vote_file = VoteFile {
            dir: dir.to_path_buf(),
            file: Some(file),
            sequence,
            vote: Some(vote),
        };
        if copies[0] != copies[1] {
            // Mended at once, so that rot in the other copy before the next vote is saved
            // finds neither both damaged nor, behind it, the vote before this one (which a
            // save cut short by a crash leaves in the second copy, and which this replica
            // may act on from now on).
            if copies.iter().any(Option::is_none) {
                tracing::warn!(
                    file = %path.display(),
                    "one copy of the vote is damaged; the other's vote is written to both again"
                );
            }
            vote_file.save(&vote)?;
        }
        Ok(vote_file)
    }

    /// The vote on disk.
    pub fn vote(&self) -> Option<Vote> {
        self.vote
    }

    /// Makes `vote` durable in both copies, one after the other, before returning. The first
    /// save writes the whole file under a temporary name, syncs it and renames it into place,
    /// so that a crash while creating it leaves no file rather than a damaged one.
    pub fn save(&mut self, vote: &Vote) -> io::Result<()> {
        let copy = encode_copy(self.sequence + 1, vote);
        match &self.file {
            Some(file) => {
                for at in COPY_AT {
                    file.write_all_at(&copy, at)?;
                    file.sync_data()?;
                }
            }
            None => {
                let file = create_durably(&self.dir, VOTE_FILE, |file| {
                    COPY_AT
                        .iter()
                        .try_for_each(|&at| file.write_all_at(&copy, at))
                })?;
                self.file = Some(file);
            }
        }
        self.sequence += 1;
        self.vote = Some(*vote);
        Ok(())
    }
}

/// Rot in a stopped replica's vote file, for the tests that inject it.
pub mod faults {
    use std::io;
    use std::path::Path;

    use super::{encode_copy, Vote, COPY_AT, VOTE_FILE};
    use crate::raft::wal::faults::invert_byte;

    /// Flips byte `at` (modulo a copy's length) of copy `copy` (0 or 1) of the vote file in the
    /// log directory `dir`.
    pub fn flip_vote_byte(dir: &Path, copy: usize, at: u64) -> io::Result<()> {
        let at = at % encode_copy(0, &Vote::default()).len() as u64;
        invert_byte(&dir.join(VOTE_FILE), COPY_AT[copy] + at)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use openraft::Vote as RaftVote;

    fn open(dir: &Path) -> io::Result<Option<Vote>> {
        VoteFile::open(dir).map(|file| file.vote())
    }

    /// A file holding `vote`, saved once.
    fn saved(dir: &Path, vote: Vote) -> VoteFile {
        let mut file = VoteFile::open(dir).unwrap();
        file.save(&vote).unwrap();
        file
    }

    #[test]
    fn a_file_is_made_whole_at_the_first_save_and_keeps_the_last() {
        let dir = tempfile::tempdir().unwrap();
        let mut file = VoteFile::open(dir.path()).unwrap();
        assert_eq!(file.vote(), None);
        assert!(!dir.path().join(VOTE_FILE).exists());
        file.save(&RaftVote::new(4, 2)).unwrap();
        assert!(!dir.path().join(format!("{VOTE_FILE}.tmp")).exists());
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
        let copy_bytes = encode_copy(2, &last).len() as u64;
        for copy in 0..2 {
            for at in 0..copy_bytes {
                let dir = tempfile::tempdir().unwrap();
                let mut file = saved(dir.path(), RaftVote::new(6, 1));
                file.save(&last).unwrap();
                drop(file);
                faults::flip_vote_byte(dir.path(), copy, at).unwrap();
                let case = format!("copy {copy} byte {at}");
                let vote = open(dir.path()).unwrap_or_else(|e| panic!("{case}: {e}"));
                assert_eq!(vote, Some(last), "{case}");
                // The open mended it: rot in the other copy now leaves this one.
                faults::flip_vote_byte(dir.path(), 1 - copy, at).unwrap();
                let vote = open(dir.path()).unwrap_or_else(|e| panic!("{case}, mended: {e}"));
                assert_eq!(vote, Some(last), "{case}, mended");
                // Both damaged between two opens is refused.
                faults::flip_vote_byte(dir.path(), 0, at).unwrap();
                faults::flip_vote_byte(dir.path(), 1, at).unwrap();
                let refused = open(dir.path()).expect_err("both copies damaged");
                assert_eq!(refused.kind(), io::ErrorKind::InvalidData, "{case}");
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
        let copy = encode_copy(file.sequence + 1, &newer);
        file.file
            .as_ref()
            .unwrap()
            .write_all_at(&copy, COPY_AT[0])
            .unwrap();
        drop(file);
        let file = VoteFile::open(dir.path()).unwrap();
        assert_eq!(file.vote(), Some(newer));
        drop(file);
        // The open wrote the newer vote to the second copy too: rot in the first now finds it
        // there, not the vote before.
        faults::flip_vote_byte(dir.path(), 0, 3).unwrap();
        let mut file = VoteFile::open(dir.path()).unwrap();
        assert_eq!(file.vote(), Some(newer));
        file.save(&RaftVote::new(3, 3)).unwrap();
        drop(file);
        assert_eq!(open(dir.path()).unwrap(), Some(RaftVote::new(3, 3)));
    }
}
