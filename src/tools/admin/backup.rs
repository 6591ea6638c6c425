//! `ctrlog snapshot save` and `snapshot restore`: a backup of the job state, taken through a
//! linearizable read, and a new cluster seeded from it (etcdctl's `snapshot save` and
//! `snapshot restore`).
//!
//! A backup file is `CTRLOGBK`, the file format's version (u16, little-endian), the body's
//! length (u64), the body (the log's codec: the offset, when and by which build it was taken,
//! the job state and its refusals), then the SHA-256 of everything before it. A file that is
//! truncated, altered or of an unknown version is refused by name before anything is written.

use std::collections::BTreeMap;
use std::path::Path;

use anyhow::Context;
use serde::{Deserialize, Serialize};

use crate::client::ControlClient;
use crate::log::{decode, encode, Offset};
use crate::raft::restore::{seed_from_state, Seeded};
use crate::wire::{ClusterId, Member, StateAt};
use crate::NodeId;

/// The first bytes of every backup file.
const MAGIC: &[u8; 8] = b"CTRLOGBK";

/// The backup file format this build writes and reads.
pub const BACKUP_FORMAT: u16 = 1;

/// The largest body read back: a job state is tens of MiB for a very large job.
const BODY_BYTES_MAX: u64 = 1 << 30;

/// What a backup file holds.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Backup {
    /// When it was taken, by the clock of the machine that took it (ms since the epoch).
    pub taken_at_ms: u64,
    /// The build that took it (`ctrlog 0.2.0`).
    pub build: String,
    /// The job state as of a linearizable read: every write acknowledged before the backup
    /// began is in it.
    pub state: StateAt,
}

impl Backup {
    /// The offset the backup is as of.
    pub fn offset(&self) -> Offset {
        self.state.offset
    }
}

/// Takes a backup through `client` (a read index at the leader, then the state as of it from
/// any replica) and writes it to `path`, durably: a temporary file, synced, renamed over.
pub async fn save(client: &ControlClient, path: &Path) -> anyhow::Result<Backup> {
    let state = client.consistent_state().await?;
    let backup = Backup {
        taken_at_ms: std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64),
        build: crate::wire::version::BUILD.to_string(),
        state,
    };
    let file = to_bytes(&backup, BACKUP_FORMAT);
    let folder = match path.parent() {
        Some(parent) if !parent.as_os_str().is_empty() => parent,
        _ => Path::new("."),
    };
    let name = (path.file_name())
        .with_context(|| format!("{} names no file", path.display()))?
        .to_string_lossy()
        .into_owned();
    crate::raft::storage::files::create_durably(folder, &name, |mut out| {
        std::io::Write::write_all(&mut out, &file)
    })
    .with_context(|| format!("writing {}", path.display()))?;
    Ok(backup)
}

/// A backup file's bytes, in format `format` (only tests write another than this build's).
fn to_bytes(backup: &Backup, format: u16) -> Vec<u8> {
    let body = encode(backup);
    let mut file = Vec::with_capacity(body.len() + 50);
    file.extend_from_slice(MAGIC);
    file.extend_from_slice(&format.to_le_bytes());
    file.extend_from_slice(&(body.len() as u64).to_le_bytes());
    file.extend_from_slice(&body);
    let digest = ring::digest::digest(&ring::digest::SHA256, &file);
    file.extend_from_slice(digest.as_ref());
    file
}

/// Why a backup file cannot be read.
#[derive(Debug, thiserror::Error)]
pub enum BackupError {
    #[error("{path} is not a ctrlog backup (it does not start with {MAGIC:?})")]
    NotABackup { path: String },
    #[error(
        "{path} is backup format {found}; this build reads format {BACKUP_FORMAT}: restore it \
         with the build that took it, or a newer one"
    )]
    Version { path: String, found: u16 },
    #[error("{path} is damaged: {reason}; nothing was restored")]
    Damaged { path: String, reason: String },
}

/// Reads and checks the backup at `path`: its checksum, format and body.
pub fn read(path: &Path) -> anyhow::Result<Backup> {
    let bytes = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
    let name = path.display().to_string();
    let damaged = |reason: String| BackupError::Damaged {
        path: name.clone(),
        reason,
    };
    if bytes.len() < MAGIC.len() || &bytes[..MAGIC.len()] != MAGIC {
        return Err(BackupError::NotABackup { path: name }.into());
    }
    let header = MAGIC.len() + 2 + 8;
    if bytes.len() < header + 32 {
        return Err(damaged(format!("{} bytes, shorter than any backup", bytes.len())).into());
    }
    let (content, checksum) = bytes.split_at(bytes.len() - 32);
    if ring::digest::digest(&ring::digest::SHA256, content).as_ref() != checksum {
        return Err(damaged("its checksum does not match its content".into()).into());
    }
    let found = u16::from_le_bytes([bytes[8], bytes[9]]);
    if found != BACKUP_FORMAT {
        return Err(BackupError::Version { path: name, found }.into());
    }
    let length = u64::from_le_bytes(bytes[10..18].try_into().expect("8 bytes"));
    let body = &content[header..];
    if length != body.len() as u64 {
        return Err(damaged(format!(
            "a body of {} bytes where {length} were written",
            body.len()
        ))
        .into());
    }
    decode(body, BODY_BYTES_MAX)
        .map_err(|e| damaged(format!("its body does not decode: {e}")).into())
}

/// The cluster id a restore of `backup` for `members` records: the same for every member
/// restored from the same backup with the same members, so that they recognise each other,
/// and another for another backup or membership.
pub fn restored_cluster_id(backup: &Backup, members: &BTreeMap<NodeId, Member>) -> ClusterId {
    let mut context = ring::digest::Context::new(&ring::digest::SHA256);
    context.update(b"ctrlog cluster restored from a backup");
    context.update(&encode(backup));
    context.update(&encode(members));
    let mut first = [0u8; 16];
    first.copy_from_slice(&context.finish().as_ref()[..16]);
    ClusterId(u128::from_le_bytes(first))
}

/// Restores the backup at `path` into the empty `data_dir` of replica `id` of a new cluster
/// of `members` ([`seed_from_state`]); run it for every member with the same file and
/// members, then start them.
pub async fn restore(
    path: &Path,
    data_dir: &Path,
    id: NodeId,
    members: BTreeMap<NodeId, Member>,
) -> anyhow::Result<(Backup, Seeded)> {
    let backup = read(path)?;
    let cluster = restored_cluster_id(&backup, &members);
    let seeded = seed_from_state(data_dir, id, members, &backup.state, cluster)
        .await
        .with_context(|| format!("restoring into {}", data_dir.display()))?;
    Ok((backup, seeded))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn backup() -> Backup {
        Backup {
            taken_at_ms: 1,
            build: "test".into(),
            state: StateAt {
                offset: 0,
                state: Default::default(),
                rejections: Default::default(),
            },
        }
    }

    /// Goal: a backup file reads back only whole and unaltered: each flipped byte, a cut at
    /// any length, another file and an unknown format are refused by name, never restored.
    #[test]
    fn a_backup_reads_back_only_whole_and_unaltered() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("b");
        let good = to_bytes(&backup(), BACKUP_FORMAT);
        std::fs::write(&path, &good).unwrap();
        assert_eq!(read(&path).unwrap().taken_at_ms, 1);
        let refused = |bytes: &[u8]| {
            std::fs::write(&path, bytes).unwrap();
            read(&path).unwrap_err().to_string()
        };
        for i in 0..good.len() {
            let mut flipped = good.clone();
            flipped[i] ^= 0x20;
            let why = refused(&flipped);
            assert!(
                why.contains("damaged") || why.contains("not a ctrlog backup"),
                "byte {i}: {why}"
            );
        }
        for len in 0..good.len() {
            let why = refused(&good[..len]);
            assert!(
                why.contains("damaged") || why.contains("not a ctrlog backup"),
                "{len}: {why}"
            );
        }
        let why = refused(&to_bytes(&backup(), BACKUP_FORMAT + 1));
        assert!(
            why.contains(&format!("format {}", BACKUP_FORMAT + 1)),
            "{why}"
        );
    }
}
