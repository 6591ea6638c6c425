//! Durable-commit throughput, fan-out delivery lag and restart time of a 3-replica loopback
//! cluster. Every append goes through the client library over TCP and is acknowledged once it
//! is fsynced on a majority and applied.
//!
//! `cargo run --release --example throughput [seconds-per-phase]`

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ctrlog::client::{ControlClient, SubscriptionItem};
use ctrlog::log::{Command, Filter, Proposal, Target};
use ctrlog::server::ReplicaHandle;
use ctrlog::tools::LocalCluster;
use futures::StreamExt;
use hdrhistogram::Histogram;

const WAIT: Duration = Duration::from_secs(120);
const PAYLOAD_BYTES: usize = 256;

fn payload(index: u64) -> Vec<u8> {
    let mut body = index.to_be_bytes().to_vec();
    body.resize(PAYLOAD_BYTES, 7);
    body
}

fn index_of(body: &[u8]) -> u64 {
    u64::from_be_bytes(body[..8].try_into().expect("8-byte prefix"))
}

/// `clients` clients, each appending sequentially for `duration`; returns (commits/s, p50 µs,
/// p99 µs).
async fn append_phase(seeds: &[String], clients: usize, duration: Duration) -> (f64, u64, u64) {
    let mut connected = Vec::new();
    for _ in 0..clients {
        connected.push(ControlClient::connect(seeds).await.expect("connect"));
    }
    let stop = Arc::new(AtomicBool::new(false));
    let started = Instant::now();
    let tasks: Vec<_> = connected
        .into_iter()
        .map(|client| {
            let stop = stop.clone();
            tokio::spawn(async move {
                let mut histogram = Histogram::<u64>::new(3).unwrap();
                while !stop.load(Ordering::Relaxed) {
                    let sent = Instant::now();
                    let command = Command::custom(1, 1, payload(0));
                    if client.append_to(Target::All, command).await.is_ok() {
                        histogram.record(sent.elapsed().as_micros() as u64).unwrap();
                    }
                }
                histogram
            })
        })
        .collect();
    tokio::time::sleep(duration).await;
    stop.store(true, Ordering::Relaxed);
    let mut all = Histogram::<u64>::new(3).unwrap();
    for task in tasks {
        all.add(task.await.unwrap()).unwrap();
    }
    let elapsed = started.elapsed().as_secs_f64();
    (
        all.len() as f64 / elapsed,
        all.value_at_quantile(0.5),
        all.value_at_quantile(0.99),
    )
}

struct FanOut {
    appended: u64,
    /// From the moment each append was sent to the moment a subscriber received it.
    since_sent: Histogram<u64>,
    /// From the moment the writer got its acknowledgement (committed and applied on the
    /// leader) to the moment a subscriber received it; zero when delivery came first.
    since_commit: Histogram<u64>,
    append_latency: Histogram<u64>,
}

/// `subscribers` subscriptions reading everything while writers append `rate` commands/s.
async fn fan_out_phase(
    seeds: &[String],
    subscribers: usize,
    rate: u64,
    duration: Duration,
) -> FanOut {
    let total = rate * duration.as_secs();
    let base = Instant::now();
    let micros = move || base.elapsed().as_micros() as u64;
    // 0 = not yet happened; times are µs since `base`, offset by one.
    let sent: Arc<Vec<AtomicU64>> = Arc::new((0..total).map(|_| AtomicU64::new(0)).collect());
    let acked: Arc<Vec<AtomicU64>> = Arc::new((0..total).map(|_| AtomicU64::new(0)).collect());
    let start_offset = ControlClient::connect(seeds)
        .await
        .unwrap()
        .leader_status()
        .await
        .unwrap()
        .applied_offset
        + 1;

    let mut readers = Vec::new();
    for _ in 0..subscribers {
        let client = ControlClient::connect(seeds).await.expect("connect");
        let (sent, acked) = (sent.clone(), acked.clone());
        readers.push(tokio::spawn(async move {
            let mut since_sent = Histogram::<u64>::new(3).unwrap();
            let mut received = Vec::with_capacity(total as usize);
            let mut stream = client.subscribe(start_offset, Filter::Everything);
            while (received.len() as u64) < total {
                match stream.next().await {
                    Some(Ok(SubscriptionItem::Entry(entry))) => {
                        let now = micros() + 1;
                        let index = index_of(&entry.frame.body);
                        let sent_at = sent[index as usize].load(Ordering::Acquire);
                        since_sent.record(now.saturating_sub(sent_at)).unwrap();
                        received.push((index, now));
                    }
                    other => panic!("subscription: {other:?}"),
                }
            }
            // Acknowledgements may arrive after delivery; read them once all are in.
            (since_sent, received, acked)
        }));
    }

    let writers: Vec<Arc<ControlClient>> = {
        let mut writers = Vec::new();
        for _ in 0..4 {
            writers.push(Arc::new(ControlClient::connect(seeds).await.unwrap()));
        }
        writers
    };
    let mut ticker = tokio::time::interval(Duration::from_micros(1_000_000 / rate));
    let mut appends = Vec::with_capacity(total as usize);
    for index in 0..total {
        ticker.tick().await;
        let writer = writers[index as usize % writers.len()].clone();
        let (sent, acked) = (sent.clone(), acked.clone());
        appends.push(tokio::spawn(async move {
            let command = Command::custom(1, 1, payload(index));
            let started = micros() + 1;
            sent[index as usize].store(started, Ordering::Release);
            writer
                .append_to(Target::All, command)
                .await
                .expect("append");
            let done = micros() + 1;
            acked[index as usize].store(done, Ordering::Release);
            done - started
        }));
    }
    let mut append_latency = Histogram::<u64>::new(3).unwrap();
    for append in appends {
        append_latency.record(append.await.unwrap()).unwrap();
    }
    let mut since_sent = Histogram::<u64>::new(3).unwrap();
    let mut since_commit = Histogram::<u64>::new(3).unwrap();
    for reader in readers {
        let (histogram, received, acked) = reader.await.unwrap();
        since_sent.add(histogram).unwrap();
        for (index, at) in received {
            let acked_at = acked[index as usize].load(Ordering::Acquire);
            since_commit.record(at.saturating_sub(acked_at)).unwrap();
        }
    }
    FanOut {
        appended: total,
        since_sent,
        since_commit,
        append_latency,
    }
}

fn ms(micros: u64) -> f64 {
    micros as f64 / 1000.0
}

/// Fills the log through the library API (one command per Raft entry) until it holds
/// `entries` Raft entries.
async fn fill(leader: &ReplicaHandle, entries: u64) {
    while leader.metrics().last_log_index.unwrap_or(0) < entries {
        let proposal = Proposal {
            producer: None,
            target: Target::All,
            frame: Command::custom(1, 1, payload(0)).into_frame(),
        };
        leader.append(proposal).await.expect("append");
    }
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let seconds: u64 = std::env::args().nth(1).map_or(Ok(5), |s| s.parse())?;
    let phase = Duration::from_secs(seconds);
    let dir = tempfile::tempdir()?;
    let mut cluster = LocalCluster::start(dir.path(), 3, |_| {}).await?;
    let leader_id = cluster.wait_for_leader(WAIT).await?;
    let leader = cluster.replica(leader_id).clone_handle();
    let seeds = cluster.client_addrs();

    println!("| clients | commits/s | p50 latency | p99 latency |");
    println!("|---|---|---|---|");
    for clients in [1, 64, 256] {
        let (rate, p50, p99) = append_phase(&seeds, clients, phase).await;
        println!(
            "| {clients} | {rate:.0} | {:.2} ms | {:.2} ms |",
            ms(p50),
            ms(p99)
        );
    }

    let fan_out = fan_out_phase(&seeds, 100, 1000, phase).await;
    println!(
        "\nfan-out: 100 subscribers, {} commands at 1,000/s; deliveries {}",
        fan_out.appended,
        fan_out.since_sent.len()
    );
    println!("| measured | p50 | p99 | max |\n|---|---|---|---|");
    for (name, histogram) in [
        ("append sent → delivered", &fan_out.since_sent),
        ("commit acknowledged → delivered", &fan_out.since_commit),
        ("append latency", &fan_out.append_latency),
    ] {
        println!(
            "| {name} | {:.2} ms | {:.2} ms | {:.2} ms |",
            ms(histogram.value_at_quantile(0.5)),
            ms(histogram.value_at_quantile(0.99)),
            ms(histogram.max())
        );
    }

    // Restart: fill to 100,000 Raft entries (snapshots every 10,000 entries by default), stop
    // a follower, restart it, and time until it has applied everything the leader has.
    fill(&leader, 100_000).await;
    let applied = leader.applied_offset();
    cluster.wait_for_applied(applied, WAIT).await?;
    let follower = cluster.follower_of(leader_id);
    cluster.stop(follower).await;
    let started = Instant::now();
    cluster.restart(follower).await?;
    let opened = started.elapsed();
    cluster.wait_for_applied(applied, WAIT).await?;
    let rejoined = started.elapsed();
    let metrics = cluster.replica(follower).metrics();
    println!(
        "\nrestart with {applied} commands ({} log entries, snapshot at entry {:?}): storage open + Raft start {:.0} ms, applied everything again after {:.0} ms",
        metrics.last_log_index.unwrap_or(0),
        metrics.snapshot.map(|l| l.index),
        opened.as_secs_f64() * 1000.0,
        rejoined.as_secs_f64() * 1000.0
    );
    cluster.shutdown().await;
    Ok(())
}
