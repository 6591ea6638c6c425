//! The admin subcommands (`append`, `tail`, `status`, `state`, `snapshot`, `broadcast`,
//! `vocabulary`, `members`): their arguments, and what each does with a client.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use clap::Subcommand;
use futures::StreamExt;
use serde_json::json;

use super::backup;
use super::flags::{ClientFlags, OutputFlags};
use super::render::{
    entry_json, entry_line, members_json, members_text, state_json, state_text, status_json,
    status_line, status_text, vocabulary_json, vocabulary_text,
};
use super::signal::{shutdown_signal, Interrupted};
use crate::client::{
    ApiError, AppendAck, ClientError, ControlClient, FetchRequest, Member, MemberStatus,
    SubscriptionItem,
};
use crate::log::vocabulary::kind_by_name;
use crate::log::{
    Command, Filter, Frame, Kind, Level, LogEntry, Offset, ProducerSeq, Proposal,
    SetVocabularyLevel, Target, CUSTOM_KIND_MIN,
};

/// `ctrlog append`'s arguments.
#[derive(clap::Args)]
#[command(group(clap::ArgGroup::new("body").required(true).args(["payload", "payload_file"])))]
pub struct AppendArgs {
    /// The command kind: a number as stored, or `custom:N` for user kind N.
    #[arg(long, value_parser = parse_kind)]
    kind: u32,
    /// The version of the kind's body encoding (`--version` in v0.1.0, still accepted).
    #[arg(long, alias = "version", default_value_t = 1)]
    kind_version: u16,
    /// `all`, `coordinator` or `container:ID`.
    #[arg(long, default_value = "all")]
    target: Target,
    /// The payload as text.
    #[arg(long)]
    payload: Option<String>,
    /// The payload from a file, as bytes.
    #[arg(long)]
    payload_file: Option<PathBuf>,
    /// An idempotent producer id; with `--seq`, running the same command twice appends once.
    #[arg(long, requires = "seq")]
    producer: Option<u64>,
    /// The sequence number within `--producer`: 1 for its first append, then one more each
    /// time; the same pair again is answered with the first offset (`duplicate`).
    #[arg(long, requires = "producer")]
    seq: Option<u64>,
    #[command(flatten)]
    output: OutputFlags,
}

/// `ctrlog tail`'s arguments.
#[derive(clap::Args)]
pub struct TailArgs {
    /// The first offset to print.
    #[arg(long, default_value_t = 1)]
    from: u64,
    /// Keep printing new commands as they commit.
    #[arg(long)]
    follow: bool,
    /// Stop after this many commands.
    #[arg(long)]
    max: Option<u64>,
    /// `everything`, or `container:ID` for one container's commands plus broadcasts.
    #[arg(long, default_value = "everything")]
    filter: Filter,
    #[command(flatten)]
    output: OutputFlags,
}

/// `ctrlog vocabulary`'s actions.
#[derive(Subcommand)]
pub enum VocabularyCmd {
    /// The built-in kinds, and which the recorded level allows.
    Show,
    /// Raise the recorded level (every replica must support it; this is checked first).
    Raise {
        /// The level to record (`vocabulary show` lists what each level allows).
        #[arg(long)]
        level: u16,
    },
}

/// `ctrlog snapshot`'s actions besides taking one.
#[derive(Subcommand)]
pub enum SnapshotCmd {
    /// Save a backup of the job to FILE: the state as of a linearizable read (every write
    /// acknowledged before it began), checksummed. Restore it with `snapshot restore`.
    Save {
        /// Where to write it (replaced whole, or left as it was).
        file: PathBuf,
    },
    /// Seed the empty data directory of one replica of a new cluster from a backup; run it
    /// for every member with the same FILE and --initial-members, then start them with
    /// `serve`. The new log continues at the backup's next offset. Talks to no cluster.
    Restore {
        /// The backup, as `snapshot save` wrote it.
        file: PathBuf,
        /// The new replica's data directory (must not hold a replica).
        #[arg(long)]
        data: PathBuf,
        /// The new replica's id.
        #[arg(long)]
        id: u64,
        /// The new cluster's members: 1=PEER/CLIENT,2=PEER/CLIENT,3=PEER/CLIENT.
        #[arg(long)]
        initial_members: String,
    },
}

/// What `ctrlog broadcast` sends.
#[derive(Subcommand)]
pub enum BroadcastCmd {
    /// A schema change: every live container must ack it (`schema-change`).
    Schema {
        /// What the schema describes, for example a stream name.
        subject: String,
        /// The schema, opaque to ctrlog (at most 4 MiB, refused before it is read).
        #[arg(long)]
        file: PathBuf,
    },
    /// A configuration change: every live container must ack it (`config-change`). Keys the
    /// cluster marks secret (`secret_config_keys`) are refused: containers read the log.
    Config {
        /// Keys to set, as KEY=VALUE.
        #[arg(value_parser = key_value)]
        set: Vec<(String, String)>,
        /// Keys to remove (applied before the ones set).
        #[arg(long)]
        remove: Vec<String>,
    },
}

/// `KEY=VALUE`, split at the first `=`.
fn key_value(text: &str) -> Result<(String, String), String> {
    let (key, value) = text
        .split_once('=')
        .ok_or_else(|| format!("`{text}` is not KEY=VALUE"))?;
    Ok((key.to_string(), value.to_string()))
}

/// `ctrlog members`'s actions.
#[derive(Subcommand)]
pub enum MembersCmd {
    /// The replicas in the membership, voters and learners, and which one leads.
    List,
    /// Add a replica: it joins as a learner and is promoted once caught up.
    Add {
        /// The new replica's id (its certificate names `node-<id>`); never reuse a removed one.
        #[arg(long)]
        id: u64,
        /// Where the other replicas reach its peer port (`host:port`).
        #[arg(long)]
        peer_addr: String,
        /// Where clients reach its client port (`host:port`).
        #[arg(long)]
        client_addr: String,
    },
    /// Remove a replica (a voter or a learner) from the membership.
    Remove {
        /// The replica's id.
        #[arg(long)]
        id: u64,
    },
    /// Hand the leadership over to voter N: the leader falls silent once N holds its log
    /// and tells N to stand, which it does as the voters' leases lapse (about an election
    /// timeout, during which appends wait). Before maintenance on the leader's host.
    TransferLeader {
        /// The voter to lead.
        #[arg(long)]
        to: u64,
    },
}

impl AppendArgs {
    /// `ctrlog append`: appends one command and prints its offset. With `--producer` and
    /// `--seq` the append is idempotent across invocations; without them the client draws a
    /// fresh producer id (idempotent across its own retries only).
    pub async fn run(self, flags: &ClientFlags, out: &mut impl Write) -> anyhow::Result<()> {
        let args = self;
        let body = match (args.payload, args.payload_file) {
            (Some(text), _) => text.into_bytes(),
            (None, Some(path)) => read_command_file(&path)?,
            (None, None) => unreachable!("clap requires one of them"),
        };
        let frame = Frame {
            kind: args.kind,
            version: args.kind_version,
            body,
        };
        let producer = args
            .producer
            .zip(args.seq)
            .map(|(producer, seq)| ProducerSeq { producer, seq });
        let client = flags.connect().await?;
        let ack = match producer {
            Some(pair) => {
                let proposal = Proposal {
                    producer: Some(pair),
                    target: args.target,
                    frame,
                };
                client.append_proposal(proposal).await?
            }
            None => {
                client
                    .append_to(args.target, Command::from_frame(frame))
                    .await?
            }
        };
        print_ack(&ack, args.output, out)
    }
}

/// A file that goes into a command whole, refused before it is read if no replica would
/// accept it: a 300 MB file must not cost 300 MB to say no to.
fn read_command_file(path: &std::path::Path) -> anyhow::Result<Vec<u8>> {
    let size = std::fs::metadata(path)
        .with_context(|| format!("reading {}", path.display()))?
        .len();
    let limit = crate::client::COMMAND_BYTES_MAX_ANY_REPLICA as u64;
    if size > limit {
        let too_large = crate::client::ApiError::TooLarge { size, limit };
        return Err(crate::client::ClientError::Api(too_large).into());
    }
    std::fs::read(path).with_context(|| format!("reading {}", path.display()))
}

/// An append's answer: its offset, and whether it was appended before.
fn print_ack(
    ack: &crate::client::AppendAck,
    output: OutputFlags,
    out: &mut impl Write,
) -> anyhow::Result<()> {
    if output.json() {
        writeln!(out, "{}", serde_json::to_string(ack)?)?;
    } else if ack.duplicate {
        writeln!(out, "{} (already appended)", ack.offset)?;
    } else {
        writeln!(out, "{}", ack.offset)?;
    }
    Ok(())
}

/// `ctrlog broadcast`: a schema or configuration change every live container must ack.
pub async fn broadcast(
    command: BroadcastCmd,
    output: OutputFlags,
    flags: &ClientFlags,
    out: &mut impl Write,
) -> anyhow::Result<()> {
    use crate::log::{Command, ConfigChange, SchemaChange};
    let command = match command {
        BroadcastCmd::Schema { subject, file } => Command::SchemaChange(SchemaChange {
            subject,
            schema: read_command_file(&file)?,
        }),
        BroadcastCmd::Config { set, remove } => {
            if set.is_empty() && remove.is_empty() {
                anyhow::bail!("nothing to change: give KEY=VALUE pairs or --remove KEY");
            }
            Command::ConfigChange(ConfigChange {
                set: set.into_iter().collect(),
                remove,
            })
        }
    };
    let ack = flags
        .connect()
        .await?
        .append_to(Target::All, command)
        .await?;
    print_ack(&ack, output, out)
}

impl TailArgs {
    /// `ctrlog tail`: prints committed commands, one per line.
    pub async fn run(self, flags: &ClientFlags, out: &mut impl Write) -> anyhow::Result<()> {
        let args = self;
        let options = TailOptions {
            from: args.from,
            follow: args.follow,
            max: args.max,
            filter: args.filter,
            json: args.output.json(),
        };
        tail(&flags.connect().await?, &options, out).await
    }
}

/// `ctrlog status`: the answering replica's view, or with `--all-replicas` each member's own
/// view on a line (every row printed, then an error if one did not answer).
pub async fn status(
    all_replicas: bool,
    output: OutputFlags,
    flags: &ClientFlags,
    out: &mut impl Write,
) -> anyhow::Result<()> {
    let client = flags.connect().await?;
    if !all_replicas {
        let (status, storage) = client.status_with_storage().await?;
        let repairing = storage.and_then(|s| s.repairing);
        output.print(out, status_text(&status, repairing.as_ref()), || {
            status_json(&status, repairing.as_ref().map(|r| r.to_string()))
        })?;
        return Ok(());
    }
    let members = client.leader_status().await?.members;
    let (count, mut unanswered) = (members.len(), Vec::new());
    for (member, answer) in ask_each_replica(members, flags).await? {
        let addr = member.member.client_addr;
        match answer {
            Ok(ReplicaAnswer {
                status,
                storage,
                build,
            }) => {
                let repairing = storage.and_then(|s| s.repairing);
                let build = build.unwrap_or_default();
                let line = status_line(&status, repairing.as_ref(), &build);
                output.print(out, line, || {
                    let mut json = status_json(&status, repairing.as_ref().map(|r| r.to_string()));
                    json["build"] = build.clone().into();
                    json
                })?
            }
            Err(error) => {
                output.print(
                    out,
                    format!("{:<3} {addr:<21} error: {error:#}", member.id),
                    || json!({ "id": member.id, "client_addr": addr, "error": format!("{error:#}") }),
                )?;
                unanswered.push((member.id, error));
            }
        }
    }
    // Every row is printed first; then the exit code says that some replica did not answer
    // (the first one's error picks it: 3 when it is unreachable, 5 when TLS refused it).
    let failed = unanswered.len();
    match unanswered.into_iter().next() {
        None => Ok(()),
        Some((id, error)) => Err(anyhow::Error::new(error).context(format!(
            "{failed} of {count} replicas did not answer, replica {id} first"
        ))),
    }
}

/// What one replica said of itself.
struct ReplicaAnswer {
    status: crate::client::Status,
    storage: Option<crate::client::StorageStatus>,
    /// Its build, as its `hello` named it.
    build: Option<String>,
}

/// Asks each of `members` for its own status, one attempt each, bounded by --dial-timeout: a
/// dead replica is an error in its row, not the whole --command-timeout.
async fn ask_each_replica(
    members: Vec<crate::client::MemberStatus>,
    flags: &ClientFlags,
) -> anyhow::Result<
    Vec<(
        MemberStatus,
        Result<ReplicaAnswer, crate::client::ClientError>,
    )>,
> {
    let options = flags.options()?.retry_deadline(Duration::ZERO);
    let mut answers = Vec::with_capacity(members.len());
    for member in members {
        let answer = async {
            let addr = &member.member.client_addr;
            let replica =
                crate::client::ControlClient::connect_with([addr], options.clone()).await?;
            let (status, storage) = replica.status_with_storage().await?;
            let build = replica.server_build().await;
            Ok(ReplicaAnswer {
                status,
                storage,
                build,
            })
        }
        .await;
        answers.push((member, answer));
    }
    Ok(answers)
}

/// `ctrlog state`: the job state folded from the log, as the answering replica applied it or,
/// with `--consistent`, as of a read index.
pub async fn state(
    consistent: bool,
    output: OutputFlags,
    flags: &ClientFlags,
    out: &mut impl Write,
) -> anyhow::Result<()> {
    let client = flags.connect().await?;
    let at = match consistent {
        true => client.consistent_state().await?,
        false => client.state(0).await?,
    };
    output.print(out, state_text(&at), || state_json(&at))?;
    Ok(())
}

/// `ctrlog snapshot`: a snapshot on the leader now, or `save` and `restore` of a backup.
pub async fn snapshot(
    action: Option<SnapshotCmd>,
    output: OutputFlags,
    flags: &ClientFlags,
    out: &mut impl Write,
) -> anyhow::Result<()> {
    match action {
        None => {
            let offset = flags.connect().await?.snapshot().await?;
            output.print(
                out,
                format!("snapshot taken; it covers offsets up to {offset}"),
                || json!({ "snapshot_offset": offset }),
            )?;
        }
        Some(SnapshotCmd::Save { file }) => {
            let saved = backup::save(&flags.connect().await?, &file).await?;
            output.print(
                out,
                format!(
                    "saved the job as of offset {} to {}",
                    saved.offset(),
                    file.display()
                ),
                || json!({ "offset": saved.offset(), "file": file.display().to_string() }),
            )?;
        }
        Some(SnapshotCmd::Restore {
            file,
            data,
            id,
            initial_members,
        }) => {
            let members = crate::server::parse_members(&initial_members)?;
            let (saved, seeded) = backup::restore(&file, &data, id, members).await?;
            output.print(
                out,
                format!(
                    "replica {id} restored in {} as of offset {}; start every member, and the \
                     log continues at offset {}",
                    data.display(),
                    saved.offset(),
                    seeded.offset + 1
                ),
                || json!({ "restored": id, "offset": saved.offset(), "data": data.display().to_string() }),
            )?;
        }
    }
    Ok(())
}

/// `ctrlog vocabulary`: show the built-in kinds and the recorded level, or raise it.
pub async fn vocabulary(
    command: VocabularyCmd,
    output: OutputFlags,
    flags: &ClientFlags,
    out: &mut impl Write,
) -> anyhow::Result<()> {
    let client = flags.connect().await?;
    match command {
        VocabularyCmd::Show => {
            let level = client.leader_status().await?.vocabulary_level;
            output.print(out, vocabulary_text(level), || vocabulary_json(level))?;
        }
        VocabularyCmd::Raise { level } => {
            let offset = raise_level(&client, level).await?.offset;
            output.print(
                out,
                format!("vocabulary level {level} recorded at offset {offset}"),
                || json!({ "level": level, "offset": offset }),
            )?;
        }
    }
    Ok(())
}

/// `ctrlog members`: list, add, remove, or hand the leadership over.
pub async fn members(
    command: MembersCmd,
    output: OutputFlags,
    flags: &ClientFlags,
    out: &mut impl Write,
) -> anyhow::Result<()> {
    let client = flags.connect().await?;
    match command {
        MembersCmd::List => {
            let status = client.leader_status().await?;
            let builds: BTreeMap<_, _> = ask_each_replica(status.members.clone(), flags)
                .await?
                .into_iter()
                .map(|(member, answer)| {
                    let build = answer.ok().and_then(|a| a.build);
                    (member.id, build.unwrap_or_else(|| "unreachable".into()))
                })
                .collect();
            output.print(out, members_text(&status, &builds), || {
                members_json(&status, &builds)
            })?;
        }
        MembersCmd::Add {
            id,
            peer_addr,
            client_addr,
        } => {
            let member = Member {
                peer_addr,
                client_addr,
            };
            // Interrupted while the new replica catches up, the operator called the change
            // off: the learner already added is removed again, not left to follow the log.
            tokio::select! {
                added = client.add_member(id, member) => added?,
                () = shutdown_signal() => {
                    match client.remove_member(id).await {
                        Ok(()) => eprintln!("ctrlog: interrupted: replica {id}, added as a learner, was removed again"),
                        Err(ClientError::Api(ApiError::Rejected(why))) if why.contains("not a member") => {}
                        Err(error) => eprintln!(
                            "ctrlog: interrupted, and replica {id} may be a learner still: \
                             {error}; remove it with `ctrlog members remove --id {id}`"
                        ),
                    }
                    return Err(Interrupted.into());
                }
            };
            output.print(
                out,
                format!("replica {id} added and promoted to voter"),
                || json!({ "added": id, "voter": true }),
            )?;
        }
        MembersCmd::TransferLeader { to } => {
            let leader = client.transfer_leader(to).await?;
            output.print(
                out,
                format!("replica {leader} leads"),
                || json!({ "leader": leader }),
            )?;
        }
        MembersCmd::Remove { id } => {
            client.remove_member(id).await?;
            output.print(
                out,
                format!("replica {id} removed"),
                || json!({ "removed": id }),
            )?;
        }
    }
    Ok(())
}

/// Parses a command kind: a number as stored (`268435457`) or a user kind (`custom:1`, which
/// is `CUSTOM_KIND_MIN + 1`).
pub fn parse_kind(text: &str) -> Result<Kind, String> {
    let number = |s: &str| {
        s.parse::<Kind>().map_err(|e| {
            format!(
                "kind {text:?}: {e}; a kind is a number, `custom:N`, or a name `ctrlog \
                 vocabulary show` lists"
            )
        })
    };
    if let Some(kind) = kind_by_name(text) {
        return Ok(kind);
    }
    match text.strip_prefix("custom:") {
        Some(user) => CUSTOM_KIND_MIN
            .checked_add(number(user)?)
            .ok_or_else(|| format!("user kind {user} is out of range")),
        None => number(text),
    }
}

/// What `tail` should read.
pub struct TailOptions {
    pub from: Offset,
    /// Keep waiting for new commands instead of stopping at the end of the committed log.
    pub follow: bool,
    /// Stop after this many entries.
    pub max: Option<u64>,
    pub filter: Filter,
    pub json: bool,
}

fn reset_line(offset: Offset, json: bool) -> String {
    if json {
        json!({ "reset": { "offset": offset } }).to_string()
    } else {
        format!("-- offsets up to {offset} were compacted; resuming after the state as of {offset}")
    }
}

/// `ctrlog tail`: prints committed entries, one per line. Without `follow` it stops at the
/// leader's applied offset as of the start. A compacted position prints a `reset` line and
/// continues after the state's offset, as a subscription does.
pub async fn tail(
    client: &ControlClient,
    options: &TailOptions,
    out: &mut impl Write,
) -> anyhow::Result<()> {
    let mut printed = 0u64;
    let done = |printed: u64| options.max.is_some_and(|max| printed >= max);
    if done(printed) {
        return Ok(());
    }
    let print = |out: &mut dyn Write, entry: &LogEntry| -> std::io::Result<()> {
        if options.json {
            writeln!(out, "{}", entry_json(entry))
        } else {
            writeln!(out, "{}", entry_line(entry))
        }
    };
    if options.follow {
        let mut stream = client.subscribe(options.from, options.filter.clone());
        while let Some(item) = stream.next().await {
            match item? {
                SubscriptionItem::Entry(entry) => {
                    print(out, &entry)?;
                    out.flush()?;
                    printed += 1;
                    if done(printed) {
                        break;
                    }
                }
                SubscriptionItem::Reset { offset, .. } => {
                    writeln!(out, "{}", reset_line(offset, options.json))?;
                }
            }
        }
        return Ok(());
    }
    let end = client
        .leader_status()
        .await
        .context("asking the leader where the log ends")?
        .applied_offset;
    let mut from = options.from.max(1);
    while from <= end && !done(printed) {
        let request = FetchRequest {
            filter: options.filter.clone(),
            ..FetchRequest::from(from)
        };
        match client.fetch(request).await {
            Ok(response) => {
                for entry in response.entries.iter().take_while(|e| e.offset <= end) {
                    print(out, entry)?;
                    printed += 1;
                    if done(printed) {
                        break;
                    }
                }
                from = response.next_offset;
            }
            Err(ClientError::Api(ApiError::Compacted { .. })) => {
                let at = client.state(from - 1).await?;
                writeln!(out, "{}", reset_line(at.offset, options.json))?;
                from = at.offset + 1;
            }
            Err(error) => return Err(error.into()),
        }
    }
    Ok(())
}

/// `ctrlog vocabulary raise`: raises the recorded vocabulary level. The leader first asks
/// every member whether its build knows the level (the rule that keeps a rolling upgrade
/// safe) and refuses with `LevelUnsupported` if one does not; an admin's right.
pub async fn raise_level(client: &ControlClient, level: Level) -> Result<AppendAck, ClientError> {
    client
        .append(Command::SetVocabularyLevel(SetVocabularyLevel { level }))
        .await
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::log::vocabulary::{kind_label, KINDS};

    #[test]
    fn kinds_parse_as_numbers_names_or_user_kinds() {
        assert_eq!(parse_kind("7"), Ok(7));
        assert_eq!(parse_kind("custom:1"), Ok(CUSTOM_KIND_MIN + 1));
        assert_eq!(
            parse_kind("schema-change"),
            Ok(crate::log::kinds::SCHEMA_CHANGE)
        );
        assert!(parse_kind("custom:4294967295").is_err());
        assert!(parse_kind("seven").unwrap_err().contains("vocabulary show"));
        for spec in KINDS {
            assert_eq!(
                parse_kind(&kind_label(spec.kind, spec.version)),
                Ok(spec.kind)
            );
        }
    }
}
