//! The middleware's own cost, without HTTP: requests straight through
//! `Service::call` of bare service, tower_governor and this crate on the
//! memory store (same key kind: the peer IP, four peers in turn; headers
//! on), and both keyed
//! by an `x-user` header over 1,000 users (`*-header`, ours with the
//! sliding log and with the token bucket, governor's algorithm), one thread,
//! interleaved passes, medians. What the load harness measures with the
//! whole HTTP stack around it, isolated here. Ours is built as the README
//! tells an axum service to build it (`same_body()`: the inner body type
//! on responses, as governor's). Each row also prints the size of its
//! response future, which every request moves. Every row's limit is out
//! of reach: an answer other than 200 stops the bench.
//!
//! ```sh
//! cargo bench --bench overhead          # PASSES=5 REQUESTS=300000 (ONLY=name: one row)
//! ONLY=ours-gcra valgrind --tool=callgrind target/release/deps/overhead-*  # instructions
//! ```
#![allow(missing_docs)]

mod support;

use std::convert::Infallible;
use std::future::ready;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Instant;
use support::env;

use axum::body::Body;
use axum::extract::ConnectInfo;
use futures_util::FutureExt;
use http::{Request, Response};
use tower::{Layer, Service, ServiceExt};
use tower_ratelimit::{Algorithm, MemoryStore, RateLimitLayer, Rule, Rules};

type Inner = tower::util::ServiceFn<
    fn(Request<Body>) -> std::future::Ready<Result<Response<Body>, Infallible>>,
>;

fn inner() -> Inner {
    fn ok(_: Request<Body>) -> std::future::Ready<Result<Response<Body>, Infallible>> {
        ready(Ok(Response::new(Body::empty())))
    }
    tower::service_fn(ok as fn(_) -> _)
}

/// Peers the requests come from in turn: one thread sends about two
/// million requests a second, and a sliding log records at most one a
/// microsecond per budget (its entries are distinct microseconds), so one
/// peer's budget would deny a third of them (and the row would time the
/// 429 path). Four peers keep every budget under its limit, for governor
/// and this crate alike.
const PEERS: u8 = 4;

/// Runs `n` requests through `service`; returns ns per request and the
/// size of its response future. Panics on an answer other than 200: every
/// row times requests let through.
fn drive<S, B>(service: &mut S, n: usize, users: bool) -> (f64, usize)
where
    S: Service<Request<Body>, Response = Response<B>>,
    S::Error: std::fmt::Debug,
{
    let peers: Vec<_> = (0..PEERS)
        .map(|p| ConnectInfo(SocketAddr::from(([10, 1, 2, p], 4000))))
        .collect();
    let names: Vec<http::HeaderValue> = (0..1000)
        .map(|i| http::HeaderValue::from_str(&format!("user-{i}")).unwrap())
        .collect();
    let mut bytes = 0;
    let started = Instant::now();
    for i in 0..n {
        let mut request = Request::new(Body::empty());
        *request.uri_mut() = http::Uri::from_static("/api/items");
        request.extensions_mut().insert(peers[i % peers.len()]);
        if users {
            request
                .headers_mut()
                .insert("x-user", names[i % names.len()].clone());
        }
        let ready = service.ready().now_or_never().unwrap().unwrap();
        let future = ready.call(request);
        bytes = std::mem::size_of_val(&future);
        let response = future.now_or_never().unwrap().unwrap();
        assert_eq!(response.status(), 200, "a row's limit was reached");
        std::hint::black_box(response);
    }
    (started.elapsed().as_nanos() as f64 / n as f64, bytes)
}

/// A named service to drive: runs n requests, returns ns per request and
/// the bytes of the service's response future (which every request moves,
/// at least once into the server's own boxed future).
type Runner = (&'static str, Box<dyn FnMut(usize) -> (f64, usize)>);

fn rules(algorithm: Algorithm) -> Rules {
    Rules::builder()
        .route(
            "^/api",
            // (A limit never reached, within what the algorithm counts.)
            [Rule::new()
                .second(match algorithm {
                    Algorithm::SlidingLog => tower_ratelimit::rules::MAX_LOG_LIMIT,
                    Algorithm::TokenBucket => 1_000_000,
                    _ => 1_000_000_000,
                })
                .algorithm(algorithm)],
        )
        .build()
        .unwrap()
}

fn ours(
    algorithm: Algorithm,
) -> impl Service<Request<Body>, Response = Response<Body>, Error = Infallible> {
    RateLimitLayer::new(rules(algorithm), MemoryStore::new())
        .same_body()
        .layer(inner())
}

/// Keyed by the `x-user` header (the crate's own header identity).
fn ours_header(
    algorithm: Algorithm,
) -> impl Service<Request<Body>, Response = Response<Body>, Error = Infallible> {
    let user = tower_ratelimit::identity::HeaderKey::new(http::HeaderName::from_static("x-user"));
    RateLimitLayer::new(rules(algorithm), MemoryStore::new())
        .same_body()
        .identify(user)
        .layer(inner())
}

/// tower_governor keyed by the `x-user` header's bytes (as the load
/// harness's `governor-header`).
#[derive(Clone)]
struct UserKey;

impl tower_governor::key_extractor::KeyExtractor for UserKey {
    type Key = Vec<u8>;

    fn extract<T>(&self, req: &Request<T>) -> Result<Vec<u8>, tower_governor::GovernorError> {
        req.headers()
            .get("x-user")
            .map(|v| v.as_bytes().to_vec())
            .ok_or(tower_governor::GovernorError::UnableToExtractKey)
    }
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
    services.push(("bare", Box::new(move |n| drive(&mut bare, n, false))));
    let mut bare_header = inner();
    services.push((
        "bare-header",
        Box::new(move |n| drive(&mut bare_header, n, true)),
    ));
    let mut governor = governor;
    services.push((
        "governor",
        Box::new(move |n| drive(&mut governor, n, false)),
    ));
    let mut sliding = ours(Algorithm::SlidingLog);
    services.push((
        "ours-sliding-log",
        Box::new(move |n| drive(&mut sliding, n, false)),
    ));
    let mut gcra = ours(Algorithm::TokenBucket);
    services.push(("ours-gcra", Box::new(move |n| drive(&mut gcra, n, false))));
    let mut governor_header = {
        use tower_governor::governor::GovernorConfigBuilder;
        use tower_governor::GovernorLayer;
        let mut builder = GovernorConfigBuilder::default()
            .use_headers()
            .key_extractor(UserKey);
        builder.per_nanosecond(1).burst_size(1_000_000);
        GovernorLayer::new(Arc::new(builder.finish().unwrap())).layer(inner())
    };
    services.push((
        "governor-header",
        Box::new(move |n| drive(&mut governor_header, n, true)),
    ));
    let mut header = ours_header(Algorithm::SlidingLog);
    services.push((
        "ours-header",
        Box::new(move |n| drive(&mut header, n, true)),
    ));
    let mut header_gcra = ours_header(Algorithm::TokenBucket);
    services.push((
        "ours-header-gcra",
        Box::new(move |n| drive(&mut header_gcra, n, true)),
    ));
    services.retain(|(name, _)| only.as_deref().is_none_or(|o| o == *name));

    let mut samples: Vec<Vec<f64>> = services.iter().map(|_| Vec::new()).collect();
    // (Warm-up, which tells each row's future size too.)
    let sizes: Vec<usize> = services
        .iter_mut()
        .map(|(_, run)| run(requests / 10).1)
        .collect();
    for _ in 0..passes {
        for (i, (_, run)) in services.iter_mut().enumerate() {
            samples[i].push(run(requests).0);
        }
    }
    let median = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let medians: Vec<f64> = samples.iter_mut().map(median).collect();
    let find = |name: &str| {
        services
            .iter()
            .position(|(n, _)| *n == name)
            .map(|i| medians[i])
    };
    // (The header-keyed rows against the bare service and governor
    // sent the same header.)
    let bases = |name: &str| {
        if name.contains("-header") {
            (find("bare-header"), find("governor-header"))
        } else {
            (find("bare"), find("governor"))
        }
    };
    println!("{passes} interleaved passes of {requests} requests, medians (one thread, no HTTP)");
    println!(
        "{:<18} {:>8} {:>12} {:>18} {:>14}",
        "service", "ns/req", "layer ns", "layer vs governor", "future bytes"
    );
    for (((name, _), ns), size) in services.iter().zip(&medians).zip(&sizes) {
        let (bare, governor) = bases(name);
        let layer = bare.map(|b| ns - b);
        let vs = match (layer, bare.zip(governor)) {
            (Some(l), Some((b, g))) if g > b => format!("{:.2}", l / (g - b)),
            _ => "—".to_owned(),
        };
        println!(
            "{name:<18} {ns:>8.0} {:>12} {vs:>18} {size:>14}",
            layer.map_or("—".to_owned(), |l| format!("{l:.0}"))
        );
    }
}
