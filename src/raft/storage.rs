//! A replica's data directory: sled (metadata and snapshots) in `meta/`, the WAL in `log/`.
//!
//! The layout is spelled here once, for a replica's start and for disaster recovery alike.

use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::log_store::{Flushing, LogStore, SEGMENT_BYTES_MAX};
use super::meta_store::{Closed, MetaStore};
use super::state_machine::StateMachineStore;

/// Where a replica keeps sled (metadata and snapshots) inside its data directory.
pub fn meta_dir(data_dir: &Path) -> PathBuf {
    data_dir.join("meta")
}

/// Where a replica keeps the WAL (the Raft log) inside its data directory.
pub fn log_dir(data_dir: &Path) -> PathBuf {
    data_dir.join("log")
}

/// Opens the metadata and the log (the WAL) of the replica whose data is in `data_dir`.
pub fn open_log(data_dir: &Path) -> io::Result<(Arc<MetaStore>, LogStore)> {
    open_log_with(data_dir, Flushing::GroupCommit)
}

fn open_log_with(data_dir: &Path, flushing: Flushing) -> io::Result<(Arc<MetaStore>, LogStore)> {
    let meta = Arc::new(MetaStore::open(&meta_dir(data_dir))?);
    let log = LogStore::open_with(
        &log_dir(data_dir),
        meta.clone(),
        SEGMENT_BYTES_MAX,
        flushing,
    )?;
    Ok((meta, log))
}

/// A replica's storage, opened: what Raft runs on.
pub struct Storage {
    pub log: LogStore,
    pub state_machine: StateMachineStore,
    /// Fires once every handle to the storage is gone and sled has released its directory.
    pub closed: Closed,
}

/// Opens a replica's storage in `data_dir`: its metadata and log, and the state machine
/// restored from its latest snapshot.
///
/// Blocking: recovery reads the whole retained log, and opening may wait for the directory's
/// lock. Call it off the async runtime's workers.
pub fn open_storage(data_dir: &Path) -> io::Result<Storage> {
    open_storage_with(data_dir, Flushing::GroupCommit)
}

/// [`open_storage`], flushing appends as `flushing` says (the simulation flushes inline).
pub fn open_storage_with(data_dir: &Path, flushing: Flushing) -> io::Result<Storage> {
    let (meta, log) = open_log_with(data_dir, flushing)?;
    let closed = meta.closed();
    let state_machine = StateMachineStore::open(meta, log.clone())?;
    log.guard_with_snapshots(state_machine.stored_snapshot_last()?)?;
    Ok(Storage {
        log,
        state_machine,
        closed,
    })
}
