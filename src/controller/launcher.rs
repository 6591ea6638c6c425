//! Starting and stopping containers. YARN or Kubernetes launchers are user implementations of
//! [`ContainerLauncher`]; [`ProcessLauncher`] runs containers as local processes (and
//! `tools::container::InProcessLauncher` runs simulated ones as tasks, for the demo and tests).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::{Child, Command as Process, Stdio};
use std::sync::Mutex;

use crate::log::ContainerId;

/// Starts and stops containers by name. A started container registers itself; the controller
/// watches the log for that, so `launch` only has to start it.
pub trait ContainerLauncher: Send + Sync {
    fn launch(&self, container: &ContainerId) -> Result<(), String>;
    /// Stops a container (gone already is fine).
    fn stop(&self, container: &ContainerId);
}

/// Runs each container as a local process from a command template: `{id}` in any argument is
/// replaced by the container's name. Every process it started is killed when it is dropped.
pub struct ProcessLauncher {
    program: PathBuf,
    args: Vec<String>,
    /// Each container's stdout and stderr go to `{log_dir}/{id}.log` when set.
    log_dir: Option<PathBuf>,
    children: Mutex<BTreeMap<ContainerId, Child>>,
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
            children: Mutex::new(BTreeMap::new()),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<ContainerId, Child>> {
        self.children.lock().expect("never poisoned")
    }
}

impl ContainerLauncher for ProcessLauncher {
    fn launch(&self, container: &ContainerId) -> Result<(), String> {
        let args = self
            .args
            .iter()
            .map(|a| a.replace("{id}", container.as_str()));
        let mut command = Process::new(&self.program);
        command.args(args).stdin(Stdio::null());
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
        self.lock().insert(container.clone(), child);
        Ok(())
    }

    fn stop(&self, container: &ContainerId) {
        if let Some(mut child) = self.lock().remove(container) {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for ProcessLauncher {
    fn drop(&mut self) {
        for (_, mut child) in std::mem::take(&mut *self.lock()) {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}
