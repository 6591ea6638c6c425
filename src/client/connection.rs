//! [`ControlClient`]: finds the leader, follows `NotLeader`, retries with bounded backoff.

use std::hash::{BuildHasher, Hasher};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use tarpc::tokio_serde::formats::Bincode;
use tarpc::{client, context};
use tokio::sync::Mutex;

use super::protocol::*;
use crate::jobs::Outcome;
use crate::log::{Command, ProducerSeq, Proposal};
use crate::NodeId;

/// How long one call keeps retrying (failover, reconnects) before giving up. An election on
/// the default timeouts takes about a second; this leaves room for several.
pub const RETRY_DEADLINE: Duration = Duration::from_secs(30);
/// The per-request deadline sent with each call.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);
const BACKOFF_MIN: Duration = Duration::from_millis(20);
const BACKOFF_MAX: Duration = Duration::from_millis(1000);
/// Frames this client accepts: a fetch response of many entries.
pub const CLIENT_FRAME_BYTES_MAX: usize = 64 << 20;

/// Why a client call failed after its retries.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The cluster answered with an error retrying cannot fix.
    #[error(transparent)]
    Api(#[from] ApiError),
    /// No replica could serve the call before the deadline.
    #[error("gave up after {elapsed:?}: {last}")]
    GaveUp { elapsed: Duration, last: String },
}

/// A connection to a ctrlog cluster. Cheap to share behind an `Arc`.
pub struct ControlClient {
    seeds: Vec<String>,
    current: Mutex<Option<(String, ControlLogClient)>>,
    producer: u64,
    next_seq: AtomicU64,
    retry_deadline: Duration,
}

/// What to do after a failed attempt.
enum Next {
    /// Try this address next (a `NotLeader` hint).
    Redirect(String),
    /// Back off, then try the next seed.
    Retry(String),
}

impl ControlClient {
    /// Connects to the cluster through any of `seeds` (client addresses).
    pub async fn connect(seeds: &[String]) -> Result<ControlClient, ClientError> {
        let client = ControlClient {
            seeds: seeds.to_vec(),
            current: Mutex::new(None),
            producer: std::collections::hash_map::RandomState::new()
                .build_hasher()
                .finish(),
            next_seq: AtomicU64::new(1),
            retry_deadline: RETRY_DEADLINE,
        };
        client.status().await?;
        Ok(client)
    }

    /// Changes how long a call retries before giving up.
    pub fn with_retry_deadline(mut self, deadline: Duration) -> Self {
        self.retry_deadline = deadline;
        self
    }

    /// This client's producer id, which makes its appends idempotent.
    pub fn producer_id(&self) -> u64 {
        self.producer
    }

    async fn dial(addr: &str) -> Result<ControlLogClient, String> {
        let mut connect = tarpc::serde_transport::tcp::connect(addr, Bincode::default);
        connect
            .config_mut()
            .max_frame_length(CLIENT_FRAME_BYTES_MAX);
        let transport = tokio::time::timeout(Duration::from_secs(2), connect)
            .await
            .map_err(|_| format!("connecting to {addr} timed out"))?
            .map_err(|e| format!("connecting to {addr}: {e}"))?;
        Ok(ControlLogClient::new(client::Config::default(), transport).spawn())
    }

    /// Runs `call` against the leader (or any replica when `leader_only` is false), following
    /// redirects and retrying transient failures until the retry deadline.
    async fn with_retries<T, F, Fut>(&self, leader_only: bool, call: F) -> Result<T, ClientError>
    where
        F: Fn(ControlLogClient, context::Context) -> Fut,
        Fut: std::future::Future<Output = Result<Result<T, ApiError>, tarpc::client::RpcError>>,
    {
        let started = Instant::now();
        let mut backoff = BACKOFF_MIN;
        let mut seed = 0usize;
        let mut target: Option<String> = None;
        loop {
            let (addr, rpc) = {
                let mut current = self.current.lock().await;
                let wanted = target.take();
                match (&*current, wanted) {
                    (Some((addr, rpc)), None) => (addr.clone(), rpc.clone()),
                    (Some((addr, rpc)), Some(w)) if *addr == w => (addr.clone(), rpc.clone()),
                    (_, wanted) => {
                        let addr = wanted.unwrap_or_else(|| {
                            seed += 1;
                            self.seeds[seed % self.seeds.len()].clone()
                        });
                        match Self::dial(&addr).await {
                            Ok(rpc) => {
                                *current = Some((addr.clone(), rpc.clone()));
                                (addr, rpc)
                            }
                            Err(e) => {
                                *current = None;
                                drop(current);
                                self.pause(started, &mut backoff, e).await?;
                                continue;
                            }
                        }
                    }
                }
            };
            let mut ctx = context::current();
            ctx.deadline = Instant::now() + REQUEST_TIMEOUT;
            let next = match call(rpc, ctx).await {
                Ok(Ok(value)) => return Ok(value),
                Ok(Err(ApiError::NotLeader {
                    leader_client_addr: Some(leader),
                    ..
                })) if leader_only && leader != addr => Next::Redirect(leader),
                Ok(Err(ApiError::NotLeader { .. })) if leader_only => {
                    Next::Retry(format!("{addr} knows no leader yet"))
                }
                Ok(Err(ApiError::Unavailable(reason))) => Next::Retry(reason),
                Ok(Err(other)) => return Err(other.into()),
                Err(e) => Next::Retry(format!("{addr}: {e}")),
            };
            match next {
                Next::Redirect(leader) => target = Some(leader),
                Next::Retry(reason) => {
                    *self.current.lock().await = None;
                    self.pause(started, &mut backoff, reason).await?;
                }
            }
        }
    }

    async fn pause(
        &self,
        started: Instant,
        backoff: &mut Duration,
        last: String,
    ) -> Result<(), ClientError> {
        if started.elapsed() + *backoff > self.retry_deadline {
            return Err(ClientError::GaveUp {
                elapsed: started.elapsed(),
                last,
            });
        }
        tracing::debug!(backoff_ms = backoff.as_millis() as u64, reason = %last, "retrying");
        tokio::time::sleep(*backoff).await;
        *backoff = (*backoff * 2).min(BACKOFF_MAX);
        Ok(())
    }

    /// Appends a command idempotently: a retry after a lost answer or a failover returns the
    /// original offset instead of appending twice.
    pub async fn append(&self, command: Command) -> Result<Outcome, ClientError> {
        let seq = self.next_seq.fetch_add(1, Ordering::Relaxed);
        self.append_proposal(Proposal {
            producer: Some(ProducerSeq {
                producer: self.producer,
                seq,
            }),
            frame: command.into_frame(),
        })
        .await
    }

    /// Appends a proposal exactly as given, with the caller's own `(producer, seq)` if any.
    /// Retries are idempotent only if the proposal carries a producer pair.
    pub async fn append_proposal(&self, proposal: Proposal) -> Result<Outcome, ClientError> {
        self.with_retries(true, |rpc, ctx| {
            let proposal = proposal.clone();
            async move { rpc.append(ctx, proposal).await }
        })
        .await
    }

    /// Reads committed entries from any replica.
    pub async fn fetch(&self, request: FetchRequest) -> Result<FetchResponse, ClientError> {
        self.with_retries(false, |rpc, ctx| {
            let request = request.clone();
            async move { rpc.fetch(ctx, request).await }
        })
        .await
    }

    /// The status of whichever replica answers.
    pub async fn status(&self) -> Result<Status, ClientError> {
        self.with_retries(
            false,
            |rpc, ctx| async move { rpc.status(ctx).await.map(Ok) },
        )
        .await
    }

    /// The leader's status (follows redirects until a leader answers).
    pub async fn leader_status(&self) -> Result<Status, ClientError> {
        self.with_retries(true, |rpc, ctx| async move {
            rpc.status(ctx).await.map(|status| {
                if status.leader_id == Some(status.id) {
                    Ok(status)
                } else {
                    Err(ApiError::NotLeader {
                        leader_id: status.leader_id,
                        leader_client_addr: status.leader_client_addr().map(str::to_string),
                    })
                }
            })
        })
        .await
    }

    /// Adds a replica (learner first, voter once caught up).
    pub async fn add_member(&self, id: NodeId, member: Member) -> Result<(), ClientError> {
        self.with_retries(true, |rpc, mut ctx| {
            let member = member.clone();
            // Catching up can take a while; the server bounds it itself.
            ctx.deadline = Instant::now() + Duration::from_secs(90);
            async move { rpc.add_member(ctx, id, member).await }
        })
        .await
    }

    /// Removes a replica.
    pub async fn remove_member(&self, id: NodeId) -> Result<(), ClientError> {
        self.with_retries(
            true,
            |rpc, ctx| async move { rpc.remove_member(ctx, id).await },
        )
        .await
    }
}
