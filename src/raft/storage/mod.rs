//! A replica's storage and its fault model: the WAL that holds the Raft log, the log store
//! openraft drives over it, sled's metadata and stored snapshot, the data directory they live
//! in, and the checks and repairs of what a disk can do to them. Nothing here uses the
//! consensus side of `raft` but the types openraft's storage traits are written in
//! ([`types`](crate::raft::types)) and the commit stages the log store times
//! ([`stages`](crate::raft::stages)); `tests/architecture.rs` checks it.
//!
//! The map:
//! * [`wal`]: the segmented log file (segments and records, the synced mark, the scan and
//!   repair at open, the injectors of its faults); [`log_store`]: openraft's log storage
//!   over it, with the sync thread, the durable mark and the repair record; `recent`: its
//!   window of the newest entries.
//! * [`meta_store`]: sled, made durable; [`snapshots`]: the stored snapshot in it;
//!   [`two_copies`]: the small records kept in two checksummed copies (the vote, the repair
//!   under way, a failed sync); [`files`]: durable creation of files and directories.
//! * [`data_dir`]: the data directory's layout, format and identity, and its opening.
//! * The fault model: [`fault`] names the kinds; [`bad_sectors`] and [`write_faults`] are
//!   where reads and writes meet the disk's errors (and where tests inject them);
//!   [`scrub`] finds rot while the replica runs, [`check`] offline; [`recover`] forces a
//!   stopped replica into a cluster of its own after a majority is lost.
//!
//! The fault model in a paragraph (ARCHITECTURE.md, "The storage fault model", has the
//! argument). A **crash** loses what was not synced: nothing is acknowledged before its
//! `fdatasync` (the log store's sync thread; the leader's early acknowledgement is never
//! acted on before it), and only the final write can be torn. A **torn write** is a bad
//! final record with nothing valid after it and above the synced mark: the scan at open cuts
//! it ([`wal`]). A **rotting sector** is any other bad record, or one at or below the synced
//! mark: the scan keeps the segments aside, cuts the log before the damage and records a
//! [`Repair`](log_store::Repair), and the replica votes only as its whole log would have until
//! the peers have sent the lost entries again; in sled, a snapshot that fails its checksum is
//! set aside and fetched from the leader ([`data_dir`], [`snapshots`]); the scrubber finds
//! either while running. A **lost write** (a disk that acknowledged and dropped it) shows as
//! a log that ends below the synced mark, or as a rolled-back vote, which the two copies and
//! the log's own terms catch ([`two_copies`], [`log_store`]). A **full disk** or a failing
//! device fails the write with its file named ([`write_faults`]), and the replica stops
//! without acknowledging it. A **failed `fdatasync`** is never retried: nothing is marked
//! synced after it, the replica stops, and the failure is recorded so that the next process
//! cuts what that sync alone covered before it syncs anything ([`wal`]'s synced mark).

pub mod bad_sectors;
pub mod check;
pub mod data_dir;
pub mod fault;
pub mod files;
pub mod log_store;
pub mod meta_store;
mod recent;
pub mod recover;
pub mod scrub;
pub mod snapshots;
pub mod two_copies;
pub mod wal;
pub mod write_faults;
