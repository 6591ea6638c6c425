//! The offline check of a stopped replica's data directory (`ctrlog check --data DIR`), as
//! `etcdutl` checks a member's: every fault of ARCHITECTURE.md's storage fault model that the
//! files show, found by the same reads a start makes, with nothing changed.
//!
//! What it reads, and how without writing:
//!
//! * the `format` file, parsed as a start parses it (a missing one is v0.1.0's format 1);
//! * the WAL, every segment whole and every record's checksum, judged against the synced mark
//!   as [`Wal::open_repairing`](super::wal::Wal::open_repairing) judges it ([`wal::check`]);
//! * `log/vote` and `log/repair`, both copies of each;
//! * sled, opened on a copy of `meta/` (sled's recovery writes to the files it opens): whether
//!   it opens at all, and the stored snapshot's chunks, length and checksum, and whether it
//!   reaches the log's first entry.
//!
//! A torn tail past the synced mark is what a crash leaves, not a fault: it is reported as a
//! note. Each fault is one the next start repairs from the peers (or, for the format file and
//! both copies of a record damaged, refuses to start on); the check says which.

use std::io;
use std::path::Path;

use super::data_dir::{
    damaged_folders, format_of, log_dir, meta_dir, sleds_set_aside_in, FORMAT_FILE,
};
use super::fault::{Fault, FaultKind};
use super::log_store::Repair;
use super::meta_store::{wait_for_lock, MetaStore, SledRefused};
use super::snapshots::verify_stored_snapshot;
use super::two_copies::{self, CopiesFound, FAILED_SYNC, REPAIR, VOTE};
use super::wal::{self, FailedSync, DAMAGED_DIR};
use crate::raft::types::Vote;

/// What the check found.
#[derive(Debug, Default, serde::Serialize)]
pub struct Report {
    pub faults: Vec<Fault>,
    /// What is worth knowing and is not a fault: a torn tail, a repair under way, damage kept
    /// from earlier starts.
    pub notes: Vec<String>,
}

impl Report {
    fn fault(&mut self, kind: FaultKind, file: &Path, detail: impl Into<String>) {
        self.faults.push(Fault {
            kind,
            file: file.to_path_buf(),
            detail: detail.into(),
        });
    }
}

/// Checks the stopped replica's data directory `data_dir`. An error is a directory that
/// cannot be checked (missing, unreadable, or in use by a running replica); faults are in
/// the report.
pub fn check_data_dir(data_dir: &Path) -> io::Result<Report> {
    if !data_dir.is_dir() {
        return Err(io::Error::new(
            io::ErrorKind::NotFound,
            format!("{} is not a directory", data_dir.display()),
        ));
    }
    // A running replica's files change under the check: wait for its lock as a start does,
    // and fail naming the directory if it is held.
    wait_for_lock(&meta_dir(data_dir))?;
    let mut report = Report::default();
    match format_of(data_dir) {
        Ok(Some(_)) => {}
        Ok(None) => report
            .notes
            .push("no format file: the layout of v0.1.0 (format 1)".into()),
        Err(error) => report.fault(
            FaultKind::Format,
            &data_dir.join(FORMAT_FILE),
            error.to_string(),
        ),
    }
    let log = log_dir(data_dir);
    let first_index = check_log(&log, &mut report)?;
    let vote = two_copies::check::<Vote>(&log, &VOTE)?;
    let repair = two_copies::check::<Repair>(&log, &REPAIR)?;
    let failed_sync = two_copies::check::<Option<FailedSync>>(&log, &FAILED_SYNC)?;
    for (record, found) in [
        (&VOTE, vote),
        (&REPAIR, repair),
        (&FAILED_SYNC, failed_sync),
    ] {
        report_copies(&log.join(record.file_name), found, &mut report);
    }
    check_sled(data_dir, first_index, &mut report)?;
    let kept = damaged_folders(data_dir)?;
    if !kept.is_empty() {
        report.notes.push(format!(
            "{} folder(s) of damage found by earlier starts are kept under {} ({} of them \
             sled's files set aside)",
            kept.len(),
            log.join(DAMAGED_DIR).display(),
            sleds_set_aside_in(&kept),
        ));
    }
    Ok(report)
}

/// Checks the WAL in `log`; returns the first index its oldest segment holds.
fn check_log(log: &Path, report: &mut Report) -> io::Result<Option<u64>> {
    if !log.is_dir() {
        report.notes.push(format!("no log at {}", log.display()));
        return Ok(None);
    }
    let found = wal::check(log)?;
    report.notes.push(format!(
        "log: {} segment(s), entries {} to {}, synced mark {}",
        found.segments,
        found.first_index.map_or("-".into(), |i| i.to_string()),
        found.next_index.saturating_sub(1),
        found.synced_mark.map_or("none".into(), |i| i.to_string()),
    ));
    for (segment, byte) in &found.unreadable {
        report.fault(
            FaultKind::UnreadableSector,
            segment,
            format!("a sector from byte {byte} fails reads (EIO)"),
        );
    }
    if found.mark_damaged {
        report.fault(
            FaultKind::SyncedMarkDamaged,
            &log.join("synced"),
            "fails its checksum and counts as none: the next start writes it again",
        );
    }
    if let Some(damage) = &found.damage {
        let (kind, what) = match found.lost_synced_records {
            true => (
                FaultKind::LostSyncedRecords,
                format!(
                    "the log ends before entry {}, which an fdatasync covered (synced mark {})",
                    damage.first,
                    found.synced_mark.map_or("none".into(), |i| i.to_string()),
                ),
            ),
            false => (
                FaultKind::LogDamaged,
                format!(
                    "record {} at byte {} fails its checksum, and the log held records up to \
                     at least entry {}",
                    damage.first,
                    damage.byte,
                    damage.end_at_least.saturating_sub(1)
                ),
            ),
        };
        report.fault(
            kind,
            &damage.segment,
            format!(
                "{what}; the next start repairs entries from {} from the peers",
                damage.first
            ),
        );
    }
    match &found.failed_sync {
        Some((failed, Some((from, to)))) => report.fault(
            FaultKind::FailedSync,
            Path::new(&failed.file),
            format!(
                "{failed}; entries {from} to {to} were covered by that fdatasync alone and may \
                 be only in the page cache: the next start cuts them before it syncs anything, \
                 and the peers send them again"
            ),
        ),
        Some((failed, None)) => report.notes.push(format!(
            "{failed}; the log holds nothing past what was vouched for"
        )),
        None => {}
    }
    if let Some((segment, byte)) = &found.torn_tail {
        report.notes.push(format!(
            "{} ends in a torn write from byte {byte}, past the synced mark: a crash's, cut at \
             the next start",
            segment.display()
        ));
    }
    Ok(found.first_index)
}

fn report_copies(file: &Path, found: CopiesFound, report: &mut Report) {
    match found {
        CopiesFound::Missing | CopiesFound::Whole => {}
        CopiesFound::OneDamaged => report.fault(
            FaultKind::RecordCopyDamaged,
            file,
            "one copy fails its checks (rot, or a save a crash tore): the next start writes \
             the other to both",
        ),
        CopiesFound::BothDamaged => report.fault(
            FaultKind::RecordLost,
            file,
            "both copies fail their checks, which no crash leaves: the replica will not start; \
             remove it from the cluster and add it back with an empty data directory",
        ),
    }
}

/// Opens sled on a copy of `meta/` and checks the stored snapshot.
fn check_sled(data_dir: &Path, first_index: Option<u64>, report: &mut Report) -> io::Result<()> {
    let meta = meta_dir(data_dir);
    if !meta.is_dir() {
        report.notes.push(format!("no sled at {}", meta.display()));
        return Ok(());
    }
    let scratch = tempfile::tempdir()?;
    let copy = scratch.path().join("meta");
    copy_dir(&meta, &copy)?;
    let data_file = meta.join("db");
    let store = match MetaStore::open(&copy) {
        Ok(store) => store,
        Err(error) => match SledRefused::in_error(&error) {
            Some(refused) => {
                report.fault(
                    FaultKind::SledRefused,
                    &meta,
                    format!(
                        "{}: the next start sets meta/ aside and fetches the snapshot from the \
                         leader",
                        refused.why
                    ),
                );
                return Ok(());
            }
            None => return Err(error),
        },
    };
    match verify_stored_snapshot(&store, |_| {})? {
        Err(damaged) => report.fault(
            FaultKind::SnapshotDamaged,
            &data_file,
            format!("{damaged}: the next start sets it aside and fetches the leader's"),
        ),
        Ok(stored) => {
            let reaches = stored.map_or(0, |last| last.index) + 1;
            if let Some(first) = first_index.filter(|&first| first > reaches) {
                report.fault(
                    FaultKind::SnapshotShortOfLog,
                    &data_file,
                    format!(
                        "the stored snapshot reaches entry {} but the log starts at entry \
                         {first}: sled lost a later snapshot; the next start fetches the \
                         leader's",
                        reaches - 1
                    ),
                );
            }
            if let Some(last) = stored {
                report
                    .notes
                    .push(format!("stored snapshot: up to entry {}", last.index));
            }
        }
    }
    Ok(())
}

/// Copies the folder `from` to `to`, recursively.
fn copy_dir(from: &Path, to: &Path) -> io::Result<()> {
    std::fs::create_dir_all(to)?;
    for entry in std::fs::read_dir(from)? {
        let entry = entry?;
        let target = to.join(entry.file_name());
        if entry.file_type()?.is_dir() {
            copy_dir(&entry.path(), &target)?;
        } else {
            std::fs::copy(entry.path(), target)?;
        }
    }
    Ok(())
}
