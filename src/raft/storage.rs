//! A replica's data directory: sled (metadata and snapshots) in `meta/`, the WAL in `log/`,
//! and the directory's format version in `format`.
//!
//! The layout is spelled here once, for a replica's start and for disaster recovery alike.
//!
//! The format version covers everything under the directory: sled's trees and their key and
//! value encodings, and the WAL's segment and record layout. A change to any of them that an
//! older build would misread is a new format, written only by a build that reads every older
//! one; a build refuses a directory of a newer format than it knows, naming both, rather than
//! misread it (a downgrade is refused, not attempted). As Kafka's `meta.properties`, the file
//! is plain text: `format = N`.

use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::fault::FaultKind;
use super::log_store::{Flushing, LogStore, SEGMENT_BYTES_MAX};
use super::meta_store::{Closed, MetaStore, SledRefused};
use super::state_machine::{set_aside_damaged_snapshot, DamagedSnapshot, StateMachineStore};
use super::wal::{create_durably, new_damaged_folder, sync_dir, DAMAGED_DIR};
use super::write_faults;

/// Where a replica keeps sled (metadata and snapshots) inside its data directory.
pub fn meta_dir(data_dir: &Path) -> PathBuf {
    data_dir.join("meta")
}

/// Where a replica keeps the WAL (the Raft log) inside its data directory.
pub fn log_dir(data_dir: &Path) -> PathBuf {
    data_dir.join("log")
}

/// The data directory format this build writes, and the newest it opens. Format 1 is the
/// layout of v0.1.0, which wrote no `format` file: a directory without one is format 1.
pub const DATA_FORMAT: u32 = 1;

/// The file in a data directory that names its format.
pub const FORMAT_FILE: &str = "format";

/// Why a data directory's format cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum FormatError {
    /// Written by a newer build: this one would misread it.
    #[error(
        "{path} is data directory format {found}, written by a newer ctrlog; this build reads \
         formats 1 to {DATA_FORMAT}. Downgrading is refused: run a build that knows format \
         {found}, or restore a backup taken before the upgrade"
    )]
    Newer { path: String, found: u32 },
    /// The file does not say `format = N` with a format some build wrote: damaged, or not
    /// ctrlog's. Nothing is guessed: a newer build's directory read as this one's would be
    /// misread.
    #[error(
        "{path} does not name a data directory format (`format = N`): {reason}. If the file \
         was damaged and the build that last ran this replica reads format {DATA_FORMAT}, \
         write `format = {DATA_FORMAT}` into it; the rest of the directory is checked at start"
    )]
    Unreadable { path: String, reason: String },
}

/// Checks the format of `data_dir` and records it if the directory has no `format` file yet
/// (a new directory, or one v0.1.0 wrote). Returns the format found.
pub fn check_format(data_dir: &Path) -> io::Result<u32> {
    match format_of(data_dir)? {
        Some(found) => Ok(found),
        None => {
            std::fs::create_dir_all(data_dir)?;
            write_format(data_dir, DATA_FORMAT)?;
            Ok(DATA_FORMAT)
        }
    }
}

/// The format `data_dir`'s `format` file names (`None`: it has none, as a new directory or
/// v0.1.0's), read without changing anything; one this build cannot use is an
/// [`io::ErrorKind::InvalidData`] error holding a [`FormatError`].
pub fn format_of(data_dir: &Path) -> io::Result<Option<u32>> {
    let path = data_dir.join(FORMAT_FILE);
    let invalid = |error: FormatError| io::Error::new(io::ErrorKind::InvalidData, error);
    match std::fs::read(&path) {
        Ok(bytes) => {
            let text = String::from_utf8(bytes).map_err(|_| "it is not UTF-8 text".to_string());
            let found = text
                .and_then(|text| parse_format(&text))
                .map_err(|reason| {
                    invalid(FormatError::Unreadable {
                        path: path.display().to_string(),
                        reason,
                    })
                })?;
            if found > DATA_FORMAT {
                return Err(invalid(FormatError::Newer {
                    path: path.display().to_string(),
                    found,
                }));
            }
            Ok(Some(found))
        }
        Err(error) if error.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(error) => Err(error),
    }
}

/// The format the first line that is not a comment names. Format 0 was never written: a flip
/// of the `1` gives it, so it is refused rather than read as an older format.
fn parse_format(text: &str) -> Result<u32, String> {
    let line = text
        .lines()
        .map(str::trim)
        .find(|line| !line.is_empty() && !line.starts_with('#'))
        .ok_or("it is empty")?;
    let value = line
        .strip_prefix("format")
        .and_then(|rest| rest.trim_start().strip_prefix('='))
        .ok_or_else(|| format!("`{line}`"))?;
    match value.trim().parse() {
        Ok(0) => Err(format!("`{line}`: no build writes format 0")),
        Ok(format) => Ok(format),
        Err(e) => Err(format!("`{line}`: {e}")),
    }
}

/// Writes the `format` file durably: a temporary file, synced, renamed over, and the
/// directory synced, so that a crash leaves the old file or the new one.
fn write_format(data_dir: &Path, format: u32) -> io::Result<()> {
    use std::io::Write as _;
    create_durably(data_dir, FORMAT_FILE, |mut file| {
        writeln!(
            file,
            "# The layout of this ctrlog data directory (meta/, log/). Do not edit.\nformat = {format}"
        )
    })
    .map(drop)
}

/// Opens the metadata and the log (the WAL) of the replica whose data is in `data_dir`, for
/// disaster recovery, which keeps everything the replica holds: sled refusing its files is an
/// error here, left to the operator (a replica's start sets them aside, [`open_storage`]).
pub fn open_log(data_dir: &Path) -> io::Result<(Arc<MetaStore>, LogStore)> {
    check_format(data_dir)?;
    let meta = Arc::new(MetaStore::open(&meta_dir(data_dir))?);
    let log = LogStore::open(&log_dir(data_dir), meta.clone())?;
    Ok((meta, log))
}

/// Opens sled. If it refuses its own files as damaged ([`SledRefused`]), they are moved, as
/// found, into a new folder of `log/damaged/` (returned), and sled starts over, empty: what
/// it held (the snapshot, the purge and commit points, a copy of the vote) is fetched from the
/// leader again or kept outside it, so the replica repairs rather than stops.
fn open_meta(data_dir: &Path) -> io::Result<(MetaStore, Option<PathBuf>)> {
    let dir = meta_dir(data_dir);
    let refused = match MetaStore::open(&dir) {
        Ok(meta) => return Ok((meta, None)),
        Err(error) => match SledRefused::in_error(&error) {
            Some(refused) => refused.to_string(),
            None => return Err(error),
        },
    };
    let kept = new_damaged_folder(&log_dir(data_dir))?;
    std::fs::rename(&dir, kept.join(SLED_SET_ASIDE))?;
    sync_dir(&kept)?;
    sync_dir(data_dir)?;
    tracing::error!(
        %refused,
        kept = %kept.display(),
        "sled's files are set aside and sled starts over, empty; the replica starts over from \
         the leader's snapshot"
    );
    Ok((MetaStore::open(&dir)?, Some(kept)))
}

/// The name sled's refused files take in their `log/damaged/` folder.
pub const SLED_SET_ASIDE: &str = "meta";

/// The folders of `log/damaged/` in `data_dir`: what earlier starts found damaged and kept.
pub fn damaged_folders(data_dir: &Path) -> io::Result<Vec<PathBuf>> {
    match std::fs::read_dir(log_dir(data_dir).join(DAMAGED_DIR)) {
        Ok(folders) => Ok(folders.flatten().map(|folder| folder.path()).collect()),
        Err(error) if error.kind() == io::ErrorKind::NotFound => Ok(Vec::new()),
        Err(error) => Err(error),
    }
}

/// How many of `damaged` (see [`damaged_folders`]) hold sled's refused files, set aside.
pub fn sleds_set_aside_in(damaged: &[PathBuf]) -> usize {
    (damaged.iter())
        .filter(|folder| folder.join(SLED_SET_ASIDE).exists())
        .count()
}

/// How many times the replica in `data_dir` has set sled's refused files aside: the folders
/// of `log/damaged/` that hold them. For the tools and tests that count the repairs.
pub fn sleds_set_aside(data_dir: &Path) -> io::Result<usize> {
    Ok(sleds_set_aside_in(&damaged_folders(data_dir)?))
}

/// A replica's storage, opened: what Raft runs on.
pub struct Storage {
    pub log: LogStore,
    pub state_machine: StateMachineStore,
    /// Fires once every handle to the storage is gone and sled has released its directory.
    pub closed: Closed,
    /// The faults this open found and began repairing.
    pub found_at_open: Vec<FaultKind>,
}

/// Opens a replica's storage in `data_dir`: its metadata and log, and the state machine
/// restored from its latest snapshot.
///
/// Blocking: recovery reads the whole retained log, and opening may wait for the directory's
/// lock. Call it off the async runtime's workers.
pub fn open_storage(data_dir: &Path) -> io::Result<Storage> {
    open_storage_with(data_dir, Flushing::GroupCommit, SEGMENT_BYTES_MAX)
        .map_err(|error| write_faults::naming_the_remedy(data_dir, error))
}

/// [`open_storage`], flushing appends as `flushing` says (the simulation flushes inline), in
/// WAL segments of `segment_bytes_max` bytes (the simulation's are small, so that it purges
/// whole segments).
pub fn open_storage_with(
    data_dir: &Path,
    flushing: Flushing,
    segment_bytes_max: u64,
) -> io::Result<Storage> {
    check_format(data_dir)?;
    let (meta, sled_set_aside) = open_meta(data_dir)?;
    let meta = Arc::new(meta);
    let log = LogStore::open_with(
        &log_dir(data_dir),
        meta.clone(),
        segment_bytes_max,
        flushing,
    )?;
    let closed = meta.closed();
    let mut found_at_open = Vec::new();
    if log.damage_found_at_open().is_some() {
        found_at_open.push(FaultKind::LogDamaged);
    }
    let state_machine = match sled_set_aside {
        // Without sled's snapshot (and purge point) the log cannot be applied: start over.
        Some(kept) => {
            found_at_open.push(FaultKind::SledRefused);
            log.start_over_for_lost_snapshot(None, &kept.join(SLED_SET_ASIDE), &kept)?;
            StateMachineStore::open(meta, log.clone())?
        }
        None => match restore(&meta, &log)? {
            Ok(state_machine) => state_machine,
            Err((kind, damaged)) => {
                found_at_open.push(kind);
                // The snapshot is fetched from the leader again (ARCHITECTURE.md, "The
                // storage fault model").
                let kept = new_damaged_folder(&log_dir(data_dir))?;
                tracing::error!(
                    %damaged,
                    last = ?damaged.last,
                    kept = %kept.display(),
                    "the stored snapshot is set aside and fetched from the leader again"
                );
                log.start_over_for_lost_snapshot(damaged.last, &kept.join("snapshot"), &kept)?;
                set_aside_damaged_snapshot(&meta, &kept)?;
                StateMachineStore::open(meta, log.clone())?
            }
        },
    };
    log.guard_with_snapshots(state_machine.stored_snapshot_last()?)?;
    Ok(Storage {
        log,
        state_machine,
        closed,
        found_at_open,
    })
}

/// The state machine restored from the stored snapshot, or the damage that keeps it from being
/// restored: a snapshot that fails its checks or stops short of the log.
fn restore(
    meta: &Arc<MetaStore>,
    log: &LogStore,
) -> io::Result<Result<StateMachineStore, (FaultKind, DamagedSnapshot)>> {
    match StateMachineStore::open(meta.clone(), log.clone()) {
        Ok(state_machine) => Ok(match short_of_the_log(&state_machine, log)? {
            None => Ok(state_machine),
            Some(damaged) => Err((FaultKind::SnapshotShortOfLog, damaged)),
        }),
        Err(error) => match DamagedSnapshot::in_error(&error) {
            Some(damaged) => Ok(Err((FaultKind::SnapshotDamaged, damaged.clone()))),
            None => Err(error),
        },
    }
}

/// The stored snapshot as damage, if it stops short of the log: the log starts after the entry
/// following it, so the entries between are in neither, and the state cannot be rebuilt.
/// Nothing this build does leaves that (a purge never passes the durable snapshot): sled's
/// recovery dropped the writes of a later snapshot, after the log was purged behind it.
fn short_of_the_log(
    state_machine: &StateMachineStore,
    log: &LogStore,
) -> io::Result<Option<DamagedSnapshot>> {
    let stored = state_machine.stored_snapshot_last()?;
    let reaches = stored.map_or(0, |last| last.index) + 1;
    // An empty log counts too: it starts where its segment's name says, after its purge point.
    let first = log.first_index();
    Ok((first > reaches).then(|| DamagedSnapshot {
        last: stored,
        problem: format!(
            "it reaches entry {} but the log starts at entry {first}: sled lost the writes of \
             a later snapshot",
            reaches - 1
        ),
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Goal: a directory without a `format` file (new, or v0.1.0's) is format 1 and gets the
    /// file; a newer format is refused naming both versions; an unreadable file is refused.
    #[test]
    fn data_directory_formats_are_recorded_and_checked() {
        let dir = tempfile::tempdir().unwrap();
        let data = dir.path().join("data");
        assert_eq!(check_format(&data).unwrap(), 1);
        let written = std::fs::read_to_string(data.join(FORMAT_FILE)).unwrap();
        assert!(written.contains("format = 1"), "{written}");
        assert_eq!(check_format(&data).unwrap(), 1, "read back");

        std::fs::write(data.join(FORMAT_FILE), "format = 2\n").unwrap();
        let refused = check_format(&data).unwrap_err().to_string();
        assert!(
            refused.contains("format 2") && refused.contains("formats 1 to 1"),
            "{refused}"
        );
        assert!(refused.contains("Downgrading is refused"), "{refused}");

        for garbage in ["", "format two", "version = 1", "format = 0"] {
            std::fs::write(data.join(FORMAT_FILE), garbage).unwrap();
            let refused = check_format(&data).unwrap_err().to_string();
            assert!(
                refused.contains("does not name a data directory format"),
                "{refused}"
            );
        }
    }

    /// Goal: a disk that is full when a new directory's format is recorded fails the start
    /// with an error naming the file, and leaves no format file that a later start misreads.
    #[test]
    fn a_full_disk_while_recording_the_format_is_an_error_naming_the_file() {
        use crate::raft::write_faults::{faults, Operation};
        let dir = tempfile::tempdir().unwrap();
        let data = dir.path().join("data");
        faults::fail_under(&data, Operation::Write, libc::ENOSPC);
        let error = check_format(&data).unwrap_err().to_string();
        faults::heal_under(&data);
        let named = data.join(format!("{FORMAT_FILE}.tmp"));
        assert!(
            error.contains(&*named.to_string_lossy()) && error.contains("No space left"),
            "{error}"
        );
        assert!(!data.join(FORMAT_FILE).exists());
        assert_eq!(check_format(&data).unwrap(), DATA_FORMAT);
    }

    /// Goal: the format file has no checksum, and needs none: each bit of it flipped in turn
    /// either leaves format 1 (a comment, trailing space) or is refused naming the file, so
    /// a rotted format file never has the directory read as another format.
    #[test]
    fn any_flipped_bit_of_the_format_file_reads_as_written_or_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let data = dir.path().join("data");
        check_format(&data).unwrap();
        let path = data.join(FORMAT_FILE);
        let written = std::fs::read(&path).unwrap();
        let (mut read_as_written, mut refused) = (0, 0);
        for byte in 0..written.len() {
            for bit in 0..8 {
                let mut flipped = written.clone();
                flipped[byte] ^= 1 << bit;
                std::fs::write(&path, &flipped).unwrap();
                match check_format(&data) {
                    Ok(format) => {
                        assert_eq!(format, 1, "byte {byte} bit {bit}");
                        read_as_written += 1;
                    }
                    Err(error) => {
                        let error = error.to_string();
                        assert!(error.contains(&*path.to_string_lossy()), "{error}");
                        refused += 1;
                    }
                }
            }
        }
        assert!(
            read_as_written > 0 && refused > 0,
            "{read_as_written} {refused}"
        );
    }
}
