//! The files a tool drives a job of `ctrlog container` processes through, and reads the
//! containers' own words from: the inputs file the controller watches, the lag file every
//! task reports, the containers' report file (what each believes it runs, for
//! [`double_runs`](crate::tools::chaos::checker::double_runs)) and their log folder. `ctrlog demo` and
//! `ctrlog chaos` share them.

use std::path::{Path, PathBuf};

use anyhow::Context;

use crate::server::{JobConfig, LauncherConfig};
use crate::tools::chaos::checker::{read_reports, TaskEvent};

/// The files of one job, under one folder.
pub struct JobFiles {
    /// One `system/stream/partition` per line; the controller re-reads it when it changes.
    pub inputs: PathBuf,
    /// The lag every running task reports (one number).
    pub lag: PathBuf,
    /// What the containers say they run, one JSON [`TaskEvent`] per line.
    pub reports: PathBuf,
    /// Each container's output, `{id}.log`.
    pub logs: PathBuf,
}

impl JobFiles {
    /// Creates the files under `dir` with the inputs `kafka/events/{partitions}` and no lag.
    pub fn create(dir: &Path, partitions: std::ops::Range<u32>) -> anyhow::Result<JobFiles> {
        let files = JobFiles {
            inputs: dir.join("inputs.txt"),
            lag: dir.join("lag.txt"),
            reports: dir.join("container-reports.jsonl"),
            logs: dir.join("container-logs"),
        };
        std::fs::create_dir_all(&files.logs)?;
        files.set_inputs(partitions)?;
        files.set_lag(0)?;
        Ok(files)
    }

    /// Lets processes of other users (replicas each under a uid of their own, and the
    /// containers they launch) read the inputs and lag and write the reports and logs.
    pub fn open_to_every_user(&self) -> anyhow::Result<()> {
        use std::os::unix::fs::PermissionsExt;
        let mode = |path: &Path, mode| {
            std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))
                .with_context(|| format!("opening {} to every user", path.display()))
        };
        if let Some(dir) = self.inputs.parent() {
            mode(dir, 0o755)?;
        }
        std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.reports)?;
        mode(&self.reports, 0o666)?;
        // Sticky, as /tmp: each replica's user may create its containers' logs, and none may
        // replace another's (`job.launcher.log_dir` refuses a folder others may write
        // without it).
        mode(&self.logs, 0o1777)
    }

    /// Rewrites the inputs as an operator would, atomically: `kafka/events/{partitions}`.
    pub fn set_inputs(&self, partitions: std::ops::Range<u32>) -> anyhow::Result<()> {
        let mut text: String = partitions.map(|p| format!("kafka/events/{p}\n")).collect();
        if text.is_empty() {
            text = format!("{}\n", crate::controller::NO_INPUTS);
        }
        let next = self.inputs.with_extension("next");
        std::fs::write(&next, text).context("writing the inputs file")?;
        std::fs::rename(&next, &self.inputs).context("replacing the inputs file")
    }

    /// Sets the lag every running task reports.
    pub fn set_lag(&self, lag: u64) -> anyhow::Result<()> {
        std::fs::write(&self.lag, lag.to_string()).context("writing the lag file")
    }

    /// How the containers run: fast heartbeats, a lease well inside the session timeout of
    /// [`JobFiles::job`], a stop that takes a moment (so that moves are seen in flight), and
    /// these files.
    pub fn container_args(&self) -> Vec<String> {
        [
            "--heartbeat-ms",
            "200",
            "--lease-ms",
            "1500",
            "--stop-delay-ms",
            "300",
            "--lag-file",
            &self.lag.display().to_string(),
            "--report-file",
            &self.reports.display().to_string(),
        ]
        .map(String::from)
        .to_vec()
    }

    /// A job of seconds: a short tick and session timeout, between `min` and `max` containers,
    /// out above 1,000 lag per container and in below 100.
    pub fn job(&self, min: u32, max: u32, launcher: LauncherConfig) -> JobConfig {
        JobConfig {
            inputs_file: Some(self.inputs.clone()),
            tick_ms: 50,
            session_timeout_ms: 3000,
            scaling: crate::server::ScalingConfig {
                min,
                max,
                scale_out_lag: 1_000,
                scale_in_lag: 100,
                cooldown_ms: 1_000,
            },
            launcher,
            ..JobConfig::default()
        }
    }

    /// The process launcher that runs this executable's `ctrlog container` with
    /// [`container_args`](Self::container_args), on the cluster the replica names.
    pub fn process_launcher(&self) -> anyhow::Result<LauncherConfig> {
        let exe = std::env::current_exe().context("finding this executable")?;
        let mut command = vec![
            exe.display().to_string(),
            "container".into(),
            "--id".into(),
            "{id}".into(),
            "--cluster".into(),
            "{cluster}".into(),
        ];
        command.extend(self.container_args());
        Ok(LauncherConfig::Process {
            command,
            log_dir: Some(self.logs.clone()),
            run_as_user: None,
            run_as_user_range: None,
            run_as_group: None,
            pass_env: Vec::new(),
        })
    }

    /// Writes `job` as the replicas' shared TOML file at `path`: only the `[job]` section
    /// (identity and addresses are each replica's flags).
    pub fn write_serve_config(path: &Path, job: JobConfig) -> anyhow::Result<()> {
        #[derive(serde::Serialize)]
        struct ServeFile {
            job: JobConfig,
        }
        std::fs::write(path, toml::to_string(&ServeFile { job })?)
            .with_context(|| format!("writing {}", path.display()))
    }

    /// What the containers reported so far.
    pub fn reports(&self) -> anyhow::Result<Vec<TaskEvent>> {
        read_reports(&self.reports).map_err(anyhow::Error::msg)
    }
}
