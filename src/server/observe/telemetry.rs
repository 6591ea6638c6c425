//! What the request path counts (appends by outcome and latency, fetches, subscriber lag,
//! authentication refusals), kept as the requests happen and shared by a replica's handles.
//! The observability port (`http.rs`) reads it at each scrape, beside what it reads of state.

use std::sync::atomic::AtomicI64;
use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;

use crate::wire::{ApiError, AppendAck, FetchResponse};

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OutcomeLabel {
    outcome: &'static str,
}

/// What the request path counts, shared by the replica's handles.
pub(crate) struct Telemetry {
    appends: Family<OutcomeLabel, Counter>,
    append_seconds: Histogram,
    fetches: Counter,
    fetches_waiting: Gauge<i64, AtomicI64>,
    auth_refusals: Family<OutcomeLabel, Counter>,
    fetch_lag: Histogram,
    append_many_size: Histogram,
    controller_tick_seconds: Histogram,
}

impl Default for Telemetry {
    fn default() -> Telemetry {
        Telemetry {
            appends: Family::default(),
            // 100 µs to about 1.6 s.
            append_seconds: Histogram::new(exponential_buckets(0.0001, 2.0, 15)),
            fetches: Counter::default(),
            fetches_waiting: Gauge::default(),
            auth_refusals: Family::default(),
            // 0 to about 1 M offsets behind.
            fetch_lag: Histogram::new(
                std::iter::once(0.0).chain(exponential_buckets(1.0, 4.0, 11)),
            ),
            // 1 to 1,024 appends.
            append_many_size: Histogram::new(exponential_buckets(1.0, 2.0, 11)),
            // 50 µs to about 3 s.
            controller_tick_seconds: Histogram::new(exponential_buckets(50e-6, 2.0, 17)),
        }
    }
}

impl Telemetry {
    /// Registers what the request path counted, for one scrape.
    pub(crate) fn register(&self, registry: &mut Registry) {
        registry.register(
            "appends",
            "Appends handled here, by outcome",
            self.appends.clone(),
        );
        registry.register(
            "append_seconds",
            "Append latency here, from arrival to answer",
            self.append_seconds.clone(),
        );
        registry.register(
            "append_many_size",
            "Appends per append_many request (producers sharing a connection, batched by the client)",
            self.append_many_size.clone(),
        );
        registry.register("fetches", "Fetches handled here", self.fetches.clone());
        registry.register(
            "fetch_lag_offsets",
            "Offsets between the head of the log and the end of each fetch answer (subscriber lag)",
            self.fetch_lag.clone(),
        );
        registry.register(
            "auth_refusals",
            "Requests refused here for their credentials or their role",
            self.auth_refusals.clone(),
        );
        registry.register(
            "controller_tick_seconds",
            "Ticks of the job's controller while this replica leads: reading the state, \
             planning, and waiting for the commands it appends",
            self.controller_tick_seconds.clone(),
        );
        registry.register(
            "fetches_waiting",
            "Fetches in progress here (long polls: about one per subscriber)",
            self.fetches_waiting.clone(),
        );
    }

    /// Counts one append by how it ended and records how long it took.
    pub(crate) fn append_done(&self, result: &Result<AppendAck, ApiError>, took: Duration) {
        let outcome = match result {
            Ok(ack) if ack.duplicate => "duplicate",
            Ok(_) => "appended",
            Err(ApiError::Fenced { .. }) => "fenced",
            Err(
                ApiError::Refused(_)
                | ApiError::Deprecated { .. }
                | ApiError::SequenceOutOfWindow { .. }
                | ApiError::ProducerForgotten { .. }
                | ApiError::TooLarge { .. }
                | ApiError::Invalid(_),
            ) => "refused",
            Err(ApiError::NotLeader { .. }) => "not_leader",
            Err(_) => "failed",
        };
        self.appends.get_or_create(&OutcomeLabel { outcome }).inc();
        self.append_seconds.observe(took.as_secs_f64());
    }

    /// One tick of the leading controller took `took`.
    pub(crate) fn controller_ticked(&self, took: Duration) {
        self.controller_tick_seconds.observe(took.as_secs_f64());
    }

    /// One `append_many` request arrived with `appends` appends.
    pub(crate) fn append_many_received(&self, appends: usize) {
        self.append_many_size.observe(appends as f64);
    }

    /// Counts a request refused for its credentials (`unauthorized`) or its role (`forbidden`).
    pub(crate) fn auth_refused(&self, refusal: &ApiError) {
        let outcome = match refusal {
            ApiError::Forbidden { .. } => "forbidden",
            _ => "unauthorized",
        };
        self.auth_refusals
            .get_or_create(&OutcomeLabel { outcome })
            .inc();
    }

    /// How far behind the head an answer leaves its reader: a subscriber's lag, in offsets.
    pub(crate) fn fetch_answered(&self, response: &FetchResponse) {
        let delivered_up_to = response.next_offset.saturating_sub(1);
        let lag = response.applied_offset.saturating_sub(delivered_up_to);
        self.fetch_lag.observe(lag as f64);
    }

    /// Counts a fetch; the guard counts it as waiting until it is answered.
    pub(crate) fn fetch_started(&self) -> impl Drop + '_ {
        self.fetches.inc();
        self.fetches_waiting.inc();
        FetchGuard(&self.fetches_waiting)
    }
}

struct FetchGuard<'a>(&'a Gauge<i64, AtomicI64>);

impl Drop for FetchGuard<'_> {
    fn drop(&mut self) {
        self.0.dec();
    }
}
