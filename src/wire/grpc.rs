//! The gRPC contract (`proto/ctrlog/v1`) in Rust: the messages and services that prost and
//! tonic generate from it at build time ([`pb`]), and their conversions to and from
//! ctrlog's own types. The conversions are the whole of what the gRPC port adds to the rules
//! both client-facing ports share (`server::ports::calls`): a request that does not convert
//! is refused `InvalidArgument`, the same refusal a malformed tarpc request gets.

use std::collections::BTreeMap;

use prost::Message;

use crate::jobs::{ContainerStatus, JobState, TaskPhase};
use crate::log::{
    Ack, AddInputs, AssignTask, CancelLaunch, Command, ConfigChange, ContainerId,
    DeregisterContainer, DesiredContainers, DesiredContainersV1, ExpireContainer, Filter, Frame,
    Input, LaunchContainer, LogEntry, ProducerSeq, Proposal, RegisterContainer, RemoveInputs,
    SchemaChange, SetVocabularyLevel, StopTask, Target, TaskId, TaskStarted, TaskStopped,
};
use crate::wire::protocol::{ApiError, AppendAck, Status, StorageStatus};

/// What prost and tonic generate from `proto/`.
#[allow(missing_docs, clippy::all)]
pub mod pb {
    tonic::include_proto!("ctrlog.v1");

    /// The standard rich-error envelope, `google.rpc.Status`.
    pub mod rpc {
        tonic::include_proto!("google.rpc");
    }

    /// The encoded `FileDescriptorSet` of every file under `proto/`: what the reflection
    /// service serves, and what the compatibility test compares with its fixture.
    pub const FILE_DESCRIPTOR_SET: &[u8] =
        include_bytes!(concat!(env!("OUT_DIR"), "/ctrlog_v1_descriptor.bin"));
}

/// The type URL of the one detail of a refusal's `google.rpc.Status`.
pub const ERROR_TYPE_URL: &str = "type.googleapis.com/ctrlog.v1.Error";

fn invalid(what: impl std::fmt::Display) -> ApiError {
    ApiError::Invalid(what.to_string())
}

/// A container's id as a request names it; `Invalid` unless it is one.
pub fn container(id: String) -> Result<ContainerId, ApiError> {
    ContainerId::new(id).map_err(invalid)
}

fn task(id: String) -> Result<TaskId, ApiError> {
    TaskId::new(id).map_err(invalid)
}

fn version(version: u32) -> Result<u16, ApiError> {
    u16::try_from(version).map_err(|_| invalid(format!("version {version} is above 65535")))
}

fn input(input: pb::Input) -> Result<Input, ApiError> {
    Input::new(input.system, input.stream, input.partition).map_err(invalid)
}

fn inputs(list: Vec<pb::Input>) -> Result<Vec<Input>, ApiError> {
    list.into_iter().map(input).collect()
}

fn input_of(input: &Input) -> pb::Input {
    pb::Input {
        system: input.system.clone(),
        stream: input.stream.clone(),
        partition: input.partition,
    }
}

impl From<&Frame> for pb::Frame {
    fn from(frame: &Frame) -> pb::Frame {
        pb::Frame {
            kind: frame.kind,
            version: frame.version.into(),
            body: frame.body.clone(),
        }
    }
}

impl TryFrom<pb::Frame> for Frame {
    type Error = ApiError;

    fn try_from(frame: pb::Frame) -> Result<Frame, ApiError> {
        Ok(Frame {
            kind: frame.kind,
            version: version(frame.version)?,
            body: frame.body,
        })
    }
}

impl TryFrom<pb::Command> for Command {
    type Error = ApiError;

    fn try_from(command: pb::Command) -> Result<Command, ApiError> {
        use pb::command::Command as C;
        let Some(command) = command.command else {
            return Err(invalid("a command with none of its cases set"));
        };
        Ok(match command {
            C::RegisterContainer(c) => Command::RegisterContainer(RegisterContainer {
                container: container(c.container)?,
                location: c.location,
            }),
            C::DeregisterContainer(c) => Command::DeregisterContainer(DeregisterContainer {
                container: container(c.container)?,
                epoch: c.epoch,
            }),
            C::ExpireContainer(c) => Command::ExpireContainer(ExpireContainer {
                container: container(c.container)?,
                epoch: c.epoch,
            }),
            C::AddInputs(c) => Command::AddInputs(AddInputs {
                inputs: inputs(c.inputs)?,
            }),
            C::RemoveInputs(c) => Command::RemoveInputs(RemoveInputs {
                inputs: inputs(c.inputs)?,
            }),
            C::AssignTask(c) => Command::AssignTask(AssignTask {
                task: task(c.task)?,
                container: container(c.container)?,
                epoch: c.epoch,
                inputs: inputs(c.inputs)?,
            }),
            C::StopTask(c) => Command::StopTask(StopTask {
                task: task(c.task)?,
                container: container(c.container)?,
                epoch: c.epoch,
            }),
            C::TaskStarted(c) => Command::TaskStarted(TaskStarted {
                task: task(c.task)?,
                container: container(c.container)?,
                epoch: c.epoch,
            }),
            C::TaskStopped(c) => Command::TaskStopped(TaskStopped {
                task: task(c.task)?,
                container: container(c.container)?,
                epoch: c.epoch,
                checkpoint: c.checkpoint,
            }),
            C::DesiredContainersV1(c) => {
                Command::DesiredContainersV1(DesiredContainersV1 { count: c.count })
            }
            C::DesiredContainers(c) => Command::DesiredContainers(DesiredContainers {
                count: c.count,
                reason: c.reason,
            }),
            C::SchemaChange(c) => Command::SchemaChange(SchemaChange {
                subject: c.subject,
                schema: c.schema,
            }),
            C::ConfigChange(c) => Command::ConfigChange(ConfigChange {
                set: c.set.into_iter().collect(),
                remove: c.remove,
            }),
            C::Ack(c) => Command::Ack(Ack {
                container: container(c.container)?,
                epoch: c.epoch,
                offset: c.offset,
            }),
            C::SetVocabularyLevel(c) => Command::SetVocabularyLevel(SetVocabularyLevel {
                level: version(c.level)?,
            }),
            C::LaunchContainer(c) => Command::LaunchContainer(LaunchContainer {
                container: container(c.container)?,
                attempt: c.attempt,
            }),
            C::CancelLaunch(c) => Command::CancelLaunch(CancelLaunch {
                container: container(c.container)?,
                launch: c.launch,
            }),
        })
    }
}

/// The typed form of a built-in command; `None` for a custom or unknown one.
pub fn typed(command: &Command) -> Option<pb::Command> {
    use pb::command::Command as C;
    let c = |c: &ContainerId| c.to_string();
    let command = match command {
        Command::RegisterContainer(x) => C::RegisterContainer(pb::RegisterContainer {
            container: c(&x.container),
            location: x.location.clone(),
        }),
        Command::DeregisterContainer(x) => C::DeregisterContainer(pb::DeregisterContainer {
            container: c(&x.container),
            epoch: x.epoch,
        }),
        Command::ExpireContainer(x) => C::ExpireContainer(pb::ExpireContainer {
            container: c(&x.container),
            epoch: x.epoch,
        }),
        Command::AddInputs(x) => C::AddInputs(pb::AddInputs {
            inputs: x.inputs.iter().map(input_of).collect(),
        }),
        Command::RemoveInputs(x) => C::RemoveInputs(pb::RemoveInputs {
            inputs: x.inputs.iter().map(input_of).collect(),
        }),
        Command::AssignTask(x) => C::AssignTask(pb::AssignTask {
            task: x.task.to_string(),
            container: c(&x.container),
            epoch: x.epoch,
            inputs: x.inputs.iter().map(input_of).collect(),
        }),
        Command::StopTask(x) => C::StopTask(pb::StopTask {
            task: x.task.to_string(),
            container: c(&x.container),
            epoch: x.epoch,
        }),
        Command::TaskStarted(x) => C::TaskStarted(pb::TaskStarted {
            task: x.task.to_string(),
            container: c(&x.container),
            epoch: x.epoch,
        }),
        Command::TaskStopped(x) => C::TaskStopped(pb::TaskStopped {
            task: x.task.to_string(),
            container: c(&x.container),
            epoch: x.epoch,
            checkpoint: x.checkpoint.clone(),
        }),
        Command::DesiredContainersV1(x) => {
            C::DesiredContainersV1(pb::DesiredContainersV1 { count: x.count })
        }
        Command::DesiredContainers(x) => C::DesiredContainers(pb::DesiredContainers {
            count: x.count,
            reason: x.reason.clone(),
        }),
        Command::SchemaChange(x) => C::SchemaChange(pb::SchemaChange {
            subject: x.subject.clone(),
            schema: x.schema.clone(),
        }),
        Command::ConfigChange(x) => C::ConfigChange(pb::ConfigChange {
            set: x.set.clone().into_iter().collect(),
            remove: x.remove.clone(),
        }),
        Command::Ack(x) => C::Ack(pb::Ack {
            container: c(&x.container),
            epoch: x.epoch,
            offset: x.offset,
        }),
        Command::SetVocabularyLevel(x) => C::SetVocabularyLevel(pb::SetVocabularyLevel {
            level: x.level.into(),
        }),
        Command::LaunchContainer(x) => C::LaunchContainer(pb::LaunchContainer {
            container: c(&x.container),
            attempt: x.attempt,
        }),
        Command::CancelLaunch(x) => C::CancelLaunch(pb::CancelLaunch {
            container: c(&x.container),
            launch: x.launch,
        }),
        Command::Custom { .. } | Command::Unknown(_) => return None,
    };
    Some(pb::Command {
        command: Some(command),
    })
}

fn target_of(target: &Target) -> (pb::Target, String) {
    match target {
        Target::All => (pb::Target::All, String::new()),
        Target::Container(id) => (pb::Target::Container, id.to_string()),
        Target::Coordinator => (pb::Target::Coordinator, String::new()),
    }
}

fn producer_of(pair: Option<pb::ProducerSeq>) -> Option<ProducerSeq> {
    pair.map(|pair| ProducerSeq {
        producer: pair.producer,
        seq: pair.seq,
    })
}

impl TryFrom<pb::AppendRequest> for Proposal {
    type Error = ApiError;

    fn try_from(request: pb::AppendRequest) -> Result<Proposal, ApiError> {
        let command = match request.command {
            Some(pb::append_request::Command::Typed(typed)) => Command::try_from(typed)?,
            Some(pb::append_request::Command::Frame(frame)) => {
                Command::from_frame(Frame::try_from(frame)?)
            }
            None => {
                return Err(invalid(
                    "an append with neither a typed command nor a frame",
                ))
            }
        };
        let target = match pb::Target::try_from(request.target) {
            Ok(pb::Target::Unspecified) => command.default_target(),
            Ok(pb::Target::All) => Target::All,
            Ok(pb::Target::Coordinator) => Target::Coordinator,
            Ok(pb::Target::Container) => Target::Container(container(request.target_container)?),
            Err(_) => return Err(invalid(format!("unknown target {}", request.target))),
        };
        Ok(Proposal {
            producer: producer_of(request.producer),
            target,
            frame: command.into_frame(),
        })
    }
}

/// The proposal of a container's registration (the join), with its producer pair.
pub fn join(request: pb::JoinRequest) -> Result<Proposal, ApiError> {
    let command = Command::RegisterContainer(RegisterContainer {
        container: container(request.container)?,
        location: request.location,
    });
    Ok(Proposal {
        producer: producer_of(request.producer),
        ..Proposal::of_command(command)
    })
}

/// The proposal of a container's deregistration (the leave), with its producer pair.
pub fn leave(request: pb::LeaveRequest) -> Result<Proposal, ApiError> {
    let command = Command::DeregisterContainer(DeregisterContainer {
        container: container(request.container)?,
        epoch: request.epoch,
    });
    Ok(Proposal {
        producer: producer_of(request.producer),
        ..Proposal::of_command(command)
    })
}

/// The filter of a subscription: a container's, or the whole log for none.
pub fn filter(container_id: String) -> Result<Filter, ApiError> {
    if container_id.is_empty() {
        return Ok(Filter::Everything);
    }
    Ok(Filter::Container(container(container_id)?))
}

/// The lag of a heartbeat, each task's name checked.
pub fn lag(lag: std::collections::HashMap<String, u64>) -> Result<BTreeMap<TaskId, u64>, ApiError> {
    lag.into_iter()
        .map(|(name, lag)| Ok((task(name)?, lag)))
        .collect()
}

impl From<&LogEntry> for pb::Entry {
    fn from(entry: &LogEntry) -> pb::Entry {
        let (target, target_container) = target_of(&entry.target);
        pb::Entry {
            offset: entry.offset,
            term: entry.term,
            appended_at_ms: entry.appended_at_ms,
            producer: entry.producer.map(|pair| pb::ProducerSeq {
                producer: pair.producer,
                seq: pair.seq,
            }),
            target: target.into(),
            target_container,
            frame: Some((&entry.frame).into()),
            command: typed(&entry.command()),
        }
    }
}

impl From<AppendAck> for pb::AppendReply {
    fn from(ack: AppendAck) -> pb::AppendReply {
        pb::AppendReply {
            offset: ack.offset,
            duplicate: ack.duplicate,
        }
    }
}

/// Most containers and tasks in one part of a state answer: a part stays well within gRPC's
/// default 4 MiB message limit with names at their longest.
pub const STATE_PART_RECORDS_MAX: usize = 1_000;

/// The job's state as of `offset`, in parts: the job-wide fields first, then containers and
/// tasks [`STATE_PART_RECORDS_MAX`] at a time.
pub fn state_parts(offset: u64, state: &JobState) -> Vec<pb::StatePart> {
    let containers: Vec<pb::ContainerState> = (state.containers().iter())
        .map(|(id, record)| pb::ContainerState {
            container: id.to_string(),
            epoch: record.epoch,
            status: match record.status {
                ContainerStatus::Live => pb::ContainerStatus::Live,
                ContainerStatus::Deregistered => pb::ContainerStatus::Deregistered,
                ContainerStatus::Expired => pb::ContainerStatus::Expired,
                ContainerStatus::Launching { .. } => pb::ContainerStatus::Launching,
            }
            .into(),
            location: record.location.clone(),
            registered_at_ms: record.registered_at_ms,
        })
        .collect();
    let tasks: Vec<pb::TaskState> = (state.tasks().iter())
        .map(|(id, record)| {
            let (phase, at) = match &record.phase {
                TaskPhase::Unassigned => (pb::TaskPhase::Unassigned, 0),
                TaskPhase::Starting { at, .. } => (pb::TaskPhase::Starting, *at),
                TaskPhase::Running { since, .. } => (pb::TaskPhase::Running, *since),
                TaskPhase::Stopping { at, .. } => (pb::TaskPhase::Stopping, *at),
            };
            let owner = record.phase.owner();
            pb::TaskState {
                task: id.to_string(),
                inputs: record.inputs.iter().map(input_of).collect(),
                phase: phase.into(),
                owner_container: owner.map(|o| o.container.to_string()),
                owner_epoch: owner.map(|o| o.epoch),
                phase_offset: at,
                checkpoint: record.checkpoint.clone(),
            }
        })
        .collect();
    let mut parts = vec![pb::StatePart {
        offset,
        vocabulary_level: state.level().into(),
        config: state.config().clone().into_iter().collect(),
        pending: state.pending().keys().copied().collect(),
        ..Default::default()
    }];
    let mut containers = containers.into_iter().peekable();
    let mut tasks = tasks.into_iter().peekable();
    while containers.peek().is_some() || tasks.peek().is_some() {
        let part = match parts.last_mut() {
            Some(part) if part.containers.len() + part.tasks.len() < STATE_PART_RECORDS_MAX => part,
            _ => {
                parts.push(pb::StatePart {
                    offset,
                    vocabulary_level: state.level().into(),
                    ..Default::default()
                });
                parts.last_mut().expect("just pushed")
            }
        };
        if let Some(record) = containers.next() {
            part.containers.push(record);
        } else if let Some(record) = tasks.next() {
            part.tasks.push(record);
        }
    }
    if let Some(last) = parts.last_mut() {
        last.last = true;
    }
    parts
}

impl From<Status> for pb::StatusReply {
    fn from(status: Status) -> pb::StatusReply {
        pb::StatusReply {
            id: status.id,
            role: status.role,
            term: status.term,
            leader_id: status.leader_id,
            members: (status.members.into_iter())
                .map(|m| pb::MemberStatus {
                    id: m.id,
                    peer_addr: m.member.peer_addr,
                    client_addr: m.member.client_addr,
                    grpc_addr: None,
                    voter: m.voter,
                })
                .collect(),
            last_log_index: status.last_log_index,
            applied_index: status.applied_index,
            applied_offset: status.applied_offset,
            first_offset: status.first_offset,
            snapshot_offset: status.snapshot_offset,
            vocabulary_level: status.vocabulary_level.into(),
            vocabulary_level_max: status.vocabulary_level_max.into(),
            snapshot_index: status.snapshot_index,
            purged_index: status.purged_index,
        }
    }
}

impl From<StorageStatus> for pb::StorageStatusReply {
    fn from(status: StorageStatus) -> pb::StorageStatusReply {
        pb::StorageStatusReply {
            id: status.id,
            repairing: status.repairing.map(|r| pb::Repairing {
                first_damaged: r.first_damaged,
                held_index: r.held_index,
                segment: r.segment,
                byte: r.byte,
            }),
        }
    }
}

/// A refusal as its typed detail.
pub fn error_detail(error: &ApiError) -> pb::Error {
    use pb::error::Error as E;
    let detail = match error.clone() {
        ApiError::NotLeader {
            leader_id,
            leader_client_addr,
        } => E::NotLeader(pb::NotLeader {
            leader_id,
            leader_grpc_addr: None,
            leader_client_addr,
        }),
        ApiError::TooLarge { size, limit } | ApiError::AnswerTooLarge { size, limit } => {
            E::TooLarge(pb::TooLarge { size, limit })
        }
        ApiError::Compacted {
            first_offset,
            snapshot_offset,
        } => E::Compacted(pb::Compacted {
            first_offset,
            snapshot_offset,
        }),
        ApiError::SequenceOutOfWindow {
            producer,
            seq,
            lowest,
        } => E::SequenceOutOfWindow(pb::SequenceOutOfWindow {
            producer,
            seq,
            lowest,
        }),
        ApiError::Fenced {
            container,
            epoch,
            current_epoch,
        } => E::Fenced(pb::Fenced {
            container: container.to_string(),
            epoch,
            current_epoch,
        }),
        ApiError::Deprecated {
            kind,
            version,
            level,
        } => E::Deprecated(pb::Deprecated {
            kind,
            version: version.into(),
            level: level.into(),
        }),
        ApiError::Refused(rejection) => E::Refused(rejection.to_string()),
        ApiError::Overloaded { in_flight_max } => E::Overloaded(pb::Overloaded { in_flight_max }),
        ApiError::Invalid(why) => E::Invalid(why),
        ApiError::Unavailable(why) => E::Unavailable(why),
        ApiError::ShuttingDown => E::ShuttingDown(pb::ShuttingDown {}),
        ApiError::Unauthorized(why) => E::Unauthenticated(why),
        ApiError::Forbidden { principal, action } => {
            E::Forbidden(pb::Forbidden { principal, action })
        }
        ApiError::ProducerForgotten { producer, seq } => {
            E::ProducerForgotten(pb::ProducerForgotten { producer, seq })
        }
        ApiError::MemberLevelUnsupported {
            member,
            supported,
            recorded,
        } => E::MemberLevelUnsupported(pb::MemberLevelUnsupported {
            member,
            supported: supported.into(),
            recorded: recorded.into(),
        }),
        other @ (ApiError::Rejected(_)
        | ApiError::ProtocolUnsupported { .. }
        | ApiError::OtherCluster { .. }) => E::Rejected(other.to_string()),
    };
    pb::Error {
        error: Some(detail),
    }
}

/// The gRPC code of a refusal (the table of `errors.proto`).
pub fn code_of(error: &ApiError) -> tonic::Code {
    use tonic::Code;
    match error {
        ApiError::NotLeader { .. } | ApiError::Unavailable(_) | ApiError::ShuttingDown => {
            Code::Unavailable
        }
        ApiError::Overloaded { .. } => Code::ResourceExhausted,
        ApiError::Compacted { .. } => Code::OutOfRange,
        ApiError::TooLarge { .. } | ApiError::AnswerTooLarge { .. } | ApiError::Invalid(_) => {
            Code::InvalidArgument
        }
        ApiError::Unauthorized(_) => Code::Unauthenticated,
        ApiError::Forbidden { .. } => Code::PermissionDenied,
        _ => Code::FailedPrecondition,
    }
}

/// A refusal as a gRPC status: its code, its words, and its typed detail in a
/// `google.rpc.Status` (the `grpc-status-details-bin` trailer). `leader_grpc_addr` fills a
/// `NotLeader`'s gRPC address when the port knows it.
pub fn status_of(error: &ApiError, leader_grpc_addr: Option<String>) -> tonic::Status {
    let code = code_of(error);
    let mut detail = error_detail(error);
    if let Some(pb::error::Error::NotLeader(not_leader)) = &mut detail.error {
        not_leader.leader_grpc_addr = leader_grpc_addr;
    }
    let message = error.to_string();
    let envelope = pb::rpc::Status {
        code: code as i32,
        message: message.clone(),
        details: vec![prost_types::Any {
            type_url: ERROR_TYPE_URL.into(),
            value: detail.encode_to_vec(),
        }],
    };
    tonic::Status::with_details(code, message, envelope.encode_to_vec().into())
}

/// The typed detail of a status the gRPC port answered, if it carries one.
pub fn detail_of(status: &tonic::Status) -> Option<pb::Error> {
    let envelope = pb::rpc::Status::decode(status.details()).ok()?;
    let any = envelope
        .details
        .into_iter()
        .find(|any| any.type_url == ERROR_TYPE_URL)?;
    pb::Error::decode(any.value.as_slice()).ok()
}
