//! Who may do what on the client port, when the configuration turns authentication on.
//!
//! A connection's principal comes from its client certificate (a certificate naming one of
//! `auth.certificates`, checked against its subject alternative names) or from a bearer token
//! it presents with `authenticate` (one of the lines of `auth.tokens_file`: `TOKEN ROLE`). Roles:
//!
//! * `container:<id>`: register, deregister, heartbeat, fetch its own commands and acknowledge,
//!   each only as container `<id>`; read the job state (a reset needs it) and the status;
//! * `operator`: append any command but a vocabulary raise, read everything;
//! * `admin`: everything, including membership changes, snapshots and vocabulary raises.
//!
//! Anything else is `Unauthorized` (no accepted credential) or `Forbidden` (the role may not),
//! counted in the metrics, and nothing is applied.

use std::collections::BTreeMap;
use std::path::Path;
use std::str::FromStr;

use rustls::pki_types::CertificateDer;

use crate::log::vocabulary::kinds;
use crate::log::{Command, ContainerId, Filter, ProducerId, Proposal};
use crate::server::config::AuthConfig;
use crate::server::ports::tls::certificate_names;
use crate::wire::{ApiError, FetchRequest};

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Role {
    Admin,
    Operator,
    /// One container: `container:ID`.
    Container(ContainerId),
    /// Any container whose id starts with a prefix of whole name segments (a segment ends at
    /// `.`, `_`, `:` or `-`): `containers:PREFIX`. The identity of a
    /// fleet whose names are made up as it goes (a Kubernetes Deployment's pods, the process
    /// launcher's `{container_prefix}-N`), with none of an operator's rights; each container
    /// is still fenced by the epoch of its own registration.
    Containers(String),
}

impl Role {
    /// Whether this role may act as container `id`.
    fn acts_as(&self, id: &ContainerId) -> bool {
        match self {
            Role::Container(me) => me == id,
            // Whole segments: `containers:worker` and `containers:worker-` cover `worker-1`,
            // `containers:w` does not (a plain string prefix once let it act as `worker-1`).
            Role::Containers(prefix) => {
                id.as_str()
                    .strip_prefix(prefix.as_str())
                    .is_some_and(|rest| {
                        let separator = |c: char| !c.is_ascii_alphanumeric();
                        prefix.ends_with(separator)
                            || rest.is_empty()
                            || rest.starts_with(separator)
                    })
            }
            Role::Admin | Role::Operator => false,
        }
    }

    /// Who it is, in a refusal.
    fn as_container(&self) -> String {
        match self {
            Role::Container(me) => format!("it is {me}"),
            Role::Containers(prefix) => format!("it may act only as containers {prefix}*"),
            Role::Admin | Role::Operator => "it is no container".into(),
        }
    }
}

impl FromStr for Role {
    type Err = String;

    fn from_str(text: &str) -> Result<Role, String> {
        let not_a_role = || {
            format!("`{text}` is not a role (admin, operator, container:ID or containers:PREFIX)")
        };
        match text {
            "admin" => Ok(Role::Admin),
            "operator" => Ok(Role::Operator),
            other => match other.split_once(':') {
                Some(("container", id)) => ContainerId::new(id)
                    .map(Role::Container)
                    .map_err(|e| e.to_string()),
                // A prefix is the start of a valid id: checked as one.
                Some(("containers", prefix)) => ContainerId::new(prefix)
                    .map(|_| Role::Containers(prefix.to_string()))
                    .map_err(|e| format!("containers:{prefix}: {e}")),
                _ => Err(not_a_role()),
            },
        }
    }
}

/// An authenticated identity.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Principal {
    pub name: String,
    pub role: Role,
    /// What this principal's producer ids are recorded under ([`Principal::own_producer`]):
    /// a digest of its token, or its certificate's name. Stable across restarts and across
    /// reorderings of the tokens file, and different for every credential.
    namespace: [u8; 32],
}

impl Principal {
    fn new(name: String, role: Role, credential: &[u8]) -> Principal {
        Principal {
            name,
            role,
            namespace: sha256(&[b"ctrlog principal\0", credential]),
        }
    }

    /// The producer id an append of this principal's `producer` is recorded under: the first
    /// eight bytes of a digest of the principal's namespace and the id. So a principal can
    /// neither advance nor read another's sequences: reaching another principal's recorded id
    /// would take a second preimage of a 64-bit digest, and the ids `state` shows are
    /// recorded ids, useless to anyone else.
    pub fn own_producer(&self, producer: ProducerId) -> ProducerId {
        let digest = sha256(&[&self.namespace, &producer.to_be_bytes()]);
        ProducerId::from_be_bytes(digest[..8].try_into().expect("eight bytes"))
    }
}

fn sha256(parts: &[&[u8]]) -> [u8; 32] {
    let mut context = ring::digest::Context::new(&ring::digest::SHA256);
    for part in parts {
        context.update(part);
    }
    context
        .finish()
        .as_ref()
        .try_into()
        .expect("SHA-256 is 32 bytes")
}

/// The credentials a replica accepts.
pub struct Authenticator {
    tokens: Vec<TokenLine>,
    /// Certificate name (a DNS name among its subject alternative names) → role.
    certificates: BTreeMap<String, Role>,
}

/// One line of the tokens file, as kept in memory: a salted digest of the token, never the
/// token itself (a plaintext line is digested when it is read).
struct TokenLine {
    salt: [u8; 16],
    digest: [u8; 32],
    role: Role,
    /// How messages name the principal: by line number, never by the token.
    name: String,
}

/// How a hashed line starts: `sha256:SALT:DIGEST ROLE`, both in hex, the digest of the salt
/// followed by the token.
const HASHED_PREFIX: &str = "sha256:";

/// The smallest token length accepted.
const TOKEN_CHARS_MIN: usize = 16;

fn salted_digest(salt: &[u8], token: &str) -> [u8; 32] {
    sha256(&[salt, token.as_bytes()])
}

/// `sha256:SALT:DIGEST` for `token` under a fresh random salt: what `ctrlog tokens hash`
/// writes in place of the token.
pub fn hash_token(token: &str) -> String {
    let salt: [u8; 16] = rand::random();
    format!(
        "{HASHED_PREFIX}{}:{}",
        hex(&salt),
        hex(&salted_digest(&salt, token))
    )
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn unhex<const N: usize>(text: &str) -> Option<[u8; N]> {
    if text.len() != 2 * N {
        return None;
    }
    let mut out = [0u8; N];
    for (i, byte) in out.iter_mut().enumerate() {
        *byte = u8::from_str_radix(text.get(2 * i..2 * i + 2)?, 16).ok()?;
    }
    Some(out)
}

impl Authenticator {
    /// Loads the configured credentials; the error names what is wrong.
    pub fn load(config: &AuthConfig) -> Result<Authenticator, String> {
        let mut tokens = Vec::new();
        if let Some(path) = &config.tokens_file {
            let read = read_tokens(path)?;
            if read.plaintext > 0 {
                tracing::warn!(
                    file = %path.display(),
                    lines = read.plaintext,
                    "the tokens file holds tokens in plain text; `ctrlog tokens hash FILE` \
                     writes the same file with each token replaced by a salted hash"
                );
            }
            tokens = read.lines;
        }
        let certificates = config
            .certificates
            .iter()
            .map(|(name, role)| {
                role.parse()
                    .map(|role| (name.clone(), role))
                    .map_err(|e| format!("auth.certificates.{name}: {e}"))
            })
            .collect::<Result<_, _>>()?;
        Ok(Authenticator {
            tokens,
            certificates,
        })
    }

    /// The principal holding `token`, if any. Every line is compared, in constant time each,
    /// so the time taken tells nothing of which line (or how much of one) matched.
    pub fn by_token(&self, token: &str) -> Option<Principal> {
        use subtle::ConstantTimeEq;
        let mut found = None;
        for line in &self.tokens {
            let digest = salted_digest(&line.salt, token);
            if bool::from(digest.ct_eq(&line.digest)) && found.is_none() {
                found = Some(line);
            }
        }
        found.map(|line| {
            let credential = format!("token {token}");
            Principal::new(line.name.clone(), line.role.clone(), credential.as_bytes())
        })
    }

    /// The principal a verified client certificate names, if any.
    pub fn by_certificate(&self, cert: &CertificateDer<'_>) -> Option<Principal> {
        let end = webpki::EndEntityCert::try_from(cert).ok()?;
        self.certificates
            .iter()
            .find(|(name, _)| certificate_names(&end, name))
            .map(|(name, role)| {
                let credential = format!("certificate {name}");
                Principal::new(name.clone(), role.clone(), credential.as_bytes())
            })
    }
}

/// The plaintext token `tokens_file` gives the role `container:<container>`, or else a
/// `containers:PREFIX` role that covers it, if any: what a launcher hands the container it
/// starts, so that each container holds only its own
/// credential. A hashed line cannot be handed out; keep the launched containers' tokens in
/// plain text (the file is private to the replica's user). Read afresh at each call, so
/// that tokens added for new container names are found.
pub fn container_token(
    tokens_file: &Path,
    container: &ContainerId,
) -> Result<Option<String>, String> {
    let text = read_file(tokens_file)?;
    let plaintext = |role: &dyn Fn(&Role) -> bool| {
        token_lines(&text).find_map(|(_, token, line_role)| {
            (!token.starts_with(HASHED_PREFIX) && role(&line_role.parse::<Role>().ok()?))
                .then(|| token.to_string())
        })
    };
    // The container's own line first; else a fleet's (`containers:PREFIX`) that covers it, so
    // that launched names never run out of provisioned tokens.
    let own = plaintext(&|role| matches!(role, Role::Container(id) if id == container));
    Ok(own.or_else(|| {
        plaintext(&|role| matches!(role, Role::Containers(_)) && role.acts_as(container))
    }))
}

/// The tokens file's lines, read.
struct TokensRead {
    lines: Vec<TokenLine>,
    /// How many held their token in plain text.
    plaintext: usize,
}

fn read_file(path: &Path) -> Result<String, String> {
    std::fs::read_to_string(path).map_err(|e| format!("auth.tokens_file {}: {e}", path.display()))
}

/// The non-blank, non-comment lines of a tokens file as (line number, first word, the rest).
fn token_lines(text: &str) -> impl Iterator<Item = (usize, &str, &str)> {
    text.lines().enumerate().filter_map(|(n, line)| {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            return None;
        }
        let (token, role) = line.split_once(char::is_whitespace).unwrap_or((line, ""));
        Some((n + 1, token, role.trim()))
    })
}

/// `TOKEN ROLE` or `sha256:SALT:DIGEST ROLE` per line; blank lines and `#` comments are
/// skipped. A principal is named in messages by its line number, never by its token.
fn read_tokens(path: &Path) -> Result<TokensRead, String> {
    let text = read_file(path)?;
    let mut read = TokensRead {
        lines: Vec::new(),
        plaintext: 0,
    };
    let mut seen = std::collections::BTreeSet::new();
    for (number, token, role) in token_lines(&text) {
        let bad = |why: String| format!("auth.tokens_file {} line {number}: {why}", path.display());
        if role.is_empty() || role.contains(char::is_whitespace) {
            return Err(bad(
                "expected `TOKEN ROLE` or `sha256:SALT:DIGEST ROLE`".into()
            ));
        }
        let role: Role = role.parse().map_err(bad)?;
        let (salt, digest) = match token.strip_prefix(HASHED_PREFIX) {
            Some(hashed) => {
                let (salt, digest) = hashed.split_once(':').unwrap_or(("", ""));
                let parsed = unhex::<16>(salt).zip(unhex::<32>(digest));
                parsed.ok_or_else(|| bad("a hashed token is sha256:SALT:DIGEST in hex".into()))?
            }
            None => {
                if token.len() < TOKEN_CHARS_MIN {
                    return Err(bad(format!(
                        "tokens must be at least {TOKEN_CHARS_MIN} characters"
                    )));
                }
                if !seen.insert(token) {
                    return Err(bad("the same token appears twice".into()));
                }
                read.plaintext += 1;
                let salt: [u8; 16] = rand::random();
                (salt, salted_digest(&salt, token))
            }
        };
        let name = format!("token on line {number} ({role:?})");
        read.lines.push(TokenLine {
            salt,
            digest,
            role,
            name,
        });
    }
    Ok(read)
}

/// `ctrlog tokens hash`: `text` (a tokens file) with every plaintext token replaced by a
/// salted hash; comments, blank lines and lines already hashed kept as they are.
pub fn hash_tokens_file(text: &str) -> String {
    text.lines()
        .map(|line| {
            let trimmed = line.trim();
            match trimmed.split_once(char::is_whitespace) {
                Some((token, role))
                    if !trimmed.starts_with('#') && !token.starts_with(HASHED_PREFIX) =>
                {
                    format!("{} {}\n", hash_token(token), role.trim())
                }
                _ => format!("{line}\n"),
            }
        })
        .collect()
}

/// What a request asks to do, for the role check.
pub enum Action<'a> {
    Append(&'a Proposal),
    Fetch(&'a FetchRequest),
    Heartbeat(&'a ContainerId),
    Read,
    /// A read index: what a backup (`snapshot save`) and `state --consistent` take, an
    /// operator's or an admin's. A container reads the state it needs without one.
    ConsistentRead,
    Membership,
    Snapshot,
}

/// Whether `principal` may do `action`.
pub fn authorize(principal: &Principal, action: &Action<'_>) -> Result<(), ApiError> {
    let forbidden = |what: String| {
        Err(ApiError::Forbidden {
            principal: principal.name.clone(),
            action: what,
        })
    };
    match (&principal.role, action) {
        (Role::Admin, _) => Ok(()),
        (Role::Operator, Action::Membership) => forbidden("change the membership".into()),
        (Role::Operator, Action::Snapshot) => forbidden("take snapshots".into()),
        (Role::Operator, Action::Heartbeat(id)) => forbidden(format!("heartbeat as {id}")),
        (Role::Operator, Action::Append(proposal))
            if proposal.frame.kind == kinds::SET_VOCABULARY_LEVEL =>
        {
            forbidden("raise the vocabulary level".into())
        }
        (Role::Operator, _) => Ok(()),
        // From here on, a container's role (`container:ID` or `containers:PREFIX`).
        (_, Action::Read) => Ok(()),
        (container, Action::Heartbeat(id)) if container.acts_as(id) => Ok(()),
        (container, Action::Fetch(request)) if matches!(&request.filter, Filter::Container(id) if container.acts_as(id)) => {
            Ok(())
        }
        (container, Action::Append(proposal)) => {
            let command = Command::from_frame(proposal.frame.clone());
            let as_container = match &command {
                Command::RegisterContainer(c) => Some(&c.container),
                Command::DeregisterContainer(c) => Some(&c.container),
                Command::TaskStarted(c) => Some(&c.container),
                Command::TaskStopped(c) => Some(&c.container),
                Command::Ack(c) => Some(&c.container),
                _ => None,
            };
            match as_container {
                Some(id) if container.acts_as(id) => Ok(()),
                Some(id) => forbidden(format!(
                    "act as container {id} ({})",
                    container.as_container()
                )),
                None => forbidden(format!("append {:?} commands", command.kind_version())),
            }
        }
        (container, Action::Fetch(_)) => forbidden(format!(
            "fetch anything but its own container's commands ({})",
            container.as_container()
        )),
        (container, Action::Heartbeat(id)) => {
            forbidden(format!("heartbeat as {id} ({})", container.as_container()))
        }
        (_, Action::Membership) => forbidden("change the membership".into()),
        (_, Action::Snapshot) => forbidden("take snapshots".into()),
        (_, Action::ConsistentRead) => forbidden(
            "take a consistent read (a backup, `state --consistent`): an operator's or an \
             admin's"
                .into(),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Goal: `containers:PREFIX` may act as any container whose id starts with the prefix,
    /// and as nothing else a container may not: a Deployment's pods (random names) and the
    /// process launcher's `{container_prefix}-N` share one credential that is not admin. The
    /// launcher hands a container the prefix's token when it has no line of its own.
    #[test]
    fn a_prefix_role_acts_as_the_containers_under_its_prefix_only() {
        use crate::log::{Command, RegisterContainer};
        let fleet: Role = "containers:worker-".parse().unwrap();
        assert_eq!(fleet, Role::Containers("worker-".into()));
        for bad in ["containers:", "containers:a b", "workers:x"] {
            assert!(bad.parse::<Role>().is_err(), "{bad}");
        }
        let principal = Principal::new("fleet".into(), fleet, b"token fleet");
        let mine = ContainerId::new("worker-7f3a").unwrap();
        let other = ContainerId::new("other-1").unwrap();
        // Whole segments only (issue 59): `containers:w` is no `worker-7f3a`.
        for (role, id, covered) in [
            ("containers:worker", "worker-7f3a", true),
            ("containers:worker", "worker", true),
            ("containers:worker-", "worker-7f3a", true),
            ("containers:w", "worker-7f3a", false),
            ("containers:worker", "workers-1", false),
            ("containers:worker-", "worker", false),
        ] {
            let role: Role = role.parse().unwrap();
            assert_eq!(
                role.acts_as(&ContainerId::new(id).unwrap()),
                covered,
                "{role:?} {id}"
            );
        }
        let register = |id: &ContainerId| Proposal {
            producer: None,
            target: crate::log::Target::Coordinator,
            frame: Command::RegisterContainer(RegisterContainer {
                container: id.clone(),
                location: String::new(),
            })
            .into_frame(),
        };
        assert!(authorize(&principal, &Action::Heartbeat(&mine)).is_ok());
        assert!(authorize(&principal, &Action::Append(&register(&mine))).is_ok());
        let own = FetchRequest {
            filter: Filter::Container(mine.clone()),
            ..FetchRequest::from(1)
        };
        assert!(authorize(&principal, &Action::Fetch(&own)).is_ok());
        assert!(authorize(&principal, &Action::Heartbeat(&other)).is_err());
        assert!(authorize(&principal, &Action::Append(&register(&other))).is_err());
        assert!(authorize(&principal, &Action::Fetch(&FetchRequest::from(1))).is_err());
        assert!(authorize(&principal, &Action::Membership).is_err());
        assert!(authorize(&principal, &Action::Snapshot).is_err());
        assert!(authorize(&principal, &Action::ConsistentRead).is_err());
        assert!(authorize(&principal, &Action::Read).is_ok());

        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("tokens");
        std::fs::write(
            &file,
            "own-token worker-own\nfleet-token containers:worker-\nc-token container:worker-own\n",
        )
        .unwrap();
        let token = |id: &str| container_token(&file, &ContainerId::new(id).unwrap()).unwrap();
        assert_eq!(
            token("worker-own").as_deref(),
            Some("c-token"),
            "its own line first"
        );
        assert_eq!(token("worker-9").as_deref(), Some("fleet-token"));
        assert_eq!(token("other-1"), None);
    }

    /// Goal: a hashed tokens file authenticates the same tokens as its plaintext original,
    /// and only those; a v0.1.0 plaintext file keeps working; the launcher still finds a
    /// container's plaintext token and refuses to hand out a hashed one.
    #[test]
    fn hashed_and_plaintext_tokens_authenticate_alike() {
        let plaintext = "# who\nadmin-token-0123456789 admin\nc1-token-0123456789 container:c1\n";
        let hashed = hash_tokens_file(plaintext);
        assert!(!hashed.contains("admin-token-0123456789"), "{hashed}");
        assert!(hashed.starts_with("# who\n"), "comments kept: {hashed}");
        let dir = tempfile::tempdir().unwrap();
        for (file, text) in [("plain", plaintext), ("hashed", hashed.as_str())] {
            let path = dir.path().join(file);
            std::fs::write(&path, text).unwrap();
            let auth = Authenticator::load(&AuthConfig {
                tokens_file: Some(path.clone()),
                certificates: BTreeMap::new(),
            })
            .unwrap();
            let admin = auth.by_token("admin-token-0123456789").expect(file);
            assert_eq!(admin.role, Role::Admin);
            assert_eq!(admin.name, "token on line 2 (Admin)");
            assert!(auth.by_token("admin-token-012345678").is_none(), "{file}");
            assert!(auth.by_token("").is_none());
            let c1 = ContainerId::new("c1").unwrap();
            let handed = container_token(&path, &c1).unwrap();
            assert_eq!(handed.is_some(), file == "plain", "{file}");
        }
        // The namespace follows the token, not the line: one credential, one namespace.
        let path = dir.path().join("plain");
        let auth = Authenticator::load(&AuthConfig {
            tokens_file: Some(path),
            certificates: BTreeMap::new(),
        })
        .unwrap();
        let again = auth.by_token("admin-token-0123456789").unwrap();
        assert_eq!(
            again.own_producer(1),
            Principal::new(String::new(), Role::Admin, b"token admin-token-0123456789")
                .own_producer(1)
        );
    }

    #[test]
    fn each_credential_records_producer_ids_in_its_own_namespace() {
        let one = Principal::new("a".into(), Role::Operator, b"token one");
        let same = Principal::new("renamed".into(), Role::Admin, b"token one");
        let other = Principal::new("a".into(), Role::Operator, b"token two");
        assert_eq!(
            one.own_producer(7),
            same.own_producer(7),
            "stable per credential"
        );
        assert_ne!(one.own_producer(7), other.own_producer(7));
        assert_ne!(one.own_producer(7), one.own_producer(8));
    }
}
