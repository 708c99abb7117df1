//! The fault matrix: every failure mode of a real `redis-server` × every
//! fail mode (and, in one fail mode, through a caller's deadpool pool).
//! For each: no request may wait past the deadline (plus scheduling
//! slack), decisions made while Redis is healthy are exact, and limiting
//! on Redis resumes by itself once the fault ends. Run with
//! `--nocapture` to see the measured figures (RELIABILITY.md).

mod support;

use std::io::Write as _;
use std::net::TcpStream;
use std::time::{Duration, Instant};

use http::StatusCode;
use support::redis_server::{cli, RedisServer};
use support::App;
use tower_ratelimit::store::redis::RedisStore;
use tower_ratelimit::{Algorithm, FailMode, Route, Rule, Rules};

const DEADLINE: Duration = Duration::from_millis(50);
/// Scheduling slack on a busy 2-core machine running the suite in parallel.
const SLACK: Duration = Duration::from_millis(250);

#[derive(Clone, Copy, Debug)]
enum Fault {
    Killed,
    Paused,
    Slow,
    ScriptFlush,
    MaxClients,
}

/// What a fault leaves behind to undo.
enum Undo {
    Restart,
    Wait(Instant),
    Nothing,
    MaxClients(TcpStream),
}

fn inject(server: &mut RedisServer, fault: Fault) -> Undo {
    match fault {
        Fault::Killed => {
            server.kill();
            Undo::Restart
        }
        Fault::Paused => {
            assert_eq!(server.cli(&["client", "pause", "1200", "all"]), "OK");
            Undo::Wait(Instant::now() + Duration::from_millis(1200))
        }
        Fault::Slow => {
            // DEBUG SLEEP blocks the whole server; run it from another client.
            let port = server.port;
            std::thread::spawn(move || cli(port, &["debug", "sleep", "1.2"]));
            std::thread::sleep(Duration::from_millis(50));
            Undo::Wait(Instant::now() + Duration::from_millis(1150))
        }
        Fault::ScriptFlush => {
            assert_eq!(server.cli(&["script", "flush"]), "OK");
            Undo::Nothing
        }
        Fault::MaxClients => {
            // One connection drops every other one and keeps the only slot.
            let mut holder = TcpStream::connect(("127.0.0.1", server.port)).unwrap();
            holder
                .write_all(b"CLIENT KILL TYPE normal SKIPME yes\r\nCONFIG SET maxclients 1\r\n")
                .unwrap();
            std::thread::sleep(Duration::from_millis(50));
            Undo::MaxClients(holder)
        }
    }
}

fn undo(server: &mut RedisServer, undo: Undo) {
    match undo {
        Undo::Restart => server.restart(),
        Undo::Wait(until) => std::thread::sleep(until.saturating_duration_since(Instant::now())),
        Undo::Nothing => {}
        Undo::MaxClients(mut holder) => {
            holder
                .write_all(b"CONFIG SET maxclients 10000\r\n")
                .unwrap();
            std::thread::sleep(Duration::from_millis(50));
            drop(holder);
        }
    }
}

/// An app limited to 2 per minute on `store` (with the test deadline), in
/// `mode`, on real time (the fallback probes every 500 ms of it), without
/// the denial cache (every request must reach the store).
async fn app_on(store: tower_ratelimit::store::redis::RedisStoreBuilder, mode: FailMode) -> App {
    app_with(store, mode, false).await
}

/// [`app_on`], its checks sent in batches on a multiplexed connection, or
/// one at a time: the token bucket on the user's budget alone, or the
/// sliding log with a route-wide budget too (never reached here), whose
/// checks have no batch script and go one at a time.
async fn app_with(
    store: tower_ratelimit::store::redis::RedisStoreBuilder,
    mode: FailMode,
    batched: bool,
) -> App {
    app_on_store(
        store.timeout(DEADLINE).build().await.unwrap(),
        mode,
        batched,
    )
}

/// [`app_with`] on `cluster`, batched.
async fn on_cluster(cluster: &support::redis_server::RedisCluster, mode: FailMode) -> App {
    app_with(RedisStore::builder().cluster(cluster.urls()), mode, true).await
}

/// The store [`on_cluster`] makes, or one through a caller's pool on
/// `cluster`, and the batched app on it.
async fn on_cluster_or_pool(
    cluster: &support::redis_server::RedisCluster,
    mode: FailMode,
    pool: bool,
) -> (App, RedisStore) {
    let builder = match pool {
        false => RedisStore::builder().cluster(cluster.urls()),
        true => RedisStore::builder().cluster_pool(cluster_pool(cluster, None)),
    };
    let store = builder.timeout(DEADLINE).build().await.unwrap();
    (app_on_store(store.clone(), mode, true), store)
}

/// [`app_with`] on a store built already.
fn app_on_store(store: RedisStore, mode: FailMode, batched: bool) -> App {
    let route = if batched {
        Route::new("^/").rules([Rule::new().minute(2).algorithm(Algorithm::TokenBucket)])
    } else {
        Route::new("^/")
            .rules([Rule::new().minute(2).algorithm(Algorithm::SlidingLog)])
            .global(Rule::new().hour(1_000_000))
    };
    let rules = Rules::builder().add_route(route).build().unwrap();
    App::on_store_clock(rules, store, |l| l.fail_mode(mode).denial_cache(0))
}

/// The store's own connection, or a caller's pool: which one a fault hits;
/// `Batched` shapes run the token bucket, whose checks are sent in
/// batches.
#[derive(Clone, Copy, Debug)]
enum Shape {
    Own,
    Pool,
    OwnBatched,
    PoolBatched,
}

async fn run(fault: Fault, mode: FailMode, shape: Shape) {
    // DEBUG SLEEP needs the debug command, from local clients only.
    let mut server = RedisServer::start_with(&["--enable-debug-command", "local"]);
    let builder = match shape {
        Shape::Own | Shape::OwnBatched => RedisStore::builder().url(server.url()),
        Shape::Pool | Shape::PoolBatched => RedisStore::builder().pool(
            deadpool_redis::Config::from_url(server.url())
                .create_pool(Some(deadpool_redis::Runtime::Tokio1))
                .unwrap(),
        ),
    };
    let batched = matches!(shape, Shape::OwnBatched | Shape::PoolBatched);
    let app = app_with(builder, mode, batched).await;

    // Warm: the connection made and the script loaded, which on a busy
    // machine can take longer than the deadline (a check failed open is
    // not counted, and the exact sequence below would be off by one).
    for attempt in 0.. {
        let user = format!("warm-up{attempt}");
        // (Under `Fallback`, a check Redis missed is answered from memory:
        // only a key in Redis tells that Redis answered.)
        if app.get("/x", &user).await.limited()
            && !server
                .cli(&["--scan", "--pattern", &format!("*{user}*")])
                .is_empty()
        {
            break;
        }
        assert!(attempt < 50, "the store never answered in time");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    // Healthy: exact.
    let healthy: Vec<StatusCode> = {
        let mut v = Vec::new();
        for _ in 0..3 {
            v.push(app.get("/x", "exact").await.status);
        }
        v
    };
    assert_eq!(
        healthy,
        [
            StatusCode::OK,
            StatusCode::OK,
            StatusCode::TOO_MANY_REQUESTS
        ]
    );

    // Background load: 8 clients sending as fast as they are answered, from
    // before the fault until the measurements end (the fault hits mid-load).
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut load = tokio::task::JoinSet::new();
    for c in 0..8 {
        let (app, stop) = (app.clone(), stop.clone());
        load.spawn(async move {
            let (mut late, mut worst, mut n) = (0, Duration::ZERO, 0u64);
            // Per user, the requests let through with the limit's headers
            // (decided by a store), and every (status, limited) seen.
            let mut allowed = std::collections::HashMap::<String, u32>::new();
            let mut seen = std::collections::BTreeSet::new();
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                n += 1;
                let started = Instant::now();
                let user = format!("load{c}-{}", n % 50);
                let reply = app.get("/x", &user).await;
                let took = started.elapsed();
                worst = worst.max(took);
                late += u32::from(took > DEADLINE + SLACK);
                if reply.status == StatusCode::OK && reply.limited() {
                    *allowed.entry(user).or_default() += 1;
                }
                seen.insert((reply.status.as_u16(), reply.limited()));
                // A store that fails at once answers without ever waiting:
                // yield, as a real connection's I/O would.
                tokio::task::yield_now().await;
            }
            (late, worst, n, allowed, seen)
        });
    }
    tokio::time::sleep(Duration::from_millis(100)).await;
    let pending = inject(&mut server, fault);
    let mut late = 0;
    let mut worst = Duration::ZERO;
    let mut statuses = Vec::new();
    for i in 0..10 {
        let started = Instant::now();
        let reply = app.get("/x", &format!("during{i}")).await;
        let took = started.elapsed();
        worst = worst.max(took);
        if took > DEADLINE + SLACK {
            late += 1;
        }
        statuses.push((reply.status, reply.limited()));
    }
    let expected = match (fault, mode) {
        // A flushed script is loaded again: no failure at all.
        (Fault::ScriptFlush, _) => (StatusCode::OK, true),
        (_, FailMode::Open) => (StatusCode::OK, false),
        (_, FailMode::Closed) => (StatusCode::SERVICE_UNAVAILABLE, false),
        // Limited by the in-process store meanwhile.
        _ => (StatusCode::OK, true),
    };
    // The first request may still be answered by Redis (a pause or a sleep
    // can begin a moment after it); every later one shows the fail mode.
    for (i, got) in statuses.iter().enumerate().skip(1) {
        assert_eq!(
            *got, expected,
            "{fault:?}/{mode:?}/{shape:?} request {i}: {statuses:?}"
        );
    }

    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let mut background = 0;
    while let Some(result) = load.join_next().await {
        let (l, w, n, allowed, seen) = result.unwrap();
        late += l;
        worst = worst.max(w);
        background += n;
        // The background's answers, before, during and after the fault:
        // each a decision on Redis (exact: at most the minute's 2 per
        // user), or the fail mode's answer. Under the fallback the
        // in-process store may allow a user's 2 again while Redis is out.
        let most = if mode == FailMode::Fallback { 4 } else { 2 };
        for (user, count) in &allowed {
            assert!(
                *count <= most,
                "{fault:?}/{mode:?}/{shape:?}: {user} allowed {count} times"
            );
        }
        for (status, limited) in &seen {
            let fail_answer = match mode {
                FailMode::Open => *status == 200 && !limited,
                FailMode::Closed => *status == 503 && !limited,
                _ => false,
            };
            assert!(
                (*limited && (*status == 200 || *status == 429)) || fail_answer,
                "{fault:?}/{mode:?}/{shape:?}: a background answer {status} (limited: {limited})"
            );
        }
    }

    undo(&mut server, pending);
    let recovering = Instant::now();
    let mut i = 0;
    loop {
        i += 1;
        let user = format!("after{i}");
        let reply = app.get("/x", &user).await;
        let on_redis = reply.limited()
            && !server
                .cli(&["--scan", "--pattern", &format!("*{user}*")])
                .is_empty();
        if on_redis {
            break;
        }
        assert!(
            recovering.elapsed() < Duration::from_secs(5),
            "{fault:?}/{mode:?}/{shape:?}: limiting never resumed"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let resumed = recovering.elapsed();
    // And exact again.
    assert_eq!(app.get("/x", "again").await.status, StatusCode::OK);
    assert_eq!(app.get("/x", "again").await.status, StatusCode::OK);
    assert_eq!(
        app.get("/x", "again").await.status,
        StatusCode::TOO_MANY_REQUESTS
    );
    println!(
        "FAULT {fault:?} / {mode:?} / {shape:?}: late {late} of {} requests, slowest {:.1} ms, resumed on Redis after {:.0} ms",
        10 + background,
        worst.as_secs_f64() * 1e3,
        resumed.as_secs_f64() * 1e3
    );
    assert_eq!(
        late, 0,
        "{fault:?}/{mode:?}: {late} requests waited past the deadline (slowest {worst:?})"
    );
}

macro_rules! matrix {
    ($($name:ident: $fault:expr, $mode:expr, $shape:expr;)+) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $name() {
                run($fault, $mode, $shape).await;
            }
        )+
    };
}

macro_rules! matrix_failover {
    ($($name:ident: $mode:expr, $shape:expr;)+) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $name() {
                failover($mode, $shape).await;
            }
        )+
    };
}

matrix! {
    killed_open: Fault::Killed, FailMode::Open, Shape::Own;
    killed_closed: Fault::Killed, FailMode::Closed, Shape::Own;
    killed_fallback: Fault::Killed, FailMode::Fallback, Shape::Own;
    paused_open: Fault::Paused, FailMode::Open, Shape::Own;
    paused_closed: Fault::Paused, FailMode::Closed, Shape::Own;
    paused_fallback: Fault::Paused, FailMode::Fallback, Shape::Own;
    slow_open: Fault::Slow, FailMode::Open, Shape::Own;
    slow_closed: Fault::Slow, FailMode::Closed, Shape::Own;
    slow_fallback: Fault::Slow, FailMode::Fallback, Shape::Own;
    script_flush_open: Fault::ScriptFlush, FailMode::Open, Shape::Own;
    script_flush_closed: Fault::ScriptFlush, FailMode::Closed, Shape::Own;
    script_flush_fallback: Fault::ScriptFlush, FailMode::Fallback, Shape::Own;
    max_clients_open: Fault::MaxClients, FailMode::Open, Shape::Own;
    max_clients_closed: Fault::MaxClients, FailMode::Closed, Shape::Own;
    max_clients_fallback: Fault::MaxClients, FailMode::Fallback, Shape::Own;
    pool_killed_open: Fault::Killed, FailMode::Open, Shape::Pool;
    pool_paused_open: Fault::Paused, FailMode::Open, Shape::Pool;
    pool_slow_open: Fault::Slow, FailMode::Open, Shape::Pool;
    pool_script_flush_open: Fault::ScriptFlush, FailMode::Open, Shape::Pool;
    pool_max_clients_open: Fault::MaxClients, FailMode::Open, Shape::Pool;
    batched_killed_closed: Fault::Killed, FailMode::Closed, Shape::OwnBatched;
    batched_paused_open: Fault::Paused, FailMode::Open, Shape::OwnBatched;
    batched_slow_fallback: Fault::Slow, FailMode::Fallback, Shape::OwnBatched;
    batched_script_flush_closed: Fault::ScriptFlush, FailMode::Closed, Shape::OwnBatched;
    batched_max_clients_open: Fault::MaxClients, FailMode::Open, Shape::OwnBatched;
    pool_batched_killed_open: Fault::Killed, FailMode::Open, Shape::PoolBatched;
    pool_batched_paused_closed: Fault::Paused, FailMode::Closed, Shape::PoolBatched;
}

/// A Cluster master killed, its replica promoted (`CLUSTER FAILOVER
/// TAKEOVER`): no request waits past the deadline, and limiting resumes on
/// the new master by itself, in every fail mode.
async fn failover(mode: FailMode, shape: Shape) {
    use support::redis_server::RedisCluster;
    let mut cluster = RedisCluster::start_with_replicas();
    let builder = match shape {
        Shape::Own | Shape::OwnBatched => RedisStore::builder().cluster(cluster.urls()),
        Shape::Pool | Shape::PoolBatched => RedisStore::builder().cluster_pool(
            deadpool_redis::cluster::Config::from_urls(cluster.urls())
                .create_pool(Some(deadpool_redis::Runtime::Tokio1))
                .unwrap(),
        ),
    };
    let app = app_on(builder, mode).await;
    // Find the slot of the user's key, and the master that serves it. (A
    // cluster just made may answer its first command with an error, which
    // the fail mode answers: the request is sent again until Redis holds
    // its entry.)
    let settled = Instant::now();
    let key = loop {
        app.get("/x", "victim").await;
        let key = cluster
            .nodes
            .iter()
            .map(|n| n.cli(&["--scan", "--pattern", "*victim*"]))
            .find(|k| !k.is_empty());
        match key {
            Some(key) => break key,
            None => assert!(
                settled.elapsed() < Duration::from_secs(10),
                "no request reached the new cluster"
            ),
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let slot: u16 = cluster.nodes[0]
        .cli(&["cluster", "keyslot", &key])
        .parse()
        .unwrap();
    let (master, replica) = cluster.master_and_replica(slot);
    let replica = replica.expect("every master has a replica");
    // Let the write reach the replica before the master dies.
    std::thread::sleep(Duration::from_millis(200));

    cluster.nodes[master].kill();
    assert_eq!(
        cluster.nodes[replica].cli(&["cluster", "failover", "takeover"]),
        "OK"
    );
    let started = Instant::now();
    let mut late = 0;
    let mut worst = Duration::ZERO;
    let resumed = loop {
        let t = Instant::now();
        let reply = app.get("/x", "victim").await;
        let took = t.elapsed();
        worst = worst.max(took);
        if took > DEADLINE + SLACK {
            late += 1;
        }
        if reply.limited() {
            break started.elapsed();
        }
        assert!(
            started.elapsed() < Duration::from_secs(15),
            "limiting never resumed"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    println!(
        "FAULT ClusterFailover / {mode:?} / {shape:?}: late {late}, slowest {:.1} ms, resumed on the new master after {:.0} ms",
        worst.as_secs_f64() * 1e3,
        resumed.as_secs_f64() * 1e3
    );
    assert_eq!(
        late, 0,
        "{late} requests waited past the deadline (slowest {worst:?})"
    );
    // Whatever the layer answers while the cluster client settles (a
    // request that timed out here may still have run on the new master, and
    // a fallback store counts on its own), Redis never allows past the
    // limit. (It may hold fewer: a failover can lose the newest writes.)
    for _ in 0..3 {
        app.get("/x", "victim").await;
    }
    let entries = cluster.nodes[replica].log_entries(&key).len();
    assert!(
        entries <= 2,
        "the new master holds {entries} entries for a limit of 2"
    );
}

matrix_failover! {
    cluster_failover_open: FailMode::Open, Shape::Own;
    cluster_failover_closed: FailMode::Closed, Shape::Own;
    cluster_failover_fallback: FailMode::Fallback, Shape::Own;
    cluster_pool_failover_open: FailMode::Open, Shape::Pool;
}

/// One slow reply is not a dead connection: the request it delays gets the
/// fail mode at its deadline, the next ones are answered on the same
/// connection (no reconnect, no window of "not connected" failures).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_slow_reply_keeps_the_connection() {
    let server = RedisServer::start_with(&["--enable-debug-command", "local"]);
    let app = app_on(RedisStore::builder().url(server.url()), FailMode::Closed).await;
    assert_eq!(app.get("/x", "a").await.status, StatusCode::OK);
    let connections = |server: &RedisServer| -> u64 {
        let info = server.cli(&["info", "stats"]);
        info.lines()
            .find_map(|l| l.strip_prefix("total_connections_received:"))
            .and_then(|n| n.trim().parse().ok())
            .unwrap()
    };
    // (Every `cli` call is a connection of its own, counted too.)
    let before = connections(&server);
    let port = server.port;
    let sleeper = std::thread::spawn(move || cli(port, &["debug", "sleep", "0.2"]));
    tokio::time::sleep(Duration::from_millis(30)).await;
    let started = Instant::now();
    let slow = app.get("/x", "b").await;
    assert_eq!(slow.status, StatusCode::SERVICE_UNAVAILABLE);
    assert!(started.elapsed() < DEADLINE + SLACK);
    sleeper.join().unwrap();
    // Redis answers again: at once, on the connection the store had.
    for user in ["c", "d", "e"] {
        assert_eq!(app.get("/x", user).await.status, StatusCode::OK, "{user}");
    }
    assert_eq!(
        connections(&server),
        before + 2,
        "the store connected again after one timeout"
    );
}

/// Connected clients a server counts (the asking `redis-cli` among them).
fn connected_clients(server: &RedisServer) -> u64 {
    info_number(&server.cli(&["info", "clients"]), "connected_clients")
}

fn info_number(info: &str, field: &str) -> u64 {
    info.lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or_else(|| panic!("no {field} in {info}"))
}

/// A connection the server closed while it was idle (its `timeout`, a load
/// balancer or a NAT would; here `CLIENT KILL`) is found by the store's
/// keepalive and replaced by itself, before a request needs it: no request
/// after it fails, and the scripts the server kept are not loaded again.
async fn closed_while_idle(shape: Shape) {
    let server = RedisServer::start();
    let builder = match shape {
        Shape::Own | Shape::OwnBatched => RedisStore::builder().url(server.url()),
        Shape::Pool | Shape::PoolBatched => RedisStore::builder().pool(
            deadpool_redis::Config::from_url(server.url())
                .create_pool(Some(deadpool_redis::Runtime::Tokio1))
                .unwrap(),
        ),
    };
    let batched = matches!(shape, Shape::OwnBatched | Shape::PoolBatched);
    let builder = builder.keepalive(Some(Duration::from_millis(100)));
    let app = app_with(builder, FailMode::Closed, batched).await;
    let first = app.get("/x", "u").await;
    assert!(
        first.status == StatusCode::OK && first.limited(),
        "{first:?}"
    );
    let loads = server.calls("script|load");
    assert!(loads > 0);
    let times = server.calls("time");
    let killed: u64 = server
        .cli(&["client", "kill", "type", "normal"])
        .parse()
        .unwrap();
    assert!(killed >= 1, "{killed}");
    // Until the store is back: connected (besides the asking redis-cli),
    // and done with its new connection's setup, whose last step reads the
    // server's clock (`TIME`), microseconds before it takes checks.
    let started = Instant::now();
    while connected_clients(&server) < 2 || server.calls("time") <= times {
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "the store never connected again"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // And holding it: its keepalive reads the clock on the new connection
    // once idle (the setup's own reading is its last step, but on a busy
    // machine a request sent just after it could still come before the
    // store took the connection, and fail closed).
    let setup = server.calls("time");
    while server.calls("time") <= setup {
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "the store never used its new connection"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    for i in 0..20 {
        let reply = app.get("/x", &format!("after{i}")).await;
        assert!(
            reply.status == StatusCode::OK && reply.limited(),
            "request {i} after the reconnect: {reply:?}"
        );
    }
    assert_eq!(server.calls("script|load"), loads);
    assert!(server.calls("script|exists") >= 2);
}

#[tokio::test]
async fn a_connection_closed_while_idle_is_replaced_before_a_request_needs_it() {
    closed_while_idle(Shape::Own).await;
}

#[tokio::test]
async fn a_pooled_connection_closed_while_idle_is_replaced_too() {
    closed_while_idle(Shape::PoolBatched).await;
}

/// A 3-master Cluster and an app failing open on it (each user's budget
/// alone: the checks spread over the masters), once every master has
/// served a check (a cluster just made may answer its first commands with
/// an error).
async fn serving_cluster() -> (support::redis_server::RedisCluster, App) {
    let cluster = support::redis_server::RedisCluster::start();
    let app = on_cluster(&cluster, FailMode::Open).await;
    let settled = Instant::now();
    for i in 0..2_000 {
        app.get("/x", &format!("warm{i}")).await;
        if cluster.nodes.iter().all(|n| n.succeeded("evalsha") > 0) {
            break;
        }
        assert!(
            settled.elapsed() < Duration::from_secs(10),
            "the cluster never served"
        );
        // (A check failed open at once never yields: without this pause the
        // store's background connect, on this test's one thread, would never
        // run when the first one, made at build, timed out on a busy
        // machine.)
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    (cluster, app)
}

/// A Cluster master down is no reason to replace the whole Cluster client:
/// the client reconnects to that node by itself, so the store neither makes
/// new connections to the other masters nor loads its scripts on them again
/// (every app replica doing so on every failed request made a storm), and
/// every request still ends within the deadline.
#[tokio::test]
async fn a_cluster_master_down_makes_no_storm_of_reconnects_and_loads() {
    let (mut cluster, app) = serving_cluster().await;
    let survivors = &cluster.nodes[1..];
    let stats = |nodes: &[RedisServer]| -> Vec<(u64, u64)> {
        nodes
            .iter()
            .map(|n| {
                let received =
                    info_number(&n.cli(&["info", "stats"]), "total_connections_received");
                (n.calls("script|load"), received)
            })
            .collect()
    };
    let before = stats(survivors);
    cluster.nodes[0].kill();
    let mut worst = Duration::ZERO;
    for i in 0..100 {
        let started = Instant::now();
        app.get("/x", &format!("during{i}")).await;
        worst = worst.max(started.elapsed());
    }
    let after = stats(&cluster.nodes[1..]);
    for ((loads, received), (loads_after, received_after)) in before.iter().zip(&after) {
        assert_eq!(
            loads_after, loads,
            "scripts loaded again: {before:?} -> {after:?}"
        );
        // (The `redis-cli` calls of `stats` themselves, and a connection or
        // two the client may make to read the slots again.)
        assert!(
            received_after - received <= 8,
            "connections: {before:?} -> {after:?}"
        );
    }
    assert!(worst < DEADLINE + SLACK, "slowest request {worst:?}");
}

/// A Cluster down as a whole: after a few checks failed in a row, the store
/// finds that no master answers its client and drops it, and the checks
/// fail at once without it until a new client connects. Before, each went
/// to the client, which tried to reconnect to its initial nodes for it,
/// and redis-rs logged warnings and errors for every check (15 each
/// here).
#[tokio::test]
async fn a_cluster_down_as_a_whole_is_not_asked_by_every_check() {
    let (mut cluster, app) = serving_cluster().await;
    let logged = RedisLogs::start();
    for node in &mut cluster.nodes {
        node.kill();
    }
    let mut worst = Duration::ZERO;
    for i in 0..200 {
        let started = Instant::now();
        let reply = app.get("/x", &format!("down{i}")).await;
        worst = worst.max(started.elapsed());
        assert!(!reply.limited(), "decided with every master down");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let errors = logged.count();
    // (The store's own tries to connect, a few a second, log some: 65
    // measured; before, 3,003.)
    assert!(
        errors < 200,
        "redis-rs logged {errors} warnings for 200 checks"
    );
    assert!(worst < DEADLINE + SLACK, "slowest request {worst:?}");
}

/// Counts what redis-rs logs (through `log`) at warning level or above on
/// this thread (a `#[tokio::test]` runs its tasks, the Cluster client's
/// among them, on its own thread) from when it is made.
struct RedisLogs(usize);

thread_local! {
    static REDIS_LOGS: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

impl RedisLogs {
    fn start() -> Self {
        struct Counter;
        impl log::Log for Counter {
            fn enabled(&self, metadata: &log::Metadata<'_>) -> bool {
                metadata.target().starts_with("redis") && metadata.level() <= log::Level::Warn
            }
            fn log(&self, record: &log::Record<'_>) {
                if self.enabled(record.metadata()) {
                    REDIS_LOGS.with(|n| n.set(n.get() + 1));
                }
            }
            fn flush(&self) {}
        }
        static COUNTER: Counter = Counter;
        static SET: std::sync::Once = std::sync::Once::new();
        SET.call_once(|| {
            log::set_logger(&COUNTER).expect("no other logger in this test binary");
            log::set_max_level(log::LevelFilter::Warn);
        });
        Self(REDIS_LOGS.with(std::cell::Cell::get))
    }

    fn count(&self) -> usize {
        REDIS_LOGS.with(std::cell::Cell::get) - self.0
    }
}

/// One stall of every Cluster node times out the checks in flight together
/// (a Cluster client's checks go one call each); they count as one
/// timeout, not as the three in a row after which the store replaces its
/// client (a new client on every master, asking each for its scripts).
#[tokio::test]
async fn checks_timed_out_by_one_stall_count_as_one_timeout() {
    let (cluster, app) = serving_cluster().await;
    let asked = || -> u64 { cluster.nodes.iter().map(|n| n.calls("script|exists")).sum() };
    let before = asked();
    for node in &cluster.nodes {
        assert_eq!(node.cli(&["client", "pause", "400", "all"]), "OK");
    }
    let users: Vec<String> = (0..24).map(|i| format!("stalled{i}")).collect();
    let started = Instant::now();
    let replies = futures_util::future::join_all(users.iter().map(|u| app.get("/x", u))).await;
    assert!(started.elapsed() < DEADLINE + SLACK);
    // (Failing open: the checks timed out, and the requests passed
    // without headers.)
    assert!(replies
        .iter()
        .all(|r| r.status == StatusCode::OK && r.header("x-ratelimit-remaining").is_none()));
    for node in &cluster.nodes {
        // (Answered once the pause is over.)
        assert_eq!(node.cli(&["ping"]), "PONG");
    }
    // A replaced client would have asked every master by now: it began
    // connecting at the third timeout, and finishes once the pause ends.
    // (Polled for 1.5 s, at most 150 times.)
    let after_pause = Instant::now();
    for i in 0..150 {
        if after_pause.elapsed() > Duration::from_millis(1500) {
            break;
        }
        assert_eq!(asked(), before, "the store replaced its Cluster client");
        let reply = app.get("/x", &format!("after{i}")).await;
        assert_eq!(reply.status, StatusCode::OK);
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // (And the old client decides again.)
    let decided = app.get("/x", "decided").await;
    assert!(decided.header("x-ratelimit-remaining").is_some());
}

/// [`app_with`] on `server`'s own connection, failing closed.
async fn failing_closed_on(server: &RedisServer, batched: bool) -> App {
    app_with(
        RedisStore::builder().url(server.url()),
        FailMode::Closed,
        batched,
    )
    .await
}

/// After `SCRIPT FLUSH` (or a restart), the checks in flight that Redis
/// answers `NOSCRIPT` share one load of their script: not one
/// `SCRIPT LOAD` each, which grew with the concurrency and the replicas.
#[tokio::test]
async fn checks_in_flight_after_a_script_flush_share_one_load() {
    for batched in [false, true] {
        let server = RedisServer::start();
        let app = failing_closed_on(&server, batched).await;
        assert!(app.get("/x", "warm").await.limited());
        assert_eq!(server.cli(&["script", "flush"]), "OK");
        let before = server.calls("script|load");
        let users: Vec<String> = (0..50).map(|i| format!("u{i}")).collect();
        let replies = futures_util::future::join_all(users.iter().map(|u| app.get("/x", u))).await;
        assert!(
            replies
                .iter()
                .all(|r| r.status == StatusCode::OK && r.limited()),
            "batched {batched}"
        );
        let loads = server.calls("script|load") - before;
        assert!((1..=2).contains(&loads), "batched {batched}: {loads} loads");
    }
}

/// After `SCRIPT FLUSH`, a batch whose checks run two scripts (two
/// algorithms, each its batch script) loads both, in one round trip, and
/// every check is decided within its deadline.
#[tokio::test]
async fn a_batch_of_two_scripts_after_a_script_flush_loads_both() {
    let server = RedisServer::start();
    let store = RedisStore::builder()
        .url(server.url())
        .timeout(DEADLINE)
        .build()
        .await
        .unwrap();
    let rules = Rules::builder()
        .route(
            "^/tb",
            [Rule::new().minute(100).algorithm(Algorithm::TokenBucket)],
        )
        .route(
            "^/fw",
            [Rule::new().minute(100).algorithm(Algorithm::FixedWindow)],
        )
        .build()
        .unwrap();
    let app = App::on_store_clock(rules, store, |l| {
        l.fail_mode(FailMode::Closed).denial_cache(0)
    });
    // (Each script run once; a first check that misses its 50 ms deadline
    // on a loaded machine is tried again.)
    for path in ["/tb", "/fw"] {
        let settled = Instant::now();
        while !app.get(path, "warm").await.limited() {
            assert!(settled.elapsed() < Duration::from_secs(10), "{path}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    assert_eq!(server.cli(&["script", "flush"]), "OK");
    let before = server.calls("script|load");
    let requests: Vec<(&str, String)> = (0..24)
        .map(|i| (if i % 2 == 0 { "/tb" } else { "/fw" }, format!("u{i}")))
        .collect();
    let replies =
        futures_util::future::join_all(requests.iter().map(|(path, u)| app.get(path, u))).await;
    assert!(
        replies
            .iter()
            .all(|r| r.status == StatusCode::OK && r.limited()),
        "{replies:?}"
    );
    let loads = server.calls("script|load") - before;
    assert!((2..=4).contains(&loads), "{loads} loads");
}

/// A check Redis runs only after its deadline (the server stalled; here
/// `CLIENT PAUSE`) is refused by the script instead of recorded: requests
/// the layer already failed closed are not charged to the user once Redis
/// catches up. (The deadline rides on the server's clock, which the store
/// reads when it connects.)
#[tokio::test]
async fn checks_redis_runs_after_a_stall_are_not_charged() {
    for batched in [false, true] {
        // (Two: a third timeout in a row would replace the connection.)
        stalled_checks_are_not_charged(batched, 1500, 2).await;
    }
}

/// As [`checks_redis_runs_after_a_stall_are_not_charged`], after a stall
/// of 400 ms (a fork's, say): the deadline on the server's clock allows the
/// check's own, the reading's error, 5 ms, up to 2 ms of rounding and the
/// clocks' drift since the reading; until round 44 it allowed 500 ms, and
/// a stall shorter than that charged the user.
#[tokio::test]
async fn checks_redis_runs_after_a_short_stall_are_not_charged() {
    for batched in [false, true] {
        stalled_checks_are_not_charged(batched, 400, 1).await;
    }
}

/// Redis paused for `pause_ms` while `requests` of one user's fail closed
/// (each at its deadline, well before the pause ends): once Redis runs
/// them, late, the user's whole budget (2 a minute) is left.
async fn stalled_checks_are_not_charged(batched: bool, pause_ms: u64, requests: usize) {
    let server = RedisServer::start();
    let app = failing_closed_on(&server, batched).await;
    assert!(app.get("/x", "warm").await.limited(), "batched {batched}");
    let pause = Duration::from_millis(pause_ms);
    let ms = pause_ms.to_string();
    // (Before the pause begins: a bound on when it ends.)
    let paused = Instant::now();
    assert_eq!(server.cli(&["client", "pause", &ms, "all"]), "OK");
    for _ in 0..requests {
        let reply = app.get("/x", "victim").await;
        assert_eq!(
            reply.status,
            StatusCode::SERVICE_UNAVAILABLE,
            "batched {batched}"
        );
    }
    // (Each check's deadline on the server's clock is about 60 ms after it
    // was sent: well before the pause ends.)
    assert!(
        paused.elapsed() < pause.saturating_sub(Duration::from_millis(150)),
        "the machine stalled"
    );
    // (No other request before the pause ends: it would time out too.)
    let ended = pause + Duration::from_millis(100);
    tokio::time::sleep(ended.saturating_sub(paused.elapsed())).await;
    // Redis runs the stalled checks, then this one, when the pause ends.
    while !app
        .get("/x", &format!("probe{}", paused.elapsed().as_millis()))
        .await
        .limited()
    {
        assert!(
            paused.elapsed() < Duration::from_secs(5),
            "batched {batched}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // The victim's whole budget is left.
    for n in 0..2 {
        let reply = app.get("/x", "victim").await;
        assert!(
            reply.status == StatusCode::OK && reply.limited(),
            "batched {batched}, pause {pause_ms} ms, request {n}: {reply:?}"
        );
    }
    assert_eq!(
        app.get("/x", "victim").await.status,
        StatusCode::TOO_MANY_REQUESTS
    );
}

/// On a Cluster, as on one server: a check that a stalled master (here
/// `CLIENT PAUSE`) runs only after its deadline is refused by the script,
/// not recorded. The deadline rides on the clock of the master that runs
/// the check (each node keeps its own), which the store reads as it
/// connects; before, a Cluster's checks carried none, and the user was
/// charged for the request the layer had failed closed. The same through a
/// caller's pool, whose slots' masters the store reads through it.
#[tokio::test]
async fn checks_a_cluster_master_runs_after_a_stall_are_not_charged() {
    for pool in [false, true] {
        let cluster = support::redis_server::RedisCluster::start();
        let (app, store) = on_cluster_or_pool(&cluster, FailMode::Closed, pool).await;
        stalled_master_does_not_charge(&cluster, &app, &store).await;
    }
}

/// See [`checks_a_cluster_master_runs_after_a_stall_are_not_charged`].
async fn stalled_master_does_not_charge(
    cluster: &support::redis_server::RedisCluster,
    app: &App,
    store: &RedisStore,
) {
    // (Each user has spent 1 of its 2 a minute.)
    let (users, masters, stalled, paused) = stall_a_master(cluster, app, Some(store), 1500).await;
    let victim = &users[0];
    let reply = app.get("/x", victim).await;
    assert_eq!(reply.status, StatusCode::SERVICE_UNAVAILABLE, "{reply:?}");
    assert!(
        paused.elapsed() < Duration::from_millis(1200),
        "the machine stalled"
    );
    tokio::time::sleep(Duration::from_millis(1600).saturating_sub(paused.elapsed())).await;
    // The master runs the stalled check, then these, once it answers again
    // (other users of its own, as probes).
    let neighbours: Vec<String> = users
        .iter()
        .zip(&masters)
        .skip(1)
        .filter(|&(_, &m)| m == stalled)
        .map(|(u, _)| u.clone())
        .collect();
    assert!(!neighbours.is_empty(), "no other user on master {stalled}");
    until_decided(app, &neighbours[..1]).await;
    // The victim's last request of the minute is left.
    let reply = app.get("/x", victim).await;
    assert_eq!(reply.status, StatusCode::OK, "{reply:?}");
    assert_eq!(reply.number("x-ratelimit-remaining"), 0, "{reply:?}");
    let reply = app.get("/x", victim).await;
    assert_eq!(reply.status, StatusCode::TOO_MANY_REQUESTS, "{reply:?}");
}

/// The index of the master of `cluster` that holds `user`'s budget, if
/// one does.
fn master_of(cluster: &support::redis_server::RedisCluster, user: &str) -> Option<usize> {
    let pattern = format!("*{user}*");
    cluster
        .nodes
        .iter()
        .position(|n| !n.cli(&["--scan", "--pattern", &pattern]).is_empty())
}

/// Sends each user's requests through `app` until one is decided (a
/// cluster just made may answer its first commands with an error).
async fn until_decided(app: &App, users: &[String]) {
    for user in users {
        let settled = Instant::now();
        while !app.get("/x", user).await.limited() {
            assert!(settled.elapsed() < Duration::from_secs(10), "{user}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

/// A caller's pool on `cluster` (of `size` connections; deadpool's
/// default without).
fn cluster_pool(
    cluster: &support::redis_server::RedisCluster,
    size: Option<usize>,
) -> deadpool_redis::cluster::Pool {
    let mut config = deadpool_redis::cluster::Config::from_urls(cluster.urls());
    config.pool = size.map(deadpool_redis::PoolConfig::new);
    config
        .create_pool(Some(deadpool_redis::Runtime::Tokio1))
        .unwrap()
}

/// Twelve users spread over `cluster`'s masters, each decided once on
/// Redis through `app`, and the master of each. (Users' names are no prefix
/// of one another, for `--scan` patterns. A user whose first check a
/// loaded machine answered from a fail mode, as `FailMode::Fallback` does
/// with headers, holds no key: it is left out for the next name.)
async fn decided_spread(
    cluster: &support::redis_server::RedisCluster,
    app: &App,
) -> (Vec<String>, Vec<usize>) {
    let (mut users, mut masters) = (Vec::new(), Vec::new());
    let started = Instant::now();
    for i in 0.. {
        if users.len() == 12 {
            break;
        }
        assert!(started.elapsed() < Duration::from_secs(20), "no spread");
        let user = format!("spread{i}x");
        until_decided(app, std::slice::from_ref(&user)).await;
        match master_of(cluster, &user) {
            Some(master) => {
                users.push(user);
                masters.push(master);
            }
            None => tokio::time::sleep(Duration::from_millis(50)).await,
        }
    }
    (users, masters)
}

/// Twelve users spread over `cluster`'s masters, each decided once through
/// `app`, and the master of each; then, once `store` (`app`'s, when its
/// checks' deadlines matter) knows every master's clock, the first user's
/// master paused (`CLIENT PAUSE`) for `ms`: its index, and when the pause
/// began.
async fn stall_a_master(
    cluster: &support::redis_server::RedisCluster,
    app: &App,
    store: Option<&RedisStore>,
    ms: u64,
) -> (Vec<String>, Vec<usize>, usize, Instant) {
    let (users, masters) = decided_spread(cluster, app).await;
    let stalled = masters[0];
    // (Checks carry no deadline before, and on a busy machine a reading
    // may come after the checks above. A `TIME` counted by a master tells
    // nothing: every script reads the clock.)
    let started = Instant::now();
    while store.is_some_and(|s| !s.deadlines_known()) {
        assert!(started.elapsed() < Duration::from_secs(5), "no clock read");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let ms = ms.to_string();
    assert_eq!(
        cluster.nodes[stalled].cli(&["client", "pause", &ms, "all"]),
        "OK"
    );
    (users, masters, stalled, Instant::now())
}

/// With one of a Cluster's masters stalled, a store's checks on the other
/// masters are decided as ever, and those on the stalled one fail (closed,
/// here) within the deadline: one master's trouble is not the whole
/// store's.
async fn decided_around_a_stalled_master(
    app: &App,
    users: &[String],
    masters: &[usize],
    stalled: usize,
) {
    for (user, &master) in users.iter().zip(masters) {
        let started = Instant::now();
        let reply = app.get("/x", user).await;
        assert!(
            started.elapsed() < DEADLINE + SLACK,
            "{user}: {:?}",
            started.elapsed()
        );
        if master == stalled {
            assert_eq!(reply.status, StatusCode::SERVICE_UNAVAILABLE, "{user}");
        } else {
            // (Decided: allowed or denied, with the store's headers.)
            assert!(reply.limited(), "{user} on master {master}: {reply:?}");
        }
    }
}

/// A store made while one Cluster master does not answer (`CLIENT PAUSE`:
/// it takes connections and leaves every command waiting, as a node
/// behind a partition or in a long pause) connects at once, and decides
/// the checks the other masters serve: its start-up (the scripts checked
/// and loaded on every master) does not wait for the stalled one.
#[tokio::test]
async fn a_store_made_while_a_cluster_master_stalls_decides_on_the_others() {
    let cluster = support::redis_server::RedisCluster::start();
    let warm = on_cluster(&cluster, FailMode::Open).await;
    let (users, masters, stalled, paused) = stall_a_master(&cluster, &warm, None, 8000).await;
    let app = on_cluster(&cluster, FailMode::Closed).await;
    decided_around_a_stalled_master(&app, &users, &masters, stalled).await;
    assert!(
        paused.elapsed() < Duration::from_secs(5),
        "the machine stalled"
    );
}

/// Under `FailMode::Fallback`, a Cluster master that stalls sends only its
/// own budgets to the in-process store: its check times out and is decided
/// there, and the other masters' budgets are still decided, and spent, on
/// Redis. Before, that one timeout sent every budget to the in-process
/// store until a probe, 500 ms on, reached a master that answers (each
/// replica then limiting on its own). The same through a caller's pool,
/// whose slots' masters the store reads through it (before, a pool's store
/// was one part).
#[tokio::test]
async fn a_stalled_cluster_master_sends_only_its_own_budgets_to_the_fallback() {
    for pool in [false, true] {
        let cluster = support::redis_server::RedisCluster::start();
        let (app, store) = on_cluster_or_pool(&cluster, FailMode::Fallback, pool).await;
        only_the_stalled_master_s_budgets_fall_back(&cluster, &app, &store).await;
    }
}

/// See [`a_stalled_cluster_master_sends_only_its_own_budgets_to_the_fallback`].
async fn only_the_stalled_master_s_budgets_fall_back(
    cluster: &support::redis_server::RedisCluster,
    app: &App,
    store: &RedisStore,
) {
    // (Each user has spent 1 of its 2 a minute on Redis.)
    let (users, masters, stalled, paused) = stall_a_master(cluster, app, Some(store), 8000).await;
    let reply = app.get("/x", &users[0]).await;
    assert_eq!(reply.status, StatusCode::OK, "{reply:?}");
    assert_eq!(
        reply.number("x-ratelimit-remaining"),
        1,
        "from memory: {reply:?}"
    );
    for (user, &master) in users.iter().zip(&masters) {
        if master == stalled {
            continue;
        }
        let reply = app.get("/x", user).await;
        assert_eq!(reply.status, StatusCode::OK, "{user}: {reply:?}");
        assert_eq!(
            reply.number("x-ratelimit-remaining"),
            0,
            "{user} on master {master}, decided on Redis: {reply:?}"
        );
    }
    assert!(
        paused.elapsed() < Duration::from_secs(5),
        "the machine stalled"
    );
}

/// A caller's Cluster pool with one master stalled: the checks for it time
/// out again and again, and the store looks for a new client from the
/// pool, but keeps the one it holds (which still serves every other
/// master) until one is ready; before, it dropped it at the third timeout,
/// and every check failed until the master came back.
#[tokio::test]
async fn a_cluster_pool_keeps_its_client_while_one_master_stalls() {
    let cluster = support::redis_server::RedisCluster::start();
    let pool = cluster_pool(&cluster, None);
    let app = app_with(
        RedisStore::builder().cluster_pool(pool),
        FailMode::Closed,
        true,
    )
    .await;
    let (users, masters, stalled, paused) = stall_a_master(&cluster, &app, None, 8000).await;
    // Five timeouts in a row on the stalled master's first user.
    for _ in 0..5 {
        let reply = app.get("/x", &users[0]).await;
        assert_eq!(reply.status, StatusCode::SERVICE_UNAVAILABLE);
    }
    decided_around_a_stalled_master(&app, &users, &masters, stalled).await;
    assert!(
        paused.elapsed() < Duration::from_secs(5),
        "the machine stalled"
    );
}

/// A store's own Cluster client with one master stalled, and checks on
/// that master alone for a while (a hot route-wide budget's slot, while
/// the other users are denied locally): the checks time out again and
/// again with no answer from another master between them, and the store
/// asks whether the client still answers on the other masters, which it
/// does, so it keeps it. Before, it made a new client, whose first calls
/// waited on a refresh of the slots that tried the stalled master, and
/// every master's checks failed, again at each new client, until the
/// master came back.
#[tokio::test]
async fn a_cluster_client_timing_out_on_one_master_alone_is_kept() {
    let cluster = support::redis_server::RedisCluster::start();
    let app = on_cluster(&cluster, FailMode::Closed).await;
    no_failover(&cluster);
    let (users, masters) = decided_spread(&cluster, &app).await;
    let stalled = masters[0];
    // (Stopped, as a process that hangs: it takes no connection and
    // answers nothing; continued however the test ends.)
    let _stopped = Stopped::new(cluster.nodes[stalled].pid().unwrap());
    let paused = Instant::now();
    // Timeouts in a row, on the stalled master's first user alone, for
    // as long as the store took to make a new client and swap it in.
    while paused.elapsed() < Duration::from_millis(1500) {
        let reply = app.get("/x", &users[0]).await;
        assert_eq!(reply.status, StatusCode::SERVICE_UNAVAILABLE);
    }
    for _ in 0..3 {
        decided_around_a_stalled_master(&app, &users, &masters, stalled).await;
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    assert!(
        paused.elapsed() < Duration::from_secs(5),
        "the machine stalled"
    );
}

/// A Cluster master that hangs (`SIGSTOP`), its replica promoted, while
/// other masters' users keep being decided (their answers between the
/// failed checks): the store finds the failed checks' master moved, makes
/// a new client that reaches it, and limiting resumes on the new master.
/// Before, every answer from another master set the count of failures in
/// a row back to nought, and the client, which never learns of a failover
/// from a master that just does not answer, sent them to the stopped one
/// until it went on.
#[tokio::test]
async fn a_hung_cluster_masters_checks_follow_its_promoted_replica() {
    let (cluster, app, users, masters) = cluster_with_replicas_spread().await;
    follows_the_promoted_replica(&cluster, &app, &users, &masters).await;
}

/// A Cluster with replicas, an app on every node as seeds (failing
/// closed), and users spread over its masters (see `decided_spread`).
async fn cluster_with_replicas_spread() -> (
    support::redis_server::RedisCluster,
    App,
    Vec<String>,
    Vec<usize>,
) {
    let cluster = support::redis_server::RedisCluster::start_with_replicas();
    let app = on_cluster(&cluster, FailMode::Closed).await;
    let (users, masters) = decided_spread(&cluster, &app).await;
    (cluster, app, users, masters)
}

/// The same with one seed, the master that hangs: the store's new client
/// is made on the masters its watch found in the slots (a client made on
/// the seed again would wait on it, and learn of no promotion while it
/// hangs).
#[tokio::test]
async fn a_hung_sole_seed_s_checks_follow_its_promoted_replica() {
    let (cluster, _warm, users, masters) = cluster_with_replicas_spread().await;
    let seed = cluster.nodes[masters[0]].url();
    let app = app_with(
        RedisStore::builder().cluster([seed]),
        FailMode::Closed,
        true,
    )
    .await;
    until_decided(&app, &users).await;
    follows_the_promoted_replica(&cluster, &app, &users, &masters).await;
}

/// Hangs the master of `users[0]` (`masters[0]`) and has the Cluster
/// promote its replica: its checks are decided again within 15 s, and the
/// other users' after.
async fn follows_the_promoted_replica(
    cluster: &support::redis_server::RedisCluster,
    app: &App,
    users: &[String],
    masters: &[usize],
) {
    let (master, replica) = master_and_replica_of(cluster, &users[0], masters[0]);
    // (The others on masters that answer.)
    let others: Vec<&String> = users
        .iter()
        .zip(masters)
        .filter(|(_, &m)| m != master)
        .map(|(u, _)| u)
        .collect();
    assert!(!others.is_empty());
    std::thread::sleep(Duration::from_millis(200));
    let _stopped = Stopped::new(cluster.nodes[master].pid().unwrap());
    assert_eq!(
        cluster.nodes[replica].cli(&["cluster", "failover", "takeover"]),
        "OK"
    );
    let started = Instant::now();
    loop {
        let victim = app.get("/x", &users[0]).await;
        if victim.limited() {
            break;
        }
        for user in &others {
            app.get("/x", user).await;
        }
        assert!(
            started.elapsed() < Duration::from_secs(15),
            "the hung master's checks never moved to its promoted replica"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    for user in others {
        assert!(app.get("/x", user).await.limited(), "{user}");
    }
}

/// A store made while a Cluster master hangs (`SIGSTOP`: it takes
/// connections and answers nothing): its client has no connection to that
/// master, and the checks on the others are still decided. Before the store
/// watched the masters itself, each check of the hung master's slots went
/// to another node, was redirected, and the client refreshed its slots,
/// waiting on the hung master and holding every check back (benches/
/// HISTORY.md, round 40): now the store finds the master silent as it
/// connects and fails its checks at once, and decides them again once it
/// answers.
#[tokio::test]
async fn a_store_made_while_a_cluster_master_hangs_decides_on_the_others() {
    let cluster = support::redis_server::RedisCluster::start();
    no_failover(&cluster);
    let warm = on_cluster(&cluster, FailMode::Open).await;
    let (users, masters) = decided_spread(&cluster, &warm).await;
    let stalled = masters[0];
    let stopped = Stopped::new(cluster.nodes[stalled].pid().unwrap());
    let paused = Instant::now();
    let store = RedisStore::builder()
        .cluster(cluster.urls())
        .timeout(DEADLINE)
        .build()
        .await
        .unwrap();
    // (Held as the store connected.)
    assert_eq!(
        store.held_masters(),
        [format!("127.0.0.1:{}", cluster.nodes[stalled].port)]
    );
    let app = app_on_store(store.clone(), FailMode::Closed, true);
    for _ in 0..5 {
        decided_around_a_stalled_master(&app, &users, &masters, stalled).await;
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(
        paused.elapsed() < Duration::from_secs(30),
        "the machine stalled"
    );
    drop(stopped);
    until_decided(&app, &users).await;
    assert!(store.held_masters().is_empty());
}

/// A store whose client refreshes its slots while a master hangs (another
/// master failed over meanwhile: its checks are redirected, and redis-rs
/// reconnects to the nodes) decides the checks of the masters that answer,
/// once the refresh is done. The watch holds the hung master, so no check
/// of its slots goes to the client, which, holding no connection to it,
/// would send it elsewhere, be redirected, and refresh its slots again,
/// waiting on the hung master and holding every check back (benches/
/// HISTORY.md, rounds 40 and 41).
#[tokio::test]
async fn a_cluster_refreshing_its_slots_while_a_master_hangs_decides_on_the_others() {
    let cluster = support::redis_server::RedisCluster::start_with_replicas();
    no_failover(&cluster);
    let store = RedisStore::builder()
        .cluster(cluster.urls())
        .timeout(DEADLINE)
        .build()
        .await
        .unwrap();
    let app = app_on_store(store.clone(), FailMode::Closed, true);
    let (users, masters) = decided_spread(&cluster, &app).await;
    let hung = masters[0];
    let (moved, mover) = users
        .iter()
        .zip(&masters)
        .find(|(_, &m)| m != hung)
        .unwrap();
    let (_, replica) = master_and_replica_of(&cluster, moved, *mover);
    let stopped = Stopped::new(cluster.nodes[hung].pid().unwrap());
    // (The hung master's checks fail, and the watch, asking the masters,
    // holds it.)
    failing_until_held(&app, &store, &users[0]).await;
    assert_eq!(
        store.held_masters(),
        [format!("127.0.0.1:{}", cluster.nodes[hung].port)]
    );
    assert_eq!(
        cluster.nodes[replica].cli(&["cluster", "failover", "takeover"]),
        "OK"
    );
    let others: Vec<String> = users
        .iter()
        .zip(&masters)
        .filter(|(_, &m)| m != hung)
        .map(|(u, _)| u.clone())
        .collect();
    until_decided(&app, &others).await;
    for _ in 0..5 {
        decided_around_a_stalled_master(&app, &users, &masters, hung).await;
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    drop(stopped);
    until_decided(&app, &users).await;
    assert!(store.held_masters().is_empty());
}

/// The store's watch of a Cluster's masters works over TLS, with the
/// store's certificates: a master that hangs is held (its slots read, and
/// its silence heard), and let go once it answers a `PING` again on the
/// watch's own TLS connection; meanwhile its checks fail, and after it they
/// are decided.
#[cfg(feature = "tls")]
#[tokio::test]
async fn a_hung_cluster_master_is_held_and_let_go_over_tls() {
    use support::redis_server::TlsFiles;
    let files = TlsFiles::make();
    let (server, tls_port) = RedisServer::start_tls_cluster_of_one(&files);
    let store = RedisStore::builder()
        .cluster([format!("rediss://127.0.0.1:{tls_port}")])
        .tls_root_certificate(files.read("ca.crt"))
        .timeout(DEADLINE)
        .build()
        .await
        .unwrap();
    let rules = Rules::builder()
        .add_route(Route::new("^/").rules([Rule::new().minute(2)]))
        .build()
        .unwrap();
    let app = App::on_store_clock(rules, store.clone(), |l| {
        l.fail_mode(FailMode::Closed).denial_cache(0)
    });
    let user = "tls-user".to_owned();
    until_decided(&app, std::slice::from_ref(&user)).await;
    assert!(store.held_masters().is_empty());
    let stopped = Stopped::new(server.pid().unwrap());
    failing_until_held(&app, &store, &user).await;
    assert_eq!(store.held_masters(), [format!("127.0.0.1:{tls_port}")]);
    assert_eq!(
        app.get("/x", &user).await.status,
        StatusCode::SERVICE_UNAVAILABLE
    );
    drop(stopped);
    let going = Instant::now();
    while !store.held_masters().is_empty() {
        assert!(going.elapsed() < Duration::from_secs(10), "never let go");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    until_decided(&app, &[user]).await;
}

/// The master (by index in `cluster`) of `user`'s budget, on `master`,
/// and its replica.
fn master_and_replica_of(
    cluster: &support::redis_server::RedisCluster,
    user: &str,
    master: usize,
) -> (usize, usize) {
    let key = cluster.nodes[master].cli(&["--scan", "--pattern", &format!("*{user}*")]);
    let slot: u16 = cluster.nodes[master]
        .cli(&["cluster", "keyslot", &key])
        .parse()
        .unwrap();
    let (master, replica) = cluster.master_and_replica(slot);
    (master, replica.expect("every master has a replica"))
}

/// Sends `user`'s requests, each failing (closed), until `store`'s watch
/// holds a master (within 10 s).
async fn failing_until_held(app: &App, store: &RedisStore, user: &str) {
    let started = Instant::now();
    while store.held_masters().is_empty() {
        assert_eq!(
            app.get("/x", user).await.status,
            StatusCode::SERVICE_UNAVAILABLE
        );
        assert!(started.elapsed() < Duration::from_secs(10), "never held");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Sets `cluster`'s node timeout to a minute, so that a stopped master is
/// not found failing while a test runs (the other masters would then
/// answer `CLUSTERDOWN`, 2 s on with the test clusters' timeout).
fn no_failover(cluster: &support::redis_server::RedisCluster) {
    for node in &cluster.nodes {
        assert_eq!(
            node.cli(&["config", "set", "cluster-node-timeout", "60000"]),
            "OK"
        );
    }
}

/// A process stopped (`SIGSTOP`) while this lives, continued when it is
/// dropped.
struct Stopped(u32);

impl Stopped {
    fn new(pid: u32) -> Self {
        let signal = |name: &str| {
            std::process::Command::new("kill")
                .args([name, &pid.to_string()])
                .status()
                .unwrap()
        };
        assert!(signal("-STOP").success());
        Self(pid)
    }
}

impl Drop for Stopped {
    fn drop(&mut self) {
        let _ = std::process::Command::new("kill")
            .args(["-CONT", &self.0.to_string()])
            .status();
    }
}

/// A caller's Cluster pool with room for one connection, which the store
/// holds: after timeouts in a row the store asks the pool for another in
/// the background (none can come), and stops asking once its own client
/// answers again; before, it asked for good, a checkout waiting on the pool
/// every second.
#[tokio::test]
async fn a_cluster_pool_stops_asking_for_a_client_once_its_own_answers_again() {
    let cluster = support::redis_server::RedisCluster::start();
    let pool = cluster_pool(&cluster, Some(1));
    let app = app_with(
        RedisStore::builder().cluster_pool(pool.clone()),
        FailMode::Closed,
        true,
    )
    .await;
    let (users, _, _, paused) = stall_a_master(&cluster, &app, None, 1500).await;
    // Timeouts in a row on the stalled master's user: the store asks the
    // pool for another client.
    for _ in 0..4 {
        let reply = app.get("/x", &users[0]).await;
        assert_eq!(reply.status, StatusCode::SERVICE_UNAVAILABLE);
    }
    assert!(
        paused.elapsed() < Duration::from_millis(1200),
        "the machine stalled"
    );
    tokio::time::sleep(Duration::from_millis(1600).saturating_sub(paused.elapsed())).await;
    // The kept client answers again.
    until_decided(&app, &users[..1]).await;
    // (A try under way when it did ends within the checkout's deadline,
    // 500 ms, and the wait after it within 500 ms.)
    tokio::time::sleep(Duration::from_millis(1200)).await;
    for _ in 0..75 {
        assert_eq!(pool.status().waiting, 0, "the store still asks the pool");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
