//! The one binary codec for the network and the disk: bincode 1 with fixed-width integers, a
//! size limit and no trailing bytes.
//!
//! The limit matters: bincode trusts length prefixes, so without it a corrupt or hostile
//! prefix of `u64::MAX` would try to allocate that much before failing.

use bincode::Options;
use serde::{de::DeserializeOwned, Serialize};

/// Why bytes did not decode. Every variant is a value, never a panic.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    /// The bytes ended before the value did, or a length prefix claims more bytes than
    /// remain: the input was cut short or is corrupt.
    #[error("input ended before the value was complete")]
    Truncated,
    /// The value needs more than the decode limit: the input is corrupt or hostile, or the
    /// limit is too small for it.
    #[error("value exceeds the {limit}-byte decode limit")]
    TooLarge {
        /// The limit given to [`decode`], in bytes.
        limit: u64,
    },
    /// A whole value decoded, but this many bytes were left after it: the input is not one
    /// value of the type asked for.
    #[error("{0} bytes were left over after the value")]
    TrailingBytes(usize),
    /// The bytes are not a value of the type asked for (an unknown enum tag, text that is not
    /// UTF-8, ...); the message is bincode's.
    #[error("malformed input: {0}")]
    Malformed(String),
}

fn options(limit: u64) -> impl Options {
    bincode::DefaultOptions::new()
        .with_fixint_encoding()
        .with_little_endian()
        .with_limit(limit)
}

/// Encodes a value. Encoding plain serde data into a `Vec` cannot fail.
pub fn encode<T: Serialize>(value: &T) -> Vec<u8> {
    options(u64::MAX)
        .serialize(value)
        .expect("serializing plain data into memory cannot fail")
}

/// Decodes exactly one value from `bytes`, allocating at most `limit` bytes for it.
///
/// The limit bincode enforces is also capped at the input's length: a value never needs more
/// bytes than it was encoded in, and bincode allocates a byte buffer for its claimed length
/// before reading it, so a length prefix beyond the input is refused (as `Truncated`) before
/// it can allocate more than the input's size, however large `limit` is.
pub fn decode<T: DeserializeOwned>(bytes: &[u8], limit: u64) -> Result<T, DecodeError> {
    let input = bytes.len() as u64;
    let mut reader = bytes;
    let value = options(limit.min(input))
        .deserialize_from(&mut reader)
        .map_err(|e| match *e {
            bincode::ErrorKind::Io(ref io) if io.kind() == std::io::ErrorKind::UnexpectedEof => {
                DecodeError::Truncated
            }
            bincode::ErrorKind::SizeLimit if input < limit => DecodeError::Truncated,
            bincode::ErrorKind::SizeLimit => DecodeError::TooLarge { limit },
            other => DecodeError::Malformed(other.to_string()),
        })?;
    if !reader.is_empty() {
        return Err(DecodeError::TrailingBytes(reader.len()));
    }
    Ok(value)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::log::{Batch, ContainerId, Frame, ProducerSeq, Proposal, Target};
    use proptest::prelude::*;

    fn sample_batch() -> Batch {
        Batch {
            appended_at_ms: 1_700_000_000_000,
            proposals: vec![Proposal {
                producer: Some(ProducerSeq {
                    producer: 9,
                    seq: 3,
                }),
                target: Target::Container(ContainerId::new("c-7").unwrap()),
                frame: Frame {
                    kind: 1,
                    version: 1,
                    body: vec![0xab; 40],
                },
            }],
        }
    }

    #[test]
    fn batch_round_trips() {
        let batch = sample_batch();
        let bytes = encode(&batch);
        assert_eq!(decode::<Batch>(&bytes, 1 << 20), Ok(batch));
    }

    #[test]
    fn every_truncation_is_a_typed_error() {
        let bytes = encode(&sample_batch());
        for cut in 0..bytes.len() {
            assert_eq!(
                decode::<Batch>(&bytes[..cut], 1 << 20),
                Err(DecodeError::Truncated),
                "cut at {cut}"
            );
        }
    }

    #[test]
    fn huge_length_prefix_fails_without_allocating_it() {
        // appended_at_ms, then a proposal count of u64::MAX with nothing behind it.
        let mut bytes = 0u64.to_le_bytes().to_vec();
        bytes.extend_from_slice(&u64::MAX.to_le_bytes());
        assert_eq!(
            decode::<Batch>(&bytes, 1 << 20),
            Err(DecodeError::Truncated)
        );
    }

    /// Found by fuzzing the snapshot decoder: under a large limit (snapshots may be 1 GiB) a
    /// claimed length was allocated before the input ran out. Now the claim is checked against
    /// the input first.
    #[test]
    fn a_claimed_length_beyond_the_input_is_truncated_under_any_limit() {
        let mut bytes = (512u64 << 20).to_le_bytes().to_vec();
        bytes.extend_from_slice(&[7; 16]);
        assert_eq!(
            decode::<serde_bytes::ByteBuf>(&bytes, 1 << 30),
            Err(DecodeError::Truncated)
        );
    }

    #[test]
    fn value_above_the_limit_is_refused() {
        let mut batch = sample_batch();
        batch.proposals[0].frame.body = vec![1; 2 << 20];
        assert_eq!(
            decode::<Batch>(&encode(&batch), 1 << 20),
            Err(DecodeError::TooLarge { limit: 1 << 20 })
        );
    }

    #[test]
    fn trailing_bytes_are_refused() {
        let mut bytes = encode(&sample_batch());
        bytes.push(0);
        assert_eq!(
            decode::<Batch>(&bytes, 1 << 20),
            Err(DecodeError::TrailingBytes(1))
        );
    }

    fn any_proposal() -> impl Strategy<Value = Proposal> {
        let producer = proptest::option::of((any::<u64>(), any::<u64>()))
            .prop_map(|p| p.map(|(producer, seq)| ProducerSeq { producer, seq }));
        let target = prop_oneof![
            Just(Target::All),
            Just(Target::Coordinator),
            "[A-Za-z0-9._:-]{1,24}".prop_map(|id| Target::Container(ContainerId::new(id).unwrap())),
        ];
        let frame = (
            any::<u32>(),
            any::<u16>(),
            proptest::collection::vec(any::<u8>(), 0..300),
        )
            .prop_map(|(kind, version, body)| Frame {
                kind,
                version,
                body,
            });
        (producer, target, frame).prop_map(|(producer, target, frame)| Proposal {
            producer,
            target,
            frame,
        })
    }

    proptest! {
        #[test]
        fn every_batch_round_trips(
            appended_at_ms in any::<u64>(),
            proposals in proptest::collection::vec(any_proposal(), 0..20),
        ) {
            let batch = Batch { appended_at_ms, proposals };
            let bytes = encode(&batch);
            prop_assert_eq!(decode::<Batch>(&bytes, bytes.len() as u64), Ok(batch));
        }

        #[test]
        fn decoding_arbitrary_bytes_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
            let _ = decode::<Batch>(&bytes, 1 << 16);
            let _ = decode::<crate::log::LogEntry>(&bytes, 1 << 16);
        }

        #[test]
        fn flipping_any_byte_never_panics(flip in 0usize..200, value in any::<u8>()) {
            let mut bytes = encode(&sample_batch());
            let at = flip % bytes.len();
            bytes[at] = value;
            let _ = decode::<Batch>(&bytes, 1 << 16);
        }
    }
}
