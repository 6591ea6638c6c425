//! A replica's data directory: sled (metadata and snapshots) in `meta/`, the WAL in `log/`,
//! and the directory's format version in `format`.
//!
//! The layout is spelled here once, for a replica's start and for disaster recovery alike.
//!
//! The format version covers everything under the directory: sled's trees and their key and
//! value encodings, and the WAL's segment and record layout. A change to any of them that an
//! older build would misread is a new format, written only by a build that reads every older
//! one; a build refuses a directory of a newer format than it knows, naming both, rather than
//! misread it (a downgrade is refused, not attempted). As Kafka's `meta.properties`, the file
//! is plain text: `format = N`, then (format 2) `node_id = N`, the replica whose log and vote
//! the directory holds, recorded by the first start that names it ([`claim`]): a replica
//! started as another node on it is refused, as it would stand for election with another
//! node's log and vote. And (format 2) `cluster_id = X`, the cluster the replica belongs to
//! ([`ClusterIdentity`]): drawn by the founder before it initialises a new cluster, and
//! adopted by every other replica from the first peer that introduces itself with one, before
//! that peer's first Raft request; two replicas that record different clusters refuse each
//! other's peer connections.
//!
//! Formats: 1, v0.1.0's layout (no `format` file, or one saying `format = 1`); 2, the same
//! layout with the node id and cluster id recorded. A format-1 directory is recorded as
//! format 2 by the first start of this build, which trusts its `--id` that once: nothing in it
//! names the node. A cluster that v0.1.0 initialised has no cluster id, and its replicas are
//! not checked against other clusters, until its vocabulary level is raised to
//! `LEVEL_CLUSTER_ID_DERIVED`: every replica derives the same id from the raising entry
//! ([`ClusterIdentity::derived`]). Nothing is drawn for a replica that holds state: two of a
//! cluster's replicas drawing apart would split it. v0.1.0 reads no `format` file, so it
//! still opens a format-2 directory.

use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::fault::FaultKind;
use super::files::{create_durably, sync_dir};
use super::log_store::{Flushing, LogStore};
use super::meta_store::{Closed, MetaStore, SledRefused};
use super::snapshots::{
    set_aside_damaged_snapshot, DamagedSnapshot, SnapshotStore, StoredSnapshot,
};
use super::two_copies::{self, CopiesFound, VOTE};
use super::wal::{new_damaged_folder, DAMAGED_DIR, SYNCED_MARK_FILE};
use crate::raft::types::Vote;
use crate::wire::ClusterId;
use crate::NodeId;

/// Where a replica keeps sled (metadata and snapshots) inside its data directory.
pub fn meta_dir(data_dir: &Path) -> PathBuf {
    data_dir.join("meta")
}

/// Where a replica keeps the WAL (the Raft log) inside its data directory.
pub fn log_dir(data_dir: &Path) -> PathBuf {
    data_dir.join("log")
}

/// The data directory format this build writes, and the newest it opens. Format 1 is the
/// layout of v0.1.0, which wrote no `format` file: a directory without one is format 1.
pub const DATA_FORMAT: u32 = 2;

/// What a data directory's `format` file records.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Recorded {
    pub format: u32,
    /// The replica whose directory it is; `None` until a replica started on it (format 1
    /// never records one).
    pub node_id: Option<NodeId>,
    /// The cluster it belongs to; `None` until its founder drew one or a peer introduced
    /// one ([`ClusterIdentity`]).
    pub cluster_id: Option<ClusterId>,
}

/// The file in a data directory that names its format.
pub const FORMAT_FILE: &str = "format";

/// Why a data directory's format cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum FormatError {
    /// Written by a newer build: this one would misread it.
    #[error(
        "{path} is data directory format {found}, written by a newer ctrlog; this build reads \
         formats 1 to {DATA_FORMAT}. Downgrading is refused: run a build that knows format \
         {found}, or restore a backup taken before the upgrade"
    )]
    Newer { path: String, found: u32 },
    /// The file does not say `format = N` with a format some build wrote: damaged, or not
    /// ctrlog's. Nothing is guessed: a newer build's directory read as this one's would be
    /// misread.
    #[error(
        "{path} does not name a data directory format (`format = N`): {reason}. If the file \
         was damaged and the build that last ran this replica reads format {DATA_FORMAT}, \
         write `format = {DATA_FORMAT}` into it; the rest of the directory is checked at start"
    )]
    Unreadable { path: String, reason: String },
    /// Another replica's directory.
    #[error(
        "{path} records that this data directory is replica {recorded}'s, and this replica was \
         started as --id {given}: a directory's log and vote are its replica's own, and another \
         node standing for election with them could elect two leaders. Start replica \
         {recorded} on it, or give replica {given} its own directory"
    )]
    OtherNode {
        path: String,
        recorded: NodeId,
        given: NodeId,
    },
}

fn invalid(error: FormatError) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, error)
}

/// Checks the format of `data_dir` and records it if the directory has no `format` file yet
/// (a new directory, or one v0.1.0 wrote). Returns the format found.
pub fn check_format(data_dir: &Path) -> io::Result<u32> {
    match recorded_in(data_dir)? {
        Some(recorded) => Ok(recorded.format),
        None => {
            std::fs::create_dir_all(data_dir)?;
            write_recorded(data_dir, None, None)?;
            Ok(DATA_FORMAT)
        }
    }
}

/// Claims `data_dir` for replica `id`: refused if it records another node; otherwise `id` is
/// recorded (format 2) unless it already is. Before anything else in the directory is opened.
pub fn claim(data_dir: &Path, id: NodeId) -> io::Result<()> {
    match recorded_in(data_dir)? {
        Some(Recorded {
            node_id: Some(recorded),
            ..
        }) if recorded == id => Ok(()),
        Some(Recorded {
            node_id: Some(recorded),
            ..
        }) => Err(invalid(FormatError::OtherNode {
            path: data_dir.join(FORMAT_FILE).display().to_string(),
            recorded,
            given: id,
        })),
        // New, v0.1.0's (no file), format 1, or not yet claimed.
        recorded => {
            std::fs::create_dir_all(data_dir)?;
            let cluster_id = recorded.and_then(|r| r.cluster_id);
            write_recorded(data_dir, Some(id), cluster_id)
        }
    }
}

/// The format `data_dir`'s `format` file names (`None`: it has none, as a new directory or
/// v0.1.0's), read without changing anything; one this build cannot use is an
/// [`io::ErrorKind::InvalidData`] error holding a [`FormatError`].
pub fn format_of(data_dir: &Path) -> io::Result<Option<u32>> {
    Ok(recorded_in(data_dir)?.map(|recorded| recorded.format))
}

/// What `data_dir`'s `format` file records, as [`format_of`] reads it.
pub fn recorded_in(data_dir: &Path) -> io::Result<Option<Recorded>> {
    let path = data_dir.join(FORMAT_FILE);
    match std::fs::read(&path) {
        Ok(bytes) => {
            let text = String::from_utf8(bytes).map_err(|_| "it is not UTF-8 text".to_string());
            let recorded = text
                .and_then(|text| parse_recorded(&text))
                .map_err(|reason| {
                    invalid(FormatError::Unreadable {
                        path: path.display().to_string(),
                        reason,
                    })
                })?;
            if recorded.format > DATA_FORMAT {
                return Err(invalid(FormatError::Newer {
                    path: path.display().to_string(),
                    found: recorded.format,
                }));
            }
            Ok(Some(recorded))
        }
        Err(error) if error.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(error) => Err(error),
    }
}

/// The lines that are not comments: first `format = N`, then, from format 2, `node_id = N`
/// and `cluster_id = X`, each at most once. Anything else is refused rather than skipped: a
/// rotted key must not leave the directory unclaimed. Format 0 was never written: a flip of a
/// digit gives it, so it is refused rather than read as an older format.
fn parse_recorded(text: &str) -> Result<Recorded, String> {
    let mut lines = text
        .lines()
        .map(str::trim)
        .filter(|line| !line.is_empty() && !line.starts_with('#'));
    let format = match parse_key(lines.next().ok_or("it is empty")?, "format")? {
        0 => return Err("`format = 0`: no build writes format 0".into()),
        format => format as u32,
    };
    let mut recorded = Recorded {
        format,
        node_id: None,
        cluster_id: None,
    };
    for line in lines {
        if format < 2 {
            return Err(format!("`{line}`: format {format} records nothing else"));
        }
        let (key, value) = (line.split_once('='))
            .map(|(key, value)| (key.trim(), value.trim()))
            .ok_or_else(|| format!("`{line}`: not `key = value`"))?;
        match key {
            "node_id" if recorded.node_id.is_none() => {
                recorded.node_id = Some(value.parse().map_err(|e| format!("`{line}`: {e}"))?)
            }
            "cluster_id" if recorded.cluster_id.is_none() => {
                recorded.cluster_id = Some(value.parse()?)
            }
            _ => return Err(format!("`{line}`: not a key this build knows, or repeated")),
        }
    }
    Ok(recorded)
}

/// The value of `line` when it says `key = N`.
fn parse_key(line: &str, key: &str) -> Result<u64, String> {
    let value = line
        .strip_prefix(key)
        .and_then(|rest| rest.trim_start().strip_prefix('='))
        .ok_or_else(|| format!("`{line}`"))?;
    let value = value.trim().parse().map_err(|e| format!("`{line}`: {e}"))?;
    if key == "format" && value > u32::MAX as u64 {
        return Err(format!("`{line}`: no such format"));
    }
    Ok(value)
}

/// Writes the `format` file (this build's format, and what is known of whose it is) durably:
/// a temporary file, synced, renamed over, and the directory synced, so that a crash leaves
/// the old file or the new one.
fn write_recorded(
    data_dir: &Path,
    node_id: Option<NodeId>,
    cluster_id: Option<ClusterId>,
) -> io::Result<()> {
    use std::io::Write as _;
    create_durably(data_dir, FORMAT_FILE, |mut file| {
        writeln!(
            file,
            "# The layout of this ctrlog data directory (meta/, log/), and whose it is. Do not \
             edit.\nformat = {DATA_FORMAT}"
        )?;
        if let Some(id) = node_id {
            writeln!(file, "node_id = {id}")?;
        }
        if let Some(id) = cluster_id {
            writeln!(file, "cluster_id = {id}")?;
        }
        Ok(())
    })
    .map(drop)
}

/// The cluster a replica's directory belongs to, as its `format` file records it, shared by
/// the replica's peer port (which adopts a caller's) and its peer clients (which compare).
///
/// Invariant: every replica that holds any of a cluster's Raft state (a vote, an entry, a
/// snapshot) and was initialised or joined by this build records that cluster's id, and
/// no other. The founder draws and records the id before it initialises Raft
/// ([`found`](Self::found)); a replica without one records a caller's before it answers the
/// caller's first Raft request ([`meet`](Self::meet)), and by induction every caller that
/// sends Raft requests in such a cluster has the id. A caller never takes a server's: a
/// replica of another cluster would take it too.
pub struct ClusterIdentity {
    data_dir: PathBuf,
    recorded: std::sync::Mutex<Option<ClusterId>>,
    /// When each peer of another cluster was last warned about.
    warned: std::sync::Mutex<std::collections::BTreeMap<String, std::time::Instant>>,
}

/// How two replicas' clusters compare when one introduces itself to the other.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Meeting {
    /// Both belong to the same cluster, or one (or both) of them to none yet.
    Same,
    /// The directories belong to different clusters: `ours`, `theirs`.
    Other { ours: ClusterId, theirs: ClusterId },
}

/// How often a peer of another cluster is warned about.
const OTHER_CLUSTER_WARNING_INTERVAL: std::time::Duration = std::time::Duration::from_secs(60);

impl ClusterIdentity {
    /// What `data_dir`'s `format` file records (opened already: [`claim`]).
    pub fn load(data_dir: &Path) -> io::Result<ClusterIdentity> {
        let recorded = recorded_in(data_dir)?.and_then(|r| r.cluster_id);
        Ok(ClusterIdentity {
            data_dir: data_dir.to_path_buf(),
            recorded: std::sync::Mutex::new(recorded),
            warned: Default::default(),
        })
    }

    /// The cluster recorded, if any.
    pub fn known(&self) -> Option<ClusterId> {
        *self.recorded.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The founder's draw: a new random id, recorded durably, unless one is recorded (a
    /// founder restarted before its initialisation finished keeps its first draw). Only for a
    /// replica whose Raft holds no state.
    pub fn found(&self) -> io::Result<ClusterId> {
        self.adopt_unless_known(ClusterId(rand::random()))
    }

    /// The id the log derived for a cluster initialised without one (the raise of the
    /// vocabulary level to `LEVEL_CLUSTER_ID_DERIVED`), recorded unless this replica records
    /// one: a cluster that has an id keeps it.
    pub fn derived(&self, id: ClusterId) -> io::Result<()> {
        if let Some(known) = self.known() {
            tracing::debug!(cluster = %known, derived = %id, "the cluster has an id: the level raise derives none");
            return Ok(());
        }
        let recorded = self.adopt_unless_known(id)?;
        tracing::info!(cluster = %recorded, "the log gave this cluster its id, {recorded}; recorded in the data directory");
        Ok(())
    }

    /// The id of a cluster seeded from a backup (`restore::seed_from_state`), which every
    /// member's restore derives alike; recorded unless one is.
    pub fn restored(&self, id: ClusterId) -> io::Result<ClusterId> {
        self.adopt_unless_known(id)
    }

    /// A caller that says it belongs to `theirs` meets this replica, which answers its Raft
    /// requests: a replica that records no cluster adopts the caller's (durably, before it
    /// answers), and one that records another is [`Meeting::Other`].
    pub fn meet(&self, theirs: Option<ClusterId>) -> io::Result<Meeting> {
        match (self.known(), theirs) {
            (Some(ours), Some(theirs)) if ours != theirs => Ok(Meeting::Other { ours, theirs }),
            (None, Some(theirs)) => {
                let ours = self.adopt_unless_known(theirs)?;
                if ours != theirs {
                    return Ok(Meeting::Other { ours, theirs });
                }
                tracing::info!(cluster = %theirs, "joined cluster {theirs}, recorded in the data directory");
                Ok(Meeting::Same)
            }
            _ => Ok(Meeting::Same),
        }
    }

    /// This replica, calling a peer that answers it belongs to `theirs`: compared, never
    /// adopted.
    pub fn compare(&self, theirs: Option<ClusterId>) -> Meeting {
        match (self.known(), theirs) {
            (Some(ours), Some(theirs)) if ours != theirs => Meeting::Other { ours, theirs },
            _ => Meeting::Same,
        }
    }

    /// Whether a meeting with `peer` (an address or a node) of another cluster is worth a
    /// warning: once a minute per peer, as it does not heal without an operator.
    pub fn warn_about(&self, peer: &str) -> bool {
        let now = std::time::Instant::now();
        let mut warned = self.warned.lock().unwrap_or_else(|e| e.into_inner());
        match warned.get(peer) {
            Some(at) if now.duration_since(*at) < OTHER_CLUSTER_WARNING_INTERVAL => false,
            _ => {
                warned.insert(peer.to_string(), now);
                true
            }
        }
    }

    /// Records `id` unless an id is recorded; returns the one recorded after.
    fn adopt_unless_known(&self, id: ClusterId) -> io::Result<ClusterId> {
        let mut recorded = self.recorded.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(known) = *recorded {
            return Ok(known);
        }
        let node_id = recorded_in(&self.data_dir)?.and_then(|r| r.node_id);
        write_recorded(&self.data_dir, node_id, Some(id))?;
        *recorded = Some(id);
        Ok(id)
    }
}

/// Opens the metadata and the log (the WAL) of the replica whose data is in `data_dir`, for
/// disaster recovery, which keeps everything the replica holds: sled refusing its files is an
/// error here, left to the operator (a replica's start sets them aside, [`open`]).
pub fn open_log(data_dir: &Path) -> io::Result<(Arc<MetaStore>, LogStore)> {
    check_format(data_dir)?;
    let meta = Arc::new(MetaStore::open(&meta_dir(data_dir))?);
    let log = LogStore::open(&log_dir(data_dir), meta.clone())?;
    Ok((meta, log))
}

/// Opens sled. If it refuses its own files as damaged ([`SledRefused`]), they are moved, as
/// found, into a new folder of `log/damaged/` (returned), and sled starts over, empty: what
/// it held (the snapshot, the purge and commit points, a copy of the vote) is fetched from the
/// leader again or kept outside it, so the replica repairs rather than stops.
fn open_meta(data_dir: &Path) -> io::Result<(MetaStore, Option<PathBuf>)> {
    let dir = meta_dir(data_dir);
    let refused = match MetaStore::open(&dir) {
        Ok(meta) => return Ok((meta, None)),
        Err(error) => match SledRefused::in_error(&error) {
            Some(refused) => refused.to_string(),
            None => return Err(error),
        },
    };
    let log = log_dir(data_dir);
    if vote_known_only_to_sled(&log)? {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!(
                "{}: sled refuses its files ({refused}), and this directory keeps its vote only \
                 in sled (v0.1.0's layout: no {}): setting sled aside would forget what this \
                 replica voted, and it could vote twice in one term. Nothing was changed. \
                 Remove it from the cluster (`ctrlog members remove --id N`) and add it back \
                 with an empty data directory",
                dir.display(),
                log.join(VOTE.file_name).display(),
            ),
        ));
    }
    let kept = new_damaged_folder(&log)?;
    std::fs::rename(&dir, kept.join(SLED_SET_ASIDE))?;
    sync_dir(&kept)?;
    sync_dir(data_dir)?;
    tracing::error!(
        %refused,
        kept = %kept.display(),
        "sled's files are set aside and sled starts over, empty; the replica starts over from \
         the leader's snapshot"
    );
    Ok((MetaStore::open(&dir)?, Some(kept)))
}

/// Whether the replica's vote is kept in sled alone, as v0.1.0 kept it (and every build before
/// the vote file): the log directory `log` has no vote file, and no build that keeps one has
/// opened it. Such a build leaves the synced mark behind at its first open (the mark came
/// after the vote file), and writes the vote file whenever a vote is known, so without the
/// mark a missing vote file says nothing about what the replica voted.
fn vote_known_only_to_sled(log: &Path) -> io::Result<bool> {
    let vote_file = two_copies::check::<Vote>(log, &VOTE)?;
    let opened_by_a_vote_file_build = log.join(SYNCED_MARK_FILE).exists();
    Ok(vote_file == CopiesFound::Missing && log.is_dir() && !opened_by_a_vote_file_build)
}

/// The name sled's refused files take in their `log/damaged/` folder.
pub const SLED_SET_ASIDE: &str = "meta";

/// The folders of `log/damaged/` in `data_dir`: what earlier starts found damaged and kept.
pub fn damaged_folders(data_dir: &Path) -> io::Result<Vec<PathBuf>> {
    match std::fs::read_dir(log_dir(data_dir).join(DAMAGED_DIR)) {
        Ok(folders) => Ok(folders.flatten().map(|folder| folder.path()).collect()),
        Err(error) if error.kind() == io::ErrorKind::NotFound => Ok(Vec::new()),
        Err(error) => Err(error),
    }
}

/// How many of `damaged` (see [`damaged_folders`]) hold sled's refused files, set aside.
pub fn sleds_set_aside_in(damaged: &[PathBuf]) -> usize {
    (damaged.iter())
        .filter(|folder| folder.join(SLED_SET_ASIDE).exists())
        .count()
}

/// How many times the replica in `data_dir` has set sled's refused files aside: the folders
/// of `log/damaged/` that hold them. For the tools and tests that count the repairs.
pub fn sleds_set_aside(data_dir: &Path) -> io::Result<usize> {
    Ok(sleds_set_aside_in(&damaged_folders(data_dir)?))
}

/// A replica's storage, opened and repaired as far as it repairs alone: the log, and the
/// stored snapshot read back whole and verified (`None` without one), for the state machine
/// to be restored from.
pub struct Opened {
    pub log: LogStore,
    pub snapshots: SnapshotStore,
    pub current_snapshot: Option<StoredSnapshot>,
    /// Fires once every handle to the storage is gone and sled has released its directory.
    pub closed: Closed,
    /// The faults this open found and began repairing.
    pub found_at_open: Vec<FaultKind>,
}

/// Opens a replica's storage in `data_dir`: its metadata, its log and its stored snapshot,
/// flushing appends as `flushing` says (the simulation flushes inline), in WAL segments of
/// `segment_bytes_max` bytes (the simulation's are small, so that it purges whole segments).
/// A snapshot that is damaged or stops short of the log is set aside, and the log starts
/// over to be fetched from the leader (ARCHITECTURE.md, "The storage fault model").
///
/// Blocking: recovery reads the whole retained log, and opening may wait for the directory's
/// lock. Call it off the async runtime's workers.
pub fn open(data_dir: &Path, flushing: Flushing, segment_bytes_max: u64) -> io::Result<Opened> {
    check_format(data_dir)?;
    let (meta, sled_set_aside) = open_meta(data_dir)?;
    let meta = Arc::new(meta);
    let log = LogStore::open_with(
        &log_dir(data_dir),
        meta.clone(),
        segment_bytes_max,
        flushing,
    )?;
    let closed = meta.closed();
    let mut found_at_open = Vec::new();
    if log.damage_found_at_open().is_some() {
        found_at_open.push(FaultKind::LogDamaged);
    }
    if log.failed_sync_found_at_open().is_some() {
        found_at_open.push(FaultKind::FailedSync);
    }
    let (snapshots, current_snapshot) = match sled_set_aside {
        // Without sled's snapshot (and purge point) the log cannot be applied: start over.
        Some(kept) => {
            found_at_open.push(FaultKind::SledRefused);
            log.start_over_for_lost_snapshot(None, &kept.join(SLED_SET_ASIDE), &kept)?;
            SnapshotStore::open(meta, log.clone())?
        }
        None => match read_snapshot(&meta, &log)? {
            Ok(read) => read,
            Err((kind, damaged)) => {
                found_at_open.push(kind);
                // The snapshot is fetched from the leader again (ARCHITECTURE.md, "The
                // storage fault model").
                let kept = new_damaged_folder(&log_dir(data_dir))?;
                tracing::error!(
                    %damaged,
                    last = ?damaged.last,
                    kept = %kept.display(),
                    "the stored snapshot is set aside and fetched from the leader again"
                );
                log.start_over_for_lost_snapshot(damaged.last, &kept.join("snapshot"), &kept)?;
                set_aside_damaged_snapshot(&meta, &kept)?;
                SnapshotStore::open(meta, log.clone())?
            }
        },
    };
    log.guard_with_snapshots(snapshots.stored_last()?)?;
    Ok(Opened {
        log,
        snapshots,
        current_snapshot,
        closed,
        found_at_open,
    })
}

/// The stored snapshot, read back, or the damage that keeps the state from being restored
/// from it: a snapshot that fails its checks or stops short of the log.
#[allow(clippy::type_complexity)]
fn read_snapshot(
    meta: &Arc<MetaStore>,
    log: &LogStore,
) -> io::Result<Result<(SnapshotStore, Option<StoredSnapshot>), (FaultKind, DamagedSnapshot)>> {
    match SnapshotStore::open(meta.clone(), log.clone()) {
        Ok((snapshots, current)) => Ok(match short_of_the_log(&snapshots, log)? {
            None => Ok((snapshots, current)),
            Some(damaged) => Err((FaultKind::SnapshotShortOfLog, damaged)),
        }),
        Err(error) => match DamagedSnapshot::in_error(&error) {
            Some(damaged) => Ok(Err((FaultKind::SnapshotDamaged, damaged.clone()))),
            None => Err(error),
        },
    }
}

/// The stored snapshot as damage, if it stops short of the log: the log starts after the entry
/// following it, so the entries between are in neither, and the state cannot be rebuilt.
/// Nothing this build does leaves that (a purge never passes the durable snapshot): sled's
/// recovery dropped the writes of a later snapshot, after the log was purged behind it.
fn short_of_the_log(
    snapshots: &SnapshotStore,
    log: &LogStore,
) -> io::Result<Option<DamagedSnapshot>> {
    let stored = snapshots.stored_last()?;
    let reaches = stored.map_or(0, |last| last.index) + 1;
    // An empty log counts too: it starts where its segment's name says, after its purge point.
    let first = log.first_index();
    Ok((first > reaches).then(|| DamagedSnapshot {
        last: stored,
        problem: format!(
            "it reaches entry {} but the log starts at entry {first}: sled lost the writes of \
             a later snapshot",
            reaches - 1
        ),
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Goal: a new directory is recorded as this build's format; a newer format is refused
    /// naming both versions; an unreadable file is refused.
    #[test]
    fn data_directory_formats_are_recorded_and_checked() {
        let dir = tempfile::tempdir().unwrap();
        let data = dir.path().join("data");
        assert_eq!(check_format(&data).unwrap(), DATA_FORMAT);
        let written = std::fs::read_to_string(data.join(FORMAT_FILE)).unwrap();
        assert!(written.contains("format = 2"), "{written}");
        assert_eq!(check_format(&data).unwrap(), DATA_FORMAT, "read back");

        std::fs::write(data.join(FORMAT_FILE), "format = 3\n").unwrap();
        let refused = check_format(&data).unwrap_err().to_string();
        assert!(
            refused.contains("format 3") && refused.contains("formats 1 to 2"),
            "{refused}"
        );
        assert!(refused.contains("Downgrading is refused"), "{refused}");

        for garbage in [
            "",
            "format two",
            "version = 1",
            "format = 0",
            "format = 1\nnode_id = 1",
            "format = 2\nnode = 1",
            "format = 2\nnode_id = 1\nnode_id = 2",
            "format = 2\nnode_id = 1\ncluster_id = 12",
            "format = 1\ncluster_id = 000102030405060708090a0b0c0d0e0f",
        ] {
            std::fs::write(data.join(FORMAT_FILE), garbage).unwrap();
            let refused = check_format(&data).unwrap_err().to_string();
            assert!(
                refused.contains("does not name a data directory format"),
                "{garbage:?}: {refused}"
            );
        }
    }

    /// Goal: a directory records the replica that first started on it and refuses another
    /// `--id`, naming both; a format-1 directory (a `format = 1` file, or none, as v0.1.0 left
    /// it) is recorded as format 2 for the id that starts it. 3d7237e accepted `serve --id 2`
    /// on replica 3's directory.
    #[test]
    fn a_directory_is_claimed_by_its_replica_and_refuses_another() {
        let dir = tempfile::tempdir().unwrap();
        let data = dir.path().join("data");
        claim(&data, 3).unwrap();
        let recorded = |data: &Path| recorded_in(data).unwrap().unwrap();
        assert_eq!(
            recorded(&data),
            Recorded {
                format: DATA_FORMAT,
                node_id: Some(3),
                cluster_id: None,
            }
        );
        claim(&data, 3).unwrap();
        let refused = claim(&data, 2).unwrap_err();
        assert_eq!(refused.kind(), io::ErrorKind::InvalidData);
        let refused = refused.to_string();
        assert!(
            refused.contains("replica 3's") && refused.contains("--id 2"),
            "{refused}"
        );
        assert_eq!(recorded(&data).node_id, Some(3), "unchanged");

        for format_1 in [Some("format = 1\n"), None] {
            let data = dir.path().join(format!("format-1-{}", format_1.is_some()));
            std::fs::create_dir_all(&data).unwrap();
            if let Some(text) = format_1 {
                std::fs::write(data.join(FORMAT_FILE), text).unwrap();
            }
            claim(&data, 2).unwrap();
            assert_eq!(
                recorded(&data),
                Recorded {
                    format: 2,
                    node_id: Some(2),
                    cluster_id: None,
                }
            );
        }
        // A directory recorded before any replica started on it (the tools open storage
        // without an id) is claimed by the first.
        let unclaimed = dir.path().join("unclaimed");
        check_format(&unclaimed).unwrap();
        assert_eq!(recorded(&unclaimed).node_id, None);
        claim(&unclaimed, 1).unwrap();
        assert_eq!(recorded(&unclaimed).node_id, Some(1));
    }

    /// Goal: a cluster id is drawn once by a founder and kept across restarts, adopted by a
    /// replica that records none from the first caller that has one (beside its node id),
    /// and another is refused by name, never adopted; a caller never takes a server's.
    #[test]
    fn a_directory_records_its_cluster_once_and_meets_another_as_other() {
        let dir = tempfile::tempdir().unwrap();
        let founder = dir.path().join("founder");
        claim(&founder, 1).unwrap();
        let drawn = ClusterIdentity::load(&founder).unwrap().found().unwrap();
        let reopened = ClusterIdentity::load(&founder).unwrap();
        assert_eq!(reopened.known(), Some(drawn));
        assert_eq!(
            reopened.found().unwrap(),
            drawn,
            "a restarted founder keeps its draw"
        );

        let joiner = dir.path().join("joiner");
        claim(&joiner, 2).unwrap();
        let identity = ClusterIdentity::load(&joiner).unwrap();
        assert_eq!(identity.meet(None).unwrap(), Meeting::Same);
        assert_eq!(
            identity.known(),
            None,
            "nothing to adopt from a caller without one"
        );
        assert_eq!(identity.meet(Some(drawn)).unwrap(), Meeting::Same);
        let recorded = recorded_in(&joiner).unwrap().unwrap();
        assert_eq!(
            (recorded.node_id, recorded.cluster_id),
            (Some(2), Some(drawn)),
            "adopted durably, beside the node id"
        );
        let other = ClusterId(drawn.0 ^ 1);
        assert_eq!(
            identity.meet(Some(other)).unwrap(),
            Meeting::Other {
                ours: drawn,
                theirs: other
            }
        );
        assert_eq!(
            identity.compare(Some(other)),
            Meeting::Other {
                ours: drawn,
                theirs: other
            }
        );
        assert_eq!(
            ClusterIdentity::load(&joiner).unwrap().known(),
            Some(drawn),
            "kept"
        );

        let caller = dir.path().join("caller");
        claim(&caller, 3).unwrap();
        let identity = ClusterIdentity::load(&caller).unwrap();
        assert_eq!(identity.compare(Some(drawn)), Meeting::Same);
        assert_eq!(identity.known(), None, "a caller takes no server's cluster");
        // Claiming again keeps the cluster.
        claim(&joiner, 2).unwrap();
        assert_eq!(
            recorded_in(&joiner).unwrap().unwrap().cluster_id,
            Some(drawn)
        );
    }

    /// Goal: a disk that is full when a new directory's format is recorded fails the start
    /// with an error naming the file, and leaves no format file that a later start misreads.
    #[test]
    fn a_full_disk_while_recording_the_format_is_an_error_naming_the_file() {
        use crate::raft::storage::write_faults::{faults, Operation};
        let dir = tempfile::tempdir().unwrap();
        let data = dir.path().join("data");
        faults::fail_under(&data, Operation::Write, libc::ENOSPC);
        let error = check_format(&data).unwrap_err().to_string();
        faults::heal_under(&data);
        let named = data.join(format!("{FORMAT_FILE}.tmp"));
        assert!(
            error.contains(&*named.to_string_lossy()) && error.contains("No space left"),
            "{error}"
        );
        assert!(!data.join(FORMAT_FILE).exists());
        assert_eq!(check_format(&data).unwrap(), DATA_FORMAT);
    }

    /// Goal: the format file has no checksum, and needs none: each bit of it flipped in turn
    /// either leaves format 2 (a comment, trailing space) or is refused naming the file, so
    /// a rotted format file never has the directory read as another format. (A flipped digit
    /// of the node id can name another node, whose start the directory would then refuse:
    /// a refusal, never another node's log served.)
    #[test]
    fn any_flipped_bit_of_the_format_file_reads_as_written_or_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let data = dir.path().join("data");
        claim(&data, 1).unwrap();
        let path = data.join(FORMAT_FILE);
        let written = std::fs::read(&path).unwrap();
        let (mut read_as_written, mut refused) = (0, 0);
        for byte in 0..written.len() {
            for bit in 0..8 {
                let mut flipped = written.clone();
                flipped[byte] ^= 1 << bit;
                std::fs::write(&path, &flipped).unwrap();
                match check_format(&data) {
                    Ok(format) => {
                        assert_eq!(format, DATA_FORMAT, "byte {byte} bit {bit}");
                        read_as_written += 1;
                    }
                    Err(error) => {
                        let error = error.to_string();
                        assert!(error.contains(&*path.to_string_lossy()), "{error}");
                        refused += 1;
                    }
                }
            }
        }
        assert!(
            read_as_written > 0 && refused > 0,
            "{read_as_written} {refused}"
        );
    }
}
