//! Reading the control log by offset: the offset index of the state machine leads to the Raft
//! entries in the WAL (or the window of recent entries), and their commands become
//! [`LogEntry`](crate::log::LogEntry)s. No second copy of the log exists.
//!
//! Invariants of every answer:
//!
//! * nothing beyond the applied offset is returned;
//! * a `from` below the first retained offset is `Compacted`, never a silent skip;
//! * `next_offset` passes only offsets that were returned or did not match the filter;
//! * one answer reads at most [`FETCH_ENTRIES_SCANNED_MAX`] Raft entries, and its entries
//!   encode to at most [`FETCH_ANSWER_BYTES_MAX`] bytes and to what the port's frame limit
//!   leaves (beyond its first entry, always returned whole).

use super::state_machine::{entry_commands, log_entry, StateMachineStore};
use super::storage::log_store::LogStore;
use crate::log::Offset;
use crate::wire::{ApiError, FetchRequest, FetchResponse};

/// Raft entries one fetch reads at most, whatever its filter skips: bounds the work of one
/// request (a container filtering for itself may skip thousands of commands per entry read).
pub const FETCH_ENTRIES_SCANNED_MAX: usize = 64;

/// The most encoded entry bytes one fetch answer carries, whatever the request asks (beyond
/// one entry, which is always returned whole): bounds the memory an answer pins while its
/// reader is slow.
pub const FETCH_ANSWER_BYTES_MAX: usize = 4 << 20;

/// One bounded scan of the applied log from `from` for the commands `request` asks for. The
/// entries of the answer take at most `answer_bytes_max` encoded bytes (the port's frame limit
/// less the answer's envelope), beyond the first entry, which is always returned whole: the
/// frame limit admits one command at the size limit, so a reader always makes progress.
pub fn read_committed(
    log: &LogStore,
    state_machine: &StateMachineStore,
    from: Offset,
    request: &FetchRequest,
    answer_bytes_max: usize,
) -> Result<FetchResponse, ApiError> {
    // Spans of purged entries linger until the next apply prunes them; skip them here.
    let first_log_index = log.first_index();
    let (applied_offset, first_offset, spans) = state_machine.read(|state| {
        let applied = state.job.last_offset();
        let first_offset = state.first_retained_offset(first_log_index);
        let from_span = state
            .offset_index
            .range(..=from)
            .next_back()
            .map_or(from, |(first, _)| *first);
        let spans: Vec<_> = state
            .offset_index
            .range(from_span.max(first_offset)..)
            .take(FETCH_ENTRIES_SCANNED_MAX.min(request.entries_max as usize))
            .map(|(first, span)| (*first, span.clone()))
            .collect();
        (applied, first_offset, spans)
    });
    let mut response = FetchResponse {
        entries: Vec::new(),
        next_offset: from,
        applied_offset,
    };
    if from > applied_offset {
        return Ok(response);
    }
    let compacted = ApiError::Compacted {
        first_offset,
        snapshot_offset: state_machine.snapshot_offset(),
    };
    if from < first_offset {
        return Err(compacted);
    }
    let bytes_max = (request.bytes_max as usize)
        .min(FETCH_ANSWER_BYTES_MAX)
        .min(answer_bytes_max);
    let mut bytes = 0usize;
    for (span_offset, span) in spans {
        let Some(raft_entry) = state_machine
            .applied_entry(span.log_index)
            .map_err(|e| ApiError::Unavailable(e.to_string()))?
        else {
            // Purged while we read: what was read so far stands.
            if response.next_offset == from {
                return Err(compacted);
            }
            break;
        };
        for (offset, proposal) in entry_commands(span_offset, &span, &raft_entry) {
            if offset < from {
                continue;
            }
            if offset > applied_offset {
                return Ok(response);
            }
            if request.filter.matches(&proposal.target) {
                let entry = log_entry(offset, proposal, &raft_entry);
                let size = entry.encoded_len();
                let full = response.entries.len() >= request.entries_max as usize
                    || (!response.entries.is_empty() && bytes + size > bytes_max);
                if full {
                    return Ok(response);
                }
                bytes += size;
                response.entries.push(entry);
            }
            response.next_offset = offset + 1;
        }
    }
    Ok(response)
}
