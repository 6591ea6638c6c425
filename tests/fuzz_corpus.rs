//! The fuzz targets on stable Rust: every target (`fuzz/targets.rs`) over its seed corpus in
//! `fuzz/corpus/<target>/` and over deterministic mutations of each seed (bit flips, byte
//! overwrites, truncations, splices, length-prefix blow-ups). cargo-fuzz explores further; see
//! RELIABILITY.md for the command.
//!
//! `CTRLOG_WRITE_CORPUS=1 cargo test --test fuzz_corpus` regenerates the seeds from real
//! encodings (every vocabulary example, RPC messages, a snapshot, a WAL segment).

#[path = "../fuzz/targets.rs"]
mod targets;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use ctrlog::client::{ControlLogRequest, ControlLogResponse, FetchRequest, Member};
use ctrlog::log::vocabulary::examples;
use ctrlog::log::{encode, Batch, Filter, LogEntry, ProducerSeq, Proposal};
use ctrlog::raft::network::{RaftRpcRequest, RaftRpcResponse};
use ctrlog::raft::state_machine::MachineState;
use ctrlog::raft::storage::wal::Wal;
use ctrlog::raft::types::{AppendEntriesRequest, Entry, LogId, Vote, VoteRequest};
use openraft::{CommittedLeaderId, EntryPayload, Membership};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde::Serialize;
use std::pin::Pin;
use tokio_serde::Serializer;

/// Mutations per seed file.
const MUTATIONS: usize = 300;

fn corpus_dir(target: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("fuzz/corpus")
        .join(target)
}

fn mutate(seed: &[u8], rng: &mut StdRng) -> Vec<u8> {
    let mut bytes = seed.to_vec();
    for _ in 0..rng.gen_range(1..=4) {
        let len = bytes.len();
        match rng.gen_range(0..5) {
            0 if len > 0 => bytes[rng.gen_range(0..len)] ^= 1 << rng.gen_range(0..8),
            1 if len > 0 => bytes[rng.gen_range(0..len)] = rng.gen(),
            2 => bytes.truncate(rng.gen_range(0..=len)),
            3 if len > 0 => {
                // A huge varint or fixed-width length where one was.
                let at = rng.gen_range(0..len);
                let blow_up = [0xfd, 0xff, 0xff, 0xff, 0x7f];
                bytes.splice(at..(at + 1).min(len), blow_up);
            }
            _ => {
                let at = rng.gen_range(0..=len);
                let extra: Vec<u8> = (0..rng.gen_range(1..16)).map(|_| rng.gen()).collect();
                bytes.splice(at..at, extra);
            }
        }
    }
    bytes
}

#[test]
fn every_target_survives_its_corpus_and_mutations() {
    if std::env::var_os("CTRLOG_WRITE_CORPUS").is_some() {
        write_corpus();
    }
    for (name, target) in targets::TARGETS {
        let dir = corpus_dir(name);
        let mut seeds: Vec<PathBuf> = std::fs::read_dir(&dir)
            .unwrap_or_else(|e| panic!("corpus {}: {e}", dir.display()))
            .map(|e| e.expect("a corpus entry").path())
            // The committed seeds; what cargo-fuzz adds locally is not part of this test.
            .filter(|p| {
                p.file_name()
                    .is_some_and(|n| n.to_string_lossy().starts_with("seed-"))
            })
            .collect();
        seeds.sort();
        assert!(!seeds.is_empty(), "target {name} has no seeds");
        let mut rng = StdRng::seed_from_u64(0x5eed);
        for seed in &seeds {
            let bytes = std::fs::read(seed).expect("reading a seed");
            target(&bytes);
            for _ in 0..MUTATIONS {
                target(&mutate(&bytes, &mut rng));
            }
        }
        println!(
            "{name}: {} seeds, {} inputs",
            seeds.len(),
            seeds.len() * (MUTATIONS + 1)
        );
    }
}

// ---- the seed corpus, from real encodings ------------------------------------------------------

fn write(target: &str, name: &str, bytes: &[u8]) {
    let dir = corpus_dir(target);
    std::fs::create_dir_all(&dir).expect("creating a corpus directory");
    std::fs::write(dir.join(format!("seed-{name}")), bytes).expect("writing a seed");
}

fn transport<T: Serialize + serde::de::DeserializeOwned + Unpin>(message: &T) -> Vec<u8> {
    let mut codec = tokio_serde::formats::Bincode::<T, T>::default();
    Pin::new(&mut codec)
        .serialize(message)
        .expect("encodes")
        .to_vec()
}

fn request<T>(message: T) -> tarpc::ClientMessage<T> {
    tarpc::ClientMessage::Request(tarpc::Request {
        context: tarpc::context::current(),
        id: 7,
        message,
    })
}

fn sample_entries() -> Vec<Entry> {
    let leader = CommittedLeaderId::new(3, 1);
    let members = BTreeMap::from([(
        1,
        Member {
            peer_addr: "10.0.0.1:7001".into(),
            client_addr: "10.0.0.1:7000".into(),
        },
    )]);
    let batch = Batch {
        appended_at_ms: 1_764_500_000_000,
        proposals: examples()
            .into_iter()
            .enumerate()
            .map(|(i, command)| Proposal {
                producer: Some(ProducerSeq {
                    producer: 42,
                    seq: i as u64 + 1,
                }),
                target: command.default_target(),
                frame: command.into_frame(),
            })
            .collect(),
    };
    vec![
        Entry {
            log_id: LogId::new(leader, 1),
            payload: EntryPayload::Membership(Membership::new(vec![[1].into()], members)),
        },
        Entry {
            log_id: LogId::new(leader, 2),
            payload: EntryPayload::Blank,
        },
        Entry {
            log_id: LogId::new(leader, 3),
            payload: EntryPayload::Normal(std::sync::Arc::new(batch)),
        },
    ]
}

fn write_corpus() {
    let entries = sample_entries();
    let mut machine = MachineState::default();
    for entry in &entries {
        machine
            .apply(entry)
            .expect("the samples set only levels this build knows");
    }
    let EntryPayload::Normal(batch) = &entries[2].payload else {
        unreachable!("the third sample entry is a batch")
    };
    for (i, proposal) in batch.proposals.iter().enumerate() {
        write(
            "frame",
            &format!("command-{i:02}"),
            &encode(&proposal.frame),
        );
        let entry = LogEntry {
            offset: i as u64 + 1,
            term: 3,
            appended_at_ms: batch.appended_at_ms,
            producer: proposal.producer,
            target: proposal.target.clone(),
            frame: proposal.frame.clone(),
        };
        write("log_entry", &format!("entry-{i:02}"), &encode(&entry));
    }
    for (i, entry) in entries.iter().enumerate() {
        write("raft_entry", &format!("entry-{i}"), &encode(entry));
    }
    write("snapshot", "machine-state", &encode(&machine));
    write("snapshot", "empty", &encode(&MachineState::default()));

    let append = ControlLogRequest::Append {
        proposal: batch.proposals[0].clone(),
    };
    let fetch = ControlLogRequest::Fetch {
        request: FetchRequest {
            from: 1,
            entries_max: 64,
            bytes_max: 1 << 20,
            max_wait_ms: 1000,
            linger_ms: 5,
            filter: Filter::Everything,
        },
    };
    let append_many = ControlLogRequest::AppendMany {
        proposals: batch.proposals.clone(),
    };
    write("client_rpc", "append", &transport(&request(append)));
    write(
        "client_rpc",
        "append-many",
        &transport(&request(append_many)),
    );
    write("client_rpc", "fetch", &transport(&request(fetch)));
    write(
        "client_rpc",
        "status",
        &transport(&request(ControlLogRequest::Status {})),
    );
    let answer: tarpc::Response<ControlLogResponse> = tarpc::Response {
        request_id: 7,
        message: Ok(ControlLogResponse::Append(Ok(ctrlog::client::AppendAck {
            offset: 9,
            duplicate: false,
        }))),
    };
    write("client_rpc", "append-answer", &transport(&answer));

    let vote = RaftRpcRequest::Vote {
        request: VoteRequest::new(
            Vote::new(4, 2),
            Some(LogId::new(CommittedLeaderId::new(3, 1), 3)),
        ),
    };
    let append_entries = RaftRpcRequest::AppendEntries {
        request: AppendEntriesRequest {
            vote: Vote::new_committed(3, 1),
            prev_log_id: None,
            entries: entries.clone(),
            leader_commit: Some(LogId::new(CommittedLeaderId::new(3, 1), 2)),
        },
    };
    write("peer_rpc", "vote", &transport(&request(vote)));
    write(
        "peer_rpc",
        "append-entries",
        &transport(&request(append_entries)),
    );
    let vote_answer: tarpc::Response<RaftRpcResponse> = tarpc::Response {
        request_id: 7,
        message: Ok(RaftRpcResponse::Vote(Ok(
            ctrlog::raft::types::VoteResponse::new(Vote::new(4, 2), None, true),
        ))),
    };
    write("peer_rpc", "vote-answer", &transport(&vote_answer));

    let dir = tempfile::tempdir().expect("a temporary directory");
    let mut wal = Wal::open(dir.path(), None, 64 << 20).expect("a new wal");
    let payloads: Vec<Vec<u8>> = entries.iter().map(encode).collect();
    wal.append(1, &payloads).expect("appending");
    drop(wal);
    let mut segment = vec![0u8]; // mode 0: raw file bytes
    segment.extend(std::fs::read(dir.path().join(format!("{:020}.wal", 1))).expect("the segment"));
    write("wal_segment", "three-entries", &segment);
    write("wal_segment", "framed-payloads", &[1, 1, 2, 3, 0xff, 4, 5]);
}
