//! The slowest check while a memory store grows: `BUDGETS` new users
//! (default 1,000,000), one check each, every check timed alone. A table
//! that grows in one go moves all of its entries inside the one check
//! that fills it, with its shard locked; this store's tables move theirs a
//! step at a time (`src/store/memory.rs`, "Memory").
//!
//! Scenarios, interleaved over `PASSES` (default 3), each on a fresh
//! store: this crate's sliding log (`log`) and token bucket (`gcra`);
//! governor's keyed GCRA on its DashMap, as tower_governor runs it
//! (`governor`); and, the baseline of growing in one go, as this store
//! did before its tables moved step by step: hashbrown maps of 128-byte
//! values (and a boxed key), as many as this store's shards (`one-go`); and the machine's
//! own hiccups, the same loop timing no check (`none`: a virtual machine's
//! slowest moment over a few seconds is often milliseconds). It prints,
//! per scenario,
//! the medians over the passes of the slowest check, the 99.99th
//! percentile, the checks slower than 100 µs and the whole run, and the
//! ratios of the slowest checks against ours.
//!
//! ```sh
//! cargo bench --bench growth                 # BUDGETS=1000000 PASSES=3
//! ```
#![allow(missing_docs)]

mod support;

use std::num::NonZeroU32;
use std::sync::Arc;
use std::time::{Duration, Instant};
use support::env;

use tower_ratelimit::clock::{ManualClock, Timestamp};
use tower_ratelimit::{Algorithm, Check, MemoryStore, Store, Window};

type Governor = governor::RateLimiter<
    Vec<u8>,
    governor::state::keyed::DashMapStateStore<Vec<u8>>,
    governor::clock::FakeRelativeClock,
    governor::middleware::NoOpMiddleware<governor::nanos::Nanos>,
>;

/// One of the stores a pass grows.
enum Grown {
    Ours(MemoryStore, Check),
    Governor(Governor, governor::clock::FakeRelativeClock),
    OneGo(Vec<hashbrown::HashMap<Box<str>, [u64; 16]>>),
    None,
}

impl Grown {
    fn new(name: &str) -> Self {
        let ours = |algorithm| {
            let windows: Arc<[Window]> =
                [Window::new(Duration::from_secs(3600), 1_000).expect("a window")].into();
            let store = MemoryStore::with_clock(ManualClock::new(Timestamp::from_micros(1)));
            Grown::Ours(store, Check::new("", windows).with_algorithm(algorithm))
        };
        match name {
            "log" => ours(Algorithm::SlidingLog),
            "gcra" => ours(Algorithm::TokenBucket),
            "governor" => {
                let quota = governor::Quota::per_hour(NonZeroU32::new(1_000).expect("non-zero"));
                let clock = governor::clock::FakeRelativeClock::default();
                Grown::Governor(
                    governor::RateLimiter::dashmap_with_clock(quota, clock.clone()),
                    clock,
                )
            }
            "none" => Grown::None,
            _ => {
                // (This store's shard count.)
                let threads = std::thread::available_parallelism().map_or(4, usize::from);
                let shards = (threads * 8).next_power_of_two().clamp(16, 1024);
                Grown::OneGo((0..shards).map(|_| hashbrown::HashMap::new()).collect())
            }
        }
    }

    /// One check of a new user at `now` (µs); whether it was allowed.
    fn check(&mut self, user: &str, now: u64) -> bool {
        match self {
            Grown::Ours(store, template) => {
                let mut check = template.as_ref();
                check.budget = user;
                check.now = Some(Timestamp::from_micros(now));
                matches!(store.check_now(&check), Some(Ok(d)) if d.allowed())
            }
            Grown::Governor(limiter, clock) => {
                clock.advance(Duration::from_micros(1));
                limiter.check_key(&user.as_bytes().to_vec()).is_ok()
            }
            Grown::OneGo(maps) => {
                use std::hash::BuildHasher;
                let hash = hashbrown::DefaultHashBuilder::default().hash_one(user);
                let shard = (hash >> 40) as usize % maps.len();
                maps[shard].insert(user.into(), [now; 16]).is_none()
            }
            Grown::None => std::hint::black_box(user).len() > 1,
        }
    }
}

struct Pass {
    slowest: Duration,
    p9999: Duration,
    over_100us: usize,
    total: Duration,
}

fn pass(name: &str, budgets: usize) -> Pass {
    let mut grown = Grown::new(name);
    let mut times = Vec::with_capacity(budgets);
    let mut user = String::new();
    let started = Instant::now();
    for n in 0..budgets {
        user.clear();
        user.push_str("r0123456789abcdef:u");
        user.push_str(itoa::Buffer::new().format(n));
        let t = Instant::now();
        let allowed = grown.check(&user, 1 + n as u64);
        times.push(t.elapsed());
        assert!(allowed, "{name}: a new user is allowed");
    }
    let total = started.elapsed();
    drop(grown);
    let over_100us = times
        .iter()
        .filter(|t| **t > Duration::from_micros(100))
        .count();
    times.sort_unstable();
    Pass {
        slowest: times.last().copied().unwrap_or_default(),
        p9999: times[times.len() * 9999 / 10000],
        over_100us,
        total,
    }
}

fn median(mut values: Vec<Duration>) -> Duration {
    values.sort_unstable();
    values[values.len() / 2]
}

fn main() {
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    let budgets = env("BUDGETS", 1_000_000);
    let passes = env("PASSES", 3);
    let names = ["log", "gcra", "governor", "one-go", "none"];
    let mut results: Vec<Vec<Pass>> = names.iter().map(|_| Vec::new()).collect();
    for p in 0..passes {
        // (Odd passes in reverse order.)
        let order: Vec<usize> = if p % 2 == 0 {
            (0..names.len()).collect()
        } else {
            (0..names.len()).rev().collect()
        };
        for i in order {
            results[i].push(pass(names[i], budgets));
        }
    }
    println!("{budgets} new users, one check each; medians of {passes} passes");
    println!("| scenario | slowest check | 99.99th pct | checks over 100 µs | whole run |");
    println!("|---|---|---|---|---|");
    let mut slowest = Vec::new();
    for (name, passes) in names.iter().zip(&results) {
        let m = |f: fn(&Pass) -> Duration| median(passes.iter().map(f).collect());
        let over = {
            let mut v: Vec<usize> = passes.iter().map(|p| p.over_100us).collect();
            v.sort_unstable();
            v[v.len() / 2]
        };
        slowest.push(m(|p| p.slowest));
        println!(
            "| {name} | {:.2} ms | {:.1} µs | {over} | {:.2} s |",
            m(|p| p.slowest).as_secs_f64() * 1e3,
            m(|p| p.p9999).as_secs_f64() * 1e6,
            m(|p| p.total).as_secs_f64(),
        );
    }
    let ratio = |a: Duration, b: Duration| a.as_secs_f64() / b.as_secs_f64().max(1e-9);
    println!(
        "slowest check against ours (sliding log / token bucket): governor {:.1}× / {:.1}×, one-go {:.1}× / {:.1}×",
        ratio(slowest[2], slowest[0]),
        ratio(slowest[2], slowest[1]),
        ratio(slowest[3], slowest[0]),
        ratio(slowest[3], slowest[1]),
    );
}
