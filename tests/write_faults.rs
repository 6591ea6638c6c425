//! A full disk (`ENOSPC`) or a failing device (`EIO`) under one follower: on a write or an
//! `fdatasync` of its WAL, a flush of sled, a write of a snapshot. Each stops that replica
//! with an error that names the file, the other two keep committing, and once the disk is
//! healed the replica restarts on its own directory and catches up with nothing acknowledged
//! lost. One test fills a real file system (a small tmpfs the test mounts) rather than
//! injecting the error.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command as Process;
use std::time::Duration;

use common::{
    append_many, assert_contiguous, assert_nothing_lost, copy_dir, eventually, read_retained,
    replica_exe, WAIT,
};
use ctrlog::client::{ClientOptions, ControlClient};
use ctrlog::log::{Command, Target};
use ctrlog::raft::restore::open_storage;
use ctrlog::raft::storage::check::check_data_dir;
use ctrlog::raft::storage::data_dir::{log_dir, meta_dir};
use ctrlog::raft::storage::fault::FaultKind;
use ctrlog::raft::storage::wal::faults as wal_faults;
use ctrlog::raft::storage::write_faults::{faults, Operation};
use ctrlog::tools::cluster::ProcessCluster;
use ctrlog::tools::LocalCluster;
use ctrlog::NodeId;

/// Where the injected failure strikes, and what makes the follower reach it.
#[derive(Clone, Copy, Debug)]
enum Site {
    WalWrite,
    WalSync,
    SledFlush,
    SnapshotWrite,
}

impl Site {
    /// The folder whose files fail, and the operation that fails on them.
    fn target(self, data_dir: &Path) -> (PathBuf, Operation) {
        match self {
            Site::WalWrite => (log_dir(data_dir), Operation::Write),
            Site::WalSync => (log_dir(data_dir), Operation::Sync),
            Site::SledFlush => (meta_dir(data_dir), Operation::Sync),
            Site::SnapshotWrite => (meta_dir(data_dir), Operation::Write),
        }
    }

    /// What the error must name: a segment of the WAL, or sled's data file.
    fn named_file(self, data_dir: &Path) -> String {
        match self {
            Site::WalWrite | Site::WalSync => log_dir(data_dir).to_string_lossy().into_owned(),
            Site::SledFlush | Site::SnapshotWrite => {
                meta_dir(data_dir).join("db").to_string_lossy().into_owned()
            }
        }
    }
}

/// The error a stopped replica's Raft core stopped on, if it stopped.
fn stopped_on(cluster: &LocalCluster, id: NodeId) -> Option<String> {
    match &cluster.replica(id).metrics().running_state {
        Err(fatal) => Some(fatal.to_string()),
        Ok(()) => None,
    }
}

/// Appends `count` commands through the client, which follows a failover; returns the
/// offsets acknowledged.
async fn append(client: &ControlClient, count: u32) -> Vec<u64> {
    let mut acked = Vec::new();
    for i in 0..count {
        let command = Command::custom(1, 1, format!("append {i}").into_bytes());
        let ack = client.append_to(Target::All, command).await;
        acked.push(ack.expect("appends go on through the fault").offset);
    }
    acked
}

/// The highest offset acknowledged.
fn max(acked: &[u64]) -> u64 {
    *acked.iter().max().expect("something was acknowledged")
}

/// Three replicas; `site` fails with `errno` on a follower (or on the leader); that replica
/// must stop naming the file, the others commit on, and once healed it restarts and catches
/// up.
async fn replica_fails_then_heals(site: Site, errno: i32, error_text: &str, on_leader: bool) {
    let case = format!("{site:?} {error_text}, leader {on_leader}");
    let dir = tempfile::tempdir().unwrap();
    let mut cluster = LocalCluster::start(dir.path(), 3, |_| {}).await.unwrap();
    let leader = cluster.wait_for_leader(WAIT).await.unwrap();
    let options = ClientOptions::new().request_timeout(Duration::from_secs(2));
    let client = ControlClient::connect_with(&cluster.client_addrs(), options)
        .await
        .unwrap();
    let mut acked = append(&client, 20).await;
    let follower = match on_leader {
        true => leader,
        false => cluster.follower_of(leader),
    };
    cluster.wait_for_applied(20, WAIT).await.unwrap();
    let data_dir = cluster.config(follower).data_dir.clone();
    let (under, operation) = site.target(&data_dir);
    faults::fail_under(&under, operation, errno);

    match site {
        Site::WalWrite | Site::WalSync => acked.extend(append(&client, 20).await),
        Site::SledFlush | Site::SnapshotWrite => {
            let raft = cluster.replica(follower).raft().clone();
            raft.trigger().snapshot().await.unwrap();
        }
    }
    let error = eventually(&format!("{case}: the replica to stop"), || {
        stopped_on(&cluster, follower)
    })
    .await;
    eprintln!("{case}: the replica stopped: {error}");
    assert!(
        error.contains(&site.named_file(&data_dir)) && error.contains(error_text),
        "{case}: the error must name the file and the failure: {error}"
    );
    // The other two keep committing.
    acked.extend(append(&client, 20).await);
    assert!(cluster
        .running()
        .all(|r| r.id() == follower || r.metrics().running_state.is_ok()));

    faults::heal_under(&under);
    cluster.stop(follower).await;
    cluster.restart(follower).await.unwrap();
    acked.extend(append(&client, 10).await);
    assert_nothing_lost(&cluster, max(&acked)).await;
    cluster.shutdown().await;
}

const NO_SPACE: &str = "No space left on device";
const IO_ERROR: &str = "Input/output error";

/// Goal: a follower whose WAL write fails stops naming the segment; the rest carry on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_disk_on_a_followers_wal_write_stops_it_and_it_catches_up() {
    replica_fails_then_heals(Site::WalWrite, libc::ENOSPC, NO_SPACE, false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_device_on_a_followers_wal_write_stops_it_and_it_catches_up() {
    replica_fails_then_heals(Site::WalWrite, libc::EIO, IO_ERROR, false).await;
}

/// Goal: the same for the WAL's `fdatasync`, which is never retried once it failed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_disk_on_a_followers_wal_fdatasync_stops_it_and_it_catches_up() {
    replica_fails_then_heals(Site::WalSync, libc::ENOSPC, NO_SPACE, false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_device_on_a_followers_wal_fdatasync_stops_it_and_it_catches_up() {
    replica_fails_then_heals(Site::WalSync, libc::EIO, IO_ERROR, false).await;
}

/// Goal: the same for sled's flush (of a snapshot the follower builds).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_disk_on_a_followers_sled_flush_stops_it_and_it_catches_up() {
    replica_fails_then_heals(Site::SledFlush, libc::ENOSPC, NO_SPACE, false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_device_on_a_followers_sled_flush_stops_it_and_it_catches_up() {
    replica_fails_then_heals(Site::SledFlush, libc::EIO, IO_ERROR, false).await;
}

/// Goal: the same for the write of a snapshot into sled.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_disk_on_a_followers_snapshot_write_stops_it_and_it_catches_up() {
    replica_fails_then_heals(Site::SnapshotWrite, libc::ENOSPC, NO_SPACE, false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_device_on_a_followers_snapshot_write_stops_it_and_it_catches_up() {
    replica_fails_then_heals(Site::SnapshotWrite, libc::EIO, IO_ERROR, false).await;
}

/// Goal: a full disk on the leader (its WAL's `fdatasync`) stops it too: the other two elect a
/// leader and commit on, and the old leader restarts healed and catches up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_disk_on_the_leaders_wal_fdatasync_stops_it_and_it_catches_up() {
    replica_fails_then_heals(Site::WalSync, libc::ENOSPC, NO_SPACE, true).await;
}

/// Goal: a failed `fdatasync` is remembered by the next process, which cuts what that sync
/// alone covered before any sync of its own could vouch for it. On a real device error Linux
/// keeps the unwritten pages in the page cache, marked clean, so the restarted replica reads
/// them back valid and a new `fdatasync` succeeds without writing them ("fsyncgate"); the
/// injector here fails the sync without running it, which leaves the same bytes behind.
///
/// Steps: three replicas, 20 appends; every `fdatasync` of a follower's WAL fails with `EIO`;
/// 20 more appends stop it, with records past its synced mark. `ctrlog check` on the stopped
/// replica names them as a fault. The device is healed; the replica's storage is opened as a
/// start opens it: its log ends at the mark, and the mark is where it was. Then the replica
/// restarts, catches up, and nothing acknowledged is lost. Before the record existed, the
/// open's own sync raised the mark over those records.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_wal_fdatasync_is_remembered_and_what_it_alone_covered_is_cut_at_the_next_start() {
    let dir = tempfile::tempdir().unwrap();
    let mut cluster = LocalCluster::start(dir.path(), 3, |_| {}).await.unwrap();
    let leader = cluster.wait_for_leader(WAIT).await.unwrap();
    let options = ClientOptions::new().request_timeout(Duration::from_secs(2));
    let client = ControlClient::connect_with(&cluster.client_addrs(), options)
        .await
        .unwrap();
    let mut acked = append(&client, 20).await;
    let follower = cluster.follower_of(leader);
    cluster.wait_for_applied(20, WAIT).await.unwrap();
    let data_dir = cluster.config(follower).data_dir.clone();
    let log = log_dir(&data_dir);
    faults::fail_under(&log, Operation::Sync, libc::EIO);
    acked.extend(append(&client, 20).await);
    eventually("the follower to stop on the failed sync", || {
        stopped_on(&cluster, follower)
    })
    .await;
    cluster.stop(follower).await;
    faults::heal_under(&log);

    let vouched = wal_faults::synced_mark(&log)
        .unwrap()
        .expect("a mark below the failure");
    let written = ctrlog::raft::storage::wal::check(&log).unwrap().next_index - 1;
    assert!(
        written > vouched,
        "the failed sync covered records past the mark ({vouched}), up to {written}"
    );
    let report = check_data_dir(&data_dir).unwrap();
    let fault = (report.faults.iter())
        .find(|f| f.kind == FaultKind::FailedSync)
        .unwrap_or_else(|| panic!("check names the failed sync: {:?}", report.faults));
    let named = format!("entries {} to {written}", vouched + 1);
    assert!(fault.detail.contains(&named), "{}", fault.detail);

    let storage = open_storage(&data_dir).unwrap();
    assert_eq!(
        storage.log.last_log_id().map(|id| id.index),
        Some(vouched),
        "the start cut every record only the failed sync covered, before syncing"
    );
    assert_eq!(wal_faults::synced_mark(&log).unwrap(), Some(vouched));
    assert_eq!(storage.found_at_open, vec![FaultKind::FailedSync]);
    let closed = storage.closed;
    drop((storage.log, storage.state_machine));
    closed.wait().await;
    let report = check_data_dir(&data_dir).unwrap();
    assert!(report.faults.is_empty(), "{:?}", report.faults);

    cluster.restart(follower).await.unwrap();
    acked.extend(append(&client, 10).await);
    assert_nothing_lost(&cluster, max(&acked)).await;
    cluster.shutdown().await;
}

/// A tmpfs of `bytes` mounted at `at` for the life of the guard (the tests run as root, as
/// CI does).
struct SmallDisk {
    at: PathBuf,
}

impl SmallDisk {
    fn mount(at: &Path, bytes: u64) -> SmallDisk {
        std::fs::create_dir_all(at).unwrap();
        let mounted = Process::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={bytes}"), "tmpfs"])
            .arg(at)
            .status()
            .expect("running mount");
        assert!(
            mounted.success(),
            "mounting a tmpfs at {} failed: this test needs root, as CI has",
            at.display()
        );
        SmallDisk {
            at: at.to_path_buf(),
        }
    }

    /// Writes a file until the disk is full; returns its path.
    fn fill(&self) -> PathBuf {
        use std::io::Write as _;
        let path = self.at.join("filler");
        let mut file = std::fs::File::create(&path).unwrap();
        let block = vec![0xa5u8; 4096];
        loop {
            match file.write_all(&block) {
                Ok(()) => {}
                Err(e) if e.raw_os_error() == Some(libc::ENOSPC) => return path,
                Err(e) => panic!("filling {}: {e}", path.display()),
            }
        }
    }
}

impl Drop for SmallDisk {
    fn drop(&mut self) {
        let _ = Process::new("umount").arg("-l").arg(&self.at).status();
    }
}

/// Goal: a follower on a real file system that fills up stops with `ENOSPC` naming a file of
/// its directory, the others commit on, and once space is freed it restarts and catches up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_follower_whose_real_disk_fills_stops_and_catches_up_once_space_is_freed() {
    let dir = tempfile::tempdir().unwrap();
    // Replica 3's data directory (`replica-3`) is a disk of its own, 16 MiB.
    let disk = SmallDisk::mount(&dir.path().join("replica-3"), 16 << 20);
    let mut cluster = LocalCluster::start(dir.path(), 3, |_| {}).await.unwrap();
    let leader = cluster.wait_for_leader(WAIT).await.unwrap();
    if leader == 3 {
        // The full disk is a follower's: hand leadership on by restarting replica 3.
        cluster.stop(3).await;
        eventually("another leader", || {
            let leader = cluster.running().find_map(|r| r.metrics().current_leader);
            leader.filter(|&l| l != 3)
        })
        .await;
        cluster.restart(3).await.unwrap();
    }
    let mut acked = append_many(&cluster, 0, 20).await;
    cluster.wait_for_applied(20, WAIT).await.unwrap();
    let filler = disk.fill();

    // Appends of 32 bytes fill the WAL's last page before they need another: append until
    // replica 3 stops, in bounded rounds.
    let mut next = 20;
    let error = loop {
        acked.extend(append_many(&cluster, next, 50).await);
        next += 50;
        if let Some(error) = stopped_on(&cluster, 3) {
            break error;
        }
        assert!(next < 20_000, "replica 3 never hit its full disk");
    };
    eprintln!("replica 3 stopped: {error}");
    let replica_dir = dir.path().join("replica-3").to_string_lossy().into_owned();
    assert!(
        error.contains(&replica_dir) && error.contains(NO_SPACE),
        "the error must name a file of replica 3 and the full disk: {error}"
    );
    acked.extend(append_many(&cluster, next, 20).await);

    std::fs::remove_file(filler).unwrap();
    cluster.stop(3).await;
    cluster.restart(3).await.unwrap();
    acked.extend(append_many(&cluster, next + 20, 10).await);
    assert_nothing_lost(&cluster, max(&acked)).await;
    cluster.shutdown().await;
    drop(disk);
}

/// Goal: the path an operator meets, on real `ctrlog serve` processes. A follower whose disk
/// (a 64 MiB tmpfs under its data directory) fills up exits non-zero, and its log names the
/// file, the failure and the remedy; the others commit on; once space is freed it starts
/// again (as `Restart=on-failure` would) and holds every acknowledged append.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_served_follower_whose_disk_fills_exits_naming_the_file_and_catches_up() {
    let mut cluster = ProcessCluster::start_with(replica_exe(), 3, &[])
        .await
        .unwrap();
    let client = ControlClient::connect_with(&cluster.client_addrs(), cluster.client_options())
        .await
        .unwrap();
    let append = |count: u32| {
        let client = &client;
        async move {
            let mut last = 0;
            for i in 0..count {
                let body = format!("append {i}").into_bytes();
                let command = Command::custom(1, 1, body);
                last = client.append_to(Target::All, command).await.unwrap().offset;
            }
            last
        }
    };
    append(20).await;
    let follower = (cluster.leader_index().await.unwrap() + 1) % 3;
    cluster.kill(follower);
    let dir = cluster.replica_dir(follower);
    let saved = tempfile::tempdir().unwrap();
    copy_dir(&dir, saved.path());
    let disk = SmallDisk::mount(&dir, 64 << 20);
    copy_dir(saved.path(), &dir);
    cluster.restart(follower).unwrap();
    let caught_up_to = append(20).await;
    // Fill the disk only once the follower has opened its storage and holds the appends: a
    // fill before it opens sled would make it fail at start, which is another test's path.
    let addr = cluster.client_addrs()[follower].clone();
    holds_up_to(&addr, caught_up_to).await;
    let filler = disk.fill();

    let mut rounds = 0;
    let status = loop {
        append(20).await;
        if let Some(status) = cluster.exited(follower) {
            break status;
        }
        rounds += 1;
        assert!(rounds < 500, "the follower never hit its full disk");
    };
    assert!(!status.success(), "{status}");
    let log = cluster.log_tail(follower, 40);
    assert!(
        log.contains(&*dir.to_string_lossy())
            && log.contains(NO_SPACE)
            && log.contains("free space, then restart the replica"),
        "{log}"
    );
    let last = append(20).await;

    std::fs::remove_file(filler).unwrap();
    cluster.restart(follower).unwrap();
    let addr = cluster.client_addrs()[follower].clone();
    holds_up_to(&addr, last).await;
    drop(disk);
}

/// Waits (at most 30 s) until the replica serving `addr` holds every entry up to `last`, with
/// no gap.
async fn holds_up_to(addr: &str, last: u64) {
    let mut held = Vec::new();
    for _ in 0..300 {
        held = read_retained(addr).await;
        if held.last().is_some_and(|e| e.offset >= last) {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    assert_contiguous(&held);
    assert!(
        held.last().is_some_and(|e| e.offset >= last),
        "the follower holds up to {:?} of {last}",
        held.last().map(|e| e.offset)
    );
}

/// Goal: a replica restarted on a disk that is already full exits at once, and what it prints
/// names the folder sled could not open and the remedy, as a write that fails while serving
/// does. Before, sled's failure at open said only "No space left on device".
///
/// The replica led a cluster of its own and holds appends, so its restart must write. A
/// directory never initialised may need no new block at all: this test once copied one, and
/// the replica started, awaited its founding members on the full disk and never exited.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_restarted_on_a_full_disk_exits_naming_the_remedy() {
    let mut cluster = ProcessCluster::start_with(replica_exe(), 1, &[])
        .await
        .unwrap();
    let client = ControlClient::connect_with(&cluster.client_addrs(), cluster.client_options())
        .await
        .unwrap();
    for i in 0..10 {
        let command = Command::custom(1, 1, format!("append {i}").into_bytes());
        client.append_to(Target::All, command).await.unwrap();
    }
    cluster.kill(0);
    let dir = cluster.replica_dir(0);
    let saved = tempfile::tempdir().unwrap();
    copy_dir(&dir, saved.path());
    let disk = SmallDisk::mount(&dir, 8 << 20);
    copy_dir(saved.path(), &dir);
    let filler = disk.fill();

    cluster.restart(0).unwrap();
    let status = eventually("the replica on a full disk exits", || cluster.exited(0)).await;
    let printed = cluster.log_tail(0, 40);
    assert!(!status.success(), "{printed}");
    assert!(
        printed.contains(&*dir.to_string_lossy())
            && printed.contains(NO_SPACE)
            && printed.contains("free space, then restart the replica"),
        "{printed}"
    );
    std::fs::remove_file(filler).unwrap();
    drop(disk);
}
