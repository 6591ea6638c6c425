//! Starting and stopping containers. YARN or Kubernetes launchers are user implementations of
//! [`ContainerLauncher`]; [`ProcessLauncher`] runs containers as local processes (and
//! `tools::chaos::container::InProcessLauncher` runs simulated ones as tasks, for the demo and tests).

use std::collections::BTreeMap;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Child, Command as Process, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::jobs::{ContainerStatus, JobState};
use crate::log::ContainerId;

/// Starts and stops containers by name. A started container registers itself; the controller
/// watches the log for that, so `launch` only has to start it.
pub trait ContainerLauncher: Send + Sync {
    fn launch(&self, container: &ContainerId) -> Result<(), String>;
    /// Stops a container (gone already is fine).
    fn stop(&self, container: &ContainerId);
    /// Called at every controller tick on every replica, leading or not, with the applied
    /// JobState: stops what this launcher started that the log has ended since (deregistered,
    /// expired, or its launch cancelled). Leadership may have moved since the launch, and
    /// only the replica that started a process can stop it. Nothing by default.
    fn stop_ended(&self, _state: &JobState) {}
}

/// What one launch gets besides the container's name: values for `{placeholders}` in the
/// arguments (`{id}` is always the name), and environment variables.
#[derive(Clone, Debug, Default)]
pub struct LaunchSettings {
    pub placeholders: Vec<(&'static str, String)>,
    pub env: Vec<(String, String)>,
}

/// Computes a launch's settings when it happens (the membership, a credential), or refuses it.
pub type SettingsFn = Box<dyn Fn(&ContainerId) -> Result<LaunchSettings, String> + Send + Sync>;

/// The variables of the replica's environment every container gets: what a program needs to
/// run at all. Anything else is passed only when named (`pass_env`): a replica's environment
/// may hold its own secrets (`CTRLOG_TOKEN`, a cloud credential).
pub const PASSED_ENV: [&str; 4] = ["PATH", "LANG", "LC_ALL", "TZ"];

/// How long a stopped container has between SIGTERM and SIGKILL, to leave the job cleanly.
pub const STOP_GRACE: Duration = Duration::from_secs(5);

/// A process this launcher started.
struct Launched {
    child: Child,
    /// The uid it runs under when it was given one of a range of its own.
    uid: Option<u32>,
    /// Whether the JobState has shown the container (launching or registered): only then can
    /// its absence or end mean the log ended it, rather than that it has not registered yet.
    seen: bool,
}

/// Runs each container as a local process from a command template: `{id}` in any argument is
/// replaced by the container's name, and other placeholders by the [`SettingsFn`]'s values.
///
/// A stopped container gets SIGTERM, and SIGKILL after [`STOP_GRACE`] if it is still there.
/// Every process it started is killed when it is dropped, unless it was built
/// [`keep_running_on_drop`](Self::keep_running_on_drop).
pub struct ProcessLauncher {
    program: PathBuf,
    args: Vec<String>,
    /// Each container's stdout and stderr go to `{log_dir}/{id}.log` (mode 0600) when set.
    log_dir: Option<PathBuf>,
    /// The user and group ids the containers run as (the replica's own when unset).
    uid: Option<u32>,
    gid: Option<u32>,
    /// A range of uids, one per container (see [`run_each_as_one_of`](Self::run_each_as_one_of)).
    uids: Option<std::ops::Range<u32>>,
    /// Variables of the replica's environment passed on besides [`PASSED_ENV`].
    pass_env: Vec<String>,
    settings: Option<SettingsFn>,
    keep_running_on_drop: bool,
    children: Mutex<BTreeMap<ContainerId, Launched>>,
}

impl ProcessLauncher {
    pub fn new(
        program: impl Into<PathBuf>,
        args: Vec<String>,
        log_dir: Option<PathBuf>,
    ) -> ProcessLauncher {
        ProcessLauncher {
            program: program.into(),
            args,
            log_dir,
            uid: None,
            gid: None,
            uids: None,
            pass_env: Vec::new(),
            settings: None,
            keep_running_on_drop: false,
            children: Mutex::new(BTreeMap::new()),
        }
    }

    /// Runs the containers as user `uid` and group `gid` (each unset: the replica's), with no
    /// supplementary groups, so that they cannot read what only the replica's user may: its
    /// tokens file, its node key, its data directory. Switching needs root or `CAP_SETUID`
    /// and `CAP_SETGID`.
    pub fn run_as(mut self, uid: Option<u32>, gid: Option<u32>) -> ProcessLauncher {
        self.uid = uid;
        self.gid = gid;
        self
    }

    /// Runs each container under a uid of its own from `uids` (its group the same number,
    /// unless [`run_as`](Self::run_as) named one), as YARN's LinuxContainerExecutor and
    /// Kubernetes' per-pod users do: containers of one user can read each other's
    /// environment (`/proc/PID/environ`, `CTRLOG_TOKEN` with it) and signal each other;
    /// of different users, neither. A launch takes the lowest uid of the range that no
    /// process on the host runs under (a container of an earlier run of the replica may still
    /// hold one), and is refused when there is none.
    pub fn run_each_as_one_of(mut self, uids: std::ops::Range<u32>) -> ProcessLauncher {
        self.uids = Some(uids);
        self
    }

    /// The lowest uid of the range that neither a container launched here nor any process
    /// on the host runs under.
    fn free_uid(&self, uids: &std::ops::Range<u32>) -> Result<u32, String> {
        let taken: std::collections::BTreeSet<u32> = (self.lock().values())
            .filter_map(|launched| launched.uid)
            .chain(uids_running())
            .collect();
        uids.clone()
            .find(|uid| !taken.contains(uid))
            .ok_or_else(|| {
                format!(
                    "every uid of run_as_user_range ({}..{}) runs a process: widen it",
                    uids.start, uids.end
                )
            })
    }

    /// Passes these variables of the replica's environment on to the containers, besides
    /// `PASSED_ENV`; nothing else of it is passed.
    pub fn pass_env(mut self, names: Vec<String>) -> ProcessLauncher {
        self.pass_env = names;
        self
    }

    /// Gives every launch the settings `settings` computes for it at that moment.
    pub fn with_settings(mut self, settings: SettingsFn) -> ProcessLauncher {
        self.settings = Some(settings);
        self
    }

    /// Leaves the processes running when the launcher is dropped, each in a process group of
    /// its own, so that a Ctrl-C at the replica's terminal does not reach them either.
    /// Containers belong to the job, not to the replica that launched them: a replica's
    /// restart or crash must not stop its share of the job. Such a container leaves when the
    /// log ends it (the controller drains it on scale-in), as `ctrlog container` does.
    pub fn keep_running_on_drop(mut self) -> ProcessLauncher {
        self.keep_running_on_drop = true;
        self
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<ContainerId, Launched>> {
        self.children.lock().expect("never poisoned")
    }
}

/// The real uids of the processes running on this host (what `/proc` shows).
fn uids_running() -> Vec<u32> {
    let Ok(processes) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    (processes.flatten())
        .filter(|entry| {
            entry
                .file_name()
                .to_string_lossy()
                .bytes()
                .all(|b| b.is_ascii_digit())
        })
        .filter_map(|entry| {
            let status = std::fs::read_to_string(entry.path().join("status")).ok()?;
            let line = status.lines().find_map(|line| line.strip_prefix("Uid:"))?;
            line.split_whitespace().next()?.parse().ok()
        })
        .collect()
}

/// SIGTERM now, SIGKILL after the grace period if the process is still there; reaped either
/// way. Waits on a thread of its own, so that the controller's tick does not.
fn terminate(mut child: Child) {
    let pid = child.id() as libc::pid_t;
    // SAFETY: kill(2) on a child this launcher started and has not reaped yet, so the pid
    // still names it; no memory is involved.
    unsafe { libc::kill(pid, libc::SIGTERM) };
    std::thread::spawn(move || {
        let deadline = Instant::now() + STOP_GRACE;
        while Instant::now() < deadline {
            if let Ok(Some(_)) = child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = child.kill();
        let _ = child.wait();
    });
}

impl ContainerLauncher for ProcessLauncher {
    fn launch(&self, container: &ContainerId) -> Result<(), String> {
        let settings = match &self.settings {
            Some(settings) => settings(container)?,
            None => LaunchSettings::default(),
        };
        let args = self.args.iter().map(|arg| {
            let arg = arg.replace("{id}", container.as_str());
            settings
                .placeholders
                .iter()
                .fold(arg, |arg, (name, value)| {
                    arg.replace(&format!("{{{name}}}"), value)
                })
        });
        let mut command = Process::new(&self.program);
        let passed = (PASSED_ENV.iter().copied())
            .chain(self.pass_env.iter().map(String::as_str))
            .filter_map(|name| Some((name, std::env::var_os(name)?)));
        command
            .args(args)
            .env_clear()
            .envs(passed)
            .envs(settings.env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null());
        if self.keep_running_on_drop {
            CommandExt::process_group(&mut command, 0);
        }
        // std clears the supplementary groups when it switches the user as root.
        let own_uid = self
            .uids
            .as_ref()
            .map(|uids| self.free_uid(uids))
            .transpose()?;
        let uid = own_uid.or(self.uid);
        if let Some(uid) = uid {
            CommandExt::uid(&mut command, uid);
        }
        if let Some(gid) = self.gid.or(own_uid) {
            CommandExt::gid(&mut command, gid);
        }
        match &self.log_dir {
            Some(dir) => {
                // Readable by the replica's user only, whatever the umask: a container may log
                // what it was given.
                // Never through a link planted at its name (O_NOFOLLOW): the replica would
                // write, as root perhaps, wherever it points.
                let path = dir.join(format!("{container}.log"));
                let log = (std::fs::OpenOptions::new()
                    .write(true)
                    .create(true)
                    .truncate(true))
                .mode(0o600)
                .custom_flags(libc::O_NOFOLLOW)
                .open(&path)
                .map_err(|e| format!("opening {}: {e}", path.display()))?;
                // Nor into a file another user put there first (the folder may be shared,
                // with the sticky bit: `job.launcher.log_dir`).
                let owner = std::os::unix::fs::MetadataExt::uid(
                    &log.metadata().map_err(|e| e.to_string())?,
                );
                // SAFETY: geteuid(2) reads the process's effective user id; no memory is
                // involved.
                if owner != unsafe { libc::geteuid() } {
                    return Err(format!(
                        "{} belongs to user {owner}, not to this replica's: not writing to it",
                        path.display()
                    ));
                }
                // `mode` applies only to a file it creates: one left by an earlier launch
                // under the same name may be readable by others.
                (log.set_permissions(std::fs::Permissions::from_mode(0o600)))
                    .map_err(|e| e.to_string())?;
                let err = log.try_clone().map_err(|e| e.to_string())?;
                command.stdout(log).stderr(err);
            }
            None => {
                command.stdout(Stdio::null()).stderr(Stdio::null());
            }
        }
        let child = command.spawn().map_err(|e| match e.kind() {
            std::io::ErrorKind::PermissionDenied if uid.is_some() || self.gid.is_some() => {
                format!(
                    "starting {} as user {:?}, group {:?}: {e}: the replica needs root or \
                     CAP_SETUID and CAP_SETGID to switch",
                    self.program.display(),
                    uid,
                    self.gid.or(own_uid)
                )
            }
            _ => format!("starting {}: {e}", self.program.display()),
        })?;
        let launched = Launched {
            child,
            uid: own_uid,
            seen: false,
        };
        if let Some(replaced) = self.lock().insert(container.clone(), launched) {
            terminate(replaced.child);
        }
        Ok(())
    }

    fn stop(&self, container: &ContainerId) {
        if let Some(launched) = self.lock().remove(container) {
            terminate(launched.child);
        }
    }

    fn stop_ended(&self, state: &JobState) {
        let mut children = self.lock();
        let ended: Vec<ContainerId> = children
            .iter_mut()
            .filter_map(|(container, launched)| {
                let exited = matches!(launched.child.try_wait(), Ok(Some(_)));
                let status = state.containers().get(container).map(|r| &r.status);
                let in_log = matches!(
                    status,
                    Some(ContainerStatus::Live | ContainerStatus::Launching { .. })
                );
                launched.seen |= in_log;
                let ended_in_log = launched.seen && !in_log;
                (exited || ended_in_log).then(|| container.clone())
            })
            .collect();
        for container in ended {
            if let Some(launched) = children.remove(&container) {
                tracing::info!(%container, "stopping a container the log ended");
                terminate(launched.child);
            }
        }
    }
}

impl Drop for ProcessLauncher {
    fn drop(&mut self) {
        let children = std::mem::take(&mut *self.lock());
        if self.keep_running_on_drop {
            return; // the processes go on, reparented; see `keep_running_on_drop`
        }
        for (_, mut launched) in children {
            let _ = launched.child.kill();
            let _ = launched.child.wait();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::jobs::Outcome;
    use crate::log::{Command, DeregisterContainer, RegisterContainer};

    fn apply(state: &mut JobState, command: Command) {
        let target = command.default_target();
        let outcome = state.apply(None, &target, &command.into_frame(), 0);
        assert!(matches!(outcome, Outcome::Appended { .. }), "{outcome:?}");
    }

    /// The log at `path` once it ends with `END`, or as it is after 10 s.
    fn log_until_end(path: &std::path::Path) -> String {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let log = std::fs::read_to_string(path).unwrap_or_default();
            if log.ends_with("END\n") || Instant::now() > deadline {
                return log;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn alive(pid: u32) -> bool {
        // A reaped process's /proc entry is gone; a zombie's says state Z.
        std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .is_ok_and(|stat| !stat.split(") ").nth(1).is_some_and(|s| s.starts_with('Z')))
    }

    /// Goal: a replica stops the container process it started once the log ends that
    /// container, whether or not it leads, and not before: a launch the log has not shown
    /// yet is left alone. Steps: launch `sleep`; tick with a state that does not know it, then
    /// one where it registered, then one where it was deregistered.
    #[test]
    fn a_container_is_stopped_once_the_log_ends_it() {
        let launcher = ProcessLauncher::new("sleep", vec!["30".into()], None);
        let name = ContainerId::new("c-1").unwrap();
        launcher.launch(&name).unwrap();
        let pid = launcher.lock()[&name].child.id();
        let mut state = JobState::default();
        launcher.stop_ended(&state);
        assert!(alive(pid), "stopped before the log showed it");
        apply(
            &mut state,
            Command::RegisterContainer(RegisterContainer {
                container: name.clone(),
                location: String::new(),
            }),
        );
        launcher.stop_ended(&state);
        assert!(alive(pid), "stopped while live");
        let epoch = state.live_session(&name).unwrap().epoch;
        apply(
            &mut state,
            Command::DeregisterContainer(DeregisterContainer {
                container: name.clone(),
                epoch,
            }),
        );
        launcher.stop_ended(&state);
        assert!(launcher.lock().is_empty());
        let deadline = Instant::now() + Duration::from_secs(10);
        while alive(pid) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
        assert!(!alive(pid), "still running after its deregistration");
    }

    /// Goal (as root, as CI runs): a container run as another user gets EACCES on the
    /// replica's secrets (a tokens file and a node key, mode 0600 as the replica keeps them),
    /// finds nothing of the replica's environment but what every program needs and what it is
    /// given, and writes to a log file only the replica's user can read. Before, it ran as the
    /// replica's user with the replica's whole environment, and its log took the umask.
    #[test]
    fn a_container_run_as_another_user_cannot_read_the_replicas_secrets() {
        use std::os::unix::fs::PermissionsExt;
        // SAFETY: geteuid(2) reads the process's effective user id; no memory is involved.
        let root = unsafe { libc::geteuid() } == 0;
        assert!(root, "this test switches users: run it as root, as CI does");
        let dir = tempfile::tempdir().unwrap();
        let mode = |path: &std::path::Path, mode| {
            std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap()
        };
        mode(dir.path(), 0o755);
        let tokens = dir.path().join("tokens");
        std::fs::write(&tokens, "admin-secret-token admin\n").unwrap();
        let key = dir.path().join("node-1-key.pem");
        std::fs::write(&key, "-----BEGIN PRIVATE KEY-----\n").unwrap();
        for secret in [&tokens, &key] {
            mode(secret, 0o600);
        }
        let logs = dir.path().join("logs");
        std::fs::create_dir(&logs).unwrap();
        // A log an earlier launch of the name left, readable by others.
        std::fs::write(logs.join("c1.log"), "").unwrap();
        mode(&logs.join("c1.log"), 0o644);
        let script = format!(
            "cat {} {}; echo ENV; env; echo END",
            tokens.display(),
            key.display()
        );
        let launcher =
            ProcessLauncher::new("/bin/sh", vec!["-c".into(), script], Some(logs.clone()))
                .run_as(Some(65534), Some(65534))
                .with_settings(Box::new(|id| {
                    Ok(LaunchSettings {
                        placeholders: Vec::new(),
                        env: vec![("CTRLOG_TOKEN".into(), format!("token-of-{id}"))],
                    })
                }));
        launcher.launch(&ContainerId::new("c1").unwrap()).unwrap();
        let log_file = logs.join("c1.log");
        let log = log_until_end(&log_file);
        assert_eq!(log.matches("Permission denied").count(), 2, "{log}");
        assert!(
            !log.contains("admin-secret-token") && !log.contains("PRIVATE KEY"),
            "{log}"
        );
        let (_, env) = log.split_once("ENV\n").expect("the environment printed");
        let names: Vec<&str> = (env.lines())
            .filter_map(|line| line.split_once('=').map(|(name, _)| name))
            .collect();
        assert!(names.contains(&"CTRLOG_TOKEN"), "{names:?}");
        // What the shell sets for itself, beside what the launcher passed.
        let shells_own = ["PWD", "OLDPWD", "SHLVL", "_"];
        let unexpected: Vec<&&str> = (names.iter())
            .filter(|name| !PASSED_ENV.contains(name) && !shells_own.contains(name))
            .filter(|name| **name != "CTRLOG_TOKEN")
            .collect();
        assert!(
            unexpected.is_empty(),
            "the replica's environment leaked: {unexpected:?}"
        );
        assert!(env.contains("token-of-c1"), "{env}");
        let log_mode = std::fs::metadata(&log_file).unwrap().permissions().mode();
        assert_eq!(log_mode & 0o777, 0o600);
    }

    /// Goal (issue 59, as root, as CI runs): with a uid range each container runs as a user
    /// of its own, and cannot read another's environment, which holds its token. Steps: a
    /// container that sleeps with its token; a second that reads the first's
    /// `/proc/PID/environ`: permission denied, no token; both uids are of the range and
    /// differ; with the range used up, a third launch is refused by name. Before, every
    /// container ran as the one `run_as_user` and read the others' tokens.
    #[test]
    fn each_container_of_a_uid_range_has_a_user_of_its_own() {
        use std::os::unix::fs::MetadataExt;
        // SAFETY: geteuid(2) reads the process's effective user id; no memory is involved.
        let root = unsafe { libc::geteuid() } == 0;
        assert!(root, "this test switches users: run it as root, as CI does");
        let logs = tempfile::tempdir().unwrap();
        // Two uids no process on this host runs under, for this test alone.
        let first = (61_700..65_000)
            .step_by(2)
            .find(|uid| {
                !uids_running()
                    .iter()
                    .any(|running| [*uid, uid + 1].contains(running))
            })
            .unwrap();
        let sleeper = ProcessLauncher::new("sleep", vec!["30".into()], None)
            .run_each_as_one_of(first..first + 2)
            .with_settings(Box::new(|id| {
                Ok(LaunchSettings {
                    placeholders: Vec::new(),
                    env: vec![("CTRLOG_TOKEN".into(), format!("token-of-{id}"))],
                })
            }));
        sleeper.launch(&ContainerId::new("c1").unwrap()).unwrap();
        let pid = sleeper.lock()[&ContainerId::new("c1").unwrap()].child.id();
        let owner = std::fs::metadata(format!("/proc/{pid}")).unwrap().uid();
        assert_eq!(owner, first);
        let reader = ProcessLauncher::new(
            "/bin/sh",
            vec![
                "-c".into(),
                format!("cat /proc/{pid}/environ; echo; echo END"),
            ],
            Some(logs.path().to_path_buf()),
        )
        .run_each_as_one_of(first..first + 2);
        reader.launch(&ContainerId::new("c2").unwrap()).unwrap();
        let reader_pid = reader.lock()[&ContainerId::new("c2").unwrap()].child.id();
        let reader_uid = std::fs::metadata(format!("/proc/{reader_pid}")).map(|m| m.uid());
        let log_file = logs.path().join("c2.log");
        let log = log_until_end(&log_file);
        assert!(log.contains("Permission denied"), "{log}");
        assert!(!log.contains("token-of-c1"), "{log}");
        if let Ok(uid) = reader_uid {
            assert_eq!(uid, first + 1, "the next free uid of the range");
        }
        // The range is two wide; `sleep` holds one and, while `reader` lives, its
        // launcher's record the other: a third container finds none free.
        let third = ProcessLauncher::new("sleep", vec!["30".into()], None)
            .run_each_as_one_of(first..first + 1);
        let refused = third.launch(&ContainerId::new("c3").unwrap()).unwrap_err();
        assert!(refused.contains("run_as_user_range"), "{refused}");
    }

    #[test]
    fn placeholders_and_environment_reach_the_process() {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("out");
        let launcher = ProcessLauncher::new(
            "sh",
            vec![
                "-c".into(),
                format!("echo {{id}} {{cluster}} $CTRLOG_TOKEN > {}", out.display()),
            ],
            None,
        )
        .with_settings(Box::new(|id| {
            Ok(LaunchSettings {
                placeholders: vec![("cluster", "127.0.0.1:1,127.0.0.1:2".into())],
                env: vec![("CTRLOG_TOKEN".into(), format!("token-of-{id}"))],
            })
        }));
        launcher.launch(&ContainerId::new("c-7").unwrap()).unwrap();
        let deadline = Instant::now() + Duration::from_secs(10);
        let text = loop {
            let text = std::fs::read_to_string(&out).unwrap_or_default();
            if text.ends_with('\n') || Instant::now() > deadline {
                break text;
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        assert_eq!(text, "c-7 127.0.0.1:1,127.0.0.1:2 token-of-c-7\n");
    }
}
