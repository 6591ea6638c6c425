//! sled, made durable where the contract needs it: the vote, the purge point and snapshots.
//!
//! sled's `flush` is `pwrite` + `sync_file_range`: it survives a process kill but not a power
//! loss (no metadata, no device cache; sled #1452). So every write the durability contract
//! depends on is followed by `fdatasync` of sled's data file, through our own handle to it
//! (fsync works on the inode, whichever descriptor calls it).
//!
//! sled writes any tree node above 128 KiB to a separate blob file that it never fsyncs. A leaf
//! holds up to 16 items, so every value stored here stays at or below [`VALUE_BYTES_MAX`].

use std::fs::File;
use std::io;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use tokio::sync::watch;

use super::write_faults::{self, Operation};

/// The largest value written to sled: 16 items of this size keep a leaf at 64 KiB, half of the
/// 128 KiB above which sled would move the node into an unsynced blob file.
pub const VALUE_BYTES_MAX: usize = 4 << 10;

/// sled's page cache. Small on purpose: sled holds metadata and snapshot chunks, which are read
/// rarely, and a replica's resident memory is budgeted (BENCHMARKS.md).
pub const CACHE_BYTES: u64 = 16 << 20;

/// How long [`MetaStore::open`] waits for the directory's lock. A replica restarted within one
/// process may find its previous instance still letting go: sled releases the lock from its
/// own threads moments after the last handle is dropped. Another live process keeps the lock,
/// and the wait ends in a `ResourceBusy` error that names the directory.
const LOCK_WAIT_MAX: Duration = Duration::from_secs(2);

pub struct MetaStore {
    db: sled::Db,
    data_file: File,
    data_path: PathBuf,
    /// Declared last, so dropped after sled and the data file: see [`MetaStore::closed`].
    closed_when_dropped: watch::Sender<()>,
}

/// sled refusing to open its own files as damaged (its recovery reports corruption, or
/// panics): they hold nothing that cannot be fetched from the leader again, so the replica's
/// storage sets them aside and starts sled over (`raft::storage`). Other errors (the lock,
/// permissions, I/O) are not damage and stop the replica.
#[derive(Debug, thiserror::Error)]
#[error("sled could not open {}: {why}", dir.display())]
pub struct SledRefused {
    pub dir: PathBuf,
    pub why: String,
}

impl SledRefused {
    /// The refusal `error` reports, if it is one.
    pub fn in_error(error: &io::Error) -> Option<&SledRefused> {
        error.get_ref()?.downcast_ref()
    }

    fn into_io(self) -> io::Error {
        io::Error::new(io::ErrorKind::InvalidData, self)
    }
}

/// Resolves once the store it came from is dropped, with sled closed.
pub struct Closed(watch::Receiver<()>);

impl Closed {
    pub async fn wait(mut self) {
        // Nothing is ever sent: `changed` returns only when the sender is gone.
        while self.0.changed().await.is_ok() {}
    }
}

impl MetaStore {
    pub fn open(dir: &Path) -> io::Result<MetaStore> {
        wait_for_lock(dir)?;
        let config = sled::Config::new().path(dir).cache_capacity(CACHE_BYTES);
        // sled's recovery may panic on files damaged in ways its checks did not foresee: that
        // is a refusal to open, reported as one, naming the directory.
        // Nothing of `config` is used after a panic, so no broken invariant can be observed.
        let opened = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| config.open()));
        let refused = |why: String| SledRefused {
            dir: dir.to_path_buf(),
            why,
        };
        let opened = opened.map_err(|panic| {
            let why = panic
                .downcast_ref::<String>()
                .map(String::as_str)
                .or_else(|| panic.downcast_ref::<&str>().copied())
                .unwrap_or("a panic");
            refused(why.to_owned()).into_io()
        })?;
        let db = opened.map_err(|error| match error {
            // `Unsupported` at open is sled reading its `conf` as another version's: ctrlog
            // has only ever run one sled, so that is damage too (seen: one inverted byte).
            sled::Error::Corruption { .. }
            | sled::Error::ReportableBug(_)
            | sled::Error::Unsupported(_) => refused(error.to_string()).into_io(),
            sled::Error::Io(error) => io::Error::new(
                error.kind(),
                format!(
                    "sled could not open {}: {error}{}",
                    dir.display(),
                    write_faults::remedy(&error)
                ),
            ),
            error => io::Error::other(format!("sled could not open {}: {error}", dir.display())),
        })?;
        let data_path = dir.join("db");
        let data_file = File::open(&data_path)?;
        Ok(MetaStore {
            db,
            data_file,
            data_path,
            closed_when_dropped: watch::Sender::new(()),
        })
    }

    /// A signal for whoever must reopen this directory: the store is closed once every handle
    /// is gone, and handles may outlive their owner in tasks still winding down.
    pub fn closed(&self) -> Closed {
        Closed(self.closed_when_dropped.subscribe())
    }

    pub fn tree(&self, name: &str) -> io::Result<sled::Tree> {
        self.db.open_tree(name).map_err(sled_io)
    }

    /// Makes every write so far durable: sled's own flush, then `fdatasync` of its data file.
    /// The error names the file ([`write_faults`]).
    pub fn sync(&self) -> io::Result<()> {
        write_faults::attempt(&self.data_path, Operation::Sync, || {
            self.db.flush().map_err(sled_io)?;
            self.data_file.sync_data()
        })
    }

    /// Where sled's data file is: what names sled in errors.
    pub fn data_path(&self) -> &Path {
        &self.data_path
    }

    pub fn get(&self, key: &str) -> io::Result<Option<Vec<u8>>> {
        Ok(self.db.get(key).map_err(sled_io)?.map(|v| v.to_vec()))
    }

    /// Inserts a small value and makes it durable before returning.
    pub fn put_durable(&self, key: &str, value: &[u8]) -> io::Result<()> {
        assert!(
            value.len() <= VALUE_BYTES_MAX,
            "sled values stay below the blob threshold"
        );
        self.db.insert(key, value).map_err(sled_io)?;
        self.sync()
    }

    /// Removes a key and makes that durable before returning.
    pub fn remove_durable(&self, key: &str) -> io::Result<()> {
        self.db.remove(key).map_err(sled_io)?;
        self.sync()
    }

    /// Inserts a value without waiting for it to be durable (for advisory data).
    pub fn put(&self, key: &str, value: &[u8]) -> io::Result<()> {
        assert!(
            value.len() <= VALUE_BYTES_MAX,
            "sled values stay below the blob threshold"
        );
        self.db.insert(key, value).map_err(sled_io)?;
        Ok(())
    }

    /// Bytes sled uses on disk.
    pub fn disk_bytes(&self) -> u64 {
        self.db.size_on_disk().unwrap_or(0)
    }
}

/// Waits up to [`LOCK_WAIT_MAX`] until nobody holds the lock sled takes on `dir/db`, then lets
/// go of it for sled to take. It is sled's own lock (an exclusive `flock` through `fs2`, as
/// sled 0.34 takes it), so the two can never disagree about who holds the directory.
pub(super) fn wait_for_lock(dir: &Path) -> io::Result<()> {
    let data_file = match File::open(dir.join("db")) {
        Ok(file) => file,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(e),
    };
    let deadline = Instant::now() + LOCK_WAIT_MAX;
    loop {
        match fs2::FileExt::try_lock_exclusive(&data_file) {
            Ok(()) => return Ok(()),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock && Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(10));
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                return Err(io::Error::new(
                    io::ErrorKind::ResourceBusy,
                    format!(
                        "{} is in use: another replica holds its lock",
                        dir.display()
                    ),
                ))
            }
            Err(e) => return Err(e),
        }
    }
}

/// Rot in a stopped replica's sled files, for the tools and tests that inject it. None of this
/// is called by a running replica.
pub mod faults {
    use std::io;
    use std::path::Path;

    /// The file in sled's directory that holds its log and pages.
    const DATA_FILE: &str = "db";

    /// Flips one byte of sled's data file in `meta_dir`, at `at` modulo its length, under
    /// sled's own checks, as a rotting disk would: sled's recovery may drop its later writes
    /// or refuse the files. Returns the byte's offset, `None` when there is no data file. The
    /// replica must be stopped.
    pub fn flip_data_file_byte(meta_dir: &Path, at: u64) -> io::Result<Option<u64>> {
        let path = meta_dir.join(DATA_FILE);
        let len = match std::fs::metadata(&path) {
            Ok(metadata) => metadata.len(),
            Err(error) if error.kind() == io::ErrorKind::NotFound => return Ok(None),
            Err(error) => return Err(error),
        };
        let Some(byte) = at.checked_rem(len) else {
            return Ok(None);
        };
        crate::raft::storage::files::faults::invert_byte(&path, byte)?;
        Ok(Some(byte))
    }
}

/// A sled error as an I/O error, keeping the kind of one that was I/O (a full disk stays
/// `StorageFull`, so that its remedy can be named).
pub(crate) fn sled_io(error: sled::Error) -> io::Error {
    match error {
        sled::Error::Io(error) => error,
        error => io::Error::other(error),
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use futures::FutureExt;

    use super::*;

    /// Goal: a second store on a directory in use is refused with a typed error naming it.
    /// Steps: open a store; open another on the same directory while the first lives; it
    /// fails with `ResourceBusy` after the lock wait, and the message names the directory.
    #[test]
    fn a_directory_in_use_is_refused_by_name() {
        let dir = tempfile::tempdir().unwrap();
        let _first = MetaStore::open(dir.path()).unwrap();
        let error = MetaStore::open(dir.path())
            .err()
            .expect("the directory is locked");
        assert_eq!(error.kind(), io::ErrorKind::ResourceBusy);
        assert!(
            error
                .to_string()
                .contains(&dir.path().display().to_string()),
            "{error}"
        );
    }

    /// Goal: a directory whose previous store is still closing opens once it has closed, rather
    /// than failing on the lock (a replica restarted in the same process).
    /// Steps: open a store and write a value; another thread starts opening the directory;
    /// once it has started, drop the first store; the second open succeeds and reads the value.
    #[test]
    fn a_directory_released_while_opening_is_opened() {
        let dir = tempfile::tempdir().unwrap();
        let first = MetaStore::open(dir.path()).unwrap();
        first.put_durable("key", b"value").unwrap();
        let (started, opening) = std::sync::mpsc::channel();
        let path = dir.path().to_owned();
        let second = std::thread::spawn(move || {
            started.send(()).unwrap();
            MetaStore::open(&path)
        });
        opening.recv().unwrap();
        drop(first);
        let second = second.join().unwrap().expect("opened once released");
        assert_eq!(second.get("key").unwrap(), Some(b"value".to_vec()));
    }

    /// Goal: `closed` fires only when the last handle is gone, and the directory then reopens.
    /// Steps: open a store shared by two handles; drop one: not closed; drop the other:
    /// closed; open the directory again, with the value written before still there.
    #[test]
    fn closed_fires_once_every_handle_is_dropped() {
        let dir = tempfile::tempdir().unwrap();
        let store = Arc::new(MetaStore::open(dir.path()).unwrap());
        store.put_durable("key", b"value").unwrap();
        let other_handle = store.clone();
        let mut closed = store.closed().wait().boxed();
        drop(store);
        assert!((&mut closed).now_or_never().is_none());
        drop(other_handle);
        assert!(closed.now_or_never().is_some());
        let reopened = MetaStore::open(dir.path()).unwrap();
        assert_eq!(reopened.get("key").unwrap(), Some(b"value".to_vec()));
    }
}
