//! Errors raised while building a rule table.

use std::error::Error as StdError;
use std::fmt;

use crate::rules::Algorithm;

/// Where in the rule table a [`ConfigError`] was found.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Location {
    pub(crate) route: Option<(usize, String)>,
    pub(crate) rule: Option<(usize, String)>,
    pub(crate) field: Option<String>,
}

impl Location {
    /// A table-wide field (`exclude.paths[1]`, `groups."key"`): no route,
    /// no rule.
    pub(crate) fn field(field: String) -> Self {
        Self {
            field: Some(field),
            ..Self::default()
        }
    }
}

/// What is wrong with a rule table.
#[derive(Debug)]
#[non_exhaustive]
pub enum ConfigErrorKind {
    /// A route's path pattern is not a valid regular expression.
    InvalidRegex(regex::Error),
    /// A path pattern is longer than
    /// [`MAX_PATTERN_LEN`](crate::rules::MAX_PATTERN_LEN) bytes (its length
    /// given).
    PatternTooLong(usize),
    /// A path pattern has more Perl or Unicode classes (`\w`, `\d`,
    /// `\pL`, inside brackets too) than a pattern may have (their number
    /// given; at most 1,024): each is hundreds of ranges once translated,
    /// and a few hundred `\w` compile past the size limit anyway.
    TooManyClasses(usize),
    /// The route patterns up to this one compile, together, to more than
    /// the route set may take (256 MiB; each alone is within the `regex`
    /// crate's 10 MiB): most often many Unicode classes (`\w`, `\d`),
    /// which ASCII ranges (`[0-9]`, `[_0-9A-Za-z]`) replace at a fraction
    /// of the size.
    RoutesTooLarge,
    /// A limit is zero, negative or above `u32::MAX`; a rule without
    /// limits is written by leaving every window out.
    InvalidLimit(i64),
    /// A window's duration, or a rule's block time, is under a millisecond
    /// (zero or negative in a file) or longer than ten years.
    InvalidDuration,
    /// A configuration window gives both or neither of `seconds` and
    /// `millis`.
    WindowLength,
    /// Two windows of one rule have the same duration.
    DuplicateWindow,
    /// A rule repeats (or is shadowed by) an earlier rule of the same route
    /// for the same group and method, so it could never apply.
    UnreachableRule,
    /// A method name (given here, in capitals, as rules keep it) is not a
    /// valid HTTP method token.
    InvalidMethod(String),
    /// A route's or an exclusion's pattern is empty (it would match every
    /// path: write `^/` or `.*` to mean that).
    EmptyPattern,
    /// A name (group, zone) is empty.
    EmptyName,
    /// A rule has more windows than [`MAX_WINDOWS`](crate::rules::MAX_WINDOWS).
    TooManyWindows,
    /// Rules of one zone share a budget, so they must count it the same way.
    ZoneAlgorithm,
    /// Rules of one zone share a budget, so they must keep the same window
    /// lengths (their limits may differ): a check on fewer or other
    /// windows would drop the counts the others keep.
    ZoneWindows,
    /// A route with a route-wide limit keeps every key in the route's Redis
    /// Cluster slot, so its rules cannot share a zone with other routes.
    ZoneWithGlobal,
    /// A route-wide limit has no window.
    EmptyGlobal,
    /// Two routes have the same pattern (budget keys are named after it,
    /// so they would share them).
    DuplicateRoute,
    /// A route-wide limit sets more than windows (an algorithm, a block
    /// time, a method or a zone): it has only windows, and is counted with
    /// its route's rules' algorithm.
    GlobalField,
    /// The rules of a route with a route-wide limit use different
    /// algorithms; the route-wide budget is one, counted one way.
    GlobalAlgorithm,
    /// A window's limit is more than its algorithm can count exactly: a
    /// sliding log records every request (at most
    /// [`MAX_LOG_LIMIT`](crate::rules::MAX_LOG_LIMIT) per window), a token
    /// bucket refills at most one per microsecond (a limit no larger than
    /// the window's length in microseconds).
    LimitForAlgorithm(Algorithm),
    /// A field that can have no effect: a block time or a cost on a rule
    /// without windows, a route-wide limit on a route without limited
    /// rules, a route without rules.
    NoEffect,
    /// A trusted proxy network is not an address or CIDR block.
    InvalidNetwork(String),
    /// An item of a limit text ([`Rule::limits`](crate::Rule::limits), or
    /// `limits` in a configuration file), or a configuration file's
    /// `windows` list, cannot be read; says which and why.
    LimitText(String),
    /// A configuration file's `block_time` is not a duration; says why and
    /// how to write one.
    InvalidBlockTime(String),
    /// A rule's [`cost`](crate::Rule::cost) is negative, or more than a
    /// window of the rule (or its route-wide limit) allows, or more than
    /// [`MAX_LOG_COST`](crate::rules::MAX_LOG_COST) on a sliding log: no
    /// request could ever pass. Says which.
    InvalidCost(String),
    /// The configuration text could not be parsed, or has an unknown field.
    Parse(String),
}

/// A rule table could not be built; says which route, rule and field.
///
/// ```
/// use tower_ratelimit::{Rule, Rules};
///
/// let err = Rules::builder()
///     .route("^/ok", [Rule::new().second(1)])
///     .route("^/bad(", [Rule::new().second(1)])
///     .build()
///     .unwrap_err();
/// assert!(err.to_string().contains("route #1 `^/bad(`"));
/// ```
#[derive(Debug)]
pub struct ConfigError {
    at: Location,
    kind: ConfigErrorKind,
}

impl ConfigError {
    pub(crate) fn new(at: Location, kind: ConfigErrorKind) -> Self {
        Self { at, kind }
    }

    /// What is wrong.
    pub fn kind(&self) -> &ConfigErrorKind {
        &self.kind
    }

    /// The index and path pattern of the offending route, when the error is
    /// about one route (the pattern empty when a file's route has no
    /// `path`, or one that is no string).
    pub fn route(&self) -> Option<(usize, &str)> {
        self.at.route.as_ref().map(|(i, p)| (*i, p.as_str()))
    }

    /// The index and group of the offending rule within its route.
    pub fn rule(&self) -> Option<(usize, &str)> {
        self.at.rule.as_ref().map(|(i, g)| (*i, g.as_str()))
    }

    /// The offending field (`second`, `windows[1]`, `method`, ...), also
    /// when the parser refused it (unknown, or of the wrong type). Fields
    /// go by their names in a TOML table: `path` is a route's pattern, also
    /// the one given to [`RulesBuilder::route`](crate::RulesBuilder::route).
    pub fn field(&self) -> Option<&str> {
        self.at.field.as_deref()
    }
}

/// The longest line of a [`ConfigError`]'s message: a longer one (a
/// megabyte-long pattern or line of a file, echoed by the parser) is cut,
/// with how much was left out.
const LONGEST_LINE: usize = 400;

/// The most of a pattern (or a method) a message shows.
const LONGEST_PATTERN: usize = 120;

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write_cut(f, &Full(self).to_string())
    }
}

/// Writes `full`, every line cut at [`LONGEST_LINE`] bytes, saying how
/// much was left out.
fn write_cut(f: &mut fmt::Formatter<'_>, full: &str) -> fmt::Result {
    for (i, line) in full.split('\n').enumerate() {
        if i > 0 {
            f.write_str("\n")?;
        }
        match cut(line, LONGEST_LINE) {
            (line, 0) => f.write_str(line)?,
            (head, more) => write!(f, "{head}… ({more} more bytes)")?,
        }
    }
    Ok(())
}

/// The first `most` bytes of `text` (to a character's boundary), and how
/// many more there are.
fn cut(text: &str, most: usize) -> (&str, usize) {
    let mut end = text.len().min(most);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    (&text[..end], text.len() - end)
}

/// A pattern (or a method) in backquotes, cut at [`LONGEST_PATTERN`] bytes
/// (so that what is said about it stays within [`LONGEST_LINE`]).
fn quoted(pattern: &str) -> String {
    quoted_at(pattern, LONGEST_PATTERN)
}

/// A pattern in backquotes cut at `most` bytes: a second pattern a message
/// names by its index too is cut at a third of [`LONGEST_PATTERN`], so
/// that what is said of the two stays on the line.
fn quoted_at(pattern: &str, most: usize) -> String {
    let (head, more) = cut(pattern, most);
    backquoted(head, more)
}

/// `head` in backquotes, and how many bytes were cut after it, if any.
fn backquoted(head: impl fmt::Display, more: usize) -> String {
    match more {
        0 => format!("`{head}`"),
        more => format!("`{head}…` ({more} more bytes)"),
    }
}

/// Text from a configuration, escaped (`\n`), in backquotes and cut as
/// [`quoted`] cuts a pattern.
pub(crate) fn shown(text: &str) -> String {
    let (head, more) = cut(text, LONGEST_PATTERN);
    backquoted(head.escape_debug(), more)
}

/// `route #1 `^/a`, rule #0 (group `g`), field `method`: `, or nothing
/// for a table-wide finding.
fn write_location(f: &mut fmt::Formatter<'_>, at: &Location) -> fmt::Result {
    let mut parts = Vec::new();
    if let Some((i, pattern)) = &at.route {
        // (A long pattern is cut, so that what is wrong with it stays on
        // the line: see `LONGEST_LINE`.)
        // (No pattern: a route without `path`, which the field says.)
        if pattern.is_empty() {
            parts.push(format!("route #{i}"));
        } else {
            parts.push(format!("route #{i} {}", quoted(pattern)));
        }
    }
    if let Some((i, group)) = &at.rule {
        parts.push(format!("rule #{i} (group {})", quoted(group)));
    }
    if let Some(field) = &at.field {
        parts.push(format!("field `{field}`"));
    }
    if parts.is_empty() {
        return Ok(());
    }
    write!(f, "{}: ", parts.join(", "))
}

/// A [`ConfigError`]'s message, whole.
struct Full<'a>(&'a ConfigError);

impl fmt::Display for Full<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let this = self.0;
        f.write_str("invalid rate-limit configuration: ")?;
        write_location(f, &this.at)?;
        match &this.kind {
            ConfigErrorKind::InvalidRegex(e) => write!(f, "invalid regular expression: {e}"),
            ConfigErrorKind::PatternTooLong(len) => write!(
                f,
                "the pattern is {len} bytes long, more than a path pattern may be ({} bytes)",
                crate::rules::MAX_PATTERN_LEN
            ),
            ConfigErrorKind::TooManyClasses(n) => write!(
                f,
                "the pattern has {n} Perl or Unicode classes (`\\w`, `\\d`, `\\pL`), more than a pattern may have ({}); ASCII ranges (`[0-9]`, `[a-z]`) are not counted",
                crate::rules::MAX_CLASSES
            ),
            ConfigErrorKind::RoutesTooLarge => write!(
                f,
                "the route patterns up to this one compile to more than the route set may take together ({} MiB): Perl and Unicode classes (`\\w`, `\\d`, `\\pL`) are the largest part of most patterns, and ASCII ranges (`[0-9]`, `[a-z]`, `[_0-9A-Za-z]`) a fraction of them",
                crate::rules::SET_SIZE_LIMIT >> 20
            ),
            ConfigErrorKind::InvalidLimit(n) => {
                write!(
                    f,
                    "limit must be a whole number from 1 to {}, got {n}",
                    u32::MAX
                )
            }
            ConfigErrorKind::InvalidDuration => {
                f.write_str("duration must be between 1 millisecond and 10 years")
            }
            ConfigErrorKind::WindowLength => {
                f.write_str("a window takes exactly one of `seconds` and `millis`")
            }
            ConfigErrorKind::DuplicateWindow => {
                f.write_str("another window of this rule has the same duration")
            }
            ConfigErrorKind::UnreachableRule => f.write_str(
                "an earlier rule of this route already covers this group and method, so this rule could never apply",
            ),
            ConfigErrorKind::InvalidMethod(method) => {
                write!(f, "{} is not a valid HTTP method", quoted(method))
            }
            ConfigErrorKind::EmptyPattern => f.write_str(
                "an empty pattern matches every path; write `^/` (or `.*`) to mean that",
            ),
            ConfigErrorKind::EmptyName => f.write_str("must not be empty"),
            ConfigErrorKind::TooManyWindows => write!(
                f,
                "a rule may have at most {} windows",
                crate::rules::MAX_WINDOWS
            ),
            ConfigErrorKind::ZoneAlgorithm => f.write_str(
                "another rule of the same zone uses a different algorithm; a zone's rules share one budget",
            ),
            ConfigErrorKind::DuplicateRoute => f.write_str(
                "an earlier route has the same pattern; merge their rules into one route",
            ),
            ConfigErrorKind::GlobalField => f.write_str(
                "a route-wide limit has only windows; it is counted with the algorithm of its route's rules",
            ),
            ConfigErrorKind::GlobalAlgorithm => f.write_str(
                "another rule of this route uses a different algorithm; the route-wide limit is one budget, counted one way",
            ),
            ConfigErrorKind::ZoneWindows => f.write_str(
                "another rule of the same zone has other window lengths; a zone's rules share one budget, so they must have the same windows (their limits may differ)",
            ),
            ConfigErrorKind::ZoneWithGlobal => f.write_str(
                "a route with a route-wide (`global`) limit cannot have rules with a zone",
            ),
            ConfigErrorKind::EmptyGlobal => f.write_str("a route-wide limit needs at least one window"),
            ConfigErrorKind::LimitForAlgorithm(Algorithm::SlidingLog) => write!(
                f,
                "a sliding log records every request (one entry per unit of cost), so a window may allow at most {} (for larger budgets, such as bytes, use the sliding window or the token bucket)",
                crate::rules::MAX_LOG_LIMIT
            ),
            ConfigErrorKind::LimitForAlgorithm(algorithm) => write!(
                f,
                "`{}` refills at most one request per microsecond, so a window may allow at most as many requests as it is long in microseconds (use a longer window, or the sliding or fixed window)",
                algorithm.as_str()
            ),
            ConfigErrorKind::NoEffect => f.write_str(match this.at.field.as_deref() {
                Some("block_time") => "has no effect here: a block time needs windows on its rule",
                Some("cost") => "has no effect here: a cost needs windows on its rule",
                Some("global") => {
                    "has no effect here: a route-wide limit needs a rule with windows on its route"
                }
                Some("rules") => {
                    "a route without rules applies to no request (to leave paths alone, list them in `exclude`)"
                }
                _ => "has no effect here",
            }),
            ConfigErrorKind::InvalidNetwork(text) => write!(
                f,
                "`{text}` is not an IP address or CIDR block (like 10.0.0.0/8; an IPv4-mapped one, `::ffff:a.b.c.d/N`, needs N of 96 or more)"
            ),
            ConfigErrorKind::LimitText(why)
            | ConfigErrorKind::InvalidBlockTime(why)
            | ConfigErrorKind::InvalidCost(why) => f.write_str(why),
            ConfigErrorKind::Parse(msg) => f.write_str(msg),
        }
    }
}

impl StdError for ConfigError {
    fn source(&self) -> Option<&(dyn StdError + 'static)> {
        match &self.kind {
            ConfigErrorKind::InvalidRegex(e) => Some(e),
            _ => None,
        }
    }
}

/// Something a valid rule table most likely does not mean, found when it
/// was built: see [`Rules::warnings`](crate::Rules::warnings). Says which
/// route, rule and field, as a [`ConfigError`] does.
///
/// ```
/// use tower_ratelimit::{ConfigWarningKind, Rule, Rules};
///
/// let rules = Rules::builder()
///     .route("^/api", [Rule::new().method("GETT").second(5)])
///     .build()?;
/// let warning = &rules.warnings()[0];
/// assert_eq!(warning.field(), Some("method"));
/// assert!(matches!(
///     warning.kind(),
///     ConfigWarningKind::UnusualMethod { nearest: Some("GET"), .. }
/// ));
/// assert!(warning.to_string().contains("did you mean `GET`?"));
/// # Ok::<(), tower_ratelimit::ConfigError>(())
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConfigWarning {
    at: Location,
    kind: ConfigWarningKind,
}

/// What a [`ConfigWarning`] is about.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum ConfigWarningKind {
    /// A method (of a rule or of `exclude.methods`) that is a valid token
    /// but none of the methods in IANA's HTTP Method Registry (RFC 9110's,
    /// `PATCH`, WebDAV's `PROPFIND` and the like, `QUERY`): it applies only
    /// to requests sent with exactly that method. Right for a private
    /// extension method; for a typo (`GETT`), the rule limits nothing.
    UnusualMethod {
        /// The method, in capitals.
        method: String,
        /// The standard or registered method one edit away, if any.
        nearest: Option<&'static str>,
    },
    /// Every path the route matches is excluded by `exclude.paths[i]`
    /// (the index and pattern given), so its rules never apply (but to a
    /// path that spells the excluded part percent-encoded, which is
    /// excluded only when both spellings are, see
    /// [`decode_path`](crate::rules::decode_path)).
    ExcludedRoute {
        /// The exclusion's index in `exclude.paths`.
        exclusion: usize,
        /// The exclusion's pattern.
        pattern: String,
    },
    /// Every method the rule applies to is excluded (`exclude.methods`),
    /// so it never applies. The rule's method, in capitals.
    ExcludedMethod(String),
    /// An exclusion (`exclude.paths[i]`, a plain `^literal`) spells a
    /// character percent-encoded (`^/a%20b`): an exclusion applies only
    /// when the path matches it both as sent and decoded (see
    /// [`decode_path`](crate::rules::decode_path)), and a path that starts
    /// with `/a%20b` decodes to one that starts with `/a b`, so (unless
    /// another exclusion matches that) it excludes nothing. The exclusion's
    /// pattern.
    EncodedExclusion(String),
    /// An earlier route (the index and pattern given) matches every path
    /// this rule's route matches, and has a rule for its group and method,
    /// so this rule never applies (the first matching route with a rule
    /// for the request's group and method does): `^/api/login` listed
    /// after `^/api`, which was meant to come first.
    ShadowedRule {
        /// The earlier route's index.
        route: usize,
        /// The earlier route's pattern.
        pattern: String,
    },
}

impl ConfigWarning {
    pub(crate) fn new(at: Location, kind: ConfigWarningKind) -> Self {
        Self { at, kind }
    }

    /// What the warning is about.
    pub fn kind(&self) -> &ConfigWarningKind {
        &self.kind
    }

    /// The index and path pattern of the route, when the warning is about
    /// one route.
    pub fn route(&self) -> Option<(usize, &str)> {
        self.at.route.as_ref().map(|(i, p)| (*i, p.as_str()))
    }

    /// The index and group of the rule within its route.
    pub fn rule(&self) -> Option<(usize, &str)> {
        self.at.rule.as_ref().map(|(i, g)| (*i, g.as_str()))
    }

    /// The field (`method`, `exclude.methods[0]`, ...).
    pub fn field(&self) -> Option<&str> {
        self.at.field.as_deref()
    }
}

impl fmt::Display for ConfigWarning {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write_cut(f, &FullWarning(self).to_string())
    }
}

/// A [`ConfigWarning`]'s message, whole.
struct FullWarning<'a>(&'a ConfigWarning);

impl fmt::Display for FullWarning<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let this = self.0;
        write_location(f, &this.at)?;
        match &this.kind {
            ConfigWarningKind::UnusualMethod { method, .. } if method == "*" => f.write_str(
                "`*` is no method a request is sent with, so this applies to none; leave the method out to mean every method",
            ),
            ConfigWarningKind::UnusualMethod { method, nearest } => {
                let method = quoted(method);
                write!(f, "{method} is not a registered HTTP method, so only requests sent with exactly {method} are concerned")?;
                match nearest {
                    Some(m) => write!(f, "; did you mean `{m}`?"),
                    None => f.write_str(" (right for a private extension method)"),
                }
            }
            ConfigWarningKind::ExcludedRoute { exclusion, pattern } => write!(
                f,
                "every path this route matches is excluded by exclude.paths[{exclusion}] {}, so its rules apply only to a path that spells the excluded part percent-encoded (`/%68ealth` for `/health`), which is excluded only when both spellings are",
                quoted_at(pattern, LONGEST_PATTERN / 3)
            ),
            ConfigWarningKind::ShadowedRule { route, pattern } => write!(
                f,
                "route #{route} {}, listed earlier, takes every path this route matches with a rule for this group and method, so this rule never applies (list the narrower route first)",
                quoted_at(pattern, LONGEST_PATTERN / 3)
            ),
            ConfigWarningKind::EncodedExclusion(pattern) => write!(
                f,
                "{} spells a character percent-encoded, but a path is excluded only when it matches both as sent and decoded, so this excludes nothing: match both spellings (`^/a(%20| )b`)",
                quoted(pattern)
            ),
            ConfigWarningKind::ExcludedMethod(method) => write!(
                f,
                "{} is excluded (exclude.methods), so this rule never applies",
                quoted(method)
            ),
        }
    }
}
