//! Micro-benchmarks of `JobState::apply`, the work every replica does per command.
//!
//! `cargo bench --bench jobs`

use criterion::{criterion_group, criterion_main, BatchSize, Criterion, Throughput};
use ctrlog::jobs::JobState;
use ctrlog::log::*;

fn apply(c: &mut Criterion) {
    let mut group = c.benchmark_group("job_state");
    let custom: Vec<(Option<ProducerSeq>, Target, Frame)> = (0..64)
        .map(|seq| {
            (
                Some(ProducerSeq { producer: 1, seq }),
                Target::All,
                Command::custom(1, 1, vec![7; 256]).into_frame(),
            )
        })
        .collect();
    group.throughput(Throughput::Elements(64));
    group.bench_function("apply_64_custom_commands_with_producer_pairs", |b| {
        b.iter_batched(
            JobState::default,
            |mut state| {
                for (producer, target, frame) in &custom {
                    state.apply(*producer, target, frame, 0);
                }
                state
            },
            BatchSize::SmallInput,
        )
    });

    // A job's life: 16 containers register, 64 inputs arrive, and every task is assigned,
    // started, stopped and acknowledged: 16 + 1 + 4 × 64 commands.
    let mut job: Vec<Command> = (0..16)
        .map(|n| {
            Command::RegisterContainer(RegisterContainer {
                container: ContainerId::new(format!("c{n}")).unwrap(),
                location: String::new(),
            })
        })
        .collect();
    let inputs: Vec<Input> = (0..64)
        .map(|p| Input::new("kafka", "events", p).unwrap())
        .collect();
    job.push(Command::AddInputs(AddInputs {
        inputs: inputs.clone(),
    }));
    for (p, input) in inputs.iter().enumerate() {
        let container = ContainerId::new(format!("c{}", p % 16)).unwrap();
        let epoch = (p % 16) as u64 + 1;
        let task = TaskId::new(format!("t{p}")).unwrap();
        job.push(Command::AssignTask(AssignTask {
            task: task.clone(),
            container: container.clone(),
            epoch,
            inputs: vec![input.clone()],
        }));
        job.push(Command::TaskStarted(TaskStarted {
            task: task.clone(),
            container: container.clone(),
            epoch,
        }));
        job.push(Command::StopTask(StopTask {
            task: task.clone(),
            container: container.clone(),
            epoch,
        }));
        job.push(Command::TaskStopped(TaskStopped {
            task,
            container,
            epoch,
            checkpoint: None,
        }));
    }
    let framed: Vec<(Target, Frame)> = job
        .into_iter()
        .map(|c| (c.target().unwrap_or(Target::All), c.into_frame()))
        .collect();
    group.throughput(Throughput::Elements(framed.len() as u64));
    group.bench_function("apply_a_job_lifecycle_of_273_builtin_commands", |b| {
        b.iter_batched(
            JobState::default,
            |mut state| {
                for (target, frame) in &framed {
                    assert!(matches!(
                        state.apply(None, target, frame, 0),
                        ctrlog::jobs::Outcome::Appended { .. }
                    ));
                }
                state
            },
            BatchSize::SmallInput,
        )
    });
    group.finish();
}

criterion_group!(benches, apply);
criterion_main!(benches);
