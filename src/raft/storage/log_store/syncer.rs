//! The sync thread and its marks: group commit (one `fdatasync` for every append queued
//! meanwhile), the [`Durable`] mark that says how far the log is on disk, and how a failed
//! `fdatasync` stops every later raise of it.

use std::io;
use std::sync::{mpsc, Arc, OnceLock};
use std::time::Instant;

use tokio::sync::watch;

use openraft::storage::LogFlushed;

use super::super::wal::{SegmentFile, SyncedMark};
use crate::raft::stages::{CommitStages, Stage};
use crate::raft::types::LogId;
use crate::raft::types::TypeConfig;

/// How far the log is known to be on disk: an index along the log as it is now.
///
/// Invariants:
/// * Every entry the log holds at or below `synced`'s index is on disk (written before an
///   `fdatasync` that returned, or covered by a durable snapshot). Compare by index
///   ([`Durable::covers`]), never by log id: log ids order the entries of one log, but an
///   entry written over a truncated one may carry an *older* term than the one it replaced
///   (an older leader's entry, sent on by a newer leader), so by log id the mark of the
///   dropped entries would vouch for entries not yet written.
/// * Between truncations the mark only rises.
/// * A truncation sets it to the log's new last entry: the truncation `fdatasync`s what it
///   keeps.
/// * An `fdatasync` of what was written before the latest truncation raises nothing
///   (`truncations` tells the two apart): the entries it synced may be gone.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Durable {
    /// Every entry up to this one is on disk.
    pub synced: Option<LogId>,
    /// Set once an `fdatasync` failed: what was written since cannot be vouched for, and the
    /// replica must stop (the next `save_committed` fails, which stops Raft).
    pub failed: Option<io::ErrorKind>,
    /// Truncations since the log was opened.
    pub truncations: u64,
}

impl Durable {
    /// Whether every entry up to `id`'s index is on disk.
    pub fn covers(&self, id: Option<LogId>) -> bool {
        index_of(self.synced) >= index_of(id)
    }
}

/// An entry's index, with `None` (no entry) before index 0.
pub(super) fn index_of(id: Option<LogId>) -> Option<u64> {
    id.map(|id| id.index)
}

/// Raises `durable`'s mark to `synced`, which a durable snapshot covers, waking whoever waits
/// for it. What a snapshot covers is committed, so no truncation ever removes it.
pub(super) fn mark_snapshotted(durable: &watch::Sender<Durable>, synced: Option<LogId>) {
    durable.send_if_modified(|d| {
        let raised = !d.covers(synced);
        if raised {
            d.synced = synced;
        }
        raised
    });
}

/// Raises `durable`'s mark to `synced`, the last entry of an `fdatasync` that returned, unless
/// the log was truncated since that entry was written (after `written_after` truncations).
/// The log's [`SyncedMark`] on disk is raised first, under the same lock, so that no raise
/// lands after a truncation that came later. A raise of the mark that fails (its write, or
/// a sync that failed first) fails the log as a failed `fdatasync` does, and the append is
/// not acknowledged.
pub(super) fn mark_synced(
    durable: &watch::Sender<Durable>,
    mark: &SyncedMark,
    synced: LogId,
    written_after: u64,
) -> Result<(), SyncFailed> {
    let mut failed = None;
    durable.send_if_modified(|d| {
        let raise = d.failed.is_none() && d.truncations == written_after && !d.covers(Some(synced));
        if !raise {
            return false;
        }
        match mark.raise(synced) {
            Ok(()) => {
                d.synced = Some(synced);
                true
            }
            Err(error) => {
                d.failed.get_or_insert(error.kind());
                failed = Some(SyncFailed {
                    kind: error.kind(),
                    message: error.to_string(),
                });
                true
            }
        }
    });
    failed.map_or(Ok(()), Err)
}

/// Records that an `fdatasync` of the log failed (`failure`): from now on the mark is never
/// raised again, and no later `fdatasync` is attempted ([`sync_file`]). The first failure's
/// message, which names the segment, is kept in `first` for the error the replica stops with.
pub(super) fn mark_failed(
    durable: &watch::Sender<Durable>,
    failure: &SyncFailed,
    first: &OnceLock<String>,
) {
    first.get_or_init(|| failure.message.clone());
    durable.send_modify(|d| {
        d.failed.get_or_insert(failure.kind);
    });
}

/// Group commit: a thread that `fdatasync`s the WAL and then acknowledges the appends it covers.
///
/// Protocol: `sync` sends the file the append was written to together with openraft's callback
/// (none for an append acknowledged already). The thread takes every request queued so far,
/// syncs each distinct file once, and in order raises the [`Durable`] mark to each request's
/// last entry and calls its callback. When the last `Syncer` handle is dropped the channel
/// closes and the thread exits after answering what it already received.
pub(super) struct Syncer {
    pub(super) requests: mpsc::Sender<SyncRequest>,
    pub(super) durable: Arc<watch::Sender<Durable>>,
    /// The first failed `fdatasync`'s message (see [`mark_failed`]).
    pub(super) first_failure: Arc<OnceLock<String>>,
}

pub(super) struct SyncRequest {
    pub(super) file: Arc<SegmentFile>,
    pub(super) callback: Option<LogFlushed<TypeConfig>>,
    pub(super) written: Written,
}

/// What one append wrote, for the `fdatasync` that makes it durable.
pub(super) struct Written {
    /// When the write began, for the append's `log_sync` time.
    pub(super) at: Instant,
    /// The append's last entry.
    pub(super) last: LogId,
    /// Truncations of the log before the write (see [`Durable`]).
    pub(super) truncations: u64,
}

/// `fdatasync`s one segment, unless one failed before: then nothing written since can be
/// vouched for, and another `fdatasync` that succeeds would say it is on disk when the page
/// cache may have dropped it ([`super::write_faults`]). The error names the segment.
///
/// The `wal-sync` fail point makes it fail, as a crash before the flush would leave the entries
/// unacknowledged; `wal-synced` fails it after the flush, as a crash between the flush and the
/// acknowledgement would.
pub(super) fn sync_file(
    file: &SegmentFile,
    durable: &watch::Sender<Durable>,
) -> Result<(), SyncFailed> {
    if let Some(earlier) = durable.borrow().failed {
        return Err(SyncFailed {
            kind: earlier,
            message: format!(
                "not flushing {}: an fdatasync of the log failed before ({earlier}), so \
                 nothing written since can be vouched for",
                file.path().display()
            ),
        });
    }
    let failed = |error: io::Error| SyncFailed {
        kind: error.kind(),
        message: error.to_string(),
    };
    fail::fail_point!("wal-sync", |_| Err(failed(io::Error::other("wal-sync"))));
    file.sync().map_err(failed)?;
    fail::fail_point!("wal-synced", |_| Err(failed(io::Error::other(
        "wal-synced"
    ))));
    Ok(())
}

/// An `fdatasync` of the log that failed: its kind, for [`Durable::failed`], and its message,
/// which names the segment, for openraft's error and the operator.
#[derive(Clone, Debug)]
pub(super) struct SyncFailed {
    pub(super) kind: io::ErrorKind,
    pub(super) message: String,
}

impl From<SyncFailed> for io::Error {
    fn from(failed: SyncFailed) -> io::Error {
        io::Error::new(failed.kind, failed.message)
    }
}

impl Syncer {
    /// Starts the sync thread; it times each append's `log_sync` into `stages`.
    pub(super) fn start(
        stages: Arc<CommitStages>,
        durable: Arc<watch::Sender<Durable>>,
        mark: Arc<SyncedMark>,
        first_failure: Arc<OnceLock<String>>,
    ) -> Syncer {
        let (requests, incoming) = mpsc::channel::<SyncRequest>();
        let thread_durable = durable.clone();
        let thread_first_failure = first_failure.clone();
        std::thread::Builder::new()
            .name("ctrlog-wal-sync".into())
            .spawn(move || {
                while let Ok(first) = incoming.recv() {
                    let mut batch = vec![first];
                    batch.extend(incoming.try_iter());
                    let mut synced: Vec<(Arc<SegmentFile>, Result<(), SyncFailed>)> = Vec::new();
                    for request in batch {
                        let result =
                            match synced.iter().find(|(f, _)| Arc::ptr_eq(f, &request.file)) {
                                Some((_, result)) => result.clone(),
                                None => {
                                    let result = sync_file(&request.file, &thread_durable);
                                    synced.push((request.file.clone(), result.clone()));
                                    result
                                }
                            };
                        let result = result.and_then(|()| {
                            let written = &request.written;
                            mark_synced(&thread_durable, &mark, written.last, written.truncations)
                        });
                        if let Err(failure) = &result {
                            mark_failed(&thread_durable, failure, &thread_first_failure)
                        }
                        stages.observe(Stage::log_sync, request.written.at.elapsed());
                        if let Some(callback) = request.callback {
                            callback.log_io_completed(result.map_err(io::Error::from));
                        }
                    }
                }
            })
            .expect("spawning the wal sync thread");
        Syncer {
            requests,
            durable,
            first_failure,
        }
    }

    pub(super) fn sync(
        &self,
        file: Arc<SegmentFile>,
        callback: Option<LogFlushed<TypeConfig>>,
        written: Written,
    ) {
        let request = SyncRequest {
            file,
            callback,
            written,
        };
        if let Err(mpsc::SendError(request)) = self.requests.send(request) {
            // An append acknowledged already will never be durable: fail the mark too.
            let stopped = SyncFailed {
                kind: io::ErrorKind::Other,
                message: "the wal sync thread has stopped".into(),
            };
            mark_failed(&self.durable, &stopped, &self.first_failure);
            if let Some(callback) = request.callback {
                callback.log_io_completed(Err(io::Error::other("the wal sync thread has stopped")));
            }
        }
    }
}
