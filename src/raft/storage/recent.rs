//! The newest entries of the log, kept in memory and shared by everyone who reads them.
//!
//! Each entry is read again soon after it is written, several times: the leader's replication
//! reads it once per follower, the state machine reads it to apply it, and every subscriber at
//! the head of the log wants it once applied. Serving those from here costs a lookup and an
//! `Arc` clone (an entry's batch is itself behind an `Arc`) instead of a WAL read and a decode
//! each, so neither replication nor fan-out multiplies disk reads or CPU. Older entries are
//! read from the WAL. The window is bounded in entries and bytes.
//!
//! Invariant: every entry in the window is the one the WAL holds at its index. The log store
//! keeps it by changing the window, under its WAL lock, whenever it changes the WAL: an append
//! pushes, a truncation drops the window's end, a purge its start. Readers take only the
//! window's own lock, so they never wait for a WAL write.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use crate::raft::types::{payload_bytes, Entry};

/// Entries kept at most.
pub const RECENT_ENTRIES_MAX: usize = 8192;
/// Command bytes kept at most.
pub const RECENT_BYTES_MAX: usize = 64 << 20;

#[derive(Default)]
struct Window {
    /// Consecutive log indices, oldest first, each with its command bytes.
    entries: VecDeque<(Arc<Entry>, usize)>,
    bytes: usize,
}

impl Window {
    fn first_index(&self) -> Option<u64> {
        self.entries.front().map(|(e, _)| e.log_id.index)
    }

    fn pop_front(&mut self) {
        if let Some((_, bytes)) = self.entries.pop_front() {
            self.bytes -= bytes;
        }
    }

    fn pop_back(&mut self) {
        if let Some((_, bytes)) = self.entries.pop_back() {
            self.bytes -= bytes;
        }
    }
}

/// The window of the newest entries.
#[derive(Default)]
pub struct RecentEntries {
    window: Mutex<Window>,
}

impl RecentEntries {
    fn lock(&self) -> std::sync::MutexGuard<'_, Window> {
        self.window.lock().expect("never poisoned")
    }

    /// Adds entries just written after the last. Entries that do not follow it (the log
    /// continues after a snapshot install) start a new window.
    pub fn push(&self, entries: impl IntoIterator<Item = Arc<Entry>>) {
        let mut window = self.lock();
        for entry in entries {
            let follows = window
                .entries
                .back()
                .is_none_or(|(last, _)| last.log_id.index + 1 == entry.log_id.index);
            if !follows {
                *window = Window::default();
            }
            let bytes = payload_bytes(&entry);
            window.bytes += bytes;
            window.entries.push_back((entry, bytes));
        }
        while window.entries.len() > RECENT_ENTRIES_MAX || window.bytes > RECENT_BYTES_MAX {
            window.pop_front();
        }
    }

    /// The entry at `index`, if it is in the window.
    pub fn get(&self, index: u64) -> Option<Arc<Entry>> {
        let window = self.lock();
        let first = window.first_index()?;
        let position = usize::try_from(index.checked_sub(first)?).ok()?;
        window.entries.get(position).map(|(e, _)| e.clone())
    }

    /// Forgets the entries from `index` on (the log truncated them).
    pub fn truncate_from(&self, index: u64) {
        let mut window = self.lock();
        while window
            .entries
            .back()
            .is_some_and(|(e, _)| e.log_id.index >= index)
        {
            window.pop_back();
        }
    }

    /// Forgets the entries up to `index` (the log purged them).
    pub fn purge_upto(&self, index: u64) {
        let mut window = self.lock();
        while window.first_index().is_some_and(|first| first <= index) {
            window.pop_front();
        }
    }

    /// Forgets everything (the log's write failed part way, so its end is unknown here).
    pub fn clear(&self) {
        *self.lock() = Window::default();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::log::Batch;
    use openraft::{CommittedLeaderId, EntryPayload, LogId};

    fn entry(index: u64) -> Arc<Entry> {
        Arc::new(Entry {
            log_id: LogId::new(CommittedLeaderId::new(1, 1), index),
            payload: EntryPayload::Normal(Arc::new(Batch::default())),
        })
    }

    fn indices(recent: &RecentEntries) -> Vec<u64> {
        let window = recent.lock();
        window.entries.iter().map(|(e, _)| e.log_id.index).collect()
    }

    #[test]
    fn follows_the_logs_appends_truncations_and_purges() {
        let recent = RecentEntries::default();
        recent.push((1..=5).map(entry));
        assert_eq!(recent.get(3).map(|e| e.log_id.index), Some(3));
        assert!(recent.get(0).is_none() && recent.get(6).is_none());

        recent.truncate_from(4);
        assert_eq!(indices(&recent), [1, 2, 3]);
        recent.push([entry(4)]);
        recent.purge_upto(2);
        assert_eq!(indices(&recent), [3, 4]);

        // After a snapshot install the log goes on past a gap: a new window.
        recent.push([entry(9), entry(10)]);
        assert_eq!(indices(&recent), [9, 10]);
        assert!(recent.get(4).is_none());
    }

    #[test]
    fn keeps_at_most_its_entry_bound() {
        let recent = RecentEntries::default();
        let total = RECENT_ENTRIES_MAX as u64 + 10;
        recent.push((1..=total).map(entry));
        assert_eq!(recent.lock().entries.len(), RECENT_ENTRIES_MAX);
        assert!(recent.get(10).is_none());
        assert!(recent.get(11).is_some() && recent.get(total).is_some());
    }
}
