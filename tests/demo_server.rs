//! The demo server (`examples/server.rs`) as a user runs it: its flags
//! parsed as clap parses them, its config file, a real Redis, a real
//! Cluster, and real HTTP/1.1 over TCP.
#![cfg(feature = "redis")]

#[path = "../examples/server.rs"]
#[allow(dead_code, unreachable_pub)]
mod example;

mod support;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use clap::Parser;
use support::redis_server::{RedisCluster, RedisSentinels, RedisServer};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// One HTTP response, read whole.
#[derive(Debug)]
struct Answer {
    status: u16,
    headers: Vec<(String, String)>,
    body: String,
}

impl Answer {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    fn has_limit_headers(&self) -> bool {
        self.header("x-ratelimit-limit").is_some()
    }
}

/// Sends one request on a connection of its own and reads the answer.
async fn send(addr: SocketAddr, method: &str, path: &str, headers: &[(&str, &str)]) -> Answer {
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    let mut request =
        format!("{method} {path} HTTP/1.1\r\nhost: localhost\r\nconnection: close\r\n");
    for (name, value) in headers {
        request.push_str(&format!("{name}: {value}\r\n"));
    }
    request.push_str("content-length: 0\r\n\r\n");
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut bytes = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), stream.read_to_end(&mut bytes))
        .await
        .expect("an answer within 10 s")
        .unwrap();
    let mut parsed = [httparse::EMPTY_HEADER; 32];
    let mut response = httparse::Response::new(&mut parsed);
    let httparse::Status::Complete(head) = response.parse(&bytes).unwrap() else {
        panic!("incomplete response: {:?}", String::from_utf8_lossy(&bytes));
    };
    Answer {
        status: response.code.unwrap(),
        headers: response
            .headers
            .iter()
            .map(|h| {
                (
                    h.name.to_owned(),
                    String::from_utf8_lossy(h.value).into_owned(),
                )
            })
            .collect(),
        body: String::from_utf8_lossy(&bytes[head..]).into_owned(),
    }
}

async fn get(addr: SocketAddr, path: &str, headers: &[(&str, &str)]) -> Answer {
    send(addr, "GET", path, headers).await
}

/// The demo server started with `flags` (after the program name), on a
/// free port; it runs until the test's runtime ends.
async fn demo(flags: &[&str]) -> SocketAddr {
    let mut argv = vec!["server", "--listen", "127.0.0.1:0"];
    argv.extend_from_slice(flags);
    let args = example::Args::try_parse_from(argv).unwrap();
    let (addr, server) = example::start(args).await.unwrap();
    tokio::spawn(server);
    addr
}

/// The error the demo server stops with, given `flags`.
async fn start_error(flags: &[&str]) -> String {
    let mut argv = vec!["server", "--listen", "127.0.0.1:0"];
    argv.extend_from_slice(flags);
    let args = example::Args::try_parse_from(argv).unwrap();
    match example::start(args).await {
        Ok(_) => panic!("{flags:?} started"),
        Err(error) => error.to_string(),
    }
}

/// A rule table written to a file of its own, removed when dropped
/// (whether the test passes or not).
struct ConfigFile(String);

impl ConfigFile {
    fn path(&self) -> &str {
        &self.0
    }
}

impl Drop for ConfigFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

fn config_file(text: &str) -> ConfigFile {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    let path = std::env::temp_dir().join(format!(
        "tower-ratelimit-demo-{}-{}.toml",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    ));
    std::fs::write(&path, text).unwrap();
    ConfigFile(path.to_string_lossy().into_owned())
}

/// Per-minute limits, so that no test depends on how fast it runs.
const MINUTE_TABLE: &str = r#"
[groups]
"admin-key" = "admin"

[[routes]]
path = "^/a"
rules = [{ minute = 2 }, { group = "admin" }]
"#;

#[tokio::test]
async fn the_built_in_table_limits_a_client_and_not_an_admin() {
    let addr = demo(&[]).await;
    // /towns: 1 a second per client (here, by its IP).
    let started = Instant::now();
    let first = get(addr, "/towns", &[]).await;
    let second = get(addr, "/towns", &[]).await;
    assert_eq!(first.status, 200, "{first:?}");
    assert_eq!(first.body, "ok /towns\n");
    // As the README's first screen shows it (which leaves out `date` and
    // `content-length`).
    assert_eq!(
        first.header("content-type"),
        Some("text/plain; charset=utf-8")
    );
    assert_eq!(first.header("x-ratelimit-limit"), Some("1"));
    assert_eq!(first.header("x-ratelimit-remaining"), Some("0"));
    // (The window is a second long: the second request is denied when it
    // came within it, as it does unless the machine stalled.)
    if support::came_within_a_second(started) {
        assert_eq!(second.status, 429, "{second:?}");
        let retry: u64 = second.header("retry-after").unwrap().parse().unwrap();
        assert_eq!(retry, 1);
        // As the README's first screen shows it.
        assert_eq!(
            second.header("content-type"),
            Some("application/problem+json")
        );
        assert!(
            second
                .body
                .contains(r#""title":"Too Many Requests","status":429"#),
            "{}",
            second.body
        );
    }
    // The admin key's group has no limits: no headers, never denied.
    for _ in 0..5 {
        let admin = get(addr, "/towns", &[("x-api-key", "admin-key")]).await;
        assert_eq!(admin.status, 200);
        assert!(!admin.has_limit_headers(), "{admin:?}");
    }
    // The admin key beside another: refused, not taken as the first.
    let both = [("x-api-key", "admin-key"), ("x-api-key", "other")];
    let both = get(addr, "/towns", &both).await;
    assert_eq!(both.status, 400, "{both:?}");
    assert!(
        both.body.contains("more than one `x-api-key` header"),
        "{both:?}"
    );
    // A path no route names is not touched.
    let other = get(addr, "/elsewhere", &[]).await;
    assert_eq!(other.status, 200);
    assert!(!other.has_limit_headers());
    // CORS preflights are excluded: never limited, and they spend nothing
    // (a fresh client's one request a second still passes after three).
    let client = [("x-api-key", "preflighting")];
    for _ in 0..3 {
        let preflight = send(addr, "OPTIONS", "/towns", &client).await;
        assert_eq!(preflight.status, 200, "{preflight:?}");
        assert!(!preflight.has_limit_headers(), "{preflight:?}");
    }
    let first = get(addr, "/towns", &client).await;
    assert_eq!(first.status, 200, "{first:?}");
    assert_eq!(first.header("x-ratelimit-remaining"), Some("0"));
}

#[tokio::test]
async fn a_key_is_its_own_user_and_an_empty_key_is_none() {
    let file = config_file(MINUTE_TABLE);
    let addr = demo(&["--config", file.path()]).await;
    let remaining = |a: &Answer| a.header("x-ratelimit-remaining").map(str::to_owned);
    // The client's address: 2 a minute.
    let by_ip = get(addr, "/a", &[]).await;
    assert_eq!(remaining(&by_ip).as_deref(), Some("1"), "{by_ip:?}");
    // An empty key is the same client, not a budget every client shares.
    let empty = get(addr, "/a", &[("x-api-key", "")]).await;
    assert_eq!(remaining(&empty).as_deref(), Some("0"), "{empty:?}");
    // A key, even one that reads as the client's address, is a user of its
    // own.
    for key in ["k", "127.0.0.1"] {
        let keyed = get(addr, "/a", &[("x-api-key", key)]).await;
        assert_eq!(remaining(&keyed).as_deref(), Some("1"), "{key}: {keyed:?}");
    }
    assert_eq!(get(addr, "/a", &[]).await.status, 429);
}

#[tokio::test]
async fn the_example_config_file_is_what_the_server_runs() {
    let addr = demo(&["--config", "examples/ratelimit.toml"]).await;
    // [exclude]: /health is never limited, nor an OPTIONS request.
    for _ in 0..3 {
        let health = get(addr, "/health", &[]).await;
        assert_eq!(health.status, 200);
        assert!(!health.has_limit_headers());
        let options = send(addr, "OPTIONS", "/towns", &[("x-api-key", "k")]).await;
        assert_eq!(options.status, 200);
        assert!(!options.has_limit_headers());
    }
    // /login: 3 POSTs a minute, then 5 minutes out; a GET is not limited.
    let key = [("x-api-key", "mallory")];
    for left in ["2", "1", "0"] {
        let login = send(addr, "POST", "/login", &key).await;
        assert_eq!(login.status, 200, "{login:?}");
        assert_eq!(login.header("x-ratelimit-remaining"), Some(left));
        // headers = "both": the IETF draft's fields too.
        assert!(login.header("ratelimit-policy").is_some(), "{login:?}");
    }
    let blocked = send(addr, "POST", "/login", &key).await;
    assert_eq!(blocked.status, 429);
    let retry: u64 = blocked.header("retry-after").unwrap().parse().unwrap();
    assert!((290..=300).contains(&retry), "{retry}");
    assert_eq!(get(addr, "/login", &key).await.status, 200);
    // Another user is not blocked.
    let other = send(addr, "POST", "/login", &[("x-api-key", "alice")]).await;
    assert_eq!(other.status, 200);
    // [groups]: the admin key is unlimited on /towns, a partner has 10.
    for _ in 0..12 {
        let admin = get(addr, "/towns", &[("x-api-key", "admin-key")]).await;
        assert_eq!(admin.status, 200);
    }
    let partner = get(addr, "/towns", &[("x-api-key", "partner-key")]).await;
    assert_eq!(partner.header("x-ratelimit-limit"), Some("10"));
    // A shadow route reports and never denies.
    for _ in 0..3 {
        assert_eq!(get(addr, "/beta", &key).await.status, 200);
    }
}

/// Two replicas of the demo server on one Redis: one budget between them.
#[tokio::test]
async fn two_replicas_on_one_redis_share_each_budget() {
    let redis = RedisServer::start();
    let file = config_file(MINUTE_TABLE);
    let url = redis.url();
    let flags = ["--config", file.path(), "--redis", url.as_str()];
    two_replicas_spend_one_budget(&flags).await;
    let key = [("x-api-key", "carol")];
    // The budget is in Redis: a third replica started now sees it spent.
    let late = demo(&[&flags[..], &SLOW_MACHINE].concat()).await;
    assert_eq!(get(late, "/a", &key).await.status, 429);
    assert_eq!(get(late, "/a", &[("x-api-key", "dave")]).await.status, 200);
}

/// Two replicas started with `flags` (a Redis store and `MINUTE_TABLE`,
/// 2 a minute on `/a`): one request each, then both deny the same key.
/// A deadline no busy machine's check outlasts, for the tests that count
/// budgets on Redis (at the default 50 ms, a debug build's check on a
/// loaded machine may fail open, and pass where it should be denied).
const SLOW_MACHINE: [&str; 2] = ["--timeout-ms", "5000"];

async fn two_replicas_spend_one_budget(flags: &[&str]) {
    let flags = [flags, &SLOW_MACHINE].concat();
    let replicas = [demo(&flags).await, demo(&flags).await];
    let key = [("x-api-key", "carol")];
    assert_eq!(get(replicas[0], "/a", &key).await.status, 200);
    assert_eq!(get(replicas[1], "/a", &key).await.status, 200);
    for replica in replicas {
        let denied = get(replica, "/a", &key).await;
        assert_eq!(denied.status, 429, "{denied:?}");
        assert_eq!(denied.header("x-ratelimit-remaining"), Some("0"));
    }
}

/// Two replicas on a Redis reached over TLS (`rediss://`), its certificate
/// signed by a private CA given with `--redis-ca`, and the client's with
/// `--redis-cert` and `--redis-key`.
#[tokio::test]
async fn two_replicas_on_a_redis_over_tls_share_each_budget() {
    use support::redis_server::TlsFiles;
    let files = TlsFiles::make();
    let (_redis, port) = RedisServer::start_tls(&files, true);
    let file = config_file(MINUTE_TABLE);
    let url = format!("rediss://127.0.0.1:{port}");
    let (ca, cert, key) = (
        files.path("ca.crt"),
        files.path("client.crt"),
        files.path("client.key"),
    );
    let flags = [
        "--config",
        file.path(),
        "--redis",
        &url,
        "--redis-ca",
        &ca,
        "--redis-cert",
        &cert,
        "--redis-key",
        &key,
    ];
    two_replicas_spend_one_budget(&flags).await;
    // Without the client certificate the server asks for: refused at start.
    let error = start_error(&["--redis", &url, "--redis-ca", &ca]).await;
    assert!(error.starts_with(&format!("--redis {url}: ")), "{error}");
}

/// Two replicas on a Redis master reached over TLS through a sentinel
/// reached over TLS, both verified against the private CA of `--redis-ca`;
/// without it, refused at start (the system's roots do not know the CA).
#[tokio::test]
async fn two_replicas_through_a_sentinel_over_tls_share_each_budget() {
    use support::redis_server::{RedisSentinels, TlsFiles};
    let files = TlsFiles::make();
    let (_master, _sentinel, port) = RedisSentinels::start_tls(&files);
    let file = config_file(MINUTE_TABLE);
    let url = format!("rediss://127.0.0.1:{port}");
    let ca = files.path("ca.crt");
    let flags = [
        "--config",
        file.path(),
        "--redis-sentinel",
        &url,
        "--redis-ca",
        &ca,
    ];
    two_replicas_spend_one_budget(&flags).await;
    let error = start_error(&["--redis-sentinel", &url]).await;
    assert!(
        error.starts_with(&format!("--redis-sentinel {url}: ")),
        "{error}"
    );
    assert!(error.contains("UnknownIssuer"), "{error}");
}

/// The same on a three-master Cluster, through `--redis-cluster`.
#[tokio::test]
async fn two_replicas_on_a_cluster_share_each_budget() {
    let cluster = RedisCluster::start();
    let file = config_file(MINUTE_TABLE);
    let urls = cluster.urls().join(",");
    let flags = ["--config", file.path(), "--redis-cluster", urls.as_str()];
    let flags = [&flags[..], &SLOW_MACHINE].concat();
    let replicas = [demo(&flags).await, demo(&flags).await];
    for user in ["erin", "frank", "grace", "heidi"] {
        let key = [("x-api-key", user)];
        assert_eq!(get(replicas[0], "/a", &key).await.status, 200, "{user}");
        assert_eq!(get(replicas[1], "/a", &key).await.status, 200, "{user}");
        assert_eq!(get(replicas[0], "/a", &key).await.status, 429, "{user}");
        assert_eq!(get(replicas[1], "/a", &key).await.status, 429, "{user}");
    }
    // The users' budgets are spread over the masters.
    let used = cluster
        .nodes
        .iter()
        .filter(|n| n.succeeded("evalsha") > 0)
        .count();
    assert!(used >= 2, "{used} of 3 masters ran a check");
}

/// The same on the master Redis Sentinel watches, through
/// `--redis-sentinel` (and `--sentinel-master`, its default name here).
#[tokio::test]
async fn two_replicas_through_sentinel_share_each_budget() {
    let set = RedisSentinels::start();
    let file = config_file(MINUTE_TABLE);
    let url = set.sentinel_url();
    let flags = [
        "--config",
        file.path(),
        "--redis-sentinel",
        url.as_str(),
        "--sentinel-master",
        "mymaster",
    ];
    let replicas = [
        demo(&[&flags[..], &SLOW_MACHINE].concat()).await,
        demo(&[&flags[..4], &SLOW_MACHINE].concat()).await,
    ];
    let key = [("x-api-key", "ivan")];
    assert_eq!(get(replicas[0], "/a", &key).await.status, 200);
    assert_eq!(get(replicas[1], "/a", &key).await.status, 200);
    assert_eq!(get(replicas[0], "/a", &key).await.status, 429);
    assert_eq!(get(replicas[1], "/a", &key).await.status, 429);
    assert!(set.master.calls("evalsha") >= 2, "checked on the master");
    assert_eq!(set.replica.calls("evalsha"), 0);

    // The master's database (and credentials) through `--sentinel-master-url`.
    let flags = [
        "--config",
        file.path(),
        "--redis-sentinel",
        url.as_str(),
        "--sentinel-master-url",
        "redis://master/3",
    ];
    let third = demo(&[&flags[..], &SLOW_MACHINE].concat()).await;
    let key = [("x-api-key", "judy")];
    assert_eq!(get(third, "/a", &key).await.status, 200);
    let keys = set
        .master
        .cli(&["-n", "3", "--scan", "--pattern", "*judy*"]);
    assert!(!keys.is_empty(), "judy's budget in database 3");

    // A password the master refuses is laid at `--sentinel-master-url`'s
    // door too, without the password.
    let error = start_error(&[
        "--redis-sentinel",
        url.as_str(),
        "--sentinel-master-url",
        "redis://judy:hunter2@master/0",
    ])
    .await;
    assert!(
        error.contains("with --sentinel-master-url redis://judy:"),
        "{error}"
    );
    assert!(error.contains("Password authentication failed"), "{error}");
    assert!(!error.contains("hunter2"), "{error}");
}

/// A Redis that never answers: each fail mode, well within a second.
#[tokio::test]
async fn the_fail_modes_against_a_redis_that_is_down() {
    // A socket that takes connections into its backlog and never answers
    // (kept bound, so no other test's server can take its port).
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("redis://{}", silent.local_addr().unwrap());
    let file = config_file(MINUTE_TABLE);
    let flags = |mode: &'static str| {
        [
            "--config".to_owned(),
            file.path().to_owned(),
            "--redis".to_owned(),
            url.clone(),
            "--fail-mode".to_owned(),
            mode.to_owned(),
            "--timeout-ms".to_owned(),
            "50".to_owned(),
        ]
    };
    let key = [("x-api-key", "ivan")];

    let closed = flags("closed");
    let closed = demo(&closed.iter().map(String::as_str).collect::<Vec<_>>()).await;
    let started = Instant::now();
    let refused = get(closed, "/a", &key).await;
    assert_eq!(refused.status, 503, "{refused:?}");
    assert_eq!(refused.header("retry-after"), Some("1"));
    let waited = started.elapsed();
    assert!(waited < Duration::from_secs(1), "{waited:?}");

    let open = flags("open");
    let open = demo(&open.iter().map(String::as_str).collect::<Vec<_>>()).await;
    for _ in 0..3 {
        let through = get(open, "/a", &key).await;
        assert_eq!(through.status, 200);
        assert!(!through.has_limit_headers(), "{through:?}");
    }

    // In memory until Redis answers: the minute's 2, then denied.
    let fallback = flags("fallback");
    let fallback = demo(&fallback.iter().map(String::as_str).collect::<Vec<_>>()).await;
    let statuses = [
        get(fallback, "/a", &key).await.status,
        get(fallback, "/a", &key).await.status,
        get(fallback, "/a", &key).await.status,
    ];
    assert_eq!(statuses, [200, 200, 429]);
}

/// Behind a trusted proxy, each X-Forwarded-For client has its own budget;
/// from anyone else the header is ignored.
#[tokio::test]
async fn a_trusted_proxy_names_the_client() {
    let file = config_file(MINUTE_TABLE);
    let trusting = demo(&["--config", file.path(), "--trusted-proxy", "127.0.0.1"]).await;
    for client in ["203.0.113.7", "203.0.113.8"] {
        let xff = [("x-forwarded-for", client)];
        assert_eq!(get(trusting, "/a", &xff).await.status, 200);
        assert_eq!(get(trusting, "/a", &xff).await.status, 200);
        assert_eq!(get(trusting, "/a", &xff).await.status, 429, "{client}");
    }
    // An API key that reads as a client's address is not that client (nor
    // a token of `Forwarded`).
    let client = [("x-forwarded-for", "203.0.113.9")];
    assert_eq!(get(trusting, "/a", &client).await.status, 200);
    assert_eq!(get(trusting, "/a", &client).await.status, 200);
    let posing = [("x-api-key", "203.0.113.9")];
    assert_eq!(get(trusting, "/a", &posing).await.status, 200);
    assert_eq!(get(trusting, "/a", &posing).await.status, 200);
    assert_eq!(get(trusting, "/a", &posing).await.status, 429);
    // Not trusted: the header is the client's own claim, and every request
    // here comes from one peer.
    let plain = demo(&["--config", file.path()]).await;
    let statuses = [
        get(plain, "/a", &[("x-forwarded-for", "198.51.100.1")])
            .await
            .status,
        get(plain, "/a", &[("x-forwarded-for", "198.51.100.2")])
            .await
            .status,
        get(plain, "/a", &[("x-forwarded-for", "198.51.100.3")])
            .await
            .status,
    ];
    assert_eq!(statuses, [200, 200, 429]);
}

/// Stopped (SIGTERM, in `main`), the server takes no new connection,
/// answers the request in flight, and ends.
#[tokio::test]
async fn a_stopped_server_answers_the_requests_in_flight() {
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let args = example::Args::try_parse_from(["server", "--listen", "127.0.0.1:0"]).unwrap();
    let (addr, server) = example::start_until(args, async {
        let _ = stopped.await;
    })
    .await
    .unwrap();
    let server = tokio::spawn(server);
    // An upload half sent when the stop comes.
    let mut upload = tokio::net::TcpStream::connect(addr).await.unwrap();
    upload
        .write_all(b"POST /upload HTTP/1.1\r\nhost: x\r\ncontent-length: 6\r\nconnection: close\r\n\r\nabc")
        .await
        .unwrap();
    // (Answered: the connection is being served before the stop.)
    let before = get(addr, "/elsewhere", &[]).await;
    assert_eq!(before.status, 200);
    stop.send(()).unwrap();
    // New connections are refused once the listener is closed.
    let deadline = Instant::now() + Duration::from_secs(10);
    while tokio::net::TcpStream::connect(addr).await.is_ok() {
        assert!(Instant::now() < deadline, "still listening");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(!server.is_finished());
    upload.write_all(b"def").await.unwrap();
    let mut answer = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), upload.read_to_end(&mut answer))
        .await
        .expect("an answer within 10 s")
        .unwrap();
    let answer = String::from_utf8_lossy(&answer);
    assert!(answer.starts_with("HTTP/1.1 200 OK"), "{answer}");
    assert!(answer.ends_with("ok /upload\n"), "{answer}");
    let ended = tokio::time::timeout(Duration::from_secs(10), server).await;
    assert!(matches!(ended, Ok(Ok(Ok(())))), "{ended:?}");
}

#[tokio::test]
async fn bad_flags_and_files_stop_it_with_a_clear_error() {
    let error = start_error(&["--trusted-proxy", "10.0.0.0/99"]).await;
    assert!(error.contains("--trusted-proxy 10.0.0.0/99"), "{error}");

    let error = start_error(&["--config", "/nonexistent/rules.toml"]).await;
    assert!(
        error.contains("cannot read /nonexistent/rules.toml"),
        "{error}"
    );

    // No regular file, or one too large: refused before it is read (a
    // device would never end, a FIFO would hang the start).
    let error = start_error(&["--config", "/dev/zero"]).await;
    assert!(
        error.contains("cannot read /dev/zero: not a regular file"),
        "{error}"
    );
    let error = start_error(&["--config", "tests"]).await;
    assert!(error.contains("a directory, not a file"), "{error}");
    let huge = config_file("");
    let file = std::fs::File::create(huge.path()).unwrap();
    file.set_len(example::MAX_CONFIG_BYTES + 1).unwrap();
    let error = start_error(&["--config", huge.path()]).await;
    assert!(
        error.contains("larger than a rule table may be (16777216 bytes, 16 MiB)"),
        "{error}"
    );

    // A file that does not load: named, as a reload's error names it.
    let bad = config_file("[[routes]]\npath = \"^/(a\"\nrules = [{ minute = 2 }]\n");
    let error = start_error(&["--config", bad.path()]).await;
    assert!(error.contains("^/(a"), "{error}");
    assert!(error.starts_with(&format!("{}: ", bad.path())), "{error}");

    // Not UTF-8: where, by line and byte.
    let latin1 = config_file("");
    std::fs::write(latin1.path(), b"[[routes]]\npath = \"^/caf\xe9\"\n").unwrap();
    let error = start_error(&["--config", latin1.path()]).await;
    assert!(
        error.contains("not UTF-8 text at line 2, column 14 (byte 25)"),
        "{error}"
    );

    // A `[groups]` key with blanks around it, which HTTP drops from a
    // header's value, so that it would never match.
    let blanks = config_file("[groups]\n\" k \" = \"admin\"\n");
    let error = start_error(&["--config", blanks.path()]).await;
    assert!(error.contains("blanks"), "{error}");
    assert!(error.contains("groups.\" k \""), "{error}");

    // A limit beyond 64 bits is reported as written.
    let huge =
        config_file("[[routes]]\npath = \"^/a\"\nrules = [{ minute = 18446744073709551615 }]\n");
    let error = start_error(&["--config", huge.path()]).await;
    assert!(error.contains("got 18446744073709551615"), "{error}");

    let unknown = config_file("[[routes]]\npath = \"^/a\"\nrules = [{ minutes = 2 }]\n");
    let error = start_error(&["--config", unknown.path()]).await;
    assert!(error.contains("minutes"), "{error}");
    assert!(
        error.starts_with(&format!("{}: ", unknown.path())),
        "{error}"
    );

    // A URL the store does not take: the flag, the URL and the forms it
    // takes.
    let error = start_error(&["--redis", "http://127.0.0.1:1"]).await;
    assert!(error.starts_with("--redis http://127.0.0.1:1: "), "{error}");
    assert!(error.contains("expected redis://HOST"), "{error}");
    assert!(error.contains("unix:///PATH"), "{error}");
    // TLS certificates for a server reached without TLS.
    let ca = config_file("not parsed: the URL is refused first");
    let error = start_error(&["--redis", "redis://127.0.0.1:1", "--redis-ca", ca.path()]).await;
    assert!(
        error.starts_with("--redis redis://127.0.0.1:1: "),
        "{error}"
    );
    assert!(error.contains("not rediss://"), "{error}");
    let error = start_error(&["--redis-cluster", "redis://127.0.0.1:1,http://127.0.0.1:2"]).await;
    assert!(
        error.starts_with("--redis-cluster redis://127.0.0.1:1,http://127.0.0.1:2: "),
        "{error}"
    );
    assert!(
        error.contains("expected comma-separated redis://HOST:PORT"),
        "{error}"
    );
    let error = start_error(&["--redis-cluster", "unix:///tmp/redis.sock"]).await;
    assert!(error.contains("not a Unix socket"), "{error}");
    let error = start_error(&["--redis-sentinel", "http://127.0.0.1:1"]).await;
    assert!(
        error.starts_with("--redis-sentinel http://127.0.0.1:1: "),
        "{error}"
    );
    assert!(
        error.contains("expected comma-separated redis://HOST"),
        "{error}"
    );
    // The master's URL is its own flag's, and takes a plain Redis URL.
    let error = start_error(&[
        "--redis-sentinel",
        "redis://127.0.0.1:1",
        "--sentinel-master-url",
        "foo://x",
    ])
    .await;
    assert!(
        error.starts_with("--sentinel-master-url foo://x: "),
        "{error}"
    );
    assert!(error.contains("expected redis://HOST"), "{error}");
    // Sentinels some over TLS and some not.
    let error = start_error(&[
        "--redis-sentinel",
        "redis://127.0.0.1:1,rediss://127.0.0.1:2",
    ])
    .await;
    assert!(error.contains("some rediss://"), "{error}");
    // A URL that reads fine but a server that refuses its password: the
    // error says so, without the password and without blaming the URL's form.
    let guarded = RedisServer::start();
    assert_eq!(
        guarded.cli(&["config", "set", "requirepass", "right"]),
        "OK"
    );
    let url = format!("redis://:s3cret@127.0.0.1:{}", guarded.port);
    let error = start_error(&["--redis", &url]).await;
    assert!(
        error.starts_with("--redis redis://:***@127.0.0.1:"),
        "{error}"
    );
    assert!(!error.contains("s3cret"), "{error}");
    assert!(!error.contains("expected redis://"), "{error}");
    assert!(error.to_lowercase().contains("password"), "{error}");

    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let taken = taken.local_addr().unwrap().to_string();
    let args = example::Args::try_parse_from(["server", "--listen", taken.as_str()]).unwrap();
    let error = example::start(args).await.err().unwrap().to_string();
    assert!(
        error.contains(&format!("cannot listen on {taken}")),
        "{error}"
    );

    // Flags clap refuses before the server starts.
    assert!(example::Args::try_parse_from(["server", "--timeout-ms", "0"]).is_err());
    // The TLS files are for a Redis store (--redis, --redis-cluster or
    // --redis-sentinel), a client certificate with its key.
    for flags in [
        &["--redis-ca", "ca.crt"][..],
        &["--redis-cert", "c.crt", "--redis-key", "c.key"],
        &["--redis", "rediss://127.0.0.1:1", "--redis-cert", "c.crt"],
    ] {
        let parsed = example::Args::try_parse_from(["server"].iter().chain(flags));
        assert!(parsed.is_err(), "{flags:?} parsed");
    }
    let sentinel = ["--redis-sentinel", "rediss://127.0.0.1:1"];
    let parsed = example::Args::try_parse_from(
        ["server"]
            .iter()
            .chain(&sentinel)
            .chain(&["--redis-ca", "ca.crt"]),
    );
    assert!(parsed.is_ok(), "{:?}", parsed.err());
    // --timeout-ms is bounded: 1 to 60000.
    let redis = ["server", "--redis", "redis://127.0.0.1:1"];
    for (ms, ok) in [
        ("1", true),
        ("60000", true),
        ("0", false),
        ("60001", false),
        ("18446744073709551615", false),
    ] {
        let parsed = example::Args::try_parse_from(redis.iter().chain(&["--timeout-ms", ms]));
        match parsed {
            Ok(_) => assert!(ok, "--timeout-ms {ms} parsed"),
            Err(error) => {
                assert!(!ok, "--timeout-ms {ms}: {error}");
                assert!(error.to_string().contains("1..=60000"), "{error}");
            }
        }
    }
    // --fail-mode and --timeout-ms are for a Redis store: without one,
    // they would do nothing.
    for flags in [["--fail-mode", "fallback"], ["--timeout-ms", "50"]] {
        let error = example::Args::try_parse_from(["server"].iter().chain(&flags))
            .err()
            .unwrap_or_else(|| panic!("{flags:?} parsed without a Redis flag"));
        let error = error.to_string();
        assert!(error.contains("--redis <URL>"), "{flags:?}: {error}");
        for redis in [
            ["--redis", "redis://127.0.0.1:1"],
            ["--redis-cluster", "redis://127.0.0.1:1"],
            ["--redis-sentinel", "redis://127.0.0.1:1"],
        ] {
            let argv = ["server"].iter().chain(&redis).chain(&flags);
            assert!(example::Args::try_parse_from(argv).is_ok(), "{flags:?}");
        }
    }
    assert!(example::Args::try_parse_from(["server", "--fail-mode", "sideways"]).is_err());
    assert!(example::Args::try_parse_from(["server", "--rfc7239"]).is_err());
    // (It looks at --config: without one it would do nothing.)
    assert!(example::Args::try_parse_from(["server", "--reload-check-ms", "20"]).is_err());
    assert!(example::Args::try_parse_from(["server", "--sentinel-master", "m"]).is_err());
    for bad in [
        "401", "401=0", "401=x", "6xx=1", "45x=1", "40=1", "4010=1", "xx=1", "=1",
    ] {
        let parsed = example::Args::try_parse_from(["server", "--penalty", bad]);
        let error = parsed
            .err()
            .unwrap_or_else(|| panic!("--penalty {bad} parsed"));
        assert!(error.to_string().contains("STATUS=N"), "{bad}: {error}");
    }
    assert!(example::Args::try_parse_from([
        "server",
        "--redis",
        "redis://127.0.0.1:1",
        "--redis-sentinel",
        "redis://127.0.0.1:2"
    ])
    .is_err());
    assert!(example::Args::try_parse_from([
        "server",
        "--redis",
        "redis://127.0.0.1:1",
        "--redis-cluster",
        "redis://127.0.0.1:2"
    ])
    .is_err());
}

/// `--penalty` and `--refund` by the response's status (`x-demo-status`
/// makes one), on the memory store and on Redis.
#[tokio::test]
async fn penalties_and_refunds_follow_the_response_status() {
    let redis = RedisServer::start();
    let url = redis.url();
    let table = config_file("[[routes]]\npath = \"^/a\"\nrules = [{ minute = 5 }]\n");
    let on_redis = [&["--redis", url.as_str()][..], &SLOW_MACHINE].concat();
    for store in [vec![], on_redis] {
        let mut flags = vec!["--config", table.path(), "--penalty", "401=3"];
        flags.extend(["--refund", "5xx=1", "--penalty", "4xx=1"]);
        flags.extend(&store);
        let addr = demo(&flags).await;
        // /a allows 5 a minute. A 401 spends 1 + 3: one more request fits.
        let key = [("x-api-key", "k1")];
        let failed = get(addr, "/a", &[key[0], ("x-demo-status", "401")]).await;
        assert_eq!(failed.status, 401, "{store:?}");
        assert_eq!(failed.body, "401 /a\n");
        assert_eq!(failed.header("x-ratelimit-remaining"), Some("4"));
        assert_eq!(get(addr, "/a", &key).await.status, 200, "{store:?}");
        assert_eq!(get(addr, "/a", &key).await.status, 429, "{store:?}");
        // Server errors cost nothing; another 4xx costs 1 more.
        let key = [("x-api-key", "k2")];
        for _ in 0..8 {
            let error = get(addr, "/a", &[key[0], ("x-demo-status", "503")]).await;
            assert_eq!(error.status, 503, "{store:?}");
        }
        let missing = get(addr, "/a", &[key[0], ("x-demo-status", "404")]).await;
        assert_eq!(missing.status, 404, "{store:?}");
        for _ in 0..3 {
            assert_eq!(get(addr, "/a", &key).await.status, 200, "{store:?}");
        }
        assert_eq!(get(addr, "/a", &key).await.status, 429, "{store:?}");
    }
}

/// `x-demo-status` asks for a final status with a body: 200 to 599 but
/// 204, 205 and 304; anything else is a 400 saying so.
/// An allowed upload is read to its end: its client can send it whole,
/// gets the answer, and the connection carries the next request.
#[tokio::test]
async fn an_allowed_upload_is_read_and_the_connection_goes_on() {
    let addr = demo(&[]).await;
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    let size = 4 << 20;
    let head =
        format!("POST /elsewhere HTTP/1.1\r\nhost: localhost\r\ncontent-length: {size}\r\n\r\n");
    stream.write_all(head.as_bytes()).await.unwrap();
    let chunk = vec![b'x'; 64 << 10];
    for _ in 0..size / chunk.len() {
        tokio::time::timeout(Duration::from_secs(10), stream.write_all(&chunk))
            .await
            .expect("the body is read within 10 s")
            .expect("the server reads the whole body");
    }
    stream
        .write_all(b"GET /after HTTP/1.1\r\nhost: localhost\r\nconnection: close\r\n\r\n")
        .await
        .unwrap();
    let mut bytes = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), stream.read_to_end(&mut bytes))
        .await
        .expect("answers within 10 s")
        .unwrap();
    let text = String::from_utf8_lossy(&bytes);
    assert_eq!(text.matches("HTTP/1.1 200 OK").count(), 2, "{text}");
    assert!(text.contains("ok /elsewhere\n"), "{text}");
    assert!(text.ends_with("ok /after\n"), "{text}");
}

#[tokio::test]
async fn the_demo_status_header_takes_only_statuses_with_a_body() {
    let addr = demo(&[]).await;
    for code in ["200", "201", "401", "404", "503", "599"] {
        let answer = get(addr, "/elsewhere", &[("x-demo-status", code)]).await;
        assert_eq!(answer.status.to_string(), code, "{answer:?}");
    }
    for bad in [
        "100", "101", "199", "204", "205", "304", "600", "999", "0", "2000", "ok", "", "+401",
        "0401", "4 01",
    ] {
        let answer = get(addr, "/elsewhere", &[("x-demo-status", bad)]).await;
        assert_eq!(answer.status, 400, "{bad}: {answer:?}");
        assert_eq!(
            answer.body,
            "x-demo-status must be a status from 200 to 599, but not 204, 205 or 304\n",
            "{bad}"
        );
    }
}

/// The log of one test's thread, which [`capture_logs`] fills.
#[derive(Clone, Default)]
struct LogBuffer(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);

impl LogBuffer {
    fn text(&self) -> String {
        let bytes = self.0.lock().unwrap_or_else(|e| e.into_inner());
        String::from_utf8_lossy(&bytes).into_owned()
    }

    /// Waits (at most 5 s) until the log holds `needle`.
    async fn until(&self, needle: &str) {
        let deadline = Instant::now() + Duration::from_secs(5);
        while !self.text().contains(needle) {
            assert!(
                Instant::now() < deadline,
                "not logged after 5 s: {needle:?}\n{}",
                self.text()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

thread_local! {
    /// Where this thread's log events go (none: nowhere).
    static THREAD_LOG: std::cell::RefCell<Option<LogBuffer>> = const { std::cell::RefCell::new(None) };
}

/// A `tracing` writer into the log of the thread that writes.
struct ThreadLog;

impl std::io::Write for ThreadLog {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        THREAD_LOG.with(|log| {
            if let Some(log) = &*log.borrow() {
                (log.0.lock().unwrap_or_else(|e| e.into_inner())).extend_from_slice(bytes);
            }
        });
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// From now on, the log events of this thread (a `#[tokio::test]`'s
/// runtime, which runs the demo server's tasks too, runs on it alone), at
/// `info` and up, without times or targets.
///
/// (One subscriber, the global one, for the whole test binary: `tracing`
/// caches each event's interest process-wide, so a subscriber of one
/// thread's own would miss events that another test, without one, logged
/// first.)
fn capture_logs() -> LogBuffer {
    static INSTALLED: std::sync::Once = std::sync::Once::new();
    INSTALLED.call_once(|| {
        let subscriber = tracing_subscriber::fmt()
            .with_max_level(tracing::Level::INFO)
            .with_ansi(false)
            .without_time()
            .with_target(false)
            .with_writer(|| ThreadLog)
            .finish();
        tracing::subscriber::set_global_default(subscriber).unwrap();
        // (An event first met by another thread while the subscriber was
        // being set is asked about again.)
        tracing::callsite::rebuild_interest_cache();
    });
    let log = LogBuffer::default();
    THREAD_LOG.with(|l| *l.borrow_mut() = Some(log.clone()));
    log
}

/// What the server says at start-up and on each reload goes to its log
/// (stderr, in `main`), never to stdout; a reloaded table gets the
/// start-up warnings too.
#[tokio::test]
async fn start_up_and_reloads_are_logged_with_their_warnings() {
    let log = capture_logs();

    // MINUTE_TABLE, and a key in a group no rule names.
    let file = config_file(
        "[groups]\n\"admin-key\" = \"admin\"\n\"lost-key\" = \"lost\"\n\n\
         [[routes]]\npath = \"^/a\"\nrules = [{ minute = 2 }, { group = \"admin\" }]\n",
    );
    let addr = demo(&["--config", file.path(), "--reload-check-ms", "20"]).await;
    let started = log.text();
    assert!(
        started.contains(&format!("INFO loaded {}: 1 route\n", file.path())),
        "{started}"
    );
    assert!(started.contains("INFO store: memory\n"), "{started}");
    assert!(
        started.contains(&format!("INFO listening on http://{addr}\n")),
        "{started}"
    );
    assert!(
        started.contains("WARN no rule names group `lost`, which [groups] gives 1 key(s)"),
        "{started}"
    );
    assert!(!started.contains("group `admin`"), "{started}");

    // A table with no routes in place of one with some: refused (an
    // emptied file is most likely one being written).
    rewrite(&file, "[groups]\n\"k1\" = \"ghost\"\n");
    log.until(&format!(
        "WARN {} has no routes; keeping the running table (to limit nothing for a while, keep the routes and set `shadow = true` at the top of the file)\n",
        file.path()
    ))
    .await;
    // A group no rule names.
    rewrite(
        &file,
        "[groups]\n\"k1\" = \"ghost\"\n\"k2\" = \"ghost\"\n\n[[routes]]\npath = \"^/a\"\nrules = [{ minute = 2 }]\n",
    );
    log.until(&format!("INFO reloaded {}: 1 route\n", file.path()))
        .await;
    log.until("WARN no rule names group `ghost`, which [groups] gives 2 key(s)")
        .await;

    // A method typo and a route under an exclusion: valid, warned about.
    rewrite(
        &file,
        "[exclude]\npaths = [\"^/health\"]\n\n\
         [[routes]]\npath = \"^/health/deep\"\nrules = [{ minute = 1 }]\n\n\
         [[routes]]\npath = \"^/b\"\nrules = [{ method = \"gett\", minute = 1 }]\n\n\
         [[routes]]\npath = \"^/b/c\"\nrules = [{ method = \"GETT\", minute = 2 }]\n",
    );
    log.until(&format!("INFO reloaded {}: 3 routes\n", file.path()))
        .await;
    log.until(
        "WARN route #2 `^/b/c`, rule #0 (group `default`): route #1 `^/b`, listed earlier, takes every path this route matches with a rule for this group and method, so this rule never applies (list the narrower route first)\n",
    )
    .await;
    log.until(
        "WARN route #0 `^/health/deep`: every path this route matches is excluded by exclude.paths[0] `^/health`, so its rules apply only to a path that spells the excluded part percent-encoded (`/%68ealth` for `/health`), which is excluded only when both spellings are\n",
    )
    .await;
    log.until(
        "WARN route #1 `^/b`, rule #0 (group `default`), field `method`: `GETT` is not a registered HTTP method, so only requests sent with exactly `GETT` are concerned; did you mean `GET`?\n",
    )
    .await;

    // One route: "1 route".
    rewrite(
        &file,
        "[[routes]]\npath = \"^/a\"\nrules = [{ minute = 7 }]\n",
    );
    until_limit(addr, "7").await;
    log.until(&format!("INFO reloaded {}: 1 route\n", file.path()))
        .await;
    // (A route the previous table did not have: its budgets are new.)
    log.until("INFO budgets: route `^/a`, group `default`: its budgets start full (no rule of the previous table counted them)\n")
        .await;
    // Another algorithm: said; a limit changed: nothing to say.
    rewrite(
        &file,
        "[[routes]]\npath = \"^/a\"\nrules = [{ minute = 8, algorithm = \"token-bucket\" }]\n",
    );
    until_limit(addr, "8").await;
    log.until("INFO budgets: route `^/a`, group `default`: its budgets start full (sliding-log before, token-bucket now; a change back finds the earlier state)\n")
        .await;
    rewrite(
        &file,
        "[[routes]]\npath = \"^/a\"\nrules = [{ minute = 9, algorithm = \"token-bucket\" }]\n",
    );
    until_limit(addr, "9").await;

    // A file that cannot be read, seen by the watcher (no SIGHUP): reported
    // once, the running table kept.
    std::fs::remove_file(file.path()).unwrap();
    log.until(&format!(
        "WARN cannot read {}: No such file or directory (os error 2); keeping the running table\n",
        file.path()
    ))
    .await;
    until_limit(addr, "9").await;
    // (The reload that changed only a limit, logged before the file went,
    // said nothing of budgets.)
    let said = log.text();
    let after = said.rfind("token-bucket now").unwrap_or(0);
    assert!(!said[after..].contains("INFO budgets:"), "{said}");
    assert_eq!(said[after..].matches("INFO reloaded").count(), 1, "{said}");
}

/// Replaces a config file's text at once (written aside, then renamed
/// over it), as a deployment does.
fn rewrite(file: &ConfigFile, text: &str) {
    let aside = format!("{}.new", file.path());
    std::fs::write(&aside, text).unwrap();
    std::fs::rename(&aside, file.path()).unwrap();
}

/// Waits (at most 5 s) until a fresh user's limit on `/a` reads `limit`:
/// the reloaded table is in place.
async fn until_limit(addr: SocketAddr, limit: &str) {
    static FRESH: AtomicUsize = AtomicUsize::new(0);
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let user = format!("fresh-{}", FRESH.fetch_add(1, Ordering::Relaxed));
        let answer = get(addr, "/a", &[("x-api-key", user.as_str())]).await;
        if answer.header("x-ratelimit-limit") == Some(limit) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "limit {:?}, not {limit}, after 5 s",
            answer.header("x-ratelimit-limit")
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// `--config` is loaded again when its text changes: the new limits and
/// `[groups]` apply to the next requests, budgets carry over, and a file
/// that does not load leaves the running table in place.
#[tokio::test]
async fn a_changed_config_file_is_reloaded_without_a_restart() {
    let file = config_file(MINUTE_TABLE);
    let addr = demo(&["--config", file.path(), "--reload-check-ms", "20"]).await;
    let k1 = [("x-api-key", "k1")];
    assert_eq!(get(addr, "/a", &k1).await.status, 200);
    assert_eq!(get(addr, "/a", &k1).await.status, 200);
    assert_eq!(get(addr, "/a", &k1).await.status, 429);

    rewrite(
        &file,
        "[groups]\n\"gold-key\" = \"gold\"\n\n[[routes]]\npath = \"^/a\"\n\
         rules = [{ minute = 3 }, { group = \"gold\", minute = 10 }]\n",
    );
    until_limit(addr, "3").await;
    // k1 spent 2 of its budget, which the new table keeps: one more.
    let answer = get(addr, "/a", &k1).await;
    assert_eq!(answer.status, 200);
    assert_eq!(answer.header("x-ratelimit-remaining"), Some("0"));
    assert_eq!(get(addr, "/a", &k1).await.status, 429);
    // The new [groups]: gold-key is in group gold, admin-key no more admin.
    let gold = get(addr, "/a", &[("x-api-key", "gold-key")]).await;
    assert_eq!(gold.header("x-ratelimit-limit"), Some("10"));
    let admin = get(addr, "/a", &[("x-api-key", "admin-key")]).await;
    assert_eq!(admin.header("x-ratelimit-limit"), Some("3"));

    // An emptied file (one being written, most likely): the running
    // table kept (given 15 looks at it).
    rewrite(&file, "");
    tokio::time::sleep(Duration::from_millis(300)).await;
    let answer = get(addr, "/a", &[("x-api-key", "after-empty")]).await;
    assert_eq!(answer.header("x-ratelimit-limit"), Some("3"));

    // A broken file: reported, and the running table kept (given 15
    // looks at it), until a good one comes.
    rewrite(
        &file,
        "[[routes]]\npath = \"^/a(\"\nrules = [{ minute = 4 }]\n",
    );
    tokio::time::sleep(Duration::from_millis(300)).await;
    let answer = get(addr, "/a", &[("x-api-key", "after-broken")]).await;
    assert_eq!(answer.header("x-ratelimit-limit"), Some("3"));
    rewrite(
        &file,
        "[[routes]]\npath = \"^/a\"\nrules = [{ minute = 4 }]\n",
    );
    until_limit(addr, "4").await;
}

/// A `[groups]` key of UTF-8 text matches as a client sends it (the
/// header's bytes): before, only a visible-ASCII key could.
#[tokio::test]
async fn a_utf8_key_finds_its_group() {
    let file = config_file(
        "[groups]\n\"ключ\" = \"admin\"\n\n[[routes]]\npath = \"^/a\"\n\
         rules = [{ minute = 1 }, { group = \"admin\" }]\n",
    );
    let addr = demo(&["--config", file.path(), "--reload-check-ms", "0"]).await;
    for _ in 0..3 {
        let answer = get(addr, "/a", &[("x-api-key", "ключ")]).await;
        assert_eq!(answer.status, 200);
        assert_eq!(answer.header("x-ratelimit-limit"), None, "unlimited");
    }
}

/// SIGHUP loads `--config` again at once (here with no looking at the file
/// in between).
#[cfg(unix)]
#[tokio::test]
async fn sighup_reloads_the_config_file() {
    let file = config_file(MINUTE_TABLE);
    let addr = demo(&["--config", file.path(), "--reload-check-ms", "0"]).await;
    until_limit(addr, "2").await;
    rewrite(
        &file,
        "[[routes]]\npath = \"^/a\"\nrules = [{ minute = 7 }]\n",
    );
    // (Every demo server of this test binary reloads its own file.)
    let status = std::process::Command::new("kill")
        .args(["-HUP", &std::process::id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    until_limit(addr, "7").await;
}
