//! Denied-request throughput on Redis with the local denial cache on and
//! off, interleaved in one run, through the whole layer (identity, rules,
//! store, 429). One hot budget that is always denied, 50 concurrent
//! workers, a throwaway `redis-server`.
//!
//! ```sh
//! cargo bench --bench denials            # PASSES=3 REQUESTS=20000
//! ```
#![allow(missing_docs)]

mod support;

use support::redis_server;

use std::convert::Infallible;
use std::future::ready;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use support::env;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::Full;
use redis_server::RedisServer;
use tower::{Service, ServiceExt};
use tower_ratelimit::identity::Global;
use tower_ratelimit::store::redis::RedisStore;
use tower_ratelimit::{RateLimitLayer, Rule, Rules};

async fn run<S>(service: S, requests: usize) -> f64
where
    S: Service<Request<()>, Response = Response<tower_ratelimit::RateLimitBody<Full<Bytes>>>>
        + Clone
        + Send
        + 'static,
    S::Future: Send,
    S::Error: std::fmt::Debug,
{
    let next = Arc::new(AtomicUsize::new(0));
    let started = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..50 {
        let service = service.clone();
        let next = next.clone();
        tasks.spawn(async move {
            while next.fetch_add(1, Ordering::Relaxed) < requests {
                let request = Request::builder().uri("/hot").body(()).unwrap();
                let response = service.clone().oneshot(request).await.unwrap();
                assert_eq!(response.status(), StatusCode::TOO_MANY_REQUESTS);
            }
        });
    }
    while tasks.join_next().await.is_some() {}
    requests as f64 / started.elapsed().as_secs_f64()
}

fn evalsha_calls(server: &RedisServer) -> f64 {
    support::commandstat(&server.cli(&["info", "commandstats"]), "evalsha", "calls")
}

#[tokio::main(flavor = "multi_thread")]
async fn main() {
    let passes = env("PASSES", 3);
    let requests = env("REQUESTS", 20_000);
    let server = RedisServer::start();
    let rules = Rules::builder()
        .route("^/hot", [Rule::new().hour(1)])
        .build()
        .unwrap();
    let store = RedisStore::builder()
        .url(server.url())
        .timeout(Duration::from_secs(5))
        .build()
        .await
        .unwrap();
    let inner = tower::service_fn(|_req: Request<()>| {
        ready(Ok::<_, Infallible>(Response::new(Full::new(
            Bytes::from_static(b"ok"),
        ))))
    });
    let layer = RateLimitLayer::new(rules, store).identify(Global);
    let cached = tower::ServiceBuilder::new()
        .layer(layer.clone())
        .service(inner);
    let uncached = tower::ServiceBuilder::new()
        .layer(layer.denial_cache(0))
        .service(inner);
    // Spend the budget (its one request), then warm up.
    let first = cached
        .clone()
        .oneshot(Request::builder().uri("/hot").body(()).unwrap())
        .await
        .unwrap();
    assert_eq!(first.status(), StatusCode::OK);
    run(cached.clone(), 1000).await;
    run(uncached.clone(), 1000).await;

    let mut with = Vec::new();
    let mut without = Vec::new();
    let mut calls = [0.0f64; 2];
    for _ in 0..passes {
        server.cli(&["config", "resetstat"]);
        with.push(run(cached.clone(), requests).await);
        calls[0] += evalsha_calls(&server);
        server.cli(&["config", "resetstat"]);
        without.push(run(uncached.clone(), requests).await);
        calls[1] += evalsha_calls(&server);
    }
    let median = |v: &mut Vec<f64>| support::median(v);
    let (with, without) = (median(&mut with), median(&mut without));
    let per = |c: f64| c / (passes * requests) as f64;
    println!("denied requests/s through the layer on Redis, 50 workers, median of {passes} passes of {requests}:");
    println!(
        "  denial cache on : {with:>9.0} req/s, {:.4} Redis calls per request",
        per(calls[0])
    );
    println!(
        "  denial cache off: {without:>9.0} req/s, {:.4} Redis calls per request",
        per(calls[1])
    );
    println!("  ratio           : {:.1}x", with / without);
}
