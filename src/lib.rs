//! Exact, multi-window rate limiting for Tower services: Axum, Hyper and
//! Tonic.
//!
//! ```
//! use axum::{routing::get, Router};
//! use tower_ratelimit::{identity::Identity, MemoryStore, RateLimitLayer, Rule, Rules};
//!
//! let rules = Rules::builder()
//!     // Default users: one request per second; admins: unlimited.
//!     .route(r"^/towns", [Rule::group("default").second(1), Rule::group("admin")])
//!     // Every window must allow a request; a denied one consumes nothing.
//!     .route(r"^/multiple", [Rule::new().second(5).minute(100).hour(1000)])
//!     .build()?;
//!
//! let app: Router = Router::new()
//!     .route("/towns", get(|| async { "towns" }))
//!     .layer(RateLimitLayer::new(rules, MemoryStore::new()).identify(
//!         // (A key the service has verified: see `identity::HeaderKey`;
//!         // `identity::single_header` refuses one sent twice.)
//!         |head: &http::request::Parts| {
//!             let key = head.headers.get("x-api-key").map(|v| v.as_bytes().to_vec());
//!             async move {
//!                 Ok(match key {
//!                     Some(key) if key == b"admin-key" => Identity::new(key).with_group("admin"),
//!                     // ("key:": no key can be "anonymous".)
//!                     Some(key) => Identity::new([b"key:".as_slice(), &key].concat()),
//!                     None => Identity::new("anonymous"),
//!                 })
//!             }
//!         },
//!     )
//!     // Under axum: responses keep axum's own body type (no box per response).
//!     .same_body());
//! # Ok::<(), tower_ratelimit::ConfigError>(())
//! ```
//!
//! # The request path
//!
//! 1. The path is matched against every route pattern in one pass; a path
//!    that matches none passes through untouched (no identity call, no store
//!    call, no headers), and so does a request whose method no rule of the
//!    matching routes is for (a `GET` where only a `POST` rule applies).
//! 2. The identity function names the user and their group.
//! 3. The first matching route with a rule for that group (and method)
//!    applies; a rule without windows, or no rule at all, means unlimited.
//! 4. The store decides on every window of the rule atomically: all allow,
//!    and the request is recorded in all of them, or it is denied and
//!    recorded in none.
//! 5. Allowed: the inner service runs and its response gets the
//!    `X-RateLimit-*` headers. Denied: `429` with `Retry-After`; the inner
//!    service is never called. Store failure: [`FailMode`]. (Those are the
//!    defaults for HTTP: [`HeaderMode`] picks other headers or none, a
//!    gRPC request is denied with `RESOURCE_EXHAUSTED` in trailers, a
//!    request that costs more than a limit gets no `Retry-After`, since
//!    waiting never lets it pass, and shadow mode lets a would-be denial
//!    through; see [`decision`].)
//!
//! # Keys
//!
//! A budget is (route, user), or (zone, user) for rules that name a zone;
//! a rule that names a method (and no zone) has its own budget. Users are
//! arbitrary bytes and are percent-encoded (and hashed when the encoding
//! passes 128 bytes) before they become part of a key, so braces, colons,
//! newlines or megabyte-long identities can never reach another user's
//! budget. See [`key`] for the layout.
//!
//! # Logs and metrics
//!
//! Events go through `tracing`, target `tower_ratelimit`: `debug` for every
//! limited request (route pattern, outcome, remaining, and `store_us`, the
//! store's latency in microseconds, when an asynchronous store was asked);
//! `trace` adds the budget key (which holds the encoded user: never at
//! `info`); `info` when shadow mode lets through a request it would deny
//! (at most once a second per rule, with the count of those held back since:
//! `debug` has every one), when a
//! failing store answers again (leaving the fallback store), and when the
//! Redis store reconnects or follows a new Sentinel master; `warn`, at
//! most once a second, when the store fails a check or an adjustment, and
//! when the identity fails with a server error (a `500`: `ClientIp` on a
//! server that does not give the peer address).
//!
//! Metrics (cargo feature `metrics`, through the `metrics` crate):
//! `tower_ratelimit_requests_total{outcome}` with outcome `allowed`,
//! `denied`, `denied_locally` (by the denial cache), `shadow_denied`,
//! `fail_open`, `fail_closed`, `fallback` (allowed by the fallback store
//! while the store is failing), `fallback_denied` or `identity_error` (the
//! identity failed: answered with its error, without a decision);
//! `tower_ratelimit_near_limit_total`, the allowed requests after which a
//! window had spent at least 80% of its limit (budgets about to be
//! denied); `tower_ratelimit_store_errors_total` (failed checks and
//! adjustments); and the histogram
//! `tower_ratelimit_store_latency_seconds` (every check an asynchronous
//! store was asked, failed ones included; not a check the client gave up
//! on before it ended, nor a penalty or refund). Metrics carry no route
//! label (a label per route pattern would be unbounded for a table that
//! grows): the `debug` events name the route.

#![forbid(unsafe_code)]
// Nothing on a request path may panic; tests may unwrap.
#![cfg_attr(not(test), warn(clippy::unwrap_used, clippy::expect_used))]
#![cfg_attr(docsrs, feature(doc_cfg))]

pub mod body;
mod cache;
pub mod clock;
pub mod decision;
mod error;
pub mod identity;
pub mod key;
mod layer;
mod observe;
pub mod rules;
mod service;
pub mod store;

/// Marks the path that calls it as rare: the compiler then lays that
/// path's code out after the common path's, which stays compact in the
/// instruction cache (round 23 in `benches/HISTORY.md`).
/// `std::hint::cold_path` does the same in recent Rust (1.95 has it); the
/// crate builds on 1.88. (`black_box` keeps the call, and with it the hint, from being
/// optimized away.)
#[cold]
#[inline(never)]
pub(crate) fn cold_path() {
    std::hint::black_box(());
}

/// The `http` crate (1.x) whose types this one's API takes and gives
/// (`Request`, `request::Parts`, `HeaderValue`, `StatusCode`), re-exported
/// so that a service can name them without a dependency of its own; the
/// examples here write `http::…`, which is `tower_ratelimit::http::…` (or
/// `axum::http::…`) to a service that does not depend on it.
pub use http;

pub use body::{BodyMode, RateLimitBody, SameBody, Wrapped};
pub use error::{ConfigError, ConfigErrorKind, ConfigWarning, ConfigWarningKind};
pub use layer::{FailMode, RateLimitLayer, ReloadableRules, RuleSource, DEFAULT_DENIAL_CACHE};
pub use rules::{Algorithm, Config, HeaderMode, Route, Rule, Rules, RulesBuilder, Window};
pub use service::{RateLimit, ResponseFuture};
pub use store::MemoryStore;
pub use store::{
    AdjustFuture, Adjustment, Check, CheckRef, Decision, GlobalCheck, GlobalRef, Store, StoreError,
    StoreErrorKind, WindowState,
};
