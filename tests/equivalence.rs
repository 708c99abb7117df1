//! Property: the memory store and the Redis scripts are the same function.
//! Random request sequences (random users, gaps from 0 to 2.5 s with many
//! exact collisions, costs from 0 to 3, 1 to 3 windows, with or without a
//! route-wide budget and a block time, some after a penalty or a refund)
//! go to both, at the same injected instants, and every decision must be
//! identical: allowed,
//! retry time, reset time and every window's remaining count, to the
//! microsecond.

mod support;

use std::sync::Arc;
use std::time::Duration;

use proptest::prelude::*;
use support::redis_server::{shared, unique_prefix};
use tower_ratelimit::clock::Timestamp;
use tower_ratelimit::store::redis::RedisStore;
use tower_ratelimit::{
    Adjustment, Algorithm, Check, Decision, GlobalCheck, MemoryStore, Store, StoreError,
    StoreErrorKind, Window,
};

/// A Redis store on the shared server, under a prefix of its own, and a
/// memory store: the two to compare.
async fn stores() -> (RedisStore, MemoryStore) {
    let redis = RedisStore::builder()
        .url(&shared().standalone)
        .prefix(unique_prefix())
        .timeout(Duration::from_secs(5))
        .build()
        .await
        .unwrap();
    (redis, MemoryStore::new())
}

/// `check` with `algorithm`, and a route-wide budget and a block time when
/// given.
fn shaped(
    mut check: Check,
    algorithm: Algorithm,
    global: &Option<Arc<[Window]>>,
    block_ms: Option<u64>,
) -> Check {
    check.algorithm = algorithm;
    if let Some(global) = global {
        check = check.with_global(GlobalCheck::new("r0:*", global.clone()));
    }
    if let Some(ms) = block_ms {
        check = check.with_block(Duration::from_millis(ms));
    }
    check
}

/// A penalty of `n` (above 0) or a refund of `-n` on both stores.
async fn adjust_both(memory: &MemoryStore, redis: &RedisStore, check: &Check, n: i64) {
    let adjustment = match u32::try_from(n) {
        Ok(n) => Adjustment::Penalty(n),
        Err(_) => Adjustment::Refund(u32::try_from(n.unsigned_abs()).unwrap()),
    };
    memory.adjust(check.clone(), adjustment).await.unwrap();
    redis.adjust(check.clone(), adjustment).await.unwrap();
}

#[derive(Debug, Clone)]
struct Step {
    user: u8,
    gap_us: u64,
    cost: u32,
    /// A penalty (above 0) or a refund (below) on the user's budget just
    /// before the check.
    adjust: Option<i64>,
}

fn step() -> impl Strategy<Value = Step> {
    let gap = prop_oneof![
        3 => Just(0u64),
        3 => 0u64..2_000,
        4 => 0u64..2_500_000,
    ];
    let adjust = proptest::option::weighted(0.2, -5i64..=25);
    (0u8..3, gap, 0u32..=3, adjust).prop_map(|(user, gap_us, cost, adjust)| Step {
        user,
        gap_us,
        cost,
        adjust,
    })
}

fn windows() -> impl Strategy<Value = Vec<Window>> {
    let window = prop_oneof![
        (1u32..6).prop_map(|l| (250u64, l)),
        (1u32..8).prop_map(|l| (1_000u64, l)),
        (2u32..12).prop_map(|l| (3_000u64, l)),
        (3u32..20).prop_map(|l| (60_000u64, l)),
    ];
    proptest::collection::vec(window, 1..=3).prop_map(|mut ws| {
        ws.sort();
        ws.dedup_by_key(|w| w.0);
        ws.into_iter()
            .map(|(ms, l)| Window::new(Duration::from_millis(ms), l).unwrap())
            .collect()
    })
}

fn algorithm() -> impl Strategy<Value = Algorithm> {
    prop_oneof![
        Just(Algorithm::SlidingLog),
        Just(Algorithm::SlidingWindow),
        Just(Algorithm::FixedWindow),
        Just(Algorithm::TokenBucket),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: support::proptest_cases(48), ..ProptestConfig::default() })]

    #[test]
    fn memory_and_redis_decide_identically(
        algorithm in algorithm(),
        windows in windows(),
        start_offset in 0u64..10_000_000,
        steps in proptest::collection::vec(step(), 1..80),
        global in proptest::option::of(windows()),
        block_ms in proptest::option::of(1u64..3_000),
    ) {
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        runtime.block_on(async {
            let (redis, memory) = stores().await;
            let windows: Arc<[Window]> = windows.into();
            let global: Option<Arc<[Window]>> = global.map(Into::into);
            let mut now = 1_767_225_600_000_000 + start_offset;
            for (i, step) in steps.iter().enumerate() {
                now += step.gap_us;
                let check = shaped(Check::new(format!("r0:user{}", step.user), windows.clone())
                    .with_cost(step.cost)
                    .at(Timestamp::from_micros(now)), algorithm, &global, block_ms);
                if let Some(n) = step.adjust {
                    adjust_both(&memory, &redis, &check, n).await;
                }
                let expected = memory.check(check.clone()).await.unwrap();
                let actual = redis.check(check).await.unwrap();
                prop_assert_eq!(&actual, &expected, "step {} of {:?}", i, steps);
            }
            Ok(())
        })?;
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: support::proptest_cases(32), ..ProptestConfig::default() })]

    /// Checks made together (the store sends them as one batch, in one call
    /// of its batch script where they have one, each decided at the same
    /// instant, in the order they were made) decide as the memory store
    /// decides them one by one in that order: a user may have several
    /// checks in one batch, and a user's checks in successive batches
    /// build on each other. Mostly the batch scripts' shape; sometimes with
    /// a route-wide budget or a block time (checks that go one command
    /// each, or the direct path).
    #[test]
    fn checks_sent_together_decide_as_the_memory_store(
        algorithm in algorithm(),
        windows in windows(),
        start_offset in 0u64..10_000_000,
        batches in proptest::collection::vec(
            (proptest::collection::vec((0u8..4, 0u32..=3), 1..8), 0u64..1_500_000),
            1..30,
        ),
        global in proptest::option::weighted(0.15, windows()),
        block_ms in proptest::option::weighted(0.15, 1u64..3_000),
    ) {
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        runtime.block_on(async {
            let (redis, memory) = stores().await;
            let windows: Arc<[Window]> = windows.into();
            let global: Option<Arc<[Window]>> = global.map(Into::into);
            let mut now = 1_767_225_600_000_000 + start_offset;
            for (b, (users, gap_us)) in batches.iter().enumerate() {
                now += gap_us;
                let checks: Vec<Check> = users
                    .iter()
                    .map(|(user, cost)| {
                        let check = Check::new(format!("r0:user{user}"), windows.clone())
                            .with_cost(*cost)
                            .at(Timestamp::from_micros(now));
                        shaped(check, algorithm, &global, block_ms)
                    })
                    .collect();
                let actual =
                    futures_util::future::join_all(checks.iter().cloned().map(|c| redis.check(c)))
                        .await;
                // (Redis runs a batch's checks in the order they were made,
                // which matters where they share a route-wide budget.)
                for (i, (actual, check)) in actual.into_iter().zip(checks).enumerate() {
                    let expected = memory.check(check).await.unwrap();
                    prop_assert_eq!(actual.unwrap(), expected, "batch {}, check {}", b, i);
                }
            }
            Ok(())
        })?;
    }
}

/// One request of [`packed_logs_decide_as_the_memory_store`]: which user,
/// how far the clock moves (back too), its cost, and which of the rules
/// checks it.
#[derive(Debug, Clone)]
struct LogStep {
    user: u8,
    gap_us: i64,
    cost: u32,
    rule: usize,
    /// Whether the check asks for every window's remaining exactly.
    exact: bool,
    /// A penalty (above 0) or a refund (below) just before the check.
    adjust: Option<i64>,
}

fn log_step() -> impl Strategy<Value = LogStep> {
    // Window lengths are whole tenths of a second: gaps of whole tenths
    // put entries right on a window's edge.
    let gap = prop_oneof![
        2 => Just(0i64),
        2 => 0i64..3_000,
        4 => 0i64..400_000,
        2 => (1i64..30).prop_map(|k| k * 100_000),
        1 => 0i64..3_000_000,
        1 => -5_000i64..0,
        1 => -1_500_000i64..0,
    ];
    (
        0u8..2,
        gap,
        prop_oneof![8 => Just(1u32), 2 => 2u32..=20, 1 => Just(0u32)],
        0usize..3,
        any::<bool>(),
        proptest::option::weighted(0.1, -30i64..=60),
    )
        .prop_map(|(user, gap_us, cost, rule, exact, adjust)| LogStep {
            user,
            gap_us,
            cost,
            rule,
            exact,
            adjust,
        })
}

/// 1 to 5 windows from 100 ms to 30 s, limits up to 400: the
/// straight-line sliding-log shapes (packed logs of hundreds of entries).
fn log_windows() -> impl Strategy<Value = Vec<Window>> {
    let limit = prop_oneof![1u32..=80, 100u32..=400];
    let window = (1u64..300, limit).prop_map(|(tenths, l)| (tenths * 100, l));
    proptest::collection::vec(window, 1..=5).prop_map(|mut ws| {
        ws.sort();
        ws.dedup_by_key(|w| w.0);
        ws.into_iter()
            .map(|(ms, l)| Window::new(Duration::from_millis(ms), l).unwrap())
            .collect()
    })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: support::proptest_cases(24), ..ProptestConfig::default() })]

    /// The packed sliding log (one string per budget; a rule whose longest
    /// window allows at most 2,048) against the memory store, over long
    /// sequences: logs of hundreds of entries, stale entries dropped in
    /// batches, hints that go stale as entries leave the windows, a clock
    /// that steps back, costly requests (and free ones), and the budget's rule switching
    /// between three window sets (another number of windows, other
    /// lengths) from one request to the next; entries land on window
    /// edges; with or without a block time; asking for every window's
    /// remaining exactly or not (see [`agree`]). Each sequence ends before
    /// [`SPAN`].
    #[test]
    fn packed_logs_decide_as_the_memory_store(
        rules in proptest::collection::vec(log_windows(), 3),
        start_offset in 0u64..10_000_000,
        steps in proptest::collection::vec(log_step(), 1..400),
        block_ms in proptest::option::of(1u64..3_000),
    ) {
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        runtime.block_on(async {
            let (redis, memory) = stores().await;
            let rules: Vec<Arc<[Window]>> = rules.into_iter().map(Into::into).collect();
            let start = 1_767_225_600_000_000u64 + start_offset;
            let mut now = start;
            for (i, step) in steps.iter().enumerate() {
                now = now.saturating_add_signed(step.gap_us);
                if now >= start + SPAN {
                    break;
                }
                let mut check = Check::new(format!("r0:user{}", step.user), rules[step.rule].clone())
                    .with_cost(step.cost)
                    .with_exact_windows(step.exact)
                    .at(Timestamp::from_micros(now));
                check.algorithm = Algorithm::SlidingLog;
                if let Some(ms) = block_ms {
                    check = check.with_block(Duration::from_millis(ms));
                }
                if let Some(n) = step.adjust {
                    adjust_both(&memory, &redis, &check, n).await;
                }
                let expected = memory.check(check.clone()).await.unwrap();
                let actual = redis.check(check).await.unwrap();
                let agreed = agree(&actual, &expected, step.exact);
                prop_assert!(agreed.is_ok(), "step {} of {:?}, rules {:?}: {:?}", i, steps, rules, agreed);
            }
            Ok(())
        })?;
    }
}

/// How long [`packed_logs_decide_as_the_memory_store`]'s sequences last
/// on the injected clock: under the minute after which the memory store
/// sweeps. A sweep drops a budget that nothing counts any more, at the
/// store's clock and under the rule that checked it last; Redis keeps its
/// key longer (its TTL ends later, and under an injected clock 10 s of
/// real time later still), so a clock that steps back, or a rule with a
/// longer window (a reload), may find on Redis entries or a block the
/// memory store no longer holds. Within the minute, neither store has let
/// anything go, and every difference is one of the decision function.
const SPAN: u64 = 59_000_000;

/// Redis's decision against the memory store's (which counts every window
/// exactly): identical, or, for a check that did not ask for every
/// window's remaining exactly and was allowed, identical but for the
/// remaining of windows other than the constraining one, which may be
/// lower (a window that could not deny the check, left uncounted).
fn agree(actual: &Decision, expected: &Decision, exact: bool) -> Result<(), String> {
    if actual == expected {
        return Ok(());
    }
    let differs = || Err(format!("{actual:?} against {expected:?}"));
    if exact || !expected.allowed() {
        return differs();
    }
    let same_shape = actual.allowed()
        && actual.retry_after() == expected.retry_after()
        && actual.reset_after() == expected.reset_after()
        && actual.is_blocked() == expected.is_blocked()
        && actual.constraining_index() == expected.constraining_index()
        && actual.windows().len() == expected.windows().len();
    if !same_shape {
        return differs();
    }
    let constraining = expected.constraining_index();
    for (i, (a, e)) in actual.windows().iter().zip(expected.windows()).enumerate() {
        let lower = a.remaining < e.remaining && constraining != Some(i);
        if a.window() != e.window() || !(a.remaining == e.remaining || lower) {
            return differs();
        }
    }
    Ok(())
}

/// A long packed log checked right on its entries' edges: the window's
/// start is found far before the entries read with the trailer, and an
/// entry exactly one window old is out of it, on both stores.
#[tokio::test]
async fn long_packed_logs_agree_on_window_edges() {
    let (redis, memory) = stores().await;
    let windows: Arc<[Window]> = [
        Window::new(Duration::from_secs(1), 400).unwrap(),
        Window::new(Duration::from_secs(10), 400).unwrap(),
    ]
    .into();
    let start = 1_767_225_600_000_000u64;
    let mut instants: Vec<u64> = (0..200).map(|i| start + i * 1_000).collect();
    // Exactly a second after an entry, in order: the 1 s window's edge
    // sits on an entry, reached from just before it or (when several
    // entries left at once) from further back.
    for k in [0u64, 40, 41, 60, 75, 100, 150, 151, 190] {
        let edge = start + k * 1_000 + 1_000_000;
        if k % 5 == 0 {
            instants.push(edge);
        } else {
            instants.extend([edge - 1, edge, edge + 1]);
        }
    }
    for (i, now) in instants.into_iter().enumerate() {
        let mut check = Check::new("r0:edge", windows.clone()).at(Timestamp::from_micros(now));
        check.algorithm = Algorithm::SlidingLog;
        let expected = memory.check(check.clone()).await.unwrap();
        let actual = redis.check(check).await.unwrap();
        assert_eq!(actual, expected, "check {i} at {now}");
    }
}

/// A check without windows limits nothing: both stores allow it and leave
/// the budget as it was, whatever the algorithm (a sliding log's entries
/// included: none is trimmed as if the longest window were empty, and no
/// counter's state is overwritten with an empty one); a route-wide budget
/// without windows is left alone the same way, and route-wide windows
/// without the user's are refused (a user without limits counts nothing).
#[tokio::test]
async fn a_check_without_windows_leaves_the_budget_alone() {
    let (redis, memory) = stores().await;
    let hour: Arc<[Window]> = [Window::new(Duration::from_secs(3600), 5).unwrap()].into();
    let none: Arc<[Window]> = Arc::from(Vec::<Window>::new());
    let start = 1_767_225_600_000_000u64;
    let at = |us: u64| Timestamp::from_micros(start + us);
    for algorithm in [
        Algorithm::SlidingLog,
        Algorithm::SlidingWindow,
        Algorithm::FixedWindow,
        Algorithm::TokenBucket,
    ] {
        for (name, store) in [("memory", &memory as &dyn DynCheck), ("redis", &redis)] {
            let case = (name, algorithm);
            let user = |who: &str| format!("r0:{who}-{algorithm:?}");
            let route = GlobalCheck::new(format!("r0:*-{algorithm:?}"), hour.clone());
            let empty_route = GlobalCheck::new(format!("r0:*-{algorithm:?}"), none.clone());
            let check = |who: &str, windows: &Arc<[Window]>, us: u64| {
                let mut check = Check::new(user(who), windows.clone()).at(at(us));
                check.algorithm = algorithm;
                check
            };
            for i in 0..5 {
                assert!(store.run(check("alice", &hour, i)).await.unwrap().allowed());
            }
            let first = check("bob", &hour, 10).with_global(route.clone());
            assert!(store.run(first).await.unwrap().allowed(), "{case:?}");
            let windowless = [
                check("alice", &none, 500_000),
                check("alice", &none, 500_001).with_global(empty_route.clone()),
            ];
            for empty in windowless {
                let decision = store.run(empty).await.unwrap();
                assert!(decision.allowed(), "{case:?}: {decision:?}");
                assert!(decision.windows().is_empty(), "{case:?}: {decision:?}");
            }
            // The user's own windows with a route's budget that has none.
            let carol = check("carol", &hour, 600_000).with_global(empty_route.clone());
            let decision = store.run(carol).await.unwrap();
            assert!(decision.allowed(), "{case:?}: {decision:?}");
            assert_eq!(decision.windows().len(), 1, "{case:?}: {decision:?}");
            assert_eq!(decision.windows()[0].remaining, 4, "{case:?}: {decision:?}");
            let only_route = check("dave", &none, 700_000).with_global(route.clone());
            let error = store.run(only_route).await.unwrap_err();
            assert_eq!(error.kind(), StoreErrorKind::Config, "{case:?}: {error}");
            // Alice's hour still holds her 5, and the route's its 1.
            let after = store.run(check("alice", &hour, 1_000_000)).await.unwrap();
            assert!(
                !after.allowed(),
                "{case:?}: the hour still holds 5: {after:?}"
            );
            let erin = check("erin", &hour, 1_000_000).with_global(route.clone());
            let decision = store.run(erin).await.unwrap();
            assert_eq!(decision.windows()[1].remaining, 3, "{case:?}: {decision:?}");
        }
    }
}

/// One store or the other, for the test above.
trait DynCheck {
    fn run(
        &self,
        check: Check,
    ) -> futures_util::future::BoxFuture<'_, Result<Decision, StoreError>>;
}

impl<S: Store> DynCheck for S {
    fn run(
        &self,
        check: Check,
    ) -> futures_util::future::BoxFuture<'_, Result<Decision, StoreError>> {
        Box::pin(self.check(check))
    }
}
