//! openraft's `RaftStateMachine`: applies committed batches to [`JobState`], keeps the index
//! from offset to Raft entry, and builds, installs and restores snapshots.
//!
//! A snapshot is the encoded [`MachineState`]; storing it durably (in sled, in chunks, behind a
//! pointer switched only once every chunk is durable) is the storage's
//! [`SnapshotStore`].
//!
//! The state machine itself is in memory. It is rebuilt at start from the current snapshot and
//! then openraft re-applies the retained log up to the committed index.

use std::collections::BTreeMap;
use std::io::{self, Cursor};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};

use openraft::storage::RaftStateMachine;
use openraft::{EntryPayload, OptionalSend, RaftSnapshotBuilder};
use serde::{Deserialize, Serialize};
use tokio::sync::watch;

use super::stages::Stage;
use super::storage::log_store::LogStore;
use super::storage::meta_store::MetaStore;
use super::storage::snapshots::{SnapshotStore, StoredSnapshot};
use super::types::{
    Entry, LogId, Snapshot, SnapshotMeta, StorageError, StorageIOError, StoredMembership,
    TypeConfig,
};
use crate::jobs::{JobState, Outcome, RecordedRejection, RejectionLog};
use crate::log::vocabulary::{kinds, LEVEL_CLUSTER_ID_DERIVED, LEVEL_MAX};
use crate::log::{decode, encode, Batch, Level, LogEntry, Offset, Proposal};
use crate::wire::ClusterId;

/// A snapshot larger than this is refused on decode: a corrupt length must not allocate
/// without bound. JobState for a very large job is tens of MiB.
pub const SNAPSHOT_BYTES_MAX: u64 = 1 << 30;

/// Where the commands of one Raft entry sit in the offset space.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct EntrySpan {
    pub log_index: u64,
    /// Positions in the batch of proposals that took no offset (duplicates and refusals).
    /// Almost always empty.
    pub skipped: Vec<u32>,
}

/// The log records a vocabulary level this build does not know. Kinds and rules of that level
/// are unknown here, so applying on would decide commands differently from the replicas that
/// know it (accept what they refuse); the replica stops applying instead (fail-stop: openraft
/// shuts its Raft core down on this storage error) until it runs a build that knows the level.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error(
    "the log records vocabulary level {recorded}, which this build does not know (it knows \
     levels up to {known}): this replica stops applying; upgrade it to a build that knows \
     level {recorded}"
)]
pub struct LevelUnknown {
    pub recorded: Level,
    pub known: Level,
}

impl LevelUnknown {
    /// `Err` if this build does not know the level `job` records.
    fn check(job: &JobState) -> Result<(), LevelUnknown> {
        if job.level_understood() {
            Ok(())
        } else {
            Err(LevelUnknown {
                recorded: job.level(),
                known: LEVEL_MAX,
            })
        }
    }
}

/// Everything the state machine holds; also exactly what a snapshot contains.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct MachineState {
    pub last_applied: Option<LogId>,
    pub last_membership: StoredMembership,
    /// Shared with readers (the controller's tick, a `state` answer): a reader takes the
    /// `Arc`, not a copy of the job, and an apply copies the job only while a reader still
    /// holds the old one (`Arc::make_mut`), so a quiet job is read for nothing. Serialized
    /// as the `JobState` itself, so snapshots are unchanged.
    pub job: Arc<JobState>,
    /// First offset of each retained entry that carries commands → its Raft entry. Lets a
    /// fetch from any offset find its entry without a second copy of the log.
    pub offset_index: BTreeMap<Offset, EntrySpan>,
    /// Commands the job model refused (they took no offset).
    pub rejections: RejectionLog,
}

impl MachineState {
    /// The lowest offset whose entry is still in the log (which now starts at
    /// `first_log_index`); `last_offset + 1` when no retained entry carries commands.
    pub fn first_retained_offset(&self, first_log_index: u64) -> Offset {
        // Spans of purged entries linger until the next apply prunes them.
        self.offset_index
            .iter()
            .find(|(_, span)| span.log_index >= first_log_index)
            .map_or(self.job.next_offset(), |(first, _)| *first)
    }

    /// Forgets the spans of entries below `first_log_index`: they were purged, or (after a
    /// snapshot install) this replica never had them, so their offsets are compacted here.
    /// Every way the log loses a prefix goes through this.
    pub fn forget_spans_before(&mut self, first_log_index: u64) {
        while let Some(span) = self.offset_index.first_entry() {
            if span.get().log_index >= first_log_index {
                break;
            }
            span.remove();
        }
    }

    /// Applies one committed entry: the whole transition, with no I/O. The replica's store and
    /// the deterministic simulation's in-memory store both apply through here.
    ///
    /// A batch is refused whole, changing nothing, if the recorded vocabulary level is one
    /// this build does not know, before or after it (a `SetVocabularyLevel` in it raised the
    /// level past [`LEVEL_MAX`]): see [`LevelUnknown`]. Nothing is skipped, so the replica
    /// meets the same entry again after a restart, until it is upgraded.
    pub fn apply(&mut self, entry: &Entry) -> Result<Vec<Outcome>, LevelUnknown> {
        match &entry.payload {
            EntryPayload::Blank => {
                self.last_applied = Some(entry.log_id);
                Ok(Vec::new())
            }
            EntryPayload::Membership(membership) => {
                self.last_applied = Some(entry.log_id);
                self.last_membership =
                    StoredMembership::new(Some(entry.log_id), membership.clone());
                Ok(Vec::new())
            }
            EntryPayload::Normal(batch) => {
                LevelUnknown::check(&self.job)?;
                let first_offset = self.job.next_offset();
                let outcomes = if raises_level(batch) {
                    // Rare (an operator's raise), so a copy is affordable: it keeps a refused
                    // batch from changing anything, with no undo written for every command.
                    let mut job = JobState::clone(&self.job);
                    let outcomes = job.apply_batch(batch);
                    LevelUnknown::check(&job)?;
                    self.job = Arc::new(job);
                    outcomes
                } else {
                    Arc::make_mut(&mut self.job).apply_batch(batch)
                };
                self.last_applied = Some(entry.log_id);
                let mut skipped = Vec::new();
                let mut last_offset = first_offset - 1;
                for (position, (outcome, proposal)) in
                    outcomes.iter().zip(&batch.proposals).enumerate()
                {
                    match outcome {
                        Outcome::Appended { offset } => last_offset = *offset,
                        Outcome::Rejected(rejection) => {
                            self.rejections.record(RecordedRejection {
                                after_offset: last_offset,
                                kind: proposal.frame.kind,
                                version: proposal.frame.version,
                                appended_at_ms: batch.appended_at_ms,
                                rejection: rejection.clone(),
                            });
                            skipped.push(position as u32);
                        }
                        Outcome::Duplicate { .. }
                        | Outcome::OutOfWindow { .. }
                        | Outcome::ProducerForgotten => skipped.push(position as u32),
                    }
                }
                if self.job.next_offset() > first_offset {
                    self.offset_index.insert(
                        first_offset,
                        EntrySpan {
                            log_index: entry.log_id.index,
                            skipped,
                        },
                    );
                }
                Ok(outcomes)
            }
        }
    }
}

/// Whether a batch holds a command that may change the vocabulary level.
fn raises_level(batch: &Batch) -> bool {
    batch
        .proposals
        .iter()
        .any(|p| p.frame.kind == kinds::SET_VOCABULARY_LEVEL)
}

/// The commands one applied entry produced, with their offsets, given its span: the entry's
/// proposals minus the skipped ones, numbered from `first_offset`.
pub fn entry_commands<'a>(
    first_offset: Offset,
    span: &'a EntrySpan,
    entry: &'a Entry,
) -> impl Iterator<Item = (Offset, &'a Proposal)> + 'a {
    let proposals: &[Proposal] = match &entry.payload {
        EntryPayload::Normal(batch) => &batch.proposals,
        _ => &[],
    };
    proposals
        .iter()
        .enumerate()
        .filter(|(position, _)| !span.skipped.contains(&(*position as u32)))
        .zip(first_offset..)
        .map(|((_, proposal), offset)| (offset, proposal))
}

/// The log entry a subscriber receives for one command of an applied Raft entry.
pub fn log_entry(offset: Offset, proposal: &Proposal, entry: &Entry) -> LogEntry {
    let appended_at_ms = match &entry.payload {
        EntryPayload::Normal(batch) => batch.appended_at_ms,
        _ => 0,
    };
    LogEntry {
        offset,
        term: entry.log_id.leader_id.term,
        appended_at_ms,
        producer: proposal.producer,
        target: proposal.target.clone(),
        frame: proposal.frame.clone(),
    }
}

/// The state machine's position after an apply: what long-polling readers wait on.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Applied {
    pub log_index: Option<u64>,
    pub last_offset: Offset,
}

struct Shared {
    state: RwLock<MachineState>,
    snapshots: SnapshotStore,
    log: LogStore,
    applied: watch::Sender<Applied>,
    /// The last offset the current snapshot covers, for `Compacted` answers.
    snapshot_offset: AtomicU64,
    /// Snapshots built since start, and the size and build time of the last one.
    snapshots_built: AtomicU64,
    last_snapshot_bytes: AtomicU64,
    last_snapshot_millis: AtomicU64,
    /// Told the cluster id an applied entry derived ([`derived_cluster_id`]), before the
    /// apply returns; unset in stores without a directory's identity (the tools').
    on_cluster_derived: std::sync::OnceLock<ClusterDerived>,
}

/// Records a cluster id derived from the log ([`StateMachineStore::on_cluster_derived`]).
pub type ClusterDerived = Box<dyn Fn(ClusterId) -> io::Result<()> + Send + Sync>;

/// The cluster id of a cluster initialised without one (by v0.1.0, or a build before cluster
/// ids), derived from the entry that raised its vocabulary level to
/// [`LEVEL_CLUSTER_ID_DERIVED`]: the same on every replica, as the entry is, and another for
/// every cluster (it hashes the entry's term, leader, index and the leader's clock). The
/// level is raised once every replica runs a build that derives it, so none derives it apart.
pub fn derived_cluster_id(log_id: &LogId, appended_at_ms: u64) -> ClusterId {
    let mut context = ring::digest::Context::new(&ring::digest::SHA256);
    context.update(b"ctrlog cluster id derived at a level raise");
    for part in [
        log_id.leader_id.term,
        log_id.leader_id.node_id,
        log_id.index,
        appended_at_ms,
    ] {
        context.update(&part.to_le_bytes());
    }
    let digest = context.finish();
    let mut first = [0u8; 16];
    first.copy_from_slice(&digest.as_ref()[..16]);
    ClusterId(u128::from_le_bytes(first))
}

/// What a replica's snapshot builds looked like, for its metrics.
#[derive(Clone, Copy, Debug, Default)]
pub struct SnapshotStats {
    pub built: u64,
    pub last_bytes: u64,
    pub last_millis: u64,
}

/// The state machine store. Clones share one state machine.
#[derive(Clone)]
pub struct StateMachineStore {
    shared: Arc<Shared>,
}

fn snapshot_read_err(e: impl std::error::Error + 'static) -> StorageError {
    StorageIOError::read_snapshot(None, &e).into()
}

fn snapshot_write_err(e: impl std::error::Error + 'static) -> StorageError {
    StorageIOError::write_snapshot(None, &e).into()
}

impl StateMachineStore {
    /// Opens the state machine, restoring it from the current snapshot if there is one; a
    /// damaged one fails with [`DamagedSnapshot`](super::storage::snapshots::DamagedSnapshot).
    pub fn open(meta: Arc<MetaStore>, log: LogStore) -> io::Result<StateMachineStore> {
        let (snapshots, current) = SnapshotStore::open(meta, log.clone())?;
        StateMachineStore::restore(snapshots, log, current)
    }

    /// The state machine restored from `current`, the snapshot `snapshots` read back
    /// (the empty state without one).
    pub fn restore(
        snapshots: SnapshotStore,
        log: LogStore,
        current: Option<StoredSnapshot>,
    ) -> io::Result<StateMachineStore> {
        let state = match current {
            Some(current) => {
                decode(&current.bytes, SNAPSHOT_BYTES_MAX).map_err(io::Error::other)?
            }
            None => MachineState::default(),
        };
        LevelUnknown::check(&state.job).map_err(io::Error::other)?;
        let snapshot_offset = state.job.last_offset();
        let applied = Applied {
            log_index: state.last_applied.map(|l| l.index),
            last_offset: state.job.last_offset(),
        };
        Ok(StateMachineStore {
            shared: Arc::new(Shared {
                state: RwLock::new(state),
                snapshots,
                log,
                applied: watch::Sender::new(applied),
                snapshot_offset: AtomicU64::new(snapshot_offset),
                snapshots_built: AtomicU64::new(0),
                last_snapshot_bytes: AtomicU64::new(0),
                last_snapshot_millis: AtomicU64::new(0),
                on_cluster_derived: std::sync::OnceLock::new(),
            }),
        })
    }

    /// Runs `f` with read access to the state.
    pub fn read<T>(&self, f: impl FnOnce(&MachineState) -> T) -> T {
        f(&self.shared.state.read().expect("state lock poisoned"))
    }

    /// The stored snapshot, for the scrubber and the tools.
    pub fn snapshots(&self) -> &SnapshotStore {
        &self.shared.snapshots
    }

    /// The last offset the current snapshot covers (0 without a snapshot).
    /// An applied entry, from the log store (whose window of recent entries serves readers
    /// at the head of the log). `None` if it was purged.
    pub fn applied_entry(&self, index: u64) -> io::Result<Option<Arc<Entry>>> {
        self.shared.log.entry(index)
    }

    /// The last entry the stored snapshot covers, `None` without one.
    pub fn stored_snapshot_last(&self) -> io::Result<Option<LogId>> {
        self.shared.snapshots.stored_last()
    }

    /// Has `record` told, before an apply returns, the cluster id an applied entry derives
    /// ([`derived_cluster_id`]). Set once; later calls are ignored.
    pub fn on_cluster_derived(&self, record: ClusterDerived) {
        let _ = self.shared.on_cluster_derived.set(record);
    }

    pub fn snapshot_stats(&self) -> SnapshotStats {
        SnapshotStats {
            built: self.shared.snapshots_built.load(Ordering::Relaxed),
            last_bytes: self.shared.last_snapshot_bytes.load(Ordering::Relaxed),
            last_millis: self.shared.last_snapshot_millis.load(Ordering::Relaxed),
        }
    }

    pub fn snapshot_offset(&self) -> Offset {
        self.shared.snapshot_offset.load(Ordering::Acquire)
    }

    /// Watches the applied position; changes after every applied batch of entries.
    pub fn applied(&self) -> watch::Receiver<Applied> {
        self.shared.applied.subscribe()
    }
}

impl RaftSnapshotBuilder<TypeConfig> for StateMachineStore {
    async fn build_snapshot(&mut self) -> Result<Snapshot, StorageError> {
        fail::fail_point!("snapshot-build", |_| Err(snapshot_write_err(
            io::Error::other("injected: snapshot-build")
        )));
        let (bytes, meta, offset) = {
            let state = self.shared.state.read().expect("state lock poisoned");
            let meta = SnapshotMeta {
                last_log_id: state.last_applied,
                last_membership: state.last_membership.clone(),
                snapshot_id: format!(
                    "{}-{}",
                    state.last_applied.map_or(0, |l| l.index),
                    self.shared.snapshots.next_storage_id()
                ),
            };
            (encode(&*state), meta, state.job.last_offset())
        };
        let started = std::time::Instant::now();
        self.shared
            .snapshots
            .store(&meta, &bytes)
            .await
            .map_err(snapshot_write_err)?;
        // A build that found a newer snapshot stored leaves its offset too.
        self.shared
            .snapshot_offset
            .fetch_max(offset, Ordering::AcqRel);
        let shared = &self.shared;
        shared.snapshots_built.fetch_add(1, Ordering::Relaxed);
        shared
            .last_snapshot_bytes
            .store(bytes.len() as u64, Ordering::Relaxed);
        shared
            .last_snapshot_millis
            .store(started.elapsed().as_millis() as u64, Ordering::Relaxed);
        tracing::info!(
            snapshot = %meta.snapshot_id,
            bytes = bytes.len(),
            elapsed_ms = started.elapsed().as_millis() as u64,
            "snapshot built"
        );
        Ok(Snapshot {
            meta,
            snapshot: Box::new(Cursor::new(bytes)),
        })
    }
}

impl RaftStateMachine<TypeConfig> for StateMachineStore {
    type SnapshotBuilder = StateMachineStore;

    async fn applied_state(&mut self) -> Result<(Option<LogId>, StoredMembership), StorageError> {
        let state = self.shared.state.read().expect("state lock poisoned");
        Ok((state.last_applied, state.last_membership.clone()))
    }

    async fn apply<I>(&mut self, entries: I) -> Result<Vec<Vec<Outcome>>, StorageError>
    where
        I: IntoIterator<Item = Entry> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        fail::fail_point!("apply", |_| Err(StorageIOError::write_state_machine(
            &io::Error::other("injected: apply")
        )
        .into()));
        let started = std::time::Instant::now();
        let first_log_index = self.shared.log.first_index();
        let mut state = self.shared.state.write().expect("state lock poisoned");
        let mut replies = Vec::new();
        let mut derived = None;
        for entry in entries {
            let level_before = state.job.level();
            match state.apply(&entry) {
                Ok(outcomes) => {
                    if let (EntryPayload::Normal(batch), true) = (
                        &entry.payload,
                        level_before < LEVEL_CLUSTER_ID_DERIVED
                            && state.job.level() >= LEVEL_CLUSTER_ID_DERIVED,
                    ) {
                        derived = Some(derived_cluster_id(&entry.log_id, batch.appended_at_ms));
                    }
                    replies.push(outcomes)
                }
                Err(unknown) => {
                    tracing::error!(
                        recorded = unknown.recorded,
                        known = unknown.known,
                        log_index = entry.log_id.index,
                        "{unknown}"
                    );
                    return Err(StorageIOError::apply(entry.log_id, &unknown).into());
                }
            }
        }
        state.forget_spans_before(first_log_index);
        // After the state changed, before anyone hears of it: a crash between the two.
        fail::fail_point!("applied", |_| Err(StorageIOError::write_state_machine(
            &io::Error::other("injected: applied")
        )
        .into()));
        let applied = Applied {
            log_index: state.last_applied.map(|l| l.index),
            last_offset: state.job.last_offset(),
        };
        drop(state);
        if let (Some(id), Some(record)) = (derived, self.shared.on_cluster_derived.get()) {
            record(id).map_err(|e| StorageIOError::write_state_machine(&e))?;
        }
        (self.shared.log.stages()).observe(Stage::applied, started.elapsed());
        self.shared.applied.send_replace(applied);
        Ok(replies)
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
        fail::fail_point!("snapshot-install", |_| Err(snapshot_read_err(
            io::Error::other("injected: snapshot-install")
        )));
        let bytes = snapshot.into_inner();
        // Check before writing: a snapshot that does not decode is never stored.
        let mut new_state: MachineState =
            decode(&bytes, SNAPSHOT_BYTES_MAX).map_err(snapshot_read_err)?;
        if new_state.last_applied != meta.last_log_id {
            return Err(snapshot_read_err(io::Error::new(
                io::ErrorKind::InvalidData,
                "snapshot content does not match its metadata",
            )));
        }
        if let Err(unknown) = LevelUnknown::check(&new_state.job) {
            tracing::error!(
                recorded = unknown.recorded,
                known = unknown.known,
                snapshot = %meta.snapshot_id,
                "{unknown}"
            );
            return Err(snapshot_read_err(unknown));
        }
        self.shared
            .snapshots
            .store(meta, &bytes)
            .await
            .map_err(snapshot_write_err)?;
        let applied = Applied {
            log_index: new_state.last_applied.map(|l| l.index),
            last_offset: new_state.job.last_offset(),
        };
        self.shared
            .snapshot_offset
            .fetch_max(new_state.job.last_offset(), Ordering::AcqRel);
        // This replica's log does not hold what the snapshot covers (it was behind, which is
        // why it installs a snapshot), so those offsets are compacted here.
        new_state.forget_spans_before(meta.last_log_id.map_or(0, |l| l.index + 1));
        *self.shared.state.write().expect("state lock poisoned") = new_state;
        self.shared.applied.send_replace(applied);
        tracing::info!(snapshot = %meta.snapshot_id, bytes = bytes.len(), "snapshot installed");
        Ok(())
    }

    async fn get_current_snapshot(&mut self) -> Result<Option<Snapshot>, StorageError> {
        let Some(current) = self.shared.snapshots.current().map_err(snapshot_read_err)? else {
            return Ok(None);
        };
        Ok(Some(Snapshot {
            meta: current.meta,
            snapshot: Box::new(Cursor::new(current.bytes)),
        }))
    }
}

#[cfg(test)]
mod tests {
    use openraft::CommittedLeaderId;

    use super::*;
    use crate::log::{Command, SetVocabularyLevel};

    fn open(dir: &std::path::Path) -> StateMachineStore {
        let meta = Arc::new(MetaStore::open(&dir.join("meta")).unwrap());
        let log = LogStore::open(&dir.join("log"), meta.clone()).unwrap();
        StateMachineStore::open(meta, log).unwrap()
    }

    /// A snapshot whose state was applied up to `index`.
    fn snapshot_at(index: u64) -> (SnapshotMeta, Vec<u8>) {
        let last = Some(LogId::new(CommittedLeaderId::new(1, 1), index));
        let state = MachineState {
            last_applied: last,
            ..MachineState::default()
        };
        let meta = SnapshotMeta {
            last_log_id: last,
            last_membership: StoredMembership::default(),
            snapshot_id: format!("test-{index}"),
        };
        (meta, encode(&state))
    }

    fn batch_entry(index: u64, commands: Vec<Command>) -> Entry {
        Entry {
            log_id: LogId::new(CommittedLeaderId::new(1, 1), index),
            payload: EntryPayload::Normal(std::sync::Arc::new(Batch {
                appended_at_ms: 0,
                proposals: commands.into_iter().map(Proposal::of_command).collect(),
            })),
        }
    }

    fn level(level: Level) -> Command {
        Command::SetVocabularyLevel(SetVocabularyLevel { level })
    }

    /// Goal: a replica whose build does not know the vocabulary level the log records stops
    /// applying (fail-stop) with an error naming the level it lacks and the highest it knows,
    /// rather than apply commands that replicas knowing the level decide differently.
    /// Steps: the real store applies a batch; a batch raising the level to `LEVEL_MAX + 1`
    /// (after a user command in the same batch) is refused whole: nothing of it is applied,
    /// the next offset and level are unchanged. A snapshot recording that level is not
    /// installed, and a directory whose stored snapshot records it does not open.
    #[tokio::test]
    async fn a_log_at_a_level_this_build_does_not_know_stops_the_state_machine() {
        let dir = tempfile::tempdir().unwrap();
        let mut store = open(dir.path());
        let user = || Command::custom(1, 1, b"x".to_vec());
        store
            .apply([batch_entry(1, vec![user(), level(2)])])
            .await
            .unwrap();
        let unknown = LEVEL_MAX + 1;
        let refused = store
            .apply([batch_entry(2, vec![user(), level(unknown)])])
            .await
            .unwrap_err();
        let message = refused.to_string();
        assert!(
            message.contains(&format!(
                "records vocabulary level {unknown}, which this build does not know (it knows \
                 levels up to {LEVEL_MAX})"
            )),
            "{message}"
        );
        store.read(|state| {
            assert_eq!(state.last_applied.map(|l| l.index), Some(1));
            assert_eq!(state.job.next_offset(), 3, "nothing of the batch applied");
            assert_eq!(state.job.level(), 2);
        });
        assert!(store
            .apply([batch_entry(2, vec![level(unknown)])])
            .await
            .is_err());

        let mut at_unknown = MachineState::default();
        at_unknown.apply(&batch_entry(1, vec![user()])).unwrap();
        // A replica that knows the level could have built this snapshot.
        let raise = level(unknown);
        let target = raise.target().unwrap();
        Arc::make_mut(&mut at_unknown.job).apply(None, &target, &raise.into_frame(), 0);
        assert_eq!(at_unknown.job.level(), unknown);
        let meta = SnapshotMeta {
            last_log_id: at_unknown.last_applied,
            last_membership: StoredMembership::default(),
            snapshot_id: "newer".into(),
        };
        let bytes = encode(&at_unknown);
        let refused = store
            .install_snapshot(&meta, Box::new(Cursor::new(bytes.clone())))
            .await
            .unwrap_err();
        assert!(refused.to_string().contains("does not know"), "{refused}");
        assert_eq!(store.stored_snapshot_last().unwrap(), None, "not stored");

        assert!(store.snapshots().store(&meta, &bytes).await.unwrap());
        drop(store);
        let meta_store = Arc::new(MetaStore::open(&dir.path().join("meta")).unwrap());
        let log = LogStore::open(&dir.path().join("log"), meta_store.clone()).unwrap();
        let opened = StateMachineStore::open(meta_store, log)
            .map(|_| ())
            .unwrap_err();
        assert!(opened.to_string().contains("does not know"), "{opened}");
    }

    /// Regression (the stored snapshot could move backwards): a build that encoded the state
    /// at 10 and is stored after an install of 50 leaves 50 in place, across a reopen.
    #[tokio::test]
    async fn an_older_snapshot_never_replaces_a_newer_one() {
        let dir = tempfile::tempdir().unwrap();
        let store = open(dir.path());
        let (newer, newer_bytes) = snapshot_at(50);
        let (older, older_bytes) = snapshot_at(10);
        assert!(store.snapshots().store(&newer, &newer_bytes).await.unwrap());
        assert!(!store.snapshots().store(&older, &older_bytes).await.unwrap());
        assert_eq!(store.stored_snapshot_last().unwrap(), newer.last_log_id);
        drop(store);
        let store = open(dir.path());
        assert_eq!(store.stored_snapshot_last().unwrap(), newer.last_log_id);
        assert_eq!(
            store.shared.state.read().unwrap().last_applied,
            newer.last_log_id
        );
    }
}
