//! A new cluster's vocabulary level. A log starts at level 1 (`LEVEL_INITIAL`), the only
//! level v0.1.0's logs could start at, so a cluster founded by a newer build would run
//! without what its build knows (recorded launches, the forgotten-producer check) until an
//! operator raised it. Instead, the first leader of a log that holds no command yet raises the
//! level itself: to the one its configuration asks for (by default the highest this build
//! knows), or to the highest every member's build knows, if that is lower.
//!
//! The raise is an ordinary `set-vocabulary-level` command, so it is in the log for every
//! reader, replica and backup, and the state machine stays a fold of the log: nothing about
//! the level is decided outside it. It takes offset 1, as etcd's first revision is its own.
//! Until the raise is over, appends wait for it ([`Founding::hold`]), so that the cluster's
//! first commands are decided at the level it was founded for; only a replica that knows
//! another leader lets them through at once, for its Raft to refuse with that leader's name,
//! and one that has known no leader for an election timeout refuses them `Unavailable`, so
//! that the client asks another replica.
//!
//! A member that does not say which levels it knows (not started yet, or cut off) is waited
//! for up to [`PATIENCE`]; after that it is taken to know [`LEVEL_KNOWN_TO_EVERY_RELEASE`],
//! which every build does. A log that already holds a command is never raised here: a cluster
//! that serves a job changes level only by an operator's `ctrlog vocabulary raise`. A raise
//! answered late, by a new leader or twice is harmless: a raise to the level already
//! recorded is refused and takes no offset.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio::time::Instant;
use tokio_util::sync::{CancellationToken, DropGuard};

use crate::jobs::JobState;
use crate::log::vocabulary::{LEVEL_INITIAL, LEVEL_KNOWN_TO_EVERY_RELEASE};
use crate::log::{Command, Level, SetVocabularyLevel};
use crate::wire::{ApiError, AppendAck};
use crate::NodeId;

/// How often a replica looks whether it leads a log that still needs its founding raise.
const LOOK_EVERY: Duration = Duration::from_millis(50);
/// How often an append held for the founding raise looks again whether another replica leads.
const HOLD_LOOKS_EVERY: Duration = Duration::from_millis(10);
/// How long a leader waits after a raise that failed for a reason that may pass (a member
/// that did not answer, a leadership in doubt) before it tries again.
const RETRY_AFTER: Duration = Duration::from_secs(1);
/// How long a leader waits for every member to say which levels it knows, from its first
/// attempt: long enough for the founding members of a deployment to start one after
/// another, short enough that a member that is down does not hold the cluster's first
/// commands for long.
pub const PATIENCE: Duration = Duration::from_secs(10);

/// What the founding raise needs of its node (`raft::node::Node` implements it).
pub trait NewLog: Send + Sync + 'static {
    /// Whether the node leads, with a quorum and its term's first entry applied.
    fn leads(&self) -> bool;
    /// The JobState as of the applied offset.
    fn job_state(&self) -> Arc<JobState>;
    /// Each other member's answer to which vocabulary levels its build knows.
    fn member_levels(&self) -> impl Future<Output = Vec<(NodeId, Result<Level, ApiError>)>> + Send;
    /// Proposes a command, without waiting for the founding raise.
    fn propose(&self, command: Command)
        -> impl Future<Output = Result<AppendAck, ApiError>> + Send;
}

/// Whom a replica's Raft names leader, as [`Founding::hold`] asks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Leader {
    /// This replica (which may not hold its lease yet: the raise is then on its way).
    This,
    /// Another replica: its Raft refuses an append itself, naming that leader.
    Another,
    /// None: the replica stands for election, or hears no leader (cut off, or the other
    /// founding members are not started).
    Unknown,
}

/// Whether a node's founding raise is over: it is once the task that makes it ends, for
/// whatever reason, as the task holds the guard that says so when dropped ([`pending`]).
///
/// A cancellation token rather than a `watch` channel: a `watch` sender wakes its waiters in
/// an order drawn from the runtime's generator, so the appends held here would reach the
/// proposer in a different order each run of a seeded simulation; the token wakes them in the
/// order they began waiting.
pub struct Founding(CancellationToken);

/// The founding raise's task holds the first; the node keeps the second.
pub fn pending() -> (DropGuard, Founding) {
    let over = CancellationToken::new();
    (over.clone().drop_guard(), Founding(over))
}

impl Founding {
    pub fn is_over(&self) -> bool {
        self.0.is_cancelled()
    }

    /// Holds an append to a new log until the founding raise is over, or for `at_most`,
    /// unless `leader` says that Raft names another replica leader: Raft then refuses the
    /// append itself, with that leader's name. `Ok` once the append may go on to Raft.
    ///
    /// Held also while this replica stands for election or knows no leader, not only while it
    /// leads: an append let through while it stood reached its Raft core after the core had
    /// won, and took offset 1. The seeded simulation left the cluster at level 1 that way in
    /// 10 of seeds 1–38 (3 replicas); holding here, in none of 1,837 runs (RELIABILITY.md).
    ///
    /// But not for long while it knows no leader: once it has known none for `leaderless_max`
    /// (an election timeout) without a break while the append waits, the append is refused
    /// `Unavailable`, which a client retries at another replica. A replica cut off, or whose
    /// fellow founders are not started, would otherwise keep it for `at_most`, the client's
    /// whole deadline for the try. Refused, it is not let through, so the raise still takes
    /// offset 1.
    ///
    /// It looks every `HOLD_LOOKS_EVERY` rather than watching Raft's metrics, for the same
    /// reason as [`Founding`] is a token: a `watch` wakes its waiters in a random order.
    pub async fn hold(
        &self,
        leader: impl Fn() -> Leader,
        leaderless_max: Duration,
        at_most: Duration,
    ) -> Result<(), ApiError> {
        let deadline = Instant::now() + at_most;
        let mut leaderless_since = None;
        while !self.is_over() {
            let now = Instant::now();
            match leader() {
                Leader::Another => return Ok(()),
                Leader::This => leaderless_since = None,
                Leader::Unknown => {
                    let leaderless = now - *leaderless_since.get_or_insert(now);
                    if leaderless >= leaderless_max {
                        return Err(ApiError::Unavailable(format!(
                            "this replica has known no leader of the new log for \
                             {leaderless:?} (cut off, or its fellow founding members not \
                             started); ask another replica"
                        )));
                    }
                }
            }
            let left = deadline.saturating_duration_since(now);
            if left.is_zero() {
                return Ok(());
            }
            let _ = tokio::time::timeout(HOLD_LOOKS_EVERY.min(left), self.0.cancelled()).await;
        }
        Ok(())
    }
}

/// Runs on every replica until the log holds a command, the recorded level reaches `wanted`,
/// or `stop` says so; whenever this replica leads meanwhile, it raises the level
/// (`raise_once`). `wanted` at [`LEVEL_INITIAL`] asks for nothing. Ending drops `pending`,
/// which ends the wait of the appends held for it.
pub async fn raise_level_of_new_log(
    node: impl NewLog,
    wanted: Level,
    pending: DropGuard,
    mut stop: watch::Receiver<bool>,
) {
    let _pending = pending;
    let mut first_attempt = None;
    loop {
        let state = node.job_state();
        if state.level() >= wanted || wanted <= LEVEL_INITIAL {
            return;
        }
        if state.last_offset() > 0 {
            if first_attempt.is_some() {
                tracing::warn!(
                    level = state.level(),
                    wanted,
                    "a command reached the new log before its vocabulary level was raised, so \
                     the cluster stays at level {}; raise it with `ctrlog vocabulary raise \
                     --level {wanted}`",
                    state.level()
                );
            }
            return;
        }
        let wait = if node.leads() {
            let since = *first_attempt.get_or_insert_with(Instant::now);
            match raise_once(&node, state.level(), wanted, since.elapsed() >= PATIENCE).await {
                Ok(()) => return,
                Err(why) => {
                    tracing::info!("the new log's vocabulary level is not raised yet: {why}");
                    RETRY_AFTER
                }
            }
        } else {
            LOOK_EVERY
        };
        // Biased, as every select here: an unbiased one draws from a generator outside a
        // seeded simulation's seed.
        tokio::select! {
            biased;
            _ = stop.wait_for(|stopping| *stopping) => return,
            _ = tokio::time::sleep(wait) => {}
        }
    }
}

/// One attempt of the leader: asks every member which levels its build knows and raises the
/// level from `current` to `wanted`, or to the highest they all know. A member that does not
/// answer fails the attempt, unless `out_of_patience`: then it is taken to know
/// [`LEVEL_KNOWN_TO_EVERY_RELEASE`]. `Ok` once nothing is left to do; `Err` says why it may
/// succeed later.
async fn raise_once(
    node: &impl NewLog,
    current: Level,
    wanted: Level,
    out_of_patience: bool,
) -> Result<(), String> {
    let mut level = wanted;
    for (member, answer) in node.member_levels().await {
        let known = match answer {
            Ok(known) => known,
            Err(error) if out_of_patience => {
                tracing::warn!(
                    member,
                    %error,
                    "replica {member} did not say which vocabulary levels it knows within {}s; \
                     the new cluster takes it to know level {LEVEL_KNOWN_TO_EVERY_RELEASE}, as \
                     every build does",
                    PATIENCE.as_secs()
                );
                LEVEL_KNOWN_TO_EVERY_RELEASE
            }
            Err(error) => return Err(error.to_string()),
        };
        if known < level {
            tracing::warn!(
                member,
                known,
                wanted,
                "replica {member} knows vocabulary levels up to {known} only, so the new \
                 cluster is founded at that level"
            );
            level = known;
        }
    }
    if level <= current {
        return Ok(());
    }
    match (node.propose(Command::SetVocabularyLevel(SetVocabularyLevel { level }))).await {
        Ok(ack) => {
            tracing::info!(
                level,
                offset = ack.offset,
                "the new cluster's vocabulary level is {level}"
            );
            Ok(())
        }
        Err(error) if error.is_retriable() => Err(error.to_string()),
        Err(error) => {
            // Refused for good: another leader's raise was committed first.
            tracing::info!(%error, level, "the new log's vocabulary level was not raised here");
            Ok(())
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicU8, Ordering};

    use super::*;

    /// The election timeout the tests hold appends with.
    const LEADERLESS_MAX: Duration = Duration::from_millis(450);

    /// A `leader` for [`Founding::hold`] that reads what a spawned task sets.
    fn read(named: &Arc<AtomicU8>) -> impl Fn() -> Leader + '_ {
        || match named.load(Ordering::SeqCst) {
            0 => Leader::This,
            1 => Leader::Another,
            _ => Leader::Unknown,
        }
    }

    /// Sets `named` to `to` after `after`.
    fn names(named: &Arc<AtomicU8>, to: u8, after: Duration) {
        let named = named.clone();
        tokio::spawn(async move {
            tokio::time::sleep(after).await;
            named.store(to, Ordering::SeqCst);
        });
    }

    #[tokio::test(start_paused = true)]
    async fn an_append_is_held_until_the_raise_is_over_or_another_replica_leads() {
        let held = |founding: &Founding, leader: Leader| {
            let founding = Founding(founding.0.clone());
            async move {
                let began = Instant::now();
                let answer =
                    (founding.hold(|| leader, LEADERLESS_MAX, Duration::from_secs(30))).await;
                (answer.is_ok(), began.elapsed())
            }
        };
        // Held until the raise is over, while this replica leads.
        let (raise, founding) = pending();
        let over = tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(300)).await;
            drop(raise);
        });
        assert_eq!(
            held(&founding, Leader::This).await,
            (true, Duration::from_millis(300))
        );
        over.await.unwrap();

        // Held until Raft names another leader, looked at every `HOLD_LOOKS_EVERY`.
        let (raise, founding) = pending();
        let named = Arc::new(AtomicU8::new(0));
        names(&named, 1, Duration::from_millis(205));
        let began = Instant::now();
        let answer = founding.hold(read(&named), LEADERLESS_MAX, Duration::from_secs(30));
        assert!(answer.await.is_ok());
        assert_eq!(began.elapsed(), Duration::from_millis(210));

        // Never longer than asked, and not at all once over.
        assert_eq!(
            held(&founding, Leader::This).await,
            (true, Duration::from_secs(30))
        );
        drop(raise);
        assert_eq!(
            held(&founding, Leader::Unknown).await,
            (true, Duration::ZERO)
        );
    }

    #[tokio::test(start_paused = true)]
    async fn an_append_to_a_replica_that_knows_no_leader_is_refused_after_an_election_timeout() {
        // Refused once no leader was known for `LEADERLESS_MAX`, not after `at_most`.
        let (_raise, founding) = pending();
        let began = Instant::now();
        let answer = founding.hold(|| Leader::Unknown, LEADERLESS_MAX, Duration::from_secs(30));
        match answer.await {
            Err(ApiError::Unavailable(why)) => {
                assert!(why.contains("known no leader of the new log"), "{why}")
            }
            other => panic!("expected Unavailable, got {other:?}"),
        }
        assert_eq!(began.elapsed(), LEADERLESS_MAX);

        // Counted again from a look that found no leader after one that found a leader: no
        // leader until 305 ms, this replica from then to 505 ms, none after; refused at the
        // look of 960 ms, `LEADERLESS_MAX` after the one of 510 ms.
        let named = Arc::new(AtomicU8::new(2));
        names(&named, 0, Duration::from_millis(305));
        names(&named, 2, Duration::from_millis(505));
        let began = Instant::now();
        let answer = founding.hold(read(&named), LEADERLESS_MAX, Duration::from_secs(30));
        assert!(matches!(answer.await, Err(ApiError::Unavailable(_))));
        assert_eq!(began.elapsed(), Duration::from_millis(960));

        // A replica that stands (no leader) and wins before the bound keeps holding, until
        // the raise is over.
        let (raise, founding) = pending();
        let named = Arc::new(AtomicU8::new(2));
        names(&named, 0, Duration::from_millis(405));
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_secs(2)).await;
            drop(raise);
        });
        let began = Instant::now();
        let answer = founding.hold(read(&named), LEADERLESS_MAX, Duration::from_secs(30));
        assert!(answer.await.is_ok());
        assert_eq!(began.elapsed(), Duration::from_secs(2));
    }
}
