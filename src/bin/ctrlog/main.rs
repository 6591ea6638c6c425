//! The `ctrlog` binary: parses the command line, sets up logging and the async runtime, and
//! hands the subcommand to the library ([`ctrlog::tools::cli`]).

use std::process::ExitCode;

use ctrlog::tools::cli::{Cli, LogFormat};

// Serving a subscriber allocates and frees a buffer per entry on both sides of the wire, a
// million times a second at 1,000 subscribers; mimalloc's per-thread free lists cut the
// fan-out's delivery lag by about a fifth against glibc's malloc (BENCHMARKS.md).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> ExitCode {
    let cli = match Cli::from_command_line() {
        Ok(cli) => cli,
        Err(code) => return code,
    };
    let mut runtime = tokio::runtime::Builder::new_multi_thread();
    runtime.enable_all();
    if let Some(threads) = cli.worker_threads() {
        runtime.worker_threads(threads);
    }
    match runtime.build() {
        Ok(runtime) => runtime.block_on(async {
            log_to_stderr(&cli);
            cli.run().await
        }),
        Err(error) => {
            eprintln!("ctrlog: starting the async runtime: {error}");
            ExitCode::FAILURE
        }
    }
}

/// Log lines go to stderr, filtered by `RUST_LOG` or the subcommand's default.
fn log_to_stderr(cli: &Cli) {
    let logs = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| cli.default_log_filter().into()),
        )
        .with_writer(std::io::stderr);
    match cli.log_format {
        // Colours only on a terminal: a log file or a pipe gets no escape sequences.
        LogFormat::Text => logs
            .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
            .init(),
        LogFormat::Json => logs.json().init(),
    }
}
