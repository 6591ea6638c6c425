//! The scrubber finds rot under a running replica within its period (a byte flipped in a
//! stored WAL segment, a byte flipped in the stored snapshot), stops that replica naming the
//! fault, and the restart repairs it from the peers, with nothing acknowledged lost.

mod common;

use common::{append_many, assert_nothing_lost, eventually, http_get, metric_sample, WAIT};
use ctrlog::raft::storage::data_dir::log_dir;
use ctrlog::raft::storage::fault::{Fault, FaultKind};
use ctrlog::raft::storage::snapshots::faults as snapshot_faults;
use ctrlog::raft::storage::wal::{faults as wal_faults, DAMAGED_DIR};
use ctrlog::tools::LocalCluster;
use ctrlog::NodeId;

/// Three replicas that scrub continuously (a pass every 100 ms at 64 MiB/s) and serve
/// `/metrics`.
async fn scrubbing_cluster(dir: &std::path::Path) -> LocalCluster {
    LocalCluster::start(dir, 3, |c| {
        c.raft.scrub_mib_per_second = 64;
        c.raft.scrub_interval_ms = 100;
        c.http_addr = Some("127.0.0.1:0".parse().unwrap());
    })
    .await
    .unwrap()
}

/// Waits until `id`'s Raft core stopped; returns the fault the scrubber stopped it for, and
/// the passes it had completed then.
async fn scrubber_stopped(cluster: &LocalCluster, id: NodeId) -> (Fault, u64) {
    let replica = cluster.replica(id);
    eventually("the scrubber to stop the replica", || {
        replica.metrics().running_state.is_err().then_some(())
    })
    .await;
    let faults = replica.storage_faults();
    let fault = faults.stopped_for().expect("stopped by the scrubber");
    (fault, faults.passes())
}

/// `ctrlog_storage_faults_total{kind="..."}` on `id`'s `/metrics`.
async fn faults_metric(cluster: &LocalCluster, id: NodeId, kind: FaultKind) -> f64 {
    let addr = cluster
        .replica(id)
        .http_addr()
        .expect("the HTTP port is on");
    let (_, text) = http_get(addr, "/metrics").await;
    let name = format!("ctrlog_storage_faults_total{{kind=\"{kind}\"}}");
    metric_sample(&text, &name).unwrap_or_else(|| panic!("{name} in {text}"))
}

/// After the scrubber stopped `follower` for a fault of `kind`: the other two commit 50
/// appends, the follower's restart finds the fault at open (counted once in its
/// `ctrlog_storage_faults_total`), and after 10 more every replica holds all 260.
async fn restart_repairs(cluster: &mut LocalCluster, follower: NodeId, kind: FaultKind) {
    append_many(cluster, 200, 50).await;
    cluster.stop(follower).await;
    cluster.restart(follower).await.unwrap();
    assert_eq!(faults_metric(cluster, follower, kind).await, 1.0);
    append_many(cluster, 250, 10).await;
    assert_nothing_lost(cluster, 260).await;
}

/// Goal: a byte flipped in a synced record of a running follower's WAL is found by the
/// scrubber within one period (before two more passes complete), the follower stops naming
/// the segment, the other two keep committing, and the restart repairs the range from the
/// leader: the damaged segment is kept, the fault is counted, nothing is lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_scrubber_finds_a_flipped_byte_in_a_running_replicas_wal_and_the_restart_repairs_it() {
    let dir = tempfile::tempdir().unwrap();
    let mut cluster = scrubbing_cluster(dir.path()).await;
    let leader = cluster.wait_for_leader(WAIT).await.unwrap();
    append_many(&cluster, 0, 200).await;
    cluster.wait_for_applied(200, WAIT).await.unwrap();
    let follower = cluster.follower_of(leader);
    let data_dir = cluster.config(follower).data_dir.clone();
    let passes_before = cluster.replica(follower).storage_faults().passes();
    let (segment, byte) = wal_faults::flip_synced_byte(&log_dir(&data_dir), 1_000)
        .unwrap()
        .expect("a synced record to flip");

    let (fault, passes_at_stop) = scrubber_stopped(&cluster, follower).await;
    assert_eq!(fault.kind, FaultKind::LogDamaged, "{fault:?}");
    assert!(fault.file.ends_with(&segment), "{fault:?} {segment} {byte}");
    assert!(
        passes_at_stop <= passes_before + 1,
        "found within one period: {passes_before} passes before the flip, {passes_at_stop} at the stop"
    );
    restart_repairs(&mut cluster, follower, FaultKind::LogDamaged).await;
    assert!(log_dir(&data_dir).join(DAMAGED_DIR).join("1").is_dir());
    let repaired = cluster.replica(follower);
    eventually("the repair to end", || {
        matches!(repaired.repairing(), Ok(None)).then_some(())
    })
    .await;
    cluster.shutdown().await;
}

/// Goal: the same for a byte flipped in a running follower's stored snapshot: the scrubber
/// finds it, the follower stops, and the restart sets the snapshot aside and fetches the
/// leader's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_scrubber_finds_a_flipped_byte_in_a_running_replicas_snapshot_and_the_restart_repairs_it(
) {
    let dir = tempfile::tempdir().unwrap();
    let mut cluster = scrubbing_cluster(dir.path()).await;
    let leader = cluster.wait_for_leader(WAIT).await.unwrap();
    append_many(&cluster, 0, 200).await;
    cluster.wait_for_applied(200, WAIT).await.unwrap();
    let follower = cluster.follower_of(leader);
    let state_machine = cluster.replica(follower).node().state_machine().clone();
    cluster.replica(follower).snapshot_now().await.unwrap();
    eventually("the follower's snapshot to be stored", || {
        state_machine.stored_snapshot_last().unwrap()
    })
    .await;
    let passes_before = cluster.replica(follower).storage_faults().passes();
    snapshot_faults::flip_running_snapshot_byte(state_machine.snapshots(), 100)
        .unwrap()
        .expect("a snapshot to flip");
    drop(state_machine);

    let (fault, passes_at_stop) = scrubber_stopped(&cluster, follower).await;
    assert_eq!(fault.kind, FaultKind::SnapshotDamaged, "{fault:?}");
    assert!(
        passes_at_stop <= passes_before + 1,
        "found within one period: {passes_before} passes before the flip, {passes_at_stop} at the stop"
    );
    restart_repairs(&mut cluster, follower, FaultKind::SnapshotDamaged).await;
    cluster.shutdown().await;
}
