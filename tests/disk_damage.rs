//! Real `ctrlog serve` processes, one of whose disks rots while the replica is down.

mod common;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use common::{http_get, metric_sample, read_retained};
use ctrlog::client::{ControlClient, Status};
use ctrlog::jobs::Seen;
use ctrlog::log::{Command, LogEntry, ProducerSeq, Proposal, Target};
use ctrlog::raft::storage::data_dir::{log_dir, meta_dir};
use ctrlog::raft::storage::snapshots::faults as snapshot_faults;
use ctrlog::raft::storage::wal::{faults, DAMAGED_DIR};
use ctrlog::tools::cluster::ProcessCluster;
use ctrlog::tools::{poll_until, POLL_INTERVAL};

const WAIT: Duration = Duration::from_secs(60);
const APPENDS: u64 = 40;

fn proposal(producer: u64) -> Proposal {
    Proposal {
        producer: Some(ProducerSeq { producer, seq: 1 }),
        target: Target::All,
        frame: Command::custom(1, 1, body(producer)).into_frame(),
    }
}

fn body(producer: u64) -> Vec<u8> {
    format!("append-{producer}").into_bytes()
}

/// One replica's status, if it answers.
async fn status_of(addr: &str) -> Option<Status> {
    let client = ControlClient::connect(&[addr.to_string()]).await.ok()?;
    client.status().await.ok()
}

/// A replica's `ctrlog_damaged_entries`; `None` if it does not answer or has no such metric.
async fn damaged_entries(http: SocketAddr) -> Option<f64> {
    // Not listening yet (just started): no answer.
    tokio::net::TcpStream::connect(http).await.ok()?;
    let (code, metrics) = http_get(http, "/metrics").await;
    (code == 200)
        .then(|| metric_sample(&metrics, "ctrlog_damaged_entries"))
        .flatten()
}

/// Goal: one flipped byte in a follower's WAL loses no acknowledged append (the failure found
/// at 3d7237e, which took the damage for a torn tail, cut the log there, and came back as a
/// voter that had forgotten what it acknowledged: 24 of 40 appends were lost).
/// Steps: [`rot_a_follower_between_two_crashes`], the byte in the middle of the follower's
/// last WAL segment, with valid records after it. The damaged segment is kept as found.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_byte_flipped_in_a_followers_wal_loses_no_acknowledged_append() {
    let (_cluster, kept) = rot_a_follower_between_two_crashes(&[], |data_dir| {
        let wal = log_dir(data_dir);
        let sizes = faults::segment_sizes(&wal).unwrap();
        let (_, last) = sizes.last_key_value().unwrap();
        let middle_of_last = sizes.values().sum::<u64>() - last + last / 2;
        faults::flip_byte(&wal, middle_of_last).unwrap();
    })
    .await;
    assert!(!faults::segment_sizes(&kept).unwrap().is_empty());
}

/// Goal: a flipped byte in the final record of a follower's WAL, which leaves it whole in
/// length with a wrong checksum, loses no acknowledged append. Those are the bytes a torn
/// final write leaves too; the WAL's synced mark says that record was `fdatasync`ed, so it
/// is damage. (Before the mark it was cut as a torn tail, and the follower came back as a
/// voter without the last append it had acknowledged.)
/// Steps: [`rot_a_follower_between_two_crashes`], the second-to-last byte of the follower's
/// last segment (the final record's payload).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_byte_flipped_in_the_final_record_of_a_followers_wal_loses_no_acknowledged_append() {
    let (_cluster, kept) = rot_a_follower_between_two_crashes(&[], |data_dir| {
        let wal = log_dir(data_dir);
        let total: u64 = faults::segment_sizes(&wal).unwrap().values().sum();
        faults::flip_byte(&wal, total - 2).unwrap();
    })
    .await;
    assert!(!faults::segment_sizes(&kept).unwrap().is_empty());
}

/// Goal: writes that a follower's disk lost after `fdatasync` reported them done (its last
/// five records, the segment cut cleanly before them) lose no acknowledged append: the synced
/// mark says the log held them, so the follower repairs them from the leader. (Before the
/// mark, a log that ended cleanly was whole, and the follower voted without them.)
/// Steps: [`rot_a_follower_between_two_crashes`], the last five records cut.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writes_a_followers_disk_lost_after_fdatasync_lose_no_acknowledged_append() {
    let (_cluster, kept) = rot_a_follower_between_two_crashes(&[], |data_dir| {
        let log = log_dir(data_dir);
        if faults::synced_mark(&log).unwrap().is_some() {
            let lost = faults::lose_synced_records(&log, 5).unwrap();
            assert!(lost.is_some(), "the synced mark covers the last records");
        } else {
            // A build before the mark (CTRLOG_TEST_REPLICA_BINARY) left none to keep.
            faults::lose_last_entries(&log, 5).unwrap();
        }
    })
    .await;
    assert!(!faults::segment_sizes(&kept).unwrap().is_empty());
}

/// Goal: one flipped byte in a follower's stored snapshot (rot that sled's own checks miss)
/// loses no acknowledged append: the follower sets the snapshot and its log aside, starts
/// over empty, refuses to vote until the leader has sent it back what it held, and is
/// repaired from the leader's snapshot and log. (Before, it refused to start: "stored
/// snapshot fails its length or checksum".)
/// Steps: [`rot_a_follower_between_two_crashes`] with snapshots every 20 entries, once the
/// follower stored one, the byte in the middle of it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_byte_flipped_in_a_followers_snapshot_loses_no_acknowledged_append() {
    let args = [
        "--snapshot-logs-since-last",
        "20",
        "--snapshot-logs-to-keep",
        "5",
    ];
    let (_cluster, kept) = rot_a_follower_between_two_crashes(&args, |data_dir| {
        let flipped =
            snapshot_faults::flip_snapshot_byte(&meta_dir(data_dir), u64::MAX / 2).unwrap();
        assert!(flipped.is_some(), "the follower has a stored snapshot");
    })
    .await;
    assert!(kept.join("snapshot").exists());
}

/// Three replicas (`serve_args` added to each); stop one (C); 40 appends, each acknowledged,
/// commit on the leader (L) and the other follower (B), which has a snapshot if snapshots are
/// taken; kill B and L; `rot` B's data directory; start B and C; wait until B says it is
/// repairing (an older build instead elects a leader among B and C and commits on it); start
/// L. Every acknowledged append is then on every replica at its offset and B's repair has
/// ended. Returns the cluster, still running, and where B kept what it found damaged.
async fn rot_a_follower_between_two_crashes(
    serve_args: &[&str],
    rot: impl FnOnce(&Path),
) -> (ProcessCluster, PathBuf) {
    let serve_args: Vec<String> = serve_args.iter().map(|a| a.to_string()).collect();
    let mut cluster = ProcessCluster::start_with_http(common::replica_exe(), 3, &serve_args)
        .await
        .unwrap();
    let addrs = cluster.client_addrs();
    let client = ControlClient::connect(&addrs).await.unwrap();
    let leader = client.leader_status().await.unwrap().id as usize - 1;
    let (damaged, down) = ((leader + 1) % 3, (leader + 2) % 3);
    cluster.kill(down);

    let mut acked = BTreeMap::new();
    for producer in 1..=APPENDS {
        let ack = client.append_proposal(proposal(producer)).await.unwrap();
        acked.insert(producer, ack.offset);
    }
    drop(client);
    if !serve_args.is_empty() {
        let damaged_addr = addrs[damaged].clone();
        poll_until(
            "the follower to store a snapshot",
            WAIT,
            POLL_INTERVAL,
            || async {
                match status_of(&damaged_addr).await {
                    Some(s) if s.snapshot_index.is_some() => Ok(()),
                    other => Err(format!("{other:?}")),
                }
            },
        )
        .await
        .unwrap();
    }
    cluster.kill(damaged);
    cluster.kill(leader);
    rot(&cluster.replica_dir(damaged));
    cluster.restart(damaged).unwrap();
    cluster.restart(down).unwrap();
    let damaged_http = cluster.http_addr(damaged).unwrap();
    let (damaged_addr, down_addr) = (addrs[damaged].clone(), addrs[down].clone());
    let repairing = poll_until(
        "the damaged replica to say it is repairing, or a leader without the third",
        WAIT,
        POLL_INTERVAL,
        || async {
            if damaged_entries(damaged_http).await.is_some_and(|d| d > 0.0) {
                let (_, page) = http_get(damaged_http, "/status.json").await;
                return Ok(Some(page));
            }
            for addr in [&damaged_addr, &down_addr] {
                // An older build: a leader of the two that has committed its first entry.
                if let Some(status) = status_of(addr).await {
                    let committed = status.applied_index == status.last_log_index;
                    if status.leader_id == Some(status.id) && committed {
                        return Ok(None);
                    }
                }
            }
            Err("neither")
        },
    )
    .await
    .unwrap();

    cluster.restart(leader).unwrap();
    poll_until(
        "the replicas to agree on what is applied",
        WAIT,
        POLL_INTERVAL,
        || async {
            let mut positions = std::collections::BTreeSet::new();
            for addr in &addrs {
                match status_of(addr).await {
                    Some(s) if s.leader_id.is_some() && s.applied_index == s.last_log_index => {
                        positions.insert((s.applied_index, s.applied_offset));
                    }
                    other => return Err(format!("{addr}: {other:?}")),
                }
            }
            (positions.len() == 1)
                .then_some(())
                .ok_or("not yet agreed")
                .map_err(String::from)
        },
    )
    .await
    .unwrap();
    for (i, addr) in addrs.iter().enumerate() {
        // The retained log, and the producer table for what snapshots compacted.
        let entries: BTreeMap<u64, LogEntry> = read_retained(addr)
            .await
            .into_iter()
            .map(|e| (e.offset, e))
            .collect();
        let replica = ControlClient::connect(std::slice::from_ref(addr))
            .await
            .unwrap();
        let state = replica.state(0).await.unwrap().state;
        let lost: Vec<u64> = acked
            .iter()
            .filter(|(producer, offset)| {
                let wanted = proposal(**producer);
                let pair = wanted.producer.expect("idempotent");
                let recorded = matches!(
                    state.producers().check(pair),
                    Seen::Duplicate { offset: at } if at == **offset
                );
                let retained = entries.get(offset).map(|e| (e.producer, &e.frame));
                !recorded || retained.is_some_and(|r| r != (wanted.producer, &wanted.frame))
            })
            .map(|(producer, _)| *producer)
            .collect();
        assert!(
            lost.is_empty(),
            "replica {} lost {} of {APPENDS} acknowledged appends: {lost:?}",
            i + 1,
            lost.len()
        );
    }
    let page = repairing.expect("the damaged replica said it was repairing");
    assert!(page.contains("repairing: entries"), "{page}");
    poll_until(
        "the damaged replica's repair to end",
        WAIT,
        POLL_INTERVAL,
        || async {
            match damaged_entries(damaged_http).await {
                Some(0.0) => Ok(()),
                other => Err(format!("{other:?}")),
            }
        },
    )
    .await
    .unwrap();
    let kept = log_dir(&cluster.replica_dir(damaged))
        .join(DAMAGED_DIR)
        .join("1");
    (cluster, kept)
}
