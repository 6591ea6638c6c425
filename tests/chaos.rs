//! A short `ctrlog chaos` run, as CI's part of the fault campaign: real replica processes are
//! killed, paused, restarted, partitioned (nftables; CI runs as root), replaced and cut back to
//! their last `fdatasync` as a power loss would (an `LD_PRELOAD` shim) under load, and the
//! recorded history must show nothing lost, duplicated, reordered or silently skipped.

use std::time::Duration;

use serde_json::Value;

/// Goal: under SIGKILLs of replicas and of the leader, a SIGSTOPped leader, a follower that
/// catches up by snapshot install and is restarted twice right after, a WAL tail left torn by
/// a crash, a byte of a stopped replica's WAL flipped anywhere its synced mark vouches for, or
/// of its stored snapshot or sled's data file (rot, repaired from the peers), a partition (nftables between real processes), a fourth replica replacing a voter,
/// and a power loss of the whole cluster (the leader's WAL syncs stalled, then SIGKILL of all
/// three and everything each wrote after its last completed sync dropped, the old leader back
/// 300 ms before the others), with
/// commands at the size limit in the load, every acknowledged append survives at
/// its offset, every subscriber saw the log exactly once, every replica came back, and the
/// job the replicas run (container processes, launched, moved and drained as the rounds
/// change its inputs and lag) settled with no task run by two containers at once. Steps:
/// `ctrlog chaos --rounds 8 --seed 14 --connections 2 --json` (a run meets each kind of fault
/// once before drawing at random; the four producers share two connections, so their appends
/// go out in batches); it exits non-zero on any violation or a replica that does not come
/// back, and its figures must say so too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_short_chaos_run_loses_and_duplicates_nothing() {
    let partitions = partitions_available();
    let faults = if partitions {
        "kills,pauses,snapshots,torn-tails,corruption,partitions,membership,power-loss"
    } else {
        "kills,pauses,snapshots,torn-tails,corruption,membership,power-loss"
    };
    let rounds = faults.split(',').count().to_string();
    let mut command = tokio::process::Command::new(env!("CARGO_BIN_EXE_ctrlog"));
    command
        .args([
            "chaos",
            "--rounds",
            &rounds,
            "--seed",
            "14",
            "--connections",
            "2",
            "--faults",
            faults,
            "--json",
        ])
        .env("RUST_LOG", "off")
        .kill_on_drop(true);
    let output = tokio::time::timeout(Duration::from_secs(400), command.output())
        .await
        .expect("the chaos run finished")
        .expect("the chaos run started");
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let figures: Value = serde_json::from_slice(&output.stdout).expect("one JSON object");
    assert_eq!(figures["rounds"].to_string(), rounds);
    assert!(figures["acked_appends"].as_u64().unwrap() > 0);
    assert_eq!(figures["lost"], 0);
    assert_eq!(figures["duplicates"], 0);
    assert_eq!(figures["violations"], 0);
    // Log matching, read from the replicas' own WALs once they stopped.
    assert_eq!(figures["forked_log_ids"], 0);
    assert!(
        figures["log_entries_compared"].as_u64().unwrap() > 0,
        "{figures}"
    );
    // The job ran through it: containers were launched, ran tasks, and none ran one twice.
    assert_eq!(figures["double_runs"], 0);
    assert!(figures["job"]["container_sessions"].as_u64().unwrap() > 0);
    assert!(figures["job"]["task_starts"].as_u64().unwrap() > 0);
    let faults = &figures["faults"];
    let injected = |name: &str| faults[name].as_u64().unwrap_or(0);
    assert!(
        injected("leader_kill") + injected("follower_kill") > 0,
        "{figures}"
    );
    for name in ["leader_pause", "snapshot_catch_up", "torn_tail"] {
        assert!(injected(name) > 0, "no {name}: {figures}");
    }
    // The rotted replica found the damage, kept the damaged segment aside and was repaired
    // from the leader until it voted again (the run fails if it is not, within a minute).
    assert!(
        injected("leader_corrupt") + injected("follower_corrupt") > 0,
        "{figures}"
    );
    assert!(
        figures["corruptions_repaired"].as_u64().unwrap() > 0,
        "{figures}"
    );
    if partitions {
        assert!(
            injected("leader_cut") + injected("leader_cut_one_way") + injected("follower_cut") > 0,
            "{figures}"
        );
    }
    assert!(
        injected("leader_replaced") + injected("follower_replaced") > 0,
        "{figures}"
    );
    // The power loss hit the window the fork needed: the old leader lost appends it had
    // acknowledged to openraft and was back first.
    assert!(injected("cluster_power_loss") > 0, "{figures}");
    assert!(
        figures["power_losses_in_window"].as_u64().unwrap() > 0,
        "{figures}"
    );
}

/// Whether nftables can be used here (root and the `nft` program), which partitions need. A
/// newcomer's machine may lack both, and the README's test command must still pass there, so
/// partitions are then left out with a warning; CI installs nftables and sets
/// `CTRLOG_CHAOS_PARTITIONS=required`, so that there they are never left out.
fn partitions_available() -> bool {
    let usable = std::process::Command::new("nft")
        .args(["list", "tables"])
        .output()
        .is_ok_and(|output| output.status.success());
    if !usable {
        assert_ne!(
            std::env::var("CTRLOG_CHAOS_PARTITIONS").as_deref(),
            Ok("required"),
            "partitions are required here, but nftables cannot be used (root and `nft` needed)"
        );
        eprintln!("WARNING: nftables cannot be used here (root and `nft` needed): no partitions");
    }
    usable
}
