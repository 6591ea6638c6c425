//! Micro-benchmarks of `JobState::apply`, the work every replica does per command, and of
//! the leading controller's tick on a large job (what `ctrlog bench scale` measures whole).
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
        .map(|c| (c.default_target(), c.into_frame()))
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

/// A settled job of `containers` live containers and `inputs` inputs over 10 streams, every
/// task (one per partition number) running on one of them, as the controller leaves it.
fn settled_job(containers: usize, inputs: usize) -> (JobState, std::collections::BTreeSet<Input>) {
    use ctrlog::jobs::plan::{GroupByPartition, Grouper};
    let mut state = JobState::default();
    let apply = |state: &mut JobState, command: Command| {
        let target = command.default_target();
        match state.apply(None, &target, &command.into_frame(), 0) {
            ctrlog::jobs::Outcome::Appended { offset, .. } => offset,
            other => panic!("refused: {other:?}"),
        }
    };
    let epochs: Vec<(ContainerId, u64)> = (0..containers)
        .map(|n| {
            let container = ContainerId::new(format!("bench-{n}")).unwrap();
            let register = Command::RegisterContainer(RegisterContainer {
                container: container.clone(),
                location: String::new(),
            });
            (container, apply(&mut state, register))
        })
        .collect();
    let per_stream = inputs.div_ceil(10);
    let all: std::collections::BTreeSet<Input> = (0..inputs)
        .map(|i| {
            Input::new(
                "bench",
                format!("s{}", i / per_stream),
                (i % per_stream) as u32,
            )
            .unwrap()
        })
        .collect();
    for chunk in all.iter().cloned().collect::<Vec<_>>().chunks(1024) {
        apply(
            &mut state,
            Command::AddInputs(AddInputs {
                inputs: chunk.to_vec(),
            }),
        );
    }
    let mut tasks: std::collections::BTreeMap<TaskId, Vec<Input>> = Default::default();
    for input in &all {
        tasks
            .entry(GroupByPartition.task_for(input))
            .or_default()
            .push(input.clone());
    }
    for (n, (task, inputs)) in tasks.into_iter().enumerate() {
        let (container, epoch) = epochs[n % containers].clone();
        let assign = AssignTask {
            task: task.clone(),
            container: container.clone(),
            epoch,
            inputs,
        };
        apply(&mut state, Command::AssignTask(assign));
        apply(
            &mut state,
            Command::TaskStarted(TaskStarted {
                task,
                container,
                epoch,
            }),
        );
    }
    (state, all)
}

/// The leading controller's tick on a settled job of 10,000 containers and 10,000 inputs, in
/// its parts: the liveness checks over every session, and the plan (empty: nothing to do),
/// which a tick makes only when the state or the observations moved since the last.
fn controller_tick(c: &mut Criterion) {
    use ctrlog::jobs::plan::{plan, GroupByPartition, Observed};
    use ctrlog::jobs::Liveness;
    use std::time::{Duration, Instant};
    let (state, inputs) = settled_job(10_000, 10_000);
    let now = Instant::now();
    let mut liveness = Liveness::new(1, now);
    for session in state.live_sessions() {
        liveness.record(&state, &session, Default::default(), now);
    }
    let mut group = c.benchmark_group("controller_tick_10k_containers_10k_inputs");
    // What an apply pays when the tick still holds the state it read (copy on write), and
    // what a `state` answer copies; the tick itself only shares it.
    group.bench_function("copy_the_job_state", |b| b.iter(|| state.clone()));
    group.bench_function("overdue_sessions", |b| {
        b.iter(|| {
            assert!(liveness
                .overdue(&state, now, Duration::from_secs(6))
                .is_empty());
        })
    });
    group.bench_function("reported_lag", |b| b.iter(|| liveness.reported(&state)));
    let observed = Observed {
        inputs: std::sync::Arc::new(inputs),
        overdue: Vec::new(),
        launching: 0,
        desired_containers: 10_000,
        orchestrated: true,
    };
    group.bench_function("plan_a_settled_job", |b| {
        b.iter(|| assert!(plan(&state, &observed, &GroupByPartition).is_empty()))
    });
    group.finish();
}

criterion_group!(benches, apply, controller_tick);
criterion_main!(benches);
