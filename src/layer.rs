//! [`RateLimitLayer`] and the [`RateLimit`] service it produces.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{ready, Context, Poll};
use std::time::Instant;

use bytes::Bytes;
use http::{Request, Response};
use pin_project_lite::pin_project;
use tower_layer::Layer;
use tower_service::Service;

use crate::body::RateLimitBody;
use crate::clock::Clock;
use crate::decision::{self, RateHeaders};
use crate::identity::{ClientIp, Identify, IdentityError};
use crate::key;
use crate::rules::{Candidates, Rules};
use crate::store::{Check, Decision, Store, StoreError};

/// What the layer does when its store cannot decide (error or deadline).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum FailMode {
    /// Let the request through, without rate-limit headers, and log a
    /// (rate-limited) warning. The default: a limiter should never be the
    /// reason a service is down.
    #[default]
    Open,
    /// Answer `503 Service Unavailable` with `Retry-After: 1`.
    Closed,
}

type BlockedFn = dyn Fn(&Decision) -> Response<Bytes> + Send + Sync;
type IdentityErrorFn = dyn Fn(&IdentityError) -> Response<Bytes> + Send + Sync;

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
/// # Ok::<(), tower_ratelimit::ConfigError>(())
/// ```
///
/// The layer is cheap to clone; every clone, and every service it makes,
/// shares the same rules and store.
#[must_use]
pub struct RateLimitLayer<St, I = ClientIp> {
    rules: Rules,
    store: Arc<St>,
    identity: Arc<I>,
    options: Options,
}

#[derive(Clone, Default)]
struct Options {
    fail_mode: FailMode,
    clock: Option<Arc<dyn Clock>>,
    on_blocked: Option<Arc<BlockedFn>>,
    on_identity_error: Option<Arc<IdentityErrorFn>>,
}

impl<St, I> Clone for RateLimitLayer<St, I> {
    fn clone(&self) -> Self {
        Self {
            rules: self.rules.clone(),
            store: self.store.clone(),
            identity: self.identity.clone(),
            options: self.options.clone(),
        }
    }
}

impl<St, I> fmt::Debug for RateLimitLayer<St, I> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RateLimitLayer")
            .field("rules", &self.rules)
            .field("fail_mode", &self.options.fail_mode)
            .finish_non_exhaustive()
    }
}

impl<St: Store> RateLimitLayer<St, ClientIp> {
    /// A layer enforcing `rules` with budgets kept in `store`, identifying
    /// users by their IP address ([`ClientIp`]) until
    /// [`identify`](Self::identify) says otherwise.
    pub fn new(rules: Rules, store: St) -> Self {
        Self {
            rules,
            store: Arc::new(store),
            identity: Arc::new(ClientIp),
            options: Options::default(),
        }
    }
}

impl<St: Store, I: Identify> RateLimitLayer<St, I> {
    /// Tells users (and their groups) apart with `identity`: a closure or an
    /// [`Identify`] implementation (see [`crate::identity`]).
    pub fn identify<J: Identify>(self, identity: J) -> RateLimitLayer<St, J> {
        RateLimitLayer {
            rules: self.rules,
            store: self.store,
            identity: Arc::new(identity),
            options: self.options,
        }
    }

    /// What to do when the store fails (default [`FailMode::Open`]).
    pub fn fail_mode(mut self, mode: FailMode) -> Self {
        self.options.fail_mode = mode;
        self
    }

    /// Decides on `clock`'s time instead of the store's own (for tests: a
    /// [`ManualClock`](crate::clock::ManualClock) makes window edges exact,
    /// for the memory and the Redis store alike).
    pub fn clock(mut self, clock: impl Clock) -> Self {
        self.options.clock = Some(Arc::new(clock));
        self
    }

    /// Builds the response to a denied request. The layer still adds the
    /// `X-RateLimit-*` headers, and `Retry-After` unless the response has
    /// one.
    pub fn on_blocked(
        mut self,
        f: impl Fn(&Decision) -> Response<Bytes> + Send + Sync + 'static,
    ) -> Self {
        self.options.on_blocked = Some(Arc::new(f));
        self
    }

    /// Builds the response to a request whose identity function failed
    /// (default: the error's status, `401` unless it says otherwise, with a
    /// problem+json body).
    pub fn on_identity_error(
        mut self,
        f: impl Fn(&IdentityError) -> Response<Bytes> + Send + Sync + 'static,
    ) -> Self {
        self.options.on_identity_error = Some(Arc::new(f));
        self
    }
}

impl<S, St, I> Layer<S> for RateLimitLayer<St, I> {
    type Service = RateLimit<S, St, I>;

    fn layer(&self, inner: S) -> Self::Service {
        RateLimit {
            inner,
            shared: Arc::new(Shared {
                rules: self.rules.clone(),
                store: self.store.clone(),
                identity: self.identity.clone(),
                options: self.options.clone(),
                warnings: WarnGate::new(),
            }),
        }
    }
}

/// Everything the services of one layer share.
struct Shared<St, I> {
    rules: Rules,
    store: Arc<St>,
    identity: Arc<I>,
    options: Options,
    warnings: WarnGate,
}

/// Lets through at most one warning per second.
struct WarnGate {
    start: Instant,
    last: AtomicU64,
    suppressed: AtomicU64,
}

impl WarnGate {
    fn new() -> Self {
        Self {
            start: Instant::now(),
            last: AtomicU64::new(0),
            suppressed: AtomicU64::new(0),
        }
    }

    fn store_failed(&self, error: &StoreError, mode: FailMode) {
        let second = self.start.elapsed().as_secs() + 1;
        let last = self.last.load(Ordering::Relaxed);
        if second > last
            && self
                .last
                .compare_exchange(last, second, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
        {
            let suppressed = self.suppressed.swap(0, Ordering::Relaxed);
            tracing::warn!(%error, ?mode, suppressed, "rate-limit store failed; applying fail mode");
        } else {
            self.suppressed.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// The rate-limiting service; made by [`RateLimitLayer`].
pub struct RateLimit<S, St, I = ClientIp> {
    inner: S,
    shared: Arc<Shared<St, I>>,
}

impl<S: Clone, St, I> Clone for RateLimit<S, St, I> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
            shared: self.shared.clone(),
        }
    }
}

impl<S: fmt::Debug, St, I> fmt::Debug for RateLimit<S, St, I> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RateLimit")
            .field("inner", &self.inner)
            .field("rules", &self.shared.rules)
            .finish_non_exhaustive()
    }
}

impl<S, St, I> RateLimit<S, St, I> {
    /// The inner service.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }

    /// The inner service, mutably.
    pub fn get_mut(&mut self) -> &mut S {
        &mut self.inner
    }

    /// The inner service, by value.
    pub fn into_inner(self) -> S {
        self.inner
    }
}

impl<S, St, I, ReqBody, ResBody> Service<Request<ReqBody>> for RateLimit<S, St, I>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>> + Clone,
    St: Store,
    I: Identify,
{
    type Response = Response<RateLimitBody<ResBody>>;
    type Error = S::Error;
    type Future = ResponseFuture<S, ReqBody, St, I>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<ReqBody>) -> Self::Future {
        let Some(candidates) = self.shared.rules.candidates(request.uri().path()) else {
            return ResponseFuture {
                state: State::Calling {
                    fut: self.inner.call(request),
                    headers: None,
                },
            };
        };
        // The service that was polled ready goes into the future; a fresh
        // clone stays behind for the next poll_ready.
        let clone = self.inner.clone();
        let inner = std::mem::replace(&mut self.inner, clone);
        let (head, body) = request.into_parts();
        let fut = self.shared.identity.identify(&head);
        ResponseFuture {
            state: State::Identifying {
                fut,
                pending: Some(Pending {
                    inner,
                    head,
                    body,
                    candidates,
                    shared: self.shared.clone(),
                }),
            },
        }
    }
}

/// A request held while its identity and budget are decided.
struct Pending<S, B, St, I> {
    inner: S,
    head: http::request::Parts,
    body: B,
    candidates: Candidates,
    shared: Arc<Shared<St, I>>,
}

impl<S, B, St, I> Pending<S, B, St, I> {
    fn call<R>(mut self) -> S::Future
    where
        S: Service<Request<B>, Response = Response<R>>,
    {
        self.inner.call(Request::from_parts(self.head, self.body))
    }
}

pin_project! {
    /// The response future of [`RateLimit`].
    pub struct ResponseFuture<S, B, St, I>
    where
        S: Service<Request<B>>,
        St: Store,
        I: Identify,
    {
        #[pin]
        state: State<S::Future, I::Future, St::Future, Pending<S, B, St, I>>,
    }
}

pin_project! {
    #[project = StateProj]
    enum State<F, IF, SF, P> {
        Identifying { #[pin] fut: IF, pending: Option<P> },
        Checking { #[pin] fut: SF, pending: Option<P> },
        Calling { #[pin] fut: F, headers: Option<RateHeaders> },
        Answer { response: Option<Response<Bytes>>, headers: Option<RateHeaders> },
    }
}

impl<S, B, St, I> fmt::Debug for ResponseFuture<S, B, St, I>
where
    S: Service<Request<B>>,
    St: Store,
    I: Identify,
{
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ResponseFuture").finish_non_exhaustive()
    }
}

impl<S, B, St, I, ResBody> Future for ResponseFuture<S, B, St, I>
where
    S: Service<Request<B>, Response = Response<ResBody>>,
    St: Store,
    I: Identify,
{
    type Output = Result<Response<RateLimitBody<ResBody>>, S::Error>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut state = self.project().state;
        loop {
            let next = match state.as_mut().project() {
                StateProj::Identifying { fut, pending } => {
                    let identity = ready!(fut.poll(cx));
                    let Some(pending) = pending.take() else {
                        return Poll::Pending;
                    };
                    let identity = match identity {
                        Ok(identity) => identity,
                        Err(error) => {
                            let response = match &pending.shared.options.on_identity_error {
                                Some(f) => f(&error),
                                None => decision::problem(error.status(), error.message()),
                            };
                            state.set(State::Answer {
                                response: Some(response),
                                headers: None,
                            });
                            continue;
                        }
                    };
                    let shared = &*pending.shared;
                    let policy = shared
                        .rules
                        .select(&pending.candidates, identity.group(), &pending.head.method)
                        .and_then(|rule| rule.policy.as_ref());
                    match policy {
                        None => State::Calling {
                            fut: pending.call(),
                            headers: None,
                        },
                        Some(policy) => {
                            let check = Check {
                                budget: key::budget_key(&policy.budget, identity.user()),
                                windows: policy.windows.clone(),
                                algorithm: policy.algorithm,
                                cost: 1,
                                now: shared.options.clock.as_ref().map(|c| c.now()),
                            };
                            State::Checking {
                                fut: shared.store.check(check),
                                pending: Some(pending),
                            }
                        }
                    }
                }
                StateProj::Checking { fut, pending } => {
                    let result = ready!(fut.poll(cx));
                    let Some(pending) = pending.take() else {
                        return Poll::Pending;
                    };
                    match result {
                        Ok(decision) if decision.allowed() => State::Calling {
                            headers: RateHeaders::new(&decision),
                            fut: pending.call(),
                        },
                        Ok(decision) => {
                            let response = match &pending.shared.options.on_blocked {
                                Some(f) => f(&decision),
                                None => decision::too_many_requests(),
                            };
                            State::Answer {
                                response: Some(response),
                                headers: RateHeaders::new(&decision),
                            }
                        }
                        Err(error) => {
                            let mode = pending.shared.options.fail_mode;
                            pending.shared.warnings.store_failed(&error, mode);
                            match mode {
                                FailMode::Closed => State::Answer {
                                    response: Some(decision::store_unavailable()),
                                    headers: None,
                                },
                                FailMode::Open => State::Calling {
                                    fut: pending.call(),
                                    headers: None,
                                },
                            }
                        }
                    }
                }
                StateProj::Calling { fut, headers } => {
                    let mut response = ready!(fut.poll(cx))?;
                    if let Some(headers) = headers.take() {
                        headers.apply(response.headers_mut());
                    }
                    return Poll::Ready(Ok(response.map(RateLimitBody::inner)));
                }
                StateProj::Answer { response, headers } => {
                    let Some(mut response) = response.take() else {
                        return Poll::Pending;
                    };
                    if let Some(headers) = headers.take() {
                        headers.apply(response.headers_mut());
                    }
                    return Poll::Ready(Ok(response.map(RateLimitBody::full)));
                }
            };
            state.set(next);
        }
    }
}
