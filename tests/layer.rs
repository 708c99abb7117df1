//! Layer behaviour that does not depend on the store: failure modes,
//! custom responses, built-in identities.

mod support;

use std::future::{ready, Ready};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use axum::body::Body;
use axum::extract::connect_info::MockConnectInfo;
use axum::Router;
use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::BodyExt;
use support::App;
use tower::ServiceExt;
use tower_ratelimit::identity::{Global, HeaderKey};
use tower_ratelimit::{
    Check, Decision, FailMode, MemoryStore, RateLimitLayer, Rule, Rules, Store, StoreError,
    StoreErrorKind,
};

/// A store that always fails, counting its calls.
#[derive(Clone, Default)]
struct BrokenStore {
    calls: Arc<AtomicUsize>,
}

impl Store for BrokenStore {
    type Future = Ready<Result<Decision, StoreError>>;

    fn check(&self, _check: Check) -> Self::Future {
        self.calls.fetch_add(1, Ordering::SeqCst);
        ready(Err(StoreError::new(
            StoreErrorKind::Unavailable,
            "connection refused",
        )))
    }
}

fn rules() -> Rules {
    Rules::builder()
        .route("^/a", [Rule::new().second(1)])
        .build()
        .unwrap()
}

#[tokio::test]
async fn fail_open_lets_requests_through_without_headers() {
    let store = BrokenStore::default();
    let app = App::new(rules(), store.clone());
    for _ in 0..3 {
        let reply = app.get("/a", "u").await;
        assert_eq!(reply.status, StatusCode::OK);
        assert!(!reply.limited());
    }
    assert_eq!(store.calls.load(Ordering::SeqCst), 3);
    assert_eq!(app.inner_calls(), 3);
}

#[tokio::test]
async fn fail_closed_answers_503_with_retry_after() {
    let app = App::with(rules(), BrokenStore::default(), |l| {
        l.fail_mode(FailMode::Closed)
    });
    let reply = app.get("/a", "u").await;
    assert_eq!(reply.status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(reply.header("retry-after"), Some("1"));
    assert_eq!(
        reply.header("content-type"),
        Some("application/problem+json")
    );
    assert_eq!(app.inner_calls(), 0);
}

#[tokio::test]
async fn on_blocked_builds_the_denial_and_headers_are_still_added() {
    let app = App::with(rules(), MemoryStore::new(), |l| {
        l.on_blocked(|decision: &Decision| {
            let wait = decision.retry_after().unwrap().as_millis();
            let mut response = Response::new(Bytes::from(format!("wait {wait} ms")));
            *response.status_mut() = StatusCode::SERVICE_UNAVAILABLE;
            response
        })
    });
    app.get("/a", "u").await;
    app.advance_ms(250);
    let reply = app.get("/a", "u").await;
    assert_eq!(reply.status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(reply.body, "wait 750 ms");
    assert_eq!(reply.header("retry-after"), Some("1"));
    assert_eq!(reply.header("x-ratelimit-limit"), Some("1"));
    assert_eq!(app.inner_calls(), 1);
}

#[tokio::test]
async fn on_identity_error_builds_the_response() {
    let app = App::with(rules(), MemoryStore::new(), |l| {
        l.on_identity_error(|e| {
            let mut response = Response::new(Bytes::from(format!("who are you? {e}")));
            *response.status_mut() = StatusCode::FORBIDDEN;
            response
        })
    });
    let reply = app.send(http::Method::GET, "/a", None, None).await;
    assert_eq!(reply.status, StatusCode::FORBIDDEN);
    assert_eq!(reply.body, "who are you? missing x-user");
}

/// The default answer to an identity error: its status (a 4xx or 5xx
/// only: a 200 would tell the client it was served) and, on a 401, the
/// challenge it names as `WWW-Authenticate` (RFC 9110 §11.6.1).
#[tokio::test]
async fn identity_errors_answer_their_status_and_challenge() {
    use tower_ratelimit::identity::IdentityError;
    let answer = |error: IdentityError| async move {
        let layer = RateLimitLayer::new(rules(), MemoryStore::new()).identify(
            move |_: &http::request::Parts| {
                ready(Err::<tower_ratelimit::identity::Identity, _>(error.clone()))
            },
        );
        let router = Router::new().fallback(|| async { "ok" }).layer(layer);
        router.oneshot(get("/a")).await.unwrap()
    };
    let challenged = answer(
        IdentityError::new("no key")
            .with_challenge(http::HeaderValue::from_static(r#"Bearer realm="api""#)),
    )
    .await;
    assert_eq!(challenged.status(), StatusCode::UNAUTHORIZED);
    assert_eq!(
        challenged.headers()["www-authenticate"],
        r#"Bearer realm="api""#
    );
    let plain = answer(IdentityError::new("no key")).await;
    assert_eq!(plain.status(), StatusCode::UNAUTHORIZED);
    assert!(!plain.headers().contains_key("www-authenticate"));
    let down = answer(IdentityError::new("lookup").with_status(StatusCode::BAD_GATEWAY)).await;
    assert_eq!(down.status(), StatusCode::BAD_GATEWAY);
    for ignored in [StatusCode::OK, StatusCode::FOUND, StatusCode::CONTINUE] {
        let reply = answer(IdentityError::new("?").with_status(ignored)).await;
        assert_eq!(reply.status(), StatusCode::UNAUTHORIZED, "{ignored}");
    }
}

async fn status(router: &Router, request: Request<Body>) -> (StatusCode, Bytes) {
    let response = router.clone().oneshot(request).await.unwrap();
    let status = response.status();
    (
        status,
        response.into_body().collect().await.unwrap().to_bytes(),
    )
}

fn get(path: &str) -> Request<Body> {
    Request::builder().uri(path).body(Body::empty()).unwrap()
}

/// Patterns see the path decoded, as axum's `Path` hands it to the
/// handler: a percent-encoded letter never escapes the limit of the path it
/// spells.
#[tokio::test]
async fn a_percent_encoded_path_is_limited_as_the_path_it_spells() {
    use axum::extract::Path;
    let rules = Rules::builder()
        .route("^/users/admin$", [Rule::new().second(2)])
        .route("^/café$", [Rule::new().second(1)])
        .build()
        .unwrap();
    let router = Router::new()
        .route(
            "/users/{name}",
            axum::routing::get(|Path(name): Path<String>| async move { name }),
        )
        .route(
            "/{place}",
            axum::routing::get(|Path(place): Path<String>| async move { place }),
        )
        .layer(RateLimitLayer::new(rules, MemoryStore::new()).identify(Global));
    let answer = |path: &'static str| {
        let router = router.clone();
        async move {
            let response = router.oneshot(get(path)).await.unwrap();
            let limited = response.headers().contains_key("x-ratelimit-limit");
            let body = response.into_body().collect().await.unwrap().to_bytes();
            (limited, body)
        }
    };
    assert_eq!(answer("/users/admin").await, (true, "admin".into()));
    assert_eq!(answer("/users/%61dmin").await, (true, "admin".into()));
    let (limited, body) = answer("/users/%61%64min").await;
    assert!(limited && std::str::from_utf8(&body).unwrap().contains("429"));
    assert_eq!(answer("/users/bob").await, (false, "bob".into()));
    assert_eq!(answer("/caf%C3%A9").await, (true, "café".into()));
    let (limited, body) = answer("/caf%c3%a9").await;
    assert!(limited && std::str::from_utf8(&body).unwrap().contains("429"));
}

/// A request target that is no path (`*`, a `CONNECT` authority), which
/// hyper accepts with any method and axum hands to the fallback, is
/// matched as `/`: a catch-all route limits it as it does every path.
#[tokio::test]
async fn a_target_that_is_no_path_is_limited_as_the_root() {
    let rules = Rules::builder()
        .route("^/", [Rule::new().minute(2)])
        .build()
        .unwrap();
    let router = Router::new()
        .fallback(|| async { "fallback" })
        .layer(RateLimitLayer::new(rules, MemoryStore::new()).identify(Global));
    let target = |method: &str, uri: &str| {
        Request::builder()
            .method(method)
            .uri(uri)
            .body(Body::empty())
            .unwrap()
    };
    let star = target("GET", "*");
    assert_eq!(star.uri().path(), "*");
    let authority = target("CONNECT", "example.com:443");
    assert_eq!(authority.uri().path(), "");
    let first = router.clone().oneshot(star).await.unwrap();
    assert_eq!(first.status(), StatusCode::OK);
    assert_eq!(first.headers()["x-ratelimit-remaining"], "1");
    let second = router.clone().oneshot(authority).await.unwrap();
    assert_eq!(second.headers()["x-ratelimit-remaining"], "0");
    // The budget they spent is the root's, and every path's.
    assert_eq!(
        status(&router, get("/")).await.0,
        StatusCode::TOO_MANY_REQUESTS
    );
    assert_eq!(
        status(&router, target("POST", "*")).await.0,
        StatusCode::TOO_MANY_REQUESTS
    );
}

#[tokio::test]
async fn client_ip_reads_axum_connect_info() {
    let shared = MemoryStore::new();
    let router = |ip: [u8; 4]| {
        Router::new()
            .fallback(|| async { "ok" })
            .layer(RateLimitLayer::new(rules(), shared.clone()))
            .layer(MockConnectInfo(SocketAddr::from((ip, 4000))))
    };
    let a = router([10, 0, 0, 1]);
    let b = router([10, 0, 0, 2]);
    assert_eq!(status(&a, get("/a")).await.0, StatusCode::OK);
    assert_eq!(status(&a, get("/a")).await.0, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(status(&b, get("/a")).await.0, StatusCode::OK);
}

#[tokio::test]
async fn client_ip_without_connect_info_is_a_server_error() {
    let router = Router::new()
        .fallback(|| async { "ok" })
        .layer(RateLimitLayer::new(rules(), MemoryStore::new()));
    let (status, body) = status(&router, get("/a")).await;
    assert_eq!(status, StatusCode::INTERNAL_SERVER_ERROR);
    // (The server's setup is the operator's business, logged: see
    // tests/logging.rs. The client reads that its address was unknown.)
    let body = std::str::from_utf8(&body).unwrap();
    assert!(
        body.contains("could not tell the client's address"),
        "{body}"
    );
    assert!(!body.contains("ConnectInfo"), "{body}");
}

#[tokio::test]
async fn header_identity_and_global_identity() {
    let by_key = Router::new().fallback(|| async { "ok" }).layer(
        RateLimitLayer::new(rules(), MemoryStore::new())
            .identify(HeaderKey::new(http::HeaderName::from_static("x-api-key"))),
    );
    let with_key = |k: &str| {
        Request::builder()
            .uri("/a")
            .header("x-api-key", k)
            .body(Body::empty())
            .unwrap()
    };
    assert_eq!(status(&by_key, with_key("k1")).await.0, StatusCode::OK);
    assert_eq!(
        status(&by_key, with_key("k1")).await.0,
        StatusCode::TOO_MANY_REQUESTS
    );
    assert_eq!(status(&by_key, with_key("k2")).await.0, StatusCode::OK);
    assert_eq!(status(&by_key, get("/a")).await.0, StatusCode::UNAUTHORIZED);
    // Sent twice, whichever comes first (k3's budget is fresh, k1's spent):
    // refused, and neither budget is charged.
    for pair in [["k3", "k1"], ["k1", "k3"], ["", "k3"]] {
        let twice = Request::builder()
            .uri("/a")
            .header("x-api-key", pair[0])
            .header("x-api-key", pair[1])
            .body(Body::empty())
            .unwrap();
        let (status, body) = status(&by_key, twice).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{pair:?}");
        let body = std::str::from_utf8(&body).unwrap();
        assert!(body.contains("more than one `x-api-key` header"), "{body}");
    }
    assert_eq!(status(&by_key, with_key("k3")).await.0, StatusCode::OK);
    // An empty value (or one of spaces) names no one, as no header does.
    for empty in ["", " "] {
        let (status, body) = status(&by_key, with_key(empty)).await;
        assert_eq!(status, StatusCode::UNAUTHORIZED, "{empty:?}");
        let body = std::str::from_utf8(&body).unwrap();
        assert!(
            body.contains("missing or empty `x-api-key` header"),
            "{body}"
        );
    }

    // No challenge unless given; given, the 401 carries it.
    let unchallenged = by_key.clone().oneshot(get("/a")).await.unwrap();
    assert_eq!(unchallenged.headers().get("www-authenticate"), None);
    let challenging = Router::new().fallback(|| async { "ok" }).layer(
        RateLimitLayer::new(rules(), MemoryStore::new()).identify(
            HeaderKey::new(http::HeaderName::from_static("x-api-key")).challenge(
                http::HeaderValue::from_static(r#"ApiKey header="x-api-key""#),
            ),
        ),
    );
    let challenged = challenging.oneshot(get("/a")).await.unwrap();
    assert_eq!(challenged.status(), StatusCode::UNAUTHORIZED);
    assert_eq!(
        challenged.headers().get("www-authenticate").unwrap(),
        r#"ApiKey header="x-api-key""#
    );

    let global = Router::new()
        .fallback(|| async { "ok" })
        .layer(RateLimitLayer::new(rules(), MemoryStore::new()).identify(Global));
    assert_eq!(status(&global, with_key("k1")).await.0, StatusCode::OK);
    assert_eq!(
        status(&global, with_key("k2")).await.0,
        StatusCode::TOO_MANY_REQUESTS
    );
}

/// The layer works with plain tower services, no axum involved.
#[tokio::test]
async fn works_on_a_plain_tower_service() {
    let calls = Arc::new(AtomicUsize::new(0));
    let counter = calls.clone();
    let inner = tower::service_fn(move |_req: Request<String>| {
        counter.fetch_add(1, Ordering::SeqCst);
        ready(Ok::<_, std::convert::Infallible>(Response::new(
            http_body_util::Full::new(Bytes::from_static(b"plain")),
        )))
    });
    let service = tower::ServiceBuilder::new()
        .layer(RateLimitLayer::new(rules(), MemoryStore::new()).identify(Global))
        .service(inner);
    let first = service
        .clone()
        .oneshot(Request::builder().uri("/a").body(String::new()).unwrap())
        .await
        .unwrap();
    assert_eq!(first.status(), StatusCode::OK);
    assert_eq!(
        first.into_body().collect().await.unwrap().to_bytes(),
        "plain"
    );
    let second = service
        .oneshot(Request::builder().uri("/a").body(String::new()).unwrap())
        .await
        .unwrap();
    assert_eq!(second.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(calls.load(Ordering::SeqCst), 1);
}

/// Headers the inner service set itself: the layer's rate-limit headers
/// replace its `X-RateLimit-*` (one value each, the rule's), and its own
/// `Retry-After` is kept, as the README says.
#[tokio::test]
async fn the_inner_services_own_headers_are_replaced_or_kept() {
    let inner = tower::service_fn(|_req: Request<String>| {
        let mut response = Response::new(http_body_util::Full::new(Bytes::new()));
        *response.status_mut() = StatusCode::SERVICE_UNAVAILABLE;
        let headers = response.headers_mut();
        headers.insert("retry-after", http::HeaderValue::from_static("120"));
        headers.insert("x-ratelimit-limit", http::HeaderValue::from_static("999"));
        headers.append(
            "x-ratelimit-remaining",
            http::HeaderValue::from_static("998"),
        );
        headers.append(
            "x-ratelimit-remaining",
            http::HeaderValue::from_static("997"),
        );
        ready(Ok::<_, std::convert::Infallible>(response))
    });
    let rules = Rules::builder()
        .route("^/a", [Rule::new().minute(5)])
        .build()
        .unwrap();
    let service = tower::ServiceBuilder::new()
        .layer(RateLimitLayer::new(rules, MemoryStore::new()).identify(Global))
        .service(inner);
    let response = service
        .oneshot(Request::builder().uri("/a").body(String::new()).unwrap())
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
    let values = |name: &str| -> Vec<&str> {
        response
            .headers()
            .get_all(name)
            .iter()
            .map(|v| v.to_str().unwrap())
            .collect()
    };
    assert_eq!(values("x-ratelimit-limit"), ["5"]);
    assert_eq!(values("x-ratelimit-remaining"), ["4"]);
    assert_eq!(values("x-ratelimit-reset").len(), 1);
    assert_eq!(values("retry-after"), ["120"]);
}

/// Over an inner service whose readiness is a resource (tower's
/// `ConcurrencyLimit` of 1: `poll_ready` takes the permit, `call` spends
/// it, and a call without one panics), the layer calls only the service
/// it polled ready, and a request it denies, or one given up on while its
/// identity is awaited, leaves no permit held: every later request is
/// served. With the identity at once (the memory store decides before
/// `call` returns) and awaited (the request held).
#[tokio::test]
async fn a_concurrency_limited_inner_service_keeps_its_permits() {
    use std::time::Duration;
    use tower::{Layer, Service};
    async fn send<S, B>(service: &mut S, user: &str) -> StatusCode
    where
        S: tower::Service<Request<String>, Response = Response<B>>,
        S::Error: std::fmt::Debug,
    {
        let request = Request::builder()
            .uri("/a")
            .header("x-user", user)
            .body(String::new())
            .unwrap();
        let served = async { service.ready().await.unwrap().call(request).await.unwrap() };
        tokio::time::timeout(Duration::from_secs(5), served)
            .await
            .expect("a permit was left held")
            .status()
    }
    let user = |head: &http::request::Parts| {
        let user = head.headers.get("x-user").map(|v| v.as_bytes().to_vec());
        user.map(tower_ratelimit::identity::Identity::new)
            .ok_or_else(|| tower_ratelimit::identity::IdentityError::new("no user"))
    };
    for awaited in [false, true] {
        let inner = tower::ServiceBuilder::new()
            .concurrency_limit(1)
            .service_fn(|_req: Request<String>| async {
                Ok::<_, std::convert::Infallible>(Response::new(Body::from("ok")))
            });
        // (A minute: the requests of a user fall in one window however
        // slow the machine.)
        let minute = Rules::builder()
            .route("^/a", [Rule::new().minute(1)])
            .build()
            .unwrap();
        let layer = RateLimitLayer::new(minute, MemoryStore::new());
        let mut service = match awaited {
            false => tower::util::BoxCloneService::new(
                layer
                    .identify(tower_ratelimit::identity::immediate(user))
                    .layer(inner),
            ),
            true => tower::util::BoxCloneService::new(
                layer
                    .identify(move |head: &http::request::Parts| ready(user(head)))
                    .layer(inner),
            ),
        };
        let mut statuses = Vec::new();
        for name in ["u", "u", "u", "v", "v", "w"] {
            statuses.push(send(&mut service, name).await);
        }
        use StatusCode as S;
        let expected = [
            S::OK,
            S::TOO_MANY_REQUESTS,
            S::TOO_MANY_REQUESTS,
            S::OK,
            S::TOO_MANY_REQUESTS,
            S::OK,
        ];
        assert_eq!(statuses, expected, "awaited: {awaited}");
        // A call given up on before its answer (its future dropped, as a
        // client that went away), then another user's: served.
        let request = Request::builder()
            .uri("/a")
            .header("x-user", "x")
            .body(String::new())
            .unwrap();
        drop(service.ready().await.unwrap().call(request));
        assert_eq!(
            send(&mut service, "y").await,
            StatusCode::OK,
            "awaited: {awaited}"
        );
    }
}

/// tower-http's `Cors` and `Timeout` layers, whose own answers need an
/// empty body of the inner one's type, stack outside the layer: the 429
/// gets the CORS headers, and a slow allowed request the timeout's 408.
/// (Tokio's clock is paused: the timeout ends the slow request at once.)
#[tokio::test(start_paused = true)]
async fn tower_http_layers_stack_outside_the_layer() {
    let inner = tower::service_fn(|req: Request<()>| async move {
        if req.uri().path() == "/a/slow" {
            tokio::time::sleep(std::time::Duration::from_secs(5)).await;
        }
        Ok::<_, std::convert::Infallible>(Response::new(http_body_util::Full::new(
            Bytes::from_static(b"inner"),
        )))
    });
    let rules = Rules::builder()
        .route("^/a", [Rule::new().second(2)])
        .build()
        .unwrap();
    let service = tower::ServiceBuilder::new()
        .layer(tower_http::cors::CorsLayer::permissive())
        .layer(tower_http::timeout::TimeoutLayer::with_status_code(
            StatusCode::REQUEST_TIMEOUT,
            std::time::Duration::from_millis(50),
        ))
        .layer(RateLimitLayer::new(rules, MemoryStore::new()).identify(Global))
        .service(inner);
    let request = |path: &str| {
        Request::builder()
            .uri(path)
            .header("origin", "https://example.com")
            .body(())
            .unwrap()
    };
    let mut statuses = Vec::new();
    for path in ["/a", "/a/slow", "/a"] {
        let response = service.clone().oneshot(request(path)).await.unwrap();
        assert_eq!(
            response.headers()["access-control-allow-origin"],
            "*",
            "{path}"
        );
        statuses.push(response.status());
        let body = response.into_body().collect().await.unwrap().to_bytes();
        if statuses.last() == Some(&StatusCode::REQUEST_TIMEOUT) {
            assert!(body.is_empty());
        }
    }
    assert_eq!(
        statuses,
        [
            StatusCode::OK,
            StatusCode::REQUEST_TIMEOUT,
            StatusCode::TOO_MANY_REQUESTS
        ]
    );
}

/// With `same_body`, the service answers with the inner body type itself:
/// the inner body untouched when allowed, the layer's own answer (same
/// status, headers and bytes as the wrapped mode) made into that type when
/// denied or failed.
#[tokio::test]
async fn same_body_keeps_the_inner_body_type_and_the_answers() {
    let calls = Arc::new(AtomicUsize::new(0));
    let counter = calls.clone();
    let inner = tower::service_fn(move |_req: Request<()>| {
        counter.fetch_add(1, Ordering::SeqCst);
        ready(Ok::<_, std::convert::Infallible>(Response::new(
            http_body_util::Full::new(Bytes::from_static(b"inner")),
        )))
    });
    let request = || Request::builder().uri("/a").body(()).unwrap();
    let wrapped = RateLimitLayer::new(rules(), MemoryStore::new()).identify(Global);
    let same = RateLimitLayer::new(rules(), MemoryStore::new())
        .identify(Global)
        .same_body();
    let wrapped = tower::Layer::layer(&wrapped, inner.clone());
    // The annotation is the point: the response body is the inner one's type.
    let same: tower_ratelimit::RateLimit<_, _, _, tower_ratelimit::SameBody> =
        tower::Layer::layer(&same, inner);
    let mut answers = Vec::new();
    for _ in 0..2 {
        let a = wrapped.clone().oneshot(request()).await.unwrap();
        let b: Response<http_body_util::Full<Bytes>> =
            same.clone().oneshot(request()).await.unwrap();
        assert_eq!(a.status(), b.status());
        assert_eq!(a.headers(), b.headers());
        let a = a.into_body().collect().await.unwrap().to_bytes();
        let b = b.into_body().collect().await.unwrap().to_bytes();
        assert_eq!(a, b);
        answers.push(b);
    }
    assert_eq!(answers[0], "inner");
    assert!(std::str::from_utf8(&answers[1]).unwrap().contains("429"));
    assert_eq!(calls.load(Ordering::SeqCst), 2);

    // A failing store, closed: the 503 is made into the inner type too.
    let store = BrokenStore::default();
    let closed = RateLimitLayer::new(rules(), store)
        .identify(Global)
        .fail_mode(FailMode::Closed)
        .same_body();
    let service = tower::Layer::layer(
        &closed,
        tower::service_fn(|_req: Request<()>| {
            ready(Ok::<_, std::convert::Infallible>(Response::new(
                Body::from("inner"),
            )))
        }),
    );
    let reply: Response<Body> = service.oneshot(request()).await.unwrap();
    assert_eq!(reply.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(reply.headers()["retry-after"], "1");
    assert!(!reply
        .into_body()
        .collect()
        .await
        .unwrap()
        .to_bytes()
        .is_empty());
}

#[tokio::test]
async fn spoofed_forwarding_headers_cannot_change_the_identity() {
    use tower_ratelimit::identity::ForwardedIp;
    let store = MemoryStore::new();
    let app = |peer: [u8; 4]| {
        Router::new()
            .fallback(|| async { "ok" })
            .layer(
                RateLimitLayer::new(rules(), store.clone())
                    .identify(ForwardedIp::new(["10.0.0.0/8"]).unwrap()),
            )
            .layer(MockConnectInfo(SocketAddr::from((peer, 4000))))
    };
    let with_xff = |xff: &str| {
        Request::builder()
            .uri("/a")
            .header("x-forwarded-for", xff)
            .body(Body::empty())
            .unwrap()
    };
    // A direct client cannot pick its budget by writing the header.
    let direct = app([203, 0, 113, 9]);
    assert_eq!(status(&direct, with_xff("1.1.1.1")).await.0, StatusCode::OK);
    assert_eq!(
        status(&direct, with_xff("2.2.2.2")).await.0,
        StatusCode::TOO_MANY_REQUESTS
    );
    assert_eq!(
        status(&direct, get("/a")).await.0,
        StatusCode::TOO_MANY_REQUESTS
    );
    // Behind the trusted proxy, only the hop the proxy appended counts.
    let proxied = app([10, 0, 0, 1]);
    assert_eq!(
        status(&proxied, with_xff("6.6.6.6, 198.51.100.7")).await.0,
        StatusCode::OK
    );
    assert_eq!(
        status(&proxied, with_xff("7.7.7.7, 198.51.100.7")).await.0,
        StatusCode::TOO_MANY_REQUESTS
    );
    assert_eq!(
        status(&proxied, with_xff("198.51.100.8")).await.0,
        StatusCode::OK
    );
}

/// Under `Router::nest`, a layer on the nested router sees the path with
/// the nest's prefix stripped (as the README says): its patterns are
/// written without it; a layer on the outer router sees the whole path.
#[tokio::test]
async fn a_layer_inside_a_nested_router_sees_the_nested_path() {
    let layer = |pattern: &str| {
        let rules = Rules::builder()
            .route(pattern, [Rule::new().minute(1)])
            .build()
            .unwrap();
        RateLimitLayer::new(rules, MemoryStore::new()).identify(Global)
    };
    let towns = || Router::new().route("/towns", axum::routing::get(|| async { "ok" }));
    let statuses = |router: Router| async move {
        let mut out = Vec::new();
        for _ in 0..2 {
            let request = Request::builder()
                .uri("/api/towns")
                .body(Body::empty())
                .unwrap();
            out.push(router.clone().oneshot(request).await.unwrap().status());
        }
        out
    };
    let limited = [StatusCode::OK, StatusCode::TOO_MANY_REQUESTS];
    let inside = Router::new().nest("/api", towns().layer(layer("^/towns")));
    assert_eq!(statuses(inside).await, limited);
    let inside_whole = Router::new().nest("/api", towns().layer(layer("^/api/towns")));
    assert_eq!(
        statuses(inside_whole).await,
        [StatusCode::OK, StatusCode::OK]
    );
    let outside = Router::new()
        .nest("/api", towns())
        .layer(layer("^/api/towns"));
    assert_eq!(statuses(outside).await, limited);
}

/// An inner service that counts its clones (the layer clones it to hold a
/// request it cannot decide at once) and answers "ok".
struct Counted {
    clones: Arc<AtomicUsize>,
}

impl Clone for Counted {
    fn clone(&self) -> Self {
        self.clones.fetch_add(1, Ordering::SeqCst);
        Counted {
            clones: self.clones.clone(),
        }
    }
}

impl tower::Service<Request<Body>> for Counted {
    type Response = Response<Body>;
    type Error = std::convert::Infallible;
    type Future = Ready<Result<Response<Body>, Self::Error>>;

    fn poll_ready(
        &mut self,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), Self::Error>> {
        std::task::Poll::Ready(Ok(()))
    }

    fn call(&mut self, _: Request<Body>) -> Self::Future {
        ready(Ok(Response::new(Body::from("ok"))))
    }
}

/// Three requests (users u, u, v) through `service`: their statuses.
async fn statuses_of<S, B>(mut service: S) -> Vec<StatusCode>
where
    S: tower::Service<Request<Body>, Response = Response<B>>,
    S::Error: std::fmt::Debug,
{
    let mut statuses = Vec::new();
    for name in ["u", "u", "v"] {
        let request = Request::get("/a")
            .header("x-user", name)
            .body(Body::empty())
            .unwrap();
        let response = service.ready().await.unwrap().call(request).await.unwrap();
        statuses.push(response.status());
    }
    statuses
}

/// `identity::immediate` decides a request at once, as the built-ins do:
/// the layer never holds it (no clone of the inner service), where a
/// closure returning a future, ready or not, is awaited with the request
/// held; both name the same users and budgets.
#[tokio::test]
async fn an_immediate_identity_is_decided_without_holding_the_request() {
    use tower::Layer;
    use tower_ratelimit::identity::{self, Identity};
    fn user(head: &http::request::Parts) -> Identity {
        let name = head
            .headers
            .get("x-user")
            .map_or(&b""[..], |v| v.as_bytes());
        Identity::new(name.to_vec())
    }
    for immediate in [true, false] {
        let clones = Arc::new(AtomicUsize::new(0));
        let inner = Counted {
            clones: clones.clone(),
        };
        // (A minute's budget: the requests' pace does not matter.)
        let rules = Rules::builder()
            .route("^/a", [Rule::new().minute(1)])
            .build()
            .unwrap();
        let layer = RateLimitLayer::new(rules, MemoryStore::new());
        let statuses = if immediate {
            statuses_of(
                layer
                    .identify(identity::immediate(|head| Ok(user(head))))
                    .layer(inner),
            )
            .await
        } else {
            let future = |head: &http::request::Parts| ready(Ok(user(head)));
            statuses_of(layer.identify(future).layer(inner)).await
        };
        assert_eq!(
            statuses,
            [
                StatusCode::OK,
                StatusCode::TOO_MANY_REQUESTS,
                StatusCode::OK
            ],
            "immediate {immediate}"
        );
        let expected = if immediate { 0 } else { 3 };
        assert_eq!(
            clones.load(Ordering::SeqCst),
            expected,
            "immediate {immediate}"
        );
    }
}

/// The response future of a request the memory store lets through stays
/// within 64 bytes of the inner service's own (every request moves it, at
/// least into the server's boxed future; at 96 bytes more, the layer's own
/// cost was 5-8% higher: benches/HISTORY.md, round 53).
#[tokio::test]
async fn the_response_future_stays_small() {
    use tower::{Layer, Service};
    type Reply = Ready<Result<Response<Body>, std::convert::Infallible>>;
    fn ok(_: Request<Body>) -> Reply {
        ready(Ok(Response::new(Body::empty())))
    }
    let inner = tower::service_fn(ok as fn(Request<Body>) -> Reply);
    let mut service = RateLimitLayer::new(rules(), MemoryStore::new())
        .same_body()
        .layer(inner);
    let future = service.call(Request::new(Body::empty()));
    let (size, inner) = (std::mem::size_of_val(&future), std::mem::size_of::<Reply>());
    assert!(
        size <= inner + 64,
        "the response future takes {size} bytes, the inner one {inner}"
    );
}
