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
use std::path::Path;

/// The largest value written to sled: 16 items of this size keep a leaf at 64 KiB, half of the
/// 128 KiB above which sled would move the node into an unsynced blob file.
pub const VALUE_BYTES_MAX: usize = 4 << 10;

/// sled's page cache. Small on purpose: sled holds metadata and snapshot chunks, which are read
/// rarely, and a replica's resident memory is budgeted (DESIGN.md, issue targets).
pub const CACHE_BYTES: u64 = 16 << 20;

pub struct MetaStore {
    db: sled::Db,
    data_file: File,
}

impl MetaStore {
    pub fn open(dir: &Path) -> io::Result<MetaStore> {
        let db = sled::Config::new()
            .path(dir)
            .cache_capacity(CACHE_BYTES)
            .open()
            .map_err(io::Error::other)?;
        let data_file = File::open(dir.join("db"))?;
        Ok(MetaStore { db, data_file })
    }

    pub fn tree(&self, name: &str) -> io::Result<sled::Tree> {
        self.db.open_tree(name).map_err(io::Error::other)
    }

    /// Makes every write so far durable: sled's own flush, then `fdatasync` of its data file.
    pub fn sync(&self) -> io::Result<()> {
        self.db.flush().map_err(io::Error::other)?;
        self.data_file.sync_data()
    }

    pub fn get(&self, key: &str) -> io::Result<Option<Vec<u8>>> {
        Ok(self
            .db
            .get(key)
            .map_err(io::Error::other)?
            .map(|v| v.to_vec()))
    }

    /// Inserts a small value and makes it durable before returning.
    pub fn put_durable(&self, key: &str, value: &[u8]) -> io::Result<()> {
        assert!(
            value.len() <= VALUE_BYTES_MAX,
            "sled values stay below the blob threshold"
        );
        self.db.insert(key, value).map_err(io::Error::other)?;
        self.sync()
    }

    /// Inserts a value without waiting for it to be durable (for advisory data).
    pub fn put(&self, key: &str, value: &[u8]) -> io::Result<()> {
        assert!(
            value.len() <= VALUE_BYTES_MAX,
            "sled values stay below the blob threshold"
        );
        self.db.insert(key, value).map_err(io::Error::other)?;
        Ok(())
    }

    /// Bytes sled uses on disk.
    pub fn disk_bytes(&self) -> u64 {
        self.db.size_on_disk().unwrap_or(0)
    }
}
