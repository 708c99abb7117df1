//! The behaviour every store must show through the layer. Each function
//! takes a fresh store; `conformance_suite!` instantiates all of them for
//! one store kind, so the memory store and Redis run the very same tests.

use std::time::Duration;

use http::{Method, StatusCode};
use tower_ratelimit::{Adjustment, Algorithm, Route, Rule, Rules, Store};

use super::App;

/// Instantiates every conformance test for the stores made by `$make`
/// (an expression evaluated once per test, inside the test's runtime).
#[macro_export]
macro_rules! conformance_suite {
    ($make:expr) => {
        $crate::conformance_suite!(@tests $make;
            window_edges_are_exact,
            custom_windows_are_exact,
            all_or_nothing_across_windows,
            headers_describe_the_constraining_window,
            a_tie_describes_the_shorter_window,
            a_tie_between_the_user_and_the_route_goes_to_the_shorter,
            every_algorithm_breaks_a_tie_for_the_shorter_window,
            groups_pick_their_rule,
            routes_fall_through_to_a_rule_for_the_group,
            methods_have_their_own_budgets,
            routes_and_zones_share_budgets,
            unmatched_paths_pass_untouched,
            hostile_identities_stay_separate,
            denied_requests_never_reach_the_inner_service,
            identity_errors_are_answered_401,
            route_wide_limits_are_shared_and_atomic,
            block_time_blocks_and_reports_the_block,
            a_blocked_user_s_headers_leave_the_route_budget_out,
            a_block_shorter_than_the_wait_reports_the_wait,
            a_costly_denial_blocks_for_the_block_time,
            cost_is_spent_exactly,
            a_sliding_log_request_beyond_the_cost_cap_writes_nothing,
            adjustments_penalize_and_refund,
            adjustments_reach_the_user_alone,
            an_adjustment_reads_no_cost,
            two_algorithms_on_one_budget_keep_their_own_state,
            a_route_budget_spelled_as_a_user_budget_is_its_own,
            a_block_holds_across_a_change_of_algorithm,
            windows_set_by_hand_out_of_order_are_refused,
        );
        $crate::conformance_suite!(@algorithms $make;
            sliding_log: tower_ratelimit::Algorithm::SlidingLog,
            sliding_window: tower_ratelimit::Algorithm::SlidingWindow,
            fixed_window: tower_ratelimit::Algorithm::FixedWindow,
            token_bucket: tower_ratelimit::Algorithm::TokenBucket,
        );
    };
    (@algorithms $make:expr; $($name:ident: $algorithm:expr),+ $(,)?) => {
        $(
            mod $name {
                #[tokio::test]
                async fn edges_are_exact() {
                    $crate::support::conformance::algorithm_edges($make, $algorithm).await;
                }
                #[tokio::test]
                async fn all_or_nothing() {
                    $crate::support::conformance::algorithm_all_or_nothing($make, $algorithm).await;
                }
                #[tokio::test]
                async fn a_clock_that_steps_back_keeps_later_counts() {
                    $crate::support::conformance::a_clock_that_steps_back_keeps_later_counts(
                        $make, $algorithm,
                    )
                    .await;
                }
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn concurrent_requests_on_one_budget_are_exact() {
                    $crate::support::conformance::concurrent_requests_on_one_budget_are_exact(
                        $make, $algorithm,
                    )
                    .await;
                }
            }
        )+
    };
    (@tests $make:expr; $($name:ident),+ $(,)?) => {
        $(
            #[tokio::test]
            async fn $name() {
                $crate::support::conformance::$name($make).await;
            }
        )+
    };
}

/// Every algorithm, for the tests that run each in turn on one store.
const ALGORITHMS: [Algorithm; 4] = [
    Algorithm::SlidingLog,
    Algorithm::SlidingWindow,
    Algorithm::FixedWindow,
    Algorithm::TokenBucket,
];

fn one_route(pattern: &str, rules: impl IntoIterator<Item = Rule>) -> Rules {
    Rules::builder().route(pattern, rules).build().unwrap()
}

pub async fn window_edges_are_exact<St: Store>(store: impl std::future::Future<Output = St>) {
    let app = App::new(one_route("^/a", [Rule::new().second(1)]), store.await);
    let first = app.get("/a", "u").await;
    assert_eq!(first.status, StatusCode::OK);
    assert_eq!(first.header("x-ratelimit-limit"), Some("1"));
    assert_eq!(first.header("x-ratelimit-remaining"), Some("0"));
    assert_eq!(first.header("x-ratelimit-reset"), Some("1"));
    assert_eq!(first.header("retry-after"), None);

    let denied = app.get("/a", "u").await;
    assert_eq!(denied.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(denied.header("retry-after"), Some("1"));
    assert_eq!(denied.header("x-ratelimit-remaining"), Some("0"));
    assert_eq!(
        denied.header("content-type"),
        Some("application/problem+json")
    );
    assert!(denied.body.contains(r#""status":429"#), "{}", denied.body);

    // 300 ms later the exact wait is 700 ms: Retry-After rounds it up.
    app.advance_ms(300);
    let denied = app.get("/a", "u").await;
    assert_eq!(denied.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(denied.number("retry-after"), 1);
    assert_eq!(denied.number("x-ratelimit-reset"), 1);

    // Denied one millisecond before the slot frees, allowed exactly at it.
    app.advance_ms(699);
    assert_eq!(
        app.get("/a", "u").await.status,
        StatusCode::TOO_MANY_REQUESTS
    );
    app.advance_ms(1);
    assert_eq!(app.get("/a", "u").await.status, StatusCode::OK);
    assert_eq!(app.inner_calls(), 2);
}

pub async fn custom_windows_are_exact<St: Store>(store: impl std::future::Future<Output = St>) {
    let rules = one_route("^/a", [Rule::new().per(Duration::from_secs(10), 5)]);
    let app = App::new(rules, store.await);
    for i in 0..5 {
        let reply = app.get("/a", "u").await;
        assert_eq!(reply.status, StatusCode::OK, "request {i}");
        assert_eq!(reply.number("x-ratelimit-remaining"), 4 - i);
        app.advance_ms(1000);
    }
    // Now t = 5 s; the first entry (t = 0) leaves at t = 10 s.
    let denied = app.get("/a", "u").await;
    assert_eq!(denied.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(denied.number("retry-after"), 5);
    assert_eq!(denied.number("x-ratelimit-reset"), 5);
    app.advance(Duration::from_millis(4999));
    assert_eq!(
        app.get("/a", "u").await.status,
        StatusCode::TOO_MANY_REQUESTS
    );
    app.advance_ms(1);
    let allowed = app.get("/a", "u").await;
    assert_eq!(allowed.status, StatusCode::OK);
    assert_eq!(allowed.number("x-ratelimit-remaining"), 0);
    // Its slot is the one that was freed: the next (t = 1 s) frees at 11 s.
    let denied = app.get("/a", "u").await;
    assert_eq!(denied.number("retry-after"), 1);
}

pub async fn all_or_nothing_across_windows<St: Store>(
    store: impl std::future::Future<Output = St>,
) {
    let app = App::new(
        one_route("^/a", [Rule::new().second(2).minute(3)]),
        store.await,
    );
    assert_eq!(app.get("/a", "u").await.status, StatusCode::OK);
    assert_eq!(app.get("/a", "u").await.status, StatusCode::OK);
    // Denied by the second window: these must not eat the minute window.
    for _ in 0..5 {
        let denied = app.get("/a", "u").await;
        assert_eq!(denied.status, StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(denied.number("retry-after"), 1);
    }
    // Two requests in one instant are recorded one microsecond apart, so the
    // second one leaves the second window 1 µs after the first.
    app.advance_ms(1001);
    let third = app.get("/a", "u").await;
    assert_eq!(third.status, StatusCode::OK);
    // The minute window is now the constraining one.
    assert_eq!(third.number("x-ratelimit-limit"), 3);
    assert_eq!(third.number("x-ratelimit-remaining"), 0);
    assert_eq!(third.number("x-ratelimit-reset"), 59);
    for _ in 0..5 {
        let denied = app.get("/a", "u").await;
        assert_eq!(denied.status, StatusCode::TOO_MANY_REQUESTS);
        // The minute window denies for 59 s; the largest wait wins.
        assert_eq!(denied.number("retry-after"), 59);
    }
    // At t = 61.001 s every entry has left the minute window.
    app.advance_ms(60_000);
    assert_eq!(app.get("/a", "u").await.status, StatusCode::OK);
    assert_eq!(app.get("/a", "u").await.status, StatusCode::OK);
    assert_eq!(
        app.get("/a", "u").await.status,
        StatusCode::TOO_MANY_REQUESTS
    );
    assert_eq!(app.inner_calls(), 5);
}

pub async fn headers_describe_the_constraining_window<St: Store>(
    store: impl std::future::Future<Output = St>,
) {
    let rules = Rules::builder()
        .route("^/tie", [Rule::new().second(5).minute(5)])
        .route("^/long", [Rule::new().second(10).hour(3)])
        .build()
        .unwrap();
    let app = App::new(rules, store.await);
    // Both windows have 4 left: the shorter one is described.
    let tie = app.get("/tie", "u").await;
    assert_eq!(tie.number("x-ratelimit-remaining"), 4);
    assert_eq!(tie.number("x-ratelimit-reset"), 1);
    // The hour window has fewer left than the second window.
    let long = app.get("/long", "u").await;
    assert_eq!(long.number("x-ratelimit-limit"), 3);
    assert_eq!(long.number("x-ratelimit-remaining"), 2);
    assert_eq!(long.number("x-ratelimit-reset"), 3600);
}

/// Two windows with as many left, then both spent, with different limits:
/// every `X-RateLimit-*` header describes the same window, the shorter
/// (its limit and its reset), and `Retry-After` the wait for the minute.
pub async fn a_tie_describes_the_shorter_window<St: Store>(
    store: impl std::future::Future<Output = St>,
) {
    let app = App::new(
        one_route("^/a", [Rule::new().second(2).minute(3)]),
        store.await,
    );
    let seen = super::Reply::x_headers;
    assert_eq!(seen(&app.get("/a", "u").await), (200, 2, 1, 1));
    app.advance_ms(1_100);
    // One left in each: the second's limit and reset.
    assert_eq!(seen(&app.get("/a", "u").await), (200, 2, 1, 1));
    // Both windows spent: still the second's, not the minute's.
    assert_eq!(seen(&app.get("/a", "u").await), (200, 2, 0, 1));
    let denied = app.get("/a", "u").await;
    assert_eq!(seen(&denied), (429, 2, 0, 1));
    assert_eq!(denied.number("retry-after"), 59);
    // The second has a slot again: the minute alone denies, and is
    // described.
    app.advance_ms(1_000);
    let denied = app.get("/a", "u").await;
    assert_eq!(seen(&denied), (429, 3, 0, 58));
    assert_eq!(denied.number("retry-after"), 58);
}

/// A tie between the user's window and the route's goes to the shorter
/// too, whichever budget it is in: here the route's second over the user's
/// minute, where the user's window, listed first, would win on order alone.
pub async fn a_tie_between_the_user_and_the_route_goes_to_the_shorter<St: Store>(
    store: impl std::future::Future<Output = St>,
) {
    let rules = super::route_with_global("^/a", [Rule::new().minute(2)], Rule::new().second(3));
    let app = App::new(rules, store.await);
    assert_eq!(app.get("/a", "u").await.status, StatusCode::OK);
    assert_eq!(app.get("/a", "u").await.status, StatusCode::OK);
    // (v spends the route's last request of this second.)
    assert_eq!(app.get("/a", "v").await.status, StatusCode::OK);
    // u: its minute and the route's second both spent; the route's second
    // is described, the user's minute is the wait.
    let denied = app.get("/a", "u").await;
    assert_eq!(denied.x_headers(), (429, 3, 0, 1));
    assert_eq!(denied.number("retry-after"), 60);
    // v's own minute has room, the route's second is spent: denied by the
    // route alone, which the headers name.
    let route = app.get("/a", "v").await;
    assert_eq!(route.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(route.number("x-ratelimit-limit"), 3);
    assert_eq!(route.number("retry-after"), 1);
}

/// Every algorithm (in the Redis scripts as in the memory store) describes
/// the shorter of two windows with as many left: the second's reset is at
/// most 2 s (a sliding window's request counts over two of its fixed
/// windows), the minute's more.
pub async fn every_algorithm_breaks_a_tie_for_the_shorter_window<St: Store>(
    store: impl std::future::Future<Output = St>,
) {
    let mut rules = Rules::builder();
    for (i, algorithm) in ALGORITHMS.into_iter().enumerate() {
        rules = rules.route(
            format!("^/{i}$"),
            [Rule::new().second(5).minute(5).algorithm(algorithm)],
        );
    }
    let app = App::new(rules.build().unwrap(), store.await);
    for (i, algorithm) in ALGORITHMS.into_iter().enumerate() {
        let reply = app.get(&format!("/{i}"), "u").await;
        assert_eq!(reply.number("x-ratelimit-remaining"), 4, "{algorithm:?}");
        assert!(reply.number("x-ratelimit-reset") <= 2, "{algorithm:?}");
    }
}

pub async fn groups_pick_their_rule<St: Store>(store: impl std::future::Future<Output = St>) {
    let rules = one_route(
        "^/towns",
        [Rule::group("default").second(1), Rule::group("admin")],
    );
    let app = App::new(rules, store.await);
    assert_eq!(app.get("/towns", "d").await.status, StatusCode::OK);
    assert_eq!(
        app.get("/towns", "d").await.status,
        StatusCode::TOO_MANY_REQUESTS
    );
    for _ in 0..10 {
        // A rule without limits: unlimited, and no headers to describe.
        let admin = app.get_as("/towns", "a", "admin").await;
        assert_eq!(admin.status, StatusCode::OK);
        assert!(!admin.limited());
        // A group without a rule: unlimited too.
        let guest = app.get_as("/towns", "g", "guest").await;
        assert_eq!(guest.status, StatusCode::OK);
        assert!(!guest.limited());
    }
}

pub async fn routes_fall_through_to_a_rule_for_the_group<St: Store>(
    store: impl std::future::Future<Output = St>,
) {
    let rules = Rules::builder()
        .route("^/api/special", [Rule::group("admin").second(1)])
        .route("^/api", [Rule::new().second(2)])
        .build()
        .unwrap();
    let app = App::new(rules, store.await);
    assert_eq!(
        app.get("/api/special", "d")
            .await
            .number("x-ratelimit-limit"),
        2
    );
    assert_eq!(
        app.get_as("/api/special", "a", "admin")
            .await
            .number("x-ratelimit-limit"),
        1
    );
    assert!(!app.get_as("/api/other", "a", "admin").await.limited());
}

pub async fn methods_have_their_own_budgets<St: Store>(
    store: impl std::future::Future<Output = St>,
) {
    let rules = one_route(
        "^/items",
        [Rule::new().method("POST").second(1), Rule::new().second(3)],
    );
    let app = App::new(rules, store.await);
    let post = |app: &App| {
        let app = app.clone();
        async move { app.send(Method::POST, "/items", Some(b"u"), None).await }
    };
    assert_eq!(post(&app).await.status, StatusCode::OK);
    assert_eq!(post(&app).await.status, StatusCode::TOO_MANY_REQUESTS);
    for left in (0..3).rev() {
        let get = app.get("/items", "u").await;
        assert_eq!(get.status, StatusCode::OK);
        assert_eq!(get.number("x-ratelimit-remaining"), left);
    }
    assert_eq!(
        app.get("/items", "u").await.status,
        StatusCode::TOO_MANY_REQUESTS
    );
}

pub async fn routes_and_zones_share_budgets<St: Store>(
    store: impl std::future::Future<Output = St>,
) {
    let rules = Rules::builder()
        .route("^/towns", [Rule::new().second(2)])
        .route("^/a", [Rule::new().second(2).zone("shared")])
        .route("^/b", [Rule::new().second(2).zone("shared")])
        .route("^/c", [Rule::new().second(2)])
        .build()
        .unwrap();
    let app = App::new(rules, store.await);
    // Every path of one route counts against one budget.
    assert_eq!(app.get("/towns/1", "u").await.status, StatusCode::OK);
    assert_eq!(app.get("/towns/2", "u").await.status, StatusCode::OK);
    assert_eq!(
        app.get("/towns/3", "u").await.status,
        StatusCode::TOO_MANY_REQUESTS
    );
    // Routes in one zone share one budget.
    assert_eq!(app.get("/a", "u").await.status, StatusCode::OK);
    assert_eq!(app.get("/b", "u").await.status, StatusCode::OK);
    assert_eq!(
        app.get("/a", "u").await.status,
        StatusCode::TOO_MANY_REQUESTS
    );
    assert_eq!(
        app.get("/b", "u").await.status,
        StatusCode::TOO_MANY_REQUESTS
    );
    // Other routes do not.
    assert_eq!(app.get("/c", "u").await.status, StatusCode::OK);
}

pub async fn unmatched_paths_pass_untouched<St: Store>(
    store: impl std::future::Future<Output = St>,
) {
    let app = App::new(one_route("^/limited", [Rule::new().second(1)]), store.await);
    for _ in 0..5 {
        let reply = app.get("/free", "u").await;
        assert_eq!(reply.status, StatusCode::OK);
        assert!(!reply.limited());
    }
    // Not even the identity function ran.
    assert_eq!(app.identity_calls(), 0);
    // Unmatched requests need no identity at all.
    let anonymous = app.send(Method::GET, "/free", None, None).await;
    assert_eq!(anonymous.status, StatusCode::OK);
    assert_eq!(app.inner_calls(), 6);
}

/// Identities that look like key syntax, or are huge, must each get their
/// own budget.
pub async fn hostile_identities_stay_separate<St: Store>(
    store: impl std::future::Future<Output = St>,
) {
    let app = App::new(
        Rules::builder()
            .route("^/a", [Rule::new().minute(1)])
            .route("^/b", [Rule::new().minute(1)])
            .build()
            .unwrap(),
        store.await,
    );
    let mut long_a = vec![b'x'; 64 * 1024];
    let mut long_b = long_a.clone();
    long_a.push(b'a');
    long_b.push(b'b');
    let users: Vec<Vec<u8>> = vec![
        b"alice".to_vec(),
        b"alice:".to_vec(),
        b"alice}".to_vec(),
        b"{alice}".to_vec(),
        b"alice}:rl:{bob".to_vec(),
        b"al%69ce".to_vec(),
        b"al%2569ce".to_vec(),
        b"alice\nbob".to_vec(),
        b"alice bob".to_vec(),
        b"".to_vec(),
        vec![0, 0xff, b':', b'{'],
        long_a,
        long_b,
    ];
    for user in &users {
        let reply = app.get_bytes("/a", user).await;
        assert_eq!(reply.status, StatusCode::OK, "first request of {user:?}");
    }
    for user in &users {
        let reply = app.get_bytes("/a", user).await;
        assert_eq!(
            reply.status,
            StatusCode::TOO_MANY_REQUESTS,
            "second request of {user:?}"
        );
        // Each user's budget on another route is untouched.
        assert_eq!(app.get_bytes("/b", user).await.status, StatusCode::OK);
    }
}

pub async fn denied_requests_never_reach_the_inner_service<St: Store>(
    store: impl std::future::Future<Output = St>,
) {
    let app = App::new(one_route("^/a", [Rule::new().second(3)]), store.await);
    let mut allowed = 0;
    for _ in 0..50 {
        if app.get("/a", "u").await.status == StatusCode::OK {
            allowed += 1;
        }
    }
    assert_eq!(allowed, 3);
    assert_eq!(app.inner_calls(), 3);
}

pub async fn identity_errors_are_answered_401<St: Store>(
    store: impl std::future::Future<Output = St>,
) {
    let app = App::new(one_route("^/a", [Rule::new().second(3)]), store.await);
    let reply = app.send(Method::GET, "/a", None, None).await;
    assert_eq!(reply.status, StatusCode::UNAUTHORIZED);
    assert_eq!(
        reply.header("content-type"),
        Some("application/problem+json")
    );
    assert!(reply.body.contains("missing x-user"), "{}", reply.body);
    assert_eq!(app.inner_calls(), 0);
}

pub async fn concurrent_requests_on_one_budget_are_exact<St: Store>(
    store: impl std::future::Future<Output = St>,
    algorithm: Algorithm,
) {
    let rule = Rule::new().minute(100).algorithm(algorithm);
    let app = App::new(one_route("^/a", [rule]), store.await);
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..1000 {
        let app = app.clone();
        tasks.spawn(async move { app.get("/a", "hot").await.status });
    }
    let mut allowed = 0;
    let mut denied = 0;
    while let Some(status) = tasks.join_next().await {
        match status.unwrap() {
            StatusCode::OK => allowed += 1,
            StatusCode::TOO_MANY_REQUESTS => denied += 1,
            other => panic!("unexpected {other}"),
        }
    }
    assert_eq!((allowed, denied), (100, 900));
    assert_eq!(app.inner_calls(), 100);
}

/// Each algorithm's own contract at its edges: allowed exactly when the
/// reported wait has passed, denied one millisecond before.
/// A request counted just after a window's edge, then one whose clock
/// reads just before it (it read the clock first but was counted second, or
/// the clock stepped back): the later count holds for both, in every
/// algorithm, on the straight-line and the general (route-wide) path.
pub async fn a_clock_that_steps_back_keeps_later_counts<St: Store + Clone>(
    store: impl std::future::Future<Output = St>,
    algorithm: Algorithm,
) {
    let store = store.await;
    let user = Rule::new().second(1).algorithm(algorithm);
    let plain = App::new(one_route("^/a", [user.clone()]), store.clone());
    let rules = super::route_with_global("^/b", [user], Rule::new().hour(1000));
    let general = App::new(rules, store);
    for (app, path) in [(&plain, "/a"), (&general, "/b")] {
        let start = tower_ratelimit::clock::Clock::now(&app.clock);
        app.advance_ms(1000);
        assert_eq!(app.get(path, "u").await.status, StatusCode::OK, "{path}");
        app.clock
            .set(start.saturating_add(Duration::from_micros(999_999)));
        let early = app.get(path, "u").await;
        assert_eq!(
            early.status,
            StatusCode::TOO_MANY_REQUESTS,
            "{algorithm:?} {path}"
        );
        assert_eq!(early.number("x-ratelimit-remaining"), 0);
        // Waits run from the clock's reading: 1 s + 1 µs to the next window
        // (the sliding window's count weighs on through the one after).
        let wait = if algorithm == Algorithm::SlidingWindow {
            3
        } else {
            2
        };
        assert_eq!(early.number("retry-after"), wait, "{algorithm:?} {path}");
        app.advance_ms(2);
        assert_eq!(
            app.get(path, "u").await.status,
            StatusCode::TOO_MANY_REQUESTS,
            "{algorithm:?} {path}"
        );
        app.advance_ms(3000);
        assert_eq!(app.get(path, "u").await.status, StatusCode::OK, "{path}");
    }
}

pub async fn algorithm_edges<St: Store>(
    store: impl std::future::Future<Output = St>,
    algorithm: Algorithm,
) {
    let store = store.await;
    let app = move |rule: Rule| App::new(one_route("^/a", [rule.algorithm(algorithm)]), store);
    match algorithm {
        Algorithm::FixedWindow => {
            // START is a whole multiple of 10 s: windows are epoch-aligned.
            let app = app(Rule::new().per(Duration::from_secs(10), 3));
            app.advance_ms(2500);
            for left in (0..3).rev() {
                let reply = app.get("/a", "u").await;
                assert_eq!(reply.status, StatusCode::OK);
                assert_eq!(reply.number("x-ratelimit-remaining"), left);
                assert_eq!(reply.number("x-ratelimit-reset"), 8);
            }
            let denied = app.get("/a", "u").await;
            assert_eq!(denied.status, StatusCode::TOO_MANY_REQUESTS);
            assert_eq!(denied.number("retry-after"), 8);
            app.advance_ms(7499);
            assert_eq!(
                app.get("/a", "u").await.status,
                StatusCode::TOO_MANY_REQUESTS
            );
            app.advance_ms(1);
            let next = app.get("/a", "u").await;
            assert_eq!(next.status, StatusCode::OK);
            assert_eq!(next.number("x-ratelimit-remaining"), 2);
            assert_eq!(next.number("x-ratelimit-reset"), 10);
        }
        Algorithm::SlidingWindow => {
            let app = app(Rule::new().second(10));
            for _ in 0..10 {
                assert_eq!(app.get("/a", "u").await.status, StatusCode::OK);
            }
            // Half-way through the next window the previous 10 weigh 5.
            app.advance_ms(1500);
            for left in (0..5).rev() {
                let reply = app.get("/a", "u").await;
                assert_eq!(reply.status, StatusCode::OK);
                assert_eq!(reply.number("x-ratelimit-remaining"), left);
            }
            let denied = app.get("/a", "u").await;
            assert_eq!(denied.status, StatusCode::TOO_MANY_REQUESTS);
            // One more fits once they weigh 4, at 60 % of the window: 100 ms.
            assert_eq!(denied.number("retry-after"), 1);
            app.advance_ms(99);
            assert_eq!(
                app.get("/a", "u").await.status,
                StatusCode::TOO_MANY_REQUESTS
            );
            app.advance_ms(1);
            assert_eq!(app.get("/a", "u").await.status, StatusCode::OK);
        }
        Algorithm::TokenBucket => {
            let app = app(Rule::new().second(4));
            for left in (0..4).rev() {
                let reply = app.get("/a", "u").await;
                assert_eq!(reply.status, StatusCode::OK);
                assert_eq!(reply.number("x-ratelimit-remaining"), left);
            }
            // One token every 250 ms.
            let denied = app.get("/a", "u").await;
            assert_eq!(denied.status, StatusCode::TOO_MANY_REQUESTS);
            assert_eq!(denied.number("retry-after"), 1);
            app.advance_ms(249);
            assert_eq!(
                app.get("/a", "u").await.status,
                StatusCode::TOO_MANY_REQUESTS
            );
            app.advance_ms(1);
            let reply = app.get("/a", "u").await;
            assert_eq!(reply.status, StatusCode::OK);
            assert_eq!(reply.number("x-ratelimit-remaining"), 0);
            // A second later the bucket is full again.
            app.advance_ms(1000);
            assert_eq!(app.get("/a", "u").await.number("x-ratelimit-remaining"), 3);
        }
        _ => {
            let app = app(Rule::new().second(1));
            assert_eq!(app.get("/a", "u").await.status, StatusCode::OK);
            app.advance_ms(400);
            let denied = app.get("/a", "u").await;
            assert_eq!(denied.number("retry-after"), 1);
            app.advance_ms(599);
            assert_eq!(
                app.get("/a", "u").await.status,
                StatusCode::TOO_MANY_REQUESTS
            );
            app.advance_ms(1);
            assert_eq!(app.get("/a", "u").await.status, StatusCode::OK);
        }
    }
}

/// Every algorithm: a denied request consumes nothing in any window.
pub async fn algorithm_all_or_nothing<St: Store>(
    store: impl std::future::Future<Output = St>,
    algorithm: Algorithm,
) {
    let rule = Rule::new().second(2).minute(3).algorithm(algorithm);
    let app = App::new(one_route("^/a", [rule]), store.await);
    assert_eq!(app.get("/a", "u").await.status, StatusCode::OK);
    assert_eq!(app.get("/a", "u").await.status, StatusCode::OK);
    for _ in 0..5 {
        assert_eq!(
            app.get("/a", "u").await.status,
            StatusCode::TOO_MANY_REQUESTS
        );
    }
    // Two seconds on (the sliding window counter still weighs the previous
    // second), the minute window has exactly one left: the denials took
    // nothing.
    app.advance_ms(2001);
    assert_eq!(app.get("/a", "u").await.status, StatusCode::OK);
    for _ in 0..5 {
        assert_eq!(
            app.get("/a", "u").await.status,
            StatusCode::TOO_MANY_REQUESTS
        );
    }
    assert_eq!(app.inner_calls(), 3);
}

pub async fn route_wide_limits_are_shared_and_atomic<St: Store>(
    store: impl std::future::Future<Output = St>,
) {
    let rules = super::route_with_global(
        "^/search",
        [Rule::new().second(2), Rule::group("admin")],
        Rule::new().second(3),
    );
    let app = App::new(rules, store.await);
    assert_eq!(app.get("/search", "a").await.status, StatusCode::OK);
    assert_eq!(app.get("/search", "a").await.status, StatusCode::OK);
    let b = app.get("/search", "b").await;
    assert_eq!(b.status, StatusCode::OK);
    // The route's budget is the constraining one now.
    assert_eq!(b.number("x-ratelimit-limit"), 3);
    assert_eq!(b.number("x-ratelimit-remaining"), 0);
    // b's own budget has room, the route's has none: denied, and b's own
    // budget is not charged.
    for user in ["b", "c", "d"] {
        let denied = app.get("/search", user).await;
        assert_eq!(denied.status, StatusCode::TOO_MANY_REQUESTS, "{user}");
        assert_eq!(denied.number("retry-after"), 1);
    }
    // Unlimited groups stay unlimited.
    assert_eq!(
        app.get_as("/search", "root", "admin").await.status,
        StatusCode::OK
    );
    // (1 ms more: requests in one instant are recorded 1 µs apart.)
    app.advance_ms(1001);
    // A user denied by their own window charges the route nothing either.
    assert_eq!(app.get("/search", "b").await.status, StatusCode::OK);
    assert_eq!(app.get("/search", "b").await.status, StatusCode::OK);
    assert_eq!(
        app.get("/search", "b").await.status,
        StatusCode::TOO_MANY_REQUESTS
    );
    assert_eq!(app.get("/search", "c").await.status, StatusCode::OK);
    assert_eq!(
        app.get("/search", "d").await.status,
        StatusCode::TOO_MANY_REQUESTS
    );
    assert_eq!(app.inner_calls(), 3 + 1 + 3);
}

pub async fn block_time_blocks_and_reports_the_block<St: Store>(
    store: impl std::future::Future<Output = St>,
) {
    let rule = Rule::new().second(2).block_time(Duration::from_secs(10));
    let app = App::new(one_route("^/login", [rule]), store.await);
    assert_eq!(app.get("/login", "u").await.status, StatusCode::OK);
    assert_eq!(app.get("/login", "u").await.status, StatusCode::OK);
    let blocked = app.get("/login", "u").await;
    assert_eq!(blocked.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(blocked.number("retry-after"), 10);
    assert_eq!(blocked.number("x-ratelimit-reset"), 10);
    assert_eq!(blocked.number("x-ratelimit-remaining"), 0);
    // The window frees after a second, the block holds for ten.
    app.advance_ms(4000);
    let still = app.get("/login", "u").await;
    assert_eq!(still.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(still.number("retry-after"), 6);
    // Others are not blocked.
    assert_eq!(app.get("/login", "v").await.status, StatusCode::OK);
    app.advance_ms(5999);
    assert_eq!(
        app.get("/login", "u").await.status,
        StatusCode::TOO_MANY_REQUESTS
    );
    app.advance_ms(1);
    assert_eq!(app.get("/login", "u").await.status, StatusCode::OK);
    assert_eq!(app.inner_calls(), 4);
}

/// A blocked user's headers describe the user's own windows, with nothing
/// left and the block's end as the reset, and leave the route-wide budget
/// out: a blocked request does not look at it, and it is not spent (before,
/// it was reported at 0 remaining while other users still had most of it).
pub async fn a_blocked_user_s_headers_leave_the_route_budget_out<St: Store>(
    store: impl std::future::Future<Output = St>,
) {
    let rules = super::route_with_global(
        "^/a",
        [Rule::new()
            .second(1)
            .hour(100)
            .block_time(Duration::from_secs(100))],
        Rule::new().hour(1000),
    );
    let app = App::with(rules, store.await, |l| {
        l.headers(tower_ratelimit::HeaderMode::Both)
    });
    assert_eq!(app.get("/a", "u").await.status, StatusCode::OK);
    for _ in 0..2 {
        let blocked = app.get("/a", "u").await;
        assert_eq!(blocked.x_headers(), (429, 1, 0, 100));
        assert_eq!(blocked.number("retry-after"), 100);
        assert_eq!(
            blocked.header("ratelimit"),
            Some(r#""1s";r=0;t=100, "3600s";r=0"#)
        );
    }
    let other = app.get("/a", "v").await;
    assert_eq!(other.status, StatusCode::OK);
    assert!(
        other
            .header("ratelimit")
            .unwrap()
            .ends_with(r#""route-3600s";r=998"#),
        "{other:?}"
    );
}

/// A block shorter than the denied request's wait holds for the wait: every
/// blocked answer, on any replica, reports when the user can pass, and the
/// user passes then (a block that ended first would leave the user denied by
/// the window and blocked again).
pub async fn a_block_shorter_than_the_wait_reports_the_wait<St: Store>(
    store: impl std::future::Future<Output = St>,
) {
    let store = std::sync::Arc::new(store.await);
    for algorithm in ALGORITHMS {
        let rule = Rule::new()
            .minute(2)
            .block_time(Duration::from_secs(10))
            .algorithm(algorithm);
        let rules = one_route("^/login", [rule]);
        let app = App::new(rules.clone(), store.clone());
        // Another replica's layer (its own denial cache) at `secs` after.
        let replica_at = |secs: u64| {
            App::on_clock_at(
                rules.clone(),
                store.clone(),
                super::START + secs * 1_000_000,
            )
        };
        let user = format!("short-block-{algorithm:?}");
        assert_eq!(app.get("/login", &user).await.status, StatusCode::OK);
        assert_eq!(app.get("/login", &user).await.status, StatusCode::OK);
        let denied = app.get("/login", &user).await;
        assert_eq!(
            denied.status,
            StatusCode::TOO_MANY_REQUESTS,
            "{algorithm:?}"
        );
        let wait = denied.number("retry-after");
        assert!(wait > 10, "{algorithm:?}: a wait of {wait} s");
        let blocked = replica_at(5).get("/login", &user).await;
        assert_eq!(
            blocked.status,
            StatusCode::TOO_MANY_REQUESTS,
            "{algorithm:?}"
        );
        assert_eq!(blocked.number("retry-after"), wait - 5, "{algorithm:?}");
        // (The wait may end within its last second: Retry-After rounds up.)
        let last = replica_at(wait - 1).get("/login", &user).await;
        assert_eq!(last.status, StatusCode::TOO_MANY_REQUESTS, "{algorithm:?}");
        assert_eq!(last.number("retry-after"), 1, "{algorithm:?}");
        let after = replica_at(wait).get("/login", &user).await;
        assert_eq!(after.status, StatusCode::OK, "{algorithm:?}");
        assert_eq!(app.inner_calls(), 2, "{algorithm:?}");
    }
}

/// A costlier request's wait is its own, not a cheaper one's (and one
/// above a limit waits for ever): denied, it blocks the user for the block
/// time only, after which a request of cost 1 that fits passes.
pub async fn a_costly_denial_blocks_for_the_block_time<St: Store>(
    store: impl std::future::Future<Output = St>,
) {
    let store = std::sync::Arc::new(store.await);
    for (algorithm, costly) in ALGORITHMS.iter().flat_map(|a| [(*a, 6u32), (*a, 11)]) {
        let rule = Rule::new()
            .minute(10)
            .block_time(Duration::from_secs(10))
            .algorithm(algorithm);
        let app = App::with(one_route("^/up", [rule]), store.clone(), |l| {
            l.cost(super::cost_header)
        });
        let user = format!("costly-block-{}-{costly}", algorithm.as_str());
        let with_cost = |cost: u32| super::costing("/up", &user, cost);
        let why = format!("{algorithm:?}, cost {costly}");
        assert_eq!(
            app.send_request(with_cost(6)).await.status,
            StatusCode::OK,
            "{why}"
        );
        let denied = app.send_request(with_cost(costly)).await;
        assert_eq!(denied.status, StatusCode::TOO_MANY_REQUESTS, "{why}");
        app.advance_ms(9_999);
        let blocked = app.send_request(with_cost(1)).await;
        assert_eq!(blocked.status, StatusCode::TOO_MANY_REQUESTS, "{why}");
        assert_eq!(blocked.number("retry-after"), 1, "{why}");
        app.advance_ms(1);
        assert_eq!(
            app.send_request(with_cost(1)).await.status,
            StatusCode::OK,
            "{why}"
        );
    }
}

pub async fn cost_is_spent_exactly<St: Store>(store: impl std::future::Future<Output = St>) {
    let store = std::sync::Arc::new(store.await);
    for algorithm in ALGORITHMS {
        let rules = one_route("^/a", [Rule::new().minute(5).algorithm(algorithm)]);
        let app = App::with(rules, store.clone(), |l| l.cost(super::cost_header));
        let user = format!("cost-{}", algorithm.as_str());
        let with_cost = |cost: u32| super::costing("/a", &user, cost);
        let first = app.send_request(with_cost(3)).await;
        assert_eq!(first.status, StatusCode::OK, "{algorithm:?}");
        assert_eq!(first.number("x-ratelimit-remaining"), 2, "{algorithm:?}");
        let denied = app.send_request(with_cost(3)).await;
        assert_eq!(
            denied.status,
            StatusCode::TOO_MANY_REQUESTS,
            "{algorithm:?}"
        );
        assert_eq!(denied.number("x-ratelimit-remaining"), 2, "{algorithm:?}");
        let last = app.send_request(with_cost(2)).await;
        assert_eq!(last.status, StatusCode::OK, "{algorithm:?}");
        assert_eq!(last.number("x-ratelimit-remaining"), 0, "{algorithm:?}");
        // A cost above the limit can never pass.
        let huge = app.send_request(with_cost(6)).await;
        assert_eq!(huge.status, StatusCode::TOO_MANY_REQUESTS, "{algorithm:?}");
    }
}

/// A sliding-log request may cost at most `MAX_LOG_COST` (each unit is an
/// entry the store writes): a costlier one, within the limit or not, is
/// answered as one that never passes (a 429 without `Retry-After`) and
/// writes nothing; the other algorithms take any cost within the limit.
pub async fn a_sliding_log_request_beyond_the_cost_cap_writes_nothing<St: Store>(
    store: impl std::future::Future<Output = St>,
) {
    use tower_ratelimit::rules::MAX_LOG_COST;
    let store = std::sync::Arc::new(store.await);
    for algorithm in ALGORITHMS {
        let rules = one_route("^/a", [Rule::new().minute(1_000_000).algorithm(algorithm)]);
        let app = App::with(rules, store.clone(), |l| l.cost(super::cost_header));
        let user = format!("cap-{}", algorithm.as_str());
        let with_cost = |cost: u32| super::costing("/a", &user, cost);
        let at_cap = app.send_request(with_cost(MAX_LOG_COST)).await;
        assert_eq!(at_cap.status, StatusCode::OK, "{algorithm:?}");
        let beyond = app.send_request(with_cost(MAX_LOG_COST + 1)).await;
        let spent = match algorithm {
            Algorithm::SlidingLog => {
                assert_eq!(beyond.status, StatusCode::TOO_MANY_REQUESTS);
                assert_eq!(beyond.header("retry-after"), None);
                MAX_LOG_COST
            }
            _ => {
                assert_eq!(beyond.status, StatusCode::OK, "{algorithm:?}");
                2 * MAX_LOG_COST + 1
            }
        };
        let next = app.send_request(with_cost(1)).await;
        assert_eq!(next.status, StatusCode::OK, "{algorithm:?}");
        assert_eq!(
            next.number("x-ratelimit-remaining"),
            u64::from(1_000_000 - spent - 1),
            "{algorithm:?}"
        );
    }
}

/// An app whose layer adjusts each response's budget by what the test put
/// in the returned cell before the request (taken by that response).
fn adjusting_app<St: Store>(
    rules: Rules,
    store: St,
) -> (App, std::sync::Arc<std::sync::Mutex<Option<Adjustment>>>) {
    let next = std::sync::Arc::new(std::sync::Mutex::new(None));
    let cell = next.clone();
    let app = App::with(rules, store, move |l| {
        l.adjust_on_response(move |status, _| {
            assert_eq!(status, StatusCode::OK);
            cell.lock().unwrap().take()
        })
    });
    (app, next)
}

/// Every algorithm: a penalty spends more than the request, a refund gives
/// units back, and a penalty far above the limit holds the user back for a
/// bounded time (no overflow).
pub async fn adjustments_penalize_and_refund<St: Store>(
    store: impl std::future::Future<Output = St>,
) {
    let store = std::sync::Arc::new(store.await);
    for algorithm in ALGORITHMS {
        let rules = one_route("^/a", [Rule::new().minute(5).algorithm(algorithm)]);
        let (app, next) = adjusting_app(rules, store.clone());
        let set = |a: Adjustment| *next.lock().unwrap() = Some(a);
        let user = format!("adj-{}", algorithm.as_str());
        // A penalty: the response tells the state before it.
        set(Adjustment::Penalty(2));
        let first = app.get("/a", &user).await;
        assert_eq!(first.status, StatusCode::OK, "{algorithm:?}");
        assert_eq!(first.number("x-ratelimit-remaining"), 4, "{algorithm:?}");
        assert!(
            next.lock().unwrap().is_none(),
            "{algorithm:?}: the hook ran"
        );
        let second = app.get("/a", &user).await;
        assert_eq!(second.number("x-ratelimit-remaining"), 1, "{algorithm:?}");
        // A refund of 1 on the last allowed request: one more fits.
        set(Adjustment::Refund(1));
        let third = app.get("/a", &user).await;
        assert_eq!(third.number("x-ratelimit-remaining"), 0, "{algorithm:?}");
        let fourth = app.get("/a", &user).await;
        assert_eq!(fourth.status, StatusCode::OK, "{algorithm:?}");
        assert_eq!(fourth.number("x-ratelimit-remaining"), 0, "{algorithm:?}");
        // A denied request is not adjusted: the refund stays unused.
        set(Adjustment::Refund(5));
        let denied = app.get("/a", &user).await;
        assert_eq!(
            denied.status,
            StatusCode::TOO_MANY_REQUESTS,
            "{algorithm:?}"
        );
        assert!(next.lock().unwrap().take().is_some(), "{algorithm:?}");
        assert_eq!(
            app.get("/a", &user).await.status,
            StatusCode::TOO_MANY_REQUESTS,
            "{algorithm:?}"
        );
        assert_eq!(app.inner_calls(), 4, "{algorithm:?}");

        // A refund larger than what was spent leaves an empty budget (no
        // more than the limit); a penalty beyond the limit is capped.
        let other = format!("adj2-{}", algorithm.as_str());
        set(Adjustment::Refund(100));
        assert_eq!(
            app.get("/a", &other).await.number("x-ratelimit-remaining"),
            4
        );
        let fresh = app.get("/a", &other).await;
        assert_eq!(fresh.number("x-ratelimit-remaining"), 4, "{algorithm:?}");
        set(Adjustment::Penalty(u32::MAX));
        assert_eq!(app.get("/a", &other).await.status, StatusCode::OK);
        let held = app.get("/a", &other).await;
        assert_eq!(held.status, StatusCode::TOO_MANY_REQUESTS, "{algorithm:?}");
        let wait = held.number("retry-after");
        assert!((1..=120).contains(&wait), "{algorithm:?}: {wait}");
        app.advance(Duration::from_secs(wait));
        assert_eq!(
            app.get("/a", &other).await.status,
            StatusCode::OK,
            "{algorithm:?} after {wait} s"
        );
    }
}

/// A budget checked under several algorithms at once (two tables in use
/// during a reload, replicas on either side of one) keeps a state per
/// algorithm: each allows its own limit, and none resets another's.
/// (Before, the memory store kept one state per budget: a change between
/// the sliding log and a counter algorithm started it afresh, and the
/// counter algorithms read each other's state.)
pub async fn two_algorithms_on_one_budget_keep_their_own_state<St: Store>(
    store: impl std::future::Future<Output = St>,
) {
    use tower_ratelimit::clock::Timestamp;
    use tower_ratelimit::{Check, Window};
    let store = store.await;
    let window = Window::new(Duration::from_secs(60), 5).unwrap();
    // (One instant, a second into a minute: no window turns meanwhile.)
    let at = Timestamp::from_micros(1_767_225_601_000_000);
    let mut allowed = [0u32; ALGORITHMS.len()];
    for i in 0..10 * ALGORITHMS.len() {
        let k = i % ALGORITHMS.len();
        let check = Check::new("r1:two-algorithms", [window])
            .with_algorithm(ALGORITHMS[k])
            .at(at);
        if store.check(check).await.unwrap().allowed() {
            allowed[k] += 1;
        }
    }
    assert_eq!(allowed, [5; ALGORITHMS.len()], "{ALGORITHMS:?}");
}

/// A check whose windows were set by hand longest first is refused as a
/// setup error (every store reads the last window as the longest), not
/// decided against the wrong window.
pub async fn windows_set_by_hand_out_of_order_are_refused<St: Store>(
    store: impl std::future::Future<Output = St>,
) {
    use tower_ratelimit::store::{GlobalCheck, StoreErrorKind};
    use tower_ratelimit::{Check, Window};
    let store = store.await;
    let second = Window::new(Duration::from_secs(1), 5).unwrap();
    let minute = Window::new(Duration::from_secs(60), 100).unwrap();
    for algorithm in ALGORITHMS {
        let mut check = Check::new("r1:by-hand", [second]).with_algorithm(algorithm);
        check.windows = [minute, second].into();
        let error = store.check(check.clone()).await.unwrap_err();
        assert_eq!(error.kind(), StoreErrorKind::Config, "{algorithm:?}");
        let mut route = GlobalCheck::new("r2:*", [second]);
        route.windows = [minute, second].into();
        let check = Check::new("r2:by-hand", [second])
            .with_algorithm(algorithm)
            .with_global(route);
        let error = store.check(check).await.unwrap_err();
        assert_eq!(error.kind(), StoreErrorKind::Config, "{algorithm:?}");
    }
}

/// A block is the user's, not an algorithm's: a reload that changes the
/// rule's algorithm while a user is blocked leaves the user blocked, and
/// the user passes when the block ends.
pub async fn a_block_holds_across_a_change_of_algorithm<St: Store>(
    store: impl std::future::Future<Output = St>,
) {
    use tower_ratelimit::clock::Timestamp;
    use tower_ratelimit::{Check, Window};
    let store = store.await;
    let minute = Window::new(Duration::from_secs(60), 1).unwrap();
    let start = 1_767_225_601_000_000;
    for first in ALGORITHMS {
        for then in ALGORITHMS.into_iter().filter(|a| *a != first) {
            let budget = format!("r1:block-{}-{}", first.as_str(), then.as_str());
            let check = |algorithm, micros| {
                Check::new(budget.as_str(), [minute])
                    .with_algorithm(algorithm)
                    .with_block(Duration::from_secs(300))
                    .at(Timestamp::from_micros(micros))
            };
            assert!(store.check(check(first, start)).await.unwrap().allowed());
            let denied = store.check(check(first, start + 1)).await.unwrap();
            assert!(denied.is_blocked(), "{first:?}");
            // Ten seconds later, under the other algorithm: still blocked.
            let later = store.check(check(then, start + 10_000_001)).await.unwrap();
            assert!(later.is_blocked(), "{first:?} then {then:?}");
            assert_eq!(
                later.retry_after(),
                Some(Duration::from_secs(290)),
                "{first:?} then {then:?}"
            );
            // And free once the block has run its 300 s.
            let after = store.check(check(then, start + 300_000_001)).await.unwrap();
            assert!(after.allowed(), "{first:?} then {then:?}");
        }
    }
}

/// A route-wide budget is its own even when a caller of the `Store` trait
/// spells it as the user's budget: each keeps its own count.
pub async fn a_route_budget_spelled_as_a_user_budget_is_its_own<St: Store>(
    store: impl std::future::Future<Output = St>,
) {
    use tower_ratelimit::clock::Timestamp;
    use tower_ratelimit::store::GlobalCheck;
    use tower_ratelimit::{Check, Window};
    let store = store.await;
    let minute = |limit| Window::new(Duration::from_secs(60), limit).unwrap();
    let at = Timestamp::from_micros(1_767_225_601_000_000);
    for algorithm in ALGORITHMS {
        let budget = format!("r-same-{}:*", algorithm.as_str());
        let check = Check::new(budget.as_str(), [minute(3)])
            .with_global(GlobalCheck::new(budget.as_str(), [minute(10)]))
            .with_algorithm(algorithm)
            .at(at);
        let mut seen = Vec::new();
        for _ in 0..5 {
            let decision = store.check(check.clone()).await.unwrap();
            seen.push((decision.allowed(), decision.windows()[0].remaining));
        }
        assert_eq!(
            seen,
            [(true, 2), (true, 1), (true, 0), (false, 0), (false, 0)],
            "{algorithm:?}"
        );
        // The route's own budget took the three allowed requests alone.
        let route = Check::new(format!("r-other-{}:u", algorithm.as_str()), [minute(100)])
            .with_global(GlobalCheck::new(budget.as_str(), [minute(10)]))
            .with_algorithm(algorithm)
            .at(at);
        let decision = store.check(route).await.unwrap();
        let route_window = decision.windows().last().unwrap();
        assert_eq!(route_window.remaining, 10 - 3 - 1, "{algorithm:?}");
    }
}

/// An adjustment reads the check's budget, windows and algorithm, not its
/// cost: a check whose cost a sliding log would refuse (beyond
/// `MAX_LOG_COST`) is adjusted all the same.
pub async fn an_adjustment_reads_no_cost<St: Store>(store: impl std::future::Future<Output = St>) {
    use tower_ratelimit::rules::MAX_LOG_COST;
    use tower_ratelimit::{Check, Window};
    let store = store.await;
    let window = Window::new(Duration::from_secs(60), 5_000).unwrap();
    let check = Check::new("r1:adjcost", [window]).with_cost(MAX_LOG_COST + 1);
    store
        .adjust(check.clone(), Adjustment::Penalty(3))
        .await
        .unwrap();
    let after = store.check(check.with_cost(1)).await.unwrap();
    assert!(after.allowed());
    assert_eq!(after.windows()[0].remaining, 5_000 - 3 - 1);
}

/// A penalty spends the user's own budget, not the route's, and works on a
/// rule with several windows (every window takes it) and with route-wide
/// windows (a sliding log then keeps another layout on Redis).
pub async fn adjustments_reach_the_user_alone<St: Store>(
    store: impl std::future::Future<Output = St>,
) {
    let store = std::sync::Arc::new(store.await);
    for algorithm in ALGORITHMS {
        // (Routes of their own: the memory store keys a route's budget by
        // the route alone, whatever its algorithm.)
        let (r, m) = (
            format!("/r-{}", algorithm.as_str()),
            format!("/m-{}", algorithm.as_str()),
        );
        let rules = Rules::builder()
            .add_route(
                Route::new(format!("^{r}"))
                    .rules([Rule::new().second(3).minute(4).algorithm(algorithm)])
                    .global(Rule::new().minute(10)),
            )
            .route(
                format!("^{m}"),
                [Rule::new().second(3).hour(4).algorithm(algorithm)],
            )
            .build()
            .unwrap();
        let (app, next) = adjusting_app(rules, store.clone());
        let set = |a: Adjustment| *next.lock().unwrap() = Some(a);
        for path in [r.as_str(), m.as_str()] {
            let user = format!("alone-{}", algorithm.as_str());
            set(Adjustment::Penalty(1));
            let first = app.get(path, &user).await;
            assert_eq!(first.status, StatusCode::OK, "{algorithm:?} {path}");
            // Two spent of the second's 3: one more fits, then none.
            let second = app.get(path, &user).await;
            assert_eq!(second.status, StatusCode::OK, "{algorithm:?} {path}");
            assert_eq!(
                second.number("x-ratelimit-remaining"),
                0,
                "{algorithm:?} {path}"
            );
            assert_eq!(
                app.get(path, &user).await.status,
                StatusCode::TOO_MANY_REQUESTS,
                "{algorithm:?} {path}"
            );
            // Once the short window is empty again, the long one (3 of 4
            // spent) takes one more; a refund of 2 on it gives back what
            // it spent, 1 (a refund gives back at most its request's
            // cost), to every window: one more fits, then the long window
            // is full.
            app.advance_ms(2000);
            set(Adjustment::Refund(2));
            let last = app.get(path, &user).await;
            assert_eq!(last.status, StatusCode::OK, "{algorithm:?} {path}");
            assert_eq!(
                last.number("x-ratelimit-remaining"),
                0,
                "{algorithm:?} {path}"
            );
            for _ in 0..1 {
                let more = app.get(path, &user).await;
                assert_eq!(more.status, StatusCode::OK, "{algorithm:?} {path}");
            }
            assert_eq!(
                app.get(path, &user).await.status,
                StatusCode::TOO_MANY_REQUESTS,
                "{algorithm:?} {path}"
            );
        }
        // The route's budget was charged for the requests alone, 4 of its
        // 10 (penalties and refunds leave it as it was).
        for i in 0..6 {
            let user = format!("route-{}-{i}", algorithm.as_str());
            assert_eq!(
                app.get(&r, &user).await.status,
                StatusCode::OK,
                "{algorithm:?} {i}"
            );
        }
        assert_eq!(
            app.get(&r, "route-last").await.status,
            StatusCode::TOO_MANY_REQUESTS,
            "{algorithm:?}"
        );
    }
}
