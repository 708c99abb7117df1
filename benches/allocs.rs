//! Allocations per request on the memory path, counted by a global
//! allocator: allowed, denied (from the store and from the denial cache),
//! and unmatched, through the whole layer with the peer-IP identity; then
//! through an axum router, with the layer's own body type and with
//! `same_body()`. Then per check on Redis (its own `redis-server`): the
//! store's, against one `EVALSHA` made by hand on the same kind of
//! connection (what redis-rs itself allocates).
//!
//! ```sh
//! cargo bench --bench allocs
//! ```
#![allow(missing_docs)]

mod support;

use std::alloc::{GlobalAlloc, Layout, System};
use std::convert::Infallible;
use std::future::ready;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};

use bytes::Bytes;
use futures_util::FutureExt;
use http::{Request, Response};
use http_body_util::Full;
use tower::{Service, ServiceExt};
use tower_ratelimit::clock::{ManualClock, Timestamp};
use tower_ratelimit::identity::{self, ClientIp, Identify, Identity};
use tower_ratelimit::store::redis::{script_args, straight_lua, RedisStore};
use tower_ratelimit::{
    Algorithm, Check, HeaderMode, MemoryStore, RateLimitLayer, Rule, Rules, Store, Window,
};

struct Counting;

static ALLOCS: AtomicU64 = AtomicU64::new(0);

// SAFETY: delegates to the system allocator; only counts calls.
#[allow(unsafe_code)]
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        ALLOCS.fetch_add(1, Ordering::Relaxed);
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new: usize) -> *mut u8 {
        ALLOCS.fetch_add(1, Ordering::Relaxed);
        unsafe { System.realloc(ptr, layout, new) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

/// A 3-window rule: `limit` per second, 60× per minute, 3600× per hour (at
/// most MAX_LOG_LIMIT)
/// (at one request per millisecond, 1,000 per second is always allowed).
fn per_request(limit: u32, path: &str, cache: usize, rounds: u64) -> f64 {
    per_request_with(three_windows(limit), HeaderMode::X, path, cache, rounds)
}

fn three_windows(limit: u32) -> Rule {
    // (A sliding log's window allows at most MAX_LOG_LIMIT.)
    Rule::new()
        .second(limit)
        .minute(limit * 60)
        .hour((limit * 3600).min(tower_ratelimit::rules::MAX_LOG_LIMIT))
}

/// A store that answers later, as Redis does (a memory store's decision,
/// ready at the first poll, never at once): the layer consults its denial
/// cache for it, and caches its denials. (The memory store decides at
/// once, and never comes near the cache.)
struct Later(MemoryStore);

impl Store for Later {
    type Future = <MemoryStore as Store>::Future;

    fn check(&self, check: Check) -> Self::Future {
        self.0.check(check)
    }
}

fn per_request_with(rule: Rule, headers: HeaderMode, path: &str, cache: usize, rounds: u64) -> f64 {
    per_request_identified(rule, headers, path, cache, rounds, ClientIp)
}

/// [`per_request_with`] on [`Later`]: a denied request (after the first,
/// cached) answered from the denial cache.
fn per_request_cached(rounds: u64) -> f64 {
    per_request_on(
        Later(MemoryStore::new()),
        (three_windows(1), HeaderMode::X, "/api", 1000),
        rounds,
        ClientIp,
    )
}

/// [`per_request_with`] with the identity `identity`.
fn per_request_identified(
    rule: Rule,
    headers: HeaderMode,
    path: &str,
    cache: usize,
    rounds: u64,
    identity: impl Identify,
) -> f64 {
    per_request_on(
        MemoryStore::new(),
        (rule, headers, path, cache),
        rounds,
        identity,
    )
}

/// [`per_request_identified`] on `store`.
fn per_request_on(
    store: impl Store,
    (rule, headers, path, cache): (Rule, HeaderMode, &str, usize),
    rounds: u64,
    identity: impl Identify,
) -> f64 {
    let rules = Rules::builder()
        .route("^/api", [rule])
        .headers(headers)
        .build()
        .unwrap();
    let inner = tower::service_fn(|_req: Request<()>| {
        ready(Ok::<_, Infallible>(Response::new(Full::new(
            Bytes::from_static(b"ok"),
        ))))
    });
    // One request per millisecond of a manual clock: a steady state.
    let clock = ManualClock::new(Timestamp::from_micros(1_767_225_600_000_000));
    let mut service = tower::ServiceBuilder::new()
        .layer(
            RateLimitLayer::new(rules, store)
                .denial_cache(cache)
                .clock(clock.clone())
                .identify(identity),
        )
        .service(inner);
    let mut run = |n: u64| {
        for _ in 0..n {
            clock.advance(std::time::Duration::from_millis(1));
            let mut request = Request::builder().uri(path).body(()).unwrap();
            request
                .extensions_mut()
                .insert(SocketAddr::from(([10, 1, 2, 3], 4000)));
            let ready = service.ready().now_or_never().unwrap().unwrap();
            let response = ready.call(request).now_or_never().unwrap().unwrap();
            drop(response);
        }
    };
    // Warm up (the budget exists, tables have grown, header values cached).
    run(1000);
    let before = ALLOCS.load(Ordering::Relaxed);
    run(rounds);
    (ALLOCS.load(Ordering::Relaxed) - before) as f64 / rounds as f64
}

fn baseline(rounds: u64) -> f64 {
    // What building the request itself costs, to subtract.
    let before = ALLOCS.load(Ordering::Relaxed);
    for _ in 0..rounds {
        let mut request = Request::builder().uri("/api").body(()).unwrap();
        request
            .extensions_mut()
            .insert(SocketAddr::from(([10, 1, 2, 3], 4000)));
        drop(request);
    }
    (ALLOCS.load(Ordering::Relaxed) - before) as f64 / rounds as f64
}

/// What wraps the router in [`through_axum`].
#[derive(Clone, Copy)]
enum Wrap {
    Bare,
    /// A layer that does nothing (`MapRequestLayer` with the identity):
    /// what axum charges any layer.
    Noop,
    Governor,
    Ours,
    OursSameBody,
    OursNoHeaders,
}

/// Allocations per request through an axum router answering "ok", bare or
/// with a layer (a quota that always allows), beyond building the request.
fn through_axum(wrap: Wrap, rounds: u64) -> f64 {
    use axum::{body::Body, extract::ConnectInfo, routing::get, Router};
    use std::sync::Arc;
    use tower_governor::{governor::GovernorConfigBuilder, GovernorLayer};
    let router = Router::new().route("/api", get(|| async { "ok" }));
    let rules = || {
        Rules::builder()
            .route("^/api", [Rule::new().second(1_000_000)])
            .build()
            .unwrap()
    };
    // (`with_state` turns the handlers into routes once, with the layer
    // applied, as `axum::serve` does: without it axum would apply the
    // layer again on every request.)
    let mut router: Router = match wrap {
        Wrap::Bare => router,
        Wrap::Noop => router.layer(tower::util::MapRequestLayer::new(|r: Request<Body>| r)),
        Wrap::Governor => {
            let mut config = GovernorConfigBuilder::default().use_headers();
            config.per_nanosecond(1).burst_size(1_000_000);
            router.layer(GovernorLayer::new(Arc::new(config.finish().unwrap())))
        }
        Wrap::Ours => router.layer(RateLimitLayer::new(rules(), MemoryStore::new())),
        Wrap::OursSameBody => {
            router.layer(RateLimitLayer::new(rules(), MemoryStore::new()).same_body())
        }
        Wrap::OursNoHeaders => router.layer(
            RateLimitLayer::new(rules(), MemoryStore::new())
                .same_body()
                .headers(HeaderMode::None),
        ),
    }
    .with_state(());
    let request = || {
        let mut request = Request::builder().uri("/api").body(Body::empty()).unwrap();
        request
            .extensions_mut()
            .insert(ConnectInfo(SocketAddr::from(([10, 1, 2, 3], 4000))));
        request
    };
    let mut run = |n: u64| {
        for _ in 0..n {
            let request = request();
            let ready = <Router as ServiceExt<Request<Body>>>::ready(&mut router)
                .now_or_never()
                .unwrap()
                .unwrap();
            let response = ready.call(request).now_or_never().unwrap().unwrap();
            assert_eq!(response.status(), 200);
            drop(response);
        }
    };
    run(1000);
    let before = ALLOCS.load(Ordering::Relaxed);
    run(rounds);
    let served = (ALLOCS.load(Ordering::Relaxed) - before) as f64 / rounds as f64;
    let before = ALLOCS.load(Ordering::Relaxed);
    for _ in 0..rounds {
        drop(request());
    }
    served - (ALLOCS.load(Ordering::Relaxed) - before) as f64 / rounds as f64
}

/// Allocations per check on Redis, one at a time on a current-thread
/// runtime, 3 windows of a limit no check reaches, 1,000 users: through
/// the store, and as one `EVALSHA` of the same script on a bare
/// multiplexed connection (the load harness's ceiling), per algorithm.
fn on_redis(rounds: u64) {
    let server = support::redis_server::RedisServer::start();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let windows: Vec<Window> = [1, 60, 3600]
        .map(|s| {
            Window::new(
                std::time::Duration::from_secs(s),
                tower_ratelimit::rules::MAX_LOG_LIMIT,
            )
            .unwrap()
        })
        .to_vec();
    println!("allocations per check on Redis (3 windows, allowed), the whole round trip:");
    println!(
        "  {:<16} {:>8} {:>14} {:>12}",
        "algorithm", "store", "12 at once", "by hand"
    );
    runtime.block_on(async {
        let store = RedisStore::builder()
            .url(server.url())
            .build()
            .await
            .unwrap();
        let client = redis::Client::open(server.url()).unwrap();
        let mut conn = client.get_multiplexed_async_connection().await.unwrap();
        for algorithm in [
            Algorithm::SlidingLog,
            Algorithm::SlidingWindow,
            Algorithm::FixedWindow,
            Algorithm::TokenBucket,
        ] {
            let checks: Vec<Check> = (0..1000)
                .map(|u| Check::new(format!("r0:u{u}"), windows.clone()).with_algorithm(algorithm))
                .collect();
            let through_store = async |n: u64| {
                for i in 0..n {
                    let check = checks[i as usize % checks.len()].clone();
                    assert!(store.check(check).await.unwrap().allowed());
                }
            };
            through_store(2000).await;
            let before = ALLOCS.load(Ordering::Relaxed);
            through_store(rounds).await;
            let ours = (ALLOCS.load(Ordering::Relaxed) - before) as f64 / rounds as f64;
            // (12 at once, as the load harness's batches are: one call of
            // the batch script.)
            let in_batches = async |n: u64| {
                for i in 0..n / 12 {
                    let batch = (0..12)
                        .map(|j| store.check(checks[(i * 12 + j) as usize % checks.len()].clone()));
                    for decision in futures_util::future::join_all(batch).await {
                        assert!(decision.unwrap().allowed());
                    }
                }
            };
            in_batches(2400).await;
            let before = ALLOCS.load(Ordering::Relaxed);
            in_batches(rounds).await;
            let batched =
                (ALLOCS.load(Ordering::Relaxed) - before) as f64 / (rounds / 12 * 12) as f64;
            let script = redis::Script::new(&straight_lua(algorithm, 3).unwrap());
            let args = script_args(&checks[0]);
            let keys: Vec<String> = (0..1000)
                .map(|u| format!("hand:{{u{u}}}:{algorithm:?}"))
                .collect();
            let mut by_hand = async |n: u64| {
                for i in 0..n {
                    let mut call = script.key(&keys[i as usize % keys.len()]);
                    call.arg(&args[..]);
                    let reply: Vec<u8> = call.invoke_async(&mut conn).await.unwrap();
                    // (Replies are packed little-endian doubles. Allowed:
                    // a counter script's first number is 1; the sliding
                    // log's allowed reply is 4 numbers long, or 12 on its
                    // usual path: what it wrote.)
                    match algorithm {
                        Algorithm::SlidingLog => assert!(matches!(reply.len(), 32 | 96)),
                        _ => {
                            let first = reply.first_chunk::<8>().copied().unwrap_or_default();
                            assert_eq!(f64::from_le_bytes(first), 1.0);
                        }
                    }
                }
            };
            by_hand(2000).await;
            let before = ALLOCS.load(Ordering::Relaxed);
            by_hand(rounds).await;
            let hand = (ALLOCS.load(Ordering::Relaxed) - before) as f64 / rounds as f64;
            println!(
                "  {:<16} {ours:>8.1} {batched:>14.1} {hand:>12.1}",
                format!("{algorithm:?}")
            );
        }
    });
}

fn main() {
    let rounds = 100_000;
    let base = baseline(rounds);
    println!("allocations per request through the layer (memory store, peer-IP identity),");
    println!("beyond the {base:.1} that building the request itself costs:");
    let rows = [
        ("unmatched path", per_request(1000, "/other", 0, rounds)),
        ("allowed", per_request(1000, "/api", 0, rounds)),
        (
            "allowed, no headers",
            per_request_with(
                Rule::new().second(1000),
                HeaderMode::None,
                "/api",
                0,
                rounds,
            ),
        ),
        (
            "allowed, token bucket",
            per_request_with(
                Rule::new().second(1000).algorithm(Algorithm::TokenBucket),
                HeaderMode::X,
                "/api",
                0,
                rounds,
            ),
        ),
        (
            "allowed, identity::immediate",
            per_request_identified(
                Rule::new().second(1000),
                HeaderMode::X,
                "/api",
                0,
                rounds,
                identity::immediate(|_| Ok(Identity::from_slice(b"user"))),
            ),
        ),
        (
            "allowed, a closure's future",
            per_request_identified(
                Rule::new().second(1000),
                HeaderMode::X,
                "/api",
                0,
                rounds,
                |_: &http::request::Parts| ready(Ok(Identity::from_slice(b"user"))),
            ),
        ),
        ("denied by the store", per_request(1, "/api", 0, rounds)),
        ("denied from the denial cache", per_request_cached(rounds)),
    ];
    for (name, allocs) in rows {
        println!("  {name:<30} {:>5.1}", allocs - base);
    }
    println!(
        "allocations per allowed request through an axum router, beyond building the request:"
    );
    let bare = through_axum(Wrap::Bare, rounds);
    println!("  {:<36} {bare:>5.1}", "bare router");
    for (name, wrap) in [
        ("a layer that does nothing", Wrap::Noop),
        ("tower_governor (headers on)", Wrap::Governor),
        ("this crate", Wrap::Ours),
        ("this crate, same_body()", Wrap::OursSameBody),
        ("this crate, same_body(), no headers", Wrap::OursNoHeaders),
    ] {
        let allocs = through_axum(wrap, rounds);
        println!("  {name:<36} {allocs:>5.1} ({:+.1})", allocs - bare);
    }
    on_redis(20_000);
}
