//! [`RateLimit`], the service a [`RateLimitLayer`](crate::RateLimitLayer)
//! makes, and its response future.

use std::fmt;
use std::future::Future;
use std::marker::PhantomData;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::request::Parts;
use http::{HeaderMap, Request, Response, StatusCode};
use pin_project_lite::pin_project;
use tower_service::Service;

use crate::body::{BodyMode, Wrapped};
use crate::decision::{self, GrpcStatus, Pushback, RateHeaders};
use crate::identity::{ClientIp, Identify, Identity, IdentityError};
use crate::key;
use crate::layer::RuleSource;
use crate::layer::{AdjustFn, FailMode, Options, RunState};
use crate::observe::{self, Outcome};
use crate::rules::{Candidates, Policy, Rules};
use crate::store::{
    Check, CheckRef, Decision, GlobalCheck, GlobalRef, Store, StoreError, StoreErrorKind,
};

/// A store's failure that took this long (or a timeout) makes
/// [`FailMode::Fallback`] skip the store for a while (see `store_failed`).
const SLOW_FAILURE: Duration = Duration::from_millis(5);

/// Everything the services of one layer share.
pub(crate) struct Shared<St, I> {
    pub(crate) rules: RuleSource,
    pub(crate) store: Arc<St>,
    pub(crate) identity: Arc<I>,
    pub(crate) options: Options,
    pub(crate) state: Arc<RunState>,
}

impl<St, I> Shared<St, I> {
    /// Now, in microseconds, on the injected clock if there is one (whether
    /// or not checks are decided on it), else on the layer's monotonic
    /// clock (for the denial cache and probes).
    fn now(&self) -> u64 {
        self.now_or(Instant::now)
    }

    /// [`now`](Self::now), with the system clock read by `real` (only when
    /// no clock was injected).
    fn now_or(&self, real: impl FnOnce() -> Instant) -> u64 {
        layer_now(self.options.clock.as_deref(), self.state.start, real)
    }

    /// Microseconds since the layer started (for rate-limited warnings).
    fn real_now(&self) -> u64 {
        self.micros_since_start(Instant::now())
    }

    fn micros_since_start(&self, at: Instant) -> u64 {
        crate::clock::duration_micros(at.saturating_duration_since(self.state.start))
    }
}

/// [`Shared::now`] from its parts (for work that outlives the request's
/// borrow of the layer): the injected clock's now if there is one, else
/// the microseconds since `start` that `real` reads.
fn layer_now(
    clock: Option<&dyn crate::clock::Clock>,
    start: Instant,
    real: impl FnOnce() -> Instant,
) -> u64 {
    match clock {
        Some(clock) => clock.now().as_micros(),
        None => crate::clock::duration_micros(real().saturating_duration_since(start)),
    }
}

/// The rate-limiting service; made by [`RateLimitLayer`](crate::RateLimitLayer).
///
/// `M` says how it types its response body ([`BodyMode`]). The inner
/// service must be `Clone`: a call takes the inner service that was made
/// ready and leaves a clone in its place, as tower's middleware do.
/// `poll_ready` is the inner service's own, so a service whose readiness
/// holds a resource (a concurrency permit) holds it while the layer
/// decides.
pub struct RateLimit<S, St, I = ClientIp, M = Wrapped> {
    inner: S,
    shared: Arc<Shared<St, I>>,
    body: PhantomData<fn() -> M>,
}

impl<S, St, I, M> RateLimit<S, St, I, M> {
    pub(crate) fn new(inner: S, shared: Arc<Shared<St, I>>) -> Self {
        Self {
            inner,
            shared,
            body: PhantomData,
        }
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

impl<S: Clone, St, I, M> Clone for RateLimit<S, St, I, M> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
            shared: self.shared.clone(),
            body: PhantomData,
        }
    }
}

impl<S: fmt::Debug, St, I, M> fmt::Debug for RateLimit<S, St, I, M> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RateLimit")
            .field("inner", &self.inner)
            .field("rules", &self.shared.rules)
            .finish_non_exhaustive()
    }
}

impl<S, St, I, M, ReqBody, ResBody> Service<Request<ReqBody>> for RateLimit<S, St, I, M>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>> + Clone,
    St: Store,
    I: Identify,
    M: BodyMode<ResBody>,
{
    type Response = Response<M::Body>;
    type Error = S::Error;
    type Future = ResponseFuture<S, ReqBody, St, I, M>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<ReqBody>) -> Self::Future {
        let shared = &*self.shared;
        // (One table for the whole decision, even if a reload swaps it.)
        let rules = shared.rules.load();
        // (A request target that is no path, `OPTIONS *` or `CONNECT
        // host:443`, which hyper takes with any method and axum hands to a
        // fallback, is matched as `/`: a catch-all route limits it too.)
        let path = request.uri().path();
        let path = if path.starts_with('/') { path } else { "/" };
        let candidates = rules.candidates(request.method(), path);
        let Some(candidates) = candidates else {
            drop(rules);
            return self.unmatched(request);
        };
        let (head, body) = request.into_parts();
        // The fast path: an identity and a store that answer at once (the
        // built-ins, the memory store, the denial cache) decide right here,
        // and the ready inner service is called directly.
        let verdict = match shared.identity.identify_now(&head) {
            Some(identity) => shared.on_identity(&rules, &head, &candidates, identity),
            None => {
                let rules = rules.owned();
                return self.identifying(head, body, candidates, rules);
            }
        };
        drop(rules);
        match verdict {
            Verdict::Pass(headers) => {
                let fut = self.inner.call(Request::from_parts(head, body));
                ResponseFuture::calling(fut, headers)
            }
            verdict => self.not_passed(verdict, head, body, candidates),
        }
    }
}

impl<S, St, I, M> RateLimit<S, St, I, M>
where
    St: Store,
    I: Identify,
{
    /// A request no route applies to (none matches, the path or method is
    /// excluded, or the table is empty): straight to the inner service.
    /// (Out of line, like [`not_passed`](Self::not_passed): each path has
    /// its own copy of the inner service's call, compact in the
    /// instruction cache.)
    #[inline(never)]
    fn unmatched<ReqBody>(
        &mut self,
        request: Request<ReqBody>,
    ) -> ResponseFuture<S, ReqBody, St, I, M>
    where
        S: Service<Request<ReqBody>> + Clone,
    {
        ResponseFuture::calling(self.inner.call(request), None)
    }

    /// A request whose identity is decided asynchronously: held until it is.
    /// (Out of line, like [`not_passed`](Self::not_passed).)
    #[inline(never)]
    fn identifying<ReqBody>(
        &mut self,
        head: Parts,
        body: ReqBody,
        candidates: Candidates,
        rules: Option<Rules>,
    ) -> ResponseFuture<S, ReqBody, St, I, M>
    where
        S: Service<Request<ReqBody>> + Clone,
    {
        let fut = self.shared.identity.identify(&head);
        let mut pending = self.pending(head, body, candidates);
        pending.rules = rules;
        ResponseFuture::new(State::Identifying {
            fut,
            pending: Some(pending),
        })
    }

    /// A request answered without the inner service, or held for an
    /// asynchronous store. (Out of line: the path of a request let through
    /// at once stays compact in the instruction cache. `call` sends the
    /// requests it lets through straight to the inner service; the `Pass`
    /// arm here only keeps the match whole.)
    #[inline(never)]
    fn not_passed<ReqBody>(
        &mut self,
        verdict: Verdict<St::Future>,
        head: Parts,
        body: ReqBody,
        candidates: Candidates,
    ) -> ResponseFuture<S, ReqBody, St, I, M>
    where
        S: Service<Request<ReqBody>> + Clone,
    {
        match verdict {
            Verdict::Pass(headers) => {
                ResponseFuture::calling(self.inner.call(Request::from_parts(head, body)), headers)
            }
            Verdict::PassThen(headers, after) => {
                let fut = self.inner.call(Request::from_parts(head, body));
                ResponseFuture::new(State::CallingThen {
                    fut,
                    headers,
                    after: Some(after),
                })
            }
            Verdict::Answer(response, headers) => ResponseFuture::answer(response, headers),
            Verdict::Wait(fut, held) => {
                let mut pending = self.pending(head, body, candidates);
                pending.held = Some(held);
                ResponseFuture::new(State::Checking {
                    fut,
                    pending: Some(pending),
                })
            }
        }
    }
}

impl<S: Clone, St, I, M> RateLimit<S, St, I, M> {
    /// Holds the request for an asynchronous decision. The service that was
    /// polled ready goes with it; a fresh clone stays behind for the next
    /// poll_ready.
    /// (Boxed: only asynchronous identities and stores hold a request, and
    /// the response future of the others stays small to move.)
    fn pending<B>(
        &mut self,
        head: Parts,
        body: B,
        candidates: Candidates,
    ) -> Box<Pending<S, B, St, I>> {
        let clone = self.inner.clone();
        Box::new(Pending {
            inner: std::mem::replace(&mut self.inner, clone),
            head,
            body,
            candidates,
            rules: None,
            shared: self.shared.clone(),
            held: None,
        })
    }
}

/// A request held while its identity or its budget is decided.
struct Pending<S, B, St, I> {
    inner: S,
    head: Parts,
    body: B,
    candidates: Candidates,
    /// The table `candidates` were matched in, while the identity is
    /// decided, if it can be swapped meanwhile (`None`: a fixed table).
    rules: Option<Rules>,
    shared: Arc<Shared<St, I>>,
    /// Set once a rule applies and the store is asked.
    held: Option<Held>,
}

impl<S, B, St, I> Pending<S, B, St, I> {
    fn call<R>(self) -> S::Future
    where
        S: Service<Request<B>, Response = Response<R>>,
    {
        let Pending {
            mut inner,
            head,
            body,
            ..
        } = self;
        inner.call(Request::from_parts(head, body))
    }
}

/// What a limited request is checked against, borrowed from the rule table
/// (and from the stack, for the budget) while the decision is made.
struct Checked<'a> {
    policy: &'a Policy,
    budget: &'a str,
    cost: u32,
    /// When an asynchronous store was asked.
    started: Option<Instant>,
    /// [`Shared::now`] when an asynchronous store was asked: its waits run
    /// from about then, not from when its answer arrived.
    asked: Option<u64>,
    /// The check, for [`FailMode::Fallback`].
    retry: Option<CheckRef<'a>>,
}

impl Checked<'_> {
    /// How long since the asynchronous store was asked, if one was: its
    /// answer (or failure) and the layer's few steps after it, read when an
    /// event is logged.
    fn latency(&self) -> Option<Duration> {
        self.started.map(|started| started.elapsed())
    }
}

/// What a request waiting for an asynchronous store keeps of its check.
struct Held {
    policy: Arc<Policy>,
    budget: Arc<str>,
    cost: u32,
    started: Instant,
    asked: u64,
    /// A copy of the check, kept only for [`FailMode::Fallback`].
    retry: Option<Check>,
}

impl Held {
    fn checked(&self) -> Checked<'_> {
        Checked {
            policy: &self.policy,
            budget: &self.budget,
            cost: self.cost,
            started: Some(self.started),
            asked: Some(self.asked),
            retry: self.retry.as_ref().map(Check::as_ref),
        }
    }
}

/// What adjusts the budget a request spent once its response is known
/// ([`RateLimitLayer::adjust_on_response`](crate::RateLimitLayer::adjust_on_response)):
/// the store's call, if the hook asks for one.
type After = Box<dyn FnOnce(StatusCode, &HeaderMap) -> Option<Adjusting> + Send + Sync>;

/// A store's adjustment under way, its failure logged.
type Adjusting = Pin<Box<dyn Future<Output = ()> + Send>>;

/// An adjustment on its way to the store, which the response waits for.
/// Dropped before it is done (the client left, an outer timeout fired),
/// it is finished on the runtime instead: a penalty is not skipped by
/// hanging up.
struct Finish(Option<Adjusting>);

impl Finish {
    fn poll(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        if let Some(fut) = &mut self.0 {
            ready!(fut.as_mut().poll(cx));
            self.0 = None;
        }
        Poll::Ready(())
    }
}

impl Drop for Finish {
    fn drop(&mut self) {
        if let (Some(fut), Ok(runtime)) = (self.0.take(), tokio::runtime::Handle::try_current()) {
            runtime.spawn(fut);
        }
    }
}

/// What to do with a request.
enum Verdict<SF> {
    /// Call the inner service, and add these headers to its response.
    Pass(Option<RateHeaders>),
    /// The same, then adjust the request's budget (a layer with
    /// `adjust_on_response`: a path of its own, so the others' stays as
    /// it was).
    PassThen(Option<RateHeaders>, After),
    /// Answer without calling the inner service.
    Answer(Response<Bytes>, Option<RateHeaders>),
    /// Wait for the store.
    Wait(SF, Held),
}

impl<St: Store, I> Shared<St, I> {
    /// Picks the rule, then answers from a store that always decides at
    /// once, or from the denial cache, the fallback store or a store that
    /// decides at once this time, or asks the store.
    fn on_identity(
        &self,
        rules: &Rules,
        head: &Parts,
        candidates: &Candidates,
        identity: Result<Identity, IdentityError>,
    ) -> Verdict<St::Future> {
        let identity = match identity {
            Ok(identity) => identity,
            Err(error) => return self.identity_failed(head, &error),
        };
        let rule = rules.select(candidates, identity.group(), &head.method);
        let Some(policy) = rule.and_then(|rule| rule.policy.as_ref()) else {
            return Verdict::Pass(None);
        };
        let options = &self.options;
        let cost = options.cost.as_ref().map_or(policy.cost, |f| f(head));
        let cost = crate::rules::checked_cost(policy.algorithm, cost);
        let mut key = key::KeyBuf::new();
        let budget = key.write(&policy.budget, identity.user());
        let mut checked = Checked {
            policy,
            budget,
            cost,
            started: None,
            asked: None,
            retry: None,
        };
        let check = CheckRef {
            budget,
            windows: &policy.windows,
            algorithm: policy.algorithm,
            cost,
            now: match &options.clock {
                Some(c) if options.clock_decides => {
                    crate::cold_path();
                    Some(c.now())
                }
                _ => None,
            },
            global: policy.global.as_ref().map(|g| GlobalRef {
                budget: &g.budget,
                windows: &g.windows,
            }),
            block: options.block_for(policy),
            // (Only the IETF and per-window headers show every window.)
            exact_windows: options.headers_for(policy).every_window(),
        };
        checked.retry = Some(check);
        // A store that always decides at once and never fails (the memory
        // store) is asked first: none of its answers is ever cached, and
        // it is never down for the fallback to stand in. The layer's run
        // state is then never read (one memory line less per request).
        // (A constant for each store type: the check compiles away.)
        if self.store.always_decides_at_once() {
            if let Some(result) = self.store.check_now(&check) {
                return self.on_decision(checked, &head.headers, result, Outcome::Allowed);
            }
            crate::cold_path();
        }
        self.ask(policy, checked, head, check)
    }

    /// Asks any other store: a denial cached for the budget, the fallback
    /// store while the store is down, the store at once if it can decide
    /// at once this time, or the store. (Out of line: the memory store
    /// never comes here.)
    #[inline(never)]
    fn ask<'a>(
        &self,
        policy: &'a Arc<Policy>,
        checked: Checked<'a>,
        head: &Parts,
        check: CheckRef<'a>,
    ) -> Verdict<St::Future> {
        let shadow = self.options.shadow_for(policy);
        let cache = self.state.denials.as_ref().filter(|c| !c.is_empty());
        if let (false, Some(cache)) = (shadow, cache) {
            if let Some(denied) = cache.get(checked.budget, policy.id, checked.cost, self.now()) {
                return self.on_decision(
                    checked,
                    &head.headers,
                    Ok(denied),
                    Outcome::DeniedLocally,
                );
            }
        }
        if let Some(fallback) = self.state.fallback.as_ref() {
            if fallback.bypass(self.now(), || self.store.failure_domain(&check)) {
                let decision = fallback.store.decide_now(&check);
                return self.on_decision(checked, &head.headers, Ok(decision), Outcome::Fallback);
            }
        }
        if let Some(result) = self.store.check_now(&check) {
            return self.on_decision(checked, &head.headers, result, Outcome::Allowed);
        }
        self.wait(policy, check)
    }

    /// The answer to a request whose identity failed (out of line: the
    /// common path stays compact in the instruction cache).
    #[cold]
    #[inline(never)]
    fn identity_failed(&self, head: &Parts, error: &IdentityError) -> Verdict<St::Future> {
        observe::identity_error(error.status(), error.message());
        if error.status().is_server_error() {
            self.state.warnings.identity_failed(error, self.real_now());
        }
        let response = match &self.options.on_identity_error {
            Some(f) => f(error),
            None if decision::is_grpc(&head.headers) => {
                let status = GrpcStatus::of_identity_error(error.status());
                decision::grpc(&head.headers, status, error.message(), Pushback::Unsaid)
            }
            None => {
                let mut response = decision::problem(error.status(), error.message());
                if let (StatusCode::UNAUTHORIZED, Some(challenge)) =
                    (error.status(), error.challenge())
                {
                    response
                        .headers_mut()
                        .insert(http::header::WWW_AUTHENTICATE, challenge.clone());
                }
                response
            }
        };
        Verdict::Answer(response, None)
    }

    /// Asks an asynchronous store: the request waits, with a check it owns.
    /// (Out of line: a store that answers at once never comes here.)
    #[inline(never)]
    fn wait(&self, policy: &Arc<Policy>, check: CheckRef<'_>) -> Verdict<St::Future> {
        let cost = check.cost;
        // (When the check carries the time it is decided at, its waits run
        // from then: an entry of the denial cache then ends with them.)
        let decided_at = check.now;
        let check = owned_check(
            policy,
            check.budget,
            cost,
            check.now,
            check.block,
            check.exact_windows,
        );
        // (One reading of the system clock for both.)
        let started = Instant::now();
        let asked = decided_at.map_or_else(|| self.now_or(|| started), |at| at.as_micros());
        let held = Held {
            policy: policy.clone(),
            budget: check.budget.clone(),
            cost,
            started,
            asked,
            retry: self.state.fallback.as_ref().map(|_| check.clone()),
        };
        Verdict::Wait(self.store.check(check), held)
    }

    /// Turns a store's answer into what to do with the request (whose
    /// headers tell a gRPC call, answered in kind).
    // (Inlined: on the synchronous path it is one function with
    // `on_identity`, without a call that passes `Checked` field by field;
    // 159 fewer instructions per request, 1.005-1.008x loaded together.)
    #[inline(always)]
    fn on_decision(
        &self,
        checked: Checked<'_>,
        request: &http::HeaderMap,
        result: Result<Decision, StoreError>,
        via: Outcome,
    ) -> Verdict<St::Future> {
        let options = &self.options;
        let (decision, via) = match result {
            Ok(decision) => {
                // (Not for the fallback's decision: that call failed.)
                if let Some(started) = checked.started.filter(|_| via != Outcome::Fallback) {
                    observe::store_latency(started.elapsed());
                }
                // (The fail mode, in the options at hand, tells whether
                // there is a fallback before the run state is read.)
                if via == Outcome::Allowed && options.fail_mode == FailMode::Fallback {
                    if let (Some(fallback), Some(check)) = (&self.state.fallback, &checked.retry) {
                        fallback.recovered(
                            || self.store.failure_domain(check),
                            |domain| self.store.failure_domain_name(domain),
                        );
                    }
                }
                (decision, via)
            }
            Err(error) => return self.store_failed(checked, request, &error),
        };
        let policy = checked.policy;
        let headers =
            RateHeaders::new(&decision, policy, options.headers_for(policy), checked.cost);
        if decision.allowed() {
            let outcome = if via == Outcome::Fallback {
                via
            } else {
                Outcome::Allowed
            };
            observe::outcome(&policy.route, checked.budget, outcome, || {
                (remaining(&decision), checked.latency())
            });
            #[cfg(feature = "metrics")]
            observe::near_limit(&decision);
            if let (Some(hook), false) = (&options.adjust, via == Outcome::Fallback) {
                return Verdict::PassThen(Some(headers), self.after(hook, &checked));
            }
            return Verdict::Pass(Some(headers));
        }
        crate::cold_path();
        self.on_denied(checked, request, decision, via, headers)
    }

    /// What a store's failure makes of a request: the fallback store's
    /// decision, or the answer of the fail mode. (Out of line, like the
    /// other rare paths.)
    #[cold]
    #[inline(never)]
    fn store_failed(
        &self,
        checked: Checked<'_>,
        request: &http::HeaderMap,
        error: &StoreError,
    ) -> Verdict<St::Future> {
        let options = &self.options;
        observe::store_error();
        // (A failed call's latency too: in a brown-out, the calls that hit
        // the deadline are the ones to see.)
        if let Some(started) = checked.started {
            observe::store_latency(started.elapsed());
        }
        let mode = options.fail_mode;
        self.state
            .warnings
            .store_failed(error, mode, self.real_now());
        match (mode, &self.state.fallback, &checked.retry) {
            (FailMode::Fallback, Some(fallback), Some(check)) => {
                // Skipping the store spares the next requests a wait on it:
                // only a failure that made this one wait (a timeout, a slow
                // answer) starts that. One the store gave at once (a Cluster
                // master it holds, a connection it knows is gone) costs the
                // next requests nothing to ask again, so they do: the
                // budgets it still answers for stay exact, each failed
                // check alone decided by the fallback store.
                let waited = checked.started.is_some_and(|s| s.elapsed() >= SLOW_FAILURE);
                if waited || error.kind() == StoreErrorKind::Timeout {
                    let domain = self.store.failure_domain(check);
                    fallback.failed(self.now(), domain, || {
                        self.store.failure_domain_name(domain)
                    });
                }
                let decision = fallback.store.decide_now(check);
                self.on_decision(checked, request, Ok(decision), Outcome::Fallback)
            }
            (FailMode::Closed, ..) => {
                observe::outcome(
                    &checked.policy.route,
                    checked.budget,
                    Outcome::FailClosed,
                    || (None, checked.latency()),
                );
                let response = if decision::is_grpc(request) {
                    decision::grpc(
                        request,
                        GrpcStatus::Unavailable,
                        "rate limiter unavailable",
                        Pushback::After(decision::STORE_RETRY),
                    )
                } else {
                    decision::store_unavailable()
                };
                Verdict::Answer(response, None)
            }
            _ => {
                observe::outcome(
                    &checked.policy.route,
                    checked.budget,
                    Outcome::FailOpen,
                    || (None, checked.latency()),
                );
                Verdict::Pass(None)
            }
        }
    }

    /// What adjusts the budget of an allowed request after its response
    /// (out of line: only layers with the hook come here).
    #[cold]
    #[inline(never)]
    fn after(&self, hook: &Arc<AdjustFn>, checked: &Checked<'_>) -> After {
        let options = &self.options;
        let hook = hook.clone();
        let store = self.store.clone();
        let state = self.state.clone();
        let clock = options.clock.clone().filter(|_| options.clock_decides);
        // (The layer's own clock, as `Shared::now` reads it: the denial
        // cache's.)
        let layer_clock = options.clock.clone();
        // (An adjustment reports nothing: how exactly is moot.)
        let block = options.block_for(checked.policy);
        let mut check = owned_check(
            checked.policy,
            checked.budget,
            checked.cost,
            None,
            block,
            true,
        );
        let cost = checked.cost;
        Box::new(move |status, headers| {
            // (A refund gives back at most what the request spent: a free
            // request's refund would give back other requests' units.)
            let adjustment = match hook(status, headers)? {
                crate::Adjustment::Refund(n) => crate::Adjustment::Refund(n.min(cost)),
                penalty => penalty,
            };
            if adjustment.is_empty() {
                return None;
            }
            check.now = clock.map(|c| c.now());
            // (A refund may let the budget's next request pass: a denial
            // this replica cached for it no longer holds.)
            let refunded =
                matches!(adjustment, crate::Adjustment::Refund(_)).then(|| check.budget.clone());
            let fut = store.adjust(check, adjustment);
            Some(Box::pin(async move {
                match fut.await {
                    Ok(()) => {
                        if let (Some(budget), Some(cache)) = (refunded, &state.denials) {
                            let now = layer_now(layer_clock.as_deref(), state.start, Instant::now);
                            cache.forget(&budget, now);
                        }
                    }
                    Err(error) => {
                        observe::store_error();
                        let now = state.start.elapsed();
                        state
                            .warnings
                            .adjust_failed(&error, crate::clock::duration_micros(now));
                    }
                }
            }))
        })
    }

    /// A denied request: let through in shadow mode, else answered 429 (or
    /// gRPC `RESOURCE_EXHAUSTED`), its denial remembered by the cache.
    #[inline(never)]
    fn on_denied(
        &self,
        checked: Checked<'_>,
        request: &http::HeaderMap,
        decision: Decision,
        via: Outcome,
        headers: RateHeaders,
    ) -> Verdict<St::Future> {
        let options = &self.options;
        let policy = checked.policy;
        if options.shadow_for(policy) {
            observe::outcome(&policy.route, checked.budget, Outcome::ShadowDenied, || {
                (remaining(&decision), checked.latency())
            });
            crate::layer::shadow_denied(&policy.shadow_log, &policy.route, || self.real_now());
            return Verdict::Pass(Some(headers.without_retry()));
        }
        let outcome = match via {
            Outcome::Allowed => Outcome::Denied,
            Outcome::Fallback => Outcome::FallbackDenied,
            other => other,
        };
        observe::outcome(&policy.route, checked.budget, outcome, || {
            (remaining(&decision), checked.latency())
        });
        // A request that costs more than a window's limit can never pass:
        // it is told no wait.
        let never = decision.exceeds_limit(checked.cost);
        // Only an asynchronous store's denials are cached (a store that
        // answers at once is as fast as the cache), from when it was asked:
        // an entry may end a little early, which only sends a request to
        // the store. And only those whose wait nothing but time changes: a
        // block, a request that never passes, and a denial of cost 1 (with
        // no slot free, no request spends) on a budget no other policy may
        // spend with a higher limit, and with no route-wide window. (A
        // penalty, `adjust_on_response`, landing while an entry holds is
        // seen once it ends; a refund this replica's layer made forgets
        // the entry, another replica's is seen once it ends.) A costlier request waits longer once
        // a cheaper one passes, and a sibling policy's requests, on any
        // replica, make this one's wait longer as they pass.
        // (A route-wide window is spent by other users meanwhile, which may
        // make it the constraining window, or lengthen the wait.)
        let exact = policy.denial_cache
            && (decision.is_blocked()
                || never
                || (checked.cost <= 1 && !policy.shared && policy.global.is_none()));
        if let (Outcome::Denied, Some(cache), Some(asked), true) =
            (outcome, &self.state.denials, checked.asked, exact)
        {
            // (A costly request's block holds for the block time alone,
            // though the wait reported is its own when longer.)
            let hold = match decision.is_blocked() && checked.cost > 1 {
                true => options.block_for(policy),
                false => None,
            };
            cache.insert(
                checked.budget,
                policy.id,
                checked.cost,
                asked,
                &decision,
                headers.shows_every_window(),
                hold,
            );
        }
        let response = match &options.on_blocked {
            Some(f) => f(&decision),
            None if decision::is_grpc(request) => decision::grpc(
                request,
                GrpcStatus::ResourceExhausted,
                if never {
                    "request costs more than the rate limit allows"
                } else {
                    "rate limit exceeded"
                },
                match decision.retry_after() {
                    _ if never => Pushback::Never,
                    Some(retry) => Pushback::After(retry),
                    None => Pushback::Unsaid,
                },
            ),
            None if never => decision::too_costly(),
            None => decision::too_many_requests(),
        };
        // (A request that never passes has no `Retry-After` already: see
        // `RateHeaders::new`.)
        Verdict::Answer(response, Some(headers))
    }
}

/// The check of `budget` under `policy`, owned (for a store that waits, or
/// an adjustment).
fn owned_check(
    policy: &Policy,
    budget: &str,
    cost: u32,
    now: Option<crate::clock::Timestamp>,
    block: Option<Duration>,
    exact_windows: bool,
) -> Check {
    Check {
        budget: Arc::from(budget),
        windows: policy.windows.clone(),
        algorithm: policy.algorithm,
        cost,
        now,
        global: policy
            .global
            .as_ref()
            .map(|g| GlobalCheck::new(g.budget.clone(), g.windows.clone())),
        block,
        exact_windows,
    }
}

pin_project! {
    /// The response future of [`RateLimit`].
    pub struct ResponseFuture<S, B, St, I, M = Wrapped>
    where
        S: Service<Request<B>>,
        St: Store,
        I: Identify,
    {
        #[pin]
        state: State<S::Future, I::Future, St::Future, Box<Pending<S, B, St, I>>, S::Response>,
        body: PhantomData<fn() -> M>,
    }
}

pin_project! {
    #[project = StateProj]
    enum State<F, IF, SF, P, R> {
        Identifying { #[pin] fut: IF, pending: Option<P> },
        Checking { #[pin] fut: SF, pending: Option<P> },
        Calling { #[pin] fut: F, headers: Option<RateHeaders> },
        CallingThen { #[pin] fut: F, headers: Option<RateHeaders>, after: Option<After> },
        Adjusting { fut: Finish, response: Option<Box<R>> },
        Answer { response: Option<Response<Bytes>> },
    }
}

impl<S, B, St, I, M> ResponseFuture<S, B, St, I, M>
where
    S: Service<Request<B>>,
    St: Store,
    I: Identify,
{
    fn new(state: StateOf<S, B, St, I>) -> Self {
        Self {
            state,
            body: PhantomData,
        }
    }

    fn calling(fut: S::Future, headers: Option<RateHeaders>) -> Self {
        Self::new(State::Calling { fut, headers })
    }

    fn answer(response: Response<Bytes>, headers: Option<RateHeaders>) -> Self {
        Self::new(State::Answer {
            response: Some(with_headers(response, headers)),
        })
    }
}

type StateOf<S, B, St, I> = State<
    <S as Service<Request<B>>>::Future,
    <I as Identify>::Future,
    <St as Store>::Future,
    Box<Pending<S, B, St, I>>,
    <S as Service<Request<B>>>::Response,
>;

/// The next state after a verdict on a held request.
fn next_state<S, B, St, I, R>(
    verdict: Verdict<St::Future>,
    mut pending: Box<Pending<S, B, St, I>>,
) -> StateOf<S, B, St, I>
where
    S: Service<Request<B>, Response = Response<R>>,
    St: Store,
    I: Identify,
{
    match verdict {
        Verdict::Pass(headers) => State::Calling {
            fut: pending.call(),
            headers,
        },
        Verdict::PassThen(headers, after) => State::CallingThen {
            fut: pending.call(),
            headers,
            after: Some(after),
        },
        Verdict::Answer(response, headers) => State::Answer {
            response: Some(with_headers(response, headers)),
        },
        Verdict::Wait(fut, held) => {
            pending.held = Some(held);
            State::Checking {
                fut,
                pending: Some(pending),
            }
        }
    }
}

/// The next state of a held request once its identity is known. (Out of
/// line, like [`decided`]: the response future's common path, a request
/// let through at once, stays compact in the instruction cache.)
#[inline(never)]
fn identified<S, B, St, I, R>(
    identity: Result<Identity, IdentityError>,
    pending: Box<Pending<S, B, St, I>>,
) -> StateOf<S, B, St, I>
where
    S: Service<Request<B>, Response = Response<R>>,
    St: Store,
    I: Identify,
{
    let shared = &pending.shared;
    let verdict = match &pending.rules {
        Some(rules) => shared.on_identity(rules, &pending.head, &pending.candidates, identity),
        // (A fixed table: the one the candidates were matched in.)
        None => {
            let rules = shared.rules.load();
            shared.on_identity(&rules, &pending.head, &pending.candidates, identity)
        }
    };
    next_state(verdict, pending)
}

/// The next state of a request held for the store once the store answers;
/// `None` if the request holds no check (never).
#[inline(never)]
fn decided<S, B, St, I, R>(
    result: Result<Decision, StoreError>,
    mut pending: Box<Pending<S, B, St, I>>,
) -> Option<StateOf<S, B, St, I>>
where
    S: Service<Request<B>, Response = Response<R>>,
    St: Store,
    I: Identify,
{
    let held = pending.held.take()?;
    let verdict = pending.shared.on_decision(
        held.checked(),
        &pending.head.headers,
        result,
        Outcome::Allowed,
    );
    Some(next_state(verdict, pending))
}

impl<S, B, St, I, M> fmt::Debug for ResponseFuture<S, B, St, I, M>
where
    S: Service<Request<B>>,
    St: Store,
    I: Identify,
{
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ResponseFuture").finish_non_exhaustive()
    }
}

impl<S, B, St, I, M, ResBody> Future for ResponseFuture<S, B, St, I, M>
where
    S: Service<Request<B>, Response = Response<ResBody>>,
    St: Store,
    I: Identify,
    M: BodyMode<ResBody>,
{
    type Output = Result<Response<M::Body>, S::Error>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut state = self.project().state;
        loop {
            let next = match state.as_mut().project() {
                StateProj::Identifying { fut, pending } => {
                    let identity = ready!(fut.poll(cx));
                    let Some(pending) = pending.take() else {
                        return Poll::Pending;
                    };
                    identified(identity, pending)
                }
                StateProj::Checking { fut, pending } => {
                    let result = ready!(fut.poll(cx));
                    let Some(pending) = pending.take() else {
                        return Poll::Pending;
                    };
                    let Some(next) = decided(result, pending) else {
                        return Poll::Pending;
                    };
                    next
                }
                StateProj::Calling { fut, headers } => {
                    let mut response = ready!(fut.poll(cx))?;
                    if let Some(headers) = headers.take() {
                        headers.apply(response.headers_mut());
                    }
                    return Poll::Ready(Ok(response.map(M::inner)));
                }
                StateProj::CallingThen {
                    fut,
                    headers,
                    after,
                } => {
                    let mut response = ready!(fut.poll(cx))?;
                    if let Some(headers) = headers.take() {
                        headers.apply(response.headers_mut());
                    }
                    // (The hook: a boxed call.)
                    let adjusting = after
                        .take()
                        .and_then(|after| after(response.status(), response.headers()));
                    match adjusting {
                        None => return Poll::Ready(Ok(response.map(M::inner))),
                        // (Boxed: the response future stays as small to
                        // move as it was without adjustments.)
                        Some(fut) => State::Adjusting {
                            fut: Finish(Some(fut)),
                            response: Some(Box::new(response)),
                        },
                    }
                }
                StateProj::Adjusting { fut, response } => {
                    // (Done already: its future is not polled again.)
                    if response.is_none() {
                        return Poll::Pending;
                    }
                    ready!(fut.poll(cx));
                    let Some(response) = response.take() else {
                        return Poll::Pending;
                    };
                    return Poll::Ready(Ok((*response).map(M::inner)));
                }
                StateProj::Answer { response } => {
                    let Some(response) = response.take() else {
                        return Poll::Pending;
                    };
                    return Poll::Ready(Ok(answered::<M, ResBody>(response)));
                }
            };
            state.set(next);
        }
    }
}

/// A response the layer wrote, given its rate-limit headers at once: the
/// response future holds the response alone, and stays as small to move
/// as a request let through needs. (Out of line, like [`answered`].)
#[inline(never)]
fn with_headers(mut response: Response<Bytes>, headers: Option<RateHeaders>) -> Response<Bytes> {
    if let Some(headers) = headers {
        headers.apply(response.headers_mut());
    }
    response
}

/// A response the layer wrote, in the service's body type. (Out of line:
/// the response future's common path, a request let through, stays
/// compact in the instruction cache.)
#[inline(never)]
fn answered<M: BodyMode<R>, R>(response: Response<Bytes>) -> Response<M::Body> {
    response.map(M::written)
}

/// The requests left in a decision's constraining window (for its log).
fn remaining(decision: &Decision) -> Option<u32> {
    decision.constraining().map(|w| w.remaining)
}
