//! [`RateLimit`], the service a [`RateLimitLayer`](crate::RateLimitLayer)
//! makes, and its response future.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};
use std::time::Instant;

use bytes::Bytes;
use http::request::Parts;
use http::{Request, Response};
use pin_project_lite::pin_project;
use tower_service::Service;

use crate::body::RateLimitBody;
use crate::decision::{self, GrpcStatus, RateHeaders};
use crate::identity::{ClientIp, Identify};
use crate::key;
use crate::layer::{FailMode, Options, RunState};
use crate::observe::{self, Outcome};
use crate::rules::{Candidates, Policy, Rules};
use crate::store::{Check, Decision, GlobalCheck, Store, StoreError};

/// Everything the services of one layer share.
pub(crate) struct Shared<St, I> {
    pub(crate) rules: Rules,
    pub(crate) store: Arc<St>,
    pub(crate) identity: Arc<I>,
    pub(crate) options: Options,
    pub(crate) state: Arc<RunState>,
}

impl<St, I> Shared<St, I> {
    /// Now, in microseconds, on the injected clock if there is one, else on
    /// the layer's monotonic clock (for the denial cache and probes).
    fn now(&self) -> u64 {
        match &self.options.clock {
            Some(clock) => clock.now().as_micros(),
            None => self.real_now(),
        }
    }

    /// Microseconds since the layer started (for rate-limited warnings).
    fn real_now(&self) -> u64 {
        u64::try_from(self.state.start.elapsed().as_micros()).unwrap_or(u64::MAX)
    }
}

/// The rate-limiting service; made by [`RateLimitLayer`](crate::RateLimitLayer).
pub struct RateLimit<S, St, I = ClientIp> {
    inner: S,
    shared: Arc<Shared<St, I>>,
}

impl<S, St, I> RateLimit<S, St, I> {
    pub(crate) fn new(inner: S, shared: Arc<Shared<St, I>>) -> Self {
        Self { inner, shared }
    }

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
        let candidates = self
            .shared
            .rules
            .candidates(request.method(), request.uri().path());
        let Some(candidates) = candidates else {
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
                    grpc: decision::is_grpc(&head.headers),
                    head,
                    body,
                    candidates,
                    shared: self.shared.clone(),
                    checked: None,
                }),
            },
        }
    }
}

/// A request held while its identity and budget are decided.
struct Pending<S, B, St, I> {
    inner: S,
    head: Parts,
    body: B,
    candidates: Candidates,
    shared: Arc<Shared<St, I>>,
    grpc: bool,
    /// Set once a rule applies.
    checked: Option<Checked>,
}

/// What a limited request is checked against.
struct Checked {
    policy: Arc<Policy>,
    budget: Arc<str>,
    cost: u32,
    /// When the store was asked.
    started: Instant,
    /// A copy of the check, kept only for [`FailMode::Fallback`].
    retry: Option<Check>,
}

enum Next<F, SF> {
    Call(F, Option<RateHeaders>),
    Check(SF),
    Answer(Response<Bytes>, Option<RateHeaders>),
}

impl<S, B, St, I> Pending<S, B, St, I>
where
    St: Store,
    I: Identify,
{
    fn call<R>(mut self, headers: Option<RateHeaders>) -> Next<S::Future, St::Future>
    where
        S: Service<Request<B>, Response = Response<R>>,
    {
        let fut = self.inner.call(Request::from_parts(self.head, self.body));
        Next::Call(fut, headers)
    }

    /// Picks the rule, then answers from the denial cache or the fallback
    /// store, or asks the store.
    fn identified<R>(
        mut self,
        identity: crate::identity::Identity,
    ) -> (Next<S::Future, St::Future>, Option<Self>)
    where
        S: Service<Request<B>, Response = Response<R>>,
    {
        let shared = self.shared.clone();
        let policy = shared
            .rules
            .select(&self.candidates, identity.group(), &self.head.method)
            .and_then(|rule| rule.policy.clone());
        let Some(policy) = policy else {
            return (self.call(None), None);
        };
        let options = &shared.options;
        let cost = options.cost.as_ref().map_or(1, |f| f(&self.head));
        let budget = key::budget_key(&policy.budget, identity.user());
        let now = shared.now();
        if !policy.shadow && !options.shadow {
            if let Some(denied) = shared
                .state
                .denials
                .as_ref()
                .and_then(|c| c.get(&budget, cost, now))
            {
                self.checked = Some(Checked {
                    policy,
                    budget,
                    cost,
                    started: Instant::now(),
                    retry: None,
                });
                return (self.decided(Ok(denied), Outcome::DeniedLocally), None);
            }
        }
        let check = Check {
            budget: budget.clone(),
            windows: policy.windows.clone(),
            algorithm: policy.algorithm,
            cost,
            now: options.clock.as_ref().map(|c| c.now()),
            global: policy
                .global
                .as_ref()
                .map(|g| GlobalCheck::new(g.budget.clone(), g.windows.clone())),
            block: policy.block,
        };
        let fallback = shared.state.fallback.as_ref();
        let retry = fallback.map(|_| check.clone());
        self.checked = Some(Checked {
            policy,
            budget,
            cost,
            started: Instant::now(),
            retry,
        });
        if let Some(fallback) = fallback.filter(|f| f.bypass(now)) {
            let decision = fallback.store.decide_now(&check);
            return (self.decided(Ok(decision), Outcome::Fallback), None);
        }
        (Next::Check(shared.store.check(check)), Some(self))
    }

    /// Turns a store's answer into the next step.
    fn decided<R>(
        mut self,
        result: Result<Decision, StoreError>,
        via: Outcome,
    ) -> Next<S::Future, St::Future>
    where
        S: Service<Request<B>, Response = Response<R>>,
    {
        let shared = self.shared.clone();
        let options = &shared.options;
        let Some(checked) = self.checked.take() else {
            return self.call(None);
        };
        let (decision, via) = match result {
            Ok(decision) => {
                if via == Outcome::Allowed {
                    observe::store_latency(checked.started.elapsed());
                    if let Some(fallback) = &shared.state.fallback {
                        fallback.recovered();
                    }
                }
                (decision, via)
            }
            Err(error) => {
                observe::store_error();
                let mode = options.fail_mode;
                shared
                    .state
                    .warnings
                    .store_failed(&error, mode, shared.real_now());
                match (mode, &shared.state.fallback, &checked.retry) {
                    (FailMode::Fallback, Some(fallback), Some(check)) => {
                        fallback.failed(shared.now());
                        (fallback.store.decide_now(check), Outcome::Fallback)
                    }
                    (FailMode::Closed, ..) => {
                        observe::outcome(
                            &checked.policy.route,
                            &checked.budget,
                            Outcome::FailClosed,
                            None,
                        );
                        let response = if self.grpc {
                            decision::grpc(
                                GrpcStatus::Unavailable,
                                "rate limiter unavailable",
                                None,
                            )
                        } else {
                            decision::store_unavailable()
                        };
                        return Next::Answer(response, None);
                    }
                    _ => {
                        observe::outcome(
                            &checked.policy.route,
                            &checked.budget,
                            Outcome::FailOpen,
                            None,
                        );
                        return self.call(None);
                    }
                }
            }
        };
        let policy = &checked.policy;
        let remaining = decision.constraining().map(|w| w.remaining);
        let headers = RateHeaders::new(&decision, policy, options.headers);
        if decision.allowed() {
            let outcome = if via == Outcome::Fallback {
                via
            } else {
                Outcome::Allowed
            };
            observe::outcome(&policy.route, &checked.budget, outcome, remaining);
            return self.call(Some(headers));
        }
        if policy.shadow || options.shadow {
            observe::outcome(
                &policy.route,
                &checked.budget,
                Outcome::ShadowDenied,
                remaining,
            );
            return self.call(Some(headers.without_retry()));
        }
        let outcome = match via {
            Outcome::Allowed => Outcome::Denied,
            other => other,
        };
        observe::outcome(&policy.route, &checked.budget, outcome, remaining);
        if outcome == Outcome::Denied {
            if let Some(cache) = &shared.state.denials {
                cache.insert(&checked.budget, checked.cost, shared.now(), &decision);
            }
        }
        let response = match &options.on_blocked {
            Some(f) => f(&decision),
            None if self.grpc => decision::grpc(
                GrpcStatus::ResourceExhausted,
                "rate limit exceeded",
                decision.retry_after(),
            ),
            None => decision::too_many_requests(),
        };
        Next::Answer(response, Some(headers))
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

impl<F, IF, SF, P> State<F, IF, SF, P> {
    fn from_next(next: Next<F, SF>, pending: Option<P>) -> Self {
        match next {
            Next::Call(fut, headers) => State::Calling { fut, headers },
            Next::Check(fut) => State::Checking { fut, pending },
            Next::Answer(response, headers) => State::Answer {
                response: Some(response),
                headers,
            },
        }
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
                    match identity {
                        Ok(identity) => {
                            let (next, pending) = pending.identified(identity);
                            State::from_next(next, pending)
                        }
                        Err(error) => {
                            let response = match &pending.shared.options.on_identity_error {
                                Some(f) => f(&error),
                                None if pending.grpc => decision::grpc(
                                    GrpcStatus::Unauthenticated,
                                    error.message(),
                                    None,
                                ),
                                None => decision::problem(error.status(), error.message()),
                            };
                            State::Answer {
                                response: Some(response),
                                headers: None,
                            }
                        }
                    }
                }
                StateProj::Checking { fut, pending } => {
                    let result = ready!(fut.poll(cx));
                    let Some(pending) = pending.take() else {
                        return Poll::Pending;
                    };
                    State::from_next(pending.decided(result, Outcome::Allowed), None)
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
