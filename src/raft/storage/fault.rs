//! The storage faults a replica can find in its own files, by kind: what `ctrlog check`
//! reports, what a start repairs, what the scrubber stops a replica for, and the `kind` label
//! of `ctrlog_storage_faults_total` (ARCHITECTURE.md, "The storage fault model").

use std::path::PathBuf;

/// A kind of storage fault: the `kind` label of `ctrlog_storage_faults_total`, and what
/// `ctrlog check` prints.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum FaultKind {
    /// The `format` file does not name a format this build reads.
    Format,
    /// A WAL record that fails its checksum where no crash leaves one.
    LogDamaged,
    /// The WAL ends before what an `fdatasync` covered: synced records were lost.
    LostSyncedRecords,
    /// A sector of a WAL segment that fails reads (EIO).
    UnreadableSector,
    /// The synced mark fails its checksum.
    SyncedMarkDamaged,
    /// An `fdatasync` of the log failed, and the log holds records only it covered.
    FailedSync,
    /// One copy of `log/vote` or `log/repair` fails its checks.
    RecordCopyDamaged,
    /// Both copies of `log/vote` or `log/repair` fail their checks.
    RecordLost,
    /// sled refuses its own files.
    SledRefused,
    /// The stored snapshot fails its checks.
    SnapshotDamaged,
    /// The stored snapshot stops short of the log's first entry.
    SnapshotShortOfLog,
}

impl FaultKind {
    pub const ALL: [FaultKind; 11] = [
        FaultKind::Format,
        FaultKind::LogDamaged,
        FaultKind::LostSyncedRecords,
        FaultKind::UnreadableSector,
        FaultKind::SyncedMarkDamaged,
        FaultKind::FailedSync,
        FaultKind::RecordCopyDamaged,
        FaultKind::RecordLost,
        FaultKind::SledRefused,
        FaultKind::SnapshotDamaged,
        FaultKind::SnapshotShortOfLog,
    ];

    /// The label: `log_damaged`, `snapshot_damaged`, ...
    pub fn label(self) -> &'static str {
        match self {
            FaultKind::Format => "format",
            FaultKind::LogDamaged => "log_damaged",
            FaultKind::LostSyncedRecords => "lost_synced_records",
            FaultKind::UnreadableSector => "unreadable_sector",
            FaultKind::SyncedMarkDamaged => "synced_mark_damaged",
            FaultKind::FailedSync => "failed_sync",
            FaultKind::RecordCopyDamaged => "record_copy_damaged",
            FaultKind::RecordLost => "record_lost",
            FaultKind::SledRefused => "sled_refused",
            FaultKind::SnapshotDamaged => "snapshot_damaged",
            FaultKind::SnapshotShortOfLog => "snapshot_short_of_log",
        }
    }
}

impl std::fmt::Display for FaultKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.label())
    }
}

/// One fault found: its kind, the file it is in, and what was found and what a start does
/// about it.
#[derive(Clone, Debug, serde::Serialize)]
pub struct Fault {
    pub kind: FaultKind,
    pub file: PathBuf,
    pub detail: String,
}
