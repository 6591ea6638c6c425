//! `ctrlog bench` against the three `ctrlog serve` processes it starts itself: the documented
//! JSON, with real work done and nothing lost. (Figures belong in BENCHMARKS.md, not here.)

use std::time::Duration;

use ctrlog::tools::LocalCluster;
use serde_json::Value;

async fn bench(args: &[&str]) -> Vec<Value> {
    let mut command = tokio::process::Command::new(env!("CARGO_BIN_EXE_ctrlog"));
    command
        .arg("bench")
        .args(args)
        .arg("--json")
        .env("RUST_LOG", "off")
        .env_remove("CTRLOG_CLUSTER")
        .kill_on_drop(true);
    let output = tokio::time::timeout(Duration::from_secs(120), command.output())
        .await
        .expect("the bench finished")
        .expect("the bench ran");
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout)
        .unwrap()
        .lines()
        .map(|line| serde_json::from_str(line).expect("one JSON object per line"))
        .collect()
}

/// Goal: the append and fan-out workloads run against real replica processes and report the
/// documented fields: every append acknowledged (clients sharing connections too), every
/// command delivered to every subscriber; `--plot` draws the append results.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn append_and_fanout_report_the_documented_json() {
    let dir = tempfile::tempdir().unwrap();
    let plot = dir.path().join("append.svg");
    let appends = bench(&[
        "append",
        "--clients",
        "1,4",
        "--connections",
        "2",
        "--duration-s",
        "1",
        "--warmup-s",
        "0",
        "--plot",
        plot.to_str().unwrap(),
    ])
    .await;
    let svg = std::fs::read_to_string(&plot).expect("the plot was written");
    assert!(svg.starts_with("<svg"), "an SVG document");
    for label in ["durable commits/s", "p99 latency (ms)"] {
        assert!(svg.contains(label), "the plot has its {label} panel");
    }
    assert!(
        svg.matches("<circle").count() >= 4,
        "a point per client count and panel"
    );
    assert_eq!(appends.len(), 2);
    for (result, (clients, connections)) in appends.iter().zip([(1, 1), (4, 2)]) {
        assert_eq!(result["workload"], "append");
        assert_eq!(result["clients"], clients);
        assert_eq!(
            result["connections"], connections,
            "never more than one per client"
        );
        assert!(result["ops"].as_u64().unwrap() > 0);
        assert!(result["ops_per_s"].as_u64().unwrap() > 0);
        assert_eq!(result["errors"], 0);
        for key in ["p50_us", "p99_us", "p999_us", "max_us"] {
            assert!(result[key].as_u64().unwrap() > 0, "{key}");
        }
        // The disk's floor, measured before the run where the replicas write.
        let floor = result["fdatasync_p50_us"].as_u64().unwrap();
        assert!(floor > 0 && result["fdatasync_p99_us"].as_u64().unwrap() >= floor);
        assert!(result["fdatasync_dir"]
            .as_str()
            .unwrap()
            .contains("ctrlog-bench-"));
        // CPU per commit of each process the bench started, and its own, and their sum.
        let cpu = &result["cpu_per_commit_us"];
        let each = ["replica-1", "replica-2", "replica-3", "client"].map(|process| {
            cpu[process]
                .as_f64()
                .unwrap_or_else(|| panic!("{process} in {cpu}"))
        });
        let total = cpu["total"].as_f64().unwrap();
        assert!(
            total > 0.0 && (total - each.iter().sum::<f64>()).abs() < 0.5,
            "{cpu}"
        );
        let leader = result["leader"].as_str().unwrap();
        assert!(
            cpu[leader].as_f64().unwrap() > 0.0,
            "the leader did work: {cpu}"
        );
        // The leader's commit stages over the window, each seen and timed.
        let stages = &result["leader_stages"];
        for stage in ["queued", "raft", "log_sync", "replicated", "applied"] {
            let figures = &stages[stage];
            assert!(figures["count"].as_u64().unwrap() > 0, "{stage}: {stages}");
            let (p50, p99) = (
                figures["p50_us"].as_f64().unwrap(),
                figures["p99_us"].as_f64().unwrap(),
            );
            assert!(p50 > 0.0 && p99 >= p50, "{stage}: {stages}");
        }
    }
    let fanout = &bench(&[
        "fanout",
        "--subscribers",
        "5",
        "--rate",
        "100",
        "--duration-s",
        "1",
    ])
    .await[0];
    assert_eq!(fanout["workload"], "fanout");
    assert_eq!(fanout["expected"], 500);
    assert_eq!(
        fanout["delivered"], 500,
        "every subscriber got every command"
    );
    assert!(fanout["lag_p99_us"].as_u64().unwrap() > 0);
}

/// Goal: `--cluster` benchmarks a running cluster that requires TLS and a client identity,
/// with the same client flags as every other subcommand.
/// Steps: start a secure three-replica cluster; `bench append` and `bench fanout` against it
/// with `--ca`, `--cert` and `--key` (its admin identity): every append acknowledged, every
/// command delivered, and the appends are in the cluster's log.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_running_secure_cluster_is_benchmarked_with_the_client_flags() {
    let dir = tempfile::tempdir().unwrap();
    let cluster = LocalCluster::start_secure(dir.path(), 3, |_| {})
        .await
        .unwrap();
    let leader = cluster
        .wait_for_leader(Duration::from_secs(20))
        .await
        .unwrap();
    let pki = dir.path().join("pki");
    let (cert, key) = ctrlog::tools::certs::client_identity(&pki, "admin");
    let ca = ctrlog::tools::certs::ca_file(&pki);
    let addrs = cluster.client_addrs().join(",");
    let flags = [
        "--cluster",
        addrs.as_str(),
        "--ca",
        ca.to_str().unwrap(),
        "--cert",
        cert.to_str().unwrap(),
        "--key",
        key.to_str().unwrap(),
    ];
    let appends = &bench(
        &[
            &[
                "append",
                "--clients",
                "2",
                "--duration-s",
                "1",
                "--warmup-s",
                "0",
            ],
            &flags[..],
        ]
        .concat(),
    )
    .await[0];
    let ops = appends["ops"].as_u64().unwrap();
    assert!(ops > 0);
    assert_eq!(appends["errors"], 0);
    // The replicas of a cluster elsewhere are not the bench's to account: only its own CPU.
    let cpu = appends["cpu_per_commit_us"].as_object().unwrap();
    assert_eq!(cpu.keys().collect::<Vec<_>>(), ["client", "total"]);
    assert!(
        cluster.replica(leader).applied_offset() >= ops,
        "the measured appends are in the log"
    );
    let fanout = &bench(
        &[
            &[
                "fanout",
                "--subscribers",
                "2",
                "--rate",
                "50",
                "--duration-s",
                "1",
            ],
            &flags[..],
        ]
        .concat(),
    )
    .await[0];
    assert_eq!(fanout["expected"], 100, "two subscribers, 50 commands each");
    assert_eq!(
        fanout["delivered"], 100,
        "both subscribers got every command"
    );
    cluster.shutdown().await;
}

/// Goal: `bench scale` runs a real job on real replica processes and reports the documented
/// fields. Steps: 30 containers on a job of 200 inputs (20 tasks) for a 2 s window: the job
/// settles; the heartbeats were answered without error; the leader's CPU, the controller's
/// tick, the `state` answer, a snapshot, a follower's restart and each replica's memory are
/// reported; the state answer holds the whole job; `--plot` draws each cost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scale_reports_the_documented_json() {
    let dir = tempfile::tempdir().unwrap();
    let plot = dir.path().join("scale.svg");
    let results = bench(&[
        "scale",
        "--containers",
        "30",
        "--inputs",
        "200",
        "--duration-s",
        "2",
        "--plot",
        plot.to_str().unwrap(),
    ])
    .await;
    let svg = std::fs::read_to_string(&plot).expect("the plot was written");
    for label in [
        "leader CPU per heartbeat",
        "heartbeat p99 (ms)",
        "state answer (MB)",
        "leader RSS (MiB)",
        "M = 200 inputs",
    ] {
        assert!(svg.contains(label), "the plot shows {label}");
    }
    assert!(
        svg.matches("<circle").count() >= 9,
        "a point in each of the nine panels"
    );
    // Saved results are drawn again by `bench plot`, as BENCHMARKS.md does it. (Its file flag
    // was `--output`, which clashed with the output format flag: the command panicked.)
    let saved = dir.path().join("scale.jsonl");
    std::fs::write(&saved, format!("{}\n", results[0])).unwrap();
    let replot = dir.path().join("again.svg");
    let printed = bench(&[
        "plot",
        "--input",
        saved.to_str().unwrap(),
        "--svg",
        replot.to_str().unwrap(),
    ])
    .await;
    assert!(printed.is_empty(), "plot prints nothing");
    let again = std::fs::read_to_string(&replot).expect("bench plot wrote the SVG");
    assert!(again.contains("leader RSS (MiB)"), "drawn as a scale run");
    assert_eq!(results.len(), 1);
    let result = &results[0];
    assert_eq!(result["workload"], "scale");
    assert_eq!(result["containers"], 30);
    assert_eq!(result["inputs"], 200);
    assert_eq!(result["tasks"], 20);
    assert_eq!(result["heartbeat_errors"], 0);
    assert!(result["heartbeats_per_s"].as_f64().unwrap() > 0.0);
    for key in [
        "heartbeat_p50_us",
        "heartbeat_p99_us",
        "controller_tick_p50_us",
        "snapshot_offset",
        "follower_disk_bytes",
        "settled_ms",
        "fdatasync_p50_us",
    ] {
        assert!(result[key].as_u64().unwrap() > 0, "{key}");
    }
    for key in [
        "leader_cpu_per_heartbeat_us",
        "state_ms_median",
        "snapshot_build_ms",
        "restart_answering_ms",
        "restart_caught_up_ms",
    ] {
        assert!(result[key].as_f64().unwrap() > 0.0, "{key}");
    }
    // 30 registrations, 20 partitions of 10 streams, 20 tasks running: well over 4 KiB.
    assert!(result["state_bytes"].as_u64().unwrap() > 4096);
    let rss = result["rss_bytes"].as_array().unwrap();
    assert_eq!(rss.len(), 3);
    assert!(rss.iter().all(|bytes| bytes.as_u64().unwrap() > 0));
    assert_eq!(result["cores"].as_array().unwrap().len(), 3);
}
