//! Micro-benchmarks of the codec on the hot path: encoding a batch for the WAL and decoding it
//! back.
//!
//! `cargo bench --bench codec`

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use ctrlog::log::{decode, encode, Batch, Command, ProducerSeq, Proposal, Target};

fn batch(commands: usize) -> Batch {
    Batch {
        appended_at_ms: 1,
        proposals: (0..commands as u64)
            .map(|seq| Proposal {
                producer: Some(ProducerSeq { producer: 1, seq }),
                target: Target::All,
                frame: Command::custom(1, 1, vec![7; 256]).into_frame(),
            })
            .collect(),
    }
}

fn codec(c: &mut Criterion) {
    let mut group = c.benchmark_group("batch_of_64x256B");
    let batch = batch(64);
    let bytes = encode(&batch);
    group.throughput(Throughput::Elements(64));
    group.bench_function("encode", |b| b.iter(|| encode(&batch)));
    group.bench_function("decode", |b| {
        b.iter(|| decode::<Batch>(&bytes, 1 << 24).unwrap())
    });
    group.finish();
}

criterion_group!(benches, codec);
criterion_main!(benches);
