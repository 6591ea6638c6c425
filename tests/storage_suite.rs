//! openraft's own storage conformance suite against ctrlog's log store (segmented WAL + sled)
//! and state machine (JobState + sled snapshots).

use std::sync::Arc;

use ctrlog::raft::state_machine::StateMachineStore;
use ctrlog::raft::storage::log_store::{Flushing, LogStore};
use ctrlog::raft::storage::meta_store::MetaStore;
use ctrlog::raft::TypeConfig;
use openraft::testing::{StoreBuilder, Suite};
use openraft::StorageError;
use tempfile::TempDir;

struct Builder;

impl StoreBuilder<TypeConfig, LogStore, StateMachineStore, TempDir> for Builder {
    async fn build(&self) -> Result<(TempDir, LogStore, StateMachineStore), StorageError<u64>> {
        let dir = TempDir::new().expect("temp dir");
        let meta = Arc::new(MetaStore::open(&dir.path().join("meta")).expect("sled"));
        // Small segments, so the suite's purges and truncations cross segment boundaries.
        let log = LogStore::open_with(
            &dir.path().join("log"),
            meta.clone(),
            256,
            Flushing::GroupCommit,
        )
        .expect("wal");
        let state_machine = StateMachineStore::open(meta, log.clone()).expect("state machine");
        Ok((dir, log, state_machine))
    }
}

/// Goal: the storage layer honours every contract openraft checks.
/// Steps: run `Suite::test_all`, which builds fresh stores per case.
#[test]
fn log_store_and_state_machine_pass_openraft_storage_suite() {
    if let Err(error) = Suite::test_all(Builder) {
        panic!("storage suite failed: {error}");
    }
}
