//! What swapping one rule table for another does to the users' budgets
//! ([`Rules::budget_changes`]), for the logs of a reload.

use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use http::Method;

use super::{span_name, Algorithm, Policy, Rules, Window};

/// One rule's budgets that a swap of tables does not carry over as they
/// are (see [`Rules::budget_changes`] and
/// [`ReloadableRules`](crate::ReloadableRules)). Its `Display` is one line
/// for a log.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct BudgetChange {
    /// The route's pattern, in the new table.
    pub route: Arc<str>,
    /// The rule's group.
    pub group: String,
    /// The rule's method, if it names one.
    pub method: Option<Method>,
    /// What becomes of the budgets.
    pub kind: BudgetChangeKind,
}

/// What a swap of tables does to one rule's budgets (see [`BudgetChange`]).
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum BudgetChangeKind {
    /// No rule of the previous table counted these budgets: a new route,
    /// a route whose pattern, zone or method changed, or a group that now
    /// counts apart from its route's other groups (or with them again).
    /// Every user starts with a full budget.
    Uncounted,
    /// The previous table counted these budgets with another algorithm:
    /// every user starts afresh, and a change back finds the earlier state
    /// as it was left (until it expires).
    Algorithm {
        /// The previous table's algorithm.
        from: Algorithm,
        /// This table's.
        to: Algorithm,
    },
    /// A counter algorithm's windows of lengths the previous table did not
    /// have: they start empty (the other windows keep their counts).
    NewWindows(Vec<Duration>),
    /// A sliding log whose longest window grew: it counts the requests made
    /// before the swap only as far back as the previous longest window
    /// reached (the log kept no older ones).
    LongerLog {
        /// The previous table's longest window.
        kept: Duration,
    },
    /// On Redis only (the memory store keeps them): the budgets move to
    /// other keys and start afresh, because route-wide limits were added
    /// to the route or removed, or a sliding log moved between up to 5
    /// windows and more. A change back finds them as they were left, until
    /// they expire.
    RedisKeys,
}

impl fmt::Display for BudgetChange {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "route `{}`, group `{}`", self.route, self.group)?;
        if let Some(method) = &self.method {
            write!(f, ", method {method}")?;
        }
        f.write_str(": ")?;
        match &self.kind {
            BudgetChangeKind::Uncounted => f.write_str(
                "its budgets start full (no rule of the previous table counted them)",
            ),
            BudgetChangeKind::Algorithm { from, to } => write!(
                f,
                "its budgets start full ({} before, {} now; a change back finds the earlier ones)",
                from.as_str(),
                to.as_str()
            ),
            BudgetChangeKind::NewWindows(windows) => {
                let names: Vec<String> = windows.iter().map(|d| duration_name(*d)).collect();
                write!(
                    f,
                    "its new windows ({}) start empty; the others keep their counts",
                    names.join(", ")
                )
            }
            BudgetChangeKind::LongerLog { kept } => write!(
                f,
                "its longest window counts the requests made before the reload only as far back as {} (the previous longest window)",
                duration_name(*kept)
            ),
            BudgetChangeKind::RedisKeys => f.write_str(
                "on Redis its budgets start full (route-wide limits added or removed, or a sliding log moved between up to 5 windows and more); the memory store keeps them",
            ),
        }
    }
}

/// A window's length as the headers name it: `60s`, `250ms`.
fn duration_name(length: Duration) -> String {
    match Window::new(length, 1) {
        Ok(window) => span_name(&window),
        Err(_) => format!("{length:?}"),
    }
}

/// The most windows of a sliding log kept in Redis's packed layout (see the
/// `store::redis` module): more, or route-wide windows, and it keeps its
/// log in another layout, under another key.
const PACKED_LOG_MAX_WINDOWS: usize = 5;

/// Where Redis keeps a policy's budgets beyond its budget and algorithm:
/// the route whose route-wide windows are decided with them (whose id
/// their keys' hash tag is), and for a sliding log, whether in the packed
/// layout.
fn redis_place(policy: &Policy) -> (Option<&str>, bool) {
    let route = policy.global.as_ref().map(|g| &*g.budget);
    let packed = policy.algorithm == Algorithm::SlidingLog
        && route.is_none()
        && policy.windows.len() <= PACKED_LOG_MAX_WINDOWS;
    (route, packed)
}

impl Rules {
    /// What swapping this table in for `previous` (as
    /// [`ReloadableRules::set`](crate::ReloadableRules::set) does) does to
    /// the users' budgets: one [`BudgetChange`] for each way a rule's
    /// budgets do not carry over as they are, in table order (a rule that
    /// limits nothing has none). Empty when every budget carries over, as
    /// when only limits change. For the log of a reload: who starts with a
    /// full budget.
    ///
    /// ```
    /// use tower_ratelimit::rules::BudgetChangeKind;
    /// use tower_ratelimit::{Algorithm, Rule, Rules};
    ///
    /// let table = |rule: Rule| Rules::builder().route("^/api", [rule]).build();
    /// let before = table(Rule::new().minute(10))?;
    /// // A higher limit: every budget carries over.
    /// assert!(table(Rule::new().minute(20))?.budget_changes(&before).is_empty());
    /// // Another algorithm: they start afresh.
    /// let after = table(Rule::new().minute(10).algorithm(Algorithm::TokenBucket))?;
    /// let changes = after.budget_changes(&before);
    /// assert_eq!(
    ///     changes[0].kind,
    ///     BudgetChangeKind::Algorithm { from: Algorithm::SlidingLog, to: Algorithm::TokenBucket }
    /// );
    /// assert_eq!(
    ///     changes[0].to_string(),
    ///     "route `^/api`, group `default`: its budgets start full (sliding-log before, token-bucket now; a change back finds the earlier ones)"
    /// );
    /// # Ok::<(), tower_ratelimit::ConfigError>(())
    /// ```
    pub fn budget_changes(&self, previous: &Rules) -> Vec<BudgetChange> {
        // (By budget: a table of thousands of routes is compared in one
        // pass over each.)
        let mut old: HashMap<&str, Vec<&Policy>> = HashMap::new();
        for policy in previous
            .inner
            .routes
            .iter()
            .flat_map(|route| route.rules.iter())
            .filter_map(|rule| rule.policy.as_deref())
        {
            old.entry(&policy.budget).or_default().push(policy);
        }
        let mut changes = Vec::new();
        for route in self.inner.routes.iter() {
            for rule in route.rules.iter() {
                let Some(new) = rule.policy.as_deref() else {
                    continue;
                };
                let mut change = |kind| {
                    changes.push(BudgetChange {
                        route: route.pattern.clone(),
                        group: rule.group.as_str().to_owned(),
                        method: rule.method.clone(),
                        kind,
                    });
                };
                let same_budget = old.get(&*new.budget).map_or(&[][..], Vec::as_slice);
                let counted: Vec<&Policy> = same_budget
                    .iter()
                    .filter(|p| p.algorithm == new.algorithm)
                    .copied()
                    .collect();
                // (Rules that share a budget count it alike: any of them
                // says how it was counted; one in the same place on Redis,
                // if any, says where it was kept.)
                let place = redis_place(new);
                let (before, same_place) = match counted.iter().find(|p| redis_place(p) == place) {
                    Some(p) => (*p, true),
                    None => match counted.first() {
                        Some(p) => (*p, false),
                        None => {
                            change(match same_budget.first() {
                                Some(p) => BudgetChangeKind::Algorithm {
                                    from: p.algorithm,
                                    to: new.algorithm,
                                },
                                None => BudgetChangeKind::Uncounted,
                            });
                            continue;
                        }
                    },
                };
                if new.algorithm == Algorithm::SlidingLog {
                    let longest = |p: &Policy| p.windows.last().map_or(0, Window::micros);
                    if longest(new) > longest(before) {
                        if let Some(kept) = before.windows.last() {
                            change(BudgetChangeKind::LongerLog {
                                kept: kept.duration(),
                            });
                        }
                    }
                } else {
                    let fresh: Vec<Duration> = new
                        .windows
                        .iter()
                        .filter(|w| !before.windows.iter().any(|o| o.micros() == w.micros()))
                        .map(Window::duration)
                        .collect();
                    if !fresh.is_empty() {
                        change(BudgetChangeKind::NewWindows(fresh));
                    }
                }
                if !same_place {
                    change(BudgetChangeKind::RedisKeys);
                }
            }
        }
        changes
    }
}
