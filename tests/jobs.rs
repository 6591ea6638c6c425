//! The job model on a real cluster: container sessions, assignments and acks, expiry and
//! fencing, the vocabulary gate with an old reader, and JobState after restart and `Reset`.

mod common;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use common::{eventually, WAIT};
use ctrlog::client::{
    ApiError, ClientError, ContainerSession, ControlClient, SessionOptions, Subscription,
    SubscriptionItem,
};
use ctrlog::jobs::{ContainerStatus, JobState, Rejection, TaskPhase};
use ctrlog::log::vocabulary::{kinds, Vocabulary, LEVEL_MAX};
use ctrlog::log::*;
use ctrlog::tools::LocalCluster;
use futures::StreamExt;

async fn next_item(stream: &mut Subscription) -> SubscriptionItem {
    tokio::time::timeout(WAIT, stream.next())
        .await
        .expect("the subscription stalled")
        .expect("the stream does not end")
        .expect("subscription item")
}

async fn next_command(stream: &mut Subscription) -> (Offset, Command) {
    match next_item(stream).await {
        SubscriptionItem::Entry(entry) => (entry.offset, entry.command()),
        reset => panic!("unexpected {reset:?}"),
    }
}

fn refused(result: Result<ctrlog::client::AppendAck, ClientError>) -> ApiError {
    match result {
        Err(ClientError::Api(error)) => error,
        other => panic!("expected a refusal, got {other:?}"),
    }
}

/// Goal: a container joins, receives its assignment, acks it, heartbeats its lag to the
/// leader, and once expired is fenced: its heartbeats and its late ack are refused, and a
/// fresh session gets a new epoch.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_container_session_is_assigned_acks_and_is_fenced_after_expiry() {
    let dir = tempfile::tempdir().unwrap();
    let cluster = LocalCluster::start_secure(dir.path(), 3, |_| {})
        .await
        .unwrap();
    let leader = cluster.wait_for_leader(WAIT).await.unwrap();
    let seeds = cluster.client_addrs();
    let coordinator = ControlClient::connect_with(&seeds, cluster.client_options())
        .await
        .unwrap();
    let container_client = Arc::new(
        ControlClient::connect_with(&seeds, cluster.client_options())
            .await
            .unwrap(),
    );
    let me = ContainerId::new("c1").unwrap();
    let options = SessionOptions {
        heartbeat_interval: Duration::from_millis(100),
        location: "test".into(),
    };
    let lag = || BTreeMap::from([(TaskId::new("t0").unwrap(), 42)]);
    let session =
        ContainerSession::join(container_client.clone(), me.clone(), options.clone(), lag)
            .await
            .unwrap();
    let epoch = session.epoch();
    let mut commands = session.commands();

    let input = Input::new("kafka", "events", 0).unwrap();
    let t0 = TaskId::new("t0").unwrap();
    coordinator
        .append(Command::AddInputs(AddInputs {
            inputs: vec![input.clone()],
        }))
        .await
        .unwrap();
    let assign = AssignTask {
        task: t0.clone(),
        container: me.clone(),
        epoch,
        inputs: vec![input],
    };
    let assigned = coordinator
        .append(Command::AssignTask(assign.clone()))
        .await
        .unwrap();
    // The container's stream skips the coordinator's own commands.
    assert_eq!(
        next_command(&mut commands).await,
        (assigned.offset, Command::AssignTask(assign))
    );
    session.task_started(t0.clone()).await.unwrap();
    let at = coordinator.state(0).await.unwrap();
    match &at.state.tasks()[&t0].phase {
        TaskPhase::Running { owner, .. } => {
            assert_eq!((&owner.container, owner.epoch), (&me, epoch))
        }
        other => panic!("expected running, got {other:?}"),
    }
    assert!(at.state.pending().is_empty(), "the handshake completed");

    let leader_handle = cluster.replica(leader).clone_handle();
    eventually("the leader to hear the lag", || {
        leader_handle
            .reported_lag()
            .unwrap()
            .get(&me)
            .copied()
            .filter(|lag| *lag == 42)
    })
    .await;
    let follower = cluster.replica(cluster.follower_of(leader)).clone_handle();
    assert!(matches!(
        follower.reported_lag(),
        Err(ApiError::NotLeader { .. })
    ));

    coordinator
        .append(Command::ExpireContainer(ExpireContainer {
            container: me.clone(),
            epoch,
        }))
        .await
        .unwrap();
    assert!(
        matches!(
            next_command(&mut commands).await.1,
            Command::ExpireContainer(_)
        ),
        "a zombie learns of its expiry from its own stream"
    );
    let refusal = tokio::time::timeout(WAIT, session.fenced()).await.unwrap();
    assert_eq!(
        refusal,
        ApiError::Fenced {
            container: me.clone(),
            epoch,
            current_epoch: None
        }
    );
    assert!(session.is_fenced());
    assert_eq!(
        refused(session.task_stopped(t0.clone(), None).await),
        ApiError::Fenced {
            container: me.clone(),
            epoch,
            current_epoch: None
        }
    );
    let at = coordinator.state(0).await.unwrap();
    assert_eq!(at.state.tasks()[&t0].phase, TaskPhase::Unassigned);
    assert_eq!(at.state.containers()[&me].status, ContainerStatus::Expired);

    let again = ContainerSession::join(container_client, me.clone(), options, Default::default)
        .await
        .unwrap();
    assert!(again.epoch() > epoch);
    let stale = AssignTask {
        task: t0.clone(),
        container: me.clone(),
        epoch,
        inputs: vec![],
    };
    assert_eq!(
        refused(coordinator.append(Command::AssignTask(stale)).await),
        ApiError::Fenced {
            container: me.clone(),
            epoch,
            current_epoch: Some(again.epoch())
        }
    );
    // A silent session shows up as overdue on the leader.
    let new_epoch = again.epoch();
    drop(again);
    eventually("the silent session to be overdue", || {
        let overdue = leader_handle
            .overdue_sessions(Duration::from_millis(300))
            .unwrap();
        overdue
            .iter()
            .any(|s| s.container == me && s.epoch == new_epoch)
            .then_some(())
    })
    .await;
    cluster.shutdown().await;
}

/// Goal: the vocabulary level gates new kinds, deprecation refuses old ones on append while
/// they stay readable, and an old reader passes a newer kind through and keeps going.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_vocabulary_gate_and_an_old_reader_on_a_real_log() {
    let dir = tempfile::tempdir().unwrap();
    let cluster = LocalCluster::start_secure(dir.path(), 3, |config| {
        config.initial_vocabulary_level = Some(1)
    })
    .await
    .unwrap();
    cluster.wait_for_leader(WAIT).await.unwrap();
    let client = ControlClient::connect_with(&cluster.client_addrs(), cluster.client_options())
        .await
        .unwrap();
    let v1 = Command::DesiredContainersV1(DesiredContainersV1 { count: 2 });
    let v2 = Command::DesiredContainers(DesiredContainers {
        count: 3,
        reason: "lag above 10,000 for 60 s".into(),
    });
    assert_eq!(
        refused(client.append(v2.clone()).await),
        ApiError::Refused(Rejection::NotYetAllowed {
            kind: kinds::DESIRED_CONTAINERS,
            version: 2,
            level: 1
        })
    );
    let old_kind = client.append(v1.clone()).await.unwrap().offset;
    assert_eq!(
        refused(
            client
                .append(Command::SetVocabularyLevel(SetVocabularyLevel {
                    level: LEVEL_MAX + 1
                }))
                .await
        ),
        ApiError::Refused(Rejection::LevelUnsupported {
            requested: LEVEL_MAX + 1,
            supported: LEVEL_MAX
        })
    );
    client
        .append(Command::SetVocabularyLevel(SetVocabularyLevel { level: 2 }))
        .await
        .unwrap();
    assert_eq!(
        refused(client.append(v1).await),
        ApiError::Deprecated {
            kind: kinds::DESIRED_CONTAINERS,
            version: 1,
            level: 2
        }
    );
    let new_kind = client.append(v2.clone()).await.unwrap().offset;
    let last = client
        .append(Command::custom(1, 1, b"after".to_vec()))
        .await
        .unwrap()
        .offset;

    let old_reader = Vocabulary::up_to(1);
    let mut stream = client.subscribe(1, Filter::Everything);
    let mut seen = Vec::new();
    while seen.last().is_none_or(|(offset, _)| *offset < last) {
        match next_item(&mut stream).await {
            SubscriptionItem::Entry(entry) => {
                seen.push((entry.offset, old_reader.decode(entry.frame)))
            }
            reset => panic!("unexpected {reset:?}"),
        }
    }
    let decoded: BTreeMap<Offset, Command> = seen.into_iter().collect();
    assert!(
        matches!(decoded[&old_kind], Command::DesiredContainersV1(_)),
        "still readable"
    );
    assert!(
        matches!(&decoded[&new_kind], Command::Unknown(frame) if frame.kind == kinds::DESIRED_CONTAINERS && frame.version == 2),
        "the old reader passes the newer kind through"
    );
    assert!(
        matches!(decoded[&last], Command::Custom { .. }),
        "and keeps going"
    );
    let at = client.state(last).await.unwrap();
    // The state machine's refusals are recorded on every replica; the level check happened
    // before the log and is not.
    assert_eq!(at.rejections.total, 2);
    assert!(matches!(
        at.rejections.recent[0].rejection,
        Rejection::NotYetAllowed { .. }
    ));
    assert!(matches!(
        at.rejections.recent[1].rejection,
        Rejection::Deprecated { .. }
    ));
    assert_eq!(at.rejections.recent[1].after_offset, old_kind + 1);
    assert_eq!(at.state.level(), 2);
    assert_eq!(at.state.desired_containers().unwrap().count, 3);
    cluster.shutdown().await;
}

/// Goal: JobState is the snapshot content: a replica restarted on a snapshot plus a tail, and
/// a subscriber that got `Reset` and folded the entries after it, hold exactly the state of
/// the replicas that applied the whole log.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restart_and_reset_reach_the_full_replay_state() {
    let dir = tempfile::tempdir().unwrap();
    let mut cluster = LocalCluster::start_secure(dir.path(), 3, |c| {
        c.raft.snapshot_logs_since_last = 100_000;
        c.raft.snapshot_logs_to_keep = 5;
    })
    .await
    .unwrap();
    let leader = cluster.wait_for_leader(WAIT).await.unwrap();
    let client = ControlClient::connect_with(&cluster.client_addrs(), cluster.client_options())
        .await
        .unwrap();
    let mut epochs = Vec::new();
    for n in 0..4 {
        let register = Command::RegisterContainer(RegisterContainer {
            container: ContainerId::new(format!("c{n}")).unwrap(),
            location: String::new(),
        });
        epochs.push(client.append(register).await.unwrap().offset);
    }
    let inputs: Vec<Input> = (0..8)
        .map(|p| Input::new("kafka", "events", p).unwrap())
        .collect();
    client
        .append(Command::AddInputs(AddInputs {
            inputs: inputs.clone(),
        }))
        .await
        .unwrap();
    let job_round = |round: u32| {
        let client = &client;
        let (epochs, inputs) = (&epochs, &inputs);
        async move {
            for (n, input) in inputs.iter().enumerate() {
                let container = ContainerId::new(format!("c{}", (n + round as usize) % 4)).unwrap();
                let epoch = epochs[(n + round as usize) % 4];
                let task = TaskId::new(format!("t{n}")).unwrap();
                client
                    .append(Command::AssignTask(AssignTask {
                        task: task.clone(),
                        container: container.clone(),
                        epoch,
                        inputs: vec![input.clone()],
                    }))
                    .await
                    .unwrap();
                client
                    .append(Command::TaskStarted(TaskStarted {
                        task: task.clone(),
                        container: container.clone(),
                        epoch,
                    }))
                    .await
                    .unwrap();
                client
                    .append(Command::StopTask(StopTask {
                        task: task.clone(),
                        container: container.clone(),
                        epoch,
                    }))
                    .await
                    .unwrap();
                let checkpoint = format!("round {round}").into_bytes();
                client
                    .append(Command::TaskStopped(TaskStopped {
                        task,
                        container,
                        epoch,
                        checkpoint: Some(checkpoint),
                    }))
                    .await
                    .unwrap();
            }
            client
                .append(Command::SchemaChange(SchemaChange {
                    subject: "events".into(),
                    schema: format!("v{round}").into_bytes(),
                }))
                .await
                .unwrap()
                .offset
        }
    };
    job_round(0).await;
    let last_before = job_round(1).await;
    cluster.wait_for_applied(last_before, WAIT).await.unwrap();
    for replica in cluster.running() {
        replica.snapshot().await.unwrap();
    }
    let follower = cluster.follower_of(leader);
    cluster.stop(follower).await;
    let last = job_round(2).await;

    cluster.restart(follower).await.unwrap();
    cluster.wait_for_applied(last, WAIT).await.unwrap();
    let reference = cluster
        .replica(leader)
        .state(last, WAIT)
        .await
        .unwrap()
        .state;
    assert!(
        reference.pending().len() >= 3,
        "the schema broadcasts await acks"
    );
    for replica in cluster.running() {
        let at = replica.state(last, WAIT).await.unwrap();
        assert_eq!(at.state, reference, "replica {}", replica.id());
    }

    let mut stream = client.subscribe(1, Filter::Everything);
    let mut folded: JobState = match next_item(&mut stream).await {
        SubscriptionItem::Reset { state, offset } => {
            assert!(
                offset >= last_before - 5,
                "reset covers the purged log (at {offset})"
            );
            state
        }
        entry => panic!("expected Reset, got {entry:?}"),
    };
    while folded.last_offset() < last {
        match next_item(&mut stream).await {
            SubscriptionItem::Entry(entry) => folded.apply_entry(&entry).unwrap(),
            reset => panic!("unexpected {reset:?}"),
        }
    }
    assert_eq!(folded, *reference);
    cluster.shutdown().await;
}

/// Goal: nothing a client names can grow the replicated state beyond its stated limits (issue
/// 14): a registration whose location exceeds `TEXT_BYTES_MAX`, or whose container id exceeds
/// the name limit inside the command's body, is refused with `Invalid` before it reaches the
/// log, and the same registration within the limits is appended.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn names_and_text_beyond_their_limits_are_refused_before_the_log() {
    let dir = tempfile::tempdir().unwrap();
    let cluster = LocalCluster::start_secure(dir.path(), 3, |_| {})
        .await
        .unwrap();
    cluster.wait_for_leader(WAIT).await.unwrap();
    let client = ControlClient::connect_with(&cluster.client_addrs(), cluster.client_options())
        .await
        .unwrap();
    let register = |location: String| {
        Command::RegisterContainer(RegisterContainer {
            container: ContainerId::new("c1").unwrap(),
            location,
        })
    };
    let too_long = client
        .append(register("x".repeat(TEXT_BYTES_MAX + 1)))
        .await;
    assert!(
        matches!(&too_long, Err(ClientError::Api(ApiError::Invalid(why))) if why.contains("location")),
        "{too_long:?}"
    );
    // A container id is checked inside the body too, however the client built it.
    let mut frame = register("host-1".into()).into_frame();
    let long_id = "c".repeat(NAME_BYTES_MAX + 1);
    frame.body = encode(&(long_id.clone(), "host-1".to_string()));
    let proposal = Proposal {
        producer: None,
        target: Target::Container(ContainerId::new("c1").unwrap()),
        frame,
    };
    let long_container = client.append_proposal(proposal).await;
    assert!(
        matches!(&long_container, Err(ClientError::Api(ApiError::Invalid(why))) if why.contains(&long_id)),
        "{long_container:?}"
    );
    // Every append above was refused before the log, so the new cluster's level raise (offset
    // 1) may still be on its way to replica 1.
    cluster.wait_for_applied(1, WAIT).await.unwrap();
    let applied = cluster.replica(1).applied_offset();
    let ack = client
        .append(register("x".repeat(TEXT_BYTES_MAX)))
        .await
        .unwrap();
    assert_eq!(ack.offset, applied + 1, "nothing refused took an offset");
    cluster.shutdown().await;
}
