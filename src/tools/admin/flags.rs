//! The flags every subcommand that talks to a cluster takes: how it connects
//! ([`ClientFlags`]) and how it prints ([`OutputFlags`]).

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use serde_json::Value;

use crate::client::{ClientError, ClientOptions, ControlClient};

/// The flags the client subcommands connect with: only those subcommands take them (a
/// `serve --ca ...` is refused by the parser instead of starting a plaintext replica), under
/// their own heading in `--help`, and after a nested subcommand too (`members list --cluster`).
#[derive(clap::Args, Clone, Debug)]
#[command(next_help_heading = "Connecting to the cluster")]
pub struct ClientFlags {
    /// Client addresses of any replicas of the cluster.
    #[arg(long, global = true, env = "CTRLOG_CLUSTER", value_delimiter = ',')]
    pub cluster: Vec<String>,
    /// Speak TLS to the cluster, trusting this CA (PEM).
    #[arg(long, global = true, env = "CTRLOG_CA")]
    pub ca: Option<PathBuf>,
    /// This client's certificate (PEM), where the cluster asks for one; with --key.
    #[arg(long, global = true, env = "CTRLOG_CERT", requires = "key")]
    pub cert: Option<PathBuf>,
    /// This client's private key (PEM); with --cert.
    #[arg(long, global = true, env = "CTRLOG_KEY", requires = "cert")]
    pub key: Option<PathBuf>,
    /// A bearer token, where the cluster requires credentials: from the environment only.
    /// Typed as `--token` it would be visible to every user of the machine through `ps`, so
    /// that spelling is refused (exit code 2), naming --token-file and CTRLOG_TOKEN.
    #[arg(
        long,
        global = true,
        env = "CTRLOG_TOKEN",
        hide = true,
        hide_env_values = true
    )]
    pub token: Option<String>,
    /// A file holding the bearer token (its first line), where the cluster requires
    /// credentials; or the token itself in CTRLOG_TOKEN.
    #[arg(
        long,
        global = true,
        env = "CTRLOG_TOKEN_FILE",
        conflicts_with = "token"
    )]
    pub token_file: Option<PathBuf>,
    /// How long dialling one replica may take (`2s`, `500ms`) before the next is tried.
    #[arg(long, global = true, value_parser = humantime::parse_duration, default_value = "2s")]
    pub dial_timeout: Duration,
    /// How long a command keeps trying (failover, other replicas) before it gives up
    /// (exit code 3).
    #[arg(long, global = true, value_parser = humantime::parse_duration, default_value = "10s")]
    pub command_timeout: Duration,
}

/// How a subcommand prints: `-o json` (or v0.1.0's `--json`) for scripts.
#[derive(clap::Args, Clone, Copy, Debug, Default)]
pub struct OutputFlags {
    /// `text` for people, `json` for scripts: one JSON object per line, whose field names
    /// stay stable across releases.
    #[arg(
        short = 'o',
        long = "output",
        global = true,
        value_enum,
        default_value_t = OutputFormat::Text
    )]
    pub output: OutputFormat,
    /// The same as `-o json` (the flag of v0.1.0).
    #[arg(long, global = true)]
    pub json: bool,
}

/// What [`OutputFlags`] asks for.
#[derive(clap::ValueEnum, Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum OutputFormat {
    #[default]
    Text,
    Json,
}

impl OutputFlags {
    /// Whether to print JSON.
    pub fn json(&self) -> bool {
        self.json || self.output == OutputFormat::Json
    }

    /// Prints one result: `json` as one line, or `text` (ended with a newline if it has none).
    pub fn print(
        &self,
        out: &mut dyn std::io::Write,
        text: impl std::fmt::Display,
        json: impl FnOnce() -> Value,
    ) -> std::io::Result<()> {
        if self.json() {
            return writeln!(out, "{}", json());
        }
        let text = text.to_string();
        if text.ends_with('\n') {
            write!(out, "{text}")
        } else {
            writeln!(out, "{text}")
        }
    }
}

impl ClientFlags {
    /// The client options the flags ask for (TLS, when `--ca` is given).
    pub fn options(&self) -> anyhow::Result<ClientOptions> {
        if self.ca.is_none() && self.cert.is_some() {
            // Half a TLS configuration would silently speak plaintext.
            anyhow::bail!(
                "--cert and --key need --ca (or CTRLOG_CA): the CA to check the cluster's \
                 certificates against"
            );
        }
        let tls = match &self.ca {
            Some(ca) => {
                let identity = self.cert.as_deref().zip(self.key.as_deref());
                Some(crate::wire::tls::client_config(ca, identity)?)
            }
            None => None,
        };
        let token = match &self.token_file {
            Some(path) => {
                let text = std::fs::read_to_string(path)
                    .with_context(|| format!("reading the token file {}", path.display()))?;
                let token = text.lines().next().unwrap_or("").trim().to_string();
                anyhow::ensure!(!token.is_empty(), "{} holds no token", path.display());
                warn_if_others_may_read(path);
                Some(token)
            }
            None => self.token.clone(),
        };
        let mut options = ClientOptions::new()
            .connect_timeout(self.dial_timeout)
            .retry_deadline(self.command_timeout)
            .request_timeout(self.command_timeout.min(crate::client::REQUEST_TIMEOUT));
        if let Some(tls) = tls {
            options = options.tls(tls);
        }
        if let Some(token) = token {
            options = options.token(token);
        }
        Ok(options)
    }

    /// The cluster's seeds, or an error saying how to give them.
    pub fn seeds(&self) -> Result<&[String], ClientError> {
        if self.cluster.is_empty() {
            return Err(ClientError::Config {
                option: "--cluster",
                reason: "no cluster given: use --cluster ADDR,ADDR,... or set CTRLOG_CLUSTER"
                    .into(),
            });
        }
        Ok(&self.cluster)
    }

    /// A client connected to the cluster the flags name.
    pub async fn connect(&self) -> anyhow::Result<ControlClient> {
        ControlClient::connect_with(self.seeds()?, self.options()?)
            .await
            .context("connecting to the cluster")
    }
}

/// Warns on standard error when users other than the file's owner may read the token file
/// `path` (its mode grants the group or others read): the token is as good as theirs.
fn warn_if_others_may_read(path: &std::path::Path) {
    use std::os::unix::fs::PermissionsExt;
    let Ok(metadata) = std::fs::metadata(path) else {
        return;
    };
    let mode = metadata.permissions().mode();
    if mode & 0o044 != 0 {
        eprintln!(
            "ctrlog: warning: the token file {} is readable by other users (mode {:o}): \
             chmod 600 it",
            path.display(),
            mode & 0o777
        );
    }
}
