//! Micro-benchmarks: the memory store's check, and the whole layer on the
//! memory store (route matching, identity, check, headers), allowed,
//! denied and unmatched, with 10 and 100 routes. Set
//! `TOWER_RATELIMIT_BENCH_REDIS=redis://127.0.0.1:6379` to add the Redis
//! store's check.
//!
//! ```sh
//! cargo bench --bench micro
//! ```
#![allow(missing_docs)]

use std::convert::Infallible;
use std::future::ready;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};
use futures_util::FutureExt;
use http::{Request, Response};
use http_body_util::Full;
use tower::{Service, ServiceExt};
use tower_ratelimit::identity::Global;
use tower_ratelimit::{Check, MemoryStore, RateLimitLayer, Rule, Rules, Store, Window};

fn windows() -> Arc<[Window]> {
    [
        Window::new(Duration::from_secs(1), u32::MAX).unwrap(),
        Window::new(Duration::from_secs(60), u32::MAX).unwrap(),
        Window::new(Duration::from_secs(3600), u32::MAX).unwrap(),
    ]
    .into()
}

fn memory_store(c: &mut Criterion) {
    let mut group = c.benchmark_group("memory_check");
    let store = MemoryStore::new();
    // A tiny window keeps the hot budget's log short, as in steady state.
    let hot: Arc<[Window]> = [Window::new(Duration::from_millis(1), u32::MAX).unwrap()].into();
    group.bench_function("hot_budget", |b| {
        b.iter(|| {
            store
                .check(Check::new("r0123456789abcdef:alice", hot.clone()))
                .now_or_never()
        })
    });
    let budgets: Vec<String> = (0..100_000)
        .map(|i| format!("r0123456789abcdef:user{i}"))
        .collect();
    let mut i = 0;
    group.bench_function("100k_budgets", |b| {
        b.iter(|| {
            i = (i + 1) % budgets.len();
            store
                .check(Check::new(budgets[i].as_str(), hot.clone()))
                .now_or_never()
        })
    });
    group.bench_function("2_threads_distinct_budgets", |b| {
        b.iter_custom(|iters| {
            let start = Instant::now();
            std::thread::scope(|s| {
                for t in 0..2 {
                    let store = store.clone();
                    let hot = hot.clone();
                    s.spawn(move || {
                        let budget = format!("r0123456789abcdef:thread{t}");
                        for _ in 0..iters {
                            let _ = store
                                .check(Check::new(budget.as_str(), hot.clone()))
                                .now_or_never();
                        }
                    });
                }
            });
            start.elapsed() / 2
        })
    });
    group.finish();
}

fn rules(n: usize, limit: u32) -> Rules {
    let mut builder = Rules::builder();
    for i in 0..n - 1 {
        builder = builder.route(format!("^/api/v{i}/"), [Rule::new().second(limit)]);
    }
    builder
        .route(
            "^/hot",
            [Rule::new().second(limit).minute(limit).hour(limit)],
        )
        .build()
        .unwrap()
}

fn layer(c: &mut Criterion) {
    let mut group = c.benchmark_group("layer");
    for routes in [10, 100] {
        for (name, limit, path) in [
            ("allowed", u32::MAX, "/hot"),
            ("denied", 1, "/hot"),
            ("unmatched", 1, "/elsewhere"),
        ] {
            let inner = tower::service_fn(|_req: Request<()>| {
                ready(Ok::<_, Infallible>(Response::new(Full::new(
                    Bytes::from_static(b"ok"),
                ))))
            });
            let mut service = tower::ServiceBuilder::new()
                .layer(
                    RateLimitLayer::new(rules(routes, limit), MemoryStore::new()).identify(Global),
                )
                .service(inner);
            group.bench_with_input(BenchmarkId::new(name, routes), &path, |b, path| {
                b.iter(|| {
                    let request = Request::builder().uri(*path).body(()).unwrap();
                    let ready = service.ready().now_or_never().unwrap().unwrap();
                    ready.call(request).now_or_never().unwrap().unwrap()
                })
            });
        }
    }
    group.finish();
}

fn redis_store(c: &mut Criterion) {
    let Ok(url) = std::env::var("TOWER_RATELIMIT_BENCH_REDIS") else {
        return;
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
    let users: Vec<String> = (0..10_000).map(|i| format!("bench:user{i}")).collect();
    let mut i = 0;
    c.bench_function("redis_check/sliding_log_3_windows", |b| {
        b.to_async(&runtime).iter(|| {
            i = (i + 1) % users.len();
            store.check(Check::new(users[i].as_str(), windows.clone()))
        })
    });
}

criterion_group!(benches, memory_store, layer, redis_store);
criterion_main!(benches);
