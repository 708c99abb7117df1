//! The memory a store's check touches that the check before it did not
//! leave in the cache: the stores of the memory path in the load harness's
//! pattern, with the rest of a server's work stood in for between checks.
//!
//! ```sh
//! bash benches/instructions/cold.sh      # counts it under cachegrind
//! cargo bench --bench cold -- log        # runs one store, timed (noisy)
//! ```
//!
//! 1,000 users take turns (one check each, 6 µs apart on an injected
//! clock: 160 checks a second per user, as in the load harness's fast
//! phase), against one window of 1 s whose limit is never reached. Between
//! two checks the bench streams through 8 KB of a 64 MB buffer, standing in
//! for the kernel's and hyper's work on a request: by a user's next turn
//! the core's 512 KB L2 holds none of that user's lines, as in a real
//! server. `cold.sh` counts, under cachegrind, the instructions and the
//! last-level (512 KB) data misses per check, less the stream's own.
//!
//! Arguments: `STORE [PATTERN]`. STORE is `log` (this crate's sliding log),
//! `gcra` (this crate's token bucket), `governor` (governor's keyed GCRA on
//! its DashMap, as tower_governor runs it) or `none` (the stream alone).
//! PATTERN is `bursts` (the load harness's: 0.5 s of traffic, then 8 s
//! idle, three times: each user's log grows through a burst and has left
//! its window by the next) or `steady` (6 s without a pause: after the
//! first second, every check drops an entry as it adds one).
#![allow(missing_docs)]

use std::num::NonZeroU32;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tower_ratelimit::clock::{ManualClock, Timestamp};
use tower_ratelimit::{Algorithm, Check, MemoryStore, Store, Window};

const USERS: u64 = 1000;
const STEP_MICROS: u64 = 6;
const STREAM_BYTES: usize = 8 * 1024;

enum Limiter {
    /// This crate's store, and a check to copy (the budget and time are
    /// set per check).
    Ours(MemoryStore, Check),
    Governor(
        governor::RateLimiter<
            Vec<u8>,
            governor::state::keyed::DashMapStateStore<Vec<u8>>,
            governor::clock::FakeRelativeClock,
            governor::middleware::NoOpMiddleware<governor::nanos::Nanos>,
        >,
        governor::clock::FakeRelativeClock,
    ),
    None,
}

/// Writes `prefix` and the user's number into `key`, as a layer makes a
/// request's key from its header: in memory the request itself just
/// touched (not a per-user copy the check would find cold).
fn user_key<'k>(key: &'k mut String, prefix: &str, user: u64) -> &'k str {
    key.clear();
    key.push_str(prefix);
    let mut digits = [b'0'; 20];
    let mut n = user;
    let mut i = digits.len();
    loop {
        i -= 1;
        digits[i] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    for &d in &digits[i..] {
        key.push(char::from(d));
    }
    key
}

impl Limiter {
    fn new(store: &str) -> Limiter {
        let ours = |algorithm| {
            let windows: Arc<[Window]> =
                [Window::new(Duration::from_secs(1), 1_000_000).expect("a window")].into();
            let store = MemoryStore::with_clock(ManualClock::new(Timestamp::from_micros(1)));
            Limiter::Ours(store, Check::new("", windows).with_algorithm(algorithm))
        };
        match store {
            "log" => ours(Algorithm::SlidingLog),
            "gcra" => ours(Algorithm::TokenBucket),
            "governor" => {
                // The load harness's quota: one cell a nanosecond, a burst
                // of a million.
                let quota = governor::Quota::with_period(Duration::from_nanos(1))
                    .expect("a period")
                    .allow_burst(NonZeroU32::new(1_000_000).expect("non-zero"));
                let clock = governor::clock::FakeRelativeClock::default();
                let limiter = governor::RateLimiter::dashmap_with_clock(quota, clock.clone());
                Limiter::Governor(limiter, clock)
            }
            _ => Limiter::None,
        }
    }

    /// One check of `user` at `now` (µs), its key made in `key`; whether it
    /// was allowed.
    fn check(&self, key: &mut String, user: u64, now: u64) -> bool {
        match self {
            Limiter::Ours(store, template) => {
                // Budgets as the layer names them: the route's id, then the
                // user, borrowed as the layer lends them.
                let mut check = template.as_ref();
                check.budget = user_key(key, "r0123456789abcdef:u", user);
                check.now = Some(Timestamp::from_micros(now));
                matches!(store.check_now(&check), Some(Ok(d)) if d.allowed())
            }
            Limiter::Governor(limiter, _) => {
                // (tower_governor's header key is the value's bytes.)
                let key = user_key(key, "u", user).as_bytes().to_vec();
                limiter.check_key(&key).is_ok()
            }
            Limiter::None => {
                user_key(key, "u", user);
                true
            }
        }
    }

    fn advance(&self, micros: u64) {
        if let Limiter::Governor(_, clock) = self {
            clock.advance(Duration::from_micros(micros));
        }
    }
}

fn main() {
    let args: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| a != "--bench")
        .collect();
    let store = args.first().map_or("log", String::as_str);
    let steady = args.get(1).is_some_and(|p| p == "steady");
    let limiter = Limiter::new(store);
    // (bursts: 80 checks per user in 0.5 s, then 8 s idle, three times;
    // steady: 1,000 checks per user, 6 s.)
    let (rounds, per_user, idle) = if steady {
        (1, 1000, 0)
    } else {
        (3, 80, 8_000_000)
    };
    let mut stream = vec![0u8; 64 << 20];
    let mut at = 0usize;
    let mut now = 1_767_225_600_000_000u64;
    let mut allowed = 0u64;
    let mut key = String::with_capacity(64);
    let started = Instant::now();
    for _ in 0..rounds {
        for k in 0..per_user * USERS {
            for i in (0..STREAM_BYTES).step_by(64) {
                let j = (at + i) % stream.len();
                stream[j] = stream[j].wrapping_add(1);
            }
            at = (at + STREAM_BYTES) % stream.len();
            allowed += u64::from(limiter.check(&mut key, k % USERS, now));
            now += STEP_MICROS;
            limiter.advance(STEP_MICROS);
        }
        now += idle;
        limiter.advance(idle);
    }
    let checks = rounds * per_user * USERS;
    // (What is counted is checks that pass, not refusals.)
    assert_eq!(allowed, checks, "{store}: checks refused");
    println!(
        "{store} {}: {checks} checks, {allowed} allowed, {} ns per check and stream",
        if steady { "steady" } else { "bursts" },
        started.elapsed().as_nanos() / u128::from(checks)
    );
}
