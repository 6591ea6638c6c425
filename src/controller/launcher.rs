//! Starting and stopping containers. YARN or Kubernetes launchers are user implementations of
//! [`ContainerLauncher`]; [`ProcessLauncher`] runs containers as local processes (and
//! `tools::container::InProcessLauncher` runs simulated ones as tasks, for the demo and tests).

use std::collections::BTreeMap;
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

/// How long a stopped container has between SIGTERM and SIGKILL, to leave the job cleanly.
pub const STOP_GRACE: Duration = Duration::from_secs(5);

/// A process this launcher started.
struct Launched {
    child: Child,
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
    /// Each container's stdout and stderr go to `{log_dir}/{id}.log` when set.
    log_dir: Option<PathBuf>,
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
            settings: None,
            keep_running_on_drop: false,
            children: Mutex::new(BTreeMap::new()),
        }
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
        command
            .args(args)
            .envs(settings.env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null());
        if self.keep_running_on_drop {
            std::os::unix::process::CommandExt::process_group(&mut command, 0);
        }
        match &self.log_dir {
            Some(dir) => {
                let log = std::fs::File::create(dir.join(format!("{container}.log")))
                    .map_err(|e| e.to_string())?;
                let err = log.try_clone().map_err(|e| e.to_string())?;
                command.stdout(log).stderr(err);
            }
            None => {
                command.stdout(Stdio::null()).stderr(Stdio::null());
            }
        }
        let child = command
            .spawn()
            .map_err(|e| format!("starting {}: {e}", self.program.display()))?;
        let launched = Launched { child, seen: false };
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
    use crate::log::{Command, DeregisterContainer, RegisterContainer, Target};

    fn apply(state: &mut JobState, command: Command) {
        let target = command.target().unwrap_or(Target::All);
        let outcome = state.apply(None, &target, &command.into_frame(), 0);
        assert!(matches!(outcome, Outcome::Appended { .. }), "{outcome:?}");
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
