//! Who gets a connection on the observability port. It takes no credential before a request
//! (probes and scrapes send none), so it cannot tell an attacker from a kubelet until a
//! request arrives: 300 connections from one host holding unfinished headers once answered 0
//! of 46 `/healthz` and `/readyz` probes in 25 s, and the liveness probe restarts a replica
//! that does not answer. So:
//!
//! * each source address holds at most [`HTTP_CONNECTIONS_PER_SOURCE_MAX`] connections; one
//!   more is closed as it is accepted;
//! * when the port is full, a new connection closes the connection that has been waiting
//!   longest for a request (unfinished headers, or idle between requests): a connection that
//!   is being answered is never closed, and a probe, which sends its request at once, is the
//!   youngest waiting connection there is. Connections from many sources that never finish a
//!   request are therefore taken down one by one, oldest first, by the probes that need room;
//! * refusals are logged at most once a second per cause, with a count.

use std::collections::{BTreeMap, HashMap};
use std::net::IpAddr;
use std::sync::{Arc, Mutex};

use tokio::task::AbortHandle;
use tokio::time::Instant;

use crate::raft::refusals::Refusals;

/// Connections the observability port holds at once. Probes, scrapes and a few browsers need a
/// handful.
pub const HTTP_CONNECTIONS_MAX: usize = 256;

/// Connections one source address may hold on the observability port: a browser opens six,
/// a Prometheus server one per target, a kubelet one per probe.
pub const HTTP_CONNECTIONS_PER_SOURCE_MAX: usize = 16;

/// The observability port's open connections.
#[derive(Default)]
pub struct HttpConnections {
    inner: Mutex<Table>,
    /// The port's refusal lines, one a second per cause.
    pub refusals: Refusals,
}

#[derive(Default)]
struct Table {
    next_id: u64,
    by_id: BTreeMap<u64, Held>,
    per_source: HashMap<IpAddr, usize>,
}

/// One open connection.
struct Held {
    source: IpAddr,
    /// Since when it has been waiting for a request; `None` while one is being answered.
    waiting_since: Option<Instant>,
    /// Closes it; set once its task is spawned.
    abort: Option<AbortHandle>,
}

/// A connection's place on the port, given back when it drops.
pub struct HttpConnection {
    port: Arc<HttpConnections>,
    id: u64,
}

impl HttpConnections {
    /// Admits a connection from `source`, closing the connection that has waited longest for
    /// a request if the port is full; `None` (logged, once a second per cause) when `source`
    /// holds its share, or every connection is being answered.
    pub fn admit(self: &Arc<Self>, source: IpAddr) -> Option<HttpConnection> {
        let mut table = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        let held = table.per_source.get(&source).copied().unwrap_or(0);
        if held >= HTTP_CONNECTIONS_PER_SOURCE_MAX {
            if let Some(refused) = self.refusals.refused("source share") {
                tracing::warn!(%source, held, refused, "observability connection refused: its source holds its share (one line a second)");
            }
            return None;
        }
        if table.by_id.len() >= HTTP_CONNECTIONS_MAX {
            let longest_waiting = (table.by_id.iter())
                .filter_map(|(id, held)| Some((held.waiting_since?, *id)))
                .min();
            let Some((_, id)) = longest_waiting else {
                if let Some(refused) = self.refusals.refused("port full") {
                    tracing::warn!(%source, refused, "observability connection refused: every connection is being answered (one line a second)");
                }
                return None;
            };
            if let Some(closed) = table.remove(id) {
                if let Some(count) = self.refusals.refused("closed for room") {
                    tracing::warn!(closed = %closed.source, count, "closed the observability connection that waited longest for a request, to make room (one line a second)");
                }
                if let Some(abort) = closed.abort {
                    abort.abort();
                }
            }
        }
        let id = table.next_id;
        table.next_id += 1;
        table.by_id.insert(
            id,
            Held {
                source,
                waiting_since: Some(Instant::now()),
                abort: None,
            },
        );
        *table.per_source.entry(source).or_default() += 1;
        Some(HttpConnection {
            port: self.clone(),
            id,
        })
    }

    /// Connections open now.
    #[cfg(test)]
    fn len(&self) -> usize {
        self.inner
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .by_id
            .len()
    }

    fn update(&self, id: u64, change: impl FnOnce(&mut Held)) {
        let mut table = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(held) = table.by_id.get_mut(&id) {
            change(held);
        }
    }
}

impl Table {
    fn remove(&mut self, id: u64) -> Option<Held> {
        let held = self.by_id.remove(&id)?;
        if let Some(count) = self.per_source.get_mut(&held.source) {
            *count -= 1;
            if *count == 0 {
                self.per_source.remove(&held.source);
            }
        }
        Some(held)
    }
}

impl HttpConnection {
    /// Its task, which closing it aborts.
    pub fn serving(&self, abort: AbortHandle) {
        self.port.update(self.id, |held| held.abort = Some(abort));
    }

    /// A request arrived whole: the connection cannot be closed for room until it is answered.
    pub fn answering(&self) {
        self.port.update(self.id, |held| held.waiting_since = None);
    }

    /// Its request was answered: it waits for the next one.
    pub fn answered(&self) {
        let now = Instant::now();
        self.port
            .update(self.id, |held| held.waiting_since = Some(now));
    }
}

impl Drop for HttpConnection {
    fn drop(&mut self) {
        (self.port.inner.lock().unwrap_or_else(|e| e.into_inner())).remove(self.id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn source(last: u8) -> IpAddr {
        IpAddr::from([127, 0, 0, last])
    }

    /// Goal: one source holds at most its share; a full port makes room by closing the
    /// connection that waited longest for a request, never one being answered; a port whose
    /// every connection is being answered refuses; a dropped connection frees its place.
    #[tokio::test(start_paused = true)]
    async fn a_share_per_source_and_room_made_from_the_longest_waiting() {
        let port = Arc::new(HttpConnections::default());
        let share: Vec<_> = (0..HTTP_CONNECTIONS_PER_SOURCE_MAX)
            .map(|_| port.admit(source(1)).expect("within the share"))
            .collect();
        assert!(port.admit(source(1)).is_none(), "past its share");
        drop(share);
        assert_eq!(port.len(), 0);

        let mut held = Vec::new();
        for i in 0..HTTP_CONNECTIONS_MAX {
            held.push(port.admit(source(2 + (i / 16) as u8)).unwrap());
            tokio::time::advance(std::time::Duration::from_millis(1)).await;
        }
        held[0].answering();
        let probe = port.admit(source(100)).expect("room is made");
        assert_eq!(port.len(), HTTP_CONNECTIONS_MAX);
        let remaining = port.inner.lock().unwrap();
        assert!(
            remaining.by_id.contains_key(&held[0].id),
            "being answered: kept"
        );
        assert!(
            !remaining.by_id.contains_key(&held[1].id),
            "waited longest: closed"
        );
        drop(remaining);
        for connection in &held {
            connection.answering();
        }
        probe.answering();
        assert!(
            port.admit(source(101)).is_none(),
            "every connection is being answered"
        );
        held[5].answered();
        assert!(
            port.admit(source(101)).is_some(),
            "one waits again: it makes room"
        );
    }
}
