//! The gRPC port (`proto/ctrlog/v1`) on real replicas and real sockets, called with the client
//! that tonic generates from the `.proto`, as a container in another language would call it:
//! join, subscribe, answer, heartbeat, leave; the standard health service; and every refusal
//! the tarpc port gives, as a gRPC status with ctrlog's typed detail.

mod common;

use std::collections::BTreeMap;
use std::time::Duration;

use common::WAIT;
use ctrlog::client::ControlClient;
use ctrlog::log::{Command, SchemaChange};
use ctrlog::server::AuthConfig;
use ctrlog::tools::LocalCluster;
use ctrlog::wire::grpc::{detail_of, pb};
use pb::control_log_client::ControlLogClient;
use pb::error::Error as Detail;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint};

const C1_TOKEN: &str = "container-c1-token-0123456";
const ADMIN_TOKEN: &str = "admin-token-0123456789abc";

async fn channel(addr: std::net::SocketAddr) -> Channel {
    Endpoint::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect()
        .await
        .unwrap()
}

/// The typed detail of a refused call, with its gRPC code.
fn refused<T: std::fmt::Debug>(result: Result<T, tonic::Status>) -> (tonic::Code, Detail) {
    let status = result.expect_err("refused");
    let detail = detail_of(&status)
        .and_then(|e| e.error)
        .unwrap_or_else(|| panic!("no ctrlog.v1.Error in {status:?}"));
    (status.code(), detail)
}

fn with_token<T>(message: T, token: &str) -> tonic::Request<T> {
    let mut request = tonic::Request::new(message);
    let value = format!("Bearer {token}").parse().unwrap();
    request.metadata_mut().insert("authorization", value);
    request
}

async fn plain_cluster(dir: &std::path::Path) -> LocalCluster {
    let cluster = LocalCluster::start(dir, 3, |c| {
        c.grpc.addr = Some("127.0.0.1:0".parse().unwrap());
    })
    .await
    .unwrap();
    cluster.wait_for_leader(WAIT).await.unwrap();
    // Offset 1, the founding raise: the tests count what is appended after it.
    cluster.wait_for_applied(1, WAIT).await.unwrap();
    cluster
}

fn join_request(container: &str) -> pb::JoinRequest {
    pb::JoinRequest {
        container: container.into(),
        location: "a test".into(),
        producer: Some(pb::ProducerSeq {
            producer: 7,
            seq: 1,
        }),
    }
}

/// Goal: a container that speaks only gRPC joins, hears a schema broadcast on its
/// subscription (typed, and as the frame the log records), acks it, heartbeats and leaves;
/// a follower refuses its join `NotLeader`, naming the leader; health says SERVING.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grpc_container_joins_hears_answers_and_leaves() {
    let dir = tempfile::tempdir().unwrap();
    let cluster = plain_cluster(dir.path()).await;
    let leader = cluster.wait_for_leader(WAIT).await.unwrap();
    let follower = cluster.follower_of(leader);

    // A follower names the leader, and, once the members told each other over the peer
    // port, the leader's gRPC port.
    let leader_grpc = cluster.replica(leader).grpc_addr().unwrap().to_string();
    let at_follower =
        ControlLogClient::new(channel(cluster.replica(follower).grpc_addr().unwrap()).await);
    let poll = Duration::from_millis(50);
    ctrlog::tools::poll_until(
        "a NotLeader naming the leader's gRPC port",
        WAIT,
        poll,
        || {
            let mut at_follower = at_follower.clone();
            let (leader_grpc, leader_client) =
                (leader_grpc.clone(), cluster.replica(leader).client_addr());
            async move {
                let (code, detail) = refused(at_follower.join(join_request("g1")).await);
                assert_eq!(code, tonic::Code::Unavailable);
                let Detail::NotLeader(not_leader) = detail else {
                    panic!("{detail:?}")
                };
                assert_eq!(not_leader.leader_id, Some(leader));
                assert_eq!(
                    not_leader.leader_client_addr,
                    Some(leader_client.to_string())
                );
                match not_leader.leader_grpc_addr {
                    Some(addr) if addr == leader_grpc => Ok(()),
                    other => Err(format!("{other:?}")),
                }
            }
        },
    )
    .await
    .unwrap();
    let mut at_follower = at_follower;
    let status = at_follower
        .status(pb::StatusRequest {})
        .await
        .unwrap()
        .into_inner();
    for member in &status.members {
        let grpc = cluster.replica(member.id).grpc_addr().unwrap().to_string();
        assert_eq!(
            member.grpc_addr.as_deref(),
            Some(grpc.as_str()),
            "{member:?}"
        );
    }

    let leader_channel = channel(cluster.replica(leader).grpc_addr().unwrap()).await;
    let mut health = tonic_health::pb::health_client::HealthClient::new(leader_channel.clone());
    let serving = tonic_health::pb::health_check_response::ServingStatus::Serving as i32;
    ctrlog::tools::poll_until(
        "the health service to say SERVING",
        WAIT,
        Duration::from_millis(50),
        || {
            let mut health = health.clone();
            async move {
                let request = tonic_health::pb::HealthCheckRequest {
                    service: "ctrlog.v1.ControlLog".into(),
                };
                match health.check(request).await {
                    Ok(answer) if answer.get_ref().status == serving => Ok(()),
                    other => Err(format!("{other:?}")),
                }
            }
        },
    )
    .await
    .unwrap();
    drop(
        health
            .check(tonic_health::pb::HealthCheckRequest::default())
            .await
            .unwrap(),
    );

    let mut client = ControlLogClient::new(leader_channel);
    let joined = client.join(join_request("g1")).await.unwrap().into_inner();
    let again = client.join(join_request("g1")).await.unwrap().into_inner();
    assert_eq!(again.epoch, joined.epoch, "a retried join keeps its epoch");
    assert!(again.duplicate);
    let epoch = joined.epoch;

    let mut commands = client
        .subscribe(pb::SubscribeRequest {
            from: epoch + 1,
            container: "g1".into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    let producer = ControlClient::connect(&cluster.client_addrs())
        .await
        .unwrap();
    let broadcast = producer
        .append(Command::SchemaChange(SchemaChange {
            subject: "clicks".into(),
            schema: b"v2".to_vec(),
        }))
        .await
        .unwrap()
        .offset;

    let entry = loop {
        let reply = tokio::time::timeout(WAIT, commands.message())
            .await
            .expect("an entry in time")
            .unwrap()
            .expect("the stream goes on");
        if let Some(entry) = reply.entries.into_iter().find(|e| e.offset == broadcast) {
            break entry;
        }
    };
    let Some(pb::command::Command::SchemaChange(change)) = entry.command.and_then(|c| c.command)
    else {
        panic!("the broadcast arrives typed")
    };
    assert_eq!(
        (change.subject.as_str(), &change.schema[..]),
        ("clicks", &b"v2"[..])
    );
    let frame = entry.frame.unwrap();
    let recorded = Command::SchemaChange(SchemaChange {
        subject: "clicks".into(),
        schema: b"v2".to_vec(),
    })
    .into_frame();
    assert_eq!((frame.kind, frame.body), (recorded.kind, recorded.body));

    let ack = pb::Command {
        command: Some(pb::command::Command::Ack(pb::Ack {
            container: "g1".into(),
            epoch,
            offset: broadcast,
        })),
    };
    client
        .append(pb::AppendRequest {
            command: Some(pb::append_request::Command::Typed(ack)),
            ..Default::default()
        })
        .await
        .unwrap();
    let beat = pb::HeartbeatRequest {
        container: "g1".into(),
        epoch,
        lag: [("partition-0".to_string(), 5)].into(),
    };
    client.heartbeat(beat.clone()).await.unwrap();

    let (code, detail) = refused(
        client
            .heartbeat(pb::HeartbeatRequest {
                epoch: epoch - 1,
                ..beat.clone()
            })
            .await,
    );
    assert_eq!(code, tonic::Code::FailedPrecondition);
    assert!(
        matches!(detail, Detail::Fenced(ref f) if f.current_epoch == Some(epoch)),
        "{detail:?}"
    );

    let left = client
        .leave(pb::LeaveRequest {
            container: "g1".into(),
            epoch,
            producer: None,
        })
        .await
        .unwrap()
        .into_inner();
    let mut parts = client
        .state(pb::StateRequest {
            min_offset: left.offset,
            max_wait_ms: 5_000,
            consistent: true,
        })
        .await
        .unwrap()
        .into_inner();
    let first = parts.message().await.unwrap().unwrap();
    assert!(first.offset >= left.offset);
    let mut containers = first.containers.clone();
    let mut last = first.last;
    while !last {
        let part = parts.message().await.unwrap().unwrap();
        containers.extend(part.containers);
        last = part.last;
    }
    let g1 = containers.iter().find(|c| c.container == "g1").unwrap();
    assert_eq!(g1.status, pb::ContainerStatus::Deregistered as i32);
    let at = (cluster.replica(leader).state(left.offset, WAIT).await).unwrap();
    assert!(
        !at.state.pending().contains_key(&broadcast),
        "the ack settled the broadcast"
    );
    cluster.shutdown().await;
}

/// Goal: a malformed or oversized request is refused `InvalidArgument`, naming the limit,
/// a subscription below the retained log `OutOfRange` with `Compacted`; nothing is appended.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_requests_get_typed_refusals_and_append_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let cluster = LocalCluster::start(dir.path(), 3, |c| {
        c.grpc.addr = Some("127.0.0.1:0".parse().unwrap());
        c.raft.snapshot_logs_to_keep = 5;
    })
    .await
    .unwrap();
    cluster.wait_for_leader(WAIT).await.unwrap();
    cluster.wait_for_applied(1, WAIT).await.unwrap();
    let leader = cluster.wait_for_leader(WAIT).await.unwrap();
    let mut client =
        ControlLogClient::new(channel(cluster.replica(leader).grpc_addr().unwrap()).await);
    let before = cluster.replica(leader).applied_offset();

    let limit = cluster.config(leader).client_port.command_bytes_max as u64;
    let oversized = pb::AppendRequest {
        command: Some(pb::append_request::Command::Frame(pb::Frame {
            kind: ctrlog::log::CUSTOM_KIND_MIN,
            version: 1,
            body: vec![0; limit as usize + 1],
        })),
        ..Default::default()
    };
    let (code, detail) = refused(client.append(oversized).await);
    assert_eq!(code, tonic::Code::InvalidArgument);
    assert_eq!(
        detail,
        Detail::TooLarge(pb::TooLarge {
            size: limit + 1,
            limit
        })
    );

    let (code, detail) = refused(client.join(join_request("not a name!")).await);
    assert_eq!(code, tonic::Code::InvalidArgument);
    assert!(matches!(detail, Detail::Invalid(_)), "{detail:?}");
    let version = pb::AppendRequest {
        command: Some(pb::append_request::Command::Frame(pb::Frame {
            kind: ctrlog::log::CUSTOM_KIND_MIN,
            version: 70_000,
            body: Vec::new(),
        })),
        ..Default::default()
    };
    let (code, _) = refused(client.append(version).await);
    assert_eq!(code, tonic::Code::InvalidArgument);
    let (code, _) = refused(client.append(pb::AppendRequest::default()).await);
    assert_eq!(code, tonic::Code::InvalidArgument);

    let many = pb::AppendManyRequest {
        appends: vec![pb::AppendRequest::default(); 4_097],
    };
    let (code, _) = refused(client.append_many(many).await);
    assert_eq!(code, tonic::Code::InvalidArgument);

    // Through the port's message limit: refused by HTTP/2's framing, the connection kept.
    let frame_limit = cluster.config(leader).client_port.frame_bytes_max;
    let huge = pb::AppendRequest {
        command: Some(pb::append_request::Command::Frame(pb::Frame {
            kind: ctrlog::log::CUSTOM_KIND_MIN,
            version: 1,
            body: vec![0; frame_limit + 1],
        })),
        ..Default::default()
    };
    let status = client.append(huge).await.expect_err("refused");
    assert_eq!(status.code(), tonic::Code::OutOfRange, "{status:?}");
    assert_eq!(
        cluster.replica(leader).applied_offset(),
        before,
        "nothing was appended"
    );

    // Below the retained log: commands enough to purge past offset 1 (the cluster keeps 5
    // entries behind its snapshot), then a snapshot.
    let producer = ControlClient::connect(&cluster.client_addrs())
        .await
        .unwrap();
    for i in 0..20u8 {
        producer
            .append(Command::custom(1, 1, vec![i]))
            .await
            .unwrap();
    }
    let snapshot = cluster.replica(leader).snapshot().await.unwrap();
    let poll = Duration::from_millis(50);
    ctrlog::tools::poll_until("the log purged past offset 1", WAIT, poll, || {
        let first = cluster.replica(leader).status().first_offset;
        std::future::ready(if first > 1 {
            Ok(())
        } else {
            Err(format!("first offset {first}"))
        })
    })
    .await
    .unwrap();
    let (code, detail) = refused(
        client
            .subscribe(pb::SubscribeRequest {
                from: 1,
                ..Default::default()
            })
            .await,
    );
    assert_eq!(code, tonic::Code::OutOfRange);
    assert!(
        matches!(detail, Detail::Compacted(ref c) if c.snapshot_offset == snapshot),
        "{detail:?}"
    );
    cluster.shutdown().await;
}

struct Secure {
    pki: tempfile::TempDir,
    cluster: LocalCluster,
    _data: tempfile::TempDir,
}

async fn secure_cluster() -> Secure {
    let pki = tempfile::tempdir().unwrap();
    ctrlog::tools::certs::generate(
        pki.path(),
        &[1, 2, 3],
        &["127.0.0.1".into()],
        &[],
        30,
        false,
    )
    .unwrap();
    let tokens = pki.path().join("tokens");
    std::fs::write(
        &tokens,
        format!("{ADMIN_TOKEN} admin\n{C1_TOKEN} container:c1\n"),
    )
    .unwrap();
    std::fs::set_permissions(&tokens, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
    let data = tempfile::tempdir().unwrap();
    let dir = pki.path().to_path_buf();
    let cluster = LocalCluster::start(data.path(), 3, move |c| {
        c.tls = Some(ctrlog::tools::certs::replica_files(&dir, c.id));
        c.grpc.addr = Some("127.0.0.1:0".parse().unwrap());
        c.auth = Some(AuthConfig {
            tokens_file: Some(tokens.clone()),
            certificates: BTreeMap::new(),
        });
    })
    .await
    .unwrap();
    cluster.wait_for_leader(WAIT).await.unwrap();
    cluster.wait_for_applied(1, WAIT).await.unwrap();
    Secure {
        pki,
        cluster,
        _data: data,
    }
}

impl Secure {
    async fn tls_channel(&self, id: u64, ca: &std::path::Path) -> Result<Channel, String> {
        let addr = self.cluster.replica(id).grpc_addr().unwrap();
        let ca = std::fs::read(ca).unwrap();
        let tls = ClientTlsConfig::new()
            .ca_certificate(Certificate::from_pem(ca))
            .domain_name(format!("node-{id}"));
        Endpoint::from_shared(format!("https://{addr}"))
            .unwrap()
            .tls_config(tls)
            .unwrap()
            .connect()
            .await
            .map_err(|e| format!("{e:?}"))
    }
}

/// Goal: over TLS, with tokens: no token, a wrong token, and a container acting for another
/// are refused `Unauthenticated` / `PermissionDenied` with their typed detail; a client that
/// trusts another CA cannot connect; three wrong tokens close the connection; nothing is
/// appended by any of them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wrong_credentials_and_roles_are_refused_as_over_tarpc() {
    let secure = secure_cluster().await;
    let leader = secure.cluster.wait_for_leader(WAIT).await.unwrap();
    let ca = ctrlog::tools::certs::ca_file(secure.pki.path());
    let before = secure.cluster.replica(leader).applied_offset();

    let other = tempfile::tempdir().unwrap();
    ctrlog::tools::certs::generate(other.path(), &[1], &["127.0.0.1".into()], &[], 30, false)
        .unwrap();
    let error = secure
        .tls_channel(leader, &ctrlog::tools::certs::ca_file(other.path()))
        .await
        .expect_err("another CA's client does not connect");
    assert!(error.to_lowercase().contains("certificate"), "{error}");

    let mut client = ControlLogClient::new(secure.tls_channel(leader, &ca).await.unwrap());
    let (code, detail) = refused(client.join(join_request("c1")).await);
    assert_eq!(code, tonic::Code::Unauthenticated);
    assert!(matches!(detail, Detail::Unauthenticated(_)), "{detail:?}");

    let mut client = ControlLogClient::new(secure.tls_channel(leader, &ca).await.unwrap());
    let joined = client
        .join(with_token(join_request("c1"), C1_TOKEN))
        .await
        .unwrap()
        .into_inner();
    let (code, detail) = refused(client.join(with_token(join_request("c2"), C1_TOKEN)).await);
    assert_eq!(code, tonic::Code::PermissionDenied);
    assert!(
        matches!(detail, Detail::Forbidden(ref f) if f.action.contains("c2")),
        "{detail:?}"
    );
    let ack_for_c2 = pb::Command {
        command: Some(pb::command::Command::TaskStarted(pb::TaskStarted {
            task: "partition-0".into(),
            container: "c2".into(),
            epoch: joined.epoch,
        })),
    };
    let forged = pb::AppendRequest {
        command: Some(pb::append_request::Command::Typed(ack_for_c2)),
        ..Default::default()
    };
    let (code, _) = refused(client.append(with_token(forged, C1_TOKEN)).await);
    assert_eq!(code, tonic::Code::PermissionDenied);
    let (code, _) = refused(
        client
            .subscribe(with_token(pb::SubscribeRequest::default(), C1_TOKEN))
            .await,
    );
    assert_eq!(
        code,
        tonic::Code::PermissionDenied,
        "a container reads only its own commands"
    );
    let mut operator =
        pb::operator_client::OperatorClient::new(secure.tls_channel(leader, &ca).await.unwrap());
    let (code, _) = refused(
        operator
            .snapshot(with_token(pb::SnapshotRequest {}, C1_TOKEN))
            .await,
    );
    assert_eq!(code, tonic::Code::PermissionDenied);
    operator
        .storage_status(with_token(pb::StorageStatusRequest {}, ADMIN_TOKEN))
        .await
        .unwrap();
    assert_eq!(
        secure.cluster.replica(leader).applied_offset(),
        joined.epoch,
        "only c1's own join was appended"
    );
    assert!(joined.epoch > before);

    let mut guesser = ControlLogClient::new(secure.tls_channel(leader, &ca).await.unwrap());
    for guess in 0..ctrlog::server::ports::calls::AUTHENTICATE_FAILURES_MAX {
        let token = format!("wrong-token-{guess:020}");
        let (code, _) = refused(
            guesser
                .status(with_token(pb::StatusRequest {}, &token))
                .await,
        );
        assert_eq!(code, tonic::Code::Unauthenticated);
    }
    let closed = guesser
        .status(with_token(pb::StatusRequest {}, ADMIN_TOKEN))
        .await
        .expect_err("the connection is closed after three wrong tokens");
    assert!(
        matches!(
            closed.code(),
            tonic::Code::Unavailable | tonic::Code::Unauthenticated | tonic::Code::Unknown
        ),
        "{closed:?}"
    );
    secure.cluster.shutdown().await;
}
