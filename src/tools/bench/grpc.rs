//! The bench's gRPC side (`--protocol grpc`): producers and subscribers that speak the
//! published contract (`proto/ctrlog/v1`) with the client tonic generates, as a container in
//! another language would, so that its figures sit beside the tarpc client's.

use std::time::Duration;

use anyhow::Context;
use tonic::transport::{Channel, Endpoint};

use crate::log::{Command, LogEntry};
use crate::wire::grpc::{detail_of, pb};
use pb::control_log_client::ControlLogClient;

/// How the bench's clients reach the replicas.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum Protocol {
    /// The client port and the Rust client library (`ControlClient`), batching included.
    #[default]
    Tarpc,
    /// The gRPC port, one call per append, as a client in another language makes them.
    Grpc,
}

async fn channel(addr: &str) -> anyhow::Result<Channel> {
    Endpoint::from_shared(format!("http://{addr}"))?
        .connect_timeout(Duration::from_secs(5))
        .connect()
        .await
        .with_context(|| format!("connecting to the gRPC port at {addr}"))
}

/// The gRPC port of the leader, asked of the first seed that answers `Status`.
pub async fn leader_addr(seeds: &[String]) -> anyhow::Result<String> {
    for seed in seeds {
        let Ok(channel) = channel(seed).await else {
            continue;
        };
        let Ok(status) = ControlLogClient::new(channel)
            .status(pb::StatusRequest {})
            .await
        else {
            continue;
        };
        let status = status.into_inner();
        let leader = status.leader_id.and_then(|leader| {
            let member = status.members.iter().find(|m| m.id == leader)?;
            member.grpc_addr.clone()
        });
        if let Some(leader) = leader {
            return Ok(leader);
        }
    }
    anyhow::bail!("no replica of {seeds:?} named a leader with a gRPC port")
}

/// An idempotent producer over the gRPC port: its own id, its sequence, and a channel to the
/// leader (shared with other producers when they share a connection).
pub struct GrpcProducer {
    client: ControlLogClient<Channel>,
    producer: u64,
    seq: std::sync::atomic::AtomicU64,
}

impl GrpcProducer {
    /// `producers` producers over `connections` channels to the leader (round-robin).
    pub async fn many(
        seeds: &[String],
        producers: usize,
        connections: usize,
    ) -> anyhow::Result<Vec<GrpcProducer>> {
        let leader = leader_addr(seeds).await?;
        let mut channels = Vec::new();
        for _ in 0..connections.clamp(1, producers.max(1)) {
            channels.push(channel(&leader).await?);
        }
        Ok((0..producers)
            .map(|i| GrpcProducer {
                client: ControlLogClient::new(channels[i % channels.len()].clone()),
                producer: rand::random::<u64>() >> 1,
                seq: Default::default(),
            })
            .collect())
    }

    /// Appends `command`, durably, retrying with the same pair what may succeed later (the
    /// port answers `RESOURCE_EXHAUSTED` when the connection has too much in flight, as the
    /// Rust client retries `Overloaded`), for up to [`APPEND_RETRY_DEADLINE`]; a refusal is
    /// the error, in words.
    pub async fn append(&self, command: Command) -> Result<(), String> {
        let seq = 1 + (self.seq).fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let request = pb::AppendRequest {
            producer: Some(pb::ProducerSeq {
                producer: self.producer,
                seq,
            }),
            target: pb::Target::All.into(),
            target_container: String::new(),
            command: Some(pb::append_request::Command::Frame(
                (&command.into_frame()).into(),
            )),
        };
        let give_up = tokio::time::Instant::now() + APPEND_RETRY_DEADLINE;
        let mut backoff = Duration::from_millis(1);
        loop {
            let status = match self.client.clone().append(request.clone()).await {
                Ok(_) => return Ok(()),
                Err(status) => status,
            };
            let retriable = matches!(
                status.code(),
                tonic::Code::ResourceExhausted | tonic::Code::Unavailable
            );
            if !retriable || tokio::time::Instant::now() + backoff > give_up {
                return Err(match detail_of(&status) {
                    Some(detail) => format!("{}: {detail:?}", status.code()),
                    None => status.to_string(),
                });
            }
            tokio::time::sleep(backoff).await;
            backoff = (backoff * 2).min(Duration::from_millis(100));
        }
    }
}

/// How long a bench producer retries an append that may succeed later.
const APPEND_RETRY_DEADLINE: Duration = Duration::from_secs(30);

/// A `Subscribe` stream from `from` at `seed` on a connection of its own, opened and never
/// read: what the replica holds for a subscriber that stops reading (HTTP/2 flow control
/// stops its sends once the stream's window is full).
pub async fn never_read(
    seed: &str,
    from: u64,
) -> anyhow::Result<tonic::Streaming<pb::SubscribeReply>> {
    let mut client = ControlLogClient::new(channel(seed).await?);
    let request = pb::SubscribeRequest {
        from,
        ..Default::default()
    };
    Ok(client.subscribe(request).await?.into_inner())
}

/// Every committed entry from `from`, over one `Subscribe` stream at `seed`, for as long as
/// it lasts: each entry's kind, body and offset go to `each` (which returns false to stop).
pub async fn subscribe(
    seed: &str,
    from: u64,
    mut each: impl FnMut(&LogEntry) -> bool,
) -> anyhow::Result<()> {
    let mut client = ControlLogClient::new(channel(seed).await?);
    let request = pb::SubscribeRequest {
        from,
        ..Default::default()
    };
    let mut stream = client.subscribe(request).await?.into_inner();
    while let Some(reply) = stream.message().await? {
        for entry in reply.entries {
            let Some(frame) = entry.frame else { continue };
            let entry = LogEntry {
                offset: entry.offset,
                term: entry.term,
                appended_at_ms: entry.appended_at_ms,
                producer: None,
                target: crate::log::Target::All,
                frame: crate::log::Frame {
                    kind: frame.kind,
                    version: frame.version as u16,
                    body: frame.body,
                },
            };
            if !each(&entry) {
                return Ok(());
            }
        }
    }
    Ok(())
}
