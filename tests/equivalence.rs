//! Property: the memory store and the Redis scripts are the same function.
//! Random request sequences (random users, gaps from 0 to 2.5 s with many
//! exact collisions, costs from 1 to 3, 1 to 3 windows, with or without a
//! route-wide budget and a block time) go to both, at the
//! same injected instants, and every decision must be identical: allowed,
//! retry time, reset time and every window's remaining count, to the
//! microsecond.

mod support;

use std::sync::Arc;
use std::time::Duration;

use proptest::prelude::*;
use support::redis_server::{shared, unique_prefix};
use tower_ratelimit::clock::Timestamp;
use tower_ratelimit::store::redis::RedisStore;
use tower_ratelimit::{Algorithm, Check, GlobalCheck, MemoryStore, Store, Window};

#[derive(Debug, Clone)]
struct Step {
    user: u8,
    gap_us: u64,
    cost: u32,
}

fn step() -> impl Strategy<Value = Step> {
    let gap = prop_oneof![
        3 => Just(0u64),
        3 => 0u64..2_000,
        4 => 0u64..2_500_000,
    ];
    (0u8..3, gap, 1u32..=3).prop_map(|(user, gap_us, cost)| Step { user, gap_us, cost })
}

fn windows() -> impl Strategy<Value = Vec<Window>> {
    let window = prop_oneof![
        (1u32..6).prop_map(|l| (250u64, l)),
        (1u32..8).prop_map(|l| (1_000u64, l)),
        (2u32..12).prop_map(|l| (3_000u64, l)),
        (3u32..20).prop_map(|l| (60_000u64, l)),
    ];
    proptest::collection::vec(window, 1..=3).prop_map(|mut ws| {
        ws.sort();
        ws.dedup_by_key(|w| w.0);
        ws.into_iter()
            .map(|(ms, l)| Window::new(Duration::from_millis(ms), l).unwrap())
            .collect()
    })
}

fn algorithm() -> impl Strategy<Value = Algorithm> {
    prop_oneof![
        Just(Algorithm::SlidingLog),
        Just(Algorithm::SlidingWindow),
        Just(Algorithm::FixedWindow),
        Just(Algorithm::TokenBucket),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    #[test]
    fn memory_and_redis_decide_identically(
        algorithm in algorithm(),
        windows in windows(),
        start_offset in 0u64..10_000_000,
        steps in proptest::collection::vec(step(), 1..80),
        global in proptest::option::of(windows()),
        block_ms in proptest::option::of(1u64..3_000),
    ) {
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        runtime.block_on(async {
            let redis = RedisStore::builder()
                .url(&shared().standalone)
                .prefix(unique_prefix())
                .timeout(Duration::from_secs(5))
                .build()
                .await
                .unwrap();
            let memory = MemoryStore::new();
            let windows: Arc<[Window]> = windows.into();
            let global: Option<Arc<[Window]>> = global.map(Into::into);
            let mut now = 1_767_225_600_000_000 + start_offset;
            for (i, step) in steps.iter().enumerate() {
                now += step.gap_us;
                let mut check = Check::new(format!("r0:user{}", step.user), windows.clone())
                    .with_cost(step.cost)
                    .at(Timestamp::from_micros(now));
                check.algorithm = algorithm;
                if let Some(global) = &global {
                    check = check.with_global(GlobalCheck::new("r0:*", global.clone()));
                }
                if let Some(ms) = block_ms {
                    check = check.with_block(Duration::from_millis(ms));
                }
                let expected = memory.check(check.clone()).await.unwrap();
                let actual = redis.check(check).await.unwrap();
                prop_assert_eq!(&actual, &expected, "step {} of {:?}", i, steps);
            }
            Ok(())
        })?;
    }
}
