//! `ctrlog bench` and `ctrlog chaos`: their arguments, and a call each into
//! `ctrlog::tools::bench` and `ctrlog::tools::chaos`.

use std::io::Write;
use std::time::Duration;

use clap::Subcommand;
use ctrlog::tools::bench::scale;
use ctrlog::tools::bench::{self, BenchTarget, OWN_CLUSTER_REPLICAS};
use ctrlog::tools::chaos::{self, ChaosOptions, FaultFamily};
use ctrlog::tools::cli::{self, ClientFlags, OutputFlags};
use ctrlog::tools::cluster::{self, ProcessCluster};

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
    },
    /// Subscribers each receiving every command while appends arrive at a fixed rate.
    Fanout {
        #[arg(long, default_value_t = 100)]
        subscribers: usize,
        #[arg(long, default_value_t = 1000)]
        rate: u64,
        #[arg(long, default_value_t = 5)]
        duration_s: u64,
        #[arg(long, default_value_t = 256)]
        payload_bytes: usize,
        /// How long a subscriber's fetch lingers after its first entry to collect more
        /// (the client's `subscription_linger`).
        #[arg(long, default_value_t = 5)]
        linger_ms: u64,
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

#[derive(clap::Args)]
pub struct ChaosArgs {
    #[arg(long, default_value_t = 10)]
    rounds: u32,
    /// Seeds the fault schedule (random by default; printed either way).
    #[arg(long)]
    seed: Option<u64>,
    #[arg(long, default_value_t = 4)]
    producers: usize,
    /// Connections the producers share, their appends batched (default: one each).
    #[arg(long)]
    connections: Option<usize>,
    #[arg(long, default_value_t = 2)]
    subscribers: usize,
    /// The kinds of fault to draw from, comma-separated (default: all; `partitions` needs
    /// root and nftables, `power-loss` a C compiler, `cc` or `$CC`).
    #[arg(long, value_enum, value_delimiter = ',')]
    faults: Vec<FaultFamily>,
    /// The `ctrlog` binary the replicas run (default: this one), e.g. an older build, to see
    /// a fault schedule break what a fix mended.
    #[arg(long)]
    replica_binary: Option<std::path::PathBuf>,
    #[command(flatten)]
    output: OutputFlags,
}

/// An append bench that runs its own replicas shares the machine with them as a light client:
/// it takes an equal share of the cores, as they do (`cluster::worker_threads_each`). The
/// fan-out bench hosts a thousand readers, the heaviest load on the machine, and keeps
/// tokio's default (one thread each measured no better for it: BENCHMARKS.md).
pub fn worker_threads(args: &BenchArgs, flags: &ClientFlags) -> Option<usize> {
    let own_cluster = flags.cluster.is_empty();
    (matches!(args.workload, BenchCmd::Append { .. }) && own_cluster)
        .then(|| cluster::worker_threads_each(OWN_CLUSTER_REPLICAS as usize))
}

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
            writeln!(out, "{}", cli::bench_line(result))
        }
    };
    let needs_cluster = matches!(
        args.workload,
        BenchCmd::Append { .. } | BenchCmd::Fanout { .. }
    );
    // Our own cluster lives for the whole run; it is removed when dropped.
    let own = if needs_cluster && flags.cluster.is_empty() {
        // With their observability ports, for the leader's commit stages.
        let exe = std::env::current_exe()?;
        Some(ProcessCluster::start_with_http(exe, OWN_CLUSTER_REPLICAS, &args.serve_flags).await?)
    } else {
        None
    };
    let target = match &own {
        Some(cluster) => BenchTarget::plain(cluster.client_addrs()),
        None => BenchTarget {
            seeds: flags.cluster.clone(),
            options: flags.options()?,
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
        } => {
            // The floor is measured where the replicas write: our own cluster's folder, or
            // (a cluster elsewhere) this machine's temporary folder, as a stand-in.
            let floor_dir = own
                .as_ref()
                .map_or_else(std::env::temp_dir, |c| c.data_dir().to_path_buf());
            // Our own replicas' CPU is accounted beside the client's; a cluster elsewhere's
            // is not ours to read.
            let replicas: Vec<bench::Accounted> = own.as_ref().map_or_else(Vec::new, |c| {
                (0..OWN_CLUSTER_REPLICAS as usize)
                    .filter_map(|i| {
                        Some(bench::Accounted {
                            name: format!("replica-{}", i + 1),
                            pid: c.pid(i)?,
                        })
                    })
                    .collect()
            });
            let mut results = Vec::new();
            for n in clients {
                let floor = bench::fdatasync_floor(&floor_dir, bench::FDATASYNC_PROBE_WRITES);
                let leader = target.leader().await?;
                let leader_http = own.as_ref().and_then(|c| c.http_addr(leader as usize - 1));
                let result = bench::append(
                    &target,
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
                bench::plot_append(&results, &path)?;
            }
        }
        BenchCmd::Fanout {
            subscribers,
            rate,
            duration_s,
            payload_bytes,
            linger_ms,
        } => {
            let result = bench::fanout(
                &target,
                subscribers,
                rate,
                Duration::from_secs(duration_s),
                payload_bytes,
                Duration::from_millis(linger_ms),
            )
            .await?;
            print(&result)?;
        }
        BenchCmd::Plot { input, svg } => {
            let results = bench::read_results(&input)?;
            match results.first().map(|r| &r["workload"]) {
                Some(workload) if workload == "scale" => scale::plot(&results, &svg)?,
                _ => bench::plot_append(&results, &svg)?,
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
                print(&bench::recovery(commands, snapshots, payload_bytes).await?)?;
            }
        }
    }
    Ok(())
}

pub async fn chaos(args: ChaosArgs, out: &mut impl Write) -> anyhow::Result<()> {
    let seed = args.seed.unwrap_or_else(chaos::seed_from_clock);
    eprintln!("chaos: seed {seed} ({} rounds)", args.rounds);
    let figures = chaos::run(ChaosOptions {
        rounds: args.rounds,
        seed,
        producers: args.producers,
        connections: args.connections,
        subscribers: args.subscribers,
        faults: if args.faults.is_empty() {
            FaultFamily::ALL.to_vec()
        } else {
            args.faults
        },
        replica_binary: args.replica_binary,
    })
    .await?;
    if args.output.json() {
        writeln!(out, "{figures}")?;
    } else {
        writeln!(out, "{}", cli::chaos_text(&figures))?;
    }
    Ok(())
}
