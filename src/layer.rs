//! [`RateLimitLayer`]: the rules, the store and the options of the
//! middleware. The service it makes is in [`crate::service`].

use std::fmt;
use std::marker::PhantomData;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Instant;

use bytes::Bytes;
use http::request::Parts;
use http::{HeaderMap, Response, StatusCode};
use tower_layer::Layer;

use crate::body::{SameBody, Wrapped};
use crate::cache::DenialCache;
use crate::clock::Clock;
use crate::identity::{ClientIp, Identify, IdentityError};
use crate::rules::{HeaderMode, Policy, Rules};
use crate::service::{RateLimit, Shared};
use crate::store::{Adjustment, Decision, MemoryStore, Store, StoreError};

/// What the layer does when its store cannot decide (error or deadline).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum FailMode {
    /// Let the request through, without rate-limit headers, and log a
    /// (rate-limited) warning. The default: a limiter should never be the
    /// reason a service is down.
    #[default]
    Open,
    /// Answer `503 Service Unavailable` with `Retry-After: 1` (gRPC:
    /// `UNAVAILABLE`).
    Closed,
    /// Keep limiting with an in-process [`MemoryStore`] while the store is
    /// down (each replica then enforces the limits on its own), and return
    /// to the store when it answers again: one request at most every
    /// 500 ms probes it; the others do not wait for it. The store counts as
    /// down after a failure that made a request wait (a timeout, or an
    /// answer slower than 5 ms); a store that fails a check at once (a
    /// Cluster master it holds, a connection it knows is gone) is still
    /// asked for every check, so the budgets it answers for stay its own,
    /// and only the failed checks are decided by the in-process store. A
    /// store in parts ([`Store::failure_domain`]: the Redis store on a
    /// Cluster, by master) is down part by part: a master that times out
    /// sends only its own budgets to the in-process store.
    Fallback,
}

pub(crate) type BlockedFn = dyn Fn(&Decision) -> Response<Bytes> + Send + Sync;
pub(crate) type IdentityErrorFn = dyn Fn(&IdentityError) -> Response<Bytes> + Send + Sync;
pub(crate) type CostFn = dyn Fn(&Parts) -> u32 + Send + Sync;
/// What [`RateLimitLayer::adjust_on_response`] takes.
pub(crate) type AdjustFn = dyn Fn(StatusCode, &HeaderMap) -> Option<Adjustment> + Send + Sync;

/// Default capacity of the local denial cache.
pub const DEFAULT_DENIAL_CACHE: usize = 100_000;

/// A rule table that can be swapped while the layers that read it run: a
/// configuration reloaded without a restart (as envoy's ratelimit reloads
/// its YAML). Cheap to clone; every clone is the same table.
///
/// A request uses the table that was current when its route was matched,
/// for its whole decision. A budget carries over a swap when its rule keeps
/// its route pattern, zone or method and algorithm (and, for a group other
/// than the route's `default` group, whether it counts alike with that
/// group's rule, or the route's first without one; another group's rule
/// changed moves no budget):
///
/// - a sliding log keeps its log of requests, which the new rule's windows
///   count whatever their lengths: a user who spent 8 of a limit of 10
///   still has 2 if the new table keeps that limit, and 12 if it raises it
///   to 20. The log holds only the requests of the old rule's longest
///   window (older ones are dropped as checks go, at each check in memory,
///   in passing on Redis), so a window made longer counts the requests
///   made before the swap only as far back as the old one reached;
/// - the counter algorithms keep the state of each window whose length
///   stays (a token bucket its fullness as a share of the window, its
///   refill rate following the new limit); a window of a new length
///   starts empty;
/// - a changed algorithm starts afresh, and a change back finds the
///   earlier state as it was left (each algorithm keeps its own: two
///   tables in use at once, during a swap, never reset each other's);
///   a block running (`block_time`) holds whatever the algorithm, if
///   the new rule has a block time too: it is the user's.
///
/// On Redis, adding a route-wide limit to a route, or removing it, moves
/// its users' budgets to other keys (a user's windows and the route's are
/// decided in one call, so on a Cluster they live in one slot): they start
/// afresh, their blocks too, and a change back finds the earlier ones as they were left,
/// until they expire. So does a sliding log whose rule moves between up to
/// 5 windows and more (see the `store::redis` module). The memory store keeps
/// them. The new table's own `headers` and `shadow` apply, unless the
/// layer sets its own ([`RateLimitLayer::headers`],
/// [`RateLimitLayer::shadow`]).
///
/// ```
/// use axum::{body::Body, Router};
/// use http::{Request, StatusCode};
/// use tower::ServiceExt;
/// use tower_ratelimit::{identity::Global, MemoryStore, RateLimitLayer, ReloadableRules, Rules};
///
/// # tokio::runtime::Runtime::new().unwrap().block_on(async {
/// let table = |limit: u32| Rules::from_toml(&format!(
///     "[[routes]]\npath = \"^/\"\nrules = [{{ minute = {limit} }}]"
/// ));
/// let rules = ReloadableRules::new(table(1)?);
/// let layer = RateLimitLayer::new(rules.clone(), MemoryStore::new()).identify(Global);
/// let app = Router::new().fallback(|| async { "hi" }).layer(layer);
/// let status = |app: Router| async move {
///     app.oneshot(Request::new(Body::empty())).await.map(|r| r.status())
/// };
///
/// assert_eq!(status(app.clone()).await?, StatusCode::OK);
/// assert_eq!(status(app.clone()).await?, StatusCode::TOO_MANY_REQUESTS);
/// // Two a minute from now on: the budget keeps the request it counted.
/// rules.set(table(2)?);
/// assert_eq!(status(app.clone()).await?, StatusCode::OK);
/// assert_eq!(status(app).await?, StatusCode::TOO_MANY_REQUESTS);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// # }).unwrap();
/// ```
#[derive(Clone)]
pub struct ReloadableRules(Arc<arc_swap::ArcSwap<Rules>>);

impl ReloadableRules {
    /// A table that starts as `rules`.
    pub fn new(rules: Rules) -> Self {
        Self(Arc::new(arc_swap::ArcSwap::from_pointee(
            rules.renumbered(),
        )))
    }

    /// Swaps in `rules`: every request matched from now on uses them.
    /// (Build and check the new table first: [`Rules::from_toml`] or the
    /// builder fail on a bad one, and the running table stays.) A table
    /// set again (one [`get`](Self::get) returned before) is a table of its
    /// own: no denial cached under it before is served again.
    /// [`Rules::budget_changes`] says, for a log, which budgets the swap
    /// does not carry over as they were.
    pub fn set(&self, rules: Rules) {
        self.0.store(Arc::new(rules.renumbered()));
    }

    /// The current table.
    pub fn get(&self) -> Rules {
        Rules::clone(&self.0.load())
    }
}

impl fmt::Debug for ReloadableRules {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("ReloadableRules")
            .field(&*self.0.load())
            .finish()
    }
}

/// What [`RateLimitLayer::new`] takes: a [`Rules`], fixed for the layer's
/// life, or a [`ReloadableRules`], which can be swapped while it runs
/// (made from either with `From`).
#[derive(Clone, Debug)]
pub struct RuleSource(Source);

#[derive(Clone, Debug)]
enum Source {
    Fixed(Rules),
    Live(ReloadableRules),
}

impl From<Rules> for RuleSource {
    fn from(rules: Rules) -> Self {
        Self(Source::Fixed(rules))
    }
}

impl From<ReloadableRules> for RuleSource {
    fn from(rules: ReloadableRules) -> Self {
        Self(Source::Live(rules))
    }
}

impl RuleSource {
    /// The table for one request.
    #[inline]
    pub(crate) fn load(&self) -> RulesGuard<'_> {
        match &self.0 {
            Source::Fixed(rules) => RulesGuard::Fixed(rules),
            Source::Live(live) => RulesGuard::Live(live.0.load()),
        }
    }
}

/// A table read for one request (see [`RuleSource::load`]).
pub(crate) enum RulesGuard<'a> {
    Fixed(&'a Rules),
    Live(arc_swap::Guard<Arc<Rules>>),
}

impl RulesGuard<'_> {
    /// The same table, owned, for a request that waits, if it can change
    /// meanwhile (a fixed one is read again: no reference count for every
    /// core's requests to share).
    pub(crate) fn owned(&self) -> Option<Rules> {
        match self {
            RulesGuard::Fixed(_) => None,
            RulesGuard::Live(guard) => Some(Rules::clone(guard)),
        }
    }
}

impl std::ops::Deref for RulesGuard<'_> {
    type Target = Rules;

    #[inline]
    fn deref(&self) -> &Rules {
        match self {
            RulesGuard::Fixed(rules) => rules,
            RulesGuard::Live(guard) => guard,
        }
    }
}

/// Rate-limits requests by a [`Rules`] table, keeping budgets in a
/// [`Store`].
///
/// ```
/// use axum::{routing::get, Router};
/// use tower_ratelimit::{MemoryStore, RateLimitLayer, Rule, Rules};
///
/// let rules = Rules::builder()
///     .route(r"^/api", [Rule::new().second(10).minute(100)])
///     .build()?;
/// let app: Router = Router::new()
///     .route("/api/hello", get(|| async { "hi" }))
///     .layer(RateLimitLayer::new(rules, MemoryStore::new()));
/// // The default identity, the client's IP, needs the peer address:
/// // serve with it, or every limited request is answered 500.
/// let service = app.into_make_service_with_connect_info::<std::net::SocketAddr>();
/// # drop(service);
/// # Ok::<(), tower_ratelimit::ConfigError>(())
/// ```
///
/// The layer is cheap to clone; every clone, and every service it makes,
/// shares the same rules, store and denial cache.
///
/// Under axum, [`same_body`](Self::same_body) keeps axum's own body type on
/// responses, which spares axum a `Box` per response.
#[must_use]
pub struct RateLimitLayer<St, I = ClientIp, M = Wrapped> {
    pub(crate) rules: RuleSource,
    pub(crate) store: Arc<St>,
    pub(crate) identity: Arc<I>,
    pub(crate) options: Options,
    /// What every service of this layer (and of its clones) shares at run
    /// time: made by the first `layer` call.
    pub(crate) state: Arc<OnceLock<Arc<RunState>>>,
    /// How the services type their response body ([`crate::body::BodyMode`]).
    pub(crate) body: PhantomData<fn() -> M>,
}

/// The layer's settings (all cheap to clone).
#[derive(Clone)]
pub(crate) struct Options {
    pub(crate) fail_mode: FailMode,
    /// The clock the layer reads for its own timing (denial cache, probes
    /// of a failing store), and, when `clock_decides`, the time checks are
    /// decided at.
    pub(crate) clock: Option<Arc<dyn Clock>>,
    pub(crate) clock_decides: bool,
    pub(crate) on_blocked: Option<Arc<BlockedFn>>,
    pub(crate) on_identity_error: Option<Arc<IdentityErrorFn>>,
    pub(crate) cost: Option<Arc<CostFn>>,
    pub(crate) adjust: Option<Arc<AdjustFn>>,
    /// The layer's own `shadow` and `headers`; `None`: the table's.
    pub(crate) shadow: Option<bool>,
    pub(crate) headers: Option<HeaderMode>,
    /// Capacity of the local denial cache; 0 turns it off.
    pub(crate) denial_cache: usize,
}

impl Options {
    /// The headers `policy`'s responses carry: the layer's, else its table's.
    #[inline]
    pub(crate) fn headers_for(&self, policy: &Policy) -> HeaderMode {
        self.headers.unwrap_or(policy.headers)
    }

    /// Whether `policy` is in shadow mode: its route's own flag, else the
    /// layer's, else its table's.
    #[inline]
    pub(crate) fn shadow_for(&self, policy: &Policy) -> bool {
        policy.shadow || self.shadow.unwrap_or(policy.table_shadow)
    }

    /// The block time a check under `policy` carries. A block is
    /// enforcement: a rule in shadow mode neither sets one nor is held by
    /// one, so it never denies, not even after its shadow period.
    #[inline]
    pub(crate) fn block_for(&self, policy: &Policy) -> Option<std::time::Duration> {
        policy.block.filter(|_| !self.shadow_for(policy))
    }
}

impl<St, I, M> Clone for RateLimitLayer<St, I, M> {
    fn clone(&self) -> Self {
        Self {
            rules: self.rules.clone(),
            store: self.store.clone(),
            identity: self.identity.clone(),
            options: self.options.clone(),
            state: self.state.clone(),
            body: PhantomData,
        }
    }
}

impl<St, I, M> fmt::Debug for RateLimitLayer<St, I, M> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RateLimitLayer")
            .field("rules", &self.rules)
            .field("fail_mode", &self.options.fail_mode)
            .field("shadow", &self.options.shadow)
            .field("headers", &self.options.headers)
            .field("denial_cache", &self.options.denial_cache)
            .finish_non_exhaustive()
    }
}

impl<St: Store> RateLimitLayer<St, ClientIp> {
    /// A layer enforcing `rules` (a [`Rules`], or a [`ReloadableRules`] to
    /// swap them while it runs) with budgets kept in `store`, identifying
    /// users by their IP address ([`ClientIp`]) until
    /// [`identify`](Self::identify) says otherwise. Shadow mode and the
    /// header mode are the table's unless the layer sets its own.
    ///
    /// [`ClientIp`] reads the peer address the server records: under axum,
    /// serve with `into_make_service_with_connect_info::<SocketAddr>()`
    /// (under tonic, the `tonic` feature reads its own); without it every
    /// limited request is answered 500, as an identity error.
    pub fn new(rules: impl Into<RuleSource>, store: St) -> Self {
        let rules = rules.into();
        let options = Options {
            fail_mode: FailMode::default(),
            clock: None,
            clock_decides: false,
            on_blocked: None,
            on_identity_error: None,
            cost: None,
            adjust: None,
            shadow: None,
            headers: None,
            denial_cache: DEFAULT_DENIAL_CACHE,
        };
        Self {
            rules,
            store: Arc::new(store),
            identity: Arc::new(ClientIp),
            options,
            state: Arc::default(),
            body: PhantomData,
        }
    }
}

impl<St: Store, I: Identify, M> RateLimitLayer<St, I, M> {
    /// Tells users (and their groups) apart with `identity`: a closure or an
    /// [`Identify`] implementation (see [`crate::identity`]).
    ///
    /// The layer gives the identity no deadline of its own (the store's
    /// deadline starts once the identity has answered): one that looks
    /// something up should bound its wait (`tokio::time::timeout`) and
    /// answer an [`IdentityError`](crate::identity::IdentityError) with a
    /// `503` when it runs out, or a lookup that hangs holds the request as
    /// long.
    pub fn identify<J: Identify>(self, identity: J) -> RateLimitLayer<St, J, M> {
        self.retyped(Arc::new(identity))
    }

    /// The same layer with another identity or body mode.
    fn retyped<J, N>(self, identity: Arc<J>) -> RateLimitLayer<St, J, N> {
        RateLimitLayer {
            rules: self.rules,
            store: self.store,
            identity,
            options: self.options,
            state: self.state,
            body: PhantomData,
        }
    }

    /// Responses keep the inner service's body type `B` (which must be
    /// `From<Bytes>`: the layer's own 429, 401 and 503 answers are made
    /// with it) instead of a [`RateLimitBody`](crate::RateLimitBody).
    ///
    /// Use it under axum: axum boxes every response body that is not its
    /// own `Body`, so a wrapped body costs an allocation per response.
    ///
    /// ```
    /// use axum::{body::Body, routing::get, Router};
    /// use http::{Request, StatusCode};
    /// use tower::ServiceExt;
    /// use tower_ratelimit::{identity::Global, MemoryStore, RateLimitLayer, Rule, Rules};
    ///
    /// # tokio::runtime::Runtime::new().unwrap().block_on(async {
    /// let rules = Rules::builder().route("^/", [Rule::new().second(1)]).build()?;
    /// let layer = RateLimitLayer::new(rules, MemoryStore::new())
    ///     .identify(Global)
    ///     .same_body();
    /// let app: Router = Router::new()
    ///     .route("/", get(|| async { "hi" }))
    ///     .layer(layer);
    ///
    /// let ok = app.clone().oneshot(Request::new(Body::empty())).await?;
    /// assert_eq!(ok.status(), StatusCode::OK);
    /// // The 429 is an axum `Body` made from the layer's bytes.
    /// let denied = app.oneshot(Request::new(Body::empty())).await?;
    /// assert_eq!(denied.status(), StatusCode::TOO_MANY_REQUESTS);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// # }).unwrap();
    /// ```
    pub fn same_body(self) -> RateLimitLayer<St, I, SameBody> {
        let identity = Arc::clone(&self.identity);
        self.retyped(identity)
    }

    /// A layer configured differently is a different layer: its services
    /// must not share run-time state (denial cache, fallback) with services
    /// made before.
    fn fresh(mut self) -> Self {
        self.state = Arc::default();
        self
    }

    /// What to do when the store fails (default [`FailMode::Open`]): an
    /// error, or its deadline passed. The deadline is the store's own
    /// (`RedisStoreBuilder::timeout`, 50 ms by default); the layer sets
    /// none, so a store of your own bounds its checks itself (see
    /// [`Store`]).
    pub fn fail_mode(mut self, mode: FailMode) -> Self {
        self.options.fail_mode = mode;
        self.fresh()
    }

    /// Decides on `clock`'s time instead of the store's own (for tests: a
    /// [`ManualClock`](crate::clock::ManualClock) makes window edges exact,
    /// for the memory and the Redis store alike). It also times the
    /// layer's own waits (cached denials, probes of a failing store), and
    /// replaces [`local_clock`](Self::local_clock). Not for replicas in
    /// production: each would decide on its own clock, which the Redis
    /// store's server clock is there to avoid.
    ///
    /// ```
    /// use std::time::Duration;
    /// use axum::{body::Body, Router};
    /// use http::{Request, StatusCode};
    /// use tower::ServiceExt;
    /// use tower_ratelimit::clock::{ManualClock, Timestamp};
    /// use tower_ratelimit::{identity::Global, MemoryStore, RateLimitLayer, Rule, Rules};
    ///
    /// # tokio::runtime::Runtime::new().unwrap().block_on(async {
    /// let clock = ManualClock::new(Timestamp::from_micros(1_000_000_000));
    /// let rules = Rules::builder().route("^/", [Rule::new().second(2)]).build()?;
    /// let layer = RateLimitLayer::new(rules, MemoryStore::new())
    ///     .identify(Global)
    ///     .clock(clock.clone());
    /// let app = Router::new().fallback(|| async { "hi" }).layer(layer);
    /// let status = |app: Router| async move {
    ///     app.oneshot(Request::new(Body::empty())).await.map(|r| r.status())
    /// };
    ///
    /// assert_eq!(status(app.clone()).await?, StatusCode::OK);
    /// clock.advance(Duration::from_millis(500));
    /// assert_eq!(status(app.clone()).await?, StatusCode::OK);
    /// assert_eq!(status(app.clone()).await?, StatusCode::TOO_MANY_REQUESTS);
    /// // The first request leaves the window exactly one second after it.
    /// clock.advance(Duration::from_micros(499_999));
    /// assert_eq!(status(app.clone()).await?, StatusCode::TOO_MANY_REQUESTS);
    /// clock.advance(Duration::from_micros(1));
    /// assert_eq!(status(app).await?, StatusCode::OK);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// # }).unwrap();
    /// ```
    pub fn clock(self, clock: impl Clock) -> Self {
        self.with_clock(clock, true)
    }

    fn with_clock(mut self, clock: impl Clock, decides: bool) -> Self {
        self.options.clock = Some(Arc::new(clock));
        self.options.clock_decides = decides;
        self.fresh()
    }

    /// Reads `clock` for the layer's own timing only: how long a cached
    /// denial lasts and when a failing store is probed again. Checks carry
    /// no time, so the store decides on its own clock: on the Redis store,
    /// the server's `TIME`, whatever this replica's clock says. For tests
    /// of those timings (a [`ManualClock`](crate::clock::ManualClock)), and
    /// of replicas whose clocks disagree. Replaces [`clock`](Self::clock).
    ///
    /// ```
    /// use std::time::Duration;
    /// use axum::{body::Body, Router};
    /// use http::{Request, StatusCode};
    /// use tower::ServiceExt;
    /// use tower_ratelimit::clock::{ManualClock, Timestamp};
    /// use tower_ratelimit::{identity::Global, MemoryStore, RateLimitLayer, Rule, Rules};
    ///
    /// # tokio::runtime::Runtime::new().unwrap().block_on(async {
    /// let store_clock = ManualClock::new(Timestamp::from_micros(1_000_000_000));
    /// // This replica's own clock, five seconds ahead of the store's.
    /// let local = ManualClock::new(Timestamp::from_micros(1_005_000_000));
    /// let rules = Rules::builder().route("^/", [Rule::new().second(1)]).build()?;
    /// let layer = RateLimitLayer::new(rules, MemoryStore::with_clock(store_clock.clone()))
    ///     .identify(Global)
    ///     .local_clock(local.clone());
    /// let app = Router::new().fallback(|| async { "hi" }).layer(layer);
    /// let status = |app: Router| async move {
    ///     app.oneshot(Request::new(Body::empty())).await.map(|r| r.status())
    /// };
    ///
    /// assert_eq!(status(app.clone()).await?, StatusCode::OK);
    /// assert_eq!(status(app.clone()).await?, StatusCode::TOO_MANY_REQUESTS);
    /// // The replica's clock moving frees nothing: the store's clock decides.
    /// local.advance(Duration::from_secs(5));
    /// assert_eq!(status(app.clone()).await?, StatusCode::TOO_MANY_REQUESTS);
    /// store_clock.advance(Duration::from_secs(1));
    /// assert_eq!(status(app).await?, StatusCode::OK);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// # }).unwrap();
    /// ```
    pub fn local_clock(self, clock: impl Clock) -> Self {
        self.with_clock(clock, false)
    }

    /// How much a request spends (without it, its rule's
    /// [`cost`](crate::Rule::cost), 1 by default; this function decides
    /// instead): e.g. by method, or by a size header. A cost of 0 is checked (and gets headers) but spends
    /// nothing. A request that costs more than a window's limit, or on a
    /// sliding log more than [`MAX_LOG_COST`](crate::rules::MAX_LOG_COST)
    /// (each unit is an entry the store writes), can never pass: it is
    /// answered 429 without `Retry-After` (and, with a block time, blocks
    /// the user as any denial does); budgets of bytes want the sliding
    /// window or the token bucket.
    pub fn cost(mut self, f: impl Fn(&Parts) -> u32 + Send + Sync + 'static) -> Self {
        self.options.cost = Some(Arc::new(f));
        self.fresh()
    }

    /// Changes the budget a request spent once the inner service has
    /// answered it: `f` reads the response's status and headers and may
    /// ask for an [`Adjustment`], a penalty (more units spent: a failed
    /// login) or a refund (units given back: a server error the client
    /// should not pay for), as rate-limiter-flexible's `penalty` and
    /// `reward` do.
    ///
    /// Only requests the store allowed (and so recorded) are adjusted: not
    /// denials let through in shadow mode, nor requests let through by the
    /// fail mode or decided by the fallback store. A refund gives back at
    /// most the request's own cost (see [`cost`](Self::cost)): nothing
    /// for a free request, so that free requests that fail never give
    /// back what others spent. The adjustment reaches
    /// the user's budget in the request's own store, on its clock, before
    /// the response goes out (so the client's next request sees it; a
    /// response dropped meanwhile, by a client that hung up, leaves it to
    /// finish on the runtime, so hanging up skips no penalty); a
    /// store that fails is counted and logged (at most once a second), and
    /// the response goes out unchanged. Its rate-limit headers (which `f`
    /// sees among the headers) describe the request's check, before the
    /// adjustment; a refund forgets this replica's cached denial of the
    /// budget (the next request asks the store), while a penalty, or
    /// another replica's refund, is seen once the entry ends. A gRPC call's status travels in trailers, after the response
    /// head `f` reads: its HTTP status is 200 whatever the call's outcome.
    ///
    /// ```
    /// use axum::{http::StatusCode, routing::post, Router};
    /// use tower_ratelimit::{Adjustment, MemoryStore, RateLimitLayer, Rule, Rules};
    ///
    /// let rules = Rules::builder()
    ///     .route("^/login$", [Rule::new().minute(10)])
    ///     .build()?;
    /// // A failed login costs five attempts; a server error costs none.
    /// let layer = RateLimitLayer::new(rules, MemoryStore::new()).adjust_on_response(
    ///     |status, _headers| match status {
    ///         StatusCode::UNAUTHORIZED => Some(Adjustment::Penalty(4)),
    ///         s if s.is_server_error() => Some(Adjustment::Refund(1)),
    ///         _ => None,
    ///     },
    /// );
    /// let app: Router = Router::new()
    ///     .route("/login", post(|| async { StatusCode::UNAUTHORIZED }))
    ///     .layer(layer);
    /// # Ok::<(), tower_ratelimit::ConfigError>(())
    /// ```
    pub fn adjust_on_response(
        mut self,
        f: impl Fn(StatusCode, &HeaderMap) -> Option<Adjustment> + Send + Sync + 'static,
    ) -> Self {
        self.options.adjust = Some(Arc::new(f));
        self.fresh()
    }

    /// Shadow mode for every route: decide, log and set headers, but never
    /// deny. Defaults to the rule table's own `shadow`, which this
    /// overrides either way; a route's own `shadow` holds regardless.
    pub fn shadow(mut self, shadow: bool) -> Self {
        self.options.shadow = Some(shadow);
        self.fresh()
    }

    /// Which rate-limit headers to send (default: the table's own,
    /// [`Rules::headers`]).
    pub fn headers(mut self, mode: HeaderMode) -> Self {
        self.options.headers = Some(mode);
        self.fresh()
    }

    /// The local denial cache: budgets the store denied are denied
    /// in-process until their wait ends, with no store call, or sooner, when
    /// the window the headers report frees a slot first: a replayed
    /// denial's headers are the store's own, its waits shortened by the
    /// time since. Only denials whose wait nothing but time changes are
    /// kept: blocks, requests that cost more than a limit, and denials of a
    /// request of cost 1 (no request passes while one is denied, so none
    /// spends) on a rule whose budget no other rule spends with a higher
    /// limit (a zone's rule elsewhere, another group counting alike, whose
    /// requests, on any replica, may pass and lengthen the wait) and that
    /// has no route-wide limit (other users spend it); with the IETF or
    /// per-window headers, only while no other window they show can change.
    /// A replayed denial of a request that never passes keeps the
    /// remaining counts the store gave, which other requests may since have
    /// spent; a penalty (`adjust_on_response`) that lands while an entry
    /// holds is seen once it ends, and a refund forgets this replica's
    /// entry (another replica's is seen once it ends). A table may turn
    /// the cache off for its rules
    /// ([`RulesBuilder::denial_cache`](crate::rules::RulesBuilder::denial_cache)). A costly request's block holds
    /// for the block time alone (its wait may be longer): its entry ends
    /// with the block, so the next request is blocked again. One entry a
    /// budget: a denial of another cost waits for it to end, unless it is
    /// a request that never passes, which gives way. Waits run from when
    /// the store was asked (an entry can only end early), so a replayed
    /// `Retry-After` may read a second less than the store's own when its
    /// answer was slow. While the store is down, entries still answer
    /// until they end, whatever the fail mode. A table set again in a
    /// [`ReloadableRules`] does not see the denials cached under it before.
    /// Only an asynchronous store's
    /// denials are kept (Redis, or a store of your own whose `check` is
    /// awaited): a store that answers at once, as [`MemoryStore`](crate::MemoryStore)
    /// does, needs no cache. The cache is sharded (no global lock) and
    /// bounded (denials beyond its room are not kept; ended ones are dropped
    /// as its shards fill; the room is split evenly over its 16 shards, at
    /// least one entry each, so a room under 16 holds 16). On
    /// by default with room for [`DEFAULT_DENIAL_CACHE`] budgets; 0 turns
    /// it off.
    pub fn denial_cache(mut self, capacity: usize) -> Self {
        self.options.denial_cache = capacity;
        self.fresh()
    }

    /// Builds the response to every denied request (by a window or by a
    /// block: "blocked" here is any denial). The layer still adds the
    /// rate-limit headers, and `Retry-After` unless the response has one.
    /// It replaces gRPC's answer too (trailers-only, `RESOURCE_EXHAUSTED`):
    /// the hook sees only the [`Decision`], so on a service that also
    /// takes gRPC leave it unset or answer gRPC's way yourself.
    /// [`Decision::exceeds_limit`] tells whether a request of a given cost
    /// could ever pass.
    pub fn on_blocked(
        mut self,
        f: impl Fn(&Decision) -> Response<Bytes> + Send + Sync + 'static,
    ) -> Self {
        self.options.on_blocked = Some(Arc::new(f));
        self.fresh()
    }

    /// Builds the response to a request whose identity function failed
    /// (default: the error's status, `401` unless it says otherwise, with a
    /// problem+json body; a gRPC request gets the matching gRPC status,
    /// which this hook, when set, replaces too).
    pub fn on_identity_error(
        mut self,
        f: impl Fn(&IdentityError) -> Response<Bytes> + Send + Sync + 'static,
    ) -> Self {
        self.options.on_identity_error = Some(Arc::new(f));
        self.fresh()
    }
}

impl<S, St, I, M> Layer<S> for RateLimitLayer<St, I, M> {
    type Service = RateLimit<S, St, I, M>;

    fn layer(&self, inner: S) -> Self::Service {
        let state = self
            .state
            .get_or_init(|| Arc::new(RunState::new(&self.options)))
            .clone();
        RateLimit::new(
            inner,
            Arc::new(Shared {
                rules: self.rules.clone(),
                store: self.store.clone(),
                identity: self.identity.clone(),
                options: self.options.clone(),
                state,
            }),
        )
    }
}

/// Run-time state shared by every service of a layer.
#[derive(Debug)]
pub(crate) struct RunState {
    pub(crate) denials: Option<DenialCache>,
    pub(crate) fallback: Option<Fallback>,
    pub(crate) warnings: WarnGate,
    /// The origin of the layer's own monotonic clock.
    pub(crate) start: Instant,
}

impl RunState {
    fn new(options: &Options) -> Self {
        Self {
            denials: (options.denial_cache > 0).then(|| DenialCache::new(options.denial_cache)),
            fallback: (options.fail_mode == FailMode::Fallback).then(Fallback::new),
            warnings: WarnGate::default(),
            start: Instant::now(),
        }
    }
}

/// [`FailMode::Fallback`]'s in-process store, and which parts of the real
/// store are down (see [`Store::failure_domain`]).
#[derive(Debug)]
pub(crate) struct Fallback {
    pub(crate) store: MemoryStore,
    /// Bit `d`: the part `d` (modulo [`PARTS`]) is down.
    down: AtomicU64,
    /// By part: when its next probe may go (layer microseconds).
    next_probe: [AtomicU64; PARTS],
    /// By part: when a check of it was last seen while it was down (layer
    /// microseconds, plus one: 0 for never).
    asked: [AtomicU64; PARTS],
    /// When the down parts are next looked over (see [`Self::sweep`]).
    next_sweep: AtomicU64,
    /// By part: what the store called it when it went down, for the line
    /// that says it was forgotten (locked only then and as it goes down).
    names: std::sync::Mutex<[Option<String>; PARTS]>,
}

/// How long a down part no check has asked for stays down: a part can be
/// gone for good (a Cluster master whose replica took its slots), and its
/// bit set would make every check ask the store for its part.
const FORGET_AFTER: u64 = 2_000_000;

/// How many parts of a store [`Fallback`] tells apart.
const PARTS: usize = 64;

/// How often a down part of a store is probed.
const PROBE_EVERY: u64 = 500_000;

impl Fallback {
    fn new() -> Self {
        Self {
            store: MemoryStore::new(),
            down: AtomicU64::new(0),
            next_probe: std::array::from_fn(|_| AtomicU64::new(0)),
            asked: std::array::from_fn(|_| AtomicU64::new(0)),
            next_sweep: AtomicU64::new(0),
            names: std::sync::Mutex::new(std::array::from_fn(|_| None)),
        }
    }

    /// Notes that a check of part `index` came while it was down (a store
    /// to its line at most every 100 ms).
    fn seen(&self, index: usize, now: u64) {
        if let Some(asked) = self.asked.get(index) {
            if asked.load(Ordering::Relaxed).saturating_add(100_000) <= now {
                asked.store(now.saturating_add(1), Ordering::Relaxed);
            }
        }
    }

    /// Every [`FORGET_AFTER`] at most, by one check: the down parts no
    /// check has asked for in that long are up again (gone, or quiet: the
    /// next check of a quiet one that is still down waits once, and marks
    /// it down again).
    fn sweep(&self, now: u64) {
        let next = self.next_sweep.load(Ordering::Relaxed);
        if now < next
            || self
                .next_sweep
                .compare_exchange(
                    next,
                    now.saturating_add(FORGET_AFTER),
                    Ordering::Relaxed,
                    Ordering::Relaxed,
                )
                .is_err()
        {
            return;
        }
        let down = self.down.load(Ordering::Acquire);
        for (index, asked) in self.asked.iter().enumerate() {
            let bit = 1u64 << index;
            if down & bit != 0
                && asked.load(Ordering::Relaxed).saturating_add(FORGET_AFTER) <= now
                && self.down.fetch_and(!bit, Ordering::AcqRel) & bit != 0
            {
                match (index, self.name_of(index)) {
                    (0, None) => tracing::info!(
                        "rate-limit store down, but no request needed it for 2 s: leaving the \
                         fallback store, the next request asks the store again"
                    ),
                    (part, name) => tracing::info!(
                        part,
                        store = name.as_deref().unwrap_or("-"),
                        "a part of the rate-limit store down, but no request needed it for \
                         2 s: its budgets leave the fallback store, the next of their requests \
                         asks it again"
                    ),
                }
            }
        }
    }

    /// What the store called part `index` when it last went down.
    #[cold]
    fn name_of(&self, index: usize) -> Option<String> {
        let names = self.names.lock().ok()?;
        names.get(index).cloned().flatten()
    }

    /// The bit and slot of part `domain`.
    fn part(domain: u32) -> (u64, usize) {
        let index = domain as usize % PARTS;
        (1 << index, index)
    }

    /// Whether this request should skip the real store: the part that
    /// decides it (`domain`, asked only while some part is down) is down,
    /// and this is not the one request allowed to probe it now.
    pub(crate) fn bypass(&self, now: u64, domain: impl FnOnce() -> u32) -> bool {
        if self.down.load(Ordering::Acquire) == 0 {
            return false;
        }
        self.sweep(now);
        let (bit, index) = Self::part(domain());
        if self.down.load(Ordering::Acquire) & bit == 0 {
            return false;
        }
        self.seen(index, now);
        let Some(next_probe) = self.next_probe.get(index) else {
            return false;
        };
        let next = next_probe.load(Ordering::Relaxed);
        let probe = now >= next
            && next_probe
                .compare_exchange(
                    next,
                    now.saturating_add(PROBE_EVERY),
                    Ordering::AcqRel,
                    Ordering::Relaxed,
                )
                .is_ok();
        !probe
    }

    /// The part `domain` (`name`: what it is, if the store says) failed a
    /// check after a wait: it is down.
    pub(crate) fn failed(&self, now: u64, domain: u32, name: impl FnOnce() -> Option<String>) {
        let (bit, index) = Self::part(domain);
        self.seen(index, now);
        if self.down.fetch_or(bit, Ordering::AcqRel) & bit == 0 {
            if let Some(next_probe) = self.next_probe.get(index) {
                next_probe.store(now.saturating_add(PROBE_EVERY), Ordering::Relaxed);
            }
            let name = name();
            if let Ok(mut names) = self.names.lock() {
                if let Some(slot) = names.get_mut(index) {
                    slot.clone_from(&name);
                }
            }
            match (domain, name) {
                (0, None) => tracing::warn!(
                    "rate-limit store down: the fallback store decides until a probe \
                     (one request every 500 ms) is answered"
                ),
                (part, name) => tracing::warn!(
                    part,
                    store = name.as_deref().unwrap_or("-"),
                    "a part of the rate-limit store is down: its budgets go to the fallback \
                     store until a probe (one of their requests every 500 ms) is answered"
                ),
            }
        }
    }

    /// The store decided a check: its part (`domain`, asked only while some
    /// part is down; `name`: what it is) is up. (One load while none is
    /// down: no write to a line every thread's requests share.) Logged as
    /// it is seen: at the part's first check decided by the store, a probe
    /// or, once the store fails at once no more, any check.
    pub(crate) fn recovered(
        &self,
        domain: impl FnOnce() -> u32,
        name: impl FnOnce(u32) -> Option<String>,
    ) {
        if self.down.load(Ordering::Acquire) == 0 {
            return;
        }
        let domain = domain();
        let (bit, _) = Self::part(domain);
        if self.down.fetch_and(!bit, Ordering::AcqRel) & bit != 0 {
            match (domain, name(domain)) {
                (0, None) => {
                    tracing::info!("rate-limit store answers again; leaving the fallback store")
                }
                (part, name) => tracing::info!(
                    part,
                    store = name.as_deref().unwrap_or("-"),
                    "a part of the rate-limit store answers again; its budgets leave the \
                     fallback store"
                ),
            }
        }
    }
}

/// Lets through at most one warning per second of each kind: a store's
/// failure, an adjustment's, an identity's server error (each kind its
/// own, so that one never hides another, and each says how many of its
/// own kind it held back). (A shadow-mode denial's `info` line has a gate
/// per rule: see [`shadow_denied`].)
#[derive(Debug, Default)]
pub(crate) struct WarnGate {
    store: Gate,
    adjust: Gate,
    identity: Gate,
}

impl WarnGate {
    pub(crate) fn store_failed(&self, error: &StoreError, mode: FailMode, now: u64) {
        if let Some(suppressed) = self.store.pass(now) {
            tracing::warn!(%error, ?mode, suppressed, "rate-limit store failed; applying fail mode");
        }
    }

    /// An identity that failed with a server error (`500`: a server
    /// without the peer address `ClientIp` needs, say), which every
    /// request may then meet.
    pub(crate) fn identity_failed(&self, error: &IdentityError, now: u64) {
        if let Some(suppressed) = self.identity.pass(now) {
            tracing::warn!(
                status = error.status().as_u16(),
                error = error.message(),
                hint = error.hint(),
                suppressed,
                "rate-limit identity failed with a server error"
            );
        }
    }

    /// An [`Adjustment`] the store could not make.
    pub(crate) fn adjust_failed(&self, error: &StoreError, now: u64) {
        if let Some(suppressed) = self.adjust.pass(now) {
            tracing::warn!(%error, suppressed, "rate-limit store failed to adjust a budget");
        }
    }
}

/// A request shadow mode let through, by the rule whose `gate` this is: at
/// `info`, at most once a second per rule (`suppressed`: that rule's since
/// its last line, said with its next one), so that trying limits on real
/// traffic does not flood the logs, and a rule that would deny less often
/// is named too; every one is logged at `debug` (and counted, with
/// `metrics`).
pub(crate) fn shadow_denied(gate: &Gate, route: &str, now: impl FnOnce() -> u64) {
    if !tracing::enabled!(tracing::Level::INFO) {
        return;
    }
    if let Some(suppressed) = gate.pass(now()) {
        tracing::info!(
            route,
            suppressed,
            "shadow mode: request would have been denied"
        );
    }
}

/// One kind of warning's gate: a second at least between two.
#[derive(Debug, Default)]
pub(crate) struct Gate {
    /// When the last warning went out, in microseconds, plus one (0: none
    /// yet).
    last: AtomicU64,
    suppressed: AtomicU64,
}

impl Gate {
    /// Whether a warning may go out at `now` (microseconds): a second or
    /// more after the last one; and how many were held back since.
    fn pass(&self, now: u64) -> Option<u64> {
        let last = self.last.load(Ordering::Relaxed);
        let due = last == 0 || now.saturating_add(1) >= last.saturating_add(1_000_000);
        if due
            && self
                .last
                .compare_exchange(
                    last,
                    now.saturating_add(1),
                    Ordering::Relaxed,
                    Ordering::Relaxed,
                )
                .is_ok()
        {
            return Some(self.suppressed.swap(0, Ordering::Relaxed));
        }
        self.suppressed.fetch_add(1, Ordering::Relaxed);
        None
    }
}

#[cfg(test)]
mod gate_tests {
    use super::Gate;

    /// A second between two warnings, counted from the last one (not from
    /// whole seconds of the clock: two 18 ms apart across a second's edge
    /// both went out).
    #[test]
    fn warnings_are_a_second_apart() {
        let gate = Gate::default();
        assert_eq!(gate.pass(985_000), Some(0));
        assert_eq!(gate.pass(1_003_000), None);
        assert_eq!(gate.pass(1_984_999), None);
        assert_eq!(gate.pass(1_985_000), Some(2));
        assert_eq!(gate.pass(1_985_001), None);
    }
}

#[cfg(test)]
mod fallback_tests {
    use super::{Fallback, FORGET_AFTER, PROBE_EVERY};

    /// A part that fails is skipped (but for one probe each
    /// `PROBE_EVERY`); the other parts are asked, and their answers do not
    /// bring the failed one back.
    #[test]
    fn a_failed_part_is_skipped_alone() {
        let fallback = Fallback::new();
        let unnamed = |_| None;
        assert!(!fallback.bypass(0, || 3));
        fallback.failed(10, 3, || None);
        assert!(fallback.bypass(20, || 3));
        assert!(!fallback.bypass(20, || 4));
        // (Parts are told apart modulo 64.)
        assert!(fallback.bypass(20, || 67));
        fallback.recovered(|| 4, unnamed);
        assert!(fallback.bypass(30, || 3));
        // One probe when its time comes, then skipped again.
        assert!(!fallback.bypass(10 + PROBE_EVERY, || 3));
        assert!(fallback.bypass(11 + PROBE_EVERY, || 3));
        fallback.recovered(|| 3, unnamed);
        assert!(!fallback.bypass(12 + PROBE_EVERY, || 3));
    }

    /// A down part no check asks for (a Cluster master whose slots moved)
    /// is up again after `FORGET_AFTER`, so that the others' checks stop
    /// asking the store for their part; one that is asked for stays down.
    #[test]
    fn a_down_part_no_check_asks_for_is_forgotten() {
        let fallback = Fallback::new();
        fallback.failed(0, 5, || None);
        fallback.failed(0, 6, || None);
        // Part 6's checks keep coming (the first a probe); part 5's stop.
        assert!(fallback.bypass(1_000, || 6));
        assert!(!fallback.bypass(FORGET_AFTER - 500_000, || 6), "a probe");
        assert!(fallback.bypass(FORGET_AFTER - 400_000, || 6));
        // The first check after FORGET_AFTER looks the parts over.
        let now = FORGET_AFTER + 1_000;
        let _ = fallback.bypass(now, || 6);
        assert!(fallback.bypass(now, || 6), "part 6 still down");
        assert!(!fallback.bypass(now, || 5), "part 5 forgotten");
        // Once no part is down, a check asks nothing.
        fallback.recovered(|| 6, |_| None);
        assert!(!fallback.bypass(now, || panic!("asked for its part")));
    }
}
