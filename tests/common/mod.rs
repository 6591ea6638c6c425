//! Helpers shared by the integration tests.
#![allow(dead_code)]

pub mod proxy;

use std::net::SocketAddr;
use std::time::Duration;

use ctrlog::client::{ApiError, AppendAck, ClientError, ControlClient, FetchRequest, Member};
use ctrlog::log::{Command, LogEntry, Proposal, Target};
use ctrlog::server::ReplicaHandle;
use ctrlog::tools::{poll_until, LocalCluster, POLL_INTERVAL};

/// Generous: CI machines are shared and slow, and a deadline only bounds a failure.
pub const WAIT: Duration = Duration::from_secs(30);

/// The `ctrlog` binary the tests' replica processes run: the one cargo built, or the one
/// `CTRLOG_TEST_REPLICA_BINARY` names (an older build, to see a regression test fail on it).
pub fn replica_exe() -> std::path::PathBuf {
    std::env::var_os("CTRLOG_TEST_REPLICA_BINARY")
        .map_or_else(|| env!("CARGO_BIN_EXE_ctrlog").into(), Into::into)
}

/// Polls `probe` every 20 ms until it returns `Some`, failing with `what` after `WAIT`. For
/// conditions nothing signals (replica metrics, the leader's heartbeat table); JobState
/// conditions wait on applies instead (`LocalJob::wait_for_state`).
pub async fn eventually<T>(what: &str, mut probe: impl FnMut() -> Option<T>) -> T {
    poll_until(what, WAIT, POLL_INTERVAL, || {
        std::future::ready(probe().ok_or("not yet"))
    })
    .await
    .unwrap_or_else(|timed_out| panic!("{timed_out}"))
}

/// An address pair nobody listens at (ports just released): a member not started.
pub fn unreachable_member() -> Member {
    let free = || {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.local_addr().unwrap().to_string()
    };
    Member {
        peer_addr: free(),
        client_addr: free(),
    }
}

pub fn command(i: u64, size: usize) -> Proposal {
    let mut body = format!("cmd-{i}:").into_bytes();
    body.resize(size.max(body.len()), b'x');
    Proposal {
        producer: None,
        target: Target::All,
        frame: Command::custom(1, 1, body).into_frame(),
    }
}

/// Appends `count` commands numbered from `from` on the current leader, concurrently, and
/// returns the offsets they were acknowledged at, in numbering order.
pub async fn append_many(cluster: &LocalCluster, from: u64, count: u64) -> Vec<u64> {
    let leader = cluster.wait_for_leader(WAIT).await.expect("leader");
    let handle = cluster.replica(leader).clone_handle();
    let tasks: Vec<_> = (from..from + count)
        .map(|i| {
            let handle = handle.clone();
            tokio::spawn(async move { handle.append(command(i, 32)).await })
        })
        .collect();
    let mut offsets = Vec::new();
    for task in tasks {
        match task.await.expect("append task") {
            Ok(AppendAck {
                offset,
                duplicate: false,
            }) => offsets.push(offset),
            other => panic!("append failed: {other:?}"),
        }
    }
    offsets
}

/// Every entry a replica has, from offset 1.
pub async fn read_all(replica: &ReplicaHandle) -> Vec<LogEntry> {
    read_from(replica, 1).await
}

/// Every entry a replica has, from `from`. A replica answers reads only once it knows a
/// leader (else `Unavailable`, so that a stale log is not served as current), which a replica
/// just restarted may not yet: that answer is retried until [`WAIT`].
pub async fn read_from(replica: &ReplicaHandle, from: u64) -> Vec<LogEntry> {
    let mut entries = Vec::new();
    let mut next = from;
    let started = std::time::Instant::now();
    loop {
        let response = match replica
            .fetch(&FetchRequest::from(next), Duration::ZERO)
            .await
        {
            Err(ApiError::Unavailable(_)) if started.elapsed() < WAIT => {
                tokio::time::sleep(POLL_INTERVAL).await;
                continue;
            }
            answer => answer.expect("fetch"),
        };
        if response.entries.is_empty() {
            return entries;
        }
        next = response.next_offset;
        entries.extend(response.entries);
    }
}

/// Asserts that `entries` are offsets 1..=n with no gap.
pub fn assert_contiguous(entries: &[LogEntry]) {
    for (i, entry) in entries.iter().enumerate() {
        assert_eq!(
            entry.offset,
            i as u64 + 1,
            "offsets must be contiguous from 1"
        );
    }
}

/// One `GET`, answered as (status code, body).
pub async fn http_get(addr: SocketAddr, path: &str) -> (u16, String) {
    http_get_with(addr, path, &format!("Host: {addr}\r\n")).await
}

/// One `GET` with these header lines (each ending in CRLF; `Host` among them if wanted).
pub async fn http_get_with(addr: SocketAddr, path: &str, headers: &str) -> (u16, String) {
    let mut socket = tokio::net::TcpStream::connect(addr).await.unwrap();
    let request = format!("GET {path} HTTP/1.1\r\n{headers}Connection: close\r\n\r\n");
    tokio::io::AsyncWriteExt::write_all(&mut socket, request.as_bytes())
        .await
        .unwrap();
    let mut answer = String::new();
    tokio::time::timeout(
        WAIT,
        tokio::io::AsyncReadExt::read_to_string(&mut socket, &mut answer),
    )
    .await
    .expect("the replica answered")
    .unwrap();
    let status = answer
        .split(' ')
        .nth(1)
        .and_then(|code| code.parse().ok())
        .expect("an HTTP status line");
    let body = answer
        .split_once("\r\n\r\n")
        .map(|(_, body)| body.to_string())
        .unwrap_or_default();
    (status, body)
}

/// The value of a sample line `name value` (or `name{labels} value`) in Prometheus text.
pub fn metric_sample(text: &str, name: &str) -> Option<f64> {
    text.lines()
        .filter(|line| !line.starts_with('#'))
        .find_map(|line| line.strip_prefix(name)?.trim().parse().ok())
}

/// How many of `streams` the other side closed within `within` (a read that ends the file or
/// fails), all looked at at once: a port that closes a connection it refuses does so at once.
pub async fn count_closed<S: tokio::io::AsyncRead + Unpin>(
    streams: &mut [S],
    within: Duration,
) -> usize {
    let looks = streams.iter_mut().map(|stream| async move {
        let mut byte = [0u8; 1];
        let read = tokio::time::timeout(within, tokio::io::AsyncReadExt::read(stream, &mut byte));
        matches!(read.await, Ok(Ok(0) | Err(_)))
    });
    futures::future::join_all(looks)
        .await
        .into_iter()
        .filter(|&closed| closed)
        .count()
}

/// A TCP connection to `addr` from `source`: any 127.0.0.0/8 address is this host, so a test
/// can be many clients at once.
pub async fn connect_from(
    source: std::net::Ipv4Addr,
    addr: SocketAddr,
) -> std::io::Result<tokio::net::TcpStream> {
    let socket = tokio::net::TcpSocket::new_v4()?;
    socket.bind((source, 0).into())?;
    socket.connect(addr).await
}

/// Everything the replica at client address `addr` still retains, from its first retained
/// offset, read from it alone.
pub async fn read_retained(addr: &str) -> Vec<LogEntry> {
    let client = ControlClient::connect(&[addr.to_string()]).await.unwrap();
    let mut entries = Vec::new();
    let mut next = 1;
    loop {
        let request = FetchRequest::from(next);
        let response = match client.fetch(request).await {
            Err(ClientError::Api(ApiError::Compacted { first_offset, .. }))
                if entries.is_empty() =>
            {
                next = first_offset;
                continue;
            }
            other => other.unwrap(),
        };
        if response.entries.is_empty() {
            return entries;
        }
        next = response.next_offset;
        entries.extend(response.entries);
    }
}

/// Every running replica of `cluster` holds offsets 1 to `last` (every acknowledged one), and
/// the same entries there: nothing acknowledged lost, no divergence.
pub async fn assert_nothing_lost(cluster: &LocalCluster, last: u64) {
    cluster.wait_for_applied(last, WAIT).await.unwrap();
    let mut reference = None;
    for replica in cluster.running() {
        let log = read_all(replica).await;
        assert_contiguous(&log);
        assert!(
            log.len() as u64 >= last,
            "replica {} lacks offsets",
            replica.id()
        );
        let prefix: Vec<_> = log.into_iter().take(last as usize).collect();
        match &reference {
            None => reference = Some(prefix),
            Some(r) => assert_eq!(&prefix, r, "replica {} diverged", replica.id()),
        }
    }
}

/// Copies the folder `from` into `to`, recursively.
pub fn copy_dir(from: &std::path::Path, to: &std::path::Path) {
    std::fs::create_dir_all(to).unwrap();
    for item in std::fs::read_dir(from).unwrap() {
        let item = item.unwrap();
        let target = to.join(item.file_name());
        match item.file_type().unwrap().is_dir() {
            true => copy_dir(&item.path(), &target),
            false => drop(std::fs::copy(item.path(), target).unwrap()),
        }
    }
}
