//! `ctrlog chaos` and `ctrlog container`: their arguments, the call each makes, and the chaos
//! figures as text for people.

use std::io::Write;
use std::path::PathBuf;
use std::time::Duration;

use serde_json::Value;

use super::container::{run_simulated_container, SimOptions};
use super::{ChaosOptions, FaultFamily};
use crate::log::ContainerId;
use crate::tools::admin::{shutdown_signal, ClientFlags, OutputFlags};

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

/// `ctrlog chaos`: runs the fault schedule and prints its figures.
pub async fn chaos(args: ChaosArgs, out: &mut impl Write) -> anyhow::Result<()> {
    let seed = args.seed.unwrap_or_else(super::seed_from_clock);
    eprintln!("chaos: seed {seed} ({} rounds)", args.rounds);
    let figures = super::run(ChaosOptions {
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
        writeln!(out, "{}", chaos_text(&figures))?;
    }
    Ok(())
}

#[derive(clap::Args)]
pub struct ContainerArgs {
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
}

impl ContainerArgs {
    /// `ctrlog container`: runs a simulated container until Ctrl-C or SIGTERM.
    pub async fn run(self, flags: &ClientFlags) -> anyhow::Result<()> {
        let args = self;
        let options = SimOptions {
            heartbeat_interval: Duration::from_millis(args.heartbeat_ms),
            lease: Duration::from_millis(args.lease_ms),
            lag_file: args.lag_file,
            report_file: args.report_file,
            stop_delay: Duration::from_millis(args.stop_delay_ms),
            client: flags.options()?,
            claimed_lag: Default::default(),
        };
        let id = ContainerId::new(args.id)?;
        let seeds = flags.seeds()?.to_vec();
        run_simulated_container(seeds, id, options, shutdown_signal()).await?;
        Ok(())
    }
}

/// `ctrlog chaos` figures for people.
pub fn chaos_text(figures: &Value) -> String {
    let counts = |object: &Value, render: &dyn Fn(&str, &Value) -> String| {
        object
            .as_object()
            .map(|o| {
                o.iter()
                    .map(|(k, v)| render(k, v))
                    .collect::<Vec<_>>()
                    .join(", ")
            })
            .unwrap_or_default()
    };
    let quantiles = |q: &Value| {
        format!(
            "p50 {} ms, p99 {} ms, max {} ms ({})",
            q["p50"], q["p99"], q["max"], q["count"]
        )
    };
    format!(
        "chaos seed {seed}: {rounds} rounds ({faults})\n\
         acknowledged appends {acked} (log reached offset {last}); lost {lost}; duplicated {dup}; violations {v}\n\
         log ids holding different entries {forks} (of {compared} WAL entries compared); tasks run twice {double}\n\
         power losses in the window {in_window}; back on the peer port {back}\n\
         failover (fault → first commit under a new leader): {all}\n  {kinds}\n\
         subscribers caught up {catch} ms after the load stopped",
        seed = figures["seed"],
        rounds = figures["rounds"],
        faults = counts(&figures["faults"], &|k, v| format!("{v} {k}")),
        acked = figures["acked_appends"],
        last = figures["committed_offsets"],
        lost = figures["lost"],
        dup = figures["duplicates"],
        v = figures["violations"],
        forks = figures["forked_log_ids"],
        compared = figures["log_entries_compared"],
        double = figures["double_runs"],
        in_window = figures["power_losses_in_window"],
        back = quantiles(&figures["power_loss_back_ms"]),
        all = quantiles(&figures["failover_all_ms"]),
        kinds = counts(&figures["failover_ms"], &|k, q| format!("{k}: {}", quantiles(q))),
        catch = figures["subscriber_catch_up_ms"],
    )
}
