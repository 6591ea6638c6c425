//! The versioned vocabulary: which `(kind, version)` pairs exist, from which level, and which
//! are deprecated.
//!
//! The log records a vocabulary level, like KRaft's `metadata.version`. A kind is written only
//! once the recorded level allows it, so during a rolling upgrade nobody writes a command that
//! a replica still on the old build cannot apply; raise the level once every replica runs the
//! new build. A kind deprecated at a level is refused from that level on, and stays readable.
//! A reader decodes with the [`Vocabulary`] it knows and passes anything else through as
//! [`Command::Unknown`].

use std::collections::BTreeMap;

use super::command::*;
use super::kinds::{Kind, CUSTOM_KIND_MIN};
use super::names::{Input, TaskId};
use super::{decode, ContainerId};

pub use super::kinds;

/// The level a new log starts at.
pub const LEVEL_INITIAL: Level = 1;
/// The highest level this build understands.
///
/// A level may also change what the state machine decides about commands it already knows;
/// such a change applies only from its level, so that replicas still on an older build decide
/// as they always did until the level is raised (which needs every replica upgraded):
/// * level 2: `desired-containers` version 2, version 1 deprecated;
/// * level 3: an append from a producer the replicas no longer remember is refused instead
///   of taken for new ([`LEVEL_FORGOTTEN_PRODUCERS_REFUSED`]); `launch-container` and
///   `cancel-launch`, with which the controller records its launches before carrying them
///   out ([`LEVEL_LAUNCHES_RECORDED`]);
/// * level 4: a cluster without a cluster id (initialised by v0.1.0, or by a build before
///   cluster ids) takes the one derived from the entry that raises the level to 4
///   ([`LEVEL_CLUSTER_ID_DERIVED`]).
pub const LEVEL_MAX: Level = 4;

/// The highest level every release knows (v0.1.0 knew up to 2): a replica of any build can
/// join a log recorded at this level or below, so adding one needs no question about its
/// level.
pub const LEVEL_KNOWN_TO_EVERY_RELEASE: Level = 2;

/// From this level on, the controller records each container launch (`launch-container`) and
/// each launch it gives up (`cancel-launch`) in the log before carrying it out. Below it, it
/// launches without a record, as builds before level 3 did.
pub const LEVEL_LAUNCHES_RECORDED: Level = 3;

/// The level whose raise gives a cluster without a cluster id one, derived on every replica
/// from the entry that raises it (`raft::state_machine::derived_cluster_id`): the same
/// everywhere, as the entry is, where a draw by each leader could differ. A cluster that has
/// one keeps it. No command changes meaning.
pub const LEVEL_CLUSTER_ID_DERIVED: Level = 4;

/// From this level on, the idempotent-producer table refuses an append from a producer it
/// does not remember whose sequence is above those a producer starts with, since it may be a
/// retry of an append made before the producer was forgotten (`jobs::producers`). Below it,
/// such an append is taken for new, as builds before level 3 did.
pub const LEVEL_FORGOTTEN_PRODUCERS_REFUSED: Level = 3;

/// One `(kind, version)` of the built-in vocabulary.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KindSpec {
    /// The kind number ([`kinds`]).
    pub kind: Kind,
    /// The body's version within the kind.
    pub version: u16,
    /// The name people read and type (`ctrlog vocabulary show`, [`kind_by_name`]); the
    /// versions of one kind share it.
    pub name: &'static str,
    /// The level from which it may be written.
    pub since: Level,
    /// The level from which it is refused on append (still readable).
    pub deprecated_since: Option<Level>,
}

const fn spec(kind: Kind, version: u16, name: &'static str, since: Level) -> KindSpec {
    KindSpec {
        kind,
        version,
        name,
        since,
        deprecated_since: None,
    }
}

/// Every built-in `(kind, version)` this build knows.
pub const KINDS: &[KindSpec] = {
    use kinds::*;
    &[
        spec(REGISTER_CONTAINER, 1, "register-container", 1),
        spec(DEREGISTER_CONTAINER, 1, "deregister-container", 1),
        spec(EXPIRE_CONTAINER, 1, "expire-container", 1),
        spec(ADD_INPUTS, 1, "add-inputs", 1),
        spec(REMOVE_INPUTS, 1, "remove-inputs", 1),
        spec(ASSIGN_TASK, 1, "assign-task", 1),
        spec(STOP_TASK, 1, "stop-task", 1),
        spec(TASK_STARTED, 1, "task-started", 1),
        spec(TASK_STOPPED, 1, "task-stopped", 1),
        KindSpec {
            deprecated_since: Some(2),
            ..spec(DESIRED_CONTAINERS, 1, "desired-containers", 1)
        },
        spec(DESIRED_CONTAINERS, 2, "desired-containers", 2),
        spec(SCHEMA_CHANGE, 1, "schema-change", 1),
        spec(CONFIG_CHANGE, 1, "config-change", 1),
        spec(ACK, 1, "ack", 1),
        spec(SET_VOCABULARY_LEVEL, 1, "set-vocabulary-level", 1),
        spec(
            LAUNCH_CONTAINER,
            1,
            "launch-container",
            LEVEL_LAUNCHES_RECORDED,
        ),
        spec(CANCEL_LAUNCH, 1, "cancel-launch", LEVEL_LAUNCHES_RECORDED),
    ]
};

/// The spec of a built-in `(kind, version)`, if this build knows it.
pub fn kind_spec(kind: Kind, version: u16) -> Option<&'static KindSpec> {
    KINDS
        .iter()
        .find(|s| s.kind == kind && s.version == version)
}

/// A command's name for people: the spec name, `custom` or `unknown`.
pub fn kind_name(kind: Kind, version: u16) -> &'static str {
    match kind_spec(kind, version) {
        Some(spec) => spec.name,
        None if kind >= CUSTOM_KIND_MIN => "custom",
        None => "unknown",
    }
}

/// A command's kind as people read and type it: the spec name of a built-in kind, `custom:N`
/// for user kind N, or `unknown:N` for a built-in number this build does not know.
/// [`kind_by_name`] reads the first two back.
pub fn kind_label(kind: Kind, version: u16) -> String {
    match kind_spec(kind, version) {
        Some(spec) => spec.name.to_string(),
        None if kind >= CUSTOM_KIND_MIN => format!("custom:{}", kind - CUSTOM_KIND_MIN),
        None => format!("unknown:{kind}"),
    }
}

/// The kind a built-in spec name (as `ctrlog vocabulary show` lists it) stands for.
pub fn kind_by_name(name: &str) -> Option<Kind> {
    KINDS.iter().find(|s| s.name == name).map(|s| s.kind)
}

/// Why a built-in frame's body did not decode.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Undecodable {
    /// This vocabulary does not have the `(kind, version)`.
    UnknownKind,
    /// It does, but the body is not a valid command of that kind.
    Malformed(String),
}

/// What a reader knows: the built-in kinds up to a level.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Vocabulary {
    level: Level,
}

impl Vocabulary {
    /// This build's vocabulary.
    pub const CURRENT: Vocabulary = Vocabulary { level: LEVEL_MAX };

    /// The vocabulary of a build that knew kinds up to `level` only (an older reader).
    pub fn up_to(level: Level) -> Vocabulary {
        Vocabulary { level }
    }

    /// Decodes a frame. Total: user kinds are `Custom`, and anything this vocabulary does not
    /// know, or cannot decode, is `Unknown` with the frame untouched.
    pub fn decode(&self, frame: Frame) -> Command {
        if frame.kind >= CUSTOM_KIND_MIN {
            return Command::Custom {
                kind: frame.kind,
                version: frame.version,
                payload: frame.body,
            };
        }
        match self.decode_builtin(&frame) {
            Ok(command) => command,
            Err(_) => Command::Unknown(frame),
        }
    }

    /// Decodes a built-in frame, saying why it could not.
    pub fn decode_builtin(&self, frame: &Frame) -> Result<Command, Undecodable> {
        use kinds::*;
        match kind_spec(frame.kind, frame.version) {
            Some(spec) if spec.since <= self.level => {}
            _ => return Err(Undecodable::UnknownKind),
        }
        let body = &frame.body;
        // A body can never decode to more than it holds, which bounds every allocation.
        let limit = body.len() as u64;
        let malformed = |e: super::DecodeError| Undecodable::Malformed(e.to_string());
        let command = match (frame.kind, frame.version) {
            (REGISTER_CONTAINER, 1) => {
                Command::RegisterContainer(decode(body, limit).map_err(malformed)?)
            }
            (DEREGISTER_CONTAINER, 1) => {
                Command::DeregisterContainer(decode(body, limit).map_err(malformed)?)
            }
            (EXPIRE_CONTAINER, 1) => {
                Command::ExpireContainer(decode(body, limit).map_err(malformed)?)
            }
            (ADD_INPUTS, 1) => Command::AddInputs(decode(body, limit).map_err(malformed)?),
            (REMOVE_INPUTS, 1) => Command::RemoveInputs(decode(body, limit).map_err(malformed)?),
            (ASSIGN_TASK, 1) => Command::AssignTask(decode(body, limit).map_err(malformed)?),
            (STOP_TASK, 1) => Command::StopTask(decode(body, limit).map_err(malformed)?),
            (TASK_STARTED, 1) => Command::TaskStarted(decode(body, limit).map_err(malformed)?),
            (TASK_STOPPED, 1) => Command::TaskStopped(decode(body, limit).map_err(malformed)?),
            (DESIRED_CONTAINERS, 1) => {
                Command::DesiredContainersV1(decode(body, limit).map_err(malformed)?)
            }
            (DESIRED_CONTAINERS, 2) => {
                Command::DesiredContainers(decode(body, limit).map_err(malformed)?)
            }
            (SCHEMA_CHANGE, 1) => Command::SchemaChange(decode(body, limit).map_err(malformed)?),
            (CONFIG_CHANGE, 1) => Command::ConfigChange(decode(body, limit).map_err(malformed)?),
            (ACK, 1) => Command::Ack(decode(body, limit).map_err(malformed)?),
            (SET_VOCABULARY_LEVEL, 1) => {
                Command::SetVocabularyLevel(decode(body, limit).map_err(malformed)?)
            }
            (LAUNCH_CONTAINER, 1) => {
                Command::LaunchContainer(decode(body, limit).map_err(malformed)?)
            }
            (CANCEL_LAUNCH, 1) => Command::CancelLaunch(decode(body, limit).map_err(malformed)?),
            _ => return Err(Undecodable::UnknownKind),
        };
        Ok(command)
    }
}

/// One command of every built-in `(kind, version)`, for tests and documentation.
pub fn examples() -> Vec<Command> {
    let container = ContainerId::new("c1").expect("valid");
    let task = TaskId::new("t1").expect("valid");
    let input = Input::new("kafka", "events", 0).expect("valid");
    vec![
        Command::RegisterContainer(RegisterContainer {
            container: container.clone(),
            location: "host-1:4242".into(),
        }),
        Command::DeregisterContainer(DeregisterContainer {
            container: container.clone(),
            epoch: 1,
        }),
        Command::ExpireContainer(ExpireContainer {
            container: container.clone(),
            epoch: 1,
        }),
        Command::AddInputs(AddInputs {
            inputs: vec![input.clone()],
        }),
        Command::RemoveInputs(RemoveInputs {
            inputs: vec![input.clone()],
        }),
        Command::AssignTask(AssignTask {
            task: task.clone(),
            container: container.clone(),
            epoch: 1,
            inputs: vec![input],
        }),
        Command::StopTask(StopTask {
            task: task.clone(),
            container: container.clone(),
            epoch: 1,
        }),
        Command::TaskStarted(TaskStarted {
            task: task.clone(),
            container: container.clone(),
            epoch: 1,
        }),
        Command::TaskStopped(TaskStopped {
            task,
            container: container.clone(),
            epoch: 1,
            checkpoint: Some(vec![1, 2, 3]),
        }),
        Command::DesiredContainersV1(DesiredContainersV1 { count: 3 }),
        Command::DesiredContainers(DesiredContainers {
            count: 4,
            reason: "lag 12,000 > 10,000".into(),
        }),
        Command::SchemaChange(SchemaChange {
            subject: "events".into(),
            schema: b"{\"type\":\"record\"}".to_vec(),
        }),
        Command::ConfigChange(ConfigChange {
            set: BTreeMap::from([("batch.size".to_string(), "500".to_string())]),
            remove: vec!["legacy.flag".into()],
        }),
        Command::Ack(Ack {
            container,
            epoch: 1,
            offset: 9,
        }),
        Command::SetVocabularyLevel(SetVocabularyLevel { level: 2 }),
        Command::LaunchContainer(LaunchContainer {
            container: ContainerId::new("c2").expect("valid"),
            attempt: 1,
        }),
        Command::CancelLaunch(CancelLaunch {
            container: ContainerId::new("c2").expect("valid"),
            launch: 16,
        }),
    ]
}

/// Decoding lives beside the vocabulary it decodes against, so that `command.rs` (the
/// types) does not depend on the table that reads them.
impl Command {
    /// Decodes a frame against this build's vocabulary. Total: an unknown frame is `Unknown`.
    pub fn from_frame(frame: Frame) -> Command {
        Vocabulary::CURRENT.decode(frame)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_spec_has_an_example_and_every_example_a_spec() {
        let examples = examples();
        assert_eq!(examples.len(), KINDS.len());
        for command in examples {
            let (kind, version) = command.kind_version();
            assert!(kind_spec(kind, version).is_some(), "{command:?}");
        }
    }

    #[test]
    fn an_older_reader_passes_newer_kinds_through_and_keeps_going() {
        let newer = Command::DesiredContainers(DesiredContainers {
            count: 4,
            reason: "lag".into(),
        })
        .into_frame();
        let old = Vocabulary::up_to(1);
        assert_eq!(old.decode(newer.clone()), Command::Unknown(newer.clone()));
        assert!(matches!(
            Vocabulary::CURRENT.decode(newer),
            Command::DesiredContainers(_)
        ));
        let older = Command::DesiredContainersV1(DesiredContainersV1 { count: 2 }).into_frame();
        assert!(matches!(old.decode(older), Command::DesiredContainersV1(_)));
    }

    #[test]
    fn a_malformed_builtin_body_is_reported_and_read_as_unknown() {
        let frame = Frame {
            kind: kinds::ASSIGN_TASK,
            version: 1,
            body: vec![0xff; 3],
        };
        assert!(matches!(
            Vocabulary::CURRENT.decode_builtin(&frame),
            Err(Undecodable::Malformed(_))
        ));
        assert_eq!(
            Vocabulary::CURRENT.decode(frame.clone()),
            Command::Unknown(frame)
        );
    }
}
