//! Scrubbing: a background pass that reads back and verifies the WAL and the stored snapshot
//! at a bounded rate, so that rot is found while the peers still hold what it took, not when
//! a lagging follower or a restart needs it (ARCHITECTURE.md, "The storage fault model").
//!
//! A pass verifies every record an `fdatasync` covered when the pass began (the records past
//! that mark are still being written), a run of up to [`RUN_BYTES`] at a time, then the stored
//! snapshot chunk by chunk: each record's length and CRC32, the snapshot's length and CRC32.
//! It reads at most [`ScrubConfig::bytes_per_second`] on average, sleeping between runs, and a
//! pass starts every [`ScrubConfig::interval`] (or as soon as the last one ended, if it took
//! longer): every byte is verified at least once per `interval + retained bytes / rate`.
//!
//! The runs are read without the WAL's lock, so that appends never wait for the scrubber. A
//! record that fails is confirmed under the lock before it counts ([`Wal::confirm_bad`]): the
//! log may have truncated it and written another in its place meanwhile. A snapshot that
//! fails is verified again while none can be stored.
//!
//! What is found stops the replica: [`run`] returns it, the replica counts it in
//! `ctrlog_storage_faults_total{kind}`, stops its Raft core and `ctrlog serve` exits naming
//! it. The restart finds the same damage at open and repairs it from the peers, as it repairs
//! any damage it finds (a damaged range of the log, or the snapshot fetched again). The
//! scrubber repairs nothing itself: the repair is the start's, which is the one path tested
//! against every fault.
//!
//! [`Wal::confirm_bad`]: super::wal::Wal::confirm_bad

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use tokio::sync::watch;

use super::fault::{Fault, FaultKind};
use super::log_store::LogStore;
use super::snapshots::SnapshotStore;
use super::wal::BadRecord;

/// The most the scrubber reads of the WAL at once: one run, between two pauses.
pub const RUN_BYTES: u64 = 1 << 20;

/// The longest the scrubber sleeps without looking whether the replica is stopping.
const STOP_CHECK: Duration = Duration::from_millis(50);

/// How fast and how often to scrub.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ScrubConfig {
    /// The average read rate of a pass; 0 turns scrubbing off.
    pub bytes_per_second: u64,
    /// How often a pass starts.
    pub interval: Duration,
}

/// Storage faults this process found, at open or while scrubbing, and the scrubber's progress:
/// what `/metrics` shows.
#[derive(Debug, Default)]
pub struct StorageFaults {
    found: Mutex<BTreeMap<FaultKind, u64>>,
    passes: AtomicU64,
    scrubbed_bytes: AtomicU64,
    /// What the scrubber found, which stopped the replica.
    stopped_for: Mutex<Option<Fault>>,
}

impl StorageFaults {
    /// Counts one fault of `kind`.
    pub fn found(&self, kind: FaultKind) {
        *self.lock_found().entry(kind).or_default() += 1;
    }

    /// Faults found so far, by kind.
    pub fn counts(&self) -> BTreeMap<FaultKind, u64> {
        self.lock_found().clone()
    }

    fn lock_found(&self) -> std::sync::MutexGuard<'_, BTreeMap<FaultKind, u64>> {
        self.found.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Scrub passes completed.
    pub fn passes(&self) -> u64 {
        self.passes.load(Ordering::Relaxed)
    }

    /// Bytes the scrubber has read and verified.
    pub fn scrubbed_bytes(&self) -> u64 {
        self.scrubbed_bytes.load(Ordering::Relaxed)
    }

    /// Records that the scrubber found `fault`, for which the replica stops.
    pub fn stop_for(&self, fault: Fault) {
        self.found(fault.kind);
        *self.stopped_for.lock().unwrap_or_else(|p| p.into_inner()) = Some(fault);
    }

    /// What the scrubber found, if it stopped the replica.
    pub fn stopped_for(&self) -> Option<Fault> {
        self.stopped_for
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }
}

/// Scrubs `log` and `snapshots` as `config` says until `stopping` turns true (returns
/// `None`) or a pass finds a fault (returns it). Blocking: run it on a thread of its own.
pub fn run(
    log: &LogStore,
    snapshots: &SnapshotStore,
    config: ScrubConfig,
    faults: &StorageFaults,
    stopping: &watch::Receiver<bool>,
) -> Option<Fault> {
    if config.bytes_per_second == 0 {
        return None;
    }
    loop {
        let started = Instant::now();
        let mut pacer = Pacer {
            bytes_per_second: config.bytes_per_second,
            started,
            bytes: 0,
            stopping,
            faults,
        };
        match pass(log, snapshots, &mut pacer) {
            Ok(Some(fault)) => return Some(fault),
            Ok(None) if *stopping.borrow() => return None,
            Ok(None) => {
                faults.passes.fetch_add(1, Ordering::Relaxed);
            }
            Err(error) => tracing::warn!(%error, "a scrub pass could not read the storage"),
        }
        if !sleep_until(started + config.interval, stopping) {
            return None;
        }
    }
}

/// One pass over the WAL, then the stored snapshot: the first fault found, confirmed.
fn pass(
    log: &LogStore,
    snapshots: &SnapshotStore,
    pacer: &mut Pacer,
) -> std::io::Result<Option<Fault>> {
    let end = log.synced_end();
    let mut from = 0;
    while let Some(listed) = log.records_to_verify(from, end, RUN_BYTES) {
        if let Some(bad) = listed.verify()? {
            if log.confirm_bad(&listed, &bad) {
                return Ok(Some(record_fault(bad)));
            }
        }
        from = listed.end();
        if !pacer.read(listed.bytes()) {
            return Ok(None);
        }
    }
    if snapshots
        .verify(|bytes| {
            pacer.read(bytes);
        })?
        .is_err()
    {
        if let Some(damaged) = snapshots.confirm_damage()? {
            return Ok(Some(Fault {
                kind: FaultKind::SnapshotDamaged,
                file: snapshots.sled_data_path(),
                detail: damaged.to_string(),
            }));
        }
    }
    Ok(None)
}

fn record_fault(bad: BadRecord) -> Fault {
    let (kind, what) = match bad.unreadable {
        true => (FaultKind::UnreadableSector, "a sector fails reads (EIO)"),
        false => (FaultKind::LogDamaged, "it fails its checksum"),
    };
    Fault {
        kind,
        file: bad.segment,
        detail: format!("record {} at byte {}: {what}", bad.index, bad.byte),
    }
}

/// Keeps a pass's reads to its rate.
struct Pacer<'a> {
    bytes_per_second: u64,
    started: Instant,
    bytes: u64,
    stopping: &'a watch::Receiver<bool>,
    faults: &'a StorageFaults,
}

impl Pacer<'_> {
    /// Counts `bytes` read and sleeps until the pass is back within its rate; `false` once the
    /// replica is stopping.
    fn read(&mut self, bytes: u64) -> bool {
        self.bytes += bytes;
        self.faults
            .scrubbed_bytes
            .fetch_add(bytes, Ordering::Relaxed);
        let due = Duration::from_secs_f64(self.bytes as f64 / self.bytes_per_second as f64);
        sleep_until(self.started + due, self.stopping)
    }
}

/// Sleeps until `deadline`, looking every [`STOP_CHECK`] whether the replica is stopping;
/// `false` if it is.
fn sleep_until(deadline: Instant, stopping: &watch::Receiver<bool>) -> bool {
    loop {
        if *stopping.borrow() {
            return false;
        }
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return true;
        }
        std::thread::sleep(left.min(STOP_CHECK));
    }
}
