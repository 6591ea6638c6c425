//! Scenario scripts of the fold and the plan: each file of `src/jobs/scenarios/` is a script
//! of commands, each followed by the trace it gives after `---` (goldenscript's format, as
//! toydb's Raft tests and raft-rs's datadriven tests are). A changed trace fails the test with
//! a diff; `UPDATE_GOLDENFILES=1 cargo test --lib jobs::scenarios` writes the traces anew, to
//! be read before they are committed.
//!
//! The fold, one command each (`c` a container, `t` a task, `p` a partition of
//! `kafka/events`; a missing `epoch=` is the container's live epoch; names are taken as
//! written, even those the naming rules refuse, such as `'has space'`):
//!
//! * `register c [location=L]`, `deregister c`, `expire c`, `launch c [attempt=N]`,
//!   `cancel-launch c launch=OFFSET`;
//! * `add-inputs p...`, `remove-inputs p...` (`0..4` is 0 1 2 3);
//! * `assign t c inputs=p,p`, `stop t c`, `started t c`, `stopped t c [checkpoint=S]`;
//! * `desired N [reason=R] [v1=true]`, `schema SUBJECT TEXT`, `config K=V...`,
//!   `config-remove K...`, `ack OFFSET c`, `level N`, `custom KIND BODY`,
//!   `unknown KIND VERSION`, `malformed KIND` (a frame of KIND whose body does not decode);
//! * on any of them: `to=c|all` (the target, instead of the command's own),
//!   `producer=P seq=S` (an idempotent append), `epoch=E`.
//!
//! Each prints `#offset` and what the command does, or why it took no offset (the runner
//! checks that such a command changed nothing). `state` prints the job; `containers [c...]`
//! how many containers it keeps, and the status of each one named (or `forgotten`). Two
//! commands append many at once and print the offsets they took: `churn N` registers and
//! expires `c0` to `cN-1`, one after the other; `producers N from=P` has producers `P` to
//! `P+N-1` append a custom command each, at sequence 1.
//!
//! The plan: `source p...|none` (the inputs the source lists), `want N` (the desired count the
//! controller acts on), `overdue c...`, `launching N`, `orchestrated true|false`; `plan`
//! prints the next steps, `step` also appends them (containers the plan launches are then
//! registered by the script); `answer` has every live container answer what it owes (task
//! started or stopped, broadcast acks); `settle` repeats `step` and `answer` until the plan is
//! empty; `settled TASKS CONTAINERS`, `loads`, `owed`, `draining N` (the containers drained
//! when N are wanted) print the plan's views of the state; `lag TOTAL [after_ms=MS]` asks a
//! lag policy (min 1, max 4, out above 100 per container, in below 10, cooldown 60 s) for the
//! count.
//!
//! The leader's heartbeat table, tracking from 0 ms (`after_ms=` is 0 when not given):
//! `heartbeat c [after_ms=MS] [t=LAG...]` records a heartbeat of c's live session with the lag
//! it reports per task; `silent [after_ms=MS]` prints the live sessions silent for over 2 s at
//! MS, or `none`; `reported` prints the lag each live session reported for its own tasks, and
//! the total.

use std::collections::BTreeMap;
use std::error::Error;
use std::fmt::Write as _;
use std::sync::Arc;
use std::time::{Duration, Instant};

use goldenscript::{Argument, Command as Line};

use super::plan::{self, Action, GroupByPartition, LagPolicy, Observed, ScalingPolicy};
use super::*;
use crate::log::*;

type Failure = Box<dyn Error>;

/// A JobState driven by a script, with what the controller would observe beside it.
struct Scenario {
    state: JobState,
    observed: Observed,
    policy: LagPolicy,
    liveness: Liveness,
    /// The script's clock: 0 ms of `after_ms=`.
    start: Instant,
    now_ms: u64,
}

impl Default for Scenario {
    fn default() -> Scenario {
        let start = Instant::now();
        Scenario {
            state: JobState::default(),
            observed: Observed::default(),
            policy: LagPolicy::new(1, 4, 100, 10, Duration::from_secs(60)),
            liveness: Liveness::new(1, start),
            start,
            now_ms: 1_000,
        }
    }
}

/// A container id as written, even one the naming rules refuse (the fold refuses it then).
fn container(name: &str) -> Result<ContainerId, Failure> {
    Ok(serde_json::from_value(name.into())?)
}

/// A task name as written, even one the naming rules refuse.
fn task(name: &str) -> Result<TaskId, Failure> {
    Ok(serde_json::from_value(name.into())?)
}

/// A container's status in words.
fn status(status: &ContainerStatus) -> String {
    match status {
        ContainerStatus::Live => "live".to_string(),
        ContainerStatus::Deregistered => "deregistered".to_string(),
        ContainerStatus::Expired => "expired".to_string(),
        ContainerStatus::Launching { attempt } => format!("launching (attempt {attempt})"),
    }
}

/// Partitions of `kafka/events`, each written `p` or `from..to`.
fn inputs<'a>(written: impl IntoIterator<Item = &'a str>) -> Result<Vec<Input>, Failure> {
    let mut inputs = Vec::new();
    for part in written {
        let (from, to) = match part.split_once("..") {
            Some((from, to)) => (from.parse::<u32>()?, to.parse::<u32>()?),
            None => (part.parse::<u32>()?, part.parse::<u32>()? + 1),
        };
        for partition in from..to {
            inputs.push(Input::new("kafka", "events", partition)?);
        }
    }
    Ok(inputs)
}

/// The positional arguments of `line`, and its `key=value` ones.
fn split(line: &Line) -> (Vec<&str>, BTreeMap<&str, &str>) {
    let positional = (line.args.iter())
        .filter(|a| a.key.is_none())
        .map(|a| a.value.as_str())
        .collect();
    let keyed = (line.args.iter())
        .filter_map(|a: &Argument| Some((a.key.as_deref()?, a.value.as_str())))
        .collect();
    (positional, keyed)
}

fn nth<'a>(positional: &[&'a str], at: usize, what: &str) -> Result<&'a str, Failure> {
    positional
        .get(at)
        .copied()
        .ok_or_else(|| format!("missing {what}").into())
}

impl Scenario {
    /// The epoch of `name`'s live session, or the `epoch=` given.
    fn epoch(&self, name: &ContainerId, keyed: &BTreeMap<&str, &str>) -> Result<Epoch, Failure> {
        if let Some(epoch) = keyed.get("epoch") {
            return Ok(epoch.parse()?);
        }
        (self.state.live_session(name))
            .map(|s| s.epoch)
            .ok_or_else(|| format!("{name} has no live session: give epoch=").into())
    }

    /// The command a fold line writes, or `None` for a line of another kind.
    fn command(&self, line: &Line) -> Result<Option<Command>, Failure> {
        let (at, keyed) = split(line);
        let named = |i| nth(&at, i, "a container").and_then(container);
        let session = |i| -> Result<(ContainerId, Epoch), Failure> {
            let name = named(i)?;
            let epoch = self.epoch(&name, &keyed)?;
            Ok((name, epoch))
        };
        let command = match line.name.as_str() {
            "register" => Command::RegisterContainer(RegisterContainer {
                container: named(0)?,
                location: keyed.get("location").unwrap_or(&"host").to_string(),
            }),
            "deregister" => {
                let (container, epoch) = session(0)?;
                Command::DeregisterContainer(DeregisterContainer { container, epoch })
            }
            "expire" => {
                let (container, epoch) = session(0)?;
                Command::ExpireContainer(ExpireContainer { container, epoch })
            }
            "launch" => Command::LaunchContainer(LaunchContainer {
                container: named(0)?,
                attempt: keyed.get("attempt").map_or(Ok(1), |a| a.parse())?,
            }),
            "cancel-launch" => Command::CancelLaunch(CancelLaunch {
                container: named(0)?,
                launch: keyed.get("launch").ok_or("missing launch=")?.parse()?,
            }),
            "add-inputs" => Command::AddInputs(AddInputs {
                inputs: inputs(at.iter().copied())?,
            }),
            "remove-inputs" => Command::RemoveInputs(RemoveInputs {
                inputs: inputs(at.iter().copied())?,
            }),
            "assign" => {
                let (container, epoch) = session(1)?;
                let listed = keyed.get("inputs").copied().unwrap_or("");
                Command::AssignTask(AssignTask {
                    task: task(nth(&at, 0, "a task")?)?,
                    container,
                    epoch,
                    inputs: inputs(listed.split(',').filter(|p| !p.is_empty()))?,
                })
            }
            "stop" | "started" | "stopped" => {
                let (container, epoch) = session(1)?;
                let task = task(nth(&at, 0, "a task")?)?;
                match line.name.as_str() {
                    "stop" => Command::StopTask(StopTask {
                        task,
                        container,
                        epoch,
                    }),
                    "started" => Command::TaskStarted(TaskStarted {
                        task,
                        container,
                        epoch,
                    }),
                    _ => Command::TaskStopped(TaskStopped {
                        task,
                        container,
                        epoch,
                        checkpoint: keyed.get("checkpoint").map(|c| c.as_bytes().to_vec()),
                    }),
                }
            }
            "desired" => {
                let count = nth(&at, 0, "a count")?.parse()?;
                match keyed.get("v1") {
                    Some(&"true") => Command::DesiredContainersV1(DesiredContainersV1 { count }),
                    _ => Command::DesiredContainers(DesiredContainers {
                        count,
                        reason: keyed.get("reason").unwrap_or(&"").to_string(),
                    }),
                }
            }
            "schema" => Command::SchemaChange(SchemaChange {
                subject: nth(&at, 0, "a subject")?.to_string(),
                schema: nth(&at, 1, "a schema")?.as_bytes().to_vec(),
            }),
            "config" => Command::ConfigChange(ConfigChange {
                set: (keyed.iter())
                    .filter(|(k, _)| !["to", "producer", "seq"].contains(k))
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect(),
                remove: Vec::new(),
            }),
            "config-remove" => Command::ConfigChange(ConfigChange {
                set: BTreeMap::new(),
                remove: at.iter().map(|k| k.to_string()).collect(),
            }),
            "ack" => {
                let (container, epoch) = session(1)?;
                Command::Ack(Ack {
                    container,
                    epoch,
                    offset: nth(&at, 0, "an offset")?.parse()?,
                })
            }
            "level" => Command::SetVocabularyLevel(SetVocabularyLevel {
                level: nth(&at, 0, "a level")?.parse()?,
            }),
            "custom" => Command::custom(
                nth(&at, 0, "a kind")?.parse()?,
                1,
                nth(&at, 1, "a body")?.as_bytes().to_vec(),
            ),
            "unknown" => Command::Unknown(Frame {
                kind: nth(&at, 0, "a kind")?.parse()?,
                version: nth(&at, 1, "a version")?.parse()?,
                body: Vec::new(),
            }),
            "malformed" => Command::Unknown(Frame {
                kind: nth(&at, 0, "a kind")?.parse()?,
                version: 1,
                body: vec![0xff; 5],
            }),
            _ => return Ok(None),
        };
        Ok(Some(command))
    }

    /// Folds `command` with `target` (its own when `None`) and says what came of it; fails if
    /// a command that took no offset changed the state.
    fn fold(
        &mut self,
        command: Command,
        target: Option<Target>,
        producer: Option<ProducerSeq>,
    ) -> Result<String, Failure> {
        let own = command.default_target();
        let addressed = match &target {
            Some(to) if *to != own => format!(" (to {to})"),
            _ => String::new(),
        };
        let target = target.unwrap_or(own);
        let frame = command.into_frame();
        self.now_ms += 1;
        let before = self.state.clone();
        let outcome = self.state.apply(producer, &target, &frame, self.now_ms);
        if !matches!(outcome, Outcome::Appended { .. }) && self.state != before {
            return Err(format!("{outcome:?} took no offset but changed the state").into());
        }
        Ok(match outcome {
            Outcome::Appended { offset } => {
                let entry = LogEntry {
                    offset,
                    term: 1,
                    appended_at_ms: self.now_ms,
                    producer,
                    target,
                    frame,
                };
                format!("#{offset} {}{addressed}", entry.summary())
            }
            Outcome::Duplicate { offset } => format!("duplicate of #{offset}: no offset taken"),
            Outcome::OutOfWindow { lowest } => {
                format!("out of the producer's window (lowest {lowest}): no offset taken")
            }
            Outcome::Rejected(why) => format!("refused: {why}"),
            Outcome::ProducerForgotten => "refused: the producer is forgotten".to_string(),
        })
    }

    /// Appends `command` from `producer`, which must be accepted, without a line of trace.
    fn append(
        &mut self,
        command: Command,
        producer: Option<ProducerSeq>,
    ) -> Result<Offset, Failure> {
        let target = command.default_target();
        self.now_ms += 1;
        match (self.state).apply(producer, &target, &command.into_frame(), self.now_ms) {
            Outcome::Appended { offset } => Ok(offset),
            other => Err(format!("expected an offset, got {other:?}").into()),
        }
    }

    fn print_state(&self) -> String {
        let state = &self.state;
        let beyond = if state.level_understood() {
            ""
        } else {
            " (above this build's)"
        };
        let mut out = format!(
            "level {}{beyond}, next offset {}\n",
            state.level(),
            state.next_offset()
        );
        for (name, record) in state.containers() {
            let status = status(&record.status);
            writeln!(out, "container {name}@{} {status}", record.epoch).unwrap();
        }
        for (name, record) in state.tasks() {
            let held: Vec<String> = record
                .inputs
                .iter()
                .map(|i| i.partition.to_string())
                .collect();
            writeln!(
                out,
                "task {name} {} holds [{}]",
                record.phase,
                held.join(" ")
            )
            .unwrap();
            if let Some(checkpoint) = &record.checkpoint {
                writeln!(
                    out,
                    "  checkpoint {:?}",
                    String::from_utf8_lossy(checkpoint)
                )
                .unwrap();
            }
        }
        let unheld: Vec<String> = (state.inputs().iter())
            .filter(|(_, owner)| owner.is_none())
            .map(|(input, _)| input.partition.to_string())
            .collect();
        if !unheld.is_empty() {
            writeln!(out, "inputs without a task [{}]", unheld.join(" ")).unwrap();
        }
        for (offset, handshake) in state.pending() {
            let owed: Vec<String> = (handshake.owed_by.iter())
                .map(|(c, e)| format!("{c}@{e}"))
                .collect();
            let awaiting = match &handshake.awaiting {
                Awaiting::TaskStarted { task } => format!("{task} started"),
                Awaiting::TaskStopped { task } => format!("{task} stopped"),
                Awaiting::Acks => "acks".to_string(),
            };
            writeln!(out, "pending #{offset}: {awaiting} from {}", owed.join(" ")).unwrap();
        }
        if let Some(desired) = state.desired_containers() {
            writeln!(
                out,
                "desired {} ({:?}) set at #{}",
                desired.count, desired.reason, desired.offset
            )
            .unwrap();
        }
        for (subject, schema) in state.schemas() {
            writeln!(
                out,
                "schema {subject} = {:?} set at #{}",
                String::from_utf8_lossy(&schema.schema),
                schema.offset
            )
            .unwrap();
        }
        for (key, value) in state.config() {
            writeln!(out, "config {key} = {value}").unwrap();
        }
        out
    }

    /// Prints the plan's steps, appending its commands if `apply`; and whether it appended.
    fn step(&mut self, apply: bool) -> Result<(String, bool), Failure> {
        let actions = plan::plan(&self.state, &self.observed, &GroupByPartition);
        let mut out = String::new();
        if actions.is_empty() {
            out.push_str("nothing to do\n");
        }
        let appends = apply && actions.iter().any(|a| matches!(a, Action::Append(_)));
        for action in &actions {
            match action {
                Action::Append(command) if apply => {
                    let folded = self.fold(command.clone(), None, None)?;
                    writeln!(out, "append {folded}").unwrap();
                }
                Action::Append(command) => writeln!(out, "append {}", describe(command)).unwrap(),
                Action::Launch(count) => writeln!(out, "launch {count} container(s)").unwrap(),
                Action::Stop(container) => {
                    writeln!(out, "stop the process of {container}").unwrap()
                }
            }
        }
        if apply {
            // What is overdue was expired by this step.
            self.observed.overdue.clear();
        }
        Ok((out, appends))
    }

    /// Every live container answers what it owes, as its loop would.
    fn answer(&mut self) -> Result<String, Failure> {
        let mut answers = Vec::new();
        for (offset, handshake) in self.state.pending() {
            for (container, epoch) in &handshake.owed_by {
                let (container, epoch) = (container.clone(), *epoch);
                answers.push(match &handshake.awaiting {
                    Awaiting::TaskStarted { task } => Command::TaskStarted(TaskStarted {
                        task: task.clone(),
                        container,
                        epoch,
                    }),
                    Awaiting::TaskStopped { task } => Command::TaskStopped(TaskStopped {
                        task: task.clone(),
                        container,
                        epoch,
                        checkpoint: None,
                    }),
                    Awaiting::Acks => Command::Ack(Ack {
                        container,
                        epoch,
                        offset: *offset,
                    }),
                });
            }
        }
        if answers.is_empty() {
            return Ok("nothing owed\n".to_string());
        }
        let mut out = String::new();
        for answer in answers {
            let folded = self.fold(answer, None, None)?;
            writeln!(out, "answer {folded}").unwrap();
        }
        Ok(out)
    }
}

/// A command as a line, for one not folded (yet).
fn describe(command: &Command) -> String {
    let entry = LogEntry {
        offset: 0,
        term: 0,
        appended_at_ms: 0,
        producer: None,
        target: command.default_target(),
        frame: command.clone().into_frame(),
    };
    entry.summary()
}

impl goldenscript::Runner for Scenario {
    fn run(&mut self, line: &Line) -> Result<String, Failure> {
        if let Some(command) = self.command(line)? {
            let (_, keyed) = split(line);
            let target = match keyed.get("to") {
                None => None,
                Some(&"all") => Some(Target::All),
                Some(name) => Some(Target::Container(container(name)?)),
            };
            let producer = match (keyed.get("producer"), keyed.get("seq")) {
                (Some(producer), Some(seq)) => Some(ProducerSeq {
                    producer: producer.parse()?,
                    seq: seq.parse()?,
                }),
                _ => None,
            };
            return Ok(self.fold(command, target, producer)? + "\n");
        }
        let (at, keyed) = split(line);
        let start = self.start;
        let after = |keyed: &BTreeMap<&str, &str>| -> Result<Instant, Failure> {
            let ms: u64 = keyed.get("after_ms").map_or(Ok(0), |ms| ms.parse())?;
            Ok(start + Duration::from_millis(ms))
        };
        Ok(match line.name.as_str() {
            "state" => self.print_state(),
            "containers" => {
                let kept = self.state.containers();
                let mut out = format!("{} containers\n", kept.len());
                for name in &at {
                    let said = (kept.get(&container(name)?))
                        .map_or("forgotten".to_string(), |record| status(&record.status));
                    writeln!(out, "{name} {said}").unwrap();
                }
                out
            }
            "churn" => {
                let count: usize = nth(&at, 0, "a count")?.parse()?;
                let first = self.state.next_offset();
                for n in 0..count {
                    let name = container(&format!("c{n}"))?;
                    let epoch = self.append(
                        Command::RegisterContainer(RegisterContainer {
                            container: name.clone(),
                            location: "host".to_string(),
                        }),
                        None,
                    )?;
                    let expire = ExpireContainer {
                        container: name,
                        epoch,
                    };
                    self.append(Command::ExpireContainer(expire), None)?;
                }
                let last = self.state.last_offset();
                let end = count.saturating_sub(1);
                format!("#{first}..#{last}: c0 to c{end} registered and expired\n")
            }
            "producers" => {
                let count: u64 = nth(&at, 0, "a count")?.parse()?;
                let from: u64 = keyed.get("from").ok_or("missing from=")?.parse()?;
                let first = self.state.next_offset();
                for producer in from..from + count {
                    let pair = ProducerSeq { producer, seq: 1 };
                    self.append(Command::custom(1, 1, Vec::new()), Some(pair))?;
                }
                let (last, end) = (self.state.last_offset(), (from + count).saturating_sub(1));
                format!("#{first}..#{last}: producers {from} to {end} appended at sequence 1\n")
            }
            "heartbeat" => {
                let name = container(nth(&at, 0, "a container")?)?;
                let session = (self.state.live_session(&name))
                    .ok_or_else(|| format!("{name} has no live session"))?;
                let mut lag = BTreeMap::new();
                for (key, value) in keyed.iter().filter(|(k, _)| **k != "after_ms") {
                    lag.insert(task(key)?, value.parse()?);
                }
                let now = after(&keyed)?;
                self.liveness.record(&self.state, &session, lag, now);
                String::new()
            }
            "silent" => {
                let now = after(&keyed)?;
                let timeout = Duration::from_secs(2);
                let silent: Vec<String> = (self.liveness.overdue(&self.state, now, timeout))
                    .into_iter()
                    .map(|s| format!("{}@{}", s.container, s.epoch))
                    .collect();
                match silent.is_empty() {
                    true => "none\n".to_string(),
                    false => format!("{}\n", silent.join(" ")),
                }
            }
            "reported" => {
                let lags: Vec<String> = (self.liveness.lag(&self.state).into_iter())
                    .map(|(c, lag)| format!("{c}={lag}"))
                    .collect();
                let reported = self.liveness.reported(&self.state);
                format!(
                    "{}; total {} from {} container(s)\n",
                    lags.join(" "),
                    reported.total,
                    reported.containers
                )
            }
            "source" => {
                let listed = at.iter().copied().filter(|p| *p != "none");
                self.observed.inputs = Arc::new(inputs(listed)?.into_iter().collect());
                String::new()
            }
            "want" => {
                self.observed.desired_containers = nth(&at, 0, "a count")?.parse()?;
                String::new()
            }
            "overdue" => {
                let mut overdue = Vec::new();
                for name in &at {
                    let name = container(name)?;
                    overdue.push(
                        (self.state.live_session(&name))
                            .ok_or_else(|| format!("{name} has no live session"))?,
                    );
                }
                self.observed.overdue = overdue;
                String::new()
            }
            "launching" => {
                self.observed.launching = nth(&at, 0, "a count")?.parse()?;
                String::new()
            }
            "orchestrated" => {
                self.observed.orchestrated = nth(&at, 0, "true or false")?.parse()?;
                String::new()
            }
            "plan" => self.step(false)?.0,
            // Until the plan appends nothing and nobody owes an answer; what it still asks
            // of the launcher (launch, stop) is printed last.
            "step" => self.step(true)?.0,
            "answer" => self.answer()?,
            "settle" => {
                let mut out = String::new();
                for _ in 0..50 {
                    let (stepped, appended) = self.step(true)?;
                    let answered = self.answer()?;
                    if !appended && answered == "nothing owed\n" {
                        return Ok(out + &stepped);
                    }
                    if appended {
                        out.push_str(&stepped);
                    }
                    if answered != "nothing owed\n" {
                        out.push_str(&answered);
                    }
                }
                return Err("no rest after 50 rounds".into());
            }
            "settled" => {
                let tasks = nth(&at, 0, "a task count")?.parse()?;
                let containers = nth(&at, 1, "a container count")?.parse()?;
                format!("{}\n", plan::settled(&self.state, tasks, containers))
            }
            "loads" => {
                let loads: Vec<String> = (plan::loads(&self.state).into_iter())
                    .map(|(c, n)| format!("{c}={n}"))
                    .collect();
                format!("{}\n", loads.join(" "))
            }
            "draining" => {
                let wanted = nth(&at, 0, "a count")?.parse()?;
                let drained: Vec<String> = (plan::draining(&self.state, wanted).iter())
                    .map(ToString::to_string)
                    .collect();
                format!("{}\n", drained.join(" "))
            }
            "owed" => {
                let mut out = String::new();
                for (offset, owing) in plan::owed_acks(&self.state) {
                    let owing: Vec<String> = owing.iter().map(ToString::to_string).collect();
                    writeln!(out, "#{offset} owed by {}", owing.join(" ")).unwrap();
                }
                out
            }
            "lag" => {
                let total = nth(&at, 0, "a total lag")?.parse()?;
                let now = after(&keyed)?;
                let current = self.observed.desired_containers;
                let wanted = self.policy.desired(current, total, now);
                self.observed.desired_containers = wanted;
                format!("{current} -> {wanted}\n")
            }
            other => return Err(format!("unknown command {other:?}").into()),
        })
    }
}

/// Goal: every scenario script gives the trace written in it.
#[test]
fn scenarios() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src/jobs/scenarios");
    let mut scripts: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    scripts.sort();
    assert!(scripts.len() >= 20, "{} scripts", scripts.len());
    for script in scripts {
        eprintln!("running {}", script.display());
        goldenscript::run(&mut Scenario::default(), &script).expect("the script runs");
    }
}
