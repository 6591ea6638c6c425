//! `ctrlog bench`: command throughput, fan-out lag and recovery, measured against three
//! `ctrlog serve` processes (started here, in a temporary folder) or a running cluster.
//!
//! Every append is durable: acknowledged once fsynced on a majority and applied. Latencies go
//! into HDR histograms; results print as a table or, with `--json`, one object per line.

pub mod command;
pub mod grpc;
pub mod scale;

use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use futures::StreamExt;
use hdrhistogram::Histogram;
use indicatif::{ProgressBar, ProgressStyle};
use serde_json::json;

use crate::client::{ClientOptions, ControlClient, SubscriptionItem};
use crate::log::{Command, Filter, Target, CUSTOM_KIND_MIN};
use crate::tools::cluster::wait::poll_until;
use crate::tools::cluster::ProcessCluster;

/// Replicas in the cluster that `ctrlog bench` starts for itself.
pub const OWN_CLUSTER_REPLICAS: u64 = 3;

/// The user kind of the commands the bench writes, so that against a running cluster it can
/// tell its own commands from the job's.
const BENCH_KIND: u32 = 0xbe7c;

/// Writes of the disk-floor probe, each 4 KiB and `fdatasync`ed: enough for a stable median
/// in well under a second on cloud block storage (about 0.5 ms a sync).
pub const FDATASYNC_PROBE_WRITES: usize = 200;

/// The disk's durability floor where `dir` lives: the median and p99 time, in microseconds, of
/// an `fdatasync` after a 4 KiB write, over `writes` writes to a scratch file in `dir` (removed
/// after). No commit can be durable faster than one of these, so every latency the bench
/// reports is read beside it (BENCHMARKS.md).
pub fn fdatasync_floor(dir: &Path, writes: usize) -> std::io::Result<(u64, u64)> {
    use std::os::unix::fs::FileExt;
    let scratch = tempfile::Builder::new()
        .prefix("fdatasync-probe-")
        .tempfile_in(dir)?;
    let block = [0x5au8; 4096];
    let mut latencies = histogram();
    for i in 0..writes {
        let started = Instant::now();
        scratch
            .as_file()
            .write_all_at(&block, (i * block.len()) as u64)?;
        scratch.as_file().sync_data()?;
        let _ = latencies.record(started.elapsed().as_micros() as u64);
    }
    Ok((
        latencies.value_at_quantile(0.5),
        latencies.value_at_quantile(0.99),
    ))
}

pub fn histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 60_000_000, 3).expect("static bounds")
}

fn payload(index: u64, bytes: usize) -> Vec<u8> {
    let mut body = index.to_be_bytes().to_vec();
    body.resize(bytes.max(8), b'x');
    body
}

fn progress(seconds: u64, what: &str) -> ProgressBar {
    let bar = ProgressBar::new(seconds);
    bar.set_style(
        ProgressStyle::with_template("{msg} [{bar:30}] {pos}/{len} s")
            .expect("static template")
            .progress_chars("=> "),
    );
    bar.set_message(what.to_string());
    bar
}

/// Ticks a progress bar once a second until `stop`.
fn tick(bar: ProgressBar, stop: Arc<AtomicBool>) {
    tokio::spawn(async move {
        while !stop.load(Ordering::Relaxed) {
            tokio::time::sleep(Duration::from_secs(1)).await;
            bar.inc(1);
        }
        bar.finish_and_clear();
    });
}

/// The CPU time (user and system, all threads) the kernel has accounted to process `pid` so
/// far, from `/proc/<pid>/stat`; `None` if the process is gone or not readable.
pub fn cpu_time(pid: u32) -> Option<Duration> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) is in parentheses and may hold spaces; utime and stime are
    // fields 14 and 15, the 12th and 13th after it.
    let mut after_name = stat.rsplit_once(')')?.1.split_whitespace().skip(11);
    let ticks: u64 =
        after_name.next()?.parse::<u64>().ok()? + after_name.next()?.parse::<u64>().ok()?;
    // SAFETY: sysconf reads a constant of the system; no memory is involved.
    let per_second = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as u64;
    Some(Duration::from_micros(ticks * 1_000_000 / per_second))
}

/// A process whose CPU a bench accounts per commit: a name for the report, and its pid.
#[derive(Clone, Debug)]
pub struct Accounted {
    pub name: String,
    pub pid: u32,
}

/// CPU per commit over a measured window: each process's CPU time from `before` to `after`
/// divided by `commits`, in microseconds, and their sum under `total`. A process that could
/// not be read at either end is left out (and so is not in the total).
fn cpu_per_commit(
    processes: &[Accounted],
    before: &[Option<Duration>],
    after: &[Option<Duration>],
    commits: u64,
) -> serde_json::Value {
    let mut figures = serde_json::Map::new();
    let mut total = 0.0;
    for ((process, before), after) in processes.iter().zip(before).zip(after) {
        if let (Some(before), Some(after)) = (before, after) {
            let us = after.saturating_sub(*before).as_secs_f64() * 1e6 / commits.max(1) as f64;
            total += us;
            figures.insert(process.name.clone(), json!((us * 10.0).round() / 10.0));
        }
    }
    figures.insert("total".into(), json!((total * 10.0).round() / 10.0));
    serde_json::Value::Object(figures)
}

/// One stage's histogram as scraped: `(upper bound in seconds, cumulative count)` per
/// bucket, in increasing order, `+Inf` last.
pub type Buckets = Vec<(f64, u64)>;

/// The leader's `ctrlog_commit_stage_seconds` histograms ([`crate::raft::stages`]), scraped
/// from its observability port at `addr`, by stage.
pub async fn scrape_stages(
    addr: std::net::SocketAddr,
) -> anyhow::Result<std::collections::BTreeMap<String, Buckets>> {
    scrape_histograms(addr, "ctrlog_commit_stage_seconds", Some("stage")).await
}

/// The histogram `metric` scraped from the observability port at `addr`, one per value of
/// its label `label` (keyed by the empty string for a histogram without labels).
pub async fn scrape_histograms(
    addr: std::net::SocketAddr,
    metric: &str,
    label: Option<&str>,
) -> anyhow::Result<std::collections::BTreeMap<String, Buckets>> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(addr).await?;
    let request = format!("GET /metrics HTTP/1.0\r\nHost: {addr}\r\n\r\n");
    stream.write_all(request.as_bytes()).await?;
    let mut answer = String::new();
    stream.read_to_string(&mut answer).await?;
    let prefix = format!("{metric}_bucket{{");
    let mut histograms: std::collections::BTreeMap<String, Buckets> = Default::default();
    for line in answer.lines() {
        let Some(rest) = line.strip_prefix(prefix.as_str()) else {
            continue;
        };
        let value_of = |name: &str| {
            let start = rest.find(&format!("{name}=\""))? + name.len() + 2;
            Some(&rest[start..start + rest[start..].find('"')?])
        };
        let key = match label {
            Some(label) => value_of(label),
            None => Some(""),
        };
        let (Some(key), Some(le), Some(count)) = (
            key,
            value_of("le"),
            line.rsplit(' ').next().and_then(|c| c.parse::<u64>().ok()),
        ) else {
            anyhow::bail!("a {metric} line that does not parse: {line}");
        };
        let le = if le == "+Inf" {
            f64::INFINITY
        } else {
            le.parse()?
        };
        histograms
            .entry(key.to_string())
            .or_default()
            .push((le, count));
    }
    for buckets in histograms.values_mut() {
        buckets.sort_by(|a, b| a.0.total_cmp(&b.0));
    }
    Ok(histograms)
}

/// The quantile `q` of what a histogram gained between two scrapes, in microseconds,
/// interpolated within its bucket as Prometheus's `histogram_quantile` does (a value in the
/// `+Inf` bucket reads as the last finite bound). `None` when it gained nothing.
pub fn window_quantile(before: &[(f64, u64)], after: &[(f64, u64)], q: f64) -> Option<f64> {
    let gained = |i: usize| {
        let earlier = before.get(i).map_or(0, |b| b.1);
        after[i].1.saturating_sub(earlier)
    };
    let total = gained(after.len().checked_sub(1)?);
    if total == 0 {
        return None;
    }
    let rank = q * total as f64;
    let (mut lower, mut below) = (0.0, 0u64);
    for (i, &(upper, _)) in after.iter().enumerate() {
        let count = gained(i);
        if count as f64 >= rank {
            if upper.is_infinite() {
                return Some(lower * 1e6);
            }
            let share = (rank - below as f64) / (count - below).max(1) as f64;
            return Some((lower + (upper - lower) * share) * 1e6);
        }
        (lower, below) = (upper, count);
    }
    None
}

/// Each stage's p50 and p99 over a window, in microseconds, with how many passes it saw.
fn stage_figures(
    before: &std::collections::BTreeMap<String, Buckets>,
    after: &std::collections::BTreeMap<String, Buckets>,
) -> serde_json::Value {
    let round = |us: Option<f64>| us.map(|us| (us * 10.0).round() / 10.0);
    let mut figures = serde_json::Map::new();
    for (stage, buckets) in after {
        let earlier = before.get(stage).map(Vec::as_slice).unwrap_or_default();
        let count = buckets.last().map_or(0, |b| b.1) - earlier.last().map_or(0, |b| b.1);
        figures.insert(
            stage.clone(),
            json!({
                "p50_us": round(window_quantile(earlier, buckets, 0.5)),
                "p99_us": round(window_quantile(earlier, buckets, 0.99)),
                "count": count,
            }),
        );
    }
    serde_json::Value::Object(figures)
}

/// The cluster a bench runs against: where to reach it, and how (TLS, credentials). Its own
/// clusters are plain; a running one (`--cluster`) takes the command line's client flags.
#[derive(Clone)]
pub struct BenchTarget {
    pub seeds: Vec<String>,
    pub options: ClientOptions,
    /// The replicas' gRPC ports, for `--protocol grpc` (the bench's own cluster serves them).
    pub grpc: Vec<String>,
}

/// One bench producer, over the protocol the run measures.
enum Producer {
    Tarpc(ControlClient),
    Grpc(grpc::GrpcProducer),
}

impl Producer {
    async fn append(&self, command: Command) -> Result<(), String> {
        match self {
            Producer::Tarpc(client) => (client.append_to(Target::All, command).await)
                .map(|_| ())
                .map_err(|e| e.to_string()),
            Producer::Grpc(producer) => producer.append(command).await,
        }
    }
}

impl BenchTarget {
    /// A cluster reached in plain text, without credentials (the bench's own).
    pub fn plain(seeds: Vec<String>) -> BenchTarget {
        BenchTarget {
            seeds,
            options: ClientOptions::default(),
            grpc: Vec::new(),
        }
    }

    /// `protocol`'s producers: [`producers`](Self::producers) over tarpc, or as many over
    /// gRPC to the leader's port; with the number of connections.
    async fn producers_over(
        &self,
        protocol: grpc::Protocol,
        producers: usize,
        connections: Option<usize>,
    ) -> anyhow::Result<(usize, Vec<Producer>)> {
        match protocol {
            grpc::Protocol::Tarpc => {
                let (connections, clients) = self.producers(producers, connections).await?;
                Ok((
                    connections,
                    clients.into_iter().map(Producer::Tarpc).collect(),
                ))
            }
            grpc::Protocol::Grpc => {
                let connections = connections.unwrap_or(producers).clamp(1, producers.max(1));
                let made = grpc::GrpcProducer::many(&self.grpc, producers, connections).await?;
                Ok((connections, made.into_iter().map(Producer::Grpc).collect()))
            }
        }
    }

    async fn connect(&self) -> anyhow::Result<ControlClient> {
        self.connect_with(self.options.clone()).await
    }

    /// The node id of the cluster's leader now.
    pub async fn leader(&self) -> anyhow::Result<crate::NodeId> {
        Ok(self.connect().await?.leader_status().await?.id)
    }

    /// `producers` producers over `connections` connections, round-robin (`None` gives each
    /// producer its own; at least one, at most one per producer): each connection's own client
    /// is its first producer, and more producers share it (`ControlClient::new_producer`).
    /// Also returns the number of connections.
    pub async fn producers(
        &self,
        producers: usize,
        connections: Option<usize>,
    ) -> anyhow::Result<(usize, Vec<ControlClient>)> {
        let connections = connections.unwrap_or(producers).clamp(1, producers.max(1));
        let mut shared = Vec::new();
        for _ in 0..connections {
            shared.push(self.connect().await?);
        }
        let extra: Vec<ControlClient> = (connections..producers)
            .map(|i| shared[i % connections].new_producer_sharing_connection())
            .collect();
        Ok((connections, shared.into_iter().chain(extra).collect()))
    }

    async fn connect_with(&self, options: ClientOptions) -> anyhow::Result<ControlClient> {
        Ok(ControlClient::connect_with(&self.seeds, options).await?)
    }
}

/// `ctrlog bench append`: `clients` producers, each appending sequentially, over
/// `connections` connections (round-robin; `None` gives every client its own, as etcd's
/// benchmark `--conns` does the other way round); returns the result as JSON.
///
/// The CPU each of `accounted` (and this process, as `client`) spends per commit over the
/// measured window is in `cpu_per_commit_us`, with the sum; with `leader_http`, the leader's
/// observability port, its commit stages over the window are in `leader_stages`.
#[allow(clippy::too_many_arguments)] // each is one of the command's own options
pub async fn append(
    cluster: &BenchTarget,
    protocol: grpc::Protocol,
    clients: usize,
    connections: Option<usize>,
    duration: Duration,
    warmup: Duration,
    payload_bytes: usize,
    accounted: &[Accounted],
    leader_http: Option<std::net::SocketAddr>,
) -> anyhow::Result<serde_json::Value> {
    let mut accounted = accounted.to_vec();
    accounted.push(Accounted {
        name: "client".into(),
        pid: std::process::id(),
    });
    let cpu_now = || {
        accounted
            .iter()
            .map(|p| cpu_time(p.pid))
            .collect::<Vec<_>>()
    };
    let (connections, connected) = cluster
        .producers_over(protocol, clients, connections)
        .await?;
    let measuring = Arc::new(AtomicBool::new(false));
    let stop = Arc::new(AtomicBool::new(false));
    let errors = Arc::new(AtomicU64::new(0));
    let tasks: Vec<_> = connected
        .into_iter()
        .map(|client| {
            let (measuring, stop, errors) = (measuring.clone(), stop.clone(), errors.clone());
            tokio::spawn(async move {
                let mut latencies = histogram();
                while !stop.load(Ordering::Relaxed) {
                    let sent = Instant::now();
                    let command = Command::custom(BENCH_KIND, 1, payload(0, payload_bytes));
                    match client.append(command).await {
                        Ok(_) if measuring.load(Ordering::Relaxed) => {
                            let _ = latencies.record(sent.elapsed().as_micros() as u64);
                        }
                        Ok(_) => {}
                        Err(_) => {
                            errors.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                }
                latencies
            })
        })
        .collect();
    tokio::time::sleep(warmup).await;
    measuring.store(true, Ordering::Relaxed);
    let cpu_before = cpu_now();
    let stages_before = match leader_http {
        Some(addr) => Some(scrape_stages(addr).await?),
        None => None,
    };
    let started = Instant::now();
    tick(
        progress(duration.as_secs(), &format!("append, {clients} clients")),
        stop.clone(),
    );
    tokio::time::sleep(duration).await;
    measuring.store(false, Ordering::Relaxed);
    let elapsed = started.elapsed().as_secs_f64();
    let cpu_after = cpu_now();
    let stages = match (leader_http, &stages_before) {
        (Some(addr), Some(before)) => Some(stage_figures(before, &scrape_stages(addr).await?)),
        _ => None,
    };
    stop.store(true, Ordering::Relaxed);
    let mut all = histogram();
    for task in tasks {
        all.add(task.await?)?;
    }
    let cpu = cpu_per_commit(&accounted, &cpu_before, &cpu_after, all.len());
    Ok(json!({
        "workload": "append",
        "protocol": format!("{protocol:?}").to_lowercase(),
        "clients": clients,
        "connections": connections,
        "payload_bytes": payload_bytes,
        "ops": all.len(),
        "ops_per_s": (all.len() as f64 / elapsed).round() as u64,
        "p50_us": all.value_at_quantile(0.5),
        "p99_us": all.value_at_quantile(0.99),
        "p999_us": all.value_at_quantile(0.999),
        "max_us": all.max(),
        "errors": errors.load(Ordering::Relaxed),
        "cpu_per_commit_us": cpu,
        "leader_stages": stages,
    }))
}

/// One line of a plot panel: its points, its colour, and its name for the legend (none for a
/// panel of one line).
pub struct PlotSeries {
    pub name: Option<String>,
    pub points: Vec<(f64, f64)>,
    pub color: plotters::style::RGBColor,
}

/// Results saved earlier by `bench append --json` or `bench scale --json`: one JSON object
/// per line (e.g. the medians of several runs), for `ctrlog bench plot`.
pub fn read_results(input: &Path) -> anyhow::Result<Vec<serde_json::Value>> {
    let text =
        std::fs::read_to_string(input).with_context(|| format!("reading {}", input.display()))?;
    text.lines()
        .filter(|line| !line.trim().is_empty())
        .map(serde_json::from_str)
        .collect::<Result<Vec<serde_json::Value>, _>>()
        .with_context(|| format!("parsing {}", input.display()))
}

/// Draws `ctrlog bench append` results into an SVG at `path`: durable commits per second above,
/// p99 latency below, both against the client count (log scale).
pub fn plot_append(results: &[serde_json::Value], path: &Path) -> anyhow::Result<()> {
    use plotters::prelude::*;

    anyhow::ensure!(!results.is_empty(), "nothing to plot");
    let line = |pick: &dyn Fn(&serde_json::Value) -> f64, color| {
        [PlotSeries {
            name: None,
            points: results
                .iter()
                .map(|r| (r["clients"].as_f64().unwrap_or(0.0), pick(r)))
                .collect(),
            color,
        }]
    };
    let x_desc = "clients, each waiting for its previous append";
    let root = SVGBackend::new(path, (720, 560)).into_drawing_area();
    root.fill(&WHITE)?;
    let (upper, lower) = root.split_vertically(280);
    let ops_per_s = line(&|r| r["ops_per_s"].as_f64().unwrap_or(0.0), BLUE);
    plot_panel(&upper, "durable commits/s", x_desc, &ops_per_s)?;
    let p99_ms = line(&|r| r["p99_us"].as_f64().unwrap_or(0.0) / 1000.0, RED);
    plot_panel(&lower, "p99 latency (ms)", x_desc, &p99_ms)?;
    root.present()?;
    Ok(())
}

/// One panel: each series' points, x on a log scale from 1, y from 0, with a legend when the
/// series are named.
pub fn plot_panel<DB: plotters::prelude::DrawingBackend>(
    area: &plotters::prelude::DrawingArea<DB, plotters::coord::Shift>,
    label: &str,
    x_desc: &str,
    series: &[PlotSeries],
) -> anyhow::Result<()>
where
    DB::ErrorType: 'static,
{
    use plotters::prelude::*;

    let points = || series.iter().flat_map(|s| s.points.iter().copied());
    let x_min = points().map(|(x, _)| x).fold(f64::MAX, f64::min).max(1.0);
    let x_max = points().map(|(x, _)| x).fold(1.0, f64::max);
    let y_max = points().map(|(_, y)| y).fold(f64::MIN_POSITIVE, f64::max);
    let legend = series.iter().any(|s| s.name.is_some());
    // A legend takes the top of the panel, above the highest point.
    let headroom = if legend { 1.7 } else { 1.15 };
    let mut chart = ChartBuilder::on(area)
        .caption(label, ("sans-serif", 18))
        .margin(12)
        .x_label_area_size(32)
        .y_label_area_size(64)
        .build_cartesian_2d(
            (x_min / 1.25..x_max * 1.25).log_scale(),
            0.0..y_max * headroom,
        )?;
    chart
        .configure_mesh()
        .light_line_style(WHITE)
        .x_label_formatter(&|v| format!("{v:.0}"))
        .y_label_formatter(&|v| {
            if y_max < 10.0 {
                format!("{v:.2}")
            } else {
                format!("{v:.0}")
            }
        })
        .x_desc(x_desc)
        .y_desc(label)
        .draw()?;
    for s in series {
        let color = s.color;
        let drawn = chart.draw_series(LineSeries::new(s.points.iter().copied(), color))?;
        if let Some(name) = &s.name {
            drawn
                .label(name.as_str())
                .legend(move |(x, y)| PathElement::new([(x, y), (x + 16, y)], color));
        }
        chart.draw_series(
            s.points
                .iter()
                .map(|&point| Circle::new(point, 4, color.filled())),
        )?;
    }
    if legend {
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::UpperLeft)
            .background_style(WHITE.mix(0.8))
            .border_style(BLACK)
            .draw()?;
    }
    Ok(())
}

/// `ctrlog bench fanout`: `subscribers` subscriptions reading everything while appends arrive
/// at `rate` per second; lag runs from the moment each append was sent to its delivery.
#[allow(clippy::too_many_arguments)] // each is one of the command's own options
pub async fn fanout(
    cluster: &BenchTarget,
    protocol: grpc::Protocol,
    subscribers: usize,
    never_reading: usize,
    rate: u64,
    duration: Duration,
    payload_bytes: usize,
    linger: Duration,
) -> anyhow::Result<serde_json::Value> {
    let total = rate * duration.as_secs();
    let base = Instant::now();
    let micros = move || base.elapsed().as_micros() as u64 + 1;
    let sent: Arc<Vec<AtomicU64>> = Arc::new((0..total).map(|_| AtomicU64::new(0)).collect());
    let probe = cluster.connect().await?;
    let from = probe.leader_status().await?.applied_offset + 1;
    let mut readers = Vec::new();
    let reader_options = ClientOptions {
        subscription_linger: linger,
        ..cluster.options.clone()
    };
    for i in 0..subscribers {
        let client = match protocol {
            grpc::Protocol::Tarpc => Some(cluster.connect_with(reader_options.clone()).await?),
            grpc::Protocol::Grpc => None,
        };
        let grpc_seed = cluster.grpc.get(i % cluster.grpc.len().max(1)).cloned();
        let sent = sent.clone();
        readers.push(tokio::spawn(async move {
            // The measurement must cost little next to what it measures: a million
            // deliveries a second at 1,000 subscribers. So one deadline for the whole read
            // rather than a timer per entry, and lag kept to 1 % (two significant figures:
            // 20 KB of counters per subscriber rather than 140 KB).
            let mut lag = Histogram::new_with_bounds(1, 60_000_000, 2).expect("static bounds");
            let mut received = 0u64;
            // Whether to read on: false once every bench command arrived.
            let mut record = |entry: &crate::log::LogEntry| {
                if entry.frame.kind != CUSTOM_KIND_MIN + BENCH_KIND {
                    return true; // the job's, or a new cluster's level raise
                }
                let index =
                    u64::from_be_bytes(entry.frame.body[..8].try_into().unwrap_or_default());
                if let Some(at) = sent.get(index as usize) {
                    let delivered = micros().saturating_sub(at.load(Ordering::Acquire));
                    let _ = lag.record(delivered.max(1));
                    received += 1;
                }
                received < total
            };
            let read_all = async {
                match (client, grpc_seed) {
                    (Some(client), _) => {
                        let mut stream = client.subscribe(from, Filter::Everything);
                        while let Some(Ok(SubscriptionItem::Entry(entry))) = stream.next().await {
                            if !record(&entry) {
                                break;
                            }
                        }
                    }
                    (None, Some(seed)) => {
                        if let Err(error) = grpc::subscribe(&seed, from, &mut record).await {
                            tracing::warn!(%error, "a gRPC subscriber's stream ended");
                        }
                    }
                    (None, None) => {}
                }
            };
            let deadline = tokio::time::Instant::now() + duration + Duration::from_secs(30);
            let _ = tokio::time::timeout_at(deadline, read_all).await;
            (lag, received)
        }));
    }
    // Held, never read, until the run ends.
    let mut unread = Vec::new();
    for i in 0..never_reading {
        let seed = cluster.grpc.get(i % cluster.grpc.len().max(1));
        let seed = seed.context("subscribers that never read are gRPC's: --protocol grpc")?;
        unread.push(grpc::never_read(seed, from).await?);
    }
    let (_, writers) = cluster.producers_over(protocol, 8, None).await?;
    let writers: Vec<Arc<Producer>> = writers.into_iter().map(Arc::new).collect();
    let stop = Arc::new(AtomicBool::new(false));
    tick(
        progress(duration.as_secs(), &format!("fan-out to {subscribers}")),
        stop.clone(),
    );
    let mut ticker = tokio::time::interval(Duration::from_micros(1_000_000 / rate.max(1)));
    let mut appends = Vec::with_capacity(total as usize);
    for index in 0..total {
        ticker.tick().await;
        let (writer, sent) = (
            writers[index as usize % writers.len()].clone(),
            sent.clone(),
        );
        appends.push(tokio::spawn(async move {
            let command = Command::custom(BENCH_KIND, 1, payload(index, payload_bytes));
            let started = micros();
            sent[index as usize].store(started, Ordering::Release);
            writer.append(command).await.map(|_| micros() - started)
        }));
    }
    stop.store(true, Ordering::Relaxed);
    let mut append_latency = histogram();
    let mut errors = 0u64;
    let mut first_error = None;
    for append in appends {
        match append.await? {
            Ok(us) => {
                let _ = append_latency.record(us.max(1));
            }
            Err(error) => {
                errors += 1;
                first_error.get_or_insert(error);
            }
        }
    }
    drop(unread);
    let mut lag = histogram();
    let mut delivered = 0u64;
    for reader in readers {
        let (histogram, received) = reader.await?;
        lag.add(histogram)?;
        delivered += received;
    }
    Ok(json!({
        "workload": "fanout",
        "protocol": format!("{protocol:?}").to_lowercase(),
        "subscribers": subscribers,
        "never_reading": never_reading,
        "rate": rate,
        "linger_ms": linger.as_millis() as u64,
        "payload_bytes": payload_bytes,
        "delivered": delivered,
        "expected": total * subscribers as u64,
        "lag_p50_us": lag.value_at_quantile(0.5),
        "lag_p99_us": lag.value_at_quantile(0.99),
        "lag_max_us": lag.max(),
        "append_p99_us": append_latency.value_at_quantile(0.99),
        "append_errors": errors,
        "append_first_error": first_error,
    }))
}

/// `ctrlog bench recovery`: fills a fresh cluster with `commands` commands, SIGKILLs a follower,
/// restarts it on its directory and times until it serves (answers) and until it has applied
/// everything again. `snapshots` chooses the default snapshot policy or none at all.
pub async fn recovery(
    commands: u64,
    snapshots: bool,
    payload_bytes: usize,
) -> anyhow::Result<serde_json::Value> {
    let extra: Vec<String> = if snapshots {
        Vec::new()
    } else {
        vec!["--snapshot-logs-since-last".into(), u64::MAX.to_string()]
    };
    let mut cluster = ProcessCluster::start(OWN_CLUSTER_REPLICAS, &extra).await?;
    let seeds = cluster.client_addrs();
    let client = ControlClient::connect(&seeds).await?;
    let leader = client.leader_status().await?.id;
    let follower = (1..=3u64).find(|id| *id != leader).expect("three replicas") as usize - 1;

    let bar = ProgressBar::new(commands);
    bar.set_style(
        ProgressStyle::with_template("filling [{bar:30}] {pos}/{len} commands")
            .expect("static template")
            .progress_chars("=> "),
    );
    let next = Arc::new(AtomicU64::new(0));
    let mut fillers = Vec::new();
    for _ in 0..128 {
        let (client, next, bar) = (
            ControlClient::connect(&seeds).await?,
            next.clone(),
            bar.clone(),
        );
        fillers.push(tokio::spawn(async move {
            while next.fetch_add(1, Ordering::Relaxed) < commands {
                let command = Command::custom(BENCH_KIND, 1, payload(0, payload_bytes));
                client.append_to(Target::All, command).await?;
                bar.inc(1);
            }
            Ok::<_, crate::client::ClientError>(())
        }));
    }
    for filler in fillers {
        filler.await??;
    }
    bar.finish_and_clear();
    let applied = client.leader_status().await?.applied_offset;
    let rss = cluster.rss_bytes(follower).unwrap_or(0);
    let disk = dir_bytes(&cluster.data_dir().join(format!("replica-{}", follower + 1)));

    let (answering, caught_up) = time_restart(&mut cluster, follower, applied).await?;
    Ok(json!({
        "workload": "recovery",
        "commands": applied,
        "snapshots": snapshots,
        "rss_before_kill_bytes": rss,
        "disk_bytes": disk,
        "answering_ms": answering.as_millis() as u64,
        "caught_up_ms": caught_up.as_millis() as u64,
    }))
}

/// Restarts replica `i` of `cluster` on its directory and times it: until it answers
/// `status` (asked alone), and until it has applied `applied` again.
pub async fn time_restart(
    cluster: &mut ProcessCluster,
    i: usize,
    applied: u64,
) -> anyhow::Result<(Duration, Duration)> {
    cluster.kill(i);
    let started = Instant::now();
    cluster.restart(i)?;
    let probe = ControlClient::connect_with(
        &cluster.client_addrs()[i..=i],
        ClientOptions {
            retry_deadline: Duration::from_secs(60),
            request_timeout: Duration::from_secs(5),
            ..Default::default()
        },
    )
    .await?;
    let answering = started.elapsed();
    let timeout = Duration::from_secs(120).saturating_sub(started.elapsed());
    poll_until(
        "the restarted replica to catch up",
        timeout,
        Duration::from_millis(5),
        || async {
            match probe.status().await {
                Ok(status) if status.applied_offset >= applied => Ok(()),
                Ok(status) => Err(format!("applied {} of {applied}", status.applied_offset)),
                Err(error) => Err(error.to_string()),
            }
        },
    )
    .await?;
    Ok((answering, started.elapsed()))
}

pub fn dir_bytes(path: &Path) -> u64 {
    std::fs::read_dir(path)
        .map(|entries| {
            entries
                .flatten()
                .map(|e| match e.metadata() {
                    Ok(m) if m.is_dir() => dir_bytes(&e.path()),
                    Ok(m) => m.len(),
                    Err(_) => 0,
                })
                .sum()
        })
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// This process's CPU time as getrusage(2) reports it.
    fn rusage_cpu() -> Duration {
        // SAFETY: getrusage fills the struct it is given; it is zeroed plain data.
        let usage = unsafe {
            let mut usage: libc::rusage = std::mem::zeroed();
            assert_eq!(libc::getrusage(libc::RUSAGE_SELF, &mut usage), 0);
            usage
        };
        let time = |t: libc::timeval| Duration::new(t.tv_sec as u64, t.tv_usec as u32 * 1000);
        time(usage.ru_utime) + time(usage.ru_stime)
    }

    /// Goal: `cpu_time` reads the fields of `/proc/<pid>/stat` that hold user and system
    /// time, in the kernel's ticks. Steps: burn CPU until getrusage shows 100 ms; read
    /// `/proc` before and after getrusage: getrusage lies between them, within a few ticks
    /// either side; a pid that does not exist reads as `None`.
    #[test]
    fn cpu_time_reads_the_kernels_accounting() {
        let me = std::process::id();
        let deadline = Instant::now() + Duration::from_secs(20);
        let mut spin = 0u64;
        while rusage_cpu() < Duration::from_millis(100) && Instant::now() < deadline {
            spin = std::hint::black_box(spin.wrapping_mul(31).wrapping_add(1));
        }
        // The kernel samples /proc's times at its ticks (10 ms), getrusage more finely.
        let tick = Duration::from_millis(30);
        let before = cpu_time(me).unwrap();
        let rusage = rusage_cpu();
        let after = cpu_time(me).unwrap();
        assert!(rusage >= Duration::from_millis(100));
        assert!(
            before.saturating_sub(tick) <= rusage && rusage <= after + tick,
            "/proc says {before:?} then {after:?}, getrusage {rusage:?}"
        );
        assert_eq!(cpu_time(u32::MAX), None);
    }

    /// Goal: a window's quantiles come from what each bucket gained between the scrapes,
    /// interpolated within the bucket, as Prometheus's `histogram_quantile` does. Steps: 100
    /// observations before the window (all slow) are left out; in the window, 50 fall in
    /// (0, 1 ms] and 50 in (1, 2 ms]: p50 is 1 ms, p99 near 2 ms; one in `+Inf` reads as the
    /// last bound; an empty window has none.
    #[test]
    fn window_quantiles_come_from_what_the_buckets_gained() {
        let before = [(0.001, 0), (0.002, 0), (f64::INFINITY, 100)];
        let after = [(0.001, 50), (0.002, 100), (f64::INFINITY, 200)];
        assert_eq!(window_quantile(&before, &after, 0.5), Some(1000.0));
        assert_eq!(
            window_quantile(&before, &after, 0.99).map(f64::round),
            Some(1980.0)
        );
        let overflow = [(0.001, 0), (0.002, 0), (f64::INFINITY, 101)];
        assert_eq!(window_quantile(&before, &overflow, 0.5), Some(2000.0));
        assert_eq!(window_quantile(&before, &before, 0.5), None);
    }

    /// Goal: CPU per commit is each process's CPU over the window divided by the commits, and
    /// the total is their sum; a process that could not be read is left out of both.
    #[test]
    fn cpu_per_commit_divides_each_process_and_sums() {
        let process = |name: &str| Accounted {
            name: name.into(),
            pid: 0,
        };
        let ms = |ms| Some(Duration::from_millis(ms));
        let figures = cpu_per_commit(
            &[process("leader"), process("gone"), process("client")],
            &[ms(100), ms(5), ms(40)],
            &[ms(300), None, ms(140)],
            10_000,
        );
        assert_eq!(
            figures,
            json!({"leader": 20.0, "client": 10.0, "total": 30.0})
        );
    }
}
