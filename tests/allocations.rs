//! The memory path's allocation budget (issue 6, point 4), held by a test:
//! a counting global allocator (per thread, so tests running beside each
//! other do not count each other's) measures a request through the layer
//! on the memory store against the same request straight to the inner
//! service. `cargo bench --bench allocs` prints the full table, through
//! an axum router too (BENCHMARKS.md).
#![allow(missing_docs)]

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::convert::Infallible;
use std::future::{ready, Future};
use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
use futures_util::FutureExt;
use http::{Request, Response, StatusCode};
use http_body_util::Full;
use tower::{Service, ServiceExt};
use tower_ratelimit::clock::{ManualClock, Timestamp};
use tower_ratelimit::identity::ClientIp;
use tower_ratelimit::{HeaderMode, MemoryStore, RateLimitLayer, Rule, Rules};

struct Counting;

thread_local! {
    /// Allocations (and reallocations) made by this thread.
    static ALLOCATIONS: Cell<u64> = const { Cell::new(0) };
}

fn count() {
    // (`try_with`: a thread's allocations while its locals are torn down
    // are not counted.)
    let _ = ALLOCATIONS.try_with(|n| n.set(n.get() + 1));
}

// SAFETY: delegates to the system allocator; only counts calls.
#[allow(unsafe_code)]
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        count();
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new: usize) -> *mut u8 {
        count();
        unsafe { System.realloc(ptr, layout, new) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

fn allocations() -> u64 {
    ALLOCATIONS.with(Cell::get)
}

fn request(path: &str) -> Request<()> {
    let mut request = Request::builder().uri(path).body(()).unwrap();
    request
        .extensions_mut()
        .insert(SocketAddr::from(([10, 1, 2, 3], 4000)));
    request
}

fn inner() -> impl Service<
    Request<()>,
    Response = Response<Full<Bytes>>,
    Error = Infallible,
    Future = impl Future<Output = Result<Response<Full<Bytes>>, Infallible>> + Send,
> + Clone {
    tower::service_fn(|_req: Request<()>| {
        ready(Ok::<_, Infallible>(Response::new(Full::new(
            Bytes::from_static(b"ok"),
        ))))
    })
}

/// Allocations per request to `path` through the layer (`rule` on `^/api`,
/// the peer IP as identity, a request a millisecond of a manual clock),
/// beyond the same request straight to the inner service; every answer
/// must have `status`.
fn layer_allocations(rule: Rule, headers: HeaderMode, path: &str, status: StatusCode) -> f64 {
    const ROUNDS: u64 = 2_000;
    let rules = Rules::builder()
        .route("^/api", [rule])
        .headers(headers)
        .build()
        .unwrap();
    let clock = ManualClock::new(Timestamp::from_micros(1_767_225_600_000_000));
    let mut service = tower::ServiceBuilder::new()
        .layer(
            RateLimitLayer::new(rules, MemoryStore::new())
                .clock(clock.clone())
                .identify(ClientIp),
        )
        .service(inner());
    let mut bare = inner();
    let mut through = |n: u64, expect: Option<StatusCode>| {
        let before = allocations();
        for _ in 0..n {
            clock.advance(Duration::from_millis(1));
            let ready = service.ready().now_or_never().unwrap().unwrap();
            let response = ready.call(request(path)).now_or_never().unwrap().unwrap();
            if let Some(status) = expect {
                assert_eq!(response.status(), status);
            }
        }
        allocations() - before
    };
    // Warm up: the budget exists (and, to be denied, is spent), the
    // tables have grown.
    through(1_000, None);
    let layered = through(ROUNDS, Some(status));
    let before = allocations();
    for _ in 0..ROUNDS {
        let ready = bare.ready().now_or_never().unwrap().unwrap();
        let response = ready.call(request(path)).now_or_never().unwrap().unwrap();
        assert_eq!(response.status(), StatusCode::OK);
    }
    let direct = allocations() - before;
    (layered as f64 - direct as f64) / ROUNDS as f64
}

fn three_windows(limit: u32) -> Rule {
    Rule::new()
        .second(limit)
        .minute(limit * 60)
        .hour(limit * 100)
}

/// `measured` allocations per request are `budget`: the store's upkeep
/// allocates now and then (a few thousandths of an allocation per request
/// here); one more per request is a whole one.
fn within(name: &str, measured: f64, budget: u32) {
    let budget = f64::from(budget);
    assert!(
        (budget..budget + 0.01).contains(&measured),
        "{name}: {measured} allocations per request, the budget is {budget}"
    );
}

#[test]
fn the_memory_path_allocates_only_what_the_http_types_force() {
    // An unmatched path: nothing at all.
    let unmatched = layer_allocations(three_windows(1000), HeaderMode::X, "/other", StatusCode::OK);
    within("unmatched", unmatched, 0);
    // Allowed without headers: nothing (the route, identity, key, check
    // and decision live on the stack and in the store's table).
    let bare = layer_allocations(
        three_windows(1000),
        HeaderMode::None,
        "/api",
        StatusCode::OK,
    );
    within("allowed, no headers", bare, 0);
    // Allowed with the X-RateLimit-* headers: the response's header map,
    // empty until then, allocates its table (indices and entries); the
    // values themselves are static (limits precomputed per rule, small
    // numbers from a static table).
    let allowed = layer_allocations(three_windows(1000), HeaderMode::X, "/api", StatusCode::OK);
    within("allowed", allowed, 2);
    // Denied by the store: the layer's own 429, its header map and body,
    // and nothing more than an allowed answer needs beside them.
    let denied = layer_allocations(
        Rule::new().second(1000).hour(1),
        HeaderMode::X,
        "/api",
        StatusCode::TOO_MANY_REQUESTS,
    );
    within("denied", denied, 2);
}
