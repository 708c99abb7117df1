//! The rule table: which requests are limited, for whom, and how much.
//!
//! A table is an ordered list of routes. Each route is a regular expression
//! over the request path and a list of [`Rule`]s, one per user group (and
//! optionally per method). A rule holds limits per window; a rule without
//! any window leaves its group unlimited.
//!
//! A request is limited by the **first** route whose pattern matches its
//! path **and** that has a rule for the request's group and method. A
//! table of plain `^/prefix` patterns is matched by comparing prefixes;
//! any other is matched in one pass of a regex set that finds every route
//! whose pattern matches anywhere in the path, as each pattern alone would.
//! A path with a percent-encoded byte is matched as it was sent and as
//! [`decode_path`] decodes it, so `/users/%61dmin` cannot escape a limit on
//! `/users/admin` (an exclusion then applies only when both match). A
//! request target that is no path (`OPTIONS *`, `CONNECT host:443`) is
//! matched as `/`.
//!
//! ```
//! use std::time::Duration;
//! use tower_ratelimit::{Rule, Rules};
//!
//! let rules = Rules::builder()
//!     .route(r"^/towns", [Rule::group("default").second(1), Rule::group("admin")])
//!     .route(r"^/multiple", [Rule::new().second(5).minute(100).hour(1000)])
//!     .route(r"^/upload", [Rule::new().per(Duration::from_secs(10), 5)])
//!     .build()?;
//! assert_eq!(rules.len(), 3);
//! # Ok::<(), tower_ratelimit::ConfigError>(())
//! ```
//!
//! The same table in TOML (see [`Config`]):
//!
//! ```toml
//! [[routes]]
//! path = "^/towns"
//! rules = [{ group = "default", second = 1 }, { group = "admin" }]
//! ```

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::fmt;
use std::num::NonZeroU32;
use std::sync::Arc;
use std::time::Duration;

use http::{HeaderName, HeaderValue, Method};
use regex::RegexSet;
use regex_automata::{Input, PatternSet};
use serde::Deserialize;

use crate::clock::duration_micros;
use crate::error::{
    shown, ConfigError, ConfigErrorKind, ConfigWarning, ConfigWarningKind, Location,
};
use crate::key;

mod changes;
pub use changes::{BudgetChange, BudgetChangeKind, ChangedOn};

/// The most windows one rule may have.
pub const MAX_WINDOWS: usize = 8;

/// The most a sliding log's window may allow: the log keeps an entry per
/// request (per unit of cost) for as long as its longest window, so a
/// budget of this many requests may hold this many entries (8 bytes each on
/// Redis), and one check may write as many as its cost. Larger budgets,
/// such as bytes, want the sliding window or the token bucket, which keep a
/// few numbers whatever the limit and the cost.
pub const MAX_LOG_LIMIT: u32 = 1_000_000;

/// The most one request may cost on a sliding log, and the most one
/// penalty adds to it: each unit is an entry the store writes, so a single
/// request of a cost a client chose (a size header) could otherwise make
/// Redis write megabytes in one script call and stall everyone else's
/// (about 0.2–0.3 µs of Redis per entry: this many take about 0.2–0.3 ms). A
/// costlier request is answered as one that costs more than its limit (a
/// 429 without `Retry-After`, nothing written); budgets of bytes want the
/// sliding window or the token bucket, whose work does not grow with the
/// cost.
pub const MAX_LOG_COST: u32 = 1_000;

/// The cost a check carries for a request of `cost` under `algorithm`: a
/// sliding-log request beyond [`MAX_LOG_COST`] is sent as costing more than
/// any limit, which every store refuses without writing.
pub(crate) fn checked_cost(algorithm: Algorithm, cost: u32) -> u32 {
    match algorithm {
        Algorithm::SlidingLog if cost > MAX_LOG_COST => u32::MAX,
        _ => cost,
    }
}

/// The group of a rule that does not name one, and of identities that do not
/// say theirs.
pub const DEFAULT_GROUP: &str = "default";

const MAX_WINDOW: Duration = Duration::from_secs(10 * 366 * 24 * 3600);

/// One limit: at most `limit` requests in any span of `duration`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Window {
    micros: u64,
    limit: NonZeroU32,
}

impl Window {
    /// A window of `limit` requests per `duration`.
    ///
    /// Errors when `limit` is zero or `duration` is shorter than a millisecond
    /// or longer than ten years.
    pub fn new(duration: Duration, limit: u32) -> Result<Self, ConfigError> {
        Self::validate(duration, i64::from(limit))
            .map_err(|kind| ConfigError::new(Location::default(), kind))
    }

    fn validate(duration: Duration, limit: i64) -> Result<Self, ConfigErrorKind> {
        let limit = u32::try_from(limit)
            .ok()
            .and_then(NonZeroU32::new)
            .ok_or(ConfigErrorKind::InvalidLimit(limit))?;
        if duration < Duration::from_millis(1) || duration > MAX_WINDOW {
            return Err(ConfigErrorKind::InvalidDuration);
        }
        Ok(Self {
            micros: duration_micros(duration),
            limit,
        })
    }

    /// The span of the window.
    pub fn duration(&self) -> Duration {
        Duration::from_micros(self.micros)
    }

    /// The span of the window in microseconds.
    pub fn micros(&self) -> u64 {
        self.micros
    }

    /// How many requests the window allows.
    pub fn limit(&self) -> u32 {
        self.limit.get()
    }

    pub(crate) fn limit_nonzero(&self) -> NonZeroU32 {
        self.limit
    }

    /// A window from parts already validated (a [`WindowState`]'s).
    ///
    /// [`WindowState`]: crate::store::WindowState
    pub(crate) fn from_parts(micros: u64, limit: NonZeroU32) -> Self {
        Self { micros, limit }
    }
}

/// How a rule counts requests.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Deserialize)]
#[serde(rename_all = "kebab-case")]
#[non_exhaustive]
pub enum Algorithm {
    /// An exact sliding window: one timestamp per allowed request, so at any
    /// instant at most `limit` requests were allowed in the last `window`.
    /// Memory grows with the limit (one entry per allowed request).
    #[default]
    SlidingLog,
    /// The sliding window counter: the current fixed window's count plus the
    /// previous one's, weighted by how much of it the sliding window still
    /// covers. O(1) per window. It assumes the previous window's requests
    /// were spread evenly: under uniform traffic it is close to exact; in the
    /// worst case (a whole limit spent at the very end of one window) a
    /// sliding span of one window can see up to 2× the limit.
    SlidingWindow,
    /// Fixed windows aligned on the Unix epoch (a minute window resets at
    /// every whole minute). O(1). A client can spend a whole limit at the
    /// end of one window and again at the start of the next: up to 2× the
    /// limit within one window length around a boundary.
    FixedWindow,
    /// A token bucket, as GCRA: a window of `n` per `w` is a bucket of `n`
    /// tokens refilled one every `ceil(w / n)`. O(1) (one timestamp per
    /// window). Allows bursts of up to `n`, then an even rate; the retry time
    /// is exact.
    TokenBucket,
}

impl Algorithm {
    /// Every algorithm (the order in which the Redis store keeps their
    /// scripts).
    pub(crate) const ALL: [Algorithm; 4] = [
        Algorithm::SlidingLog,
        Algorithm::SlidingWindow,
        Algorithm::FixedWindow,
        Algorithm::TokenBucket,
    ];

    /// The name used in configuration files (`sliding-log`, ...).
    pub fn as_str(&self) -> &'static str {
        match self {
            Algorithm::SlidingLog => "sliding-log",
            Algorithm::SlidingWindow => "sliding-window",
            Algorithm::FixedWindow => "fixed-window",
            Algorithm::TokenBucket => "token-bucket",
        }
    }
}

/// Limits for one user group (and optionally one method) of a route.
///
/// Build with [`Rule::new`] (group `"default"`) or [`Rule::group`], then add
/// windows. Limits are validated when the table is built, so the builder
/// itself never fails.
#[derive(Clone, Debug, PartialEq, Eq)]
#[must_use]
pub struct Rule {
    group: String,
    method: Option<String>,
    zone: Option<String>,
    algorithm: Algorithm,
    block_time: Option<Duration>,
    /// What one request costs (1 when not set; a config file's negative
    /// or too large cost is kept as read, and refused at build).
    cost: Option<i64>,
    /// (Field name, duration, limit; no duration: a config window that
    /// gave both or neither of `seconds` and `millis`.)
    windows: Vec<(String, Option<Duration>, i64)>,
    /// The first item of a [`limits`](Self::limits) text that could not be
    /// read: its field, and why.
    notation_error: Option<(String, String)>,
    /// Why a configuration file's `block_time` could not be read.
    block_time_error: Option<String>,
}

impl Default for Rule {
    fn default() -> Self {
        Self::new()
    }
}

impl Rule {
    /// A rule for the `"default"` group, with no limits yet.
    pub fn new() -> Self {
        Self::group(DEFAULT_GROUP)
    }

    /// A rule for the group `name`, with no limits yet.
    pub fn group(name: impl Into<String>) -> Self {
        Self {
            group: name.into(),
            method: None,
            zone: None,
            algorithm: Algorithm::default(),
            block_time: None,
            cost: None,
            windows: Vec::new(),
            notation_error: None,
            block_time_error: None,
        }
    }

    /// Applies the rule only to requests with this method (e.g. `"POST"`).
    /// A `GET` rule also limits `HEAD` requests, on the same budget (so a
    /// later `HEAD` rule for the same group could never apply, and is a
    /// build error). The rule has a budget of its own, unless it names a
    /// [zone](Self::zone).
    pub fn method(mut self, method: impl AsRef<str>) -> Self {
        self.method = Some(method.as_ref().to_ascii_uppercase());
        self
    }

    /// Shares one budget between every route whose rule names this zone.
    /// The zone's rules must count alike (one algorithm, the same window
    /// lengths; their limits may differ), and a route with a route-wide
    /// limit takes no zone: both are build errors.
    pub fn zone(mut self, zone: impl Into<String>) -> Self {
        self.zone = Some(zone.into());
        self
    }

    /// How requests are counted.
    pub fn algorithm(mut self, algorithm: Algorithm) -> Self {
        self.algorithm = algorithm;
        self
    }

    /// Blocks a user who exceeds this rule for `duration`: every request of
    /// theirs under this rule's budget is denied until it ends (set
    /// atomically with the denial; `Retry-After` and the headers report the
    /// block). The block is on the rule's budget and holds the rules on it
    /// that also have a block time: in a [zone](Self::zone), every route
    /// whose rule has one; a rule of another method has a budget of its
    /// own, which the block does not hold. In shadow mode no block is set.
    /// From 1 ms to ten years, on a rule with windows (else a build error).
    pub fn block_time(mut self, duration: Duration) -> Self {
        self.block_time = Some(duration);
        self.block_time_error = None;
        self
    }

    /// What each request this rule limits costs: `n` units of every window
    /// instead of 1 (0: free, counted by nothing). With rules per method,
    /// one route's writes may cost more than its reads
    /// (`Rule::new().method("POST").minute(100).cost(5)`). A cost above a
    /// window's limit, which no request could ever pass, is a build error,
    /// as is one above [`MAX_LOG_COST`] on a sliding log. The layer's
    /// [`cost`](crate::RateLimitLayer::cost) function, when it has one,
    /// decides instead (it sees the request's head: a body-size header,
    /// say).
    pub fn cost(mut self, n: u32) -> Self {
        self.cost = Some(i64::from(n));
        self
    }

    fn named(mut self, name: &str, seconds: u64, limit: u32) -> Self {
        self.windows.push((
            name.to_owned(),
            Some(Duration::from_secs(seconds)),
            i64::from(limit),
        ));
        self
    }

    /// At most `limit` requests per second. As every window's: a limit of
    /// 0 is a build error, as is a second window of the same length in the
    /// rule, and a sliding log counts at most
    /// [`MAX_LOG_LIMIT`] a window (a token bucket one a microsecond).
    pub fn second(self, limit: u32) -> Self {
        self.named("second", 1, limit)
    }

    /// At most `limit` requests per minute.
    pub fn minute(self, limit: u32) -> Self {
        self.named("minute", 60, limit)
    }

    /// At most `limit` requests per hour.
    pub fn hour(self, limit: u32) -> Self {
        self.named("hour", 3600, limit)
    }

    /// At most `limit` requests per day.
    pub fn day(self, limit: u32) -> Self {
        self.named("day", 86_400, limit)
    }

    /// At most `limit` requests per month (30 days).
    pub fn month(self, limit: u32) -> Self {
        self.named("month", 30 * 86_400, limit)
    }

    /// At most `limit` requests per `duration` (e.g. 5 per 10 seconds).
    pub fn per(mut self, duration: Duration, limit: u32) -> Self {
        let name = format!("windows[{}]", self.windows.len());
        self.windows.push((name, Some(duration), i64::from(limit)));
        self
    }

    /// Adds the windows of a limit text, as Flask-Limiter writes them:
    /// items such as `10/second`, `100 per minute` or `5/10 seconds`,
    /// separated by `;`, `,` or `|` (one may end the text; two in a row
    /// are an error). Units: `millisecond`, `second`,
    /// `minute`, `hour`, `day`, `month` (30 days) and `year` (365 days;
    /// Flask-Limiter's is 360),
    /// singular or plural, any case (also `ms`, `s`, `sec`, `min`, `h`,
    /// `hr`, `d`). Like every limit, the text is checked when the table is
    /// built: an item that cannot be read fails the build, naming it.
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_ratelimit::{Rule, Rules};
    ///
    /// let rules = Rules::builder()
    ///     .route("^/api", [Rule::new().limits("10/second; 500 per hour")])
    ///     .route("^/upload", [Rule::new().limits("5/10 seconds")])
    ///     .build()?;
    /// assert_eq!(rules.len(), 2);
    ///
    /// let err = Rules::builder()
    ///     .route("^/api", [Rule::new().limits("10/second; 100/fortnight")])
    ///     .build()
    ///     .unwrap_err();
    /// assert_eq!(err.field(), Some("limits[1]"));
    /// assert!(err.to_string().contains("`100/fortnight`"));
    /// # Ok::<(), tower_ratelimit::ConfigError>(())
    /// ```
    pub fn limits(mut self, text: impl AsRef<str>) -> Self {
        self.add_limits(text.as_ref());
        self
    }

    fn add_limits(&mut self, text: &str) {
        if self.notation_error.is_some() {
            return;
        }
        let mut items: Vec<&str> = text.split([';', ',', '|']).map(str::trim).collect();
        // (One separator may end the text; an empty item elsewhere, `;;`
        // or a separator first, is a typo, most likely of a limit left
        // out.)
        if items.len() > 1 && items.last() == Some(&"") {
            items.pop();
        }
        if items.len() > 1 {
            if let Some(i) = items.iter().position(|item| item.is_empty()) {
                let why = match i {
                    0 => "it starts with a separator",
                    _ => "two separators in a row",
                };
                self.notation_error = Some((
                    format!("limits[{i}]"),
                    format!(
                        "{} has an empty item ({why}: a limit left out?)",
                        shown(text)
                    ),
                ));
                return;
            }
        }
        items.retain(|item| !item.is_empty());
        if items.is_empty() {
            self.notation_error = Some((
                "limits".to_owned(),
                format!(
                    "{} holds no limit (leave `limits` out for a rule without limits)",
                    shown(text)
                ),
            ));
            return;
        }
        // (Numbered on from an earlier call's items.)
        let before = self
            .windows
            .iter()
            .filter(|(name, ..)| name.starts_with("limits["))
            .count();
        for (i, item) in items.into_iter().enumerate() {
            let name = format!("limits[{}]", before + i);
            match parse_limit(item) {
                Ok((duration, limit)) => self.windows.push((name, Some(duration), limit)),
                Err(why) => {
                    self.notation_error =
                        Some((name, format!("cannot read {}: {why}", shown(item))));
                    return;
                }
            }
        }
    }

    fn push_raw(&mut self, name: String, duration: Option<Duration>, limit: i64) {
        self.windows.push((name, duration, limit));
    }

    /// The validated windows, shortest first.
    fn compile_windows(
        &self,
        fail: impl Fn(Option<&str>, ConfigErrorKind) -> ConfigError,
    ) -> Result<Vec<Window>, ConfigError> {
        if let Some((field, why)) = &self.notation_error {
            return Err(fail(Some(field), ConfigErrorKind::LimitText(why.clone())));
        }
        // (Named by the first window past the most a rule may have.)
        if let Some((name, _, _)) = self.windows.get(MAX_WINDOWS) {
            return Err(fail(Some(name), ConfigErrorKind::TooManyWindows));
        }
        let mut windows: Vec<Window> = Vec::with_capacity(self.windows.len());
        for (name, duration, limit) in &self.windows {
            let duration =
                duration.ok_or_else(|| fail(Some(name), ConfigErrorKind::WindowLength))?;
            let window =
                Window::validate(duration, *limit).map_err(|kind| fail(Some(name), kind))?;
            if windows.iter().any(|w| w.micros == window.micros) {
                return Err(fail(Some(name), ConfigErrorKind::DuplicateWindow));
            }
            windows.push(window);
        }
        windows.sort_by_key(|w| w.micros);
        Ok(windows)
    }
}

/// One item of a limit text (`10/second`, `100 per minute`,
/// `5/10 seconds`): its window's length and limit. The limit is returned
/// as written (a zero or negative one is reported by the window's check,
/// as for every other limit).
fn parse_limit(item: &str) -> Result<(Duration, i64), String> {
    let lower = item.to_ascii_lowercase();
    let (count, rest) = match lower.split_once('/') {
        Some((count, rest)) => (count, rest),
        None => lower
            .split_once(" per ")
            .ok_or("expected `<limit>/<unit>` or `<limit> per <unit>`, like `10/second`")?,
    };
    let count = count.trim();
    if count.starts_with('+') {
        return Err(format!("{} is not a whole number", shown(count)));
    }
    let digits_only = |text: &str| {
        let text = text.strip_prefix(['-', '+']).unwrap_or(text);
        !text.is_empty() && text.bytes().all(|b| b.is_ascii_digit())
    };
    let limit: i64 = count.parse().map_err(|_| {
        if digits_only(count) {
            // (Out of range: the window's check names the limits allowed.)
            format!("limit {} is too large (at most {})", shown(count), u32::MAX)
        } else {
            format!("{} is not a whole number", shown(count))
        }
    })?;
    let rest = rest.trim();
    // An optional multiple of the unit: `5/10 seconds`, `5/10seconds`.
    let digits = rest.len() - rest.trim_start_matches(|c: char| c.is_ascii_digit()).len();
    let (times, unit) = rest.split_at(digits);
    if unit.starts_with(['.', ',']) {
        let number: String = rest
            .chars()
            .take_while(|c| c.is_ascii_digit() || matches!(c, '.' | ','))
            .collect();
        // (The same length in milliseconds, when it is a whole number of
        // them: `1.5 seconds` is `1500 ms`.)
        let ms = unit_ms(rest[number.len()..].trim())
            .and_then(|unit| decimal_times(&number, unit))
            .filter(|ms| *ms >= 1);
        return Err(match ms {
            Some(ms) => format!(
                "{} is not a whole number of units (write `{ms} ms`)",
                shown(&number)
            ),
            None => format!(
                "{} is not a whole number of units, nor of milliseconds, the shortest a window counts",
                shown(&number)
            ),
        });
    }
    let times: u64 = match times {
        "" => 1,
        n => n.parse().ok().filter(|&n| n > 0).ok_or_else(|| {
            if n.trim_start_matches('0').is_empty() {
                format!("`{n}` is not a length of window (from 1)")
            } else {
                format!("`{n}` units are longer than any window (at most 10 years)")
            }
        })?,
    };
    let unit = unit.trim();
    let unit_ms = unit_ms(unit).ok_or_else(|| {
        format!(
            "unknown unit {} (expected millisecond, second, minute, hour, day, month or year)",
            shown(unit)
        )
    })?;
    // (Past the longest window: the window's check reports it.)
    let duration = Duration::from_millis(times.saturating_mul(unit_ms));
    Ok((duration, limit))
}

/// `number` (digits, one `.` or `,`, more digits) times `unit`, exactly,
/// if that is a whole number (and not absurdly large).
fn decimal_times(number: &str, unit: u64) -> Option<u64> {
    let (whole, fraction) = number.split_once(['.', ',']).unwrap_or((number, ""));
    if fraction.len() > 18
        || !fraction
            .bytes()
            .chain(whole.bytes())
            .all(|b| b.is_ascii_digit())
    {
        return None;
    }
    let scale = 10u128.pow(u32::try_from(fraction.len()).ok()?);
    let digits = format!("{whole}{fraction}");
    let scaled: u128 = if digits.is_empty() {
        0
    } else {
        digits.parse().ok()?
    };
    let product = scaled.checked_mul(u128::from(unit))?;
    (product % scale == 0)
        .then(|| u64::try_from(product / scale).ok())
        .flatten()
}

/// A unit of a limit text, in milliseconds.
fn unit_ms(unit: &str) -> Option<u64> {
    Some(match unit {
        "ms" | "millisecond" | "milliseconds" => 1,
        "s" | "sec" | "second" | "seconds" => 1_000,
        "min" | "minute" | "minutes" => 60_000,
        "h" | "hr" | "hour" | "hours" => 3_600_000,
        "d" | "day" | "days" => 86_400_000,
        "month" | "months" => 30 * 86_400_000,
        "year" | "years" => 365 * 86_400_000,
        _ => return None,
    })
}

/// One route: a path pattern, its rules, and optionally a route-wide limit
/// shared by all its users.
///
/// ```
/// use tower_ratelimit::{Route, Rule, Rules};
///
/// let rules = Rules::builder()
///     .add_route(
///         Route::new("^/search")
///             .rules([Rule::new().second(5).block_time(std::time::Duration::from_secs(60))])
///             // The search backend takes 100/s in total, whoever asks.
///             .global(Rule::new().second(100)),
///     )
///     .build()?;
/// # Ok::<(), tower_ratelimit::ConfigError>(())
/// ```
#[derive(Clone, Debug)]
#[must_use]
pub struct Route {
    pattern: String,
    rules: Vec<Rule>,
    global: Option<Rule>,
    shadow: bool,
}

impl Route {
    /// A route over paths matching `pattern` (a regular expression; a
    /// percent-encoded path is matched decoded too, see [`decode_path`]).
    pub fn new(pattern: impl Into<String>) -> Self {
        Self {
            pattern: pattern.into(),
            rules: Vec::new(),
            global: None,
            shadow: false,
        }
    }

    /// Adds rules (one per group, optionally per method).
    pub fn rules(mut self, rules: impl IntoIterator<Item = Rule>) -> Self {
        self.rules.extend(rules);
        self
    }

    /// A route-wide budget: the windows of `limits` (only its windows are
    /// read: a group is ignored, and an algorithm other than the default,
    /// a block time, a method or a zone is a build error) are shared by every user of the route, and checked atomically with
    /// each user's own windows in the same store call. A request passes only
    /// if both allow it; a denied one consumes neither. Groups whose rule
    /// has no windows stay unlimited.
    ///
    /// On Redis Cluster every key of such a route lives in one slot (the
    /// route's): the route-wide budget is one hot key by nature. (Not the
    /// identity [`Global`](crate::identity::Global), which makes every
    /// request one user, and so has no per-user windows.)
    pub fn global(mut self, limits: Rule) -> Self {
        self.global = Some(limits);
        self
    }

    /// Shadow mode for this route: decide, log and set headers, but never
    /// deny (to roll out new limits safely); its rules' block times set no
    /// block.
    pub fn shadow(mut self, shadow: bool) -> Self {
        self.shadow = shadow;
        self
    }
}

/// The route-wide part of a policy.
#[derive(Clone, Debug)]
pub(crate) struct GlobalPolicy {
    /// `<route id>:*`
    pub(crate) budget: Arc<str>,
    pub(crate) windows: Arc<[Window]>,
}

/// The compiled limits of one rule: what one store check needs, and what
/// its responses say.
#[derive(Clone, Debug)]
pub(crate) struct Policy {
    /// Unique in the process: tells apart policies that share a budget key
    /// (a zone's rules, a route's groups), whose limits and block times may
    /// differ (the denial cache serves a denial only to its own policy).
    pub(crate) id: u64,
    /// The policy part of every budget key of this rule (see [`crate::key`]).
    pub(crate) budget: Box<str>,
    /// Whether another policy spends the same budget keys with a higher
    /// limit (a zone's rule on another route, another group counting
    /// alike): it may be allowed, on any replica, while this one denies, and
    /// lengthen the wait, so this policy's denials are not cached (but
    /// blocks).
    pub(crate) shared: bool,
    /// Sorted by duration, shortest first.
    pub(crate) windows: Arc<[Window]>,
    pub(crate) algorithm: Algorithm,
    pub(crate) global: Option<GlobalPolicy>,
    pub(crate) block: Option<Duration>,
    /// What a request costs ([`Rule::cost`]; 1 by default), unless the
    /// layer's cost function says.
    pub(crate) cost: u32,
    /// The route's own `shadow`.
    pub(crate) shadow: bool,
    /// The table's `shadow` and `headers`: the defaults of a layer that
    /// does not set its own (read per request, so that a table swapped in
    /// a [`ReloadableRules`](crate::ReloadableRules) brings its own).
    pub(crate) table_shadow: bool,
    pub(crate) headers: HeaderMode,
    /// Whether the table lets the layer cache its denials
    /// ([`RulesBuilder::denial_cache`]).
    pub(crate) denial_cache: bool,
    /// The route's pattern, for logs.
    pub(crate) route: Arc<str>,
    /// The gate of this rule's shadow-mode `info` lines (see
    /// [`crate::layer::shadow_denied`]).
    pub(crate) shadow_log: Arc<crate::layer::Gate>,
    /// `RateLimit-Policy` (draft-ietf-httpapi-ratelimit-headers-10): one
    /// item per window, computed once.
    pub(crate) ietf_policy: Option<HeaderValue>,
    /// `X-RateLimit-Limit` of each window (the user's, then the route's).
    pub(crate) limits: Box<[&'static str]>,
    /// [`HeaderMode::XWindows`]' names of each window's limit and remaining
    /// headers (the user's, then the route's).
    pub(crate) window_headers: Box<[Option<(HeaderName, HeaderName)>]>,
}

/// How a policy counts its budget: its algorithm and window lengths. Rules
/// sharing a budget must agree on it (their limits may differ).
type Shape = (Algorithm, Vec<u64>);

impl Policy {
    fn shape(&self) -> Shape {
        (
            self.algorithm,
            self.windows.iter().map(Window::micros).collect(),
        )
    }
}

/// The name of a window in the IETF headers: `60s`, `250ms`; route-wide
/// windows are prefixed `route-`.
pub(crate) fn ietf_name(window: &Window, index: usize, user_windows: usize) -> String {
    scoped(span_name(window), index, user_windows)
}

/// A window's length as a name: `60s`, `250ms`, and `1500us` for one
/// that is not whole milliseconds (a `Window` made by hand), so that two
/// windows of a rule never share a name.
fn span_name(window: &Window) -> String {
    let micros = window.micros();
    if micros.is_multiple_of(1_000_000) {
        format!("{}s", micros / 1_000_000)
    } else if micros.is_multiple_of(1_000) {
        format!("{}ms", micros / 1_000)
    } else {
        format!("{micros}us")
    }
}

/// `name` of the `index`-th window of a decision, prefixed `route-` for a
/// route-wide one (after the `user_windows` of the user).
fn scoped(name: String, index: usize, user_windows: usize) -> String {
    if index < user_windows {
        name
    } else {
        format!("route-{name}")
    }
}

/// [`HeaderMode::XWindows`]' header names of each window: the user's
/// windows, then the route's, one entry each (so that indexes stay those
/// of the decision's windows).
fn window_headers(
    windows: &[Window],
    global: &[Window],
) -> Box<[Option<(HeaderName, HeaderName)>]> {
    windows
        .iter()
        .chain(global)
        .enumerate()
        .map(|(i, w)| {
            let span = match w.micros() {
                1_000_000 => "second".to_owned(),
                60_000_000 => "minute".to_owned(),
                3_600_000_000 => "hour".to_owned(),
                86_400_000_000 => "day".to_owned(),
                2_592_000_000_000 => "month".to_owned(),
                31_536_000_000_000 => "year".to_owned(),
                _ => span_name(w),
            };
            let span = scoped(span, i, windows.len());
            // (Always valid: lowercase letters, digits and dashes.)
            let limit = HeaderName::from_bytes(format!("x-ratelimit-limit-{span}").as_bytes());
            let remaining =
                HeaderName::from_bytes(format!("x-ratelimit-remaining-{span}").as_bytes());
            Some((limit.ok()?, remaining.ok()?))
        })
        .collect()
}

fn ietf_policy(windows: &[Window], global: &[Window]) -> Option<HeaderValue> {
    let items: Vec<String> = windows
        .iter()
        .chain(global)
        .enumerate()
        .map(|(i, w)| {
            // (`w` is whole seconds: a window that is not, such as 250 ms,
            // is left without it rather than misstated; its name says it.)
            let name = ietf_name(w, i, windows.len());
            match w.micros() % 1_000_000 {
                0 => format!("\"{name}\";q={};w={}", w.limit(), w.micros() / 1_000_000),
                _ => format!("\"{name}\";q={}", w.limit()),
            }
        })
        .collect();
    HeaderValue::from_str(&items.join(", ")).ok()
}

#[derive(Clone, Debug)]
pub(crate) struct CompiledRule {
    /// Inline when short (every group a request is matched against is
    /// compared without reading other memory).
    group: crate::key::ShortStr<22>,
    method: Option<Method>,
    /// `None`: the group is unlimited.
    pub(crate) policy: Option<Arc<Policy>>,
}

#[derive(Clone, Debug)]
struct CompiledRoute {
    pattern: Arc<str>,
    rules: Box<[CompiledRule]>,
}

/// Which rate-limit headers responses carry.
///
/// Only the IETF and per-window headers show every window's remaining;
/// under the others
/// the layer's checks let a store leave uncounted a window that can
/// neither deny an allowed request nor be the constraining one
/// ([`Check::exact_windows`](crate::Check::exact_windows): the Redis
/// sliding log then skips searching for where it starts).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
#[non_exhaustive]
pub enum HeaderMode {
    /// `X-RateLimit-Limit`, `X-RateLimit-Remaining`, `X-RateLimit-Reset`.
    #[default]
    X,
    /// `RateLimit-Policy` and `RateLimit` (draft-ietf-httpapi-ratelimit-headers-10).
    Ietf,
    /// Both sets.
    Both,
    /// No rate-limit headers (a denial still carries `Retry-After`).
    None,
    /// `X-RateLimit-*`, and for every window its own
    /// `X-RateLimit-Limit-<Window>` and `X-RateLimit-Remaining-<Window>`,
    /// as Kong sends them: `-Second`, `-Minute`, `-Hour`, `-Day`, `-Month`
    /// (30 days), `-Year` (365 days), other lengths as `-10s` or `-250ms`
    /// (`-1500us` if not whole milliseconds),
    /// a route-wide window's with `Route-` before (`-Route-Minute`).
    /// `"x-windows"` in a configuration file.
    #[serde(rename = "x-windows")]
    XWindows,
}

impl HeaderMode {
    /// Whether the headers show every window's remaining (so every window
    /// must be counted exactly).
    pub(crate) fn every_window(self) -> bool {
        matches!(
            self,
            HeaderMode::Ietf | HeaderMode::Both | HeaderMode::XWindows
        )
    }
}

/// A compiled, validated rule table. Cheap to clone.
#[derive(Clone)]
pub struct Rules {
    inner: Arc<RulesInner>,
}

#[derive(Clone)]
struct RulesInner {
    /// Every route pattern, matched in one pass.
    set: regex_automata::meta::Regex,
    /// When every pattern is `^` and a literal (`^/api/`, the common
    /// shape), the literals: matching is then a prefix test per route.
    prefixes: Option<Box<[Box<str>]>>,
    routes: Box<[CompiledRoute]>,
    exclude_paths: Option<RegexSet>,
    exclude_methods: Box<[Method]>,
    /// Whether some rule names methods: a route then matches a request
    /// only if one of its rules is for the request's method.
    by_method: bool,
    shadow: bool,
    headers: HeaderMode,
    warnings: Box<[ConfigWarning]>,
}

impl RulesInner {
    /// Whether the method or the path is excluded; a path with a decoded
    /// spelling (see [`decode_path`]) only when both spellings are. (Out
    /// of line: a table without exclusions, the common one, never comes
    /// here.)
    #[inline(never)]
    fn excluded(&self, method: &Method, path: &str, decoded: Option<&str>) -> bool {
        self.exclude_methods.iter().any(|m| applies(m, method))
            || self.exclude_paths.as_ref().is_some_and(|set| {
                set.is_match(path) && decoded.is_none_or(|decoded| set.is_match(decoded))
            })
    }
}

impl fmt::Debug for Rules {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list()
            .entries(self.inner.routes.iter().map(|r| &r.pattern))
            .finish()
    }
}

/// The routes whose pattern matched a path, in table order.
#[derive(Debug)]
pub(crate) enum Candidates {
    /// Bit `i` set: route `i` matched (tables of up to 64 routes).
    Mask(u64),
    Many(Vec<u32>),
}

impl Candidates {
    /// The routes either matched, in table order.
    fn union(self, other: Self) -> Self {
        match (self, other) {
            (Candidates::Mask(a), Candidates::Mask(b)) => Candidates::Mask(a | b),
            (a, b) => {
                let mut all = a.into_list();
                all.extend(b.into_list());
                all.sort_unstable();
                all.dedup();
                Candidates::Many(all)
            }
        }
    }

    fn into_list(self) -> Vec<u32> {
        match self {
            Candidates::Mask(mask) => (0..64u32).filter(|i| mask & (1 << i) != 0).collect(),
            Candidates::Many(list) => list,
        }
    }
}

/// The next [`Policy::id`]: unique in the process.
static NEXT_ID: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

impl Rules {
    /// This table with new policy ids (see [`Policy::id`]), for a reload
    /// ([`ReloadableRules`](crate::ReloadableRules)): a denial cached under
    /// a table that was swapped out never answers for it once it is swapped
    /// back in, when its budgets may have changed meanwhile (a rule with
    /// other windows counted them). Policies shared by several rules stay
    /// shared.
    pub(crate) fn renumbered(&self) -> Rules {
        let mut inner = RulesInner::clone(&self.inner);
        let mut renamed: HashMap<*const Policy, Arc<Policy>> = HashMap::new();
        for route in inner.routes.iter_mut() {
            for rule in route.rules.iter_mut() {
                let Some(policy) = rule.policy.as_mut() else {
                    continue;
                };
                let old = Arc::as_ptr(policy);
                if let Some(new) = renamed.get(&old) {
                    *policy = new.clone();
                    continue;
                }
                let mut new = Policy::clone(policy);
                new.id = NEXT_ID.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                let new = Arc::new(new);
                renamed.insert(old, new.clone());
                *policy = new;
            }
        }
        Rules {
            inner: Arc::new(inner),
        }
    }

    /// Starts an empty table.
    pub fn builder() -> RulesBuilder {
        RulesBuilder::default()
    }

    /// Parses and validates a TOML rule table (see [`Config`]). A
    /// `[groups]` table is validated and dropped: it maps keys to groups,
    /// which is the identity function's work; read it with
    /// [`Config::from_toml`] and [`Config::groups`].
    pub fn from_toml(text: &str) -> Result<Self, ConfigError> {
        Config::from_toml(text).map(Config::into_rules)
    }

    /// The number of routes.
    pub fn len(&self) -> usize {
        self.inner.routes.len()
    }

    /// Whether the table has no routes.
    pub fn is_empty(&self) -> bool {
        self.inner.routes.is_empty()
    }

    /// Whether the table puts every route in shadow mode.
    pub fn shadow(&self) -> bool {
        self.inner.shadow
    }

    /// The headers the table asks for.
    pub fn headers(&self) -> HeaderMode {
        self.inner.headers
    }

    /// What in this valid table is most likely not meant, found when it
    /// was built: a method no registry lists (`GETT`), a route every
    /// path of which is excluded (`^/health/deep` under an exclusion
    /// `^/health`; its rules then apply only to a path that spells the
    /// excluded part percent-encoded), an exclusion spelled
    /// percent-encoded (`^/a%20b`, which excludes nothing), a rule whose
    /// method is excluded, a rule that an earlier route always takes first
    /// (`^/api/login` after `^/api`, both with a rule for its group; in
    /// a table of up to 128 routes, compared by their automata too, so
    /// `^/v1/[a-z]+$` after `^/v[0-9]` is found). See
    /// [`ConfigWarningKind`]. Servers should log
    /// them at start-up and after each reload (the example server does).
    ///
    /// ```
    /// use tower_ratelimit::{ConfigWarningKind, Rule, Rules};
    ///
    /// let rules = Rules::builder()
    ///     .exclude_path("^/health")
    ///     .route("^/health/deep", [Rule::new().second(1)])
    ///     .route("^/api", [Rule::new().second(5)])
    ///     .build()?;
    /// let [warning] = rules.warnings() else { panic!() };
    /// assert_eq!(warning.route(), Some((0, "^/health/deep")));
    /// assert!(matches!(warning.kind(), ConfigWarningKind::ExcludedRoute { exclusion: 0, .. }));
    /// # Ok::<(), tower_ratelimit::ConfigError>(())
    /// ```
    pub fn warnings(&self) -> &[ConfigWarning] {
        &self.inner.warnings
    }

    /// The routes whose pattern matches the request; `None` when none does,
    /// or when the path or method is excluded. A path with a `%` is also
    /// matched decoded (see [`decode_path`]).
    #[inline]
    pub(crate) fn candidates(&self, method: &Method, path: &str) -> Option<Candidates> {
        if path.as_bytes().contains(&b'%') {
            return self.candidates_encoded(method, path);
        }
        let inner = &*self.inner;
        if (!inner.exclude_methods.is_empty() || inner.exclude_paths.is_some())
            && inner.excluded(method, path, None)
        {
            return None;
        }
        let found = self.matching(path)?;
        if inner.by_method {
            return self.for_method(found, method);
        }
        Some(found)
    }

    /// The routes among `found` with a rule for `method` (of any group):
    /// a request no rule can limit is not identified (its identity may
    /// fail: a `GET` without the API key only a `POST` rule needs).
    /// (Out of line: most tables have no rule for some methods alone.)
    #[inline(never)]
    fn for_method(&self, found: Candidates, method: &Method) -> Option<Candidates> {
        let routes = &self.inner.routes;
        let serves = |i: usize| {
            routes.get(i).is_some_and(|route| {
                route
                    .rules
                    .iter()
                    .any(|r| r.method.as_ref().is_none_or(|m| applies(m, method)))
            })
        };
        match found {
            Candidates::Mask(mask) => {
                let kept = (0..64).filter(|&i| mask & (1 << i) != 0 && serves(i));
                let kept = kept.fold(0u64, |kept, i| kept | 1 << i);
                (kept != 0).then_some(Candidates::Mask(kept))
            }
            Candidates::Many(mut list) => {
                list.retain(|&i| serves(i as usize));
                (!list.is_empty()).then_some(Candidates::Many(list))
            }
        }
    }

    /// [`candidates`](Self::candidates) of a path with a `%`: the routes
    /// its text as sent or decoded matches (a router routes by the text as
    /// sent, and hands its handlers the parameters decoded: `/users/%61dmin`
    /// reaches `/users/{name}` as `admin`, so either may be what a pattern
    /// names), and excluded only when both are (`/%68ealth` is not routed
    /// as `/health`). (Out of line: most paths hold no `%`.)
    #[cold]
    #[inline(never)]
    fn candidates_encoded(&self, method: &Method, path: &str) -> Option<Candidates> {
        let inner = &*self.inner;
        let decoded = decode_path(path);
        if inner.excluded(method, path, Some(&decoded)) {
            return None;
        }
        let found = match (self.matching(path), self.matching(&decoded)) {
            (Some(sent), Some(decoded)) => Some(sent.union(decoded)),
            (sent, decoded) => sent.or(decoded),
        }?;
        if inner.by_method {
            return self.for_method(found, method);
        }
        Some(found)
    }

    /// The routes whose pattern matches `path`.
    fn matching(&self, path: &str) -> Option<Candidates> {
        let inner = &*self.inner;
        let n = inner.routes.len();
        if n == 0 {
            return None;
        }
        match &inner.prefixes {
            Some(prefixes) if n <= 64 => {
                let mask = prefixes
                    .iter()
                    .enumerate()
                    .filter(|(_, prefix)| path.starts_with(&***prefix))
                    .fold(0u64, |m, (i, _)| m | (1u64 << i));
                (mask != 0).then_some(Candidates::Mask(mask))
            }
            Some(prefixes) => many_prefixes(prefixes, path),
            None => set_candidates(inner, path),
        }
    }

    /// The rule that applies to a request of `group` and `method` among the
    /// matched routes: the first route, in table order, with a rule for them.
    pub(crate) fn select(
        &self,
        candidates: &Candidates,
        group: &str,
        method: &Method,
    ) -> Option<&CompiledRule> {
        match candidates {
            Candidates::Mask(mask) => {
                let mut rest = *mask;
                while rest != 0 {
                    let i = rest.trailing_zeros() as usize;
                    if let Some(rule) = self.rule_for(i, group, method) {
                        return Some(rule);
                    }
                    rest &= rest - 1;
                }
                None
            }
            Candidates::Many(list) => self.select_many(list, group, method),
        }
    }

    /// [`select`](Self::select) among more than 64 routes. (Out of line:
    /// the common table's path stays compact in the instruction cache.)
    #[inline(never)]
    fn select_many(&self, list: &[u32], group: &str, method: &Method) -> Option<&CompiledRule> {
        list.iter()
            .find_map(|&i| self.rule_for(i as usize, group, method))
    }

    /// Route `i`'s rule for `group` and `method`, if it has one.
    #[inline]
    fn rule_for(&self, i: usize, group: &str, method: &Method) -> Option<&CompiledRule> {
        self.inner
            .routes
            .get(i)?
            .rules
            .iter()
            .find(|r| r.group.is(group) && r.method.as_ref().is_none_or(|m| applies(m, method)))
    }
}

/// The routes among more than 64 whose literal prefix starts `path`.
/// (Out of line, like [`set_candidates`].)
#[inline(never)]
fn many_prefixes(prefixes: &[Box<str>], path: &str) -> Option<Candidates> {
    let hits: Vec<u32> = prefixes
        .iter()
        .enumerate()
        .filter(|(_, prefix)| path.starts_with(&***prefix))
        .filter_map(|(i, _)| u32::try_from(i).ok())
        .collect();
    (!hits.is_empty()).then_some(Candidates::Many(hits))
}

/// `path` with its percent-encoding decoded, as routers decode the
/// parameters they hand their handlers (axum's `Path`): `/users/%61dmin` is
/// `/users/admin`, and `/caf%C3%A9` is `/café`. An encoded slash stays
/// encoded, as `%2F` in capitals (it does not split a segment, and a
/// router does not route by it as by a `/`), and so does a `%25` before
/// `2F` (so that `%2F` in a decoded path always is an encoded slash, and
/// `/a%252Fb`, the text `a%2Fb`, is not `/a%2Fb`); an escape that is not
/// two hex digits stays as it is, and bytes that are not UTF-8 become
/// U+FFFD.
///
/// A path with a `%` is matched both as it was sent and as this decodes
/// it: a route applies when its pattern matches either (a router routes
/// by the path as sent, and hands its handlers the parameters decoded, so
/// a client cannot spell a limited path another way to escape it), and an
/// exclusion only when it matches both (`/%68ealth` is not routed as
/// `/health`, so it is not excluded as `/health` is).
///
/// ```
/// use tower_ratelimit::rules::decode_path;
///
/// assert_eq!(decode_path("/users/%61dmin"), "/users/admin");
/// assert_eq!(decode_path("/caf%c3%a9/a%2fb/100%"), "/café/a%2Fb/100%");
/// assert_eq!(decode_path("/a%252Fb/100%25"), "/a%252Fb/100%");
/// ```
pub fn decode_path(path: &str) -> String {
    let hex = |b: Option<&u8>| b.and_then(|&b| char::from(b).to_digit(16));
    let mut out = Vec::with_capacity(path.len());
    let mut bytes = path.as_bytes().iter();
    while let Some(&b) = bytes.next() {
        let rest = bytes.as_slice();
        match (b, hex(rest.first()), hex(rest.get(1))) {
            (b'%', Some(high), Some(low)) => {
                bytes.nth(1);
                match u8::try_from(high * 16 + low) {
                    Ok(b'/') => out.extend_from_slice(b"%2F"),
                    // (`%252F` is the text `%2F`, not an encoded slash.)
                    Ok(b'%')
                        if bytes
                            .as_slice()
                            .get(..2)
                            .is_some_and(|n| n.eq_ignore_ascii_case(b"2F")) =>
                    {
                        out.extend_from_slice(b"%25");
                    }
                    Ok(decoded) => out.push(decoded),
                    Err(_) => {}
                }
            }
            _ => out.push(b),
        }
    }
    match String::from_utf8(out) {
        Ok(text) => text,
        Err(e) => String::from_utf8_lossy(e.as_bytes()).into_owned(),
    }
}

/// The routes whose regular expression matches `path`, by the table's
/// regex set. (Out of line: a table of literal prefixes never comes here,
/// and each path stays compact in the instruction cache.)
#[inline(never)]
fn set_candidates(inner: &RulesInner, path: &str) -> Option<Candidates> {
    // One reusable set of hits per thread: matching allocates nothing.
    thread_local! {
        static HITS: std::cell::RefCell<PatternSet> =
            std::cell::RefCell::new(PatternSet::new(0));
    }
    let n = inner.routes.len();
    HITS.with(|hits| {
        let mut hits = hits.borrow_mut();
        if hits.capacity() != n {
            *hits = PatternSet::new(n);
        }
        hits.clear();
        inner
            .set
            .which_overlapping_matches(&Input::new(path), &mut hits);
        if hits.is_empty() {
            None
        } else if n <= 64 {
            Some(Candidates::Mask(
                hits.iter().fold(0u64, |m, id| m | (1u64 << id.as_usize())),
            ))
        } else {
            Some(Candidates::Many(
                hits.iter()
                    .filter_map(|id| u32::try_from(id.as_usize()).ok())
                    .collect(),
            ))
        }
    })
}

/// Whether a rule for `rule` applies to a request with `request`: the same
/// method, or `HEAD` under a `GET` rule (axum, like most routers, answers
/// `HEAD` with the `GET` handler, so a `GET` limit must hold for it too).
fn applies(rule: &Method, request: &Method) -> bool {
    rule == request || (*rule == Method::GET && *request == Method::HEAD)
}

/// Builds a [`Rules`] table; see the [module docs](self).
#[derive(Debug, Default)]
#[must_use]
pub struct RulesBuilder {
    routes: Vec<Route>,
    exclude_paths: Vec<String>,
    exclude_methods: Vec<String>,
    shadow: bool,
    headers: HeaderMode,
    /// The table turns the layer's denial cache off.
    no_denial_cache: bool,
}

impl RulesBuilder {
    /// Adds a route: a regular expression over the request path (a
    /// percent-encoded path is matched decoded too, see [`decode_path`])
    /// and its rules. Routes are tried in the order they are added.
    pub fn route(self, pattern: impl Into<String>, rules: impl IntoIterator<Item = Rule>) -> Self {
        self.add_route(Route::new(pattern).rules(rules))
    }

    /// Adds a [`Route`] (for route-wide limits and per-route shadow mode).
    pub fn add_route(mut self, route: Route) -> Self {
        self.routes.push(route);
        self
    }

    /// Never limits paths matching `pattern` (e.g. `^/health`); a
    /// percent-encoded path only when it matches both as sent and decoded
    /// (see [`decode_path`]).
    pub fn exclude_path(mut self, pattern: impl Into<String>) -> Self {
        self.exclude_paths.push(pattern.into());
        self
    }

    /// Never limits requests with `method` (e.g. `OPTIONS`); excluding `GET`
    /// excludes `HEAD` too, as a `GET` rule limits `HEAD` requests.
    pub fn exclude_method(mut self, method: impl AsRef<str>) -> Self {
        self.exclude_methods
            .push(method.as_ref().to_ascii_uppercase());
        self
    }

    /// Shadow mode for every route: decide, log and set headers, never
    /// deny.
    pub fn shadow(mut self, shadow: bool) -> Self {
        self.shadow = shadow;
        self
    }

    /// Which rate-limit headers to send (default [`HeaderMode::X`]).
    pub fn headers(mut self, headers: HeaderMode) -> Self {
        self.headers = headers;
        self
    }

    /// Whether the layer may cache this table's denials (its
    /// [`denial_cache`](crate::RateLimitLayer::denial_cache); on by
    /// default): `false` sends every denied request to the store, as a
    /// layer with a cache of 0 does. (A configuration file's top-level
    /// `denial_cache = false`.)
    pub fn denial_cache(mut self, on: bool) -> Self {
        self.no_denial_cache = !on;
        self
    }

    /// Validates and compiles the table.
    ///
    /// Errors name the route, the rule and the field (see
    /// [`ConfigErrorKind`] for every one): among them an invalid regular
    /// expression or an empty one (or one too long, with too many Unicode
    /// classes, or too large compiled, alone or with the routes before
    /// it), two routes with one pattern, a route without rules, a zero or
    /// negative limit, a limit beyond what the rule's algorithm counts, a
    /// window under a millisecond, two windows of the same length in one
    /// rule, more than [`MAX_WINDOWS`] windows, an invalid method, a rule
    /// that an earlier rule of its route makes unreachable, a block time
    /// without windows, zones that disagree on their algorithm or window
    /// lengths, a zone on a route with a route-wide limit, a route-wide
    /// limit with fields it does not read, or rules of such a route that
    /// disagree on their algorithm. What is valid but most likely not
    /// meant is in [`Rules::warnings`].
    pub fn build(self) -> Result<Rules, ConfigError> {
        let mut routes = Vec::with_capacity(self.routes.len());
        // The shape of each zone's first rule with limits.
        let mut zones: BTreeMap<&str, Shape> = BTreeMap::new();
        let mut patterns: BTreeMap<&str, usize> = BTreeMap::new();
        // (Only a plain exclusion, or an earlier plain route, `^/api` or
        // `^/api/.*`, can be found to cover a route, from the route's
        // literal prefixes: see `Rules::warnings`.)
        let plain_covers = self
            .exclude_paths
            .iter()
            .any(|x| plain_exclusion(x).is_some())
            || self
                .routes
                .iter()
                .any(|r| covering_literal(&r.pattern).is_some());
        let mut route_prefixes = Vec::with_capacity(self.routes.len());
        // (Each route's parsed pattern, for the shadowing warnings of a
        // table small enough to compare its routes' automata: see
        // `Inclusion`.)
        let mut route_hirs = Vec::new();
        // (What the route set's automata take, route by route.)
        let (mut set_memory, mut set_states) = (0, [0, 0]);
        for (ri, route) in self.routes.iter().enumerate() {
            let at_route = Location {
                route: Some((ri, route.pattern.clone())),
                ..Location::default()
            };
            // (The pattern is a file's `path`.)
            let at_path = || Location {
                field: Some("path".to_owned()),
                ..at_route.clone()
            };
            if route.pattern.is_empty() {
                return Err(ConfigError::new(at_path(), ConfigErrorKind::EmptyPattern));
            }
            // (Parsed only: every pattern is compiled once, into the set
            // below; compiling each alone too took most of a large table's
            // build.)
            let checked =
                check_pattern(&route.pattern).map_err(|kind| ConfigError::new(at_path(), kind))?;
            set_memory += checked.memory;
            if set_memory > SET_SIZE_LIMIT {
                return Err(ConfigError::new(at_path(), ConfigErrorKind::RoutesTooLarge));
            }
            set_states[0] += checked.states[0];
            set_states[1] += checked.states[1];
            route_prefixes.push(if plain_covers {
                RoutePrefixes::of(&checked.hir)
            } else {
                None
            });
            if self.routes.len() <= INCLUSION_ROUTES {
                route_hirs.push((checked.states[0] <= INCLUSION_NFA_STATES).then_some(checked.hir));
            }
            // Budget keys are named after the pattern: two routes with one
            // pattern would share them, whatever their rules.
            if patterns.insert(&route.pattern, ri).is_some() {
                return Err(ConfigError::new(at_path(), ConfigErrorKind::DuplicateRoute));
            }
            let route_id = key::pattern_id(&route.pattern);
            let pattern: Arc<str> = route.pattern.as_str().into();
            let global = match &route.global {
                None => None,
                Some(limits) => {
                    let at = Location {
                        field: Some("global".to_owned()),
                        ..at_route.clone()
                    };
                    // Only windows: the route-wide budget is counted with
                    // its rules' algorithm, and has no method, zone or block.
                    let ignored = [
                        ("algorithm", limits.algorithm != Algorithm::default()),
                        ("block_time", limits.block_time.is_some()),
                        ("cost", limits.cost.is_some()),
                        ("method", limits.method.is_some()),
                        ("zone", limits.zone.is_some()),
                    ];
                    if let Some((field, _)) = ignored.iter().find(|(_, set)| *set) {
                        let mut at = at;
                        at.field = Some(format!("global.{field}"));
                        return Err(ConfigError::new(at, ConfigErrorKind::GlobalField));
                    }
                    let windows = limits.compile_windows(|field, kind| {
                        let mut at = at.clone();
                        if let Some(f) = field {
                            at.field = Some(format!("global.{f}"));
                        }
                        ConfigError::new(at, kind)
                    })?;
                    if windows.is_empty() {
                        return Err(ConfigError::new(at, ConfigErrorKind::EmptyGlobal));
                    }
                    Some(windows)
                }
            };
            // (A request on a route with no rule for its group goes on to
            // the next route: a route without rules matches nothing.)
            if route.rules.is_empty() {
                let at = Location {
                    field: Some("rules".to_owned()),
                    ..at_route.clone()
                };
                return Err(ConfigError::new(at, ConfigErrorKind::NoEffect));
            }
            let mut compiled: Vec<CompiledRule> = Vec::with_capacity(route.rules.len());
            // (The route's rules so far, by group: a rule is checked against
            // its own group's, not every earlier rule.)
            let mut by_group: HashMap<&str, Vec<usize>> = HashMap::new();
            let mut route_algorithm = None;
            for (i, rule) in route.rules.iter().enumerate() {
                let at = Location {
                    rule: Some((i, rule.group.clone())),
                    ..at_route.clone()
                };
                if rule.zone.is_some() && global.is_some() {
                    let mut at = at;
                    at.field = Some("zone".to_owned());
                    return Err(ConfigError::new(at, ConfigErrorKind::ZoneWithGlobal));
                }
                let context = RouteContext {
                    id: &route_id,
                    pattern: &pattern,
                    global: global.as_deref(),
                    shadow: route.shadow,
                    // (The table's own settings are the layer's defaults,
                    // which the layer may override: see
                    // `RateLimitLayer::shadow` and `headers`.)
                    table_shadow: self.shadow,
                    headers: self.headers,
                    denial_cache: !self.no_denial_cache,
                };
                let rule_at = at.clone();
                let earlier: Vec<&CompiledRule> = by_group
                    .get(rule.group.as_str())
                    .map(|ix| ix.iter().filter_map(|&i| compiled.get(i)).collect())
                    .unwrap_or_default();
                let compiled_rule = compile_rule(rule, at, &context, &earlier)?;
                by_group
                    .entry(rule.group.as_str())
                    .or_default()
                    .push(compiled.len());
                compiled.push(compiled_rule);
                // (Only rules with limits count a budget: an unlimited group
                // is no conflict.)
                let Some(policy) = compiled.last().and_then(|r| r.policy.as_ref()) else {
                    continue;
                };
                let shape = policy.shape();
                // The route-wide budget is one for every rule of the route:
                // counted one way.
                let route_algorithm = *route_algorithm.get_or_insert(shape.0);
                let conflict = if global.is_some() && shape.0 != route_algorithm {
                    Some(("algorithm", ConfigErrorKind::GlobalAlgorithm))
                } else if let Some(zone) = rule.zone.as_deref() {
                    let first = zones.entry(zone).or_insert_with(|| shape.clone());
                    if first.0 != shape.0 {
                        Some(("zone", ConfigErrorKind::ZoneAlgorithm))
                    } else if first.1 != shape.1 {
                        Some(("zone", ConfigErrorKind::ZoneWindows))
                    } else {
                        None
                    }
                } else {
                    None
                };
                if let Some((field, kind)) = conflict {
                    let mut at = rule_at;
                    at.field = Some(field.to_owned());
                    return Err(ConfigError::new(at, kind));
                }
            }
            // (A route-wide budget is counted by the route's limited rules:
            // without one, it would never be.)
            if global.is_some() && route_algorithm.is_none() {
                let at = Location {
                    field: Some("global".to_owned()),
                    ..at_route.clone()
                };
                return Err(ConfigError::new(at, ConfigErrorKind::NoEffect));
            }
            split_by_group(&mut compiled);
            routes.push(CompiledRoute {
                pattern,
                rules: compiled.into_boxed_slice(),
            });
        }
        mark_shared(&mut routes);
        let set = route_set(&self.routes, set_states)?;
        for (i, pattern) in self.exclude_paths.iter().enumerate() {
            let at = || Location::field(format!("exclude.paths[{i}]"));
            if pattern.is_empty() {
                return Err(ConfigError::new(at(), ConfigErrorKind::EmptyPattern));
            }
            check_pattern(pattern).map_err(|kind| ConfigError::new(at(), kind))?;
            // (The set of exclusions is the `regex` crate's: each is
            // compiled alone too, so that one too large is named.)
            if let Err(e) = regex::Regex::new(pattern) {
                return Err(ConfigError::new(at(), ConfigErrorKind::InvalidRegex(e)));
            }
        }
        let exclude_paths = if self.exclude_paths.is_empty() {
            None
        } else {
            Some(RegexSet::new(&self.exclude_paths).map_err(|e| {
                ConfigError::new(
                    Location::field("exclude.paths".to_owned()),
                    ConfigErrorKind::InvalidRegex(e),
                )
            })?)
        };
        let mut exclude_methods = Vec::with_capacity(self.exclude_methods.len());
        for (i, m) in self.exclude_methods.iter().enumerate() {
            exclude_methods.push(Method::from_bytes(m.as_bytes()).map_err(|_| {
                ConfigError::new(
                    Location::field(format!("exclude.methods[{i}]")),
                    ConfigErrorKind::InvalidMethod(m.clone()),
                )
            })?);
        }
        let prefixes = self
            .routes
            .iter()
            .map(|r| literal_prefix(&r.pattern).map(Box::from))
            .collect::<Option<Box<[Box<str>]>>>();
        let warnings = warnings(
            &routes,
            &route_prefixes,
            &route_hirs,
            &self.exclude_paths,
            exclude_paths.as_ref(),
            &exclude_methods,
        );
        let by_method = routes
            .iter()
            .any(|route| route.rules.iter().any(|rule| rule.method.is_some()));
        Ok(Rules {
            inner: Arc::new(RulesInner {
                set,
                prefixes,
                routes: routes.into_boxed_slice(),
                exclude_paths,
                exclude_methods: exclude_methods.into_boxed_slice(),
                by_method,
                shadow: self.shadow,
                headers: self.headers,
                warnings: warnings.into_boxed_slice(),
            }),
        })
    }
}

/// The longest path pattern (of a route or an exclusion), in bytes: far
/// beyond any real one (a plain literal this long is about as much as the
/// regex engine's default size limit compiles), and short enough that
/// checking one takes a few tens of megabytes at most (a 10 MB pattern
/// took 850 MB to be refused).
pub const MAX_PATTERN_LEN: usize = 256 * 1024;

/// The most Perl or Unicode classes (`\w`, `\d`, `\pL`, also inside
/// brackets) one pattern may have: such a class is hundreds of ranges once
/// translated (a pattern of 131,071 `\w` took 868 MB to be refused as too
/// large compiled), and about 210 `\w` already compile past the size
/// limit. ASCII classes (`[0-9]`, `[a-z]`) are not counted.
pub(crate) const MAX_CLASSES: usize = 1024;

/// The most one pattern's automaton may take, as the `regex` crate's
/// default size limit.
const PATTERN_SIZE_LIMIT: usize = 10 << 20;

/// The most the route set's automaton may take: well beyond ten thousand
/// ordinary routes together (which pass [`PATTERN_SIZE_LIMIT`]), each
/// within it alone. Each route's share (its larger automaton's size) is
/// counted as the table is built, so the route that takes the set past it
/// is named; the set itself is compiled with half as much again, as its
/// compiler's heap holds about a quarter more than the automaton it makes.
pub(crate) const SET_SIZE_LIMIT: usize = 256 << 20;

/// What [`check_pattern`] found of a valid pattern.
struct CheckedPattern {
    hir: regex_syntax::hir::Hir,
    /// The states of its forward and its reverse automaton.
    states: [usize; 2],
    /// The larger of its two automata's sizes, in bytes.
    memory: usize,
}

/// Checks a path pattern as the `regex` crate would compile it, with its
/// errors, but for the DFAs it would also build: its length, its syntax,
/// its number of classes, its automata's size (forward, with captures, and
/// reverse).
fn check_pattern(pattern: &str) -> Result<CheckedPattern, ConfigErrorKind> {
    use regex_automata::nfa::thompson::{Compiler, Config, WhichCaptures};
    use regex_syntax::ast::{self, Ast, ClassSetItem};
    /// Counts the Perl and Unicode classes of a pattern.
    struct Classes(usize);
    impl ast::Visitor for Classes {
        type Output = usize;
        type Err = ();
        fn finish(self) -> Result<usize, ()> {
            Ok(self.0)
        }
        fn visit_pre(&mut self, ast: &Ast) -> Result<(), ()> {
            if matches!(ast, Ast::ClassUnicode(_) | Ast::ClassPerl(_)) {
                self.0 += 1;
            }
            Ok(())
        }
        fn visit_class_set_item_pre(&mut self, item: &ClassSetItem) -> Result<(), ()> {
            if matches!(item, ClassSetItem::Unicode(_) | ClassSetItem::Perl(_)) {
                self.0 += 1;
            }
            Ok(())
        }
    }
    if pattern.len() > MAX_PATTERN_LEN {
        return Err(ConfigErrorKind::PatternTooLong(pattern.len()));
    }
    let syntax =
        |e: regex_syntax::Error| ConfigErrorKind::InvalidRegex(regex::Error::Syntax(e.to_string()));
    let tree = ast::parse::Parser::new()
        .parse(pattern)
        .map_err(|e| syntax(e.into()))?;
    if let Ok(n) = ast::visit(&tree, Classes(0)) {
        if n > MAX_CLASSES {
            return Err(ConfigErrorKind::TooManyClasses(n));
        }
    }
    let hir = regex_syntax::hir::translate::Translator::new()
        .translate(pattern, &tree)
        .map_err(|e| syntax(e.into()))?;
    let mut states = [0; 2];
    let mut memory = 0;
    for (i, (reverse, captures)) in [(false, WhichCaptures::All), (true, WhichCaptures::None)]
        .into_iter()
        .enumerate()
    {
        let nfa = Compiler::new()
            .configure(
                Config::new()
                    .nfa_size_limit(Some(PATTERN_SIZE_LIMIT))
                    .reverse(reverse)
                    .which_captures(captures),
            )
            .build_from_hir(&hir)
            .map_err(|_| {
                ConfigErrorKind::InvalidRegex(regex::Error::CompiledTooBig(PATTERN_SIZE_LIMIT))
            })?;
        states[i] = nfa.states().len();
        memory = memory.max(nfa.memory_usage());
    }
    Ok(CheckedPattern {
        hir,
        states,
        memory,
    })
}

/// Every route pattern (each checked by [`check_pattern`]), compiled into
/// one set. (The set reports every pattern that matches anywhere in the
/// path only with `MatchKind::All`: under the default leftmost-first
/// semantics an overlapping search stops at the first pattern's match and
/// misses routes that match later in the path or end later.) It keeps no
/// capture slots: its slower engine's (the PikeVM's) take a slot per route
/// in every state, which for thousands of routes took seconds a request,
/// and gigabytes. Its lazy DFA's cache grows with the table (see
/// [`set_cache_capacity`]), so a large one's does not thrash (16,000
/// routes and random paths: 6 ms a request with the default 2 MiB, 0.1 ms
/// with 32 MiB, in a release build). Each thread that matches at the same
/// time as another keeps a cache of its own, grown only as far as the
/// paths it sees need. `states` are the routes' automata's states,
/// forward and reverse, from [`check_pattern`].
fn route_set(
    routes: &[Route],
    states: [usize; 2],
) -> Result<regex_automata::meta::Regex, ConfigError> {
    let patterns: Vec<&str> = routes.iter().map(|r| r.pattern.as_str()).collect();
    let config = regex_automata::meta::Config::new()
        .match_kind(regex_automata::MatchKind::All)
        .which_captures(regex_automata::nfa::thompson::WhichCaptures::None)
        .hybrid_cache_capacity(set_cache_capacity(routes.len(), states))
        .nfa_size_limit(Some(SET_SIZE_LIMIT + SET_SIZE_LIMIT / 2));
    regex_automata::meta::Regex::builder()
        .configure(config)
        .build_many(&patterns)
        .map_err(|e| {
            ConfigError::new(
                Location::default(),
                // (Each route's share was counted as it was checked, so
                // this is not expected; its cause is said whole.)
                ConfigErrorKind::Parse(format!(
                    "the route patterns together cannot be compiled ({} routes): {e}{}",
                    routes.len(),
                    std::error::Error::source(&e)
                        .map(|cause| format!(": {cause}"))
                        .unwrap_or_default()
                )),
            )
        })
}

/// The route set's lazy-DFA cache: at least 2 MiB (the engine's default)
/// and 2 KiB a route, and twice the least the engine builds a lazy DFA
/// with, which grows with its automata's states (about 27 bytes a state and
/// 36 a pattern, after regex-automata's `minimum_cache_capacity`, for the
/// larger of the two automata; each searching thread's cache, forward and
/// reverse, may grow to it: 6,000 routes of `\w+` reached 860 MB with a
/// cache twice this one). Below
/// that least, the engine builds no lazy DFA and silently matches every
/// path with its slowest one: a Unicode class's reverse automaton is large
/// (`\d+` 158 states, `\w+` 1,443, `[0-9]+` 15), so 16,000 routes of `\d+`
/// took 4.6 ms a request with a cache sized by their number alone.
fn set_cache_capacity(routes: usize, states: [usize; 2]) -> usize {
    let least = 27 * states[0].max(states[1]) + 36 * routes + (64 << 10);
    (2 << 20).max(routes * 2048).max(2 * least)
}

/// HTTP's standard methods (RFC 9110 and PATCH): what a method no
/// registry lists is compared with, for a typo.
const STANDARD_METHODS: [&str; 9] = [
    "GET", "HEAD", "POST", "PUT", "DELETE", "CONNECT", "OPTIONS", "TRACE", "PATCH",
];

/// The other methods of IANA's HTTP Method Registry (WebDAV's and its
/// extensions', `QUERY`...): a rule for one of them gets no warning.
const REGISTERED_METHODS: [&str; 31] = [
    "ACL",
    "BASELINE-CONTROL",
    "BIND",
    "CHECKIN",
    "CHECKOUT",
    "COPY",
    "LABEL",
    "LINK",
    "LOCK",
    "MERGE",
    "MKACTIVITY",
    "MKCALENDAR",
    "MKCOL",
    "MKREDIRECTREF",
    "MKWORKSPACE",
    "MOVE",
    "ORDERPATCH",
    "PRI",
    "PROPFIND",
    "PROPPATCH",
    "QUERY",
    "REBIND",
    "REPORT",
    "SEARCH",
    "UNBIND",
    "UNCHECKOUT",
    "UNLINK",
    "UNLOCK",
    "UPDATE",
    "UPDATEREDIRECTREF",
    "VERSION-CONTROL",
];

/// The warnings of a valid table: see [`Rules::warnings`].
fn warnings(
    routes: &[CompiledRoute],
    route_prefixes: &[Option<RoutePrefixes>],
    route_hirs: &[Option<regex_syntax::hir::Hir>],
    exclude_paths: &[String],
    exclude_set: Option<&RegexSet>,
    exclude_methods: &[Method],
) -> Vec<ConfigWarning> {
    let mut found = Vec::new();
    let unusual = |method: &Method| {
        let name = method.as_str();
        let known = STANDARD_METHODS.contains(&name) || REGISTERED_METHODS.contains(&name);
        (!known).then(|| ConfigWarningKind::UnusualMethod {
            method: name.to_owned(),
            nearest: STANDARD_METHODS
                .iter()
                .chain(&REGISTERED_METHODS)
                .find(|m| one_edit_apart(m, name))
                .copied(),
        })
    };
    for (i, method) in exclude_methods.iter().enumerate() {
        if let Some(kind) = unusual(method) {
            let at = Location::field(format!("exclude.methods[{i}]"));
            found.push(ConfigWarning::new(at, kind));
        }
    }
    for (i, exclusion) in exclude_paths.iter().enumerate() {
        // (A path that starts with `L` decodes to one that starts with its
        // decoding, which matches `^L` only if `L` starts with it too, as
        // `/%2525` does; or another exclusion may match the decoding, as
        // `^/a b` beside `^/a%20b`.)
        let encoded = literal_prefix(exclusion).is_some_and(|literal| {
            let decoded = decode_path(literal);
            !literal.starts_with(&decoded) && !exclude_set.is_some_and(|set| set.is_match(&decoded))
        });
        if encoded {
            let at = Location::field(format!("exclude.paths[{i}]"));
            let kind = ConfigWarningKind::EncodedExclusion(exclusion.clone());
            found.push(ConfigWarning::new(at, kind));
        }
    }
    // (An exclusion that spells a character percent-encoded, `^/a%20b`,
    // never matches the decoded path, so it excludes no path a route
    // matches as a client sends it: nothing to say of the routes under it.
    // Worked out once, not once a route.)
    let spelled_as_sent: Vec<bool> = exclude_paths
        .iter()
        .map(|x| !x.contains('%') || decode_path(x) == *x)
        .collect();
    let excluded = |method: &Method| exclude_methods.iter().any(|x| applies(x, method));
    // The plain routes (`^/api`, `^/api/.*`), by their literal.
    let plain: HashMap<&[u8], usize> = routes
        .iter()
        .enumerate()
        .filter_map(|(i, r)| covering_literal(&r.pattern).map(|l| (l.as_bytes(), i)))
        .collect();
    // (Only in a table small enough: a larger one has no automata to
    // compare, and a pass over every earlier route for each rule would take
    // a table of 16,000 routes minutes.)
    let mut inclusion = (!route_hirs.is_empty()).then(|| Inclusion::new(route_hirs));
    for (ri, (route, prefixes)) in routes.iter().zip(route_prefixes).enumerate() {
        let at_route = Location {
            route: Some((ri, route.pattern.to_string())),
            ..Location::default()
        };
        if let Some(i) = exclude_paths
            .iter()
            .zip(&spelled_as_sent)
            .position(|(x, &sent)| sent && always_excluded(&route.pattern, prefixes.as_ref(), x))
        {
            let kind = ConfigWarningKind::ExcludedRoute {
                exclusion: i,
                pattern: exclude_paths[i].clone(),
            };
            found.push(ConfigWarning::new(at_route.clone(), kind));
        }
        // The earlier plain routes that match every path starting with
        // each of this route's literal prefixes.
        let covering: Vec<Vec<usize>> = match prefixes {
            Some(p) if p.anchored => p
                .literals
                .iter()
                .map(|literal| {
                    (0..=literal.len())
                        .filter_map(|k| plain.get(&literal[..k]).copied())
                        .filter(|&i| i < ri)
                        .collect()
                })
                .collect(),
            _ => Vec::new(),
        };
        for (i, rule) in route.rules.iter().enumerate() {
            // Shadowed: whatever path it matches, an earlier route that
            // matches it too has a rule for its group and method.
            let shadowing = |earlier: &Vec<usize>| {
                earlier
                    .iter()
                    .copied()
                    .find(|&e| routes[e].rules.iter().any(|r| shadows(r, rule)))
            };
            let by: Vec<Option<usize>> = covering.iter().map(shadowing).collect();
            let by = match by.first() {
                Some(&Some(e)) if by.iter().all(Option::is_some) => Some(e),
                // (Otherwise an earlier route whose automaton matches
                // every path this route's does, when the table is small
                // enough to compare them.)
                _ => inclusion.as_mut().and_then(|inclusion| {
                    (0..ri).find(|&e| {
                        routes[e].rules.iter().any(|r| shadows(r, rule)) && inclusion.covers(e, ri)
                    })
                }),
            };
            if let Some(e) = by {
                let at = Location {
                    rule: Some((i, rule.group.as_str().to_owned())),
                    ..at_route.clone()
                };
                let kind = ConfigWarningKind::ShadowedRule {
                    route: e,
                    pattern: routes[e].pattern.to_string(),
                };
                found.push(ConfigWarning::new(at, kind));
            }
            let Some(method) = &rule.method else {
                continue;
            };
            let at = Location {
                rule: Some((i, rule.group.as_str().to_owned())),
                field: Some("method".to_owned()),
                ..at_route.clone()
            };
            // (A `GET` rule applies to `HEAD` too.)
            if excluded(method) && (*method != Method::GET || excluded(&Method::HEAD)) {
                let kind = ConfigWarningKind::ExcludedMethod(method.as_str().to_owned());
                found.push(ConfigWarning::new(at, kind));
            } else if let Some(kind) = unusual(method) {
                found.push(ConfigWarning::new(at, kind));
            }
        }
    }
    found
}

/// The most routes a table may have for its shadowing warnings to compare
/// routes by their automata (see [`Inclusion`]); a larger table's are
/// found from literal prefixes alone.
const INCLUSION_ROUTES: usize = 128;

/// The most pairs of states [`Inclusion::covers`] visits over a whole
/// table, and the most states a route's automaton (its NFA) may have to be
/// compared: a table of patterns with large classes (`\w`, `\pL`:
/// hundreds of states) warns less. (128 routes sharing one literal prefix,
/// every pair compared: 27–31 ms from start to listening in the release
/// demo server, 15–24 ms for 128 of distinct prefixes.)
const INCLUSION_STATES: usize = 100_000;
const INCLUSION_NFA_STATES: usize = 256;

/// The most pairs of states one comparison visits, and the most bytes a
/// route's automaton may take (`.*x.{10}`, unanchored, would take
/// thousands of states).
const INCLUSION_PAIR_STATES: usize = 2_000;
const INCLUSION_DFA_BYTES: usize = 64 << 10;

/// The most automata [`Inclusion`] fails to build before it builds no
/// more.
const INCLUSION_FAILURES: usize = 4;

/// Whether an earlier route matches every path a later one matches, told by
/// their deterministic automata: every text the later one matches
/// somewhere (a route applies when the path, as sent or decoded, matches
/// it anywhere), the earlier one matches somewhere too. This sees what
/// literal prefixes cannot (`^/api/[a-z]+` under `^/api/`, `^/v[12]/x`
/// under `^/v[0-9]`). Texts are any bytes, not only a path's, so the
/// answer errs toward no warning. A pattern whose automaton is too large,
/// or that needs look-around the automaton cannot do (a Unicode `\b` on
/// non-ASCII text), is never found to cover or be covered.
struct Inclusion<'a> {
    hirs: &'a [Option<regex_syntax::hir::Hir>],
    /// Each route's literal prefixes, and its automaton, made when first
    /// needed (`None` inside: there are none, or it could not be built).
    prefixes: Vec<Option<Option<RoutePrefixes>>>,
    dfas: Vec<Option<Option<DenseDfa>>>,
    /// The automata that could not be built: past a few, no more are
    /// tried (each failure takes a millisecond or two).
    failed: usize,
    /// The states left to visit.
    budget: usize,
    /// The pairs (earlier, later) compared, and the answers (a route's
    /// rules for several groups ask the same).
    answers: HashMap<(usize, usize), bool>,
}

/// A route's automaton for [`Inclusion`].
type DenseDfa = regex_automata::dfa::dense::DFA<Vec<u32>>;

impl<'a> Inclusion<'a> {
    fn new(hirs: &'a [Option<regex_syntax::hir::Hir>]) -> Self {
        Self {
            hirs,
            prefixes: hirs.iter().map(|_| None).collect(),
            dfas: hirs.iter().map(|_| None).collect(),
            failed: 0,
            budget: INCLUSION_STATES,
            answers: HashMap::new(),
        }
    }

    /// Whether some text may start with a match of both routes: false
    /// for two routes anchored at the start whose literal prefixes
    /// differ (`^/users` and `^/orders`, as most of a table's do).
    fn may_overlap(&mut self, a: usize, b: usize) -> bool {
        for i in [a, b] {
            if let (Some(Some(hir)), Some(slot)) = (self.hirs.get(i), self.prefixes.get_mut(i)) {
                slot.get_or_insert_with(|| RoutePrefixes::of(hir));
            }
        }
        let (Some(Some(Some(pa))), Some(Some(Some(pb)))) =
            (self.prefixes.get(a), self.prefixes.get(b))
        else {
            return true;
        };
        let compatible = |x: &[u8], y: &[u8]| x.starts_with(y) || y.starts_with(x);
        !(pa.anchored && pb.anchored)
            || pa
                .literals
                .iter()
                .any(|x| pb.literals.iter().any(|y| compatible(x, y)))
    }

    /// Builds route `i`'s automaton (unanchored, every match reported) if
    /// it was not tried yet; whether it exists.
    fn build(&mut self, i: usize) -> bool {
        use regex_automata::dfa::{dense, StartKind};
        use regex_automata::nfa::thompson::{Compiler, Config, WhichCaptures};
        let (Some(Some(hir)), Some(slot)) = (self.hirs.get(i), self.dfas.get_mut(i)) else {
            return false;
        };
        if slot.is_none() {
            if self.failed >= INCLUSION_FAILURES {
                return false;
            }
            let dfa = Compiler::new()
                .configure(Config::new().which_captures(WhichCaptures::None))
                .build_from_hir(hir)
                .ok()
                .and_then(|nfa| {
                    dense::Builder::new()
                        .configure(
                            dense::Config::new()
                                .match_kind(regex_automata::MatchKind::All)
                                .start_kind(StartKind::Unanchored)
                                .dfa_size_limit(Some(INCLUSION_DFA_BYTES))
                                .determinize_size_limit(Some(INCLUSION_DFA_BYTES)),
                        )
                        .build_from_nfa(&nfa)
                        .ok()
                });
            self.failed += usize::from(dfa.is_none());
            *slot = Some(dfa);
        }
        matches!(slot, Some(Some(_)))
    }

    /// Whether route `earlier` matches every text route `later` matches
    /// (false when that could not be told).
    fn covers(&mut self, earlier: usize, later: usize) -> bool {
        if let Some(&answer) = self.answers.get(&(earlier, later)) {
            return answer;
        }
        let answer = self.compare(earlier, later);
        self.answers.insert((earlier, later), answer);
        answer
    }

    /// [`covers`](Self::covers), worked out.
    fn compare(&mut self, earlier: usize, later: usize) -> bool {
        if !self.may_overlap(earlier, later) || !self.build(earlier) || !self.build(later) {
            return false;
        }
        let (Some(Some(Some(e))), Some(Some(Some(l)))) =
            (self.dfas.get(earlier), self.dfas.get(later))
        else {
            return false;
        };
        let mut budget = self.budget.min(INCLUSION_PAIR_STATES);
        let found = covers(e, l, &mut budget);
        self.budget -= self.budget.min(INCLUSION_PAIR_STATES) - budget;
        found.unwrap_or(false)
    }
}

/// Whether every text that `later` matches somewhere, `earlier` matches
/// somewhere too: a search of the pairs of their states that a text
/// reaches (`later`'s `None` once it has matched: a text that matches
/// somewhere, and every text that continues it, does), for a text that
/// `later` has matched and `earlier` does not match. A text `earlier` has
/// matched is not continued. `None` when the search would visit more than
/// `budget` pairs (taken from it), or reaches a state where an automaton
/// gives up.
fn covers(earlier: &DenseDfa, later: &DenseDfa, budget: &mut usize) -> Option<bool> {
    use regex_automata::dfa::Automaton;
    use regex_automata::util::{primitives::StateID, start};
    use std::collections::VecDeque;
    if *budget == 0 {
        return None;
    }
    let start = start::Config::new().anchored(regex_automata::Anchored::No);
    let first = (
        Some(later.start_state(&start).ok()?),
        earlier.start_state(&start).ok()?,
    );
    // A byte of each run of bytes that both automata treat alike (every
    // class the two tell apart has one).
    let (ce, cl) = (earlier.byte_classes(), later.byte_classes());
    let bytes: Vec<u8> = (0..=255u8)
        .filter(|&b| b == 0 || ce.get(b) != ce.get(b - 1) || cl.get(b) != cl.get(b - 1))
        .collect();
    let mut seen: HashSet<(Option<StateID>, StateID)> = HashSet::from([first]);
    let mut queue = VecDeque::from([first]);
    while let Some((l, e)) = queue.pop_front() {
        *budget = budget.checked_sub(1)?;
        // The text ends here: a match of `later` without one of `earlier`?
        let end = earlier.next_eoi_state(e);
        if earlier.is_quit_state(end) {
            return None;
        }
        if !earlier.is_match_state(end) {
            let matched = match l {
                None => true,
                Some(l) => {
                    let end = later.next_eoi_state(l);
                    if later.is_quit_state(end) {
                        return None;
                    }
                    later.is_match_state(end)
                }
            };
            if matched {
                return Some(false);
            }
        }
        for &b in &bytes {
            let e = earlier.next_state(e, b);
            if earlier.is_quit_state(e) {
                return None;
            }
            if earlier.is_match_state(e) {
                continue;
            }
            let l = match l {
                None => None,
                Some(l) => {
                    let l = later.next_state(l, b);
                    if later.is_quit_state(l) {
                        return None;
                    }
                    if later.is_dead_state(l) {
                        // (`later` matches no text that continues this one.)
                        continue;
                    }
                    (!later.is_match_state(l)).then_some(l)
                }
            };
            if seen.insert((l, e)) {
                queue.push_back((l, e));
            }
        }
    }
    Some(true)
}

/// Whether a request that `later` applies to is taken by `earlier` (a rule
/// of an earlier route matching the same path): the same group, and
/// `earlier` without a method, or with the same, or `GET` for `HEAD`.
fn shadows(earlier: &CompiledRule, later: &CompiledRule) -> bool {
    earlier.group.as_str() == later.group.as_str()
        && match (&earlier.method, &later.method) {
            (None, _) => true,
            (Some(e), Some(l)) => applies(e, l),
            (Some(_), None) => false,
        }
}

/// What every match of a route starts with: whether it is anchored at the
/// start of the path, and the literals one of which begins each match (a
/// route whose matches cannot be told by a few literals has none).
struct RoutePrefixes {
    anchored: bool,
    literals: Vec<Vec<u8>>,
}

impl RoutePrefixes {
    fn of(hir: &regex_syntax::hir::Hir) -> Option<Self> {
        use regex_syntax::hir::literal::{ExtractKind, Extractor};
        use regex_syntax::hir::Look;
        let anchored = hir.properties().look_set_prefix().contains(Look::Start);
        // (Literals up to 4 KiB, where the extractor's default cuts them
        // at 100 bytes: a longer plain route or exclusion is found too.)
        let prefixes = Extractor::new()
            .kind(ExtractKind::Prefix)
            .limit_literal_len(4096)
            .extract(hir);
        let literals: Vec<Vec<u8>> = prefixes
            .literals()?
            .iter()
            .map(|l| l.as_bytes().to_vec())
            .collect();
        (!literals.is_empty()).then_some(Self { anchored, literals })
    }
}

/// An exclusion that is a plain literal: whether it is anchored (`^/health`)
/// or not (`/internal/`, anywhere in the path), and the literal.
fn plain_exclusion(exclusion: &str) -> Option<(bool, &str)> {
    match literal_prefix(exclusion) {
        Some(literal) => Some((true, literal)),
        None if !exclusion.is_empty() && literal_prefix(&format!("^{exclusion}")).is_some() => {
            Some((false, exclusion))
        }
        None => None,
    }
}

/// Whether every path `route` matches (as sent) is matched by `exclusion`:
/// the same pattern, or a plain exclusion (see [`plain_exclusion`]) which
/// every match of the route starts with (anchored) or contains (not
/// anchored), as its literal prefixes tell. A route they cannot tell about
/// is not reported.
fn always_excluded(route: &str, prefixes: Option<&RoutePrefixes>, exclusion: &str) -> bool {
    if route == exclusion {
        return true;
    }
    let (Some((anchored, literal)), Some(prefixes)) = (plain_exclusion(exclusion), prefixes) else {
        return false;
    };
    if anchored && !prefixes.anchored {
        return false;
    }
    let literal = literal.as_bytes();
    prefixes.literals.iter().all(|prefix| {
        if anchored {
            prefix.starts_with(literal)
        } else {
            literal.is_empty() || prefix.windows(literal.len()).any(|w| w == literal)
        }
    })
}

/// Whether `a` becomes `b` by one edit: a letter changed, added or left
/// out, or two neighbours swapped (`GETT`, `GE`, `PSOT`; not `LIST` for
/// `POST`).
fn one_edit_apart(a: &str, b: &str) -> bool {
    let (a, b) = (a.as_bytes(), b.as_bytes());
    let (short, long) = if a.len() <= b.len() { (a, b) } else { (b, a) };
    let same_start = short.iter().zip(long).take_while(|(x, y)| x == y).count();
    match long.len() - short.len() {
        0 => {
            let (x, y) = (&short[same_start..], &long[same_start..]);
            match x.len() {
                0 => false,
                1 => true,
                _ => x[1..] == y[1..] || (x[0] == y[1] && x[1] == y[0] && x[2..] == y[2..]),
            }
        }
        1 => short[same_start..] == long[same_start + 1..],
        _ => false,
    }
}

/// The literal of a pattern that is `^` followed by plain characters only
/// (no regex syntax at all), which matches exactly the paths starting with it.
fn literal_prefix(pattern: &str) -> Option<&str> {
    let literal = pattern.strip_prefix('^')?;
    let plain = |c: char| !c.is_whitespace() && !"\\.+*?()|[]{}^$#".contains(c);
    literal.chars().all(plain).then_some(literal)
}

/// The literal `L` of a route that matches every path starting with it:
/// `^L`, `^L.*` or `^L.*$` (`.` matches anything but a newline, which a
/// path as sent never holds, and a route applies when the path as sent
/// matches it).
fn covering_literal(pattern: &str) -> Option<&str> {
    let head = pattern
        .strip_suffix(".*$")
        .or_else(|| pattern.strip_suffix(".*"))
        .unwrap_or(pattern);
    literal_prefix(head)
}

/// Marks the policies whose budget another policy (a zone's rule on
/// another route, another group of the route counting alike) may spend
/// while this one denies: one with a higher limit for a window of the same
/// length. See [`Policy::shared`].
fn mark_shared(routes: &mut [CompiledRoute]) {
    // The highest limit of each window length, per budget: one pass over
    // the table, however many rules share a budget.
    let mut highest: HashMap<Box<str>, Vec<(u64, u32)>> = HashMap::new();
    let policies = routes.iter().flat_map(|r| r.rules.iter());
    for policy in policies.filter_map(|r| r.policy.as_ref()) {
        let lengths = highest.entry(policy.budget.clone()).or_default();
        for w in policy.windows.iter() {
            match lengths.iter_mut().find(|(micros, _)| *micros == w.micros()) {
                Some((_, limit)) => *limit = (*limit).max(w.limit()),
                None => lengths.push((w.micros(), w.limit())),
            }
        }
    }
    for rule in routes.iter_mut().flat_map(|r| r.rules.iter_mut()) {
        let Some(policy) = rule.policy.as_mut() else {
            continue;
        };
        let lengths = highest.get(&*policy.budget).map_or(&[][..], Vec::as_slice);
        let higher = policy.windows.iter().any(|own| {
            lengths
                .iter()
                .any(|&(micros, limit)| own.micros() == micros && own.limit() < limit)
        });
        // (Made just above, not shared yet: `get_mut` finds it alone. A
        // policy it missed would only keep its denials in the cache.)
        if let Some(policy) = Arc::get_mut(policy) {
            policy.shared = higher;
        }
    }
}

/// What a rule's policy takes from its route.
struct RouteContext<'a> {
    id: &'a str,
    pattern: &'a Arc<str>,
    global: Option<&'a [Window]>,
    shadow: bool,
    /// The table's own `shadow`, `headers` and `denial_cache`.
    table_shadow: bool,
    headers: HeaderMode,
    denial_cache: bool,
}

/// Rules of one route that share a budget key (the route's, or the route's
/// for one method) but count it otherwise (another algorithm or other
/// window lengths) than the budget's reference rule, the `default` group's
/// (else the first in the table), get a budget of their own per group: `/`
/// and the encoded group appended (`/` is in no encoding or route id). A
/// user whose group changes between requests would otherwise meet a state
/// laid out for other windows, which the stores would read as partly
/// counted. (Measured against the reference rule alone, not against each
/// other, so that a reloaded table that changes one group's rule moves no
/// other group's budget: the reference rule's budget never moves, and
/// another's only when its own rule, or the reference's, changes how it
/// counts.)
fn split_by_group(rules: &mut [CompiledRule]) {
    let mut reference: HashMap<&str, (Shape, bool)> = HashMap::new();
    for rule in rules.iter() {
        let Some(policy) = rule.policy.as_deref() else {
            continue;
        };
        let is_default = rule.group.as_str() == DEFAULT_GROUP;
        match reference.get(&*policy.budget) {
            Some((_, true)) => {}
            Some((_, false)) if !is_default => {}
            _ => {
                reference.insert(&policy.budget, (policy.shape(), is_default));
            }
        }
    }
    let differs: Vec<bool> = rules
        .iter()
        .map(|rule| {
            rule.policy.as_deref().is_some_and(|policy| {
                reference
                    .get(&*policy.budget)
                    .is_some_and(|(shape, _)| *shape != policy.shape())
            })
        })
        .collect();
    for (rule, differs) in rules.iter_mut().zip(differs) {
        let group = rule.group.as_str().to_owned();
        if let Some(policy) = rule.policy.as_mut().and_then(Arc::get_mut) {
            if differs {
                policy.budget =
                    format!("{}/{}", policy.budget, key::encode(group.as_bytes())).into();
            }
        }
    }
}

fn compile_rule(
    rule: &Rule,
    at: Location,
    route: &RouteContext<'_>,
    earlier: &[&CompiledRule],
) -> Result<CompiledRule, ConfigError> {
    let fail = |field: Option<&str>, kind| {
        let mut at = at.clone();
        at.field = field.map(str::to_owned);
        ConfigError::new(at, kind)
    };
    if rule.group.is_empty() {
        return Err(fail(Some("group"), ConfigErrorKind::EmptyName));
    }
    let method = match &rule.method {
        None => None,
        Some(m) => Some(
            Method::from_bytes(m.as_bytes())
                .map_err(|_| fail(Some("method"), ConfigErrorKind::InvalidMethod(m.clone())))?,
        ),
    };
    // An earlier rule for the same group whose method is the same, or any,
    // would always be picked first.
    if earlier.iter().any(|e| {
        e.group.is(&rule.group)
            && match (&e.method, &method) {
                (None, _) => true,
                (Some(e), Some(m)) => applies(e, m),
                (Some(_), None) => false,
            }
    }) {
        return Err(fail(None, ConfigErrorKind::UnreachableRule));
    }
    let windows = rule.compile_windows(fail)?;
    // Limits the algorithm cannot count exactly (the route-wide windows
    // are counted with this rule's algorithm too, when it has windows: an
    // unlimited group never counts them).
    let route_wide = match windows.is_empty() {
        true => &[][..],
        false => route.global.unwrap_or(&[]),
    };
    let user = windows.iter().map(|w| (w, false));
    for (w, global) in user.chain(route_wide.iter().map(|w| (w, true))) {
        let too_many = match rule.algorithm {
            Algorithm::SlidingLog => w.limit() > MAX_LOG_LIMIT,
            Algorithm::TokenBucket => u64::from(w.limit()) > w.micros(),
            Algorithm::SlidingWindow | Algorithm::FixedWindow => false,
        };
        if too_many {
            // (The field that wrote the window: `second`, `windows[1]`,
            // `limits`; the route's own `global` for a route-wide one.)
            let named = rule
                .windows
                .iter()
                .find(|(_, d, _)| *d == Some(w.duration()))
                .map(|(name, ..)| name.as_str());
            let field = match (global, named) {
                (false, Some(name)) => name.to_owned(),
                (true, _) => "global".to_owned(),
                (false, None) => format!("window of {:?}", w.duration()),
            };
            return Err(fail(
                Some(&field),
                ConfigErrorKind::LimitForAlgorithm(rule.algorithm),
            ));
        }
    }
    if let Some(why) = &rule.block_time_error {
        return Err(fail(
            Some("block_time"),
            ConfigErrorKind::InvalidBlockTime(why.clone()),
        ));
    }
    if rule.block_time.is_some() && windows.is_empty() {
        return Err(fail(Some("block_time"), ConfigErrorKind::NoEffect));
    }
    if rule.cost.is_some() && windows.is_empty() {
        return Err(fail(Some("cost"), ConfigErrorKind::NoEffect));
    }
    let cost = rule_cost(rule, &windows, route_wide)
        .map_err(|why| fail(Some("cost"), ConfigErrorKind::InvalidCost(why)))?;
    if rule.zone.as_deref() == Some("") {
        return Err(fail(Some("zone"), ConfigErrorKind::EmptyName));
    }
    if let Some(block) = rule.block_time {
        if block < Duration::from_millis(1) || block > MAX_WINDOW {
            return Err(fail(Some("block_time"), ConfigErrorKind::InvalidDuration));
        }
    }
    let policy = if windows.is_empty() {
        None
    } else {
        let budget = match (&rule.zone, &method) {
            (Some(zone), _) => format!("z{}", key::encode(zone.as_bytes())),
            (None, Some(m)) => format!("{}.{}", route.id, key::encode(m.as_str().as_bytes())),
            (None, None) => route.id.to_owned(),
        };
        let global = route.global.map(|windows| GlobalPolicy {
            budget: format!("{}:*", route.id).into(),
            windows: windows.into(),
        });
        let limits = windows
            .iter()
            .chain(route.global.unwrap_or(&[]))
            .map(|w| crate::decision::limit_text(w.limit()))
            .collect();
        Some(Arc::new(Policy {
            id: NEXT_ID.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
            budget: budget.into_boxed_str(),
            shared: false,
            ietf_policy: ietf_policy(&windows, route.global.unwrap_or(&[])),
            window_headers: window_headers(&windows, route.global.unwrap_or(&[])),
            limits,
            windows: windows.into(),
            algorithm: rule.algorithm,
            global,
            block: rule.block_time,
            cost,
            shadow: route.shadow,
            table_shadow: route.table_shadow,
            denial_cache: route.denial_cache,
            headers: route.headers,
            route: route.pattern.clone(),
            shadow_log: Arc::default(),
        }))
    };
    Ok(CompiledRule {
        group: crate::key::ShortStr::new(&rule.group),
        method,
        policy,
    })
}

/// The key of `table` that keeps it from reading as `T` (an unknown field,
/// a value of the wrong type): the first one without which it reads; in a
/// table under it that does not read alone (`global`), the key there too,
/// as `global.second`, by `inner`.
fn offending_key<T: serde::de::DeserializeOwned>(
    table: &toml::Value,
    inner: impl Fn(&str, &toml::Value) -> Option<String>,
) -> Option<String> {
    let table = table.as_table()?;
    // (Each try copies the table: a table of many keys, all unknown, would
    // cost their square. No rule or route has this many fields.)
    if table.len() > 64 {
        return None;
    }
    table.keys().find_map(|key| {
        let mut without = table.clone();
        let value = without.remove(key)?;
        T::deserialize(toml::Value::Table(without)).ok()?;
        Some(inner(key, &value).unwrap_or_else(|| key.clone()))
    })
}

/// The route, rule and field a configuration's parse error is in, when the
/// text is TOML and the error is in one route's fields (an unknown field,
/// a value of the wrong type, a missing `path`): the first route, and its
/// first rule, that do not read alone, and the field without which they
/// would. The parse error itself gives the line and column.
fn parse_error_at(text: &str) -> Location {
    let Ok(table) = toml::from_str::<toml::Table>(text) else {
        return Location::default();
    };
    let Some(routes) = table.get("routes").and_then(toml::Value::as_array) else {
        return Location::default();
    };
    // (A field's text; a value of another type as TOML writes it, the
    // very value at fault when it is the error.)
    let text_of = |value: &toml::Value, key: &str| {
        value.get(key).map(|v| match v.as_str() {
            Some(text) => text.to_owned(),
            None => v.to_string(),
        })
    };
    let Some((i, route)) = routes
        .iter()
        .enumerate()
        .find(|(_, route)| RawRoute::deserialize((*route).clone()).is_err())
    else {
        return Location::default();
    };
    let rule = route
        .get("rules")
        .and_then(toml::Value::as_array)
        .and_then(|rules| {
            rules
                .iter()
                .enumerate()
                .find(|(_, rule)| RawRule::deserialize((*rule).clone()).is_err())
        })
        .map(|(j, rule)| {
            let group = text_of(rule, "group").unwrap_or_else(|| DEFAULT_GROUP.to_owned());
            // (A window of the list by its index, as range errors name it.)
            let window = |key: &str, value: &toml::Value| {
                let windows = value.as_array().filter(|_| key == "windows")?;
                let i = windows
                    .iter()
                    .position(|w| RawWindow::deserialize(w.clone()).is_err())?;
                Some(format!("windows[{i}]"))
            };
            (j, group, offending_key::<RawRule>(rule, window))
        });
    let field = match &rule {
        Some((_, _, field)) => field.clone(),
        None if !route.get("path").is_some_and(toml::Value::is_str) => Some("path".to_owned()),
        // (Only `global` is a table of windows to look into: another
        // key's value, `rules = { .. }` or an unknown `[routes.extra]`, is
        // wrong whole.)
        None => offending_key::<RawRoute>(route, |key, value| {
            let inner =
                (key == "global").then(|| offending_key::<RawWindows>(value, |_, _| None))??;
            Some(format!("{key}.{inner}"))
        }),
    };
    // (A path that is no string is no pattern to name the route by.)
    let path = route.get("path").and_then(toml::Value::as_str);
    Location {
        route: Some((i, path.unwrap_or_default().to_owned())),
        rule: rule.map(|(j, group, _)| (j, group)),
        field,
    }
}

/// A rule's [`Rule::cost`] (1 if not set), or why it can never pass:
/// negative or too large for a `u32`, above a limit of its windows or of
/// the route-wide ones, or above [`MAX_LOG_COST`] on a sliding log.
fn rule_cost(rule: &Rule, windows: &[Window], route_wide: &[Window]) -> Result<u32, String> {
    let Some(raw) = rule.cost else {
        return Ok(1);
    };
    let cost = u32::try_from(raw)
        .map_err(|_| format!("{raw} is not a cost: a whole number from 0 (free) to 4294967295"))?;
    let own = windows.iter().map(|w| (w, "the "));
    if let Some((w, whose)) = own
        .chain(route_wide.iter().map(|w| (w, "the route-wide ")))
        .find(|(w, _)| cost > w.limit())
    {
        return Err(format!(
            "{cost} is more than {whose}limit of {} per {:?}: no request could ever pass",
            w.limit(),
            w.duration()
        ));
    }
    if rule.algorithm == Algorithm::SlidingLog && cost > MAX_LOG_COST {
        return Err(format!(
            "{cost} is more than a sliding log takes for one request ({MAX_LOG_COST}): use another algorithm"
        ));
    }
    Ok(cost)
}

/// A rate-limit configuration file.
///
/// ```
/// use tower_ratelimit::Config;
///
/// let config = Config::from_toml(r#"
///     headers = "both"                 # x | ietf | both | none | x-windows
///     shadow = false                   # true: never deny, only log and set headers
///     denial_cache = true              # false: every denial asks the store
///
///     [exclude]
///     paths = ["^/health"]
///     methods = ["OPTIONS"]
///
///     [groups]
///     "admin-key" = "admin"
///
///     [[routes]]
///     path = "^/towns"
///     rules = [{ group = "default", second = 1 }, { group = "admin" }]
///
///     [[routes]]
///     path = "^/search"
///     global = { second = 100 }        # shared by every user of the route
///     rules = [{ second = 5, block_time = 60 }]
///
///     [[routes]]
///     path = "^/items"                 # writes cost five reads
///     rules = [{ method = "POST", minute = 100, cost = 5 }, { minute = 100 }]
/// "#)?;
/// assert_eq!(config.groups()["admin-key"], "admin");
/// assert_eq!(config.rules().len(), 3);
/// # Ok::<(), tower_ratelimit::ConfigError>(())
/// ```
///
/// Fields of a rule: `group` (default `"default"`), `method`, `zone`,
/// `algorithm`, `block_time` (seconds, or a duration with its unit:
/// `"5m"`, `"90s"`, `"1h 30m"`, `"500ms"`), `cost` (what each request it
/// limits costs, 1 by default: [`Rule::cost`]), `second`, `minute`, `hour`, `day`,
/// `month`, `limits = "5/second; 100 per minute"` (Flask-Limiter's notation) and
/// `windows = [{ seconds = 10, limit = 5 }]` (`millis` instead of `seconds`
/// for sub-second windows). A route has `path`, `rules`, `global` (window
/// fields only: `second` to `month`, `limits`, `windows`) and `shadow`.
/// Unknown fields are errors.
#[derive(Clone, Debug)]
pub struct Config {
    groups: BTreeMap<String, String>,
    /// The groups some rule names (`default` for a rule without `group`).
    named: BTreeSet<String>,
    rules: Rules,
}

impl Config {
    /// Parses and validates a TOML configuration.
    pub fn from_toml(text: &str) -> Result<Self, ConfigError> {
        let raw: RawConfig = toml::from_str(text).map_err(|e| {
            ConfigError::new(parse_error_at(text), ConfigErrorKind::Parse(e.to_string()))
        })?;
        let mut builder = Rules::builder()
            .shadow(raw.shadow)
            .headers(raw.headers.unwrap_or_default())
            .denial_cache(raw.denial_cache.unwrap_or(true));
        if let Some(exclude) = raw.exclude {
            for path in exclude.paths {
                builder = builder.exclude_path(path);
            }
            for method in exclude.methods {
                builder = builder.exclude_method(method);
            }
        }
        // (An empty or blank key names no one, an empty group no rule.)
        if let Some((key, _)) = raw
            .groups
            .iter()
            .find(|(key, group)| key.trim().is_empty() || group.trim().is_empty())
        {
            let at = Location::field(format!("groups.{key:?}"));
            return Err(ConfigError::new(at, ConfigErrorKind::EmptyName));
        }
        // (Nor is a key with blanks around it sent: HTTP drops them from a
        // header's value.)
        if let Some(key) = raw.groups.keys().find(|key| key.trim() != key.as_str()) {
            let at = Location::field(format!("groups.{key:?}"));
            return Err(ConfigError::new(
                at,
                ConfigErrorKind::Parse(
                    "a key with blanks before or after it never matches: HTTP drops them from a header's value"
                        .to_owned(),
                ),
            ));
        }
        let mut named = BTreeSet::new();
        for route in raw.routes {
            named.extend(
                route
                    .rules
                    .iter()
                    .map(|r| r.group.clone().unwrap_or_else(|| DEFAULT_GROUP.to_owned())),
            );
            let mut r = Route::new(route.path)
                .rules(route.rules.into_iter().map(RawRule::into_rule))
                .shadow(route.shadow);
            if let Some(global) = route.global {
                r = r.global(global.into_rule());
            }
            builder = builder.add_route(r);
        }
        Ok(Self {
            groups: raw.groups,
            named,
            rules: builder.build()?,
        })
    }

    /// The `[groups]` entries (key, group) whose group no rule of any route
    /// names. Their users are never limited: what a group left out on
    /// purpose means, and what a misspelt one does too, so a server had
    /// better say so at start-up (the example server warns about each).
    ///
    /// ```
    /// let config = tower_ratelimit::Config::from_toml(r#"
    ///     [groups]
    ///     "k1" = "admn"                    # a typo: `admin` was meant
    ///     "k2" = "admin"
    ///     [[routes]]
    ///     path = "^/"
    ///     rules = [{ second = 5 }, { group = "admin" }]
    /// "#)?;
    /// assert_eq!(config.groups_without_rules().collect::<Vec<_>>(), [("k1", "admn")]);
    /// # Ok::<(), tower_ratelimit::ConfigError>(())
    /// ```
    pub fn groups_without_rules(&self) -> impl Iterator<Item = (&str, &str)> {
        self.groups
            .iter()
            .filter(|(_, group)| !self.named.contains(group.as_str()))
            .map(|(key, group)| (key.as_str(), group.as_str()))
    }

    /// The `[groups]` table: API key to group name. The crate itself does
    /// not read it; identity functions (like the example server's) may.
    pub fn groups(&self) -> &BTreeMap<String, String> {
        &self.groups
    }

    /// The compiled rule table.
    pub fn rules(&self) -> &Rules {
        &self.rules
    }

    /// The compiled rule table, by value.
    pub fn into_rules(self) -> Rules {
        self.rules
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawConfig {
    #[serde(default)]
    groups: BTreeMap<String, String>,
    #[serde(default)]
    shadow: bool,
    headers: Option<HeaderMode>,
    denial_cache: Option<bool>,
    exclude: Option<RawExclude>,
    #[serde(default)]
    routes: Vec<RawRoute>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawExclude {
    #[serde(default)]
    paths: Vec<String>,
    #[serde(default)]
    methods: Vec<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawRoute {
    path: String,
    #[serde(default)]
    rules: Vec<RawRule>,
    global: Option<RawWindows>,
    #[serde(default)]
    shadow: bool,
}

/// The window fields, shared by rules and route-wide limits.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawWindows {
    second: Option<RawLimit>,
    minute: Option<RawLimit>,
    hour: Option<RawLimit>,
    day: Option<RawLimit>,
    month: Option<RawLimit>,
    windows: Option<Vec<RawWindow>>,
    limits: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawRule {
    group: Option<String>,
    method: Option<String>,
    zone: Option<String>,
    algorithm: Option<Algorithm>,
    block_time: Option<RawBlockTime>,
    cost: Option<RawCost>,
    // The window fields of `RawWindows` (serde's `flatten` cannot be combined
    // with `deny_unknown_fields`).
    second: Option<RawLimit>,
    minute: Option<RawLimit>,
    hour: Option<RawLimit>,
    day: Option<RawLimit>,
    month: Option<RawLimit>,
    windows: Option<Vec<RawWindow>>,
    limits: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawWindow {
    seconds: Option<RawSeconds>,
    millis: Option<RawMillis>,
    limit: RawLimit,
}

/// A whole number, or an error that says what the field takes (`what`)
/// rather than a Rust type's name.
fn whole_number<'de, D: serde::Deserializer<'de>>(
    d: D,
    what: &'static str,
) -> Result<i64, D::Error> {
    struct Visitor(&'static str);
    impl serde::de::Visitor<'_> for Visitor {
        type Value = i64;
        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str(self.0)
        }
        fn visit_i64<E: serde::de::Error>(self, n: i64) -> Result<i64, E> {
            Ok(n)
        }
        fn visit_u64<E: serde::de::Error>(self, n: u64) -> Result<i64, E> {
            i64::try_from(n).map_err(|_| E::custom(format_args!("{}, got {n}", self.0)))
        }
    }
    d.deserialize_i64(Visitor(what))
}

/// A window's `millis`.
struct RawMillis(u64);

impl<'de> Deserialize<'de> for RawMillis {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        const WHAT: &str = "a whole number of milliseconds, at least 1";
        let n = whole_number(d, WHAT)?;
        u64::try_from(n)
            .map(RawMillis)
            .map_err(|_| serde::de::Error::custom(format_args!("{WHAT}, got {n}")))
    }
}

/// A rule's `cost` (checked against its windows when the rule is built).
struct RawCost(i64);

impl<'de> Deserialize<'de> for RawCost {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        whole_number(d, "a cost: a whole number from 0 (free) to 4294967295").map(RawCost)
    }
}

/// A window's `seconds`: a whole number (a fraction is an error that
/// points to `millis`).
struct RawSeconds(u64);

impl<'de> Deserialize<'de> for RawSeconds {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Visitor;
        impl serde::de::Visitor<'_> for Visitor {
            type Value = RawSeconds;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a whole number of seconds (`millis` gives a window in milliseconds, `millis = 500` for half a second)")
            }
            fn visit_u64<E: serde::de::Error>(self, n: u64) -> Result<RawSeconds, E> {
                Ok(RawSeconds(n))
            }
            fn visit_i64<E: serde::de::Error>(self, n: i64) -> Result<RawSeconds, E> {
                u64::try_from(n).map(RawSeconds).map_err(|_| {
                    E::custom(format_args!(
                        "a window's `seconds` is a whole number of at least 1, got {n}"
                    ))
                })
            }
        }
        d.deserialize_u64(Visitor)
    }
}

/// A rule's `block_time` as a file writes it: a number of seconds (`300`,
/// `0.5`) or a duration with its unit (`"5m"`, `"90s"`, `"1h 30m"`,
/// `"500ms"`), read by [`parse_duration`] when the rule is made (so that
/// its errors name the route, the rule and the field). A negative, NaN or
/// infinite number is out of range, which the builder reports against
/// `block_time` (as it does a zero or a huge one).
enum RawBlockTime {
    /// A number no duration is.
    OutOfRange,
    /// A positive number as text (`0.5`), or the file's text.
    Text(String),
}

impl<'de> Deserialize<'de> for RawBlockTime {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Visitor;
        impl serde::de::Visitor<'_> for Visitor {
            type Value = RawBlockTime;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, "a block time: {BLOCK_TIME_FORMS}")
            }
            fn visit_f64<E: serde::de::Error>(self, secs: f64) -> Result<RawBlockTime, E> {
                // (A float's `Display` is its shortest exact decimal, never
                // in exponent form: `1.0001` is read as `"1.0001"` is.)
                Ok(if secs.is_finite() && secs > 0.0 {
                    RawBlockTime::Text(secs.to_string())
                } else {
                    RawBlockTime::OutOfRange
                })
            }
            fn visit_i64<E: serde::de::Error>(self, secs: i64) -> Result<RawBlockTime, E> {
                Ok(if secs > 0 {
                    RawBlockTime::Text(secs.to_string())
                } else {
                    RawBlockTime::OutOfRange
                })
            }
            fn visit_u64<E: serde::de::Error>(self, secs: u64) -> Result<RawBlockTime, E> {
                self.visit_i64(i64::try_from(secs).unwrap_or(i64::MAX))
            }
            fn visit_str<E: serde::de::Error>(self, text: &str) -> Result<RawBlockTime, E> {
                Ok(RawBlockTime::Text(text.to_owned()))
            }
        }
        d.deserialize_any(Visitor)
    }
}

impl RawBlockTime {
    /// The duration, or why the text is none.
    fn read(&self) -> Result<Duration, String> {
        match self {
            RawBlockTime::OutOfRange => Ok(Duration::ZERO),
            // (Why first: the line is cut at 400 bytes, after the route's
            // and the group's names.)
            RawBlockTime::Text(text) => parse_duration(text)
                .map_err(|why| format!("{why}, in {}; write {BLOCK_TIME_FORMS}", shown(text))),
        }
    }
}

/// The units a duration may have, for its errors.
const DURATION_UNITS: &str = "ms, s, m or min, h, d, month, year";

/// How a block time is written, for its errors.
const BLOCK_TIME_FORMS: &str = "a number of seconds (`block_time = 300`) or a duration with its unit (`block_time = \"5m\"`, `\"90s\"`, `\"1h 30m\"`, `\"500ms\"`)";

/// A duration written with units, as durations are in Go, systemd or
/// humantime: numbers each followed by a unit (`5m`, `1h 30m`, `1.5s`,
/// `500ms`; a lone number, `300` or `2.5`, is seconds). Units are those of a limit text
/// (see [`Rule::limits`]), and `m` for minutes. The total must be a whole
/// number of milliseconds; a total of zero is returned as zero, for the
/// caller's range check to report.
fn parse_duration(text: &str) -> Result<Duration, String> {
    let mut rest = text.trim();
    if rest.is_empty() {
        return Err("it is empty".to_owned());
    }
    // (`1,000s` would be a thousand seconds in some places, one and a bit
    // in others, and `,` separates the items of a limit text.)
    if rest.contains(',') {
        return Err("write numbers without `,` (`1000s`; a fraction with `.`)".to_owned());
    }
    let number_len = |text: &str| {
        text.find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(text.len())
    };
    // A lone number is seconds.
    let lone = number_len(rest) == rest.len();
    let mut total: u64 = 0;
    while !rest.is_empty() {
        let (number, after) = rest.split_at(number_len(rest));
        if after.starts_with('-') && number.is_empty() {
            return Err("a block time is not negative".to_owned());
        }
        if !number.bytes().any(|b| b.is_ascii_digit()) {
            return Err(format!("expected a number at {}", shown(rest)));
        }
        let after = after.trim_start();
        let unit_len = after
            .find(|c: char| !c.is_alphabetic())
            .unwrap_or(after.len());
        let (unit, after) = after.split_at(unit_len);
        // (`M` is a month to some, a minute to others.)
        if unit == "M" {
            return Err(
                "`M` could be a minute or a month: write `m` or `min`, or `month`".to_owned(),
            );
        }
        let unit = unit.to_ascii_lowercase();
        let unit_ms = match unit.as_str() {
            "" if lone => 1_000,
            "m" => 60_000,
            u => unit_ms(u).ok_or_else(|| {
                if u.is_empty() {
                    format!("{} has no unit ({DURATION_UNITS})", shown(number))
                } else {
                    format!("unknown unit {} ({DURATION_UNITS})", shown(u))
                }
            })?,
        };
        let (whole, fraction) = number.split_once('.').unwrap_or((number, ""));
        if fraction.contains('.') {
            return Err(format!("{} is not a number", shown(number)));
        }
        // (Exact: `1.000000000000000000000h` is an hour.)
        let fraction = fraction.trim_end_matches('0');
        let exact = format!("{whole}.{fraction}");
        let ms = match decimal_times(&exact, unit_ms) {
            Some(ms) => ms,
            // (Longer than any block: the range check reports it.)
            None if decimal_times(whole, unit_ms).is_none() => u64::MAX,
            None => {
                return Err(format!(
                    "{} is not a whole number of milliseconds",
                    shown(&format!("{number}{unit}"))
                ))
            }
        };
        total = total.saturating_add(ms);
        rest = after.trim_start();
    }
    Ok(Duration::from_millis(total))
}

/// A limit as a configuration file writes it: any integer (a zero or
/// negative one is reported by the window's check, naming its field);
/// anything else (`1.5`, `"10"`, a number beyond 64 bits) is an error that
/// says what a limit is.
struct RawLimit(i64);

impl<'de> Deserialize<'de> for RawLimit {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Visitor;
        impl serde::de::Visitor<'_> for Visitor {
            type Value = RawLimit;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, "a limit: a whole number from 1 to {}", u32::MAX)
            }
            fn visit_i64<E: serde::de::Error>(self, n: i64) -> Result<RawLimit, E> {
                Ok(RawLimit(n))
            }
            fn visit_u64<E: serde::de::Error>(self, n: u64) -> Result<RawLimit, E> {
                // (Beyond i64: far beyond any limit, reported with the
                // number as written.)
                i64::try_from(n).map(RawLimit).map_err(|_| {
                    E::custom(format!(
                        "a limit is a whole number from 1 to {}, got {n}",
                        u32::MAX
                    ))
                })
            }
        }
        d.deserialize_i64(Visitor)
    }
}

impl RawWindows {
    fn into_rule(self) -> Rule {
        let mut rule = Rule::new();
        self.add_to(&mut rule);
        rule
    }

    fn add_to(self, rule: &mut Rule) {
        let named = [
            ("second", 1, self.second),
            ("minute", 60, self.minute),
            ("hour", 3600, self.hour),
            ("day", 86_400, self.day),
            ("month", 30 * 86_400, self.month),
        ];
        for (name, secs, limit) in named {
            if let Some(RawLimit(limit)) = limit {
                rule.push_raw(name.to_owned(), Some(Duration::from_secs(secs)), limit);
            }
        }
        if self.windows.as_ref().is_some_and(Vec::is_empty) {
            rule.notation_error = Some((
                "windows".to_owned(),
                "`windows = []` holds no window (leave `windows` out for a rule without limits)"
                    .to_owned(),
            ));
        }
        for (i, w) in self.windows.into_iter().flatten().enumerate() {
            // Exactly one of `seconds` and `millis`; anything else is
            // reported against this window by the builder.
            let duration = match (w.seconds, w.millis) {
                (Some(RawSeconds(s)), None) => Some(Duration::from_secs(s)),
                (None, Some(RawMillis(ms))) => Some(Duration::from_millis(ms)),
                _ => None,
            };
            rule.push_raw(format!("windows[{i}]"), duration, w.limit.0);
        }
        if let Some(text) = self.limits {
            rule.add_limits(&text);
        }
    }
}

impl RawRule {
    fn into_rule(self) -> Rule {
        let mut rule = Rule::group(self.group.unwrap_or_else(|| DEFAULT_GROUP.to_owned()));
        rule.method = self.method.map(|m| m.to_ascii_uppercase());
        rule.zone = self.zone;
        rule.algorithm = self.algorithm.unwrap_or_default();
        rule.cost = self.cost.map(|RawCost(n)| n);
        let block_time = self.block_time.map(|raw| raw.read());
        let limits = RawWindows {
            second: self.second,
            minute: self.minute,
            hour: self.hour,
            day: self.day,
            month: self.month,
            windows: self.windows,
            limits: self.limits,
        };
        limits.add_to(&mut rule);
        match block_time {
            Some(Ok(duration)) => rule.block_time = Some(duration),
            Some(Err(why)) => rule.block_time_error = Some(why),
            None => {}
        }
        rule
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn matched(rules: &Rules, path: &str) -> Vec<usize> {
        match rules.candidates(&Method::GET, path) {
            None => Vec::new(),
            Some(Candidates::Mask(m)) => (0..64).filter(|i| m & (1 << i) != 0).collect(),
            Some(Candidates::Many(v)) => v.into_iter().map(|i| i as usize).collect(),
        }
    }

    /// Every window of a rule has a name of its own in the headers, those
    /// that are not whole milliseconds (made by hand) included.
    #[test]
    fn windows_of_a_rule_never_share_a_header_name() {
        let window = |us, limit| Window::new(Duration::from_micros(us), limit).unwrap();
        let user = [window(1_500, 1), window(2_000, 5), window(2_000_000, 7)];
        let route = [window(1_500, 9)];
        let names: Vec<_> = (0..4)
            .map(|i| ietf_name(user.get(i).unwrap_or(&route[0]), i, 3))
            .collect();
        assert_eq!(names, ["1500us", "2ms", "2s", "route-1500us"]);
        let headers = window_headers(&user, &route);
        let limits: Vec<_> = headers
            .iter()
            .map(|h| h.as_ref().unwrap().0.as_str().to_owned())
            .collect();
        assert_eq!(
            limits,
            [
                "x-ratelimit-limit-1500us",
                "x-ratelimit-limit-2ms",
                "x-ratelimit-limit-2s",
                "x-ratelimit-limit-route-1500us"
            ]
        );
        let policy = ietf_policy(&user, &route).unwrap();
        assert_eq!(
            policy.to_str().unwrap(),
            r#""1500us";q=1, "2ms";q=5, "2s";q=7;w=2, "route-1500us";q=9"#
        );
    }

    /// Prefix tables and regex sets, routes and exclusions alike, see the
    /// path decoded; an encoded slash stays one, in capitals.
    #[test]
    fn patterns_see_the_path_percent_decoded() {
        let prefixes = Rules::builder()
            .route("^/users/admin", [Rule::new().second(1)])
            .route("^/café", [Rule::new().second(1)])
            .route("^/files/a%2Fb", [Rule::new().second(1)])
            .build()
            .unwrap();
        let regexes = Rules::builder()
            .route("^/users/admin$", [Rule::new().second(1)])
            .route("^/café$", [Rule::new().second(1)])
            .route("^/files/a%2Fb$", [Rule::new().second(1)])
            .exclude_path("^/users/admin/health$")
            .build()
            .unwrap();
        for rules in [&prefixes, &regexes] {
            assert_eq!(matched(rules, "/users/%61dmin"), [0]);
            assert_eq!(matched(rules, "/users/%61%64%6D%69%6e"), [0]);
            assert_eq!(matched(rules, "/caf%C3%A9"), [1]);
            assert_eq!(matched(rules, "/files/a%2fb"), [2]);
            assert_eq!(matched(rules, "/files/a/b"), Vec::<usize>::new());
            // (`%252F` is the text `%2F`, not an encoded slash.)
            assert_eq!(matched(rules, "/files/a%252Fb"), Vec::<usize>::new());
            assert_eq!(matched(rules, "/users/%2561dmin"), Vec::<usize>::new());
        }
        // A pattern written encoded still matches the path as sent.
        assert_eq!(matched(&regexes, "/caf%C3%A9"), [1]);
        // A newline spelled `%0A` escapes no pattern: the path as sent
        // still matches.
        let dotted = Rules::builder()
            .route("^/users/.+/posts$", [Rule::new().second(1)])
            .build()
            .unwrap();
        assert_eq!(matched(&dotted, "/users/x%0A/posts"), [0]);
        // An exclusion applies when both spellings match it: `/%68ealth`
        // is not routed as `/health`.
        let excluding = Rules::builder()
            .route("^/", [Rule::new().second(1)])
            .exclude_path("^/health")
            .build()
            .unwrap();
        assert_eq!(matched(&excluding, "/health"), Vec::<usize>::new());
        assert_eq!(matched(&excluding, "/health/%41"), Vec::<usize>::new());
        assert_eq!(matched(&excluding, "/%68ealth"), [0]);
        // Past 64 routes too, both spellings' routes in table order.
        let mut many = Rules::builder();
        for i in 0..70 {
            many = many.route(format!("^/none{i}$"), [Rule::new().second(1)]);
        }
        let many = many
            .route("^/users/%61dmin$", [Rule::new().second(1)])
            .route("^/users/admin$", [Rule::new().second(1)])
            .build()
            .unwrap();
        assert_eq!(matched(&many, "/users/%61dmin"), [70, 71]);
        assert_eq!(matched(&many, "/users/%61%64min"), [71]);
        // What is not an escape stays; bytes that are not UTF-8 too, as
        // U+FFFD.
        assert_eq!(decode_path("/a%zz/%4/%"), "/a%zz/%4/%");
        assert_eq!(decode_path("/%ff%41"), "/\u{fffd}A");
        assert_eq!(decode_path("/%2541"), "/%41");
    }

    /// The budget of the rule `rules` picks for `group` on `path` (GET).
    fn budget(rules: &Rules, path: &str, group: &str) -> String {
        let candidates = rules.candidates(&Method::GET, path).unwrap();
        let rule = rules.select(&candidates, group, &Method::GET).unwrap();
        rule.policy.as_ref().unwrap().budget.to_string()
    }

    #[test]
    fn groups_that_count_a_route_differently_get_budgets_of_their_own() {
        let rules = Rules::builder()
            .route(
                "^/a",
                [
                    Rule::new().minute(2),
                    // Same windows, another limit: the same budget.
                    Rule::group("more").minute(20),
                    Rule::group("pro").minute(20).hour(100),
                    Rule::group("tb")
                        .minute(2)
                        .algorithm(Algorithm::TokenBucket),
                ],
            )
            .route(
                "^/b",
                [Rule::new().minute(2), Rule::group("more").minute(9)],
            )
            .build()
            .unwrap();
        let route = key::pattern_id("^/a");
        // (The default group's rule is the reference: its budget, and
        // that of a group counting alike, is the route's.)
        assert_eq!(budget(&rules, "/a", "default"), route);
        assert_eq!(budget(&rules, "/a", "more"), route);
        assert_eq!(budget(&rules, "/a", "pro"), format!("{route}/pro"));
        assert_eq!(budget(&rules, "/a", "tb"), format!("{route}/tb"));
        // A route whose groups all count alike keeps one budget.
        let route = key::pattern_id("^/b");
        assert_eq!(budget(&rules, "/b", "default"), route);
        assert_eq!(budget(&rules, "/b", "more"), route);
    }

    #[test]
    fn a_get_rule_limits_head_too() {
        let rules = Rules::builder()
            .route("^/a", [Rule::new().method("GET").minute(2)])
            .build()
            .unwrap();
        let candidates = rules.candidates(&Method::HEAD, "/a").unwrap();
        assert!(rules
            .select(&candidates, "default", &Method::HEAD)
            .is_some());
        assert!(rules
            .select(&candidates, "default", &Method::POST)
            .is_none());
        // A HEAD rule after a GET rule of the same group is unreachable.
        let err = Rules::builder()
            .route(
                "^/a",
                [
                    Rule::new().method("GET").minute(2),
                    Rule::new().method("HEAD").minute(9),
                ],
            )
            .build()
            .unwrap_err();
        assert!(matches!(err.kind(), ConfigErrorKind::UnreachableRule));
    }

    /// The route set's cache holds what the lazy DFA needs, forward and
    /// backward, for tables of Unicode classes too (below it the engine
    /// would build no lazy DFA and match every path with its slowest one):
    /// 2,000 routes of `\d+` needed four times the cache a count of
    /// routes gave them.
    #[test]
    fn the_route_sets_cache_fits_its_lazy_dfas() {
        use regex_automata::hybrid::dfa::DFA;
        use regex_automata::nfa::thompson::{Compiler, Config, WhichCaptures};
        for (shape, n) in [
            ("^/r{}/items/\\d+$", 2_000),
            ("^/u{}/\\w+$", 300),
            ("^/p{}/[0-9]+$", 2_000),
        ] {
            let patterns: Vec<String> = (0..n)
                .map(|i| shape.replace("{}", &i.to_string()))
                .collect();
            let mut states = [0, 0];
            for p in &patterns {
                let checked = check_pattern(p).unwrap();
                states[0] += checked.states[0];
                states[1] += checked.states[1];
            }
            let capacity = set_cache_capacity(n, states);
            for reverse in [false, true] {
                let nfa = Compiler::new()
                    .configure(
                        Config::new()
                            .reverse(reverse)
                            .which_captures(WhichCaptures::None)
                            .nfa_size_limit(None),
                    )
                    .build_many(&patterns)
                    .unwrap();
                let build = |capacity| {
                    DFA::builder()
                        .configure(
                            DFA::config()
                                .cache_capacity(capacity)
                                .match_kind(regex_automata::MatchKind::All)
                                .starts_for_each_pattern(true),
                        )
                        .build_from_nfa(nfa.clone())
                        .is_ok()
                };
                assert!(build(capacity), "{shape} x{n}, reverse {reverse}");
                if reverse && shape.contains("\\d") {
                    // (What a count of routes alone gave it.)
                    assert!(!build((2 << 20).max(n * 2048)), "{shape}");
                }
            }
        }
    }

    /// Routes compared by their automata: covered or not, and not told
    /// (no warning) when the search runs out of states or an automaton
    /// cannot be built.
    #[test]
    fn routes_are_compared_by_their_automata_within_a_budget() {
        let hirs: Vec<Option<regex_syntax::hir::Hir>> = [
            "^/v[0-9]",
            "^/v1/[a-z]+$",
            "^/v1/x",
            "(?i)\\b\\w+\\b",
            "^/v2",
        ]
        .iter()
        .map(|p| check_pattern(p).ok().map(|c| c.hir))
        .collect();
        let mut inclusion = Inclusion::new(&hirs);
        assert!(inclusion.covers(0, 1));
        assert!(inclusion.covers(0, 2));
        assert!(!inclusion.covers(1, 0));
        assert!(!inclusion.covers(1, 2));
        // (No literal prefix in common: not searched.)
        assert!(!inclusion.may_overlap(2, 4));
        // A Unicode `\b`: no automaton, no answer.
        assert!(!inclusion.covers(3, 1));
        assert_eq!(inclusion.failed, 1);
        let [Some(Some(e)), Some(Some(l))] = [&inclusion.dfas[0], &inclusion.dfas[1]] else {
            panic!("no automata");
        };
        assert_eq!(covers(e, l, &mut 1), None);
        assert_eq!(covers(e, l, &mut 0), None);
        let mut budget = 100;
        assert_eq!(covers(e, l, &mut budget), Some(true));
        assert!(budget < 100);
    }

    #[test]
    fn literal_prefixes_are_recognised_and_nothing_else() {
        assert_eq!(literal_prefix("^/api/v1"), Some("/api/v1"));
        assert_eq!(literal_prefix("^/"), Some("/"));
        for pattern in [
            "/api", "^/api$", "^/a.i", "^/(a|b)", "^/a\\d", "^/a b", "^/[a]",
        ] {
            assert_eq!(literal_prefix(pattern), None, "{pattern}");
        }
    }

    #[test]
    fn tables_of_more_than_64_routes_match_and_select_in_order() {
        for literal in [true, false] {
            let mut builder = Rules::builder();
            for i in 0..100 {
                let pattern = match literal {
                    true => format!("^/r{i}/"),
                    false => format!("^/r{i}/.*"),
                };
                builder = builder.route(pattern, [Rule::new().second(1)]);
            }
            let last = if literal { "^/" } else { "^/.*" };
            let rules = builder
                .route(last, [Rule::new().second(2), Rule::group("g").second(3)])
                .build()
                .unwrap();
            assert_eq!(rules.inner.prefixes.is_some(), literal);
            assert!(matches!(
                rules.candidates(&Method::GET, "/r70/x"),
                Some(Candidates::Many(_))
            ));
            assert_eq!(matched(&rules, "/r70/x"), [70, 100], "literal: {literal}");
            assert_eq!(matched(&rules, "/elsewhere"), [100]);
            // The first matched route with a rule for the group applies.
            let catch_all = budget(&rules, "/elsewhere", "default");
            assert_ne!(budget(&rules, "/r70/x", "default"), catch_all);
            assert_eq!(
                budget(&rules, "/r70/x", "g"),
                budget(&rules, "/elsewhere", "g")
            );
        }
    }

    /// A route whose pattern matches later in the path, or ends later, than
    /// an earlier route's is still a candidate (regression: the regex set
    /// once ran leftmost-first, and an overlapping search stopped at the
    /// first route's match).
    #[test]
    fn every_route_matching_the_path_is_a_candidate() {
        let tables: [(&[&str], &str, &[usize]); 5] = [
            (&["^/api", "^/api/v[0-9]+/"], "/api/v1/x", &[0, 1]),
            (&["^/z", "^/z/", "/y$"], "/z/1", &[0, 1]),
            (&["^/a", "towns"], "/a/towns", &[0, 1]),
            (&["^/a", "towns", "^/a/t"], "/a/towns/y", &[0, 1, 2]),
            (&["o", "^/b", "b.*x$"], "/foobar/x", &[0, 2]),
        ];
        for (patterns, path, expected) in tables {
            let mut builder = Rules::builder();
            for p in patterns {
                builder = builder.route(*p, [Rule::new().second(1)]);
            }
            let rules = builder.build().unwrap();
            assert!(rules.inner.prefixes.is_none(), "{patterns:?}");
            assert_eq!(matched(&rules, path), expected, "{patterns:?} {path:?}");
        }
        // So a later route applies when the first one has no rule for the
        // request's method (or group).
        let rules = Rules::builder()
            .route("^/api", [Rule::new().method("POST").minute(3)])
            .route("^/api/v[0-9]+/", [Rule::new().minute(5)])
            .build()
            .unwrap();
        assert_eq!(
            budget(&rules, "/api/v1/x", "default"),
            key::pattern_id("^/api/v[0-9]+/").to_string()
        );
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(64))]

        /// The routes a path matches, by the table's literal prefixes or its
        /// regex set, in up to 64 routes or more, are exactly those whose
        /// own regex matches it.
        #[test]
        fn candidates_are_the_routes_whose_regex_matches(
            patterns in proptest::collection::vec(
                (
                    proptest::bool::ANY,
                    proptest::collection::vec(
                        proptest::sample::select(vec![
                            "/a", "/b", "/a/", "/[0-9]+", "towns", ".*", "/y", "[ab]", "x?",
                        ]),
                        1..4,
                    ),
                    proptest::bool::weighted(0.2),
                ),
                1..8,
            ),
            paths in proptest::collection::vec(
                proptest::collection::vec(
                    proptest::sample::select(vec!["/a", "/b", "/1", "/23", "/y", "towns", "/x"]),
                    0..5,
                ),
                1..6,
            ),
            padding in proptest::sample::select(vec![0usize, 70]),
        ) {
            let patterns = patterns
                .into_iter()
                .map(|(anchored, atoms, end)| {
                    format!("{}{}{}", if anchored { "^" } else { "" }, atoms.concat(), if end { "$" } else { "" })
                })
                .collect::<Vec<String>>();
            // Routes that never match, to take the table past 64 routes.
            let mut table: Vec<String> = (0..padding).map(|i| format!("^/none{i}$")).collect();
            table.extend(patterns);
            table.sort();
            table.dedup();
            let mut builder = Rules::builder();
            for p in &table {
                builder = builder.route(p.as_str(), [Rule::new().second(1)]);
            }
            let rules = builder.build().unwrap();
            for path in paths {
                let path = path.concat();
                let expected: Vec<usize> = table
                    .iter()
                    .enumerate()
                    .filter(|(_, p)| regex::Regex::new(p).unwrap().is_match(&path))
                    .map(|(i, _)| i)
                    .collect();
                proptest::prop_assert_eq!(matched(&rules, &path), expected, "{:?} {:?}", table, path);
            }
        }
    }

    #[test]
    fn prefix_matching_agrees_with_the_regexes() {
        let literal = ["^/api/v1", "^/api", "^/static", "^/"];
        let mixed = ["^/api/v1", "^/api", "^/static", "^/.*"];
        let paths = ["/", "/api", "/api/v1/x", "/apix", "/static/a", "/x/api", ""];
        for patterns in [&literal[..], &mixed[..]] {
            let mut builder = Rules::builder();
            for p in patterns {
                builder = builder.route(*p, [Rule::new().second(1)]);
            }
            let rules = builder.build().unwrap();
            assert_eq!(rules.inner.prefixes.is_some(), patterns == &literal[..]);
            for path in paths {
                let expected: Vec<usize> = patterns
                    .iter()
                    .enumerate()
                    .filter(|(_, p)| regex::Regex::new(p).unwrap().is_match(path))
                    .map(|(i, _)| i)
                    .collect();
                assert_eq!(matched(&rules, path), expected, "{patterns:?} {path:?}");
            }
        }
    }
}
