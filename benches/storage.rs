//! Micro-benchmarks of the storage hot path: appending a group of entries to the WAL and
//! making it durable (what the sync thread does per flush), reading an entry back for a fetch
//! (what a subscriber below the in-memory window costs), and applying a batch to the state
//! machine (what every replica does per committed entry).
//!
//! `cargo bench --bench storage`

use criterion::{criterion_group, criterion_main, BatchSize, Criterion, Throughput};
use ctrlog::log::{decode, encode, Batch, Command, ProducerSeq, Proposal, Target};
use ctrlog::raft::state_machine::MachineState;
use ctrlog::raft::types::{Entry, LogId};
use ctrlog::raft::wal::Wal;
use openraft::{CommittedLeaderId, EntryPayload};

fn entry(index: u64, commands: u64) -> Entry {
    entry_of_producers(index, commands, 0)
}

/// Entry `index`, carrying `commands` commands of 256 bytes, each from its own producer, at
/// sequence number `seq`.
fn entry_of_producers(index: u64, commands: u64, seq: u64) -> Entry {
    Entry {
        log_id: LogId::new(CommittedLeaderId::new(1, 1), index),
        payload: EntryPayload::Normal(Batch {
            appended_at_ms: 1,
            proposals: (0..commands)
                .map(|producer| Proposal {
                    producer: Some(ProducerSeq { producer, seq }),
                    target: Target::All,
                    frame: Command::custom(1, 1, vec![7; 256]).into_frame(),
                })
                .collect(),
        }),
    }
}

fn storage(c: &mut Criterion) {
    let dir = tempfile::tempdir().unwrap();
    let mut wal = Wal::open(dir.path(), None, 64 << 20).unwrap();
    let mut group = c.benchmark_group("wal");
    // A flush group: 4 entries of 64 commands of 256 bytes, then fdatasync.
    group.throughput(Throughput::Elements(4 * 64));
    group.bench_function("append_4x64x256B_and_fdatasync", |b| {
        b.iter(|| {
            let first = wal.next_index();
            let payloads: Vec<Vec<u8>> =
                (first..first + 4).map(|i| encode(&entry(i, 64))).collect();
            wal.append(first, &payloads).unwrap();
            wal.active_file().sync_data().unwrap();
        })
    });
    let index = wal.next_index() - 1;
    group.throughput(Throughput::Elements(64));
    group.bench_function("read_and_decode_64x256B_entry", |b| {
        b.iter(|| {
            let bytes = wal.read(index).unwrap().unwrap();
            decode::<Entry>(&bytes, 1 << 24).unwrap()
        })
    });
    group.finish();
}

/// Applying one committed batch of 256 commands from 256 producers (a busy leader's batch) to
/// the state machine: deduplication, offsets, the job's fold, the offset index.
fn state_machine(c: &mut Criterion) {
    let mut group = c.benchmark_group("state_machine");
    group.throughput(Throughput::Elements(256));
    let mut state = MachineState::default();
    let mut index = 0;
    group.bench_function("apply_256x256B_batch_of_256_producers", |b| {
        b.iter_batched(
            || {
                index += 1;
                entry_of_producers(index, 256, index)
            },
            |entry| state.apply(&entry).unwrap(),
            BatchSize::SmallInput,
        )
    });
    group.finish();
}

criterion_group!(benches, storage, state_machine);
criterion_main!(benches);
