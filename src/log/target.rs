//! Who a command is for, and which commands a subscriber wants.
//!
//! Every command carries a [`Target`] next to its frame, so that a replica can serve a
//! container "its own commands plus broadcasts" without decoding command bodies, and so that
//! routing works the same for built-in and user commands.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use super::names::{valid_name, NAME_BYTES_MAX};

/// The longest container id accepted on append.
pub const CONTAINER_ID_BYTES_MAX: usize = NAME_BYTES_MAX;

/// A container's name, chosen by whoever launches it (a YARN container id, a pod name, "0").
///
/// Deserialisation accepts any string, because a log entry must always decode; the rules are
/// enforced where ids enter the log ([`ContainerId::new`] and the replica's append path).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct ContainerId(String);

/// Why a container id was refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("invalid container id {id:?}: use 1 to {CONTAINER_ID_BYTES_MAX} characters from [A-Za-z0-9._:-]")]
pub struct InvalidContainerId {
    /// The refused id, as given.
    pub id: String,
}

impl ContainerId {
    /// Checks the id: 1 to [`CONTAINER_ID_BYTES_MAX`] ASCII letters, digits or `._:-`, which
    /// keeps ids printable, unambiguous in `container:ID` syntax and bounded in size.
    pub fn new(id: impl Into<String>) -> Result<ContainerId, InvalidContainerId> {
        let id = id.into();
        if valid_name(&id) {
            Ok(ContainerId(id))
        } else {
            Err(InvalidContainerId { id })
        }
    }

    /// Re-checks an id that arrived over the wire.
    pub fn validate(&self) -> Result<(), InvalidContainerId> {
        if self.is_valid() {
            Ok(())
        } else {
            Err(InvalidContainerId { id: self.0.clone() })
        }
    }

    /// Whether the id passes the checks of [`ContainerId::new`]; false only for an id that
    /// arrived unchecked, decoded from the wire or the log.
    pub fn is_valid(&self) -> bool {
        valid_name(&self.0)
    }

    /// The id as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for ContainerId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// Who a command is addressed to.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Target {
    /// Every container (schema and config changes, user broadcasts).
    #[default]
    All,
    /// One container (assign or stop a task on it).
    Container(ContainerId),
    /// The coordinator only: containers' acks, input changes, capacity decisions. Containers
    /// filtering for themselves do not receive these.
    Coordinator,
}

impl Target {
    /// The bytes this target adds to an encoded entry, for size limits.
    pub fn encoded_len(&self) -> usize {
        match self {
            Target::All | Target::Coordinator => 4,
            Target::Container(id) => 4 + 8 + id.0.len(),
        }
    }
}

impl fmt::Display for Target {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Target::All => f.write_str("all"),
            Target::Container(id) => write!(f, "container:{id}"),
            Target::Coordinator => f.write_str("coordinator"),
        }
    }
}

/// Parses `all`, `coordinator` or `container:ID`.
impl FromStr for Target {
    type Err = String;

    fn from_str(s: &str) -> Result<Target, String> {
        match s {
            "all" => Ok(Target::All),
            "coordinator" => Ok(Target::Coordinator),
            _ => match s.strip_prefix("container:") {
                Some(id) => ContainerId::new(id)
                    .map(Target::Container)
                    .map_err(|e| e.to_string()),
                None => Err(format!(
                    "unknown target {s:?}: expected all, coordinator or container:ID"
                )),
            },
        }
    }
}

/// Which commands a subscriber receives.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Filter {
    /// The whole log (the coordinator, tools, audits).
    #[default]
    Everything,
    /// What one container must hear: commands addressed to it and broadcasts.
    Container(ContainerId),
}

impl Filter {
    /// Whether a command addressed to `target` passes this filter: everything passes
    /// [`Filter::Everything`]; a container's filter passes its own commands and broadcasts,
    /// never those for the coordinator.
    pub fn matches(&self, target: &Target) -> bool {
        match (self, target) {
            (Filter::Everything, _) | (Filter::Container(_), Target::All) => true,
            (Filter::Container(wanted), Target::Container(id)) => wanted == id,
            (Filter::Container(_), Target::Coordinator) => false,
        }
    }
}

impl fmt::Display for Filter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Filter::Everything => f.write_str("everything"),
            Filter::Container(id) => write!(f, "container:{id}"),
        }
    }
}

/// Parses `everything` (or `all`) or `container:ID`.
impl FromStr for Filter {
    type Err = String;

    fn from_str(s: &str) -> Result<Filter, String> {
        match s.parse::<Target>() {
            Ok(Target::All) => Ok(Filter::Everything),
            Ok(Target::Container(id)) => Ok(Filter::Container(id)),
            _ if s == "everything" => Ok(Filter::Everything),
            _ => Err(format!(
                "unknown filter {s:?}: expected everything or container:ID"
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn container_ids_are_checked() {
        assert!(ContainerId::new("container_0001.a:b-c").is_ok());
        assert!(ContainerId::new("").is_err());
        assert!(ContainerId::new("has space").is_err());
        assert!(ContainerId::new("x".repeat(CONTAINER_ID_BYTES_MAX + 1)).is_err());
    }

    #[test]
    fn a_container_filter_sees_its_commands_and_broadcasts_only() {
        let me = ContainerId::new("a").unwrap();
        let other = ContainerId::new("b").unwrap();
        let filter = Filter::Container(me.clone());
        assert!(filter.matches(&Target::All));
        assert!(filter.matches(&Target::Container(me)));
        assert!(!filter.matches(&Target::Container(other.clone())));
        assert!(!filter.matches(&Target::Coordinator));
        assert!(Filter::Everything.matches(&Target::Container(other)));
        assert!(Filter::Everything.matches(&Target::Coordinator));
    }

    #[test]
    fn targets_and_filters_parse_from_their_display_form() {
        for text in ["all", "coordinator", "container:7"] {
            assert_eq!(text.parse::<Target>().unwrap().to_string(), text);
        }
        assert_eq!(
            "container:7".parse::<Filter>().unwrap().to_string(),
            "container:7"
        );
        assert_eq!("all".parse::<Filter>().unwrap(), Filter::Everything);
        assert!("container:".parse::<Target>().is_err());
        assert!("coordinator".parse::<Filter>().is_err());
    }
}
