//! [`ContainerSession`]: a container's membership in the job, from registration to fencing.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use tokio::sync::watch;
use tokio::task::JoinHandle;

use super::connection::{ClientError, ControlClient};
use super::subscription::Subscription;
use crate::log::{
    Ack, Command, ContainerId, DeregisterContainer, Epoch, Filter, Offset, RegisterContainer,
    TaskId, TaskStarted, TaskStopped,
};
use crate::wire::protocol::{ApiError, AppendAck};

/// How a session registers and heartbeats.
#[derive(Clone, Debug)]
pub struct SessionOptions {
    /// How often the session tells the leader it is alive. The coordinator's session timeout
    /// should be several of these.
    pub heartbeat_interval: Duration,
    /// Free text for operators: where this container runs.
    pub location: String,
}

impl SessionOptions {
    /// Whether these options can work: a heartbeat interval above zero and at most
    /// [`OPTION_DURATION_MAX`](super::OPTION_DURATION_MAX).
    pub fn check(&self) -> Result<(), ClientError> {
        if self.heartbeat_interval.is_zero() || self.heartbeat_interval > super::OPTION_DURATION_MAX
        {
            return Err(ClientError::Config {
                option: "heartbeat_interval",
                reason: format!(
                    "{:?} is not between zero and {:?}",
                    self.heartbeat_interval,
                    super::OPTION_DURATION_MAX
                ),
            });
        }
        Ok(())
    }
}

impl Default for SessionOptions {
    fn default() -> Self {
        SessionOptions {
            heartbeat_interval: Duration::from_secs(1),
            location: format!("pid {}", std::process::id()),
        }
    }
}

/// A container's session: registered (its epoch is the registration's offset), heartbeating
/// in the background with the lag its callback reports, reading the commands addressed to it
/// plus broadcasts, and answering them. Every answer carries the epoch; once the session is
/// fenced (expired, or the container registered again elsewhere) the cluster refuses them all
/// with `Fenced`, and [`ContainerSession::fenced`] resolves: stop work and join again.
///
/// ```no_run
/// # async fn example(client: ctrlog::client::ControlClient) -> Result<(), ctrlog::client::ClientError> {
/// use ctrlog::client::{ContainerSession, SessionOptions, SubscriptionItem};
/// use ctrlog::log::{Command, ContainerId};
/// use futures::StreamExt;
///
/// let me = ContainerId::new("container-1").expect("valid id");
/// let session = ContainerSession::join(client, me, SessionOptions::default(), Default::default).await?;
/// let mut commands = session.commands();
/// while let Some(item) = commands.next().await {
///     if let SubscriptionItem::Entry(entry) = item? {
///         match entry.command() {
///             Command::AssignTask(assign) => { /* start it */ session.task_started(assign.task).await?; }
///             Command::StopTask(stop) => { /* stop it */ session.task_stopped(stop.task, None).await?; }
///             _ => { session.ack(entry.offset).await?; }
///         }
///     }
/// }
/// # Ok(()) }
/// ```
pub struct ContainerSession {
    client: ControlClient,
    container: ContainerId,
    epoch: Epoch,
    fenced: watch::Receiver<Option<ApiError>>,
    /// When the last heartbeat the leader accepted was sent.
    last_accepted: watch::Receiver<Instant>,
    heartbeats: JoinHandle<()>,
}

impl std::fmt::Debug for ContainerSession {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ContainerSession")
            .field("container", &self.container)
            .field("epoch", &self.epoch)
            .field("fenced", &self.fenced.borrow().is_some())
            .finish_non_exhaustive()
    }
}

impl Drop for ContainerSession {
    fn drop(&mut self) {
        self.heartbeats.abort();
    }
}

impl ContainerSession {
    /// Registers `container` and starts heartbeating with the lag `lag` reports per task.
    /// `client` is a [`ControlClient`] (or an `Arc` of one); the session keeps a handle.
    /// Options that cannot work (a zero heartbeat interval) are refused with
    /// [`ClientError::Config`] before anything is sent.
    pub async fn join<L>(
        client: impl Into<ControlClient>,
        container: ContainerId,
        options: SessionOptions,
        lag: L,
    ) -> Result<ContainerSession, ClientError>
    where
        L: Fn() -> BTreeMap<TaskId, u64> + Send + Sync + 'static,
    {
        let client = client.into();
        options.check()?;
        let registration = Command::RegisterContainer(RegisterContainer {
            container: container.clone(),
            location: options.location.clone(),
        });
        let epoch = client.append(registration).await?.offset;
        let (fence, fenced) = watch::channel(None);
        let (accepted, last_accepted) = watch::channel(Instant::now());
        let heartbeats = tokio::spawn(heartbeat_loop(
            client.clone(),
            Beat {
                container: container.clone(),
                epoch,
                interval: options.heartbeat_interval,
            },
            lag,
            fence,
            accepted,
        ));
        tracing::info!(%container, epoch, "container session joined");
        Ok(ContainerSession {
            client,
            container,
            epoch,
            fenced,
            last_accepted,
            heartbeats,
        })
    }

    /// The container this session registered.
    pub fn container(&self) -> &ContainerId {
        &self.container
    }

    /// This session's epoch: the offset of its registration.
    pub fn epoch(&self) -> Epoch {
        self.epoch
    }

    /// The commands for this container plus broadcasts, from just after its registration, in
    /// order, resuming across failures.
    pub fn commands(&self) -> Subscription {
        self.client
            .subscribe(self.epoch + 1, Filter::Container(self.container.clone()))
    }

    /// How long ago the last heartbeat the leader accepted was sent (the registration counts
    /// as one). A container should stop work once this exceeds a lease shorter than the
    /// coordinator's session timeout: by then the coordinator may have expired it and given its
    /// tasks to another container.
    ///
    /// Check it on a timer of its own, not only between commands: an answer
    /// ([`task_stopped`](Self::task_stopped) and the others) to a leader this container cannot
    /// reach waits up to the client's retry deadline, far longer than any lease.
    pub fn heartbeat_age(&self) -> Duration {
        self.last_accepted.borrow().elapsed()
    }

    /// Whether the cluster has fenced this session.
    pub fn is_fenced(&self) -> bool {
        self.fenced.borrow().is_some()
    }

    /// Resolves once the cluster fences this session, with the refusal that said so.
    pub async fn fenced(&self) -> ApiError {
        let mut fenced = self.fenced.clone();
        let refusal = match fenced.wait_for(Option::is_some).await {
            Ok(refusal) => refusal.clone().expect("waited for Some"),
            Err(_) => ApiError::ShuttingDown,
        };
        refusal
    }

    /// Answers an assignment: the task runs here.
    pub async fn task_started(&self, task: TaskId) -> Result<AppendAck, ClientError> {
        self.answer(Command::TaskStarted(TaskStarted {
            task,
            container: self.container.clone(),
            epoch: self.epoch,
        }))
        .await
    }

    /// Answers a stop: the task stopped here, resumable from `checkpoint`.
    pub async fn task_stopped(
        &self,
        task: TaskId,
        checkpoint: Option<Vec<u8>>,
    ) -> Result<AppendAck, ClientError> {
        self.answer(Command::TaskStopped(TaskStopped {
            task,
            container: self.container.clone(),
            epoch: self.epoch,
            checkpoint,
        }))
        .await
    }

    /// Acknowledges the command at `offset` (a schema or config change, or a user command).
    pub async fn ack(&self, offset: Offset) -> Result<AppendAck, ClientError> {
        self.answer(Command::Ack(Ack {
            container: self.container.clone(),
            epoch: self.epoch,
            offset,
        }))
        .await
    }

    /// Leaves the job cleanly: deregisters (after the coordinator drained this container).
    pub async fn leave(self) -> Result<AppendAck, ClientError> {
        self.heartbeats.abort();
        self.answer(Command::DeregisterContainer(DeregisterContainer {
            container: self.container.clone(),
            epoch: self.epoch,
        }))
        .await
    }

    async fn answer(&self, command: Command) -> Result<AppendAck, ClientError> {
        self.client.append(command).await
    }
}

/// Who heartbeats, and how often.
struct Beat {
    container: ContainerId,
    epoch: Epoch,
    interval: Duration,
}

async fn heartbeat_loop<L>(
    client: ControlClient,
    beat: Beat,
    lag: L,
    fence: watch::Sender<Option<ApiError>>,
    accepted: watch::Sender<Instant>,
) where
    L: Fn() -> BTreeMap<TaskId, u64>,
{
    let Beat {
        container,
        epoch,
        interval,
    } = beat;
    let mut ticker = tokio::time::interval(interval);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticker.tick().await;
        let sent = Instant::now();
        match client.heartbeat(&container, epoch, &lag()).await {
            Ok(_) => {
                accepted.send_replace(sent);
            }
            Err(ClientError::Api(refusal @ ApiError::Fenced { .. })) => {
                tracing::warn!(%container, epoch, %refusal, "container session fenced");
                fence.send_replace(Some(refusal));
                return;
            }
            // The client already retried through failover; keep trying at the next tick.
            Err(error) => tracing::warn!(%container, epoch, %error, "heartbeat failed"),
        }
    }
}
