//! `ctrlog demo`, the README's first command, runs its whole scenario and its invariants hold,
//! in this process and (`--serve`) on three `ctrlog serve` processes.

use std::time::Duration;

/// Goal: the demo works from a clean build and leaves nothing behind.
/// Steps: run the binary's `demo`; it must exit 0 having printed the timeline, the summary and
/// the invariant check, and no `ctrlog container` process it started may outlive it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_demo_runs_its_scenario_and_its_invariants_hold() {
    // The secure path is the demo's path: TLS everywhere, containers with tokens.
    run_demo(&[], "TLS on both ports").await;
}

/// Goal: the same story runs on `ctrlog serve` processes whose only job configuration is the
/// `[job]` section of their file, and leaves nothing behind either: the containers the killed
/// leader launched outlive it and are ended with the demo.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_demo_runs_on_serve_processes() {
    run_demo(&["--serve"], "`ctrlog serve` processes").await;
}

async fn run_demo(flags: &[&str], mode: &str) {
    let data = tempfile::tempdir().unwrap();
    let mut command = tokio::process::Command::new(env!("CARGO_BIN_EXE_ctrlog"));
    command
        .arg("demo")
        .args(flags)
        .arg("--data")
        .arg(data.path())
        .kill_on_drop(true);
    let output = tokio::time::timeout(Duration::from_secs(120), command.output())
        .await
        .expect("the demo finished in time")
        .expect("the demo ran");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "demo failed: {stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    for expected in [
        mode,
        "killing the leader",
        "ack: partition-",
        "schema change",
        "== summary",
        "== invariants held",
    ] {
        assert!(
            stdout.contains(expected),
            "missing {expected:?} in:\n{stdout}"
        );
    }
    // Every container process it launched logged into the data directory; none is left.
    let logs = std::fs::read_dir(data.path().join("container-logs"))
        .unwrap()
        .count();
    assert!(logs >= 3, "containers ran as processes ({logs} logs)");
    let survivors = std::process::Command::new("pgrep")
        .args(["-f", &data.path().display().to_string()])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_default();
    assert!(
        survivors.is_empty(),
        "container processes left behind: {survivors}"
    );
}
