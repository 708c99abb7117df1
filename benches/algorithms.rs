//! The algorithms' trade-offs, measured in one run against a throwaway
//! `redis-server`:
//!
//! 1. Redis memory per budget (`MEMORY USAGE`) with one window filled to its
//!    limit, at limits 10, 1,000 and 100,000;
//! 2. accuracy: the most requests any algorithm lets through in one sliding
//!    span of the window, as a multiple of the limit, under random traffic
//!    and under a burst timed at a window boundary (memory store, manual
//!    clock: exact and repeatable);
//! 3. check throughput on Redis (multiplexed connection, 50 concurrent
//!    workers, 3 windows), with Redis' own µs per EVALSHA.
//!
//! ```sh
//! cargo bench --bench algorithms       # PASSES=3 CHECKS=20000 by default
//! ```
#![allow(missing_docs)]

mod support;

use support::redis_server;

use std::collections::VecDeque;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use support::env;

use futures_util::FutureExt;
use redis_server::RedisServer;
use tower_ratelimit::clock::Timestamp;
use tower_ratelimit::store::redis::RedisStore;
use tower_ratelimit::{Algorithm, Check, MemoryStore, Store, Window};

const ALGORITHMS: [Algorithm; 4] = [
    Algorithm::SlidingLog,
    Algorithm::SlidingWindow,
    Algorithm::FixedWindow,
    Algorithm::TokenBucket,
];

fn check(budget: &str, windows: &Arc<[Window]>, algorithm: Algorithm) -> Check {
    let mut check = Check::new(budget, windows.clone());
    check.algorithm = algorithm;
    check
}

async fn memory_usage(server: &RedisServer, store: &RedisStore) -> Vec<(Algorithm, [u64; 3])> {
    let mut rows = Vec::new();
    for algorithm in ALGORITHMS {
        let mut bytes = [0u64; 3];
        for (i, limit) in [10u32, 1_000, 100_000].into_iter().enumerate() {
            let windows: Arc<[Window]> =
                [Window::new(Duration::from_secs(3600), limit).unwrap()].into();
            let budget = format!("mem:{}:{limit}", algorithm.as_str());
            // Fill the window to its limit, one request at a time for small
            // limits, in chunks for large ones.
            let chunk = (limit / 100).max(1);
            let mut spent = 0;
            while spent < limit {
                let c = check(&budget, &windows, algorithm).with_cost(chunk.min(limit - spent));
                let d = store.check(c).await.unwrap();
                assert!(d.allowed());
                spent += chunk.min(limit - spent);
            }
            let [key, ..] = store.keys(&check(&budget, &windows, algorithm));
            bytes[i] = server
                .cli(&["memory", "usage", &key, "samples", "0"])
                .parse()
                .unwrap_or(0);
        }
        rows.push((algorithm, bytes));
    }
    rows
}

/// The most allowed requests in any span of `window`, over the limit.
fn worst_span(allowed: &[u64], window: u64, limit: u32) -> f64 {
    let mut span: VecDeque<u64> = VecDeque::new();
    let mut worst = 0;
    for &t in allowed {
        span.push_back(t);
        while span.front().is_some_and(|&f| f + window <= t) {
            span.pop_front();
        }
        worst = worst.max(span.len());
    }
    worst as f64 / f64::from(limit)
}

fn accuracy(algorithm: Algorithm) -> (f64, f64) {
    let limit = 100u32;
    let window = 60_000_000u64;
    let windows: Arc<[Window]> =
        [Window::new(Duration::from_micros(window), limit).unwrap()].into();
    let start = 1_767_225_600_000_000u64;
    // Random traffic at three times the limit for an hour (xorshift: the
    // same sequence every run).
    let store = MemoryStore::new();
    let mut allowed = Vec::new();
    let mut seed = 0x9e37_79b9_7f4a_7c15u64;
    let mut t = start;
    let mean_gap = window / (3 * u64::from(limit));
    while t < start + 3600 * 1_000_000 {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        t += seed % (2 * mean_gap);
        let c = check("random", &windows, algorithm).at(Timestamp::from_micros(t));
        if store.check(c).now_or_never().unwrap().unwrap().allowed() {
            allowed.push(t);
        }
    }
    let random = worst_span(&allowed, window, limit);
    // A burst: the whole limit just before a window boundary, then as much
    // as it allows just after.
    let store = MemoryStore::new();
    let mut allowed = Vec::new();
    let boundary = start + 10 * window;
    // One attempt per microsecond for the last millisecond before the
    // boundary, then one per millisecond for half a window.
    let before = boundary - 1000..boundary;
    let after = (boundary..boundary + window / 2).step_by(1000);
    for t in before.chain(after) {
        let c = check("burst", &windows, algorithm).at(Timestamp::from_micros(t));
        if store.check(c).now_or_never().unwrap().unwrap().allowed() {
            allowed.push(t);
        }
    }
    (random, worst_span(&allowed, window, limit))
}

async fn throughput(store: &RedisStore, algorithm: Algorithm, checks: usize) -> f64 {
    let windows: Arc<[Window]> = [
        Window::new(Duration::from_secs(1), 1_000_000).unwrap(),
        Window::new(Duration::from_secs(60), 1_000_000).unwrap(),
        Window::new(Duration::from_secs(3600), 1_000_000).unwrap(),
    ]
    .into();
    let next = Arc::new(AtomicUsize::new(0));
    let started = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..50 {
        let store = store.clone();
        let next = next.clone();
        let windows = windows.clone();
        tasks.spawn(async move {
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= checks {
                    break;
                }
                let c = check(&format!("tp:{}", i % 1000), &windows, algorithm);
                assert!(store.check(c).await.unwrap().allowed());
            }
        });
    }
    while tasks.join_next().await.is_some() {}
    checks as f64 / started.elapsed().as_secs_f64()
}

fn usec_per_evalsha(server: &RedisServer) -> f64 {
    support::commandstat(
        &server.cli(&["info", "commandstats"]),
        "evalsha",
        "usec_per_call",
    )
}

#[tokio::main(flavor = "multi_thread")]
async fn main() {
    let passes = env("PASSES", 3);
    let checks = env("CHECKS", 20_000);
    let server = RedisServer::start();
    let store = RedisStore::builder()
        .url(server.url())
        .prefix("alg")
        .timeout(Duration::from_secs(5))
        .build()
        .await
        .unwrap();

    println!("Redis memory per budget, one window filled to its limit (MEMORY USAGE, bytes):");
    println!(
        "{:<16} {:>10} {:>10} {:>12}",
        "algorithm", "10", "1,000", "100,000"
    );
    for (algorithm, bytes) in memory_usage(&server, &store).await {
        println!(
            "{:<16} {:>10} {:>10} {:>12}",
            algorithm.as_str(),
            bytes[0],
            bytes[1],
            bytes[2]
        );
    }

    println!("\nMost allowed in one sliding span of the window, x limit (100/min):");
    println!(
        "{:<16} {:>16} {:>22}",
        "algorithm", "random 3x load", "burst at a boundary"
    );
    for algorithm in ALGORITHMS {
        let (random, burst) = accuracy(algorithm);
        println!(
            "{:<16} {:>16.2} {:>22.2}",
            algorithm.as_str(),
            random,
            burst
        );
    }

    let mut rates = vec![Vec::new(); ALGORITHMS.len()];
    let mut usec = vec![Vec::new(); ALGORITHMS.len()];
    for algorithm in ALGORITHMS {
        throughput(&store, algorithm, 2_000).await;
    }
    for _ in 0..passes {
        for (i, algorithm) in ALGORITHMS.into_iter().enumerate() {
            server.cli(&["config", "resetstat"]);
            rates[i].push(throughput(&store, algorithm, checks).await);
            usec[i].push(usec_per_evalsha(&server));
        }
    }
    let median = |v: &mut Vec<f64>| support::median(v);
    let base = median(&mut rates[0].clone());
    println!("\nRedis checks/s, 3 windows, 50 workers, median of {passes} interleaved passes of {checks}:");
    println!(
        "{:<16} {:>10} {:>18} {:>16}",
        "algorithm", "checks/s", "vs sliding-log", "us per EVALSHA"
    );
    for (i, algorithm) in ALGORITHMS.into_iter().enumerate() {
        let rate = median(&mut rates[i]);
        println!(
            "{:<16} {:>10.0} {:>18.2} {:>16.1}",
            algorithm.as_str(),
            rate,
            rate / base,
            median(&mut usec[i])
        );
    }
}
