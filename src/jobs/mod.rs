//! The job model: the control log folded into a [`JobState`].
//!
//! This is the state machine's content and the snapshot's content. It is pure: no openraft,
//! sled or tarpc, no clock, no randomness. `src/raft` feeds it committed batches in log order;
//! the same log therefore yields the same JobState on every replica, in every restart, and in a
//! subscriber that loads a snapshot and replays the tail.
//!
//! JobState numbers commands (contiguous offsets), de-duplicates idempotent
//! producers, enforces the vocabulary level, and folds the SAMZA-237 vocabulary into
//! containers and their epochs, tasks and their owners, the input → task map, schemas, config
//! and the handshakes still open. [`Liveness`] is the leader's in-memory heartbeat table.

mod liveness;
mod model;
pub mod plan;
mod producers;
mod rejection;
mod state;

pub use liveness::{Heartbeat, Liveness, ReportedLag};
pub use model::*;
pub use producers::{ProducerTable, Seen, PRODUCERS_MAX, PRODUCER_WINDOW};
pub use rejection::{RecordedRejection, Rejection, RejectionLog, REJECTIONS_KEPT};
pub use state::{JobState, Outcome, ReplayError, DEAD_CONTAINERS_KEPT};

#[cfg(test)]
mod scenarios;
#[cfg(test)]
mod tests;
