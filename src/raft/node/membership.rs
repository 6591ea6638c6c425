//! Membership changes at the leader: a replica added as a learner, caught up and promoted; a
//! replica removed; the vocabulary levels the members' builds know, asked before a replica is
//! added or a level raised. Each change is serialised at this replica and waits for the
//! membership in effect to commit first.

use super::*;

impl Node {
    /// Waits, up to [`MEMBERSHIP_COMMIT_WAIT`], until this replica has applied the membership
    /// in effect, so that it is committed. openraft refuses a change before then ("already
    /// undergoing a configuration change"), which a leader just elected in a new cluster is
    /// until its first entry commits: a script adding a replica right after the first start
    /// met that refusal.
    async fn membership_committed(&self) -> Result<(), ApiError> {
        let mut metrics = self.inner.raft.metrics();
        // A leader commits nothing of an earlier term before an entry of its own, so the
        // membership is committed once an entry of the leader's term is applied. (A follower
        // refuses the change with a redirect anyway: it does not wait.)
        let committed = metrics.wait_for(|m| {
            m.current_leader != Some(m.id)
                || (m
                    .last_applied
                    .is_some_and(|l| l.leader_id.term == m.current_term)
                    && m.membership_config.log_id().map(|l| l.index)
                        <= m.last_applied.map(|l| l.index))
        });
        let waited = tokio::time::timeout(MEMBERSHIP_COMMIT_WAIT, committed)
            .await
            .map(|seen| seen.is_ok());
        match waited {
            Ok(true) => Ok(()),
            Ok(false) => Err(ApiError::ShuttingDown),
            Err(_) => Err(ApiError::Unavailable(format!(
                "the membership in effect is not committed after {MEMBERSHIP_COMMIT_WAIT:?} \
                 (no quorum?); nothing was changed"
            ))),
        }
    }

    /// Adds a replica as a learner, waits until it has caught up, then promotes it to voter.
    ///
    /// A learner that never answers (nobody runs it at that address) is removed again after
    /// [`LEARNER_FIRST_CONTACT_MAX`] and the call fails saying so, so nothing is left behind;
    /// one that answers but does not catch up within [`MEMBER_CATCH_UP_TIMEOUT`] stays a
    /// learner, and the error says how to remove it. Membership changes are serialised at
    /// this replica and incremental (openraft's `AddVoterIds`), so two changes never undo
    /// each other.
    pub async fn add_member(&self, id: NodeId, member: Member) -> Result<(), ApiError> {
        let _serialised = self.inner.membership_changes.lock().await;
        // Looked at under the lock, which a handover takes to begin: none begins until this
        // change, and all its writes to Raft, are over.
        self.refuse_while_handing_over()?;
        self.membership_committed().await?;
        self.check_member_level(id, &member).await?;
        let raft = &self.inner.raft;
        asked_again_while_in_progress(|| raft.add_learner(id, member.clone(), false)).await?;
        let mut metrics = raft.metrics();
        let started = tokio::time::Instant::now();
        loop {
            let matched = {
                let m = metrics.borrow_and_update();
                let matched = m
                    .replication
                    .as_ref()
                    .and_then(|r| r.get(&id).copied().flatten())
                    .map(|l| l.index);
                match (matched, m.last_log_index) {
                    (Some(matched), Some(last))
                        if matched + MEMBER_CATCH_UP_ENTRIES_MAX >= last =>
                    {
                        break
                    }
                    (matched, _) => matched,
                }
            };
            let deadline = started
                + if matched.is_some() {
                    MEMBER_CATCH_UP_TIMEOUT
                } else {
                    LEARNER_FIRST_CONTACT_MAX
                };
            match tokio::time::timeout_at(deadline, metrics.changed()).await {
                Ok(Ok(())) => {}
                Ok(Err(_)) => return Err(ApiError::ShuttingDown),
                Err(_) if matched.is_none() => {
                    raft.change_membership(ChangeMembers::RemoveNodes(BTreeSet::from([id])), false)
                        .await
                        .map_err(ApiError::from)?;
                    // Refused, not `Unavailable`: the change is over, and a client retrying a
                    // retriable error would add and remove the replica again until its deadline.
                    return Err(ApiError::Rejected(format!(
                        "replica {id} did not answer within {LEARNER_FIRST_CONTACT_MAX:?}; \
                         it was removed again"
                    )));
                }
                Err(_) => {
                    return Err(ApiError::Rejected(format!(
                        "learner {id} did not catch up within {MEMBER_CATCH_UP_TIMEOUT:?}; it \
                         stays a learner (`ctrlog members remove --id {id}` removes it)"
                    )))
                }
            }
        }
        asked_again_while_in_progress(|| {
            raft.change_membership(ChangeMembers::AddVoterIds(BTreeSet::from([id])), false)
        })
        .await?;
        tracing::info!(member = id, "promoted to voter");
        Ok(())
    }

    /// Refuses, before anything is added, a replica whose build does not know the recorded
    /// vocabulary level: it would stop applying once it caught up (or, built before that
    /// stop existed, decide commands differently). Every release knows up to
    /// [`LEVEL_KNOWN_TO_EVERY_RELEASE`], so the replica is asked only above it; asked, it
    /// must answer within [`LEARNER_FIRST_CONTACT_MAX`] (a build from before the question,
    /// like one not running, does not).
    async fn check_member_level(&self, id: NodeId, member: &Member) -> Result<(), ApiError> {
        let recorded = self.inner.state_machine.read(|state| state.job.level());
        if recorded <= LEVEL_KNOWN_TO_EVERY_RELEASE {
            return Ok(());
        }
        let consequence = format!(
            "the log records level {recorded}, which builds too old to answer do not know; \
             nothing was added"
        );
        // A replica started just before it is added may not listen yet: it is given the time
        // a learner is given for its first contact.
        let asked = tokio::time::Instant::now();
        let supported = loop {
            match self.member_level_max(id, member, &consequence).await {
                Err(_) if asked.elapsed() < LEARNER_FIRST_CONTACT_MAX => {
                    tokio::time::sleep(MEMBER_LEVEL_RETRY).await;
                }
                answer => break answer?,
            }
        };
        if supported < recorded {
            return Err(ApiError::MemberLevelUnsupported {
                member: id,
                supported,
                recorded,
            });
        }
        Ok(())
    }

    /// The highest vocabulary level replica `id`'s build knows, asked over the peer port; a
    /// replica that does not answer is refused with `consequence` (what was not done).
    async fn member_level_max(
        &self,
        id: NodeId,
        member: &Member,
        consequence: &str,
    ) -> Result<Level, ApiError> {
        self.inner
            .levels
            .level_max(id, member, MEMBER_LEVEL_ANSWER_MAX)
            .await
            .map_err(|why| {
                ApiError::Rejected(format!(
                    "replica {id} did not say which vocabulary levels it knows ({why}); \
                     {consequence}"
                ))
            })
    }

    /// Refuses to raise the vocabulary level to `level` unless every other member's build says
    /// it knows it: one that did not would stop applying (or decide commands differently)
    /// once the level is recorded.
    pub(super) async fn check_members_know_level(&self, level: Level) -> Result<(), ApiError> {
        for (member, answer) in self.member_levels().await {
            let supported = answer?;
            if supported < level {
                tracing::warn!(member, supported, level, "vocabulary raise refused");
                return Err(Rejection::LevelUnsupported {
                    requested: level,
                    supported,
                }
                .into());
            }
        }
        Ok(())
    }

    /// Each other member's answer to which vocabulary levels its build knows, asked over the
    /// peer port with this replica's own credentials, so a caller needs no right beyond the
    /// one to append.
    pub async fn member_levels(&self) -> Vec<(NodeId, Result<Level, ApiError>)> {
        let membership = self.metrics().membership_config.membership().clone();
        let mut answers = Vec::new();
        for (id, member) in membership.nodes() {
            if *id != self.inner.id {
                let answer = self
                    .member_level_max(*id, member, "the level was not raised")
                    .await;
                answers.push((*id, answer));
            }
        }
        answers
    }

    /// Removes a replica from the cluster: a voter (which leaves the membership entirely) or a
    /// learner. Serialised with the other membership changes at this replica.
    pub async fn remove_member(&self, id: NodeId) -> Result<(), ApiError> {
        let _serialised = self.inner.membership_changes.lock().await;
        // Under the lock, as in `add_member`.
        self.refuse_while_handing_over()?;
        self.membership_committed().await?;
        let metrics = self.metrics();
        // Only the leader's membership can judge the change: a replica the founding membership
        // has not reached yet would answer that no such member exists.
        if metrics.current_leader != Some(metrics.id) {
            return Err(not_leader_from(&metrics));
        }
        let membership = metrics.membership_config.membership().clone();
        let voters: BTreeSet<NodeId> = membership.voter_ids().collect();
        let change = if voters.contains(&id) {
            if voters.len() == 1 {
                return Err(ApiError::Rejected("cannot remove the last voter".into()));
            }
            ChangeMembers::RemoveVoters(BTreeSet::from([id]))
        } else if membership.get_node(&id).is_some() {
            ChangeMembers::RemoveNodes(BTreeSet::from([id]))
        } else {
            return Err(ApiError::Rejected(format!("{id} is not a member")));
        };
        // `retain: false`: a removed voter leaves the membership instead of staying a learner.
        let raft = &self.inner.raft;
        asked_again_while_in_progress(|| raft.change_membership(change.clone(), false)).await?;
        tracing::info!(member = id, "removed");
        Ok(())
    }
}

/// Runs one membership change, asking again for up to [`MEMBERSHIP_COMMIT_WAIT`] while
/// openraft refuses it as "already undergoing a configuration change". openraft says so for a
/// moment after the membership in effect was seen applied (a new cluster's leader right after
/// its first election: seen in CI for an add and for a remove alike), and the change has not
/// begun then, so asking again changes nothing twice.
async fn asked_again_while_in_progress<T, F, Asked>(mut change: F) -> Result<T, ApiError>
where
    F: FnMut() -> Asked,
    Asked: std::future::Future<Output = Result<T, RaftError<ClientWriteError>>>,
{
    let asked = tokio::time::Instant::now();
    loop {
        match change().await {
            Err(RaftError::APIError(ClientWriteError::ChangeMembershipError(
                openraft::error::ChangeMembershipError::InProgress(_),
            ))) if asked.elapsed() < MEMBERSHIP_COMMIT_WAIT => {
                tokio::time::sleep(MEMBERSHIP_RETRY).await;
            }
            answer => return answer.map_err(ApiError::from),
        }
    }
}
