//! The leader's lease: when a quorum last acknowledged this replica as leader.
//!
//! openraft 0.9 does not step a leader down when it loses its quorum (no check-quorum), and a
//! leader removed from the membership keeps its vote, so "my metrics say I lead" is not
//! leadership (ARCHITECTURE.md, "Invariants"). Each metrics report carries
//! `millis_since_quorum_ack`, the age of the latest quorum acknowledgement at the time of the
//! report; [`track`] turns that into the instant of the acknowledgement. A partitioned leader
//! hears nothing, reports nothing new, and the instant stays where it was: its age grows, as it
//! should.
//!
//! Two uses, two bounds:
//! * [`QuorumLease::holds`] within `election_timeout_min`: no follower can have started an
//!   election that long after it last heard this leader, so no other leader exists. Only then
//!   does this replica acknowledge a container's heartbeat or let its controller act.
//! * [`QuorumLease::lost`] past `election_timeout_max`: the cluster has surely moved on or is
//!   unreachable; appends and fetches are answered at once with a retriable error, so clients
//!   move to another replica instead of waiting for their deadline here (check-quorum).
//!
//! Clock assumption: this replica's monotonic clock and the followers' run at the same rate
//! within a few percent over an election timeout; the lease is shorter than the shortest
//! election timeout by design, and containers keep a further margin (`SessionOptions`).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use tokio::sync::{watch, Notify};
// tokio's clock, so that a simulation's paused clock drives the lease as it drives Raft.
use tokio::time::Instant;

use super::types::RaftMetrics;
use crate::NodeId;

/// How often [`track`] re-checks the lease while nothing is reported, so that [`QuorumLease`]'s
/// `lost` signal fires within this of the bound passing.
const CHECK_INTERVAL: Duration = Duration::from_millis(50);

/// When a quorum last acknowledged this replica as leader.
pub struct QuorumLease {
    /// Origin of the stored instants.
    epoch: Instant,
    /// Milliseconds after `epoch` of the latest quorum acknowledgement; `u64::MAX`: none yet
    /// in this term.
    acked_ms: AtomicU64,
    /// Milliseconds after `epoch` of the first report of this process leading `term`. Only
    /// the lost bound counts from it: a report that this replica leads proves no quorum's
    /// acknowledgement (a replica restored as leader at start reports exactly that).
    leading_since_ms: AtomicU64,
    /// The term both instants belong to.
    term: AtomicU64,
    /// Within this of the acknowledgement the lease holds.
    hold: Duration,
    /// Past this without one the lease is lost.
    lose: Duration,
    /// Whether the lease is lost: set when it is, cleared once a quorum acknowledges again.
    lost: AtomicBool,
    /// Wakes every [`wait_lost`](QuorumLease::wait_lost) when `lost` is set. A `Notify`, not a
    /// `watch`: every append waits here, and tokio's `watch` spreads its waiters over shards
    /// chosen at random, so their wake-up order (and with it a seeded simulation's schedule)
    /// would change from run to run; a `Notify` wakes them in the order they began to wait.
    lost_notify: Notify,
}

impl QuorumLease {
    pub fn new(hold: Duration, lose: Duration) -> QuorumLease {
        QuorumLease {
            epoch: Instant::now(),
            acked_ms: AtomicU64::new(u64::MAX),
            leading_since_ms: AtomicU64::new(u64::MAX),
            term: AtomicU64::new(0),
            hold,
            lose,
            lost: AtomicBool::new(false),
            lost_notify: Notify::new(),
        }
    }

    /// The age of `instant_ms`, an instant of `term`, if there is one.
    fn age(&self, instant_ms: &AtomicU64, term: u64, now: Instant) -> Option<Duration> {
        let ms = instant_ms.load(Ordering::Acquire);
        if ms == u64::MAX || self.term.load(Ordering::Acquire) != term {
            return None;
        }
        let at = self.epoch + Duration::from_millis(ms);
        Some(now.saturating_duration_since(at))
    }

    /// Whether a quorum acknowledged this replica as leader of `term` recently enough that no
    /// other leader can exist. Only an acknowledgement this process saw counts.
    pub fn holds(&self, term: u64) -> bool {
        self.age(&self.acked_ms, term, Instant::now())
            .is_some_and(|age| age < self.hold)
    }

    /// Whether this replica, leading in `term`, has gone so long without a quorum's
    /// acknowledgement (or, with none yet, since it first reported leading the term) that it
    /// must stop acting as leader. `false` while nothing is known of `term` yet ([`track`]
    /// sees a report within moments).
    pub fn lost(&self, term: u64) -> bool {
        let now = Instant::now();
        self.age(&self.acked_ms, term, now)
            .or_else(|| self.age(&self.leading_since_ms, term, now))
            .is_some_and(|age| age >= self.lose)
    }

    /// Resolves once the lease is lost (at once if it is).
    pub async fn wait_lost(&self) {
        let notified = self.lost_notify.notified();
        tokio::pin!(notified);
        // Registered before the flag is read, so that a loss in between still wakes it.
        notified.as_mut().enable();
        if self.lost.load(Ordering::Acquire) {
            return;
        }
        notified.await;
    }

    /// Whether the lease was found lost at the last metrics report (or check).
    #[cfg(test)]
    fn found_lost(&self) -> bool {
        self.lost.load(Ordering::Acquire)
    }

    /// Records one metrics report, observed at `now`.
    fn observe(&self, metrics: &RaftMetrics, now: Instant) {
        let leading = metrics.current_leader == Some(metrics.id);
        let at = now.saturating_duration_since(self.epoch).as_millis() as u64;
        if leading && self.term.load(Ordering::Acquire) != metrics.current_term {
            // A new term: nothing acknowledged yet. Not even an election is taken for one: a
            // replica that openraft restored as leader at start reports leading with no peer
            // having answered it (`raft::storage::log_store::as_restarted` keeps that from happening,
            // and the lease does not rely on it).
            self.acked_ms.store(u64::MAX, Ordering::Release);
            self.leading_since_ms.store(at, Ordering::Release);
            self.term.store(metrics.current_term, Ordering::Release);
        }
        if let (true, Some(since)) = (leading, metrics.millis_since_quorum_ack) {
            self.acked_ms
                .store(at.saturating_sub(since), Ordering::Release);
        }
        let lost = leading && self.lost(metrics.current_term);
        if self.lost.swap(lost, Ordering::AcqRel) != lost && lost {
            self.lost_notify.notify_waiters();
        }
    }
}

/// Whether replica `id`, reporting `metrics`, may act as the leader: acknowledge a
/// container's heartbeat, expire sessions, let its controller act. It must be running and lead
/// in its own view, hold the quorum lease of its term, and have applied an entry of that term
/// (openraft commits one at election): before that, its state may miss the previous term's
/// last commands, such as a container's registration, and it would judge by stale state.
pub fn leads(metrics: &RaftMetrics, id: NodeId, lease: &QuorumLease) -> bool {
    metrics.running_state.is_ok()
        && metrics.state == openraft::ServerState::Leader
        && metrics.current_leader == Some(id)
        && lease.holds(metrics.current_term)
        && metrics
            .last_applied
            .is_some_and(|applied| applied.leader_id.term == metrics.current_term)
}

/// Keeps `lease` up to date from `metrics` until `stop` fires or Raft stops reporting.
pub async fn track(
    lease: std::sync::Arc<QuorumLease>,
    mut metrics: watch::Receiver<RaftMetrics>,
    mut stop: watch::Receiver<bool>,
) {
    let mut ticker = tokio::time::interval(CHECK_INTERVAL);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        // Biased: the order is then the same every run, which a seeded simulation needs.
        tokio::select! {
            biased;
            _ = stop.changed() => return,
            changed = metrics.changed() => if changed.is_err() { return },
            _ = ticker.tick() => {}
        }
        let observed = metrics.borrow_and_update().clone();
        lease.observe(&observed, Instant::now());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Regression (issue 31): a replica that openraft restored as leader at start reports
    /// leading with no acknowledgement yet, and the lease took that first report for an
    /// election: `is_leader` held for about `election_timeout_min` with no peer answering,
    /// long enough to accept a cut-off container's heartbeat. Steps: the restart's first
    /// report, then reports with no acknowledgement for the whole hold bound.
    #[test]
    fn a_report_of_leading_without_an_acknowledgement_holds_no_lease() {
        let lease = QuorumLease::new(Duration::from_millis(500), Duration::from_millis(1000));
        lease.observe(&report(7, true, None), Instant::now());
        assert!(!lease.holds(7), "the first report after a restart");
        lease.observe(&report(7, true, None), Instant::now());
        assert!(!lease.holds(7), "later reports without an acknowledgement");
        lease.observe(&report(7, true, Some(10)), Instant::now());
        assert!(lease.holds(7), "a quorum's acknowledgement seen here");
    }

    fn report(term: u64, leading: bool, since_ms: Option<u64>) -> RaftMetrics {
        let mut metrics = RaftMetrics::new_initial(1);
        metrics.current_term = term;
        metrics.current_leader = leading.then_some(1);
        metrics.millis_since_quorum_ack = since_ms;
        metrics
    }

    /// The lease starts with the election, holds within its bound of the acknowledgement a
    /// report carried, is lost past the wider bound, and belongs to its term.
    #[test]
    fn the_lease_follows_the_latest_quorum_acknowledgement() {
        let mut lease = QuorumLease::new(Duration::from_millis(500), Duration::from_millis(1000));
        // Instants before the lease was made are representable.
        lease.epoch -= Duration::from_secs(10);
        assert!(
            !lease.holds(3) && !lease.lost(3),
            "nothing known before leading"
        );
        // Leading for 1.2 s with no acknowledgement: never held, and lost past the bound.
        lease.observe(
            &report(3, true, None),
            Instant::now() - Duration::from_millis(1_200),
        );
        assert!(!lease.holds(3), "leading is no acknowledgement");
        assert!(
            lease.lost(3),
            "leading 1.2 s without one is past the lose bound"
        );
        assert!(lease.found_lost());
        lease.observe(&report(3, true, None), Instant::now());
        assert!(
            lease.lost(3),
            "leading is counted from the first report of the term, not from every report"
        );

        lease.observe(&report(3, true, Some(100)), Instant::now());
        assert!(lease.holds(3) && !lease.lost(3));
        assert!(!lease.holds(4), "another term's lease is not this one");
        assert!(!lease.found_lost());

        // The same acknowledgement, seen in a report 700 ms older than it: 800 ms old now.
        let now = Instant::now();
        lease.observe(&report(3, true, Some(800)), now);
        assert!(!lease.holds(3), "past the hold bound");
        assert!(!lease.lost(3), "not yet past the lose bound");
        lease.observe(&report(3, true, Some(1_200)), Instant::now());
        assert!(lease.lost(3));
        assert!(lease.found_lost());

        // A new term starts with nothing acknowledged, whatever the last term had.
        lease.observe(&report(4, true, None), Instant::now());
        assert!(!lease.holds(4) && !lease.lost(4));
        lease.observe(&report(4, true, Some(0)), Instant::now());
        assert!(lease.holds(4));

        // A follower's reports leave the lease alone and never say it was lost.
        lease.observe(&report(3, false, None), Instant::now());
        assert!(!lease.found_lost());
    }
}
