//! Both wire protocols of v0.1.0 (commit 7ad98d6) stay readable: every request and answer
//! v0.1.0 puts on the client port and the peer port, as bytes v0.1.0 itself encoded
//! (`tests/fixtures/v0.1.0/wire/`, made by `scripts/make-wire-fixtures.sh`), decodes in this
//! build, and this build encodes the decoded message to the same bytes. A change to a message
//! that an older peer or client would misread fails here; such a change needs a new protocol
//! version (ARCHITECTURE.md, "Compatibility").

use std::path::Path;

use bincode::Options;
use ctrlog::client::version::{Hello, ProtocolOffer};
use ctrlog::client::{ApiError, ControlLogRequest, ControlLogResponse, StateChunk};
use ctrlog::jobs::Rejection;
use ctrlog::raft::network::{RaftRpcRequest, RaftRpcResponse};

fn fixtures(version: &str) -> Vec<(String, Vec<u8>)> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(version)
        .join("wire");
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
        .unwrap_or_else(|e| panic!("{name}: the committed bytes no longer decode: {e}"));
    let shown = format!("{decoded:?}");
    assert!(
        shown.starts_with(&variant(method)),
        "{name} decoded as {shown}"
    );
    codec.serialize(&decoded).unwrap()
}

/// Round-trips the fixture `name` (`<port>-<request|answer>-<method>[-<case>]`) as its
/// port's message; returns `<port>-<kind>-<method>` and the bytes encoded again.
fn fixture_round_trip(name: &str, bytes: &[u8]) -> (String, Vec<u8>) {
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
    (format!("{port}-{kind}-{method}"), again)
}

/// Goal: every message of both v0.1.0 protocols decodes in this build and encodes back to
/// v0.1.0's bytes; each method of v0.1.0 has its request and at least one answer here.
#[test]
fn v0_1_0_messages_decode_and_encode_to_the_same_bytes() {
    let files = fixtures("v0.1.0");
    let mut methods = std::collections::BTreeSet::new();
    for (name, bytes) in &files {
        let (method, again) = fixture_round_trip(name, bytes);
        assert_eq!(&again, bytes, "{name}: this build encodes it differently");
        methods.insert(method);
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

/// Every request and answer protocol version 2 added to v0.1.0's (`client::version`): the
/// handshake on both ports, `state_chunk`, and the answers v0.1.0 never gave.
fn protocol_2_messages() -> Vec<(&'static str, Vec<u8>)> {
    use ControlLogRequest as Q;
    use ControlLogResponse as A;
    let encode = |value: &dyn erased::Encode| value.encoded();
    let offer = ProtocolOffer {
        min: 1,
        max: 2,
        build: "ctrlog 0.2.0".into(),
    };
    let hello = Hello {
        protocol: 2,
        server: offer.clone(),
        requests: vec!["state_chunk".into(), "hello".into()],
        vocabulary_level_max: 3,
    };
    let unsupported = ApiError::ProtocolUnsupported {
        offered_min: 3,
        offered_max: 4,
        supported_min: 1,
        supported_max: 2,
    };
    vec![
        (
            "client-request-hello",
            encode(&Q::Hello {
                offer: offer.clone(),
            }),
        ),
        (
            "client-answer-hello-ok",
            encode(&A::Hello(Ok(hello.clone()))),
        ),
        (
            "client-answer-hello-unsupported",
            encode(&A::Hello(Err(unsupported.clone()))),
        ),
        (
            "client-request-state_chunk",
            encode(&Q::StateChunk {
                offset: 41,
                chunk: 1,
            }),
        ),
        (
            "client-answer-state_chunk-ok",
            encode(&A::StateChunk(Ok(StateChunk {
                offset: 41,
                chunk: 1,
                chunks: 3,
                bytes: vec![1, 2, 3, 250],
            }))),
        ),
        (
            "client-answer-state-too-large",
            encode(&A::State(Err(ApiError::AnswerTooLarge {
                size: 70_000_000,
                limit: 67_104_768,
            }))),
        ),
        (
            "client-answer-append-producer-forgotten",
            encode(&A::Append(Err(ApiError::ProducerForgotten {
                producer: 7,
                seq: 70_000,
            }))),
        ),
        (
            "client-answer-append-container-exists",
            encode(&A::Append(Err(ApiError::Refused(
                Rejection::ContainerExists {
                    container: ctrlog::log::ContainerId::new("c1").unwrap(),
                },
            )))),
        ),
        (
            "client-answer-add_member-level-unsupported",
            encode(&A::AddMember(Err(ApiError::MemberLevelUnsupported {
                member: 4,
                supported: 2,
                recorded: 3,
            }))),
        ),
        (
            "peer-request-hello",
            encode(&RaftRpcRequest::Hello { offer }),
        ),
        (
            "peer-answer-hello-ok",
            encode(&RaftRpcResponse::Hello(Ok(hello))),
        ),
        (
            "peer-answer-hello-unsupported",
            encode(&RaftRpcResponse::Hello(Err(unsupported))),
        ),
    ]
}

/// Encoding behind a trait object, so that one list holds messages of four types.
mod erased {
    use bincode::Options;

    pub trait Encode {
        fn encoded(&self) -> Vec<u8>;
    }

    impl<T: serde::Serialize> Encode for T {
        fn encoded(&self) -> Vec<u8> {
            bincode::DefaultOptions::new().serialize(self).unwrap()
        }
    }
}

/// Goal: protocol version 2's messages keep their bytes in every later build, as v0.1.0's do:
/// each encodes to the committed fixture (`tests/fixtures/v2/wire/`), and the fixture decodes
/// as its method's message and encodes back to itself. `CTRLOG_WRITE_WIRE_FIXTURES=1` writes
/// the fixtures instead; that is for a new protocol version's messages only, never to make
/// this test pass after a change to an existing one.
#[test]
fn protocol_2_messages_keep_their_bytes() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/v2/wire");
    let messages = protocol_2_messages();
    if std::env::var_os("CTRLOG_WRITE_WIRE_FIXTURES").is_some() {
        std::fs::create_dir_all(&dir).unwrap();
        for (name, bytes) in &messages {
            std::fs::write(dir.join(format!("{name}.bin")), bytes).unwrap();
        }
    }
    let files = fixtures("v2");
    assert_eq!(
        files
            .iter()
            .map(|(name, _)| name.as_str())
            .collect::<Vec<_>>(),
        {
            let mut names: Vec<_> = messages.iter().map(|(name, _)| *name).collect();
            names.sort();
            names
        },
        "one fixture per message"
    );
    for (name, bytes) in &messages {
        let (_, committed) = files.iter().find(|(file, _)| file == name).unwrap();
        assert_eq!(
            bytes, committed,
            "{name}: this build encodes it differently"
        );
        let (_, again) = fixture_round_trip(name, committed);
        assert_eq!(&again, committed, "{name}: does not encode back to itself");
    }
}
