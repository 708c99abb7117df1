//! Where budgets live: the [`Store`] contract, and its implementations.
//!
//! One request is one [`Store::check`], and one check is one atomic decision
//! over every window that applies to the request: the store checks all of
//! them first, then records the request in all of them or in none. A denied
//! request consumes nothing.
//!
//! The [`MemoryStore`] is the executable specification of that contract; the
//! Redis store's scripts make exactly the same decisions (the conformance
//! tests run one suite against both).

use std::error::Error as StdError;
use std::fmt;
use std::future::Future;
use std::num::NonZeroU32;
use std::sync::Arc;
use std::time::Duration;

use arrayvec::ArrayVec;

use crate::clock::Timestamp;
use crate::rules::{Algorithm, Window, MAX_WINDOWS};

pub(crate) mod counters;
mod log;
pub mod memory;
#[cfg(feature = "redis")]
pub mod redis;
pub(crate) mod sliding_log;
#[cfg(feature = "redis")]
pub(crate) mod template;

pub use memory::MemoryStore;

/// One question to a store: may this budget spend `cost` now?
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct Check {
    /// The budget: `<policy>:<user>`, already encoded so it contains no key
    /// syntax (see [`crate::key`](crate#keys)).
    pub budget: Arc<str>,
    /// The windows to check, shortest first, each length once.
    pub windows: Arc<[Window]>,
    /// How requests are counted.
    pub algorithm: Algorithm,
    /// How many units this request spends (1 unless configured).
    pub cost: u32,
    /// The time of the check when a clock was injected into the layer; `None`
    /// lets the store use its own clock (Redis: the server's `TIME`).
    pub now: Option<Timestamp>,
    /// A route-wide budget shared by every user, decided in the same atomic
    /// step: the request is allowed only if both budgets allow it, and is
    /// recorded in both or in neither.
    pub global: Option<GlobalCheck>,
    /// When the user's own windows deny the request, block the user's
    /// budget for this long (set atomically with the decision).
    pub block: Option<Duration>,
    /// Whether every window's remaining must be exact (`true`, the
    /// default). `false` (the layer shows only the constraining window: no
    /// IETF headers) lets a store answer an **allowed** check with a lower
    /// bound of the remaining of a window that can neither deny the check
    /// nor be the constraining one, to spare itself counting it: the Redis
    /// sliding log then skips the search for where such a window starts.
    /// The constraining window, and every window of a denial, stay exact.
    pub exact_windows: bool,
}

/// The route-wide part of a [`Check`].
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct GlobalCheck {
    /// The route's budget: `<route id>:*` (the Redis store uses the route id
    /// as the hash tag of every key of such a check).
    pub budget: Arc<str>,
    /// Its windows, shortest first, each length once (as
    /// [`GlobalCheck::new`] puts them; a store refuses a check otherwise).
    pub windows: Arc<[Window]>,
}

impl GlobalCheck {
    /// A route-wide budget.
    pub fn new(budget: impl Into<Arc<str>>, windows: impl Into<Arc<[Window]>>) -> Self {
        Self {
            budget: budget.into(),
            windows: sorted(windows.into()),
        }
    }

    /// The hash tag shared by every key of a check with this global part.
    pub fn tag(&self) -> &str {
        route_tag(&self.budget)
    }
}

/// The hash tag of a route-wide budget (see [`GlobalCheck::tag`]).
fn route_tag(budget: &str) -> &str {
    budget.split_once(':').map_or(budget, |(tag, _)| tag)
}

/// `windows` shortest first, each length once: two limits on one length
/// are the stricter one (a store keeps one count per length).
fn sorted(windows: Arc<[Window]>) -> Arc<[Window]> {
    // The rules' windows are already so (they reject a length twice).
    if shortest_first(&windows) {
        return windows;
    }
    let mut sorted = windows.to_vec();
    sorted.sort_by_key(|w| (w.micros(), w.limit()));
    sorted.dedup_by_key(|w| w.micros());
    sorted.into()
}

impl Check {
    /// A check of `budget` against `windows`, costing 1, on the store's
    /// clock. The windows are put shortest first; two limits on one length
    /// become the stricter one.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_ratelimit::rules::Window;
    /// use tower_ratelimit::store::Check;
    ///
    /// let w = |secs, limit| Window::new(Duration::from_secs(secs), limit).unwrap();
    /// let check = Check::new("r1:alice", vec![w(60, 100), w(1, 10), w(1, 5)]);
    /// let windows: Vec<_> = check.windows.iter().map(|w| (w.duration().as_secs(), w.limit())).collect();
    /// assert_eq!(windows, [(1, 5), (60, 100)]);
    /// ```
    pub fn new(budget: impl Into<Arc<str>>, windows: impl Into<Arc<[Window]>>) -> Self {
        Self {
            budget: budget.into(),
            windows: sorted(windows.into()),
            algorithm: Algorithm::default(),
            cost: 1,
            now: None,
            global: None,
            block: None,
            exact_windows: true,
        }
    }

    /// Counts requests with `algorithm`.
    #[must_use]
    pub fn with_algorithm(mut self, algorithm: Algorithm) -> Self {
        self.algorithm = algorithm;
        self
    }

    /// Also checks a route-wide budget.
    #[must_use]
    pub fn with_global(mut self, global: GlobalCheck) -> Self {
        self.global = Some(global);
        self
    }

    /// Blocks the user's budget for `block` when its windows deny.
    #[must_use]
    pub fn with_block(mut self, block: Duration) -> Self {
        self.block = Some(block);
        self
    }

    /// Sets the cost of the request. (On a sliding log, one above
    /// [`MAX_LOG_COST`](crate::rules::MAX_LOG_COST) that its windows could
    /// allow is refused: see [`CheckRef::supported`]; the layer sends it as
    /// costing more than any limit.)
    #[must_use]
    pub fn with_cost(mut self, cost: u32) -> Self {
        self.cost = cost;
        self
    }

    /// Decides at `now` instead of on the store's clock.
    #[must_use]
    pub fn at(mut self, now: Timestamp) -> Self {
        self.now = Some(now);
        self
    }

    /// Sets [`exact_windows`](Self::exact_windows).
    #[must_use]
    pub fn with_exact_windows(mut self, exact: bool) -> Self {
        self.exact_windows = exact;
        self
    }

    /// The same check, borrowed (what [`Store::check_now`] takes).
    pub fn as_ref(&self) -> CheckRef<'_> {
        CheckRef {
            budget: &self.budget,
            windows: &self.windows,
            algorithm: self.algorithm,
            cost: self.cost,
            now: self.now,
            global: self.global.as_ref().map(|g| GlobalRef {
                budget: &g.budget,
                windows: &g.windows,
            }),
            block: self.block,
            exact_windows: self.exact_windows,
        }
    }
}

impl CheckRef<'_> {
    /// `Ok` when the built-in stores can decide this check: at most
    /// [`MAX_WINDOWS`] windows of the user's and as many route-wide, each
    /// list shortest first with each length once (as [`Check::new`] and
    /// [`GlobalCheck::new`] put them), and
    /// for a sliding log no window allowing more than
    /// [`MAX_LOG_LIMIT`](crate::rules::MAX_LOG_LIMIT) and no cost above
    /// [`MAX_LOG_COST`](crate::rules::MAX_LOG_COST) that its windows could
    /// allow (the layer never makes such checks; one made by hand might,
    /// and would have a store write an entry per unit of a cost that
    /// large). Route-wide windows need some of the user's: a check without
    /// windows of its own limits nothing (the built-in stores allow it and
    /// change nothing), its route's budget included.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_ratelimit::rules::Window;
    /// use tower_ratelimit::store::{Check, StoreErrorKind};
    ///
    /// let windows: Vec<_> = (1..=9)
    ///     .map(|s| Window::new(Duration::from_secs(s), 10).unwrap())
    ///     .collect();
    /// let error = Check::new("r1:alice", windows).as_ref().supported().unwrap_err();
    /// assert_eq!(error.kind(), StoreErrorKind::Config);
    ///
    /// // A sliding log (the default algorithm) of 2,000,000 a day.
    /// let day = Window::new(Duration::from_secs(86_400), 2_000_000).unwrap();
    /// let error = Check::new("r1:bob", [day]).as_ref().supported().unwrap_err();
    /// assert_eq!(error.kind(), StoreErrorKind::Config);
    /// let counted = Check::new("r1:bob", [day]).with_algorithm(tower_ratelimit::Algorithm::SlidingWindow);
    /// assert!(counted.as_ref().supported().is_ok());
    ///
    /// // Windows set by hand, longest first.
    /// let (second, minute) = (Duration::from_secs(1), Duration::from_secs(60));
    /// let mut carol = Check::new("r1:carol", [Window::new(second, 5).unwrap()]);
    /// carol.windows = [Window::new(minute, 100).unwrap(), Window::new(second, 5).unwrap()].into();
    /// let error = carol.as_ref().supported().unwrap_err();
    /// assert_eq!(error.kind(), StoreErrorKind::Config);
    /// ```
    pub fn supported(&self) -> Result<(), StoreError> {
        self.shape_supported()?;
        // (One that costs more than a limit writes nothing: refused as such
        // by the store.)
        if self.algorithm == Algorithm::SlidingLog
            && self.cost > crate::rules::MAX_LOG_COST
            && self.windows.iter().all(|w| self.cost <= w.limit())
        {
            return Err(log_cost_too_high(self.cost));
        }
        Ok(())
    }

    /// [`supported`](Self::supported) without the cost: whether the
    /// store can keep this budget at all (what an adjustment, whose cost
    /// is not read, needs).
    pub(crate) fn shape_supported(&self) -> Result<(), StoreError> {
        let global = self.global.map_or(&[][..], |g| g.windows);
        if self.windows.len() > MAX_WINDOWS || global.len() > MAX_WINDOWS {
            return Err(too_many_windows(self.windows.len(), global.len()));
        }
        // (A rule's unlimited group never counts its route's windows: the
        // layer never sends one.)
        if self.windows.is_empty() && !global.is_empty() {
            return Err(route_without_user_windows());
        }
        // (`Check::new` sorts them; a caller who set the field by hand may
        // not have, and every store reads the last window as the longest.)
        if !shortest_first(self.windows) || !shortest_first(global) {
            return Err(unsorted_windows());
        }
        if self.algorithm == Algorithm::SlidingLog
            && self
                .windows
                .iter()
                .chain(global)
                .any(|w| w.limit() > crate::rules::MAX_LOG_LIMIT)
        {
            return Err(log_too_long());
        }
        Ok(())
    }
}

/// (Out of line: the layer never gets here.)
#[cold]
#[inline(never)]
fn log_cost_too_high(cost: u32) -> StoreError {
    StoreError::new(
        StoreErrorKind::Config,
        format!(
            "a sliding-log request may cost at most {} (its store writes an entry per unit), not {cost}",
            crate::rules::MAX_LOG_COST
        ),
    )
}

/// (Out of line: the layer never gets here.)
#[cold]
#[inline(never)]
fn log_too_long() -> StoreError {
    StoreError::new(
        StoreErrorKind::Config,
        format!(
            "a sliding log's window allows at most {} (its store keeps an entry per unit)",
            crate::rules::MAX_LOG_LIMIT
        ),
    )
}

/// Whether `windows` are shortest first, each length once.
fn shortest_first(windows: &[Window]) -> bool {
    windows.windows(2).all(|p| p[0].micros() < p[1].micros())
}

/// (Out of line: the layer never gets here.)
#[cold]
#[inline(never)]
fn unsorted_windows() -> StoreError {
    StoreError::new(
        StoreErrorKind::Config,
        "a check's windows must be shortest first, each length once (as `Check::new` puts them)",
    )
}

/// (Out of line: the layer never gets here.)
#[cold]
#[inline(never)]
fn too_many_windows(user: usize, global: usize) -> StoreError {
    StoreError::new(
        StoreErrorKind::Config,
        format!(
            "a check of {user} windows and {global} route-wide: a store takes at most {MAX_WINDOWS} of each"
        ),
    )
}

/// (Out of line: the layer never gets here.)
#[cold]
#[inline(never)]
fn route_without_user_windows() -> StoreError {
    StoreError::new(
        StoreErrorKind::Config,
        "a check with route-wide windows but none of its own: a user without limits counts nothing, the route's budget included",
    )
}

/// A [`Check`] borrowed from the layer's rule table: what a store that
/// decides at once needs, made per request without allocating (the budget
/// key lives on the stack, unless its policy part is unusually long: a
/// group name of more than about 100 bytes).
///
/// ```
/// use std::time::Duration;
/// use tower_ratelimit::{Check, MemoryStore, Store, Window};
///
/// let store = MemoryStore::new();
/// let check = Check::new("r1:alice", [Window::new(Duration::from_secs(1), 1)?]);
/// // The memory store decides at once, on the borrowed check.
/// let first = store.check_now(&check.as_ref()).expect("decides at once")?;
/// let second = store.check_now(&check.as_ref()).expect("decides at once")?;
/// assert!(first.allowed() && !second.allowed());
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Copy, Debug)]
#[non_exhaustive]
pub struct CheckRef<'a> {
    /// The budget (see [`Check::budget`]).
    pub budget: &'a str,
    /// The windows to check, shortest first, each length once.
    pub windows: &'a [Window],
    /// How requests are counted.
    pub algorithm: Algorithm,
    /// How many units this request spends.
    pub cost: u32,
    /// The time of the check, when a clock was injected into the layer.
    pub now: Option<Timestamp>,
    /// The route-wide budget, decided in the same atomic step.
    pub global: Option<GlobalRef<'a>>,
    /// How long to block the user's budget when its windows deny.
    pub block: Option<Duration>,
    /// Whether every window's remaining must be exact (see
    /// [`Check::exact_windows`]).
    pub exact_windows: bool,
}

/// The route-wide part of a [`CheckRef`].
#[derive(Clone, Copy, Debug)]
#[non_exhaustive]
pub struct GlobalRef<'a> {
    /// The route's budget.
    pub budget: &'a str,
    /// Its windows, shortest first, each length once (as
    /// [`GlobalCheck::new`] puts them; a store refuses a check otherwise).
    pub windows: &'a [Window],
}

impl<'a> GlobalRef<'a> {
    /// The hash tag shared by every key of a check with this global part
    /// (as [`GlobalCheck::tag`]).
    pub fn tag(&self) -> &'a str {
        route_tag(self.budget)
    }
}

/// The state of one window after a check.
///
/// Sixteen bytes (the window's length and limit are stored flat), so a
/// [`Decision`] stays small to move.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct WindowState {
    micros: u64,
    limit: NonZeroU32,
    /// Requests the window still allows (after counting this one, if it was
    /// allowed).
    pub remaining: u32,
}

impl WindowState {
    /// The state of `window`.
    pub fn new(window: Window, remaining: u32) -> Self {
        Self {
            micros: window.micros(),
            limit: window.limit_nonzero(),
            remaining,
        }
    }

    /// The window.
    pub fn window(&self) -> Window {
        Window::from_parts(self.micros, self.limit)
    }
}

/// Window states kept inline: enough for a rule with a limit per second,
/// minute, hour, day and month.
const INLINE_WINDOWS: usize = 5;

/// The most windows the Redis store's straight-line scripts are made for:
/// a sliding log of more (or with route-wide windows) keeps its log in
/// another layout, under another key (see [`crate::rules::BudgetChange`]).
pub(crate) const STRAIGHT_MAX_WINDOWS: usize = 5;

/// The windows of a decision: inline up to [`INLINE_WINDOWS`] (no
/// allocation, and a [`Decision`] small enough to move in a few
/// instructions), on the heap beyond.
#[derive(Clone, Debug)]
enum States {
    Inline(ArrayVec<WindowState, INLINE_WINDOWS>),
    Heap(Box<[WindowState]>),
}

impl States {
    fn as_slice(&self) -> &[WindowState] {
        match self {
            States::Inline(states) => states,
            States::Heap(states) => states,
        }
    }

    fn collect(states: impl IntoIterator<Item = WindowState>) -> Self {
        let mut states = states.into_iter().take(2 * MAX_WINDOWS);
        let mut inline = ArrayVec::new();
        for state in states.by_ref() {
            if let Err(full) = inline.try_push(state) {
                let mut heap: Vec<WindowState> = inline.into_iter().collect();
                heap.push(full.element());
                heap.extend(states);
                return States::Heap(heap.into_boxed_slice());
            }
        }
        States::Inline(inline)
    }
}

impl PartialEq for States {
    fn eq(&self, other: &Self) -> bool {
        self.as_slice() == other.as_slice()
    }
}

impl Eq for States {}

/// "No wait" in [`Decision`]'s microsecond fields.
const NO_RETRY: u64 = u64::MAX;

/// The answer of a store to a [`Check`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Decision {
    allowed: bool,
    blocked: bool,
    /// Microseconds, [`NO_RETRY`] for none.
    retry_after: u64,
    /// Microseconds.
    reset_after: u64,
    windows: States,
}

impl Decision {
    /// A decision. `windows` (the user's, then the route-wide ones) beyond
    /// `2 * MAX_WINDOWS` are ignored; `reset_after` belongs to the
    /// [constraining](Self::constraining) window: the fewest remaining,
    /// and on a tie the shorter window, then the first (a store written
    /// for a version that took the longer on a tie must follow, or its
    /// headers would give one window's limit with another's reset).
    // (Inlined: every algorithm's one-window path makes its decision with
    // it, and a call per check shows in their instruction counts.)
    #[inline(always)]
    pub fn new(
        allowed: bool,
        retry_after: Option<Duration>,
        reset_after: Duration,
        windows: impl IntoIterator<Item = WindowState>,
    ) -> Self {
        let retry_after = match retry_after {
            Some(retry) if !allowed => crate::clock::duration_micros(retry).min(NO_RETRY - 1),
            _ => NO_RETRY,
        };
        Self {
            allowed,
            blocked: false,
            retry_after,
            reset_after: crate::clock::duration_micros(reset_after),
            windows: States::collect(windows),
        }
    }

    /// A denial because the user is blocked for `wait` more: each of
    /// `windows`, the user's (a route-wide budget, which a blocked
    /// request does not look at, is left out, not reported as spent),
    /// reports nothing remaining, and the block's end as its reset.
    pub fn new_blocked(wait: Duration, windows: impl IntoIterator<Item = Window>) -> Self {
        let mut decision = Self::new(
            false,
            Some(wait),
            wait,
            windows.into_iter().map(|w| WindowState::new(w, 0)),
        );
        decision.blocked = true;
        decision
    }

    /// Whether the request was denied by a block (`block_time`) rather than
    /// by a window.
    pub fn is_blocked(&self) -> bool {
        self.blocked
    }

    /// This decision, `elapsed` later: the waits shortened by it (a
    /// cached denial replayed).
    pub(crate) fn rewound(&self, elapsed: Duration) -> Decision {
        let elapsed = crate::clock::duration_micros(elapsed);
        let mut decision = self.clone();
        if decision.retry_after != NO_RETRY {
            decision.retry_after = self.retry_after.saturating_sub(elapsed);
        }
        decision.reset_after = self.reset_after.saturating_sub(elapsed);
        decision
    }

    /// Joins the decisions on a user's budget and on its route's budget
    /// (a check with a [`global`](Check::global) part): allowed only if
    /// both are; the longest wait; the user's windows, then the route's;
    /// the reset of the constraining window of all (see
    /// [`constraining`](Self::constraining)). A store
    /// decides both first without recording, and records in both only if
    /// both allow.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_ratelimit::{Decision, Window, WindowState};
    ///
    /// let user = WindowState::new(Window::new(Duration::from_secs(60), 10)?, 9);
    /// let route = WindowState::new(Window::new(Duration::from_secs(60), 100)?, 0);
    /// let wait = Some(Duration::from_secs(3));
    /// let joined = Decision::join(
    ///     Decision::new(true, None, Duration::from_secs(60), [user]),
    ///     Decision::new(false, wait, Duration::from_secs(3), [route]),
    /// );
    /// assert!(!joined.allowed());
    /// assert_eq!(joined.retry_after(), wait);
    /// assert_eq!(joined.windows(), [user, route]);
    /// # Ok::<(), tower_ratelimit::ConfigError>(())
    /// ```
    pub fn join(user: Decision, global: Decision) -> Decision {
        // (Each reset belongs to its own decision's constraining window:
        // the joined one's is the user's if that window wins over all.)
        let both = user.windows().iter().chain(global.windows());
        let first = constraining(both.map(|w| (w.remaining, w.window().micros())));
        let reset = match first {
            Some(i) if i < user.windows().len() => user.reset_after,
            _ => global.reset_after,
        };
        let retry = user
            .retry_after()
            .unwrap_or_default()
            .max(global.retry_after().unwrap_or_default());
        Decision::new(
            user.allowed && global.allowed,
            Some(retry),
            Duration::from_micros(reset),
            user.windows().iter().chain(global.windows()).copied(),
        )
    }

    /// Whether the request may pass.
    pub fn allowed(&self) -> bool {
        self.allowed
    }

    /// For a denied request, the exact time until it would be allowed (the
    /// largest wait among the windows that deny it); for a user blocked by
    /// a rule's block time, until the block ends; for a request that costs
    /// more than a window's limit and so never passes (see
    /// [`exceeds_limit`](Self::exceeds_limit)), the window's length.
    pub fn retry_after(&self) -> Option<Duration> {
        (self.retry_after != NO_RETRY).then(|| Duration::from_micros(self.retry_after))
    }

    /// Whether a request of `cost` can never pass under this decision's
    /// windows: it costs more than one of their limits. The stores then
    /// report the whole window as [`retry_after`](Self::retry_after); the
    /// layer sends no `Retry-After` for it (and a gRPC client a pushback of
    /// `-1`: do not retry).
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_ratelimit::{Decision, Window, WindowState};
    ///
    /// let minute = WindowState::new(Window::new(Duration::from_secs(60), 5)?, 5);
    /// let denied = Decision::new(false, Some(Duration::from_secs(60)), Duration::ZERO, [minute]);
    /// assert!(denied.exceeds_limit(6));
    /// assert!(!denied.exceeds_limit(5));
    /// # Ok::<(), tower_ratelimit::ConfigError>(())
    /// ```
    pub fn exceeds_limit(&self, cost: u32) -> bool {
        self.windows().iter().any(|w| cost > w.window().limit())
    }

    /// Time until the [constraining](Self::constraining) window frees its
    /// next slot. When that window is empty (a check of cost 0, or a
    /// denial that wrote nothing on a budget with nothing spent), it is zero for the sliding log and the token bucket, the time
    /// to the window's end for the fixed window, and the window's length
    /// for the sliding window.
    pub fn reset_after(&self) -> Duration {
        Duration::from_micros(self.reset_after)
    }

    /// Every window of the rule, shortest first, then those of its
    /// route-wide limit (if any), shortest first; a blocked decision's are
    /// the rule's alone (see [`new_blocked`](Self::new_blocked)).
    pub fn windows(&self) -> &[WindowState] {
        self.windows.as_slice()
    }

    /// The window with the fewest requests remaining (ties: the shorter
    /// window; then the user's before the route's): the one the
    /// `X-RateLimit-*` headers describe.
    pub fn constraining(&self) -> Option<&WindowState> {
        self.constraining_index()
            .and_then(|i| self.windows().get(i))
    }

    /// The index of the [constraining](Self::constraining) window in
    /// [`windows`](Self::windows).
    pub fn constraining_index(&self) -> Option<usize> {
        constraining(
            self.windows()
                .iter()
                .map(|w| (w.remaining, w.window().micros())),
        )
    }
}

/// The index of the window with the fewest remaining, of `(remaining,
/// length in microseconds)` pairs; ties go to the shorter window, then to
/// the first (the user's, listed before a route-wide one).
pub(crate) fn constraining(windows: impl IntoIterator<Item = (u32, u64)>) -> Option<usize> {
    windows
        .into_iter()
        .enumerate()
        .reduce(|best, w| {
            let ((r, d), (best_r, best_d)) = (w.1, best.1);
            if r < best_r || (r == best_r && d < best_d) {
                w
            } else {
                best
            }
        })
        .map(|(i, _)| i)
}

/// What went wrong in a store.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum StoreErrorKind {
    /// The store did not answer within its deadline.
    Timeout,
    /// The store could not be reached (connection refused, dropped, ...).
    Unavailable,
    /// The store answered with an error or an unexpected reply.
    Backend,
    /// The store was configured wrongly (bad URL, bad key prefix, ...).
    Config,
}

/// A store could not decide; the layer then applies its
/// [`FailMode`](crate::FailMode).
#[derive(Debug)]
pub struct StoreError {
    kind: StoreErrorKind,
    source: Option<Box<dyn StdError + Send + Sync>>,
}

impl StoreError {
    /// An error of `kind` caused by `source`.
    pub fn new(kind: StoreErrorKind, source: impl Into<Box<dyn StdError + Send + Sync>>) -> Self {
        Self {
            kind,
            source: Some(source.into()),
        }
    }

    /// A timeout.
    pub fn timeout() -> Self {
        Self {
            kind: StoreErrorKind::Timeout,
            source: None,
        }
    }

    /// What went wrong.
    pub fn kind(&self) -> StoreErrorKind {
        self.kind
    }
}

impl fmt::Display for StoreError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let what = match self.kind {
            StoreErrorKind::Timeout => "rate-limit store timed out",
            StoreErrorKind::Unavailable => "rate-limit store unavailable",
            StoreErrorKind::Backend => "rate-limit store failed",
            StoreErrorKind::Config => "invalid rate-limit store configuration",
        };
        match &self.source {
            // (Not "timed out: timed out", as redis-rs' timeouts say.)
            Some(source) if !what.ends_with(source.to_string().as_str()) => {
                write!(f, "{what}: {source}")
            }
            _ => f.write_str(what),
        }
    }
}

impl StdError for StoreError {
    fn source(&self) -> Option<&(dyn StdError + 'static)> {
        self.source
            .as_deref()
            .map(|e| e as &(dyn StdError + 'static))
    }
}

/// A change to a user's budget made outside a check: rate-limiter-flexible's
/// penalty and reward, applied by the layer after a response
/// ([`RateLimitLayer::adjust_on_response`](crate::RateLimitLayer::adjust_on_response))
/// or by hand with [`Store::adjust`].
///
/// An adjustment touches the user's budget only (a route-wide budget stays
/// as its checks left it), in every window of the check it is given, atomically,
/// and on the same clock as checks. It never blocks a user (a `block_time`
/// starts only when a check is denied).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Adjustment {
    /// Spends `n` more units in every window, whether or not they fit: the
    /// next requests are denied until the windows have room again, as if
    /// `n` more requests had been allowed now (a failed login that costs
    /// five attempts). A window takes at most its limit of them, and
    /// never holds more than twice its limit (a token bucket is never more
    /// than twice its size behind), so penalties that pile up hold a user
    /// back for a bounded time; a sliding log, whose windows share its
    /// entries, takes at most its largest limit of them, and at most
    /// [`MAX_LOG_COST`](crate::rules::MAX_LOG_COST) at once, and never holds
    /// more than twice that (each entry beyond a shorter window's limit
    /// adds a microsecond to that window's wait).
    Penalty(u32),
    /// Gives back up to `n` units spent in the windows (a request whose
    /// answer should not count, such as a server error): the newest
    /// entries of a sliding log, the current window's count of a fixed or
    /// sliding window, `n` tokens of a bucket (never more than it holds).
    ///
    /// Those are the refunded request's own units when the budget recorded
    /// nothing after it and no fixed window began since. The layer refunds
    /// as the request's answer leaves: a handler slow enough for the same
    /// user's other requests to pass meanwhile makes the refund give back
    /// one of theirs (or the new window's), and the budget may then let
    /// through up to `n` requests more than its limit within a window's
    /// span (never more than its limit plus the units refunded). A refund
    /// never takes a budget below empty.
    Refund(u32),
}

impl Adjustment {
    /// Whether it changes nothing (a penalty or a refund of 0).
    pub fn is_empty(self) -> bool {
        matches!(self, Adjustment::Penalty(0) | Adjustment::Refund(0))
    }
}

/// The future of [`Store::adjust`].
pub type AdjustFuture = std::pin::Pin<Box<dyn Future<Output = Result<(), StoreError>> + Send>>;

/// A place where budgets are kept and decided on atomically.
///
/// Implementations must decide each [`Check`] atomically over all its
/// windows: a request is allowed only if every window allows it, and a
/// denied request is recorded nowhere. The returned future must not borrow
/// the store (clone an `Arc` into it), so the layer can hold it across
/// awaits without boxing. Every window's remaining is reported exactly,
/// except where a check allows otherwise ([`Check::exact_windows`]).
///
/// The layer sets no deadline on a check: a store that may wait (on a
/// network) bounds its own, answering [`StoreErrorKind::Timeout`] when it
/// passes (the Redis store's is
/// `RedisStoreBuilder::timeout`),
/// or a stalled store holds its requests. The future may be dropped at
/// any await (the client went away): a check must be safe to cancel.
///
/// Every field of a check is part of the question, and a store must honour
/// each, or refuse the check with a [`StoreErrorKind::Config`] error (then
/// the layer's [`FailMode`](crate::FailMode) applies) rather than decide
/// a smaller question:
///
/// - [`budget`](Check::budget), [`windows`](Check::windows) (shortest
///   first, each length once; refused otherwise, see
///   [`CheckRef::supported`]) and [`cost`](Check::cost): allowed only if every window has
///   room for `cost` more; recorded in all of them, or in none.
/// - [`algorithm`](Check::algorithm): how the windows count. A store that
///   keeps one algorithm refuses the others.
/// - [`global`](Check::global): a route-wide budget that every user of
///   the route shares. Allowed only if both the user's windows and the
///   route's allow; recorded in both or neither. The decision's windows
///   are the user's, then the route's (a blocked user's: the user's
///   alone, [`Decision::new_blocked`]); [`Decision::join`] makes that
///   decision from the two. The route's budget is its own even when
///   spelled as a user's.
/// - [`block`](Check::block): a request the user's own windows deny
///   blocks the user's budget for this long (at a cost of 0 or 1, for the
///   request's own wait if that is longer), and is answered with the longer
///   of the two; a blocked budget is denied without being looked at
///   ([`Decision::new_blocked`]). The block is the budget's whatever the
///   algorithm: a check of another algorithm with a block time on that
///   budget is blocked too.
/// - [`now`](Check::now): the time to decide at (an injected clock), else
///   the store's own clock.
/// - [`exact_windows`](Check::exact_windows): when `false`, a window that
///   cannot deny may report an approximate remaining.
///
/// New fields of [`Check`] (it is `#[non_exhaustive]`) come with a minor
/// version, default to what changes nothing for the checks a store
/// already decides, and are listed here.
pub trait Store: Send + Sync + 'static {
    /// The future of one check.
    type Future: Future<Output = Result<Decision, StoreError>> + Send + 'static;

    /// Decides on `check`, and records it when allowed. (A check without
    /// windows limits nothing: the built-in stores allow it, with no
    /// window in the decision, and change nothing.)
    fn check(&self, check: Check) -> Self::Future;

    /// Decides at once, when the store can (the memory store can): the
    /// layer then answers without holding the request, and without making
    /// an owned [`Check`]. The default, `None`, means "call
    /// [`check`](Self::check)".
    fn check_now(&self, check: &CheckRef<'_>) -> Option<Result<Decision, StoreError>> {
        let _ = check;
        None
    }

    /// Whether [`check_now`](Self::check_now) always answers, and never
    /// with an error for a check the layer makes (the memory store's does:
    /// it refuses only checks no rule table builds, such as more windows
    /// than a rule may have). The layer then asks it
    /// first, without reading its denial cache (which only spares waits)
    /// or its fallback state (which only spares a store that is down):
    /// less memory touched per request. The default, `false`, keeps the
    /// order a store that may wait or fail needs: a cached denial, then
    /// the fallback store while the store is down, then the store.
    fn always_decides_at_once(&self) -> bool {
        false
    }

    /// The part of the store that decides `check`, for
    /// [`FailMode::Fallback`](crate::FailMode::Fallback): a failure that
    /// makes the layer skip the store for a while skips only the failed
    /// check's part, and the checks of the other parts are still asked.
    /// Parts are told apart by this number modulo 64. The default, 0, makes
    /// the whole store one part; the Redis store on a Cluster (its own
    /// client or a caller's pool) answers by the master that serves the
    /// check's slot, so that
    /// one master that hangs sends only its own budgets to the in-process
    /// store.
    ///
    /// The layer asks only while some part is skipped, so a store may take
    /// its time here (a lookup, an allocation). A part is skipped when a
    /// check of it failed after a wait, whichever node the check went to
    /// (a Cluster client that still sends a promoted replica's slots to
    /// the master that hangs: the part is unreachable, for this store),
    /// until a probe is answered, or until no check has asked for it in
    /// 2 s (a part that is gone).
    fn failure_domain(&self, check: &CheckRef<'_>) -> u32 {
        let _ = check;
        0
    }

    /// What part `domain` of [`failure_domain`](Self::failure_domain) is,
    /// for the layer's log lines when it goes down and comes back (the
    /// Redis store on a Cluster: `redis cluster master 10.0.0.7:6379`).
    /// The default, `None`, leaves the part's number alone.
    fn failure_domain_name(&self, domain: u32) -> Option<String> {
        let _ = domain;
        None
    }

    /// Applies `adjustment` to the user's budget of `check` (its budget,
    /// windows and algorithm, and the shape that picks where a store keeps
    /// them: give it the check the requests of that budget make; its cost
    /// is not read: a store of your own that validates the check with
    /// [`CheckRef::supported`] should do so at cost 1). An adjustment of 0, or of a check without windows,
    /// changes nothing. The built-in stores implement it; the default
    /// answers a [`StoreErrorKind::Config`] error.
    ///
    /// ```
    /// use std::time::Duration;
    /// use futures_util::FutureExt;
    /// use tower_ratelimit::{Adjustment, Check, MemoryStore, Store, Window};
    ///
    /// let store = MemoryStore::new();
    /// let check = Check::new("r1:alice", [Window::new(Duration::from_secs(60), 5)?]);
    /// // Five failed logins' worth of penalty fill the window...
    /// store.adjust(check.clone(), Adjustment::Penalty(5)).now_or_never().unwrap()?;
    /// let first = store.check(check.clone()).now_or_never().unwrap()?;
    /// assert!(!first.allowed());
    /// // ...and a refund gives two back.
    /// store.adjust(check.clone(), Adjustment::Refund(2)).now_or_never().unwrap()?;
    /// let second = store.check(check).now_or_never().unwrap()?;
    /// assert!(second.allowed());
    /// assert_eq!(second.windows()[0].remaining, 1);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    fn adjust(&self, check: Check, adjustment: Adjustment) -> AdjustFuture {
        let _ = (check, adjustment);
        Box::pin(std::future::ready(Err(StoreError::new(
            StoreErrorKind::Config,
            "this store does not take adjustments",
        ))))
    }
}

impl<S: Store> Store for Arc<S> {
    type Future = S::Future;

    fn check(&self, check: Check) -> Self::Future {
        (**self).check(check)
    }

    fn check_now(&self, check: &CheckRef<'_>) -> Option<Result<Decision, StoreError>> {
        (**self).check_now(check)
    }

    fn always_decides_at_once(&self) -> bool {
        (**self).always_decides_at_once()
    }

    fn failure_domain(&self, check: &CheckRef<'_>) -> u32 {
        (**self).failure_domain(check)
    }

    fn failure_domain_name(&self, domain: u32) -> Option<String> {
        (**self).failure_domain_name(domain)
    }

    fn adjust(&self, check: Check, adjustment: Adjustment) -> AdjustFuture {
        (**self).adjust(check, adjustment)
    }
}

#[cfg(test)]
mod tests {
    use super::{StoreError, StoreErrorKind};

    #[test]
    fn an_error_says_its_kind_and_its_source_once() {
        let timed_out = StoreError::new(StoreErrorKind::Timeout, "timed out");
        assert_eq!(timed_out.to_string(), "rate-limit store timed out");
        assert_eq!(StoreError::timeout().to_string(), timed_out.to_string());
        let refused = StoreError::new(StoreErrorKind::Unavailable, "connection refused");
        assert_eq!(
            refused.to_string(),
            "rate-limit store unavailable: connection refused"
        );
    }
}
