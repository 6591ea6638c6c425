//! What a replica tells about itself: its metrics (`telemetry`), the recent history of its
//! figures for the status page's charts ([`history`]), the status as JSON ([`json`]) and when
//! its certificates expire ([`expiry`]). Nothing here serves a port: `ports::http` does.

pub mod expiry;
pub mod history;
pub mod json;
pub(in crate::server) mod telemetry;
