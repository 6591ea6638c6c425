//! `[tls]` and `[auth]`: the files a replica proves itself and checks others with, and who
//! may do what on its client port. Both are off when absent; `[auth]` needs `[tls]`
//! (`ReplicaConfig::validate` checks the pair).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::server::config::error::{refuse, ConfigError};

/// The `[tls]` section: the PEM files of a replica's TLS. It has no `Default`: the section is
/// absent (plain TCP) or names all three.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TlsFiles {
    /// The CA that signs every replica and client certificate. Required.
    pub ca_file: PathBuf,
    /// This replica's certificate, naming it `node-<id>`. Required.
    pub cert_file: PathBuf,
    /// This replica's private key, readable by its owner only. Required.
    pub key_file: PathBuf,
}

/// The `[auth]` section, client authentication (`server::ports::auth`): bearer tokens from a
/// file and client certificates by name, each mapped to a role (`admin`, `operator`,
/// `container:ID` or `containers:PREFIX`). At least one of the two must be given.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AuthConfig {
    /// Lines of `TOKEN ROLE` (or `sha256:SALT:DIGEST ROLE`), readable by its owner only.
    /// Default none.
    pub tokens_file: Option<PathBuf>,
    /// Certificate name (a DNS name in the client certificate) → role. Default none.
    pub certificates: BTreeMap<String, String>,
}

impl TlsFiles {
    /// Refuses a file that is not there, and a key others may read.
    pub fn validate(&self) -> Result<(), ConfigError> {
        for (field, path) in [
            ("tls.ca_file", &self.ca_file),
            ("tls.cert_file", &self.cert_file),
            ("tls.key_file", &self.key_file),
        ] {
            if !path.is_file() {
                refuse(field, format!("{} is not a readable file", path.display()))?;
            }
        }
        refuse_unless_private(
            "tls.key_file",
            &self.key_file,
            "its key is this replica's identity",
        )
    }
}

impl AuthConfig {
    /// Refuses a tokens file that is not there or that others may read, and a section that
    /// would let nobody in.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if let Some(path) = &self.tokens_file {
            if !path.is_file() {
                refuse(
                    "auth.tokens_file",
                    format!("{} is not a readable file", path.display()),
                )?;
            }
            refuse_unless_private("auth.tokens_file", path, "its tokens are credentials")?;
        }
        if self.tokens_file.is_none() && self.certificates.is_empty() {
            refuse(
                "auth",
                "names no tokens file and no certificates: nobody could connect",
            )?;
        }
        Ok(())
    }
}

/// Refuses a secret file (`what` says why it is one) that others may read. Allowed: no access
/// for group or others, whoever owns it; or owned by root, readable (not writable) by its
/// group, which is how a Kubernetes Secret volume with an `fsGroup` arrives (root:fsGroup,
/// 0440) and the rule PostgreSQL applies to its key.
fn refuse_unless_private(field: &'static str, path: &Path, what: &str) -> Result<(), ConfigError> {
    use std::os::unix::fs::MetadataExt as _;
    let metadata = std::fs::metadata(path).map_err(|e| ConfigError {
        field,
        reason: format!("{}: {e}", path.display()),
    })?;
    if is_private(metadata.mode(), metadata.uid()) {
        return Ok(());
    }
    refuse(
        field,
        format!(
            "{} is readable by others than its owner (mode {:o}, owner uid {}): {what}; chmod \
             600 it (a file owned by root may also be read by its group: mode 440 or 640)",
            path.display(),
            metadata.mode() & 0o777,
            metadata.uid()
        ),
    )
}

/// Whether a file of `mode` owned by `owner` keeps its contents from other users: see
/// [`refuse_unless_private`].
fn is_private(mode: u32, owner: u32) -> bool {
    let no_group_or_others = mode & 0o077 == 0;
    let root_and_its_group_reads = owner == 0 && mode & 0o037 == 0;
    no_group_or_others || root_and_its_group_reads
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Owner-only files pass whoever owns them; a root-owned file may be read by its group
    /// (a Kubernetes Secret volume with `fsGroup`), never written by it or read by others.
    #[test]
    fn secret_files_are_private_to_their_owner_or_to_root_and_its_group() {
        let cases = [
            (0o600, 1000, true),
            (0o400, 1000, true),
            (0o440, 1000, false),
            (0o640, 1000, false),
            (0o604, 1000, false),
            (0o400, 0, true),
            (0o440, 0, true),
            (0o640, 0, true),
            (0o460, 0, false),
            (0o444, 0, false),
            (0o441, 0, false),
        ];
        for (mode, owner, private) in cases {
            assert_eq!(
                is_private(mode, owner),
                private,
                "mode {mode:o}, owner {owner}"
            );
        }
    }

    /// The same rule on a real file, as `validate` reads it: a tokens file of mode 440 passes
    /// only when root owns it (CI runs as root, so there it does).
    #[test]
    fn a_tokens_file_of_mode_440_is_accepted_only_from_root() {
        use std::os::unix::fs::PermissionsExt as _;
        let dir = tempfile::tempdir().unwrap();
        let tokens = dir.path().join("tokens");
        std::fs::write(&tokens, "secret operator\n").unwrap();
        let set_mode = |mode| {
            std::fs::set_permissions(&tokens, std::fs::Permissions::from_mode(mode)).unwrap()
        };
        let root = unsafe { libc::geteuid() } == 0;
        set_mode(0o440);
        assert_eq!(
            refuse_unless_private("auth.tokens_file", &tokens, "x").is_ok(),
            root
        );
        set_mode(0o444);
        let refused = refuse_unless_private("auth.tokens_file", &tokens, "x").unwrap_err();
        assert_eq!(refused.field, "auth.tokens_file");
        assert!(refused.reason.contains("mode 444"), "{}", refused.reason);
        set_mode(0o600);
        assert!(refuse_unless_private("auth.tokens_file", &tokens, "x").is_ok());
    }
}
