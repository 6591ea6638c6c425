//! `ctrlog bench`: its arguments, the loop that runs each workload against a cluster (its own
//! or a named one), and its results as lines for people.

use std::io::Write;
use std::time::Duration;

use clap::Subcommand;
use serde_json::Value;

use super::grpc::Protocol;
use super::scale;
use super::{BenchTarget, OWN_CLUSTER_REPLICAS};
use crate::tools::admin::{ClientFlags, OutputFlags};
use crate::tools::cluster::{self, ProcessCluster};

#[derive(clap::Args)]
pub struct BenchArgs {
    #[command(subcommand)]
    workload: BenchCmd,
    #[command(flatten)]
    output: OutputFlags,
    /// A flag for the `ctrlog serve` replicas that `append` and `fanout` start when no
    /// --cluster is given, e.g. `--serve-flag=--config=replica.toml` (a file that states only
    /// what differs from the defaults). Repeat for several.
    #[arg(long = "serve-flag", global = true, allow_hyphen_values = true)]
    serve_flags: Vec<String>,
}

#[derive(Subcommand)]
enum BenchCmd {
    /// Clients each appending sequentially, every append durable.
    Append {
        /// Client counts to run one after the other, e.g. 1,16,64,256.
        #[arg(long, value_delimiter = ',', default_value = "1,64,256")]
        clients: Vec<usize>,
        /// Connections the clients share, each still with its own producer id and each
        /// waiting for its previous append (etcd's benchmark `--conns`). Default: one per
        /// client.
        #[arg(long)]
        connections: Option<usize>,
        #[arg(long, default_value_t = 5)]
        duration_s: u64,
        #[arg(long, default_value_t = 1)]
        warmup_s: u64,
        #[arg(long, default_value_t = 256)]
        payload_bytes: usize,
        /// Also draw commits/s and p99 latency against the client count into this SVG file.
        #[arg(long)]
        plot: Option<std::path::PathBuf>,
        /// The protocol the clients speak: `grpc` measures the gRPC port (on the bench's
        /// own cluster only).
        #[arg(long, value_enum, default_value_t)]
        protocol: Protocol,
    },
    /// Subscribers each receiving every command while appends arrive at a fixed rate.
    Fanout {
        #[arg(long, default_value_t = 100)]
        subscribers: usize,
        /// Subscribers besides those that open a gRPC stream and never read it (with
        /// `--protocol grpc`): the others' lag shows whether they slow anyone down.
        #[arg(long, default_value_t = 0)]
        never_reading: usize,
        #[arg(long, default_value_t = 1000)]
        rate: u64,
        #[arg(long, default_value_t = 5)]
        duration_s: u64,
        #[arg(long, default_value_t = 256)]
        payload_bytes: usize,
        /// How long a subscriber's fetch lingers after its first entry to collect more
        /// (the client's `subscription_linger`; tarpc only).
        #[arg(long, default_value_t = 5)]
        linger_ms: u64,
        /// The protocol the subscribers and writers speak (`grpc`: the bench's own cluster
        /// only).
        #[arg(long, value_enum, default_value_t)]
        protocol: Protocol,
    },
    /// Draw `bench append --json` or `bench scale --json` results saved earlier (one JSON
    /// object per line, e.g. the medians of several runs) into an SVG, as their `--plot`
    /// does.
    Plot {
        /// The JSON lines to read.
        #[arg(long)]
        input: std::path::PathBuf,
        /// The SVG file to write. (Not `--output`, which every subcommand takes for its
        /// output format.)
        #[arg(long)]
        svg: std::path::PathBuf,
    },
    /// A job's size against its cost: N containers heartbeating once a second on a job of M
    /// inputs, each pair on a cluster of its own (always its own cluster).
    Scale {
        /// Container counts (N) to run, e.g. 100,1000,10000.
        #[arg(long, value_delimiter = ',', default_value = "100,1000,10000")]
        containers: Vec<usize>,
        /// Input counts (M) to run each container count with, e.g. 1000,10000,100000.
        #[arg(long, value_delimiter = ',', default_value = "10000")]
        inputs: Vec<usize>,
        /// Connections the containers' heartbeats and answers share.
        #[arg(long, default_value_t = 8)]
        connections: usize,
        /// The measured window, once every task runs.
        #[arg(long, default_value_t = 10)]
        duration_s: u64,
        /// Also draw each cost against N, one line per M, into this SVG file.
        #[arg(long)]
        plot: Option<std::path::PathBuf>,
    },
    /// Restart a follower behind N commands, with and without snapshots (always its own
    /// cluster).
    Recovery {
        #[arg(long, default_value_t = 100_000)]
        commands: u64,
        #[arg(long, default_value_t = 256)]
        payload_bytes: usize,
    },
}

/// An append bench that runs its own replicas shares the machine with them as a light client:
/// it takes an equal share of the cores, as they do (`cluster::worker_threads_each`). The
/// fan-out bench hosts a thousand readers, the heaviest load on the machine, and keeps
/// tokio's default (one thread each measured no better for it: BENCHMARKS.md).
impl BenchArgs {
    pub fn worker_threads(&self, flags: &ClientFlags) -> Option<usize> {
        let own_cluster = flags.cluster.is_empty();
        (matches!(self.workload, BenchCmd::Append { .. }) && own_cluster)
            .then(|| cluster::worker_threads_each(OWN_CLUSTER_REPLICAS as usize))
    }
}

/// `ctrlog bench`: runs the workload and prints a result per run (one JSON object each with
/// `-o json`).
pub async fn bench(
    args: BenchArgs,
    flags: &ClientFlags,
    out: &mut impl Write,
) -> anyhow::Result<()> {
    let json = args.output.json();
    let mut print = |result: &serde_json::Value| -> std::io::Result<()> {
        if json {
            writeln!(out, "{result}")
        } else {
            writeln!(out, "{}", bench_line(result))
        }
    };
    let needs_cluster = matches!(
        args.workload,
        BenchCmd::Append { .. } | BenchCmd::Fanout { .. }
    );
    let protocol = match args.workload {
        BenchCmd::Append { protocol, .. } | BenchCmd::Fanout { protocol, .. } => protocol,
        _ => Protocol::Tarpc,
    };
    if protocol == Protocol::Grpc && !flags.cluster.is_empty() {
        anyhow::bail!("--protocol grpc runs against the bench's own cluster: leave out --cluster");
    }
    // Our own cluster lives for the whole run; it is removed when dropped.
    let own = if needs_cluster && flags.cluster.is_empty() {
        // With their observability ports, for the leader's commit stages, and their gRPC
        // ports too when those are measured.
        let (exe, serve_flags) = (std::env::current_exe()?, &args.serve_flags);
        Some(match protocol {
            Protocol::Tarpc => {
                ProcessCluster::start_with_http(exe, OWN_CLUSTER_REPLICAS, serve_flags).await?
            }
            Protocol::Grpc => {
                ProcessCluster::start_with_grpc(exe, OWN_CLUSTER_REPLICAS, serve_flags).await?
            }
        })
    } else {
        None
    };
    let target = match &own {
        Some(cluster) => BenchTarget {
            grpc: (0..OWN_CLUSTER_REPLICAS as usize)
                .filter_map(|i| cluster.grpc_addr(i).map(|a| a.to_string()))
                .collect(),
            ..BenchTarget::plain(cluster.client_addrs())
        },
        None => BenchTarget {
            seeds: flags.cluster.clone(),
            options: flags.options()?,
            grpc: Vec::new(),
        },
    };
    match args.workload {
        BenchCmd::Append {
            clients,
            connections,
            duration_s,
            warmup_s,
            payload_bytes,
            plot,
            protocol,
        } => {
            // The floor is measured where the replicas write: our own cluster's folder, or
            // (a cluster elsewhere) this machine's temporary folder, as a stand-in.
            let floor_dir = own
                .as_ref()
                .map_or_else(std::env::temp_dir, |c| c.data_dir().to_path_buf());
            // Our own replicas' CPU is accounted beside the client's; a cluster elsewhere's
            // is not ours to read.
            let replicas: Vec<super::Accounted> = own.as_ref().map_or_else(Vec::new, |c| {
                (0..OWN_CLUSTER_REPLICAS as usize)
                    .filter_map(|i| {
                        Some(super::Accounted {
                            name: format!("replica-{}", i + 1),
                            pid: c.pid(i)?,
                        })
                    })
                    .collect()
            });
            let mut results = Vec::new();
            for n in clients {
                let floor = super::fdatasync_floor(&floor_dir, super::FDATASYNC_PROBE_WRITES);
                let leader = target.leader().await?;
                let leader_http = own.as_ref().and_then(|c| c.http_addr(leader as usize - 1));
                let result = super::append(
                    &target,
                    protocol,
                    n,
                    connections,
                    Duration::from_secs(duration_s),
                    Duration::from_secs(warmup_s),
                    payload_bytes,
                    &replicas,
                    leader_http,
                )
                .await?;
                let mut result = result;
                result["leader"] = serde_json::json!(format!("replica-{leader}"));
                let (p50, p99) = floor.map_err(|e| {
                    anyhow::anyhow!("measuring fdatasync in {}: {e}", floor_dir.display())
                })?;
                result["fdatasync_p50_us"] = serde_json::json!(p50);
                result["fdatasync_p99_us"] = serde_json::json!(p99);
                result["fdatasync_dir"] = serde_json::json!(floor_dir.display().to_string());
                print(&result)?;
                results.push(result);
            }
            if let Some(path) = plot {
                super::plot_append(&results, &path)?;
            }
        }
        BenchCmd::Fanout {
            subscribers,
            never_reading,
            rate,
            duration_s,
            payload_bytes,
            linger_ms,
            protocol,
        } => {
            let mut result = super::fanout(
                &target,
                protocol,
                subscribers,
                never_reading,
                rate,
                Duration::from_secs(duration_s),
                payload_bytes,
                Duration::from_millis(linger_ms),
            )
            .await?;
            if let Some(cluster) = &own {
                let rss: Vec<Option<u64>> = (0..OWN_CLUSTER_REPLICAS as usize)
                    .map(|i| cluster.rss_bytes(i))
                    .collect();
                result["replica_rss_bytes"] = serde_json::json!(rss);
            }
            print(&result)?;
        }
        BenchCmd::Plot { input, svg } => {
            let results = super::read_results(&input)?;
            match results.first().map(|r| &r["workload"]) {
                Some(workload) if workload == "scale" => scale::plot(&results, &svg)?,
                _ => super::plot_append(&results, &svg)?,
            }
        }
        BenchCmd::Scale {
            containers,
            inputs,
            connections,
            duration_s,
            plot,
        } => {
            let mut results = Vec::new();
            for &inputs in &inputs {
                for &containers in &containers {
                    let run = scale::ScaleRun {
                        containers,
                        inputs,
                        connections,
                        duration: Duration::from_secs(duration_s),
                    };
                    let result = scale::scale(&run).await?;
                    print(&result)?;
                    results.push(result);
                }
            }
            if let Some(path) = plot {
                scale::plot(&results, &path)?;
            }
        }
        BenchCmd::Recovery {
            commands,
            payload_bytes,
        } => {
            for snapshots in [true, false] {
                print(&super::recovery(commands, snapshots, payload_bytes).await?)?;
            }
        }
    }
    Ok(())
}

/// One `ctrlog bench` result as a line for people.
pub fn bench_line(result: &Value) -> String {
    let ms = |key: &str| result[key].as_u64().unwrap_or(0) as f64 / 1000.0;
    match result["workload"].as_str() {
        Some("append") => format!(
            "append ({})  clients {:>4}  connections {:>4}  {:>8} commits/s  p50 {:>7.2} ms  p99 {:>7.2} ms  p99.9 {:>7.2} ms  max {:>7.2} ms  errors {}  (disk fdatasync p50 {:.3} ms)  CPU per commit: {}  leader stages p50/p99: {}",
            result["protocol"].as_str().unwrap_or("tarpc"), result["clients"], result["connections"], result["ops_per_s"], ms("p50_us"), ms("p99_us"), ms("p999_us"), ms("max_us"), result["errors"], ms("fdatasync_p50_us"),
            cpu_line(result), stages_line(result)
        ),
        Some("fanout") => format!(
            "fanout ({})  subscribers {} (+{} never reading)  rate {}/s  delivered {}/{}  lag p50 {:.2} ms  p99 {:.2} ms  max {:.2} ms  append p99 {:.2} ms  append errors {}  replica RSS {} MiB",
            result["protocol"].as_str().unwrap_or("tarpc"), result["subscribers"], result["never_reading"], result["rate"], result["delivered"], result["expected"],
            ms("lag_p50_us"), ms("lag_p99_us"), ms("lag_max_us"), ms("append_p99_us"), result["append_errors"],
            result["replica_rss_bytes"].as_array().map_or("-".into(), |all| all.iter().map(|b| (b.as_u64().unwrap_or(0) >> 20).to_string()).collect::<Vec<_>>().join("/"))
        ),
        Some("recovery") => format!(
            "recovery  {} commands, snapshots {}: answering after {} ms, caught up after {} ms; before the kill: RSS {} MiB, disk {} MiB",
            result["commands"], result["snapshots"], result["answering_ms"], result["caught_up_ms"],
            result["rss_before_kill_bytes"].as_u64().unwrap_or(0) >> 20,
            result["disk_bytes"].as_u64().unwrap_or(0) >> 20
        ),
        Some("scale") => format!(
            "scale  {} containers, {} inputs ({} tasks): settled after {:.1} s; {} heartbeats/s p50 {:.2} ms p99 {:.2} ms, leader CPU {} µs per heartbeat, cores {}; controller tick p50 {:.2} ms p99 {:.2} ms; state {} ms, {} KiB; snapshot {} ms; follower restart answering {} ms, caught up {} ms; RSS {} MiB (disk fdatasync p50 {:.3} ms)",
            result["containers"], result["inputs"], result["tasks"], ms("settled_ms"),
            result["heartbeats_per_s"], ms("heartbeat_p50_us"), ms("heartbeat_p99_us"),
            result["leader_cpu_per_heartbeat_us"], result["cores"],
            ms("controller_tick_p50_us"), ms("controller_tick_p99_us"),
            result["state_ms_median"], result["state_bytes"].as_u64().unwrap_or(0) >> 10,
            result["snapshot_build_ms"], result["restart_answering_ms"], result["restart_caught_up_ms"],
            result["rss_bytes"].as_array().map_or(String::new(), |all| all.iter().map(|b| (b.as_u64().unwrap_or(0) >> 20).to_string()).collect::<Vec<_>>().join("/")),
            ms("fdatasync_p50_us")
        ),
        _ => result.to_string(),
    }
}

/// `cpu_per_commit_us` for people: each process's µs per commit (the leader marked), then the
/// total.
fn cpu_line(result: &Value) -> String {
    let Some(figures) = result["cpu_per_commit_us"].as_object() else {
        return "not measured".into();
    };
    let leader = result["leader"].as_str().unwrap_or_default();
    let mut parts: Vec<String> = figures
        .iter()
        .filter(|(name, _)| *name != "total")
        .map(|(name, us)| match name == leader {
            true => format!("{name} (leader) {us} µs"),
            false => format!("{name} {us} µs"),
        })
        .collect();
    parts.push(format!("total {} µs", figures["total"]));
    parts.join(", ")
}

/// `leader_stages` for people: each stage's p50 / p99 in milliseconds, in the commit path's
/// order.
fn stages_line(result: &Value) -> String {
    let stages = &result["leader_stages"];
    if !stages.is_object() {
        return "not measured".into();
    }
    ["queued", "raft", "log_sync", "replicated", "applied"]
        .iter()
        .filter(|stage| stages[**stage].is_object())
        .map(|stage| {
            let ms = |q: &str| {
                stages[*stage][q]
                    .as_f64()
                    .map_or("-".into(), |us| format!("{:.2}", us / 1000.0))
            };
            format!("{stage} {} / {} ms", ms("p50_us"), ms("p99_us"))
        })
        .collect::<Vec<_>>()
        .join(", ")
}
