//! Rolling upgrades with real binaries: three replicas of v0.1.0 (commit 7ad98d6, built by
//! `scripts/build-v0.1.0.sh`) serve a v0.1.0 client (its own `ctrlog append` and `ctrlog tail`
//! processes) and a client of this build while they are replaced one by one with this build
//! on the same data directories, as DEPLOY.md's upgrade section tells an operator to; then the
//! vocabulary level is raised. The history checker then verifies every guarantee: nothing
//! acknowledged lost, nothing appended twice, every subscription continuous and equal to the
//! replicas' logs.

use std::collections::BTreeSet;
use std::io::BufRead;
use std::path::PathBuf;
use std::process::{Child, Command as Process, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use base64::Engine;
use ctrlog::client::{ClientError, ControlClient, Status, SubscriptionItem};
use ctrlog::jobs::Rejection;
use ctrlog::log::{
    Command, Filter, Frame, LogEntry, ProducerSeq, Proposal, SetVocabularyLevel, Target,
};
use ctrlog::tools::chaos::checker::{check, Acked, Delivery, History, SubscriptionRecord};
use ctrlog::tools::chaos::read_log;
use ctrlog::tools::cluster::ProcessCluster;
use ctrlog::tools::{poll_until, POLL_INTERVAL};
use futures::StreamExt;

/// How long any one condition may take to hold.
const WAIT: Duration = Duration::from_secs(60);

/// How long a replica has to stop after SIGTERM, as a service manager would allow.
const STOP_GRACE: Duration = Duration::from_secs(10);

/// Raft entries each replica applies between snapshots: a few per step.
const SNAPSHOT_EVERY: u64 = 8;

/// Acknowledged appends each running client must add after every step.
const APPENDS_PER_STEP: u64 = 3;

/// The v0.1.0 binary, built once and kept in `target/v0.1.0/` (the tests here, which run at
/// once, share one build).
fn v010_binary() -> PathBuf {
    static BUILT: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    BUILT
        .get_or_init(|| {
            let script = concat!(env!("CARGO_MANIFEST_DIR"), "/scripts/build-v0.1.0.sh");
            let built = Process::new(script)
                .stderr(Stdio::inherit())
                .output()
                .expect("scripts/build-v0.1.0.sh runs");
            assert!(built.status.success(), "building v0.1.0 failed");
            PathBuf::from(String::from_utf8(built.stdout).unwrap().trim())
        })
        .clone()
}

fn this_build() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_ctrlog"))
}

/// What the producers tried and had acknowledged.
#[derive(Default)]
struct Produced {
    attempted: BTreeSet<ProducerSeq>,
    acked: Vec<Acked>,
}

impl Produced {
    /// Records the `seq`-th append of `client`'s `producer` as attempted; returns its pair
    /// and command.
    fn attempt(
        this: &Mutex<Produced>,
        client: &str,
        producer: u64,
        seq: u64,
    ) -> (ProducerSeq, Frame) {
        let pair = ProducerSeq { producer, seq };
        this.lock().unwrap().attempted.insert(pair);
        (pair, frame(client, seq))
    }

    /// Records an acknowledged append, and counts it in `acks`.
    fn acknowledged(
        this: &Mutex<Produced>,
        acks: &AtomicU64,
        pair: ProducerSeq,
        offset: u64,
        frame: Frame,
    ) {
        this.lock().unwrap().acked.push(Acked {
            pair,
            offset,
            frame,
        });
        acks.fetch_add(1, Ordering::Relaxed);
    }
}

/// One client's appends and subscription, running until stopped.
struct Client {
    name: &'static str,
    acks: Arc<AtomicU64>,
    delivered_upto: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
}

impl Client {
    fn new(name: &'static str) -> Client {
        Client {
            name,
            acks: Arc::default(),
            delivered_upto: Arc::default(),
            stop: Arc::default(),
        }
    }
}

/// The command a producer appends as its `seq`-th.
fn frame(client: &str, seq: u64) -> Frame {
    Command::custom(1, 1, format!("{client} {seq}").into_bytes()).into_frame()
}

/// The v0.1.0 client's producer: one `ctrlog append` process of the v0.1.0 binary per command,
/// each run again with the same `(producer, seq)` until it is acknowledged.
fn old_producer(
    exe: PathBuf,
    seeds: String,
    producer: u64,
    client: &Client,
    produced: Arc<Mutex<Produced>>,
) -> std::thread::JoinHandle<()> {
    let (name, acks, stop) = (client.name, client.acks.clone(), client.stop.clone());
    std::thread::spawn(move || {
        let mut seq = 0;
        while !stop.load(Ordering::Relaxed) {
            seq += 1;
            let (pair, frame) = Produced::attempt(&produced, name, producer, seq);
            loop {
                let run = Process::new(&exe)
                    .args(["--cluster", &seeds, "append", "--kind", "custom:1"])
                    .arg("--payload")
                    .arg(String::from_utf8(frame.body.clone()).unwrap())
                    .args(["--producer", &producer.to_string()])
                    .args(["--seq", &seq.to_string(), "--json"])
                    .env("RUST_LOG", "error")
                    .output()
                    .expect("the v0.1.0 binary runs");
                if run.status.success() {
                    let ack: serde_json::Value = serde_json::from_slice(&run.stdout).unwrap();
                    let offset = ack["offset"].as_u64().expect("an offset");
                    Produced::acknowledged(&produced, &acks, pair, offset, frame);
                    break;
                }
                if stop.load(Ordering::Relaxed) {
                    return;
                }
                eprintln!(
                    "{name}: append {seq} failed, retrying: {}",
                    String::from_utf8_lossy(&run.stderr).trim()
                );
            }
        }
    })
}

/// A line of `ctrlog tail --json` (v0.1.0's format) as the delivery it reports.
fn delivery_of_line(line: &str) -> Delivery {
    let json: serde_json::Value = serde_json::from_str(line).expect("tail prints JSON");
    if let Some(offset) = json["reset"]["offset"].as_u64() {
        return Delivery::Reset { offset };
    }
    let number = |key: &str| {
        json[key]
            .as_u64()
            .unwrap_or_else(|| panic!("{key} in {line}"))
    };
    let body = match (json["payload"].as_str(), json["payload_b64"].as_str()) {
        (Some(text), _) => text.as_bytes().to_vec(),
        (None, Some(b64)) => base64::engine::general_purpose::STANDARD
            .decode(b64)
            .unwrap(),
        (None, None) => panic!("no payload in {line}"),
    };
    Delivery::Entry(LogEntry {
        offset: number("offset"),
        term: number("term"),
        appended_at_ms: number("appended_at_ms"),
        producer: json["producer"].as_u64().map(|producer| ProducerSeq {
            producer,
            seq: number("seq"),
        }),
        target: json["target"].as_str().unwrap().parse().unwrap(),
        frame: Frame {
            kind: number("kind") as u32,
            version: number("version") as u16,
            body,
        },
    })
}

/// The v0.1.0 client's subscription: `ctrlog tail --follow --json` of the v0.1.0 binary from
/// offset 1, its lines read into deliveries.
fn old_subscriber(
    exe: &PathBuf,
    seeds: &str,
    client: &Client,
) -> (Child, std::thread::JoinHandle<Vec<Delivery>>) {
    let mut tail = Process::new(exe)
        .args([
            "--cluster",
            seeds,
            "tail",
            "--from",
            "1",
            "--follow",
            "--json",
        ])
        .env("RUST_LOG", "error")
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("the v0.1.0 binary runs");
    let lines = std::io::BufReader::new(tail.stdout.take().unwrap());
    let upto = client.delivered_upto.clone();
    let reader = std::thread::spawn(move || {
        let mut deliveries = Vec::new();
        for line in lines.lines() {
            let delivery = delivery_of_line(&line.unwrap());
            if let Delivery::Entry(LogEntry { offset, .. }) | Delivery::Reset { offset } = &delivery
            {
                upto.store(*offset, Ordering::Relaxed);
            }
            deliveries.push(delivery);
        }
        deliveries
    });
    (tail, reader)
}

/// This build's client: a producer appending with explicit `(producer, seq)` pairs through
/// the client library's retries, and a subscription from offset 1.
async fn new_client(
    seeds: &[String],
    producer: u64,
    client: &Client,
    produced: Arc<Mutex<Produced>>,
    deliveries: Arc<Mutex<Vec<Delivery>>>,
) -> (tokio::task::JoinHandle<()>, tokio::task::JoinHandle<()>) {
    let connection = ControlClient::connect(seeds).await.unwrap();
    let (name, acks, stop) = (client.name, client.acks.clone(), client.stop.clone());
    let appends = connection.clone();
    let producing = tokio::spawn(async move {
        let mut seq = 0;
        while !stop.load(Ordering::Relaxed) {
            seq += 1;
            let (pair, frame) = Produced::attempt(&produced, name, producer, seq);
            let proposal = Proposal {
                producer: Some(pair),
                target: Target::All,
                frame: frame.clone(),
            };
            loop {
                match appends.append_proposal(proposal.clone()).await {
                    Ok(ack) => {
                        Produced::acknowledged(&produced, &acks, pair, ack.offset, frame);
                        break;
                    }
                    Err(_) if stop.load(Ordering::Relaxed) => return,
                    Err(ClientError::GaveUp { .. }) => {}
                    Err(error) => panic!("{name}: append {seq}: {error}"),
                }
            }
        }
    });
    let upto = client.delivered_upto.clone();
    let subscribing = tokio::spawn(async move {
        let mut stream = connection.subscribe(1, Filter::Everything);
        while let Some(item) = stream.next().await {
            let delivery = match item {
                Ok(SubscriptionItem::Entry(entry)) => Delivery::Entry(entry),
                Ok(SubscriptionItem::Reset { offset, .. }) => Delivery::Reset { offset },
                Err(_) => continue, // the stream retries from where it was
            };
            if let Delivery::Entry(LogEntry { offset, .. }) | Delivery::Reset { offset } = &delivery
            {
                upto.store(*offset, Ordering::Relaxed);
            }
            deliveries.lock().unwrap().push(delivery);
        }
    });
    (producing, subscribing)
}

/// Waits until `reached(i, client)` holds for every client in `clients`.
async fn until_each(what: &str, clients: &[&Client], reached: impl Fn(usize, &Client) -> bool) {
    poll_until(what, WAIT, POLL_INTERVAL, || {
        let behind: Vec<&str> = (clients.iter().enumerate())
            .filter(|(i, client)| !reached(*i, client))
            .map(|(_, client)| client.name)
            .collect();
        std::future::ready(match behind.is_empty() {
            true => Ok(()),
            false => Err(format!("still waiting for {behind:?}")),
        })
    })
    .await
    .unwrap();
}

/// Waits until every client in `running` has `APPENDS_PER_STEP` more acknowledged appends
/// than now: the cluster serves them all after the step just taken.
async fn progress(step: &str, running: &[&Client]) {
    let targets: Vec<u64> = running
        .iter()
        .map(|c| c.acks.load(Ordering::Relaxed) + APPENDS_PER_STEP)
        .collect();
    until_each(step, running, |i, c| {
        c.acks.load(Ordering::Relaxed) >= targets[i]
    })
    .await;
}

/// The status of the replica at `addr` alone, as `ctrlog status` on its host shows it.
async fn status_of(addr: &str) -> Result<Status, ClientError> {
    ControlClient::connect(&[addr.to_string()])
        .await?
        .status()
        .await
}

/// Waits until the replica at `addr` knows a leader, has applied everything the leader had
/// when the step was taken, and has taken a snapshot of its own since `snapshot_before` (so
/// the next build to open its directory reads a snapshot this one wrote). Only then is the
/// next replica stopped, so that the cluster never loses its quorum.
async fn caught_up(step: &str, addr: &str, admin: &ControlClient, snapshot_before: Option<u64>) {
    let target = admin.leader_status().await.unwrap().applied_offset;
    poll_until(step, WAIT, POLL_INTERVAL, || async {
        let status = status_of(addr).await.map_err(|e| e.to_string())?;
        match status.leader_id.is_some()
            && status.applied_offset >= target
            && status.snapshot_index > snapshot_before
        {
            true => Ok(()),
            false => Err(format!(
                "leader {:?}, applied {} of {target}, snapshot at index {:?}",
                status.leader_id, status.applied_offset, status.snapshot_index
            )),
        }
    })
    .await
    .unwrap();
}

/// Raises the vocabulary level to 3 (which v0.1.0 does not know) through `client`.
async fn raise_to_3(client: &ControlClient) -> Result<(), ClientError> {
    client
        .append(Command::SetVocabularyLevel(SetVocabularyLevel { level: 3 }))
        .await
        .map(|_| ())
}

#[derive(Clone, Copy, PartialEq)]
enum Order {
    /// The replicas are upgraded while v0.1.0's client keeps running (and after).
    ReplicasFirst,
    /// v0.1.0's client has stopped (its containers were upgraded) before any replica is.
    ClientsFirst,
}

async fn rolling_upgrade(order: Order) {
    let (old, new) = (v010_binary(), this_build());
    // Frequent snapshots, so that each build restarts from (and the rolled-back v0.1.0
    // reads) snapshots the other wrote.
    let snapshots = [
        "--snapshot-logs-since-last".to_string(),
        SNAPSHOT_EVERY.to_string(),
    ];
    let mut cluster = ProcessCluster::start_with(old.clone(), 3, &snapshots)
        .await
        .unwrap();
    let seeds = cluster.client_addrs();
    let produced = Arc::new(Mutex::new(Produced::default()));
    let (old_client, new_client_) = (Client::new("v0.1.0 client"), Client::new("this client"));

    let old_producing = old_producer(
        old.clone(),
        seeds.join(","),
        0x0100,
        &old_client,
        produced.clone(),
    );
    let (mut old_tail, old_tailing) = old_subscriber(&old, &seeds.join(","), &old_client);
    let new_deliveries = Arc::new(Mutex::new(Vec::new()));
    let (new_producing, new_subscribing) = new_client(
        &seeds,
        0x0200,
        &new_client_,
        produced.clone(),
        new_deliveries.clone(),
    )
    .await;
    progress(
        "both clients append to v0.1.0",
        &[&old_client, &new_client_],
    )
    .await;

    // v0.1.0's client, stopped: its producer finishes the append it is in, and its
    // subscription ends where it got.
    let stop_old_client = |tail: &mut Child| {
        old_client.stop.store(true, Ordering::Relaxed);
        tail.kill().unwrap();
        tail.wait().unwrap();
    };
    let mut running = vec![&old_client, &new_client_];
    if order == Order::ClientsFirst {
        stop_old_client(&mut old_tail);
        running.remove(0);
    }

    let admin = ControlClient::connect(&seeds).await.unwrap();
    for (i, addr) in seeds.iter().enumerate() {
        let mut steps = vec![(new.clone(), format!("replica {} runs this build", i + 1))];
        if i == 0 && order == Order::ReplicasFirst {
            // Before the level is raised, an upgrade can be rolled back.
            steps.push((old.clone(), "replica 1 rolled back to v0.1.0".into()));
            steps.push((new.clone(), "replica 1 upgraded again".into()));
        }
        for (exe, step) in steps {
            let snapshot_before = status_of(addr).await.unwrap().snapshot_index;
            cluster.replace(i, exe, STOP_GRACE).await.unwrap();
            progress(&step, &running).await;
            caught_up(&step, addr, &admin, snapshot_before).await;
        }
        if i < 2 {
            // A replica of v0.1.0 remains: the leader refuses the level it does not know.
            match raise_to_3(&admin).await {
                Err(ClientError::Api(ctrlog::client::ApiError::Refused(
                    Rejection::LevelUnsupported {
                        requested: 3,
                        supported: 2,
                    },
                ))) => {}
                other => panic!("raising to 3 with v0.1.0 replicas left: {other:?}"),
            }
        }
    }
    raise_to_3(&admin)
        .await
        .expect("every replica knows level 3");
    progress("both clients append at level 3", &running).await;

    old_client.stop.store(true, Ordering::Relaxed);
    new_client_.stop.store(true, Ordering::Relaxed);
    new_producing.await.unwrap();
    tokio::task::block_in_place(|| old_producing.join().unwrap());
    let last = admin.leader_status().await.unwrap().applied_offset;
    let mut subscribers = vec![&new_client_];
    if order == Order::ReplicasFirst {
        subscribers.push(&old_client);
    }
    until_each("the subscriptions reach the end", &subscribers, |_, c| {
        c.delivered_upto.load(Ordering::Relaxed) >= last
    })
    .await;
    if order == Order::ReplicasFirst {
        stop_old_client(&mut old_tail);
    }
    let old_deliveries = old_tailing.join().unwrap();
    new_subscribing.abort();
    let new_deliveries = std::mem::take(&mut *new_deliveries.lock().unwrap());

    let mut replica_logs = Vec::new();
    for (i, addr) in seeds.iter().enumerate() {
        let log = read_log(addr, last).await.unwrap();
        replica_logs.push((format!("replica-{}", i + 1), log));
    }
    let produced = std::mem::take(&mut *produced.lock().unwrap());
    let acked = produced.acked.len();
    let record = |name: &str, deliveries| SubscriptionRecord {
        name: name.into(),
        filter: Filter::Everything,
        from: 1,
        deliveries,
    };
    let history = History {
        replica_logs,
        attempted: produced.attempted,
        acked: produced.acked,
        subscriptions: vec![
            record("v0.1.0 tail", old_deliveries),
            record("this client", new_deliveries),
        ],
        task_events: Vec::new(),
    };
    assert_eq!(check(&history), vec![], "{acked} appends acknowledged");
}

/// Goal: a rolling upgrade from v0.1.0 loses nothing and stops no client. Steps: three v0.1.0
/// replicas; v0.1.0's client (`ctrlog append` and `ctrlog tail --follow` processes of the
/// v0.1.0 binary) and this build's client append and subscribe throughout; each replica in
/// turn is stopped with SIGTERM and started as this build on its data directory (the first
/// is rolled back to v0.1.0 and upgraded again); both clients must make progress after each
/// step; raising the vocabulary level to 3 is refused while a v0.1.0 replica remains and
/// succeeds after; the history checker finds no lost, duplicated or skipped command.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_upgrade_under_clients_of_both_builds() {
    rolling_upgrade(Order::ReplicasFirst).await;
}

/// Goal: the other order: clients upgraded before the replicas. Steps: as above, but
/// v0.1.0's client stops after the first phase, so this build's client alone talks to
/// v0.1.0 replicas, then to a mixed cluster, then to this build's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clients_upgrade_before_the_replicas() {
    rolling_upgrade(Order::ClientsFirst).await;
}

/// Goal: a new cluster with a founding member on v0.1.0 is founded at the highest level
/// v0.1.0 knows (2), never at this build's, so the old member keeps applying the log; a raise
/// beyond it is refused while the member runs v0.1.0. 3d7237e founded every cluster at level
/// 1. Steps: replicas 1 and 2 on this build, 3 on v0.1.0 (restarted if it leads the new log,
/// as a v0.1.0 leader founds nothing); the level; offset 1 is the raise; the v0.1.0 replica
/// applies it and the first append; a raise to 3 is refused naming level 2.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_cluster_with_a_v010_member_is_founded_at_the_level_v010_knows() {
    let mut cluster = ProcessCluster::start_mixed(this_build(), 3, &[], [(2, v010_binary())])
        .await
        .unwrap();
    if cluster.leader_index().await.unwrap() == 2 {
        cluster.kill(2);
        cluster.restart(2).unwrap();
    }
    let client = ControlClient::connect(&cluster.client_addrs())
        .await
        .unwrap();
    poll_until(
        "the new cluster's level raise",
        WAIT,
        POLL_INTERVAL,
        || async {
            let level = (client.leader_status().await)
                .map_err(|e| e.to_string())?
                .vocabulary_level;
            match level {
                2 => Ok(()),
                other => Err(format!("level {other}")),
            }
        },
    )
    .await
    .unwrap();
    let first = client
        .append(Command::custom(1, 1, b"first".to_vec()))
        .await
        .unwrap();
    assert_eq!(first.offset, 2, "the raise took offset 1");
    let mut log = client.subscribe(1, Filter::Everything);
    match tokio::time::timeout(WAIT, log.next()).await {
        Ok(Some(Ok(SubscriptionItem::Entry(entry)))) => assert_eq!(
            (entry.offset, entry.command()),
            (
                1,
                Command::SetVocabularyLevel(SetVocabularyLevel { level: 2 })
            )
        ),
        other => panic!("offset 1: {other:?}"),
    }
    let old_member = cluster.client_addrs()[2].clone();
    poll_until(
        "the v0.1.0 member to apply",
        WAIT,
        POLL_INTERVAL,
        || async {
            let applied = status_of(&old_member)
                .await
                .map_err(|e| e.to_string())?
                .applied_offset;
            match applied >= first.offset {
                true => Ok(()),
                false => Err(format!("applied {applied}")),
            }
        },
    )
    .await
    .unwrap();
    match raise_to_3(&client).await {
        Err(ClientError::Api(ctrlog::client::ApiError::Refused(Rejection::LevelUnsupported {
            requested: 3,
            supported: 2,
        }))) => {}
        other => panic!("expected LevelUnsupported, got {other:?}"),
    }
}
