//! The observability port of real replicas: Prometheus metrics, probes and the status page,
//! over real HTTP on loopback.

mod common;

use common::{http_get as get, metric_sample as sample, WAIT};
use ctrlog::client::ControlClient;
use ctrlog::log::{
    Command, ContainerId, DesiredContainers, DesiredContainersV1, RegisterContainer, Target,
};
use ctrlog::tools::cluster::ProcessCluster;
use ctrlog::tools::{poll_until, LocalCluster, POLL_INTERVAL};
use serde_json::Value;

/// Goal: each replica's HTTP port reports its state truthfully: metrics that follow the log,
/// probes that follow the cluster's health, and a status page that shows the job.
/// Steps: start three replicas with the port on; register a container and append 10
/// commands; read the leader's metrics, status JSON and page; stop two replicas and watch the
/// last one's readiness turn to 503 while it stays alive.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_probes_and_the_status_page_follow_the_cluster() {
    let dir = tempfile::tempdir().unwrap();
    let mut cluster = LocalCluster::start(dir.path(), 3, |c| {
        c.http_addr = Some("127.0.0.1:0".parse().unwrap());
    })
    .await
    .unwrap();
    let leader = cluster.wait_for_leader(WAIT).await.unwrap();
    let http = |id| cluster.replica(id).http_addr().expect("the port is on");
    for id in cluster.running_ids() {
        assert_eq!(get(http(id), "/healthz").await.0, 200);
    }

    let client = ControlClient::connect(&cluster.client_addrs())
        .await
        .unwrap();
    let c1 = ContainerId::new("c1").unwrap();
    client
        .append(Command::RegisterContainer(RegisterContainer {
            container: c1,
            location: "host-a".into(),
        }))
        .await
        .unwrap();
    let mut last = 0;
    for i in 0..10u8 {
        last = client
            .append_to(Target::All, Command::custom(1, 1, vec![b'a' + i]))
            .await
            .unwrap()
            .offset;
    }
    cluster.wait_for_applied(last, WAIT).await.unwrap();

    let (code, metrics) = get(http(leader), "/metrics").await;
    assert_eq!(code, 200);
    assert_eq!(sample(&metrics, "ctrlog_is_leader"), Some(1.0));
    let build_info = format!(
        "ctrlog_build_info{{version=\"{}\"}}",
        env!("CARGO_PKG_VERSION")
    );
    assert_eq!(sample(&metrics, &build_info), Some(1.0), "{metrics}");
    assert_eq!(sample(&metrics, "ctrlog_leader_id"), Some(leader as f64));
    assert_eq!(sample(&metrics, "ctrlog_applied_offset"), Some(last as f64));
    assert_eq!(sample(&metrics, "ctrlog_containers_live"), Some(1.0));
    assert_eq!(
        sample(&metrics, "ctrlog_appends_total{outcome=\"appended\"}"),
        Some(11.0),
        "{metrics}"
    );
    assert_eq!(sample(&metrics, "ctrlog_append_seconds_count"), Some(11.0));
    assert!(sample(&metrics, "ctrlog_wal_bytes").unwrap() > 0.0);
    assert!(
        metrics.contains("ctrlog_fetch_lag_offsets_bucket"),
        "subscriber lag is reported"
    );
    assert!(metrics.trim_end().ends_with("# EOF"), "OpenMetrics text");
    let follower = cluster.follower_of(leader);
    let (_, follower_metrics) = get(http(follower), "/metrics").await;
    assert_eq!(sample(&follower_metrics, "ctrlog_is_leader"), Some(0.0));

    let (code, status) = get(http(leader), "/status.json").await;
    assert_eq!(code, 200);
    let status: Value = serde_json::from_str(&status).unwrap();
    assert_eq!(status["replica"]["role"], "Leader");
    assert_eq!(status["healthy"], true);
    assert_eq!(status["job"]["containers"][0]["id"], "c1");
    assert_eq!(status["job"]["containers"][0]["location"], "host-a");
    let tail = status["tail"].as_array().unwrap();
    assert_eq!(
        tail.len(),
        12,
        "the 11 appends after the new cluster's level raise"
    );
    assert_eq!(tail.last().unwrap()["offset"], last);

    // No controller has recorded a desired count: an autoscaler must see no value, not 0.
    assert_eq!(sample(&metrics, "ctrlog_desired_containers"), None);
    client
        .append(Command::DesiredContainers(DesiredContainers {
            count: 3,
            reason: "an autoscaler's gauge".into(),
        }))
        .await
        .unwrap();
    let desired = poll_until(
        "the desired count in the metrics",
        WAIT,
        POLL_INTERVAL,
        || async {
            let (_, metrics) = get(http(follower), "/metrics").await;
            sample(&metrics, "ctrlog_desired_containers").ok_or("not yet")
        },
    );
    assert_eq!(
        desired.await.unwrap(),
        3.0,
        "every replica reports the committed count"
    );

    // The charts' history: one sample a second of what this replica applied.
    let samples = poll_until("two samples of history", WAIT, POLL_INTERVAL, || async {
        let (_, history) = get(http(leader), "/history.json").await;
        let samples: Vec<Value> = serde_json::from_str(&history).unwrap();
        if samples.len() >= 2 && samples.last().unwrap()["desired"] == 3 {
            Ok(samples)
        } else {
            Err(format!("{} samples", samples.len()))
        }
    })
    .await
    .unwrap();
    let newest = samples.last().unwrap();
    assert!(newest["applied_offset"].as_u64().unwrap() > last);
    assert_eq!(newest["leader"], leader);
    assert_eq!(newest["live"], 1);

    let (code, page) = get(http(leader), "/").await;
    assert_eq!(code, 200);
    assert!(page.contains("/status.json"), "the page polls the status");
    assert!(
        page.contains("/history.json"),
        "the page charts the history"
    );
    assert!(
        !page.contains("http://") && !page.contains("https://"),
        "the page loads nothing from elsewhere"
    );
    assert_eq!(get(http(leader), "/readyz").await.0, 200);

    // Alone, the last replica stays alive but is no longer ready: it knows no leader.
    let last_one = follower;
    let last_http = http(last_one);
    for id in cluster.running_ids() {
        if id != last_one {
            cluster.stop(id).await;
        }
    }
    let why = poll_until("readiness to drop", WAIT, POLL_INTERVAL, || async move {
        match get(last_http, "/readyz").await {
            (503, why) => Ok(why),
            (code, _) => Err(format!("/readyz answers {code}")),
        }
    })
    .await
    .unwrap();
    assert!(why.contains("no leader"), "{why}");
    assert_eq!(get(last_http, "/healthz").await.0, 200);
    cluster.shutdown().await;
}

/// Goal: `/readyz` tells the truth about replicas that cannot serve, on `ctrlog serve`
/// processes: a removed replica answers 503, also once restarted on its old directory; a leader
/// left without a quorum answers 503 within 3 s (the bound is about 0.7 s with the default
/// timeouts, ARCHITECTURE.md). 3d7237e answered 200 "ready" in both cases: the survivor for as
/// long as it ran, while every append and `state` failed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readiness_is_refused_by_a_removed_replica_and_a_leader_without_quorum() {
    let mut cluster = ProcessCluster::start_with_http(common::replica_exe(), 3, &[])
        .await
        .unwrap();
    let leader = cluster.leader_index().await.unwrap();
    let (removed, last) = match leader {
        0 => (1, 2),
        1 => (0, 2),
        _ => (0, 1),
    };
    // Fixed for each replica across its restarts.
    let https: Vec<_> = (0..3).map(|i| cluster.http_addr(i).unwrap()).collect();
    let not_ready = |i: usize, deadline| {
        let addr = https[i];
        poll_until(
            "/readyz to answer 503",
            deadline,
            POLL_INTERVAL,
            move || async move {
                if tokio::net::TcpStream::connect(addr).await.is_err() {
                    return Err("not listening (yet)".to_string());
                }
                match get(addr, "/readyz").await {
                    (503, why) => Ok(why),
                    (code, why) => Err(format!("/readyz answers {code} {why}")),
                }
            },
        )
    };
    assert_eq!(get(https[leader], "/readyz").await.0, 200);

    let client = ControlClient::connect_with(&cluster.client_addrs(), cluster.client_options())
        .await
        .unwrap();
    client.remove_member(removed as u64 + 1).await.unwrap();
    let why = not_ready(removed, WAIT).await.unwrap();
    assert!(
        why.contains("not a member") || why.contains("no leader"),
        "{why}"
    );
    cluster.restart(removed).unwrap();
    let why = not_ready(removed, WAIT)
        .await
        .unwrap_or_else(|e| panic!("{e}: {}", cluster.log_tail(removed, 20)));
    assert!(
        why.contains("not a member") || why.contains("no leader"),
        "{why}"
    );
    assert_eq!(get(https[leader], "/readyz").await.0, 200);

    // The leader's one remaining follower stops: two members, no quorum.
    cluster.kill(last);
    let why = not_ready(leader, std::time::Duration::from_secs(3))
        .await
        .unwrap();
    assert!(why.contains("without a quorum"), "{why}");
}

/// Goal: a leader that removed itself, restarted on its directory by mistake, says once that
/// it was removed and answers `/readyz` 503, on `ctrlog serve` processes. 3d7237e said nothing
/// of it, and logged a warning at every refused request.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_removed_leader_restarted_says_once_that_it_was_removed() {
    let mut cluster = ProcessCluster::start_with_http(common::replica_exe(), 3, &[])
        .await
        .unwrap();
    let leader = cluster.leader_index().await.unwrap();
    let http = cluster.http_addr(leader).unwrap();
    let client = ControlClient::connect_with(&cluster.client_addrs(), cluster.client_options())
        .await
        .unwrap();
    client.remove_member(leader as u64 + 1).await.unwrap();
    cluster.kill(leader);
    cluster.restart(leader).unwrap();
    const SAID: &str = "this replica was removed from the cluster";
    poll_until("the removed replica to say so", WAIT, POLL_INTERVAL, || {
        let tail = cluster.log_tail(leader, 200);
        async move {
            match tail.matches(SAID).count() {
                0 => Err(tail),
                _ => Ok(()),
            }
        }
    })
    .await
    .unwrap();
    let why = poll_until(
        "/readyz to answer 503",
        WAIT,
        POLL_INTERVAL,
        || async move {
            if tokio::net::TcpStream::connect(http).await.is_err() {
                return Err("not listening (yet)".to_string());
            }
            match get(http, "/readyz").await {
                (503, why) => Ok(why),
                (code, why) => Err(format!("/readyz answers {code} {why}")),
            }
        },
    )
    .await
    .unwrap();
    assert!(why.contains("not a member"), "{why}");
    assert_eq!(
        cluster.log_tail(leader, 200).matches(SAID).count(),
        1,
        "said once"
    );
}

/// The cluster id replica `i` of `cluster` records in its directory's `format` file, if any.
fn recorded_cluster(cluster: &ProcessCluster, i: usize) -> Option<String> {
    let format = std::fs::read_to_string(cluster.replica_dir(i).join("format")).ok()?;
    let line = format.lines().find(|l| l.starts_with("cluster_id"))?;
    Some(line.split('=').nth(1)?.trim().to_string())
}

/// Goal: every replica of a cluster records its founder's cluster id, and a replica started on
/// a directory of another cluster (the same node id: a cluster built anew beside an old
/// replica's directory) takes no part in it: its peers refuse it and it refuses them, each
/// naming both clusters, while the cluster keeps committing, on `ctrlog serve` processes.
/// 3d7237e recorded no cluster and spoke Raft with the stray replica as with any member.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_on_another_clusters_directory_is_refused_naming_both_clusters() {
    let exe = common::replica_exe();
    let mut old = ProcessCluster::start_with_http(exe.clone(), 3, &[])
        .await
        .unwrap();
    let mut new = ProcessCluster::start_with_http(exe, 3, &[]).await.unwrap();
    for cluster in [&old, &new] {
        poll_until(
            "every replica to record the founder's cluster",
            WAIT,
            POLL_INTERVAL,
            || {
                let recorded: Vec<_> = (0..3).map(|i| recorded_cluster(cluster, i)).collect();
                async move {
                    match recorded[0].is_some() && recorded.iter().all(|r| *r == recorded[0]) {
                        true => Ok(()),
                        false => Err(format!("{recorded:?}")),
                    }
                }
            },
        )
        .await
        .unwrap();
    }
    let (old_id, new_id) = (
        recorded_cluster(&old, 0).unwrap(),
        recorded_cluster(&new, 0).unwrap(),
    );
    assert_ne!(old_id, new_id, "each founder draws its own");

    let leader = new.leader_index().await.unwrap();
    let stray = (leader + 1) % 3;
    for i in 0..3 {
        old.kill(i);
    }
    new.kill(stray);
    std::fs::remove_dir_all(new.replica_dir(stray)).unwrap();
    common::copy_dir(&old.replica_dir(stray), &new.replica_dir(stray));
    new.restart(stray).unwrap();

    let refused_by_the_stray =
        format!("this replica belongs to cluster {old_id}, the caller's directory to {new_id}");
    let refused_by_the_leader =
        format!("belongs to cluster {old_id}, and this replica to cluster {new_id}");
    poll_until(
        "both sides to name both clusters",
        WAIT,
        POLL_INTERVAL,
        || {
            let (stray_log, leader_log) = (new.log_tail(stray, 400), new.log_tail(leader, 400));
            let said = stray_log.contains(&refused_by_the_stray)
                && leader_log.contains(&refused_by_the_leader);
            async move {
                match said {
                    true => Ok(()),
                    false => Err(format!("stray:\n{stray_log}\nleader:\n{leader_log}")),
                }
            }
        },
    )
    .await
    .unwrap();

    let client = ControlClient::connect_with(&new.client_addrs(), new.client_options())
        .await
        .unwrap();
    let ack = client
        .append(Command::DesiredContainers(DesiredContainers {
            count: 2,
            reason: "a commit the stray must not take part in".into(),
        }))
        .await
        .unwrap();
    assert_eq!(
        recorded_cluster(&new, stray),
        Some(old_id.clone()),
        "the stray keeps its own"
    );
    let status = get(new.http_addr(stray).unwrap(), "/status.json").await.1;
    let status: Value = serde_json::from_str(&status).unwrap();
    assert_eq!(status["replica"]["cluster_id"], Value::String(old_id));
    let applied = status["replica"]["applied_offset"].as_u64().unwrap();
    assert!(
        applied < ack.offset,
        "the stray received none of it: {status}"
    );
}

/// Goal: a cluster initialised before cluster ids (its directories record none) gets one id
/// on every replica when its vocabulary level is raised to the level that derives it, and
/// nothing is drawn before: no replica that holds state draws one of its own, on `ctrlog
/// serve` processes. Steps: a cluster's `cluster_id` lines removed while it is stopped, as a
/// build before cluster ids left them; restarted, it commits with none; the raise.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_without_an_id_gets_one_from_the_level_raise_on_every_replica() {
    // Founded at level 1, as every build before cluster ids founded its clusters.
    let at_level_1 = ["--initial-vocabulary-level".to_string(), "1".to_string()];
    let mut cluster = ProcessCluster::start_with_http(common::replica_exe(), 3, &at_level_1)
        .await
        .unwrap();
    poll_until(
        "the founder's id on every replica",
        WAIT,
        POLL_INTERVAL,
        || {
            let all = (0..3).all(|i| recorded_cluster(&cluster, i).is_some());
            async move { all.then_some(()).ok_or("not yet") }
        },
    )
    .await
    .unwrap();
    let drawn = recorded_cluster(&cluster, 0).unwrap();
    for i in 0..3 {
        cluster.kill(i);
        let format = cluster.replica_dir(i).join("format");
        let text = std::fs::read_to_string(&format).unwrap();
        let without: String = (text.lines())
            .filter(|line| !line.starts_with("cluster_id"))
            .map(|line| format!("{line}\n"))
            .collect();
        std::fs::write(&format, without).unwrap();
    }
    for i in 0..3 {
        cluster.restart(i).unwrap();
    }
    let client = ControlClient::connect_with(&cluster.client_addrs(), cluster.client_options())
        .await
        .unwrap();
    client
        .append(Command::DesiredContainersV1(DesiredContainersV1 {
            count: 1,
        }))
        .await
        .unwrap();
    let recorded: Vec<_> = (0..3).map(|i| recorded_cluster(&cluster, i)).collect();
    assert_eq!(
        recorded,
        [None, None, None],
        "nothing drawn for a replica with state"
    );

    let raise = Command::SetVocabularyLevel(ctrlog::log::SetVocabularyLevel {
        level: ctrlog::log::vocabulary::LEVEL_CLUSTER_ID_DERIVED,
    });
    client.append(raise).await.unwrap();
    let derived = poll_until(
        "every replica to record the derived id",
        WAIT,
        POLL_INTERVAL,
        || {
            let recorded: Vec<_> = (0..3).map(|i| recorded_cluster(&cluster, i)).collect();
            async move {
                match &recorded[0] {
                    Some(id) if recorded.iter().all(|r| r.as_ref() == Some(id)) => Ok(id.clone()),
                    _ => Err(format!("{recorded:?}")),
                }
            }
        },
    )
    .await
    .unwrap();
    assert_ne!(derived, drawn);
}

/// The `ctrlog_*` metric names a text mentions, as registered: without the `_total`,
/// `_bucket`, `_sum` and `_count` suffixes the exposition adds to counters and histograms.
fn metric_names(text: &str) -> std::collections::BTreeSet<String> {
    let mut names = std::collections::BTreeSet::new();
    for (start, _) in text.match_indices("ctrlog_") {
        let name: String = text[start..]
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect();
        let registered = ["_total", "_bucket", "_sum", "_count"]
            .iter()
            .find_map(|suffix| name.strip_suffix(suffix))
            .unwrap_or(&name);
        names.insert(registered.to_string());
    }
    names
}

/// Goal: the alert rules and the dashboard in `deploy/` query only metrics a replica exports,
/// so neither goes silently blank after a rename. Steps: a replica with a desired count
/// recorded (the one metric absent until then); every `ctrlog_*` name in
/// `deploy/prometheus/ctrlog-rules.yml` and `deploy/grafana/ctrlog-dashboard.json` has a
/// `# TYPE` line in its `/metrics`. (`promtool` checks the rules themselves in CI.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_metric_the_alerts_and_the_dashboard_query_is_exported() {
    let dir = tempfile::tempdir().unwrap();
    let cluster = LocalCluster::start(dir.path(), 1, |c| {
        c.http_addr = Some("127.0.0.1:0".parse().unwrap());
    })
    .await
    .unwrap();
    cluster.wait_for_leader(WAIT).await.unwrap();
    let client = ControlClient::connect(&cluster.client_addrs())
        .await
        .unwrap();
    let ack = client
        .append(Command::DesiredContainers(DesiredContainers {
            count: 1,
            reason: "the desired-containers gauge".into(),
        }))
        .await
        .unwrap();
    cluster.wait_for_applied(ack.offset, WAIT).await.unwrap();
    let (code, metrics) = get(cluster.replica(1).http_addr().unwrap(), "/metrics").await;
    assert_eq!(code, 200);
    let exported: std::collections::BTreeSet<String> = metrics
        .lines()
        .filter_map(|line| line.strip_prefix("# TYPE "))
        .filter_map(|line| line.split(' ').next())
        .map(String::from)
        .collect();
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy");
    for file in [
        "prometheus/ctrlog-rules.yml",
        "grafana/ctrlog-dashboard.json",
    ] {
        let text = std::fs::read_to_string(root.join(file)).unwrap();
        if file.ends_with(".json") {
            let dashboard: Value = serde_json::from_str(&text).expect("the dashboard is JSON");
            let panels = dashboard["panels"].as_array().expect("it has panels");
            assert!(panels
                .iter()
                .all(|p| p["targets"].as_array().is_some_and(|t| !t.is_empty())));
        }
        let used = metric_names(&text);
        assert!(used.len() >= 8, "{file} queries {used:?}");
        let missing: Vec<_> = used.difference(&exported).collect();
        assert!(
            missing.is_empty(),
            "{file} queries {missing:?}, not exported"
        );
    }
    cluster.shutdown().await;
}
