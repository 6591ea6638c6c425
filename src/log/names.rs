//! The names commands use: task instances and input partitions (SSPs).

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// The longest task name or input part accepted.
pub const NAME_BYTES_MAX: usize = 128;

/// Whether `name` is 1 to [`NAME_BYTES_MAX`] ASCII letters, digits or `._:-`: printable,
/// unambiguous in `kind:NAME` and `a/b/c` syntax, and bounded in size.
pub(crate) fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= NAME_BYTES_MAX
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"._:-".contains(&b))
}

/// A task instance's name (Samza's "Partition 3" becomes `partition-3`).
///
/// Like every name in a command, deserialisation accepts any string (a log entry must always
/// decode); the job model refuses invalid names when the command is applied.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct TaskId(String);

/// Why a name was refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("invalid {what} {name:?}: use 1 to {NAME_BYTES_MAX} characters from [A-Za-z0-9._:-]")]
pub struct InvalidName {
    /// What the name was for: `task` or `input`.
    pub what: &'static str,
    /// The refused name as given (an input in its `system/stream/partition` form).
    pub name: String,
}

impl TaskId {
    /// Checks the name: 1 to [`NAME_BYTES_MAX`] ASCII letters, digits or `._:-`.
    pub fn new(name: impl Into<String>) -> Result<TaskId, InvalidName> {
        let name = name.into();
        if valid_name(&name) {
            Ok(TaskId(name))
        } else {
            Err(InvalidName { what: "task", name })
        }
    }

    /// Whether the name passes the checks of [`TaskId::new`]; false only for a name that
    /// arrived unchecked, decoded from the wire or the log.
    pub fn is_valid(&self) -> bool {
        valid_name(&self.0)
    }

    /// The name as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for TaskId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// One input partition, a Samza SSP: `system/stream/partition`.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct Input {
    /// The system the stream lives in (for example `kafka`); a name by the rules of
    /// [`TaskId::new`].
    pub system: String,
    /// The stream within the system (a topic); a name by the same rules.
    pub stream: String,
    /// The partition's number within the stream.
    pub partition: u32,
}

impl Input {
    /// Checks `system` and `stream` by the name rules of [`TaskId::new`].
    pub fn new(
        system: impl Into<String>,
        stream: impl Into<String>,
        partition: u32,
    ) -> Result<Input, InvalidName> {
        let input = Input {
            system: system.into(),
            stream: stream.into(),
            partition,
        };
        if input.is_valid() {
            Ok(input)
        } else {
            Err(InvalidName {
                what: "input",
                name: input.to_string(),
            })
        }
    }

    /// Whether `system` and `stream` pass the checks of [`Input::new`]; false only for an
    /// input that arrived unchecked, decoded from the wire or the log.
    pub fn is_valid(&self) -> bool {
        valid_name(&self.system) && valid_name(&self.stream)
    }
}

impl fmt::Display for Input {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}/{}", self.system, self.stream, self.partition)
    }
}

/// Parses `system/stream/partition`.
impl FromStr for Input {
    type Err = InvalidName;

    fn from_str(s: &str) -> Result<Input, InvalidName> {
        let invalid = || InvalidName {
            what: "input",
            name: s.to_string(),
        };
        let mut parts = s.split('/');
        match (parts.next(), parts.next(), parts.next(), parts.next()) {
            (Some(system), Some(stream), Some(partition), None) => {
                let partition = partition.parse().map_err(|_| invalid())?;
                Input::new(system, stream, partition)
            }
            _ => Err(invalid()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn inputs_parse_from_their_display_form() {
        let input: Input = "kafka/page-views/7".parse().unwrap();
        assert_eq!(input, Input::new("kafka", "page-views", 7).unwrap());
        assert_eq!(input.to_string(), "kafka/page-views/7");
        for bad in ["kafka/page-views", "kafka/page views/1", "a/b/c", "a/b/1/2"] {
            assert!(bad.parse::<Input>().is_err(), "{bad}");
        }
    }

    #[test]
    fn task_names_are_checked() {
        assert!(TaskId::new("partition-3").is_ok());
        assert!(TaskId::new("Partition 3").is_err());
        assert!(TaskId::new("").is_err());
    }
}
