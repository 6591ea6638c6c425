//! The subcommands that talk to a running cluster as its operator does (`append`, `tail`,
//! `status`, `state`, `snapshot`, `broadcast`, `vocabulary`, `members`):
//!
//! * [`flags`]: how they connect ([`ClientFlags`]) and print ([`OutputFlags`]);
//! * [`commands`]: their arguments, and what each does with a client;
//! * [`render`]: what they print, text for people and JSON for scripts (an interface);
//! * [`backup`]: `snapshot save` and `snapshot restore`;
//! * [`signal`]: Ctrl-C and SIGTERM, and the error a command interrupted by them returns.

pub mod backup;
pub mod commands;
pub mod flags;
pub mod render;
pub mod signal;

pub use commands::{parse_kind, raise_level, tail, TailOptions};
pub use flags::{ClientFlags, OutputFlags, OutputFormat};
pub use render::{entry_json, entry_line, state_json, state_text};
pub use signal::{shutdown_signal, Interrupted};
