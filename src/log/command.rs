//! Commands and their `{kind, version, body}` frame.
//!
//! Each built-in command is a plain struct; its frame body is that struct in the log's codec.
//! Which `(kind, version)` pairs exist, and from which vocabulary level, is in
//! [`vocabulary`](super::vocabulary).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::kinds::{self, Kind, CUSTOM_KIND_MIN};
#[cfg(test)]
use super::names::NAME_BYTES_MAX;
use super::names::{Input, TaskId};
use super::{ContainerId, Offset, Target};

/// A container's generation: the offset of its registration.
pub type Epoch = Offset;

/// The vocabulary level recorded in the log (like KRaft's `metadata.version`).
pub type Level = u16;

/// The most bytes of free text a command may carry where the job's state keeps it: a
/// container's location, a schema's subject, a scaling reason, a config key (checked on
/// append, [`Command::check_limits`]).
pub const TEXT_BYTES_MAX: usize = 256;

/// The most bytes of one config value (checked on append, [`Command::check_limits`]).
pub const CONFIG_VALUE_BYTES_MAX: usize = 64 << 10;

/// The wire and disk form of every command, as KRaft frames its records.
///
/// The frame is what is stored and replicated. Readers decode it with a
/// [`Vocabulary`](super::vocabulary::Vocabulary), which is what lets an old reader pass a newer
/// kind through as [`Command::Unknown`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Frame {
    /// The command's kind: a built-in one ([`kinds`](super::kinds)) below
    /// [`CUSTOM_KIND_MIN`], a user's from it up.
    pub kind: Kind,
    /// The layout of `body` within its kind; a changed body is a new version, and readers
    /// decode only the versions they know.
    pub version: u16,
    /// Encoded as one length and the bytes (the same layout as a byte sequence, without
    /// walking it byte by byte).
    #[serde(with = "serde_bytes")]
    pub body: Vec<u8>,
}

impl Frame {
    /// The bytes this frame takes in a batch, for size limits.
    pub fn encoded_len(&self) -> usize {
        // kind (4) + version (2) + body length prefix (8) + body.
        14 + self.body.len()
    }
}

/// A container announces itself. The offset this command gets is the container's epoch.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RegisterContainer {
    /// The container that registers. If it already has a live session, that session ends
    /// (its tasks are released and its answers fenced) and this offset becomes its new epoch.
    pub container: ContainerId,
    /// Free text for operators: where the container runs (host, pid, pod).
    pub location: String,
}

/// A container leaves cleanly (after it was drained).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeregisterContainer {
    /// The container that leaves.
    pub container: ContainerId,
    /// The epoch of the session that ends; refused as `Fenced` unless it is the live one.
    pub epoch: Epoch,
}

/// The coordinator declares a container dead (it missed its heartbeats). Everything from this
/// epoch is fenced from here on.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExpireContainer {
    /// The container declared dead.
    pub container: ContainerId,
    /// The epoch of the session declared dead. Refused as `Fenced` unless it is the live one,
    /// so a container that registered again since keeps its newer session.
    pub epoch: Epoch,
}

/// Input partitions that appeared.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct AddInputs {
    /// The inputs that appeared; those the job has already are left as they are. A new input
    /// belongs to no task until an [`AssignTask`] names it.
    pub inputs: Vec<Input>,
}

/// Input partitions that went away. Refused for an input whose task is owned: stop the task
/// first (revoke before reassign).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RemoveInputs {
    /// The inputs that went away. Each must be known to the job; a task left without inputs,
    /// and without an owner, is dropped.
    pub inputs: Vec<Input>,
}

/// Gives a task, with this input set, to a container (at its current epoch). The container
/// answers [`TaskStarted`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct AssignTask {
    /// The task to give; refused while another session owns it.
    pub task: TaskId,
    /// The container to run it.
    pub container: ContainerId,
    /// The container's live epoch; an assignment to any other is refused as `Fenced`.
    pub epoch: Epoch,
    /// The task's whole input set, replacing the one it had. Each input must be known to the
    /// job and not belong to another task that is owned.
    pub inputs: Vec<Input>,
}

/// Tells a container to stop a task. The container answers [`TaskStopped`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct StopTask {
    /// The task to stop: starting or running on this container.
    pub task: TaskId,
    /// The container that owns the task.
    pub container: ContainerId,
    /// The owner's live epoch; refused as `Fenced` otherwise.
    pub epoch: Epoch,
}

/// A container's answer to [`AssignTask`]: the task runs.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TaskStarted {
    /// The task that now runs; it must be starting on this session.
    pub task: TaskId,
    /// The container that answers: the task's owner.
    pub container: ContainerId,
    /// The epoch of the session that answers; an ended session's answer is refused as
    /// `Fenced`.
    pub epoch: Epoch,
}

/// A container's answer to [`StopTask`]: the task stopped, with where it got to.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TaskStopped {
    /// The task that stopped; it must be stopping on this session. It becomes unassigned.
    pub task: TaskId,
    /// The container that answers: the task's owner.
    pub container: ContainerId,
    /// The epoch of the session that answers; an ended session's answer is refused as
    /// `Fenced`.
    pub epoch: Epoch,
    /// Opaque position the next owner resumes from. `None` keeps the checkpoint the task had.
    pub checkpoint: Option<Vec<u8>>,
}

/// The container count the coordinator wants (version 1, deprecated at level 2).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DesiredContainersV1 {
    /// How many containers the job should have.
    pub count: u32,
}

/// The container count the coordinator wants, and why (version 2, from level 2), so that an
/// audit of the log explains every scaling decision.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DesiredContainers {
    /// How many containers the job should have.
    pub count: u32,
    /// Why, for people reading the log (for example `lag 12,000 > 10,000`); at most
    /// [`TEXT_BYTES_MAX`] bytes.
    pub reason: String,
}

/// A schema changed: every live container must ack it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SchemaChange {
    /// What the schema describes, for example a stream name.
    pub subject: String,
    /// The schema itself, opaque to ctrlog; it replaces the subject's previous one.
    pub schema: Vec<u8>,
}

/// Configuration changed: every live container must ack it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ConfigChange {
    /// Keys to set, with their values: keys of at most [`TEXT_BYTES_MAX`] bytes, values of at
    /// most [`CONFIG_VALUE_BYTES_MAX`].
    pub set: BTreeMap<String, String>,
    /// Keys to remove. Removals apply before `set`, so a key in both ends up set.
    pub remove: Vec<String>,
}

impl ConfigChange {
    /// The first key this change sets that `marked` calls secret, if any. An entry of
    /// `marked` names a key, also as the last segments of a longer one (`sasl.jaas.config`
    /// marks `kafka.sasl.jaas.config`), or, starting with `*`, every key that ends with the
    /// rest (`*password` marks `db.password`). Both are compared in their
    /// [`comparable_key`] form, so that case, spaces, invisible characters, compatibility
    /// forms and look-alike letters change nothing: a trailing space, a homoglyph and a
    /// longer Kafka key once each carried a password into the log.
    pub fn first_secret_key<'a>(&'a self, marked: &[String]) -> Option<&'a str> {
        let marked: Vec<(bool, String)> = (marked.iter())
            .map(|entry| match entry.trim_start().strip_prefix('*') {
                Some(suffix) => (true, comparable_key(suffix)),
                None => (false, comparable_key(entry)),
            })
            .filter(|(_, entry)| !entry.is_empty())
            .collect();
        let is_marked = |key: &str| {
            let key = comparable_key(key);
            marked.iter().any(|(any_ending, entry)| {
                let Some(before) = key.strip_suffix(entry.as_str()) else {
                    return false;
                };
                *any_ending || before.is_empty() || before.ends_with(|c: char| !c.is_alphanumeric())
            })
        };
        self.set
            .keys()
            .map(String::as_str)
            .find(|key| is_marked(key))
    }
}

/// `key` as secret keys are compared: in Unicode compatibility form (NFKC: `ｐａｓｓ` is
/// `pass`), without whitespace, control or invisible format characters, as its confusable
/// skeleton (UTS #39: the Cyrillic `а` of `pаssword` is `a`, `0` is `O`), in lower case.
pub fn comparable_key(key: &str) -> String {
    use unicode_normalization::UnicodeNormalization;
    let invisible = |c: char| {
        c.is_whitespace()
            || c.is_control()
            || matches!(c, '\u{00AD}' | '\u{034F}' | '\u{061C}' | '\u{115F}' | '\u{1160}'
                | '\u{17B4}' | '\u{17B5}' | '\u{180B}'..='\u{180F}' | '\u{200B}'..='\u{200F}'
                | '\u{202A}'..='\u{202E}' | '\u{2060}'..='\u{206F}' | '\u{3164}'
                | '\u{FE00}'..='\u{FE0F}' | '\u{FEFF}' | '\u{FFA0}' | '\u{1D173}'..='\u{1D17A}'
                | '\u{E0000}'..='\u{E0FFF}')
    };
    let visible: String = key.nfkc().filter(|c| !invisible(*c)).collect();
    let skeleton: String = unicode_security::skeleton(&visible.to_lowercase()).collect();
    skeleton.to_lowercase()
}

/// A container acknowledges the command at `offset` (a broadcast, or a user command).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Ack {
    /// The container that acknowledges.
    pub container: ContainerId,
    /// The epoch of its live session; refused as `Fenced` otherwise.
    pub epoch: Epoch,
    /// The offset of the command acknowledged, which must be below the ack's own. An ack of
    /// a broadcast settles this session's share of it; any other ack is recorded and changes
    /// nothing.
    pub offset: Offset,
}

/// Raises the vocabulary level, allowing the kinds that level introduces (and refusing the
/// ones it deprecates). Raise it only once every replica runs a build that supports it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SetVocabularyLevel {
    /// The new level: above the recorded one, and at most the highest every replica's build
    /// supports.
    pub level: Level,
}

/// The coordinator is about to launch a container under this name (from level 3). It is
/// written, and committed, before the launcher is called, so that a later leader knows of
/// every launch that may be running, waits for it to register, and neither launches it again
/// nor forgets it. The offset this command gets identifies the launch ([`CancelLaunch`]).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LaunchContainer {
    /// The name the launched container will register under; refused while a container of
    /// that name is live or being launched.
    pub container: ContainerId,
    /// Which launch of its container slot this is, from 1: retries of a launch that never
    /// registered count up, so that any leader stops retrying after the same number.
    pub attempt: u32,
}

/// The coordinator gives up the launch recorded at `launch` (its [`LaunchContainer`]'s
/// offset), which never registered (from level 3). Written before the launched container is
/// stopped, and before a retry is launched under a new name.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CancelLaunch {
    /// The container whose launch is given up; it becomes `Expired`.
    pub container: ContainerId,
    /// The offset of the [`LaunchContainer`] given up: the launch of this container still in
    /// flight, or the command is refused.
    pub launch: Offset,
}

/// A command as a reader understands it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Command {
    /// `register-container`, addressed to the container: it announces itself, and the offset
    /// is its new epoch.
    RegisterContainer(RegisterContainer),
    /// `deregister-container`, addressed to the container: it leaves cleanly.
    DeregisterContainer(DeregisterContainer),
    /// `expire-container`, addressed to the container, so that a zombie learns from its own
    /// stream that it is fenced: the coordinator declared it dead.
    ExpireContainer(ExpireContainer),
    /// `add-inputs`, for the coordinator: input partitions appeared.
    AddInputs(AddInputs),
    /// `remove-inputs`, for the coordinator: input partitions went away.
    RemoveInputs(RemoveInputs),
    /// `assign-task`, addressed to the container: run this task; it answers
    /// [`Command::TaskStarted`].
    AssignTask(AssignTask),
    /// `stop-task`, addressed to the container: stop this task; it answers
    /// [`Command::TaskStopped`].
    StopTask(StopTask),
    /// `task-started`, for the coordinator: a container's answer to an assignment.
    TaskStarted(TaskStarted),
    /// `task-stopped`, for the coordinator: a container's answer to a stop, with its
    /// checkpoint.
    TaskStopped(TaskStopped),
    /// `desired-containers` version 1, for the coordinator: refused on append from level 2,
    /// still read from older logs.
    DesiredContainersV1(DesiredContainersV1),
    /// `desired-containers` version 2 (from level 2), for the coordinator: the wanted count
    /// and why.
    DesiredContainers(DesiredContainers),
    /// `schema-change`, broadcast: every container live when it is applied must ack it.
    SchemaChange(SchemaChange),
    /// `config-change`, broadcast: every container live when it is applied must ack it.
    ConfigChange(ConfigChange),
    /// `ack`, for the coordinator: a container acknowledges the command at an offset.
    Ack(Ack),
    /// `set-vocabulary-level`, broadcast: the level recorded in the log goes up.
    SetVocabularyLevel(SetVocabularyLevel),
    /// A user-defined command. ctrlog orders and replicates it and never looks inside.
    Custom {
        /// The kind number, at or above [`CUSTOM_KIND_MIN`] ([`Command::custom`] adds the
        /// user's own number to it).
        kind: Kind,
        /// The payload's format version, chosen by the user; ctrlog only carries it.
        version: u16,
        /// The body as the user encoded it, at most the replica's command size limit.
        payload: Vec<u8>,
    },
    /// A frame this reader does not know (a newer release wrote it). Passed through untouched
    /// so that the stream never stalls on it.
    Unknown(Frame),
    // Variants added after v0.1.0 come last, so that those before keep their encoding.
    /// `launch-container` (from level 3), for the coordinator: a launch recorded before it is
    /// carried out.
    LaunchContainer(LaunchContainer),
    /// `cancel-launch` (from level 3), for the coordinator: a launch that never registered,
    /// given up.
    CancelLaunch(CancelLaunch),
}

impl Command {
    /// The frame's `(kind, version)`.
    pub fn kind_version(&self) -> (Kind, u16) {
        use kinds::*;
        match self {
            Command::RegisterContainer(_) => (REGISTER_CONTAINER, 1),
            Command::DeregisterContainer(_) => (DEREGISTER_CONTAINER, 1),
            Command::ExpireContainer(_) => (EXPIRE_CONTAINER, 1),
            Command::AddInputs(_) => (ADD_INPUTS, 1),
            Command::RemoveInputs(_) => (REMOVE_INPUTS, 1),
            Command::AssignTask(_) => (ASSIGN_TASK, 1),
            Command::StopTask(_) => (STOP_TASK, 1),
            Command::TaskStarted(_) => (TASK_STARTED, 1),
            Command::TaskStopped(_) => (TASK_STOPPED, 1),
            Command::DesiredContainersV1(_) => (DESIRED_CONTAINERS, 1),
            Command::DesiredContainers(_) => (DESIRED_CONTAINERS, 2),
            Command::SchemaChange(_) => (SCHEMA_CHANGE, 1),
            Command::ConfigChange(_) => (CONFIG_CHANGE, 1),
            Command::Ack(_) => (ACK, 1),
            Command::SetVocabularyLevel(_) => (SET_VOCABULARY_LEVEL, 1),
            Command::Custom { kind, version, .. } => (*kind, *version),
            Command::Unknown(frame) => (frame.kind, frame.version),
            Command::LaunchContainer(_) => (LAUNCH_CONTAINER, 1),
            Command::CancelLaunch(_) => (CANCEL_LAUNCH, 1),
        }
    }

    /// Encodes this command as the frame that is stored and replicated.
    pub fn into_frame(self) -> Frame {
        let (kind, version) = self.kind_version();
        let body = match self {
            Command::RegisterContainer(c) => super::encode(&c),
            Command::DeregisterContainer(c) => super::encode(&c),
            Command::ExpireContainer(c) => super::encode(&c),
            Command::AddInputs(c) => super::encode(&c),
            Command::RemoveInputs(c) => super::encode(&c),
            Command::AssignTask(c) => super::encode(&c),
            Command::StopTask(c) => super::encode(&c),
            Command::TaskStarted(c) => super::encode(&c),
            Command::TaskStopped(c) => super::encode(&c),
            Command::DesiredContainersV1(c) => super::encode(&c),
            Command::DesiredContainers(c) => super::encode(&c),
            Command::SchemaChange(c) => super::encode(&c),
            Command::ConfigChange(c) => super::encode(&c),
            Command::Ack(c) => super::encode(&c),
            Command::SetVocabularyLevel(c) => super::encode(&c),
            Command::Custom { payload, .. } => payload,
            Command::Unknown(frame) => frame.body,
            Command::LaunchContainer(c) => super::encode(&c),
            Command::CancelLaunch(c) => super::encode(&c),
        };
        Frame {
            kind,
            version,
            body,
        }
    }

    /// Checks what the job's state would keep of this command against its size limits: every
    /// name ([`ContainerId`], [`TaskId`], [`Input`]) is valid, free text (a location, a schema
    /// subject, a scaling reason, a config key) is at most [`TEXT_BYTES_MAX`] bytes and a config
    /// value at most [`CONFIG_VALUE_BYTES_MAX`]. A replica checks this on append, before the
    /// command enters the log, so that nothing a client names can grow the replicated state
    /// (or a rejection recorded in it) beyond these; it is never checked on apply, so that a
    /// log written before the limits replays as it did.
    pub fn check_limits(&self) -> Result<(), String> {
        let container = |c: &ContainerId| c.validate().map_err(|e| e.to_string());
        let task = |t: &TaskId| {
            if t.is_valid() {
                Ok(())
            } else {
                Err(TaskId::new(t.as_str()).unwrap_err().to_string())
            }
        };
        let inputs = |inputs: &[Input]| match inputs.iter().find(|i| !i.is_valid()) {
            Some(bad) => Err(format!("invalid input {bad:?}")),
            None => Ok(()),
        };
        let text = |what: &str, text: &str, max: usize| {
            if text.len() <= max {
                Ok(())
            } else {
                Err(format!("{what} of {} bytes exceeds {max}", text.len()))
            }
        };
        match self {
            Command::RegisterContainer(c) => {
                container(&c.container)?;
                text("location", &c.location, TEXT_BYTES_MAX)
            }
            Command::DeregisterContainer(DeregisterContainer { container: c, .. })
            | Command::ExpireContainer(ExpireContainer { container: c, .. })
            | Command::Ack(Ack { container: c, .. })
            | Command::LaunchContainer(LaunchContainer { container: c, .. })
            | Command::CancelLaunch(CancelLaunch { container: c, .. }) => container(c),
            Command::AddInputs(c) => inputs(&c.inputs),
            Command::RemoveInputs(c) => inputs(&c.inputs),
            Command::AssignTask(c) => {
                task(&c.task)?;
                container(&c.container)?;
                inputs(&c.inputs)
            }
            Command::StopTask(StopTask {
                task: t,
                container: c,
                ..
            })
            | Command::TaskStarted(TaskStarted {
                task: t,
                container: c,
                ..
            })
            | Command::TaskStopped(TaskStopped {
                task: t,
                container: c,
                ..
            }) => {
                task(t)?;
                container(c)
            }
            Command::DesiredContainers(c) => text("reason", &c.reason, TEXT_BYTES_MAX),
            Command::SchemaChange(c) => text("subject", &c.subject, TEXT_BYTES_MAX),
            Command::ConfigChange(c) => {
                for (key, value) in &c.set {
                    text("config key", key, TEXT_BYTES_MAX)?;
                    text("config value", value, CONFIG_VALUE_BYTES_MAX)?;
                }
                c.remove
                    .iter()
                    .try_for_each(|key| text("config key", key, TEXT_BYTES_MAX))
            }
            Command::DesiredContainersV1(_)
            | Command::SetVocabularyLevel(_)
            | Command::Custom { .. }
            | Command::Unknown(_) => Ok(()),
        }
    }

    /// Who a built-in command is for; `None` for user and unknown commands, whose target the
    /// appender chooses. The replicated state machine refuses a built-in command appended with
    /// any other target, so a container filtering for itself never misses one meant for it.
    pub fn target(&self) -> Option<Target> {
        let to = |c: &ContainerId| Some(Target::Container(c.clone()));
        match self {
            // A container hears its own registration, deregistration and expiry: a zombie
            // learns from its own stream that it is fenced.
            Command::RegisterContainer(c) => to(&c.container),
            Command::DeregisterContainer(c) => to(&c.container),
            Command::ExpireContainer(c) => to(&c.container),
            Command::AssignTask(c) => to(&c.container),
            Command::StopTask(c) => to(&c.container),
            Command::SchemaChange(_)
            | Command::ConfigChange(_)
            | Command::SetVocabularyLevel(_) => Some(Target::All),
            Command::AddInputs(_)
            | Command::RemoveInputs(_)
            | Command::TaskStarted(_)
            | Command::TaskStopped(_)
            | Command::DesiredContainersV1(_)
            | Command::DesiredContainers(_)
            | Command::Ack(_)
            | Command::LaunchContainer(_)
            | Command::CancelLaunch(_) => Some(Target::Coordinator),
            Command::Custom { .. } | Command::Unknown(_) => None,
        }
    }

    /// The target an append of this command takes when its appender names none: the
    /// built-in command's own ([`target`](Self::target)), everyone for the others.
    pub fn default_target(&self) -> Target {
        self.target().unwrap_or(Target::All)
    }

    /// A user command; `kind` is offset into the user range so that it cannot collide with a
    /// built-in kind.
    pub fn custom(user_kind: u32, version: u16, payload: Vec<u8>) -> Command {
        Command::Custom {
            kind: CUSTOM_KIND_MIN.saturating_add(user_kind),
            version,
            payload,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An entry names a key exactly, or with a leading `*` every key ending with the rest;
    /// case never matters; only keys the change sets count (removing one is no secret).
    /// A name marks the keys it ends as whole segments; spaces, invisible characters,
    /// compatibility forms and look-alike letters do not hide a key.
    #[test]
    fn secret_keys_match_by_name_or_by_ending() {
        let marked = ["*password".to_string(), "sasl.jaas.config".to_string()];
        let setting = |key: &str| ConfigChange {
            set: [(key.to_string(), "v".to_string())].into(),
            remove: vec!["old.password".to_string()],
        };
        for (key, secret) in [
            ("db.password", true),
            ("DB.PASSWORD", true),
            ("password", true),
            ("sasl.jaas.config", true),
            ("SASL.JAAS.Config", true),
            // A longer key ending in the marked one's segments (issue 59).
            ("kafka.sasl.jaas.config", true),
            ("kafka/sasl.jaas.config", true),
            // Spaces, invisible characters, compatibility forms, look-alikes (issue 59).
            ("sasl.jaas.config ", true),
            (" db.password", true),
            ("sasl.jaas\u{200B}.config", true),
            ("ｓａｓｌ.jaas.config", true),
            ("db.p\u{0430}ssword", true),
            ("db.passw0rd", true),
            ("password.policy", false),
            ("jaas.config", false),
            ("xsasl.jaas.config", false),
            ("db.url", false),
        ] {
            let change = setting(key);
            assert_eq!(change.first_secret_key(&marked).is_some(), secret, "{key}");
        }
        assert_eq!(setting("db.password").first_secret_key(&[]), None);
    }

    /// Each case puts one field at or over its limit; a name is built without its checks, as
    /// a hostile client's bytes would decode.
    #[test]
    fn what_the_state_keeps_of_a_command_is_bounded() {
        let at = |n: usize| "x".repeat(n);
        // As a hostile client's bytes decode: the name's checks never ran.
        fn unchecked<T: serde::de::DeserializeOwned>(name: String) -> T {
            crate::log::decode(&crate::log::encode(&name), 1 << 20).unwrap()
        }
        let raw_container = |n: usize| unchecked::<ContainerId>(at(n));
        let register = |container: ContainerId, location: String| {
            Command::RegisterContainer(RegisterContainer {
                container,
                location,
            })
        };
        let config = |key: String, value: String| {
            Command::ConfigChange(ConfigChange {
                set: [(key, value)].into(),
                remove: Vec::new(),
            })
        };
        let cases: [(&str, Command, bool); 8] = [
            (
                "a location at the limit",
                register(raw_container(8), at(TEXT_BYTES_MAX)),
                true,
            ),
            (
                "a location over it",
                register(raw_container(8), at(TEXT_BYTES_MAX + 1)),
                false,
            ),
            (
                "a container id at the limit",
                register(raw_container(NAME_BYTES_MAX), at(1)),
                true,
            ),
            (
                "a container id over it",
                register(raw_container(NAME_BYTES_MAX + 1), at(1)),
                false,
            ),
            (
                "a task name over the limit",
                Command::TaskStarted(TaskStarted {
                    task: unchecked(at(NAME_BYTES_MAX + 1)),
                    container: raw_container(8),
                    epoch: 1,
                }),
                false,
            ),
            (
                "a config value at the limit",
                config(at(8), at(CONFIG_VALUE_BYTES_MAX)),
                true,
            ),
            (
                "a config key over the limit",
                config(at(TEXT_BYTES_MAX + 1), at(1)),
                false,
            ),
            (
                "a schema subject over the limit",
                Command::SchemaChange(SchemaChange {
                    subject: at(TEXT_BYTES_MAX + 1),
                    schema: Vec::new(),
                }),
                false,
            ),
        ];
        for (what, command, accepted) in cases {
            assert_eq!(command.check_limits().is_ok(), accepted, "{what}");
        }
    }

    #[test]
    fn custom_round_trips_through_its_frame() {
        let command = Command::custom(7, 2, b"hello".to_vec());
        let frame = command.clone().into_frame();
        assert_eq!(frame.kind, CUSTOM_KIND_MIN + 7);
        assert_eq!(Command::from_frame(frame), command);
    }

    #[test]
    fn unknown_builtin_kind_passes_through_unchanged() {
        let frame = Frame {
            kind: 4242,
            version: 9,
            body: vec![1, 2, 3],
        };
        let command = Command::from_frame(frame.clone());
        assert_eq!(command, Command::Unknown(frame.clone()));
        assert_eq!(command.into_frame(), frame);
    }

    #[test]
    fn every_builtin_round_trips_through_its_frame() {
        for command in super::super::vocabulary::examples() {
            let frame = command.clone().into_frame();
            assert!(frame.kind < CUSTOM_KIND_MIN);
            assert_eq!(Command::from_frame(frame), command);
        }
    }
}
