//! `ctrlog chaos`: three real `ctrlog serve` processes, producers and subscribers through the
//! real client (one producer writes commands of the full size limit), and rounds of faults:
//! SIGKILL a replica or the leader; SIGSTOP the leader past the election timeout; stop a
//! follower until the leader has purged past it, so that it catches up by snapshot install,
//! then kill and restart it twice right after; kill a follower and leave zeros or garbage
//! after the last record of its WAL before it restarts; cut the power of the leader, a
//! follower or the whole cluster (its WAL syncs stalled, then SIGKILL and everything written
//! after the last completed sync dropped: [`power_loss`](crate::tools::cluster::power_loss)), the old leader
//! back first. Meanwhile the replicas run a job: their
//! controllers launch `ctrlog container` processes that hold leases and run tasks, and the
//! rounds add inputs and raise and drop the lag, so that containers are launched and drained
//! and tasks move while the faults land; partitions also cut the containers off from the
//! leader. Then the history is verified with the [`checker`](crate::tools::chaos::checker), the containers'
//! own reports included (no task ran on two containers at once), and every replica must have
//! come back and the job settled.
//!
//! Faults are chosen by a seeded generator, so a run's fault schedule is reproducible from its
//! seed (the timing of real processes is not).

pub mod checker;
pub mod command;
pub mod container;
pub mod firewall;
pub mod job_files;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Context;
use futures::StreamExt;
use rand::{Rng, SeedableRng};
use serde_json::json;

use crate::client::{
    ApiError, ClientError, ClientOptions, ControlClient, FetchRequest, SubscriptionItem,
};
use crate::jobs::plan::settled;
use crate::log::{
    decode, Command, Filter, LogEntry, Offset, ProducerSeq, Proposal, Target,
    COMMAND_BYTES_MAX_DEFAULT,
};
use crate::raft::storage::data_dir::{log_dir, meta_dir, sleds_set_aside};
use crate::raft::storage::meta_store::faults as sled_faults;
use crate::raft::storage::snapshots::faults as snapshot_faults;
use crate::raft::storage::wal::{self, Wal, RECORD_BYTES_MAX};
use crate::raft::types::Entry;
use crate::tools::bench::BenchTarget;
use crate::tools::chaos::checker::{
    check, Acked, Delivery, History, LogMatching, SubscriptionRecord, TaskEvent, Violation,
};
use crate::tools::chaos::firewall::Firewall;
use crate::tools::chaos::job_files::JobFiles;
use crate::tools::cluster::power_loss::PowerLoss;
use crate::tools::cluster::wait::{job_state_until, poll_until, POLL_INTERVAL};
use crate::tools::cluster::{processes_mentioning, ProcessCluster};

/// How a run is shaped.
#[derive(Clone, Debug)]
pub struct ChaosOptions {
    pub rounds: u32,
    pub seed: u64,
    pub producers: usize,
    /// Connections the producers share (their appends then go out in batches); `None` gives
    /// each producer its own.
    pub connections: Option<usize>,
    pub subscribers: usize,
    /// The kinds of fault to draw from (at least one).
    pub faults: Vec<FaultFamily>,
    /// The `ctrlog` binary the replicas run (default: this one), e.g. an older build, to see
    /// a fault schedule break what a fix mended.
    pub replica_binary: Option<std::path::PathBuf>,
}

/// A kind of fault a run may inject.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, clap::ValueEnum)]
pub enum FaultFamily {
    /// SIGKILL the leader or another replica.
    Kills,
    /// SIGSTOP the leader past the election timeout, then SIGCONT.
    Pauses,
    /// A follower catches up by snapshot install, then restarts twice right after.
    Snapshots,
    /// A killed follower's WAL gets zeros or garbage after its last record.
    TornTails,
    /// A stopped replica (the leader a third of the time) gets one byte flipped in its WAL
    /// where its synced mark vouches for it (the final record included), or (a quarter of the
    /// time each) in its stored snapshot, if it has one, or in sled's data file: rot, which no
    /// crash leaves. It must come back, refuse to vote while it lacks what it had acknowledged,
    /// and be repaired from the peers; sled refusing its files has them set aside.
    Corruption,
    /// Cut links with nftables: the leader from its peers (both ways, or only what it sends)
    /// while its clients still reach it, a follower from everyone, or the job's containers
    /// from the leader's client port. Needs root.
    Partitions,
    /// Add a fourth replica as a voter and remove another voter (the leader among them),
    /// or add a replica that cannot be reached, which must fail and leave nothing behind.
    Membership,
    /// Stall the WAL syncs of the leader, a follower or the whole cluster, kill it and drop
    /// what was written after the last completed sync (an `LD_PRELOAD` shim, built with the
    /// machine's C compiler: [`power_loss`](crate::tools::cluster::power_loss)); the old leader comes back
    /// first, inside the followers' election timeout.
    PowerLoss,
}

impl FaultFamily {
    pub const ALL: [FaultFamily; 8] = [
        FaultFamily::Kills,
        FaultFamily::Pauses,
        FaultFamily::Snapshots,
        FaultFamily::TornTails,
        FaultFamily::Corruption,
        FaultFamily::Partitions,
        FaultFamily::Membership,
        FaultFamily::PowerLoss,
    ];
}

/// A seed for a run that was given none: the clock's seconds. It is printed with the run, so
/// that any run can be replayed with `--seed`.
pub fn seed_from_clock() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(1, |d| d.as_secs())
}

/// Which of a stopped replica's files a [`Fault::Corrupt`] flips a byte of.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Rotted {
    /// A WAL record its synced mark vouches for: always found, always repaired.
    Wal,
    /// Its stored snapshot, if it has one (else its WAL): always found, fetched again.
    Snapshot,
    /// sled's data file, under sled's own checks: sled's recovery may drop its later writes
    /// (what the replica checks it against then tells), refuse the files (set aside, and the
    /// replica starts over from the leader's snapshot), or miss the byte altogether.
    Sled,
}

/// One fault. Replicas are 0-based indices into the process cluster.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Fault {
    KillLeader,
    KillReplica(usize),
    PauseLeader,
    /// Behind the leader's purge, a snapshot install, then two restarts right after it.
    SnapshotCatchUp(usize),
    /// Killed, with zeros (`true`) or garbage after the last record of its WAL.
    TornTail(usize, bool),
    /// Stopped, one byte of its files flipped, restarted.
    Corrupt {
        replica: usize,
        rotted: Rotted,
    },
    /// The leader's peer links cut both ways; its clients still reach it.
    CutLeader,
    /// Only what the leader sends to its peers is dropped: they stop hearing it, it still
    /// hears them.
    CutLeaderOneWay,
    /// A follower's peer links cut both ways.
    IsolateFollower(usize),
    /// The job's containers cannot reach the leader's client port, for longer than the
    /// session timeout: their leases lapse and the leader expires them.
    CutContainersFromLeader,
    /// The spare replica added as a voter, then voter `remove` removed (it becomes the spare).
    ReplaceVoter {
        remove: usize,
    },
    /// The spare, stopped, is added: the change must fail within its deadline and leave no
    /// member behind.
    AddUnreachable,
    PowerLoss(PowerLossOf),
}

/// Whose power a [`Fault::PowerLoss`] cuts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum PowerLossOf {
    Leader,
    Follower(usize),
    /// Every replica; the leader's syncs were the stalled ones, and it comes back
    /// [`CLUSTER_BACK_AFTER`] before the others.
    Cluster,
}

/// How long a power loss's victim runs with its WAL syncs stalled before it dies: a loaded
/// leader writes, and its followers store, appends it never syncs.
const SYNCS_STALLED: Duration = Duration::from_millis(300);

/// How much sooner than the others the old leader's host comes back from a power loss of the
/// whole cluster (as in the report that found the fork this fault guards against).
const CLUSTER_BACK_AFTER: Duration = Duration::from_millis(300);

/// The followers' election timeout (`election_timeout_min_ms`'s default): an old leader back
/// from a power loss sooner than this, having lost appends, hit the window in which a replica
/// restored as leader of its old term would write new entries under the log ids of lost ones.
const FOLLOWERS_ELECTION_TIMEOUT: Duration = Duration::from_millis(300);

/// Replicas a run may start: the three, and the one membership changes add.
const REPLICAS_MAX: u32 = 4;

/// How long a partition lasts (at least; a leader's lasts until a new leader has committed).
const PARTITION_HELD: Duration = Duration::from_millis(2_000);

/// How long containers stay cut from the leader: past the job's session timeout (3 s), so
/// that the leader expires them.
const CONTAINER_CUT_HELD: Duration = Duration::from_millis(4_500);

/// How long the job may take to settle once the faults are over: every input assigned and
/// running on the minimum of containers.
const JOB_SETTLED_MAX: Duration = Duration::from_secs(90);

/// uids for replicas under [`FaultFamily::Partitions`]: replica `i` runs as `UID_BASE + i + 1`.
/// Far above Debian's range for people and system accounts.
const UID_BASE: u32 = 61_000;

/// Snapshot and purge often, so that a follower stopped for a round falls behind the purge.
const SNAPSHOT_ARGS: [&str; 4] = [
    "--snapshot-logs-since-last",
    "300",
    "--snapshot-logs-to-keep",
    "30",
];

/// How long a replica may take to come back and answer before the run fails.
const REPLICA_BACK_MAX: Duration = Duration::from_secs(60);

/// How long a replica whose WAL was damaged may take, once back, to be repaired from the
/// leader and vote again.
const REPAIR_MAX: Duration = Duration::from_secs(60);

/// What producers recorded.
#[derive(Default)]
struct Produced {
    attempted: BTreeSet<ProducerSeq>,
    acked: Vec<Acked>,
}

/// The job every chaos run carries. The replicas' controllers launch `ctrlog container`
/// processes (1 to 3), which hold leases, run tasks and report what they run; each round may
/// add an input or raise or drop the lag, so that containers are launched and drained and
/// tasks move while the faults land.
struct ChaosJob {
    dir: tempfile::TempDir,
    files: JobFiles,
    /// Inputs `kafka/events/0..partitions`.
    partitions: u32,
    lag_high: bool,
}

impl ChaosJob {
    /// The job's files in a folder of their own, readable by replicas under uids of their own
    /// when `other_users`.
    fn create(other_users: bool) -> anyhow::Result<ChaosJob> {
        let dir = tempfile::Builder::new()
            .prefix("ctrlog-chaos-job-")
            .tempdir()?;
        let partitions = 4;
        let files = JobFiles::create(dir.path(), 0..partitions)?;
        if other_users {
            files.open_to_every_user()?;
        }
        JobFiles::write_serve_config(
            &dir.path().join("job.toml"),
            files.job(1, 3, files.process_launcher()?),
        )?;
        Ok(ChaosJob {
            dir,
            files,
            partitions,
            lag_high: false,
        })
    }

    /// The `ctrlog serve` flags that run this job.
    fn serve_args(&self) -> Vec<String> {
        let config = self.dir.path().join("job.toml");
        vec!["--config".into(), config.display().to_string()]
    }

    /// After round `round`: an input more every third round; the lag raised or dropped at
    /// random, which scales the job out to 3 containers or back in to 1.
    fn step(&mut self, round: u32, rng: &mut impl Rng) -> anyhow::Result<()> {
        if round % 3 == 2 {
            self.partitions += 1;
            self.files.set_inputs(0..self.partitions)?;
        }
        if rng.gen_bool(0.5) {
            self.lag_high = !self.lag_high;
            self.files.set_lag(if self.lag_high { 1_000 } else { 0 })?;
        }
        Ok(())
    }

    /// Drops the lag and waits until every input runs on the one container left; returns
    /// how long that took.
    async fn settle(&self, client: &ControlClient) -> anyhow::Result<Duration> {
        let started = Instant::now();
        self.files.set_lag(0)?;
        let what = format!(
            "the job to settle: {} tasks on 1 container",
            self.partitions
        );
        job_state_until(client, &what, JOB_SETTLED_MAX, |state| {
            settled(state, self.partitions as usize, 1)
        })
        .await?;
        Ok(started.elapsed())
    }

    /// Leaves the folder in place for a failure to be looked into; returns its path.
    fn keep_files(&mut self) -> &std::path::Path {
        self.dir.disable_cleanup(true);
        self.dir.path()
    }

    /// What the job went through, from the containers' reports; `settled_in` is `None` when
    /// it did not settle.
    fn figures(&self, events: &[TaskEvent], settled_in: Option<Duration>) -> serde_json::Value {
        let sessions: BTreeSet<(&str, u64)> = events
            .iter()
            .map(|e| (e.container.as_str(), e.epoch))
            .collect();
        json!({
            "inputs": self.partitions,
            "container_sessions": sessions.len(),
            "task_starts": events.iter().filter(|e| e.running).count(),
            "settled_ms": settled_in.map(|d| d.as_millis() as u64),
        })
    }
}

/// Containers outlive the replicas that launched them; the run's end is theirs too.
impl Drop for ChaosJob {
    fn drop(&mut self) {
        for pid in processes_mentioning(self.dir.path()) {
            // SAFETY: kill(2) on a container process of this run; no memory is involved.
            unsafe { libc::kill(pid, libc::SIGKILL) };
        }
    }
}

async fn leader_index(client: &ControlClient) -> anyhow::Result<usize> {
    Ok(client.leader_status().await?.id as usize - 1)
}

/// Runs the chaos rounds and returns the figures as JSON; fails if the history has a violation.
pub async fn run(options: ChaosOptions) -> anyhow::Result<serde_json::Value> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(options.seed);
    let snapshot_args: Vec<String> = SNAPSHOT_ARGS.iter().map(|a| a.to_string()).collect();
    anyhow::ensure!(!options.faults.is_empty(), "no fault to inject");
    let partitions = options.faults.contains(&FaultFamily::Partitions);
    // The firewall first: without nftables a partition run fails before it starts anything.
    let firewall = partitions
        .then(|| Firewall::new((1..=REPLICAS_MAX).map(|id| UID_BASE + id)))
        .transpose()?;
    let power = match options.faults.contains(&FaultFamily::PowerLoss) {
        true => Some(PowerLoss::build().context("power-loss faults need the shim")?),
        false => None,
    };
    let mut job = ChaosJob::create(partitions)?;
    let serve_args: Vec<String> = snapshot_args.into_iter().chain(job.serve_args()).collect();
    let replica_binary = match &options.replica_binary {
        Some(binary) => binary.clone(),
        None => std::env::current_exe().context("finding this executable")?,
    };
    let cluster = ProcessCluster::for_faults(
        replica_binary,
        3,
        &serve_args,
        partitions.then_some(UID_BASE),
        power.as_ref().map(PowerLoss::spawn_hook),
    )
    .await?;
    let seeds = cluster.client_addrs();
    // A paused leader holds requests until they time out; keep that short.
    let options_quick = ClientOptions {
        retry_deadline: Duration::from_secs(60),
        request_timeout: Duration::from_secs(1),
        ..ClientOptions::default()
    };
    let admin = ControlClient::connect_with(&seeds, options_quick.clone()).await?;
    let stop = Arc::new(AtomicBool::new(false));
    let produced = Arc::new(Mutex::new(Produced::default()));

    // Producers: each appends with its own (producer, seq), retrying a pair until it is
    // acknowledged, as a real producer must when an append's fate is unknown.
    let target = BenchTarget {
        options: options_quick.clone(),
        ..BenchTarget::plain(seeds.clone())
    };
    let (_, clients) = target
        .producers(options.producers, options.connections)
        .await?;
    let mut producers = Vec::new();
    for (p, client) in clients.into_iter().enumerate() {
        let producer = options.seed.wrapping_mul(1_000) + p as u64 + 1;
        let load = Load {
            producer,
            body_bytes: 0,
            pause: Duration::ZERO,
        };
        producers.push(tokio::spawn(load.run(
            client,
            stop.clone(),
            produced.clone(),
        )));
    }
    // One more producer writes commands of the full size limit, a few a second.
    let large = Load {
        producer: options.seed.wrapping_mul(1_000) + 999,
        body_bytes: COMMAND_BYTES_MAX_DEFAULT,
        pause: Duration::from_millis(200),
    };
    let client = ControlClient::connect_with(&seeds, options_quick.clone()).await?;
    producers.push(tokio::spawn(large.run(
        client,
        stop.clone(),
        produced.clone(),
    )));

    // Subscribers: record every delivery.
    let records: Arc<Mutex<Vec<Vec<Delivery>>>> =
        Arc::new(Mutex::new(vec![Vec::new(); options.subscribers]));
    let delivered_upto = Arc::new(
        (0..options.subscribers)
            .map(|_| AtomicU64::new(0))
            .collect::<Vec<_>>(),
    );
    let mut subscribers = Vec::new();
    for s in 0..options.subscribers {
        let client = ControlClient::connect_with(&seeds, options_quick.clone()).await?;
        let (records, upto) = (records.clone(), delivered_upto.clone());
        subscribers.push(tokio::spawn(async move {
            let mut stream = client.subscribe(1, Filter::Everything);
            while let Some(item) = stream.next().await {
                let delivery = match item {
                    Ok(SubscriptionItem::Entry(entry)) => {
                        upto[s].store(entry.offset, Ordering::Relaxed);
                        Delivery::Entry(entry)
                    }
                    Ok(SubscriptionItem::Reset { offset, .. }) => {
                        upto[s].store(offset, Ordering::Relaxed);
                        Delivery::Reset { offset }
                    }
                    Err(_) => continue, // retried from the same offset by the stream
                };
                records.lock().expect("never poisoned")[s].push(delivery);
            }
        }));
    }

    // The rounds.
    let mut injector = Injector {
        cluster,
        firewall,
        admin,
        options: options_quick.clone(),
        voters: vec![0, 1, 2],
        spare: None,
        injected: BTreeMap::new(),
        failovers: BTreeMap::new(),
        power,
        power_losses: Vec::new(),
        repairs: Vec::new(),
        snapshots_rotted: 0,
        sleds_rotted: 0,
        sleds_set_aside: 0,
    };
    for round in 0..options.rounds {
        tokio::time::sleep(Duration::from_millis(rng.gen_range(300..1_000))).await;
        let leader = leader_index(&injector.admin).await?;
        // Each kind once first, so that a short run meets them all; then at random.
        let family = match options.faults.get(round as usize) {
            Some(&family) => family,
            None => options.faults[rng.gen_range(0..options.faults.len())],
        };
        let fault = injector.choose(&mut rng, family, leader);
        tracing::info!(round, ?fault, leader = leader + 1, "fault");
        let injected = injector.inject(fault, leader).await;
        let moved = injected.and_then(|()| job.step(round, &mut rng));
        if let Err(error) = moved {
            let replicas = injector.describe().await;
            let kept = injector.cluster.keep_files().display().to_string();
            return Err(error.context(format!(
                "round {round}: {fault:?} with replica {} leading; now:\n{replicas}\n\
                 the replicas' data and logs are kept in {kept}, the job's files in {}",
                leader + 1,
                job.keep_files().display()
            )));
        }
    }
    // Every replica came back from every fault, and the job settles.
    for i in injector.running() {
        wait_until_back(&mut injector.cluster, i, &options_quick).await?;
    }
    // A job that does not settle fails the run, after the history is checked and the figures
    // are out: what was lost or run twice matters most when something else went wrong too.
    let job_settled = job.settle(&injector.admin).await;

    // Quiesce: stop producing, let every subscriber reach the end, read every replica's log.
    stop.store(true, Ordering::Relaxed);
    for producer in producers {
        let _ = producer.await;
    }
    let last = injector.admin.leader_status().await?.applied_offset;
    let caught_up_started = Instant::now();
    let subscribers_reached = format!("every subscriber to reach offset {last}");
    poll_until(
        &subscribers_reached,
        Duration::from_secs(60),
        POLL_INTERVAL,
        || {
            let behind = delivered_upto
                .iter()
                .filter(|u| u.load(Ordering::Relaxed) < last)
                .count();
            std::future::ready(if behind == 0 {
                Ok(())
            } else {
                Err(format!("{behind} behind"))
            })
        },
    )
    .await
    .map_err(|error| with_forks_on_disk(&mut injector.cluster, error.into()))?;
    let catch_up = caught_up_started.elapsed();
    for subscriber in subscribers {
        subscriber.abort();
    }
    let mut replica_logs = Vec::new();
    let addrs = injector.cluster.client_addrs();
    for &i in &injector.voters {
        let log = read_log(&addrs[i], last)
            .await
            .map_err(|error| with_forks_on_disk(&mut injector.cluster, error))?;
        replica_logs.push((format!("replica-{}", i + 1), log));
    }
    let produced = std::mem::take(&mut *produced.lock().expect("never poisoned"));
    let history = History {
        replica_logs,
        attempted: produced.attempted,
        acked: produced.acked,
        subscriptions: std::mem::take(&mut *records.lock().expect("never poisoned"))
            .into_iter()
            .enumerate()
            .map(|(s, deliveries)| SubscriptionRecord {
                name: format!("subscriber-{s}"),
                filter: Filter::Everything,
                from: 1,
                deliveries,
            })
            .collect(),
        task_events: job.files.reports()?,
    };
    let mut violations = check(&history);
    let (entries_compared, forks) = log_matching_on_disk(&mut injector.cluster)?;
    violations.extend(forks);
    let count = |f: fn(&Violation) -> bool| violations.iter().filter(|v| f(v)).count();
    let failover_ms: serde_json::Map<String, serde_json::Value> = injector
        .failovers
        .iter_mut()
        .map(|(kind, durations)| (kind.to_string(), quantiles(durations)))
        .collect();
    let mut all: Vec<Duration> = injector.failovers.values().flatten().copied().collect();
    let mut power_loss_back: Vec<Duration> = injector.power_losses.iter().map(|p| p.back).collect();
    let figures = json!({
        "seed": options.seed,
        "rounds": options.rounds,
        "faults": injector.injected,
        "acked_appends": history.acked.len(),
        "committed_offsets": last,
        "lost": count(|v| matches!(v, Violation::LostAck { .. })),
        "duplicates": count(|v| matches!(v, Violation::DuplicateInLog { .. } | Violation::DuplicateDelivery { .. })),
        "violations": violations.len(),
        "double_runs": count(|v| matches!(v, Violation::DoubleRun(_))),
        "forked_log_ids": count(|v| matches!(v, Violation::ForkedLogId { .. })),
        "log_entries_compared": entries_compared,
        "job": job.figures(&history.task_events, job_settled.as_ref().ok().copied()),
        "failover_ms": failover_ms,
        "failover_all_ms": quantiles(&mut all),
        "subscriber_catch_up_ms": catch_up.as_millis() as u64,
        "power_losses_in_window": injector.power_losses.iter().filter(|p| p.in_window).count(),
        "power_loss_dropped_bytes": injector.power_losses.iter().map(|p| p.dropped_bytes).sum::<u64>(),
        "power_loss_back_ms": quantiles(&mut power_loss_back),
        "corruptions_repaired": injector.repairs.len(),
        "snapshots_rotted": injector.snapshots_rotted,
        "sleds_rotted": injector.sleds_rotted,
        "sleds_set_aside": injector.sleds_set_aside,
        "repair_ms": quantiles(&mut injector.repairs),
    });
    if !violations.is_empty() || job_settled.is_err() {
        eprintln!(
            "the job's files are kept in {}, the replicas' in {}",
            job.keep_files().display(),
            injector.cluster.keep_files().display()
        );
    }
    for violation in violations.iter().take(20) {
        eprintln!("violation: {violation}");
    }
    if let Err(error) = job_settled {
        return Err(error.context(format!(
            "seed {}; replay the fault schedule with `ctrlog chaos --seed {} --rounds {}`: {figures}",
            options.seed, options.seed, options.rounds
        )));
    }
    if !violations.is_empty() {
        anyhow::bail!(
            "{} violations in the history (seed {}; replay the fault schedule with `ctrlog chaos --seed {} --rounds {}`): {figures}",
            violations.len(),
            options.seed,
            options.seed,
            options.rounds
        );
    }
    Ok(figures)
}

/// Raft's log matching from the replicas' own logs: stops every replica (SIGKILL; the run is
/// over) and reads each one's WAL, every entry under one log id on every replica, replaced
/// ones included, must be the same entry. Returns how many entries it read, and the forks.
fn log_matching_on_disk(cluster: &mut ProcessCluster) -> anyhow::Result<(u64, Vec<Violation>)> {
    let mut matching = LogMatching::default();
    let (mut compared, mut forks) = (0, Vec::new());
    for i in 0..cluster.replica_count() {
        cluster.kill(i);
        let dir = log_dir(&cluster.replica_dir(i));
        if !dir.is_dir() {
            continue;
        }
        let wal = Wal::open(&dir, None, u64::MAX)
            .with_context(|| format!("opening {} to compare logs", dir.display()))?;
        let replica = format!("replica-{}", i + 1);
        for index in wal.first_index()..wal.next_index() {
            let Some(bytes) = wal.read(index)? else {
                continue;
            };
            let entry: Entry = decode(&bytes, RECORD_BYTES_MAX as u64)
                .with_context(|| format!("entry {index} of {}", dir.display()))?;
            forks.extend(matching.observe(&replica, &entry));
            compared += 1;
        }
    }
    Ok((compared, forks))
}

/// A run that fails before its history is checked (a subscriber or a replica that never
/// reaches the end) still says whether the replicas' logs forked, which would explain it.
fn with_forks_on_disk(cluster: &mut ProcessCluster, error: anyhow::Error) -> anyhow::Error {
    let kept = cluster.keep_files().display().to_string();
    let verdict = match log_matching_on_disk(cluster) {
        Ok((compared, forks)) => format!(
            "{} forked log ids among {compared} entries read from the replicas' WALs{}",
            forks.len(),
            forks
                .first()
                .map(|fork| format!(", the first: {fork}"))
                .unwrap_or_default()
        ),
        Err(reading) => format!("the replicas' WALs could not be compared: {reading:#}"),
    };
    error.context(format!("{verdict}; their files are kept in {kept}"))
}

/// Sorts `durations` and gives their count, p50, p99 and max in milliseconds.
fn quantiles(durations: &mut [Duration]) -> serde_json::Value {
    durations.sort();
    let at = |q: f64| {
        durations
            .get(((durations.len() as f64 - 1.0) * q).round() as usize)
            .map_or(0, |d| d.as_millis() as u64)
    };
    json!({
        "count": durations.len(),
        "p50": at(0.5),
        "p99": at(0.99),
        "max": durations.last().map_or(0, |d| d.as_millis() as u64),
    })
}

/// The cluster under fault, and what the rounds did to it.
struct Injector {
    cluster: ProcessCluster,
    /// Present when partitions are among the faults.
    firewall: Option<Firewall>,
    admin: ControlClient,
    options: ClientOptions,
    /// The current voters (indices into the cluster).
    voters: Vec<usize>,
    /// The running replica that is not a member, once a membership change made one.
    spare: Option<usize>,
    /// Fault name → how many times it was injected.
    injected: BTreeMap<&'static str, u32>,
    /// Kind of failover → from the fault to the first commit under a new leader.
    failovers: BTreeMap<&'static str, Vec<Duration>>,
    /// Present when power losses are among the faults.
    power: Option<Arc<PowerLoss>>,
    power_losses: Vec<PowerLossRecord>,
    /// From the restart to repaired and voting again, for each corruption that found damage.
    repairs: Vec<Duration>,
    /// Corruptions that flipped a byte of a stored snapshot rather than of the WAL.
    snapshots_rotted: u64,
    /// Corruptions that flipped a byte of sled's data file, and how many of those sled
    /// refused, so that the replica set its files aside and started over.
    sleds_rotted: u64,
    sleds_set_aside: u64,
}

/// What one power loss did.
struct PowerLossRecord {
    /// From the kill to the first replica back listening on its peer port.
    back: Duration,
    /// What the victims had written and not synced.
    dropped_bytes: u64,
    /// The old leader back first, within the followers' election timeout, having lost appends
    /// it had acknowledged to openraft: the window the fault is for.
    in_window: bool,
}

impl Injector {
    /// Every replica process that should be running: the voters and the spare.
    fn running(&self) -> Vec<usize> {
        self.voters.iter().copied().chain(self.spare).collect()
    }

    fn choose(&self, rng: &mut impl Rng, family: FaultFamily, leader: usize) -> Fault {
        let followers: Vec<usize> = self
            .voters
            .iter()
            .copied()
            .filter(|&v| v != leader)
            .collect();
        let follower = followers[rng.gen_range(0..followers.len())];
        match family {
            FaultFamily::Kills if rng.gen_bool(0.5) => Fault::KillLeader,
            FaultFamily::Kills => Fault::KillReplica(follower),
            FaultFamily::Pauses => Fault::PauseLeader,
            FaultFamily::Snapshots => Fault::SnapshotCatchUp(follower),
            FaultFamily::TornTails => Fault::TornTail(follower, rng.gen_bool(0.5)),
            FaultFamily::Corruption => Fault::Corrupt {
                replica: if rng.gen_bool(1.0 / 3.0) {
                    leader
                } else {
                    follower
                },
                rotted: match rng.gen_range(0..4) {
                    0 => Rotted::Snapshot,
                    1 => Rotted::Sled,
                    _ => Rotted::Wal,
                },
            },
            FaultFamily::Partitions => match rng.gen_range(0..4) {
                0 => Fault::CutLeader,
                1 => Fault::CutLeaderOneWay,
                2 => Fault::CutContainersFromLeader,
                _ => Fault::IsolateFollower(follower),
            },
            FaultFamily::Membership if self.spare.is_some() && rng.gen_bool(0.25) => {
                Fault::AddUnreachable
            }
            FaultFamily::Membership => Fault::ReplaceVoter {
                remove: if rng.gen_bool(1.0 / 3.0) {
                    leader
                } else {
                    follower
                },
            },
            // The cluster's first, so that a short run meets the window the fault is for
            // whatever the machine's speed: the followers are down, so the old leader is back
            // first by construction (the leader's alone hits it only if it restarts within
            // the followers' election timeout). It is also the failure as it was reported.
            FaultFamily::PowerLoss if self.power_losses.is_empty() => {
                Fault::PowerLoss(PowerLossOf::Cluster)
            }
            FaultFamily::PowerLoss => Fault::PowerLoss(match rng.gen_range(0..3) {
                0 => PowerLossOf::Leader,
                1 => PowerLossOf::Follower(follower),
                _ => PowerLossOf::Cluster,
            }),
        }
    }

    async fn inject(&mut self, fault: Fault, leader: usize) -> anyhow::Result<()> {
        let name = match fault {
            Fault::KillLeader => "leader_kill",
            Fault::KillReplica(_) => "follower_kill",
            Fault::PauseLeader => "leader_pause",
            Fault::SnapshotCatchUp(_) => "snapshot_catch_up",
            Fault::TornTail(..) => "torn_tail",
            Fault::Corrupt { replica, .. } if replica == leader => "leader_corrupt",
            Fault::Corrupt { .. } => "follower_corrupt",
            Fault::CutLeader => "leader_cut",
            Fault::CutLeaderOneWay => "leader_cut_one_way",
            Fault::IsolateFollower(_) => "follower_cut",
            Fault::CutContainersFromLeader => "containers_cut",
            Fault::ReplaceVoter { remove } if remove == leader => "leader_replaced",
            Fault::ReplaceVoter { .. } => "follower_replaced",
            Fault::AddUnreachable => "unreachable_added",
            Fault::PowerLoss(PowerLossOf::Leader) => "leader_power_loss",
            Fault::PowerLoss(PowerLossOf::Follower(_)) => "follower_power_loss",
            Fault::PowerLoss(PowerLossOf::Cluster) => "cluster_power_loss",
        };
        *self.injected.entry(name).or_default() += 1;
        let before = self.admin.leader_status().await?.applied_offset;
        let started = Instant::now();
        let options = self.options.clone();
        match fault {
            Fault::KillLeader => {
                self.cluster.kill(leader);
                self.failover("kill", leader, before, started).await?;
                self.cluster.restart(leader)?;
            }
            Fault::KillReplica(i) => self.cluster.restart(i)?,
            Fault::PauseLeader => {
                self.cluster.signal(leader, libc::SIGSTOP)?;
                self.failover("pause", leader, before, started).await?;
                tokio::time::sleep(PARTITION_HELD.saturating_sub(started.elapsed())).await;
                self.cluster.signal(leader, libc::SIGCONT)?;
            }
            Fault::SnapshotCatchUp(i) => {
                catch_up_by_snapshot_then_restart(&mut self.cluster, &self.admin, i, &options)
                    .await?;
            }
            Fault::TornTail(i, zeros) => {
                self.cluster.kill(i);
                let bytes = rand::thread_rng().gen_range(1..70_000);
                wal::faults::tear_tail(&log_dir(&self.cluster.replica_dir(i)), bytes, zeros)?;
                self.cluster.restart(i)?;
                wait_until_back(&mut self.cluster, i, &options).await?;
            }
            Fault::Corrupt { replica: i, rotted } => {
                self.cluster.kill(i);
                if i == leader {
                    self.failover("corrupt", leader, before, started).await?;
                }
                let dir = self.cluster.replica_dir(i);
                let kept_before = damaged_kept(&dir)?;
                let sleds_before = sleds_set_aside(&dir)?;
                let at = rand::thread_rng().gen();
                let flipped = match rotted {
                    Rotted::Sled => sled_faults::flip_data_file_byte(&meta_dir(&dir), at)?
                        .map(|byte| (Rotted::Sled, format!("byte {byte} of sled's data file"))),
                    Rotted::Snapshot => snapshot_faults::flip_snapshot_byte(&meta_dir(&dir), at)?
                        .map(|byte| (Rotted::Snapshot, format!("byte {byte} of the snapshot"))),
                    Rotted::Wal => None,
                };
                let flipped = match flipped {
                    Some(flipped) => Some(flipped),
                    None => wal::faults::flip_synced_byte(&log_dir(&dir), at)?
                        .map(|(segment, byte)| (Rotted::Wal, format!("byte {byte} of {segment}"))),
                };
                tracing::info!(replica = i + 1, ?flipped, "flipped");
                let restarted = Instant::now();
                self.cluster.restart(i)?;
                wait_until_back(&mut self.cluster, i, &options).await?;
                match flipped {
                    // sled may drop its later writes, refuse its files or miss the byte: in
                    // each case the replica is whole and voting again.
                    Some((Rotted::Sled, _)) => {
                        self.sleds_rotted += 1;
                        wait_until_repaired(&mut self.cluster, i, None, &options).await?;
                        if sleds_set_aside(&dir)? > sleds_before {
                            self.sleds_set_aside += 1;
                            self.repairs.push(restarted.elapsed());
                        }
                    }
                    Some((rotted, _)) => {
                        self.snapshots_rotted += u64::from(rotted == Rotted::Snapshot);
                        let found = Some(kept_before);
                        wait_until_repaired(&mut self.cluster, i, found, &options).await?;
                        self.repairs.push(restarted.elapsed());
                    }
                    None => {}
                }
            }
            Fault::CutLeader | Fault::CutLeaderOneWay => {
                for &peer in self.running().iter().filter(|&&r| r != leader) {
                    self.cut(leader, peer)?;
                    if fault == Fault::CutLeader {
                        self.cut(peer, leader)?;
                    }
                }
                let kind = if fault == Fault::CutLeader {
                    "partition"
                } else {
                    "partition_one_way"
                };
                self.failover(kind, leader, before, started).await?;
                tokio::time::sleep(PARTITION_HELD.saturating_sub(started.elapsed())).await;
                self.heal()?;
            }
            Fault::IsolateFollower(i) => {
                for &peer in self.running().iter().filter(|&&r| r != i) {
                    self.cut(i, peer)?;
                    self.cut(peer, i)?;
                }
                tokio::time::sleep(PARTITION_HELD).await;
                self.heal()?;
            }
            Fault::CutContainersFromLeader => {
                // Containers run under the uid of the replica that launched them, and
                // replicas themselves never dial a client port.
                for replica in self.running() {
                    self.cut_to_port(replica, self.cluster.client_port(leader))?;
                }
                tokio::time::sleep(CONTAINER_CUT_HELD).await;
                self.heal()?;
            }
            Fault::ReplaceVoter { remove } => {
                let spare = match self.spare {
                    Some(spare) => spare,
                    None => self.cluster.add_replica()?,
                };
                self.admin
                    .add_member(spare as u64 + 1, self.cluster.member(spare))
                    .await
                    .context("adding the spare as a voter")?;
                self.voters.push(spare);
                self.spare = None;
                let removed_at = Instant::now();
                self.admin
                    .remove_member(remove as u64 + 1)
                    .await
                    .context("removing a voter")?;
                self.voters.retain(|&v| v != remove);
                self.spare = Some(remove);
                if remove == leader {
                    self.failover("leader_removed", leader, before, removed_at)
                        .await?;
                }
            }
            Fault::AddUnreachable => {
                let spare = self.spare.expect("chosen only with a spare");
                self.cluster.kill(spare);
                let id = spare as u64 + 1;
                let refused = self.admin.add_member(id, self.cluster.member(spare)).await;
                anyhow::ensure!(
                    refused.is_err(),
                    "adding replica {id}, which is stopped, reported success"
                );
                let members = self.admin.leader_status().await?.members;
                anyhow::ensure!(
                    members.iter().all(|m| m.id != id),
                    "a failed add of replica {id} left it in the membership: {members:?}"
                );
                self.cluster.restart(spare)?;
            }
            Fault::PowerLoss(of) => self.power_loss(of, leader).await?,
        }
        Ok(())
    }

    /// Stalls the WAL syncs of the leader (or of the follower that loses power), lets the load
    /// run on them, kills the victims, drops what each had written after its last completed
    /// sync, and starts the stalled replica again at once, the rest of a cluster
    /// [`CLUSTER_BACK_AFTER`] later.
    async fn power_loss(&mut self, of: PowerLossOf, leader: usize) -> anyhow::Result<()> {
        let power = self
            .power
            .clone()
            .expect("power losses are chosen only with the shim");
        let first_back = match of {
            PowerLossOf::Follower(i) => i,
            PowerLossOf::Leader | PowerLossOf::Cluster => leader,
        };
        power.stall(first_back)?;
        tokio::time::sleep(SYNCS_STALLED).await;
        let mut victims = vec![first_back];
        if of == PowerLossOf::Cluster {
            victims.extend(self.running().into_iter().filter(|&r| r != first_back));
        }
        let died = Instant::now();
        for &victim in &victims {
            self.cluster.kill(victim);
        }
        let (mut dropped_bytes, mut first_dropped) = (0, 0);
        for &victim in &victims {
            let dropped = power.lose_unsynced(victim, &self.cluster.replica_dir(victim))?;
            if victim == first_back {
                first_dropped = dropped;
            }
            dropped_bytes += dropped;
        }
        self.cluster.restart(first_back)?;
        let back = peer_port_open(&self.cluster.member(first_back).peer_addr, died).await?;
        if victims.len() > 1 {
            tokio::time::sleep(CLUSTER_BACK_AFTER.saturating_sub(died.elapsed())).await;
            for &victim in &victims[1..] {
                self.cluster.restart(victim)?;
            }
        }
        let in_window = !matches!(of, PowerLossOf::Follower(_))
            && first_dropped > 0
            && (of == PowerLossOf::Cluster || back < FOLLOWERS_ELECTION_TIMEOUT);
        self.power_losses.push(PowerLossRecord {
            back,
            dropped_bytes,
            in_window,
        });
        let options = self.options.clone();
        for &victim in &victims {
            wait_until_back(&mut self.cluster, victim, &options).await?;
        }
        Ok(())
    }

    /// One line per running replica: its role, term, leader and applied offset, for a
    /// failure report.
    async fn describe(&self) -> String {
        let mut lines = Vec::new();
        for i in self.running() {
            let voter = if self.voters.contains(&i) {
                "voter"
            } else {
                "spare"
            };
            let status = match client_of(&self.cluster, i, &self.options).await {
                Ok(client) => client.status().await.map_err(anyhow::Error::from),
                Err(error) => Err(error),
            };
            let probe = match &status {
                // What an append there meets now: a leader that cannot commit says why here.
                Ok(s) if s.role == "Leader" => {
                    let options = ClientOptions {
                        retry_deadline: Duration::ZERO,
                        request_timeout: Duration::from_secs(2),
                        ..ClientOptions::default()
                    };
                    let addr = self.cluster.client_addrs()[i].clone();
                    let answer = match ControlClient::connect_with(&[addr], options).await {
                        Ok(client) => client
                            .append(Command::custom(1, 1, b"probe".to_vec()))
                            .await
                            .map(|ack| ack.offset)
                            .map_err(anyhow::Error::from),
                        Err(error) => Err(error.into()),
                    };
                    format!("; an append there: {answer:?}")
                }
                _ => String::new(),
            };
            lines.push(match status {
                Ok(s) => format!(
                    "  replica {} ({voter}): {} in term {}, leader {:?}, log to {:?}, applied index {:?} (offset {}), members {:?}{probe}",
                    i + 1,
                    s.role,
                    s.term,
                    s.leader_id,
                    s.last_log_index,
                    s.applied_index,
                    s.applied_offset,
                    s.members.iter().map(|m| (m.id, m.voter)).collect::<Vec<_>>()
                ),
                Err(error) => format!("  replica {} ({voter}): {error}", i + 1),
            });
        }
        lines.join("\n")
    }

    /// Drops what replica `from` sends to replica `to`'s peer port.
    fn cut(&self, from: usize, to: usize) -> anyhow::Result<()> {
        self.cut_to_port(from, self.cluster.peer_port(to))
    }

    /// Drops what the processes of replica `from`'s uid (it, and the containers it launched)
    /// send to `port`.
    fn cut_to_port(&self, from: usize, port: u16) -> anyhow::Result<()> {
        let firewall = self.firewall.as_ref().expect("partitions have a firewall");
        let uid = self
            .cluster
            .uid(from)
            .expect("partitions run replicas under own uids");
        firewall.cut(uid, port)
    }

    fn heal(&self) -> anyhow::Result<()> {
        self.firewall
            .as_ref()
            .expect("partitions have a firewall")
            .heal()
    }

    /// Records the time from `since` to the first commit under a leader other than `old`.
    async fn failover(
        &mut self,
        kind: &'static str,
        old: usize,
        before: Offset,
        since: Instant,
    ) -> anyhow::Result<()> {
        let addrs = self.cluster.client_addrs();
        let took = first_commit_under_new_leader(&addrs, old, before, since).await?;
        self.failovers.entry(kind).or_default().push(took);
        Ok(())
    }
}

/// One producer's load: sequential appends with its own `(producer, seq)`, each retried until
/// it is acknowledged, as a real producer must when an append's fate is unknown.
struct Load {
    producer: u64,
    /// Bodies are padded to this size (the producer and sequence alone when smaller).
    body_bytes: usize,
    /// Between appends (none when zero).
    pause: Duration,
}

impl Load {
    async fn run(
        self,
        client: ControlClient,
        stop: Arc<AtomicBool>,
        produced: Arc<Mutex<Produced>>,
    ) {
        let producer = self.producer;
        let mut seq = 0;
        while !stop.load(Ordering::Relaxed) {
            seq += 1;
            let pair = ProducerSeq { producer, seq };
            let mut body = format!("{producer}/{seq}").into_bytes();
            if body.len() < self.body_bytes {
                body.resize(self.body_bytes, b'x');
            }
            let frame = Command::custom(1, 1, body).into_frame();
            produced
                .lock()
                .expect("never poisoned")
                .attempted
                .insert(pair);
            let proposal = Proposal {
                producer: Some(pair),
                target: Target::All,
                frame: frame.clone(),
            };
            loop {
                match client.append_proposal(proposal.clone()).await {
                    Ok(ack) => {
                        produced.lock().expect("never poisoned").acked.push(Acked {
                            pair,
                            offset: ack.offset,
                            frame,
                        });
                        break;
                    }
                    Err(ClientError::GaveUp { .. }) if !stop.load(Ordering::Relaxed) => {}
                    Err(_) if stop.load(Ordering::Relaxed) => return,
                    Err(error) => {
                        eprintln!("producer {producer} stopped at seq {seq}: {error}");
                        return;
                    }
                }
            }
            if !self.pause.is_zero() {
                tokio::time::sleep(self.pause).await;
            }
        }
    }
}

/// A client of replica `i` alone (0-based), which answers `status` itself.
async fn client_of(
    cluster: &ProcessCluster,
    i: usize,
    options: &ClientOptions,
) -> anyhow::Result<ControlClient> {
    let addr = cluster.client_addrs()[i].clone();
    Ok(ControlClient::connect_with(&[addr], options.clone()).await?)
}

/// Waits until replica `i` runs and answers, failing with its log if it exited or stays
/// silent: no fault may leave a replica unable to start.
async fn wait_until_back(
    cluster: &mut ProcessCluster,
    i: usize,
    options: &ClientOptions,
) -> anyhow::Result<()> {
    let what = format!("replica {} to answer after its restart", i + 1);
    let answered = poll_until(&what, REPLICA_BACK_MAX, POLL_INTERVAL, || async {
        match client_of(cluster, i, options).await {
            Ok(client) => client.status().await.map_err(|e| e.to_string()),
            Err(error) => Err(error.to_string()),
        }
    })
    .await;
    if let Some(status) = cluster.exited(i) {
        anyhow::bail!(
            "replica {} exited ({status}) after a restart:\n{}",
            i + 1,
            cluster.log_tail(i, 20)
        );
    }
    answered.map(|_| ()).map_err(|e| {
        anyhow::anyhow!(
            "{e}\nreplica {} logged:\n{}",
            i + 1,
            cluster.log_tail(i, 20)
        )
    })
}

/// How many damaged parts of its log the replica in `data_dir` has kept aside so far (one
/// folder under the WAL's `damaged/` each time it found damage).
fn damaged_kept(data_dir: &std::path::Path) -> anyhow::Result<usize> {
    match std::fs::read_dir(log_dir(data_dir).join(wal::DAMAGED_DIR)) {
        Ok(entries) => Ok(entries.count()),
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => Ok(0),
        Err(error) => Err(error.into()),
    }
}

/// Waits until replica `i`, restarted with damaged files, reports its storage whole again:
/// repaired from the leader, voting. With `kept_before`, it must also have found the damage
/// (kept one more damaged part than that).
async fn wait_until_repaired(
    cluster: &mut ProcessCluster,
    i: usize,
    kept_before: Option<usize>,
    options: &ClientOptions,
) -> anyhow::Result<()> {
    let dir = cluster.replica_dir(i);
    let what = format!(
        "replica {} to find the damage and be repaired from the leader",
        i + 1
    );
    let repaired = poll_until(&what, REPAIR_MAX, POLL_INTERVAL, || async {
        if let Some(kept_before) = kept_before {
            if damaged_kept(&dir).map_err(|e| e.to_string())? <= kept_before {
                return Err("it kept no damaged part".to_string());
            }
        }
        let client = client_of(cluster, i, options)
            .await
            .map_err(|e| e.to_string())?;
        match client.status_with_storage().await {
            Ok((_, Some(storage))) => match storage.repairing {
                None => Ok(()),
                Some(repairing) => Err(repairing.to_string()),
            },
            Ok((_, None)) => Err("no storage status".to_string()),
            Err(error) => Err(error.to_string()),
        }
    })
    .await;
    repaired.map_err(|e| {
        anyhow::anyhow!(
            "{e}\nreplica {} logged:\n{}",
            i + 1,
            cluster.log_tail(i, 20)
        )
    })
}

/// Stops follower `i` until the leader has purged its log past the follower's end, restarts
/// it (it catches up by installing the leader's snapshot), then kills and restarts it twice
/// right after the install.
async fn catch_up_by_snapshot_then_restart(
    cluster: &mut ProcessCluster,
    admin: &ControlClient,
    i: usize,
    options: &ClientOptions,
) -> anyhow::Result<()> {
    let behind = client_of(cluster, i, options)
        .await?
        .status()
        .await?
        .last_log_index
        .unwrap_or(0);
    cluster.kill(i);
    let purged = poll_until(
        "the leader to purge past the stopped follower",
        REPLICA_BACK_MAX,
        POLL_INTERVAL,
        || async {
            match admin.leader_status().await.map(|s| s.purged_index) {
                Ok(Some(purged)) if purged > behind => Ok(purged),
                other => Err(format!("purged {other:?}, follower at {behind}")),
            }
        },
    )
    .await?;
    cluster.restart(i)?;
    wait_until_back(cluster, i, options).await?;
    let client = client_of(cluster, i, options).await?;
    poll_until(
        "the follower to install the leader's snapshot",
        REPLICA_BACK_MAX,
        POLL_INTERVAL,
        || async {
            match client.status().await.map(|s| s.snapshot_index) {
                Ok(Some(snapshot)) if snapshot >= purged => Ok(()),
                other => Err(format!("snapshot {other:?}, leader purged {purged}")),
            }
        },
    )
    .await?;
    for _ in 0..2 {
        cluster.restart(i)?;
        wait_until_back(cluster, i, options).await?;
    }
    Ok(())
}

/// Waits until `addr` accepts connections, and returns the time since `since`.
async fn peer_port_open(addr: &str, since: Instant) -> anyhow::Result<Duration> {
    let deadline = Instant::now() + REPLICA_BACK_MAX;
    loop {
        if tokio::net::TcpStream::connect(addr).await.is_ok() {
            return Ok(since.elapsed());
        }
        anyhow::ensure!(
            Instant::now() < deadline,
            "{addr} did not listen within {REPLICA_BACK_MAX:?}"
        );
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

/// Waits for a commit past `before` under a leader other than `old`, returning the time since
/// the fault. Asks every replica in `addrs` directly, every 10 ms, so that the figure is the
/// cluster's and not a client's retry backoff (which the producers' own acks include).
async fn first_commit_under_new_leader(
    addrs: &[String],
    old: usize,
    before: Offset,
    since: Instant,
) -> anyhow::Result<Duration> {
    let options = ClientOptions {
        retry_deadline: Duration::ZERO,
        request_timeout: Duration::from_millis(200),
        ..ClientOptions::default()
    };
    let mut clients: Vec<Option<ControlClient>> = (0..addrs.len()).map(|_| None).collect();
    let timeout = Duration::from_secs(60).saturating_sub(since.elapsed());
    let deadline = Instant::now() + timeout;
    loop {
        for (i, client) in clients.iter_mut().enumerate() {
            if i == old {
                continue;
            }
            if client.is_none() {
                *client = ControlClient::connect_with(&addrs[i..=i], options.clone())
                    .await
                    .ok();
            }
            let Some(replica) = client else { continue };
            match replica.status().await {
                Ok(status)
                    if status.role == "Leader"
                        && status.leader_id == Some(status.id)
                        && status.applied_offset > before =>
                {
                    return Ok(since.elapsed());
                }
                Ok(_) => {}
                Err(_) => *client = None,
            }
        }
        anyhow::ensure!(
            Instant::now() < deadline,
            "no commit under a new leader within {timeout:?}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Everything one replica retains, up to `last`, without a gap. Fails if the replica has not
/// applied that far within `REPLICA_BACK_MAX`.
pub async fn read_log(addr: &str, last: Offset) -> anyhow::Result<Vec<LogEntry>> {
    let client = ControlClient::connect(&[addr.to_string()]).await?;
    let mut entries = Vec::new();
    let mut next = 1;
    let deadline = Instant::now() + REPLICA_BACK_MAX;
    while next <= last {
        anyhow::ensure!(
            Instant::now() < deadline,
            "{addr} did not apply offset {next} of {last} within {REPLICA_BACK_MAX:?}"
        );
        match client.fetch(FetchRequest::from(next)).await {
            Ok(response) if response.entries.is_empty() && response.next_offset <= next => {
                // This replica has not applied that far yet: wait for it.
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            Ok(response) => {
                next = response.next_offset;
                entries.extend(response.entries.into_iter().filter(|e| e.offset <= last));
            }
            // Purged before (or, as the last snapshot lands, while) we read: the retained log
            // starts later; read it whole from there, so that it stays contiguous.
            Err(ClientError::Api(ApiError::Compacted { first_offset, .. })) => {
                entries.clear();
                next = first_offset;
            }
            Err(error) => return Err(error.into()),
        }
    }
    Ok(entries)
}
