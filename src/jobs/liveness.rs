//! The leader's heartbeat table, held in memory as KRaft holds broker heartbeats.
//!
//! Heartbeats are not written to the log: only their consequence is, when the controller
//! expires a silent container. A new leader starts with an empty table and counts silence from
//! the moment it started tracking, so a failover never expires a container that was
//! heartbeating to the old leader; and a session it has not heard from counts its silence from
//! when the table first saw it live, so a container that registered after the term began is
//! not expired before its first heartbeat can arrive.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use super::model::Session;
use super::state::JobState;
use crate::log::{ContainerId, Epoch, TaskId};

/// The last heartbeat of one container.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Heartbeat {
    /// The epoch the heartbeat was sent from; it keeps only that session alive, not a newer
    /// one of the same container.
    pub epoch: Epoch,
    /// When the leader recorded it, on the clock passed to [`Liveness::record`].
    pub at: Instant,
    /// Consumer lag per task, as the container reported it.
    pub lag: BTreeMap<TaskId, u64>,
}

/// Who was heard from, and when, during one leadership term. Times are passed in, so the
/// table is deterministic under test.
#[derive(Clone, Debug)]
pub struct Liveness {
    term: u64,
    tracking_since: Instant,
    beats: BTreeMap<ContainerId, Heartbeat>,
    /// When each live session was first seen by [`Liveness::overdue`], by container.
    first_seen: BTreeMap<ContainerId, (Epoch, Instant)>,
}

impl Liveness {
    /// An empty table for a leader of `term` that starts tracking at `now`.
    pub fn new(term: u64, now: Instant) -> Liveness {
        Liveness {
            term,
            tracking_since: now,
            beats: BTreeMap::new(),
            first_seen: BTreeMap::new(),
        }
    }

    /// The term this table belongs to.
    pub fn term(&self) -> u64 {
        self.term
    }

    /// Starts over, empty, if `term` is not this table's: a new leader counts silence from
    /// `now`, not from the last leader's last word.
    pub fn follow_term(&mut self, term: u64, now: Instant) {
        if self.term != term {
            *self = Liveness::new(term, now);
        }
    }

    /// Records a heartbeat from a session the caller checked is live.
    pub fn record(&mut self, session: &Session, lag: BTreeMap<TaskId, u64>, now: Instant) {
        self.beats.insert(
            session.container.clone(),
            Heartbeat {
                epoch: session.epoch,
                at: now,
                lag,
            },
        );
    }

    /// The last heartbeat of a container, from any epoch.
    pub fn last(&self, container: &ContainerId) -> Option<&Heartbeat> {
        self.beats.get(container)
    }

    /// When `session` was last heard from: its latest heartbeat of this epoch, or else when
    /// this table first saw it live (never before tracking started).
    pub fn last_heard(&self, session: &Session) -> Instant {
        let beat = self
            .beats
            .get(&session.container)
            .filter(|beat| beat.epoch == session.epoch)
            .map(|beat| beat.at);
        let seen = self
            .first_seen
            .get(&session.container)
            .filter(|(epoch, _)| *epoch == session.epoch)
            .map(|(_, at)| *at);
        beat.into_iter()
            .chain(seen)
            .max()
            .unwrap_or(self.tracking_since)
    }

    /// The live sessions of `state` not heard from for longer than `timeout`. A session seen
    /// here for the first time counts its silence from `now`.
    pub fn overdue(&mut self, state: &JobState, now: Instant, timeout: Duration) -> Vec<Session> {
        for session in state.live_sessions() {
            let seen = self
                .first_seen
                .entry(session.container.clone())
                .or_insert((session.epoch, now));
            if seen.0 != session.epoch {
                *seen = (session.epoch, now);
            }
        }
        state
            .live_sessions()
            .filter(|session| now.saturating_duration_since(self.last_heard(session)) > timeout)
            .collect()
    }

    /// The lag each live session reported last (sessions without a heartbeat are absent).
    pub fn lag(&self, state: &JobState) -> BTreeMap<ContainerId, u64> {
        state
            .live_sessions()
            .filter_map(|session| {
                let beat = self.beats.get(&session.container)?;
                (beat.epoch == session.epoch).then(|| (session.container, beat.lag.values().sum()))
            })
            .collect()
    }
}
