//! Micro-benchmarks: the memory store's check (the borrowed check the layer
//! makes: one hot budget, 100,000 budgets; 1 thread, and 2 threads on
//! distinct budgets, on one hot budget and on the 100,000); the whole layer on
//! the memory store (route matching, identity, check, headers), allowed,
//! denied and unmatched, with 10 and 100 routes (unmatched is route
//! matching alone), the routes plain prefixes or regular expressions; decision -> headers (the layer with its headers on,
//! less the layer with them off); and the Redis store's check, per
//! algorithm, on a throwaway `redis-server` the bench starts on a free port
//! (skipped with a note when `redis-server` is not on PATH), or on the
//! server `TOWER_RATELIMIT_BENCH_REDIS` names (e.g. `redis://127.0.0.1:6379`).
//!
//! ```sh
//! cargo bench --bench micro
//! ```
#![allow(missing_docs)]

mod support;

use std::convert::Infallible;
use std::future::ready;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};
use futures_util::FutureExt;
use http::{Request, Response};
use http_body_util::Full;
use tower::{Service, ServiceExt};
use tower_ratelimit::clock::{ManualClock, Timestamp};
use tower_ratelimit::identity::Global;
use tower_ratelimit::rules::MAX_LOG_LIMIT;
use tower_ratelimit::{
    Algorithm, Check, HeaderMode, MemoryStore, RateLimitLayer, Rule, Rules, Store, Window,
};

fn windows() -> Arc<[Window]> {
    [
        Window::new(Duration::from_secs(1), MAX_LOG_LIMIT).unwrap(),
        Window::new(Duration::from_secs(60), MAX_LOG_LIMIT).unwrap(),
        Window::new(Duration::from_secs(3600), MAX_LOG_LIMIT).unwrap(),
    ]
    .into()
}

/// A time for each check, a microsecond after the last: a check a
/// microsecond of the store's clock, as fast as the bench runs, so that a
/// sliding log never runs ahead of its clock (checks faster than one a
/// microsecond would take the microseconds after now, and fill any window
/// in the end) and every timed check passes.
struct Ticks(u64);

impl Ticks {
    fn new() -> Self {
        Ticks(1_767_225_600_000_000)
    }

    fn next(&mut self) -> Timestamp {
        self.0 += 1;
        Timestamp::from_micros(self.0)
    }
}

/// Checks `check` at the next tick; it must pass.
fn passes(store: &MemoryStore, check: &Check, ticks: &mut Ticks) {
    let mut check = check.as_ref();
    check.now = Some(ticks.next());
    let passed = matches!(store.check_now(&check), Some(Ok(d)) if d.allowed());
    assert!(passed, "a timed check was refused");
}

/// `iters` checks on each of two threads, on one clock both read: thread
/// `t` goes through `checks` from its own half on (one check: both on it).
/// Half the time taken: the two threads' time per check together.
fn two_threads(store: &MemoryStore, clock: &AtomicU64, checks: &[Check], iters: u64) -> Duration {
    let start = Instant::now();
    std::thread::scope(|s| {
        for t in 0..2 {
            s.spawn(move || {
                for i in 0..iters as usize {
                    let mut check = checks[(t * checks.len() / 2 + i) % checks.len()].as_ref();
                    check.now = Some(Timestamp::from_micros(
                        clock.fetch_add(1, Ordering::Relaxed),
                    ));
                    let passed = matches!(store.check_now(&check), Some(Ok(d)) if d.allowed());
                    assert!(passed, "a timed check was refused");
                }
            });
        }
    });
    start.elapsed() / 2
}

fn memory_store(c: &mut Criterion) {
    let mut group = c.benchmark_group("memory_check");
    let store = MemoryStore::new();
    // A tiny window keeps the hot budget's log short, as in steady state
    // (a thousand entries at a check a microsecond).
    let hot: Arc<[Window]> = [Window::new(Duration::from_millis(1), MAX_LOG_LIMIT).unwrap()].into();
    let alice = Check::new("r0123456789abcdef:alice", hot.clone());
    let mut ticks = Ticks::new();
    group.bench_function("hot_budget", |b| {
        b.iter(|| passes(&store, &alice, &mut ticks))
    });
    let budgets: Vec<Check> = (0..100_000)
        .map(|i| Check::new(format!("r0123456789abcdef:user{i}"), hot.clone()))
        .collect();
    let mut i = 0;
    group.bench_function("100k_budgets", |b| {
        b.iter(|| {
            i = (i + 1) % budgets.len();
            passes(&store, &budgets[i], &mut ticks)
        })
    });
    // (Each thread's clock goes on from where its last batch left it.)
    let mut clocks = [Ticks::new(), Ticks::new()];
    group.bench_function("2_threads_distinct_budgets", |b| {
        b.iter_custom(|iters| {
            let start = Instant::now();
            std::thread::scope(|s| {
                for (t, ticks) in clocks.iter_mut().enumerate() {
                    let store = store.clone();
                    let hot = hot.clone();
                    s.spawn(move || {
                        let check = Check::new(format!("r0123456789abcdef:thread{t}"), hot);
                        for _ in 0..iters {
                            passes(&store, &check, ticks);
                        }
                    });
                }
            });
            // (Each thread made `iters` checks: criterion divides by
            // `iters`, so half the time is the time per check of the two
            // threads together, their throughput, next to one thread's.)
            start.elapsed() / 2
        })
    });
    // Two threads on shared budgets, on one clock both read (a check a
    // microsecond between them, as `Ticks`): the hot budget both check,
    // its lock passed between the cores; and the 100,000 budgets, each
    // thread going through all of them from its own half.
    // (From past every tick the checks above took, so that no log's
    // clock goes back.)
    let after = ticks.0.max(clocks[0].0).max(clocks[1].0);
    let shared = AtomicU64::new(after + 1_000_000);
    let bob = [Check::new("r0123456789abcdef:bob", hot.clone())];
    group.bench_function("2_threads_hot_budget", |b| {
        b.iter_custom(|iters| two_threads(&store, &shared, &bob, iters))
    });
    group.bench_function("2_threads_100k_budgets", |b| {
        b.iter_custom(|iters| two_threads(&store, &shared, &budgets, iters))
    });
    group.finish();
}

/// `n` routes, the last `/hot`: plain prefixes (matched by comparing
/// them), or regular expressions (matched by the table's regex set).
fn rules(n: usize, limit: u32, regex: bool) -> Rules {
    let mut builder = Rules::builder();
    for i in 0..n - 1 {
        let pattern = match regex {
            false => format!("^/api/v{i}/"),
            true => format!("^/api/v{i}/[a-z]+"),
        };
        builder = builder.route(pattern, [Rule::new().second(limit)]);
    }
    builder
        .route(
            if regex { "^/ho+t" } else { "^/hot" },
            [Rule::new().second(limit).minute(limit).hour(limit)],
        )
        .build()
        .unwrap()
}

fn layer(c: &mut Criterion) {
    let mut group = c.benchmark_group("layer");
    for routes in [10, 100] {
        for (name, limit, path, regex) in [
            ("allowed", MAX_LOG_LIMIT, "/hot", false),
            ("denied", 1, "/hot", false),
            ("unmatched", 1, "/elsewhere", false),
            ("allowed_regex", MAX_LOG_LIMIT, "/hot", true),
            ("unmatched_regex", 1, "/elsewhere", true),
        ] {
            let inner = tower::service_fn(|_req: Request<()>| {
                ready(Ok::<_, Infallible>(Response::new(Full::new(
                    Bytes::from_static(b"ok"),
                ))))
            });
            // (4 ms of the layer's clock a request, so that its hour window of
            // MAX_LOG_LIMIT holds at most 900,000 and every allowed one
            // passes: see `Ticks`.)
            let clock = ManualClock::new(Ticks::new().next());
            let mut service = tower::ServiceBuilder::new()
                .layer(
                    RateLimitLayer::new(rules(routes, limit, regex), MemoryStore::new())
                        .identify(Global)
                        .clock(clock.clone()),
                )
                .service(inner);
            let status = match name {
                "denied" => 429,
                _ => 200,
            };
            // (A denied request records nothing: its clock stays, and its
            // hour's one stays spent.)
            let step = match name {
                "denied" => Duration::ZERO,
                _ => Duration::from_millis(4),
            };
            // (The first request of "denied" spends its one.)
            let request = Request::builder().uri(path).body(()).unwrap();
            let _ = service
                .ready()
                .now_or_never()
                .unwrap()
                .unwrap()
                .call(request)
                .now_or_never();
            group.bench_with_input(BenchmarkId::new(name, routes), &path, |b, path| {
                b.iter(|| {
                    clock.advance(step);
                    let request = Request::builder().uri(*path).body(()).unwrap();
                    let ready = service.ready().now_or_never().unwrap().unwrap();
                    let response = ready.call(request).now_or_never().unwrap().unwrap();
                    assert_eq!(response.status(), status, "{name}");
                    response
                })
            });
        }
    }
    group.finish();
}

/// Decision -> headers: the same allowed request through the layer with
/// its `X-RateLimit-*` headers on and off; the difference is what making
/// and adding the headers costs.
fn headers(c: &mut Criterion) {
    let mut group = c.benchmark_group("headers");
    for mode in [HeaderMode::X, HeaderMode::None, HeaderMode::Both] {
        let inner = tower::service_fn(|_req: Request<()>| {
            ready(Ok::<_, Infallible>(Response::new(Full::new(
                Bytes::from_static(b"ok"),
            ))))
        });
        let rules = Rules::builder()
            .route(
                "^/hot",
                [Rule::new().second(MAX_LOG_LIMIT).minute(MAX_LOG_LIMIT)],
            )
            .headers(mode)
            .build()
            .unwrap();
        let clock = ManualClock::new(Ticks::new().next());
        let mut service = tower::ServiceBuilder::new()
            .layer(
                RateLimitLayer::new(rules, MemoryStore::new())
                    .identify(Global)
                    .clock(clock.clone()),
            )
            .service(inner);
        let name = match mode {
            HeaderMode::X => "x_ratelimit",
            HeaderMode::None => "none",
            _ => "x_and_ietf",
        };
        // Limits that never deny; their numbers are large, the slower case
        // of formatting (small ones are static header values).
        group.bench_function(name, |b| {
            // (100 µs a request: its minute window of MAX_LOG_LIMIT holds at
            // most 600,000.)
            b.iter(|| {
                clock.advance(Duration::from_micros(100));
                let request = Request::builder().uri("/hot").body(()).unwrap();
                let ready = service.ready().now_or_never().unwrap().unwrap();
                let response = ready.call(request).now_or_never().unwrap().unwrap();
                assert_eq!(response.status(), 200);
                response
            })
        });
    }
    group.finish();
}

fn redis_store(c: &mut Criterion) {
    // (The throwaway server lives until the group is done.)
    let (url, _server) = match std::env::var("TOWER_RATELIMIT_BENCH_REDIS") {
        Ok(url) => (url, None),
        Err(_) => {
            let found = std::process::Command::new("redis-server")
                .arg("--version")
                .output()
                .is_ok_and(|o| o.status.success());
            if !found {
                eprintln!("redis_check_3_windows: skipped (no redis-server on PATH)");
                return;
            }
            let server = support::redis_server::RedisServer::start();
            (server.url(), Some(server))
        }
    };
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let store = runtime.block_on(async {
        tower_ratelimit::store::redis::RedisStore::builder()
            .url(url)
            .prefix("rl-bench")
            .timeout(Duration::from_secs(1))
            .build()
            .await
            .unwrap()
    });
    let windows = windows();
    let mut group = c.benchmark_group("redis_check_3_windows");
    for algorithm in [
        Algorithm::SlidingLog,
        Algorithm::SlidingWindow,
        Algorithm::FixedWindow,
        Algorithm::TokenBucket,
    ] {
        let checks: Vec<Check> = (0..10_000)
            .map(|i| {
                Check::new(format!("bench:user{i}"), windows.clone()).with_algorithm(algorithm)
            })
            .collect();
        let mut i = 0;
        group.bench_function(algorithm.as_str(), |b| {
            b.to_async(&runtime).iter(|| {
                i = (i + 1) % checks.len();
                let decided = store.check(checks[i].clone());
                // (A failed check would time an error, not a check.)
                async move { assert!(decided.await.is_ok(), "a check failed") }
            })
        });
    }
    group.finish();
}

criterion_group!(benches, memory_store, layer, headers, redis_store);
criterion_main!(benches);
