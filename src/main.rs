//! The `ctrlog` binary: parses arguments and calls the library.

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{bail, Context};
use clap::{Parser, Subcommand};
use ctrlog::cli;
use ctrlog::client::{ClientOptions, ControlClient, Member};
use ctrlog::log::{Filter, Frame, ProducerSeq, Target};
use ctrlog::raft::{parse_members, ReplicaConfig};

// Serving a subscriber allocates and frees a buffer per entry on both sides of the wire, a
// million times a second at 1,000 subscribers; mimalloc's per-thread free lists cut the
// fan-out's delivery lag by about a fifth against glibc's malloc (BENCHMARKS.md).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[derive(Parser)]
#[command(
    name = "ctrlog",
    version,
    about = "A replicated job control log on Raft"
)]
struct Cli {
    #[command(flatten)]
    client: ClientFlags,
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Run one replica until SIGINT or SIGTERM.
    Serve(ServeArgs),
    /// Disaster recovery, with the replica stopped: make its data the only member of a new
    /// cluster, keeping every command it holds (etcd's --force-new-cluster). Takes the same
    /// options as `serve`; start it with `serve` afterwards and add new replicas with
    /// `members add`. Never start the other old replicas' directories again.
    ForceNewCluster(ServeArgs),
    /// Append one command and print its offset.
    Append(AppendArgs),
    /// Print committed commands, one per line.
    Tail {
        /// The first offset to print.
        #[arg(long, default_value_t = 1)]
        from: u64,
        /// Keep printing new commands as they commit.
        #[arg(long)]
        follow: bool,
        /// Stop after this many commands.
        #[arg(long)]
        max: Option<u64>,
        /// `everything`, or `container:ID` for one container's commands plus broadcasts.
        #[arg(long, default_value = "everything")]
        filter: Filter,
        /// One JSON object per line.
        #[arg(long)]
        json: bool,
    },
    /// Show a replica's view of the cluster.
    Status {
        #[arg(long)]
        json: bool,
    },
    /// Show the job state folded from the log.
    State {
        #[arg(long)]
        json: bool,
    },
    /// Take a snapshot on the leader now (and purge what retention allows).
    Snapshot,
    /// Show the command vocabulary, or raise its level after an upgrade.
    Vocabulary {
        #[command(subcommand)]
        command: VocabularyCmd,
    },
    /// List, add or remove replicas.
    Members {
        #[command(subcommand)]
        command: MembersCmd,
    },
    /// Measure command throughput, fan-out lag or recovery (starts its own 3-replica cluster
    /// of `ctrlog serve` processes unless --cluster is given).
    Bench {
        #[command(subcommand)]
        workload: BenchCmd,
        /// One JSON object per line instead of a table.
        #[arg(long, global = true)]
        json: bool,
    },
    /// Kill, pause and restart replicas of a three-process cluster under load, then verify
    /// the history (lost, duplicated, reordered or skipped commands).
    Chaos {
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
        #[arg(long)]
        json: bool,
    },
    /// Run a simulated container: join the job, run what it is assigned, report lag, obey.
    Container {
        /// This container's name.
        #[arg(long)]
        id: String,
        #[arg(long, default_value_t = 500)]
        heartbeat_ms: u64,
        /// Stop work after this long without an accepted heartbeat (keep it below the
        /// controller's session timeout).
        #[arg(long, default_value_t = 3000)]
        lease_ms: u64,
        /// A file with the lag each running task reports (one number).
        #[arg(long)]
        lag_file: Option<PathBuf>,
        /// Append a JSON line per task started or stopped here.
        #[arg(long)]
        report_file: Option<PathBuf>,
        /// How long a stopping task flushes its state before the stop is acknowledged.
        #[arg(long, default_value_t = 0)]
        stop_delay_ms: u64,
    },
    /// Run a three-replica cluster in this process and show the control log at work.
    Demo {
        /// Where the replicas keep their data (a fresh temporary directory by default).
        #[arg(long)]
        data: Option<PathBuf>,
    },
    /// Certificates for TLS.
    Certs {
        #[command(subcommand)]
        action: CertsCmd,
    },
}

#[derive(Subcommand)]
enum CertsCmd {
    /// A CA plus a certificate per replica (`node-<id>`) and per client, for a test or a small
    /// deployment.
    Generate {
        #[arg(long)]
        out: PathBuf,
        /// Replica ids, e.g. 1,2,3.
        #[arg(long, value_delimiter = ',', required = true)]
        nodes: Vec<u64>,
        /// Host names and IP addresses the replicas are dialled at (every replica's
        /// certificate carries them all).
        #[arg(long, value_delimiter = ',', default_value = "127.0.0.1,localhost")]
        hosts: Vec<String>,
        /// Client certificates to issue, by name.
        #[arg(long, value_delimiter = ',')]
        clients: Vec<String>,
        #[arg(long, default_value_t = 365)]
        days: i64,
    },
}

#[derive(clap::Args)]
#[command(group(clap::ArgGroup::new("body").required(true).args(["payload", "payload_file"])))]
struct AppendArgs {
    /// The command kind: a number as stored, or `custom:N` for user kind N.
    #[arg(long, value_parser = ctrlog::cli::parse_kind)]
    kind: u32,
    #[arg(long, default_value_t = 1)]
    version: u16,
    /// `all`, `coordinator` or `container:ID`.
    #[arg(long, default_value = "all")]
    target: Target,
    /// The payload as text.
    #[arg(long)]
    payload: Option<String>,
    /// The payload from a file, as bytes.
    #[arg(long)]
    payload_file: Option<PathBuf>,
    /// An idempotent producer id; with `--seq`, running the same command twice appends once.
    #[arg(long, requires = "seq")]
    producer: Option<u64>,
    #[arg(long, requires = "producer")]
    seq: Option<u64>,
    /// Print `{"offset":N,"duplicate":false}`.
    #[arg(long)]
    json: bool,
}

#[derive(clap::Args)]
struct ServeArgs {
    /// A TOML file with any of the options; flags override it.
    #[arg(long)]
    config: Option<PathBuf>,
    #[arg(long)]
    id: Option<u64>,
    #[arg(long)]
    peer_addr: Option<std::net::SocketAddr>,
    #[arg(long)]
    client_addr: Option<std::net::SocketAddr>,
    /// Serve /metrics, /healthz, /readyz and the status page here (HTTP).
    #[arg(long)]
    http_addr: Option<std::net::SocketAddr>,
    /// TLS on both ports: the CA (PEM); with --tls-cert and --tls-key.
    #[arg(long, requires_all = ["tls_cert", "tls_key"])]
    tls_ca: Option<PathBuf>,
    /// This replica's certificate (PEM), naming it `node-<id>`.
    #[arg(long, requires = "tls_ca")]
    tls_cert: Option<PathBuf>,
    /// This replica's private key (PEM).
    #[arg(long, requires = "tls_ca")]
    tls_key: Option<PathBuf>,
    #[arg(long)]
    data: Option<PathBuf>,
    /// The founding members: 1=PEER/CLIENT,2=PEER/CLIENT,3=PEER/CLIENT.
    #[arg(long)]
    initial_members: Option<String>,
    #[arg(long)]
    snapshot_logs_since_last: Option<u64>,
    #[arg(long)]
    snapshot_logs_to_keep: Option<u64>,
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
    /// Draw `bench append --json` results saved earlier (one JSON object per line, e.g. the
    /// medians of several runs) into an SVG, as `append --plot` does.
    Plot {
        /// The JSON lines to read.
        #[arg(long)]
        input: std::path::PathBuf,
        /// The SVG file to write.
        #[arg(long)]
        output: std::path::PathBuf,
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

#[derive(Subcommand)]
enum VocabularyCmd {
    /// The built-in kinds, and which the recorded level allows.
    Show,
    /// Raise the recorded level (every replica must support it; this is checked first).
    Raise {
        #[arg(long)]
        level: u16,
    },
}

#[derive(Subcommand)]
enum MembersCmd {
    List,
    /// Add a replica: it joins as a learner and is promoted once caught up.
    Add {
        #[arg(long)]
        id: u64,
        #[arg(long)]
        peer_addr: String,
        #[arg(long)]
        client_addr: String,
    },
    Remove {
        #[arg(long)]
        id: u64,
    },
}

fn serve_config(args: ServeArgs) -> anyhow::Result<ReplicaConfig> {
    let mut config = match &args.config {
        Some(path) => {
            let text = std::fs::read_to_string(path)
                .with_context(|| format!("reading {}", path.display()))?;
            toml::from_str(&text).with_context(|| format!("parsing {}", path.display()))?
        }
        None => ReplicaConfig::default(),
    };
    if let Some(id) = args.id {
        config.id = id;
    }
    if let Some(addr) = args.peer_addr {
        config.peer_addr = addr;
    }
    if let Some(addr) = args.client_addr {
        config.client_addr = addr;
    }
    if let Some(addr) = args.http_addr {
        config.http_addr = Some(addr);
    }
    if let (Some(ca_file), Some(cert_file), Some(key_file)) =
        (args.tls_ca, args.tls_cert, args.tls_key)
    {
        config.tls = Some(ctrlog::raft::TlsFiles {
            ca_file,
            cert_file,
            key_file,
        });
    }
    if let Some(dir) = args.data {
        config.data_dir = dir;
    }
    if let Some(members) = args.initial_members {
        config.initial_members = parse_members(&members)?;
    }
    if let Some(n) = args.snapshot_logs_since_last {
        config.snapshot_logs_since_last = n;
    }
    if let Some(n) = args.snapshot_logs_to_keep {
        config.snapshot_logs_to_keep = n;
    }
    if args.id.is_none() && args.config.is_none() {
        bail!("--id is required (or give it in --config)");
    }
    config.validate()?;
    Ok(config)
}

async fn shutdown_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = signal(SignalKind::terminate()).expect("installing the SIGTERM handler");
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
}

/// The global flags the client subcommands connect with.
#[derive(clap::Args, Clone)]
struct ClientFlags {
    /// Client addresses of any replicas of the cluster (for the client subcommands).
    #[arg(long, global = true, env = "CTRLOG_CLUSTER", value_delimiter = ',')]
    cluster: Vec<String>,
    /// Speak TLS to the cluster, trusting this CA (PEM), for the client subcommands.
    #[arg(long, global = true, env = "CTRLOG_CA")]
    ca: Option<PathBuf>,
    /// This client's certificate (PEM), where the cluster asks for one; with --key.
    #[arg(long, global = true, env = "CTRLOG_CERT", requires = "key")]
    cert: Option<PathBuf>,
    /// This client's private key (PEM); with --cert.
    #[arg(long, global = true, env = "CTRLOG_KEY", requires = "cert")]
    key: Option<PathBuf>,
    /// A bearer token, where the cluster requires credentials.
    #[arg(long, global = true, env = "CTRLOG_TOKEN", hide_env_values = true)]
    token: Option<String>,
}

impl ClientFlags {
    /// The client options the flags ask for (TLS, when `--ca` is given).
    fn options(&self) -> anyhow::Result<ClientOptions> {
        let tls = match &self.ca {
            Some(ca) => {
                let identity = self.cert.as_deref().zip(self.key.as_deref());
                Some(ctrlog::client::tls::client_config(ca, identity)?)
            }
            None => None,
        };
        Ok(ClientOptions {
            tls,
            token: self.token.clone(),
            ..ClientOptions::default()
        })
    }
}

async fn connect(flags: &ClientFlags) -> anyhow::Result<ControlClient> {
    if flags.cluster.is_empty() {
        bail!("no cluster given: use --cluster ADDR,ADDR,... or set CTRLOG_CLUSTER");
    }
    ControlClient::connect_with(&flags.cluster, flags.options()?)
        .await
        .context("connecting to the cluster")
}

async fn run(cli: Cli) -> anyhow::Result<()> {
    // Not locked for the whole command: the demo prints from several tasks.
    let mut out = std::io::stdout();
    let flags = cli.client;
    match cli.command {
        Cmd::Certs {
            action:
                CertsCmd::Generate {
                    out: dir,
                    nodes,
                    hosts,
                    clients,
                    days,
                },
        } => {
            for path in ctrlog::certs::generate(&dir, &nodes, &hosts, &clients, days)? {
                writeln!(out, "{}", path.display())?;
            }
        }
        Cmd::Serve(args) => ctrlog::raft::serve(serve_config(args)?, shutdown_signal()).await?,
        Cmd::ForceNewCluster(args) => {
            let config = serve_config(args)?;
            let forced = ctrlog::raft::recover::force_new_cluster(&config).with_context(|| {
                format!("forcing a new cluster from {}", config.data_dir.display())
            })?;
            writeln!(
                out,
                "replica {} is now the only member of its cluster: its log ended at index {} \
                 (term {}), and the membership entry at index {} (term {}) commits when it \
                 starts. Start it with `ctrlog serve`, then add replicas with `ctrlog members add`.",
                config.id,
                forced.previous_last.index,
                forced.previous_last.leader_id.term,
                forced.entry.index,
                forced.entry.leader_id.term,
            )?;
        }
        Cmd::Append(args) => {
            let body = match (args.payload, args.payload_file) {
                (Some(text), _) => text.into_bytes(),
                (None, Some(path)) => {
                    std::fs::read(&path).with_context(|| format!("reading {}", path.display()))?
                }
                (None, None) => unreachable!("clap requires one of them"),
            };
            let frame = Frame {
                kind: args.kind,
                version: args.version,
                body,
            };
            let producer = args
                .producer
                .zip(args.seq)
                .map(|(producer, seq)| ProducerSeq { producer, seq });
            let client = connect(&flags).await?;
            let ack = cli::append(&client, args.target, frame, producer).await?;
            if args.json {
                writeln!(out, "{}", serde_json::to_string(&ack)?)?;
            } else if ack.duplicate {
                writeln!(out, "{} (already appended)", ack.offset)?;
            } else {
                writeln!(out, "{}", ack.offset)?;
            }
        }
        Cmd::Tail {
            from,
            follow,
            max,
            filter,
            json,
        } => {
            let client = connect(&flags).await?;
            let options = cli::TailOptions {
                from,
                follow,
                max,
                filter,
                json,
            };
            cli::tail(&client, &options, &mut out).await?;
        }
        Cmd::Status { json } => {
            let status = connect(&flags).await?.status().await?;
            if json {
                writeln!(out, "{}", cli::status_json(&status))?;
            } else {
                write!(out, "{}", cli::status_text(&status))?;
            }
        }
        Cmd::State { json } => {
            let at = connect(&flags).await?.state(0).await?;
            if json {
                writeln!(out, "{}", cli::state_json(&at))?;
            } else {
                write!(out, "{}", cli::state_text(&at))?;
            }
        }
        Cmd::Snapshot => {
            let offset = connect(&flags).await?.snapshot().await?;
            writeln!(out, "snapshot taken; it covers offsets up to {offset}")?;
        }
        Cmd::Vocabulary { command } => {
            let client = connect(&flags).await?;
            match command {
                VocabularyCmd::Show => {
                    let level = client.leader_status().await?.vocabulary_level;
                    write!(out, "{}", cli::vocabulary_text(level))?;
                }
                VocabularyCmd::Raise { level } => {
                    let ack = cli::raise_level(&client, level).await?;
                    writeln!(
                        out,
                        "vocabulary level {level} recorded at offset {}",
                        ack.offset
                    )?;
                }
            }
        }
        Cmd::Members { command } => {
            let client = connect(&flags).await?;
            match command {
                MembersCmd::List => {
                    write!(out, "{}", cli::status_text(&client.leader_status().await?))?
                }
                MembersCmd::Add {
                    id,
                    peer_addr,
                    client_addr,
                } => {
                    let member = Member {
                        peer_addr,
                        client_addr,
                    };
                    client.add_member(id, member).await?;
                    writeln!(out, "replica {id} added and promoted to voter")?;
                }
                MembersCmd::Remove { id } => {
                    client.remove_member(id).await?;
                    writeln!(out, "replica {id} removed")?;
                }
            }
        }
        Cmd::Bench { workload, json } => {
            let print =
                |out: &mut std::io::Stdout, result: serde_json::Value| -> std::io::Result<()> {
                    if json {
                        writeln!(out, "{result}")
                    } else {
                        writeln!(out, "{}", cli::bench_line(&result))
                    }
                };
            // Keep our own cluster alive for the whole run; it is removed when dropped.
            let own = match (&workload, flags.cluster.is_empty()) {
                (BenchCmd::Recovery { .. } | BenchCmd::Plot { .. }, _) | (_, false) => None,
                (_, true) => Some(
                    ctrlog::bench::ProcessCluster::start(ctrlog::bench::OWN_CLUSTER_REPLICAS, &[])
                        .await?,
                ),
            };
            let target = match &own {
                Some(cluster) => ctrlog::bench::BenchTarget::plain(cluster.client_addrs()),
                None => ctrlog::bench::BenchTarget {
                    seeds: flags.cluster.clone(),
                    options: flags.options()?,
                },
            };
            match workload {
                BenchCmd::Append {
                    clients,
                    connections,
                    duration_s,
                    warmup_s,
                    payload_bytes,
                    plot,
                } => {
                    let mut results = Vec::new();
                    for n in clients {
                        let result = ctrlog::bench::append(
                            &target,
                            n,
                            connections,
                            std::time::Duration::from_secs(duration_s),
                            std::time::Duration::from_secs(warmup_s),
                            payload_bytes,
                        )
                        .await?;
                        print(&mut out, result.clone())?;
                        results.push(result);
                    }
                    if let Some(path) = plot {
                        ctrlog::bench::plot_append(&results, &path)?;
                    }
                }
                BenchCmd::Fanout {
                    subscribers,
                    rate,
                    duration_s,
                    payload_bytes,
                    linger_ms,
                } => {
                    let result = ctrlog::bench::fanout(
                        &target,
                        subscribers,
                        rate,
                        std::time::Duration::from_secs(duration_s),
                        payload_bytes,
                        std::time::Duration::from_millis(linger_ms),
                    )
                    .await?;
                    print(&mut out, result)?;
                }
                BenchCmd::Plot { input, output } => {
                    let results = std::fs::read_to_string(&input)?
                        .lines()
                        .filter(|line| !line.trim().is_empty())
                        .map(serde_json::from_str)
                        .collect::<Result<Vec<serde_json::Value>, _>>()?;
                    ctrlog::bench::plot_append(&results, &output)?;
                }
                BenchCmd::Recovery {
                    commands,
                    payload_bytes,
                } => {
                    for snapshots in [true, false] {
                        let result =
                            ctrlog::bench::recovery(commands, snapshots, payload_bytes).await?;
                        print(&mut out, result)?;
                    }
                }
            }
        }
        Cmd::Chaos {
            rounds,
            seed,
            producers,
            connections,
            subscribers,
            json,
        } => {
            let seed = seed.unwrap_or_else(|| {
                std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map_or(1, |d| d.as_secs())
            });
            eprintln!("chaos: seed {seed} ({rounds} rounds)");
            let figures = ctrlog::chaos::run(ctrlog::chaos::ChaosOptions {
                rounds,
                seed,
                producers,
                connections,
                subscribers,
            })
            .await?;
            if json {
                writeln!(out, "{figures}")?;
            } else {
                writeln!(out, "{}", cli::chaos_text(&figures))?;
            }
        }
        Cmd::Container {
            id,
            heartbeat_ms,
            lease_ms,
            lag_file,
            report_file,
            stop_delay_ms,
        } => {
            if flags.cluster.is_empty() {
                bail!("no cluster given: use --cluster ADDR,ADDR,... or set CTRLOG_CLUSTER");
            }
            let options = ctrlog::controller::SimOptions {
                heartbeat_interval: std::time::Duration::from_millis(heartbeat_ms),
                lease: std::time::Duration::from_millis(lease_ms),
                lag_file,
                report_file,
                stop_delay: std::time::Duration::from_millis(stop_delay_ms),
                client: flags.options()?,
            };
            let id = ctrlog::log::ContainerId::new(id)?;
            ctrlog::controller::run_simulated_container(
                flags.cluster,
                id,
                options,
                shutdown_signal(),
            )
            .await?;
        }
        Cmd::Demo { data } => ctrlog::demo::run(data).await?,
    }
    Ok(())
}

fn is_broken_pipe(error: &anyhow::Error) -> bool {
    error
        .downcast_ref::<std::io::Error>()
        .is_some_and(|e| e.kind() == std::io::ErrorKind::BrokenPipe)
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let mut runtime = tokio::runtime::Builder::new_multi_thread();
    runtime.enable_all();
    // An append bench that runs its own replicas shares the machine with them as a light
    // client: it takes an equal share of the cores, as they do (`bench::worker_threads_each`).
    // The fan-out bench hosts a thousand readers, the heaviest load on the machine, and keeps
    // tokio's default (one thread each measured no better for it: BENCHMARKS.md).
    if let Cmd::Bench {
        workload: BenchCmd::Append { .. },
        ..
    } = cli.command
    {
        if cli.client.cluster.is_empty() {
            runtime.worker_threads(ctrlog::bench::worker_threads_each(
                ctrlog::bench::OWN_CLUSTER_REPLICAS as usize,
            ));
        }
    }
    match runtime.build() {
        Ok(runtime) => runtime.block_on(run_main(cli)),
        Err(error) => {
            eprintln!("ctrlog: starting the async runtime: {error}");
            ExitCode::FAILURE
        }
    }
}

async fn run_main(cli: Cli) -> ExitCode {
    // The demo kills a leader on purpose; its story is the timeline, not the replicas' logs.
    let default_filter = match cli.command {
        Cmd::Demo { .. } => "error,openraft=off,tarpc=off",
        // Faults are the point: show them, not every replica's complaint about them.
        Cmd::Chaos { .. } => "error,ctrlog::chaos=info,openraft=off,tarpc=off",
        // tarpc opens an info-level span per request; formatting its fields cost the bench
        // client about a tenth of its CPU (perf), so tarpc speaks only of problems.
        _ => "info,openraft=warn,tarpc=warn",
    };
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| default_filter.into()),
        )
        .with_writer(std::io::stderr)
        .init();
    match run(cli).await {
        Ok(()) => ExitCode::SUCCESS,
        // `ctrlog tail | head` closing the pipe is not an error.
        Err(error) if is_broken_pipe(&error) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("ctrlog: {error:#}");
            ExitCode::FAILURE
        }
    }
}
