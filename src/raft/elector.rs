//! When this replica stands for election: ctrlog's timer in place of openraft's.
//!
//! openraft 0.9's own election timer has two habits that stretch failover under load
//! (RELIABILITY.md, "Failover"):
//! * each replica draws its election timeout once, at start, so two followers that drew close
//!   values split their votes at every election, round after round;
//! * a candidate refused by a voter with a longer log waits an extra `2 × election_timeout_max`
//!   at its next election, and the flag is cleared only when it next stands, so a replica that
//!   lost one election on its log is still slow at a failover many terms later.
//!
//! So replicas run with openraft's timer off (`enable_elect = false`) and [`drive`] stands for
//! them through `Raft::trigger().elect()`, on an [`ElectionTimer`] that the peer port feeds:
//! * a follower that heard the leader (an `AppendEntries` or snapshot chunk it accepted) stands
//!   `lease + heartbeat + random(0..max - min)` later, where the lease is openraft's leader
//!   lease (`election_timeout_max`), within which every voter that heard the same leader
//!   refuses any candidate: standing earlier could only bump the term and depose a live
//!   leader. The heartbeat is a margin for a voter that heard one heartbeat more than this
//!   replica did; the random spread (as wide as openraft's timeout range) keeps the followers
//!   of a dead leader from standing together. openraft's own timer would add a whole election
//!   timeout after the lease, which only delays a failover: no voter can still refuse for the
//!   lease by then;
//! * a replica that granted its vote, or stood itself, stands again `random(min..max)` later,
//!   drawn afresh each time, so candidates that collided once are unlikely to collide again;
//! * a candidate a voter refused with a longer log waits a further `election_timeout_max` at its
//!   next try only, so the longer log stands first; hearing a leader clears it;
//! * two candidates that stood in the same term refuse each other (each voted for itself): the
//!   one with the longer log, or the higher id if the logs are equal, stands again at once in
//!   the next term, which the other grants, instead of both waiting a timeout and perhaps
//!   colliding again. Under load a vote round takes tens of milliseconds (two `fdatasync`s and
//!   a busy Raft core), so two draws from a 150 ms range collide often enough to matter;
//! * a candidacy that no peer answered at all doubles the wait before the next (up to
//!   [`UNANSWERED_BACKOFF_MAX`] doublings). openraft 0.9 has no pre-vote: a replica whose
//!   requests cannot get out (a one-way partition) would otherwise stand every timeout, its
//!   term racing ahead, and every replica that can win would adopt that term from its refusal
//!   and drop its own candidacy, round after round (seen in `ctrlog chaos`: 60 s without a
//!   leader). Backing off lets the others' terms overtake it.
//!
//! * a leader that stops (SIGTERM) hands over: it names the most caught-up voter after its
//!   Raft core went silent ([`ElectionTimer::handed_over`]), and that voter stands the moment
//!   the voters' leases lapse, a margin after, rather than a heartbeat and a random spread
//!   later; a heartbeat of the old leader that arrives after the handover moves nothing. It
//!   tells the other voters too ([`ElectionTimer::stands_back`]), and they stand no earlier
//!   than an election timeout after that voter: a just-restarted voter's vote request waits
//!   on a dial and a TLS handshake, and under load it reached a voter whose own timer had
//!   fired first (two candidates in one term) in about one rolling restart in eight.
//!   A voter may still refuse the handed-over candidate for its lease, having taken the old
//!   leader's last message later than the margin allows (a busy core): while the others
//!   stand back, such a refusal makes it stand again a heartbeat later, not a timeout.
//! * a replica that led when it stopped waits an election timeout more before it first
//!   stands ([`ElectionTimer::led_when_stopped`]): restarted at once after a handover, it
//!   stood, under load, before the voter it handed over to had won and reached it, and its
//!   higher term deposed that voter.
//!   openraft 0.9 offers no way to shorten the voters' lease, so a handover costs one lease
//!   (`election_timeout_max`) plus a vote round, against a failover's lease, heartbeat and
//!   spread.
//!
//! Safety is openraft's alone: who may vote for whom (the voters' lease and log checks) is
//! unchanged; this decides only when a replica asks.

use std::sync::Mutex;
use std::time::Duration;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tokio::time::Instant;

use super::storage::log_store::LogStore;
use super::types::{
    AppendEntriesResponse, InstallSnapshotResponse, Raft, Vote, VoteRequest, VoteResponse,
};
use crate::NodeId;

/// How long after the voters' leases lapse a handed-over voter stands: room for a heartbeat
/// that left the old leader as its core stopped, and for the two clocks' rates.
pub const HANDOVER_MARGIN: Duration = Duration::from_millis(20);

/// Doublings of the wait after candidacies in a row that no peer answered: at most 8 × the
/// timeout (3.6 s with the defaults) between such tries.
pub const UNANSWERED_BACKOFF_MAX: u32 = 3;

/// The replica's election timing, from its configuration.
#[derive(Clone, Copy, Debug)]
pub struct ElectionTiming {
    pub timeout_min: Duration,
    pub timeout_max: Duration,
    /// The leader's heartbeat interval.
    pub heartbeat: Duration,
}

impl ElectionTiming {
    /// openraft's leader lease: a voter refuses candidates this long after it heard a leader.
    fn lease(&self) -> Duration {
        self.timeout_max
    }
}

/// When this replica next stands, as the peer port's traffic moves it.
pub struct ElectionTimer {
    timing: ElectionTiming,
    state: Mutex<TimerState>,
    /// Notified when `stand_at` moved earlier, so that [`drive`] wakes.
    hastened: tokio::sync::Notify,
}

struct TimerState {
    stand_at: Instant,
    refused_for_log: bool,
    /// This replica stood since it last heard a leader, and no peer has answered since.
    unanswered: bool,
    /// Candidacies in a row that no peer answered.
    unanswered_in_a_row: u32,
    /// A leader handed over to this replica, which stands then whatever it hears before.
    handed_over_at: Option<Instant>,
    /// A leader handed over to another voter: this replica stands no earlier, whatever it
    /// hears before.
    stand_back_until: Option<Instant>,
    /// A leader handed over to this replica: until then (when the other voters stop standing
    /// back), a candidacy refused only for a voter's lease stands again a heartbeat later.
    handover_retries_until: Option<Instant>,
    random: StdRng,
}

impl TimerState {
    fn draw(&mut self, timing: &ElectionTiming) -> Duration {
        self.random
            .gen_range(timing.timeout_min..timing.timeout_max)
    }

    /// How long after it last heard the leader a follower stands: once every voter that heard
    /// the same leader, perhaps one heartbeat later, is past its lease, with a random spread.
    fn after_lease(&mut self, timing: &ElectionTiming) -> Duration {
        timing.lease() + timing.heartbeat + self.draw(timing) - timing.timeout_min
    }
}

/// When the voter a leader handed over to stands, the leader's core silent for `silent_for`
/// already: as soon as every voter's lease from its last message has lapsed, a margin after.
fn handed_over_stands_at(timing: &ElectionTiming, silent_for: Duration) -> Instant {
    Instant::now() + timing.lease().saturating_sub(silent_for) + HANDOVER_MARGIN
}

impl ElectionTimer {
    /// A timer whose first election is as far away as if a leader had just been heard:
    /// a replica that starts cannot tell whether a leader is alive, and a restarted follower
    /// that stood before the leader's next try reached it (openraft retries an unreachable
    /// peer every `network::UNREACHABLE_RETRY`) would be refused by the voters, who still
    /// hear the leader, but its higher term would depose that leader: an election for nothing
    /// on most follower restarts (openraft's own first timeout, `random(min..max)`, was
    /// shorter than its 500 ms retry). The cost is a fresh cluster's or a whole cluster's
    /// restart electing a lease later. `seed` draws the timeouts, so that a simulation
    /// replays; a replica seeds from the OS.
    pub fn new(timing: ElectionTiming, seed: u64) -> ElectionTimer {
        let mut state = TimerState {
            stand_at: Instant::now(),
            refused_for_log: false,
            unanswered: false,
            unanswered_in_a_row: 0,
            handed_over_at: None,
            stand_back_until: None,
            handover_retries_until: None,
            random: StdRng::seed_from_u64(seed),
        };
        let first = state.after_lease(&timing);
        state.stand_at += first;
        ElectionTimer {
            timing,
            state: Mutex::new(state),
            hastened: tokio::sync::Notify::new(),
        }
    }

    fn with<T>(&self, change: impl FnOnce(&mut TimerState, &ElectionTiming) -> T) -> T {
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        change(&mut state, &self.timing)
    }

    /// When this replica stands next, unless the timer moves before then.
    pub fn stand_at(&self) -> Instant {
        self.with(|state, _| state.stand_at)
    }

    /// A leader was heard: stand only once the voters' leases have passed. A heartbeat the
    /// old leader sent before it handed over, arriving after, moves nothing.
    fn heard_leader(&self) {
        self.with(|state, timing| {
            state.refused_for_log = false;
            state.unanswered = false;
            state.unanswered_in_a_row = 0;
            state.handover_retries_until = None;
            if state.handed_over_at.is_none() {
                let after_lease = Instant::now() + state.after_lease(timing);
                state.stand_at = after_lease.max(state.stand_back_until.unwrap_or(after_lease));
            }
        });
    }

    /// The leader handed over to this replica, its core silent for `silent_for` already
    /// (a stopping leader, whose last message left then): stand as soon as every voter's
    /// lease from that message has lapsed, [`HANDOVER_MARGIN`] after. Stands once; a new
    /// leader heard afterwards moves the timer as usual.
    pub fn handed_over(&self, silent_for: Duration) {
        self.with(|state, timing| {
            let stand_at = handed_over_stands_at(timing, silent_for);
            state.stand_at = stand_at;
            state.handed_over_at = Some(stand_at);
            state.handover_retries_until = Some(stand_at + timing.timeout_max);
            state.refused_for_log = false;
            state.unanswered_in_a_row = 0;
        });
        self.hastened.notify_one();
    }

    /// The leader handed over to another voter, its core silent for `silent_for` already:
    /// that voter stands [`HANDOVER_MARGIN`] after the leases lapse, and this replica no
    /// earlier than an election timeout (`election_timeout_max`) later, its vote round's
    /// time; a late heartbeat of the old leader moves nothing. Without this, this replica's
    /// own timer (a heartbeat and a random spread after the lease) fires within tens of
    /// milliseconds of the other's candidacy often enough, and a vote request that waits on a
    /// dial arrives after it: two candidates in one term, and one more election.
    pub fn stands_back(&self, silent_for: Duration) {
        self.with(|state, timing| {
            let until = handed_over_stands_at(timing, silent_for) + timing.timeout_max;
            state.stand_at = state.stand_at.max(until);
            state.stand_back_until = Some(until);
        });
    }

    /// This replica led when it last stopped (its durable vote is its own, committed): the
    /// other voters elect without it, by a handover or on their timeouts, and if it stood
    /// first its higher term would depose their new leader before that leader's first
    /// message reached it. It waits one election timeout (`election_timeout_max`) more
    /// before it first stands, time for that vote round; so a whole cluster's restart, whose
    /// other voters stand as usual, costs nothing more.
    pub fn led_when_stopped(&self) {
        self.with(|state, timing| state.stand_at += timing.timeout_max);
    }

    /// This replica granted its vote: give that candidate a fresh timeout to win.
    fn granted_vote(&self) {
        self.with(|state, timing| {
            let stand_at = Instant::now() + state.draw(timing);
            state.stand_at = state.stand_at.max(stand_at);
        });
    }

    /// A voter refused this replica's candidacy and holds a longer log.
    fn refused_for_log(&self) {
        self.with(|state, _| state.refused_for_log = true);
    }

    /// This replica must wait (it leads, or does not vote): look again a timeout later.
    fn wait_again(&self) {
        self.with(|state, timing| state.stand_at = Instant::now() + state.draw(timing));
    }

    /// This replica stands now: the next try is a fresh timeout away, doubled for each
    /// unanswered candidacy in a row, plus a lease if a longer log refused the last one.
    fn standing(&self) {
        self.with(|state, timing| {
            state.handed_over_at = None;
            if std::mem::replace(&mut state.unanswered, true) {
                state.unanswered_in_a_row += 1;
            } else {
                state.unanswered_in_a_row = 0;
            }
            let doublings = state.unanswered_in_a_row.min(UNANSWERED_BACKOFF_MAX);
            let mut wait = state.draw(timing) * (1 << doublings);
            if std::mem::take(&mut state.refused_for_log) {
                wait += timing.lease();
            }
            state.stand_at = Instant::now() + wait;
        });
    }

    /// Feeds the timer an `AppendEntries` answer this replica gives: anything but `HigherVote`
    /// means it accepted the sender as leader.
    pub fn answered_append_entries(&self, answer: &AppendEntriesResponse) {
        if !matches!(answer, AppendEntriesResponse::HigherVote(_)) {
            self.heard_leader();
        }
    }

    /// Feeds the timer a snapshot chunk's answer this replica gives to a sender of `sender`'s
    /// vote: the receiver answers with its own vote, which is the sender's when it accepted it
    /// as leader.
    pub fn answered_install_snapshot(&self, sender: &Vote, answer: &InstallSnapshotResponse) {
        if answer.vote == *sender {
            self.heard_leader();
        }
    }

    /// Feeds the timer a vote this replica gives.
    pub fn answered_vote(&self, answer: &VoteResponse) {
        if answer.vote_granted {
            self.granted_vote();
        }
    }

    /// A rival candidate of the same term refused this one and would grant the next term.
    fn stand_now(&self) {
        self.with(|state, _| state.stand_at = Instant::now());
        self.hastened.notify_one();
    }

    /// A voter refused this replica's candidacy for its lease alone. In a handover to this
    /// replica that means the voter took the old leader's last message later than the
    /// margin allows (a busy core, a slow link): stand again a heartbeat later, rather than a
    /// timeout, while the other voters stand back. Otherwise a leader may be alive, and
    /// the usual wait holds.
    fn refused_for_lease(&self) {
        let retry = self.with(|state, timing| {
            let now = Instant::now();
            let retry = state
                .handover_retries_until
                .is_some_and(|until| now < until);
            if retry {
                state.stand_at = now + timing.heartbeat;
            }
            retry
        });
        if retry {
            self.hastened.notify_one();
        }
    }

    /// Feeds the timer `voter`'s answer to this replica's candidacy.
    pub fn received_vote(&self, voter: NodeId, request: &VoteRequest, answer: &VoteResponse) {
        self.with(|state, _| state.unanswered = false);
        if answer.vote_granted {
            return;
        }
        if answer.last_log_id > request.last_log_id {
            self.refused_for_log();
            return;
        }
        let (theirs, ours) = (&answer.vote, &request.vote);
        if theirs.is_committed() && theirs.leader_id().term < ours.leader_id().term {
            // The voter follows the leader of an older term, within its lease.
            self.refused_for_lease();
            return;
        }
        let rival = !theirs.is_committed()
            && theirs.leader_id().voted_for() == Some(voter)
            && theirs.leader_id().term == ours.leader_id().term;
        // Exactly one of two rivals wins this comparison, so they do not both stand again.
        let ahead =
            (request.last_log_id, ours.leader_id().voted_for()) > (answer.last_log_id, Some(voter));
        if rival && ahead {
            self.stand_now();
        }
    }
}

/// Stands for election whenever `timer` says so and this replica is a voter that does not
/// lead; returns when Raft stops or `stop` fires. A voter whose damaged log the leader has
/// not yet repaired ([`Repair`](super::storage::log_store::Repair)) never stands (openraft 0.9 would let
/// it, with its cut log); if it is the only voter, nobody can repair it, and it stops.
pub async fn drive(
    raft: Raft,
    id: NodeId,
    log: LogStore,
    timer: std::sync::Arc<ElectionTimer>,
    mut stop: tokio::sync::watch::Receiver<bool>,
) {
    let metrics = raft.metrics();
    let mut told_of_repair = false;
    let own_vote = log.vote().filter(|vote| vote.is_committed());
    if own_vote.is_some_and(|vote| vote.leader_id().voted_for() == Some(id)) {
        timer.led_when_stopped();
    }
    loop {
        // Biased, as every select on the request paths: an unbiased one draws its order from a
        // generator outside any seed, and the order futures are polled in is the order their
        // wakers queue, which a deterministic simulation must not leave to chance.
        tokio::select! {
            biased;
            _ = tokio::time::sleep_until(timer.stand_at()) => {}
            _ = timer.hastened.notified() => {}
            _ = stop.wait_for(|stopped| *stopped) => return,
        }
        if timer.stand_at() > Instant::now() {
            // The leader was heard, or a vote granted, while this slept.
            continue;
        }
        let (running, leads, votes, alone) = {
            let m = metrics.borrow();
            let membership = m.membership_config.membership();
            let votes = membership.voter_ids().any(|voter| voter == id);
            let alone = votes && membership.voter_ids().count() == 1;
            let leads = m.current_leader == Some(id);
            (m.running_state.is_ok(), leads, votes, alone)
        };
        if !running {
            return;
        }
        // Not whole, or cannot tell: either way it may not stand.
        let repair = log.repairing().map_err(|e| e.to_string());
        match repair {
            Ok(None) => {}
            Ok(Some(repair)) if alone => {
                tracing::error!(
                    %repair,
                    "this replica is the only voter, so no peer holds the damaged entries: \
                     stopping. Restore its data directory from a backup; the damaged \
                     segments are kept in the log's `damaged` folder"
                );
                raft.shutdown().await.ok();
                return;
            }
            Ok(Some(repair)) => {
                if !told_of_repair {
                    tracing::warn!(%repair, "not standing for election until repaired");
                    told_of_repair = true;
                }
                timer.wait_again();
                continue;
            }
            Err(e) => {
                tracing::error!(error = %e, "could not read the repair record; not standing");
                timer.wait_again();
                continue;
            }
        }
        if leads || !votes {
            timer.wait_again();
            continue;
        }
        timer.standing();
        tracing::info!(
            replica = id,
            "no leader heard within the election timeout; standing"
        );
        if raft.trigger().elect().await.is_err() {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TIMING: ElectionTiming = ElectionTiming {
        timeout_min: Duration::from_millis(300),
        timeout_max: Duration::from_millis(450),
        heartbeat: Duration::from_millis(50),
    };

    fn wait(timer: &ElectionTimer) -> Duration {
        timer.stand_at() - Instant::now()
    }

    /// Lease 450 ms, a heartbeat's margin, and up to the timeout range's 150 ms of spread.
    #[tokio::test(start_paused = true)]
    async fn a_follower_that_heard_a_leader_waits_out_the_lease_and_a_heartbeat() {
        let timer = ElectionTimer::new(TIMING, 1);
        let mut waits = std::collections::BTreeSet::new();
        for _ in 0..100 {
            timer.heard_leader();
            let wait = wait(&timer);
            assert!(wait >= Duration::from_millis(500) && wait < Duration::from_millis(650));
            waits.insert(wait);
        }
        assert!(waits.len() > 50, "{waits:?}");
    }

    /// A handed-over follower stands as the voters' leases from the stopped leader's last
    /// message lapse, a margin after, with no spread; a heartbeat that arrives after the
    /// handover (sent before it) moves nothing; once it stood, a leader heard moves the
    /// timer as usual.
    #[tokio::test(start_paused = true)]
    async fn a_handed_over_follower_stands_as_the_leases_lapse() {
        let timer = ElectionTimer::new(TIMING, 1);
        timer.heard_leader();
        timer.handed_over(Duration::from_millis(30));
        let expected = TIMING.lease() - Duration::from_millis(30) + HANDOVER_MARGIN;
        assert_eq!(wait(&timer), expected);
        timer.heard_leader();
        assert_eq!(wait(&timer), expected, "a late heartbeat moves nothing");
        timer.standing();
        timer.heard_leader();
        assert!(wait(&timer) >= TIMING.lease() + TIMING.heartbeat);
    }

    /// A voter told that the leader handed over to another stands no earlier than an
    /// election timeout after that voter does, whatever its own draw or a late heartbeat
    /// says; a granted vote and the new leader's messages move it later as usual.
    #[tokio::test(start_paused = true)]
    async fn a_bystander_of_a_handover_stands_back_an_election_timeout() {
        for seed in 0..100 {
            let timer = ElectionTimer::new(TIMING, seed);
            timer.heard_leader();
            timer.stands_back(Duration::from_millis(30));
            let handed_over_stands = TIMING.lease() - Duration::from_millis(30) + HANDOVER_MARGIN;
            let expected = handed_over_stands + TIMING.timeout_max;
            assert_eq!(wait(&timer), expected, "seed {seed}");
            timer.heard_leader();
            assert_eq!(wait(&timer), expected, "a late heartbeat moves nothing");
            tokio::time::advance(handed_over_stands).await;
            timer.granted_vote();
            assert!(
                wait(&timer) <= TIMING.timeout_max,
                "the granted vote is as usual"
            );
            tokio::time::advance(Duration::from_millis(10)).await;
            timer.heard_leader();
            assert!(wait(&timer) >= TIMING.lease() + TIMING.heartbeat);
        }
    }

    /// A handed-over candidate that a voter refused for its lease (the voter took the old
    /// leader's last message late) stands again a heartbeat later while the other voters
    /// stand back; after that, or without a handover, it waits as usual.
    #[tokio::test(start_paused = true)]
    async fn a_handed_over_candidate_refused_for_a_lease_soon_stands_again() {
        let old_leader = crate::raft::types::Vote::new_committed(4, 1);
        let lease_refusal =
            |ours: &VoteRequest| VoteResponse::new(old_leader, ours.last_log_id, false);
        let timer = ElectionTimer::new(TIMING, 8);
        timer.heard_leader();
        timer.handed_over(Duration::ZERO);
        tokio::time::advance(wait(&timer)).await;
        for term in 5..8 {
            timer.standing();
            let ours = vote(term, 2, Some(10));
            timer.received_vote(3, &ours, &lease_refusal(&ours));
            assert_eq!(wait(&timer), TIMING.heartbeat, "term {term}");
            tokio::time::advance(TIMING.heartbeat).await;
        }
        tokio::time::advance(TIMING.timeout_max).await;
        timer.standing();
        let ours = vote(9, 2, Some(10));
        timer.received_vote(3, &ours, &lease_refusal(&ours));
        assert!(
            wait(&timer) >= TIMING.timeout_min,
            "past the window, the usual wait"
        );

        let timer = ElectionTimer::new(TIMING, 9);
        timer.heard_leader();
        tokio::time::advance(wait(&timer)).await;
        timer.standing();
        let ours = vote(5, 2, Some(10));
        timer.received_vote(3, &ours, &lease_refusal(&ours));
        assert!(
            wait(&timer) >= TIMING.timeout_min,
            "without a handover, the usual wait"
        );
    }

    /// A replica that led when it stopped first stands an election timeout later than one
    /// that followed.
    #[tokio::test(start_paused = true)]
    async fn a_replica_that_led_when_it_stopped_stands_a_timeout_later() {
        for seed in 0..100 {
            let (followed, led) = (
                ElectionTimer::new(TIMING, seed),
                ElectionTimer::new(TIMING, seed),
            );
            led.led_when_stopped();
            assert_eq!(
                wait(&led),
                wait(&followed) + TIMING.timeout_max,
                "seed {seed}"
            );
        }
    }

    /// Regression (issue 31): a restarted follower stood 300–450 ms after start, before the
    /// leader's retry (500 ms in openraft's default backoff) reached it, and its higher term
    /// deposed a healthy leader. The first election now waits out a lease and a heartbeat,
    /// longer than several of the leader's retries.
    #[tokio::test(start_paused = true)]
    async fn a_started_replica_waits_out_the_lease_before_it_first_stands() {
        for seed in 0..100 {
            let wait = wait(&ElectionTimer::new(TIMING, seed));
            assert!(wait >= TIMING.lease() + TIMING.heartbeat, "{wait:?}");
            assert!(
                wait >= 4 * crate::raft::network::UNREACHABLE_RETRY,
                "{wait:?}"
            );
        }
    }

    /// openraft 0.9 draws once; a collision would repeat at every election.
    #[tokio::test(start_paused = true)]
    async fn every_try_draws_a_fresh_timeout() {
        let timer = ElectionTimer::new(TIMING, 2);
        let mut waits = std::collections::BTreeSet::new();
        for _ in 0..20 {
            timer.wait_again();
            let wait = wait(&timer);
            assert!(wait >= TIMING.timeout_min && wait < TIMING.timeout_max);
            waits.insert(wait);
        }
        assert!(waits.len() > 10, "{waits:?}");
    }

    /// The longer log's replica stands first, once; openraft kept the delay for good.
    #[tokio::test(start_paused = true)]
    async fn a_refusal_for_a_shorter_log_delays_the_next_try_only() {
        let timer = ElectionTimer::new(TIMING, 3);
        let (ours, answer) = (vote(5, 1, Some(9)), refusal(&vote(4, 2, Some(10))));
        timer.standing();
        timer.received_vote(2, &ours, &answer);
        timer.standing();
        assert!(wait(&timer) >= TIMING.timeout_min + TIMING.lease());
        timer.received_vote(3, &ours, &VoteResponse::new(ours.vote, None, true));
        timer.standing();
        assert!(wait(&timer) < TIMING.timeout_max);

        timer.received_vote(2, &ours, &answer);
        timer.heard_leader();
        timer.standing();
        assert!(
            wait(&timer) < TIMING.timeout_max,
            "hearing a leader clears it"
        );
    }

    fn vote(term: u64, candidate: NodeId, last_log_index: Option<u64>) -> VoteRequest {
        let last_log_id = last_log_index.map(|index| crate::raft::types::LogId {
            leader_id: openraft::CommittedLeaderId::new(1, 1),
            index,
        });
        VoteRequest::new(crate::raft::types::Vote::new(term, candidate), last_log_id)
    }

    fn refusal(by: &VoteRequest) -> VoteResponse {
        VoteResponse::new(by.vote, by.last_log_id, false)
    }

    /// Two candidates of one term: the longer log, else the higher id, stands again at once.
    #[tokio::test(start_paused = true)]
    async fn of_two_rivals_only_the_one_ahead_stands_again_at_once() {
        // (what, ours (term, id, last index), the voter's own candidacy, stands at once)
        let cases = [
            ("longer log", (5, 1, Some(10)), (5, 2, Some(9)), true),
            ("shorter log", (5, 2, Some(9)), (5, 1, Some(10)), false),
            (
                "equal logs, higher id",
                (5, 2, Some(10)),
                (5, 1, Some(10)),
                true,
            ),
            (
                "equal logs, lower id",
                (5, 1, Some(10)),
                (5, 2, Some(10)),
                false,
            ),
            (
                "the voter is in another term",
                (5, 2, Some(10)),
                (6, 1, Some(10)),
                false,
            ),
        ];
        for (what, (term, id, last), (their_term, voter, their_last), at_once) in cases {
            let timer = ElectionTimer::new(TIMING, 5);
            timer.heard_leader();
            let ours = vote(term, id, last);
            timer.received_vote(voter, &ours, &refusal(&vote(their_term, voter, their_last)));
            assert_eq!(timer.stand_at() <= Instant::now(), at_once, "{what}");
        }

        // A voter that voted for someone else is no rival of ours.
        let timer = ElectionTimer::new(TIMING, 6);
        timer.heard_leader();
        let ours = vote(5, 3, Some(10));
        timer.received_vote(1, &ours, &refusal(&vote(5, 2, Some(9))));
        assert!(timer.stand_at() > Instant::now());
    }

    /// A replica whose requests cannot get out backs off instead of racing its term ahead.
    #[tokio::test(start_paused = true)]
    async fn unanswered_candidacies_back_off_until_a_peer_answers() {
        let timer = ElectionTimer::new(TIMING, 7);
        let max_after = |doublings: u32| TIMING.timeout_max * (1 << doublings);
        timer.standing();
        assert!(wait(&timer) < max_after(0), "the first try after a leader");
        for doublings in 1..=UNANSWERED_BACKOFF_MAX + 2 {
            timer.standing();
            let capped = doublings.min(UNANSWERED_BACKOFF_MAX);
            assert!(wait(&timer) >= TIMING.timeout_min * (1 << capped));
            assert!(wait(&timer) < max_after(capped));
        }
        let ours = vote(9, 1, Some(9));
        timer.received_vote(2, &ours, &refusal(&vote(9, 2, Some(9))));
        timer.standing();
        assert!(wait(&timer) < max_after(0), "an answer resets it");
    }

    /// Granting a vote never brings the next try forward past a leader's lease.
    #[tokio::test(start_paused = true)]
    async fn a_granted_vote_postpones_but_never_hastens() {
        let timer = ElectionTimer::new(TIMING, 4);
        timer.heard_leader();
        let after_leader = timer.stand_at();
        timer.granted_vote();
        assert_eq!(timer.stand_at(), after_leader);
    }
}
