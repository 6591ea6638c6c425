//! Commands and their `{kind, version, body}` frame (DESIGN.md §5).

use serde::{Deserialize, Serialize};

/// A command kind number. Built-in kinds live below [`CUSTOM_KIND_MIN`]; the space above it
/// belongs to users, so a user kind can never collide with a kind a later release adds.
pub type Kind = u32;

/// The first kind number reserved for user [`Command::Custom`] commands.
pub const CUSTOM_KIND_MIN: Kind = 0x1000_0000;

/// The wire and disk form of every command, as KRaft frames its records.
///
/// The frame is what is stored and replicated. Readers decode it with [`Command::from_frame`]
/// against the vocabulary *they* know, which is what lets an old reader pass a newer kind through
/// as [`Command::Unknown`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Frame {
    pub kind: Kind,
    pub version: u16,
    pub body: Vec<u8>,
}

impl Frame {
    /// The bytes this frame takes in a batch, for size limits.
    pub fn encoded_len(&self) -> usize {
        // kind (4) + version (2) + body length prefix (8) + body.
        14 + self.body.len()
    }
}

/// A command as a reader understands it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Command {
    /// A user-defined command. ctrlog orders and replicates it and never looks inside.
    Custom {
        kind: Kind,
        version: u16,
        payload: Vec<u8>,
    },
    /// A built-in frame this reader does not know (a newer release wrote it). Passed through
    /// untouched so that the stream never stalls on it.
    Unknown(Frame),
}

impl Command {
    /// Decodes a frame against this build's vocabulary. Total: an unknown frame is `Unknown`.
    pub fn from_frame(frame: Frame) -> Command {
        if frame.kind >= CUSTOM_KIND_MIN {
            return Command::Custom {
                kind: frame.kind,
                version: frame.version,
                payload: frame.body,
            };
        }
        Command::Unknown(frame)
    }

    /// Encodes this command as the frame that is stored and replicated.
    pub fn into_frame(self) -> Frame {
        match self {
            Command::Custom {
                kind,
                version,
                payload,
            } => Frame {
                kind,
                version,
                body: payload,
            },
            Command::Unknown(frame) => frame,
        }
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
}
