//! The rules of a caller's requests, one implementation for both client-facing ports: the
//! tarpc client port ([`client`](super::client)) and the gRPC port ([`grpc`](super::grpc)).
//!
//! A [`Caller`] is one connection's view of the replica: who it is (a client certificate, or
//! a token it presented), what it may hold of its connection's, its principal's and the
//! port's budgets, and every request a container or a tool makes, each admitted, checked
//! against the principal's role and served through the [`ReplicaHandle`] the same way
//! whichever protocol carried it. A port only decodes requests, encodes answers and says when
//! an answer has been written (what a request holds of the budgets is given back then).

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU32, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rustls::pki_types::CertificateDer;
use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore};

use crate::log::{ContainerId, Epoch, Offset, Proposal, TaskId};
use crate::raft::refusals::Refusals;
use crate::server::handle::ReplicaHandle;
use crate::server::ports::auth::{authorize, Action, Authenticator, Principal};
use crate::server::ports::connections::{Admission, PortLimits};
use crate::wire::protocol::{
    ApiError, AppendAck, FetchRequest, FetchResponse, HeartbeatAck, Member, StateAt, Status,
    StorageStatus, APPEND_MANY_PROPOSALS_MAX,
};
use crate::NodeId;

/// The longest a long poll waits, whatever the request asks.
pub const FETCH_WAIT_MAX: Duration = Duration::from_secs(60);

/// Fetches in flight on one connection. A subscription keeps one; a few let a client share a
/// connection between subscriptions. The bound is what keeps a client that sends fetches but
/// never reads the answers from pinning more than this many answers in the replica's memory.
pub const FETCHES_IN_FLIGHT_MAX: usize = 4;

/// Failed authentications one connection may make (a wrong token to `authenticate`, or on a
/// gRPC call); its next request of any kind closes it. Guessing tokens then costs a
/// connection (and a TLS handshake) per few guesses.
pub const AUTHENTICATE_FAILURES_MAX: u32 = 3;

/// What a request in flight is counted to hold of its principal's share and the port's
/// budget until it is answered: its task, its decoded request and its place in the
/// connection's buffers. Measured at about 6.5 KB for a long poll (DEPLOY.md, "Bounds").
pub const REQUEST_HELD_BYTES: u32 = 8 << 10;

/// What a client-facing port and each of its connections may hold.
#[derive(Clone, Debug)]
pub struct ConnectionBudget {
    /// What the port holds: connections, bytes being received, idle and read timeouts.
    pub port: PortLimits,
    /// Requests, of any kind.
    pub requests: usize,
    /// Encoded bytes of appends waiting to commit.
    pub append_bytes: usize,
    /// Encoded bytes of large answers (fetches, states, state chunks, statuses) built and not
    /// yet written, on one connection.
    pub answer_bytes: usize,
    /// What the port holds for all its callers: answers not yet written, and
    /// [`REQUEST_HELD_BYTES`] per request in flight.
    pub port_answer_bytes: usize,
    /// Of that, what one principal's connections may hold together.
    pub principal_held_bytes: usize,
    /// With authentication on, how long a connection may go without authenticating.
    pub authenticate_timeout: Duration,
}

/// Each principal's share of what the port holds for its callers
/// ([`ConnectionBudget::principal_held_bytes`]), one per principal name, made at its first
/// connection; connections not yet authenticated share a sixteenth of that.
struct PrincipalShares {
    bytes_max: usize,
    unauthenticated: Arc<Semaphore>,
    by_name: Mutex<HashMap<String, Arc<Semaphore>>>,
}

impl PrincipalShares {
    fn new(bytes_max: usize) -> PrincipalShares {
        PrincipalShares {
            bytes_max,
            unauthenticated: Arc::new(Semaphore::new(bytes_max / 16)),
            by_name: Default::default(),
        }
    }

    /// The share of `principal` (`None`: not yet authenticated).
    fn of(&self, principal: Option<&Principal>) -> Arc<Semaphore> {
        let Some(principal) = principal else {
            return self.unauthenticated.clone();
        };
        let mut by_name = self.by_name.lock().expect("never poisoned");
        (by_name.entry(principal.name.clone()))
            .or_insert_with(|| Arc::new(Semaphore::new(self.bytes_max)))
            .clone()
    }
}

/// What one port's callers share: the replica, the credentials it accepts, the budgets of
/// the port and of each principal, and the port's refusal lines.
pub struct CallerPort {
    replica: ReplicaHandle,
    budget: ConnectionBudget,
    auth: Option<Arc<Authenticator>>,
    port_answer_bytes: Arc<Semaphore>,
    shares: Arc<PrincipalShares>,
    refusals: Refusals<&'static str>,
}

impl CallerPort {
    pub fn new(
        replica: ReplicaHandle,
        budget: ConnectionBudget,
        auth: Option<Arc<Authenticator>>,
    ) -> CallerPort {
        CallerPort {
            port_answer_bytes: Arc::new(Semaphore::new(budget.port_answer_bytes)),
            shares: Arc::new(PrincipalShares::new(budget.principal_held_bytes)),
            replica,
            budget,
            auth,
            refusals: Refusals::default(),
        }
    }

    pub fn budget(&self) -> &ConnectionBudget {
        &self.budget
    }

    /// The caller of a connection just accepted: authenticated by its client certificate if
    /// the cluster knows it, by nothing when authentication is off, and otherwise not yet
    /// (it must present a token within the deadline; see [`CallerPort::refused`]).
    pub fn caller(
        &self,
        peer: SocketAddr,
        certificate: Option<&CertificateDer<'static>>,
        admission: Admission,
    ) -> Caller {
        let principal = match (&self.auth, certificate) {
            (Some(auth), Some(cert)) => auth.by_certificate(cert),
            _ => None,
        };
        let must_authenticate = self.auth.is_some() && principal.is_none();
        if !must_authenticate {
            admission.authenticated();
        }
        // Without authentication every caller is the same principal: the port's budget is
        // its share.
        let share = self
            .auth
            .as_ref()
            .map(|_| self.shares.of(principal.as_ref()));
        let budget = &self.budget;
        Caller {
            replica: self.replica.clone(),
            peer,
            must_authenticate,
            in_flight: Arc::new(Semaphore::new(budget.requests)),
            in_flight_max: budget.requests as u32,
            append_bytes: Arc::new(Semaphore::new(budget.append_bytes)),
            append_bytes_max: budget.append_bytes,
            fetches: Arc::new(Semaphore::new(FETCHES_IN_FLIGHT_MAX)),
            answer_bytes: Arc::new(Semaphore::new(budget.answer_bytes)),
            port_answer_bytes: self.port_answer_bytes.clone(),
            shares: self.shares.clone(),
            share: Arc::new(Mutex::new(share)),
            held: Arc::default(),
            auth: self.auth.clone(),
            principal: Arc::new(Mutex::new(principal)),
            failed_authentications: Arc::default(),
            hang_up: Arc::default(),
            admission: Arc::new(admission),
            authenticated: Arc::default(),
        }
    }

    /// Ends once `caller`'s connection is to be closed: a request called for the hang-up
    /// (too many failed authentications), or the authentication deadline passed for a caller
    /// that must authenticate and has not. A port serves each connection until this or the
    /// connection itself ends, whichever comes first, checking this first.
    pub async fn refused(&self, caller: &Caller) {
        let timeout = self.budget.authenticate_timeout;
        tokio::select! {
            biased;
            _ = caller.hang_up.notified() => {
                if let Some(closed) = self.refusals.refused("failed authentications") {
                    tracing::info!(peer = %caller.peer, closed, "closing a connection after failed authentications (one line a second)");
                }
            }
            _ = async {
                let authenticating = caller.authenticated.notified();
                if !caller.must_authenticate
                    || tokio::time::timeout(timeout, authenticating).await.is_ok()
                {
                    std::future::pending::<()>().await;
                }
            } => {
                if let Some(closed) = self.refusals.refused("no authentication in time") {
                    tracing::info!(peer = %caller.peer, ?timeout, closed, "closing a connection that did not authenticate in time (one line a second)");
                }
            }
        }
    }
}

/// One connection's caller. Cloned per request ([`Caller::for_request`]): the clones share
/// everything but what the request holds.
#[derive(Clone)]
pub struct Caller {
    replica: ReplicaHandle,
    peer: SocketAddr,
    /// With authentication on, whether the connection came without credentials the cluster
    /// knows, so that a token must follow within the deadline.
    must_authenticate: bool,
    /// Requests in flight on this connection.
    in_flight: Arc<Semaphore>,
    in_flight_max: u32,
    /// Encoded bytes of the appends in flight on this connection.
    append_bytes: Arc<Semaphore>,
    append_bytes_max: usize,
    /// Fetches in flight on this connection (see [`FETCHES_IN_FLIGHT_MAX`]).
    fetches: Arc<Semaphore>,
    /// Encoded bytes of this connection's large answers not yet written.
    answer_bytes: Arc<Semaphore>,
    /// What the port holds for all its callers: answers not yet written, and
    /// [`REQUEST_HELD_BYTES`] per request in flight.
    port_answer_bytes: Arc<Semaphore>,
    /// The principals' shares of that.
    shares: Arc<PrincipalShares>,
    /// This connection's principal's share (`None` without authentication).
    share: Arc<Mutex<Option<Arc<Semaphore>>>>,
    /// What the request being served holds until its answer is written: its slot of
    /// `in_flight`, and of `fetches`, `answer_bytes` and `port_answer_bytes` for a large
    /// answer. Fresh for each request (see [`Caller::for_request`]).
    held: Arc<Mutex<Vec<OwnedSemaphorePermit>>>,
    /// The credentials this replica accepts; `None` when authentication is off.
    auth: Option<Arc<Authenticator>>,
    /// Who this connection is: from its client certificate, or from a token.
    principal: Arc<Mutex<Option<Principal>>>,
    /// Authentications refused on this connection.
    failed_authentications: Arc<AtomicU32>,
    /// Ends the connection (see [`AUTHENTICATE_FAILURES_MAX`]).
    hang_up: Arc<Notify>,
    /// The connection's place among the port's unauthenticated connections, left once it
    /// authenticates.
    admission: Arc<Admission>,
    /// Told once a token authenticated the connection, which then has no deadline.
    authenticated: Arc<Notify>,
}

impl Caller {
    /// A clone for one request, holding nothing yet.
    pub fn for_request(&self) -> Caller {
        Caller {
            held: Arc::default(),
            ..self.clone()
        }
    }

    /// What this request holds, taken to travel with its answer.
    pub fn take_held(&self) -> Vec<OwnedSemaphorePermit> {
        std::mem::take(&mut *self.held.lock().expect("never poisoned"))
    }

    pub fn replica(&self) -> &ReplicaHandle {
        &self.replica
    }

    /// Keeps `permit` until this request's answer is written.
    fn hold(&self, permit: OwnedSemaphorePermit) {
        self.held.lock().expect("never poisoned").push(permit);
    }

    /// Holds `bytes` of the connection's answer budget, and of its principal's share and the
    /// port's budget, until this request's answer is written; `Overloaded` when they are not
    /// free now (the answer is dropped, and the client asks again once it has read what it
    /// was sent).
    pub fn hold_answer(&self, bytes: u64) -> Result<(), ApiError> {
        let bytes = u32::try_from(bytes).unwrap_or(u32::MAX);
        let connection = (self.answer_bytes.clone())
            .try_acquire_many_owned(bytes)
            .map_err(|_| self.overloaded())?;
        self.hold_of_port(bytes)?;
        self.hold(connection);
        Ok(())
    }

    /// Holds `bytes` of the principal's share and of the port's budget until this request's
    /// answer is written; `Overloaded` when they are not free now.
    fn hold_of_port(&self, bytes: u32) -> Result<(), ApiError> {
        let share = self.share.lock().expect("never poisoned").clone();
        let of_share = share
            .map(|share| share.try_acquire_many_owned(bytes))
            .transpose()
            .map_err(|_| self.overloaded())?;
        let of_port = (self.port_answer_bytes.clone())
            .try_acquire_many_owned(bytes)
            .map_err(|_| self.overloaded())?;
        self.hold(of_port);
        if let Some(of_share) = of_share {
            self.hold(of_share);
        }
        Ok(())
    }

    fn overloaded(&self) -> ApiError {
        ApiError::Overloaded {
            in_flight_max: self.in_flight_max,
        }
    }

    /// Admits one request to the connection's budget, held until its answer is written:
    /// refused `Overloaded` when it is full, and `Unauthorized`, closing the connection, once
    /// it failed to authenticate too often.
    pub fn admit(&self) -> Result<(), ApiError> {
        let failures = self.failed_authentications.load(Relaxed);
        if failures >= AUTHENTICATE_FAILURES_MAX {
            self.hang_up.notify_one();
            return Err(ApiError::Unauthorized(format!(
                "{failures} failed authentications on this connection; closing it"
            )));
        }
        let permit = (self.in_flight.clone())
            .try_acquire_owned()
            .map_err(|_| self.overloaded())?;
        self.hold(permit);
        self.hold_of_port(REQUEST_HELD_BYTES)
    }

    /// Holds `bytes` of this connection's append budget until the permit drops; `Overloaded`
    /// when they are not free now.
    fn admit_bytes(&self, bytes: usize) -> Result<OwnedSemaphorePermit, ApiError> {
        let bytes = u32::try_from(bytes.min(self.append_bytes_max)).unwrap_or(u32::MAX);
        self.append_bytes
            .clone()
            .try_acquire_many_owned(bytes)
            .map_err(|_| self.overloaded())
    }

    /// Whether this connection may do `action` (always, when authentication is off). Refusals
    /// are counted in the metrics.
    pub fn check(&self, action: Action<'_>) -> Result<(), ApiError> {
        if self.auth.is_none() {
            return Ok(());
        }
        let result = match &*self.principal.lock().expect("never poisoned") {
            None => {
                // A request before authenticating counts toward the hang-up, as a failed
                // authentication does: a connection cannot probe the port for ever.
                self.failed_authentications.fetch_add(1, Relaxed);
                Err(ApiError::Unauthorized(
                    "present a client certificate the cluster knows, or a token".into(),
                ))
            }
            Some(principal) => authorize(principal, &action),
        };
        if let Err(refusal) = &result {
            self.replica.telemetry().auth_refused(refusal);
        }
        result
    }

    /// Makes `token`'s principal this connection's: the principal's name, or `Unauthorized`
    /// (counted toward the hang-up) for a token the cluster does not know. Anyone, when
    /// authentication is off.
    pub fn authenticate(&self, token: &str) -> Result<String, ApiError> {
        let Some(auth) = &self.auth else {
            return Ok("anyone (authentication is off)".into());
        };
        match auth.by_token(token) {
            Some(principal) => {
                let name = principal.name.clone();
                *self.share.lock().expect("never poisoned") =
                    Some(self.shares.of(Some(&principal)));
                *self.principal.lock().expect("never poisoned") = Some(principal);
                self.admission.authenticated();
                self.authenticated.notify_one();
                Ok(name)
            }
            None => {
                let refusal = ApiError::Unauthorized("unknown token".into());
                self.replica.telemetry().auth_refused(&refusal);
                self.failed_authentications.fetch_add(1, Relaxed);
                Err(refusal)
            }
        }
    }

    /// Appends `proposal` with its producer id in this connection's principal's own
    /// namespace (see [`Principal::own_producer`]), so that no principal can advance or
    /// replay another's sequences; an answer naming the recorded id names the client's again.
    /// Without authentication the id is recorded as sent.
    async fn append_as_principal(&self, mut proposal: Proposal) -> Result<AppendAck, ApiError> {
        let Some(pair) = proposal.producer.as_mut() else {
            return self.replica.append(proposal).await;
        };
        let sent = pair.producer;
        // Derived under the lock rather than cloning the principal for every append.
        let recorded = (self.principal.lock().expect("never poisoned").as_ref())
            .map(|principal| principal.own_producer(sent));
        let Some(recorded) = recorded else {
            return self.replica.append(proposal).await;
        };
        pair.producer = recorded;
        self.replica
            .append(proposal)
            .await
            .map_err(|error| match error {
                ApiError::SequenceOutOfWindow { seq, lowest, .. } => {
                    ApiError::SequenceOutOfWindow {
                        producer: sent,
                        seq,
                        lowest,
                    }
                }
                ApiError::ProducerForgotten { seq, .. } => ApiError::ProducerForgotten {
                    producer: sent,
                    seq,
                },
                other => other,
            })
    }

    pub async fn append(&self, proposal: Proposal) -> Result<AppendAck, ApiError> {
        self.admit()?;
        let _bytes = self.admit_bytes(proposal.encoded_len())?;
        self.check(Action::Append(&proposal))?;
        self.append_as_principal(proposal).await
    }

    /// Appends every proposal, answered one by one: each is checked against the role on its
    /// own, and all are queued at the proposer before any is awaited, so they share a Raft
    /// entry where they fit.
    pub async fn append_many(
        &self,
        proposals: Vec<Proposal>,
    ) -> Result<Vec<Result<AppendAck, ApiError>>, ApiError> {
        self.admit()?;
        let _bytes = self.admit_bytes(proposals.iter().map(Proposal::encoded_len).sum())?;
        if proposals.len() > APPEND_MANY_PROPOSALS_MAX {
            return Err(ApiError::Invalid(format!(
                "{} proposals in one append_many; at most {APPEND_MANY_PROPOSALS_MAX}",
                proposals.len()
            )));
        }
        self.replica
            .telemetry()
            .append_many_received(proposals.len());
        let appends = proposals.into_iter().map(|proposal| {
            let allowed = self.check(Action::Append(&proposal));
            async move {
                allowed?;
                self.append_as_principal(proposal).await
            }
        });
        Ok(futures::future::join_all(appends).await)
    }

    /// A long poll of the committed log, waiting at most `max_wait` (and
    /// [`FETCH_WAIT_MAX`]). The answer's size is held by the port, which knows its encoding
    /// ([`Caller::hold_answer`]).
    pub async fn fetch(
        &self,
        request: &FetchRequest,
        max_wait: Duration,
    ) -> Result<FetchResponse, ApiError> {
        self.admit()?;
        self.check(Action::Fetch(request))?;
        let slot =
            (self.fetches.clone())
                .try_acquire_owned()
                .map_err(|_| ApiError::Overloaded {
                    in_flight_max: FETCHES_IN_FLIGHT_MAX as u32,
                })?;
        self.hold(slot);
        self.replica
            .fetch(request, max_wait.min(FETCH_WAIT_MAX))
            .await
    }

    /// The job's state as of `min_offset` or later, waiting at most `max_wait` for it.
    pub async fn state(&self, min_offset: Offset, max_wait: Duration) -> Result<StateAt, ApiError> {
        self.admit()?;
        self.check(Action::Read)?;
        self.replica.state(min_offset, max_wait).await
    }

    pub fn status(&self) -> Result<Status, ApiError> {
        self.admit()?;
        self.check(Action::Read)?;
        Ok(self.replica.status())
    }

    pub fn heartbeat(
        &self,
        container: ContainerId,
        epoch: Epoch,
        lag: BTreeMap<TaskId, u64>,
    ) -> Result<HeartbeatAck, ApiError> {
        self.admit()?;
        self.check(Action::Heartbeat(&container))?;
        self.replica.heartbeat(container, epoch, lag)
    }

    pub async fn add_member(&self, id: NodeId, member: Member) -> Result<(), ApiError> {
        self.admit()?;
        self.check(Action::Membership)?;
        self.replica.add_member(id, member).await
    }

    pub async fn remove_member(&self, id: NodeId) -> Result<(), ApiError> {
        self.admit()?;
        self.check(Action::Membership)?;
        self.replica.remove_member(id).await
    }

    pub async fn snapshot(&self) -> Result<Offset, ApiError> {
        self.admit()?;
        self.check(Action::Snapshot)?;
        self.replica.snapshot().await
    }

    pub fn storage_status(&self) -> Result<StorageStatus, ApiError> {
        self.admit()?;
        self.check(Action::Read)?;
        let repairing = self.replica.repairing().map_err(|e| {
            ApiError::Unavailable(format!("this replica cannot read its repair record: {e}"))
        })?;
        Ok(StorageStatus {
            id: self.replica.id(),
            repairing: repairing.map(|r| r.report()),
        })
    }

    pub async fn transfer_leader(&self, to: NodeId) -> Result<NodeId, ApiError> {
        self.admit()?;
        self.check(Action::Membership)?;
        self.replica.transfer_leader(to).await
    }

    pub async fn read_index(&self) -> Result<Offset, ApiError> {
        self.admit()?;
        self.check(Action::ConsistentRead)?;
        self.replica.read_index().await
    }
}
