//! The fuzz targets' bodies: one function per decoder that reads bytes from the network or the
//! disk. Each must return (never panic, never allocate what the input merely claims), and what
//! it decodes must re-encode to something that decodes to the same bytes again.
//!
//! Shared by the cargo-fuzz targets (`fuzz/fuzz_targets/*.rs`) and by `tests/fuzz_corpus.rs`,
//! which runs every target over its seed corpus and mutations of it on stable Rust.

use std::pin::Pin;

use bytes::BytesMut;
use ctrlog::client::{ControlLogRequest, ControlLogResponse};
use ctrlog::log::vocabulary::Vocabulary;
use ctrlog::log::{decode, encode, Command, Frame, LogEntry};
use ctrlog::raft::network::{RaftRpcRequest, RaftRpcResponse};
use ctrlog::raft::state_machine::{MachineState, SNAPSHOT_BYTES_MAX};
use ctrlog::raft::storage::wal::{Wal, RECORD_BYTES_MAX};
use ctrlog::raft::types::Entry;
use serde::de::DeserializeOwned;
use serde::Serialize;
use tokio_serde::formats::Bincode;
use tokio_serde::{Deserializer, Serializer};

/// A target's body: must return for every input.
pub type Target = fn(&[u8]);

/// Every target, by name (the corpus directory and the cargo-fuzz target share it).
pub const TARGETS: &[(&str, Target)] = &[
    ("frame", frame),
    ("log_entry", log_entry),
    ("raft_entry", raft_entry),
    ("client_rpc", client_rpc),
    ("peer_rpc", peer_rpc),
    ("snapshot", snapshot),
    ("wal_segment", wal_segment),
];

/// The limit a replica applies to a command frame from a client.
const FRAME_LIMIT: u64 = 1 << 20;

/// Decodes with the log's codec; if that works, the value must survive a round trip.
fn round_trips<T: Serialize + DeserializeOwned>(data: &[u8], limit: u64) -> Option<T> {
    let value: T = decode(data, limit).ok()?;
    let bytes = encode(&value);
    let again: T = decode(&bytes, limit.max(bytes.len() as u64)).expect("re-encoded value decodes");
    assert_eq!(encode(&again), bytes, "round trip is stable");
    Some(value)
}

/// A command frame as a client appends it, then its body through the vocabulary.
pub fn frame(data: &[u8]) {
    let Some(frame) = round_trips::<Frame>(data, FRAME_LIMIT) else {
        return;
    };
    let command = Command::from_frame(frame.clone());
    if let Ok(builtin) = Vocabulary::CURRENT.decode_builtin(&frame) {
        assert_eq!(Command::from_frame(builtin.clone().into_frame()), builtin);
    }
    let _ = command.target();
}

/// A log entry as a subscriber receives it.
pub fn log_entry(data: &[u8]) {
    if let Some(entry) = round_trips::<LogEntry>(data, FRAME_LIMIT) {
        let _ = entry.command();
    }
}

/// A Raft entry as the WAL stores it and AppendEntries carries it.
pub fn raft_entry(data: &[u8]) {
    round_trips::<Entry>(data, RECORD_BYTES_MAX as u64);
}

/// Decodes `data` the way tarpc's transport does (tokio-serde's bincode format), and checks
/// a decoded message re-encodes to bytes that decode again.
///
/// tarpc's own decoder panics on some inputs (a request deadline that overflows the clock).
/// A replica serves every connection on its own task, so such a panic closes that connection
/// and nothing else (`tests/client.rs` holds both ports to that); here it is contained the same
/// way, and only the round trip of what did decode must hold.
fn transport_round_trips<T: Serialize + DeserializeOwned + Unpin>(data: &[u8]) {
    let mut codec = Bincode::<T, T>::default();
    let bytes = BytesMut::from(data);
    let hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(|_| {}));
    let decoded = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        Pin::new(&mut codec).deserialize(&bytes)
    }));
    std::panic::set_hook(hook);
    let Ok(Ok(value)) = decoded else {
        return;
    };
    let bytes = Pin::new(&mut codec)
        .serialize(&value)
        .expect("a decoded message encodes");
    Pin::new(&mut codec)
        .deserialize(&BytesMut::from(&bytes[..]))
        .expect("a re-encoded message decodes");
}

/// What a replica's client port reads, and what a client reads back.
pub fn client_rpc(data: &[u8]) {
    transport_round_trips::<tarpc::ClientMessage<ControlLogRequest>>(data);
    transport_round_trips::<tarpc::Response<ControlLogResponse>>(data);
}

/// What a replica's peer port reads, and what the calling peer reads back.
pub fn peer_rpc(data: &[u8]) {
    transport_round_trips::<tarpc::ClientMessage<RaftRpcRequest>>(data);
    transport_round_trips::<tarpc::Response<RaftRpcResponse>>(data);
}

/// A snapshot as a replica loads it from sled or receives it from the leader.
pub fn snapshot(data: &[u8]) {
    round_trips::<MachineState>(data, SNAPSHOT_BYTES_MAX);
}

/// A WAL segment as recovery reads it. The first byte picks the mode: raw file bytes, or
/// well-framed records (correct lengths and checksums) around fuzzed payloads, cut short at a
/// fuzzed length, so that the payloads reach the entry decoder through the disk path.
pub fn wal_segment(data: &[u8]) {
    let Some((mode, rest)) = data.split_first() else {
        return;
    };
    let file = if mode % 2 == 0 {
        rest.to_vec()
    } else {
        let mut file = Vec::new();
        for payload in rest.split(|b| *b == 0xff) {
            file.extend_from_slice(&(payload.len() as u32).to_le_bytes());
            file.extend_from_slice(&crc32fast::hash(payload).to_le_bytes());
            file.extend_from_slice(payload);
        }
        let keep = file.len() - (*mode as usize % 7).min(file.len());
        file.truncate(keep);
        file
    };
    let dir = tempfile::tempdir().expect("a temporary directory");
    std::fs::write(dir.path().join(format!("{:020}.wal", 1)), &file).expect("writing a segment");
    let Ok(wal) = Wal::open(dir.path(), None, 64 << 20) else {
        return;
    };
    for index in wal.first_index()..wal.next_index() {
        let payload = wal
            .read(index)
            .expect("a recovered record reads")
            .expect("a recovered index is present");
        raft_entry(&payload);
    }
}
