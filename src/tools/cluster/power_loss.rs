//! Power loss on real replica processes, for `ctrlog chaos`.
//!
//! A SIGKILL loses nothing a process wrote: the page cache outlives it. A power loss may lose
//! everything written after the last completed `fdatasync`. To emulate one, each replica runs
//! with a small C library preloaded (`power_loss_shim.c`, compiled here with the machine's C
//! compiler) that notes how much of each WAL segment every sync covered and, on request,
//! stalls the syncs. A power loss is then: [`stall`](PowerLoss::stall) the replica's syncs (it
//! goes on writing, and a leader acknowledges its own appends early, as it does), SIGKILL it,
//! and [`lose_unsynced`](PowerLoss::lose_unsynced): cut each segment back to its last synced
//! size (`raft::storage::wal::faults::lose_unsynced`), before it starts again.
//!
//! The emulation covers the WAL only: sled's files (the vote, the snapshots' metadata) and the
//! snapshot files are synced and kept as written. A truncation the replica did not get to sync
//! is kept too (the disk may keep it); the emulation only ever drops a suffix of what was
//! written, which a real disk may do.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::Context;

use crate::raft::storage::data_dir::log_dir;
use crate::raft::storage::wal::faults::{lose_unsynced, segment_sizes};
use crate::tools::cluster::process::{SpawnHook, Spawning};

const SHIM_SOURCE: &str = include_str!("power_loss_shim.c");

/// The shim's environment variable: the folder it reads `stall` from and writes `synced` to.
const CONTROL_DIR_VAR: &str = "CTRLOG_POWER_LOSS_DIR";

/// The compiled shim and one control folder per replica, in a temporary folder.
pub struct PowerLoss {
    dir: tempfile::TempDir,
    library: PathBuf,
}

impl PowerLoss {
    /// Compiles the shim with `$CC` (default `cc`).
    pub fn build() -> anyhow::Result<Arc<PowerLoss>> {
        let dir = tempfile::Builder::new()
            .prefix("ctrlog-power-loss-")
            .tempdir()?;
        // Replicas under uids of their own must load the library and reach their folders.
        set_mode(dir.path(), 0o711)?;
        let source = dir.path().join("power_loss_shim.c");
        std::fs::write(&source, SHIM_SOURCE)?;
        let library = dir.path().join("libctrlog_power_loss.so");
        let compiler = std::env::var("CC").unwrap_or_else(|_| "cc".into());
        let output = std::process::Command::new(&compiler)
            .args(["-shared", "-fPIC", "-O2", "-Wall", "-o"])
            .arg(&library)
            .arg(&source)
            .arg("-ldl")
            .output()
            .with_context(|| format!("running the C compiler `{compiler}`"))?;
        anyhow::ensure!(
            output.status.success(),
            "compiling the power-loss shim with `{compiler}` failed: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        set_mode(&library, 0o755)?;
        Ok(Arc::new(PowerLoss { dir, library }))
    }

    fn control_dir(&self, replica: usize) -> PathBuf {
        self.dir.path().join(format!("replica-{}", replica + 1))
    }

    /// Loads the shim into every replica the cluster starts, with a fresh record of what is
    /// durable: the WAL as it lies on disk before the process starts.
    pub fn spawn_hook(self: &Arc<Self>) -> SpawnHook {
        let power = self.clone();
        Box::new(move |spawning: &Spawning<'_>, process| {
            let control = power.control_dir(spawning.index);
            std::fs::create_dir_all(&control)?;
            let _ = std::fs::remove_file(control.join("stall"));
            let _ = std::fs::remove_file(control.join("synced"));
            let wal = log_dir(spawning.data_dir);
            let on_disk = match wal.is_dir() {
                true => segment_sizes(&wal)?,
                false => BTreeMap::new(),
            };
            std::fs::write(control.join("baseline"), format_sizes(&on_disk))?;
            if let Some(uid) = spawning.uid {
                std::os::unix::fs::chown(&control, Some(uid), Some(uid))?;
            }
            process
                .env("LD_PRELOAD", &power.library)
                .env(CONTROL_DIR_VAR, &control);
            Ok(())
        })
    }

    /// From now on, replica `replica`'s WAL syncs block before they start.
    pub fn stall(&self, replica: usize) -> anyhow::Result<()> {
        let control = self.control_dir(replica);
        anyhow::ensure!(
            control.join("synced").exists(),
            "replica {} has synced nothing through the power-loss shim: it was not preloaded",
            replica + 1
        );
        std::fs::write(control.join("stall"), b"")?;
        Ok(())
    }

    /// The power loss itself, on replica `replica`, which must be stopped: cuts its WAL back
    /// to what its syncs covered. Returns the bytes dropped.
    pub fn lose_unsynced(&self, replica: usize, data_dir: &Path) -> anyhow::Result<u64> {
        let control = self.control_dir(replica);
        // What the process found on disk, then what each of its syncs covered, later lines
        // superseding earlier ones for the same segment.
        let mut durable = parse_sizes(&std::fs::read_to_string(control.join("baseline"))?)?;
        if let Ok(synced) = std::fs::read_to_string(control.join("synced")) {
            durable.extend(parse_sizes(&synced)?);
        }
        let wal = log_dir(data_dir);
        lose_unsynced(&wal, &durable)
            .with_context(|| format!("cutting {} back to what was synced", wal.display()))
    }
}

fn set_mode(path: &Path, mode: u32) -> std::io::Result<()> {
    std::fs::set_permissions(path, std::os::unix::fs::PermissionsExt::from_mode(mode))
}

/// `SIZE NAME` lines, as the shim writes them.
fn format_sizes(sizes: &BTreeMap<String, u64>) -> String {
    sizes
        .iter()
        .map(|(name, size)| format!("{size} {name}\n"))
        .collect()
}

fn parse_sizes(text: &str) -> anyhow::Result<BTreeMap<String, u64>> {
    text.lines()
        .map(|line| {
            let (size, name) = line
                .split_once(' ')
                .with_context(|| format!("a line of the power-loss shim's record: {line:?}"))?;
            Ok((name.to_string(), size.parse()?))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn later_lines_supersede_earlier_ones() {
        let sizes = parse_sizes("10 a.wal\n20 b.wal\n30 a.wal\n").unwrap();
        assert_eq!(sizes["a.wal"], 30);
        assert_eq!(sizes["b.wal"], 20);
        assert_eq!(parse_sizes(&format_sizes(&sizes)).unwrap(), sizes);
    }
}
