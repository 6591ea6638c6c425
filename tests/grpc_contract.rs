//! The gRPC contract's compatibility rules, checked against committed fixtures:
//!
//! * `tests/fixtures/grpc/fields-v1.txt` lists every field of package `ctrlog.v1` (message,
//!   name, number, type, label) and every enum value. A field or value of the fixture that is
//!   renumbered, retyped, renamed or taken out fails the test: fields are only added, numbers
//!   never reused. A field added to a `.proto` fails it too until the fixture lists it, so that
//!   each addition is deliberate (the failure prints the line to add).
//! * `tests/fixtures/grpc/*.bin` are golden encodings of messages a container sends and
//!   receives; each is checked both ways: the message built here encodes to the fixture's
//!   bytes, and the bytes decode to the message. A JVM or Python client decodes these bytes
//!   the same way, so they pin the wire, not just the schema.

use std::collections::BTreeSet;
use std::path::PathBuf;

use ctrlog::wire::grpc::pb;
use prost::Message;

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/grpc")
        .join(name)
}

/// One line per field and enum value of package `ctrlog.v1`, as `fields-v1.txt` lists them.
fn contract_lines() -> BTreeSet<String> {
    let set = prost_types::FileDescriptorSet::decode(pb::FILE_DESCRIPTOR_SET).unwrap();
    let mut lines = BTreeSet::new();
    fn message(prefix: &str, m: &prost_types::DescriptorProto, lines: &mut BTreeSet<String>) {
        let name = format!("{prefix}.{}", m.name());
        for f in &m.field {
            let kind = match f.type_name() {
                "" => format!("{:?}", f.r#type()),
                named => named.to_string(),
            };
            let oneof = match f.oneof_index {
                Some(i) if !f.proto3_optional() => {
                    format!(" oneof {}", m.oneof_decl[i as usize].name())
                }
                _ => String::new(),
            };
            let optional = if f.proto3_optional() { " optional" } else { "" };
            lines.insert(format!(
                "field {name}.{} = {} {:?} {kind}{optional}{oneof}",
                f.name(),
                f.number(),
                f.label()
            ));
        }
        for range in &m.reserved_range {
            lines.insert(format!(
                "reserved {name} {}..{}",
                range.start(),
                range.end()
            ));
        }
        for nested in &m.nested_type {
            message(&name, nested, lines);
        }
        for e in &m.enum_type {
            for v in &e.value {
                lines.insert(format!(
                    "enum {name}.{}.{} = {}",
                    e.name(),
                    v.name(),
                    v.number()
                ));
            }
        }
    }
    for file in set.file.iter().filter(|f| f.package() == "ctrlog.v1") {
        for m in &file.message_type {
            message(".ctrlog.v1", m, &mut lines);
        }
        for e in &file.enum_type {
            for v in &e.value {
                lines.insert(format!(
                    "enum .ctrlog.v1.{}.{} = {}",
                    e.name(),
                    v.name(),
                    v.number()
                ));
            }
        }
        for service in &file.service {
            for method in &service.method {
                lines.insert(format!(
                    "rpc .ctrlog.v1.{}.{}({}) returns ({}{})",
                    service.name(),
                    method.name(),
                    method.input_type(),
                    if method.server_streaming() {
                        "stream "
                    } else {
                        ""
                    },
                    method.output_type()
                ));
            }
        }
    }
    lines
}

/// Goal: nothing of the published contract changed but by addition, and every addition is in
/// the fixture. Seen failing with `JoinRequest.location` renumbered from 2 to 4.
#[test]
fn the_contract_only_grows() {
    let path = fixture("fields-v1.txt");
    let current = contract_lines();
    if std::env::var_os("CTRLOG_BLESS").is_some() {
        let text: String = current.iter().map(|l| format!("{l}\n")).collect();
        std::fs::write(&path, text).unwrap();
    }
    let recorded: BTreeSet<String> = std::fs::read_to_string(&path)
        .unwrap()
        .lines()
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(String::from)
        .collect();
    let broken: Vec<&String> = recorded.difference(&current).collect();
    assert!(
        broken.is_empty(),
        "the .proto changed these published fields, values or calls (renumbered, retyped, \
         renamed or removed), which breaks every client built on the old ones; add new \
         fields instead, and reserve a removed one's number and name:\n{broken:#?}"
    );
    let added: Vec<&String> = current.difference(&recorded).collect();
    assert!(
        added.is_empty(),
        "new in the .proto and not yet in {}: add these lines (CTRLOG_BLESS=1 writes them):\n{added:#?}",
        path.display()
    );
}

/// A golden message's check: given the fixture's bytes, the message's own encoding and
/// whether the bytes decode to it.
type GoldenCheck = Box<dyn Fn(&[u8]) -> (Vec<u8>, bool)>;

/// Messages a container sends and receives, each with its golden encoding's file.
fn golden() -> Vec<(&'static str, GoldenCheck)> {
    fn check<M: Message + Default + PartialEq + 'static>(message: M) -> GoldenCheck {
        Box::new(move |bytes| {
            let decoded = M::decode(bytes).map(|d| d == message).unwrap_or(false);
            (message.encode_to_vec(), decoded)
        })
    }
    let pair = Some(pb::ProducerSeq {
        producer: 0x1234_5678_9abc,
        seq: 3,
    });
    let started = pb::Command {
        command: Some(pb::command::Command::TaskStarted(pb::TaskStarted {
            task: "partition-7".into(),
            container: "c1".into(),
            epoch: 42,
        })),
    };
    vec![
        (
            "join-request.bin",
            check(pb::JoinRequest {
                container: "c1".into(),
                location: "host-a pid 7".into(),
                producer: pair,
            }),
        ),
        (
            "append-request-typed.bin",
            check(pb::AppendRequest {
                producer: pair,
                target: pb::Target::Unspecified.into(),
                target_container: String::new(),
                command: Some(pb::append_request::Command::Typed(started.clone())),
            }),
        ),
        (
            "subscribe-request.bin",
            check(pb::SubscribeRequest {
                from: 43,
                container: "c1".into(),
                entries_max: 64,
                bytes_max: 0,
            }),
        ),
        (
            "subscribe-reply.bin",
            check(pb::SubscribeReply {
                entries: vec![pb::Entry {
                    offset: 44,
                    term: 2,
                    appended_at_ms: 1_765_000_000_000,
                    producer: None,
                    target: pb::Target::Container.into(),
                    target_container: "c1".into(),
                    frame: Some(pb::Frame {
                        kind: 6,
                        version: 1,
                        body: vec![1, 2, 3],
                    }),
                    command: Some(pb::Command {
                        command: Some(pb::command::Command::AssignTask(pb::AssignTask {
                            task: "partition-7".into(),
                            container: "c1".into(),
                            epoch: 42,
                            inputs: vec![pb::Input {
                                system: "kafka".into(),
                                stream: "clicks".into(),
                                partition: 7,
                            }],
                        })),
                    }),
                }],
                next_offset: 45,
                applied_offset: 50,
            }),
        ),
        (
            "heartbeat-request.bin",
            check(pb::HeartbeatRequest {
                container: "c1".into(),
                epoch: 42,
                lag: [("partition-7".to_string(), 12_000)].into(),
            }),
        ),
        (
            "error-not-leader.bin",
            check(pb::Error {
                error: Some(pb::error::Error::NotLeader(pb::NotLeader {
                    leader_id: Some(2),
                    leader_grpc_addr: Some("10.0.0.2:7003".into()),
                    leader_client_addr: Some("10.0.0.2:7000".into()),
                })),
            }),
        ),
        (
            "error-fenced.bin",
            check(pb::Error {
                error: Some(pb::error::Error::Fenced(pb::Fenced {
                    container: "c1".into(),
                    epoch: 42,
                    current_epoch: Some(57),
                })),
            }),
        ),
    ]
}

/// Goal: each golden encoding is what the message encodes to, and decodes to the message.
/// Seen failing with `JoinRequest.location` renumbered from 2 to 4.
#[test]
fn golden_messages_encode_and_decode_both_ways() {
    let bless = std::env::var_os("CTRLOG_BLESS").is_some();
    for (name, check) in golden() {
        let path = fixture(name);
        if bless {
            std::fs::write(&path, check(&[]).0).unwrap();
        }
        let bytes = std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        let (encoded, decoded) = check(&bytes);
        assert_eq!(
            encoded, bytes,
            "{name}: the message no longer encodes to its fixture"
        );
        assert!(
            decoded,
            "{name}: the fixture no longer decodes to the message"
        );
    }
}
