//! TLS on both ports of real replicas, with certificates from `ctrlog::tools::certs`: the secure path
//! works end to end, and each wrong credential is refused without disturbing anyone else.

mod common;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use common::WAIT;
use ctrlog::client::tls::{client_config, framed, server_name};
use ctrlog::client::{ClientError, ClientOptions, ControlClient, Status, SubscriptionItem};
use ctrlog::log::{Command, Filter, Target};
use ctrlog::raft::network::{PeerNetwork, RaftRpcClient};
use ctrlog::server::TlsFiles;
use ctrlog::tools::certs::{Authority, Usage};
use ctrlog::tools::cluster::ProcessCluster;
use ctrlog::tools::LocalCluster;
use futures::StreamExt;
use time::OffsetDateTime;
use tokio::io::AsyncWriteExt;

struct Pki {
    dir: tempfile::TempDir,
}

impl Pki {
    /// A CA, replicas 1–4 named `node-<id>` at 127.0.0.1 (the clusters run 1–3; node 4 is never
    /// added), a client `operator`, a client whose certificate expired yesterday, and a second
    /// CA's client (`stranger`).
    fn new() -> Pki {
        let dir = tempfile::tempdir().unwrap();
        let authority = Authority::new(30).unwrap();
        authority.write(dir.path()).unwrap();
        let now = OffsetDateTime::now_utc();
        let day = time::Duration::days(1);
        for id in 1..=4u64 {
            let name = format!("node-{id}");
            let sans = vec![name.clone(), "127.0.0.1".into()];
            authority
                .issue(
                    dir.path(),
                    &name,
                    &name,
                    sans,
                    Usage::Replica,
                    now - day,
                    now + 30 * day,
                )
                .unwrap();
        }
        for (file, from, until) in [
            ("client-operator", now - day, now + 30 * day),
            ("client-expired", now - 30 * day, now - day),
        ] {
            authority
                .issue(
                    dir.path(),
                    file,
                    file,
                    vec![file.into()],
                    Usage::Client,
                    from,
                    until,
                )
                .unwrap();
        }
        let other = Authority::new(30).unwrap();
        let elsewhere = dir.path().join("elsewhere");
        other.write(&elsewhere).unwrap();
        other
            .issue(
                &elsewhere,
                "client-stranger",
                "stranger",
                vec![],
                Usage::Client,
                now - day,
                now + day,
            )
            .unwrap();
        Pki { dir }
    }

    fn path(&self, file: &str) -> PathBuf {
        self.dir.path().join(file)
    }

    fn ca(&self) -> PathBuf {
        ctrlog::tools::certs::ca_file(self.dir.path())
    }

    fn replica_files(&self, id: u64) -> TlsFiles {
        ctrlog::tools::certs::replica_files(self.dir.path(), id)
    }

    fn identity(&self, client: &str) -> (PathBuf, PathBuf) {
        ctrlog::tools::certs::client_identity(self.dir.path(), client)
    }
}

fn options(tls: Option<Arc<rustls::ClientConfig>>) -> ClientOptions {
    let options = ClientOptions::new().retry_deadline(Duration::from_secs(2));
    match tls {
        Some(tls) => options.tls(tls),
        None => options,
    }
}

async fn start(pki: &Pki, dir: &Path) -> LocalCluster {
    let cluster = LocalCluster::start(dir, 3, |c| c.tls = Some(pki.replica_files(c.id)))
        .await
        .unwrap();
    cluster.wait_for_leader(WAIT).await.unwrap();
    cluster
}

/// A connection the replicas refused. A refusal this side's TLS can see (the replicas'
/// certificate is not the CA's) is `Tls`, at once; one that only the replica sees (TLS 1.3
/// verifies a client's certificate after the client's side of the handshake is done) looks
/// like a dropped connection and ends in `GaveUp`.
fn refused(result: Result<ControlClient, ClientError>, what: &str) {
    match result {
        Err(ClientError::GaveUp { .. } | ClientError::Tls { .. }) => {}
        Err(other) => panic!("{what}: unexpected error {other}"),
        Ok(_) => panic!("{what}: was served"),
    }
}

/// Goal: with TLS on both ports the cluster replicates, and clients append and subscribe over
/// TLS with or without a certificate of their own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cluster_replicates_and_serves_over_tls() {
    let pki = Pki::new();
    let data = tempfile::tempdir().unwrap();
    let cluster = start(&pki, data.path()).await;
    let seeds = cluster.client_addrs();

    let anonymous = client_config(&pki.ca(), None).unwrap();
    let (cert, key) = pki.identity("operator");
    let operator = client_config(&pki.ca(), Some((&cert, &key))).unwrap();
    let writer = ControlClient::connect_with(&seeds, options(Some(operator)))
        .await
        .unwrap();
    let reader = ControlClient::connect_with(&seeds, options(Some(anonymous)))
        .await
        .unwrap();
    let mut stream = reader.subscribe(1, Filter::Everything);
    let mut last = 0;
    for i in 0..20u8 {
        last = writer
            .append_to(Target::All, Command::custom(1, 1, vec![i]))
            .await
            .unwrap()
            .offset;
    }
    cluster.wait_for_applied(last, WAIT).await.unwrap();
    for expected in 1..=last {
        let item = tokio::time::timeout(WAIT, stream.next())
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        let SubscriptionItem::Entry(entry) = item else {
            panic!("unexpected {item:?}")
        };
        assert_eq!(entry.offset, expected);
    }
    cluster.shutdown().await;
}

/// Goal: every wrong credential on the client port is refused at the handshake, and the port
/// keeps serving the right ones: plain TCP, a CA the replicas do not use, a client certificate
/// from another CA, an expired client certificate, and a handshake that never completes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wrong_credentials_on_the_client_port_are_refused() {
    let pki = Pki::new();
    let data = tempfile::tempdir().unwrap();
    let cluster = start(&pki, data.path()).await;
    let seeds = cluster.client_addrs();

    // A silent connection that never starts its handshake holds up no one.
    let _silent = tokio::net::TcpStream::connect(&seeds[0]).await.unwrap();

    refused(
        ControlClient::connect_with(&seeds, options(None)).await,
        "plain TCP",
    );
    let wrong_ca = client_config(&pki.path("elsewhere/ca.pem"), None).unwrap();
    let started = std::time::Instant::now();
    let wrong_ca = ControlClient::connect_with(
        &seeds,
        ClientOptions::new().tls(wrong_ca), // the default 30 s retry deadline
    )
    .await;
    assert!(
        matches!(wrong_ca, Err(ClientError::Tls { .. })),
        "a CA the replicas do not use fails at once with a typed error: {wrong_ca:?}"
    );
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "{:?}",
        started.elapsed()
    );
    let (cert, key) = (
        pki.path("elsewhere/client-stranger.pem"),
        pki.path("elsewhere/client-stranger-key.pem"),
    );
    let stranger = client_config(&pki.ca(), Some((&cert, &key))).unwrap();
    refused(
        ControlClient::connect_with(&seeds, options(Some(stranger))).await,
        "a client certificate from another CA",
    );
    let (cert, key) = pki.identity("expired");
    let expired = client_config(&pki.ca(), Some((&cert, &key))).unwrap();
    refused(
        ControlClient::connect_with(&seeds, options(Some(expired))).await,
        "an expired client certificate",
    );

    let good = client_config(&pki.ca(), None).unwrap();
    let client = ControlClient::connect_with(&seeds, options(Some(good)))
        .await
        .unwrap();
    client
        .append_to(Target::All, Command::custom(1, 1, b"still served".to_vec()))
        .await
        .unwrap();
    cluster.shutdown().await;
}

/// Goal: the peer port accepts only replicas. A client certificate (valid, same CA) completes
/// mutual TLS, but its connection is closed before a frame is read, since it names no node
/// (it used to be read, up to 256 MiB a frame, and each request refused); garbage instead of
/// a handshake is dropped; the cluster keeps committing throughout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_certificate_on_the_peer_port_is_refused() {
    let pki = Pki::new();
    let data = tempfile::tempdir().unwrap();
    let cluster = start(&pki, data.path()).await;
    let leader = cluster.wait_for_leader(WAIT).await.unwrap();
    let peer_addr = cluster.replica(leader).peer_addr().to_string();

    let mut garbage = tokio::net::TcpStream::connect(&peer_addr).await.unwrap();
    let _ = garbage
        .write_all(&[0x16, 0x03, 0x01, 0xff, 0xff, 1, 2, 3])
        .await;

    let (cert, key) = pki.identity("operator");
    let operator = client_config(&pki.ca(), Some((&cert, &key))).unwrap();
    let tcp = tokio::net::TcpStream::connect(&peer_addr).await.unwrap();
    let tls = tokio_rustls::TlsConnector::from(operator)
        .connect(server_name(&peer_addr).unwrap(), tcp)
        .await
        .expect("the handshake itself succeeds: the certificate is the CA's");
    let rpc = RaftRpcClient::new(tarpc::client::Config::default(), framed(tls, 1 << 20)).spawn();
    // Claims to be replica 1, a candidate in term 1000.
    let request = ctrlog::raft::types::VoteRequest::new(openraft::Vote::new(1_000, 1), None);
    let answer = rpc.vote(tarpc::context::current(), request).await;
    assert!(
        answer.is_err(),
        "the connection of a certificate naming no node closes before a request is read: \
         {answer:?}"
    );
    let term = cluster.replica(leader).metrics().current_term;
    assert!(term < 1_000, "the forged vote did not move the term");

    let client = ControlClient::connect_with(
        &cluster.client_addrs(),
        options(Some(client_config(&pki.ca(), None).unwrap())),
    )
    .await
    .unwrap();
    let ack = client
        .append_to(Target::All, Command::custom(1, 1, b"after".to_vec()))
        .await
        .unwrap();
    cluster.wait_for_applied(ack.offset, WAIT).await.unwrap();
    cluster.shutdown().await;
}

/// Goal (issue 32): a replica hears on its peer port only nodes that the membership its own
/// log gives names, whatever a request claims. Steps: three `ctrlog serve` processes with TLS
/// and authentication, as deployed. With node 4's certificate (the CA signed it, node 4 was
/// never added), a follower is sent an `AppendEntries` with a committed vote of a higher term
/// naming node 4 and one entry after the follower's last, a vote request of a higher term with
/// a longer log, and an `InstallSnapshot` chunk: each is refused, and the follower's term,
/// leader and log are as they were. Then replica 3 is removed and stopped, and its
/// certificate sends the same to a remaining member: refused too. The cluster commits on, and
/// the forged command is in neither member's log. On 3d7237e the forged `AppendEntries` was
/// answered `Success` (a committed vote at least the replica's admitted a non-member) and the
/// vote was granted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_outside_the_membership_is_refused_whatever_it_claims() {
    let mut cluster = ProcessCluster::start_secure(common::replica_exe(), 3, "", false, &[])
        .await
        .unwrap();
    let pki = cluster.pki().unwrap().to_path_buf();
    let client = ControlClient::connect_with(&cluster.client_addrs(), cluster.client_options())
        .await
        .unwrap();
    for seq in 0..10 {
        client
            .append_to(Target::All, Command::custom(1, 1, vec![seq]))
            .await
            .unwrap();
    }
    let leader = client.leader_status().await.unwrap().id;
    let follower = if leader == 1 { 2 } else { 1 };
    refuses_every_forgery(&cluster, &pki, 4, follower).await;
    // A member that lies: the other follower, authenticated, claims the leader's handover.
    let liar = (1..=3).find(|id| ![leader, follower].contains(id)).unwrap();
    let rpc = raw_peer(
        &ctrlog::tools::certs::replica_files(&pki, liar),
        &cluster.member(follower as usize - 1).peer_addr,
    )
    .await;
    refuses_handover_notices(&rpc, [liar, leader], follower, liar).await;

    client.remove_member(3).await.unwrap();
    cluster.kill(2);
    let members = [1, 2];
    for member in members {
        eventually_status(&cluster, member, "replica 3's removal held", |status| {
            status.leader_id.is_some() && status.members.iter().all(|m| m.id != 3)
        })
        .await;
    }
    let leader = client.leader_status().await.unwrap().id;
    let member = if leader == 1 { 2 } else { 1 };
    refuses_every_forgery(&cluster, &pki, 3, member).await;

    // The cluster commits on, and nothing forged is in either member's log.
    let ack = client
        .append_to(Target::All, Command::custom(1, 1, b"after".to_vec()))
        .await
        .unwrap();
    let forged = Command::custom(1, 1, FORGED.to_vec()).into_frame();
    for member in members {
        let replica = replica_client(&cluster, member).await;
        let entries = fetch_until(&replica, ack.offset).await;
        assert!(
            entries.iter().all(|e| e.frame != forged),
            "a forged command reached replica {member}'s log"
        );
    }
}

/// Goal (issue 59): a replica whose log knows no membership yet hears only the nodes it was
/// started to: its fellow founding members, or the members it joins from (`--join-from`).
/// Steps: founding members 2 and 3 run as deployed (TLS, tokens), the founder not yet. With
/// node 4's certificate (the CA signed it, node 4 is no founder), each is sent a made-up
/// cluster id, then a first membership {2, 3, 4} committed by node 4, then a snapshot naming
/// it: every one is refused, and nothing is recorded. The founder starts and founds
/// {1, 2, 3}. Then replica 4 is started to be added (`--join-from 1,2,3`); node 5's
/// certificate sends it the same, refused too, and `members add 4` makes it a member that
/// follows the cluster's leader. On 923b218 node 4's membership was taken, and 2 and 3 formed
/// a cluster with node 4 that refused the founder for good.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_before_its_membership_hears_only_the_nodes_it_was_started_to() {
    let mut cluster = ProcessCluster::start_secure_without_founder(common::replica_exe(), 3)
        .await
        .unwrap();
    let pki = cluster.pki().unwrap().to_path_buf();
    for founding_member in [2, 3] {
        refuses_a_first_membership(&cluster, &pki, 4, founding_member).await;
    }
    cluster.restart(0).unwrap();
    for id in 1..=3 {
        eventually_status(&cluster, id, "the founding membership", |status| {
            let members: Vec<u64> = status.members.iter().map(|m| m.id).collect();
            status.leader_id.is_some() && members == [1, 2, 3]
        })
        .await;
    }
    let client = ControlClient::connect_with(&cluster.client_addrs(), cluster.client_options())
        .await
        .unwrap();
    client
        .append_to(Target::All, Command::custom(1, 1, b"founded".to_vec()))
        .await
        .unwrap();

    let joiner = cluster.add_replica().unwrap();
    let joiner_peer = cluster.member(joiner).peer_addr;
    ctrlog::tools::poll_until(
        "the joiner listening",
        WAIT,
        ctrlog::tools::POLL_INTERVAL,
        || tokio::net::TcpStream::connect(joiner_peer.clone()),
    )
    .await
    .unwrap();
    refuses_a_first_membership(&cluster, &pki, 5, joiner as u64 + 1).await;
    client
        .add_member(joiner as u64 + 1, cluster.member(joiner))
        .await
        .unwrap();
    let leader = client.leader_status().await.unwrap().id;
    eventually_status(
        &cluster,
        joiner as u64 + 1,
        "the joiner follows",
        |status| status.leader_id == Some(leader) && status.members.iter().any(|m| m.id == 4),
    )
    .await;
}

/// Sends replica `target`, whose log knows no membership, what would make node `sender` (no
/// node it may hear) a member of its first membership: a made-up cluster id, an append of a
/// membership naming `sender` and the two founding members 2 and 3, committed by `sender`,
/// and a snapshot whose membership names them. Each must be refused, leaving the replica
/// without a membership.
async fn refuses_a_first_membership(
    cluster: &ProcessCluster,
    pki: &Path,
    sender: u64,
    target: u64,
) {
    use ctrlog::raft::types::{AppendEntriesRequest, Entry};
    use openraft::{Membership, StoredMembership};

    let peer_addr = &cluster.member(target as usize - 1).peer_addr;
    let rpc = raw_peer(&ctrlog::tools::certs::replica_files(pki, sender), peer_addr).await;
    let made_up = ctrlog::wire::ClusterId(0x5eed);
    let introduced = (rpc.introduce(tarpc::context::current(), Some(made_up)))
        .await
        .expect("the replica answers");
    assert!(
        matches!(introduced, Err(ctrlog::client::ApiError::Rejected(_))),
        "node {sender}'s introduction to replica {target} was answered {introduced:?}"
    );
    let voters = std::collections::BTreeSet::from([2, 3, sender]);
    let members = voters
        .iter()
        .map(|id| (*id, cluster.member(2.min(*id as usize - 1))))
        .collect::<std::collections::BTreeMap<_, _>>();
    let membership = Membership::new(vec![voters], members);
    let vote = openraft::Vote::new_committed(1, sender);
    let first = openraft::LogId::new(openraft::CommittedLeaderId::new(1, sender), 1);
    let appended = rpc
        .append_entries(
            tarpc::context::current(),
            AppendEntriesRequest {
                vote,
                prev_log_id: None,
                entries: vec![Entry {
                    log_id: first,
                    payload: openraft::EntryPayload::Membership(membership.clone()),
                }],
                leader_commit: Some(first),
            },
        )
        .await
        .expect("the replica answers");
    assert!(
        appended.is_err(),
        "node {sender}'s first membership to replica {target} was answered {appended:?}"
    );
    let membership = StoredMembership::new(Some(first), membership);
    refuses_a_snapshot(&rpc, vote, first, membership, sender, target).await;
    let status = replica_client(cluster, target)
        .await
        .status()
        .await
        .unwrap();
    assert!(
        status.members.is_empty() && status.last_log_index.is_none(),
        "replica {target} took node {sender}'s word: {status:?}"
    );
}

/// What a forged append carries.
const FORGED: &[u8] = b"written by a node outside the membership";

/// A client of replica `id` alone (its own status, its own log), as the cluster's admin.
async fn replica_client(cluster: &ProcessCluster, id: u64) -> ControlClient {
    let addr = cluster.client_addrs()[id as usize - 1].clone();
    ControlClient::connect_with(&[addr], cluster.client_options())
        .await
        .unwrap()
}

/// Replica `id`'s status once `condition` holds of it.
async fn eventually_status(
    cluster: &ProcessCluster,
    id: u64,
    what: &str,
    condition: impl Fn(&Status) -> bool,
) -> Status {
    let replica = replica_client(cluster, id).await;
    ctrlog::tools::poll_until(what, WAIT, ctrlog::tools::POLL_INTERVAL, || async {
        match replica.status().await {
            Ok(status) if condition(&status) => Ok(status),
            Ok(status) => Err(format!("{status:?}")),
            Err(error) => Err(error.to_string()),
        }
    })
    .await
    .unwrap_or_else(|timed_out| panic!("replica {id}: {timed_out}"))
}

/// Every entry of `replica`'s log up to `offset`, once it holds that far.
async fn fetch_until(replica: &ControlClient, offset: u64) -> Vec<ctrlog::log::LogEntry> {
    let (mut entries, mut from) = (Vec::new(), 1);
    while from <= offset {
        let mut request = ctrlog::client::FetchRequest::from(from);
        request.max_wait_ms = 1_000;
        let answer = tokio::time::timeout(WAIT, replica.fetch(request))
            .await
            .expect("the replica answers")
            .unwrap();
        from = answer.next_offset;
        entries.extend(answer.entries);
    }
    entries
}

/// Sends replica `target` every forgery node `sender` can: an append of a higher committed
/// vote with one entry after the replica's last, a vote request of a higher term with a longer
/// log, a snapshot chunk. Each must be refused, and leave the replica's term, leader and log
/// as they were.
async fn refuses_every_forgery(cluster: &ProcessCluster, pki: &Path, sender: u64, target: u64) {
    use ctrlog::log::{Batch, Proposal};
    use ctrlog::raft::types::{AppendEntriesRequest, Entry, VoteRequest};
    use openraft::StoredMembership;

    let before =
        eventually_status(cluster, target, "a leader known", |s| s.leader_id.is_some()).await;
    let leader = before.leader_id.unwrap();
    let peer_addr = &cluster.member(target as usize - 1).peer_addr;
    let rpc = raw_peer(&ctrlog::tools::certs::replica_files(pki, sender), peer_addr).await;
    let last = before.last_log_index.unwrap();
    let prev = openraft::LogId::new(openraft::CommittedLeaderId::new(before.term, leader), last);
    let higher = openraft::Vote::new_committed(before.term + 1, sender);
    let forged_id = openraft::LogId::new(
        openraft::CommittedLeaderId::new(before.term + 1, sender),
        last + 1,
    );
    let entry = Entry {
        log_id: forged_id,
        payload: openraft::EntryPayload::Normal(Arc::new(Batch {
            appended_at_ms: 0,
            proposals: vec![Proposal {
                producer: None,
                target: Target::All,
                frame: Command::custom(1, 1, FORGED.to_vec()).into_frame(),
            }],
        })),
    };
    let appended = rpc
        .append_entries(
            tarpc::context::current(),
            AppendEntriesRequest {
                vote: higher,
                prev_log_id: Some(prev),
                entries: vec![entry],
                leader_commit: Some(forged_id),
            },
        )
        .await
        .expect("the replica answers");
    assert!(
        appended.is_err(),
        "node {sender}'s forged append to replica {target} was answered {appended:?}"
    );
    let candidate = openraft::Vote::new(before.term + 1, sender);
    let longer = openraft::LogId::new(
        openraft::CommittedLeaderId::new(before.term, sender),
        last + 1_000,
    );
    let voted = rpc
        .vote(
            tarpc::context::current(),
            VoteRequest::new(candidate, Some(longer)),
        )
        .await
        .expect("the replica answers");
    assert!(
        voted.is_err(),
        "node {sender}'s vote request to replica {target} was answered {voted:?}"
    );
    refuses_a_snapshot(
        &rpc,
        higher,
        longer,
        StoredMembership::default(),
        sender,
        target,
    )
    .await;
    refuses_handover_notices(&rpc, [sender, leader], target, sender).await;
    let after = replica_client(cluster, target)
        .await
        .status()
        .await
        .unwrap();
    assert_eq!(
        (after.term, after.leader_id),
        (before.term, before.leader_id),
        "replica {target}'s term or leader moved"
    );
    assert!(
        after.last_log_index == before.last_log_index || after.leader_id == Some(leader),
        "replica {target}'s log moved under no leader it knows"
    );
}

/// Sends replica `target`, over `rpc` as node `sender`, a one-chunk snapshot up to `last` with
/// `membership`: it must be refused.
async fn refuses_a_snapshot(
    rpc: &RaftRpcClient,
    vote: ctrlog::raft::types::Vote,
    last: ctrlog::raft::types::LogId,
    membership: openraft::StoredMembership<u64, ctrlog::client::Member>,
    sender: u64,
    target: u64,
) {
    let request = ctrlog::raft::types::InstallSnapshotRequest {
        vote,
        meta: openraft::SnapshotMeta {
            last_log_id: Some(last),
            last_membership: membership,
            snapshot_id: "forged".into(),
        },
        offset: 0,
        data: vec![1],
        done: true,
    };
    let snapshot = (rpc.install_snapshot(tarpc::context::current(), request))
        .await
        .expect("the replica answers");
    assert!(
        snapshot.is_err(),
        "node {sender}'s snapshot to replica {target} was answered {snapshot:?}"
    );
}

/// Sends replica `target` a stopping leader's notices (`take_over`, `stand_back` naming
/// `to`), as if from each of `claimed`, over `rpc`, whose certificate names another node than
/// the leader: each is refused (a notice moves the receiver's election timer, so a liar
/// could hasten or hold back elections).
async fn refuses_handover_notices(
    rpc: &RaftRpcClient,
    claimed: impl IntoIterator<Item = u64>,
    target: u64,
    to: u64,
) {
    for from in claimed {
        let taken = (rpc.take_over(tarpc::context::current(), from, 0))
            .await
            .expect("the replica answers");
        assert!(
            matches!(taken, Err(ctrlog::client::ApiError::Rejected(_))),
            "a handover from {from} to replica {target} was answered {taken:?}"
        );
        let stood_back = (rpc.stand_back(tarpc::context::current(), from, to, 0))
            .await
            .expect("the replica answers");
        assert!(
            matches!(stood_back, Err(ctrlog::client::ApiError::Rejected(_))),
            "a stand-back from {from} to replica {target} was answered {stood_back:?}"
        );
    }
}

/// A raw Raft RPC connection to `peer_addr` with a replica's certificate.
async fn raw_peer(files: &TlsFiles, peer_addr: &str) -> RaftRpcClient {
    let config = client_config(&files.ca_file, Some((&files.cert_file, &files.key_file))).unwrap();
    let tcp = tokio::net::TcpStream::connect(peer_addr).await.unwrap();
    let tls = tokio_rustls::TlsConnector::from(config)
        .connect(server_name(peer_addr).unwrap(), tcp)
        .await
        .unwrap();
    RaftRpcClient::new(tarpc::client::Config::default(), framed(tls, 1 << 20)).spawn()
}

/// Goal: a replica dials a peer expecting that peer's certificate (`node-<id>`), not merely
/// one valid for the address. Steps: replica 2's peer address is dialled as if it were
/// replica 3 (a swapped configuration, a stale DNS record): the dial fails naming `node-3`;
/// dialled as replica 2, it answers. Before the fix, the dial as replica 3 was answered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dialled_peer_must_be_the_node_dialled() {
    let pki = Pki::new();
    let data = tempfile::tempdir().unwrap();
    let cluster = start(&pki, data.path()).await;
    let files = pki.replica_files(1);
    let network = PeerNetwork {
        tls: Some(
            client_config(&files.ca_file, Some((&files.cert_file, &files.key_file))).unwrap(),
        ),
        elections: None,
        stages: None,
        durable: None,
        cluster: None,
    };
    let replica_2 = cluster.replica(2).member();
    let misdirected = network.vocabulary_level_max(3, &replica_2, WAIT).await;
    let error = misdirected.expect_err("replica 2's certificate does not name node-3");
    assert!(
        error.contains("node-3") || error.contains("certificate"),
        "{error}"
    );
    network
        .vocabulary_level_max(2, &replica_2, WAIT)
        .await
        .expect("dialled as itself, replica 2 answers");
    cluster.shutdown().await;
}

/// Goal: a removed replica, whose certificate is still valid, can no longer take part. Steps:
/// a follower is removed; with its certificate, a vote request for a far later term
/// (from a log that ends before the removal, as a removed replica's does) and an append
/// claiming it leads the first term are both refused with an error, not answered, and
/// the leader's term does not move. Before the fix both were answered (and the vote request
/// judged on its term).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_removed_replica_is_refused_on_the_peer_port() {
    let pki = Pki::new();
    let data = tempfile::tempdir().unwrap();
    let mut cluster = start(&pki, data.path()).await;
    // A second term, so that the first is a past one.
    let first = cluster.wait_for_leader(WAIT).await.unwrap();
    cluster.stop(first).await;
    let leader = cluster.wait_for_leader(WAIT).await.unwrap();
    cluster.restart(first).await.unwrap();
    let removed = cluster.follower_of(leader);
    let replica = cluster.replica(leader);
    replica.clone_handle().remove_member(removed).await.unwrap();
    common::eventually("the follower to leave the membership", || {
        let membership = replica.metrics().membership_config.clone();
        (membership.membership().get_node(&removed).is_none()).then_some(())
    })
    .await;
    let term = replica.metrics().current_term;
    let rpc = raw_peer(
        &pki.replica_files(removed),
        &replica.peer_addr().to_string(),
    )
    .await;

    let vote =
        ctrlog::raft::types::VoteRequest::new(openraft::Vote::new(term + 100, removed), None);
    let answer = rpc
        .vote(tarpc::context::current(), vote)
        .await
        .expect("answered");
    assert!(
        answer.is_err(),
        "a removed replica's vote request is refused: {answer:?}"
    );

    let mut old_leader = openraft::Vote::new(1, removed);
    old_leader.commit();
    let append = ctrlog::raft::types::AppendEntriesRequest {
        vote: old_leader,
        prev_log_id: None,
        entries: Vec::new(),
        leader_commit: None,
    };
    let answer = rpc
        .append_entries(tarpc::context::current(), append)
        .await
        .expect("answered");
    assert!(
        answer.is_err(),
        "a removed replica's append is refused: {answer:?}"
    );
    assert_eq!(
        replica.metrics().current_term,
        term,
        "the term did not move"
    );
    cluster.shutdown().await;
}

/// Goal: a replica exports how many days each certificate file it loaded has left, so that
/// an alert fires before the CA or a replica's certificate lapses. Steps: a replica whose CA
/// and certificate the test issued for 30 days; `/metrics` carries both, at 29 to 30 days.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn certificate_expiry_is_exported() {
    let pki = Pki::new();
    let data = tempfile::tempdir().unwrap();
    let cluster = LocalCluster::start(data.path(), 1, |c| {
        c.tls = Some(pki.replica_files(c.id));
        c.http_addr = Some("127.0.0.1:0".parse().unwrap());
    })
    .await
    .unwrap();
    let http = cluster.replica(1).http_addr().unwrap();
    let (status, body) = common::http_get(http, "/metrics").await;
    assert_eq!(status, 200);
    for certificate in ["ca", "replica"] {
        let line = body
            .lines()
            .find(|l| {
                l.starts_with("ctrlog_certificate_expiry_days{")
                    && l.contains(&format!("certificate=\"{certificate}\""))
            })
            .unwrap_or_else(|| panic!("no expiry for the {certificate} certificate in\n{body}"));
        let days: f64 = line.rsplit(' ').next().unwrap().parse().unwrap();
        assert!((29.0..=30.0).contains(&days), "{line}");
    }
    cluster.shutdown().await;
}
