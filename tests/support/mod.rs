//! Shared test support: an axum app behind the layer, driven in-process.
#![allow(dead_code, unreachable_pub)]

pub mod conformance;
#[cfg(feature = "redis")]
pub mod redis_server;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::Router;
use http::request::Parts;
use http::{HeaderMap, Method, Request, StatusCode};
use http_body_util::BodyExt;
use tower::ServiceExt;
use tower_ratelimit::clock::{ManualClock, Timestamp};
use tower_ratelimit::identity::{Identity, IdentityError};
use tower_ratelimit::{RateLimitLayer, Rules, Store};

/// Whether everything a test sent since `started` came within 0.9 s: a
/// test of a budget of a second asserts its refusals only then (a machine
/// that stalled may have let the window pass).
pub fn came_within_a_second(started: std::time::Instant) -> bool {
    started.elapsed() < Duration::from_millis(900)
}

/// The start of every manual clock: a round second, so window edges are
/// easy to read (2026-01-01T00:00:00Z).
pub const START: u64 = 1_767_225_600_000_000;

/// A table of one route, `pattern`, with `rules` and the route-wide limit
/// `global`.
pub fn route_with_global(
    pattern: &str,
    rules: impl IntoIterator<Item = tower_ratelimit::Rule>,
    global: tower_ratelimit::Rule,
) -> Rules {
    Rules::builder()
        .add_route(
            tower_ratelimit::Route::new(pattern)
                .rules(rules)
                .global(global),
        )
        .build()
        .unwrap()
}

/// One user spends `spend` requests to `/a` under `before` (all allowed),
/// then `after` is swapped in: what `after.budget_changes` said of the swap
/// that is true of `on` (the store's kind), as (route-wide, kind) pairs,
/// and the status of the user's next request. (On `store`, at a fixed
/// time: the swap is the only change.)
pub async fn next_after_reload<S>(
    store: S,
    on: tower_ratelimit::rules::ChangedOn,
    before: Rules,
    after: Rules,
    spend: usize,
) -> (
    Vec<(bool, tower_ratelimit::rules::BudgetChangeKind)>,
    StatusCode,
)
where
    S: Store + Clone + Send + Sync + 'static,
    S::Future: Send,
{
    let rules = tower_ratelimit::ReloadableRules::new(before);
    let layer = RateLimitLayer::new(rules.clone(), store)
        .clock(ManualClock::new(Timestamp::from_micros(START)))
        .identify(tower_ratelimit::identity::Global)
        .denial_cache(0);
    let router = Router::new().fallback(|| async { "ok" }).layer(layer);
    let status = || async {
        let request = Request::get("/a").body(Body::empty()).unwrap();
        router.clone().oneshot(request).await.unwrap().status()
    };
    for i in 0..spend {
        assert_eq!(
            status().await,
            StatusCode::OK,
            "request {i} before the swap"
        );
    }
    let changes = after
        .budget_changes(&rules.get())
        .into_iter()
        .filter(|c| [tower_ratelimit::rules::ChangedOn::Every, on].contains(&c.stores))
        .map(|c| (c.route_wide, c.kind))
        .collect();
    rules.set(after);
    (changes, status().await)
}

/// How many cases a property test runs: `quick` (what CI runs), or
/// `PROPTEST_CASES` when set, for a long fuzzing run
/// (`PROPTEST_CASES=1000000 cargo test --release --all-features --test
/// hostile`; RELIABILITY.md). (A test's own count would otherwise override
/// the variable.)
pub fn proptest_cases(quick: u32) -> u32 {
    std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|cases| cases.parse().ok())
        .unwrap_or(quick)
}

/// The cost a test request names in its `x-cost` header (1 without): the
/// layer's `.cost(cost_header)`.
pub fn cost_header(head: &Parts) -> u32 {
    head.headers
        .get("x-cost")
        .and_then(|v| v.to_str().ok()?.parse().ok())
        .unwrap_or(1)
}

/// A GET of `path` by `user` that costs `cost` (see [`cost_header`]).
pub fn costing(path: &str, user: &str, cost: u32) -> Request<Body> {
    Request::builder()
        .uri(path)
        .header("x-user", user)
        .header("x-cost", cost.to_string())
        .body(Body::empty())
        .unwrap()
}

/// A response, read whole.
#[derive(Debug)]
pub struct Reply {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub body: String,
}

impl Reply {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }

    pub fn number(&self, name: &str) -> u64 {
        self.header(name)
            .unwrap_or_else(|| panic!("no {name} header in {self:?}"))
            .parse()
            .unwrap()
    }

    /// The status and the `X-RateLimit-*` headers: (status, limit,
    /// remaining, reset).
    pub fn x_headers(&self) -> (u16, u64, u64, u64) {
        (
            self.status.as_u16(),
            self.number("x-ratelimit-limit"),
            self.number("x-ratelimit-remaining"),
            self.number("x-ratelimit-reset"),
        )
    }

    pub fn limited(&self) -> bool {
        self.headers.contains_key("x-ratelimit-limit")
    }
}

/// Identity for tests: user from `x-user` (missing: an error, 401 or the
/// status in `x-fail-status`), group from `x-group` (default "default").
pub fn header_identity(
    head: &Parts,
) -> impl std::future::Future<Output = Result<Identity, IdentityError>> + Send + 'static {
    // `x-user-hex` carries bytes a header cannot (newlines, NUL, non-UTF-8).
    let user = match head.headers.get("x-user-hex") {
        Some(hex) => Some(decode_hex(hex.as_bytes())),
        None => head.headers.get("x-user").map(|v| v.as_bytes().to_vec()),
    };
    let group = head
        .headers
        .get("x-group")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    let fail_status = head
        .headers
        .get("x-fail-status")
        .and_then(|v| http::StatusCode::from_bytes(v.as_bytes()).ok())
        .unwrap_or(http::StatusCode::UNAUTHORIZED);
    // `x-fail-message-hex`: the error's message, as bytes a header cannot carry.
    let fail_message = head
        .headers
        .get("x-fail-message-hex")
        .map(|hex| String::from_utf8_lossy(&decode_hex(hex.as_bytes())).into_owned())
        .unwrap_or_else(|| "missing x-user".to_owned());
    async move {
        let user = user.ok_or_else(|| IdentityError::new(fail_message).with_status(fail_status))?;
        let identity = Identity::new(user);
        Ok(match group {
            Some(g) => identity.with_group(g),
            None => identity,
        })
    }
}

pub fn decode_hex(hex: &[u8]) -> Vec<u8> {
    hex.chunks(2)
        .map(|pair| u8::from_str_radix(std::str::from_utf8(pair).unwrap(), 16).unwrap())
        .collect()
}

pub fn encode_hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// An axum app that answers 200 "ok" on every path behind the layer, on a
/// manual clock, counting how often the inner service and the identity
/// function run.
#[derive(Clone)]
pub struct App {
    pub router: Router,
    pub clock: ManualClock,
    pub inner_calls: Arc<AtomicUsize>,
    pub identity_calls: Arc<AtomicUsize>,
}

impl App {
    pub fn new<St: Store>(rules: Rules, store: St) -> Self {
        Self::with(rules, store, |layer| layer)
    }

    /// Like [`new`](Self::new), letting the caller adjust the layer.
    pub fn with<St: Store, F>(rules: Rules, store: St, adjust: F) -> Self
    where
        F: FnOnce(
            RateLimitLayer<St, tower_ratelimit::identity::ClientIp>,
        ) -> RateLimitLayer<St, tower_ratelimit::identity::ClientIp>,
    {
        let clock = ManualClock::new(Timestamp::from_micros(START));
        Self::build(rules, store, Some((clock, true)), adjust)
    }

    /// An app on a manual clock starting at `start` (microseconds), read
    /// by the layer for its own timing only (`local_clock`): the store
    /// decides on its own clock (Redis: the server's `TIME`).
    #[allow(dead_code)]
    pub fn on_local_clock<St: Store>(rules: Rules, store: St, start: u64) -> Self {
        let clock = ManualClock::new(Timestamp::from_micros(start));
        Self::build(rules, store, Some((clock, false)), |layer| layer)
    }

    /// An app whose checks are decided on a manual clock starting at
    /// `start` (microseconds).
    #[allow(dead_code)]
    pub fn on_clock_at<St: Store>(rules: Rules, store: St, start: u64) -> Self {
        let clock = ManualClock::new(Timestamp::from_micros(start));
        Self::build(rules, store, Some((clock, true)), |layer| layer)
    }

    /// An app whose layer has no injected clock: the store decides on its
    /// own clock (Redis: the server's `TIME`).
    pub fn on_store_clock<St: Store, F>(rules: Rules, store: St, adjust: F) -> Self
    where
        F: FnOnce(
            RateLimitLayer<St, tower_ratelimit::identity::ClientIp>,
        ) -> RateLimitLayer<St, tower_ratelimit::identity::ClientIp>,
    {
        Self::build(rules, store, None, adjust)
    }

    /// `manual`: a manual clock, and whether checks are decided on it (else
    /// the layer reads it for its own timing only).
    fn build<St: Store, F>(
        rules: Rules,
        store: St,
        manual: Option<(ManualClock, bool)>,
        adjust: F,
    ) -> Self
    where
        F: FnOnce(
            RateLimitLayer<St, tower_ratelimit::identity::ClientIp>,
        ) -> RateLimitLayer<St, tower_ratelimit::identity::ClientIp>,
    {
        let mut layer = RateLimitLayer::new(rules, store);
        let clock = match manual {
            Some((clock, true)) => {
                layer = layer.clock(clock.clone());
                clock
            }
            Some((clock, false)) => {
                layer = layer.local_clock(clock.clone());
                clock
            }
            None => ManualClock::default(),
        };
        let inner_calls = Arc::new(AtomicUsize::new(0));
        let identity_calls = Arc::new(AtomicUsize::new(0));
        let calls = inner_calls.clone();
        let ids = identity_calls.clone();
        let layer = adjust(layer).identify(move |head: &Parts| {
            ids.fetch_add(1, Ordering::SeqCst);
            header_identity(head)
        });
        let router = Router::new()
            .fallback(move || {
                let calls = calls.clone();
                async move {
                    calls.fetch_add(1, Ordering::SeqCst);
                    "ok"
                }
            })
            .layer(layer);
        Self {
            router,
            clock,
            inner_calls,
            identity_calls,
        }
    }

    pub fn advance(&self, by: Duration) {
        self.clock.advance(by);
    }

    pub fn advance_ms(&self, ms: u64) {
        self.clock.advance(Duration::from_millis(ms));
    }

    /// Sets the clock back by `by` (a clock that went back), and returns
    /// the time it read before.
    #[allow(dead_code)]
    pub fn rewind(&self, by: Duration) -> Timestamp {
        let now = tower_ratelimit::clock::Clock::now(&self.clock);
        let micros = u64::try_from(by.as_micros()).unwrap_or(u64::MAX);
        self.clock.set(Timestamp::from_micros(
            now.as_micros().saturating_sub(micros),
        ));
        now
    }

    pub async fn send(
        &self,
        method: Method,
        path: &str,
        user: Option<&[u8]>,
        group: Option<&str>,
    ) -> Reply {
        let mut request = Request::builder().method(method).uri(path);
        if let Some(user) = user {
            request = request.header("x-user", http::HeaderValue::from_bytes(user).unwrap());
        }
        if let Some(group) = group {
            request = request.header("x-group", group);
        }
        self.send_request(request.body(Body::empty()).unwrap())
            .await
    }

    /// A GET as a user given as raw bytes (sent hex-encoded).
    pub async fn get_bytes(&self, path: &str, user: &[u8]) -> Reply {
        let request = Request::builder()
            .uri(path)
            .header("x-user-hex", encode_hex(user))
            .body(Body::empty())
            .unwrap();
        self.send_request(request).await
    }

    pub async fn send_request(&self, request: Request<Body>) -> Reply {
        let response = self.router.clone().oneshot(request).await.unwrap();
        let (parts, body) = response.into_parts();
        let body = body.collect().await.unwrap().to_bytes();
        Reply {
            status: parts.status,
            headers: parts.headers,
            body: String::from_utf8_lossy(&body).into_owned(),
        }
    }

    pub async fn get(&self, path: &str, user: &str) -> Reply {
        self.send(Method::GET, path, Some(user.as_bytes()), None)
            .await
    }

    pub async fn get_as(&self, path: &str, user: &str, group: &str) -> Reply {
        self.send(Method::GET, path, Some(user.as_bytes()), Some(group))
            .await
    }

    pub fn inner_calls(&self) -> usize {
        self.inner_calls.load(Ordering::SeqCst)
    }

    pub fn identity_calls(&self) -> usize {
        self.identity_calls.load(Ordering::SeqCst)
    }
}
