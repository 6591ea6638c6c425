//! The one error a bad configuration gets: the field at fault and why. Its own file, so that
//! every section of the configuration (`config`, `job_config`) refuses the same way without
//! the sections using each other.

/// A configuration that cannot work, with the field at fault.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid configuration: {field}: {reason}")]
pub struct ConfigError {
    pub field: &'static str,
    pub reason: String,
}

pub(crate) fn refuse(field: &'static str, reason: impl Into<String>) -> Result<(), ConfigError> {
    Err(ConfigError {
        field,
        reason: reason.into(),
    })
}
