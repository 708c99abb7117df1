//! Load harness for the Redis store's connection shapes and script shapes.
//!
//! Starts its own throwaway `redis-server` on a free port, then runs, in
//! interleaved passes, 50 concurrent workers doing checks through:
//!
//! - `multiplexed`: `RedisStore` on one multiplexed connection (the default);
//! - `pool16`: `RedisStore` on a deadpool-redis pool of 16 (it keeps one
//!   connection checked out and multiplexes every check on it);
//! - `pool-get`: the same script by hand through that pool with a
//!   `pool.get()` per check (what the store would pay checking out per
//!   check: the pool's `UNWATCH` + `PING` each time);
//! - `conn-manager`: the same script over redis-rs' `ConnectionManager`;
//! - `raw-multiplex`: the same script called by hand over a bare
//!   `MultiplexedConnection` (the ceiling: no store around it);
//! - `per-window`: the baseline script with one sorted set per window, over
//!   a multiplexed connection (what one shared set per budget saves);
//! - `steady`: `RedisStore` again, with windows of 1, 5 and 20 ms over 10
//!   users, so that every window slides at every check, as in steady
//!   traffic (the other shapes' 1 s window barely slides within a pass):
//!   what the packed log's searches for the windows' new starts cost.
//!
//! It reports checks/s (median of the passes), the ratio to `multiplexed`,
//! and Redis-side `usec_per_call` of EVALSHA and commands per check.
//!
//! ```sh
//! cargo bench --bench redis_load            # PASSES=3 CHECKS=20000 by default
//! ```
#![allow(missing_docs)]

mod support;

use support::redis_server;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use support::env;

use redis_server::RedisServer;
use tower_ratelimit::store::redis::{script_args, straight_lua, RedisStore};
use tower_ratelimit::{Algorithm, Check, Store, Window};

const WORKERS: usize = 50;
const USERS: usize = 1000;

fn windows() -> Arc<[Window]> {
    [
        Window::new(Duration::from_secs(1), 1_000_000).unwrap(),
        Window::new(Duration::from_secs(60), 1_000_000).unwrap(),
        Window::new(Duration::from_secs(3600), 1_000_000).unwrap(),
    ]
    .into()
}

#[derive(Clone)]
enum Shape {
    Store(RedisStore),
    Manager(redis::aio::ConnectionManager, Arc<redis::Script>),
    Raw(redis::aio::MultiplexedConnection, Arc<redis::Script>),
    PoolGet(deadpool_redis::Pool, Arc<redis::Script>),
    PerWindow(redis::aio::MultiplexedConnection, Arc<redis::Script>),
    Steady(RedisStore, Arc<[Window]>),
}

impl Shape {
    async fn check(&mut self, user: usize, windows: &Arc<[Window]>) {
        match self {
            Shape::Store(store) => {
                let d = store
                    .check(Check::new(format!("rbench:u{user}"), windows.clone()))
                    .await;
                assert!(d.is_ok(), "{d:?}");
            }
            Shape::Manager(conn, script) => {
                assert_eq!(sliding_log(conn, script, "mgr", user, windows).await, 1);
            }
            Shape::Raw(conn, script) => {
                assert_eq!(sliding_log(conn, script, "raw", user, windows).await, 1);
            }
            Shape::PoolGet(pool, script) => {
                let mut conn = pool.get().await.unwrap();
                assert_eq!(sliding_log(&mut conn, script, "pg", user, windows).await, 1);
            }
            Shape::Steady(store, steady) => {
                let d = store
                    .check(Check::new(format!("steady:u{}", user % 10), steady.clone()))
                    .await;
                assert!(d.is_ok_and(|d| d.allowed()));
            }
            Shape::PerWindow(conn, script) => {
                let mut inv = script.prepare_invoke();
                for i in 0..windows.len() {
                    inv.key(format!("pw:{{u{user}}}:{i}"));
                }
                inv.arg("").arg(1);
                for w in windows.iter() {
                    inv.arg(w.micros()).arg(w.limit());
                }
                let r: i64 = inv.invoke_async(conn).await.unwrap();
                assert_eq!(r, 1);
            }
        }
    }
}

/// The sliding-log script called by hand: what the store does, minus the
/// store (no deadline, no boxing, no reconnect logic).
async fn sliding_log(
    conn: &mut impl redis::aio::ConnectionLike,
    script: &redis::Script,
    prefix: &str,
    user: usize,
    windows: &[Window],
) -> i64 {
    // The store's layout (scripts/straight_prelude.lua): the state key
    // alone (no block time), then the packed numbers (TIME, cost 1, no
    // block, the windows, their fingerprint).
    let args = script_args(&Check::new("-", windows.to_vec()));
    let mut inv = script.key(format!("{prefix}:{{u{user}}}:l"));
    inv.arg(args);
    // (The reply is packed little-endian doubles: 4 when the script allowed
    // the check, or 12 on its usual allowed path (what it wrote: the new
    // entry and the log's trailer), 7 when not.)
    let r: Vec<u8> = inv.invoke_async(conn).await.unwrap();
    i64::from(matches!(r.len(), 32 | 96))
}

async fn run(shape: &Shape, checks: usize) -> f64 {
    let next = Arc::new(AtomicUsize::new(0));
    let windows = windows();
    let started = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..WORKERS {
        let mut shape = shape.clone();
        let next = next.clone();
        let windows = windows.clone();
        tasks.spawn(async move {
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= checks {
                    break;
                }
                shape.check(i % USERS, &windows).await;
            }
        });
    }
    while tasks.join_next().await.is_some() {}
    checks as f64 / started.elapsed().as_secs_f64()
}

#[tokio::main(flavor = "multi_thread")]
async fn main() {
    // `cargo bench` passes --bench; nothing else is expected.
    let passes = env("PASSES", 3);
    let checks = env("CHECKS", 20_000);
    let server = RedisServer::start();
    let url = server.url();
    let client = redis::Client::open(url.as_str()).unwrap();
    // A store on its own multiplexed connection, its keys under `prefix`.
    let store = async |prefix: &str| {
        RedisStore::builder()
            .url(&url)
            .prefix(prefix)
            .timeout(Duration::from_secs(5))
            .build()
            .await
            .unwrap()
    };
    let multiplexed = store("mx").await;
    let pool = deadpool_redis::Config::from_url(&url)
        .builder()
        .unwrap()
        .max_size(16)
        .runtime(deadpool_redis::Runtime::Tokio1)
        .build()
        .unwrap();
    let pooled = RedisStore::builder()
        .pool(pool.clone())
        .prefix("pl")
        .timeout(Duration::from_secs(5))
        .build()
        .await
        .unwrap();
    let manager = redis::aio::ConnectionManager::new(client.clone())
        .await
        .unwrap();
    let per_window_conn = client.get_multiplexed_async_connection().await.unwrap();
    let steady_store = store("st").await;
    let steady: Arc<[Window]> = [1, 5, 20]
        .map(|ms| Window::new(Duration::from_millis(ms), 1_000_000).unwrap())
        .into();
    // The script the store runs for a 3-window sliding-log check.
    let sliding_log = straight_lua(Algorithm::SlidingLog, 3).unwrap_or_default();
    let shapes = [
        ("multiplexed", Shape::Store(multiplexed)),
        ("pool16", Shape::Store(pooled)),
        (
            "pool-get",
            Shape::PoolGet(pool, Arc::new(redis::Script::new(&sliding_log))),
        ),
        (
            "conn-manager",
            Shape::Manager(manager, Arc::new(redis::Script::new(&sliding_log))),
        ),
        (
            "raw-multiplex",
            Shape::Raw(
                client.get_multiplexed_async_connection().await.unwrap(),
                Arc::new(redis::Script::new(&sliding_log)),
            ),
        ),
        (
            "per-window",
            Shape::PerWindow(
                per_window_conn,
                Arc::new(redis::Script::new(include_str!(
                    "../scripts/per_window_baseline.lua"
                ))),
            ),
        ),
        ("steady", Shape::Steady(steady_store, steady)),
    ];
    let mut rates: Vec<Vec<f64>> = vec![Vec::new(); shapes.len()];
    let mut usec: Vec<Vec<f64>> = vec![Vec::new(); shapes.len()];
    let mut per_check: Vec<Vec<f64>> = vec![Vec::new(); shapes.len()];
    let mut client_cmds: Vec<Vec<f64>> = vec![Vec::new(); shapes.len()];
    // Warm up every shape (scripts loaded, connections made).
    for (_, shape) in &shapes {
        run(shape, 2_000).await;
    }
    for _ in 0..passes {
        for (i, (_, shape)) in shapes.iter().enumerate() {
            server.cli(&["config", "resetstat"]);
            rates[i].push(run(shape, checks).await);
            let info = server.cli(&["info", "commandstats"]);
            usec[i].push(support::commandstat(&info, "evalsha", "usec_per_call"));
            let evalsha = support::commandstat(&info, "evalsha", "calls");
            // Script-internal commands are counted by Redis too; what the
            // client sent is EVALSHA plus everything that is not called from
            // a script (PING, UNWATCH, SCRIPT LOAD...).
            let internal = support::total_calls(&info)
                - evalsha
                - support::commandstat(&info, "ping", "calls")
                - support::commandstat(&info, "unwatch", "calls");
            client_cmds[i].push((support::total_calls(&info) - internal) / checks as f64);
            per_check[i].push(internal / checks as f64);
        }
    }
    let median = |v: &mut Vec<f64>| support::median(v);
    let base = median(&mut rates[0].clone());
    println!(
        "{checks} checks x {passes} passes, {WORKERS} concurrent workers, 3-window sliding log"
    );
    println!(
        "{:<14} {:>10} {:>8} {:>16} {:>18} {:>16}",
        "shape", "checks/s", "ratio", "evalsha us/call", "client cmds/check", "in-script cmds"
    );
    for (i, (name, _)) in shapes.iter().enumerate() {
        let rate = median(&mut rates[i]);
        println!(
            "{:<14} {:>10.0} {:>8.2} {:>16.1} {:>18.2} {:>16.2}",
            name,
            rate,
            rate / base,
            median(&mut usec[i]),
            median(&mut client_cmds[i]),
            median(&mut per_check[i])
        );
    }
}
