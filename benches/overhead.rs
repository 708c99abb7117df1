//! The middleware's own cost, without HTTP: requests straight through
//! `Service::call` of bare service, tower_governor and this crate on the
//! memory store (same key kind: the peer IP; headers on), one thread,
//! interleaved passes, medians. What the load harness measures with the
//! whole HTTP stack around it, isolated here.
//!
//! ```sh
//! cargo bench --bench overhead          # PASSES=5 REQUESTS=300000
//! ONLY=ours-gcra valgrind --tool=callgrind target/release/deps/overhead-*  # instructions
//! ```
#![allow(missing_docs)]

use std::convert::Infallible;
use std::future::ready;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Instant;

use axum::body::Body;
use axum::extract::ConnectInfo;
use futures_util::FutureExt;
use http::{Request, Response};
use tower::{Layer, Service, ServiceExt};
use tower_ratelimit::{Algorithm, MemoryStore, RateLimitLayer, Rule, Rules};

fn env(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

type Inner = tower::util::ServiceFn<
    fn(Request<Body>) -> std::future::Ready<Result<Response<Body>, Infallible>>,
>;

fn inner() -> Inner {
    fn ok(_: Request<Body>) -> std::future::Ready<Result<Response<Body>, Infallible>> {
        ready(Ok(Response::new(Body::empty())))
    }
    tower::service_fn(ok as fn(_) -> _)
}

/// Runs `n` requests through `service`; returns ns per request.
fn drive<S>(service: &mut S, n: usize) -> f64
where
    S: Service<Request<Body>>,
    S::Error: std::fmt::Debug,
{
    let peer = ConnectInfo(SocketAddr::from(([10, 1, 2, 3], 4000)));
    let started = Instant::now();
    for _ in 0..n {
        let mut request = Request::new(Body::empty());
        *request.uri_mut() = http::Uri::from_static("/api/items");
        request.extensions_mut().insert(peer);
        let ready = service.ready().now_or_never().unwrap().unwrap();
        let response = ready.call(request).now_or_never().unwrap().unwrap();
        std::hint::black_box(response);
    }
    started.elapsed().as_nanos() as f64 / n as f64
}

/// A named service to drive: runs n requests, returns ns per request.
type Runner = (&'static str, Box<dyn FnMut(usize) -> f64>);

fn ours(algorithm: Algorithm) -> impl Service<Request<Body>, Error = Infallible> {
    let rules = Rules::builder()
        .route(
            "^/api",
            [Rule::new().second(1_000_000_000).algorithm(algorithm)],
        )
        .build()
        .unwrap();
    RateLimitLayer::new(rules, MemoryStore::new()).layer(inner())
}

fn main() {
    let passes = env("PASSES", 5);
    let requests = env("REQUESTS", 300_000);
    let only = std::env::var("ONLY").ok();
    let governor = {
        use tower_governor::governor::GovernorConfigBuilder;
        use tower_governor::GovernorLayer;
        let mut builder = GovernorConfigBuilder::default().use_headers();
        builder.per_nanosecond(1).burst_size(1_000_000);
        GovernorLayer::new(Arc::new(builder.finish().unwrap())).layer(inner())
    };
    let mut services: Vec<Runner> = Vec::new();
    let mut bare = inner();
    services.push(("bare", Box::new(move |n| drive(&mut bare, n))));
    let mut governor = governor;
    services.push(("governor", Box::new(move |n| drive(&mut governor, n))));
    let mut sliding = ours(Algorithm::SlidingLog);
    services.push((
        "ours-sliding-log",
        Box::new(move |n| drive(&mut sliding, n)),
    ));
    let mut gcra = ours(Algorithm::TokenBucket);
    services.push(("ours-gcra", Box::new(move |n| drive(&mut gcra, n))));
    services.retain(|(name, _)| only.as_deref().is_none_or(|o| o == *name));

    let mut samples: Vec<Vec<f64>> = services.iter().map(|_| Vec::new()).collect();
    for (_, run) in &mut services {
        run(requests / 10); // warm up
    }
    for _ in 0..passes {
        for (i, (_, run)) in services.iter_mut().enumerate() {
            samples[i].push(run(requests));
        }
    }
    let median = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let medians: Vec<f64> = samples.iter_mut().map(median).collect();
    let bare = services
        .iter()
        .position(|(n, _)| *n == "bare")
        .map(|i| medians[i]);
    let governor = services
        .iter()
        .position(|(n, _)| *n == "governor")
        .map(|i| medians[i]);
    println!("{passes} interleaved passes of {requests} requests, medians (one thread, no HTTP)");
    println!(
        "{:<18} {:>8} {:>12} {:>16}",
        "service", "ns/req", "layer ns", "layer vs governor"
    );
    for ((name, _), ns) in services.iter().zip(&medians) {
        let layer = bare.map(|b| ns - b);
        let vs = match (layer, bare.zip(governor)) {
            (Some(l), Some((b, g))) if g > b => format!("{:.2}", l / (g - b)),
            _ => "—".to_owned(),
        };
        println!(
            "{name:<18} {ns:>8.0} {:>12} {vs:>16}",
            layer.map_or("—".to_owned(), |l| format!("{l:.0}"))
        );
    }
}
