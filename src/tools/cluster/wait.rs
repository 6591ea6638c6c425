//! Waiting for a condition that nothing signals (another replica's metrics, a remote status,
//! a report), with a deadline: the one polling loop the tools and the tests share.
//!
//! Where a signal exists, wait on it instead (a `watch` of the applied offset, openraft's
//! metrics): polling only bounds how late a change is seen.

use std::fmt::Display;
use std::future::Future;
use std::time::Duration;

use tokio::time::Instant;

use crate::client::ControlClient;
use crate::jobs::JobState;
use crate::tools::admin::render::state_text;

/// How often the tools and tests re-check a condition by default: often enough that a wait
/// ends within a few milliseconds of its condition, rarely enough to cost nothing.
pub const POLL_INTERVAL: Duration = Duration::from_millis(20);

/// A wait that ran out of time, saying for what and what was seen last.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct WaitError(pub String);

/// Runs `probe` every `every` until it returns `Ok`, and returns that value. After `timeout`
/// it fails, naming `what` and the last `Err` the probe gave (why it was not there yet).
///
/// Runs on tokio's clock, so a test on a paused clock waits in virtual time.
pub async fn poll_until<T, E, Fut>(
    what: &str,
    timeout: Duration,
    every: Duration,
    mut probe: impl FnMut() -> Fut,
) -> Result<T, WaitError>
where
    E: Display,
    Fut: Future<Output = Result<T, E>>,
{
    let deadline = Instant::now() + timeout;
    loop {
        let not_yet = match probe().await {
            Ok(value) => return Ok(value),
            Err(not_yet) => not_yet,
        };
        if Instant::now() >= deadline {
            return Err(WaitError(format!(
                "timed out after {timeout:?} waiting for {what}: {not_yet}"
            )));
        }
        tokio::time::sleep(every).await;
    }
}

/// Polls the job state through `client` until `condition` holds, and returns that state.
/// After `timeout` it fails, naming `what` and showing the last state seen as `ctrlog state`
/// prints it. Each look is at a state at least as new as what the leader has applied: any
/// replica may answer, and one that is behind for good (a removed member that never heard of
/// its removal, say) would otherwise show the same old state until the deadline. For clusters
/// in other processes; in this one, `LocalJob::wait_for_state` waits on applies instead.
pub async fn job_state_until(
    client: &ControlClient,
    what: &str,
    timeout: Duration,
    condition: impl Fn(&JobState) -> bool,
) -> Result<JobState, WaitError> {
    poll_until(what, timeout, POLL_INTERVAL, || async {
        let applied = match client.leader_status().await {
            Ok(leader) => leader.applied_offset,
            Err(error) => return Err(error.to_string()),
        };
        match client.state(applied).await {
            Ok(at) if condition(&at.state) => Ok(std::sync::Arc::unwrap_or_clone(at.state)),
            Ok(at) => Err(format!("the state was\n{}", state_text(&at))),
            Err(error) => Err(error.to_string()),
        }
    })
    .await
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A condition that holds on the third look is returned; one that never holds fails
    /// after the timeout with the probe's last word. On a paused clock, so instantly.
    #[tokio::test(start_paused = true)]
    async fn polls_until_the_condition_holds_or_the_deadline_passes() {
        let mut looks = 0;
        let value = poll_until("three looks", Duration::from_secs(1), POLL_INTERVAL, || {
            looks += 1;
            std::future::ready(if looks == 3 {
                Ok(looks)
            } else {
                Err("not yet")
            })
        })
        .await
        .unwrap();
        assert_eq!(value, 3);

        let started = Instant::now();
        let error = poll_until::<(), _, _>("never", Duration::from_secs(1), POLL_INTERVAL, || {
            std::future::ready(Err("still no"))
        })
        .await
        .unwrap_err();
        assert!(started.elapsed() >= Duration::from_secs(1));
        assert!(
            error.0.contains("never") && error.0.contains("still no"),
            "{error}"
        );
    }
}
