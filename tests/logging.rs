//! The decisions' log events, in a test binary of their own: `tracing`
//! keeps its subscribers' interest in each event in process-wide state, which
//! tests running at once on other threads would share.

mod support;

use std::sync::Arc;

use support::App;
use tower_ratelimit::{MemoryStore, Rule, Rules};

fn one(rule: Rule) -> Rules {
    Rules::builder().route("^/a", [rule]).build().unwrap()
}

/// A `tracing` writer into a buffer the test reads.
#[derive(Clone, Default)]
struct LogBuffer(Arc<std::sync::Mutex<Vec<u8>>>);

impl std::io::Write for LogBuffer {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .extend_from_slice(bytes);
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for LogBuffer {
    type Writer = LogBuffer;

    fn make_writer(&'a self) -> LogBuffer {
        self.clone()
    }
}

/// Runs `work` on a runtime of its own under a subscriber at `level`:
/// what it returns, and what it logged.
fn capture<F: std::future::Future>(level: tracing::Level, work: F) -> (F::Output, String) {
    let buffer = LogBuffer::default();
    let subscriber = tracing_subscriber::fmt()
        .with_max_level(level)
        .with_ansi(false)
        .with_writer(buffer.clone())
        .finish();
    let output = tracing::subscriber::with_default(subscriber, || {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
            .block_on(work)
    });
    let bytes = buffer.0.lock().unwrap().clone();
    (output, String::from_utf8(bytes).unwrap())
}

/// What two requests of one user (limit 1 a second) log under a
/// subscriber at `level`, in shadow mode or not.
fn logged(level: tracing::Level, shadow: bool) -> String {
    let work = async {
        let app = App::with(one(Rule::new().second(1)), MemoryStore::new(), |l| {
            l.shadow(shadow)
        });
        app.get("/a", "u").await;
        app.get("/a", "u").await;
    };
    capture(level, work).1
}

#[test]
fn decisions_are_logged_at_debug_and_shadow_denials_at_info() {
    let debug = logged(tracing::Level::DEBUG, false);
    assert!(debug.contains("rate limit decision"), "{debug}");
    assert!(debug.contains("outcome=\"allowed\" remaining=0"), "{debug}");
    assert!(debug.contains("outcome=\"denied\" remaining=0"), "{debug}");
    let info = logged(tracing::Level::INFO, true);
    assert!(
        info.contains("shadow mode: request would have been denied"),
        "{info}"
    );
    assert!(!info.contains("rate limit decision"), "{info}");
    assert_eq!(logged(tracing::Level::WARN, true), "");
}

/// Shadow mode on real traffic does not flood the logs: one `info` line a
/// second per rule (the first of many here; a rule that would deny less
/// often is named too), every would-be denial at `debug`.
#[test]
fn shadow_denials_are_said_at_info_once_a_second() {
    let shadowed = |level| {
        let work = async {
            let rules = Rules::builder()
                .route("^/a", [Rule::new().minute(1)])
                .route("^/b", [Rule::new().minute(1)])
                .build()
                .unwrap();
            let app = App::with(rules, MemoryStore::new(), |l| l.shadow(true));
            for i in 0..20 {
                let path = if i % 10 == 9 { "/b" } else { "/a" };
                assert_eq!(app.get(path, "u").await.status, http::StatusCode::OK);
            }
        };
        capture(level, work).1
    };
    let line = "shadow mode: request would have been denied";
    let info = shadowed(tracing::Level::INFO);
    // (One line a rule, unless the 20 requests took more than a second:
    // the gates keep the real time.)
    let lines = |route: &str| {
        info.lines()
            .filter(|l| l.contains(line) && l.contains(&format!("route=\"{route}\"")))
            .count()
    };
    assert!((1..17).contains(&lines("^/a")), "{info}");
    assert_eq!(lines("^/b"), 1, "{info}");
    assert!(info.contains("suppressed=0"), "{info}");
    let debug = shadowed(tracing::Level::DEBUG);
    assert_eq!(
        debug.matches("outcome=\"shadow_denied\"").count(),
        18,
        "{debug}"
    );
}

/// A store that always fails.
#[derive(Clone)]
struct Down;

impl tower_ratelimit::Store for Down {
    type Future =
        std::future::Ready<Result<tower_ratelimit::Decision, tower_ratelimit::StoreError>>;

    fn check(&self, _check: tower_ratelimit::Check) -> Self::Future {
        std::future::ready(Err(tower_ratelimit::StoreError::new(
            tower_ratelimit::StoreErrorKind::Unavailable,
            "connection refused",
        )))
    }
}

/// A failing store is reported at `warn` at most once a second (of real
/// time: the gate reads the monotonic clock, not the layer's injected
/// one), and never with the user (an API key).
#[test]
fn store_failures_warn_once_a_second_without_the_user() {
    let work = async {
        let started = std::time::Instant::now();
        let app = App::new(one(Rule::new().second(1)), Down);
        for _ in 0..5 {
            assert_eq!(app.get("/a", "secret-api-key").await.status, 200);
        }
        started.elapsed()
    };
    let (text, first) = warned_once(work);
    assert!(first.contains("rate-limit store failed"), "{text}");
    assert!(first.contains("connection refused"), "{text}");
    assert!(first.contains("mode=Open suppressed=0"), "{text}");
    assert!(!text.contains("secret-api-key"), "{text}");
}

/// What `work` (which returns how long it took) logged at `warn`, and its
/// first line, which must be its only one: its failures came within a
/// second of real time, unless the machine stalled (then a second line
/// is allowed).
fn warned_once(work: impl std::future::Future<Output = std::time::Duration>) -> (String, String) {
    let (elapsed, text) = capture(tracing::Level::WARN, work);
    let lines: Vec<&str> = text.lines().collect();
    assert!(!lines.is_empty() && lines.len() <= 2, "{text}");
    if elapsed < std::time::Duration::from_millis(900) {
        assert_eq!(lines.len(), 1, "{text}");
    }
    let first = lines[0].to_owned();
    (text, first)
}

/// An identity that fails with a server error (`500`: here, the
/// `x-fail-status` the test identity answers with) is reported at `warn`
/// at most once a second; one that fails with a client's error (`401`, a
/// missing user) is the client's doing, and is not.
#[test]
fn identity_server_errors_warn_once_a_second() {
    let work = async {
        let started = std::time::Instant::now();
        let app = App::new(one(Rule::new().second(1)), MemoryStore::new());
        for _ in 0..3 {
            let reply = app.send(http::Method::GET, "/a", None, None).await;
            assert_eq!(reply.status, 401);
        }
        for _ in 0..5 {
            let request = http::Request::builder()
                .uri("/a")
                .header("x-fail-status", "500")
                .body(axum::body::Body::empty())
                .unwrap();
            assert_eq!(app.send_request(request).await.status, 500);
        }
        started.elapsed()
    };
    let (text, first) = warned_once(work);
    assert!(
        first.contains("rate-limit identity failed with a server error"),
        "{text}"
    );
    assert!(first.contains("status=500"), "{text}");
}

/// A server that does not record the peer address `ClientIp` needs: the
/// warning tells the operator how to set it up (the client's `500` does
/// not: tests/layer.rs).
#[test]
fn a_missing_peer_address_warns_with_the_setup_to_fix() {
    use tower::ServiceExt;
    let work = async {
        let started = std::time::Instant::now();
        let router = axum::Router::new().fallback(|| async { "ok" }).layer(
            tower_ratelimit::RateLimitLayer::new(one(Rule::new().second(1)), MemoryStore::new()),
        );
        let request = http::Request::builder()
            .uri("/a")
            .body(axum::body::Body::empty())
            .unwrap();
        let response = router.oneshot(request).await.unwrap();
        assert_eq!(response.status(), 500);
        started.elapsed()
    };
    let (text, first) = warned_once(work);
    assert!(first.contains("status=500"), "{text}");
    assert!(
        first.contains("hint=") && first.contains("into_make_service_with_connect_info"),
        "{text}"
    );
}

/// A store that answers later (as Redis does), deciding on a memory store.
#[derive(Clone)]
struct Later(MemoryStore);

impl tower_ratelimit::Store for Later {
    type Future = std::pin::Pin<
        Box<
            dyn std::future::Future<
                    Output = Result<tower_ratelimit::Decision, tower_ratelimit::StoreError>,
                > + Send,
        >,
    >;

    fn check(&self, check: tower_ratelimit::Check) -> Self::Future {
        let store = self.0.clone();
        Box::pin(async move {
            tokio::task::yield_now().await;
            store.check(check).await
        })
    }
}

/// A store of two parts (`failure_domain`): user `d`'s, part 7, times out
/// while `down` is set; the others', part 2, answer.
#[derive(Clone, Default)]
struct Parted {
    memory: MemoryStore,
    down: Arc<std::sync::atomic::AtomicBool>,
}

impl tower_ratelimit::Store for Parted {
    type Future =
        std::future::Ready<Result<tower_ratelimit::Decision, tower_ratelimit::StoreError>>;

    fn check(&self, check: tower_ratelimit::Check) -> Self::Future {
        if check.budget.ends_with(":d") && self.down.load(std::sync::atomic::Ordering::SeqCst) {
            return std::future::ready(Err(tower_ratelimit::StoreError::new(
                tower_ratelimit::StoreErrorKind::Timeout,
                "timed out",
            )));
        }
        self.memory.check(check)
    }

    fn failure_domain(&self, check: &tower_ratelimit::CheckRef<'_>) -> u32 {
        if check.budget.ends_with(":d") {
            7
        } else {
            2
        }
    }

    fn failure_domain_name(&self, domain: u32) -> Option<String> {
        Some(format!("shard {domain}"))
    }
}

impl Parted {
    /// A store with part 7 down, under an app (100 a second) that falls
    /// back.
    fn down_under_fallback() -> (Self, App) {
        let store = Parted::default();
        let app = App::with(one(Rule::new().second(100)), store.clone(), |l| {
            l.fail_mode(tower_ratelimit::FailMode::Fallback)
        });
        store.down.store(true, std::sync::atomic::Ordering::SeqCst);
        (store, app)
    }
}

/// Under `FailMode::Fallback`, a part of the store that goes down is named
/// at `warn` as it goes, and at `info` as its first check is decided by the
/// store again; the other parts' checks say nothing.
#[test]
fn a_part_of_the_store_down_and_back_is_named() {
    let work = async {
        let (store, app) = Parted::down_under_fallback();
        for user in ["d", "u", "d", "u"] {
            assert_eq!(app.get("/a", user).await.status, 200);
        }
        store.down.store(false, std::sync::atomic::Ordering::SeqCst);
        // (The next probe of part 7 goes 500 ms on, on the layer's clock.)
        app.advance(std::time::Duration::from_millis(510));
        assert_eq!(app.get("/a", "d").await.status, 200);
    };
    let ((), text) = capture(tracing::Level::INFO, work);
    let down = only_line(&text, "a part of the rate-limit store is down");
    assert!(down.contains("part=7 store=\"shard 7\""), "{text}");
    let back = only_line(&text, "answers again");
    assert!(back.contains("part=7 store=\"shard 7\""), "{text}");
    assert!(!text.contains("part=2"), "{text}");
}

/// A down part that no check asks for any more is forgotten, and the line
/// that says so names it as the store did when it went down.
#[test]
fn a_forgotten_part_is_named() {
    let work = async {
        let (_store, app) = Parted::down_under_fallback();
        assert_eq!(app.get("/a", "d").await.status, 200);
        // (Part 2's checks alone, on the layer's clock: the parts are
        // looked over by the first at 0.8 s, then 2 s on.)
        for _ in 0..4 {
            app.advance(std::time::Duration::from_millis(800));
            assert_eq!(app.get("/a", "u").await.status, 200);
        }
    };
    let ((), text) = capture(tracing::Level::INFO, work);
    let forgotten = only_line(&text, "no request needed it for 2 s");
    assert!(forgotten.contains("part=7 store=\"shard 7\""), "{text}");
}

/// The decision event carries the route, the outcome, the remaining count
/// and, when an asynchronous store was asked, how long it took.
#[test]
fn decision_events_carry_the_store_latency_of_an_asynchronous_store() {
    let work = async {
        let later = App::new(one(Rule::new().second(1)), Later(MemoryStore::new()));
        assert_eq!(later.get("/a", "u").await.status, 200);
        assert_eq!(later.get("/a", "u").await.status, 429);
    };
    let ((), text) = capture(tracing::Level::DEBUG, work);
    let decisions: Vec<&str> = text
        .lines()
        .filter(|l| l.contains("rate limit decision"))
        .collect();
    assert_eq!(decisions.len(), 2, "{text}");
    for line in &decisions {
        assert!(line.contains("route=\"^/a\""), "{line}");
        assert!(line.contains(" store_us="), "{line}");
    }
    assert!(decisions[0].contains("outcome=\"allowed\""), "{text}");
    assert!(decisions[1].contains("outcome=\"denied\""), "{text}");
    // A store that decides at once has no latency to report.
    let memory = logged(tracing::Level::DEBUG, false);
    assert!(memory.contains("rate limit decision"), "{memory}");
    assert!(!memory.contains("store_us"), "{memory}");
}

/// A server that holds writes and scripts (`CLIENT PAUSE ... WRITE`) while
/// the store is built is said to answer but run no script in time (not to
/// be unreachable); the first connection, made once the pause ends, is
/// logged as made; and a second pause, after its timeouts drop the
/// connection, ends with one line that it was made again, not one per try.
#[test]
fn connections_to_a_server_holding_writes_are_logged_once_made() {
    use std::time::{Duration, Instant};
    use support::redis_server::RedisServer;
    use tower_ratelimit::{Check, Store, Window};
    let server = RedisServer::start();
    let work = async {
        let minute = Window::new(Duration::from_secs(60), 1000).unwrap();
        let check = || Check::new("r1:u", [minute]);
        assert_eq!(server.cli(&["client", "pause", "1000", "write"]), "OK");
        let store = store_at(server.url()).await;
        // (Each wait below is bounded: the pause is, and the store tries
        // again at least every 500 ms.)
        let decided = |limit: Duration| {
            let store = store.clone();
            async move {
                let until = Instant::now() + limit;
                while store.check(check()).await.is_err() {
                    assert!(Instant::now() < until, "never decided again");
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
            }
        };
        decided(Duration::from_secs(5)).await;
        assert_eq!(server.cli(&["client", "pause", "1000", "write"]), "OK");
        let paused = Instant::now();
        while paused.elapsed() < Duration::from_millis(700) {
            let _ = store.check(check()).await;
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        decided(Duration::from_secs(5)).await;
    };
    let ((), text) = capture(tracing::Level::INFO, work);
    only_line(&text, "answers, but runs no script in time yet");
    assert!(!text.contains("not reachable"), "{text}");
    only_line(&text, "rate-limit store connected to redis");
    only_line(&text, "rate-limit store reconnected to redis");
}

/// A reconnect that keeps failing (the server gone; through Sentinel, the
/// sentinels down) says why once, as a warning, not once per try: the
/// layer's own warnings say only that the store is not connected.
#[test]
fn a_reconnect_that_keeps_failing_says_why_once() {
    use std::time::{Duration, Instant};
    use support::redis_server::RedisServer;
    use tower_ratelimit::{Check, Store, Window};
    let mut server = RedisServer::start();
    let work = async {
        let store = store_at(server.url()).await;
        let minute = Window::new(Duration::from_secs(60), 1000).unwrap();
        assert!(store.check(Check::new("r1:u", [minute])).await.is_ok());
        server.kill();
        // (The store tries again every 25–500 ms: several tries in 1.5 s.)
        let started = Instant::now();
        while started.elapsed() < Duration::from_millis(1500) {
            assert!(store.check(Check::new("r1:u", [minute])).await.is_err());
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    };
    let ((), text) = capture(tracing::Level::INFO, work);
    let line = only_line(&text, "redis reconnect failed; retrying in the background");
    assert!(line.contains("WARN"), "{line}");
}

/// A store built on one server (`url(..)`) of a Redis Cluster of a single
/// master, which `build` lets be: once the Cluster gains a second master
/// and hands it a budget's slot, that budget's checks are answered
/// `MOVED`. They fail by the fail mode, and the store says why, once, as
/// an error naming `cluster(..)`.
#[test]
fn a_server_that_answers_moved_is_named_a_cluster_node_once() {
    use std::time::{Duration, Instant};
    use support::redis_server::RedisServer;
    use tower_ratelimit::store::redis::RedisStore;
    use tower_ratelimit::{Check, Store, Window};
    let first = RedisServer::start_cluster_of_one();
    let second = RedisServer::start_with(&["--cluster-enabled", "yes"]);
    let work = async {
        let store = RedisStore::builder()
            .url(first.url())
            .build()
            .await
            .unwrap();
        let minute = Window::new(Duration::from_secs(60), 10).unwrap();
        let check = |user: &str| Check::new(format!("r1:{user}"), [minute]);
        assert!(store.check(check("here")).await.unwrap().allowed());
        // The second master joins and takes the slot of another budget.
        assert_eq!(
            first.cli(&["cluster", "meet", "127.0.0.1", &second.port.to_string()]),
            "OK"
        );
        let second_id = second.cli(&["cluster", "myid"]);
        let deadline = Instant::now() + Duration::from_secs(20);
        while !first.cli(&["cluster", "nodes"]).contains(&second_id)
            || second.cli(&["cluster", "nodes"]).lines().count() < 2
        {
            assert!(Instant::now() < deadline, "the nodes never met");
            std::thread::sleep(Duration::from_millis(20));
        }
        let key = store.keys(&check("moved"))[0].clone();
        let slot = first.cli(&["cluster", "keyslot", &key]);
        for node in [&second, &first] {
            assert_eq!(
                node.cli(&["cluster", "setslot", &slot, "node", &second_id]),
                "OK"
            );
        }
        for _ in 0..3 {
            assert!(store.check(check("moved")).await.is_err());
        }
        // The other budgets are still decided.
        assert!(store.check(check("here")).await.unwrap().allowed());
    };
    let ((), text) = capture(tracing::Level::ERROR, work);
    let told = only_line(&text, "answers MOVED");
    assert!(told.contains("`cluster(..)`"), "{text}");
}

/// The one line of `text` that holds `needle` (there must be exactly one).
/// A Redis store at `url`, with a 50 ms deadline.
async fn store_at(url: String) -> tower_ratelimit::store::redis::RedisStore {
    tower_ratelimit::store::redis::RedisStore::builder()
        .url(url)
        .timeout(std::time::Duration::from_millis(50))
        .build()
        .await
        .unwrap()
}

fn only_line<'a>(text: &'a str, needle: &str) -> &'a str {
    let lines: Vec<&str> = text.lines().filter(|l| l.contains(needle)).collect();
    assert_eq!(lines.len(), 1, "{needle}: {text}");
    lines[0]
}
