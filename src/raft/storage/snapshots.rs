//! The stored snapshot, in sled: its chunks under a storage id no earlier snapshot used, and
//! a header (the pointer) that makes one current. What a snapshot holds is the state
//! machine's to say; here it is bytes with a checksum, stored durably, read back whole and
//! verified, and set aside when it fails its checks (ARCHITECTURE.md, "The storage fault
//! model").

use std::io;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use super::log_store::LogStore;
use super::meta_store::{sled_io, MetaStore, VALUE_BYTES_MAX};
use super::write_faults::{attempt, Operation};
use crate::log::{decode, encode};
use crate::raft::types::{LogId, SnapshotMeta};

const SNAPSHOT_TREE: &str = "snapshot";
const CURRENT_KEY: &[u8] = b"current";

/// The pointer to the current snapshot, stored under [`CURRENT_KEY`].
#[derive(Clone, Debug, Serialize, Deserialize)]
struct StoredSnapshotHeader {
    meta: SnapshotMeta,
    /// Chunks live under this id, so a new snapshot never overwrites the current one.
    storage_id: u64,
    chunks: u32,
    bytes: u64,
    crc: u32,
}

/// The stored snapshot of one replica. Clones share one store.
#[derive(Clone)]
pub struct SnapshotStore {
    meta: Arc<MetaStore>,
    /// Told of every snapshot made current, which the log may then be purged behind.
    log: LogStore,
    next_storage_id: Arc<AtomicU64>,
    /// Serialises snapshot writes (a build and an install must not interleave).
    lock: Arc<tokio::sync::Mutex<()>>,
}

/// A snapshot read back from the store, verified: its metadata and its bytes.
pub struct StoredSnapshot {
    pub meta: SnapshotMeta,
    pub bytes: Vec<u8>,
}

fn chunk_key(storage_id: u64, chunk: u32) -> [u8; 12] {
    let mut key = [0u8; 12];
    key[..8].copy_from_slice(&storage_id.to_be_bytes());
    key[8..].copy_from_slice(&chunk.to_be_bytes());
    key
}

impl SnapshotStore {
    /// Opens the snapshot store in `meta`, removing the chunks a crash orphaned, and reads the
    /// current snapshot back whole; a damaged one fails with [`DamagedSnapshot`].
    pub fn open(
        meta: Arc<MetaStore>,
        log: LogStore,
    ) -> io::Result<(SnapshotStore, Option<StoredSnapshot>)> {
        let tree = meta.tree(SNAPSHOT_TREE)?;
        let header = read_header(&tree).map_err(|e| DamagedSnapshot::from_read(None, e))?;
        let next_storage_id =
            remove_orphaned_chunks(&meta, &tree, header.as_ref().map(|h| h.storage_id))?;
        let current = match header {
            Some(header) => {
                let bytes = read_chunks(&tree, &header)
                    .map_err(|e| DamagedSnapshot::from_read(header.meta.last_log_id, e))?;
                Some(StoredSnapshot {
                    meta: header.meta,
                    bytes,
                })
            }
            None => None,
        };
        let store = SnapshotStore {
            meta,
            log,
            next_storage_id: Arc::new(AtomicU64::new(next_storage_id)),
            lock: Arc::new(tokio::sync::Mutex::new(())),
        };
        Ok((store, current))
    }

    /// The current snapshot, read back whole and verified; `None` without one.
    pub fn current(&self) -> io::Result<Option<StoredSnapshot>> {
        let tree = self.meta.tree(SNAPSHOT_TREE)?;
        let Some(header) = read_header(&tree)? else {
            return Ok(None);
        };
        let bytes = read_chunks(&tree, &header)?;
        Ok(Some(StoredSnapshot {
            meta: header.meta,
            bytes,
        }))
    }

    /// The last entry the stored snapshot covers, `None` without one.
    pub fn stored_last(&self) -> io::Result<Option<LogId>> {
        let tree = self.meta.tree(SNAPSHOT_TREE)?;
        Ok(read_header(&tree)?.and_then(|h| h.meta.last_log_id))
    }

    /// The storage id the next snapshot will take: it names a build's snapshot.
    pub fn next_storage_id(&self) -> u64 {
        self.next_storage_id.load(Ordering::Relaxed)
    }

    /// Verifies the stored snapshot as [`verify_stored_snapshot`] does, telling `read` of
    /// each chunk read: for the scrubber, which paces its reads.
    pub fn verify(
        &self,
        read: impl FnMut(u64),
    ) -> io::Result<Result<Option<LogId>, DamagedSnapshot>> {
        verify_stored_snapshot(&self.meta, read)
    }

    /// Whether damage that [`SnapshotStore::verify`] found is there: verified again while no
    /// snapshot can be stored, so that one stored meanwhile is not taken for damage.
    /// Blocking: call it off the runtime's workers.
    pub fn confirm_damage(&self) -> io::Result<Option<DamagedSnapshot>> {
        let _no_store = self.lock.blocking_lock();
        Ok(verify_stored_snapshot(&self.meta, |_| {})?.err())
    }

    /// Where sled's data file is, which holds the stored snapshot.
    pub fn sled_data_path(&self) -> std::path::PathBuf {
        self.meta.data_path().to_path_buf()
    }

    /// Persists `bytes` as the current snapshot with `meta`, durably, replacing the previous one
    /// unless that one is newer. Returns whether it was stored.
    ///
    /// Invariants:
    /// * the stored snapshot's last log id never goes down: a build that encoded the state at
    ///   `A` and finishes after an install of `B > A` was stored leaves `B` in place;
    /// * a snapshot's chunks are written under a storage id no earlier snapshot used (ids only
    ///   grow, and open starts past every id on disk), and only the pointer switch makes them
    ///   current, so a crash at any point leaves the previous snapshot whole; what it orphans
    ///   is removed at the next open ([`SnapshotStore::open`]).
    pub async fn store(&self, meta: &SnapshotMeta, bytes: &[u8]) -> io::Result<bool> {
        let _guard = self.lock.lock().await;
        let tree = self.meta.tree(SNAPSHOT_TREE)?;
        let previous = read_header(&tree)?;
        if let Some(newer) = previous
            .as_ref()
            .filter(|p| p.meta.last_log_id > meta.last_log_id)
        {
            tracing::info!(
                stored = ?newer.meta.last_log_id,
                offered = ?meta.last_log_id,
                "a newer snapshot is stored already; keeping it"
            );
            return Ok(false);
        }
        let storage_id = self.next_storage_id.fetch_add(1, Ordering::Relaxed);
        let mut chunks = 0u32;
        let data_path = self.meta.data_path();
        for chunk in bytes.chunks(VALUE_BYTES_MAX) {
            attempt(data_path, Operation::Write, || {
                (tree.insert(chunk_key(storage_id, chunks), chunk)).map_err(sled_io)
            })?;
            chunks += 1;
        }
        let header = StoredSnapshotHeader {
            meta: meta.clone(),
            storage_id,
            chunks,
            bytes: bytes.len() as u64,
            crc: crc32fast::hash(bytes),
        };
        // Chunks first, then the pointer: both durable before the old chunks go.
        self.meta.sync()?;
        tree.insert(CURRENT_KEY, encode(&header)).map_err(sled_io)?;
        self.meta.sync()?;
        self.log.snapshot_stored(meta.last_log_id)?;
        if let Some(previous) = previous {
            for chunk in 0..previous.chunks {
                tree.remove(chunk_key(previous.storage_id, chunk))
                    .map_err(sled_io)?;
            }
        }
        Ok(true)
    }
}

/// Removes the chunks of every snapshot but the current one: those a crash left behind, between
/// writing a new snapshot's chunks and switching the pointer, or between the switch and the
/// removal of the old chunks. Returns the storage id the next snapshot may use, past every id
/// found, so that no id is ever used twice.
fn remove_orphaned_chunks(
    meta: &MetaStore,
    tree: &sled::Tree,
    current: Option<u64>,
) -> io::Result<u64> {
    let mut next_id = current.map_or(1, |id| id + 1);
    let mut orphans = Vec::new();
    for item in tree.iter() {
        let (key, _) = item.map_err(sled_io)?;
        let Ok(chunk_key) = <[u8; 12]>::try_from(&key[..]) else {
            continue; // the pointer
        };
        let id = u64::from_be_bytes(chunk_key[..8].try_into().expect("8 bytes"));
        next_id = next_id.max(id + 1);
        if Some(id) != current {
            orphans.push(key);
        }
    }
    if !orphans.is_empty() {
        tracing::warn!(
            chunks = orphans.len(),
            "removing snapshot chunks a crash left behind"
        );
        for key in orphans {
            tree.remove(key).map_err(sled_io)?;
        }
        meta.sync()?;
    }
    Ok(next_id)
}

/// A stored snapshot that fails its checks: a header that does not decode, a missing chunk,
/// or bytes whose length or checksum are not the header's. [`SnapshotStore::open`] fails
/// with it (inside an [`io::ErrorKind::InvalidData`] error) rather than restore the snapshot.
#[derive(Clone, Debug, thiserror::Error)]
#[error("the stored snapshot is damaged: {problem}")]
pub struct DamagedSnapshot {
    /// The last entry it covered, if its header still says.
    pub last: Option<LogId>,
    pub problem: String,
}

impl DamagedSnapshot {
    /// The damage `error` reports, if it is one.
    pub fn in_error(error: &io::Error) -> Option<&DamagedSnapshot> {
        error.get_ref()?.downcast_ref()
    }

    /// `error` as damage to the snapshot that covered up to `last`, if it is invalid data
    /// (sled's own errors are not damage found).
    fn from_read(last: Option<LogId>, error: io::Error) -> io::Error {
        if error.kind() != io::ErrorKind::InvalidData {
            return error;
        }
        let problem = error.to_string();
        io::Error::new(
            io::ErrorKind::InvalidData,
            DamagedSnapshot { last, problem },
        )
    }
}

/// Moves the damaged stored snapshot out of sled: its header and chunks, as found, are
/// written to `kept/snapshot` (synced), then removed from sled durably.
pub fn set_aside_damaged_snapshot(meta: &MetaStore, kept: &std::path::Path) -> io::Result<()> {
    use std::io::Write as _;
    let tree = meta.tree(SNAPSHOT_TREE)?;
    let mut file = std::fs::File::create(kept.join("snapshot"))?;
    let mut keys = Vec::new();
    for item in tree.iter() {
        let (key, value) = item.map_err(sled_io)?;
        file.write_all(&(key.len() as u32).to_le_bytes())?;
        file.write_all(&key)?;
        file.write_all(&(value.len() as u32).to_le_bytes())?;
        file.write_all(&value)?;
        keys.push(key);
    }
    file.sync_all()?;
    for key in keys {
        tree.remove(key).map_err(sled_io)?;
    }
    meta.sync()
}

/// Reads the stored snapshot in `meta` whole and verifies it (its header, every chunk, its
/// length and checksum), changing nothing: the last entry it covers (`None`: no snapshot), or
/// the damage found. `read(bytes)` is told of each chunk as it is read, for a caller that
/// paces its reads (the scrubber). For the offline check and the scrubber; a snapshot stored
/// meanwhile can look damaged (its predecessor's chunks go once it is stored), which
/// [`SnapshotStore::confirm_damage`] tells.
pub fn verify_stored_snapshot(
    meta: &MetaStore,
    mut read: impl FnMut(u64),
) -> io::Result<Result<Option<LogId>, DamagedSnapshot>> {
    let damaged = |last, problem: String| Ok(Err(DamagedSnapshot { last, problem }));
    let tree = meta.tree(SNAPSHOT_TREE)?;
    let header = match read_header(&tree) {
        Ok(Some(header)) => header,
        Ok(None) => return Ok(Ok(None)),
        Err(error) if error.kind() == io::ErrorKind::InvalidData => {
            return damaged(None, error.to_string())
        }
        Err(error) => return Err(error),
    };
    let last = header.meta.last_log_id;
    let (mut bytes, mut crc) = (0u64, crc32fast::Hasher::new());
    for chunk in 0..header.chunks {
        let key = chunk_key(header.storage_id, chunk);
        let Some(value) = tree.get(key).map_err(sled_io)? else {
            return damaged(last, format!("snapshot chunk {chunk} is missing"));
        };
        crc.update(&value);
        bytes += value.len() as u64;
        read(value.len() as u64);
    }
    if bytes != header.bytes || crc.finalize() != header.crc {
        return damaged(last, "stored snapshot fails its length or checksum".into());
    }
    Ok(Ok(last))
}

fn read_header(tree: &sled::Tree) -> io::Result<Option<StoredSnapshotHeader>> {
    match tree.get(CURRENT_KEY).map_err(sled_io)? {
        Some(bytes) => {
            Ok(Some(decode(&bytes, 1 << 20).map_err(|e| {
                io::Error::new(io::ErrorKind::InvalidData, e)
            })?))
        }
        None => Ok(None),
    }
}

fn read_chunks(tree: &sled::Tree, header: &StoredSnapshotHeader) -> io::Result<Vec<u8>> {
    let mut bytes = Vec::with_capacity(header.bytes as usize);
    for chunk in 0..header.chunks {
        let value = tree
            .get(chunk_key(header.storage_id, chunk))
            .map_err(sled_io)?
            .ok_or_else(|| {
                io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!("snapshot chunk {chunk} is missing"),
                )
            })?;
        bytes.extend_from_slice(&value);
    }
    if bytes.len() as u64 != header.bytes || crc32fast::hash(&bytes) != header.crc {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            "stored snapshot fails its length or checksum",
        ));
    }
    Ok(bytes)
}

/// Rot in a replica's stored snapshot, for the tools and tests that inject it. None of this is
/// called by a replica itself.
pub mod faults {
    use super::*;

    /// Flips one byte of the stored snapshot's chunks in the sled database in `meta_dir`, at
    /// `at` modulo their bytes, as rot that sled's own checks miss would (a misdirected write,
    /// or a flip in memory before sled wrote it). Returns the byte's offset in the snapshot,
    /// `None` when there is no snapshot. The replica must be stopped.
    pub fn flip_snapshot_byte(meta_dir: &std::path::Path, at: u64) -> io::Result<Option<u64>> {
        flip_stored_snapshot_byte(&MetaStore::open(meta_dir)?, at)
    }

    /// [`flip_snapshot_byte`] in a running replica's snapshot store: what sled hands back
    /// from then on, as rot under a running replica is.
    pub fn flip_running_snapshot_byte(
        snapshots: &SnapshotStore,
        at: u64,
    ) -> io::Result<Option<u64>> {
        flip_stored_snapshot_byte(&snapshots.meta, at)
    }

    fn flip_stored_snapshot_byte(meta: &MetaStore, at: u64) -> io::Result<Option<u64>> {
        let tree = meta.tree(SNAPSHOT_TREE)?;
        let Some(header) = read_header(&tree)? else {
            return Ok(None);
        };
        let mut left = at % header.bytes.max(1);
        let offset = left;
        for chunk in 0..header.chunks {
            let key = chunk_key(header.storage_id, chunk);
            let Some(value) = tree.get(key).map_err(io::Error::other)? else {
                continue;
            };
            if (left as usize) < value.len() {
                let mut value = value.to_vec();
                value[left as usize] = !value[left as usize];
                tree.insert(key, value).map_err(io::Error::other)?;
                meta.sync()?;
                return Ok(Some(offset));
            }
            left -= value.len() as u64;
        }
        Ok(None)
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use openraft::CommittedLeaderId;

    use super::*;
    use crate::raft::types::StoredMembership;

    fn open(dir: &std::path::Path) -> SnapshotStore {
        let meta = Arc::new(MetaStore::open(&dir.join("meta")).unwrap());
        let log = LogStore::open(&dir.join("log"), meta.clone()).unwrap();
        SnapshotStore::open(meta, log).unwrap().0
    }

    /// A snapshot of some bytes, covering up to `index`.
    fn snapshot_at(index: u64) -> (SnapshotMeta, Vec<u8>) {
        let last = Some(LogId::new(CommittedLeaderId::new(1, 1), index));
        let meta = SnapshotMeta {
            last_log_id: last,
            last_membership: StoredMembership::default(),
            snapshot_id: format!("test-{index}"),
        };
        (meta, format!("state at {index}").into_bytes())
    }

    fn chunk_ids(store: &SnapshotStore) -> BTreeSet<u64> {
        let tree = store.meta.tree(SNAPSHOT_TREE).unwrap();
        tree.iter()
            .keys()
            .map(|k| k.unwrap())
            .filter(|k| k.len() == 12)
            .map(|k| u64::from_be_bytes(k[..8].try_into().unwrap()))
            .collect()
    }

    /// Regression: chunks a crash orphaned (a new snapshot's, before the pointer switched; an
    /// old one's, after) are removed at open, and the next snapshot's id is past every id that
    /// was on disk, so it never shares an id with an orphan.
    #[tokio::test]
    async fn orphaned_chunks_are_removed_at_open_and_ids_never_reused() {
        let dir = tempfile::tempdir().unwrap();
        let store = open(dir.path());
        let (meta, bytes) = snapshot_at(20);
        assert!(store.store(&meta, &bytes).await.unwrap());
        let current = chunk_ids(&store);
        assert_eq!(current.len(), 1);
        let current = *current.first().unwrap();
        // What two crashes would leave: chunks of a snapshot never made current (a higher id)
        // and of a replaced one never removed (a lower id).
        let tree = store.meta.tree(SNAPSHOT_TREE).unwrap();
        tree.insert(chunk_key(current + 5, 0), &b"orphan"[..])
            .unwrap();
        tree.insert(chunk_key(current - 1, 3), &b"stale"[..])
            .unwrap();
        store.meta.sync().unwrap();
        drop((tree, store));

        let store = open(dir.path());
        assert_eq!(chunk_ids(&store), BTreeSet::from([current]));
        assert_eq!(store.stored_last().unwrap(), meta.last_log_id);
        let (next, next_bytes) = snapshot_at(30);
        assert!(store.store(&next, &next_bytes).await.unwrap());
        let ids = chunk_ids(&store);
        assert_eq!(ids.len(), 1);
        assert!(*ids.first().unwrap() > current + 5, "a fresh id: {ids:?}");
    }
}
