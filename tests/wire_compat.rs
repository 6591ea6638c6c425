//! Both wire protocols of v0.1.0 (commit 7ad98d6) stay readable: every request and answer
//! v0.1.0 puts on the client port and the peer port, as bytes v0.1.0 itself encoded
//! (`tests/fixtures/v0.1.0/wire/`, made by `scripts/make-wire-fixtures.sh`), decodes in this
//! build, and this build encodes the decoded message to the same bytes. A change to a message
//! that an older peer or client would misread fails here; such a change needs a new protocol
//! version (ARCHITECTURE.md, "Compatibility").

use std::path::Path;

use bincode::Options;
use ctrlog::client::{ControlLogRequest, ControlLogResponse};
use ctrlog::raft::network::{RaftRpcRequest, RaftRpcResponse};

fn fixtures() -> Vec<(String, Vec<u8>)> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/v0.1.0/wire");
    let mut files: Vec<(String, Vec<u8>)> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|entry| entry.unwrap().path())
        .filter(|path| path.extension().is_some_and(|e| e == "bin"))
        .map(|path| {
            let name = path.file_stem().unwrap().to_string_lossy().into_owned();
            (name, std::fs::read(&path).unwrap())
        })
        .collect();
    files.sort();
    files
}

/// `append_many` → `AppendMany`: the variant tarpc generates for a method.
fn variant(method: &str) -> String {
    method
        .split('_')
        .map(|word| word[..1].to_uppercase() + &word[1..])
        .collect()
}

/// Decodes `bytes` as `T` the way tarpc's transport does, checks the variant is the method's,
/// and encodes it again.
fn round_trip<T>(name: &str, method: &str, bytes: &[u8]) -> Vec<u8>
where
    T: serde::Serialize + serde::de::DeserializeOwned + std::fmt::Debug,
{
    let codec = bincode::DefaultOptions::new();
    let decoded: T = codec
        .deserialize(bytes)
        .unwrap_or_else(|e| panic!("{name}: v0.1.0's bytes no longer decode: {e}"));
    let shown = format!("{decoded:?}");
    assert!(
        shown.starts_with(&variant(method)),
        "{name} decoded as {shown}"
    );
    codec.serialize(&decoded).unwrap()
}

/// Goal: every message of both v0.1.0 protocols decodes in this build and encodes back to
/// v0.1.0's bytes; each method of v0.1.0 has its request and at least one answer here.
#[test]
fn v0_1_0_messages_decode_and_encode_to_the_same_bytes() {
    let files = fixtures();
    let mut methods = std::collections::BTreeSet::new();
    for (name, bytes) in &files {
        let (port, rest) = name.split_once('-').unwrap();
        let (kind, rest) = rest.split_once('-').unwrap();
        let method = rest.split('-').next().unwrap();
        let again = match (port, kind) {
            ("client", "request") => round_trip::<ControlLogRequest>(name, method, bytes),
            ("client", "answer") => round_trip::<ControlLogResponse>(name, method, bytes),
            ("peer", "request") => round_trip::<RaftRpcRequest>(name, method, bytes),
            ("peer", "answer") => round_trip::<RaftRpcResponse>(name, method, bytes),
            _ => panic!("{name}: not a fixture name"),
        };
        assert_eq!(&again, bytes, "{name}: this build encodes it differently");
        methods.insert(format!("{port}-{kind}-{method}"));
    }
    let client = [
        "append",
        "fetch",
        "state",
        "status",
        "heartbeat",
        "add_member",
        "remove_member",
        "snapshot",
        "authenticate",
        "append_many",
    ];
    let peer = ["append_entries", "vote", "install_snapshot"];
    for (port, names) in [("client", &client[..]), ("peer", &peer[..])] {
        for method in names {
            for kind in ["request", "answer"] {
                let key = format!("{port}-{kind}-{method}");
                assert!(methods.contains(&key), "no fixture for {key}");
            }
        }
    }
}
