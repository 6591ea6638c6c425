//! A short `ctrlog chaos` run, as CI's part of the fault campaign: real replica processes are
//! killed, paused and restarted under load, and the recorded history must show nothing lost,
//! duplicated, reordered or silently skipped.

use std::time::Duration;

use serde_json::Value;

/// Goal: under SIGKILLs of replicas and of the leader, a SIGSTOPped leader, a follower that
/// catches up by snapshot install and is restarted twice right after, and a WAL tail left
/// torn by a crash, with commands at the size limit in the load, every acknowledged append
/// survives at its offset, every subscriber saw the log exactly once, and every replica came
/// back. Steps: `ctrlog chaos --rounds 5 --seed 14 --connections 2 --json` (a fault schedule
/// with each kind of fault; the four producers share two connections, so their appends go out
/// in batches); it exits non-zero on any violation or a replica that does not come back, and
/// its figures must say so too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_short_chaos_run_loses_and_duplicates_nothing() {
    let mut command = tokio::process::Command::new(env!("CARGO_BIN_EXE_ctrlog"));
    command
        .args([
            "chaos",
            "--rounds",
            "5",
            "--seed",
            "14",
            "--connections",
            "2",
            "--json",
        ])
        .env("RUST_LOG", "off")
        .kill_on_drop(true);
    let output = tokio::time::timeout(Duration::from_secs(300), command.output())
        .await
        .expect("the chaos run finished")
        .expect("the chaos run started");
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let figures: Value = serde_json::from_slice(&output.stdout).expect("one JSON object");
    assert_eq!(figures["rounds"], 5);
    assert!(figures["acked_appends"].as_u64().unwrap() > 0);
    assert_eq!(figures["lost"], 0);
    assert_eq!(figures["duplicates"], 0);
    assert_eq!(figures["violations"], 0);
    let leader_faults =
        figures["leader_kills"].as_u64().unwrap() + figures["leader_pauses"].as_u64().unwrap();
    assert!(leader_faults > 0, "the schedule hit the leader: {figures}");
    assert!(
        figures["snapshot_catch_ups"].as_u64().unwrap() > 0,
        "{figures}"
    );
    assert!(figures["torn_tails"].as_u64().unwrap() > 0, "{figures}");
}
