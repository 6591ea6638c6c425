//! The job model: the control log folded into a [`JobState`].
//!
//! This is the state machine's content and the snapshot's content. It is pure: no openraft,
//! sled or tarpc, no clock, no randomness. `src/raft` feeds it committed batches in log order;
//! the same log therefore yields the same JobState on every replica, in every restart, and in a
//! subscriber that loads a snapshot and replays the tail.
//!
//! Today JobState numbers commands (contiguous offsets, DESIGN.md §4) and de-duplicates
//! idempotent producers. The SAMZA-237 vocabulary (containers, tasks, inputs, handshakes) folds
//! into the same structure.

mod producers;
mod state;

pub use producers::{ProducerTable, PRODUCERS_MAX, PRODUCER_WINDOW};
pub use state::{JobState, Outcome};
