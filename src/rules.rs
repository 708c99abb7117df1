//! The rule table: which requests are limited, for whom, and how much.
//!
//! A table is an ordered list of routes. Each route is a regular expression
//! over the request path and a list of [`Rule`]s, one per user group (and
//! optionally per method). A rule holds limits per window; a rule without
//! any window leaves its group unlimited.
//!
//! A request is limited by the **first** route whose pattern matches its
//! path **and** that has a rule for the request's group and method. All
//! patterns are matched in one pass with a [`regex::RegexSet`].
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

use std::collections::BTreeMap;
use std::fmt;
use std::num::NonZeroU32;
use std::sync::Arc;
use std::time::Duration;

use http::Method;
use regex::RegexSet;
use serde::Deserialize;

use crate::clock::duration_micros;
use crate::error::{ConfigError, ConfigErrorKind, Location};
use crate::key;

/// The most windows one rule may have.
pub const MAX_WINDOWS: usize = 8;

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
    windows: Vec<(String, Duration, i64)>,
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
            windows: Vec::new(),
        }
    }

    /// Applies the rule only to requests with this method (e.g. `"POST"`).
    pub fn method(mut self, method: impl AsRef<str>) -> Self {
        self.method = Some(method.as_ref().to_ascii_uppercase());
        self
    }

    /// Shares one budget between every route whose rule names this zone.
    pub fn zone(mut self, zone: impl Into<String>) -> Self {
        self.zone = Some(zone.into());
        self
    }

    /// How requests are counted.
    pub fn algorithm(mut self, algorithm: Algorithm) -> Self {
        self.algorithm = algorithm;
        self
    }

    fn named(mut self, name: &str, seconds: u64, limit: u32) -> Self {
        self.windows.push((
            name.to_owned(),
            Duration::from_secs(seconds),
            i64::from(limit),
        ));
        self
    }

    /// At most `limit` requests per second.
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
        self.windows.push((name, duration, i64::from(limit)));
        self
    }

    fn push_raw(&mut self, name: String, duration: Duration, limit: i64) {
        self.windows.push((name, duration, limit));
    }
}

/// The compiled limits of one rule: what one store check needs.
#[derive(Debug)]
pub(crate) struct Policy {
    /// The policy part of every budget key of this rule (see [`crate::key`]).
    pub(crate) budget: Box<str>,
    /// Sorted by duration, shortest first.
    pub(crate) windows: Arc<[Window]>,
    pub(crate) algorithm: Algorithm,
}

#[derive(Debug)]
pub(crate) struct CompiledRule {
    group: Box<str>,
    method: Option<Method>,
    /// `None`: the group is unlimited.
    pub(crate) policy: Option<Arc<Policy>>,
}

#[derive(Debug)]
struct Route {
    pattern: Box<str>,
    rules: Box<[CompiledRule]>,
}

/// A compiled, validated rule table. Cheap to clone.
#[derive(Clone)]
pub struct Rules {
    inner: Arc<RulesInner>,
}

struct RulesInner {
    set: RegexSet,
    routes: Box<[Route]>,
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

impl Rules {
    /// Starts an empty table.
    pub fn builder() -> RulesBuilder {
        RulesBuilder::default()
    }

    /// Parses and validates a TOML rule table (see [`Config`]).
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

    /// The routes whose pattern matches `path`; `None` when none does.
    pub(crate) fn candidates(&self, path: &str) -> Option<Candidates> {
        let inner = &*self.inner;
        let n = inner.routes.len();
        if n <= 64 {
            let mut hits = [false; 64];
            if !inner.set.matches_read_at(&mut hits[..n], path, 0) {
                return None;
            }
            let mask = hits[..n]
                .iter()
                .enumerate()
                .fold(0u64, |m, (i, &hit)| m | (u64::from(hit) << i));
            Some(Candidates::Mask(mask))
        } else {
            let matches = inner.set.matches(path);
            if !matches.matched_any() {
                return None;
            }
            Some(Candidates::Many(
                matches
                    .iter()
                    .filter_map(|i| u32::try_from(i).ok())
                    .collect(),
            ))
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
        let pick = |i: usize| {
            self.inner.routes.get(i).and_then(|route| {
                route
                    .rules
                    .iter()
                    .find(|r| &*r.group == group && r.method.as_ref().is_none_or(|m| m == method))
            })
        };
        match candidates {
            Candidates::Mask(mask) => {
                let mut rest = *mask;
                while rest != 0 {
                    let i = rest.trailing_zeros() as usize;
                    if let Some(rule) = pick(i) {
                        return Some(rule);
                    }
                    rest &= rest - 1;
                }
                None
            }
            Candidates::Many(list) => list.iter().find_map(|&i| pick(i as usize)),
        }
    }
}

/// Builds a [`Rules`] table; see the [module docs](self).
#[derive(Debug, Default)]
#[must_use]
pub struct RulesBuilder {
    routes: Vec<(String, Vec<Rule>)>,
}

impl RulesBuilder {
    /// Adds a route: a regular expression over the request path and its
    /// rules. Routes are tried in the order they are added.
    pub fn route(
        mut self,
        pattern: impl Into<String>,
        rules: impl IntoIterator<Item = Rule>,
    ) -> Self {
        self.routes
            .push((pattern.into(), rules.into_iter().collect()));
        self
    }

    /// Validates and compiles the table.
    ///
    /// Errors name the route, the rule and the field: an invalid regular
    /// expression, a zero or negative limit, a window of zero length, two
    /// windows of the same length in one rule, an unknown method, or a rule
    /// that an earlier rule of its route makes unreachable.
    pub fn build(self) -> Result<Rules, ConfigError> {
        let mut routes = Vec::with_capacity(self.routes.len());
        let mut zones: BTreeMap<&str, Algorithm> = BTreeMap::new();
        for (ri, (pattern, rules)) in self.routes.iter().enumerate() {
            let at_route = Location {
                route: Some((ri, pattern.clone())),
                ..Location::default()
            };
            if let Err(e) = regex::Regex::new(pattern) {
                return Err(ConfigError::new(at_route, ConfigErrorKind::InvalidRegex(e)));
            }
            let route_id = key::pattern_id(pattern);
            let mut compiled: Vec<CompiledRule> = Vec::with_capacity(rules.len());
            for (i, rule) in rules.iter().enumerate() {
                let at = Location {
                    rule: Some((i, rule.group.clone())),
                    ..at_route.clone()
                };
                if let Some(zone) = rule.zone.as_deref() {
                    if *zones.entry(zone).or_insert(rule.algorithm) != rule.algorithm {
                        let mut at = at;
                        at.field = Some("algorithm".to_owned());
                        return Err(ConfigError::new(at, ConfigErrorKind::ZoneAlgorithm));
                    }
                }
                compiled.push(compile_rule(rule, at, &route_id, &compiled)?);
            }
            routes.push(Route {
                pattern: pattern.as_str().into(),
                rules: compiled.into_boxed_slice(),
            });
        }
        let set = RegexSet::new(self.routes.iter().map(|(p, _)| p.as_str()))
            .map_err(|e| ConfigError::new(Location::default(), ConfigErrorKind::InvalidRegex(e)))?;
        Ok(Rules {
            inner: Arc::new(RulesInner {
                set,
                routes: routes.into_boxed_slice(),
            }),
        })
    }
}

fn compile_rule(
    rule: &Rule,
    at: Location,
    route_id: &str,
    earlier: &[CompiledRule],
) -> Result<CompiledRule, ConfigError> {
    let fail = |field: Option<&str>, kind| {
        let mut at = at.clone();
        at.field = field.map(str::to_owned);
        Err(ConfigError::new(at, kind))
    };
    if rule.group.is_empty() {
        return fail(Some("group"), ConfigErrorKind::EmptyName);
    }
    let method = match &rule.method {
        None => None,
        Some(m) => match Method::from_bytes(m.as_bytes()) {
            Ok(m) => Some(m),
            Err(_) => return fail(Some("method"), ConfigErrorKind::InvalidMethod),
        },
    };
    // An earlier rule for the same group whose method is the same, or any,
    // would always be picked first.
    if earlier
        .iter()
        .any(|e| *e.group == *rule.group && (e.method.is_none() || e.method == method))
    {
        return fail(None, ConfigErrorKind::UnreachableRule);
    }
    if rule.windows.len() > MAX_WINDOWS {
        return fail(None, ConfigErrorKind::TooManyWindows);
    }
    let mut windows: Vec<Window> = Vec::with_capacity(rule.windows.len());
    for (name, duration, limit) in &rule.windows {
        let window = match Window::validate(*duration, *limit) {
            Ok(w) => w,
            Err(kind) => return fail(Some(name), kind),
        };
        if windows.iter().any(|w| w.micros == window.micros) {
            return fail(Some(name), ConfigErrorKind::DuplicateWindow);
        }
        windows.push(window);
    }
    let zone = match &rule.zone {
        Some(z) if z.is_empty() => return fail(Some("zone"), ConfigErrorKind::EmptyName),
        z => z,
    };
    let policy = if windows.is_empty() {
        None
    } else {
        windows.sort_by_key(|w| w.micros);
        let budget = match (zone, &method) {
            (Some(zone), _) => format!("z{}", key::encode(zone.as_bytes())),
            (None, Some(m)) => format!("{route_id}.{}", key::encode(m.as_str().as_bytes())),
            (None, None) => route_id.to_owned(),
        };
        Some(Arc::new(Policy {
            budget: budget.into_boxed_str(),
            windows: windows.into(),
            algorithm: rule.algorithm,
        }))
    };
    Ok(CompiledRule {
        group: rule.group.as_str().into(),
        method,
        policy,
    })
}

/// A rate-limit configuration file.
///
/// ```
/// use tower_ratelimit::Config;
///
/// let config = Config::from_toml(r#"
///     [groups]
///     "admin-key" = "admin"
///
///     [[routes]]
///     path = "^/towns"
///     rules = [{ group = "default", second = 1 }, { group = "admin" }]
///
///     [[routes]]
///     path = "^/multiple"
///     rules = [{ second = 5, minute = 100, hour = 1000 }]
/// "#)?;
/// assert_eq!(config.groups()["admin-key"], "admin");
/// assert_eq!(config.rules().len(), 2);
/// # Ok::<(), tower_ratelimit::ConfigError>(())
/// ```
///
/// Fields of a rule: `group` (default `"default"`), `method`, `zone`,
/// `algorithm`, `second`, `minute`, `hour`, `day`, `month` and
/// `windows = [{ seconds = 10, limit = 5 }]` (`millis` instead of `seconds`
/// for sub-second windows). Unknown fields are errors.
#[derive(Clone, Debug)]
pub struct Config {
    groups: BTreeMap<String, String>,
    rules: Rules,
}

impl Config {
    /// Parses and validates a TOML configuration.
    pub fn from_toml(text: &str) -> Result<Self, ConfigError> {
        let raw: RawConfig = toml::from_str(text).map_err(|e| {
            ConfigError::new(Location::default(), ConfigErrorKind::Parse(e.to_string()))
        })?;
        let mut builder = Rules::builder();
        for route in raw.routes {
            let rules = route
                .rules
                .into_iter()
                .map(RawRule::into_rule)
                .collect::<Vec<_>>();
            builder = builder.route(route.path, rules);
        }
        Ok(Self {
            groups: raw.groups,
            rules: builder.build()?,
        })
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
    routes: Vec<RawRoute>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawRoute {
    path: String,
    #[serde(default)]
    rules: Vec<RawRule>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawRule {
    group: Option<String>,
    method: Option<String>,
    zone: Option<String>,
    algorithm: Option<Algorithm>,
    second: Option<i64>,
    minute: Option<i64>,
    hour: Option<i64>,
    day: Option<i64>,
    month: Option<i64>,
    #[serde(default)]
    windows: Vec<RawWindow>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawWindow {
    seconds: Option<u64>,
    millis: Option<u64>,
    limit: i64,
}

impl RawRule {
    fn into_rule(self) -> Rule {
        let mut rule = Rule::group(self.group.unwrap_or_else(|| DEFAULT_GROUP.to_owned()));
        rule.method = self.method.map(|m| m.to_ascii_uppercase());
        rule.zone = self.zone;
        rule.algorithm = self.algorithm.unwrap_or_default();
        let named = [
            ("second", 1, self.second),
            ("minute", 60, self.minute),
            ("hour", 3600, self.hour),
            ("day", 86_400, self.day),
            ("month", 30 * 86_400, self.month),
        ];
        for (name, secs, limit) in named {
            if let Some(limit) = limit {
                rule.push_raw(name.to_owned(), Duration::from_secs(secs), limit);
            }
        }
        for (i, w) in self.windows.into_iter().enumerate() {
            // Exactly one of `seconds` and `millis`; anything else is a zero
            // duration, reported against this window by the builder.
            let duration = match (w.seconds, w.millis) {
                (Some(s), None) => Duration::from_secs(s),
                (None, Some(ms)) => Duration::from_millis(ms),
                _ => Duration::ZERO,
            };
            rule.push_raw(format!("windows[{i}]"), duration, w.limit);
        }
        rule
    }
}
