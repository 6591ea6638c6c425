//! The `ctrlog` client subcommands against a running cluster: the documented output of
//! `append`, `tail --json`, `status --json` and `state --json`, and error exit codes.

mod common;

use std::process::Output;

use common::WAIT;
use ctrlog::log::{vocabulary, CUSTOM_KIND_MIN};
use ctrlog::tools::{poll_until, LocalCluster, POLL_INTERVAL};
use serde_json::Value;

/// Runs `ctrlog ARGS` with `CTRLOG_CLUSTER` set to `cluster` (unless it is empty).
async fn ctrlog(cluster: &str, args: &[&str]) -> Output {
    let mut command = tokio::process::Command::new(env!("CARGO_BIN_EXE_ctrlog"));
    command.args(args).env("RUST_LOG", "off").kill_on_drop(true);
    if cluster.is_empty() {
        command.env_remove("CTRLOG_CLUSTER");
    } else {
        command.env("CTRLOG_CLUSTER", cluster);
    }
    tokio::time::timeout(WAIT, command.output())
        .await
        .expect("ctrlog finished")
        .expect("ctrlog ran")
}

fn stdout_of(output: &Output) -> String {
    assert!(
        output.status.success(),
        "ctrlog failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout.clone()).unwrap()
}

/// Runs `ctrlog ARGS` and checks that it exits with `code` within 5 s: at once, or after a
/// short `--command-timeout`, never after the default retry deadline. Returns what it printed
/// on stderr, which must say it once: no line twice, no cause repeated after its message.
async fn exits_within(cluster: &str, args: &[&str], code: i32) -> String {
    let started = std::time::Instant::now();
    let output = ctrlog(cluster, args).await;
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    assert_eq!(output.status.code(), Some(code), "{args:?}: {stderr}");
    assert!(
        started.elapsed() < std::time::Duration::from_secs(5),
        "{args:?} took {:?}",
        started.elapsed()
    );
    assert_said_once(&stderr);
    stderr
}

/// Fails if a message repeats a piece of itself: `ctrlog: storage: X: X` says X twice.
fn assert_said_once(stderr: &str) {
    for line in stderr.lines() {
        let pieces: Vec<&str> = line.split(": ").collect();
        for (i, piece) in pieces.iter().enumerate() {
            assert!(
                piece.len() < 8 || !pieces[i + 1..].contains(piece),
                "{piece:?} is said twice in {line:?}"
            );
        }
    }
}

fn json_lines(output: &Output) -> Vec<Value> {
    stdout_of(output)
        .lines()
        .map(|line| serde_json::from_str(line).expect("one JSON object per line"))
        .collect()
}

/// Goal: scripts can drive the cluster through the CLI and parse what it prints.
/// Steps: `append --json` prints the offset; an idempotent append repeated prints the same
/// offset marked duplicate; a binary payload from a file is tailed as base64; `tail --json`
/// prints one object per entry with the documented fields, honouring `--filter` and `--max`;
/// `status --json` names the leader and members; `state --json` is at the last offset; the
/// vocabulary level is raised only to what every replica supports; bad
/// input and an unreachable cluster exit non-zero with one line on stderr.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cli_appends_tails_and_reports_status_as_documented() {
    let dir = tempfile::tempdir().unwrap();
    // Founded at level 1, as v0.1.0 founded every cluster, so that the raise has a level to
    // go to and the first append takes offset 1.
    let mut cluster = LocalCluster::start(dir.path(), 3, |c| c.initial_vocabulary_level = Some(1))
        .await
        .unwrap();
    let leader = cluster.wait_for_leader(WAIT).await.unwrap();
    let addrs = cluster.client_addrs().join(",");

    let first = ctrlog(
        &addrs,
        &[
            "append",
            "--kind",
            "custom:1",
            "--payload",
            "hello",
            "--json",
        ],
    )
    .await;
    assert_eq!(
        json_lines(&first),
        vec![serde_json::json!({"offset": 1, "duplicate": false})]
    );

    let idempotent = [
        "append",
        "--kind",
        "custom:2",
        "--version",
        "3",
        "--target",
        "container:c1",
        "--payload",
        "for c1",
        "--producer",
        "42",
        "--seq",
        "7",
        "--json",
    ];
    let second = json_lines(&ctrlog(&addrs, &idempotent).await);
    assert_eq!(second[0]["offset"], 2);
    assert_eq!(second[0]["duplicate"], false);
    let again = json_lines(&ctrlog(&addrs, &idempotent).await);
    assert_eq!(again[0]["offset"], 2, "the same pair appends once");
    assert_eq!(again[0]["duplicate"], true);

    let binary = dir.path().join("payload.bin");
    std::fs::write(&binary, [0xff, 0x00, 0x7f]).unwrap();
    let third = ctrlog(
        "",
        &[
            "append",
            "--cluster",
            &addrs,
            "--kind",
            "268435459",
            "--target",
            "coordinator",
            "--payload-file",
            binary.to_str().unwrap(),
        ],
    )
    .await;
    assert_eq!(stdout_of(&third).trim(), "3", "plain output is the offset");

    let tail = json_lines(&ctrlog(&addrs, &["tail", "--from", "1", "--json"]).await);
    assert_eq!(tail.len(), 3);
    assert_eq!(tail[0]["offset"], 1);
    assert_eq!(tail[0]["kind"], CUSTOM_KIND_MIN + 1);
    assert_eq!(tail[0]["version"], 1);
    assert_eq!(tail[0]["target"], "all");
    assert_eq!(tail[0]["payload"], "hello");
    assert!(tail[0]["term"].as_u64().unwrap() >= 1);
    assert!(tail[0]["appended_at_ms"].as_u64().unwrap() > 1_600_000_000_000);
    assert!(tail[0]["producer"].is_u64(), "the CLI appends idempotently");
    assert_eq!(tail[1]["target"], "container:c1");
    assert_eq!(tail[1]["version"], 3);
    assert_eq!(tail[1]["producer"], 42);
    assert_eq!(tail[1]["seq"], 7);
    assert_eq!(tail[2]["target"], "coordinator");
    assert_eq!(tail[2]["payload_b64"], "/wB/");
    assert!(tail[2].get("payload").is_none());

    let filtered =
        json_lines(&ctrlog(&addrs, &["tail", "--filter", "container:c2", "--json"]).await);
    assert_eq!(filtered.len(), 1, "c2 sees the broadcast only");
    assert_eq!(filtered[0]["offset"], 1);
    let limited =
        json_lines(&ctrlog(&addrs, &["tail", "--from", "2", "--max", "1", "--json"]).await);
    assert_eq!(limited.len(), 1);
    assert_eq!(limited[0]["offset"], 2);
    let followed = json_lines(
        &ctrlog(
            &addrs,
            &["tail", "--follow", "--from", "3", "--max", "1", "--json"],
        )
        .await,
    );
    assert_eq!(followed[0]["offset"], 3);

    let status = &json_lines(&ctrlog(&addrs, &["status", "--json"]).await)[0];
    assert_eq!(status["leader_id"], leader);
    assert_eq!(status["members"].as_array().unwrap().len(), 3);
    for member in status["members"].as_array().unwrap() {
        assert!(member["client_addr"]
            .as_str()
            .unwrap()
            .starts_with("127.0.0.1:"));
        assert_eq!(member["voter"], true);
    }
    assert_eq!(status["first_offset"], 1);
    cluster.wait_for_applied(3, WAIT).await.unwrap();
    let status = &json_lines(&ctrlog(&addrs, &["status", "--json"]).await)[0];
    assert_eq!(status["applied_offset"], 3);
    assert_eq!(status["commit_offset"], 3);
    let every = json_lines(&ctrlog(&addrs, &["status", "--all-replicas", "-o", "json"]).await);
    let ids: Vec<u64> = every.iter().map(|s| s["id"].as_u64().unwrap()).collect();
    assert_eq!(ids, vec![1, 2, 3], "each replica answers for itself");
    assert!(every.iter().all(|s| s["leader_id"] == leader));
    let this_build = concat!("ctrlog ", env!("CARGO_PKG_VERSION"));
    assert!(
        every.iter().all(|s| s["build"] == this_build),
        "each replica names its build: {every:?}"
    );
    let table = stdout_of(&ctrlog(&addrs, &["status", "--all-replicas"]).await);
    assert_eq!(table.lines().count(), 3, "{table}");

    let state = &json_lines(&ctrlog(&addrs, &["state", "--json"]).await)[0];
    assert_eq!(state["offset"], 3);
    assert_eq!(state["next_offset"], 4);
    assert_eq!(state["vocabulary_level"], 1);
    assert!(state["containers"].as_array().unwrap().is_empty());
    assert!(stdout_of(&ctrlog(&addrs, &["state"]).await).contains("as of offset 3"));

    let too_high = ctrlog(&addrs, &["vocabulary", "raise", "--level", "99"]).await;
    assert!(!too_high.status.success());
    assert!(
        String::from_utf8_lossy(&too_high.stderr).contains("upgrade every replica before raising")
    );
    let raised = stdout_of(&ctrlog(&addrs, &["vocabulary", "raise", "--level", "2"]).await);
    assert!(
        raised.contains("vocabulary level 2 recorded at offset 4"),
        "{raised}"
    );
    let shown = stdout_of(&ctrlog(&addrs, &["vocabulary", "show"]).await);
    assert!(shown.starts_with("recorded vocabulary level 2"), "{shown}");
    assert!(shown.contains("desired-containers"));

    let bad_target = ctrlog(
        &addrs,
        &[
            "append",
            "--kind",
            "1",
            "--target",
            "nobody",
            "--payload",
            "x",
        ],
    )
    .await;
    assert!(!bad_target.status.success());
    let no_cluster = ctrlog("", &["status"]).await;
    assert!(!no_cluster.status.success());
    let stderr = String::from_utf8(no_cluster.stderr).unwrap();
    assert_eq!(stderr.lines().count(), 1, "one line: {stderr}");
    assert!(stderr.contains("CTRLOG_CLUSTER"));

    // A replica that does not answer is a row saying so, and the exit code says so too
    // (3d7237e exited 0): 3, it could not be reached, after one try at it.
    let stopped = cluster.follower_of(leader);
    cluster.stop(stopped).await;
    let patient = ["status", "--all-replicas", "--command-timeout", "30s"];
    let said = exits_within(&addrs, &patient, 3).await;
    assert!(said.contains("1 of 3 replicas did not answer"), "{said}");
    let partial = ctrlog(&addrs, &["status", "--all-replicas"]).await;
    let partial = String::from_utf8_lossy(&partial.stdout);
    assert_eq!(
        partial.lines().count(),
        3,
        "every row is printed: {partial}"
    );
    assert_eq!(partial.matches(" error: ").count(), 1, "{partial}");
    cluster.shutdown().await;
}

/// Goal: `ctrlog certs generate` writes a CA and certificates that a TLS cluster accepts, and
/// the client subcommands speak TLS with `--ca`.
/// Steps: generate for replicas 1–3 and a client; start three replicas with those files; run
/// `status` with `--ca` and the client's certificate.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn certs_generate_and_the_client_subcommands_speak_tls() {
    let dir = tempfile::tempdir().unwrap();
    let pki = dir.path().join("pki");
    let generated = ctrlog(
        "",
        &[
            "certs",
            "generate",
            "--out",
            pki.to_str().unwrap(),
            "--nodes",
            "1,2,3",
            "--clients",
            "operator",
        ],
    )
    .await;
    assert!(
        generated.status.success(),
        "{}",
        String::from_utf8_lossy(&generated.stderr)
    );
    for file in [
        "ca.pem",
        "ca-key.pem",
        "node-1.pem",
        "node-3-key.pem",
        "client-operator.pem",
    ] {
        assert!(pki.join(file).is_file(), "{file} was written");
    }
    let key_mode = std::os::unix::fs::PermissionsExt::mode(
        &std::fs::metadata(pki.join("node-1-key.pem"))
            .unwrap()
            .permissions(),
    );
    assert_eq!(key_mode & 0o077, 0, "keys are private to their owner");

    let cluster = LocalCluster::start(&dir.path().join("data"), 3, |c| {
        c.tls = Some(ctrlog::tools::certs::replica_files(&pki, c.id))
    })
    .await
    .unwrap();
    cluster.wait_for_leader(WAIT).await.unwrap();
    let seeds = cluster.client_addrs().join(",");
    let ca = ctrlog::tools::certs::ca_file(&pki);
    let (cert, key) = ctrlog::tools::certs::client_identity(&pki, "operator");
    let served = ctrlog(
        &seeds,
        &[
            "status",
            "--json",
            "--ca",
            ca.to_str().unwrap(),
            "--cert",
            cert.to_str().unwrap(),
            "--key",
            key.to_str().unwrap(),
        ],
    )
    .await;
    assert!(
        served.status.success(),
        "{}",
        String::from_utf8_lossy(&served.stderr)
    );
    assert!(json_lines(&served)[0]["leader_id"].is_u64());

    // A CA the replicas do not use: refused at once, exit code 5 (credentials).
    let elsewhere = dir.path().join("elsewhere");
    let other = ctrlog(
        "",
        &[
            "certs",
            "generate",
            "-o",
            "json",
            "--out",
            elsewhere.to_str().unwrap(),
            "--nodes",
            "1",
        ],
    )
    .await;
    assert!(json_lines(&other)[0]["written"].as_array().unwrap().len() >= 2);
    let wrong_ca = elsewhere.join("ca.pem");
    exits_within(&seeds, &["status", "--ca", wrong_ca.to_str().unwrap()], 5).await;

    // The other mistakes a new user makes fail at once too, each with its exit code, though
    // --command-timeout would let a retrying client try for 30 s (3d7237e did, then exited 3):
    // no --ca against replicas that speak TLS; a client certificate of another CA; a
    // cluster address without a port.
    let patient = ["--command-timeout", "30s"];
    let said = exits_within(&seeds, &[&["status"], &patient[..]].concat(), 5).await;
    assert!(
        said.contains("speaks TLS") && said.contains("--ca"),
        "{said}"
    );
    let (foreign_cert, foreign_key) = ctrlog::tools::certs::client_identity(&elsewhere, "operator");
    ctrlog(
        "",
        &[
            "certs",
            "generate",
            "--force",
            "--out",
            elsewhere.to_str().unwrap(),
            "--nodes",
            "1",
            "--clients",
            "operator",
        ],
    )
    .await;
    let foreign = [
        "status",
        "--ca",
        ca.to_str().unwrap(),
        "--cert",
        foreign_cert.to_str().unwrap(),
        "--key",
        foreign_key.to_str().unwrap(),
    ];
    let said = exits_within(&seeds, &[&foreign[..], &patient[..]].concat(), 5).await;
    assert!(said.contains("refused this client's TLS"), "{said}");
    let without_port = seeds.rsplit_once(':').unwrap().0;
    let said = exits_within(without_port, &[&["status"], &patient[..]].concat(), 2).await;
    assert!(said.contains("is not HOST:PORT"), "{said}");
    cluster.shutdown().await;
}

/// Goal: `force-new-cluster` refuses, by name, a data directory with nothing to recover and
/// leaves it as it was. (tests/cluster.rs recovers a real survivor.)
/// Steps: run it on an empty directory: non-zero exit, one line on stderr naming the
/// directory and saying it holds no log.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn force_new_cluster_refuses_a_directory_without_a_log() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("replica-1");
    let output = ctrlog(
        "",
        &[
            "force-new-cluster",
            "--id",
            "1",
            "--data",
            data.to_str().unwrap(),
        ],
    )
    .await;
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("holds no log"), "{stderr}");
    assert!(stderr.contains(data.to_str().unwrap()), "{stderr}");
    assert!(!data.exists(), "nothing was created");
}

/// Goal: a replica whose port is taken says which port and address, and leaves its data
/// directory untouched: ports are bound before storage opens. 3d7237e said "Address already in
/// use (os error 98)" alone, after initialising the directory.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_port_in_use_is_named_and_nothing_is_initialised() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let taken_addr = taken.local_addr().unwrap().to_string();
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("replica");
    let data_dir = data.display().to_string();
    let serve = ctrlog(
        "",
        &[
            "serve",
            "--id",
            "1",
            "--peer-addr",
            "127.0.0.1:0",
            "--client-addr",
            &taken_addr,
            "--data",
            &data_dir,
        ],
    )
    .await;
    assert!(!serve.status.success());
    let said = String::from_utf8_lossy(&serve.stderr);
    assert!(
        said.contains(&format!("binding the client port {taken_addr}")),
        "{said}"
    );
    assert_said_once(&said);
    assert!(
        !data.exists() || std::fs::read_dir(&data).unwrap().next().is_none(),
        "the data directory was initialised"
    );
}

/// Goal: a data directory is its replica's: `serve --id 2` on replica 3's directory exits
/// naming both, and `serve --id 2` with node 1's certificate exits naming whose it is, each
/// before the directory is touched. 3d7237e accepted both: the first stood for election as
/// replica 2 with node 3's log and vote; the second started, and only its peers refused it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_refuses_another_nodes_directory_and_certificate() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("replica-3");
    let data_dir = data.display().to_string();
    let serve = |id: &str, data_dir: &str, tls: &[String]| {
        let mut command = tokio::process::Command::new(env!("CARGO_BIN_EXE_ctrlog"));
        command
            .args(["serve", "--id", id, "--peer-addr", "127.0.0.1:0"])
            .args(["--client-addr", "127.0.0.1:0", "--data", data_dir])
            .args(tls)
            .env("RUST_LOG", "off")
            .kill_on_drop(true);
        command
    };
    let mut replica_3 = serve("3", &data_dir, &[]).spawn().unwrap();
    poll_until(
        "replica 3 to claim its directory",
        WAIT,
        POLL_INTERVAL,
        || {
            let format = data.join("format");
            async move {
                match std::fs::read_to_string(&format) {
                    Ok(text) if text.contains("node_id = 3") => Ok(()),
                    other => Err(format!("{other:?}")),
                }
            }
        },
    )
    .await
    .unwrap();
    replica_3.kill().await.unwrap();

    let as_2 = tokio::time::timeout(WAIT, serve("2", &data_dir, &[]).output())
        .await
        .expect("refused at once")
        .unwrap();
    let said = String::from_utf8_lossy(&as_2.stderr);
    assert!(!as_2.status.success(), "{said}");
    assert!(
        said.contains("replica 3's") && said.contains("--id 2"),
        "{said}"
    );
    assert_said_once(&said);

    let pki = dir.path().join("pki");
    let generated = ctrlog(
        "",
        &[
            "certs",
            "generate",
            "--out",
            pki.to_str().unwrap(),
            "--nodes",
            "1,2",
        ],
    )
    .await;
    assert!(generated.status.success());
    let node_1 = ctrlog::tools::certs::replica_files(&pki, 1);
    let tls = vec![
        "--tls-ca".to_string(),
        node_1.ca_file.display().to_string(),
        "--tls-cert".to_string(),
        node_1.cert_file.display().to_string(),
        "--tls-key".to_string(),
        node_1.key_file.display().to_string(),
    ];
    let fresh = dir.path().join("replica-2");
    let with_1s = serve("2", &fresh.display().to_string(), &tls).output();
    let with_1s = tokio::time::timeout(WAIT, with_1s)
        .await
        .expect("refused at once")
        .unwrap();
    let said = String::from_utf8_lossy(&with_1s.stderr);
    assert!(!with_1s.status.success(), "{said}");
    assert!(
        said.contains("is node-1's") && said.contains("node-2 (--id 2)"),
        "{said}"
    );
    assert!(!fresh.exists(), "nothing was created: {said}");
}

/// Goal: a flag that looks like TLS but is not is refused, never silently plaintext. Steps:
/// `serve` given the client's `--ca/--cert/--key` (its own are `--tls-*`) exits 2 naming the
/// flag, before opening anything, since only the client subcommands take the client flags;
/// `certs generate --help` lists none of them; a client given `--cert/--key` without `--ca`
/// exits 1 saying it needs `--ca`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn flags_that_look_like_tls_but_are_not_are_refused() {
    let data = tempfile::tempdir().unwrap();
    let data_dir = data.path().join("replica").display().to_string();
    let serve = ctrlog(
        "",
        &[
            "serve", "--id", "1", "--data", &data_dir, "--ca", "ca.pem", "--cert", "n.pem",
            "--key", "k.pem",
        ],
    )
    .await;
    assert_eq!(serve.status.code(), Some(2));
    let said = String::from_utf8_lossy(&serve.stderr);
    assert!(said.contains("unexpected argument '--ca'"), "{said}");
    assert!(
        !data.path().join("replica").exists(),
        "the replica did not start"
    );
    let help = ctrlog("", &["certs", "generate", "--help"]).await;
    let help = stdout_of(&help);
    assert!(
        help.contains("--days") && !help.contains("--cluster"),
        "{help}"
    );
    let help = ctrlog("", &["members", "list", "--help"]).await;
    let help = stdout_of(&help);
    assert!(
        help.contains("Connecting to the cluster:\n      --cluster"),
        "{help}"
    );

    let half = ctrlog(
        "127.0.0.1:1",
        &["status", "--cert", "c.pem", "--key", "k.pem"],
    )
    .await;
    assert_eq!(half.status.code(), Some(1));
    let said = String::from_utf8_lossy(&half.stderr);
    assert!(said.contains("need --ca"), "{said}");
}

/// Goal: `ctrlog tokens hash` turns a v0.1.0 tokens file into one that holds no token, line
/// for line, comments kept (the replica accepting it is `auth.rs`'s unit test).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_hash_replaces_every_plaintext_token() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("tokens");
    std::fs::write(&file, "# roles\nsecret-token-0123456789 operator\n").unwrap();
    let output = ctrlog("", &["tokens", "hash", &file.display().to_string()]).await;
    let hashed = stdout_of(&output);
    assert!(!hashed.contains("secret-token"), "{hashed}");
    let lines: Vec<&str> = hashed.lines().collect();
    assert_eq!(lines[0], "# roles");
    assert!(
        lines[1].starts_with("sha256:") && lines[1].ends_with(" operator"),
        "{hashed}"
    );
}

/// The first line `ctrlog serve` logs with `flags`, its stderr a pipe (as a log file is).
async fn first_log_line(flags: &[&str]) -> String {
    use tokio::io::AsyncBufReadExt;
    let data = tempfile::tempdir().unwrap();
    let mut command = tokio::process::Command::new(env!("CARGO_BIN_EXE_ctrlog"));
    command
        .args(flags)
        .args(["serve", "--id", "1", "--peer-addr", "127.0.0.1:0"])
        .args(["--client-addr", "127.0.0.1:0", "--data"])
        .arg(data.path())
        .env("RUST_LOG", "info")
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true);
    let mut replica = command.spawn().unwrap();
    let stderr = replica.stderr.take().unwrap();
    let mut lines = tokio::io::BufReader::new(stderr).lines();
    tokio::time::timeout(WAIT, lines.next_line())
        .await
        .expect("the replica logged")
        .unwrap()
        .expect("a line")
}

/// Goal: logs written to a pipe or file carry no colour codes, and `--log-format json`
/// writes one JSON object per line for a log shipper.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn logs_are_plain_in_a_file_and_json_on_request() {
    let text = first_log_line(&[]).await;
    assert!(!text.contains('\u{1b}'), "escape codes in {text:?}");
    let json: Value = serde_json::from_str(&first_log_line(&["--log-format", "json"]).await)
        .expect("a JSON object per line");
    assert!(
        json["level"].is_string() && json["fields"].is_object(),
        "{json}"
    );
}

/// Goal: every subcommand that prints speaks `-o json` (one JSON object per line), and a
/// script can tell failures apart by exit code, as `ctrlog --help` documents: 2 bad
/// arguments, 3 gave up (no replica answered within `--command-timeout`), 4 refused by the
/// cluster. (5, credentials, is in the TLS test above.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn printing_subcommands_speak_json_and_failures_have_their_own_exit_codes() {
    let dir = tempfile::tempdir().unwrap();
    let cluster = LocalCluster::start(dir.path(), 1, |_| {}).await.unwrap();
    cluster.wait_for_leader(WAIT).await.unwrap();
    let addrs = cluster.client_addrs().join(",");
    let json = |args: &'static [&'static str]| {
        let addrs = addrs.clone();
        async move {
            let mut with_output = args.to_vec();
            with_output.extend(["-o", "json"]);
            let lines = json_lines(&ctrlog(&addrs, &with_output).await);
            assert!(!lines.is_empty(), "{args:?} printed nothing");
            lines[0].clone()
        }
    };
    // Offset 1 is the new cluster's level raise.
    let ack = json(&["append", "--kind", "custom:1", "--payload", "x"]).await;
    assert_eq!(ack["offset"], 2);
    assert_eq!(json(&["tail", "--max", "1"]).await["offset"], 1);
    assert_eq!(json(&["status"]).await["id"], 1);
    assert_eq!(json(&["state"]).await["offset"], 2);
    assert!(json(&["snapshot"]).await["snapshot_offset"].is_u64());
    let shown = json(&["vocabulary", "show"]).await;
    assert_eq!(shown["level"], vocabulary::LEVEL_MAX);
    assert!(shown["kinds"]
        .as_array()
        .unwrap()
        .iter()
        .any(|k| k["name"] == "schema-change"));
    let refused = exits_within(&addrs, &["vocabulary", "raise", "--level", "2"], 4).await;
    assert!(refused.contains("2 does not raise it"), "{refused}");
    let members = json(&["members", "list"]).await;
    assert_eq!(members["leader_id"], 1);
    assert_eq!(members["members"][0]["leader"], true);
    assert_eq!(
        members["members"][0]["build"],
        concat!("ctrlog ", env!("CARGO_PKG_VERSION")),
        "each member's build, for a rolling upgrade"
    );
    let legacy = json_lines(&ctrlog(&addrs, &["status", "--json"]).await);
    assert_eq!(legacy[0]["id"], 1, "v0.1.0's --json still works");
    let before = json_lines(&ctrlog("", &["--cluster", &addrs, "status", "--json"]).await);
    assert_eq!(
        before[0]["id"], 1,
        "v0.1.0's flags before the subcommand still work"
    );
    exits_within(
        "",
        &[
            "--ca", "ca.pem", "certs", "generate", "--out", "x", "--nodes", "1",
        ],
        2,
    )
    .await;

    exits_within("", &["status"], 2).await; // no cluster given
    exits_within(&addrs, &["status", "--dial-timeout", "0s"], 2).await;
    exits_within("127.0.0.1:1", &["status", "--command-timeout", "1s"], 3).await;
    let not_a_registration = [
        "append",
        "--kind",
        "register-container",
        "--payload",
        "not a registration",
    ];
    exits_within(&addrs, &not_a_registration, 4).await;

    // A replica that accepts connections and never answers (a hung process) costs one
    // --dial-timeout before the next seed is tried, not the --command-timeout.
    let never_answers = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let hung = never_answers.local_addr().unwrap();
    let past_the_hung = format!("{hung},{hung},{hung},{addrs}");
    let started = std::time::Instant::now();
    let answered = ctrlog(
        &past_the_hung,
        &[
            "status",
            "--dial-timeout",
            "300ms",
            "--command-timeout",
            "30s",
        ],
    )
    .await;
    assert!(answered.status.success());
    assert!(
        started.elapsed() < std::time::Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );

    // A payload no replica accepts is refused at once, exit 4, without being read: this one
    // is a sparse file of 1 TiB, which reading whole would not survive.
    let huge = dir.path().join("huge");
    std::fs::File::create(&huge)
        .unwrap()
        .set_len(1 << 40)
        .unwrap();
    let append_huge = ["append", "--kind", "custom:1", "--payload-file"];
    let said = exits_within(
        &addrs,
        &[&append_huge[..], &[huge.to_str().unwrap()]].concat(),
        4,
    )
    .await;
    assert!(said.contains("exceeds the 4194304-byte limit"), "{said}");
    cluster.shutdown().await;
}

/// The subject alternative names of the certificate in `path`, and the days it has left.
fn names_and_days_left(path: &std::path::Path) -> (Vec<String>, i64) {
    use x509_parser::extensions::GeneralName;
    let pem = std::fs::read(path).unwrap();
    let (_, pem) = x509_parser::pem::parse_x509_pem(&pem).unwrap();
    let cert = pem.parse_x509().unwrap();
    let names = (cert
        .subject_alternative_name()
        .unwrap()
        .unwrap()
        .value
        .general_names
        .iter())
    .map(|name| match name {
        GeneralName::DNSName(dns) => dns.to_string(),
        GeneralName::IPAddress(ip) => format!("{ip:?}"),
        other => format!("{other:?}"),
    })
    .collect();
    let left =
        cert.validity().not_after.timestamp() - time::OffsetDateTime::now_utc().unix_timestamp();
    (names, left / 86_400)
}

/// Goal: leaves are issued and renewed under the cluster's own CA, as an operator rotates
/// short-lived certificates, on a secure cluster of `ctrlog serve` processes. Steps: `certs
/// issue --client ops` adds a leaf (and refuses to replace it, naming `renew`); `certs renew
/// --days 20` gives every leaf a fresh key and certificate with the same names, valid 20
/// days, and leaves the CA as it was; each replica restarted in turn on its renewed files
/// serves `status --all-replicas` to the renewed admin certificate. 3d7237e had only `certs
/// generate --force`, which replaces the CA and so every certificate at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn certificates_are_issued_and_renewed_under_the_clusters_ca() {
    use ctrlog::tools::cluster::ProcessCluster;
    let mut cluster = ProcessCluster::start_secure(common::replica_exe(), 3, "", false, &[])
        .await
        .unwrap();
    let pki = cluster.pki().unwrap().to_path_buf();
    let dir = pki.display().to_string();
    let read = |file: &str| std::fs::read(pki.join(file)).unwrap();

    let issued = ctrlog(
        "",
        &[
            "certs", "issue", "--dir", &dir, "--client", "ops", "--days", "10",
        ],
    )
    .await;
    assert!(stdout_of(&issued).contains("client-ops.pem"));
    let (names, days) = names_and_days_left(&pki.join("client-ops.pem"));
    assert_eq!(names, ["client-ops"]);
    assert!((9..=10).contains(&days), "valid 10 days: {days} left");
    let again = ctrlog("", &["certs", "issue", "--dir", &dir, "--client", "ops"]).await;
    let said = String::from_utf8_lossy(&again.stderr);
    assert!(
        !again.status.success() && said.contains("certs renew"),
        "{said}"
    );

    let (ca, node_1, node_1_key) = (read("ca.pem"), read("node-1.pem"), read("node-1-key.pem"));
    let renewed = ctrlog("", &["certs", "renew", "--dir", &dir, "--days", "20"]).await;
    let renewed = stdout_of(&renewed);
    for leaf in [
        "node-1.pem",
        "node-3.pem",
        "client-admin.pem",
        "client-ops.pem",
    ] {
        assert!(renewed.contains(leaf), "{leaf} renewed: {renewed}");
    }
    assert_eq!(read("ca.pem"), ca, "the CA is unchanged");
    assert_ne!(read("node-1.pem"), node_1);
    assert_ne!(read("node-1-key.pem"), node_1_key, "a fresh key");
    let (names, days) = names_and_days_left(&pki.join("node-1.pem"));
    assert!((19..=20).contains(&days), "valid 20 days: {days} left");
    assert_eq!(names, ["node-1", "[127, 0, 0, 1]"], "the same names");

    for i in 0..3 {
        cluster.restart(i).unwrap();
        poll_until(
            "the restarted replica to serve",
            WAIT,
            POLL_INTERVAL,
            || {
                let leader = cluster.leader_index();
                async move { leader.await.map_err(|e| e.to_string()) }
            },
        )
        .await
        .unwrap();
    }
    let (cert, key) = ctrlog::tools::certs::client_identity(&pki, "admin");
    let ca_file = ctrlog::tools::certs::ca_file(&pki);
    let seeds = cluster.client_addrs().join(",");
    let (ca_file, cert, key) = (
        ca_file.to_str().unwrap(),
        cert.to_str().unwrap(),
        key.to_str().unwrap(),
    );
    let args = [
        "--ca",
        ca_file,
        "--cert",
        cert,
        "--key",
        key,
        "status",
        "--all-replicas",
    ];
    let rows = poll_until(
        "every replica to answer the renewed admin",
        WAIT,
        POLL_INTERVAL,
        || {
            let status = ctrlog(&seeds, &args);
            async move {
                let status = status.await;
                match status.status.success() {
                    true => Ok(String::from_utf8_lossy(&status.stdout).into_owned()),
                    false => Err(String::from_utf8_lossy(&status.stderr).into_owned()),
                }
            }
        },
    )
    .await
    .unwrap();
    assert_eq!(rows.matches("Leader").count(), 1, "{rows}");
}

/// Goal: `state --consistent` holds every write acknowledged before it started, asked through
/// a follower (the leader confirms it leads with a quorum and names its applied offset), and
/// refuses where no quorum can confirm a leader: with the other two replicas stopped, the
/// follower left still answers a plain `state` from what it holds, and `--consistent` exits
/// 3. 3d7237e had no such read.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_consistent_state_holds_every_acknowledged_write_and_needs_a_quorum() {
    let dir = tempfile::tempdir().unwrap();
    let mut cluster = LocalCluster::start(dir.path(), 3, |_| {}).await.unwrap();
    let leader = cluster.wait_for_leader(WAIT).await.unwrap();
    let follower = cluster.follower_of(leader);
    let client = ctrlog::client::ControlClient::connect(&cluster.client_addrs())
        .await
        .unwrap();
    let mut acknowledged = 0;
    for n in 0..3u8 {
        let command = ctrlog::log::Command::custom(1, 1, vec![n]);
        acknowledged = client.append(command).await.unwrap().offset;
    }
    let through = cluster.replica(follower).client_addr().to_string();
    let state = ctrlog(&through, &["state", "--consistent", "-o", "json"]).await;
    let offset = json_lines(&state)[0]["offset"].as_u64().unwrap();
    assert!(offset >= acknowledged, "{offset} < {acknowledged}");

    for id in cluster.running_ids() {
        if id != follower {
            cluster.stop(id).await;
        }
    }
    let plain = ctrlog(&through, &["state", "-o", "json"]).await;
    assert_eq!(json_lines(&plain)[0]["offset"].as_u64(), Some(offset));
    let args = ["state", "--consistent", "--command-timeout", "2s"];
    let said = exits_within(&through, &args, 3).await;
    assert!(said.contains("gave up"), "{said}");
}

/// Goal: `bench` never loads a cluster it was not told to by name: with `CTRLOG_CLUSTER` set
/// (as for day-to-day commands against a real job) and no `--cluster`, `bench append` exits 2
/// at once saying how to name one, and the cluster receives nothing of it. 3d7237e sent a real
/// job's containers 1,040 commands.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bench_refuses_a_cluster_it_was_not_given_by_name() {
    let dir = tempfile::tempdir().unwrap();
    let cluster = LocalCluster::start(dir.path(), 1, |_| {}).await.unwrap();
    cluster.wait_for_leader(WAIT).await.unwrap();
    let seeds = cluster.client_addrs().join(",");
    let args = ["bench", "append", "--clients", "1", "--duration-s", "1"];
    let said = exits_within(&seeds, &args, 2).await;
    assert!(
        said.contains("--cluster") && said.contains("CTRLOG_CLUSTER"),
        "{said}"
    );
    // The leader of a new log raises its vocabulary level on its own, at offset 1, whenever
    // its first entry commits: that raise is the only command the log may hold.
    let tail = ctrlog(&seeds, &["tail", "--from", "1", "--json"]).await;
    let appended: Vec<_> = json_lines(&tail)
        .into_iter()
        .filter(|command| command["kind_name"] != "set-vocabulary-level")
        .collect();
    assert!(appended.is_empty(), "the bench appended {appended:?}");
}

/// Goal: `tail` reads as the status page does: a built-in command as what it does (text and
/// JSON's `summary`), every kind by name (`kind_name`), and a producer id above 2^53 exact
/// as text in `producer_id` beside v0.1.0's integer `producer`. 3d7237e printed a built-in
/// command's encoding as an escaped string, and only the integer, which jq rounds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tail_reads_built_in_commands_and_exact_producer_ids() {
    use ctrlog::log::{Command, ContainerId, ProducerSeq, Proposal, RegisterContainer, Target};
    let dir = tempfile::tempdir().unwrap();
    let cluster = LocalCluster::start(dir.path(), 1, |_| {}).await.unwrap();
    cluster.wait_for_leader(WAIT).await.unwrap();
    let client = ctrlog::client::ControlClient::connect(&cluster.client_addrs())
        .await
        .unwrap();
    let register = Command::RegisterContainer(RegisterContainer {
        container: ContainerId::new("c1").unwrap(),
        location: "host-a".into(),
    });
    client.append(register).await.unwrap();
    let producer = (1u64 << 53) + 1;
    let custom = Proposal {
        producer: Some(ProducerSeq { producer, seq: 1 }),
        target: Target::All,
        frame: Command::custom(1, 1, b"start task 0".to_vec()).into_frame(),
    };
    client.append_proposal(custom).await.unwrap();

    let seeds = cluster.client_addrs().join(",");
    let text = stdout_of(&ctrlog(&seeds, &["tail", "--from", "1", "--max", "3"]).await);
    let lines: Vec<&str> = text.lines().collect();
    assert!(
        lines[0].contains("set-vocabulary-level v1")
            && lines[0].contains(&format!("vocabulary level {}", vocabulary::LEVEL_MAX)),
        "a new cluster's first command is its level raise: {text}"
    );
    // A container's epoch is its registration's offset.
    assert!(
        lines[1].contains("register-container v1") && lines[1].contains("register c1 (epoch 2)"),
        "{text}"
    );
    assert!(
        lines[2].contains("custom:1 v1") && lines[2].contains("\"start task 0\""),
        "{text}"
    );
    let json =
        json_lines(&ctrlog(&seeds, &["tail", "--from", "2", "--max", "2", "-o", "json"]).await);
    assert_eq!(json[0]["kind_name"], "register-container");
    assert_eq!(json[0]["summary"], "register c1 (epoch 2)");
    assert_eq!(json[1]["kind_name"], "custom:1");
    assert_eq!(
        json[1]["summary"],
        Value::Null,
        "a custom command is its payload"
    );
    assert_eq!(json[1]["producer_id"], producer.to_string());
    assert_eq!(
        json[1]["producer"].as_u64(),
        Some(producer),
        "v0.1.0's field kept"
    );
}

/// Goal: an operator broadcasts a schema or a configuration change from the CLI, and the job
/// state records it; a key the cluster marks secret is refused (exit 4) before it enters the
/// log, and a schema file over the limit is refused unread. 3d7237e's only way, `append
/// --kind schema-change`, was refused ("value exceeds the 7-byte decode limit").
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn schema_and_config_changes_are_broadcast_from_the_cli() {
    let dir = tempfile::tempdir().unwrap();
    let cluster = LocalCluster::start(dir.path(), 1, |_| {}).await.unwrap();
    cluster.wait_for_leader(WAIT).await.unwrap();
    let seeds = cluster.client_addrs().join(",");
    let schema = dir.path().join("orders.avsc");
    std::fs::write(&schema, r#"{"type": "record", "name": "Order"}"#).unwrap();
    let file = schema.to_str().unwrap();
    let sent = ctrlog(&seeds, &["broadcast", "schema", "orders", "--file", file]).await;
    assert_eq!(
        stdout_of(&sent).trim(),
        "2",
        "after the new cluster's level raise"
    );
    let args = [
        "broadcast",
        "config",
        "batch.size=100",
        "linger.ms=5",
        "-o",
        "json",
    ];
    assert_eq!(json_lines(&ctrlog(&seeds, &args).await)[0]["offset"], 3);

    let said = exits_within(&seeds, &["broadcast", "config", "db.password=hunter2"], 4).await;
    assert!(said.contains("db.password"), "{said}");
    let huge = dir.path().join("huge.avsc");
    std::fs::File::create(&huge)
        .unwrap()
        .set_len(1 << 40)
        .unwrap();
    let args = [
        "broadcast",
        "schema",
        "big",
        "--file",
        huge.to_str().unwrap(),
    ];
    exits_within(&seeds, &args, 4).await;

    let state = json_lines(&ctrlog(&seeds, &["state", "-o", "json"]).await);
    assert_eq!(state[0]["schemas"][0]["subject"], "orders");
    assert_eq!(
        state[0]["schemas"][0]["schema"],
        r#"{"type": "record", "name": "Order"}"#
    );
    assert_eq!(state[0]["config"]["batch.size"], "100");
    assert_eq!(state[0]["config"]["linger.ms"], "5");
    assert_eq!(state[0]["config"].get("db.password"), None);
}

/// Goal: Ctrl-C during `bench` stops the replicas it started and removes their folder, and
/// exits 130. Steps: `bench append` with its temporary folders under a folder of the test's
/// own; once its three replicas run, SIGINT. 3d7237e died at once and left the replicas
/// running and the folder behind.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_interrupted_bench_leaves_no_replica_and_no_folder() {
    use ctrlog::tools::cluster::processes_mentioning;
    let tmp = tempfile::tempdir().unwrap();
    let mut bench = tokio::process::Command::new(env!("CARGO_BIN_EXE_ctrlog"))
        .args(["bench", "append", "--clients", "1", "--duration-s", "60"])
        .env("TMPDIR", tmp.path())
        .env_remove("CTRLOG_CLUSTER")
        .env("RUST_LOG", "off")
        .stdout(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    poll_until("bench's three replicas", WAIT, POLL_INTERVAL, || {
        let running = processes_mentioning(tmp.path()).len();
        async move { (running >= 3).then_some(()).ok_or(running) }
    })
    .await
    .unwrap();
    // SAFETY: kill(2) on the child this test spawned; no memory is involved.
    unsafe { libc::kill(bench.id().unwrap() as libc::pid_t, libc::SIGINT) };
    let status = tokio::time::timeout(WAIT, bench.wait())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(status.code(), Some(130));
    assert_eq!(
        processes_mentioning(tmp.path()),
        Vec::<libc::pid_t>::new(),
        "no replica left"
    );
    let left: Vec<_> = std::fs::read_dir(tmp.path()).unwrap().collect();
    assert!(left.is_empty(), "folders left: {left:?}");
}

/// Goal: `ctrlog members transfer-leader --to N` moves the leadership to voter N with one
/// election, under a steady append load that loses no append; a replica that is not a voter
/// is refused (exit 4). 3d7237e had no such command: the only way was to stop the leader.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leadership_is_transferred_to_the_voter_named() {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;
    let dir = tempfile::tempdir().unwrap();
    let cluster = LocalCluster::start(dir.path(), 3, |_| {}).await.unwrap();
    let leader = cluster.wait_for_leader(WAIT).await.unwrap();
    let to = cluster.follower_of(leader);
    let client = ctrlog::client::ControlClient::connect(&cluster.client_addrs())
        .await
        .unwrap();
    let term_before = client.leader_status().await.unwrap().term;
    let stop = Arc::new(AtomicBool::new(false));
    let load = tokio::spawn({
        let (client, stop) = (client.clone(), stop.clone());
        async move {
            let (mut appended, mut failed) = (0, Vec::new());
            while !stop.load(Ordering::Relaxed) {
                match client
                    .append(ctrlog::log::Command::custom(1, 1, vec![1]))
                    .await
                {
                    Ok(_) => appended += 1,
                    Err(error) => failed.push(error.to_string()),
                }
            }
            (appended, failed)
        }
    });
    let seeds = cluster.client_addrs().join(",");
    let to_text = to.to_string();
    let args = ["members", "transfer-leader", "--to", &to_text, "-o", "json"];
    let moved = json_lines(&ctrlog(&seeds, &args).await);
    assert_eq!(moved[0]["leader"], to);
    stop.store(true, Ordering::Relaxed);
    let (appended, failed) = load.await.unwrap();
    assert!(
        failed.is_empty() && appended > 0,
        "{appended} appended, failed: {failed:?}"
    );
    let status = client.leader_status().await.unwrap();
    assert_eq!(
        (status.leader_id, status.term),
        (Some(to), term_before + 1),
        "one election"
    );

    let said = exits_within(&seeds, &["members", "transfer-leader", "--to", "9"], 4).await;
    assert!(said.contains("not a member"), "{said}");
    let said = exits_within(&seeds, &["members", "transfer-leader", "--to", &to_text], 4).await;
    assert!(said.contains("not another voter"), "{said}");
}
