//! The Redis store against real `redis-server` processes started by the
//! tests (a standalone server and a 3-master cluster on free ports): the
//! conformance suite on every connection shape, then what only Redis has:
//! one shared budget across replicas, state in Redis, scripts, failures.

mod support;

use std::time::{Duration, Instant};

use http::StatusCode;
use support::redis_server::{cli, log_entries, shared, unique_prefix, RedisServer};
use support::{App, START};
use tower_ratelimit::store::redis::{RedisStore, RedisStoreBuilder};
use tower_ratelimit::{Algorithm, FailMode, HeaderMode, Rule, Rules};

/// Generous: the conformance suite checks decisions, not latency, on a
/// 2-core machine that may be busy.
const TEST_TIMEOUT: Duration = Duration::from_secs(30);

async fn standalone() -> RedisStore {
    standalone_at(&unique_prefix()).await
}

/// A store on the shared standalone server, under `prefix`.
async fn standalone_at(prefix: &str) -> RedisStore {
    RedisStore::builder()
        .url(&shared().standalone)
        .prefix(prefix)
        .timeout(TEST_TIMEOUT)
        .build()
        .await
        .unwrap()
}

/// `EVALSHA`'s line of the server's `INFO commandstats` (calls, time,
/// rejected and failed calls).
fn evalsha_stats(server: &RedisServer) -> String {
    server
        .cli(&["info", "commandstats"])
        .lines()
        .find(|l| l.starts_with("cmdstat_evalsha:"))
        .unwrap_or_default()
        .to_owned()
}

/// The commands the server has run since its stats were reset (those
/// scripts called included), by name, sorted.
fn commands_run(server: &RedisServer) -> Vec<String> {
    let mut ran: Vec<String> = server
        .cli(&["info", "commandstats"])
        .lines()
        .filter_map(|l| Some(l.strip_prefix("cmdstat_")?.split(':').next()?.to_owned()))
        .collect();
    ran.sort_unstable();
    ran
}

/// A plain (blocking) connection to the server at `url`, for raw values.
fn connect(url: &str) -> redis::Connection {
    redis::Client::open(url).unwrap().get_connection().unwrap()
}

/// A key's value, its bytes as stored.
fn raw_value(url: &str, key: &str) -> Vec<u8> {
    redis::cmd("GET").arg(key).query(&mut connect(url)).unwrap()
}

/// Numbers as the scripts pack them: little-endian doubles.
fn doubles(numbers: &[f64]) -> Vec<u8> {
    numbers.iter().flat_map(|n| n.to_le_bytes()).collect()
}

/// The `i`-th packed double from the end of `bytes` (1: the last).
fn double_from_end(bytes: &[u8], i: usize) -> f64 {
    let end = bytes.len() - 8 * (i - 1);
    f64::from_le_bytes(bytes[end - 8..end].try_into().unwrap())
}

/// A store on a server of the test's own.
async fn own_store(server: &RedisServer) -> RedisStore {
    RedisStore::builder()
        .url(server.url())
        .timeout(TEST_TIMEOUT)
        .build()
        .await
        .unwrap()
}

async fn cluster() -> RedisStore {
    RedisStore::builder()
        .cluster(shared().cluster.clone())
        .prefix(unique_prefix())
        .timeout(TEST_TIMEOUT)
        .build()
        .await
        .unwrap()
}

async fn pool() -> RedisStore {
    let pool = deadpool_redis::Config::from_url(&shared().standalone)
        .create_pool(Some(deadpool_redis::Runtime::Tokio1))
        .unwrap();
    RedisStore::builder()
        .pool(pool)
        .prefix(unique_prefix())
        .timeout(TEST_TIMEOUT)
        .build()
        .await
        .unwrap()
}

async fn cluster_pool() -> RedisStore {
    let pool = deadpool_redis::cluster::Config::from_urls(shared().cluster.clone())
        .create_pool(Some(deadpool_redis::Runtime::Tokio1))
        .unwrap();
    RedisStore::builder()
        .cluster_pool(pool)
        .prefix(unique_prefix())
        .timeout(TEST_TIMEOUT)
        .build()
        .await
        .unwrap()
}

mod on_standalone {
    crate::conformance_suite!(crate::standalone());
}

mod on_cluster {
    crate::conformance_suite!(crate::cluster());
}

mod on_pool {
    crate::conformance_suite!(crate::pool());
}

mod on_cluster_pool {
    crate::conformance_suite!(crate::cluster_pool());
}

/// Sends requests for `user` until one is limited (Redis answers again, with
/// the request allowed); returns how long that took, failing past `within`.
async fn until_limited(app: &App, user: &str, within: Duration) -> Duration {
    let started = Instant::now();
    loop {
        let reply = app.get("/a", user).await;
        if reply.limited() {
            assert_eq!(reply.status, StatusCode::OK);
            return started.elapsed();
        }
        assert!(
            started.elapsed() < within,
            "limiting did not resume within {within:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// [`until_limited`] for user `w`, whose next request (of a second's
/// limit of 1) is then denied.
async fn limiting_resumes(app: &App, within: Duration) {
    until_limited(app, "w", within).await;
    assert_eq!(
        app.get("/a", "w").await.status,
        StatusCode::TOO_MANY_REQUESTS
    );
}

/// The layer with a limit of 1 a second on `/a`, on a store of `server`
/// (a caller's pool of it if `pooled`) with this `deadline`.
async fn one_a_second_on(server: &RedisServer, pooled: bool, deadline: Duration) -> App {
    let store = builder_for(server, pooled)
        .0
        .timeout(deadline)
        .build()
        .await
        .unwrap();
    App::new(one_route(Rule::new().second(1)), store)
}

fn port_of(url: &str) -> u16 {
    url.rsplit(':').next().unwrap().parse().unwrap()
}

/// Held by the tests that flush the shared servers' script caches: a
/// second flush between a check's reload of its script and its retry
/// fails that check (and the layer fails it open, uncounted), so two such
/// tests must not flush at once.
static SCRIPT_FLUSH: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// A standalone store and a Cluster store, each with the ports of its
/// servers.
async fn standalone_and_cluster() -> [(RedisStore, Vec<u16>); 2] {
    [
        (standalone().await, vec![port_of(&shared().standalone)]),
        (
            cluster().await,
            shared().cluster.iter().map(|u| port_of(u)).collect(),
        ),
    ]
}

/// Every key under `prefix` on a standalone server.
fn keys(port: u16, prefix: &str) -> Vec<String> {
    let out = cli(port, &["--scan", "--pattern", &format!("{prefix}:*")]);
    out.lines()
        .map(str::to_owned)
        .filter(|l| !l.is_empty())
        .collect()
}

/// A store on `cluster`'s own client, with the deadline `timeout`.
async fn cluster_store(
    cluster: &support::redis_server::RedisCluster,
    timeout: Duration,
) -> RedisStore {
    RedisStore::builder()
        .cluster(cluster.urls())
        .timeout(timeout)
        .build()
        .await
        .unwrap()
}

/// The ports of `cluster`'s nodes, in its order.
fn ports_of(cluster: &support::redis_server::RedisCluster) -> Vec<u16> {
    cluster.nodes.iter().map(|n| n.port).collect()
}

/// The deadline of the stores the tests of reaching a server (TLS,
/// Sentinel) make: they are about reaching it, and on the loaded test
/// machine a check can take longer than the default 50 ms (it would fail
/// open, and a 429 expected would be a 200).
const REACHING: Duration = Duration::from_secs(2);

/// On a route of one request a second, `user`'s first request passes and
/// the second is limited (429, with the headers): `store` decides.
async fn passes_once_then_limits(store: RedisStore, user: &str) {
    let app = App::new(one_route(Rule::new().second(1)), store);
    assert_eq!(app.get("/a", user).await.status, StatusCode::OK);
    let denied = app.get("/a", user).await;
    assert_eq!(denied.status, StatusCode::TOO_MANY_REQUESTS);
    assert!(denied.limited());
}

fn one_route(rule: Rule) -> Rules {
    Rules::builder().route("^/a", [rule]).build().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_share_one_exact_budget() {
    // Four replicas, each with its own connection, sharing one Redis. The
    // deadline is generous: this is about exactness, on a debug build that
    // shares two cores with the rest of the suite.
    let prefix = unique_prefix();
    let mut replicas = Vec::new();
    for _ in 0..4 {
        let store = RedisStore::builder()
            .url(&shared().standalone)
            .prefix(&prefix)
            .timeout(Duration::from_secs(60))
            .build()
            .await
            .unwrap();
        replicas.push(App::on_store_clock(
            one_route(Rule::new().minute(100)),
            store,
            |l| l,
        ));
    }
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..2000 {
        let app = replicas[i % 4].clone();
        tasks.spawn(async move { app.get("/a", "shared-user").await.status });
    }
    let mut allowed = 0;
    while let Some(status) = tasks.join_next().await {
        match status.unwrap() {
            StatusCode::OK => allowed += 1,
            StatusCode::TOO_MANY_REQUESTS => {}
            other => panic!("unexpected {other}"),
        }
    }
    assert_eq!(allowed, 100);
    let inner: usize = replicas.iter().map(App::inner_calls).sum();
    assert_eq!(inner, 100);
}

#[tokio::test]
async fn denied_requests_write_nothing_in_redis() {
    let port = port_of(&shared().standalone);
    let prefix = unique_prefix();
    let store = standalone_at(&prefix).await;
    let app = App::new(one_route(Rule::new().second(2).minute(3).hour(100)), store);
    app.get("/a", "u").await;
    app.get("/a", "u").await;
    for _ in 0..10 {
        assert_eq!(
            app.get("/a", "u").await.status,
            StatusCode::TOO_MANY_REQUESTS
        );
    }
    let keys = keys(port, &prefix);
    assert_eq!(keys.len(), 1, "one log per budget: {keys:?}");
    let key = &keys[0];
    // (A limit of 100 at most: the packed layout, `p3`.)
    assert!(
        key.starts_with(&format!("{prefix}:{{r")) && key.ends_with(":u}:p3"),
        "{key}"
    );
    // Only the two allowed requests are recorded, in every window.
    assert_eq!(log_entries(port, key).len(), 2);
    app.advance_ms(1500);
    assert_eq!(app.get("/a", "u").await.status, StatusCode::OK);
    for _ in 0..10 {
        assert_eq!(
            app.get("/a", "u").await.status,
            StatusCode::TOO_MANY_REQUESTS
        );
    }
    assert_eq!(log_entries(port, key).len(), 3);
}

#[tokio::test]
async fn every_key_has_a_ttl() {
    let port = port_of(&shared().standalone);
    let prefix = unique_prefix();
    let store = standalone_at(&prefix).await;
    let rules = Rules::builder()
        .route("^/a", [Rule::new().second(2).minute(5)])
        // (Long enough that no key expires while the test reads them on a
        // loaded machine: 1.5 s, which this was, left 2.5 s of TTL to 40
        // `redis-cli` calls.)
        .route("^/b", [Rule::new().per(Duration::from_millis(20_500), 1)])
        .build()
        .unwrap();
    let app = App::on_store_clock(rules, store, |l| l);
    for user in 0..20 {
        for path in ["/a", "/b"] {
            for _ in 0..3 {
                app.get(path, &format!("user{user}")).await;
            }
        }
    }
    let keys = keys(port, &prefix);
    assert_eq!(keys.len(), 40);
    for key in keys {
        let ttl: i64 = cli(port, &["pttl", &key]).parse().unwrap();
        // Alive until the newest entry leaves the longest window, and a
        // quarter of that window more at most (a packed log's TTL is set
        // ahead, so most writes keep it).
        assert!(ttl > 0 && ttl <= 60_000 + 15_000 + 1, "{key}: pttl {ttl}");
    }
}

/// The other kinds of key expire too: a block time's marker, a sliding
/// log kept as a sorted set (more windows than the packed log takes), a
/// route-wide budget, and every counter algorithm's state beside them.
#[tokio::test]
async fn every_kind_of_key_has_a_ttl() {
    let port = port_of(&shared().standalone);
    let prefix = unique_prefix();
    let store = standalone_at(&prefix).await;
    let six = Rule::new()
        .second(50)
        .per(Duration::from_secs(2), 50)
        .per(Duration::from_secs(3), 50)
        .per(Duration::from_secs(4), 50)
        .per(Duration::from_secs(5), 50)
        .minute(50);
    let rules = Rules::builder()
        .route(
            "^/login",
            [Rule::new().minute(1).block_time(Duration::from_secs(30))],
        )
        .route("^/six", [six])
        .add_route(
            tower_ratelimit::Route::new("^/wide")
                .rules([Rule::new().minute(5)])
                .global(Rule::new().minute(100)),
        )
        .add_route(
            // (A route-wide bucket of 10 a minute: its TTL after 3
            // requests, about 18 s, outlasts the reads below; one of 100
            // a minute kept its state about 2 s.)
            tower_ratelimit::Route::new("^/bucket")
                .rules([Rule::new().minute(5).algorithm(Algorithm::TokenBucket)])
                .global(Rule::new().minute(10)),
        )
        .route(
            "^/fixed",
            [Rule::new()
                .minute(1)
                .block_time(Duration::from_secs(30))
                .algorithm(Algorithm::FixedWindow)],
        )
        .build()
        .unwrap();
    let app = App::on_store_clock(rules, store, |l| l);
    // (The fixed window's key expires at the minute's end.)
    clear_of_a_minute_end(port).await;
    for path in ["/login", "/six", "/wide", "/bucket", "/fixed"] {
        for _ in 0..3 {
            app.get(path, "u").await;
        }
    }
    let keys = keys(port, &prefix);
    // Two block markers, the route-wide budgets (a sorted set, a bucket)
    // and the users' own (a packed log, a sorted set, a bucket, a counter).
    let kinds: std::collections::BTreeSet<&str> =
        keys.iter().map(|k| k.rsplit(':').next().unwrap()).collect();
    assert_eq!(keys.len(), 9, "{keys:?}");
    for kind in ["b", "l", "p3", "tb2", "fw2"] {
        assert!(kinds.contains(kind), "no {kind} key: {keys:?}");
    }
    assert_eq!(keys.iter().filter(|k| k.contains(":*:")).count(), 2);
    for key in &keys {
        let ttl: i64 = cli(port, &["pttl", key]).parse().unwrap();
        // (At most the longest window or block, and a quarter more.)
        assert!(ttl > 0 && ttl <= 75_001, "{key}: pttl {ttl}");
    }
}

/// A penalty writes each layout's key with a TTL as long as the state it
/// leaves needs (and no longer), a refund of everything leaves a sliding
/// log's key gone and a counter's empty, and a refund of a budget that
/// spent nothing writes no key.
#[tokio::test]
async fn adjusted_keys_keep_a_ttl_and_refunds_leave_nothing_behind() {
    use tower_ratelimit::{Adjustment, Check, GlobalCheck, Store, Window};
    let port = port_of(&shared().standalone);
    let prefix = unique_prefix();
    let store = standalone_at(&prefix).await;
    let minute = || vec![Window::new(Duration::from_secs(60), 10).unwrap()];
    let checks = [
        ("p3", Check::new("r1:u", minute())),
        (
            "l",
            Check::new("r1:u", minute()).with_global(GlobalCheck::new("r1:*", minute())),
        ),
        (
            "sw2",
            Check::new("r1:u", minute()).with_algorithm(Algorithm::SlidingWindow),
        ),
        (
            "fw2",
            Check::new("r1:u", minute()).with_algorithm(Algorithm::FixedWindow),
        ),
        (
            "tb2",
            Check::new("r1:u", minute()).with_algorithm(Algorithm::TokenBucket),
        ),
    ];
    for (kind, check) in checks {
        let key = store.keys(&check)[0].clone();
        assert!(key.ends_with(kind), "{key}");
        // (A minute that ended between the penalty and the refund would
        // leave the penalty in the minute before, which a sliding window
        // still weighs, and a fixed window's next check allowed.)
        clear_of_a_minute_end(port).await;
        store
            .adjust(check.clone(), Adjustment::Refund(3))
            .await
            .unwrap();
        assert_eq!(
            cli(port, &["exists", &key]),
            "0",
            "{kind}: a refund of nothing"
        );
        store
            .adjust(check.clone(), Adjustment::Penalty(100))
            .await
            .unwrap();
        let ttl: i64 = cli(port, &["pttl", &key]).parse().unwrap();
        // (The window, and a sliding log's slack of a quarter of it; a
        // sliding window's count weighs in the next window too.)
        let most = if kind == "sw2" { 120_001 } else { 75_001 };
        assert!(ttl > 0 && ttl <= most, "{kind}: pttl {ttl}");
        // The penalty filled the window: the next check is denied.
        let denied = store.check(check.clone()).await.unwrap();
        assert!(!denied.allowed(), "{kind}");
        store
            .adjust(check.clone(), Adjustment::Refund(100))
            .await
            .unwrap();
        let allowed = store.check(check.clone()).await.unwrap();
        assert!(allowed.allowed(), "{kind}");
        assert_eq!(allowed.windows()[0].remaining, 9, "{kind}");
        store
            .adjust(check.clone(), Adjustment::Refund(1))
            .await
            .unwrap();
        let exists = cli(port, &["exists", &key]);
        match kind {
            "p3" | "l" => assert_eq!(exists, "0", "{kind}: an empty log is deleted"),
            _ => {
                // (Never without a TTL. A token bucket full again expires
                // at its next whole second, which may be a millisecond
                // away: it may be gone, -2, by the time this asks.)
                let ttl: i64 = cli(port, &["pttl", &key]).parse().unwrap();
                assert!(ttl != -1 && ttl <= 121_000, "{kind}: pttl {ttl}");
                if kind != "tb2" {
                    assert!(ttl > 0, "{kind}: pttl {ttl}");
                }
            }
        }
    }
}

/// Waits for the next minute of the server's clock when the current one
/// has less than 5 s left (so at most 5 s, about one call in twelve). The
/// counters' windows are whole minutes of that clock: a test that counts
/// or reads their keys across a minute's end sees a new window.
async fn clear_of_a_minute_end(port: u16) {
    let left = 60_000 - server_millis(port) % 60_000;
    if left < 5_000 {
        tokio::time::sleep(Duration::from_millis(left + 100)).await;
    }
}

/// The server's clock (`TIME`) in milliseconds.
fn server_millis(port: u16) -> u64 {
    let time = cli(port, &["time"]);
    let mut parts = time.split_whitespace().map(|p| p.parse::<u64>().unwrap());
    let (secs, micros) = (parts.next().unwrap(), parts.next().unwrap());
    secs * 1000 + micros / 1000
}

/// A packed log adjusted under a shorter rule keeps the longer TTL a check
/// of a longer rule on the same budget set (a zone shared by both): its
/// entries still count there.
#[tokio::test]
async fn an_adjusted_packed_log_keeps_a_longer_ttl() {
    use tower_ratelimit::{Adjustment, Check, Store, Window};
    let port = port_of(&shared().standalone);
    let store = standalone_at(&unique_prefix()).await;
    let hour = Check::new(
        "z1:u",
        [Window::new(Duration::from_secs(3600), 10).unwrap()],
    );
    let minute = Check::new("z1:u", [Window::new(Duration::from_secs(60), 10).unwrap()]);
    let key = store.keys(&hour)[0].clone();
    assert_eq!(key, store.keys(&minute)[0]);
    assert!(store.check(hour.clone()).await.unwrap().allowed());
    let before: i64 = cli(port, &["pttl", &key]).parse().unwrap();
    assert!(before > 3_600_000, "pttl {before}");
    for adjustment in [Adjustment::Penalty(2), Adjustment::Refund(1)] {
        store.adjust(minute.clone(), adjustment).await.unwrap();
        let after: i64 = cli(port, &["pttl", &key]).parse().unwrap();
        assert!(
            after > 3_600_000 && after <= before,
            "{adjustment:?}: pttl {after}"
        );
    }
    // Both rules read what it left, 1 + 2 - 1 entries, and add theirs.
    let hourly = store.check(hour.clone()).await.unwrap();
    assert_eq!(hourly.windows()[0].remaining, 7);
    let minutely = store.check(minute).await.unwrap();
    assert_eq!(minutely.windows()[0].remaining, 6);
}

/// An adjustment of a long packed log reads a few entries, whatever the
/// log's length (binary searches; Redis copies the rest): counted in the
/// commands its script runs, on a server of its own.
#[tokio::test]
async fn an_adjustment_of_a_long_log_reads_a_few_entries() {
    use tower_ratelimit::clock::Timestamp;
    use tower_ratelimit::{Adjustment, Check, Store, Window};
    let server = RedisServer::start();
    let store = RedisStore::builder()
        .url(server.url())
        .timeout(Duration::from_secs(10))
        .build()
        .await
        .unwrap();
    let t0 = START;
    let mut reads = Vec::new();
    for n in [1_000u32, 100_000] {
        let window = Window::new(Duration::from_secs(3600), n).unwrap();
        let check = Check::new(format!("r1:u{n}"), [window]).at(Timestamp::from_micros(t0));
        // (A penalty adds at most MAX_LOG_COST entries: in as many as it
        // takes, at one instant, each after the last's run.)
        let most = tower_ratelimit::rules::MAX_LOG_COST;
        for _ in 0..n / most {
            store
                .adjust(check.clone(), Adjustment::Penalty(most))
                .await
                .unwrap();
        }
        let key = store.keys(&check)[0].clone();
        assert_eq!(server.cli(&["strlen", &key]), (8 * n + 56).to_string());
        let before = server.calls("getrange");
        for i in 0..10 {
            let at = Timestamp::from_micros(t0 + 1_000 + i);
            let check = check.clone().at(at);
            store
                .adjust(check.clone(), Adjustment::Refund(1))
                .await
                .unwrap();
            store.adjust(check, Adjustment::Penalty(1)).await.unwrap();
        }
        reads.push(server.calls("getrange") - before);
        // The log is whole: n entries, the last one refunded and taken
        // again each time.
        let last = store
            .check(check.clone().at(Timestamp::from_micros(t0 + 2_000)))
            .await;
        assert!(!last.unwrap().allowed());
    }
    // Two binary searches per adjustment: about twice log2(n) reads.
    assert!(reads[0] <= 20 * 2 * 12, "{reads:?}");
    assert!(reads[1] <= 20 * 2 * 19, "{reads:?}");
}

#[tokio::test]
async fn counter_states_live_until_their_longest_window_lets_go() {
    // The straight-line scripts (counter algorithms, no route-wide windows,
    // no block time) work out the TTL in whole milliseconds, rounded up:
    // token bucket: until the minute window's next token (12 s at 5 per
    // minute); fixed window: until the current minute ends; sliding window:
    // until the next minute ends (its count still weighs in then).
    let port = port_of(&shared().standalone);
    for (algorithm, bounds) in [
        // (The second request takes the bucket's next token: 12 s more.
        // A bucket's TTL runs to its TAT rounded up to a whole second.)
        (Algorithm::TokenBucket, [(11_500, 13_000), (23_500, 25_000)]),
        (Algorithm::FixedWindow, [(0, 60_000); 2]),
        (Algorithm::SlidingWindow, [(59_000, 120_000); 2]),
    ] {
        let prefix = unique_prefix();
        let store = standalone_at(&prefix).await;
        let rules = Rules::builder()
            .route("^/", [Rule::new().second(2).minute(5).algorithm(algorithm)])
            .build()
            .unwrap();
        let app = App::on_store_clock(rules, store, |l| l);
        clear_of_a_minute_end(port).await;
        // (The bucket's TTLs count down from its first request: the lower
        // bounds give up what the test itself took since.)
        let first = std::time::Instant::now();
        // The second request keeps the TTL the first set when its windows
        // end at the same time (fixed and sliding window: KEEPTTL).
        for (request, (low, high)) in bounds.into_iter().enumerate() {
            assert_eq!(app.get("/", "u").await.status, StatusCode::OK);
            let keys = keys(port, &prefix);
            assert_eq!(keys.len(), 1, "{algorithm:?}");
            let ttl: i64 = cli(port, &["pttl", &keys[0]]).parse().unwrap();
            let taken = i64::try_from(first.elapsed().as_millis()).unwrap();
            let low = (low - taken).max(0);
            assert!(
                ttl > low && ttl <= high,
                "{algorithm:?}, request {}: pttl {ttl} not in ({low}, {high}]",
                request + 1
            );
        }
    }
}

#[tokio::test]
async fn scores_come_from_the_server_clock() {
    let port = port_of(&shared().standalone);
    let prefix = unique_prefix();
    // Two replicas, each with a store (a connection) of its own: neither
    // injects a clock, so whatever their own clocks say, both decide on
    // the server's TIME and agree exactly. (The layers themselves read
    // only a monotonic clock, for their denial caches: a replica's wall
    // clock, skewed or stepped, is read nowhere.)
    let a = App::on_store_clock(
        one_route(Rule::new().per(Duration::from_secs(30), 3)),
        standalone_at(&prefix).await,
        |l| l,
    );
    let b = App::on_store_clock(
        one_route(Rule::new().per(Duration::from_secs(30), 3)),
        standalone_at(&prefix).await,
        |l| l,
    );
    let started = std::time::Instant::now();
    assert_eq!(a.get("/a", "u").await.status, StatusCode::OK);
    assert_eq!(b.get("/a", "u").await.status, StatusCode::OK);
    assert_eq!(a.get("/a", "u").await.status, StatusCode::OK);
    let denied_b = b.get("/a", "u").await;
    let denied_a = a.get("/a", "u").await;
    assert_eq!(denied_b.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(denied_a.status, StatusCode::TOO_MANY_REQUESTS);
    // (Both wait for the first entry to leave the 30 s window, in whole
    // seconds rounded up: 30 while the denials came within a second of
    // it, as they do unless the machine stalled.)
    if support::came_within_a_second(started) {
        assert_eq!(denied_a.header("retry-after"), Some("30"));
        assert_eq!(denied_b.header("retry-after"), Some("30"));
    }
    let time = cli(port, &["time"]);
    let mut parts = time.lines();
    let secs: i64 = parts.next().unwrap().parse().unwrap();
    let key = &keys(port, &prefix)[0];
    let first = log_entries(port, key)[0];
    assert!(
        (secs * 1_000_000 - first).abs() < 5_000_000,
        "score {first} vs server time {secs}"
    );
}

/// The issue's "two replicas whose injected clocks differ by 5 s still
/// agree when the server clock is used": each replica's layer reads a
/// manual clock of its own for its own timing, 5 s apart from the other's
/// (and months from the real time), while the store decides on Redis's
/// `TIME`.
#[tokio::test]
async fn replicas_whose_clocks_differ_by_five_seconds_agree_on_the_server_clock() {
    const SKEW: u64 = 5_000_000;
    let port = port_of(&shared().standalone);
    // A 4 s window: shorter than the skew, so replicas deciding on their
    // own clocks would each see the other's requests as gone (the control
    // below).
    let rule = || Rule::new().per(Duration::from_secs(4), 3);
    let alternate = |a: App, b: App| async move {
        let mut allowed = 0;
        let mut denied = Vec::new();
        for i in 0..6 {
            let reply = if i % 2 == 0 { &a } else { &b }.get("/a", "u").await;
            match reply.status {
                StatusCode::OK => allowed += 1,
                _ => denied.push(reply),
            }
        }
        (allowed, denied)
    };

    // Two replicas, each with a store of its own, their clocks SKEW apart;
    // deciding on them, or timing only their own work.
    let replicas = |decide: bool| async move {
        let prefix = unique_prefix();
        let make = if decide {
            App::on_clock_at::<RedisStore>
        } else {
            App::on_local_clock::<RedisStore>
        };
        let a = make(one_route(rule()), standalone_at(&prefix).await, START);
        let b = make(
            one_route(rule()),
            standalone_at(&prefix).await,
            START + SKEW,
        );
        (prefix, a, b)
    };

    let (prefix, a, b) = replicas(false).await;
    let (allowed, denied) = alternate(a.clone(), b.clone()).await;
    assert_eq!(allowed, 3, "exactly the limit across both replicas");
    assert_eq!(denied.len(), 3);
    for reply in &denied {
        assert_eq!(reply.status, StatusCode::TOO_MANY_REQUESTS);
        let wait: u64 = reply.header("retry-after").unwrap().parse().unwrap();
        assert!((1..=4).contains(&wait), "retry-after {wait}");
    }
    // Every entry is at the server's time, not at either replica's.
    let secs: i64 = cli(port, &["time"])
        .lines()
        .next()
        .unwrap()
        .parse()
        .unwrap();
    let budget = keys(port, &prefix);
    assert_eq!(budget.len(), 1, "one budget: {budget:?}");
    let entries = log_entries(port, &budget[0]);
    assert_eq!(entries.len(), 3);
    for entry in entries {
        assert!(
            (secs * 1_000_000 - entry).abs() < 5_000_000,
            "entry {entry} vs server time {secs} s"
        );
    }

    // The replicas' own clocks time their denial caches: with the budget
    // gone from Redis, each still denies from its cache until its own
    // clock has passed the wait, whatever the real time.
    assert_eq!(cli(port, &["del", &budget[0]]), "1");
    assert_eq!(a.get("/a", "u").await.status, StatusCode::TOO_MANY_REQUESTS);
    a.advance(Duration::from_secs(5));
    assert_eq!(a.get("/a", "u").await.status, StatusCode::OK);
    assert_eq!(b.get("/a", "u").await.status, StatusCode::TOO_MANY_REQUESTS);
    b.advance(Duration::from_secs(5));
    assert_eq!(b.get("/a", "u").await.status, StatusCode::OK);
    assert_eq!(log_entries(port, &budget[0]).len(), 2);

    // The control: the same replicas deciding on their own clocks
    // disagree, each counting only its own requests in its window.
    let (_, a, b) = replicas(true).await;
    let (allowed, _) = alternate(a, b).await;
    assert!(allowed > 3, "on skewed clocks {allowed} allowed");
}

#[tokio::test]
async fn script_flush_is_recovered_from() {
    let _flushing = SCRIPT_FLUSH.lock().await;
    for (store, ports) in standalone_and_cluster().await {
        let app = App::new(one_route(Rule::new().second(2)), store);
        assert_eq!(app.get("/a", "u").await.status, StatusCode::OK);
        for port in &ports {
            assert_eq!(cli(*port, &["script", "flush"]), "OK");
        }
        // NOSCRIPT: loaded again and retried, with the same budget.
        assert_eq!(app.get("/a", "u").await.status, StatusCode::OK);
        assert_eq!(
            app.get("/a", "u").await.status,
            StatusCode::TOO_MANY_REQUESTS
        );
        for user in 0..20 {
            assert_eq!(
                app.get("/a", &format!("other{user}")).await.status,
                StatusCode::OK
            );
        }
    }
}

/// An adjustment that meets a flushed script cache loads its script again
/// and is made (on a Cluster too).
#[tokio::test]
async fn an_adjustment_after_a_script_flush_is_made() {
    let _flushing = SCRIPT_FLUSH.lock().await;
    for (store, ports) in standalone_and_cluster().await {
        let app = App::with(one_route(Rule::new().second(2)), store, |l| {
            l.adjust_on_response(|_, _| Some(tower_ratelimit::Adjustment::Penalty(1)))
        });
        for port in &ports {
            assert_eq!(cli(*port, &["script", "flush"]), "OK");
        }
        // The check loads its own script again, then the penalty its own.
        assert_eq!(app.get("/a", "u").await.status, StatusCode::OK);
        assert_eq!(
            app.get("/a", "u").await.status,
            StatusCode::TOO_MANY_REQUESTS
        );
    }
}

/// Checks sent together (one pipeline per batch, on a multiplexed
/// connection and through a caller's pool) each get their own answer, also
/// when the batch meets a flushed script cache: the scripts are loaded
/// once for the batch and its checks sent again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_checks_get_their_own_answers_in_batches() {
    let shapes = [
        (false, Algorithm::TokenBucket),
        (true, Algorithm::TokenBucket),
        (false, Algorithm::SlidingLog),
    ];
    for (pooled, algorithm) in shapes {
        let server = RedisServer::start();
        let store = builder_for(&server, pooled)
            .0
            .timeout(TEST_TIMEOUT)
            .build()
            .await
            .unwrap();
        // (An hour: a token comes back 6 minutes after the first is
        // taken, long after the test ends; no window edge to cross.)
        let rule = Rule::new().hour(10).algorithm(algorithm);
        let app = App::with(one_route(rule), store, |l| l.denial_cache(0));
        // "a" and "d" have 2 left, "b" and "e" all 10, "c" and "f" none;
        // the second round (after a flush) asks for d, e, f.
        for (user, used) in [("a", 8), ("c", 10), ("d", 8), ("f", 10)] {
            for _ in 0..used {
                assert_eq!(app.get("/a", user).await.status, StatusCode::OK);
            }
        }
        for flush in [false, true] {
            if flush {
                assert_eq!(server.cli(&["script", "flush"]), "OK");
            }
            let users = if flush {
                ["d", "e", "f"]
            } else {
                ["a", "b", "c"]
            };
            let replies =
                futures_util::future::join_all((0..30).map(|i| app.get("/a", users[i % 3]))).await;
            let ok = |user: &str| {
                replies
                    .iter()
                    .enumerate()
                    .filter(|(i, r)| users[i % 3] == user && r.status == StatusCode::OK)
                    .count()
            };
            // Every check decided by the store: allowed or denied, none
            // failed open or closed.
            assert!(replies
                .iter()
                .all(|r| [StatusCode::OK, StatusCode::TOO_MANY_REQUESTS].contains(&r.status)));
            // Each round takes what its users have left, each its own.
            assert_eq!(
                users.map(ok),
                [2, 10, 0],
                "{algorithm:?}, pooled {pooled}, flushed {flush}"
            );
        }
        // 36 checks one at a time, then two rounds of 30 at once: at most
        // one call per check (and the flushed round's once more), however
        // the runtime's threads split them into batches (the tests
        // `a_big_batch_goes_as_several_calls` and the pool's count calls
        // exactly, on one thread).
        let calls = server.calls("evalsha");
        assert!(
            (36 + 2..=36 + 2 * 30 + 30).contains(&calls),
            "{algorithm:?}, pooled {pooled}: {calls}"
        );
    }
}

/// Every script, the batch scripts too, is loaded when the store connects
/// (in one pipeline), and none again under load: checks alone and checks
/// sent together find theirs.
#[tokio::test]
async fn every_script_is_loaded_once_at_start_up() {
    let server = RedisServer::start();
    let store = own_store(&server).await;
    // 4 general scripts, per algorithm 5 straight-line and 5 batch
    // scripts (1 to 5 windows), and the adjustments' script.
    let scripts = 4 + 4 * 5 * 2 + 1;
    assert_eq!(server.calls("script|load"), scripts);
    for algorithm in [
        Algorithm::SlidingLog,
        Algorithm::SlidingWindow,
        Algorithm::FixedWindow,
        Algorithm::TokenBucket,
    ] {
        let rules = Rules::builder()
            .route(
                "^/a",
                [Rule::new().second(5).minute(50).algorithm(algorithm)],
            )
            .build()
            .unwrap();
        let app = App::with(rules, store.clone(), |l| l.denial_cache(0));
        app.get("/a", "alone").await;
        let users = ["x", "y", "z"];
        futures_util::future::join_all((0..12).map(|i| app.get("/a", users[i % 3]))).await;
    }
    assert_eq!(server.calls("script|load"), scripts);
    // (No NOSCRIPT: not one check's call failed; the one failed call is
    // the store's access probe at start-up, which a script answers with an
    // error without touching its key.)
    let evalsha = evalsha_stats(&server);
    assert!(evalsha.contains(",failed_calls=1"), "{evalsha}");
}

/// On a Cluster every master gets every script when the store connects
/// (a check may land on any of them).
#[tokio::test]
async fn a_cluster_store_loads_every_script_on_every_master() {
    let cluster = support::redis_server::RedisCluster::start();
    let _store = RedisStore::builder()
        .cluster(cluster.urls())
        .timeout(TEST_TIMEOUT)
        .connect_timeout(TEST_TIMEOUT)
        .build()
        .await
        .unwrap();
    for node in &cluster.nodes {
        assert!(node.calls("script|load") >= 4 + 4 * 5 * 2, "{}", node.url());
    }
}

/// A request alone (nothing else in flight) costs exactly one command, its
/// script's `EVALSHA`, whatever the algorithm; none for a locally denied
/// one.
#[tokio::test]
async fn a_request_alone_costs_exactly_one_command() {
    for algorithm in [
        Algorithm::SlidingLog,
        Algorithm::SlidingWindow,
        Algorithm::FixedWindow,
        Algorithm::TokenBucket,
    ] {
        let server = RedisServer::start();
        // (No keepalive ping, should the machine stall for a second.)
        let store = RedisStore::builder()
            .url(server.url())
            .timeout(TEST_TIMEOUT)
            .keepalive(None)
            .build()
            .await
            .unwrap();
        let app = App::with(
            one_route(Rule::new().second(3).hour(100).algorithm(algorithm)),
            store,
            |l| l.denial_cache(0),
        );
        assert_eq!(server.cli(&["config", "resetstat"]), "OK");
        for n in 1..=5 {
            app.get("/a", "u").await;
            assert_eq!(server.calls("evalsha"), n, "{algorithm:?}");
        }
        // (Besides the test's own CONFIG and INFO, and what scripts call.)
        let mut top_level = commands_run(&server);
        top_level.retain(|c| !["get", "set", "setrange", "getrange", "time"].contains(&c.as_str()));
        assert_eq!(
            top_level,
            ["config|resetstat", "evalsha", "info"],
            "{algorithm:?}"
        );
    }
}

/// A batch script's call decides at most 64 checks (it holds Redis for
/// its whole run): 150 checks made at once go as three calls, each check
/// with its own answer.
#[tokio::test]
async fn a_big_batch_goes_as_several_calls() {
    let server = RedisServer::start();
    let store = own_store(&server).await;
    // (A month's fixed window: an hour's, aligned on the epoch, may end
    // between the two rounds.)
    let rule = Rule::new().month(1).algorithm(Algorithm::FixedWindow);
    let app = App::with(one_route(rule), store, |l| l.denial_cache(0));
    assert_eq!(server.cli(&["config", "resetstat"]), "OK");
    let users: Vec<String> = (0..150).map(|i| format!("u{i}")).collect();
    for expected in [StatusCode::OK, StatusCode::TOO_MANY_REQUESTS] {
        let replies = futures_util::future::join_all(users.iter().map(|u| app.get("/a", u))).await;
        assert!(replies.iter().all(|r| r.status == expected));
    }
    assert_eq!(server.calls("evalsha"), 6);
}

/// With `combine_checks(false)` (behind a sharding proxy) the checks of a
/// batch go one `EVALSHA` each, every one on its own user's key.
#[tokio::test]
async fn checks_can_be_kept_one_command_each() {
    let server = RedisServer::start();
    let store = RedisStore::builder()
        .url(server.url())
        .timeout(TEST_TIMEOUT)
        .combine_checks(false)
        .build()
        .await
        .unwrap();
    let rule = Rule::new().hour(2).algorithm(Algorithm::TokenBucket);
    let app = App::with(one_route(rule), store, |l| l.denial_cache(0));
    assert_eq!(server.cli(&["config", "resetstat"]), "OK");
    let users = ["a", "b", "c", "d"];
    let replies =
        futures_util::future::join_all((0..12).map(|i| app.get("/a", users[i % 4]))).await;
    let allowed = replies
        .iter()
        .filter(|r| r.status == StatusCode::OK)
        .count();
    assert_eq!(allowed, 8);
    assert_eq!(server.calls("evalsha"), 12);
}

/// A check of a batch that fails in Redis (its key holds another type)
/// fails alone: the checks sent with it keep their exact answers.
#[tokio::test]
async fn a_check_that_fails_in_a_batch_leaves_the_others_their_answers() {
    let server = RedisServer::start();
    let store = own_store(&server).await;
    let rule = Rule::new().hour(6).algorithm(Algorithm::FixedWindow);
    let app = App::with(one_route(rule), store, |l| {
        l.denial_cache(0).fail_mode(FailMode::Closed)
    });
    assert_eq!(app.get("/a", "bad").await.status, StatusCode::OK);
    let key = server.cli(&["keys", "*"]);
    assert!(key.contains("bad"), "{key}");
    server.cli(&["del", &key]);
    assert_eq!(server.cli(&["lpush", &key, "x"]), "1");
    let before = server.calls("evalsha");
    let users = ["bad", "good"];
    let replies =
        futures_util::future::join_all((0..20).map(|i| app.get("/a", users[i % 2]))).await;
    let statuses = |user: &str| -> Vec<StatusCode> {
        let mut s: Vec<StatusCode> = (0..20)
            .filter(|i| users[i % 2] == user)
            .map(|i| replies[i].status)
            .collect();
        s.sort();
        s
    };
    assert_eq!(statuses("bad"), [StatusCode::SERVICE_UNAVAILABLE; 10]);
    let mut good = vec![StatusCode::OK; 6];
    good.extend([StatusCode::TOO_MANY_REQUESTS; 4]);
    assert_eq!(statuses("good"), good);
    // (Sent together: fewer script calls than checks.)
    let calls = server.calls("evalsha") - before;
    assert!((1..20).contains(&calls), "{calls}");
    assert_eq!(server.cli(&["type", &key]), "list");
}

/// A batch script's numbers go once per run of checks that have the same
/// (here two runs: costs 1 and 2), each followed by how many checks it is
/// for; counts that do not add up to one per key fail the whole call,
/// before any check runs.
#[test]
fn a_batch_takes_each_run_of_numbers_once() {
    let server = RedisServer::start();
    let mut conn = connect(&server.url());
    let script = tower_ratelimit::store::redis::batched_lua(Algorithm::SlidingLog, 1).unwrap();
    // (A sliding log's numbers: the server's clock, the cost, no block
    // time, the window's length in microseconds and its limit, the
    // windows' fingerprint, and every window counted exactly.)
    let numbers = |cost: f64| doubles(&[-1.0, cost, 0.0, 60e6, 5.0, 7.0, 1.0]);
    let mut call = |counts: [&str; 2]| {
        redis::cmd("EVAL")
            .arg(&script)
            .arg(3)
            .arg(&["a", "b", "c"][..])
            .arg(numbers(1.0))
            .arg(counts[0])
            .arg(numbers(2.0))
            .arg(counts[1])
            .query::<redis::Value>(&mut conn)
    };
    for counts in [
        ["2", "2"],
        ["1", "1"],
        ["0", "3"],
        ["x", "2"],
        ["1.5", "1.5"],
    ] {
        let error = call(counts).unwrap_err();
        assert!(
            error.to_string().contains("do not match its keys"),
            "{error}"
        );
    }
    assert_eq!(server.cli(&["dbsize"]), "0");
    let redis::Value::Array(replies) = call(["2", "1"]).unwrap() else {
        panic!("a list of replies");
    };
    assert_eq!(replies.len(), 3);
    // a and b spent 1 of 5, c 2 of 5: the remaining, as each check's reply
    // ends with it.
    let remaining: Vec<f64> = replies
        .iter()
        .map(|reply| match reply {
            redis::Value::BulkString(bytes) => double_from_end(bytes, 1),
            other => panic!("{other:?}"),
        })
        .collect();
    assert_eq!(remaining, [4.0, 4.0, 3.0]);

    // A check whose command fails answers with the server's own error, its
    // code first (as the client reads it: `WRONGTYPE`, `READONLY`), and
    // the others still run.
    assert_eq!(server.cli(&["del", "b"]), "1");
    assert_eq!(server.cli(&["rpush", "b", "x"]), "1");
    let length = |key: &str| server.cli(&["strlen", key]).parse::<u64>().unwrap();
    let before = [length("a"), length("c")];
    let error = call(["2", "1"]).unwrap_err();
    assert_eq!(error.code(), Some("WRONGTYPE"), "{error}");
    assert!(length("a") > before[0] && length("c") > before[1]);

    // The first check of a run failing: the run's next check still runs,
    // on the run's numbers (b, cost 1: 1 of 5 spent), and the next run on
    // its own (c, cost 2: 4 more of 5 spent, then denied).
    assert_eq!(server.cli(&["del", "a", "b", "c"]), "3");
    assert_eq!(server.cli(&["rpush", "a", "x"]), "1");
    for _ in 0..2 {
        let error = call(["2", "1"]).unwrap_err();
        assert_eq!(error.code(), Some("WRONGTYPE"), "{error}");
    }
    // (A 1-window packed log: 8 bytes an entry, and the trailer's two
    // numbers for the window and five every trailer ends with.)
    let log = |entries: u64| 8 * entries + 8 * (2 + 5);
    assert_eq!(length("b"), log(2));
    assert_eq!(length("c"), log(4));
}

/// A check whose caller is gone before its batch is sent (a request
/// dropped: the client left, an outer timeout fired) is not sent: it
/// spends nothing of its user's budget.
#[tokio::test]
async fn a_check_dropped_before_its_batch_is_sent_spends_nothing() {
    use futures_util::FutureExt;
    use tower_ratelimit::{Check, Store, Window};
    let server = RedisServer::start();
    let store = own_store(&server).await;
    let windows = [Window::new(Duration::from_secs(60), 5).unwrap()];
    // Polled once (queued for the next batch), then dropped.
    assert!(store
        .check(Check::new("r0:gone", windows))
        .now_or_never()
        .is_none());
    let kept = store.check(Check::new("r0:kept", windows)).await.unwrap();
    assert_eq!(kept.windows()[0].remaining, 4);
    let gone = store.check(Check::new("r0:gone", windows)).await.unwrap();
    assert_eq!(
        gone.windows()[0].remaining,
        4,
        "the dropped check spent nothing"
    );
}

/// A server that refuses a call on keys of several slots (here a Cluster
/// node holding every slot, reached as a single server; in production, a
/// proxy in front of a sharded deployment) gets a batch's checks one
/// command each, exact, from then on.
#[tokio::test]
async fn a_server_refusing_keys_of_several_slots_gets_checks_one_by_one() {
    let server = RedisServer::start_cluster_of_one();
    let store = own_store(&server).await;
    let rule = Rule::new().hour(8).algorithm(Algorithm::TokenBucket);
    let app = App::with(one_route(rule), store, |l| {
        l.denial_cache(0).fail_mode(FailMode::Closed)
    });
    let users = ["a", "b", "c"];
    for round in 0..2 {
        let replies =
            futures_util::future::join_all((0..15).map(|i| app.get("/a", users[i % 3]))).await;
        let ok = |user: &str| {
            (0..15)
                .filter(|i| users[i % 3] == user && replies[*i].status == StatusCode::OK)
                .count()
        };
        assert!(replies
            .iter()
            .all(|r| [StatusCode::OK, StatusCode::TOO_MANY_REQUESTS].contains(&r.status)));
        // 5 each per round, of 8 each.
        let expected = if round == 0 { [5, 5, 5] } else { [3, 3, 3] };
        assert_eq!(users.map(ok), expected, "round {round}");
    }
    // Every check its own EVALSHA (the refused call is not counted, but
    // rejected, once), besides the store's access probe at start-up.
    assert_eq!(server.calls("evalsha"), 30 + 1);
    let evalsha = evalsha_stats(&server);
    assert!(evalsha.contains(",rejected_calls=1,"), "{evalsha}");
}

/// A store built on one runtime and used on another after the first is
/// gone (a store shared across tests' runtimes): its checks, batched ones
/// included, do not wait on the dead runtime; once the store has connected
/// again from the new one, they decide exactly.
#[test]
fn a_store_outlives_the_runtime_it_was_built_on() {
    let server = RedisServer::start();
    let built = tokio::runtime::Runtime::new().unwrap();
    let store = built.block_on(async {
        RedisStore::builder()
            .url(server.url())
            .timeout(Duration::from_millis(200))
            .build()
            .await
            .unwrap()
    });
    drop(built);
    let other = tokio::runtime::Runtime::new().unwrap();
    other.block_on(async {
        let rule = Rule::new().hour(3).algorithm(Algorithm::TokenBucket);
        let app = App::with(one_route(rule), store, |l| {
            l.denial_cache(0).fail_mode(FailMode::Closed)
        });
        // Closed: 503 while the store reconnects, never a hang.
        let started = Instant::now();
        loop {
            let asked = Instant::now();
            let status = app.get("/a", "u").await.status;
            assert!(asked.elapsed() < Duration::from_secs(2));
            if status == StatusCode::OK {
                break;
            }
            assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
            assert!(
                started.elapsed() < Duration::from_secs(10),
                "never reconnected"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let rest = [
            app.get("/a", "u").await.status,
            app.get("/a", "u").await.status,
            app.get("/a", "u").await.status,
        ];
        assert_eq!(
            rest,
            [
                StatusCode::OK,
                StatusCode::OK,
                StatusCode::TOO_MANY_REQUESTS
            ]
        );
    });
}

/// A builder for a server of the test's own: on a multiplexed connection
/// of the store's, or through a pool of the caller's (returned too).
fn builder_for(
    server: &RedisServer,
    pooled: bool,
) -> (RedisStoreBuilder, Option<deadpool_redis::Pool>) {
    if pooled {
        let pool = deadpool_redis::Config::from_url(server.url())
            .create_pool(Some(deadpool_redis::Runtime::Tokio1))
            .unwrap();
        (RedisStore::builder().pool(pool.clone()), Some(pool))
    } else {
        (RedisStore::builder().url(server.url()), None)
    }
}

/// A caller's pool: its connections are checked out once and used by
/// every check, not one `pool.get()` (with its `UNWATCH` + `PING`) per
/// check; the store keeps one connection out of the pool while it lives.
#[tokio::test]
async fn a_pool_costs_at_most_one_command_per_check_and_lends_the_store_one_connection() {
    let server = RedisServer::start();
    let (builder, pool) = builder_for(&server, true);
    let pool = pool.unwrap();
    // (No keepalive ping, should the machine stall for a second.)
    let store = builder
        .timeout(TEST_TIMEOUT)
        .connect_timeout(TEST_TIMEOUT)
        .keepalive(None)
        .build()
        .await
        .unwrap();
    let status = pool.status();
    assert_eq!((status.size, status.available), (1, 0));
    // (Every denial asks the store: no local cache.)
    let app = App::with(one_route(Rule::new().second(3).minute(100)), store, |l| {
        l.denial_cache(0)
    });
    assert_eq!(server.cli(&["config", "resetstat"]), "OK");
    let users = ["u", "v", "w", "x"];
    let replies =
        futures_util::future::join_all((0..40).map(|i| app.get("/a", users[i % 4]))).await;
    let allowed = replies
        .iter()
        .filter(|r| r.status == StatusCode::OK)
        .count();
    assert_eq!(allowed, 12);
    // At most one command per check: since the reset (counted), the only
    // commands run are the scripts and what they call (a new log's SET,
    // then GETRANGE and SETRANGE); no PING or UNWATCH. The 40 checks,
    // made in one tick, went as one batch: one call of the batch script.
    assert_eq!(
        commands_run(&server),
        ["config|resetstat", "evalsha", "getrange", "set", "setrange"]
    );
    assert_eq!(server.calls("evalsha"), 1);
    // Dropped: its connection goes back to the pool.
    drop(app);
    let status = pool.status();
    assert_eq!((status.size, status.available), (1, 1));
}

#[tokio::test]
async fn killed_redis_fails_open_or_closed_within_the_deadline() {
    let deadline = Duration::from_millis(50);
    let shapes = [
        (FailMode::Open, false),
        (FailMode::Closed, false),
        (FailMode::Open, true),
    ];
    for (mode, pooled) in shapes {
        let mut server = RedisServer::start();
        // (Through a caller's pool, the connection is replaced through it.)
        let store = builder_for(&server, pooled)
            .0
            .timeout(deadline)
            .build()
            .await
            .unwrap();
        let app = App::with(one_route(Rule::new().second(1)), store, |l| {
            l.fail_mode(mode)
        });
        assert_eq!(app.get("/a", "u").await.status, StatusCode::OK);
        assert_eq!(
            app.get("/a", "u").await.status,
            StatusCode::TOO_MANY_REQUESTS
        );
        server.kill();
        // A user the store never denied (a denied one stays denied from the
        // local cache until its wait ends, store or no store).
        for _ in 0..20 {
            let started = Instant::now();
            let reply = app.get("/a", "w").await;
            let took = started.elapsed();
            match mode {
                FailMode::Open => {
                    assert_eq!(reply.status, StatusCode::OK);
                    assert!(!reply.limited());
                }
                _ => assert_eq!(reply.status, StatusCode::SERVICE_UNAVAILABLE),
            }
            // The deadline, plus scheduling slack on a busy machine.
            assert!(
                took < deadline + Duration::from_millis(150),
                "{mode:?} (pooled: {pooled}) took {took:?}"
            );
        }
        // Restarted: limiting resumes by itself (the budget is gone with
        // the data, so the first request is allowed again).
        server.restart();
        let resumed = until_limited(&app, "v", Duration::from_secs(3)).await;
        assert!(
            resumed < Duration::from_millis(1500),
            "resumed after {resumed:?}"
        );
        assert_eq!(
            app.get("/a", "v").await.status,
            StatusCode::TOO_MANY_REQUESTS
        );
    }
}

/// A server of its own, with the one-a-second app on it (see
/// [`one_a_second_on`]) after a first allowed request, then paused
/// (`CLIENT PAUSE ms kind`).
async fn paused_after_one_check(
    pooled: bool,
    deadline: Duration,
    ms: &str,
    kind: &str,
) -> (RedisServer, App) {
    let server = RedisServer::start();
    let app = one_a_second_on(&server, pooled, deadline).await;
    assert_eq!(app.get("/a", "u").await.status, StatusCode::OK);
    assert_eq!(server.cli(&["client", "pause", ms, kind]), "OK");
    (server, app)
}

#[tokio::test]
async fn paused_redis_cannot_stall_requests() {
    for pooled in [false, true] {
        paused_redis_cannot_stall(pooled).await;
    }
}

/// A paused server answers nothing: only the store's deadline ends a
/// check (a pool's connections have the caller's response timeout).
async fn paused_redis_cannot_stall(pooled: bool) {
    let deadline = Duration::from_millis(50);
    let (_server, app) = paused_after_one_check(pooled, deadline, "1500", "all").await;
    let started = Instant::now();
    for _ in 0..5 {
        let t = Instant::now();
        let reply = app.get("/a", "u").await;
        assert_eq!(reply.status, StatusCode::OK);
        assert!(!reply.limited());
        assert!(
            t.elapsed() < deadline + Duration::from_millis(150),
            "took {:?} (pooled: {pooled})",
            t.elapsed()
        );
    }
    assert!(started.elapsed() < Duration::from_millis(1500));
    // Once the pause ends, limiting resumes.
    limiting_resumes(&app, Duration::from_secs(4)).await;
}

#[tokio::test]
async fn a_server_holding_writes_is_not_connected_to_again_and_again() {
    for pooled in [false, true] {
        a_server_holding_writes(pooled).await;
    }
}

/// A server that answers reads but holds writes and scripts (`CLIENT PAUSE
/// ... WRITE`, as a coordinated `FAILOVER` does) takes a new connection,
/// but runs no check on it: the store does not take it for one that
/// works, so after the timeouts that drop its connection the checks fail
/// at once until the pause ends, instead of three of them waiting out
/// their deadline on every new connection.
async fn a_server_holding_writes(pooled: bool) {
    let deadline = Duration::from_millis(50);
    let (_server, app) = paused_after_one_check(pooled, deadline, "3000", "write").await;
    let started = Instant::now();
    let (mut waited, mut sent) = (0, 0);
    while started.elapsed() < Duration::from_millis(1200) && sent < 200 {
        let t = Instant::now();
        let reply = app.get("/a", "u").await;
        assert!(!reply.limited(), "(pooled: {pooled})");
        if t.elapsed() >= deadline * 9 / 10 {
            waited += 1;
        }
        sent += 1;
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(sent >= 20, "{sent} requests in 1.2 s (pooled: {pooled})");
    // (The three timeouts in a row that drop the connection, and one that
    // was on its way.)
    assert!(
        waited <= 4,
        "{waited} of {sent} requests waited out the deadline (pooled: {pooled})"
    );
    // Once the pause ends, limiting resumes.
    limiting_resumes(&app, Duration::from_secs(6)).await;
}

/// A store pointed at a replica (`url(..)` on a server a failover demoted,
/// or a mistake) does not connect to it: it would answer every check
/// `READONLY`, on which the store drops the connection, and the store
/// would connect to it again at once, once per check (an outside review
/// counted one connection and one logged reconnect per request). The
/// checks fail at once by the fail mode, a handful of connections are
/// tried, and once the replica is made a master its checks are decided.
#[tokio::test]
async fn a_replica_is_not_connected_to_once_per_check() {
    let master = RedisServer::start();
    let replica = RedisServer::start_with(&["--replicaof", "127.0.0.1", &master.port.to_string()]);
    let store = RedisStore::builder()
        .url(replica.url())
        .timeout(Duration::from_millis(50))
        .build()
        .await
        .unwrap();
    let app = App::new(one_route(Rule::new().second(1)), store);
    let connections = || -> u64 {
        let info = replica.cli(&["info", "stats"]);
        let line = info
            .lines()
            .find_map(|l| l.strip_prefix("total_connections_received:"))
            .unwrap();
        line.trim().parse().unwrap()
    };
    let before = connections();
    for i in 0..20 {
        let started = Instant::now();
        let reply = app.get("/a", &format!("u{i}")).await;
        assert_eq!(reply.status, StatusCode::OK);
        assert!(!reply.limited());
        // (At once: no connection to wait on. Bounded loosely, for a busy
        // machine.)
        assert!(started.elapsed() < Duration::from_millis(250));
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // (Each `cli` call is a connection too: the two of `connections`. The
    // store's tries back off from 25–50 ms to 250–500 ms: about six in
    // these 0.5 s.)
    let made = connections() - before - 1;
    assert!(made <= 9, "{made} connections for 20 checks");
    assert_eq!(replica.cli(&["replicaof", "no", "one"]), "OK");
    limiting_resumes(&app, Duration::from_secs(4)).await;
}

#[tokio::test]
async fn unreachable_redis_at_start_up_is_not_fatal() {
    let mut server = RedisServer::start();
    let url = server.url();
    server.kill();
    let store = RedisStore::builder()
        .url(&url)
        .timeout(Duration::from_millis(50))
        .connect_timeout(Duration::from_millis(100))
        .build()
        .await
        .unwrap();
    let app = App::new(one_route(Rule::new().second(1)), store);
    assert!(!app.get("/a", "u").await.limited());
    server.restart();
    until_limited(&app, "u", Duration::from_secs(3)).await;
}

/// A target set up wrongly fails the build, naming the mistake, where a
/// store that kept retrying would fail every check, by its fail mode, for
/// good: a Cluster client on a standalone server, a direct connection to a
/// node of a Cluster of several masters (which answers `MOVED` for the
/// others' budgets), a master name no sentinel knows, a wrong password.
/// (An unreachable Redis still is not an error:
/// `unreachable_redis_at_start_up_is_not_fatal`.)
#[tokio::test]
async fn a_target_set_up_wrongly_is_an_error_at_build() {
    use support::redis_server::{RedisCluster, RedisSentinels};
    use tower_ratelimit::StoreErrorKind;
    let standalone = RedisServer::start();
    let e = RedisStore::builder()
        .cluster([standalone.url()])
        .build()
        .await
        .unwrap_err();
    assert_eq!(e.kind(), StoreErrorKind::Config, "{e}");
    assert!(e.to_string().contains("cluster support disabled"), "{e}");
    assert!(e.to_string().contains("the server is not a Cluster node: reach a standalone server with RedisStoreBuilder::url"), "{e}");

    let cluster = RedisCluster::start();
    for node in &cluster.nodes {
        let e = RedisStore::builder()
            .url(node.url())
            .build()
            .await
            .unwrap_err();
        assert_eq!(e.kind(), StoreErrorKind::Config, "{e}");
        assert!(e.to_string().contains("`cluster(..)`"), "{e}");
    }
    // (The Cluster client itself, on the same nodes, is fine.)
    RedisStore::builder()
        .cluster(cluster.urls())
        .build()
        .await
        .unwrap();

    let set = RedisSentinels::start();
    let e = RedisStore::builder()
        .sentinel([set.sentinel_url()], "nosuchmaster")
        .build()
        .await
        .unwrap_err();
    assert_eq!(e.kind(), StoreErrorKind::Config, "{e}");
    assert!(e.to_string().contains("nosuchmaster"), "{e}");

    let guarded = RedisServer::start();
    assert_eq!(
        guarded.cli(&["config", "set", "requirepass", "right"]),
        "OK"
    );
    let wrong = format!("redis://:wrong@127.0.0.1:{}", guarded.port);
    let e = RedisStore::builder().url(wrong).build().await.unwrap_err();
    assert_eq!(e.kind(), StoreErrorKind::Config, "{e}");
    let right = format!("redis://:right@127.0.0.1:{}", guarded.port);
    let store = RedisStore::builder().url(right).build().await.unwrap();
    let app = App::new(one_route(Rule::new().second(1)), store);
    assert!(app.get("/a", "u").await.limited());

    // A user whose ACL denies `SCRIPT` (the scripts are loaded with it),
    // though it allows `EVALSHA`.
    let acl = RedisServer::start();
    assert_eq!(
        acl.cli(&["acl", "setuser", "limiter", "on", ">pw", "~*", "&*", "+@all", "-script"]),
        "OK"
    );
    let denied = format!("redis://limiter:pw@127.0.0.1:{}", acl.port);
    let e = RedisStore::builder().url(denied).build().await.unwrap_err();
    assert_eq!(e.kind(), StoreErrorKind::Config, "{e}");
    assert!(e.to_string().contains("no permissions"), "{e}");
    // One allowed `SCRIPT LOAD` alone (no `SCRIPT EXISTS`) is enough.
    assert_eq!(
        acl.cli(&[
            "acl",
            "setuser",
            "loader",
            "on",
            ">pw",
            "~*",
            "&*",
            "+@all",
            "-script",
            "+script|load"
        ]),
        "OK"
    );
    let least = format!("redis://loader:pw@127.0.0.1:{}", acl.port);
    let store = RedisStore::builder().url(least).build().await.unwrap();
    let app = App::new(one_route(Rule::new().second(1)), store);
    assert!(app.get("/a", "u").await.limited());

    // A user whose ACL denies the checks' own command, or the store's
    // keys: every check would fail for good, so the build does.
    let setuser = |name: &str, rules: &[&str]| {
        let mut args = vec!["acl", "setuser", name, "on", ">pw", "&*", "+@all"];
        args.extend_from_slice(rules);
        assert_eq!(acl.cli(&args), "OK");
        format!("redis://{name}:pw@127.0.0.1:{}", acl.port)
    };
    for (name, rules) in [
        ("no-evalsha", &["~*", "-evalsha"][..]),
        ("other-keys", &["~other:*"][..]),
        ("read-only", &["%R~*"][..]),
    ] {
        let url = setuser(name, rules);
        let e = RedisStore::builder().url(url).build().await.unwrap_err();
        assert_eq!(e.kind(), StoreErrorKind::Config, "{name}: {e}");
        assert!(e.to_string().contains("no permissions"), "{name}: {e}");
    }
    // Keys under the store's prefix are enough.
    let url = setuser("prefixed", &["~app:*"]);
    let store = RedisStore::builder().url(url).prefix("app").build().await;
    let app = App::new(one_route(Rule::new().second(1)), store.unwrap());
    assert!(app.get("/a", "u").await.limited());

    // A database the server does not have.
    let url = format!("redis://127.0.0.1:{}/99", acl.port);
    let e = RedisStore::builder().url(url).build().await.unwrap_err();
    assert_eq!(e.kind(), StoreErrorKind::Config, "{e}");
    assert!(e.to_string().contains("DB index"), "{e}");
}

/// A server that refuses every command for a while (`LOADING`: reading its
/// data after a restart; here a fake one that answers nothing else) is not
/// sent the scripts: the store retries its connection, and sends
/// `SCRIPT LOAD` only once the server answers. Before, each try loaded every
/// script (some 45, half a megabyte), on every replica at once.
#[tokio::test]
async fn a_server_loading_its_data_is_not_sent_the_scripts() {
    use std::io::{BufRead, BufReader, Write};
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let (commands, loads) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let (seen, loaded) = (commands.clone(), loads.clone());
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(stream) = stream else { return };
            let (seen, loaded) = (seen.clone(), loaded.clone());
            std::thread::spawn(move || {
                let mut reader = BufReader::new(stream.try_clone().unwrap());
                let mut writer = stream;
                // RESP arrays of bulk strings: `*n`, then `$len` and the
                // argument, n times.
                let mut line = String::new();
                loop {
                    line.clear();
                    if reader.read_line(&mut line).unwrap_or(0) == 0 {
                        return;
                    }
                    let Some(n) = line.trim_end().strip_prefix('*') else {
                        continue;
                    };
                    let n: usize = n.parse().unwrap();
                    let mut args = Vec::new();
                    for _ in 0..2 * n {
                        line.clear();
                        reader.read_line(&mut line).unwrap();
                        args.push(line.trim_end().to_owned());
                    }
                    let words: Vec<String> = args
                        .iter()
                        .skip(1)
                        .step_by(2)
                        .map(|a| a.to_uppercase())
                        .collect();
                    seen.fetch_add(1, Ordering::SeqCst);
                    let reply = match words.first().map(String::as_str) {
                        Some("INFO") => {
                            let text = "# Cluster\r\ncluster_enabled:0\r\n";
                            format!("${}\r\n{text}\r\n", text.len())
                        }
                        Some("CLIENT") => "+OK\r\n".to_owned(),
                        Some("SCRIPT") if words.get(1).map(String::as_str) == Some("LOAD") => {
                            loaded.fetch_add(1, Ordering::SeqCst);
                            "-LOADING Redis is loading the dataset in memory\r\n".to_owned()
                        }
                        _ => "-LOADING Redis is loading the dataset in memory\r\n".to_owned(),
                    };
                    if writer.write_all(reply.as_bytes()).is_err() {
                        return;
                    }
                }
            });
        }
    });
    let store = RedisStore::builder()
        .url(format!("redis://127.0.0.1:{port}"))
        .build()
        .await
        .unwrap();
    // The first try and those of the next second (backoff from 50 ms).
    let started = Instant::now();
    while commands.load(Ordering::SeqCst) < 20 {
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "the store stopped trying"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(
        loads.load(Ordering::SeqCst),
        0,
        "scripts sent to a server loading its data"
    );
    drop(store);
}

#[tokio::test]
async fn bad_configuration_is_an_error() {
    let e = RedisStore::builder()
        .url("not a url")
        .build()
        .await
        .unwrap_err();
    assert!(e.to_string().contains("invalid redis url"), "{e}");
    let e = RedisStore::builder()
        .url("redis://127.0.0.1:1")
        .prefix("a{b}")
        .build()
        .await
        .unwrap_err();
    assert!(e.to_string().contains("prefix"), "{e}");
    let e = RedisStore::builder().build().await.unwrap_err();
    assert!(e.to_string().contains("no redis"), "{e}");
}

#[tokio::test]
async fn fallback_limits_in_memory_while_redis_is_down() {
    let mut server = RedisServer::start();
    let store = RedisStore::builder()
        .url(server.url())
        .timeout(Duration::from_millis(50))
        .build()
        .await
        .unwrap();
    let app = App::on_store_clock(one_route(Rule::new().minute(2)), store, |l| {
        l.fail_mode(FailMode::Fallback)
    });
    assert_eq!(app.get("/a", "u").await.status, StatusCode::OK);
    server.kill();
    // Still limited (2 per minute, now counted in memory), never stalled.
    let started = Instant::now();
    let mut statuses = Vec::new();
    for _ in 0..4 {
        statuses.push(app.get("/a", "v").await.status);
    }
    assert_eq!(
        statuses,
        [
            StatusCode::OK,
            StatusCode::OK,
            StatusCode::TOO_MANY_REQUESTS,
            StatusCode::TOO_MANY_REQUESTS
        ]
    );
    assert!(
        started.elapsed() < Duration::from_millis(500),
        "{:?}",
        started.elapsed()
    );
    // Back on Redis once it answers again (probed every 500 ms).
    server.restart();
    let resumed = Instant::now();
    for i in 0.. {
        // A new user each time, so no memory budget runs out meanwhile.
        let user = format!("w{i}");
        assert_eq!(app.get("/a", &user).await.status, StatusCode::OK);
        if keys(server.port, "rl")
            .iter()
            .any(|k| k.contains(&format!(":{user}}}")))
        {
            break;
        }
        assert!(
            resumed.elapsed() < Duration::from_secs(3),
            "never returned to redis"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A rule whose windows change keeps the state of the windows it keeps, on
/// every algorithm, with the straight-line scripts (fixed window and token
/// bucket without a block time) and the general ones, and agrees with the
/// memory store.
#[tokio::test]
async fn changed_windows_keep_the_state_of_the_windows_they_keep() {
    use tower_ratelimit::clock::Timestamp;
    use tower_ratelimit::store::{Check, Store};
    use tower_ratelimit::{Algorithm, MemoryStore, Window};
    let redis = standalone().await;
    let memory = MemoryStore::new();
    let now = Timestamp::from_micros(1_700_000_000_123_456);
    let w = |secs, limit| Window::new(Duration::from_secs(secs), limit).unwrap();
    for algorithm in [
        Algorithm::SlidingLog,
        Algorithm::SlidingWindow,
        Algorithm::FixedWindow,
        Algorithm::TokenBucket,
    ] {
        for block in [None, Some(Duration::from_secs(1))] {
            let budget = format!("changed:{algorithm:?}:{}", block.is_some());
            let check = |windows: Vec<Window>| {
                let check = Check::new(budget.as_str(), windows)
                    .with_algorithm(algorithm)
                    .at(now);
                match block {
                    Some(block) => check.with_block(block),
                    None => check,
                }
            };
            let mut remaining = Vec::new();
            for windows in [
                vec![w(1, 5), w(60, 10)],
                vec![w(1, 5), w(60, 10)],
                // The minute stays; the second goes; the hour is new.
                vec![w(60, 10), w(3600, 100)],
                // Reordered and shrunk: the hour keeps its count.
                vec![w(3600, 100)],
            ] {
                let on_redis = redis.check(check(windows.clone())).await.unwrap();
                let in_memory = memory.check(check(windows)).await.unwrap();
                let left: Vec<u32> = on_redis.windows().iter().map(|s| s.remaining).collect();
                let memory_left: Vec<u32> =
                    in_memory.windows().iter().map(|s| s.remaining).collect();
                assert_eq!(left, memory_left, "{algorithm:?}, block {block:?}");
                assert!(on_redis.allowed(), "{algorithm:?}, block {block:?}");
                remaining.push(left);
            }
            // A sliding log keeps the requests themselves, so a new window
            // counts the ones it covers; the counters start new windows
            // empty.
            let hour = match algorithm {
                Algorithm::SlidingLog => 97,
                _ => 99,
            };
            assert_eq!(
                remaining,
                [vec![4, 9], vec![3, 8], vec![7, hour], vec![hour - 1]],
                "{algorithm:?}, block {block:?}"
            );
        }
    }
}

/// On the server's clock, a counter state whose TTL still holds is saved
/// without touching it: overwritten in place when it keeps its length,
/// replaced whole when the rule's window count changed (an in-place write
/// would leave the old layout's tail, which the next check would read as
/// windows of its own). The counts of the windows kept go on either way.
#[tokio::test]
async fn a_counter_state_is_written_in_place_only_when_it_keeps_its_length() {
    use tower_ratelimit::store::{Check, Store};
    use tower_ratelimit::Window;
    let server = RedisServer::start();
    let store = own_store(&server).await;
    let w = |secs, limit| Window::new(Duration::from_secs(secs), limit).unwrap();
    let (minute, hour, day) = (w(60, 100), w(3600, 1000), w(86_400, 10_000));
    let five = vec![w(1, 10), minute, hour, day, w(7 * 86_400, 100_000)];
    let three = vec![minute, hour, day];
    let check = |windows: &Vec<Window>| {
        Check::new("shrunk", windows.clone()).with_algorithm(Algorithm::FixedWindow)
    };
    let remaining = |d: &tower_ratelimit::Decision| -> Vec<u32> {
        d.windows().iter().map(|s| s.remaining).collect()
    };
    let first = store.check(check(&five)).await.unwrap();
    assert_eq!(remaining(&first), [9, 99, 999, 9_999, 99_999]);
    let key = server.cli(&["--scan", "--pattern", "*shrunk*"]);
    let key = key.trim().to_owned();
    let strlen = || server.cli(&["strlen", &key]);
    let pttl = || -> i64 { server.cli(&["pttl", &key]).parse().unwrap() };
    // Three numbers per window; the TTL runs to the end of the longest.
    assert_eq!(strlen(), (8 * 3 * 5).to_string());
    let ttl = pttl();
    assert!(ttl > 0, "pttl {ttl}");
    // Three of the five windows: the state shrinks to their three. (The
    // day's count is the one read: a minute or an hour may end meanwhile.)
    let second = store.check(check(&three)).await.unwrap();
    assert_eq!(remaining(&second)[2], 9_998);
    assert_eq!(strlen(), (8 * 3 * 3).to_string());
    let before = server.calls("setrange");
    for left in [9_997, 9_996, 9_995] {
        let next = store.check(check(&three)).await.unwrap();
        assert_eq!(remaining(&next)[2], left);
    }
    assert_eq!(strlen(), (8 * 3 * 3).to_string());
    // In place (one of the three saves may cross midnight and set a TTL).
    assert!(server.calls("setrange") - before >= 2);
    // The TTL kept (or, past midnight, set to the day's end): never longer.
    let kept = pttl();
    assert!(kept > 0 && kept <= ttl, "pttl {kept}, first {ttl}");
}

/// A check's future is moved into its box and under its deadline on every
/// request: the shapes that need large futures (pools, Cluster) box their
/// own, so the default shape's stays small (it was 7 KiB, a measurable
/// share of the store's CPU per request).
#[tokio::test]
async fn a_check_future_stays_small() {
    use tower_ratelimit::store::{Check, Store};
    // (Nothing listens there: building is not fatal, and no check runs.)
    let store = RedisStore::builder()
        .url("redis://127.0.0.1:1")
        .build()
        .await
        .unwrap();
    let window = tower_ratelimit::Window::new(Duration::from_secs(1), 1).unwrap();
    let future = store.check(Check::new("a", vec![window]));
    let size = std::mem::size_of_val(&*future);
    assert!(size <= 1024, "a check's future takes {size} bytes");
}

/// A request whose microsecond falls inside a run of taken ones (after a
/// costly request) finds the first free microsecond in one search: a few
/// commands, not one `ZADD` per taken microsecond inside the script. (The
/// sorted-set layout: a rule of six windows runs the general script.)
#[tokio::test]
async fn a_request_after_a_packed_run_finds_its_microsecond_in_one_search() {
    let server = RedisServer::start();
    let store = own_store(&server).await;
    let rule = Rule::new()
        .second(100_000)
        .per(Duration::from_secs(10), 100_000)
        .minute(100_000)
        .per(Duration::from_secs(600), 100_000)
        .hour(100_000)
        .day(100_000);
    let app = App::with(one_route(rule), store, |l| {
        l.cost(|head| match head.uri.path() {
            "/a/big" => tower_ratelimit::rules::MAX_LOG_COST,
            "/a/five" => 5,
            _ => 1,
        })
    });
    let zadds = || server.calls("zadd");
    // 10,000 entries from now on; then, at the same instant, one more.
    // (A run of 10,000 at one instant: ten requests of the most one may
    // cost, each after the last's run.)
    for _ in 0..10_000 / tower_ratelimit::rules::MAX_LOG_COST {
        assert_eq!(app.get("/a/big", "u").await.status, StatusCode::OK);
    }
    let before = zadds();
    let reply = app.get("/a", "u").await;
    assert_eq!(reply.status, StatusCode::OK);
    assert_eq!(reply.number("x-ratelimit-remaining"), 100_000 - 10_001);
    // (The one-entry ZADD at now, then one after the run.)
    assert!(zadds() - before <= 2, "{} ZADDs", zadds() - before);
    let keys = server.cli(&["--scan", "--pattern", "*:u}:l"]);
    assert_eq!(server.cli(&["zcard", keys.trim()]), "10001");
    // The clock steps back 3 µs: three free microseconds below the run,
    // then the run is skipped in one search again.
    app.rewind(Duration::from_micros(3));
    let before = zadds();
    assert_eq!(app.get("/a/five", "u").await.status, StatusCode::OK);
    assert!(zadds() - before <= 2, "{} ZADDs", zadds() - before);
    assert_eq!(server.cli(&["zcard", keys.trim()]), "10006");
}

/// A sliding log on the straight-line shape is one packed string: its
/// entries that left the window leave the string in batches (it stays
/// within its limit plus one batch), most writes go in place over its
/// trailer (`SETRANGE`, the TTL kept), and a check reads a few dozen
/// bytes (`GETRANGE`), never the whole log.
#[tokio::test]
async fn a_packed_log_stays_near_its_limit_and_is_written_in_place() {
    let server = RedisServer::start();
    let store = own_store(&server).await;
    let app = App::new(one_route(Rule::new().second(50)), store);
    let mut allowed = 0;
    // 100 requests a second for 6 s: half of them allowed.
    for _ in 0..600 {
        if app.get("/a", "u").await.status == StatusCode::OK {
            allowed += 1;
        }
        app.advance_ms(10);
    }
    assert_eq!(allowed, 300);
    let key = server.cli(&["--scan", "--pattern", "*:u}:p3"]);
    let key = key.trim();
    let calls = |command: &str| server.calls(command);
    assert_eq!(
        calls("zadd") + calls("get"),
        0,
        "a sorted set, or a whole read"
    );
    let (set, setrange) = (calls("set"), calls("setrange"));
    assert!(
        set * 4 < setrange,
        "{set} SETs, {setrange} SETRANGEs for {allowed} allowed requests"
    );
    assert_eq!(server.cli(&["type", key]), "string");
    assert_eq!(server.log_entries(key).len(), 50);
    // The live 50, fewer dropped ones than 64 (then they go), and the
    // trailer's 15 numbers.
    let bytes: usize = server.cli(&["strlen", key]).parse().unwrap();
    assert!(bytes < 8 * (50 + 64 + 15), "{bytes} bytes");
    let ttl: i64 = server.cli(&["pttl", key]).parse().unwrap();
    assert!(ttl > 0, "pttl {ttl}");
}

/// A window that can neither deny a check nor have the fewest remaining
/// is not searched when the layer shows only the constraining window (the
/// `X-RateLimit-*` headers): one read per check, where counting every
/// window exactly (as the IETF headers need) takes two once the 1 s
/// window's start is older than the entries read with the trailer; and
/// the `X-RateLimit-*` headers are the same either way. The per-window
/// headers count every window exactly too.
#[tokio::test]
async fn a_window_that_cannot_deny_is_not_searched_for_the_x_headers() {
    type Seen = Vec<(StatusCode, u64, u64, u64)>;
    async fn run(mode: HeaderMode) -> (Seen, u64, Option<String>) {
        let server = RedisServer::start();
        let store = own_store(&server).await;
        // (The minute window has the fewest remaining: it counts more.)
        let rule = Rule::new().second(10_000).minute(10_000);
        let app = App::with(one_route(rule), store, |l| l.headers(mode));
        let mut seen = Vec::new();
        let mut second = None;
        // 50 requests a second for 6 s: the 1 s window's oldest entry
        // leaves it before every check after the first second.
        for _ in 0..300 {
            let reply = app.get("/a", "u").await;
            seen.push((
                reply.status,
                reply.number("x-ratelimit-limit"),
                reply.number("x-ratelimit-remaining"),
                reply.number("x-ratelimit-reset"),
            ));
            second = reply
                .header("x-ratelimit-remaining-second")
                .map(str::to_owned);
            app.advance_ms(20);
        }
        (seen, server.calls("getrange"), second)
    }
    let (x, x_reads, none) = run(HeaderMode::X).await;
    let (both, exact_reads, _) = run(HeaderMode::Both).await;
    let (windows, window_reads, second) = run(HeaderMode::XWindows).await;
    assert_eq!(x, both);
    assert_eq!(x, windows);
    assert_eq!(none, None);
    // The last second holds the last 50 requests.
    assert_eq!(second.as_deref(), Some("9950"));
    assert!(window_reads >= 500, "{window_reads} GETRANGEs per window");
    // (The oldest entry is 5.98 s old: 54.02 s left, rounded up.)
    assert_eq!(x[299], (StatusCode::OK, 10_000, 10_000 - 300, 55));
    assert!(x_reads <= 300 + 5, "{x_reads} GETRANGEs for 300 checks");
    assert!(
        exact_reads >= 500,
        "{exact_reads} GETRANGEs counting exactly"
    );
}

/// A penalty on the sorted-set layout after a run ahead of the clock (a
/// burst of costly requests at one instant) takes the first free
/// microseconds past the run with one search: it neither reads the run
/// nor writes it back (a run of up to the limit's length would have held
/// Redis for as long as a million entries take).
#[tokio::test]
async fn a_penalty_after_a_run_ahead_of_the_clock_reads_none_of_it() {
    use tower_ratelimit::clock::Timestamp;
    use tower_ratelimit::rules::MAX_LOG_COST;
    use tower_ratelimit::{Adjustment, Check, Store, Window};
    let server = RedisServer::start();
    let store = own_store(&server).await;
    // (Six windows: the general script, whose log is a sorted set.)
    let windows: Vec<Window> = [1, 10, 60, 600, 3600, 86_400]
        .iter()
        .map(|&s| Window::new(Duration::from_secs(s), 100_000).unwrap())
        .collect();
    let check = Check::new("r1:u", windows).at(Timestamp::from_micros(START));
    for _ in 0..10 {
        let d = store
            .check(check.clone().with_cost(MAX_LOG_COST))
            .await
            .unwrap();
        assert!(d.allowed());
    }
    let (ranges, adds) = (server.calls("zrangebyscore"), server.calls("zadd"));
    store
        .adjust(check.clone(), Adjustment::Penalty(5))
        .await
        .unwrap();
    assert_eq!(server.calls("zrangebyscore"), ranges, "the run was read");
    assert!(
        server.calls("zadd") - adds <= 2,
        "{} ZADDs",
        server.calls("zadd") - adds
    );
    let key = store.keys(&check)[0].clone();
    assert_eq!(server.cli(&["zcard", &key]), "10005");
    // Past the run: the five take the microseconds after its newest.
    let newest = server.cli(&["zrange", &key, "-1", "-1"]);
    assert_eq!(newest.trim(), (START + 10_004).to_string());
}

/// The same on the packed layout: after a run of 10,000 (ten requests of
/// the most one may cost), one more
/// at the same instant is appended after the run (found with a search, no
/// copy of the run), and one whose clock stepped back below the run fills
/// the free microseconds there, rewriting only the entries after them.
#[tokio::test]
async fn a_packed_log_appends_after_a_run_of_taken_microseconds() {
    let server = RedisServer::start();
    let store = own_store(&server).await;
    let app = App::with(one_route(Rule::new().minute(100_000)), store, |l| {
        l.cost(|head| match head.uri.path() {
            "/a/big" => tower_ratelimit::rules::MAX_LOG_COST,
            "/a/five" => 5,
            _ => 1,
        })
    });
    let key = || server.cli(&["--scan", "--pattern", "*:u}:p3"]);
    let bytes = |key: &str| -> usize { server.cli(&["strlen", key]).parse().unwrap() };
    // (A run of 10,000 at one instant: ten requests of the most one may
    // cost, each after the last's run.)
    for _ in 0..10_000 / tower_ratelimit::rules::MAX_LOG_COST {
        assert_eq!(app.get("/a/big", "u").await.status, StatusCode::OK);
    }
    let key = key();
    let key = key.trim();
    let before = bytes(key);
    let reply = app.get("/a", "u").await;
    assert_eq!(reply.status, StatusCode::OK);
    assert_eq!(reply.number("x-ratelimit-remaining"), 100_000 - 10_001);
    assert_eq!(bytes(key), before + 8);
    let log = server.log_entries(key);
    assert_eq!(log.len(), 10_001);
    assert!(log.windows(2).all(|w| w[1] == w[0] + 1), "one run");
    // The clock steps back 3 µs: three free microseconds below the run,
    // then two after it.
    let start = app.rewind(Duration::from_micros(3));
    assert_eq!(app.get("/a/five", "u").await.status, StatusCode::OK);
    let log = server.log_entries(key);
    assert_eq!(log.len(), 10_006);
    assert!(log.windows(2).all(|w| w[1] == w[0] + 1), "still one run");
    assert_eq!(log[0], start.as_micros() as i64 - 3);
}

/// A packed log's TTL is set again when the clock it runs on went back (or
/// its rule changed), even by a denied request: the key outlives its
/// newest entry on the clock it is checked on, not on the one it was
/// written on.
#[tokio::test]
async fn a_packed_log_keeps_its_entries_after_the_clock_steps_back() {
    let port = port_of(&shared().standalone);
    let prefix = unique_prefix();
    let store = standalone_at(&prefix).await;
    let app = App::new(one_route(Rule::new().second(1)), store);
    assert_eq!(app.get("/a", "u").await.status, StatusCode::OK);
    let key = keys(port, &prefix).remove(0);
    let pttl = || -> i64 { cli(port, &["pttl", &key]).parse().unwrap() };
    // (1 s, a second of slack, the injected clock's 10 s pad.)
    assert!(pttl() <= 12_000, "pttl {}", pttl());
    app.rewind(Duration::from_secs(20));
    // The entry is 20 s ahead of this clock: still in the window, and the
    // key must live until it leaves it, 21 s from now and more.
    let denied = app.get("/a", "u").await;
    assert_eq!(denied.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(denied.number("retry-after"), 21);
    assert!(pttl() > 21_000, "pttl {}", pttl());
}

/// The same for the general script's sorted set (six windows): a request
/// on a clock that went back sets the TTL from the newest entry, which an
/// earlier request left ahead of that clock, not from its own.
#[tokio::test]
async fn a_sorted_set_log_keeps_its_entries_after_the_clock_steps_back() {
    let port = port_of(&shared().standalone);
    let prefix = unique_prefix();
    let store = standalone_at(&prefix).await;
    let rule = (1..=6).fold(Rule::new(), |rule, s| rule.per(Duration::from_secs(s), 10));
    let app = App::new(one_route(rule), store);
    assert_eq!(app.get("/a", "u").await.status, StatusCode::OK);
    let key = keys(port, &prefix).remove(0);
    assert!(key.ends_with(":l"), "{key}");
    let pttl = || -> i64 { cli(port, &["pttl", &key]).parse().unwrap() };
    // (6 s and the injected clock's 10 s pad.)
    assert!(pttl() <= 16_000, "pttl {}", pttl());
    app.rewind(Duration::from_secs(20));
    // Allowed, with an entry of its own 20 s before the first one, which
    // stays in the 6 s window until 26 s from this clock: the key must
    // live that long (and the pad).
    assert_eq!(app.get("/a", "u").await.status, StatusCode::OK);
    assert_eq!(cli(port, &["zcard", &key]), "2");
    assert!(pttl() > 26_000, "pttl {}", pttl());
}

/// A value this script did not write under a packed log's key is
/// replaced by a fresh log when its numbers do not fit it, and refused
/// (an error that leaves out the key, which names the user: the layer's
/// fail mode) when they fit until a
/// read falls past its end; never a panic. (A value forged to look like a
/// log, whose trailer agrees with the bytes the script reads, is trusted,
/// as anything a writer of the store's keys leaves there: telling it apart
/// would cost every check one more command.)
#[tokio::test]
async fn a_packed_log_key_holding_something_else_is_replaced_or_refused() {
    let server = RedisServer::start();
    let store = own_store(&server).await;
    let windows: std::sync::Arc<[tower_ratelimit::Window]> =
        [tower_ratelimit::Window::new(Duration::from_secs(1), 5).unwrap()].into();
    let check = || {
        tower_ratelimit::Check::new("r0:u", windows.clone()).at(
            tower_ratelimit::clock::Timestamp::from_micros(1_000_000_000),
        )
    };
    let key = store.keys(&check())[0].clone();
    assert!(key.ends_with(":p3"), "{key}");
    // A trailer claiming 1,000 entries, starting at the 500th, in its 56
    // bytes alone (a window's hints, zero; then size, clock, TTL end,
    // start, fingerprint).
    let trailer = |fingerprint: f64| doubles(&[0.0, 0.0, 1000.0, 0.0, 0.0, 500.0, fingerprint]);
    let lie = trailer(1.0);
    let set = |value: &[u8]| {
        redis::cmd("SET")
            .arg(&key)
            .arg(value)
            .query::<()>(&mut connect(&server.url()))
            .unwrap();
    };
    set(&lie);
    let decision = tower_ratelimit::Store::check(&store, check())
        .await
        .unwrap();
    assert!(decision.allowed());
    assert_eq!(decision.windows()[0].remaining, 4);
    assert_eq!(server.log_entries(&key), [1_000_000_000]);
    // The same lie after 800 bytes of something else, forged with the
    // rule's own fingerprint (the last number of the log just written):
    // its numbers are taken as they are (a check does not test a trailer
    // of its own rule), and the first read past the string's end is
    // refused: here a newest entry at the check's time and a window hint
    // at the 500th entry, so the window's start is sought from there.
    // (With another fingerprint the string's length is checked too:
    // replaced, as above.)
    let written = server.cli(&["strlen", &key]);
    assert_eq!(written, "64", "one entry and a 56-byte trailer");
    let fingerprint = double_from_end(&raw_value(&server.url(), &key), 1);
    let mut long = vec![7u8; 792];
    long.extend_from_slice(&doubles(&[1_000_000_000.0, 500.0, 0.0]));
    long.extend_from_slice(&doubles(&[1000.0, 0.0, 0.0, 500.0, fingerprint]));
    set(&long);
    let error = tower_ratelimit::Store::check(&store, check())
        .await
        .unwrap_err();
    assert!(
        error
            .to_string()
            .contains("holds a value this script did not write"),
        "{error}"
    );
    // (The error is logged at `warn`: it must not carry the key, which
    // holds the user, such as an API key.)
    assert!(!error.to_string().contains(&key), "{error}");
    long.truncate(800);
    long.extend_from_slice(&trailer(fingerprint + 2.0));
    set(&long);
    let decision = tower_ratelimit::Store::check(&store, check())
        .await
        .unwrap();
    assert_eq!(decision.windows()[0].remaining, 4);
    assert_eq!(server.log_entries(&key), [1_000_000_000]);
}

/// On an injected clock, a check that changes nothing in a packed log
/// still records the clock it read (the trailer's `at`), so that a later
/// check on a clock below it is seen as a clock that went back, and sets
/// the TTL again: the clock can run on, step back a little and run on
/// without the key expiring under an entry still in its window.
#[tokio::test]
async fn a_packed_log_remembers_the_latest_clock_it_was_checked_on() {
    let port = port_of(&shared().standalone);
    let prefix = unique_prefix();
    let store = standalone_at(&prefix).await;
    let app = App::new(
        one_route(Rule::new().per(Duration::from_secs(20), 1)),
        store,
    );
    assert_eq!(app.get("/a", "u").await.status, StatusCode::OK);
    let key = keys(port, &prefix).remove(0);
    // (The fourth number from the end.)
    let at = || double_from_end(&raw_value(&shared().standalone, &key), 4) as i64;
    let start = tower_ratelimit::clock::Clock::now(&app.clock).as_micros() as i64;
    assert_eq!(at(), start);
    app.advance_ms(19_000);
    assert_eq!(
        app.get("/a", "u").await.status,
        StatusCode::TOO_MANY_REQUESTS
    );
    assert_eq!(at(), start + 19_000_000);
}

/// A check made by hand with more windows than any rule allows is refused
/// with an error by both stores, for the user's windows and the route's,
/// never a panic; the store goes on deciding.
#[tokio::test]
async fn checks_beyond_the_window_limit_are_refused_not_panicked_on() {
    use tower_ratelimit::store::{Check, GlobalCheck, StoreErrorKind};
    use tower_ratelimit::{MemoryStore, Store, Window};
    let server = RedisServer::start();
    let redis = own_store(&server).await;
    let memory = MemoryStore::new();
    let windows = |n: u64| -> std::sync::Arc<[Window]> {
        (1..=n)
            .map(|s| Window::new(Duration::from_secs(s), 10).unwrap())
            .collect()
    };
    let too_many_own = || Check::new("r0:u", windows(9));
    let too_many_global =
        || Check::new("r0:u", windows(1)).with_global(GlobalCheck::new("r0:*", windows(9)));
    for check in [too_many_own(), too_many_global()] {
        let error = memory.check(check.clone()).await.unwrap_err();
        assert_eq!(error.kind(), StoreErrorKind::Config, "{error}");
        assert!(error.to_string().contains("at most 8"), "{error}");
        let error = redis.check(check).await.unwrap_err();
        assert_eq!(error.kind(), StoreErrorKind::Config, "{error}");
    }
    // Eight of each are decided.
    let most = Check::new("r0:u", windows(8)).with_global(GlobalCheck::new("r0:*", windows(8)));
    assert!(memory.check(most.clone()).await.unwrap().allowed());
    assert!(redis.check(most).await.unwrap().allowed());
}

/// A store of its own on `server`, with a deadline of `ms` milliseconds.
async fn store_with_deadline(server: &RedisServer, ms: u64) -> RedisStore {
    RedisStore::builder()
        .url(server.url())
        .timeout(Duration::from_millis(ms))
        .build()
        .await
        .unwrap()
}

/// Checks of one user's budget of 100 a minute, made on demand.
fn minute_checks() -> impl Fn() -> tower_ratelimit::Check {
    let windows: std::sync::Arc<[tower_ratelimit::Window]> =
        [tower_ratelimit::Window::new(Duration::from_secs(60), 100).unwrap()].into();
    move || tower_ratelimit::Check::new("r0:u", windows.clone())
}

/// A check's deadline counts from when the store was asked, so a wait in
/// the batching queue (here: a runtime stalled by other work while the
/// check is queued) is inside it: the check times out rather than waiting
/// past its deadline. It is answered without being sent, and the stall is
/// not held against Redis: after three in a row the connection is kept
/// and the next check is decided.
#[test]
fn a_checks_deadline_includes_its_wait_in_the_queue() {
    use std::future::Future;
    use std::task::Poll;
    use tower_ratelimit::store::StoreErrorKind;
    use tower_ratelimit::Store;
    let server = RedisServer::start();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let store = store_with_deadline(&server, 300).await;
        let check = minute_checks();
        assert!(store.check(check()).await.unwrap().allowed());
        let scripts = server.calls("evalsha");
        for _ in 0..3 {
            // Queued (one poll), then the runtime's only thread is kept
            // busy past the deadline before the batching task can send it.
            let mut asked = std::pin::pin!(store.check(check()));
            let first =
                std::future::poll_fn(|cx| Poll::Ready(asked.as_mut().poll(cx).is_pending())).await;
            assert!(first, "answered at once");
            std::thread::sleep(Duration::from_millis(600));
            let error = asked.await.unwrap_err();
            assert_eq!(error.kind(), StoreErrorKind::Timeout, "{error}");
        }
        assert_eq!(server.calls("evalsha"), scripts, "a late check was sent");
        // The connection was kept: the next check is decided at once.
        let decision = store.check(check()).await.unwrap();
        assert_eq!(decision.windows()[0].remaining, 98);
    });
}

/// A Redis that stops answering (paused) costs three checks their whole
/// deadline; then the connection is presumed dead and dropped, and checks
/// fail at once while a new one is made, instead of each waiting.
#[tokio::test]
async fn three_timeouts_drop_the_connection_and_later_checks_fail_fast() {
    use tower_ratelimit::store::StoreErrorKind;
    use tower_ratelimit::Store;
    let server = RedisServer::start();
    let store = store_with_deadline(&server, 300).await;
    let check = minute_checks();
    assert!(store.check(check()).await.unwrap().allowed());
    assert_eq!(server.cli(&["client", "pause", "3000", "all"]), "OK");
    for _ in 0..3 {
        let error = store.check(check()).await.unwrap_err();
        assert_eq!(error.kind(), StoreErrorKind::Timeout, "{error}");
    }
    let started = Instant::now();
    let error = store.check(check()).await.unwrap_err();
    assert_eq!(error.kind(), StoreErrorKind::Unavailable, "{error}");
    assert!(
        started.elapsed() < Duration::from_millis(150),
        "{:?}",
        started.elapsed()
    );
}

/// Through Redis Sentinel: checks go to the master the sentinel names;
/// after a failover, a connection to the old master is dropped when it
/// fails (the old master died), answers `READONLY` (it was demoted), or the
/// sentinel names another master (the old one still runs as a master,
/// which the sentinels demote only seconds later: checks there would be
/// lost), and the next one goes to the new master, where the budgets are
/// (replicated).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sentinel_store_follows_the_master_through_failovers() {
    use support::redis_server::RedisSentinels;
    #[derive(Clone, Copy, Debug, PartialEq)]
    enum OldMaster {
        Demoted,
        Dies,
        RunsOn,
    }
    for old in [OldMaster::Demoted, OldMaster::Dies, OldMaster::RunsOn] {
        let old_master_dies = old == OldMaster::Dies;
        let mut set = RedisSentinels::start();
        // (A long keepalive: the sentinels are asked once a second all the
        // same.)
        let store = RedisStore::builder()
            .sentinel([set.sentinel_url()], "mymaster")
            .prefix("s")
            .timeout(TEST_TIMEOUT)
            .keepalive(Some(Duration::from_secs(10)))
            .build()
            .await
            .unwrap();
        let app = App::new(one_route(Rule::new().minute(3)), store);
        assert_eq!(app.get("/a", "u").await.status, StatusCode::OK);
        assert_eq!(app.get("/a", "u").await.status, StatusCode::OK);
        assert_eq!(keys(set.master.port, "s").len(), 1, "written on the master");

        set.failover();
        if old == OldMaster::RunsOn {
            // Still a master, accepting writes: the store must leave it
            // because the sentinel names another, within a few seconds.
            let started = Instant::now();
            let mut probe = 0;
            loop {
                probe += 1;
                let user = format!("moved-{probe}");
                app.get("/a", &user).await;
                if keys(set.replica.port, "s")
                    .iter()
                    .any(|k| k.contains(&user))
                {
                    break;
                }
                assert!(
                    started.elapsed() < Duration::from_secs(5),
                    "still writing to the old master after {:?}",
                    started.elapsed()
                );
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            assert_eq!(app.get("/a", "u").await.status, StatusCode::OK);
            assert_eq!(
                app.get("/a", "u").await.status,
                StatusCode::TOO_MANY_REQUESTS
            );
            continue;
        }
        if old_master_dies {
            set.master.kill();
        } else {
            // (What the sentinel does to the old master once it sees it.)
            let new_master = set.replica.port.to_string();
            assert_eq!(
                set.master.cli(&["replicaof", "127.0.0.1", &new_master]),
                "OK"
            );
        }
        // Checks fail (fail open: no headers) until the store has
        // reconnected, through the sentinel, to the new master. (Probes in
        // bursts of 8 at once: their checks go in batches, whose answers
        // are where a demoted master's `READONLY` comes back.)
        let deadline = Instant::now() + Duration::from_secs(10);
        let mut probe = 0;
        loop {
            let burst: Vec<_> = (0..8)
                .map(|_| {
                    probe += 1;
                    let (app, user) = (app.clone(), format!("probe-{probe}"));
                    tokio::spawn(async move { app.get("/a", &user).await })
                })
                .collect();
            let mut checked = false;
            for reply in burst {
                let reply = reply.await.unwrap();
                assert_eq!(reply.status, StatusCode::OK);
                checked |= reply.header("x-ratelimit-limit").is_some();
            }
            if checked {
                break;
            }
            assert!(Instant::now() < deadline, "no check succeeded in 10 s");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        // u's two requests were replicated: one left.
        assert_eq!(app.get("/a", "u").await.status, StatusCode::OK);
        assert_eq!(
            app.get("/a", "u").await.status,
            StatusCode::TOO_MANY_REQUESTS
        );
        let user_keys = keys(set.replica.port, "s");
        assert!(user_keys.len() >= 2, "on the new master: {user_keys:?}");
    }
}

/// A master its sentinels see down at start-up (here with no replica to
/// fail over to) is not a setup mistake: the store builds, the checks fail
/// by the fail mode, and it connects once the master is back. (redis-rs
/// reports it as it reports an unknown master name.)
#[tokio::test]
async fn a_sentinel_master_down_at_start_up_is_not_fatal() {
    use support::redis_server::RedisSentinels;
    let mut set = RedisSentinels::start();
    set.replica.kill();
    set.master.kill();
    let seen_down = Instant::now();
    while !set
        .sentinel
        .cli(&["sentinel", "master", "mymaster"])
        .contains("s_down")
    {
        assert!(
            seen_down.elapsed() < Duration::from_secs(10),
            "the sentinel never saw the master down"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let store = RedisStore::builder()
        .sentinel([set.sentinel_url()], "mymaster")
        .timeout(TEST_TIMEOUT)
        .connect_timeout(Duration::from_millis(200))
        .build()
        .await
        .unwrap();
    let app = App::new(one_route(Rule::new().second(1)), store);
    assert!(!app.get("/a", "u").await.limited());
    set.master.restart();
    until_limited(&app, "u", Duration::from_secs(10)).await;
}

/// A Sentinel setup that cannot work is a configuration error at build:
/// no sentinel, a master URL that is not one, or sentinels some reached
/// over TLS and some not.
#[tokio::test]
async fn a_bad_sentinel_setup_is_a_config_error() {
    let none: [&str; 0] = [];
    for (builder, says) in [
        (RedisStore::builder().sentinel(none, "mymaster"), "sentinel"),
        (
            RedisStore::builder()
                .sentinel(["redis://127.0.0.1:1"], "mymaster")
                .sentinel_master_url("not a url"),
            "invalid redis master url",
        ),
        (
            RedisStore::builder()
                .sentinel(["redis://127.0.0.1:1", "rediss://127.0.0.1:2"], "mymaster"),
            "some rediss://",
        ),
    ] {
        let error = builder.build().await.unwrap_err();
        assert_eq!(
            error.kind(),
            tower_ratelimit::StoreErrorKind::Config,
            "{error}"
        );
        assert!(error.to_string().contains(says), "{error}");
    }
    // A local socket, which has no TLS, goes with sentinels of either
    // scheme (these answer nothing: whatever the build says, not that).
    let socket_and_tls = RedisStore::builder()
        .sentinel(
            ["unix:///nonexistent/sentinel.sock", "rediss://127.0.0.1:2"],
            "mymaster",
        )
        .connect_timeout(Duration::from_millis(200))
        .timeout(Duration::from_millis(200))
        .build()
        .await;
    if let Err(error) = socket_and_tls {
        assert!(!error.to_string().contains("some rediss://"), "{error}");
    }
}

/// A live reshard: while the slot of a route's budgets migrates between two
/// masters, a route-wide check whose keys are all still on the source is
/// decided at once (before, the block marker's place holder, a key that
/// never exists, had Redis answer `TRYAGAIN` to every route-wide check
/// until the slot had moved), and one Redis answers `TRYAGAIN` while its
/// keys are split between the nodes goes again within its deadline, to be
/// decided once they have moved (before, the Cluster client waited 1.28 s
/// before it tried again, past any deadline).
#[tokio::test]
async fn route_wide_checks_are_decided_while_their_slot_migrates() {
    use support::redis_server::RedisCluster;
    use tower_ratelimit::store::GlobalCheck;
    use tower_ratelimit::{Check, Store, Window};
    let cluster = RedisCluster::start();
    let store = cluster_store(&cluster, Duration::from_secs(1)).await;
    let minute = |limit| Window::new(Duration::from_secs(60), limit).unwrap();
    let check = |user: &str| {
        Check::new(format!("rmig:{user}"), [minute(100)])
            .with_global(GlobalCheck::new("rmig:*", [minute(1000)]))
    };
    assert!(store.check(check("alice")).await.unwrap().allowed());

    let slot = cli(cluster.nodes[0].port, &["cluster", "keyslot", "rmig"]);
    let (source, _) = cluster.master_and_replica(slot.parse().unwrap());
    let target = (source + 1) % cluster.nodes.len();
    let ports = ports_of(&cluster);
    let target_id = start_moving(&ports, &slot, (source, target));

    // Every key of Alice's check is still on the source.
    let started = Instant::now();
    let decision = store.check(check("alice")).await.unwrap();
    assert!(decision.allowed());
    assert_eq!(decision.windows()[1].remaining, 1000 - 2);
    assert!(started.elapsed() < Duration::from_millis(500));

    // Bob's state does not exist yet, the route's does: `TRYAGAIN` until
    // the slot has moved, which a thread finishes a moment after.
    let finish = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(20));
        finish_moving(&ports, &slot, (source, target), &target_id);
    });
    let decision = store.check(check("bob")).await.unwrap();
    assert!(decision.allowed());
    assert_eq!(decision.windows()[1].remaining, 1000 - 3);
    finish.join().unwrap();
    // And on the new node, as the Cluster now says.
    let decision = store.check(check("carol")).await.unwrap();
    assert_eq!(decision.windows()[1].remaining, 1000 - 4);
}

/// A check on several keys that cannot be decided until its slot has moved
/// (a new user's budget and block marker, neither on either node yet:
/// Redis answers `TRYAGAIN`) fails by its deadline, as documented, and its
/// error says why: the slot was moving, not a slow server.
#[tokio::test]
async fn a_check_failing_while_its_slot_moves_says_so() {
    use support::redis_server::RedisCluster;
    use tower_ratelimit::{Check, Store, StoreErrorKind, Window};
    let cluster = RedisCluster::start();
    let deadline = Duration::from_millis(50);
    let store = cluster_store(&cluster, deadline).await;
    let minute = Window::new(Duration::from_secs(60), 3).unwrap();
    let check = |user: &str| {
        Check::new(format!("bmv:{user}"), [minute]).with_block(Duration::from_secs(30))
    };
    // (Decided once the store has connected: on a busy machine a 50 ms
    // deadline may leave the first connection to the background; and
    // again after the failures below, which may have it reconnect.)
    let decided = |user: &'static str| {
        let store = store.clone();
        async move {
            let until = Instant::now() + Duration::from_secs(5);
            loop {
                match store.check(check(user)).await {
                    Ok(decision) => return decision,
                    Err(e) => assert!(Instant::now() < until, "{user}: {e}"),
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    };
    assert!(decided("alice").await.allowed());

    let slot = cli(cluster.nodes[0].port, &["cluster", "keyslot", "bmv:bob"]);
    let (source, _) = cluster.master_and_replica(slot.parse().unwrap());
    let target = (source + 1) % cluster.nodes.len();
    let ports = ports_of(&cluster);
    let target_id = start_moving(&ports, &slot, (source, target));
    // (Redis's last answer when the deadline came between two tries, which
    // says that nothing ran; or, when it came during one, whose outcome is
    // unknown, a time-out that names the moving slot, where it was a bare
    // "timed out", as from a slow server, that an outside trial saw.)
    for _ in 0..6 {
        let started = Instant::now();
        let error = store.check(check("bob")).await.unwrap_err();
        let took = started.elapsed();
        assert!(
            took < deadline + Duration::from_millis(300),
            "took {took:?}"
        );
        let text = error.to_string();
        match error.kind() {
            StoreErrorKind::Backend => assert!(text.contains("TryAgain"), "{text}"),
            StoreErrorKind::Timeout => assert!(text.contains("slot was moving"), "{text}"),
            other => panic!("{other:?}: {text}"),
        }
    }
    // Once the slot has moved, Bob's checks are decided.
    finish_moving(&ports, &slot, (source, target), &target_id);
    assert!(decided("bob").await.allowed());
}

/// Begins moving `slot` from the Cluster node at `ports[source]` to the one
/// at `ports[target]` (importing there, migrating here): the target's id.
fn start_moving(ports: &[u16], slot: &str, (source, target): (usize, usize)) -> String {
    let id = |i: usize| cli(ports[i], &["cluster", "myid"]);
    let (source_id, target_id) = (id(source), id(target));
    cli(
        ports[target],
        &["cluster", "setslot", slot, "importing", &source_id],
    );
    cli(
        ports[source],
        &["cluster", "setslot", slot, "migrating", &target_id],
    );
    target_id
}

/// Ends the move of `slot` (importing, migrating) from the Cluster node at
/// `ports[source]` to the one at `ports[target]` (`target_id`): its keys
/// (if it has any) migrated, and every node told.
fn finish_moving(ports: &[u16], slot: &str, (source, target): (usize, usize), target_id: &str) {
    let keys = cli(ports[source], &["cluster", "getkeysinslot", slot, "100"]);
    let target_port = ports[target].to_string();
    let mut migrate = vec![
        "migrate",
        "127.0.0.1",
        &target_port,
        "",
        "0",
        "5000",
        "keys",
    ];
    migrate.extend(keys.lines());
    if !keys.is_empty() {
        assert_eq!(cli(ports[source], &migrate), "OK");
    }
    for port in ports {
        cli(*port, &["cluster", "setslot", slot, "node", target_id]);
    }
}

/// A slot that moved to another master while no check failed (a reshard):
/// within a few seconds the store's map of the masters says so (it reads
/// the slots through its client every 5 s while it holds no master), so
/// that the budgets of the slot fall back, and take their deadline, with
/// their new master's. Before, the watch read the slots only once a check
/// failed, and kept the old master for them.
#[tokio::test]
async fn the_store_follows_a_slot_moved_while_no_check_failed() {
    use support::redis_server::RedisCluster;
    use tower_ratelimit::{Check, Store, Window};
    let cluster = RedisCluster::start();
    let store = cluster_store(&cluster, Duration::from_secs(1)).await;
    let check = |user: &str| {
        let minute = Window::new(Duration::from_secs(60), 100).unwrap();
        Check::new(format!("fd:{user}"), [minute])
    };
    assert!(store.check(check("alice")).await.unwrap().allowed());
    let ports = ports_of(&cluster);
    let slot_of = |user: &str| cli(ports[0], &["cluster", "keyslot", &format!("fd:{user}")]);
    let master_of = |user: &str| cluster.master_and_replica(slot_of(user).parse().unwrap()).0;
    let slot = slot_of("alice");
    let source = master_of("alice");
    let target = (source + 1) % ports.len();
    let neighbour = (0..200)
        .map(|i| format!("n{i}"))
        .find(|user| master_of(user) == target)
        .unwrap();
    let domain = |user: &str| store.failure_domain(&check(user).as_ref());
    assert!(domain("alice") != 0 && domain("alice") != domain(&neighbour));
    let target_id = start_moving(&ports, &slot, (source, target));
    finish_moving(&ports, &slot, (source, target), &target_id);
    let moved = Instant::now();
    while domain("alice") != domain(&neighbour) {
        assert!(moved.elapsed() < Duration::from_secs(8), "not followed");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let decision = store.check(check("alice")).await.unwrap();
    assert_eq!(decision.windows()[0].remaining, 100 - 2);
}

/// A live reshard, a user's budget already moved to the slot's new node:
/// every check of it is answered `ASK` by the old node, and sent with
/// `ASKING` to the new one while other calls share that connection. Every
/// check is decided (before, redis-rs sent `ASKING` and waited for its
/// answer before sending the call, another call could use the permission
/// in between, and the check bounced between the nodes until it failed).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn checks_of_a_moved_budget_are_decided_while_its_slot_migrates() {
    use support::redis_server::RedisCluster;
    use tower_ratelimit::{Check, Store, Window};
    let cluster = RedisCluster::start();
    let store = cluster_store(&cluster, Duration::from_secs(2)).await;
    let check = |user: &str| {
        // (A fixed window ten years long: one of a minute, aligned on the
        // epoch, ended mid-run on a loaded machine, and its count began
        // again.)
        let window = Window::new(Duration::from_secs(3_650 * 86_400), 1_000_000).unwrap();
        Check::new(format!("rask:{user}"), [window]).with_algorithm(Algorithm::FixedWindow)
    };
    let ports = ports_of(&cluster);
    let slot_of = |user: &str| {
        cli(
            ports[0],
            &["cluster", "keyslot", &store.keys(&check(user))[0]],
        )
    };
    let slot = slot_of("moved");
    let (source, _) = cluster.master_and_replica(slot.parse().unwrap());
    let target = (source + 1) % ports.len();
    // Users whose budgets the new node serves already.
    let locals: Vec<String> = (0..200)
        .map(|i| format!("local{i}"))
        .filter(|u| cluster.master_and_replica(slot_of(u).parse().unwrap()).0 == target)
        .take(8)
        .collect();
    assert!(!locals.is_empty());
    assert!(store.check(check("moved")).await.unwrap().allowed());
    start_moving(&ports, &slot, (source, target));
    let key = store.keys(&check("moved"))[0].clone();
    let target_port = ports[target].to_string();
    let moved = cli(
        ports[source],
        &["migrate", "127.0.0.1", &target_port, &key, "0", "5000"],
    );
    assert_eq!(moved, "OK");

    let store = std::sync::Arc::new(store);
    let tasks: Vec<_> = (0..8)
        .map(|t| {
            let (store, local) = (store.clone(), locals[t % locals.len()].clone());
            tokio::spawn(async move {
                let mut failed = 0;
                for _ in 0..150 {
                    let (moved, other) =
                        tokio::join!(store.check(check("moved")), store.check(check(&local)));
                    failed += usize::from(moved.is_err()) + usize::from(other.is_err());
                }
                failed
            })
        })
        .collect();
    let mut failed = 0;
    for task in tasks {
        failed += task.await.unwrap();
    }
    assert_eq!(failed, 0);
    // The moved budget counted every check, on the new node.
    let last = store.check(check("moved")).await.unwrap();
    assert_eq!(last.windows()[0].remaining, 1_000_000 - 1 - 8 * 150 - 1);
}

/// Scaling a Cluster out: a master added after the store loaded its
/// scripts, and given its first slot, owns no slot while that slot moves
/// in, so a load sent to every master misses it. A new user's check on
/// the moving slot is sent on to it (`ASK`, the key not on the old node)
/// and answered `NOSCRIPT`: the store loads the script on that node and
/// the check is decided, where before it failed until the slot had moved.
#[tokio::test]
async fn a_new_masters_first_slot_is_decided_while_it_moves_in() {
    use support::redis_server::RedisCluster;
    use tower_ratelimit::{Check, Store, Window};
    let cluster = RedisCluster::start();
    let store = cluster_store(&cluster, Duration::from_secs(2)).await;
    let added = RedisCluster::start_node();
    let ports = ports_of(&cluster);
    let added_port = added.port.to_string();
    assert_eq!(
        cli(ports[0], &["cluster", "meet", "127.0.0.1", &added_port]),
        "OK"
    );
    let added_id = added.cli(&["cluster", "myid"]);
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while !cluster
        .nodes
        .iter()
        .all(|n| n.cli(&["cluster", "nodes"]).contains(&added_id))
        || !added.cli(&["cluster", "info"]).contains("cluster_state:ok")
    {
        assert!(
            std::time::Instant::now() < deadline,
            "the node never joined"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let window = Window::new(Duration::from_secs(60), 1_000).unwrap();
    let check = |user: &str| Check::new(format!("grow:{user}"), [window]);
    let key = store.keys(&check("fresh"))[0].clone();
    let slot = cli(ports[0], &["cluster", "keyslot", &key]);
    let (source, _) = cluster.master_and_replica(slot.parse().unwrap());
    let source_id = cli(ports[source], &["cluster", "myid"]);
    assert_eq!(
        added.cli(&["cluster", "setslot", &slot, "importing", &source_id]),
        "OK"
    );
    assert_eq!(
        cli(
            ports[source],
            &["cluster", "setslot", &slot, "migrating", &added_id]
        ),
        "OK"
    );
    for n in 1..=5 {
        let decision = store.check(check("fresh")).await.unwrap();
        assert!(decision.allowed());
        assert_eq!(decision.windows()[0].remaining, 1_000 - n);
    }
    // The script was loaded on the new node, once, and the budget lives
    // there, not on the old node.
    assert_eq!(added.calls("script|load"), 1);
    let calls = added.calls("evalsha");
    assert!(store.check(check("fresh")).await.unwrap().allowed());
    assert_eq!(added.calls("evalsha"), calls + 1);
    let keys_in_slot = |port: u16| cli(port, &["cluster", "countkeysinslot", &slot]);
    assert_eq!(keys_in_slot(added.port), "1");
    assert_eq!(keys_in_slot(ports[source]), "0");
}

/// TLS (`rediss://`, the `tls` feature): a server whose certificate a
/// private CA signed is reached with that CA as the root, checks are
/// decided over it, and a server that asks for a client certificate gets
/// the one given; without the CA the server is refused, as it is without
/// the client certificate it asks for, and `#insecure` skips the check.
#[cfg(feature = "tls")]
#[tokio::test]
async fn a_store_over_tls_decides_and_verifies_the_server() {
    use support::redis_server::TlsFiles;
    use tower_ratelimit::StoreErrorKind;
    let files = TlsFiles::make();
    let (_server, port) = RedisServer::start_tls(&files, false);
    let url = format!("rediss://127.0.0.1:{port}");
    let store = RedisStore::builder()
        .url(&url)
        .tls_root_certificate(files.read("ca.crt"))
        .timeout(REACHING)
        .build()
        .await
        .unwrap();
    passes_once_then_limits(store, "u").await;

    // The system's roots do not know the private CA.
    let unknown = RedisStore::builder().url(&url).build().await.unwrap_err();
    assert_eq!(unknown.kind(), StoreErrorKind::Config, "{unknown}");
    assert!(unknown.to_string().contains("UnknownIssuer"), "{unknown}");
    // Unless told not to verify.
    let insecure = RedisStore::builder()
        .url(format!("{url}/#insecure"))
        .build()
        .await;
    assert!(insecure.is_ok(), "{:?}", insecure.err());
    // What holds no certificate, or a key and certificate swapped: named.
    let empty = RedisStore::builder()
        .url(&url)
        .tls_root_certificate(Vec::new())
        .build()
        .await
        .unwrap_err();
    assert_eq!(empty.kind(), StoreErrorKind::Config, "{empty}");
    assert!(
        empty.to_string().contains("tls_root_certificate"),
        "{empty}"
    );
    let swapped = RedisStore::builder()
        .url(&url)
        .tls_root_certificate(files.read("ca.crt"))
        .tls_client_certificate(files.read("client.key"), files.read("client.crt"))
        .build()
        .await
        .unwrap_err();
    assert_eq!(swapped.kind(), StoreErrorKind::Config, "{swapped}");
    assert!(
        swapped.to_string().contains("tls_client_certificate"),
        "{swapped}"
    );
    // Certificates for a server reached without TLS: a setup error.
    let plain = RedisStore::builder()
        .url(format!("redis://127.0.0.1:{}", _server.port))
        .tls_root_certificate(files.read("ca.crt"))
        .build()
        .await
        .unwrap_err();
    assert_eq!(plain.kind(), StoreErrorKind::Config, "{plain}");

    // A server that asks for the client's certificate.
    let (_asking, port) = RedisServer::start_tls(&files, true);
    let url = format!("rediss://127.0.0.1:{port}");
    let without = RedisStore::builder()
        .url(&url)
        .tls_root_certificate(files.read("ca.crt"))
        .build()
        .await;
    let without = without.unwrap_err();
    assert_eq!(without.kind(), StoreErrorKind::Config, "{without}");
    let store = RedisStore::builder()
        .url(&url)
        .tls_root_certificate(files.read("ca.crt"))
        .tls_client_certificate(files.read("client.crt"), files.read("client.key"))
        .build()
        .await
        .unwrap();
    let app = App::new(one_route(Rule::new().second(1)), store);
    assert_eq!(app.get("/a", "u").await.status, StatusCode::OK);
    assert_eq!(
        app.get("/a", "u").await.status,
        StatusCode::TOO_MANY_REQUESTS
    );
}

/// A Cluster over TLS (one node holding every slot, which announces its
/// TLS port), reached with the private CA as the root.
#[cfg(feature = "tls")]
#[tokio::test]
async fn a_cluster_store_over_tls_decides() {
    use support::redis_server::TlsFiles;
    let files = TlsFiles::make();
    let (_server, tls_port) = RedisServer::start_tls_cluster_of_one(&files);
    let store = RedisStore::builder()
        .cluster([format!("rediss://127.0.0.1:{tls_port}")])
        .tls_root_certificate(files.read("ca.crt"))
        .timeout(REACHING)
        .build()
        .await
        .unwrap();
    passes_once_then_limits(store, "u").await;
}

/// A master reached over TLS through sentinels reached over TLS (the
/// sentinels' URLs are `rediss://`, so the master's connection is too),
/// both verified against the private CA given to the store; without it,
/// nothing is decided (the system's roots do not know the CA), and
/// `#insecure` skips the verification. Certificates for sentinels of which
/// some are reached over TLS and some not are a configuration error.
#[cfg(feature = "tls")]
#[tokio::test]
async fn a_sentinel_store_over_tls_verifies_with_a_private_ca() {
    use support::redis_server::{RedisSentinels, TlsFiles};
    use tower_ratelimit::StoreErrorKind;
    let files = TlsFiles::make();
    let (_master, _sentinel, port) = RedisSentinels::start_tls(&files);
    let url = format!("rediss://127.0.0.1:{port}");
    let store = RedisStore::builder()
        .sentinel([url.clone()], "mymaster")
        .tls_root_certificate(files.read("ca.crt"))
        .timeout(REACHING)
        .build()
        .await
        .unwrap();
    passes_once_then_limits(store, "u").await;

    // The system's roots do not know the private CA.
    let unverified = RedisStore::builder()
        .sentinel([url.clone()], "mymaster")
        .timeout(Duration::from_millis(300))
        .connect_timeout(Duration::from_millis(300))
        .build()
        .await;
    let unverified = unverified.unwrap_err();
    assert_eq!(unverified.kind(), StoreErrorKind::Config, "{unverified}");
    assert!(
        unverified.to_string().contains("UnknownIssuer"),
        "{unverified}"
    );
    // Unless told not to verify.
    let insecure = RedisStore::builder()
        .sentinel([format!("{url}/#insecure")], "mymaster")
        .timeout(REACHING)
        .build()
        .await
        .unwrap();
    passes_once_then_limits(insecure, "v").await;

    // The sentinels are asked over TLS with the CA too: one whose name
    // they do not know is refused by name.
    let unknown = RedisStore::builder()
        .sentinel([url.clone()], "nosuchmaster")
        .tls_root_certificate(files.read("ca.crt"))
        .build()
        .await
        .unwrap_err();
    assert_eq!(unknown.kind(), StoreErrorKind::Config, "{unknown}");
    assert!(
        unknown
            .to_string()
            .contains("no sentinel knows a master named"),
        "{unknown}"
    );

    let mixed = RedisStore::builder()
        .sentinel([url.clone(), "redis://127.0.0.1:1".to_owned()], "mymaster")
        .tls_root_certificate(files.read("ca.crt"))
        .build()
        .await
        .unwrap_err();
    assert_eq!(mixed.kind(), StoreErrorKind::Config, "{mixed}");
    assert!(mixed.to_string().contains("some rediss://"), "{mixed}");

    // What else certificates cannot do through sentinels, named at build:
    // no TLS anywhere, sentinels with different credentials (redis-rs
    // takes one set for all), and a client certificate for a master not
    // verified (redis-rs connects to one with no certificate).
    let ca = || files.read("ca.crt");
    let sentinel = |urls: &[&str]| {
        RedisStore::builder().sentinel(urls.iter().map(|u| u.to_string()), "mymaster")
    };
    let refusals = [
        (
            sentinel(&["redis://127.0.0.1:1"]).tls_root_certificate(ca()),
            "are not rediss://",
        ),
        (
            sentinel(&["rediss://:a@127.0.0.1:1", "rediss://:b@127.0.0.1:2"])
                .tls_root_certificate(ca()),
            "different credentials",
        ),
        (
            sentinel(&["rediss://127.0.0.1:1"])
                .sentinel_master_url("rediss://master/#insecure")
                .tls_root_certificate(ca())
                .tls_client_certificate(files.read("client.crt"), files.read("client.key")),
            "#insecure",
        ),
    ];
    for (builder, why) in refusals {
        let error = builder.build().await.unwrap_err();
        assert_eq!(error.kind(), StoreErrorKind::Config, "{error}");
        assert!(error.to_string().contains(why), "{why}: {error}");
    }
}

/// A master and a sentinel that ask for a client certificate get the one
/// given to a Sentinel store; without it, the store is refused at build.
#[cfg(feature = "tls")]
#[tokio::test]
async fn a_sentinel_store_presents_its_client_certificate() {
    use support::redis_server::{RedisSentinels, TlsFiles};
    use tower_ratelimit::StoreErrorKind;
    let files = TlsFiles::make();
    let (_master, _sentinel, port) = RedisSentinels::start_tls_asking(&files, true);
    let url = format!("rediss://127.0.0.1:{port}");
    let store = RedisStore::builder()
        .sentinel([url.clone()], "mymaster")
        .tls_root_certificate(files.read("ca.crt"))
        .tls_client_certificate(files.read("client.crt"), files.read("client.key"))
        .timeout(REACHING)
        .build()
        .await
        .unwrap();
    passes_once_then_limits(store, "u").await;

    let refused = RedisStore::builder()
        .sentinel([url], "mymaster")
        .tls_root_certificate(files.read("ca.crt"))
        .timeout(Duration::from_millis(300))
        .connect_timeout(Duration::from_millis(300))
        .build()
        .await
        .unwrap_err();
    assert_eq!(refused.kind(), StoreErrorKind::Config, "{refused}");
}

/// What `Rules::budget_changes` says a reload does to the budgets (those
/// changes true of Redis) is what the Redis store then does: a user who
/// spent a minute's 3 of 3 is still denied where the report lists no
/// change of the user's own budget, and allowed where it says Redis's keys
/// move (a route-wide limit added or removed, a sliding log past 5
/// windows), though the memory store keeps those budgets.
#[tokio::test]
async fn a_reloads_budget_changes_say_what_redis_does() {
    use tower_ratelimit::rules::{BudgetChangeKind as Kind, ChangedOn};
    use tower_ratelimit::Algorithm::{FixedWindow, SlidingLog, TokenBucket};
    let minute = || Rule::new().minute(3);
    let (ok, denied) = (StatusCode::OK, StatusCode::TOO_MANY_REQUESTS);
    let secs = Duration::from_secs;
    let user = |kind| vec![(false, kind)];
    let cases = [
        (
            "a lower limit",
            one_route(minute()),
            one_route(Rule::new().minute(2)),
            vec![],
            denied,
        ),
        (
            "another algorithm",
            one_route(minute()),
            one_route(minute().algorithm(TokenBucket)),
            user(Kind::Algorithm {
                from: SlidingLog,
                to: TokenBucket,
            }),
            ok,
        ),
        (
            "a counter's window added",
            one_route(minute().algorithm(FixedWindow)),
            one_route(minute().second(3).algorithm(FixedWindow)),
            user(Kind::NewWindows(vec![secs(1)])),
            denied,
        ),
        (
            "a sliding log of 5 windows",
            one_route(minute()),
            one_route(minute().second(3).hour(3).day(3).month(3)),
            user(Kind::LongerLog { kept: secs(60) }),
            denied,
        ),
        (
            "a sliding log of 6 windows",
            one_route(minute()),
            one_route(minute().second(3).hour(3).day(3).month(3).per(secs(7), 3)),
            user(Kind::RedisKeys),
            ok,
        ),
        (
            "a route-wide limit added",
            one_route(minute()),
            support::route_with_global("^/a", [minute()], Rule::new().minute(100)),
            vec![(false, Kind::RedisKeys), (true, Kind::Uncounted)],
            ok,
        ),
        (
            "a counter's route-wide limit removed",
            support::route_with_global(
                "^/a",
                [minute().algorithm(TokenBucket)],
                Rule::new().minute(100),
            ),
            one_route(minute().algorithm(TokenBucket)),
            user(Kind::RedisKeys),
            ok,
        ),
    ];
    for (what, before, after, expected, next) in cases {
        let (seen, status) =
            support::next_after_reload(standalone().await, ChangedOn::Redis, before, after, 3)
                .await;
        assert_eq!(seen, expected, "{what}");
        assert_eq!(status, next, "{what}");
    }
}
