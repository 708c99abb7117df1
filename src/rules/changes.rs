//! What swapping one rule table for another does to the users' budgets
//! ([`Rules::budget_changes`]), for the logs of a reload.

use std::collections::{HashMap, HashSet};
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use http::Method;

use super::{span_name, Algorithm, Policy, Rules, Window};
use crate::store::STRAIGHT_MAX_WINDOWS;

/// One rule's budgets that a swap of tables does not carry over as they
/// are (see [`Rules::budget_changes`] and
/// [`ReloadableRules`](crate::ReloadableRules)). Its `Display` is one line
/// for a log.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct BudgetChange {
    /// The route's pattern, in the new table.
    pub route: Arc<str>,
    /// The rule's group (for a route-wide budget, the first group whose
    /// rule counts it).
    pub group: String,
    /// The rule's method, if it names one.
    pub method: Option<Method>,
    /// Whether this is the route-wide budget, which every user of the
    /// route shares ([`Route::global`](crate::Route::global)), rather
    /// than each user's own.
    pub route_wide: bool,
    /// Which stores it is true of.
    pub stores: ChangedOn,
    /// What becomes of the budgets.
    pub kind: BudgetChangeKind,
}

/// The stores a [`BudgetChange`] is true of: the memory store and Redis
/// keep budgets alike, but for the keys Redis moves (see
/// [`BudgetChangeKind::RedisKeys`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum ChangedOn {
    /// Every store.
    Every,
    /// The memory store (Redis starts these budgets full instead).
    Memory,
    /// Redis.
    Redis,
}

/// What a swap of tables does to one rule's budgets (see [`BudgetChange`]).
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum BudgetChangeKind {
    /// No rule of the previous table counted these budgets for this group:
    /// a new route or group, a route whose pattern, zone or method changed,
    /// a group that now counts apart from its route's other groups or with
    /// them again, or a route-wide limit added. Every user starts with a
    /// full budget.
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
    /// have: they start with nothing counted (a token bucket full); the
    /// other windows keep their counts.
    NewWindows(Vec<Duration>),
    /// A sliding log's windows longer than the previous table's longest:
    /// the requests made before the swap count in them only within that
    /// longest window of the swap (the log kept no older ones).
    LongerLog {
        /// The previous table's longest window.
        kept: Duration,
    },
    /// Redis moves the budgets to other keys, where they start full: a
    /// route-wide limit was added to the route or removed, or a sliding
    /// log went from 5 windows or fewer to more, or back. A change back
    /// finds them as they were left, until they expire. (Always
    /// [`ChangedOn::Redis`]: the memory store keeps them.)
    RedisKeys,
}

impl fmt::Display for BudgetChange {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "route `{}`, ", self.route)?;
        if self.route_wide {
            f.write_str("route-wide budget")?;
        } else {
            write!(f, "group `{}`", self.group)?;
        }
        if let Some(method) = &self.method {
            write!(f, ", method {method}")?;
        }
        f.write_str(": ")?;
        match self.stores {
            ChangedOn::Every => {}
            ChangedOn::Memory => f.write_str("on the memory store, ")?,
            ChangedOn::Redis => f.write_str("on Redis, ")?,
        }
        let whose = if self.route_wide {
            "it starts"
        } else {
            "its budgets start"
        };
        match &self.kind {
            BudgetChangeKind::Uncounted => write!(
                f,
                "{whose} full (no rule of the previous table counted them)"
            ),
            BudgetChangeKind::Algorithm { from, to } => write!(
                f,
                "{whose} full ({} before, {} now; a change back finds the earlier state)",
                from.as_str(),
                to.as_str()
            ),
            BudgetChangeKind::NewWindows(windows) => {
                let names: Vec<String> = windows.iter().map(|d| duration_name(*d)).collect();
                write!(
                    f,
                    "the new windows ({}) start with nothing counted; the others keep their counts",
                    names.join(", ")
                )
            }
            BudgetChangeKind::LongerLog { kept } => write!(
                f,
                "the requests made before the reload count in the longer windows only within {} of it (the previous longest window)",
                duration_name(*kept)
            ),
            BudgetChangeKind::RedisKeys => write!(
                f,
                "{whose} full under other keys (a route-wide limit added or removed, or a sliding log gone from 5 windows or fewer to more, or back)"
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

/// Where Redis keeps a policy's budgets beyond its budget and algorithm:
/// the route whose route-wide windows are decided with them (whose id
/// their keys' hash tag is), and for a sliding log, whether in the packed
/// layout (see the `store::redis` module).
fn redis_place(policy: &Policy) -> (Option<&str>, bool) {
    let route = policy.global.as_ref().map(|g| &*g.budget);
    let packed = policy.algorithm == Algorithm::SlidingLog
        && route.is_none()
        && policy.windows.len() <= STRAIGHT_MAX_WINDOWS;
    (route, packed)
}

/// How one budget went from one table to the next, given how the previous
/// table counted it with the same algorithm (`before`): its new windows,
/// or its longer reach.
fn compare(algorithm: Algorithm, before: &[Window], after: &[Window]) -> Option<BudgetChangeKind> {
    if algorithm == Algorithm::SlidingLog {
        let kept = before.last()?;
        (after.last()?.micros() > kept.micros()).then(|| BudgetChangeKind::LongerLog {
            kept: kept.duration(),
        })
    } else {
        let fresh: Vec<Duration> = after
            .iter()
            .filter(|w| !before.iter().any(|o| o.micros() == w.micros()))
            .map(Window::duration)
            .collect();
        (!fresh.is_empty()).then_some(BudgetChangeKind::NewWindows(fresh))
    }
}

/// Why a budget that no rule of the previous table counted with its
/// algorithm starts full: another algorithm counted it (`counted`), or
/// none did.
fn afresh(counted: Option<&Policy>, to: Algorithm) -> BudgetChangeKind {
    match counted {
        Some(p) => BudgetChangeKind::Algorithm {
            from: p.algorithm,
            to,
        },
        None => BudgetChangeKind::Uncounted,
    }
}

impl Rules {
    /// What swapping this table in for `previous` (as
    /// [`ReloadableRules::set`](crate::ReloadableRules::set) does) does to
    /// the budgets: one [`BudgetChange`] for each way a rule's budgets, or
    /// a route's route-wide budget, do not carry over as they are, in table
    /// order (a rule that limits nothing has none), each saying which
    /// stores it is true of. Empty when every budget carries over, as when
    /// only limits change. For the log of a reload: who starts with a full
    /// budget. (A user whose group changes, as the demo server's `[groups]`
    /// can, moves to that group's budget: that is the user's change, not
    /// the table's.)
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
    ///     "route `^/api`, group `default`: its budgets start full \
    ///      (sliding-log before, token-bucket now; a change back finds the earlier state)"
    /// );
    /// # Ok::<(), tower_ratelimit::ConfigError>(())
    /// ```
    pub fn budget_changes(&self, previous: &Rules) -> Vec<BudgetChange> {
        // (By budget and group: a user's state is where the rule of the
        // user's group counted it. A table of thousands of routes is
        // compared in one pass over each.)
        let mut old: HashMap<(&str, &str), Vec<&Policy>> = HashMap::new();
        let mut old_route_wide: HashMap<&str, Vec<&Policy>> = HashMap::new();
        for rule in previous.inner.routes.iter().flat_map(|r| r.rules.iter()) {
            let Some(policy) = rule.policy.as_deref() else {
                continue;
            };
            old.entry((&policy.budget, rule.group.as_str()))
                .or_default()
                .push(policy);
            if let Some(global) = &policy.global {
                old_route_wide
                    .entry(&global.budget)
                    .or_default()
                    .push(policy);
            }
        }
        let mut changes = Vec::new();
        let mut route_wide_seen: HashSet<(&str, Algorithm)> = HashSet::new();
        for route in self.inner.routes.iter() {
            for rule in route.rules.iter() {
                let Some(new) = rule.policy.as_deref() else {
                    continue;
                };
                let mut change = |route_wide, stores, kind| {
                    changes.push(BudgetChange {
                        route: route.pattern.clone(),
                        group: rule.group.as_str().to_owned(),
                        method: if route_wide {
                            None
                        } else {
                            rule.method.clone()
                        },
                        route_wide,
                        stores,
                        kind,
                    });
                };
                let same_budget = old
                    .get(&(&*new.budget, rule.group.as_str()))
                    .map_or(&[][..], Vec::as_slice);
                let counted = || same_budget.iter().filter(|p| p.algorithm == new.algorithm);
                // (Rules that share a budget count it alike: any of them
                // says how it was counted; one in the same place on Redis,
                // if any, says where it was kept.)
                let place = redis_place(new);
                match (
                    counted().find(|p| redis_place(p) == place),
                    counted().next(),
                ) {
                    (Some(before), _) => {
                        if let Some(kind) = compare(new.algorithm, &before.windows, &new.windows) {
                            change(false, ChangedOn::Every, kind);
                        }
                    }
                    (None, Some(before)) => {
                        change(false, ChangedOn::Redis, BudgetChangeKind::RedisKeys);
                        if let Some(kind) = compare(new.algorithm, &before.windows, &new.windows) {
                            change(false, ChangedOn::Memory, kind);
                        }
                    }
                    (None, None) => change(
                        false,
                        ChangedOn::Every,
                        afresh(same_budget.first().copied(), new.algorithm),
                    ),
                }
                // The route-wide budget, once per algorithm that counts it.
                let Some(global) = &new.global else { continue };
                if !route_wide_seen.insert((&global.budget, new.algorithm)) {
                    continue;
                }
                let counted_before = old_route_wide
                    .get(&*global.budget)
                    .map_or(&[][..], Vec::as_slice);
                let before = counted_before
                    .iter()
                    .find(|p| p.algorithm == new.algorithm)
                    .and_then(|p| p.global.as_ref());
                match (before, counted_before.first()) {
                    (Some(old_global), _) => {
                        if let Some(kind) =
                            compare(new.algorithm, &old_global.windows, &global.windows)
                        {
                            change(true, ChangedOn::Every, kind);
                        }
                    }
                    (None, other) => change(
                        true,
                        ChangedOn::Every,
                        afresh(other.copied(), new.algorithm),
                    ),
                }
            }
        }
        changes
    }
}
