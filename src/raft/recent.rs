//! The most recently applied entries, kept in memory and shared by every reader.
//!
//! Subscribers at the head of the log all want the entry that was just applied. Serving it from
//! here costs a lookup and an `Arc` clone instead of a WAL read and a decode per subscriber, so
//! fan-out to many subscribers does not multiply disk reads or CPU. Older entries are read from
//! the WAL as before. The window is bounded in entries and bytes.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use super::types::{payload_bytes, Entry};

/// Entries kept at most.
pub const RECENT_ENTRIES_MAX: usize = 8192;
/// Command bytes kept at most.
pub const RECENT_BYTES_MAX: usize = 64 << 20;

#[derive(Default)]
struct Window {
    /// Consecutive log indices, oldest first.
    entries: VecDeque<(Arc<Entry>, usize)>,
    bytes: usize,
}

impl Window {
    fn first_index(&self) -> Option<u64> {
        self.entries.front().map(|(e, _)| e.log_id.index)
    }
}

/// The window of recently applied entries.
#[derive(Default)]
pub struct RecentEntries {
    window: Mutex<Window>,
}

impl RecentEntries {
    fn lock(&self) -> std::sync::MutexGuard<'_, Window> {
        self.window.lock().expect("never poisoned")
    }

    /// Adds the entry just applied. A gap (after a snapshot install) starts a new window.
    pub fn push(&self, entry: Arc<Entry>) {
        let bytes = payload_bytes(&entry);
        let mut window = self.lock();
        let follows = window
            .entries
            .back()
            .is_none_or(|(last, _)| last.log_id.index + 1 == entry.log_id.index);
        if !follows {
            *window = Window::default();
        }
        window.bytes += bytes;
        window.entries.push_back((entry, bytes));
        while window.entries.len() > RECENT_ENTRIES_MAX || window.bytes > RECENT_BYTES_MAX {
            let Some((_, bytes)) = window.entries.pop_front() else {
                break;
            };
            window.bytes -= bytes;
        }
    }

    /// The entry at `index`, if it is in the window.
    pub fn get(&self, index: u64) -> Option<Arc<Entry>> {
        let window = self.lock();
        let first = window.first_index()?;
        let position = usize::try_from(index.checked_sub(first)?).ok()?;
        window.entries.get(position).map(|(e, _)| e.clone())
    }

    /// Forgets everything (the state machine was replaced by a snapshot).
    pub fn clear(&self) {
        *self.lock() = Window::default();
    }
}
