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

use super::config::AuthConfig;
use super::tls::certificate_names;
use crate::client::{ApiError, FetchRequest};
use crate::log::vocabulary::kinds;
use crate::log::{Command, ContainerId, Filter, ProducerId, Proposal};

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Role {
    Admin,
    Operator,
    Container(ContainerId),
}

impl FromStr for Role {
    type Err = String;

    fn from_str(text: &str) -> Result<Role, String> {
        match text {
            "admin" => Ok(Role::Admin),
            "operator" => Ok(Role::Operator),
            other => match other.strip_prefix("container:") {
                Some(id) => ContainerId::new(id)
                    .map(Role::Container)
                    .map_err(|e| e.to_string()),
                None => Err(format!(
                    "`{other}` is not a role (admin, operator or container:ID)"
                )),
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
    tokens: BTreeMap<String, Principal>,
    /// Certificate name (a DNS name among its subject alternative names) → role.
    certificates: BTreeMap<String, Role>,
}

impl Authenticator {
    /// Loads the configured credentials; the error names what is wrong.
    pub fn load(config: &AuthConfig) -> Result<Authenticator, String> {
        let mut tokens = BTreeMap::new();
        if let Some(path) = &config.tokens_file {
            tokens = read_tokens(path)?;
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

    pub fn by_token(&self, token: &str) -> Option<Principal> {
        self.tokens.get(token).cloned()
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

/// The token `tokens_file` gives the role `container:<container>`, if any: what a launcher
/// hands the container it starts, so that each container holds only its own credential.
/// Read afresh at each call, so that tokens added for new container names are found.
pub fn container_token(
    tokens_file: &Path,
    container: &ContainerId,
) -> Result<Option<String>, String> {
    Ok(read_tokens(tokens_file)?
        .into_iter()
        .find(|(_, principal)| principal.role == Role::Container(container.clone()))
        .map(|(token, _)| token))
}

/// `TOKEN ROLE` per line; blank lines and `#` comments are skipped. The token names its
/// principal in messages by its line number, never by itself.
fn read_tokens(path: &Path) -> Result<BTreeMap<String, Principal>, String> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| format!("auth.tokens_file {}: {e}", path.display()))?;
    let mut tokens = BTreeMap::new();
    for (number, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let bad = |why: String| {
            format!(
                "auth.tokens_file {} line {}: {why}",
                path.display(),
                number + 1
            )
        };
        let mut parts = line.split_whitespace();
        let (Some(token), Some(role), None) = (parts.next(), parts.next(), parts.next()) else {
            return Err(bad("expected `TOKEN ROLE`".into()));
        };
        if token.len() < 16 {
            return Err(bad("tokens must be at least 16 characters".into()));
        }
        let role: Role = role.parse().map_err(bad)?;
        let name = format!("token on line {} ({role:?})", number + 1);
        let principal = Principal::new(name, role, format!("token {token}").as_bytes());
        if tokens.insert(token.to_string(), principal).is_some() {
            return Err(bad("the same token appears twice".into()));
        }
    }
    Ok(tokens)
}

/// What a request asks to do, for the role check.
pub enum Action<'a> {
    Append(&'a Proposal),
    Fetch(&'a FetchRequest),
    Heartbeat(&'a ContainerId),
    Read,
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
        (Role::Container(_), Action::Read) => Ok(()),
        (Role::Container(me), Action::Heartbeat(id)) if me == *id => Ok(()),
        (Role::Container(me), Action::Fetch(request))
            if request.filter == Filter::Container(me.clone()) =>
        {
            Ok(())
        }
        (Role::Container(me), Action::Append(proposal)) => {
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
                Some(id) if id == me => Ok(()),
                Some(id) => forbidden(format!("act as container {id}")),
                None => forbidden(format!("append {:?} commands", command.kind_version())),
            }
        }
        (Role::Container(me), Action::Fetch(_)) => {
            forbidden(format!("fetch anything but container {me}'s own commands"))
        }
        (Role::Container(me), Action::Heartbeat(id)) => {
            forbidden(format!("heartbeat as {id} (it is {me})"))
        }
        (Role::Container(_), Action::Membership) => forbidden("change the membership".into()),
        (Role::Container(_), Action::Snapshot) => forbidden("take snapshots".into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
