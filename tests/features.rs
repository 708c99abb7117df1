//! Layer features on top of any store: shadow mode, header modes,
//! exclusions, gRPC denials, the local denial cache, the fallback store,
//! and metrics.

mod support;

use std::future::{ready, Ready};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use http::{Request, StatusCode};
use support::App;
use tower_ratelimit::{
    AdjustFuture, Adjustment, Check, Decision, FailMode, HeaderMode, MemoryStore, Route, Rule,
    Rules, Store, StoreError, StoreErrorKind,
};

/// A memory store that counts its calls and can be made to fail.
#[derive(Clone, Default)]
struct Flaky {
    inner: MemoryStore,
    calls: Arc<AtomicUsize>,
    failing: Arc<AtomicBool>,
    /// Whether its adjustments fail (its checks do not).
    adjust_fails: Arc<AtomicBool>,
}

impl Store for Flaky {
    type Future = Ready<Result<Decision, StoreError>>;

    fn check(&self, check: Check) -> Self::Future {
        self.calls.fetch_add(1, Ordering::SeqCst);
        if self.failing.load(Ordering::SeqCst) {
            // (As a store that is down fails: its calls time out.)
            return ready(Err(StoreError::new(StoreErrorKind::Timeout, "down")));
        }
        self.inner.check(check)
    }

    fn adjust(&self, check: Check, adjustment: Adjustment) -> AdjustFuture {
        if self.adjust_fails.load(Ordering::SeqCst) {
            let error = StoreError::new(StoreErrorKind::Timeout, "slow");
            return Box::pin(ready(Err(error)));
        }
        self.inner.adjust(check, adjustment)
    }
}

impl Flaky {
    fn calls(&self) -> usize {
        self.calls.load(Ordering::SeqCst)
    }
}

fn one(rule: Rule) -> Rules {
    Rules::builder().route("^/a", [rule]).build().unwrap()
}

#[tokio::test]
async fn shadow_mode_never_denies_but_reports() {
    let rules = Rules::builder()
        .add_route(
            Route::new("^/new")
                .rules([Rule::new().second(1)])
                .shadow(true),
        )
        .route("^/old", [Rule::new().second(1)])
        .build()
        .unwrap();
    let app = App::new(rules, MemoryStore::new());
    for _ in 0..3 {
        let reply = app.get("/new", "u").await;
        assert_eq!(reply.status, StatusCode::OK);
        assert_eq!(reply.number("x-ratelimit-limit"), 1);
        assert_eq!(reply.number("x-ratelimit-remaining"), 0);
        assert_eq!(reply.header("retry-after"), None);
    }
    app.get("/old", "u").await;
    assert_eq!(
        app.get("/old", "u").await.status,
        StatusCode::TOO_MANY_REQUESTS
    );
    // The whole layer can be put in shadow mode too.
    let app = App::with(one(Rule::new().second(1)), MemoryStore::new(), |l| {
        l.shadow(true)
    });
    app.get("/a", "u").await;
    assert_eq!(app.get("/a", "u").await.status, StatusCode::OK);
    assert_eq!(app.inner_calls(), 2);
    // A table in shadow mode is the layer's default, which it overrides.
    let table = || {
        Rules::builder()
            .route("^/a", [Rule::new().second(1)])
            .shadow(true)
            .build()
            .unwrap()
    };
    let app = App::new(table(), MemoryStore::new());
    app.get("/a", "u").await;
    assert_eq!(app.get("/a", "u").await.status, StatusCode::OK);
    let app = App::with(table(), MemoryStore::new(), |l| l.shadow(false));
    app.get("/a", "u").await;
    assert_eq!(
        app.get("/a", "u").await.status,
        StatusCode::TOO_MANY_REQUESTS
    );
}

/// With two windows both spent, the headers describe the shorter one (a
/// tie), on a 429 too: `X-RateLimit-Reset` (and the IETF `t`) is when it
/// frees a slot, and `Retry-After` when the request may pass, once the
/// longer one has freed one too.
#[tokio::test]
async fn a_denial_s_reset_is_its_constraining_window_s() {
    let app = App::with(
        one(Rule::new().second(1).minute(1)),
        MemoryStore::new(),
        |l| l.headers(HeaderMode::Both),
    );
    let first = app.get("/a", "u").await;
    assert_eq!(first.number("x-ratelimit-reset"), 1);
    assert_eq!(
        first.header("ratelimit"),
        Some(r#""1s";r=0;t=1, "60s";r=0"#)
    );
    let denied = app.get("/a", "u").await;
    assert_eq!(denied.x_headers(), (429, 1, 0, 1));
    assert_eq!(denied.number("retry-after"), 60);
    assert_eq!(
        denied.header("ratelimit"),
        Some(r#""1s";r=0;t=1, "60s";r=0"#)
    );
    // Past the second's reset, the minute alone denies: its own reset.
    app.advance_ms(1_000);
    let denied = app.get("/a", "u").await;
    assert_eq!(denied.x_headers(), (429, 1, 0, 59));
    assert_eq!(denied.number("retry-after"), 59);
    app.advance_ms(58_999);
    assert_eq!(
        app.get("/a", "u").await.status,
        StatusCode::TOO_MANY_REQUESTS
    );
    app.advance_ms(1);
    assert_eq!(app.get("/a", "u").await.status, StatusCode::OK);
}

#[tokio::test]
async fn ietf_headers_describe_every_window() {
    let rules = Rules::builder()
        .add_route(
            Route::new("^/a")
                .rules([Rule::new().second(5).minute(3)])
                .global(Rule::new().per(Duration::from_millis(500), 100)),
        )
        .headers(HeaderMode::Ietf)
        .build()
        .unwrap();
    let app = App::new(rules, MemoryStore::new());
    let reply = app.get("/a", "u").await;
    assert_eq!(
        reply.header("ratelimit-policy"),
        // (`w` is whole seconds: a 500 ms window has none rather than a
        // wrong one, which would say 100 a second.)
        Some(r#""1s";q=5;w=1, "60s";q=3;w=60, "route-500ms";q=100"#)
    );
    assert_eq!(
        reply.header("ratelimit"),
        Some(r#""1s";r=4, "60s";r=2;t=60, "route-500ms";r=99"#)
    );
    assert!(!reply.headers.contains_key("x-ratelimit-limit"));

    let both = App::with(one(Rule::new().second(1)), MemoryStore::new(), |l| {
        l.headers(HeaderMode::Both)
    });
    let reply = both.get("/a", "u").await;
    assert!(
        reply.headers.contains_key("ratelimit") && reply.headers.contains_key("x-ratelimit-limit")
    );

    let none = App::with(one(Rule::new().second(1)), MemoryStore::new(), |l| {
        l.headers(HeaderMode::None)
    });
    let reply = none.get("/a", "u").await;
    assert!(!reply.limited() && !reply.headers.contains_key("ratelimit"));
    // A denial still says when to come back.
    let denied = none.get("/a", "u").await;
    assert_eq!(denied.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(denied.header("retry-after"), Some("1"));
}

/// A block is enforcement: a shadow rule's would-be denials set none, so
/// neither another route sharing its zone nor the rule itself once out of
/// shadow mode is ever held by one (on a store that decides at once and
/// on one the layer waits for).
#[tokio::test]
async fn shadow_mode_never_sets_a_block() {
    let table = |shadow: bool| {
        Rules::builder()
            .add_route(
                Route::new("^/za")
                    .rules([Rule::new()
                        .zone("z")
                        .second(1)
                        .block_time(Duration::from_secs(30))])
                    .shadow(shadow),
            )
            .route(
                "^/zb",
                [Rule::new()
                    .zone("z")
                    .second(100)
                    .block_time(Duration::from_secs(30))],
            )
            .build()
            .unwrap()
    };
    for waited in [false, true] {
        let store = Flaky::default();
        let shadowed = match waited {
            false => App::new(table(true), store.inner.clone()),
            true => App::new(table(true), store.clone()),
        };
        for _ in 0..3 {
            let reply = shadowed.get("/za", "u").await;
            assert_eq!(reply.status, StatusCode::OK, "waited: {waited}");
            assert_eq!(reply.header("retry-after"), None);
        }
        // The zone's other route: its own 100 a second, no block.
        let other = shadowed.get("/zb", "u").await;
        assert_eq!(other.status, StatusCode::OK, "waited: {waited}: {other:?}");
        // The same budgets, the route out of shadow mode, a second later
        // (its window empty): allowed, not held by a block.
        let enforced = App::new(table(false), store.inner.clone());
        enforced.advance(Duration::from_millis(1_100));
        let reply = enforced.get("/za", "u").await;
        assert_eq!(reply.status, StatusCode::OK, "waited: {waited}: {reply:?}");
        assert_eq!(
            enforced.get("/za", "u").await.status,
            StatusCode::TOO_MANY_REQUESTS
        );
        if waited {
            assert!(store.calls() >= 4);
        }
    }
}

/// The first matching route with a rule for the request's method and group
/// applies, whichever of its patterns match later in the path or end later
/// (a table of regexes, not only literal prefixes).
#[tokio::test]
async fn a_later_route_applies_when_an_earlier_match_has_no_rule_for_the_request() {
    let rules = Rules::from_toml(
        r#"
        [[routes]]
        path = "^/api"
        rules = [{ method = "POST", minute = 3 }, { group = "admin", minute = 9 }]

        [[routes]]
        path = "^/api/v[0-9]+/"
        rules = [{ minute = 2 }]

        [[routes]]
        path = "towns"
        rules = [{ second = 1 }]
        "#,
    )
    .unwrap();
    let app = App::new(rules, MemoryStore::new());
    // GET by the default group: the first route has no rule for it.
    for remaining in ["1", "0"] {
        let reply = app.get("/api/v1/x", "u").await;
        assert_eq!(reply.status, StatusCode::OK);
        assert_eq!(reply.header("x-ratelimit-limit"), Some("2"));
        assert_eq!(reply.header("x-ratelimit-remaining"), Some(remaining));
    }
    assert_eq!(
        app.get("/api/v1/x", "u").await.status,
        StatusCode::TOO_MANY_REQUESTS
    );
    // POST takes the first route's rule; the admin group its own.
    let post = app
        .send(http::Method::POST, "/api/v1/x", Some(b"u"), None)
        .await;
    assert_eq!(post.header("x-ratelimit-limit"), Some("3"));
    let admin = app.get_as("/api/v1/x", "u", "admin").await;
    assert_eq!(admin.header("x-ratelimit-limit"), Some("9"));
    // An unanchored pattern matching after the first route's prefix.
    let towns = app.get("/api/towns", "u").await;
    assert_eq!(towns.header("x-ratelimit-limit"), Some("1"));
    assert_eq!(
        app.get("/api/towns", "u").await.status,
        StatusCode::TOO_MANY_REQUESTS
    );
}

/// A request no rule can limit, as its method has none, is not identified:
/// a `GET` without the user a `POST`-only rule needs passes (before, the
/// identity ran first and its error answered 401), and the routes after
/// such a route still limit it.
#[tokio::test]
async fn a_method_without_a_rule_is_neither_limited_nor_identified() {
    let rules = Rules::builder()
        .route("^/upload", [Rule::new().method("POST").minute(1)])
        .route(
            "^/both",
            [
                Rule::new().method("POST").minute(1),
                Rule::group("gold").method("GET").minute(1),
            ],
        )
        .route("^/", [Rule::new().method("DELETE").minute(1)])
        .build()
        .unwrap();
    let app = App::new(rules, MemoryStore::new());
    for _ in 0..3 {
        let reply = app.send(http::Method::GET, "/upload", None, None).await;
        assert_eq!(reply.status, StatusCode::OK, "{reply:?}");
        assert!(!reply.limited());
    }
    assert_eq!(app.identity_calls(), 0);
    // A POST without a user is refused, one with a user limited.
    let reply = app.send(http::Method::POST, "/upload", None, None).await;
    assert_eq!(reply.status, StatusCode::UNAUTHORIZED);
    let reply = app
        .send(http::Method::POST, "/upload", Some(b"u"), None)
        .await;
    assert!(reply.status == StatusCode::OK && reply.limited());
    // A GET on a route with a GET rule for some group is identified (the
    // group decides), and limited in that group alone.
    let reply = app.send(http::Method::GET, "/both", None, None).await;
    assert_eq!(reply.status, StatusCode::UNAUTHORIZED);
    let gold = app
        .send(http::Method::GET, "/both", Some(b"g"), Some("gold"))
        .await;
    assert!(gold.limited());
    assert!(!app.get("/both", "u").await.limited());
    // A later route's rule for the method still applies.
    app.send(http::Method::DELETE, "/upload", Some(b"u"), None)
        .await;
    let reply = app
        .send(http::Method::DELETE, "/upload", Some(b"u"), None)
        .await;
    assert_eq!(reply.status, StatusCode::TOO_MANY_REQUESTS);
}

#[tokio::test]
async fn excluded_paths_and_methods_are_never_limited() {
    let rules = Rules::builder()
        .route("^/", [Rule::new().second(1)])
        .exclude_path("^/health")
        .exclude_method("options")
        .build()
        .unwrap();
    let app = App::new(rules, MemoryStore::new());
    for _ in 0..5 {
        let health = app.get("/health", "u").await;
        assert_eq!(health.status, StatusCode::OK);
        assert!(!health.limited());
        let options = app
            .send(http::Method::OPTIONS, "/x", Some(b"u"), None)
            .await;
        assert_eq!(options.status, StatusCode::OK);
    }
    assert_eq!(app.identity_calls(), 0);
    // Excluding GET excludes HEAD, which GET rules limit.
    let rules = Rules::builder()
        .route("^/", [Rule::new().method("GET").second(1)])
        .exclude_method("GET")
        .build()
        .unwrap();
    let get_excluded = App::new(rules, MemoryStore::new());
    for _ in 0..3 {
        let head = get_excluded
            .send(http::Method::HEAD, "/x", Some(b"u"), None)
            .await;
        assert_eq!(head.status, StatusCode::OK);
        assert!(!head.limited());
    }
    assert_eq!(get_excluded.identity_calls(), 0);
    app.get("/x", "u").await;
    assert_eq!(
        app.get("/x", "u").await.status,
        StatusCode::TOO_MANY_REQUESTS
    );
}

#[tokio::test]
async fn grpc_requests_are_denied_the_grpc_way() {
    let app = App::new(one(Rule::new().second(1)), MemoryStore::new());
    let grpc = || {
        Request::builder()
            .method("POST")
            .uri("/a")
            .header("content-type", "application/grpc+proto")
            .header("x-user", "u")
            .body(Body::empty())
            .unwrap()
    };
    assert_eq!(app.send_request(grpc()).await.status, StatusCode::OK);
    app.advance_ms(200);
    let denied = app.send_request(grpc()).await;
    assert_eq!(denied.status, StatusCode::OK);
    assert_eq!(denied.header("grpc-status"), Some("8"));
    assert_eq!(denied.header("grpc-message"), Some("rate limit exceeded"));
    assert_eq!(denied.header("content-type"), Some("application/grpc"));
    assert_eq!(denied.header("retry-after"), Some("1"));
    assert_eq!(denied.header("grpc-retry-pushback-ms"), Some("800"));
    assert!(denied.body.is_empty());
    assert_eq!(app.inner_calls(), 1);
    // An identity failure is UNAUTHENTICATED (401, the default), or what
    // the identity's status says, as gRPC maps HTTP statuses: 403
    // PERMISSION_DENIED, 429 and 502 to 504 UNAVAILABLE; another server
    // error INTERNAL, another client error INVALID_ARGUMENT.
    for (status, grpc) in [
        (None, "16"),
        (Some("403"), "7"),
        (Some("429"), "14"),
        (Some("502"), "14"),
        (Some("503"), "14"),
        (Some("504"), "14"),
        (Some("500"), "13"),
        (Some("400"), "3"),
    ] {
        let mut anonymous = Request::builder()
            .uri("/a")
            .header("content-type", "application/grpc");
        if let Some(status) = status {
            anonymous = anonymous.header("x-fail-status", status);
        }
        let reply = app
            .send_request(anonymous.body(Body::empty()).unwrap())
            .await;
        assert_eq!(reply.header("grpc-status"), Some(grpc), "{status:?}");
    }
}

/// `grpc-message` is percent-encoded (gRPC's rule: bytes outside printable
/// ASCII, and `%`), so a client decodes the message exactly; a gRPC-Web
/// request's denial keeps its content type; a look-alike content type is
/// not gRPC; the content type's case does not matter.
#[tokio::test]
async fn grpc_answers_encode_their_message_and_keep_grpc_web() {
    let app = App::new(one(Rule::new().second(1)), MemoryStore::new());
    let message = "key 100%41\nrejected: é";
    let hex: String = message.bytes().map(|b| format!("{b:02x}")).collect();
    let failed = app
        .send_request(
            Request::builder()
                .uri("/a")
                .header("content-type", "application/grpc")
                .header("x-fail-message-hex", hex)
                .body(Body::empty())
                .unwrap(),
        )
        .await;
    assert_eq!(failed.header("grpc-status"), Some("16"));
    assert_eq!(
        failed.header("grpc-message"),
        Some("key 100%2541%0Arejected: %C3%A9")
    );
    let web = |content_type: &'static str| {
        Request::builder()
            .method("POST")
            .uri("/a")
            .header("content-type", content_type)
            .header("x-user", "web")
            .body(Body::empty())
            .unwrap()
    };
    assert_eq!(
        app.send_request(web("application/grpc-web+proto"))
            .await
            .status,
        StatusCode::OK
    );
    let denied = app.send_request(web("application/grpc-web-text")).await;
    assert_eq!(denied.status, StatusCode::OK);
    assert_eq!(denied.header("grpc-status"), Some("8"));
    assert_eq!(
        denied.header("content-type"),
        Some("application/grpc-web-text")
    );
    let other = app.send_request(web("application/grpcx")).await;
    assert_eq!(other.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(other.header("grpc-status"), None);
    // A media type's case does not matter (Tonic serves these).
    for content_type in ["Application/GRPC", "APPLICATION/GRPC-WEB-TEXT"] {
        let denied = app.send_request(web(content_type)).await;
        assert_eq!(denied.status, StatusCode::OK, "{content_type}");
        assert_eq!(denied.header("grpc-status"), Some("8"), "{content_type}");
    }
    assert_eq!(
        app.send_request(web("APPLICATION/GRPC-WEB-TEXT"))
            .await
            .header("content-type"),
        Some("APPLICATION/GRPC-WEB-TEXT")
    );
}

/// A request that costs more than a window's limit can never pass: it is
/// denied without a `Retry-After` (no wait would let it through), and a
/// gRPC client is told not to retry (a pushback of -1); one that costs the
/// whole limit passes.
#[tokio::test]
async fn a_request_costlier_than_the_limit_is_told_no_wait() {
    let app = App::with(
        one(Rule::new().second(10).minute(5)),
        MemoryStore::new(),
        |l| l.cost(support::cost_header),
    );
    let request = |cost: &'static str, grpc: bool| {
        let mut request = Request::builder()
            .method("POST")
            .uri("/a")
            .header("x-user", "u")
            .header("x-cost", cost);
        if grpc {
            request = request.header("content-type", "application/grpc");
        }
        request.body(Body::empty()).unwrap()
    };
    let denied = app.send_request(request("6", false)).await;
    assert_eq!(denied.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(denied.header("retry-after"), None);
    assert_eq!(denied.number("x-ratelimit-remaining"), 5);
    // (The reset is the described window's own, the minute's, empty: not
    // the whole window a wait would have pushed it to.)
    assert_eq!(denied.number("x-ratelimit-limit"), 5);
    assert_eq!(denied.number("x-ratelimit-reset"), 0);
    assert!(
        denied.body.contains("can never be allowed"),
        "{:?}",
        denied.body
    );
    let grpc = app.send_request(request("6", true)).await;
    assert_eq!(grpc.header("grpc-status"), Some("8"));
    assert_eq!(grpc.header("grpc-retry-pushback-ms"), Some("-1"));
    assert_eq!(grpc.header("retry-after"), None);
    // The whole limit is a cost that can pass; once it is spent, the next
    // request waits, and is told how long.
    assert_eq!(
        app.send_request(request("5", false)).await.status,
        StatusCode::OK
    );
    let waits = app.send_request(request("1", true)).await;
    assert_eq!(waits.header("grpc-status"), Some("8"));
    assert_eq!(waits.header("retry-after"), Some("60"));
    assert_eq!(waits.header("grpc-retry-pushback-ms"), Some("60000"));
    assert_eq!(app.inner_calls(), 1);
}

/// Failing closed, a gRPC client is told to come back in a second, as an
/// HTTP client is by `Retry-After`.
#[tokio::test]
async fn failing_closed_tells_a_grpc_client_when_to_retry() {
    let store = Flaky::default();
    store.failing.store(true, Ordering::SeqCst);
    let app = App::with(one(Rule::new().second(1)), store, |l| {
        l.fail_mode(FailMode::Closed)
    });
    let reply = app
        .send_request(
            Request::builder()
                .method("POST")
                .uri("/a")
                .header("x-user", "u")
                .header("content-type", "application/grpc")
                .body(Body::empty())
                .unwrap(),
        )
        .await;
    assert_eq!(reply.header("grpc-status"), Some("14"));
    assert_eq!(reply.header("retry-after"), Some("1"));
    assert_eq!(reply.header("grpc-retry-pushback-ms"), Some("1000"));
    assert_eq!(app.get("/a", "u").await.header("retry-after"), Some("1"));
    assert_eq!(app.inner_calls(), 0);
}

#[tokio::test]
async fn denials_are_served_from_the_local_cache_until_their_wait_ends() {
    let store = Flaky::default();
    let app = App::new(one(Rule::new().second(2)), store.clone());
    app.get("/a", "u").await;
    app.get("/a", "u").await;
    assert_eq!(
        app.get("/a", "u").await.status,
        StatusCode::TOO_MANY_REQUESTS
    );
    assert_eq!(store.calls(), 3);
    app.advance_ms(400);
    for _ in 0..100 {
        let denied = app.get("/a", "u").await;
        assert_eq!(denied.status, StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(denied.number("retry-after"), 1);
        assert_eq!(denied.number("x-ratelimit-remaining"), 0);
    }
    // No store call for any of them; other users still go to the store.
    assert_eq!(store.calls(), 3);
    assert_eq!(app.get("/a", "v").await.status, StatusCode::OK);
    assert_eq!(store.calls(), 4);
    // Exactly when the wait ends, the store is asked again, and allows.
    app.advance_ms(599);
    assert_eq!(
        app.get("/a", "u").await.status,
        StatusCode::TOO_MANY_REQUESTS
    );
    assert_eq!(store.calls(), 4);
    app.advance_ms(1);
    assert_eq!(app.get("/a", "u").await.status, StatusCode::OK);
    assert_eq!(store.calls(), 5);

    // Switched off, every request asks the store.
    let store = Flaky::default();
    let app = App::with(one(Rule::new().second(1)), store.clone(), |l| {
        l.denial_cache(0)
    });
    for _ in 0..10 {
        app.get("/a", "u").await;
    }
    assert_eq!(store.calls(), 10);
}

/// A zone's other route with a higher limit spends the shared budget while
/// this route's requests are denied, on this replica or another, and
/// lengthens their wait: their denials are not cached, and each tells the
/// wait the store would. (The higher-limited route's own denials are: no
/// request of the zone passes while they hold.)
#[tokio::test]
async fn a_zone_spent_by_another_route_is_not_answered_from_the_cache() {
    let rules = || {
        Rules::builder()
            .route("^/a", [Rule::new().zone("z").minute(5)])
            .route("^/b", [Rule::new().zone("z").minute(3)])
            .build()
            .unwrap()
    };
    let store = Flaky::default();
    let cached = App::new(rules(), store.clone());
    let direct = App::new(rules(), MemoryStore::new());
    for (step_ms, path) in [
        (0, "/b"),
        (10_000, "/b"),
        (0, "/b"),
        (0, "/b"),
        (10_000, "/a"),
        (0, "/a"),
        (10_000, "/b"),
    ] {
        cached.advance_ms(step_ms);
        direct.advance_ms(step_ms);
        let (a, b) = (cached.get(path, "u").await, direct.get(path, "u").await);
        assert_eq!(a.status, b.status, "{path}");
        assert_eq!(a.header("retry-after"), b.header("retry-after"), "{path}");
        assert_eq!(
            a.header("x-ratelimit-reset"),
            b.header("x-ratelimit-reset"),
            "{path}"
        );
    }
    // (Every request asked the store.)
    assert_eq!(store.calls(), 7);
    // /a, the higher limit: its denial is kept.
    for _ in 0..3 {
        assert_eq!(
            cached.get("/a", "u").await.status,
            StatusCode::TOO_MANY_REQUESTS
        );
    }
    assert_eq!(store.calls(), 8);
}

/// A costly request's wait grows when a cheaper one passes meanwhile: its
/// denial is not cached, and the next one tells the wait the store would.
#[tokio::test]
async fn a_costly_denial_is_not_answered_from_the_cache() {
    use support::{cost_header, costing};
    let store = Flaky::default();
    let cached = App::with(one(Rule::new().minute(5)), store.clone(), |l| {
        l.cost(cost_header)
    });
    let direct = App::with(one(Rule::new().minute(5)), MemoryStore::new(), |l| {
        l.cost(cost_header)
    });
    let request = |cost: u32| costing("/a", "u", cost);
    for (step_ms, cost) in [
        (0, 1),
        (20_000, 1),
        (10_000, 2),
        (10_000, 3),
        (5_000, 1),
        (0, 3),
    ] {
        cached.advance_ms(step_ms);
        direct.advance_ms(step_ms);
        let a = cached.send_request(request(cost)).await;
        let b = direct.send_request(request(cost)).await;
        assert_eq!(a.status, b.status, "cost {cost}");
        assert_eq!(
            a.header("retry-after"),
            b.header("retry-after"),
            "cost {cost}"
        );
    }
}

/// Other users spend a route-wide window while one user's denial would be
/// cached, which may lengthen its wait or make the route's window the one
/// its headers describe: a denial on a route with a route-wide limit asks
/// the store each time (a block still does not).
#[tokio::test]
async fn a_denial_on_a_route_with_a_route_wide_limit_is_not_cached() {
    let rules = support::route_with_global("^/a", [Rule::new().minute(1)], Rule::new().minute(100));
    let store = Flaky::default();
    let app = App::new(rules, store.clone());
    assert_eq!(app.get("/a", "u").await.status, StatusCode::OK);
    for _ in 0..3 {
        assert_eq!(
            app.get("/a", "u").await.status,
            StatusCode::TOO_MANY_REQUESTS
        );
    }
    assert_eq!(store.calls(), 4);
}

/// A configuration file's `block_time` is seconds or a duration with its
/// unit: each form blocks for what it says (`Retry-After` rounds up).
#[tokio::test]
async fn a_block_time_is_read_in_seconds_or_with_a_unit() {
    let forms = [
        ("300", 300),
        ("0.5", 1),
        ("\"2.5\"", 3),
        ("\"1.000000000000000000000h\"", 3_600),
        ("\"300\"", 300),
        ("\"5m\"", 300),
        ("\"90s\"", 90),
        ("\"1h 30m\"", 5_400),
        ("\"1h30m\"", 5_400),
        ("\"2.5s\"", 3),
        ("\"1500ms\"", 2),
        ("\"2 minutes\"", 120),
        ("\"1D\"", 86_400),
        ("\"1H 30Min\"", 5_400),
        ("\"5MS\"", 1),
    ];
    for (form, seconds) in forms {
        let rules = tower_ratelimit::Rules::from_toml(&format!(
            "[[routes]]\npath = \"^/a\"\nrules = [{{ second = 1, block_time = {form} }}]\n"
        ))
        .unwrap_or_else(|e| panic!("{form}: {e}"));
        let app = App::new(rules, MemoryStore::new());
        assert_eq!(app.get("/a", "u").await.status, StatusCode::OK);
        let blocked = app.get("/a", "u").await;
        assert_eq!(blocked.status, StatusCode::TOO_MANY_REQUESTS, "{form}");
        assert_eq!(blocked.number("retry-after"), seconds, "{form}");
    }
}

/// A block is cached whatever the windows and the header mode: it holds
/// the user's windows at nothing left until it ends (and its headers leave
/// the route-wide budget out), so its replay is exact and the store is not
/// asked again.
#[tokio::test]
async fn a_block_is_cached_with_every_window_shown() {
    let rules = support::route_with_global(
        "^/a",
        [Rule::new()
            .second(1)
            .minute(5)
            .block_time(Duration::from_secs(60))],
        Rule::new().hour(1_000),
    );
    let store = Flaky::default();
    let app = App::with(rules, store.clone(), |l| l.headers(HeaderMode::Both));
    assert_eq!(app.get("/a", "u").await.status, StatusCode::OK);
    let blocked = app.get("/a", "u").await;
    assert_eq!(blocked.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(blocked.number("retry-after"), 60);
    let asked = store.calls();
    for _ in 0..5 {
        app.advance_ms(1_000);
        let again = app.get("/a", "u").await;
        assert_eq!(again.status, StatusCode::TOO_MANY_REQUESTS);
    }
    assert_eq!(store.calls(), asked, "the store was asked during the block");
}

/// A cached denial's headers are the store's own: replayed only while the
/// windows they report still hold (here, two spent windows, the shorter
/// one reported, which frees a slot long before the request may pass:
/// cached only until it does).
#[tokio::test]
async fn a_cached_denial_reports_what_the_store_would() {
    let rules = || {
        Rules::builder()
            .route(
                "^/a",
                [Rule::new()
                    .per(Duration::from_millis(500), 1)
                    .per(Duration::from_secs(2), 2)],
            )
            .build()
            .unwrap()
    };
    let store = Flaky::default();
    let cached = App::with(rules(), store.clone(), |l| l.headers(HeaderMode::Both));
    let direct = App::with(rules(), MemoryStore::new(), |l| l.headers(HeaderMode::Both));
    let headers = [
        "x-ratelimit-limit",
        "x-ratelimit-remaining",
        "x-ratelimit-reset",
        "retry-after",
        "ratelimit",
    ];
    for step_ms in [0, 600, 0, 300, 300, 200, 600] {
        cached.advance_ms(step_ms);
        direct.advance_ms(step_ms);
        let (a, b) = (cached.get("/a", "u").await, direct.get("/a", "u").await);
        assert_eq!(a.status, b.status);
        for name in headers {
            assert_eq!(a.header(name), b.header(name), "{name} at +{step_ms} ms");
        }
    }
    // (Denials at 0.6, 0.9, 1.2 and 1.4 s: those at 0.6 and 0.9 s, both
    // windows spent, by the store; the one at 1.2 s, the shorter window
    // having freed a slot at 1.1 s, by the store, and the one at 1.4 s
    // from the cache.)
    assert_eq!(store.calls(), 6);
}

#[tokio::test]
async fn a_cached_denial_serves_only_the_rule_that_was_denied() {
    // Two routes share a zone's budget with other limits: a denial on the
    // stricter one says nothing of the other, whose requests may pass and
    // lengthen the stricter one's wait (so its denials are not kept); the
    // laxer one's denial holds for both.
    let store = Flaky::default();
    let rules = Rules::builder()
        .route("^/a", [Rule::new().zone("z").second(1)])
        .route("^/b", [Rule::new().zone("z").second(3)])
        .build()
        .unwrap();
    let app = App::new(rules, store.clone());
    assert_eq!(app.get("/a", "u").await.status, StatusCode::OK);
    for _ in 0..3 {
        assert_eq!(
            app.get("/a", "u").await.status,
            StatusCode::TOO_MANY_REQUESTS
        );
    }
    assert_eq!(
        store.calls(),
        4,
        "the stricter route's denials asked the store"
    );
    assert_eq!(app.get("/b", "u").await.status, StatusCode::OK);
    assert_eq!(app.get("/b", "u").await.status, StatusCode::OK);
    for _ in 0..3 {
        assert_eq!(
            app.get("/b", "u").await.status,
            StatusCode::TOO_MANY_REQUESTS
        );
    }
    assert_eq!(store.calls(), 7, "the repeats came from the cache");
}

/// A store that says no and gives no wait.
#[derive(Clone, Default)]
struct NoWait;

impl Store for NoWait {
    type Future = Ready<Result<Decision, StoreError>>;

    fn check(&self, _: Check) -> Self::Future {
        ready(Ok(Decision::new(false, None, Duration::ZERO, [])))
    }
}

#[tokio::test]
async fn a_denial_without_a_wait_still_gets_retry_after() {
    let app = App::new(one(Rule::new().second(1)), NoWait);
    let denied = app.get("/a", "u").await;
    assert_eq!(denied.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(denied.number("retry-after"), 1);
}

/// Each of `windows` with one request of its limit spent.
fn one_spent(
    windows: &[tower_ratelimit::Window],
) -> impl Iterator<Item = tower_ratelimit::store::WindowState> + '_ {
    windows
        .iter()
        .map(|w| tower_ratelimit::store::WindowState::new(*w, w.limit().saturating_sub(1)))
}

/// An allowed decision over `windows`, resetting in a second.
fn allowed(windows: impl IntoIterator<Item = tower_ratelimit::store::WindowState>) -> Decision {
    Decision::new(true, None, Duration::from_secs(1), windows)
}

/// A store whose decisions report one window more than the check had, the
/// constraining one, with `limit`.
#[derive(Clone)]
struct ExtraWindow {
    limit: u32,
}

impl Store for ExtraWindow {
    type Future = Ready<Result<Decision, StoreError>>;

    fn check(&self, check: Check) -> Self::Future {
        let extra = tower_ratelimit::Window::new(Duration::from_secs(1), self.limit).unwrap();
        let windows =
            one_spent(&check.windows).chain([tower_ratelimit::store::WindowState::new(extra, 3)]);
        ready(Ok(allowed(windows)))
    }
}

#[tokio::test]
async fn a_stores_window_the_rule_does_not_have_still_gets_its_limit_header() {
    for limit in [7, 12_345, 4_000_000_000] {
        let app = App::new(one(Rule::new().second(100)), ExtraWindow { limit });
        let reply = app.get("/a", "u").await;
        assert_eq!(reply.status, StatusCode::OK);
        assert_eq!(reply.number("x-ratelimit-limit"), u64::from(limit));
        assert_eq!(reply.number("x-ratelimit-remaining"), 3);
    }
}

/// A memory store whose answers take 40 ms on the layer's clock to arrive.
#[derive(Clone, Default)]
struct Slow {
    inner: MemoryStore,
    clock: Arc<std::sync::Mutex<Option<tower_ratelimit::clock::ManualClock>>>,
}

impl Store for Slow {
    type Future = Ready<Result<Decision, StoreError>>;

    fn check(&self, check: Check) -> Self::Future {
        let answer = self.inner.check(check);
        if let Some(clock) = self.clock.lock().unwrap().as_ref() {
            clock.advance(Duration::from_millis(40));
        }
        answer
    }
}

#[tokio::test]
async fn a_cached_denial_ends_when_the_store_said_not_when_its_answer_came() {
    let store = Slow::default();
    let app = App::new(one(Rule::new().second(1)), store.clone());
    *store.clock.lock().unwrap() = Some(app.clock.clone());
    // Allowed at 0 (answer at 40 ms); denied at 40 ms until 1 s (answer at
    // 80 ms): the cached denial must end at 1 s, not 40 ms later.
    assert_eq!(app.get("/a", "u").await.status, StatusCode::OK);
    let denied = app.get("/a", "u").await;
    assert_eq!(denied.status, StatusCode::TOO_MANY_REQUESTS);
    app.advance_ms(919);
    assert_eq!(
        app.get("/a", "u").await.status,
        StatusCode::TOO_MANY_REQUESTS,
        "999 ms: still denied (from the cache)"
    );
    app.advance_ms(1);
    assert_eq!(app.get("/a", "u").await.status, StatusCode::OK, "at 1 s");
}

#[tokio::test]
async fn fallback_limits_in_memory_while_the_store_is_down_and_probes_it() {
    let store = Flaky::default();
    let app = App::with(one(Rule::new().second(2)), store.clone(), |l| {
        l.fail_mode(FailMode::Fallback).denial_cache(0)
    });
    assert_eq!(app.get("/a", "u").await.status, StatusCode::OK);
    store.failing.store(true, Ordering::SeqCst);
    // Still limited, now by the in-process store (a fresh budget).
    app.advance_ms(1000);
    let calls_before = store.calls();
    assert_eq!(app.get("/a", "u").await.status, StatusCode::OK);
    assert_eq!(app.get("/a", "u").await.status, StatusCode::OK);
    let denied = app.get("/a", "u").await;
    assert_eq!(denied.status, StatusCode::TOO_MANY_REQUESTS);
    assert!(denied.limited());
    // Only the first failure reached the store; the rest did not wait on it.
    assert_eq!(store.calls(), calls_before + 1);
    // One probe per 500 ms at most.
    app.advance_ms(499);
    app.get("/a", "w").await;
    assert_eq!(store.calls(), calls_before + 1);
    app.advance_ms(1);
    app.get("/a", "w").await;
    assert_eq!(store.calls(), calls_before + 2);
    // The store is back: the next probe finds it, and it decides again.
    store.failing.store(false, Ordering::SeqCst);
    app.advance_ms(500);
    assert_eq!(app.get("/a", "x").await.status, StatusCode::OK);
    let after = store.calls();
    app.get("/a", "x").await;
    app.get("/a", "x").await;
    assert_eq!(store.calls(), after + 2);
}

/// A store that fails at once for one budget (as a Redis Cluster whose
/// master of that budget's slot is held) and decides the others.
#[derive(Clone, Default)]
struct PartlyDown {
    inner: MemoryStore,
    down: Arc<std::sync::Mutex<String>>,
    calls: Arc<AtomicUsize>,
}

impl Store for PartlyDown {
    type Future = Ready<Result<Decision, StoreError>>;

    fn check(&self, check: Check) -> Self::Future {
        self.calls.fetch_add(1, Ordering::SeqCst);
        if check.budget.ends_with(self.down.lock().unwrap().as_str()) {
            let error = StoreError::new(StoreErrorKind::Unavailable, "its master is held");
            return ready(Err(error));
        }
        self.inner.check(check)
    }
}

/// With `FailMode::Fallback`, a store that fails at once for one budget
/// (a held Cluster master's) is still asked for the others: their budgets
/// stay the store's, exact across replicas, and only the failing budget's
/// checks are decided by the fallback store.
#[tokio::test]
async fn fallback_keeps_asking_a_store_that_fails_at_once_for_one_budget() {
    let store = PartlyDown::default();
    *store.down.lock().unwrap() = ":down".to_owned();
    let app = App::with(one(Rule::new().second(2)), store.clone(), |l| {
        l.fail_mode(FailMode::Fallback).denial_cache(0)
    });
    // The failing budget: limited by the fallback store.
    assert_eq!(app.get("/a", "down").await.status, StatusCode::OK);
    assert_eq!(app.get("/a", "down").await.status, StatusCode::OK);
    assert_eq!(
        app.get("/a", "down").await.status,
        StatusCode::TOO_MANY_REQUESTS
    );
    // Every other budget is still the store's: each of its checks asks it.
    let before = store.calls.load(Ordering::SeqCst);
    for _ in 0..2 {
        assert_eq!(app.get("/a", "up").await.status, StatusCode::OK);
    }
    assert_eq!(
        app.get("/a", "up").await.status,
        StatusCode::TOO_MANY_REQUESTS
    );
    assert_eq!(store.calls.load(Ordering::SeqCst), before + 3);
}

/// A store that waits (through `Flaky`) unless `at_once` is set, and then
/// answers at once with an allowance, whatever the budget: a custom store
/// that decides at once only some of the time.
#[derive(Clone, Default)]
struct Sometimes {
    waits: Flaky,
    at_once: Arc<AtomicBool>,
    asked_at_once: Arc<AtomicUsize>,
}

impl Store for Sometimes {
    type Future = Ready<Result<Decision, StoreError>>;

    fn check(&self, check: Check) -> Self::Future {
        self.waits.check(check)
    }

    fn check_now(
        &self,
        check: &tower_ratelimit::CheckRef<'_>,
    ) -> Option<Result<Decision, StoreError>> {
        if !self.at_once.load(Ordering::SeqCst) {
            return None;
        }
        self.asked_at_once.fetch_add(1, Ordering::SeqCst);
        Some(Ok(allowed(one_spent(check.windows))))
    }
}

#[tokio::test]
async fn a_store_that_decides_at_once_only_sometimes_does_not_end_the_fallback() {
    let store = Sometimes::default();
    let app = App::with(one(Rule::new().second(5)), store.clone(), |l| {
        l.fail_mode(FailMode::Fallback).denial_cache(0)
    });
    store.waits.failing.store(true, Ordering::SeqCst);
    assert_eq!(app.get("/a", "u").await.status, StatusCode::OK);
    assert_eq!(
        store.waits.calls(),
        1,
        "the failure that starts the fallback"
    );
    // While the store is down its answers at once are not asked for, and
    // cannot end the fallback: the next request that would wait does not
    // go to the store before the next probe is due.
    store.at_once.store(true, Ordering::SeqCst);
    app.get("/a", "v").await;
    assert_eq!(store.asked_at_once.load(Ordering::SeqCst), 0);
    store.at_once.store(false, Ordering::SeqCst);
    app.get("/a", "w").await;
    assert_eq!(store.waits.calls(), 1, "no wait on a store that is down");
}

#[tokio::test]
async fn a_cached_denial_is_served_before_a_store_that_decides_at_once_only_sometimes() {
    let store = Sometimes::default();
    let app = App::new(one(Rule::new().second(1)), store.clone());
    assert_eq!(app.get("/a", "u").await.status, StatusCode::OK);
    assert_eq!(
        app.get("/a", "u").await.status,
        StatusCode::TOO_MANY_REQUESTS
    );
    // The denial is cached until 1 s: the store is not asked, not even at
    // once (where this one would allow).
    store.at_once.store(true, Ordering::SeqCst);
    assert_eq!(
        app.get("/a", "u").await.status,
        StatusCode::TOO_MANY_REQUESTS
    );
    assert_eq!(store.asked_at_once.load(Ordering::SeqCst), 0);
    assert_eq!(store.waits.calls(), 2);
}

#[cfg(feature = "metrics")]
#[test]
fn metrics_count_outcomes_and_store_latency() {
    use metrics_util::debugging::{DebugValue, DebuggingRecorder};
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    metrics::with_local_recorder(&recorder, || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        runtime.block_on(async {
            let store = Flaky::default();
            let app = App::with(one(Rule::new().second(1)), store.clone(), |l| {
                l.denial_cache(0)
            });
            app.get("/a", "u").await;
            app.get("/a", "u").await;
            store.failing.store(true, Ordering::SeqCst);
            app.get("/a", "v").await;
            // Failing over to the memory store: its allowed and its denied
            // requests told apart.
            let fallback = App::with(one(Rule::new().second(1)), store.clone(), |l| {
                l.denial_cache(0).fail_mode(FailMode::Fallback)
            });
            fallback.get("/a", "f").await;
            fallback.get("/a", "f").await;
            // Near the limit: the 8th, 9th and 10th of 10 a minute (80% spent
            // and more), not the 7th; the 11th is denied.
            let near = App::new(one(Rule::new().minute(10).hour(1000)), MemoryStore::new());
            for _ in 0..11 {
                near.get("/a", "w").await;
            }
            // Any window counts, not only the constraining one: the 8th
            // request a second apart spends 80% of the minute, while the
            // second (as many left, and shorter) constrains.
            let any = App::new(one(Rule::new().second(3).minute(10)), MemoryStore::new());
            for _ in 0..8 {
                any.get("/a", "x").await;
                any.advance(Duration::from_millis(1001));
            }
            // An identity that fails: no decision, but counted.
            let anonymous = near.send(http::Method::GET, "/a", None, None).await;
            assert_eq!(anonymous.status, http::StatusCode::UNAUTHORIZED);
        });
    });
    let snapshot = snapshotter.snapshot().into_vec();
    let counter = |name: &str, outcome: Option<&str>| -> u64 {
        snapshot
            .iter()
            .filter(|(key, ..)| {
                key.key().name() == name
                    && outcome.is_none_or(|o| key.key().labels().any(|l| l.value() == o))
            })
            .map(|(.., value)| match value {
                DebugValue::Counter(n) => *n,
                _ => 0,
            })
            .sum()
    };
    assert_eq!(
        counter("tower_ratelimit_requests_total", Some("allowed")),
        19
    );
    assert_eq!(counter("tower_ratelimit_requests_total", Some("denied")), 2);
    // (And the first app's request, which spent its whole limit of 1, and
    // the fallback's allowed one, which did too.)
    assert_eq!(counter("tower_ratelimit_near_limit_total", None), 6);
    assert_eq!(
        counter("tower_ratelimit_requests_total", Some("fail_open")),
        1
    );
    assert_eq!(
        counter("tower_ratelimit_requests_total", Some("fallback")),
        1
    );
    assert_eq!(
        counter("tower_ratelimit_requests_total", Some("fallback_denied")),
        1
    );
    assert_eq!(
        counter("tower_ratelimit_requests_total", Some("identity_error")),
        1
    );
    // (The fallback's second request did not ask the store: it probes it
    // once per 500 ms.)
    assert_eq!(counter("tower_ratelimit_store_errors_total", None), 2);
    let latencies = snapshot
        .iter()
        .find(|(key, ..)| key.key().name() == "tower_ratelimit_store_latency_seconds")
        .map(|(.., value)| match value {
            DebugValue::Histogram(v) => v.len(),
            _ => 0,
        });
    // (The two answered calls and the two failed ones.)
    assert_eq!(latencies, Some(4));
}

#[tokio::test]
async fn a_limit_text_makes_the_windows_its_builders_make() {
    let policy = |rule: Rule| async move {
        let rules = Rules::builder()
            .route("^/a", [rule])
            .headers(HeaderMode::Ietf)
            .build()
            .unwrap();
        let reply = App::new(rules, MemoryStore::new()).get("/a", "u").await;
        reply.header("ratelimit-policy").map(str::to_owned)
    };
    let written = policy(Rule::new().limits("2 per second; 5/10 seconds; 100/Minute; 7/2h")).await;
    let built = policy(
        Rule::new()
            .second(2)
            .per(Duration::from_secs(10), 5)
            .minute(100)
            .per(Duration::from_secs(7200), 7),
    )
    .await;
    assert_eq!(written, built);
    assert_eq!(
        written.as_deref(),
        Some(r#""1s";q=2;w=1, "10s";q=5;w=10, "60s";q=100;w=60, "7200s";q=7;w=7200"#)
    );

    // And it limits as it says: 2 a second, 5 in any 10 seconds.
    let rules = Rules::from_toml(
        "[[routes]]\npath = \"^/a\"\nrules = [{ limits = \"2/second; 5/10 seconds\" }]\n",
    )
    .unwrap();
    let app = App::new(rules, MemoryStore::new());
    let mut allowed = Vec::new();
    for _ in 0..4 {
        let mut n = 0;
        for _ in 0..3 {
            if app.get("/a", "u").await.status == StatusCode::OK {
                n += 1;
            }
        }
        allowed.push(n);
        // (Past the second: a request's entry leaves its window a
        // second after it.)
        app.advance(Duration::from_millis(1001));
    }
    assert_eq!(allowed, [2, 2, 1, 0]);
}

#[tokio::test]
async fn per_window_headers_name_every_window_as_kong_does() {
    let rules = support::route_with_global(
        "^/a",
        [Rule::new()
            .minute(3)
            .per(Duration::from_secs(10), 2)
            .per(Duration::from_millis(250), 9)
            .day(50)],
        Rule::new().second(100),
    );
    let app = App::with(rules, MemoryStore::new(), |l| {
        l.headers(HeaderMode::XWindows)
    });
    let reply = app.get("/a", "u").await;
    let expected = [
        ("x-ratelimit-limit-250ms", "9"),
        ("x-ratelimit-remaining-250ms", "8"),
        ("x-ratelimit-limit-10s", "2"),
        ("x-ratelimit-remaining-10s", "1"),
        ("x-ratelimit-limit-minute", "3"),
        ("x-ratelimit-remaining-minute", "2"),
        ("x-ratelimit-limit-day", "50"),
        ("x-ratelimit-remaining-day", "49"),
        ("x-ratelimit-limit-route-second", "100"),
        ("x-ratelimit-remaining-route-second", "99"),
        // The constraining window's, as in every mode with them.
        ("x-ratelimit-limit", "2"),
        ("x-ratelimit-remaining", "1"),
        ("x-ratelimit-reset", "10"),
    ];
    for (name, value) in expected {
        assert_eq!(reply.header(name), Some(value), "{name}");
    }
    let limited = reply
        .headers
        .keys()
        .filter(|k| k.as_str().starts_with("x-ratelimit"))
        .count();
    assert_eq!(limited, expected.len());
    assert!(!reply.headers.contains_key("ratelimit"));

    // A denial carries them too; from a file, `headers = "x-windows"`.
    let rules = Rules::from_toml(
        "headers = \"x-windows\"\n[[routes]]\npath = \"^/a\"\nrules = [{ limits = \"1/second; 5/year\" }]\n",
    )
    .unwrap();
    let app = App::new(rules, MemoryStore::new());
    assert_eq!(app.get("/a", "u").await.status, StatusCode::OK);
    let denied = app.get("/a", "u").await;
    assert_eq!(denied.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(denied.header("x-ratelimit-remaining-second"), Some("0"));
    assert_eq!(denied.header("x-ratelimit-limit-year"), Some("5"));
    assert_eq!(denied.header("x-ratelimit-remaining-year"), Some("4"));
    assert_eq!(denied.header("retry-after"), Some("1"));
}

/// A table swapped in a `ReloadableRules` applies from the next request,
/// with its own header mode and shadow flag, budgets carrying over; a
/// request whose identity is still being decided finishes on the table its
/// route was matched in.
#[tokio::test]
async fn a_reloaded_table_applies_from_the_next_request() {
    use tower::ServiceExt;
    use tower_ratelimit::ReloadableRules;

    let table = |limit: u32| Rules::builder().route("^/a", [Rule::new().minute(limit)]);
    let rules = ReloadableRules::new(table(1).build().unwrap());
    let clock = tower_ratelimit::clock::ManualClock::new(
        tower_ratelimit::clock::Timestamp::from_micros(support::START),
    );
    // (An identity decided asynchronously, which waits for `gate` when the
    // request says so.)
    let gate = Arc::new(tokio::sync::Notify::new());
    let waiting = Arc::new(AtomicBool::new(false));
    let layer = {
        let (gate, waiting) = (gate.clone(), waiting.clone());
        tower_ratelimit::RateLimitLayer::new(rules.clone(), MemoryStore::new())
            .clock(clock)
            .identify(move |head: &http::request::Parts| {
                let user = head.headers.get("x-user").cloned();
                let hold = head.headers.contains_key("x-hold");
                let (gate, waiting) = (gate.clone(), waiting.clone());
                async move {
                    if hold {
                        waiting.store(true, Ordering::SeqCst);
                        gate.notified().await;
                    }
                    let user = user
                        .ok_or_else(|| tower_ratelimit::identity::IdentityError::new("x-user"))?;
                    Ok(tower_ratelimit::identity::Identity::new(
                        user.as_bytes().to_vec(),
                    ))
                }
            })
    };
    let router = axum::Router::new().fallback(|| async { "ok" }).layer(layer);
    let send = |user: &str, hold: bool| {
        let mut request = Request::get("/a").header("x-user", user);
        if hold {
            request = request.header("x-hold", "1");
        }
        router.clone().oneshot(request.body(Body::empty()).unwrap())
    };

    assert_eq!(send("u", false).await.unwrap().status(), StatusCode::OK);
    assert_eq!(
        send("u", false).await.unwrap().status(),
        StatusCode::TOO_MANY_REQUESTS
    );

    // A request held in its identity while the table changes.
    let held = tokio::spawn(send("v", true));
    while !waiting.load(Ordering::SeqCst) {
        tokio::task::yield_now().await;
    }
    rules.set(table(3).headers(HeaderMode::Ietf).build().unwrap());
    gate.notify_one();
    let held = held.await.unwrap().unwrap();
    assert_eq!(held.status(), StatusCode::OK);
    assert_eq!(
        held.headers()["x-ratelimit-limit"],
        "1",
        "the table it was matched in"
    );

    // The next requests: the new limit and headers; u's budget kept its 1.
    let next = send("u", false).await.unwrap();
    assert_eq!(next.status(), StatusCode::OK);
    assert!(!next.headers().contains_key("x-ratelimit-limit"));
    assert_eq!(next.headers()["ratelimit"], r#""60s";r=1;t=60"#);
    assert_eq!(send("u", false).await.unwrap().status(), StatusCode::OK);
    assert_eq!(
        send("u", false).await.unwrap().status(),
        StatusCode::TOO_MANY_REQUESTS
    );

    // A table in shadow mode lets the denial through; one without the route
    // limits nothing.
    rules.set(table(3).shadow(true).build().unwrap());
    let shadowed = send("u", false).await.unwrap();
    assert_eq!(shadowed.status(), StatusCode::OK);
    assert_eq!(shadowed.headers()["x-ratelimit-remaining"], "0");
    rules.set(
        Rules::builder()
            .route("^/b", [Rule::new().minute(1)])
            .build()
            .unwrap(),
    );
    let free = send("u", false).await.unwrap();
    assert_eq!(free.status(), StatusCode::OK);
    assert!(!free.headers().contains_key("x-ratelimit-remaining"));
    assert_eq!(rules.get().len(), 1);
}

/// A layer whose hook asks for `adjustment` after every response, counting
/// how often it runs.
fn adjusted_by<St: Store>(
    rules: Rules,
    store: St,
    adjustment: Option<Adjustment>,
    shadow: bool,
) -> (App, Arc<AtomicUsize>) {
    let runs = Arc::new(AtomicUsize::new(0));
    let counted = runs.clone();
    let app = App::with(rules, store, move |l| {
        l.shadow(shadow).adjust_on_response(move |_, _| {
            counted.fetch_add(1, Ordering::SeqCst);
            adjustment
        })
    });
    (app, runs)
}

#[tokio::test]
async fn adjustments_reach_a_store_that_waits_and_a_failed_one_leaves_the_response_alone() {
    let store = Flaky::default();
    let penalty = Some(Adjustment::Penalty(1));
    let (app, runs) = adjusted_by(one(Rule::new().minute(5)), store.clone(), penalty, false);
    // Each allowed request spends 2: itself and its penalty.
    let first = app.get("/a", "u").await;
    assert_eq!(first.status, StatusCode::OK);
    assert_eq!(first.number("x-ratelimit-remaining"), 4);
    store.adjust_fails.store(true, Ordering::SeqCst);
    // A failed penalty: the response goes out as it was, the budget as it
    // was (3 spent, not 4).
    let second = app.get("/a", "u").await;
    assert_eq!(second.status, StatusCode::OK);
    assert_eq!(second.number("x-ratelimit-remaining"), 2);
    assert_eq!(second.body, "ok");
    store.adjust_fails.store(false, Ordering::SeqCst);
    let third = app.get("/a", "u").await;
    assert_eq!(third.number("x-ratelimit-remaining"), 1);
    // 3 + 2 spent: full. A denied request runs no hook.
    assert_eq!(
        app.get("/a", "u").await.status,
        StatusCode::TOO_MANY_REQUESTS
    );
    assert_eq!(runs.load(Ordering::SeqCst), 3);
    assert_eq!(app.inner_calls(), 3);
}

/// A rule's `cost`, from a configuration file: each POST spends five of
/// the rule's budget, a GET (its own rule, its own budget) one; a layer's
/// cost function decides instead of it.
#[tokio::test]
async fn a_rule_s_cost_is_spent_by_each_request_it_limits() {
    let config = tower_ratelimit::Config::from_toml(
        r#"
        [[routes]]
        path = "^/a"
        rules = [{ method = "POST", minute = 12, cost = 5 }, { minute = 100 }]
        "#,
    )
    .unwrap();
    let app = App::new(config.rules().clone(), MemoryStore::new());
    let post = |app: &App| {
        let app = app.clone();
        async move { app.send(http::Method::POST, "/a", Some(b"u"), None).await }
    };
    assert_eq!(post(&app).await.number("x-ratelimit-remaining"), 7);
    assert_eq!(post(&app).await.number("x-ratelimit-remaining"), 2);
    let denied = post(&app).await;
    assert_eq!(denied.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(denied.number("x-ratelimit-remaining"), 2);
    assert_eq!(app.get("/a", "u").await.number("x-ratelimit-remaining"), 99);
    // The layer's cost function decides instead of the rule's cost.
    let app = App::with(config.rules().clone(), MemoryStore::new(), |l| {
        l.cost(support::cost_header)
    });
    assert_eq!(post(&app).await.number("x-ratelimit-remaining"), 11);
}

/// A table with `denial_cache = false` sends every denial to the store,
/// though the layer has a cache.
#[tokio::test]
async fn a_table_may_turn_the_denial_cache_off() {
    for (cache, asked) in [(true, 2), (false, 4)] {
        let store = Flaky::default();
        let config = tower_ratelimit::Config::from_toml(&format!(
            "denial_cache = {cache}\n[[routes]]\npath = \"^/a\"\nrules = [{{ minute = 1 }}]\n"
        ))
        .unwrap();
        let app = App::new(config.rules().clone(), store.clone());
        assert_eq!(app.get("/a", "u").await.status, StatusCode::OK);
        for _ in 0..3 {
            assert_eq!(
                app.get("/a", "u").await.status,
                StatusCode::TOO_MANY_REQUESTS
            );
        }
        assert_eq!(store.calls(), asked, "denial_cache = {cache}");
    }
}

/// A refund that lands while this replica holds a cached denial of its
/// budget forgets the denial: the budget's next request asks the store,
/// which lets it through (before, the cache kept denying it until the
/// denial's wait ended, a minute here, while the store had room).
#[tokio::test]
async fn a_refund_forgets_the_cached_denial_of_its_budget() {
    use tower::ServiceExt as _;
    let store = Flaky::default();
    let (entered, release) = (
        Arc::new(tokio::sync::Notify::new()),
        Arc::new(tokio::sync::Notify::new()),
    );
    let (entering, waiting) = (entered.clone(), release.clone());
    let layer = tower_ratelimit::RateLimitLayer::new(one(Rule::new().minute(2)), store.clone())
        .adjust_on_response(|status, _| {
            (status == StatusCode::INTERNAL_SERVER_ERROR).then_some(Adjustment::Refund(1))
        })
        .identify(support::header_identity);
    // (A request with `x-slow` is answered 500 once released.)
    let router = axum::Router::new()
        .fallback(move |headers: http::HeaderMap| {
            let (entering, waiting) = (entering.clone(), waiting.clone());
            async move {
                if !headers.contains_key("x-slow") {
                    return StatusCode::OK;
                }
                entering.notify_one();
                waiting.notified().await;
                StatusCode::INTERNAL_SERVER_ERROR
            }
        })
        .layer(layer);
    let send = |slow: bool| {
        let mut request = Request::builder().uri("/a").header("x-user", "u");
        if slow {
            request = request.header("x-slow", "1");
        }
        let request = request.body(Body::empty()).unwrap();
        let router = router.clone();
        async move { router.oneshot(request).await.unwrap().status() }
    };
    let slow = tokio::spawn(send(true));
    entered.notified().await;
    assert_eq!(send(false).await, StatusCode::OK);
    // Spent: the store denies, then the cache does.
    assert_eq!(send(false).await, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(send(false).await, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(store.calls(), 3, "the second denial came from the cache");
    // The slow request fails and is refunded: one unit free again.
    release.notify_one();
    assert_eq!(slow.await.unwrap(), StatusCode::INTERNAL_SERVER_ERROR);
    assert_eq!(send(false).await, StatusCode::OK);
    assert_eq!(store.calls(), 4);
    assert_eq!(send(false).await, StatusCode::TOO_MANY_REQUESTS);
}

/// A refund gives back at most what its request spent: a free request
/// (cost 0) that fails gives back nothing, so a client cannot undo its paid
/// requests with free ones; a paid one gives back no more than its cost.
#[tokio::test]
async fn a_refund_gives_back_at_most_the_request_s_own_cost() {
    let refunding = Arc::new(AtomicBool::new(false));
    let on = refunding.clone();
    let app = App::with(one(Rule::new().minute(2)), MemoryStore::new(), move |l| {
        l.cost(support::cost_header)
            .adjust_on_response(move |_, _| {
                on.load(Ordering::SeqCst).then_some(Adjustment::Refund(5))
            })
    });
    let send = |user: &str, cost: u32| app.send_request(support::costing("/a", user, cost));
    // Two paid requests fill the budget.
    for _ in 0..2 {
        assert_eq!(send("u", 1).await.status, StatusCode::OK);
    }
    assert_eq!(send("u", 1).await.status, StatusCode::TOO_MANY_REQUESTS);
    // A free request, refunded: nothing given back.
    refunding.store(true, Ordering::SeqCst);
    assert_eq!(send("u", 0).await.status, StatusCode::OK);
    refunding.store(false, Ordering::SeqCst);
    assert_eq!(send("u", 1).await.status, StatusCode::TOO_MANY_REQUESTS);
    // A paid request refunded 5 gives back its own 1, not the one before.
    assert_eq!(send("v", 1).await.status, StatusCode::OK);
    refunding.store(true, Ordering::SeqCst);
    assert_eq!(send("v", 1).await.status, StatusCode::OK);
    refunding.store(false, Ordering::SeqCst);
    let last = send("v", 1).await;
    assert_eq!(last.status, StatusCode::OK);
    assert_eq!(last.number("x-ratelimit-remaining"), 0);
    assert_eq!(send("v", 1).await.status, StatusCode::TOO_MANY_REQUESTS);
}

/// A memory store whose adjustments wait for `gate` before they apply.
#[derive(Clone)]
struct GatedAdjust {
    inner: MemoryStore,
    gate: Arc<tokio::sync::Semaphore>,
}

impl Store for GatedAdjust {
    type Future = Ready<Result<Decision, StoreError>>;

    fn check(&self, check: Check) -> Self::Future {
        self.inner.check(check)
    }

    fn adjust(&self, check: Check, adjustment: Adjustment) -> AdjustFuture {
        let (inner, gate) = (self.inner.clone(), self.gate.clone());
        Box::pin(async move {
            let _pass = gate.acquire().await;
            inner.adjust(check, adjustment).await
        })
    }
}

/// A penalty on its way to the store when the response is dropped (the
/// client hung up, an outer timeout fired) still reaches the budget.
#[tokio::test]
async fn a_penalty_under_way_when_its_response_is_dropped_still_lands() {
    let store = GatedAdjust {
        inner: MemoryStore::new(),
        gate: Arc::new(tokio::sync::Semaphore::new(0)),
    };
    let app = App::with(one(Rule::new().minute(5)), store.clone(), |l| {
        l.adjust_on_response(|_, _| Some(Adjustment::Penalty(3)))
    });
    let dropped = tokio::time::timeout(Duration::from_millis(50), app.get("/a", "u")).await;
    assert!(dropped.is_err(), "the response waits for its penalty");
    store.gate.add_permits(10);
    for _ in 0..10 {
        tokio::task::yield_now().await;
    }
    // 1 spent and 3 of penalty: this one is the last of 5 (without the
    // penalty it would leave 3).
    let reply = app.get("/a", "u").await;
    assert_eq!(reply.status, StatusCode::OK);
    assert_eq!(
        reply.number("x-ratelimit-remaining"),
        0,
        "the penalty landed"
    );
}

#[tokio::test]
async fn only_requests_the_store_allowed_are_adjusted() {
    // Shadow mode: a denial let through is not adjusted.
    let (app, runs) = adjusted_by(one(Rule::new().second(1)), MemoryStore::new(), None, true);
    assert_eq!(app.get("/a", "u").await.status, StatusCode::OK);
    assert_eq!(app.get("/a", "u").await.status, StatusCode::OK);
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    assert_eq!(app.inner_calls(), 2);
    // Fail open: a request let through without a decision is not either.
    let store = Flaky::default();
    store.failing.store(true, Ordering::SeqCst);
    let (app, runs) = adjusted_by(one(Rule::new().second(1)), store, None, false);
    assert_eq!(app.get("/a", "u").await.status, StatusCode::OK);
    assert_eq!(runs.load(Ordering::SeqCst), 0);
    // Nor one the fallback store decided while the store is down.
    let store = Flaky::default();
    store.failing.store(true, Ordering::SeqCst);
    let runs = Arc::new(AtomicUsize::new(0));
    let counted = runs.clone();
    let app = App::with(one(Rule::new().second(1)), store, move |l| {
        l.fail_mode(FailMode::Fallback)
            .adjust_on_response(move |_, _| {
                counted.fetch_add(1, Ordering::SeqCst);
                None
            })
    });
    assert_eq!(app.get("/a", "u").await.status, StatusCode::OK);
    assert_eq!(
        app.get("/a", "u").await.status,
        StatusCode::TOO_MANY_REQUESTS
    );
    assert_eq!(runs.load(Ordering::SeqCst), 0);
    // Nor an unlimited one.
    let unlimited = Rules::builder()
        .route("^/a", [Rule::group("admin")])
        .build()
        .unwrap();
    let (app, runs) = adjusted_by(unlimited, MemoryStore::new(), None, false);
    assert_eq!(app.get_as("/a", "u", "admin").await.status, StatusCode::OK);
    assert_eq!(runs.load(Ordering::SeqCst), 0);
}

/// A table set again after another (a rollback, with a table `get` gave
/// before) is a table of its own for the denial cache: its old denials are
/// not served, and the store is asked, as the budget may have changed
/// meanwhile (on Redis, a counter algorithm's state written under another
/// table's windows keeps only those).
#[tokio::test]
async fn a_table_set_again_is_not_answered_from_its_old_denials() {
    use tower::ServiceExt;
    use tower_ratelimit::identity::Global;
    use tower_ratelimit::ReloadableRules;

    let table = |rule: Rule| Rules::builder().route("^/a", [rule]).build().unwrap();
    let rules = ReloadableRules::new(table(Rule::new().minute(1)));
    let first = rules.get();
    let store = Flaky::default();
    let clock = tower_ratelimit::clock::ManualClock::new(
        tower_ratelimit::clock::Timestamp::from_micros(support::START),
    );
    let layer = tower_ratelimit::RateLimitLayer::new(rules.clone(), store.clone())
        .clock(clock)
        .identify(Global);
    let router = axum::Router::new().fallback(|| async { "ok" }).layer(layer);
    let status = || async {
        let request = Request::get("/a").body(Body::empty()).unwrap();
        router.clone().oneshot(request).await.unwrap().status()
    };
    assert_eq!(status().await, StatusCode::OK);
    assert_eq!(status().await, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(status().await, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(store.calls(), 2, "the second denial came from the cache");
    rules.set(table(Rule::new().hour(100)));
    assert_eq!(status().await, StatusCode::OK);
    rules.set(first);
    assert_eq!(status().await, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(store.calls(), 4, "the store was asked again");
    // (Under the table set again, its own denials are cached as before.)
    assert_eq!(status().await, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(store.calls(), 4);
}

/// A reloaded table that changes one group's rule moves no other group's
/// budget: a default user who spent a minute's 10 is still denied after
/// the `gold` rule changes its windows, and a block running holds. Before,
/// the route's groups then counted differently, every group's budget got
/// a key of its own, and the user had 10 more (an outside trial, on the
/// memory store and on Redis).
#[tokio::test]
async fn another_groups_rule_changed_by_a_reload_moves_no_budget() {
    use tower::ServiceExt;
    use tower_ratelimit::identity::Global;
    use tower_ratelimit::ReloadableRules;

    let table = |gold: Rule| {
        let mine = Rule::new().minute(10).block_time(Duration::from_secs(3600));
        Rules::builder().route("^/a", [mine, gold]).build().unwrap()
    };
    let rules = ReloadableRules::new(table(Rule::group("gold").minute(100)));
    let layer = tower_ratelimit::RateLimitLayer::new(rules.clone(), MemoryStore::new())
        .clock(tower_ratelimit::clock::ManualClock::new(
            tower_ratelimit::clock::Timestamp::from_micros(support::START),
        ))
        .identify(Global);
    let router = axum::Router::new().fallback(|| async { "ok" }).layer(layer);
    let status = || async {
        let request = Request::get("/a").body(Body::empty()).unwrap();
        router.clone().oneshot(request).await.unwrap().status()
    };
    for _ in 0..10 {
        assert_eq!(status().await, StatusCode::OK);
    }
    assert_eq!(status().await, StatusCode::TOO_MANY_REQUESTS);
    for gold in [
        Rule::group("gold").hour(100),
        Rule::group("gold")
            .minute(100)
            .algorithm(tower_ratelimit::Algorithm::TokenBucket),
        Rule::group("gold").minute(100),
    ] {
        rules.set(table(gold));
        assert_eq!(status().await, StatusCode::TOO_MANY_REQUESTS);
    }
}

/// A costly request's block holds for the block time, though the wait it
/// reports is its own when longer: the cached denial ends with the block,
/// so the next costly request reaches the store and is blocked again, and
/// the user stays blocked (before, the cache answered it for the whole
/// wait, no block was set again, and a cheap request passed; found by a
/// review). A request that never passes gives its entry up to a cheaper
/// request's, which stays cached.
#[tokio::test]
async fn a_costly_blocked_request_is_cached_no_longer_than_its_block() {
    let rule = Rule::new().minute(10).block_time(Duration::from_secs(10));
    let store = Flaky::default();
    let app = App::with(one(rule), store.clone(), |l| l.cost(support::cost_header));
    let send = |cost: u32| app.send_request(support::costing("/a", "u", cost));
    assert_eq!(send(6).await.status, StatusCode::OK);
    app.advance_ms(1_000);
    let blocked = send(6).await;
    assert_eq!(blocked.status, StatusCode::TOO_MANY_REQUESTS);
    // (Its own wait, longer than the block.)
    assert!(blocked.number("retry-after") >= 59);
    let asked = store.calls();
    app.advance_ms(11_000);
    // Past the block: the store is asked, and blocks again.
    assert_eq!(send(6).await.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(store.calls(), asked + 1);
    app.advance_ms(1_000);
    assert_eq!(send(1).await.status, StatusCode::TOO_MANY_REQUESTS);

    // A request that never passes, cached, then a cheap one denied: the
    // cheap one's denial takes the entry and is answered from the cache.
    let store = Flaky::default();
    let app = App::with(one(Rule::new().minute(2)), store.clone(), |l| {
        l.cost(support::cost_header)
    });
    let send = |cost: u32| app.send_request(support::costing("/a", "u", cost));
    assert_eq!(send(1).await.status, StatusCode::OK);
    assert_eq!(send(1).await.status, StatusCode::OK);
    assert_eq!(send(3).await.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(send(1).await.status, StatusCode::TOO_MANY_REQUESTS);
    let asked = store.calls();
    for _ in 0..5 {
        assert_eq!(send(1).await.status, StatusCode::TOO_MANY_REQUESTS);
    }
    assert_eq!(store.calls(), asked, "the cheap denials were not cached");
}

/// A table of thousands of regex routes matches each path to its route.
/// (The route set once kept capture slots for every route in every state
/// of its automaton: a request's match took 21 s in a release build with
/// 4,000 routes, and with 8,000 asked for 83 GB and aborted.) Each route
/// here has its own limit, so the header tells which one matched.
#[tokio::test]
async fn thousands_of_regex_routes_match_each_path_to_its_own() {
    const ROUTES: usize = 8_000;
    let mut builder = tower_ratelimit::Rules::builder();
    for i in 0..ROUTES {
        let limit = u32::try_from(i % 1_000).unwrap() + 1;
        builder = builder.route(format!("^/r{i}/items/[0-9]+$"), [Rule::new().minute(limit)]);
    }
    let app = App::new(builder.build().unwrap(), MemoryStore::new());
    // (A spread of routes, first and last among them.)
    for i in (0..ROUTES).step_by(397).chain([ROUTES - 1]) {
        let reply = app.get(&format!("/r{i}/items/{}", i * 7), "u").await;
        assert_eq!(reply.status, StatusCode::OK);
        assert_eq!(
            reply.number("x-ratelimit-limit"),
            (i % 1_000) as u64 + 1,
            "/r{i}"
        );
    }
    for unmatched in ["/r1/items/x", "/r8000/items/1", "/x/r1/items/1"] {
        let reply = app.get(unmatched, "u").await;
        assert_eq!(reply.status, StatusCode::OK);
        assert!(!reply.limited(), "{unmatched}");
    }
}

/// What `Rules::budget_changes` says a reload does to the budgets (those
/// changes true of the memory store) is what the memory store then does: a
/// user who spent a minute's 3 of 3 is still denied where the report lists
/// no change of the user's own budget, and allowed where it says it starts
/// full.
#[tokio::test]
async fn a_reloads_budget_changes_say_what_the_memory_store_does() {
    use tower_ratelimit::rules::{BudgetChangeKind as Kind, ChangedOn};
    use tower_ratelimit::Algorithm::{FixedWindow, SlidingLog, TokenBucket};
    let one =
        |pattern: &str, rules: Vec<Rule>| Rules::builder().route(pattern, rules).build().unwrap();
    let minute = || Rule::new().minute(3);
    let fixed = |rule: Rule| rule.algorithm(FixedWindow);
    let gold = || Rule::group("gold");
    let with_global = |global: Rule| support::route_with_global("^/a", [minute()], global);
    let (ok, denied) = (StatusCode::OK, StatusCode::TOO_MANY_REQUESTS);
    let secs = Duration::from_secs;
    let user = |kind| vec![(false, kind)];
    let cases = [
        (
            "a lower limit",
            one("^/a", vec![minute()]),
            one("^/a", vec![Rule::new().minute(2)]),
            vec![],
            denied,
        ),
        (
            "another algorithm",
            one("^/a", vec![minute()]),
            one("^/a", vec![minute().algorithm(TokenBucket)]),
            user(Kind::Algorithm {
                from: SlidingLog,
                to: TokenBucket,
            }),
            ok,
        ),
        (
            "another pattern",
            one("^/a", vec![minute()]),
            one("^/(a|b)", vec![minute()]),
            user(Kind::Uncounted),
            ok,
        ),
        (
            "a counter's window added",
            one("^/a", vec![fixed(minute())]),
            one("^/a", vec![fixed(minute().second(3))]),
            user(Kind::NewWindows(vec![secs(1)])),
            denied,
        ),
        (
            "a counter's window replaced",
            one("^/a", vec![fixed(minute())]),
            one("^/a", vec![fixed(Rule::new().hour(3))]),
            user(Kind::NewWindows(vec![secs(3600)])),
            ok,
        ),
        (
            "a sliding log's longest window longer",
            one("^/a", vec![minute()]),
            one("^/a", vec![Rule::new().hour(3)]),
            user(Kind::LongerLog { kept: secs(60) }),
            denied,
        ),
        (
            "a sliding log of 6 windows",
            one("^/a", vec![minute()]),
            one(
                "^/a",
                vec![minute().second(3).hour(3).day(3).month(3).per(secs(7), 3)],
            ),
            user(Kind::LongerLog { kept: secs(60) }),
            denied,
        ),
        (
            "a route-wide limit added",
            one("^/a", vec![minute()]),
            with_global(Rule::new().minute(100)),
            vec![(true, Kind::Uncounted)],
            denied,
        ),
        (
            "a route-wide window longer",
            with_global(Rule::new().minute(100)),
            with_global(Rule::new().hour(100)),
            vec![(true, Kind::LongerLog { kept: secs(60) })],
            denied,
        ),
        (
            "another group's rule counting apart",
            one("^/a", vec![minute(), gold().minute(3)]),
            one(
                "^/a",
                vec![minute(), gold().minute(3).algorithm(TokenBucket)],
            ),
            user(Kind::Uncounted),
            denied,
        ),
        (
            "another group's rule counting alike again",
            one("^/a", vec![minute(), gold().hour(3)]),
            one("^/a", vec![minute(), gold().minute(3)]),
            user(Kind::Uncounted),
            denied,
        ),
        (
            "a new group counting alike",
            one("^/a", vec![minute()]),
            one("^/a", vec![minute(), Rule::group("silver").minute(3)]),
            user(Kind::Uncounted),
            denied,
        ),
        (
            "the default group's rule removed",
            one("^/a", vec![minute(), gold().hour(3)]),
            one("^/a", vec![gold().hour(3)]),
            user(Kind::Uncounted),
            ok,
        ),
    ];
    for (what, before, after, expected, next) in cases {
        let (seen, status) =
            support::next_after_reload(MemoryStore::new(), ChangedOn::Memory, before, after, 3)
                .await;
        assert_eq!(seen, expected, "{what}");
        assert_eq!(status, next, "{what}");
    }
}

/// A reload's budget changes name the rule: its route, group and method.
#[test]
fn a_budget_change_names_its_rule() {
    let before = Rules::builder()
        .route("^/a", [Rule::new().minute(3)])
        .build()
        .unwrap();
    let after = Rules::builder()
        .route("^/a", [Rule::new().minute(3)])
        .route("^/b", [Rule::group("gold").method("POST").minute(3)])
        .build()
        .unwrap();
    let changes = after.budget_changes(&before);
    assert_eq!(changes.len(), 1);
    assert_eq!(&*changes[0].route, "^/b");
    assert_eq!(changes[0].group, "gold");
    assert_eq!(changes[0].method, Some(http::Method::POST));
    assert_eq!(
        changes[0].to_string(),
        "route `^/b`, group `gold`, method POST: its budgets start full (no rule of the previous table counted them)"
    );
    assert!(before.budget_changes(&before).is_empty());

    // A route-wide limit added: the users' budgets move on Redis only; the
    // route-wide budget is new on every store.
    let after = support::route_with_global("^/a", [Rule::new().minute(3)], Rule::new().hour(100));
    let said: Vec<String> = after
        .budget_changes(&before)
        .iter()
        .map(ToString::to_string)
        .collect();
    assert_eq!(
        said,
        [
            "route `^/a`, group `default`: on Redis, its budgets start full under other keys (a route-wide limit added or removed, or a sliding log gone from 5 windows or fewer to more, or back)",
            "route `^/a`, route-wide budget: it starts full (no rule of the previous table counted them)",
        ]
    );
}
