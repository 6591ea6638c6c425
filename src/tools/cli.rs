//! The `ctrlog` command line: its arguments, one call per subcommand into the wings, and exit
//! codes. The binary parses, sets up logging and the runtime, and calls [`Cli::run`].

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use clap::{Parser, Subcommand};

use crate::server::ServeFlags;
use crate::tools::admin::commands::{self as admin, AppendArgs, TailArgs};
use crate::tools::admin::{shutdown_signal, ClientFlags, Interrupted, OutputFlags};
use crate::tools::bench::command::{self as bench, BenchArgs};
use crate::tools::chaos::command::{self as chaos, ChaosArgs, ContainerArgs};

/// What `ctrlog --help` says of exit codes, after the subcommands (the README repeats it).
const EXIT_CODES: &str = "\
Exit codes:
  0  done
  1  failed for another reason (a file, the disk, a bug): see the message
  2  bad arguments or options (nothing was sent)
  3  gave up: no replica answered in time (--command-timeout); safe to retry, and an append
     retried with the same --producer/--seq appends once
  4  refused by the cluster: the request itself is wrong for the log or the job; do not retry
     it unchanged
  5  credentials refused: the token, the client certificate or the CA (TLS)
  6  `check` found faults in the data directory (each is listed)
  7  forbidden: the credentials were accepted, but their role may not do this
130  interrupted (Ctrl-C or SIGTERM); bench and chaos stop the replicas they started and
     remove their folders first, and `members add` removes the learner it added";

#[derive(Parser)]
#[command(
    name = "ctrlog",
    version,
    about = "A replicated job control log on Raft",
    after_help = EXIT_CODES
)]
pub struct Cli {
    /// How log lines are written to stderr: text (colours only on a terminal) or one JSON
    /// object per line, for a log shipper.
    #[arg(long, global = true, value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,
    #[command(flatten)]
    before_subcommand: ClientFlagsBeforeSubcommand,
    #[command(subcommand)]
    command: Cmd,
}

/// The client flags where v0.1.0 also took them, before the subcommand
/// (`ctrlog --cluster ADDRS status`): still accepted there for a client subcommand, and
/// refused for any other (`ctrlog --ca ca.pem serve` would otherwise start a plaintext
/// replica). Hidden: the subcommands' own flags are the documented spelling.
#[derive(clap::Args, Debug, Default)]
struct ClientFlagsBeforeSubcommand {
    #[arg(long = "cluster", hide = true, value_delimiter = ',')]
    cluster: Vec<String>,
    #[arg(long = "ca", hide = true)]
    ca: Option<PathBuf>,
    #[arg(long = "cert", hide = true)]
    cert: Option<PathBuf>,
    #[arg(long = "key", hide = true)]
    key: Option<PathBuf>,
    #[arg(long = "token", hide = true)]
    token: Option<String>,
    #[arg(long = "token-file", hide = true)]
    token_file: Option<PathBuf>,
}

impl ClientFlagsBeforeSubcommand {
    /// The first flag given, as typed.
    fn first_given(&self) -> Option<&'static str> {
        [
            (!self.cluster.is_empty(), "--cluster"),
            (self.ca.is_some(), "--ca"),
            (self.cert.is_some(), "--cert"),
            (self.key.is_some(), "--key"),
            (self.token.is_some(), "--token"),
            (self.token_file.is_some(), "--token-file"),
        ]
        .into_iter()
        .find_map(|(given, flag)| given.then_some(flag))
    }

    /// Fills in what the subcommand's own flags (or the environment) left unset.
    fn fill(&self, flags: &mut ClientFlags) {
        if flags.cluster.is_empty() {
            flags.cluster = self.cluster.clone();
        }
        for (ours, theirs) in [
            (&self.ca, &mut flags.ca),
            (&self.cert, &mut flags.cert),
            (&self.key, &mut flags.key),
            (&self.token_file, &mut flags.token_file),
        ] {
            if theirs.is_none() {
                theirs.clone_from(ours);
            }
        }
        if flags.token.is_none() {
            flags.token.clone_from(&self.token);
        }
    }
}

impl Cmd {
    /// The client flags of a subcommand that talks to a cluster.
    fn client_flags(&mut self) -> Option<&mut ClientFlags> {
        match self {
            Cmd::Append { client, .. }
            | Cmd::Tail { client, .. }
            | Cmd::Status { client, .. }
            | Cmd::State { client, .. }
            | Cmd::Snapshot { client, .. }
            | Cmd::Broadcast { client, .. }
            | Cmd::Vocabulary { client, .. }
            | Cmd::Members { client, .. }
            | Cmd::Bench { client, .. }
            | Cmd::Container { client, .. } => Some(client),
            Cmd::Serve(_)
            | Cmd::ForceNewCluster(_)
            | Cmd::Chaos(_)
            | Cmd::Demo { .. }
            | Cmd::Check { .. }
            | Cmd::Certs { .. }
            | Cmd::Tokens { .. } => None,
        }
    }
}

/// Moves client flags typed before the subcommand onto it, or refuses them where the
/// subcommand talks to no cluster.
fn place_client_flags(cli: &mut Cli) -> Result<(), String> {
    let Some(flag) = cli.before_subcommand.first_given() else {
        return Ok(());
    };
    match cli.command.client_flags() {
        Some(flags) => {
            cli.before_subcommand.fill(flags);
            Ok(())
        }
        None => {
            let hint = match cli.command {
                Cmd::Serve(_) | Cmd::ForceNewCluster(_) => {
                    " (a replica's TLS flags are --tls-ca, --tls-cert and --tls-key)"
                }
                _ => "",
            };
            Err(format!(
                "{flag} is a flag of the client subcommands; this subcommand does not use it{hint}"
            ))
        }
    }
}

#[derive(Clone, Copy, clap::ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
}

#[derive(Subcommand)]
enum Cmd {
    /// Run one replica until SIGINT or SIGTERM.
    Serve(ServeFlags),
    /// Disaster recovery, with the replica stopped: make its data the only member of a new
    /// cluster, keeping every command it holds (etcd's --force-new-cluster). Takes the same
    /// options as `serve`; start it with `serve` afterwards and add new replicas with
    /// `members add`. Never start the other old replicas' directories again.
    ForceNewCluster(ServeFlags),
    /// Append one command and print its offset.
    Append {
        #[command(flatten)]
        args: AppendArgs,
        #[command(flatten)]
        client: ClientFlags,
    },
    /// Print committed commands, one per line.
    Tail {
        #[command(flatten)]
        args: TailArgs,
        #[command(flatten)]
        client: ClientFlags,
    },
    /// Show a replica's view of the cluster, or every replica's with --all-replicas.
    Status {
        /// Ask every member (from the membership) for its own view, one line each: a replica
        /// that does not answer shows its error.
        #[arg(long)]
        all_replicas: bool,
        #[command(flatten)]
        output: OutputFlags,
        #[command(flatten)]
        client: ClientFlags,
    },
    /// Show the job state folded from the log: what the replica answering has applied (it
    /// may lag the leader by what is in flight), or with --consistent every write
    /// acknowledged before the command started.
    State {
        /// A linearizable read: the leader confirms with a quorum that it leads and names
        /// the offset it has applied (the read index); the state is read once applied that
        /// far. Costs a round trip to a quorum; fails when none answers.
        #[arg(long)]
        consistent: bool,
        #[command(flatten)]
        output: OutputFlags,
        #[command(flatten)]
        client: ClientFlags,
    },
    /// Take a snapshot on the leader now (and purge what retention allows); or save a backup
    /// of the job to a file, or restore one into a new cluster's data directory.
    Snapshot {
        #[command(subcommand)]
        action: Option<admin::SnapshotCmd>,
        #[command(flatten)]
        output: OutputFlags,
        #[command(flatten)]
        client: ClientFlags,
    },
    /// Broadcast a schema or configuration change to every container (each live one must
    /// ack it); prints the offset it got.
    Broadcast {
        #[command(subcommand)]
        command: admin::BroadcastCmd,
        #[command(flatten)]
        output: OutputFlags,
        #[command(flatten)]
        client: ClientFlags,
    },
    /// Show the command vocabulary, or raise its level after an upgrade.
    Vocabulary {
        #[command(subcommand)]
        command: admin::VocabularyCmd,
        #[command(flatten)]
        output: OutputFlags,
        #[command(flatten)]
        client: ClientFlags,
    },
    /// List, add or remove replicas.
    Members {
        #[command(subcommand)]
        command: admin::MembersCmd,
        #[command(flatten)]
        output: OutputFlags,
        #[command(flatten)]
        client: ClientFlags,
    },
    /// Measure command throughput, fan-out lag or recovery (starts its own 3-replica cluster
    /// of `ctrlog serve` processes unless --cluster is given).
    Bench {
        #[command(flatten)]
        args: BenchArgs,
        #[command(flatten)]
        client: ClientFlags,
    },
    /// Kill, pause and restart replicas of a three-process cluster under load, then verify
    /// the history (lost, duplicated, reordered or skipped commands).
    Chaos(ChaosArgs),
    /// Run a simulated container: join the job, run what it is assigned, report lag, obey.
    Container {
        #[command(flatten)]
        args: ContainerArgs,
        #[command(flatten)]
        client: ClientFlags,
    },
    /// Verify a stopped replica's data directory, changing nothing: every WAL record against
    /// its checksum and the synced mark, the vote and repair files, sled and the stored
    /// snapshot, the format file. Lists each fault and what the next start does about it;
    /// exits 6 if there is any.
    Check {
        /// The replica's data directory.
        #[arg(long)]
        data: PathBuf,
        #[command(flatten)]
        output: OutputFlags,
    },
    /// Run a three-replica cluster in this process and show the control log at work.
    Demo {
        /// Where the replicas keep their data (a fresh temporary directory by default).
        #[arg(long)]
        data: Option<PathBuf>,
        /// Run the replicas as three `ctrlog serve` processes configured by a `[job]` section,
        /// as a deployment does, instead of in this process.
        #[arg(long)]
        serve: bool,
    },
    /// Certificates for TLS.
    Certs {
        #[command(subcommand)]
        action: CertsCmd,
    },
    /// Tokens files (`[auth] tokens_file`).
    Tokens {
        #[command(subcommand)]
        action: TokensCmd,
    },
}

#[derive(Subcommand)]
enum TokensCmd {
    /// Print FILE with every plaintext token replaced by a salted hash
    /// (`sha256:SALT:DIGEST ROLE`); replicas accept both forms. Keep the plaintext tokens of
    /// containers a process launcher starts: a hash cannot be handed to them.
    Hash { file: PathBuf },
}

#[derive(Subcommand)]
enum CertsCmd {
    /// A CA plus a certificate per replica (`node-<id>`) and per client, for a test or a small
    /// deployment.
    Generate {
        /// The directory to write into (created if missing).
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
        /// How long the replica and client certificates are valid; the CA lives ten times as
        /// long (at least ten years), so they can be renewed under it.
        #[arg(long, default_value_t = 365)]
        days: i64,
        /// Replace an existing CA in --out (every certificate it signed stops being trusted).
        #[arg(long)]
        force: bool,
        #[command(flatten)]
        output: OutputFlags,
    },
    /// One more certificate under the CA in --dir (its ca.pem and ca-key.pem): a replica's
    /// (`--node N`, named node-N plus --hosts) or a client's (`--client NAME`).
    #[command(group(clap::ArgGroup::new("leaf").required(true).args(["node", "client"])))]
    Issue {
        /// The folder holding the CA (as `certs generate --out` wrote it); the leaf is
        /// written there.
        #[arg(long)]
        dir: PathBuf,
        /// A replica's certificate, for this id.
        #[arg(long)]
        node: Option<u64>,
        /// A client's certificate, for this name.
        #[arg(long)]
        client: Option<String>,
        /// Host names and IP addresses the replica is dialled at (a replica's only).
        #[arg(long, value_delimiter = ',', default_value = "127.0.0.1,localhost")]
        hosts: Vec<String>,
        /// How long it is valid; refused if it would outlive the CA.
        #[arg(long, default_value_t = 365)]
        days: i64,
        #[command(flatten)]
        output: OutputFlags,
    },
    /// Fresh keys and certificates, with the same names, for the leaves in --dir, under the
    /// CA there (the CA is unchanged, so everything that trusts it trusts them). Replicas
    /// read their files at start: replace each replica's files, then restart it.
    Renew {
        /// The folder holding the CA and the leaves (as `certs generate --out` wrote it).
        #[arg(long)]
        dir: PathBuf,
        /// The leaves to renew (`node-2`, `client-ops`); every node-*.pem and client-*.pem
        /// in --dir when not given.
        #[arg(long, value_delimiter = ',')]
        only: Vec<String>,
        /// How long the new certificates are valid; refused if they would outlive the CA.
        #[arg(long, default_value_t = 30)]
        days: i64,
        #[command(flatten)]
        output: OutputFlags,
    },
}

impl Cli {
    /// The command line of this process, parsed; or the exit code after saying why not (2,
    /// or clap's own for `--help` and `--version`).
    pub fn from_command_line() -> Result<Cli, ExitCode> {
        let matches = <Cli as clap::CommandFactory>::command().get_matches();
        let refused = refuse_token_on_the_command_line(&matches)
            .and_then(|()| refuse_a_bench_cluster_not_named(&matches));
        if let Err(error) = refused {
            eprintln!("ctrlog: {error}");
            return Err(ExitCode::from(2));
        }
        let mut cli = match <Cli as clap::FromArgMatches>::from_arg_matches(&matches) {
            Ok(cli) => cli,
            Err(error) => error.exit(),
        };
        if let Err(error) = place_client_flags(&mut cli) {
            eprintln!("ctrlog: {error}");
            return Err(ExitCode::from(2));
        }
        Ok(cli)
    }

    /// The async runtime's worker threads, where the subcommand wants other than tokio's
    /// default of one per core.
    pub fn worker_threads(&self) -> Option<usize> {
        match &self.command {
            Cmd::Bench { args, client } => args.worker_threads(client),
            _ => None,
        }
    }

    /// The log filter when `RUST_LOG` sets none.
    pub fn default_log_filter(&self) -> &'static str {
        match self.command {
            // The demo kills a leader on purpose; its story is the timeline, not the
            // replicas' logs.
            Cmd::Demo { .. } => "error,openraft=off,tarpc=off",
            // Faults are the point: show them, not every replica's complaint about them.
            Cmd::Chaos { .. } => "error,ctrlog::tools::chaos=info,openraft=off,tarpc=off",
            // tarpc opens an info-level span per request; formatting its fields cost the
            // bench client about a tenth of its CPU (perf), so tarpc speaks only of problems.
            _ => "info,openraft=warn,tarpc=warn",
        }
    }

    /// Runs the subcommand, and says what failed on stderr; the exit code as
    /// [`EXIT_CODES`] lists them.
    pub async fn run(self) -> ExitCode {
        match run(self).await {
            Ok(()) => ExitCode::SUCCESS,
            // `ctrlog tail | head` closing the pipe is not an error.
            Err(error) if is_broken_pipe(&error) => ExitCode::SUCCESS,
            Err(error) => {
                eprintln!("ctrlog: {}", describe(&error));
                ExitCode::from(exit_code(&error))
            }
        }
    }
}

async fn run(cli: Cli) -> anyhow::Result<()> {
    // Not locked for the whole command: the demo prints from several tasks.
    let mut out = std::io::stdout();
    match cli.command {
        Cmd::Serve(serve) => crate::server::serve(serve.load()?, shutdown_signal()).await?,
        Cmd::ForceNewCluster(serve) => {
            let config = serve.load()?;
            let forced = crate::server::force_new_cluster(&config).with_context(|| {
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
        Cmd::Append { args, client } => args.run(&client, &mut out).await?,
        Cmd::Tail { args, client } => args.run(&client, &mut out).await?,
        Cmd::Status {
            all_replicas,
            output,
            client,
        } => admin::status(all_replicas, output, &client, &mut out).await?,
        Cmd::State {
            consistent,
            output,
            client,
        } => admin::state(consistent, output, &client, &mut out).await?,
        Cmd::Snapshot {
            action,
            output,
            client,
        } => admin::snapshot(action, output, &client, &mut out).await?,
        Cmd::Vocabulary {
            command,
            output,
            client,
        } => admin::vocabulary(command, output, &client, &mut out).await?,
        Cmd::Broadcast {
            command,
            output,
            client,
        } => admin::broadcast(command, output, &client, &mut out).await?,
        Cmd::Members {
            command,
            output,
            client,
        } => admin::members(command, output, &client, &mut out).await?,
        Cmd::Container { args, client } => args.run(&client).await?,
        // Interrupted, the future is dropped, and with it the cluster the command started:
        // its replicas are killed and its folder removed, rather than left running.
        Cmd::Bench { args, client } => tokio::select! {
            done = bench::bench(args, &client, &mut out) => done?,
            () = shutdown_signal() => return Err(Interrupted.into()),
        },
        Cmd::Chaos(args) => tokio::select! {
            done = chaos::chaos(args, &mut out) => done?,
            () = shutdown_signal() => return Err(Interrupted.into()),
        },
        Cmd::Demo { data, serve } => crate::tools::demo::run(data, serve).await?,
        Cmd::Check { data, output } => {
            let report = crate::raft::storage::check::check_data_dir(&data)
                .with_context(|| format!("checking {}", data.display()))?;
            output.print(
                &mut out,
                crate::tools::admin::render::check_text(&report),
                || serde_json::json!(report),
            )?;
            if !report.faults.is_empty() {
                return Err(FaultsFound(report.faults.len()).into());
            }
        }
        Cmd::Certs {
            action:
                CertsCmd::Generate {
                    out: dir,
                    nodes,
                    hosts,
                    clients,
                    days,
                    force,
                    output,
                },
        } => {
            let written =
                crate::tools::certs::generate(&dir, &nodes, &hosts, &clients, days, force)?;
            print_written(&mut out, &output, &written)?;
        }
        Cmd::Certs {
            action:
                CertsCmd::Issue {
                    dir,
                    node,
                    client,
                    hosts,
                    days,
                    output,
                },
        } => {
            use crate::tools::certs::Leaf;
            let leaf = match (node, client) {
                (Some(id), _) => Leaf::Node(id),
                (None, Some(name)) => Leaf::Client(name),
                (None, None) => unreachable!("clap requires one of them"),
            };
            let written = crate::tools::certs::issue(&dir, &leaf, &hosts, days)?;
            print_written(&mut out, &output, &[written])?;
        }
        Cmd::Certs {
            action:
                CertsCmd::Renew {
                    dir,
                    only,
                    days,
                    output,
                },
        } => {
            let only = (only.iter())
                .map(|name| crate::tools::certs::Leaf::parse(name))
                .collect::<anyhow::Result<Vec<_>>>()?;
            let written = crate::tools::certs::renew(&dir, &only, days)?;
            print_written(&mut out, &output, &written)?;
        }
        Cmd::Tokens {
            action: TokensCmd::Hash { file },
        } => {
            let text = std::fs::read_to_string(&file)
                .with_context(|| format!("reading {}", file.display()))?;
            write!(
                out,
                "{}",
                crate::server::ports::auth::hash_tokens_file(&text)
            )?;
        }
    }
    Ok(())
}

/// `ctrlog check` found this many faults (exit code 6).
#[derive(Debug, thiserror::Error)]
#[error("{0} fault(s) found")]
struct FaultsFound(usize);

/// Prints the files a `certs` subcommand wrote, one per line (`{"written": [...]}` in JSON).
fn print_written(
    out: &mut dyn Write,
    output: &OutputFlags,
    written: &[PathBuf],
) -> std::io::Result<()> {
    let written: Vec<String> = written.iter().map(|p| p.display().to_string()).collect();
    output.print(
        out,
        written.join("\n"),
        || serde_json::json!({ "written": written }),
    )
}

/// The exit code for `error`, as [`EXIT_CODES`] lists them.
fn exit_code(error: &anyhow::Error) -> u8 {
    use crate::client::{ApiError, ClientError};
    if error.downcast_ref::<FaultsFound>().is_some() {
        return 6;
    }
    if error.downcast_ref::<Interrupted>().is_some() {
        return 130;
    }
    match error.downcast_ref::<ClientError>() {
        Some(ClientError::Config { .. }) => 2,
        Some(ClientError::GaveUp { .. }) => 3,
        Some(ClientError::Tls { .. }) | Some(ClientError::Api(ApiError::Unauthorized(_))) => 5,
        Some(ClientError::Api(ApiError::Forbidden { .. })) => 7,
        Some(ClientError::Api(_)) => 4,
        _ => 1,
    }
}

fn is_broken_pipe(error: &anyhow::Error) -> bool {
    error
        .downcast_ref::<std::io::Error>()
        .is_some_and(|e| e.kind() == std::io::ErrorKind::BrokenPipe)
}

/// Refuses a token typed on the command line (`--token`, before or after the subcommand):
/// every user of the machine reads it through `ps`. The environment (`CTRLOG_TOKEN`) and a
/// file (`--token-file`) serve instead.
fn refuse_token_on_the_command_line(matches: &clap::ArgMatches) -> Result<(), String> {
    // `try_get_raw` first: a subcommand without client flags has no `token` to ask about.
    let typed = |matches: &clap::ArgMatches| {
        matches.try_get_raw("token").is_ok_and(|raw| raw.is_some())
            && matches.value_source("token") == Some(clap::parser::ValueSource::CommandLine)
    };
    let mut level = Some(matches);
    while let Some(matches) = level {
        if typed(matches) {
            return Err(
                "--token puts the token where every user of this machine can read it \
                        (`ps`): put it in a file for --token-file, or in CTRLOG_TOKEN"
                    .into(),
            );
        }
        level = matches.subcommand().map(|(_, sub)| sub);
    }
    Ok(())
}

/// Refuses a `bench append` or `fanout` whose cluster came from `CTRLOG_CLUSTER` only: the variable is set for
/// day-to-day commands against a real job, and a bench sends it thousands of commands its
/// containers would receive. A cluster to benchmark is named with `--cluster`; without one,
/// `bench` starts a cluster of its own.
fn refuse_a_bench_cluster_not_named(matches: &clap::ArgMatches) -> Result<(), String> {
    use clap::parser::ValueSource;
    let workload = (matches.subcommand_matches("bench")).and_then(|bench| bench.subcommand_name());
    if !matches!(workload, Some("append" | "fanout")) {
        return Ok(());
    }
    let source = |matches: &clap::ArgMatches| {
        (matches
            .try_get_raw("cluster")
            .is_ok_and(|raw| raw.is_some()))
        .then(|| matches.value_source("cluster"))
        .flatten()
    };
    let mut sources = Vec::new();
    let mut level = Some(matches);
    while let Some(matches) = level {
        sources.extend(source(matches));
        level = matches.subcommand().map(|(_, sub)| sub);
    }
    match (
        sources.contains(&ValueSource::EnvVariable),
        sources.contains(&ValueSource::CommandLine),
    ) {
        (true, false) => Err(
            "bench would load the cluster CTRLOG_CLUSTER names, and its job's containers would \
             receive every command: name a cluster to benchmark with --cluster, or unset \
             CTRLOG_CLUSTER to benchmark a cluster bench starts itself"
                .into(),
        ),
        _ => Ok(()),
    }
}

/// `error` and its causes, each said once: a cause whose text the message already holds
/// (`#[error("storage: {0}")]` over its source) is not repeated after it, as `{:#}` would.
fn describe(error: &anyhow::Error) -> String {
    let mut text = error.to_string();
    for cause in error.chain().skip(1) {
        let cause = cause.to_string();
        if !text.contains(&cause) {
            text.push_str(": ");
            text.push_str(&cause);
        }
    }
    text
}
