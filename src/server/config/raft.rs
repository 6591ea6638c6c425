//! `[raft]`: elections and heartbeats, snapshots and the log kept behind them, and the
//! scrubber that reads the log and the snapshot back.

use serde::{Deserialize, Serialize};

use crate::server::config::error::{refuse, ConfigError};

/// The `[raft]` section. Every field has a default, so a file states only what differs.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RaftConfig {
    /// Leader heartbeat period. Small enough to detect a dead leader quickly; each one costs
    /// an RPC per follower. openraft checks its timers every 1.5 heartbeats. Default 50.
    pub heartbeat_interval_ms: u64,
    /// A follower that hears nothing for a random time between this and
    /// `election_timeout_max_ms` starts an election. Must exceed the heartbeat by a wide
    /// margin so that one slow fsync does not depose a leader.
    ///
    /// openraft 0.9 adds a leader lease of `election_timeout_max_ms` before a follower that
    /// knew a leader votes, so a follower stands (`raft::elector`) after `max + heartbeat +
    /// random(0, max - min)` of silence, with a fresh draw at each try: with the defaults (50,
    /// 300, 450) between 0.5 and 0.65 s, which keeps kill → first commit under 1.2 s
    /// (RELIABILITY.md) while needing 0.5 s of silence, 10 heartbeats, before an election.
    /// Default 300.
    pub election_timeout_min_ms: u64,
    /// The top of the election timeout's range, and openraft's leader lease. Default 450.
    pub election_timeout_max_ms: u64,
    /// Build a snapshot once this many entries were applied since the last one. Default
    /// 10,000.
    pub snapshot_logs_since_last: u64,
    /// Entries kept in the log after a snapshot (openraft's `max_in_snapshot_log_to_keep`),
    /// so that recent history can still be fetched and slightly lagging followers catch up
    /// from the log rather than by snapshot. Default 1,000.
    pub snapshot_logs_to_keep: u64,
    /// How fast the background scrubber reads back the WAL and the stored snapshot to verify
    /// them, in MiB per second on average; 0 turns it off. Default 8.
    pub scrub_mib_per_second: u64,
    /// How often a scrub pass starts, in ms: every synced record of the log and the stored
    /// snapshot are verified at least once per this period plus the time a pass takes at the
    /// rate (retained bytes / rate). At least 100. Default 3,600,000 (an hour).
    pub scrub_interval_ms: u64,
}

impl Default for RaftConfig {
    fn default() -> Self {
        RaftConfig {
            heartbeat_interval_ms: 50,
            election_timeout_min_ms: 300,
            election_timeout_max_ms: 450,
            snapshot_logs_since_last: 10_000,
            snapshot_logs_to_keep: 1_000,
            scrub_mib_per_second: 8,
            scrub_interval_ms: 3_600_000,
        }
    }
}

/// The shortest scrub period accepted: passes over a small log end at once, so a shorter one
/// would have the scrubber spin.
const SCRUB_INTERVAL_MS_MIN: u64 = 100;

impl RaftConfig {
    /// Refuses timings that would misbehave at run time, naming the field.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.election_timeout_min_ms <= self.heartbeat_interval_ms {
            refuse(
                "raft.election_timeout_min_ms",
                "must exceed heartbeat_interval_ms, or followers start elections between heartbeats",
            )?;
        }
        if self.election_timeout_max_ms <= self.election_timeout_min_ms {
            refuse(
                "raft.election_timeout_max_ms",
                "must exceed election_timeout_min_ms",
            )?;
        }
        if self.scrub_interval_ms < SCRUB_INTERVAL_MS_MIN {
            refuse(
                "raft.scrub_interval_ms",
                "must be at least 100: a shorter period spins over a small log (turn scrubbing \
                 off with scrub_mib_per_second = 0)",
            )?;
        }
        if self.snapshot_logs_since_last == 0 {
            refuse("raft.snapshot_logs_since_last", "must be at least 1")?;
        }
        Ok(())
    }
}
