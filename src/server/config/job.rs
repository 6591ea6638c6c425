//! The `[job]` section of a replica's configuration, and the `ctrlog serve` flags for its
//! common fields. A replica with the section runs the job's controller (`job.rs` builds it).
//!
//! The names are a contract with operators' files: `inputs` or `inputs_file`,
//! `session_timeout_ms`, `[job.scaling]` `min` and `max`, and `[job.launcher]` `kind`
//! (`process` with `command`, or `external`) keep their meaning in every later build.

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::controller::{ControllerConfig, WatchedFile};
use crate::jobs::plan::LagPolicy;
use crate::log::{ContainerId, Input};
use crate::server::config::error::{refuse, ConfigError};

/// The `[job]` section.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct JobConfig {
    /// The inputs, each `system/stream/partition`. Give this or `inputs_file`. Default none.
    pub inputs: Option<Vec<String>>,
    /// A file with one `system/stream/partition` per line (`#` starts a comment), re-read when
    /// it changes: a partition that appears is added and assigned at once. An edit that does
    /// not parse keeps the last good set. Default none.
    pub inputs_file: Option<PathBuf>,
    /// A container silent for longer is expired and its tasks reassigned. Containers stop
    /// work after their own lease (`ctrlog container --lease-ms`), which must be shorter.
    /// Default 6,000.
    pub session_timeout_ms: u64,
    /// How inputs group into tasks. Default `partition`.
    pub grouper: GrouperName,
    /// How often the controller re-plans. Default 100.
    pub tick_ms: u64,
    /// A launched container that has not registered within this is stopped and launched
    /// again, up to `launch_attempts` times (`process` launcher). Default 15,000.
    pub launch_timeout_ms: u64,
    /// Launches per container slot before the failure is reported and the slot given up.
    /// Default 3.
    pub launch_attempts: u32,
    /// Containers the controller launches are named `{container_prefix}-{n}`. Default
    /// `container`.
    pub container_prefix: String,
    /// `[job.scaling]`: how many containers, by the lag.
    pub scaling: ScalingConfig,
    /// `[job.launcher]`: who starts containers. Default `external`.
    pub launcher: LauncherConfig,
}

impl Default for JobConfig {
    fn default() -> Self {
        let controller = ControllerConfig::default();
        JobConfig {
            inputs: None,
            inputs_file: None,
            session_timeout_ms: controller.session_timeout.as_millis() as u64,
            grouper: GrouperName::Partition,
            tick_ms: controller.tick.as_millis() as u64,
            launch_timeout_ms: controller.launch_timeout.as_millis() as u64,
            launch_attempts: controller.launch_attempts,
            container_prefix: controller.container_prefix,
            scaling: ScalingConfig::default(),
            launcher: LauncherConfig::External {},
        }
    }
}

/// The groupers a configuration can name.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum GrouperName {
    /// Samza's default: task `partition-N` holds partition N of every input stream.
    Partition,
}

/// `[job.scaling]`: the lag policy ([`LagPolicy`]). One container is added while the lag per
/// container exceeds `scale_out_lag`, one drained while it is below `scale_in_lag`, within
/// `[min, max]`, at most once per `cooldown_ms`, which also starts over when a replica takes
/// the lead (the log says the count changed, not when).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ScalingConfig {
    /// The fewest containers. Default 1.
    pub min: u32,
    /// The most containers. Default 1.
    pub max: u32,
    /// One container more while the lag per container is above this. Default 10,000.
    pub scale_out_lag: u64,
    /// One container fewer while the lag per container is below this. Default 1,000.
    pub scale_in_lag: u64,
    /// At most one change per this long. Default 30,000.
    pub cooldown_ms: u64,
}

impl ScalingConfig {
    /// The policy this section describes.
    pub fn policy(&self) -> LagPolicy {
        LagPolicy::new(
            self.min,
            self.max,
            self.scale_out_lag,
            self.scale_in_lag,
            Duration::from_millis(self.cooldown_ms),
        )
    }
}

impl Default for ScalingConfig {
    fn default() -> Self {
        ScalingConfig {
            min: 1,
            max: 1,
            scale_out_lag: 10_000,
            scale_in_lag: 1_000,
            cooldown_ms: 30_000,
        }
    }
}

/// `[job.launcher]`: who starts containers.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "lowercase", deny_unknown_fields)]
pub enum LauncherConfig {
    /// The controller launches nothing: it publishes the desired count (in the log, in
    /// `ctrlog state`, as the `ctrlog_desired_containers` gauge) and an orchestrator starts
    /// containers that register themselves (`deploy/kubernetes/`).
    // A struct variant, so that a stray field (`command` left over) is refused.
    External {},
    /// The leader runs each container as a process on its host.
    Process {
        /// The program and its arguments. `{id}` becomes the container's name, `{cluster}` the
        /// members' client addresses (comma-separated), `{grpc}` the gRPC ports the leader
        /// knows of (its own, and those the members told it; empty without `[grpc]`) and
        /// `{ca}` the CA file of `[tls]`. The process also finds them in `CTRLOG_CLUSTER`,
        /// `CTRLOG_GRPC` and `CTRLOG_CA`, and, with `[auth]`, its own token in
        /// `CTRLOG_TOKEN`: the one the tokens file gives `container:<name>`.
        command: Vec<String>,
        /// Each container's output goes to `{log_dir}/{id}.log` (mode 0600); discarded when
        /// unset.
        log_dir: Option<PathBuf>,
        /// The user id the containers run as, so that they cannot read what the replica's
        /// user can (the tokens file, the node key, the data directory). The replica then
        /// needs root or `CAP_SETUID`. Unset: the replica's own user.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        run_as_user: Option<u32>,
        /// A uid of its own for each container instead of `run_as_user` (which it excludes):
        /// the lowest of `first` .. `first + count` that no process on the host runs under,
        /// its group the same number unless `run_as_group` names one. Containers of one user
        /// can read each other's environment (`/proc/PID/environ`, and the token with it);
        /// of different users, not. Needs root or `CAP_SETUID`. Unset: `run_as_user`.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        run_as_user_range: Option<UserRange>,
        /// The group id they run as, with no supplementary groups; unset: the same number as
        /// `run_as_user` (or the replica's group, without it).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        run_as_group: Option<u32>,
        /// Variables of the replica's environment a container gets besides `PATH`, `LANG`,
        /// `LC_ALL` and `TZ` (and the `CTRLOG_*` it is given): the rest of the replica's
        /// environment, which may hold its secrets, is not passed.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        pass_env: Vec<String>,
    },
}

/// A range of user ids, `first` .. `first + count`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UserRange {
    pub first: u32,
    pub count: u32,
}

impl UserRange {
    /// The uids, or `None` when the range is empty, holds root, or runs past the last uid.
    pub fn uids(&self) -> Option<std::ops::Range<u32>> {
        let end = self.first.checked_add(self.count)?;
        (self.first > 0 && self.count > 0).then_some(self.first..end)
    }
}

impl Default for LauncherConfig {
    fn default() -> Self {
        LauncherConfig::External {}
    }
}

/// The placeholders a process launcher's command may use.
const PLACEHOLDERS: [&str; 4] = ["id", "cluster", "grpc", "ca"];

impl JobConfig {
    /// Refuses a section that could not run a job, naming the field.
    pub fn validate(&self) -> Result<(), ConfigError> {
        match (&self.inputs, &self.inputs_file) {
            (Some(_), Some(_)) => refuse("job.inputs", "give inputs or inputs_file, not both")?,
            (None, None) => refuse(
                "job.inputs",
                "give inputs = [\"system/stream/partition\", ...] or inputs_file",
            )?,
            (Some(inputs), None) => {
                parse_inputs(inputs).map_err(|reason| ConfigError {
                    field: "job.inputs",
                    reason,
                })?;
            }
            (None, Some(path)) => {
                let text = std::fs::read_to_string(path)
                    .map_err(|e| format!("{}: {e}", path.display()))
                    .and_then(|text| {
                        WatchedFile::parse(&text).map_err(|e| format!("{}: {e}", path.display()))
                    });
                if let Err(reason) = text {
                    refuse("job.inputs_file", reason)?;
                }
            }
        }
        if self.session_timeout_ms < 1000 {
            refuse(
                "job.session_timeout_ms",
                "must be at least 1000: containers heartbeat several times within it, and it \
                 must outlast a leader's failover or every failover expires them",
            )?;
        }
        if self.tick_ms == 0 || self.tick_ms >= self.session_timeout_ms {
            refuse(
                "job.tick_ms",
                "must be at least 1 and below session_timeout_ms",
            )?;
        }
        if self.launch_timeout_ms < 1000 {
            refuse("job.launch_timeout_ms", "must be at least 1000")?;
        }
        if self.launch_attempts == 0 {
            refuse("job.launch_attempts", "must be at least 1")?;
        }
        if let Err(error) = ContainerId::new(format!("{}-1", self.container_prefix)) {
            refuse("job.container_prefix", error.to_string())?;
        }
        let scaling = &self.scaling;
        if scaling.min == 0 {
            refuse(
                "job.scaling.min",
                "must be at least 1: only running containers report the lag that scales out",
            )?;
        }
        if scaling.max < scaling.min {
            refuse("job.scaling.max", "must be at least min")?;
        }
        if scaling.scale_in_lag >= scaling.scale_out_lag {
            refuse(
                "job.scaling.scale_in_lag",
                "must be below scale_out_lag, or the job scales out and straight back in",
            )?;
        }
        if let LauncherConfig::Process {
            command,
            log_dir,
            run_as_user,
            run_as_user_range,
            ..
        } = &self.launcher
        {
            validate_command(command)?;
            if let Some(range) = run_as_user_range {
                let field = "job.launcher.run_as_user_range";
                if run_as_user.is_some() {
                    refuse(
                        field,
                        "excludes run_as_user: each container gets a uid of its own",
                    )?;
                }
                if range.uids().is_none() {
                    refuse(
                        field,
                        "must hold at least one uid above 0 and end below 2^32",
                    )?;
                }
            }
            if let Some(dir) = log_dir {
                check_log_dir(dir)?;
            }
        }
        Ok(())
    }

    /// The controller's timing and limits.
    pub fn controller_config(&self) -> ControllerConfig {
        ControllerConfig {
            tick: Duration::from_millis(self.tick_ms),
            session_timeout: Duration::from_millis(self.session_timeout_ms),
            launch_timeout: Duration::from_millis(self.launch_timeout_ms),
            launch_attempts: self.launch_attempts,
            container_prefix: self.container_prefix.clone(),
        }
    }
}

pub(crate) fn parse_inputs(inputs: &[String]) -> Result<BTreeSet<Input>, String> {
    inputs
        .iter()
        .map(|text| text.parse().map_err(|e| format!("{text:?}: {e}")))
        .collect()
}

fn validate_command(command: &[String]) -> Result<(), ConfigError> {
    let Some(program) = command.first() else {
        return refuse("job.launcher.command", "must name a program");
    };
    if program.contains('/') && !std::path::Path::new(program).is_file() {
        refuse(
            "job.launcher.command",
            format!("{program} is not a file (a name without a slash is looked up in PATH)"),
        )?;
    }
    if !command.iter().any(|arg| arg.contains("{id}")) {
        refuse(
            "job.launcher.command",
            "must pass the container its name, {id}: it registers under that name",
        )?;
    }
    for arg in command {
        let mut rest = arg.as_str();
        while let Some(open) = rest.find('{') {
            let Some(close) = rest[open..].find('}') else {
                break;
            };
            let name = &rest[open + 1..open + close];
            if !PLACEHOLDERS.contains(&name) {
                refuse(
                    "job.launcher.command",
                    format!(
                        "unknown placeholder {{{name}}}; known: {{id}}, {{cluster}}, {{grpc}}, \
                         {{ca}}"
                    ),
                )?;
            }
            rest = &rest[open + close + 1..];
        }
    }
    Ok(())
}

/// Refuses a `log_dir` that is not a directory (a link to one is not either), that a user
/// other than the replica's (or root) owns, or that others may write to without the sticky
/// bit: anyone who may rename or remove names in it could swap a link in where a container's
/// log is opened. (A file another user created there first is refused at launch.)
fn check_log_dir(dir: &std::path::Path) -> Result<(), ConfigError> {
    use std::os::unix::fs::MetadataExt;
    let field = "job.launcher.log_dir";
    let metadata = match std::fs::symlink_metadata(dir) {
        Ok(metadata) if metadata.is_dir() => metadata,
        Ok(_) => return refuse(field, format!("{} is not a directory", dir.display())),
        Err(e) => return refuse(field, format!("{}: {e}", dir.display())),
    };
    // SAFETY: geteuid(2) reads the process's effective user id; no memory is involved.
    let me = unsafe { libc::geteuid() };
    if ![me, 0].contains(&metadata.uid()) {
        return refuse(
            field,
            format!(
                "{} is owned by user {}, neither the replica's user {me} nor root",
                dir.display(),
                metadata.uid()
            ),
        );
    }
    let sticky = metadata.mode() & 0o1000 != 0;
    if metadata.mode() & 0o022 != 0 && !sticky {
        return refuse(
            field,
            format!(
                "{} may be written by other users (mode {:o}): chmod go-w it (or +t, as /tmp)",
                dir.display(),
                metadata.mode() & 0o7777
            ),
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Goal (issue 59): a container log folder is a real directory of the replica's user (or
    /// root) that others cannot write, or can only with the sticky bit; a link to a folder,
    /// a file, and a folder open to all without the sticky bit are refused by name.
    #[test]
    fn a_log_dir_is_a_folder_no_one_else_can_swap_names_in() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let folder = dir.path().join("logs");
        std::fs::create_dir(&folder).unwrap();
        let mode = |mode| {
            std::fs::set_permissions(&folder, std::fs::Permissions::from_mode(mode)).unwrap()
        };
        for (bits, allowed) in [(0o700, true), (0o755, true), (0o1777, true), (0o777, false)] {
            mode(bits);
            assert_eq!(check_log_dir(&folder).is_ok(), allowed, "mode {bits:o}");
        }
        let link = dir.path().join("link");
        std::os::unix::fs::symlink(&folder, &link).unwrap();
        let file = dir.path().join("file");
        std::fs::write(&file, "").unwrap();
        for refused in [link, file] {
            let error = check_log_dir(&refused).unwrap_err().to_string();
            assert!(error.contains("not a directory"), "{error}");
        }
    }

    fn job(text: &str) -> Result<JobConfig, String> {
        let job: JobConfig = toml::from_str(text).map_err(|e| e.to_string())?;
        job.validate().map_err(|e| e.field.to_string())?;
        Ok(job)
    }

    #[test]
    fn the_fixed_names_parse() {
        let job = job(r#"
            inputs = ["kafka/events/0", "kafka/events/1"]
            session_timeout_ms = 4000
            [scaling]
            min = 2
            max = 5
            scale_out_lag = 500
            scale_in_lag = 50
            [launcher]
            kind = "process"
            command = ["ctrlog", "container", "--id", "{id}", "--cluster", "{cluster}"]
        "#)
        .unwrap();
        assert_eq!(job.scaling.max, 5);
        assert!(matches!(job.launcher, LauncherConfig::Process { .. }));
        let external = self::job("inputs = []\n[launcher]\nkind = \"external\"").unwrap();
        assert_eq!(external.launcher, LauncherConfig::External {});
    }

    /// Each bad section is refused by the field at fault.
    #[test]
    fn errors_name_the_field() {
        let cases = [
            ("session_timeout_ms = 100", "job.inputs"),
            ("inputs = [\"kafka/events/x\"]", "job.inputs"),
            ("inputs = []\ninputs_file = \"/x\"", "job.inputs"),
            ("inputs_file = \"/nonexistent/inputs\"", "job.inputs_file"),
            ("inputs = []\nsession_timeout_ms = 100", "job.session_timeout_ms"),
            ("inputs = []\n[scaling]\nmin = 3\nmax = 2", "job.scaling.max"),
            ("inputs = []\n[scaling]\nmin = 0", "job.scaling.min"),
            (
                "inputs = []\n[scaling]\nscale_out_lag = 5\nscale_in_lag = 5",
                "job.scaling.scale_in_lag",
            ),
            (
                "inputs = []\n[launcher]\nkind = \"process\"\ncommand = []",
                "job.launcher.command",
            ),
            (
                "inputs = []\n[launcher]\nkind = \"process\"\ncommand = [\"ctrlog\", \"container\"]",
                "job.launcher.command",
            ),
            (
                "inputs = []\n[launcher]\nkind = \"process\"\ncommand = [\"x\", \"{id}\", \"{tokn}\"]",
                "job.launcher.command",
            ),
            ("inputs = []\ncontainer_prefix = \"a b\"", "job.container_prefix"),
        ];
        for (text, field) in cases {
            assert_eq!(job(text).unwrap_err(), field, "{text}");
        }
        // Unknown names and kinds are parse errors that name them.
        let unknown = job("inputs = []\n[launcher]\nkind = \"yarn\"").unwrap_err();
        assert!(unknown.contains("yarn"), "{unknown}");
        let typo = job("inputs = []\n[scaling]\nmaximum = 3").unwrap_err();
        assert!(typo.contains("maximum"), "{typo}");
        let extra =
            job("inputs = []\n[launcher]\nkind = \"external\"\ncommand = [\"x\"]").unwrap_err();
        assert!(extra.contains("command"), "{extra}");
    }
}
