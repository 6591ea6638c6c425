//! The `ctrlog` binary: parses arguments and calls the library.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{bail, Context};
use clap::{Parser, Subcommand};
use ctrlog::client::{ControlClient, Member};
use ctrlog::raft::{parse_members, ReplicaConfig};

#[derive(Parser)]
#[command(
    name = "ctrlog",
    version,
    about = "A replicated job control log on Raft"
)]
struct Cli {
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Run one replica until SIGINT or SIGTERM.
    Serve(ServeArgs),
    /// Show a replica's view of the cluster.
    Status {
        /// Client addresses of any replicas.
        #[arg(long, value_delimiter = ',', required = true)]
        cluster: Vec<String>,
    },
    /// List, add or remove replicas.
    Members {
        #[command(subcommand)]
        command: MembersCmd,
    },
    /// Run a three-replica cluster in this process and show the control log at work.
    Demo {
        /// Where the replicas keep their data (a fresh temporary directory by default).
        #[arg(long)]
        data: Option<PathBuf>,
    },
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
enum MembersCmd {
    List {
        #[arg(long, value_delimiter = ',', required = true)]
        cluster: Vec<String>,
    },
    /// Add a replica: it joins as a learner and is promoted once caught up.
    Add {
        #[arg(long, value_delimiter = ',', required = true)]
        cluster: Vec<String>,
        #[arg(long)]
        id: u64,
        #[arg(long)]
        peer_addr: String,
        #[arg(long)]
        client_addr: String,
    },
    Remove {
        #[arg(long, value_delimiter = ',', required = true)]
        cluster: Vec<String>,
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

fn print_status(status: &ctrlog::client::Status) {
    println!(
        "replica {} is {} in term {}; leader: {:?}; applied offset {}; log index {:?}",
        status.id,
        status.role,
        status.term,
        status.leader_id,
        status.applied_offset,
        status.last_log_index
    );
    for m in &status.members {
        println!(
            "  {} {} peer={} client={}",
            m.id,
            if m.voter { "voter  " } else { "learner" },
            m.member.peer_addr,
            m.member.client_addr
        );
    }
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| "info,openraft=warn".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    let cli = Cli::parse();
    match cli.command {
        Cmd::Serve(args) => ctrlog::raft::serve(serve_config(args)?, shutdown_signal()).await?,
        Cmd::Status { cluster } => {
            let client = ControlClient::connect(&cluster).await?;
            print_status(&client.status().await?);
        }
        Cmd::Members { command } => match command {
            MembersCmd::List { cluster } => {
                let client = ControlClient::connect(&cluster).await?;
                print_status(&client.leader_status().await?);
            }
            MembersCmd::Add {
                cluster,
                id,
                peer_addr,
                client_addr,
            } => {
                let client = ControlClient::connect(&cluster).await?;
                client
                    .add_member(
                        id,
                        Member {
                            peer_addr,
                            client_addr,
                        },
                    )
                    .await?;
                println!("replica {id} added and promoted to voter");
            }
            MembersCmd::Remove { cluster, id } => {
                let client = ControlClient::connect(&cluster)
                    .await?
                    .with_retry_deadline(Duration::from_secs(30));
                client.remove_member(id).await?;
                println!("replica {id} removed");
            }
        },
        Cmd::Demo { data } => ctrlog::demo::run(data).await?,
    }
    Ok(())
}
