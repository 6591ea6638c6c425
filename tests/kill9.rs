//! Real `ctrlog serve` processes killed with SIGKILL in a loop while clients append.

mod common;

use std::collections::{BTreeMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::read_retained;
use ctrlog::client::{AppendAck, ControlClient};
use ctrlog::log::{Command, LogEntry, ProducerSeq, Proposal, Target};
use ctrlog::tools::cluster::ProcessCluster;
use ctrlog::tools::{poll_until, POLL_INTERVAL};

const WAIT: Duration = Duration::from_secs(60);
const KILL_ROUNDS: usize = 6;
const WRITERS: u64 = 4;
/// Enough distinct producers that the producer table, and so every snapshot, outgrows sled's
/// 128 KiB blob threshold (about 48 bytes per producer).
const APPENDS_MIN: usize = 3_000;
/// Every this many appends carries a body above 128 KiB.
const LARGE_EVERY: u64 = 40;
const LARGE_BYTES: usize = 200 << 10;

fn body(producer: u64) -> Vec<u8> {
    let size = if producer.is_multiple_of(LARGE_EVERY) {
        LARGE_BYTES
    } else {
        64
    };
    let mut body = producer.to_le_bytes().to_vec();
    body.resize(size, (producer % 251) as u8);
    body
}

/// Goal: no acknowledged append is ever lost when replicas die with SIGKILL at any moment,
/// including appends and snapshots larger than sled's 128 KiB blob threshold.
/// Steps: start three `ctrlog serve` processes (snapshot every 200 entries, keep 50); four
/// writers append with a fresh producer id each time (growing the snapshot), every 40th body
/// 200 KiB; six times, once the writers have made progress, SIGKILL a replica (the leader
/// every other round) and restart it on its directory; then stop, wait for all replicas to
/// apply everything, and check: every acknowledged append is at its acknowledged offset with
/// its body, offsets are contiguous, no producer pair appears twice, and all three logs are
/// equal.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_loop_never_loses_an_acknowledged_append() {
    let extra: Vec<String> = [
        "--snapshot-logs-since-last",
        "200",
        "--snapshot-logs-to-keep",
        "50",
    ]
    .map(String::from)
    .to_vec();
    let mut cluster = ProcessCluster::start_with(env!("CARGO_BIN_EXE_ctrlog").into(), 3, &extra)
        .await
        .unwrap();
    let client_addrs = cluster.client_addrs();

    // Writers: each append has its own producer id, so the outcome is checkable per append.
    let acked: Arc<Mutex<Vec<(u64, u64)>>> = Arc::default(); // (producer, offset)
    let stop = Arc::new(AtomicBool::new(false));
    let mut writers = Vec::new();
    for writer in 0..WRITERS {
        let (acked, stop, seeds) = (acked.clone(), stop.clone(), client_addrs.clone());
        writers.push(tokio::spawn(async move {
            let client = ControlClient::connect(&seeds).await.unwrap();
            let mut n = 0u64;
            while !stop.load(Ordering::Relaxed) {
                n += 1;
                let producer = n * WRITERS + writer;
                let proposal = Proposal {
                    producer: Some(ProducerSeq { producer, seq: 1 }),
                    target: Target::All,
                    frame: Command::custom(1, 1, body(producer)).into_frame(),
                };
                // An error means the fate is unknown (not acknowledged): nothing to check.
                if let Ok(ack) = client.append_proposal(proposal).await {
                    acked.lock().unwrap().push((producer, ack.offset));
                }
            }
        }));
    }

    let progress = |acked: &Arc<Mutex<Vec<(u64, u64)>>>| acked.lock().unwrap().len();
    let status_client = ControlClient::connect(&client_addrs).await.unwrap();
    for round in 0..KILL_ROUNDS {
        let target = progress(&acked) + APPENDS_MIN / KILL_ROUNDS;
        let progressed = poll_until("the writers' progress", WAIT, POLL_INTERVAL, || {
            let done = progress(&acked);
            std::future::ready(if done >= target {
                Ok(())
            } else {
                Err(format!("{done} of {target} appends"))
            })
        })
        .await;
        if let Err(stalled) = progressed {
            let tails: Vec<String> = (0..3)
                .map(|i| format!("replica {}:\n{}", i + 1, cluster.log_tail(i, 15)))
                .collect();
            panic!(
                "writers stalled in round {round}: {stalled}\n{}",
                tails.join("\n")
            );
        }
        let victim = if round % 2 == 0 {
            status_client.leader_status().await.unwrap().id as usize - 1
        } else {
            round % 3
        };
        cluster.restart(victim).unwrap(); // SIGKILL, then start on the same directory
    }
    stop.store(true, Ordering::Relaxed);
    for writer in writers {
        writer.await.unwrap();
    }

    let acked = acked.lock().unwrap().clone();
    assert!(
        acked.len() >= APPENDS_MIN,
        "only {} appends acknowledged",
        acked.len()
    );
    let last = acked.iter().map(|(_, offset)| *offset).max().unwrap();
    // Every replica applies at least everything acknowledged.
    for (i, addr) in client_addrs.iter().enumerate() {
        let client = ControlClient::connect(std::slice::from_ref(addr))
            .await
            .unwrap();
        let what = format!("replica {} to catch up", i + 1);
        poll_until(&what, WAIT, POLL_INTERVAL, || async {
            match client.status().await.unwrap().applied_offset {
                applied if applied >= last => Ok(()),
                applied => Err(format!("applied {applied} of {last}")),
            }
        })
        .await
        .unwrap();
    }
    let logs = futures::future::join_all(client_addrs.iter().map(|addr| read_retained(addr))).await;
    // Replicas purge at different points, so compare where their retained ranges overlap. A
    // replica may also lack a trailing unacknowledged append: only content may not differ.
    let maps: Vec<BTreeMap<u64, &LogEntry>> = logs
        .iter()
        .map(|log| log.iter().map(|e| (e.offset, e)).collect())
        .collect();
    for (i, map) in maps.iter().enumerate().skip(1) {
        for (offset, entry) in map {
            if let Some(other) = maps[0].get(offset) {
                assert!(
                    entry == other,
                    "replica {} diverges from replica 1 at offset {offset}",
                    i + 1
                );
            }
        }
    }
    let longest = logs
        .iter()
        .max_by_key(|l| l.last().map(|e| e.offset))
        .unwrap();
    // The first retained offset may be above 1 after purges; everything retained is contiguous.
    for pair in longest.windows(2) {
        assert_eq!(pair[1].offset, pair[0].offset + 1, "gap in the log");
    }
    let by_offset: BTreeMap<u64, &LogEntry> = longest.iter().map(|e| (e.offset, e)).collect();
    let first_retained = longest.first().map_or(1, |e| e.offset);
    let mut compacted = Vec::new();
    for (producer, offset) in &acked {
        if *offset < first_retained {
            compacted.push((*producer, *offset));
            continue;
        }
        let entry = by_offset
            .get(offset)
            .unwrap_or_else(|| panic!("acknowledged offset {offset} is missing"));
        assert_eq!(
            entry.producer,
            Some(ProducerSeq {
                producer: *producer,
                seq: 1
            })
        );
        assert_eq!(entry.frame.body, body(*producer), "body at offset {offset}");
    }
    // Appends behind the snapshot are checked through the replicated producer table: a retry
    // of each must be answered with the offset it was acknowledged at.
    let retry_client = Arc::new(ControlClient::connect(&client_addrs).await.unwrap());
    let retries = compacted
        .chunks(compacted.len().div_ceil(8).max(1))
        .map(|chunk| {
            let (client, chunk) = (retry_client.clone(), chunk.to_vec());
            tokio::spawn(async move {
                for (producer, offset) in chunk {
                    let proposal = Proposal {
                        producer: Some(ProducerSeq { producer, seq: 1 }),
                        target: Target::All,
                        frame: Command::custom(1, 1, body(producer)).into_frame(),
                    };
                    assert_eq!(
                        client.append_proposal(proposal).await.unwrap(),
                        AppendAck {
                            offset,
                            duplicate: true
                        },
                        "retry of compacted producer {producer}"
                    );
                }
            })
        });
    for retry in futures::future::join_all(retries).await {
        retry.unwrap();
    }
    let mut seen = HashSet::new();
    for entry in longest {
        assert!(
            seen.insert(entry.producer),
            "producer pair delivered twice at {}",
            entry.offset
        );
    }
}
