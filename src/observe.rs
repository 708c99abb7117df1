//! Logs and metrics of decisions.
//!
//! Events (`tracing`, target `tower_ratelimit`): `debug` for every limited
//! request (route pattern, outcome, remaining, store latency), `trace` adds
//! the budget key (which contains the encoded user: never at `info`),
//! `info` when shadow mode lets through a request it would deny, `warn` (at
//! most once a second) when the store fails.
//!
//! Metrics (cargo feature `metrics`, through the `metrics` crate):
//! `tower_ratelimit_requests_total{outcome}` with outcome `allowed`,
//! `denied`, `denied_locally`, `shadow_denied`, `fail_open`, `fail_closed`
//! or `fallback`; `tower_ratelimit_store_errors_total`; and the histogram
//! `tower_ratelimit_store_latency_seconds`.

use std::time::Duration;

/// What happened to a limited request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Outcome {
    Allowed,
    Denied,
    DeniedLocally,
    ShadowDenied,
    FailOpen,
    FailClosed,
    Fallback,
}

impl Outcome {
    fn as_str(self) -> &'static str {
        match self {
            Outcome::Allowed => "allowed",
            Outcome::Denied => "denied",
            Outcome::DeniedLocally => "denied_locally",
            Outcome::ShadowDenied => "shadow_denied",
            Outcome::FailOpen => "fail_open",
            Outcome::FailClosed => "fail_closed",
            Outcome::Fallback => "fallback",
        }
    }
}

pub(crate) fn outcome(route: &str, budget: &str, outcome: Outcome, remaining: Option<u32>) {
    #[cfg(feature = "metrics")]
    metrics::counter!("tower_ratelimit_requests_total", "outcome" => outcome.as_str()).increment(1);
    if outcome == Outcome::ShadowDenied {
        tracing::info!(route, "shadow mode: request would have been denied");
    }
    tracing::debug!(
        route,
        outcome = outcome.as_str(),
        remaining,
        "rate limit decision"
    );
    tracing::trace!(
        route,
        budget,
        outcome = outcome.as_str(),
        "rate limit budget"
    );
}

pub(crate) fn store_latency(latency: Duration) {
    #[cfg(feature = "metrics")]
    metrics::histogram!("tower_ratelimit_store_latency_seconds").record(latency.as_secs_f64());
    tracing::trace!(
        latency_us = latency.as_micros() as u64,
        "rate limit store call"
    );
}

pub(crate) fn store_error() {
    #[cfg(feature = "metrics")]
    metrics::counter!("tower_ratelimit_store_errors_total").increment(1);
}
