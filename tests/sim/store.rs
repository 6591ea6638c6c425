//! In-memory storage for the simulation: openraft's two storage traits over a [`Disk`] that
//! outlives a crash of its replica.
//!
//! What survives a crash is what the real stores make durable before they acknowledge: the
//! vote, every appended entry (the flush callback runs at once, as if `fdatasync` were
//! instant), the purge point and the current snapshot. The state machine itself is volatile: a
//! restarted replica starts from its snapshot and re-applies the log, exactly as the sled-backed
//! store does. Transitions go through the product's own [`MachineState::apply`].

use std::collections::BTreeMap;
use std::fmt::Debug;
use std::io::Cursor;
use std::ops::RangeBounds;
use std::sync::{Arc, Mutex, MutexGuard};

use ctrlog::log::{decode, encode, LogEntry, Offset};
use ctrlog::raft::state_machine::{entry_commands, log_entry, MachineState, SNAPSHOT_BYTES_MAX};
use ctrlog::raft::types::*;
use ctrlog::raft::TypeConfig;
use openraft::storage::{LogFlushed, LogState, RaftLogStorage, RaftStateMachine};
use openraft::{OptionalSend, RaftLogReader, RaftSnapshotBuilder};

/// What a replica has on stable storage.
#[derive(Default)]
pub struct Disk {
    vote: Option<Vote>,
    committed: Option<LogId>,
    log: BTreeMap<u64, Entry>,
    last_purged: Option<LogId>,
    snapshot: Option<(SnapshotMeta, Vec<u8>)>,
    snapshots_built: u64,
}

/// One replica's storage: the disk plus the volatile state machine of the running incarnation.
#[derive(Clone)]
pub struct Storage {
    disk: Arc<Mutex<Disk>>,
    machine: Arc<Mutex<MachineState>>,
}

/// What a subscriber's fetch from a replica returns.
pub enum Fetched {
    Entries(Vec<LogEntry>),
    /// The position is no longer in this replica's log: here is the state as of `offset`.
    Compacted {
        offset: Offset,
        state: Box<ctrlog::jobs::JobState>,
    },
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().expect("simulation locks are never poisoned")
}

impl Storage {
    pub fn new() -> Storage {
        Storage {
            disk: Arc::default(),
            machine: Arc::default(),
        }
    }

    /// The storage a restarted replica opens: the same disk, the state machine rebuilt from the
    /// stored snapshot (everything after it is re-applied by openraft).
    pub fn reopen(&self) -> Storage {
        let machine = match &lock(&self.disk).snapshot {
            Some((_, bytes)) => decode(bytes, SNAPSHOT_BYTES_MAX).expect("stored snapshots decode"),
            None => MachineState::default(),
        };
        Storage {
            disk: self.disk.clone(),
            machine: Arc::new(Mutex::new(machine)),
        }
    }

    /// Drops the last `entries` of the log, as a crash would if appends were acknowledged
    /// before they were durable. Only the test that shows the simulation catches such a store
    /// calls this.
    pub fn lose_tail(&self, entries: usize) {
        let mut disk = lock(&self.disk);
        for _ in 0..entries {
            disk.log.pop_last();
        }
    }

    pub fn snapshots_built(&self) -> u64 {
        lock(&self.disk).snapshots_built
    }

    pub fn job_state(&self) -> ctrlog::jobs::JobState {
        lock(&self.machine).job.clone()
    }

    /// Applied commands from `from`, at most `max`, the way a replica's fetch serves them: through
    /// the offset index into the retained log.
    pub fn fetch(&self, from: Offset, max: usize) -> Fetched {
        let machine = lock(&self.machine);
        let disk = lock(&self.disk);
        let last = machine.job.last_offset();
        if from > last {
            return Fetched::Entries(Vec::new());
        }
        let start = machine
            .offset_index
            .range(..=from)
            .next_back()
            .filter(|(_, span)| disk.log.contains_key(&span.log_index))
            .map(|(first, _)| *first);
        let Some(start) = start else {
            return Fetched::Compacted {
                offset: last,
                state: Box::new(machine.job.clone()),
            };
        };
        let mut entries = Vec::new();
        for (first, span) in machine.offset_index.range(start..) {
            let Some(entry) = disk.log.get(&span.log_index) else {
                break;
            };
            for (offset, proposal) in entry_commands(*first, span, entry) {
                if offset >= from && entries.len() < max {
                    entries.push(log_entry(offset, proposal, entry));
                }
            }
            if entries.len() >= max {
                break;
            }
        }
        Fetched::Entries(entries)
    }

    /// Every retained command, for comparing replicas at the end of a run.
    pub fn retained_log(&self) -> Vec<LogEntry> {
        let mut all = Vec::new();
        let mut from = 1;
        loop {
            match self.fetch(from, 4096) {
                Fetched::Entries(entries) if entries.is_empty() => return all,
                Fetched::Entries(entries) => {
                    from = entries.last().map_or(from, |e| e.offset + 1);
                    all.extend(entries);
                }
                Fetched::Compacted { .. } => {
                    // Start at the first retained offset instead.
                    let machine = lock(&self.machine);
                    let disk = lock(&self.disk);
                    let first = machine
                        .offset_index
                        .iter()
                        .find(|(_, span)| disk.log.contains_key(&span.log_index))
                        .map(|(first, _)| *first);
                    match first {
                        Some(first) if first > from => from = first,
                        _ => return all,
                    }
                }
            }
        }
    }

    pub fn last_applied_index(&self) -> Option<u64> {
        lock(&self.machine).last_applied.map(|l| l.index)
    }

    pub fn last_offset(&self) -> Offset {
        lock(&self.machine).job.last_offset()
    }
}

impl RaftLogReader<TypeConfig> for Storage {
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug + OptionalSend>(
        &mut self,
        range: RB,
    ) -> Result<Vec<Entry>, StorageError> {
        Ok(lock(&self.disk)
            .log
            .range(range)
            .map(|(_, e)| e.clone())
            .collect())
    }
}

impl RaftLogStorage<TypeConfig> for Storage {
    type LogReader = Storage;

    async fn get_log_state(&mut self) -> Result<LogState<TypeConfig>, StorageError> {
        let disk = lock(&self.disk);
        let last = disk.log.values().next_back().map(|e| e.log_id);
        Ok(LogState {
            last_purged_log_id: disk.last_purged,
            last_log_id: last.or(disk.last_purged),
        })
    }

    async fn get_log_reader(&mut self) -> Self::LogReader {
        self.clone()
    }

    async fn save_vote(&mut self, vote: &Vote) -> Result<(), StorageError> {
        lock(&self.disk).vote = Some(*vote);
        Ok(())
    }

    async fn read_vote(&mut self) -> Result<Option<Vote>, StorageError> {
        Ok(lock(&self.disk).vote)
    }

    async fn save_committed(&mut self, committed: Option<LogId>) -> Result<(), StorageError> {
        lock(&self.disk).committed = committed;
        Ok(())
    }

    async fn read_committed(&mut self) -> Result<Option<LogId>, StorageError> {
        Ok(lock(&self.disk).committed)
    }

    async fn append<I>(
        &mut self,
        entries: I,
        callback: LogFlushed<TypeConfig>,
    ) -> Result<(), StorageError>
    where
        I: IntoIterator<Item = Entry> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        let mut disk = lock(&self.disk);
        for entry in entries {
            disk.log.insert(entry.log_id.index, entry);
        }
        drop(disk);
        callback.log_io_completed(Ok(()));
        Ok(())
    }

    async fn truncate(&mut self, log_id: LogId) -> Result<(), StorageError> {
        lock(&self.disk).log.split_off(&log_id.index);
        Ok(())
    }

    async fn purge(&mut self, log_id: LogId) -> Result<(), StorageError> {
        let mut disk = lock(&self.disk);
        let kept = disk.log.split_off(&(log_id.index + 1));
        disk.log = kept;
        disk.last_purged = Some(log_id);
        Ok(())
    }
}

impl RaftSnapshotBuilder<TypeConfig> for Storage {
    async fn build_snapshot(&mut self) -> Result<Snapshot, StorageError> {
        let (meta, bytes) = {
            let machine = lock(&self.machine);
            let last_index = machine.last_applied.map_or(0, |l| l.index);
            let meta = SnapshotMeta {
                last_log_id: machine.last_applied,
                last_membership: machine.last_membership.clone(),
                snapshot_id: format!("{last_index}"),
            };
            (meta, encode(&*machine))
        };
        let mut disk = lock(&self.disk);
        disk.snapshot = Some((meta.clone(), bytes.clone()));
        disk.snapshots_built += 1;
        Ok(Snapshot {
            meta,
            snapshot: Box::new(Cursor::new(bytes)),
        })
    }
}

impl RaftStateMachine<TypeConfig> for Storage {
    type SnapshotBuilder = Storage;

    async fn applied_state(&mut self) -> Result<(Option<LogId>, StoredMembership), StorageError> {
        let machine = lock(&self.machine);
        Ok((machine.last_applied, machine.last_membership.clone()))
    }

    async fn apply<I>(
        &mut self,
        entries: I,
    ) -> Result<Vec<Vec<ctrlog::jobs::Outcome>>, StorageError>
    where
        I: IntoIterator<Item = Entry> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        let mut machine = lock(&self.machine);
        Ok(entries.into_iter().map(|e| machine.apply(&e)).collect())
    }

    async fn get_snapshot_builder(&mut self) -> Self::SnapshotBuilder {
        self.clone()
    }

    async fn begin_receiving_snapshot(&mut self) -> Result<Box<Cursor<Vec<u8>>>, StorageError> {
        Ok(Box::new(Cursor::new(Vec::new())))
    }

    async fn install_snapshot(
        &mut self,
        meta: &SnapshotMeta,
        snapshot: Box<Cursor<Vec<u8>>>,
    ) -> Result<(), StorageError> {
        let bytes = snapshot.into_inner();
        let mut state: MachineState =
            decode(&bytes, SNAPSHOT_BYTES_MAX).expect("snapshots from a peer decode");
        assert_eq!(
            state.last_applied, meta.last_log_id,
            "snapshot matches its meta"
        );
        // As in the real store: what the snapshot covers is compacted on this replica.
        state.forget_spans_before(meta.last_log_id.map_or(0, |l| l.index + 1));
        lock(&self.disk).snapshot = Some((meta.clone(), bytes));
        *lock(&self.machine) = state;
        Ok(())
    }

    async fn get_current_snapshot(&mut self) -> Result<Option<Snapshot>, StorageError> {
        Ok(lock(&self.disk)
            .snapshot
            .clone()
            .map(|(meta, bytes)| Snapshot {
                meta,
                snapshot: Box::new(Cursor::new(bytes)),
            }))
    }
}
