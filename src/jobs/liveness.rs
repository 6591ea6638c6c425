//! The leader's heartbeat table, held in memory as KRaft holds broker heartbeats.
//!
//! Heartbeats are not written to the log: only their consequence is, when the controller
//! expires a silent container. A new leader starts with an empty table and counts silence from
//! the moment it started tracking, so a failover never expires a container that was
//! heartbeating to the old leader; and a session it has not heard from counts its silence from
//! when the table first saw it live, so a container that registered after the term began is
//! not expired before its first heartbeat can arrive.

use std::collections::{BTreeMap, HashMap};
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

/// The consumer lag the live sessions reported to this leader, summed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ReportedLag {
    /// Live sessions that have reported (a new leader knows none until each heartbeats).
    pub containers: usize,
    /// Their lag, summed over their tasks.
    pub total: u64,
}

/// Whether `state` gives `task` to the session of `container` at `epoch`.
fn owns(state: &JobState, container: &ContainerId, epoch: Epoch, task: &TaskId) -> bool {
    let owner = state
        .tasks()
        .get(task)
        .and_then(|record| record.phase.owner());
    owner.is_some_and(|owner| owner.epoch == epoch && owner.container == *container)
}

/// The sum of a heartbeat's lag over the tasks its session owns in `state` now: a report made
/// while a task was still its own (stopping, on its way to another container) stops counting
/// once the task is the other's, which reports it itself. Saturating: reports are a
/// container's word, and a sum that wrapped would read as no lag at all.
fn owned_total(state: &JobState, container: &ContainerId, beat: &Heartbeat) -> u64 {
    beat.lag
        .iter()
        .filter(|(task, _)| owns(state, container, beat.epoch, task))
        .fold(0, |sum, (_, lag)| sum.saturating_add(*lag))
}

/// Who was heard from, and when, during one leadership term. Times are passed in, so the
/// table is deterministic under test.
#[derive(Clone, Debug)]
pub struct Liveness {
    term: u64,
    tracking_since: Instant,
    // Hashed, not ordered: every tick looks up each live session here, and nothing walks
    // these in order.
    beats: HashMap<ContainerId, Heartbeat>,
    /// When each live session was first seen by [`Liveness::overdue`], by container.
    first_seen: HashMap<ContainerId, (Epoch, Instant)>,
}

impl Liveness {
    /// An empty table for a leader of `term` that starts tracking at `now`.
    pub fn new(term: u64, now: Instant) -> Liveness {
        Liveness {
            term,
            tracking_since: now,
            beats: HashMap::new(),
            first_seen: HashMap::new(),
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

    /// Records a heartbeat from a session the caller checked is live in `state`. Its lag
    /// counts only for the tasks `state` gives that session, now and when it is read: a
    /// container's word about tasks it does not own (another container's, or none at all)
    /// would steer the scaling policy.
    pub fn record(
        &mut self,
        state: &JobState,
        session: &Session,
        mut lag: BTreeMap<TaskId, u64>,
        now: Instant,
    ) {
        lag.retain(|task, _| owns(state, &session.container, session.epoch, task));
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
    /// here for the first time counts its silence from `now`. It runs every controller tick
    /// over every session, so it copies a name only for a session it meets first, or returns.
    pub fn overdue(&mut self, state: &JobState, now: Instant, timeout: Duration) -> Vec<Session> {
        let (mut live, mut overdue) = (0, Vec::new());
        for (container, epoch) in state.live_epochs() {
            live += 1;
            let seen = match self.first_seen.get_mut(container) {
                Some(seen) if seen.0 == epoch => seen.1,
                Some(seen) => {
                    *seen = (epoch, now);
                    now
                }
                None => {
                    self.first_seen.insert(container.clone(), (epoch, now));
                    now
                }
            };
            let beat = self
                .beats
                .get(container)
                .filter(|beat| beat.epoch == epoch)
                .map_or(seen, |beat| beat.at.max(seen));
            if now.saturating_duration_since(beat) > timeout {
                overdue.push(Session {
                    container: container.clone(),
                    epoch,
                });
            }
        }
        // Forget containers that are no longer live, so that a job whose containers come
        // and go under new names does not grow the table for the whole term.
        if self.first_seen.len() > live {
            let is_live = |c: &ContainerId| state.live_session(c).is_some();
            self.first_seen.retain(|c, _| is_live(c));
            self.beats.retain(|c, _| is_live(c));
        }
        overdue
    }

    /// How many live sessions reported their lag, and its sum: what the scaling policy reads
    /// every tick, without a map of ten thousand names.
    pub fn reported(&self, state: &JobState) -> ReportedLag {
        let mut reported = ReportedLag::default();
        for (container, epoch) in state.live_epochs() {
            if let Some(beat) = self.beats.get(container).filter(|b| b.epoch == epoch) {
                reported.containers += 1;
                reported.total = reported
                    .total
                    .saturating_add(owned_total(state, container, beat));
            }
        }
        reported
    }

    /// The lag each live session reported last, over the tasks it owns now (sessions
    /// without a heartbeat are absent).
    pub fn lag(&self, state: &JobState) -> BTreeMap<ContainerId, u64> {
        state
            .live_sessions()
            .filter_map(|session| {
                let beat = self.beats.get(&session.container)?;
                let total = (beat.epoch == session.epoch)
                    .then(|| owned_total(state, &session.container, beat))?;
                Some((session.container, total))
            })
            .collect()
    }
}
