//! Kind numbers: the built-in ones, and where the users' begin. Numbers are never reused; a
//! changed body is a new version.

/// A command kind number. Built-in kinds live below [`CUSTOM_KIND_MIN`]; the space above it
/// belongs to users, so a user kind can never collide with a kind a later release adds.
pub type Kind = u32;

/// The first kind number reserved for user [`Command::Custom`](super::Command::Custom)
/// commands.
pub const CUSTOM_KIND_MIN: Kind = 0x1000_0000;

/// `register-container`: [`RegisterContainer`](super::RegisterContainer).
pub const REGISTER_CONTAINER: Kind = 1;
/// `deregister-container`: [`DeregisterContainer`](super::DeregisterContainer).
pub const DEREGISTER_CONTAINER: Kind = 2;
/// `expire-container`: [`ExpireContainer`](super::ExpireContainer).
pub const EXPIRE_CONTAINER: Kind = 3;
/// `launch-container`: [`LaunchContainer`](super::LaunchContainer), from level 3.
pub const LAUNCH_CONTAINER: Kind = 4;
/// `cancel-launch`: [`CancelLaunch`](super::CancelLaunch), from level 3.
pub const CANCEL_LAUNCH: Kind = 5;
/// `add-inputs`: [`AddInputs`](super::AddInputs).
pub const ADD_INPUTS: Kind = 10;
/// `remove-inputs`: [`RemoveInputs`](super::RemoveInputs).
pub const REMOVE_INPUTS: Kind = 11;
/// `assign-task`: [`AssignTask`](super::AssignTask).
pub const ASSIGN_TASK: Kind = 20;
/// `stop-task`: [`StopTask`](super::StopTask).
pub const STOP_TASK: Kind = 21;
/// `task-started`: [`TaskStarted`](super::TaskStarted).
pub const TASK_STARTED: Kind = 22;
/// `task-stopped`: [`TaskStopped`](super::TaskStopped).
pub const TASK_STOPPED: Kind = 23;
/// `desired-containers`: version 1 is [`DesiredContainersV1`](super::DesiredContainersV1),
/// deprecated at level 2; version 2 is [`DesiredContainers`](super::DesiredContainers).
pub const DESIRED_CONTAINERS: Kind = 30;
/// `schema-change`: [`SchemaChange`](super::SchemaChange).
pub const SCHEMA_CHANGE: Kind = 40;
/// `config-change`: [`ConfigChange`](super::ConfigChange).
pub const CONFIG_CHANGE: Kind = 41;
/// `ack`: [`Ack`](super::Ack).
pub const ACK: Kind = 50;
/// `set-vocabulary-level`: [`SetVocabularyLevel`](super::SetVocabularyLevel).
pub const SET_VOCABULARY_LEVEL: Kind = 60;
