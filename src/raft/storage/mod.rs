//! A replica's storage and its fault model.

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
