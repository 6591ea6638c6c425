//! Data directories written by v0.1.0 (commit 7ad98d6) open in this build and serve what
//! v0.1.0 served from them. The fixture and how it was made: `tests/fixtures/v0.1.0/`.

mod common;

use std::path::Path;
use std::time::Duration;

use common::WAIT;
use ctrlog::client::{ApiError, FetchRequest};
use ctrlog::log::vocabulary::LEVEL_CLUSTER_ID_DERIVED;
use ctrlog::log::{Command, SetVocabularyLevel, Target};
use ctrlog::raft::storage::data_dir::{DATA_FORMAT, FORMAT_FILE};
use ctrlog::server::{Replica, ReplicaConfig};
use ctrlog::tools::admin::{entry_json, state_json};

fn fixture() -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/v0.1.0")
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let path = entry.unwrap().path();
        let target = to.join(path.file_name().unwrap());
        if path.is_dir() {
            copy_dir(&path, &target);
        } else {
            std::fs::copy(&path, &target).unwrap();
        }
    }
}

async fn start(data_dir: &Path) -> Replica {
    let replica = Replica::start(ReplicaConfig {
        id: 1,
        data_dir: data_dir.to_path_buf(),
        ..ReplicaConfig::default()
    })
    .await
    .expect("a v0.1.0 data directory opens");
    let mut metrics = replica.raft().metrics();
    tokio::time::timeout(WAIT, metrics.wait_for(|m| m.current_leader == Some(1)))
        .await
        .expect("the single replica leads again")
        .unwrap();
    replica
}

/// Goal: a replica of this build starts on a copy of a v0.1.0 data directory (one replica,
/// no `format` file, which it records as format 2 with the node id it starts as;
/// snapshot at offset 122, log retained from 113 to 132) and serves it as v0.1.0 did: the same
/// retained entries, the same JobState, `Compacted` below the retained range; it appends on
/// from offset 133 and serves all of it again after a restart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_v0_1_0_data_directory_opens_and_serves_what_v0_1_0_served() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("replica-1");
    copy_dir(&fixture().join("single-replica"), &data);
    let expected_tail: Vec<serde_json::Value> =
        std::fs::read_to_string(fixture().join("expected-tail.jsonl"))
            .unwrap()
            .lines()
            .map(|line| serde_json::from_str(line).unwrap())
            .collect();
    let expected_state: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(fixture().join("expected-state.json")).unwrap(),
    )
    .unwrap();

    assert!(
        !data.join(FORMAT_FILE).exists(),
        "v0.1.0 wrote no format file"
    );
    let replica = start(&data).await;
    let format = std::fs::read_to_string(data.join(FORMAT_FILE)).unwrap();
    assert!(
        format.contains("format = 2") && format.contains("node_id = 1"),
        "recorded as format 2, replica 1's: {format}"
    );
    let tail = common::read_from(&replica, 113).await;
    // Every field v0.1.0 printed, as it printed it; fields added since come beside them.
    let tail_json: Vec<serde_json::Value> = (tail.iter().map(entry_json))
        .zip(&expected_tail)
        .map(|(mut printed, expected)| {
            let printed = printed.as_object_mut().unwrap();
            printed.retain(|key, _| expected.get(key).is_some());
            serde_json::Value::Object(printed.clone())
        })
        .collect();
    assert_eq!(tail_json, expected_tail);
    let state = replica.state(132, Duration::ZERO).await.unwrap();
    assert_eq!(state_json(&state), expected_state);
    match replica.fetch(&FetchRequest::from(1), Duration::ZERO).await {
        Err(ApiError::Compacted {
            first_offset: 113,
            snapshot_offset: 122,
        }) => {}
        other => panic!("expected Compacted below 113, got {other:?}"),
    }

    let ack = replica
        .append(ctrlog::log::Proposal {
            producer: None,
            target: Target::All,
            frame: Command::custom(1, 1, b"written by this build".to_vec()).into_frame(),
        })
        .await
        .unwrap();
    assert_eq!(ack.offset, 133);
    replica.shutdown().await;

    let replica = start(&data).await;
    let after = common::read_from(&replica, 113).await;
    assert_eq!(after.len(), 21);
    assert_eq!(after[..20], tail[..]);
    assert_eq!(after[20].frame.body, b"written by this build");

    // A cluster v0.1.0 initialised has no cluster id until its level is raised to the one
    // that derives it; then the directory records it, and keeps it across a restart.
    assert_eq!(
        replica.cluster_id(),
        None,
        "nothing is drawn for a replica with state"
    );
    let raise = Command::SetVocabularyLevel(SetVocabularyLevel {
        level: LEVEL_CLUSTER_ID_DERIVED,
    });
    let raise = ctrlog::log::Proposal {
        producer: None,
        target: Target::All,
        frame: raise.into_frame(),
    };
    replica.append(raise).await.unwrap();
    let derived = replica.cluster_id().expect("derived by the raise");
    let format = std::fs::read_to_string(data.join(FORMAT_FILE)).unwrap();
    assert!(
        format.contains(&format!("cluster_id = {derived}")) && format.contains("node_id = 1"),
        "{format}"
    );
    replica.shutdown().await;
    let replica = start(&data).await;
    assert_eq!(replica.cluster_id(), Some(derived), "kept");
    replica.shutdown().await;
}

/// Goal: a data directory of a newer format than this build knows is refused, naming both
/// formats, before anything in it is opened or changed (a downgrade is refused, not
/// attempted). Steps: a copy of the v0.1.0 fixture marked one format ahead; `Replica::start`
/// fails saying so; the file and the directory's contents are as they were.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_newer_data_directory_format_is_refused_by_name() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("replica-1");
    copy_dir(&fixture().join("single-replica"), &data);
    let newer = format!("format = {}\n", DATA_FORMAT + 1);
    std::fs::write(data.join(FORMAT_FILE), &newer).unwrap();
    let listing = |path: &Path| {
        let mut names: Vec<_> = walk(path);
        names.sort();
        names
    };
    let before = listing(&data);
    let refused = Replica::start(ReplicaConfig {
        id: 1,
        data_dir: data.clone(),
        ..ReplicaConfig::default()
    })
    .await
    .err()
    .expect("a newer format is refused")
    .to_string();
    assert!(
        refused.contains(&format!("format {}", DATA_FORMAT + 1))
            && refused.contains(&format!("formats 1 to {DATA_FORMAT}")),
        "{refused}"
    );
    assert_eq!(
        std::fs::read_to_string(data.join(FORMAT_FILE)).unwrap(),
        newer
    );
    assert_eq!(listing(&data), before, "nothing was opened or written");
}

/// Every file under `dir` with its size.
fn walk(dir: &Path) -> Vec<(std::path::PathBuf, u64)> {
    let mut files = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            files.extend(walk(&path));
        } else {
            let len = std::fs::metadata(&path).unwrap().len();
            files.push((path, len));
        }
    }
    files
}
