//! Faults injected inside a replica at its storage boundaries (the `fail` crate): a failed
//! WAL flush, a failed apply, a failed snapshot build and a failed snapshot install each stop
//! the replica they hit, as a crash would; restarted on its directory, it recovers with no
//! committed entry lost and no divergence.
//!
//! `cargo test --features failpoints --test failpoints` (CI runs it).
#![cfg(feature = "failpoints")]

mod common;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use common::{assert_contiguous, read_all, read_from, WAIT};
use ctrlog::client::{ClientOptions, ControlClient};
use ctrlog::log::{Command, Offset, Target};
use ctrlog::raft::LocalCluster;
use ctrlog::NodeId;

/// Appends `count` commands, retrying through failovers; returns offset → body.
async fn append(client: &ControlClient, tag: &str, count: u32) -> BTreeMap<Offset, Vec<u8>> {
    let mut acked = BTreeMap::new();
    for i in 0..count {
        let body = format!("{tag} #{i}").into_bytes();
        let ack = client
            .append_to(Target::All, Command::custom(1, 1, body.clone()))
            .await
            .expect("appends go on after the fault");
        acked.insert(ack.offset, body);
    }
    acked
}

/// Replicas whose Raft core stopped on the injected storage error.
fn stopped(cluster: &LocalCluster) -> Vec<NodeId> {
    cluster
        .running()
        .filter(|r| r.metrics().running_state.is_err())
        .map(|r| r.id())
        .collect()
}

/// Waits until some replica stopped on the fault, then restarts every stopped one.
async fn restart_stopped(cluster: &mut LocalCluster, point: &str) -> Vec<NodeId> {
    let deadline = Instant::now() + WAIT;
    let victims = loop {
        let victims = stopped(cluster);
        if !victims.is_empty() {
            break victims;
        }
        assert!(
            Instant::now() < deadline,
            "{point}: no replica hit the fault"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    for id in &victims {
        cluster.stop(*id).await;
        cluster.restart(*id).await.unwrap();
    }
    victims
}

/// Every replica holds every acknowledged command at its offset, and the logs are equal.
async fn assert_nothing_lost(
    cluster: &LocalCluster,
    acked: &BTreeMap<Offset, Vec<u8>>,
    point: &str,
) {
    let last = *acked.keys().last().unwrap();
    cluster.wait_for_applied(last, WAIT).await.unwrap();
    let mut reference = None;
    for replica in cluster.running() {
        let log = read_all(replica).await;
        assert_contiguous(&log);
        for (offset, body) in acked {
            assert_eq!(
                &log[*offset as usize - 1].frame.body,
                body,
                "{point}: offset {offset}"
            );
        }
        let prefix: Vec<_> = log.iter().take(last as usize).cloned().collect();
        match &reference {
            None => reference = Some(prefix),
            Some(r) => assert_eq!(&prefix, r, "{point}: replica {} diverged", replica.id()),
        }
    }
}

/// Goal: each storage fault stops only the replica it hits, and a restart recovers it.
/// Steps, for a failed WAL flush and a failed apply: commit 20 commands, arm the fail point
/// for one hit, commit 30 more through whatever failover follows, restart the replica that
/// stopped, and check every acknowledged command on every replica. For a failed snapshot
/// build: arm it, ask the leader for a snapshot, restart it, check. For a failed snapshot
/// install: a follower far behind a purged leader fails its first install, is restarted, and
/// installs on the second try.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn storage_faults_stop_a_replica_and_a_restart_recovers_it() {
    let scenario = fail::FailScenario::setup();
    let options = ClientOptions {
        request_timeout: Duration::from_secs(2),
        ..ClientOptions::default()
    };
    for point in ["wal-sync", "apply"] {
        let dir = tempfile::tempdir().unwrap();
        let mut cluster = LocalCluster::start(dir.path(), 3, |_| {}).await.unwrap();
        cluster.wait_for_leader(WAIT).await.unwrap();
        let client = ControlClient::connect_with(&cluster.client_addrs(), options.clone())
            .await
            .unwrap();
        let mut acked = append(&client, "before", 20).await;
        fail::cfg(point, "1*return").unwrap();
        acked.extend(append(&client, "after", 30).await);
        let victims = restart_stopped(&mut cluster, point).await;
        fail::remove(point);
        acked.extend(append(&client, "restarted", 10).await);
        assert_nothing_lost(&cluster, &acked, point).await;
        println!("{point}: replica(s) {victims:?} stopped and recovered");
        cluster.shutdown().await;
    }

    // A failed snapshot build stops the leader; its successor and its restart lose nothing.
    let dir = tempfile::tempdir().unwrap();
    let mut cluster = LocalCluster::start(dir.path(), 3, |c| c.snapshot_logs_to_keep = 5)
        .await
        .unwrap();
    let leader = cluster.wait_for_leader(WAIT).await.unwrap();
    let client = ControlClient::connect_with(&cluster.client_addrs(), options.clone())
        .await
        .unwrap();
    let mut acked = append(&client, "before", 40).await;
    fail::cfg("snapshot-build", "1*return").unwrap();
    let _ = cluster.replica(leader).snapshot_now().await;
    let victims = restart_stopped(&mut cluster, "snapshot-build").await;
    fail::remove("snapshot-build");
    assert_eq!(victims, vec![leader]);
    acked.extend(append(&client, "after", 20).await);
    assert_nothing_lost(&cluster, &acked, "snapshot-build").await;

    // A follower left behind a purged log must install a snapshot; the first install fails.
    let leader = cluster.wait_for_leader(WAIT).await.unwrap();
    let follower = cluster.follower_of(leader);
    cluster.stop(follower).await;
    acked.extend(append(&client, "while away", 60).await);
    for replica in cluster.running() {
        replica.snapshot().await.unwrap();
    }
    fail::cfg("snapshot-install", "1*return").unwrap();
    cluster.restart(follower).await.unwrap();
    let victims = restart_stopped(&mut cluster, "snapshot-install").await;
    fail::remove("snapshot-install");
    assert_eq!(victims, vec![follower]);
    acked.extend(append(&client, "after install", 10).await);
    let last = *acked.keys().last().unwrap();
    cluster.wait_for_applied(last, WAIT).await.unwrap();
    let installed = cluster.replica(follower).metrics().snapshot;
    assert!(installed.is_some(), "the follower installed a snapshot");
    // Both retain the tail after their snapshots; where they overlap they are equal, and
    // the acknowledged commands there are at their offsets.
    let first = [leader, follower]
        .iter()
        .map(|id| cluster.replica(*id).status().first_offset)
        .max()
        .unwrap();
    let leader_tail = read_from(cluster.replica(leader), first).await;
    let follower_tail = read_from(cluster.replica(follower), first).await;
    assert_eq!(
        follower_tail, leader_tail,
        "snapshot-install: the follower diverged"
    );
    assert!(!follower_tail.is_empty());
    for entry in &follower_tail {
        if let Some(body) = acked.get(&entry.offset) {
            assert_eq!(
                &entry.frame.body, body,
                "snapshot-install: offset {}",
                entry.offset
            );
        }
    }
    cluster.shutdown().await;
    scenario.teardown();
}
