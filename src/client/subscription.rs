//! [`Subscription`]: the committed log as a stream, resumed across failures.

use std::collections::VecDeque;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use futures::stream::BoxStream;
use futures::Stream;

use super::connection::{state_at, ClientError, Connector, ControlClient};
use crate::jobs::JobState;
use crate::log::{Filter, LogEntry, Offset};
use crate::wire::protocol::{ApiError, FetchRequest, FetchResponse};

/// How long one long poll waits for a new command before the replica answers empty.
pub const LONG_POLL_WAIT: Duration = Duration::from_secs(5);
/// Entries and bytes asked for per fetch.
const FETCH_ENTRIES_MAX: u32 = 4096;
const FETCH_BYTES_MAX: u32 = 8 << 20;

/// One item of a [`Subscription`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SubscriptionItem {
    /// The next committed command that matches the filter.
    Entry(LogEntry),
    /// The subscription's position was compacted away. `state` is the JobState as of
    /// `offset`, which is at or after the last delivered entry and after every append of the
    /// client that made the subscription acknowledged by then (read your writes: a container
    /// never sees a state that lacks its own answers). Replace whatever was built from earlier
    /// entries with it. Entries continue from `offset + 1`.
    Reset {
        /// The job as the log describes it at `offset`.
        state: JobState,
        /// The last offset folded into `state`.
        offset: Offset,
    },
}

/// A stream of the committed commands matching a filter, from an offset.
///
/// Guarantees: entries arrive in strictly increasing offset order, each exactly once, with no
/// gap the filter does not explain (with [`Filter::Everything`], consecutive offsets); a
/// position that was compacted yields [`SubscriptionItem::Reset`], never a silent skip. The
/// stream reads from any replica over its own connection, resumes from the last delivered
/// offset after a dropped connection or a leader change, and moves away from a replica that
/// has lost the leader.
///
/// An `Err` item (the retry deadline passed with no replica answering, or a replica broke the
/// protocol) does not end the stream: polling again resumes from the same offset.
pub struct Subscription {
    inner: BoxStream<'static, Result<SubscriptionItem, ClientError>>,
}

impl std::fmt::Debug for Subscription {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Where it is lives inside the stream's state, which is not reachable from here.
        f.debug_struct("Subscription").finish_non_exhaustive()
    }
}

struct Cursor {
    connector: Connector,
    linger: Duration,
    filter: Filter,
    /// The offset to fetch from next; everything below it was delivered or filtered out.
    next: Offset,
    /// The highest offset the subscribing client's own appends were acknowledged at.
    own_writes: Arc<AtomicU64>,
    buffered: VecDeque<LogEntry>,
}

impl Subscription {
    pub(crate) fn new(
        connector: Connector,
        own_writes: Arc<AtomicU64>,
        from: Offset,
        filter: Filter,
    ) -> Subscription {
        let cursor = Cursor {
            linger: connector.settings().options.subscription_linger,
            connector,
            filter,
            next: from.max(1),
            own_writes,
            buffered: VecDeque::new(),
        };
        let inner = futures::stream::unfold(cursor, |mut cursor| async move {
            let item = cursor.next_item().await;
            Some((item, cursor))
        });
        Subscription {
            inner: Box::pin(inner),
        }
    }
}

impl Stream for Subscription {
    type Item = Result<SubscriptionItem, ClientError>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        self.inner.as_mut().poll_next(cx)
    }
}

impl Cursor {
    async fn next_item(&mut self) -> Result<SubscriptionItem, ClientError> {
        loop {
            if let Some(entry) = self.buffered.pop_front() {
                return Ok(SubscriptionItem::Entry(entry));
            }
            let request = FetchRequest {
                from: self.next,
                entries_max: FETCH_ENTRIES_MAX,
                bytes_max: FETCH_BYTES_MAX,
                max_wait_ms: LONG_POLL_WAIT.as_millis() as u32,
                linger_ms: self.linger.as_millis() as u32,
                filter: self.filter.clone(),
            };
            let answer = self
                .connector
                .call(false, |rpc, mut ctx, addr| {
                    let request = request.clone();
                    ctx.deadline += LONG_POLL_WAIT;
                    async move {
                        let answer = rpc.fetch(ctx, request.clone()).await?;
                        Ok(answer.map(|response| (response, addr)))
                    }
                })
                .await;
            match answer {
                Ok((response, replica)) => {
                    check_response(&request, &response)
                        .map_err(|detail| ClientError::Protocol { replica, detail })?;
                    self.next = response.next_offset;
                    self.buffered.extend(response.entries);
                }
                Err(ClientError::Api(ApiError::Compacted { .. })) => {
                    // The state must cover at least what was delivered, so that the reset
                    // never moves the reader backwards, and this client's own acknowledged
                    // appends, which its filter may not show it (a container's answers go to
                    // the coordinator): a lagging replica's older state would still show them
                    // owed, and the container would answer twice.
                    let own = self.own_writes.load(Ordering::Acquire);
                    let at = state_at(&self.connector, (self.next - 1).max(own)).await?;
                    self.next = at.offset + 1;
                    return Ok(SubscriptionItem::Reset {
                        state: std::sync::Arc::unwrap_or_clone(at.state),
                        offset: at.offset,
                    });
                }
                Err(error) => return Err(error),
            }
        }
    }
}

/// Checks an answer against the guarantees the stream makes, so that a faulty replica is
/// reported rather than believed.
fn check_response(request: &FetchRequest, response: &FetchResponse) -> Result<(), String> {
    let mut expected = request.from;
    for entry in &response.entries {
        let fits = match request.filter {
            Filter::Everything => entry.offset == expected,
            Filter::Container(_) => entry.offset >= expected,
        };
        if !fits || !request.filter.matches(&entry.target) {
            return Err(format!(
                "entry at offset {} (target {}) where offset {expected} or later matching {} was due",
                entry.offset, entry.target, request.filter
            ));
        }
        expected = entry.offset + 1;
    }
    if response.next_offset < expected {
        return Err(format!(
            "next offset {} is below {expected}",
            response.next_offset
        ));
    }
    if request.filter == Filter::Everything && response.next_offset != expected {
        return Err(format!(
            "unfiltered fetch skipped from {expected} to {}",
            response.next_offset
        ));
    }
    Ok(())
}

/// Subscribing lives beside the subscription, so that the connection (`connection.rs`) does
/// not depend on the stream built on top of it.
impl ControlClient {
    /// Every committed command matching `filter` from offset `from` on, in offset order,
    /// exactly once, across reconnects and leader changes. See [`Subscription`].
    pub fn subscribe(&self, from: Offset, filter: Filter) -> Subscription {
        Subscription::new(
            Connector::new(self.connector.settings().clone()),
            self.own_writes.clone(),
            from,
            filter,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::log::{Command, ContainerId, Target};

    fn entry(offset: Offset, target: Target) -> LogEntry {
        LogEntry {
            offset,
            term: 1,
            appended_at_ms: 0,
            producer: None,
            target,
            frame: Command::custom(1, 1, vec![]).into_frame(),
        }
    }

    fn response(entries: Vec<LogEntry>, next_offset: Offset) -> FetchResponse {
        FetchResponse {
            entries,
            next_offset,
            applied_offset: 100,
        }
    }

    #[test]
    fn gaps_and_foreign_entries_are_protocol_violations() {
        let everything = FetchRequest::from(5);
        let consecutive = response(vec![entry(5, Target::All), entry(6, Target::All)], 7);
        assert!(check_response(&everything, &consecutive).is_ok());
        let gap = response(vec![entry(5, Target::All), entry(7, Target::All)], 8);
        assert!(check_response(&everything, &gap).is_err());
        let skip = response(vec![], 9);
        assert!(check_response(&everything, &skip).is_err());

        let me = ContainerId::new("a").unwrap();
        let mine = FetchRequest {
            filter: Filter::Container(me.clone()),
            ..FetchRequest::from(5)
        };
        let filtered = response(vec![entry(7, Target::Container(me))], 12);
        assert!(check_response(&mine, &filtered).is_ok());
        let foreign = response(vec![entry(7, Target::Coordinator)], 8);
        assert!(check_response(&mine, &foreign).is_err());
        let backwards = response(vec![entry(4, Target::All)], 5);
        assert!(check_response(&mine, &backwards).is_err());
    }
}
