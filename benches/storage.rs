//! Micro-benchmarks of the commit path's pieces: the proposer's hand-off (appends queued,
//! then taken as one batch), appending a group of entries to the WAL and making it durable
//! (what the sync thread does per flush, with the synced mark it raises after), reading an entry back for a fetch (what a
//! subscriber below the in-memory window costs), and applying a batch to the state machine
//! (what every replica does per committed entry).
//!
//! `cargo bench --bench storage`

use criterion::{criterion_group, criterion_main, BatchSize, Criterion, Throughput};
use ctrlog::log::{decode, encode, Batch, Command, ProducerSeq, Proposal, Target};
use ctrlog::raft::state_machine::MachineState;
use ctrlog::raft::storage::wal::Wal;
use ctrlog::raft::types::{Entry, LogId};
use openraft::{CommittedLeaderId, EntryPayload};

fn entry(index: u64, commands: u64) -> Entry {
    entry_of_producers(index, commands, 0)
}

/// Entry `index`, carrying `commands` commands of 256 bytes, each from its own producer, at
/// sequence number `seq`.
fn entry_of_producers(index: u64, commands: u64, seq: u64) -> Entry {
    Entry {
        log_id: LogId::new(CommittedLeaderId::new(1, 1), index),
        payload: EntryPayload::Normal(std::sync::Arc::new(Batch {
            appended_at_ms: 1,
            proposals: (0..commands)
                .map(|producer| Proposal {
                    producer: Some(ProducerSeq { producer, seq }),
                    target: Target::All,
                    frame: Command::custom(1, 1, vec![7; 256]).into_frame(),
                })
                .collect(),
        })),
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
            wal.active_file().sync().unwrap();
        })
    });
    // What each flush adds since the synced mark: one 33-byte write (the index and its entry's
    // id), never synced.
    let mark = wal.synced_mark();
    let mut marked = wal.next_index() - 1;
    group.throughput(Throughput::Elements(1));
    group.bench_function("raise_the_synced_mark", |b| {
        b.iter(|| {
            marked += 1;
            let id = LogId::new(CommittedLeaderId::new(1, 1), marked);
            mark.raise(id).unwrap()
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

/// The proposer's hand-off of 256 appends: each queued on its channel, as 256 connections'
/// appends arrive, then taken as one batch by the accumulator the proposer runs, for one
/// Raft entry.
fn proposer(c: &mut Criterion) {
    use ctrlog::raft::proposer::{PROPOSER_BATCHES, QUEUE_DEPTH};
    use ctrlog::wire::batching::Accumulator;
    let mut group = c.benchmark_group("proposer");
    group.throughput(Throughput::Elements(256));
    let proposals: Vec<Proposal> = match entry_of_producers(1, 256, 1).payload {
        EntryPayload::Normal(batch) => batch.proposals.clone(),
        _ => unreachable!("a normal entry"),
    };
    let (queue, incoming) = tokio::sync::mpsc::channel(QUEUE_DEPTH);
    let mut batches = Accumulator::new(incoming, PROPOSER_BATCHES, Proposal::encoded_len);
    group.bench_function("queue_256x256B_and_take_one_batch", |b| {
        b.iter_batched(
            || proposals.clone(),
            |proposals| {
                for proposal in proposals {
                    queue.try_send(proposal).expect("room in the queue");
                }
                let (batch, _slot) = futures::executor::block_on(batches.next()).expect("queued");
                assert_eq!(batch.len(), 256);
                batch
            },
            BatchSize::SmallInput,
        )
    });
    group.finish();
}

criterion_group!(benches, proposer, storage, state_machine);
criterion_main!(benches);
