//! Reading the WAL's files where a disk may fail a read: a bad sector answers `EIO`
//! (ARCHITECTURE.md, "The storage fault model").
//!
//! The WAL reads its segments at open through [`read_salvaging`], which keeps every sector it
//! can read and says where the first it could not lies. The bytes it could not read are judged
//! as any damaged bytes are: followed by a valid record, in a sealed segment or under the
//! synced mark they are damage, repaired from the peers; at the very end of the last segment,
//! past the synced mark, they are what a crash may leave and are cut as a torn tail (nothing
//! there was acknowledged). A read while the replica runs
//! ([`read_exact_at`]) fails with the error: openraft stops on it, the replica exits, and its
//! supervisor's restart runs recovery.
//!
//! The storage owns this fault as it owns the others: [`faults::make_unreadable`] marks a
//! sector of a file unreadable, and the reads here then fail on it as a bad sector does. A
//! marked sector stays bad until the file is cut below it or a new file takes its path (a disk
//! remaps a sector when it is written again). With nothing marked, a read costs one relaxed
//! atomic load more than the plain `pread`.

use std::collections::BTreeMap;
use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;

/// The unit in which a disk fails reads, and in which [`read_salvaging`] retries them.
pub const SECTOR_BYTES: u64 = 4096;

/// Sectors marked unreadable, by the path of their file. Set only by [`faults`].
static UNREADABLE: Mutex<BTreeMap<PathBuf, Vec<u64>>> = Mutex::new(BTreeMap::new());

/// Whether [`UNREADABLE`] holds anything: the one thing a read checks when nothing is marked.
static ANY_UNREADABLE: AtomicBool = AtomicBool::new(false);

fn unreadable() -> std::sync::MutexGuard<'static, BTreeMap<PathBuf, Vec<u64>>> {
    UNREADABLE
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// `Err(EIO)` if `len` bytes at `offset` of the file at `path` touch a marked sector.
fn check(path: &Path, offset: u64, len: usize) -> io::Result<()> {
    if !ANY_UNREADABLE.load(Ordering::Relaxed) || len == 0 {
        return Ok(());
    }
    let first = offset / SECTOR_BYTES;
    let last = (offset + len as u64 - 1) / SECTOR_BYTES;
    let bad = unreadable()
        .get(path)
        .is_some_and(|sectors| sectors.iter().any(|s| (first..=last).contains(s)));
    match bad {
        true => Err(io::Error::from_raw_os_error(libc::EIO)),
        false => Ok(()),
    }
}

/// Whether `error` is a failed read of the medium (`EIO`), which retrying will not mend.
pub fn is_medium_error(error: &io::Error) -> bool {
    error.raw_os_error() == Some(libc::EIO)
}

/// Reads exactly `buf.len()` bytes at `offset` of `file`, which is at `path`.
pub fn read_exact_at(file: &File, path: &Path, buf: &mut [u8], offset: u64) -> io::Result<()> {
    check(path, offset, buf.len())?;
    file.read_exact_at(buf, offset)
}

/// A file's bytes as far as they could be read.
pub struct Salvaged {
    /// Every byte of the file; a sector that could not be read is zeros.
    pub bytes: Vec<u8>,
    /// Where the first sector that could not be read starts, if one could not.
    pub unreadable_from: Option<u64>,
}

/// Reads the whole file at `path`. A read that fails with `EIO` is read again sector by
/// sector, and what the failing sectors held is given as zeros, so that the caller keeps what
/// lies after a bad sector. Any other error is returned.
pub fn read_salvaging(path: &Path) -> io::Result<Salvaged> {
    let file = File::open(path)?;
    let len = file.metadata()?.len();
    let mut bytes = vec![0u8; len as usize];
    match read_exact_at(&file, path, &mut bytes, 0) {
        Ok(()) => {
            return Ok(Salvaged {
                bytes,
                unreadable_from: None,
            })
        }
        Err(error) if is_medium_error(&error) => {}
        Err(error) => return Err(error),
    }
    let mut unreadable_from = None;
    for (sector, chunk) in bytes.chunks_mut(SECTOR_BYTES as usize).enumerate() {
        let offset = sector as u64 * SECTOR_BYTES;
        match read_exact_at(&file, path, chunk, offset) {
            Ok(()) => {}
            Err(error) if is_medium_error(&error) => {
                chunk.fill(0);
                unreadable_from.get_or_insert(offset);
            }
            Err(error) => return Err(error),
        }
    }
    Ok(Salvaged {
        bytes,
        unreadable_from,
    })
}

/// A new file now stands at `path`: the sectors of the one there before are not its own.
pub fn forget(path: &Path) {
    if ANY_UNREADABLE.load(Ordering::Relaxed) {
        unreadable().remove(path);
    }
}

/// The file at `path` was cut to `len` bytes: its sectors from there on are given back.
pub fn forget_from(path: &Path, len: u64) {
    if ANY_UNREADABLE.load(Ordering::Relaxed) {
        if let Some(sectors) = unreadable().get_mut(path) {
            sectors.retain(|&sector| (sector + 1) * SECTOR_BYTES <= len);
        }
    }
}

/// Bad sectors, for the tools and tests that inject them (the simulation's rotting disk).
pub mod faults {
    use std::path::{Path, PathBuf};
    use std::sync::atomic::Ordering;

    use super::{unreadable, ANY_UNREADABLE, SECTOR_BYTES};

    /// Makes the sector that holds byte `offset` of the file at `path` fail every read, as a
    /// bad sector does, until the file is cut below it or replaced.
    pub fn make_unreadable(path: &Path, offset: u64) {
        let mut marked = unreadable();
        marked
            .entry(path.to_path_buf())
            .or_default()
            .push(offset / SECTOR_BYTES);
        ANY_UNREADABLE.store(true, Ordering::Relaxed);
    }

    /// Lifts the marks of every file under `dir` and returns them (a path and a byte of each
    /// marked sector), for an injector that must read the files whole and then marks them
    /// again.
    pub fn take_unreadable_under(dir: &Path) -> Vec<(PathBuf, u64)> {
        let mut marked = unreadable();
        let paths: Vec<PathBuf> = marked
            .keys()
            .filter(|path| path.starts_with(dir))
            .cloned()
            .collect();
        paths
            .into_iter()
            .flat_map(|path| {
                let sectors = marked.remove(&path).unwrap_or_default();
                sectors
                    .into_iter()
                    .map(move |sector| (path.clone(), sector * SECTOR_BYTES))
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_marked_sector_fails_reads_of_it_only_and_is_salvaged_around() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("file");
        let content: Vec<u8> = (0..3 * SECTOR_BYTES).map(|i| (i % 251) as u8 + 1).collect();
        std::fs::write(&path, &content).unwrap();
        faults::make_unreadable(&path, SECTOR_BYTES + 10);
        let file = File::open(&path).unwrap();
        let mut buf = [0u8; 16];
        read_exact_at(&file, &path, &mut buf, 0).unwrap();
        let error = read_exact_at(&file, &path, &mut buf, SECTOR_BYTES - 8).unwrap_err();
        assert!(is_medium_error(&error), "{error}");
        read_exact_at(&file, &path, &mut buf, 2 * SECTOR_BYTES).unwrap();

        let salvaged = read_salvaging(&path).unwrap();
        assert_eq!(salvaged.unreadable_from, Some(SECTOR_BYTES));
        let sector = SECTOR_BYTES as usize;
        assert_eq!(salvaged.bytes[..sector], content[..sector]);
        assert!(salvaged.bytes[sector..2 * sector].iter().all(|&b| b == 0));
        assert_eq!(salvaged.bytes[2 * sector..], content[2 * sector..]);

        forget_from(&path, SECTOR_BYTES);
        assert_eq!(read_salvaging(&path).unwrap().unreadable_from, None);
        faults::make_unreadable(&path, 0);
        forget(&path);
        assert_eq!(read_salvaging(&path).unwrap().unreadable_from, None);
    }
}
