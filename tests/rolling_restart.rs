//! A rolling restart of `ctrlog serve` processes under a steady append load, as DEPLOY.md's
//! section 6 tells an operator to run one: SIGTERM, restart, wait until the replica is back,
//! next. RELIABILITY.md ("Rolling restarts") quotes the gaps this test prints.

mod common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ctrlog::client::ControlClient;
use ctrlog::log::Command;
use ctrlog::tools::cluster::ProcessCluster;
use ctrlog::tools::{poll_until, POLL_INTERVAL};

/// How long any one condition may take to hold.
const WAIT: Duration = Duration::from_secs(60);

/// How long a replica has to stop after SIGTERM, as a service manager would allow.
const STOP_GRACE: Duration = Duration::from_secs(10);

/// Rounds of three restarts: each replica is restarted once a round, so the leader of the
/// moment is restarted at least once a round.
const ROUNDS: usize = 2;

/// Goal: a rolling restart of three `ctrlog serve` replicas under a steady append load fails
/// no append and costs no election beyond one handover per leader restart: a stopping leader
/// hands over to its most caught-up voter (`Replica::shutdown_handing_over`), and a restarted
/// follower deposes nobody. Steps: one appender, its commits timed; each replica in turn gets
/// SIGTERM, is restarted on its directory, and is waited for until it has applied the
/// leader's offset; twice round. The term may rise by at most the leader restarts. Prints
/// the longest gap between two consecutive commits of the load (measured, not asserted:
/// RELIABILITY.md). 3d7237e elected on the voters' timeouts after each leader restart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rolling_restart_under_load_fails_no_append_and_hands_leadership_over() {
    let exe = common::replica_exe();
    let mut cluster = ProcessCluster::start_with_http(exe.clone(), 3, &[])
        .await
        .unwrap();
    let client = ControlClient::connect_with(&cluster.client_addrs(), cluster.client_options())
        .await
        .unwrap();
    let term_before = client.leader_status().await.unwrap().term;

    let stop = Arc::new(AtomicBool::new(false));
    let commits = Arc::new(Mutex::new(Vec::<Instant>::new()));
    let load = tokio::spawn({
        let (client, stop, commits) = (client.clone(), stop.clone(), commits.clone());
        async move {
            let mut failed = Vec::new();
            let mut n = 0u64;
            while !stop.load(Ordering::Relaxed) {
                n += 1;
                match client
                    .append(Command::custom(1, 1, n.to_le_bytes().to_vec()))
                    .await
                {
                    Ok(_) => commits.lock().unwrap().push(Instant::now()),
                    Err(error) => failed.push(error.to_string()),
                }
            }
            failed
        }
    });
    let committed = || commits.lock().unwrap().len();
    poll_until("the load to commit", WAIT, POLL_INTERVAL, || {
        let n = committed();
        async move { (n >= 50).then_some(()).ok_or(n) }
    })
    .await
    .unwrap();

    let mut leader_restarts = 0;
    for _ in 0..ROUNDS {
        for i in 0..3 {
            if cluster.leader_index().await.unwrap() == i {
                leader_restarts += 1;
            }
            cluster.replace(i, exe.clone(), STOP_GRACE).await.unwrap();
            // Back: it answers, and has applied what the leader had when it came back.
            let addr = cluster.client_addrs()[i].clone();
            let target = client.leader_status().await.unwrap().applied_offset;
            poll_until(
                "the restarted replica to catch up",
                WAIT,
                POLL_INTERVAL,
                || {
                    let addr = addr.clone();
                    let options = cluster.client_options();
                    async move {
                        let one = ControlClient::connect_with(
                            &[addr],
                            options.retry_deadline(Duration::from_secs(1)),
                        )
                        .await
                        .map_err(|e| e.to_string())?;
                        let status = one.status().await.map_err(|e| e.to_string())?;
                        (status.applied_offset >= target && status.leader_id.is_some())
                            .then_some(())
                            .ok_or(format!("applied {} of {target}", status.applied_offset))
                    }
                },
            )
            .await
            .unwrap();
            // Some commits on the cluster as it now is before the next step.
            let mark = committed();
            poll_until("commits after the step", WAIT, POLL_INTERVAL, || {
                let n = committed();
                async move { (n >= mark + 20).then_some(()).ok_or(n) }
            })
            .await
            .unwrap();
        }
    }
    stop.store(true, Ordering::Relaxed);
    let failed = load.await.unwrap();
    let elections = client.leader_status().await.unwrap().term - term_before;
    // The replicas log their handovers and candidacies (`ProcessCluster` keeps the replica,
    // its peer port and its elector at info); a handover that could not be made (a dial or a
    // message past its deadline on a loaded machine) falls back to an election on the
    // timeouts, which the load survives too.
    let logged = |pattern: &str| -> Vec<String> {
        (0..3)
            .flat_map(|i| {
                (cluster.log_tail(i, 1_000_000).lines())
                    .filter(|line| line.contains(pattern))
                    .map(|line| format!("replica {}: {line}", i + 1))
                    .collect::<Vec<_>>()
            })
            .collect()
    };
    let handed_over = logged("handed the leadership over").len();
    let stood_back = logged("standing back").len();
    let longest = {
        let commits = commits.lock().unwrap();
        (commits.windows(2))
            .map(|pair| pair[1] - pair[0])
            .max()
            .unwrap()
    };
    let (floor_p50_us, _) = ctrlog::tools::bench::fdatasync_floor(cluster.data_dir(), 300).unwrap();
    eprintln!(
        "rolling restart: longest gap between two commits {longest:?}; {elections} elections \
         and {handed_over} handovers ({stood_back} voters stood back) for {leader_restarts} \
         leader restarts; fdatasync p50 {floor_p50_us} us"
    );
    assert!(failed.is_empty(), "appends failed: {failed:?}");
    assert!(
        elections <= leader_restarts,
        "{elections} elections for {leader_restarts} leader restarts:\n{}",
        [logged("stand"), logged("hand"), logged("vote")]
            .concat()
            .join("\n")
    );
    assert!(handed_over >= 1, "no leader handed over");
    assert!(stood_back >= 1, "no voter was told to stand back");
}
