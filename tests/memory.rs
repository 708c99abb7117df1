//! The conformance suite on the in-memory store, and its own properties.

mod support;

use http::StatusCode;
use support::App;
use tower_ratelimit::{MemoryStore, Rule, Rules};

conformance_suite!(async { tower_ratelimit::MemoryStore::new() });

#[tokio::test]
async fn unmatched_and_unlimited_requests_never_touch_the_store() {
    let store = MemoryStore::new();
    let rules = Rules::builder()
        .route(
            "^/towns",
            [Rule::group("default").second(1), Rule::group("admin")],
        )
        .build()
        .unwrap();
    let app = App::new(rules, store.clone());
    for _ in 0..10 {
        assert_eq!(app.get("/elsewhere", "u").await.status, StatusCode::OK);
        assert_eq!(
            app.get_as("/towns", "a", "admin").await.status,
            StatusCode::OK
        );
        assert_eq!(
            app.get_as("/towns", "g", "guest").await.status,
            StatusCode::OK
        );
    }
    assert!(store.is_empty());
    app.get("/towns", "u").await;
    assert_eq!(store.len(), 1);
}

/// A model test of the store's growth: one store takes every check of
/// thousands of users (its tables grow, move a step at a time, sweep and
/// shrink as time jumps), and each user's checks also go to a store of its
/// own, which never holds more than a few budgets; at the same instants,
/// every decision must be the same, to the microsecond. (An outside model
/// test of this kind found a shrink that never ended.)
#[test]
fn a_growing_store_decides_as_a_store_of_one_user() {
    use futures_util::FutureExt;
    use std::time::Duration;
    use tower_ratelimit::clock::{Clock, ManualClock, Timestamp};
    use tower_ratelimit::{Adjustment, Algorithm, Check, Store, Window};

    let clock = ManualClock::new(Timestamp::from_micros(1_767_225_600_000_000));
    let shared = MemoryStore::with_clock(clock.clone());
    let mut alone: Vec<MemoryStore> = Vec::new();
    // A small deterministic generator (splitmix64).
    let mut seed = 0x5eed_u64;
    let mut next = move |below: u64| {
        seed = seed.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = seed;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        (z ^ (z >> 31)) % below
    };
    let lengths = [1, 2, 30, 3600];
    let (mut moves_back, mut sweeps) = (0, 0);
    for step in 0..120_000u64 {
        // New users in bursts, old ones between (some long emptied).
        let user = if alone.is_empty() || next(3) == 0 {
            alone.push(MemoryStore::with_clock(clock.clone()));
            alone.len() - 1
        } else {
            next(alone.len() as u64) as usize
        };
        let shape = user as u64 % 16;
        let algorithm = [
            Algorithm::SlidingLog,
            Algorithm::SlidingWindow,
            Algorithm::FixedWindow,
            Algorithm::TokenBucket,
        ][(shape % 4) as usize];
        let windows: Vec<Window> = lengths
            .iter()
            .skip((shape / 4) as usize)
            .take(2)
            .map(|&secs| Window::new(Duration::from_secs(secs), 3).unwrap())
            .collect();
        let check = Check::new(format!("u{user}"), windows)
            .with_algorithm(algorithm)
            .with_cost(if next(10) == 0 { 2 } else { 1 })
            .at(clock.now());
        if next(20) == 0 {
            let adjustment = match next(2) {
                0 => Adjustment::Penalty(1),
                _ => Adjustment::Refund(1),
            };
            for store in [&shared, &alone[user]] {
                let adjusted = store.adjust(check.clone(), adjustment).now_or_never();
                assert!(matches!(adjusted, Some(Ok(()))), "step {step}");
            }
        }
        let a = shared.check(check.clone()).into_inner().unwrap();
        let b = alone[user].check(check).into_inner().unwrap();
        assert_eq!(a.allowed(), b.allowed(), "step {step}, user {user}");
        assert_eq!(a.retry_after(), b.retry_after(), "step {step}, user {user}");
        assert_eq!(a.reset_after(), b.reset_after(), "step {step}, user {user}");
        let remaining = |d: &tower_ratelimit::Decision| -> Vec<u32> {
            d.windows().iter().map(|w| w.remaining).collect()
        };
        assert_eq!(remaining(&a), remaining(&b), "step {step}, user {user}");
        // Time moves on in small steps, and now and then far (budgets
        // empty, shards sweep, tables shrink); now and then a whole sweep.
        match next(1_000) {
            0..=2 => {
                clock.advance(Duration::from_secs(70));
                moves_back += 1;
            }
            3 => {
                shared.sweep_at(clock.now());
                sweeps += 1;
            }
            _ => clock.advance(Duration::from_micros(next(20_000))),
        }
    }
    assert!(alone.len() > 30_000, "{} users", alone.len());
    assert!(
        moves_back > 50 && sweeps > 10,
        "{moves_back} jumps, {sweeps} sweeps"
    );
}
