//! A full disk (`ENOSPC`) or a failing device (`EIO`) under one follower: on a write or an
//! `fdatasync` of its WAL, a flush of sled, a write of a snapshot. Each stops that replica
//! with an error that names the file, the other two keep committing, and once the disk is
//! healed the replica restarts on its own directory and catches up with nothing acknowledged
//! lost. One test fills a real file system (a small tmpfs the test mounts) rather than
//! injecting the error.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command as Process;

use common::{append_many, assert_contiguous, eventually, read_all, WAIT};
use ctrlog::raft::storage::{log_dir, meta_dir};
use ctrlog::raft::write_faults::{faults, Operation};
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

/// Every running replica holds every acknowledged offset, and their logs are equal.
async fn assert_nothing_lost(cluster: &LocalCluster, acked: &[u64], case: &str) {
    let last = *acked.iter().max().expect("something was acknowledged");
    cluster.wait_for_applied(last, WAIT).await.unwrap();
    let mut reference = None;
    for replica in cluster.running() {
        let log = read_all(replica).await;
        assert_contiguous(&log);
        assert!(log.len() as u64 >= last, "{case}: replica {}", replica.id());
        let prefix: Vec<_> = log.into_iter().take(last as usize).collect();
        match &reference {
            None => reference = Some(prefix),
            Some(r) => assert_eq!(&prefix, r, "{case}: replica {} diverged", replica.id()),
        }
    }
}

/// Three replicas; a follower's `site` fails with `errno`; the follower must stop naming the
/// file, the others commit on, and the healed follower restarts and catches up.
async fn follower_fails_then_heals(site: Site, errno: i32, error_text: &str) {
    let case = format!("{site:?} {error_text}");
    let dir = tempfile::tempdir().unwrap();
    let mut cluster = LocalCluster::start(dir.path(), 3, |_| {}).await.unwrap();
    let leader = cluster.wait_for_leader(WAIT).await.unwrap();
    let mut acked = append_many(&cluster, 0, 20).await;
    let follower = cluster.follower_of(leader);
    cluster.wait_for_applied(20, WAIT).await.unwrap();
    let data_dir = cluster.config(follower).data_dir.clone();
    let (under, operation) = site.target(&data_dir);
    faults::fail_under(&under, operation, errno);

    match site {
        Site::WalWrite | Site::WalSync => acked.extend(append_many(&cluster, 20, 20).await),
        Site::SledFlush | Site::SnapshotWrite => {
            let raft = cluster.replica(follower).raft().clone();
            raft.trigger().snapshot().await.unwrap();
        }
    }
    let error = eventually(&format!("{case}: the follower to stop"), || {
        stopped_on(&cluster, follower)
    })
    .await;
    eprintln!("{case}: the follower stopped: {error}");
    assert!(
        error.contains(&site.named_file(&data_dir)) && error.contains(error_text),
        "{case}: the error must name the file and the failure: {error}"
    );
    // The other two keep committing.
    acked.extend(append_many(&cluster, 40, 20).await);
    assert!(cluster
        .running()
        .all(|r| r.id() == follower || r.metrics().running_state.is_ok()));

    faults::heal_under(&under);
    cluster.stop(follower).await;
    cluster.restart(follower).await.unwrap();
    acked.extend(append_many(&cluster, 60, 10).await);
    assert_nothing_lost(&cluster, &acked, &case).await;
    cluster.shutdown().await;
}

const NO_SPACE: &str = "No space left on device";
const IO_ERROR: &str = "Input/output error";

/// Goal: a follower whose WAL write fails stops naming the segment; the rest carry on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_disk_on_a_followers_wal_write_stops_it_and_it_catches_up() {
    follower_fails_then_heals(Site::WalWrite, libc::ENOSPC, NO_SPACE).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_device_on_a_followers_wal_write_stops_it_and_it_catches_up() {
    follower_fails_then_heals(Site::WalWrite, libc::EIO, IO_ERROR).await;
}

/// Goal: the same for the WAL's `fdatasync`, which is never retried once it failed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_disk_on_a_followers_wal_fdatasync_stops_it_and_it_catches_up() {
    follower_fails_then_heals(Site::WalSync, libc::ENOSPC, NO_SPACE).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_device_on_a_followers_wal_fdatasync_stops_it_and_it_catches_up() {
    follower_fails_then_heals(Site::WalSync, libc::EIO, IO_ERROR).await;
}

/// Goal: the same for sled's flush (of a snapshot the follower builds).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_disk_on_a_followers_sled_flush_stops_it_and_it_catches_up() {
    follower_fails_then_heals(Site::SledFlush, libc::ENOSPC, NO_SPACE).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_device_on_a_followers_sled_flush_stops_it_and_it_catches_up() {
    follower_fails_then_heals(Site::SledFlush, libc::EIO, IO_ERROR).await;
}

/// Goal: the same for the write of a snapshot into sled.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_disk_on_a_followers_snapshot_write_stops_it_and_it_catches_up() {
    follower_fails_then_heals(Site::SnapshotWrite, libc::ENOSPC, NO_SPACE).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_device_on_a_followers_snapshot_write_stops_it_and_it_catches_up() {
    follower_fails_then_heals(Site::SnapshotWrite, libc::EIO, IO_ERROR).await;
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
    assert_nothing_lost(&cluster, &acked, "a real full disk").await;
    cluster.shutdown().await;
    drop(disk);
}
