//! Writes and `fdatasync`s that fail: a full disk answers `ENOSPC`, a failing device `EIO`
//! (ARCHITECTURE.md, "The storage fault model").
//!
//! Either stops the replica, and nothing is retried: a failed `fdatasync` may have dropped the
//! dirty pages it was asked to write, and a second one that succeeds says nothing of them
//! (PostgreSQL's "fsyncgate"), so the log that saw one vouches for nothing written since
//! (`log_store::Durable::failed`). openraft stops on the storage error, `ctrlog serve` exits
//! naming the file, and the restart on the same directory recovers as from a crash: a torn
//! tail is cut, and the peers send what is missing.
//!
//! Every write of the storage runs through [`attempt`], which names its file in its error
//! and first checks whether the storage's injector ([`faults`]) fails it as a full disk or a
//! failing device would. With nothing injected, a check is one relaxed atomic load.

use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;

/// What a storage write does to its file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Operation {
    /// Writes bytes: the WAL's records, sled's inserts of a snapshot, a record file's copies.
    Write,
    /// Makes them durable: the WAL's `fdatasync`, sled's flush.
    Sync,
}

impl Operation {
    fn verb(self) -> &'static str {
        match self {
            Operation::Write => "writing",
            Operation::Sync => "flushing (fdatasync)",
        }
    }
}

/// One injected failure: every `operation` on a file under `under` fails with `errno`.
struct Failing {
    under: PathBuf,
    operation: Operation,
    errno: i32,
}

static FAILING: Mutex<Vec<Failing>> = Mutex::new(Vec::new());

/// Whether [`FAILING`] holds anything: the one thing a check reads when nothing is injected.
static ANY_FAILING: AtomicBool = AtomicBool::new(false);

fn failing() -> std::sync::MutexGuard<'static, Vec<Failing>> {
    FAILING
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// `Err` with the injected error if `operation` on the file at `path` is made to fail, named
/// as [`naming`] names it.
fn check(path: &Path, operation: Operation) -> io::Result<()> {
    if !ANY_FAILING.load(Ordering::Relaxed) {
        return Ok(());
    }
    let errno = failing()
        .iter()
        .find(|f| f.operation == operation && path.starts_with(&f.under))
        .map(|f| f.errno);
    match errno {
        Some(errno) => Err(naming(path, operation, io::Error::from_raw_os_error(errno))),
        None => Ok(()),
    }
}

/// Runs `operation` on the file at `path` (`run`), failing it as injected (`check`) and
/// naming the file in its error (`naming`).
pub fn attempt<T>(
    path: &Path,
    operation: Operation,
    run: impl FnOnce() -> io::Result<T>,
) -> io::Result<T> {
    check(path, operation)?;
    run().map_err(|error| naming(path, operation, error))
}

/// `error`, from `operation` on the file at `path`, with a message that names both: what an
/// operator reads when the replica stops. The kind is kept.
fn naming(path: &Path, operation: Operation, error: io::Error) -> io::Error {
    io::Error::new(
        error.kind(),
        format!(
            "{} {} failed: {error}{}",
            operation.verb(),
            path.display(),
            remedy(&error)
        ),
    )
}

/// What an operator does about `error`, as a clause to append to its message ("" when the
/// error has no remedy of its own).
pub(super) fn remedy(error: &io::Error) -> &'static str {
    // sled hands its I/O errors on rebuilt, without the errno, but with the kind.
    let full = error.kind() == io::ErrorKind::StorageFull;
    match error.raw_os_error() {
        Some(libc::ENOSPC) => DISK_FULL,
        None if full => DISK_FULL,
        Some(libc::EIO) => "; the device failed: check it, then restart the replica",
        _ => "",
    }
}

const DISK_FULL: &str = "; the disk is full: free space, then restart the replica";

/// `error`, from opening the storage in `data_dir`, with the directory and the remedy added
/// when the error has one and does not say it yet (sled's own errors name no file).
pub fn naming_the_remedy(data_dir: &Path, error: io::Error) -> io::Error {
    let remedy = remedy(&error);
    let text = error.to_string();
    if remedy.is_empty() || text.contains(remedy) {
        return error;
    }
    io::Error::new(
        error.kind(),
        format!("{}: {text}{remedy}", data_dir.display()),
    )
}

/// Failing writes, for the tools and tests that inject them.
pub mod faults {
    use std::path::Path;
    use std::sync::atomic::Ordering;

    use super::{failing, Failing, Operation, ANY_FAILING};

    /// Makes every `operation` on a file under `under` fail with `errno` (`libc::ENOSPC`,
    /// `libc::EIO`) until [`heal_under`].
    pub fn fail_under(under: &Path, operation: Operation, errno: i32) {
        failing().push(Failing {
            under: under.to_path_buf(),
            operation,
            errno,
        });
        ANY_FAILING.store(true, Ordering::Relaxed);
    }

    /// Lifts every failure injected under `dir`: space was freed, the device replaced.
    pub fn heal_under(dir: &Path) {
        let mut failing = failing();
        failing.retain(|f| !f.under.starts_with(dir));
        ANY_FAILING.store(!failing.is_empty(), Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_injected_failure_hits_its_operation_under_its_folder_only() {
        let dir = Path::new("/data/replica-2");
        let segment = dir.join("log/00000000000000000001.wal");
        faults::fail_under(dir, Operation::Sync, libc::ENOSPC);
        check(&segment, Operation::Write).unwrap();
        check(Path::new("/data/replica-3/log/1.wal"), Operation::Sync).unwrap();
        let error = check(&segment, Operation::Sync).unwrap_err();
        assert_eq!(error.kind(), io::ErrorKind::StorageFull);
        let message = error.to_string();
        assert!(
            message.contains(&*segment.to_string_lossy()) && message.contains("disk is full"),
            "{message}"
        );
        faults::heal_under(dir);
        check(&segment, Operation::Sync).unwrap();
    }
}
