//! What a replica whose log was damaged must get back from its peers before it votes or stands
//! again (the [`Repair`] it records), and the vote a replica restarts with: the later of its
//! two copies, never older than its log says, and its own leadership turned into a candidacy
//! ([`as_restarted`]).

use openraft::CommittedLeaderId;

use super::super::two_copies::TwoCopies;
use super::super::wal::{Damage, RECORD_BYTES_MAX};
use crate::log::decode;
use crate::raft::types::Entry;
use crate::raft::types::{LogId, Vote};
use crate::wire::protocol::Repairing;
use crate::NodeId;

/// Where builds before the repair file kept a [`Repair`] under way; read once at open and moved
/// into the file. v0.1.0 never reads either: a damaged log is new to later builds, and a log
/// they repaired is an ordinary log again.
pub(super) const REPAIR_KEY: &str = "repair";

/// What damage to the log took, that this replica must get back from its peers before it
/// votes or stands again (ARCHITECTURE.md, "The storage fault model").
///
/// Why it may not vote meanwhile: the damaged entries may be ones it acknowledged, and so part
/// of the majority that committed them. Voting with its cut log, it could elect a candidate
/// that lacks them, whose entries would then overwrite the only other copies. So it votes only
/// for a candidate whose log is at least as up to date as `held`, exactly as the replica would
/// have that still held its whole log, and never stands itself. It is whole again once its log
/// is on disk up to `held`'s index: what a leader sent it since (entries or a snapshot) is that
/// leader's log, which holds every committed entry.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Repair {
    /// The first index the damage took.
    pub first_damaged: u64,
    /// The last entry the log held before the damage was found.
    pub held: LogId,
    /// The segment file where the damage starts.
    pub segment: String,
    /// The byte of that segment where it starts.
    pub byte: u64,
}

/// The leader of `vote`, which stands in for the term of an entry known only by its index: no
/// entry is of a later term than the vote, so an id with it is no less up to date than the
/// true one.
pub(super) fn vote_leader(vote: Option<Vote>) -> CommittedLeaderId<NodeId> {
    vote.map_or_else(CommittedLeaderId::default, |v| {
        CommittedLeaderId::new(v.leader_id.term, v.leader_id.node_id)
    })
}

impl Repair {
    /// The repair that `damage` calls for. The last entry's id is the last valid record's
    /// after the damage, else the synced mark's (which knows the id of the final record it
    /// covered), and only when neither says it the durable `vote`'s leader stands in for it: a
    /// replica that stood unanswered holds a vote of a later term than its last entry, and
    /// that bound would have it refuse a candidate whose log is exactly the one it held.
    pub(super) fn of(damage: &Damage, vote: Option<Vote>) -> Repair {
        let last_index = damage.end_at_least - 1;
        let decoded = damage
            .last_record
            .as_deref()
            .and_then(|bytes| decode::<Entry>(bytes, RECORD_BYTES_MAX as u64).ok())
            .map(|entry| entry.log_id)
            .filter(|id| id.index >= last_index);
        let marked = damage.marked.filter(|id| id.index == last_index);
        let held =
            (decoded.or(marked)).unwrap_or_else(|| LogId::new(vote_leader(vote), last_index));
        Repair {
            first_damaged: damage.first,
            held,
            segment: damage.segment.display().to_string(),
            byte: damage.byte,
        }
    }

    /// One repair that asks for both: a log damaged again before it was whole must get back
    /// what either damage took.
    pub(super) fn merged(self, earlier: Option<Repair>) -> Repair {
        match earlier {
            Some(earlier) if earlier.held > self.held => Repair {
                first_damaged: earlier.first_damaged.min(self.first_damaged),
                ..earlier
            },
            Some(earlier) => Repair {
                first_damaged: earlier.first_damaged.min(self.first_damaged),
                ..self
            },
            None => self,
        }
    }

    /// The repair as the client port reports it.
    pub fn report(&self) -> Repairing {
        Repairing {
            first_damaged: self.first_damaged,
            held_index: self.held.index,
            segment: self.segment.clone(),
            byte: self.byte,
        }
    }
}

impl std::fmt::Display for Repair {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Display::fmt(&self.report(), f)
    }
}

/// The repair the repair file holds, if one is under way.
pub(super) fn unfinished(repair: &TwoCopies<Option<Repair>>) -> Option<Repair> {
    repair.value().cloned().flatten()
}

/// The vote this replica made durable last, from the vote file's (`in_file`) and sled's copy.
/// The file's, unless sled's is later: a build that writes only sled (v0.1.0, rolled back
/// onto the directory) voted since. A sled copy older than the file's, or one that cannot be
/// ordered with it, is sled having dropped a write in its recovery: the file's stands.
pub(super) fn later_vote(in_file: Option<Vote>, in_sled: Option<Vote>) -> Option<Vote> {
    match (in_file, in_sled) {
        (Some(file), Some(sled)) if sled > file => {
            tracing::info!(%sled, %file, "sled holds a later vote than the vote file: an older build voted since");
            Some(sled)
        }
        (Some(file), Some(sled)) if sled != file => {
            tracing::warn!(%sled, %file, "sled's copy of the vote is older than the vote file's: sled lost a write, and the file's vote stands");
            Some(file)
        }
        (Some(file), None) => {
            tracing::warn!(%file, "sled holds no copy of the vote (lost, or a crash came between the two writes); the vote file's stands");
            Some(file)
        }
        (file, sled) => file.or(sled),
    }
}

/// `vote`, raised if the log says it must have been later: a replica holds entries of a term
/// only after it voted in that term for their leader (or followed it), so a durable vote of an
/// earlier term (or none) beside them was rolled back, by both stores losing it. The vote it
/// must have held is then the leader's of the last entry, committed, which grants no other
/// vote in that term.
pub(super) fn no_older_than_the_log(vote: Option<Vote>, last: Option<LogId>) -> Option<Vote> {
    let Some(last) = last else {
        return vote;
    };
    if vote.is_some_and(|v| v.leader_id.term >= last.leader_id.term) {
        return vote;
    }
    let followed = Vote::new_committed(last.leader_id.term, last.leader_id.node_id);
    tracing::error!(
        durable = ?vote,
        %last,
        raised_to = %followed,
        "the durable vote is older than the log's last entry: it was rolled back, and is raised \
         to the vote that entry's leader must have had"
    );
    Some(followed)
}

/// The vote replica `own` restarts with, given the `durable` one: its own committed vote
/// becomes a candidacy of the same term, so that it must win the next term before it leads
/// again.
///
/// Why: openraft 0.9 restores a replica whose vote is a committed vote for itself as leader of
/// that term at once, with no election. A leader acknowledges its own appends before their
/// `fdatasync` (see the module docs), so after a power loss it may no longer hold entries its
/// followers do. Leading the same term again, it would write new entries under the very log
/// ids of the lost ones, and the followers, which compare entries by log id only, would keep
/// the old ones and count them as the new: the replicas' logs would fork, and an acknowledged
/// append be lost. Standing for the next term instead, it either wins with a log that a
/// majority accepts (then every entry it writes has a new term in its id) or loses to a
/// replica that holds more; what it lost was never applied anywhere (the durable mark).
///
/// Nothing here weakens the vote: a candidacy of term T refuses every other candidate of T,
/// as the committed vote did, and the next term's election is what any replica that stops
/// hearing a leader holds anyway.
pub fn as_restarted(durable: Vote, own: NodeId) -> Vote {
    if durable.committed && durable.leader_id.node_id == own {
        Vote::new(durable.leader_id.term, own)
    } else {
        durable
    }
}
