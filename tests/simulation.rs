//! Deterministic simulation (see `tests/sim/mod.rs`): seeded fault schedules against 3- and
//! 5-replica clusters, checked by the history checker, for log matching and
//! for at most one replica acting as leader at a time.
//!
//! `CTRLOG_SIM_SEEDS=N` runs N seeds per cluster size instead of the CI default, starting at
//! `CTRLOG_SIM_SEED_BASE` (default 1); `CTRLOG_SIM_ROT=1` rots one replica's disk in each
//! (`SimConfig::rot_one_disk`). A failure prints the command that replays its seed.

mod sim;

use ctrlog::log::vocabulary::LEVEL_MAX;
use sim::{run, SimConfig, DEPOSED_AND_LEADING_AGAIN};

/// Seeds per cluster size in CI: a few minutes in all on two cores.
const CI_SEEDS: u64 = 4;

/// The most seeds a test that looks for a schedule with some property runs before it fails.
const SEEDS_SCANNED_MAX: u64 = 24;

/// Runs of the rotting disk in CI whose rotting replica crashes and finds damage: in its WAL
/// (the final record too, once after it stood alone above its log), in its stored snapshot, in
/// sled's data file (which sled refuses once), in writes the disk lost, and under sectors that
/// fail reads (once while it runs); and whose disk fails writes while it runs (the replica
/// stops and is restarted, once after a failed `fdatasync` whose records its restart cuts). A
/// read failing while the replica runs is the rarest: 2 of seeds 50–99 (67, 74) since the
/// failed-sync record and the crash after standing alone, which moved every schedule; scan
/// `CTRLOG_SIM_ROT=1 CTRLOG_SIM_SEED_BASE=50 CTRLOG_SIM_SEEDS=50` again when they move.
const ROTTING_SEEDS: [(u64, u64); 3] = [(58, 3), (66, 3), (67, 3)];

fn env_u64(name: &str) -> Option<u64> {
    std::env::var(name).ok().map(|v| {
        v.parse()
            .unwrap_or_else(|_| panic!("{name} must be a number, not {v:?}"))
    })
}

fn run_seeds(replicas: u64) {
    let seeds = env_u64("CTRLOG_SIM_SEEDS").unwrap_or(CI_SEEDS);
    let base = env_u64("CTRLOG_SIM_SEED_BASE").unwrap_or(1);
    let mut failed = Vec::new();
    let mut power_loss_hits = 0;
    let rot = env_u64("CTRLOG_SIM_ROT").is_some_and(|rot| rot != 0);
    for seed in base..base + seeds {
        let mut config = SimConfig::new(seed, replicas);
        config.rot_one_disk = rot;
        let report = run(&config);
        power_loss_hits += report
            .faults
            .get("power losses in the window")
            .copied()
            .unwrap_or(0);
        println!(
            "seed {seed} ({replicas} replicas): {} acked, {} committed, faults {:?}, {} terms, {} resets ({} of containers), {} snapshots, {} task starts, {} lease lapses, level {}, {:.1} s simulated, digest {:016x}",
            report.acked,
            report.committed,
            report.faults,
            report.terms_with_leader,
            report.resets,
            report.container_resets,
            report.snapshots,
            report.task_starts,
            report.lease_lapses,
            report.level,
            report.simulated.as_secs_f64(),
            report.digest,
        );
        let mut violations = report.violations;
        // A new log's first command is its founding raise to the highest level (this build
        // is every member's), and nothing else in a run changes the level: a run left below
        // it had a command reach the log first (10 of seeds 1–38 with 3 replicas did, while
        // appends were held only by a replica Raft named leader).
        if report.level < LEVEL_MAX {
            violations.push(format!(
                "the run ended at vocabulary level {}, not {LEVEL_MAX}: a command reached the \
                 new log before its founding raise",
                report.level
            ));
        }
        if !violations.is_empty() {
            eprintln!(
                "seed {seed} FAILED; replay with: {}",
                config.replay_command()
            );
            for violation in &violations {
                eprintln!("  {violation}");
            }
            failed.push(seed);
        }
    }
    println!(
        "{power_loss_hits} power losses in the window over {seeds} seeds ({replicas} replicas)"
    );

    assert!(failed.is_empty(), "failing seeds: {failed:?}");
    assert!(
        power_loss_hits > 0,
        "no seed took a power loss in the window (the old leader back first, having lost \
         entries it had acknowledged to openraft)"
    );
}

#[test]
fn three_replicas_under_seeded_faults() {
    run_seeds(3);
}

#[test]
fn five_replicas_under_seeded_faults() {
    run_seeds(5);
}

/// Replays one seed (`CTRLOG_SIM_SEED`, `CTRLOG_SIM_REPLICAS`, `CTRLOG_SIM_ROT`; a fixed one
/// by default) and
/// holds a second run of it to the same fingerprint.
#[test]
fn replay() {
    let seed = env_u64("CTRLOG_SIM_SEED").unwrap_or(7);
    let replicas = env_u64("CTRLOG_SIM_REPLICAS").unwrap_or(3);
    let mut config = SimConfig::new(seed, replicas);
    config.rot_one_disk = env_u64("CTRLOG_SIM_ROT").is_some_and(|rot| rot != 0);
    let first = run(&config);
    println!("{first:#?}");
    assert!(first.violations.is_empty(), "{:#?}", first.violations);
    let second = run(&config);
    let parted = (first.fault_timeline.iter())
        .zip(&second.fault_timeline)
        .position(|(a, b)| a != b)
        .map(|at| (&first.fault_timeline[at], &second.fault_timeline[at]));
    assert_eq!(
        first.digest,
        second.digest,
        "two runs of seed {seed} differ; the simulation is not deterministic. Their faults \
         part at {parted:?} ({} and {} faults)",
        first.fault_timeline.len(),
        second.fault_timeline.len()
    );
}

/// The simulation has teeth: a store that acknowledges appends before they are durable (a crash
/// loses its last entries) is caught, as lost acknowledged appends or diverged replicas. Many
/// schedules mask one replica's lost tail behind the other two, so the test runs seeds from 1
/// until two catch it, within [`SEEDS_SCANNED_MAX`]. It scans rather than naming seeds: every
/// change to what a run does (a new log's founding raise, the founding's hold on appends)
/// moves every fault schedule, and named seeds stopped catching it each time. About one seed
/// in three catches it (8 of seeds 1–24 in a debug build, at the founding raise).
#[test]
fn a_store_that_acknowledges_before_it_is_durable_is_caught() {
    let caught: Vec<u64> = (1..=SEEDS_SCANNED_MAX)
        .filter(|&seed| {
            let mut config = SimConfig::new(seed, 3);
            config.store_acknowledges_early = true;
            !run(&config).violations.is_empty()
        })
        .take(2)
        .collect();
    assert_eq!(
        caught.len(),
        2,
        "seeds 1–{SEEDS_SCANNED_MAX} caught an early-acknowledging store only at {caught:?}"
    );
}

/// Regression, found by seed 1192 of the in-memory simulation: a container's subscription was
/// reset from a lagging replica whose state predated the container's own `TaskStarted`, so the
/// container answered again and was refused (the product's simulated container then quit).
/// Resets now read at least as far as the subscribing client's own acknowledged appends (read
/// your writes). Runs seeds from 1 until one resets a container's subscription, within
/// [`SEEDS_SCANNED_MAX`] (14 of seeds 1–24 did at the founding raise), each without a
/// violation.
#[test]
fn a_reset_from_a_lagging_replica_does_not_make_a_container_answer_twice() {
    for seed in 1..=SEEDS_SCANNED_MAX {
        let report = run(&SimConfig::new(seed, 3));
        assert!(
            report.violations.is_empty(),
            "seed {seed}: {:#?}",
            report.violations
        );
        if report.container_resets > 0 {
            return;
        }
    }
    panic!("no seed of 1–{SEEDS_SCANNED_MAX} reset a container's subscription");
}

/// Regression, found by seed 4 once the simulation ran the real storage: a follower restarted
/// right after it caught up by snapshot install did not start ("try to get log at index 1162
/// but got None") while the store dropped the purge openraft asks for before the install is
/// durable. Every run sends a follower through that path; this seed hit the hole.
#[test]
fn a_follower_restarted_right_after_its_snapshot_install_starts() {
    let report = run(&SimConfig::new(4, 3));
    assert_eq!(report.faults.get("installs then restarts"), Some(&1));
    assert!(report.violations.is_empty(), "{:#?}", report.violations);
}

/// Regression for the quorum lease (issue 15, failure 1): a leader cut off from its peers
/// went on acknowledging container heartbeats, because openraft's metrics still said it led.
/// A container that reached only that leader kept its tasks while the new leader expired it
/// and gave them to another: two containers ran partitions 0, 1 and 2 (seed 5, when the
/// simulation still restated the heartbeat rule; with the old rule 4, 14 and 26 of seeds 1–30
/// failed too). Heartbeats are now answered by the node's own rule (`Node::heartbeat`, by the
/// quorum lease); seed 2 isolates the leader while containers heartbeat to it, and its
/// containers' leases lapse, cleanly.
#[test]
fn a_leader_cut_off_from_its_peers_does_not_keep_a_container_alive() {
    let report = run(&SimConfig::new(2, 3));
    assert!(
        report.faults.contains_key("leader isolations"),
        "{:?}",
        report.faults
    );
    assert!(report.lease_lapses > 0);
    assert!(report.violations.is_empty(), "{:#?}", report.violations);
}

/// Goal (issue 33): the simulation hosts a peer that lies, and the replicas refuse it by the
/// product's own rules, since the simulation runs the product's peer layer: a node outside the
/// membership sends every replica, every half second through the faults, a forged
/// AppendEntries under a committed vote of a higher term (as itself, then claiming to be the
/// leader) and a vote request of a higher term with a longer log. Every one is refused (the
/// run counts them), none is answered, and the forged command is in no replica's log, while
/// the run stays clean. With the membership check taken out of `PeerAnswers::admit`, the run
/// reports the answered appends and the forged command in the logs.
#[test]
fn a_lying_peer_is_refused_by_every_replica() {
    let mut config = SimConfig::new(3, 3);
    config.lying_peer = true;
    let report = run(&config);
    assert!(report.violations.is_empty(), "{:#?}", report.violations);
    assert!(report.lies_refused > 20, "{} refused", report.lies_refused);
}

/// Regression (seen in `ctrlog chaos`, issue 33 brings it into the simulation): a leader
/// deposed with its batch slots full, caught up by a snapshot install that covers the batches'
/// entries (openraft then answers none of them), and leader again, must still take appends.
/// The proposer gives a batch up when its term ends; `tests/failpoints.rs` takes that away and
/// holds this run to failing.
#[test]
fn a_deposed_leader_caught_up_by_snapshot_leads_again_and_takes_appends() {
    let mut config = SimConfig::new(1, 3);
    config.deposed_leader_leads_again = true;
    let report = run(&config);
    assert_eq!(
        report.faults.get(DEPOSED_AND_LEADING_AGAIN),
        Some(&1),
        "{:?}",
        report.faults
    );
    assert!(report.violations.is_empty(), "{:#?}", report.violations);
}

/// Issue 34: one replica's disk rots (at each of its crashes, a byte of its WAL flipped at a
/// random offset of the records its synced mark vouches for, in the final one a quarter of
/// the time, or its last synced records lost, or a byte of its stored snapshot; and now and
/// then a byte of one copy of its vote file or of its repair file, sled's vote rolled back, or
/// a byte of sled's data file, whose recovery may drop sled's later writes; and a sector of
/// its WAL that fails reads from then on, at its restart or once it runs): it finds the
/// damage, neither votes nor stands until the leader has sent it what it held again (entries,
/// or its snapshot and log), and is voting again once the cluster settles, with no
/// acknowledged append lost and no divergence. Nothing stops it: sled refusing its own damaged
/// files sets them aside and starts the replica over from the leader's snapshot (counted as
/// "sleds set aside"); a read failing while it runs stops its Raft core, and its restart
/// repairs the range (counted as "restarts after a failed read"); a disk that fills up or
/// fails writes stops it at the first write or `fdatasync` that fails, and its restart once
/// healed catches up (counted as "restarts after a failed write"); a failed `fdatasync` is
/// recorded, and the restart (its power kept, so the page cache still holds the records the
/// failed sync covered) cuts them before any sync of its own. A replica that stood alone above
/// its log and then found its final record rotted repairs toward the entry its synced mark
/// names, not toward its vote's term. Before 45e04e8 that restart synced the kept records and
/// vouched for them, and that repair refused every candidate holding exactly its log.
/// On the build before it, WAL damage was cut as a torn tail and the replica voted with a log
/// that had forgotten what it acknowledged, and a damaged snapshot kept the replica from
/// starting; before the synced mark, rot in the final record was cut as a torn tail.
#[test]
fn one_rotting_disk_loses_nothing_and_is_repaired_from_the_peers() {
    let (mut snapshot_bytes_flipped, mut final_record_bytes_flipped) = (0, 0);
    let (mut synced_writes_lost, mut sled_bytes_flipped, mut sleds_set_aside) = (0, 0, 0);
    let (mut sectors_failing_reads, mut restarts_after_a_failed_read) = (0, 0);
    let (mut disks_failing_writes, mut restarts_after_a_failed_write) = (0, 0);
    let (mut failed_syncs_cut, mut final_records_below_a_higher_vote) = (0, 0);
    for (seed, replicas) in ROTTING_SEEDS {
        let mut config = SimConfig::new(seed, replicas);
        config.rot_one_disk = true;
        let report = run(&config);
        assert!(
            report.faults.get("repairs begun").is_some_and(|&n| n > 0),
            "seed {seed}: {:?}",
            report.faults
        );
        snapshot_bytes_flipped += report.faults["snapshot bytes flipped"];
        final_record_bytes_flipped += report.faults["wal final record bytes flipped"];
        synced_writes_lost += report.faults["synced writes lost"];
        sled_bytes_flipped += report.faults["sled bytes flipped"];
        sleds_set_aside += report.faults["sleds set aside"];
        sectors_failing_reads += report.faults["sectors failing reads"];
        restarts_after_a_failed_read += report.faults["restarts after a failed read"];
        disks_failing_writes += report.faults["disks failing writes"];
        restarts_after_a_failed_write += report.faults["restarts after a failed write"];
        failed_syncs_cut += report.faults["failed syncs with records to cut"];
        final_records_below_a_higher_vote +=
            report.faults["final records flipped below a higher vote"];
        assert!(
            report.violations.is_empty(),
            "seed {seed} ({}): {:#?}",
            config.replay_command(),
            report.violations
        );
    }
    assert!(
        snapshot_bytes_flipped > 0,
        "no seed rotted a stored snapshot"
    );
    assert!(
        final_record_bytes_flipped > 0,
        "no seed rotted a final record"
    );
    assert!(synced_writes_lost > 0, "no seed lost a synced write");
    assert!(sled_bytes_flipped > 0, "no seed rotted sled's data file");
    assert!(sleds_set_aside > 0, "sled refused no seed's files");
    assert!(sectors_failing_reads > 0, "no seed's sector failed reads");
    assert!(
        restarts_after_a_failed_read > 0,
        "no seed's read failed while the replica ran"
    );
    assert!(disks_failing_writes > 0, "no seed's disk failed writes");
    assert!(
        restarts_after_a_failed_write > 0,
        "no seed's replica stopped on a failed write"
    );
    assert!(
        failed_syncs_cut > 0,
        "no seed restarted a replica over records only a failed fdatasync covered"
    );
    assert!(
        final_records_below_a_higher_vote > 0,
        "no seed rotted the final record of a replica that stood alone above its log"
    );
}
