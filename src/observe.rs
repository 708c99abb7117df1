//! Logs and metrics of decisions: what is sent is described in the crate
//! docs (*Logs and metrics*).

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
    FallbackDenied,
    /// The identity failed: answered without a decision (counted, never
    /// logged as a decision: see [`identity_error`]).
    IdentityError,
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
            Outcome::FallbackDenied => "fallback_denied",
            Outcome::IdentityError => "identity_error",
        }
    }
}

#[cfg(feature = "metrics")]
mod keys {
    use metrics::{Key, Label, Metadata};

    pub(super) static METADATA: Metadata<'static> = Metadata::new(
        "tower_ratelimit",
        metrics::Level::INFO,
        Some(module_path!()),
    );

    macro_rules! outcome_key {
        ($name:ident, $labels:ident, $value:literal) => {
            static $labels: [Label; 1] = [Label::from_static_parts("outcome", $value)];
            pub(super) static $name: Key =
                Key::from_static_parts("tower_ratelimit_requests_total", &$labels);
        };
    }
    outcome_key!(ALLOWED, ALLOWED_LABELS, "allowed");
    outcome_key!(DENIED, DENIED_LABELS, "denied");
    outcome_key!(DENIED_LOCALLY, DENIED_LOCALLY_LABELS, "denied_locally");
    outcome_key!(SHADOW_DENIED, SHADOW_DENIED_LABELS, "shadow_denied");
    outcome_key!(FAIL_OPEN, FAIL_OPEN_LABELS, "fail_open");
    outcome_key!(FAIL_CLOSED, FAIL_CLOSED_LABELS, "fail_closed");
    outcome_key!(FALLBACK, FALLBACK_LABELS, "fallback");
    outcome_key!(FALLBACK_DENIED, FALLBACK_DENIED_LABELS, "fallback_denied");
    outcome_key!(IDENTITY_ERROR, IDENTITY_ERROR_LABELS, "identity_error");
    pub(super) static NEAR_LIMIT: Key = Key::from_static_name("tower_ratelimit_near_limit_total");
    pub(super) static STORE_ERRORS: Key =
        Key::from_static_name("tower_ratelimit_store_errors_total");
    pub(super) static STORE_LATENCY: Key =
        Key::from_static_name("tower_ratelimit_store_latency_seconds");
}

/// Counts and logs one limited request. The metric keys are static, so
/// recording costs no allocation; `details` (the remaining count, and the
/// store's latency when an asynchronous store was asked) are worked out
/// only when an event may be logged.
pub(crate) fn outcome(
    route: &str,
    budget: &str,
    outcome: Outcome,
    details: impl FnOnce() -> (Option<u32>, Option<Duration>),
) {
    #[cfg(feature = "metrics")]
    {
        let key = match outcome {
            Outcome::Allowed => &keys::ALLOWED,
            Outcome::Denied => &keys::DENIED,
            Outcome::DeniedLocally => &keys::DENIED_LOCALLY,
            Outcome::ShadowDenied => &keys::SHADOW_DENIED,
            Outcome::FailOpen => &keys::FAIL_OPEN,
            Outcome::FailClosed => &keys::FAIL_CLOSED,
            Outcome::Fallback => &keys::FALLBACK,
            Outcome::FallbackDenied => &keys::FALLBACK_DENIED,
            Outcome::IdentityError => &keys::IDENTITY_ERROR,
        };
        metrics::with_recorder(|r| r.register_counter(key, &keys::METADATA).increment(1));
    }
    // (One look at the most verbose level any subscriber wants: below
    // `debug`, as without a subscriber or under the usual `info` one, none
    // of its events can be on, and the request's path stays short. A
    // shadow-mode denial's `info` line is the layer's, at most once a
    // second.)
    use tracing::level_filters::{LevelFilter, STATIC_MAX_LEVEL};
    use tracing::Level;
    if Level::DEBUG <= STATIC_MAX_LEVEL && Level::DEBUG <= LevelFilter::current() {
        let (remaining, latency) = details();
        log_outcome(route, budget, outcome, remaining, latency);
    }
}

/// Counts and logs one request whose identity failed (answered with
/// `status`, without a decision).
pub(crate) fn identity_error(status: http::StatusCode, message: &str) {
    #[cfg(feature = "metrics")]
    metrics::with_recorder(|r| {
        r.register_counter(&keys::IDENTITY_ERROR, &keys::METADATA)
            .increment(1)
    });
    tracing::debug!(
        status = status.as_u16(),
        message,
        outcome = Outcome::IdentityError.as_str(),
        "rate limit identity failed"
    );
}

/// The events of [`outcome`].
#[inline(never)]
fn log_outcome(
    route: &str,
    budget: &str,
    outcome: Outcome,
    remaining: Option<u32>,
    latency: Option<Duration>,
) {
    let store_us = latency.map(|l| u64::try_from(l.as_micros()).unwrap_or(u64::MAX));
    tracing::debug!(
        route,
        outcome = outcome.as_str(),
        remaining,
        store_us,
        "rate limit decision"
    );
    tracing::trace!(
        route,
        budget,
        outcome = outcome.as_str(),
        "rate limit budget"
    );
}

/// The share of a window's limit from which an allowed request counts as
/// near the limit: 80%, in fifths.
#[cfg(feature = "metrics")]
const NEAR_LIMIT_FIFTHS: u64 = 4;

/// Counts an allowed request after which any of its windows has spent at
/// least 80% of its limit.
#[cfg(feature = "metrics")]
pub(crate) fn near_limit(decision: &crate::store::Decision) {
    let near = decision.windows().iter().any(|state| {
        let limit = u64::from(state.window().limit());
        let spent = limit.saturating_sub(u64::from(state.remaining));
        spent * 5 >= limit * NEAR_LIMIT_FIFTHS
    });
    if near {
        metrics::with_recorder(|r| {
            r.register_counter(&keys::NEAR_LIMIT, &keys::METADATA)
                .increment(1)
        });
    }
}

pub(crate) fn store_latency(latency: Duration) {
    #[cfg(feature = "metrics")]
    metrics::with_recorder(|r| {
        r.register_histogram(&keys::STORE_LATENCY, &keys::METADATA)
            .record(latency.as_secs_f64())
    });
    tracing::trace!(
        latency_us = latency.as_micros() as u64,
        "rate limit store call"
    );
}

pub(crate) fn store_error() {
    #[cfg(feature = "metrics")]
    metrics::with_recorder(|r| {
        r.register_counter(&keys::STORE_ERRORS, &keys::METADATA)
            .increment(1)
    });
}
