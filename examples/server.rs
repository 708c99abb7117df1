//! The demo server: every path answers 200 with a short text, behind the
//! rate-limit layer.
//!
//! ```sh
//! cargo run --release --example server                       # built-in table, memory store
//! cargo run --release --example server -- --config examples/ratelimit.toml
//! cargo run --release --example server -- --redis redis://127.0.0.1:6379
//! cargo run --release --example server -- --redis-cluster redis://127.0.0.1:7000,redis://127.0.0.1:7001
//! cargo run --release --example server -- --redis redis://127.0.0.1:6379 --fail-mode fallback --timeout-ms 50
//! cargo run --release --example server -- --penalty 401=4 --refund 5xx=1
//! ```
//!
//! Every config field reaches the layer: route rules, `global`,
//! `block_time`, `exclude`, `shadow`, `headers = "x" | "ietf" | "both" |
//! "none" | "x-windows"`.
//!
//! A request with an `x-demo-status: NNN` header is answered with that
//! status, to try `--penalty` and `--refund` (penalties and refunds by the
//! response's status, `RateLimitLayer::adjust_on_response`). NNN may be
//! any status from 200 to 599 but 204, 205 and 304 (whose responses have
//! no body, where the demo's has one; nor a 1xx, which is no final
//! answer); any other value of the header is answered `400` with a short
//! text saying so.
//!
//! `--fail-mode` and `--timeout-ms` apply to a Redis store only: given
//! without `--redis`, `--redis-cluster` or `--redis-sentinel`, they are an
//! error (the memory store answers at once and never fails).
//!
//! Logs, including what the server says at start-up (the built-in table,
//! the store, the address) and on each reload, go to stderr; `RUST_LOG`
//! sets their filter (unset or empty: `info`).
//!
//! `SIGTERM` or `SIGINT` stop the server: it takes no new connection,
//! answers the requests in flight (for `DRAIN`, 10 s, at most) and exits
//! 0; a second one ends it at once (exit 1). `SIGHUP` reloads `--config`, and is caught before anything else, so
//! one that comes while a large table loads never ends the process.
//!
//! Identity: the user is the `x-api-key` header, in the group that the
//! config's `[groups]` table gives that key (else `default`); without the
//! header (or with an empty one), the user is the client IP, in group
//! `default`; a request sending the header twice is answered `400`. Keys
//! are kept apart from IPs (a key `203.0.113.7` is not that client). The demo takes any key as it comes; a real service keys
//! users by a key it has verified (else a client escapes its limit with a
//! new key per request).

use std::collections::BTreeMap;
use std::future::{Future, IntoFuture};
use std::io::IsTerminal;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::ConnectInfo;
use axum::Router;
use clap::{Parser, ValueEnum};
use http::request::Parts;
use tower_ratelimit::identity::{
    self, single_header, Client, ForwardedIp, Identity, IdentityError,
};
use tower_ratelimit::store::redis::{redacted, RedisStore, RedisStoreBuilder};
use tower_ratelimit::{
    Adjustment, Config, ConfigErrorKind, FailMode, MemoryStore, RateLimitLayer, ReloadableRules,
    Store, StoreError, StoreErrorKind,
};

/// The table used without `--config`.
const DEMO: &str = r#"# API key -> group; other keys are "default"
[groups]
"admin-key" = "admin"

# OPTIONS requests pass unlimited (a browser sends a CORS preflight before a request).
[exclude]
methods = ["OPTIONS"]

[[routes]]
path = "^/towns"
rules = [
  { group = "default", second = 1 },
  { group = "admin" },
]

[[routes]]
path = "^/multiple"
rules = [{ second = 5, minute = 100, hour = 1000 }]
"#;

/// What a `--redis` URL may be (`redis::Client::open`, with the crate's
/// `tls` feature).
const REDIS_URLS: &str = "expected redis://HOST[:PORT][/DB] (valkey:// too), rediss:// for TLS, \
     or a Unix socket, unix:///PATH or redis+unix:///PATH";

/// What a `--redis-cluster` seed node may be (redis-rs' cluster client
/// takes no Unix socket: a Cluster names its nodes by IP and port).
const CLUSTER_URLS: &str = "expected comma-separated redis://HOST:PORT (valkey:// too), or \
     rediss://HOST:PORT for TLS; not a Unix socket (a Cluster names its nodes by IP and port)";

/// What a `--redis-sentinel` URL may be.
const SENTINEL_URLS: &str = "expected comma-separated redis://HOST[:PORT] (valkey:// too), \
     rediss:// for TLS (the master too, then), or unix:///PATH sentinel addresses";

/// The longest `--timeout-ms`: a deadline is there to bound a stalled
/// store's wait.
const MAX_TIMEOUT_MS: u64 = 60_000;

/// The demo server's command line.
#[derive(Parser, Debug)]
#[command(about = "tower-ratelimit demo server")]
#[command(group(clap::ArgGroup::new("redis_store")
    .args(["redis", "redis_cluster", "redis_sentinel"])
    .multiple(false)))]
pub struct Args {
    /// A TOML rule table (default: a built-in demo table, logged at start-up).
    #[arg(long, value_name = "FILE")]
    config: Option<std::path::PathBuf>,
    /// Address to listen on.
    #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:3000")]
    listen: SocketAddr,
    /// Keep budgets in this Redis server instead of in memory
    /// (redis://HOST[:PORT][/DB], rediss:// for TLS, unix:///PATH).
    #[arg(long, value_name = "URL", conflicts_with = "redis_cluster")]
    redis: Option<String>,
    /// Keep budgets in this Redis Cluster (comma-separated seed nodes).
    #[arg(long, value_name = "URL[,URL...]", value_delimiter = ',')]
    redis_cluster: Option<Vec<String>>,
    /// Keep budgets in the Redis master these sentinels watch
    /// (comma-separated sentinel URLs), following it through failovers.
    #[arg(long, value_name = "URL[,URL...]", value_delimiter = ',',
          conflicts_with_all = ["redis", "redis_cluster"])]
    redis_sentinel: Option<Vec<String>>,
    /// The name the sentinels know the master by.
    #[arg(
        long,
        value_name = "NAME",
        default_value = "mymaster",
        requires = "redis_sentinel"
    )]
    sentinel_master: String,
    /// The master's user, password and database under --redis-sentinel, as
    /// a URL whose address is not used (the sentinels give it), e.g.
    /// `redis://app:secret@master/2` (rediss:// for TLS to the master)
    #[arg(long, value_name = "URL", requires = "redis_sentinel")]
    sentinel_master_url: Option<String>,
    /// What to do when the Redis store fails (fallback: limit in memory
    /// until it answers again). Redis only: the memory store never fails.
    #[arg(long, value_enum, default_value_t = Mode::Open, requires = "redis_store")]
    fail_mode: Mode,
    /// Deadline of one Redis call, in milliseconds (1 to 60000; Redis
    /// only).
    #[arg(long, value_name = "N", default_value_t = 50, requires = "redis_store",
          value_parser = clap::value_parser!(u64).range(1..=MAX_TIMEOUT_MS))]
    timeout_ms: u64,
    /// For rediss:// (TLS): trust this CA (a PEM file) instead of the
    /// system's root certificates (under --redis-sentinel, whose URLs must
    /// then be rediss://, for the sentinels and the master).
    #[arg(long, value_name = "FILE", requires = "redis_store")]
    redis_ca: Option<std::path::PathBuf>,
    /// For rediss:// (TLS) to a server that asks for a client certificate:
    /// this one (a PEM file), with --redis-key.
    #[arg(long, value_name = "FILE", requires_all = ["redis_key", "redis_store"])]
    redis_cert: Option<std::path::PathBuf>,
    /// The private key (a PEM file) of --redis-cert.
    #[arg(long, value_name = "FILE", requires = "redis_cert")]
    redis_key: Option<std::path::PathBuf>,
    /// Trust X-Forwarded-For from proxies in this network (repeatable; CIDR
    /// or address). Without it, the peer address is the client.
    #[arg(long = "trusted-proxy", value_name = "CIDR")]
    trusted_proxies: Vec<String>,
    /// The trusted proxies write RFC 7239's `Forwarded` header: read it
    /// instead of X-Forwarded-For.
    #[arg(long, requires = "trusted_proxies")]
    rfc7239: bool,
    /// How often to look at --config for changes, in milliseconds (0:
    /// never). A changed file is loaded without a restart once two looks
    /// in a row read the same text, and at once on SIGHUP; one with an
    /// error is reported and the running table kept.
    #[arg(long, value_name = "N", default_value_t = 1000, requires = "config")]
    reload_check_ms: u64,
    /// A response with this status (`401`) or class (`4xx`) spends N more
    /// of its user's budget, after an allowed request (repeatable; the
    /// first --penalty, then --refund, that matches applies).
    #[arg(long = "penalty", value_name = "STATUS=N", value_parser = status_and_units)]
    penalties: Vec<(Status, u32)>,
    /// A response with this status or class gives N of its user's budget
    /// back (repeatable), e.g. `5xx=1`: server errors cost nothing.
    #[arg(long = "refund", value_name = "STATUS=N", value_parser = status_and_units)]
    refunds: Vec<(Status, u32)>,
}

/// The statuses a `--penalty` or `--refund` applies to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Status {
    /// One status code.
    Code(u16),
    /// A class: `4` for `4xx`.
    Class(u16),
}

impl Status {
    fn matches(self, status: http::StatusCode) -> bool {
        match self {
            Status::Code(code) => status.as_u16() == code,
            Status::Class(class) => status.as_u16() / 100 == class,
        }
    }
}

/// `401=4` or `5xx=1`: a status or class, and how many units.
fn status_and_units(text: &str) -> Result<(Status, u32), String> {
    let bad = || format!("`{text}`: expected STATUS=N, like 401=4 or 5xx=1 (N at least 1)");
    let (status, units) = text.split_once('=').ok_or_else(bad)?;
    let units: u32 = units.trim().parse().map_err(|_| bad())?;
    if units == 0 {
        return Err(bad());
    }
    let status = status.trim().to_ascii_lowercase();
    let status = match status.strip_suffix("xx") {
        Some(class) if class.len() == 1 => match class.parse::<u16>() {
            Ok(class @ 1..=5) => Status::Class(class),
            _ => return Err(bad()),
        },
        Some(_) => return Err(bad()),
        None => match status.parse::<u16>() {
            Ok(code @ 100..=599) if status.len() == 3 => Status::Code(code),
            _ => return Err(bad()),
        },
    };
    Ok((status, units))
}

#[derive(Clone, Copy, Debug, ValueEnum)]
enum Mode {
    Open,
    Closed,
    Fallback,
}

#[allow(dead_code)]
#[tokio::main]
async fn main() -> std::process::ExitCode {
    // Logs go to stderr, in colour only on a terminal. By default redis-rs
    // says only its errors: its Cluster client warns once per node on
    // every reconnect attempt while a Cluster is down, where the store
    // warns once, then at most once a second (RUST_LOG overrides).
    // (A RUST_LOG that is no filter is said, not ignored without a word.)
    // (An empty one, as a chart that sets every variable gives, is none.)
    let (filter, unread) = match std::env::var("RUST_LOG") {
        Ok(value) if value.trim().is_empty() => ("info,redis=error".into(), None),
        Ok(value) => match tracing_subscriber::EnvFilter::try_new(&value) {
            Ok(filter) => (filter, None),
            Err(error) => ("info,redis=error".into(), Some((value, error))),
        },
        Err(_) => ("info,redis=error".into(), None),
    };
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .init();
    if let Some((value, error)) = unread {
        tracing::warn!("RUST_LOG `{value}` is not a log filter ({error}); logging at info");
    }
    // (Caught before anything else, as SIGHUP is.)
    let stop = stop_signal();
    let result = match start_until(Args::parse(), stop).await {
        Ok((_, server)) => server.await.map_err(Into::into),
        Err(error) => Err(error),
    };
    match result {
        Ok(()) => {
            tracing::info!("stopped");
            // (Not waiting for the runtime's blocking tasks: a read of the
            // config file that hangs, a FIFO put in its place, would hold
            // the exit for ever.)
            std::process::exit(0)
        }
        Err(error) => {
            eprintln!("error: {error}");
            std::process::ExitCode::FAILURE
        }
    }
}

/// The running server (it ends once stopped, or on an I/O error).
pub type Server = Pin<Box<dyn Future<Output = std::io::Result<()>> + Send>>;

/// How long a stopping server waits for the requests in flight.
pub const DRAIN: Duration = Duration::from_secs(10);

/// SIGINT (Ctrl-C) or SIGTERM (what systemd and Kubernetes send to stop a
/// service), caught from now on (one that comes while the server starts
/// stops it once it runs), said in the log; a second one ends the process
/// at once, without waiting for the requests in flight.
#[cfg(unix)]
fn stop_signal() -> impl Future<Output = ()> + Send + 'static {
    use tokio::signal::unix::{signal, SignalKind};
    let stop = Arc::new(tokio::sync::Notify::new());
    let told = stop.clone();
    match signal(SignalKind::terminate()).and_then(|term| {
        let interrupt = signal(SignalKind::interrupt())?;
        Ok((term, interrupt))
    }) {
        // (Watched by a task of its own from now on, so that signals are
        // told apart, and said, in the order they come, also while the
        // table loads.)
        Ok((mut term, mut interrupt)) => {
            tokio::spawn(async move {
                let name = |term: bool| if term { "SIGTERM" } else { "SIGINT" };
                let first = tokio::select! {
                    _ = term.recv() => true,
                    _ = interrupt.recv() => false,
                };
                tracing::info!("{}", name(first));
                told.notify_one();
                let second = tokio::select! {
                    _ = term.recv() => true,
                    _ = interrupt.recv() => false,
                };
                tracing::warn!("{} while stopping: stopping now", name(second));
                std::process::exit(1);
            });
        }
        Err(e) => tracing::warn!("cannot catch SIGTERM and SIGINT: {e}"),
    }
    async move { stop.notified().await }
}

#[cfg(not(unix))]
fn stop_signal() -> impl Future<Output = ()> + Send + 'static {
    async {
        if tokio::signal::ctrl_c().await.is_ok() {
            tracing::info!("Ctrl-C");
        } else {
            std::future::pending().await
        }
    }
}

/// [`start_until`] a server that runs until it fails.
pub async fn start(args: Args) -> Result<(SocketAddr, Server), Box<dyn std::error::Error>> {
    start_until(args, std::future::pending()).await
}

/// Checks the flags and the rule table, connects the store and binds the
/// listener: the address it listens on, and the server to run. Once `stop`
/// ends, the server takes no new connection, closes idle ones, and ends
/// when the requests in flight are answered ([`DRAIN`] at most).
/// (`tests/demo_server.rs` drives this very code.)
pub async fn start_until(
    args: Args,
    stop: impl Future<Output = ()> + Send + 'static,
) -> Result<(SocketAddr, Server), Box<dyn std::error::Error>> {
    // (SIGHUP is taken over first: one sent while a large table loads, as
    // a reload script sends every server, does not end the process; it
    // reloads once the server runs.)
    let hangups = catch_hangups();
    // (Checked first: the error names the flag.)
    let proxies = ForwardedIp::new(&args.trusted_proxies).map_err(|e| match e.kind() {
        ConfigErrorKind::InvalidNetwork(net) => {
            format!("--trusted-proxy {net}: not an IP address or CIDR block (like 10.0.0.0/8)")
        }
        _ => e.to_string(),
    })?;
    // (The text loaded is what a reload compares the file with.)
    let (config, loaded) = match &args.config {
        Some(path) => {
            let text = read_config(path)
                .await
                .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
            // (Named as a reload's error names it.)
            let config =
                Config::from_toml(&text).map_err(|e| format!("{}: {e}", path.display()))?;
            tracing::info!(
                "loaded {}: {}",
                path.display(),
                routes(config.rules().len())
            );
            (config, Some(text))
        }
        None => {
            tracing::info!("no --config given; using the built-in demo table:\n\n{DEMO}");
            (Config::from_toml(DEMO)?, None)
        }
    };
    warn_about(&config);
    let timeout = Duration::from_millis(args.timeout_ms);
    let mode = match args.fail_mode {
        Mode::Open => FailMode::Open,
        Mode::Closed => FailMode::Closed,
        Mode::Fallback => FailMode::Fallback,
    };
    if let Some(url) = &args.redis {
        let store = with_tls(RedisStore::builder().url(url), &args)?
            .timeout(timeout)
            .build()
            .await
            .map_err(|e| bad_url("--redis", &redacted(url), e, REDIS_URLS))?;
        tracing::info!("store: redis {}", redacted(url));
        serve(&args, config, loaded, store, mode, proxies, (hangups, stop)).await
    } else if let Some(urls) = &args.redis_sentinel {
        let mut builder =
            RedisStore::builder().sentinel(urls.clone(), args.sentinel_master.clone());
        if let Some(master) = &args.sentinel_master_url {
            builder = builder.sentinel_master_url(master.clone());
        }
        let store = with_tls(builder, &args)?
            .timeout(timeout)
            .build()
            .await
            .map_err(|e| match &args.sentinel_master_url {
                // (The master's URL is read for its credentials and
                // database alone, but must read as a Redis URL.)
                Some(master) if e.to_string().contains("invalid redis master url") => {
                    bad_url("--sentinel-master-url", &redacted(master), e, REDIS_URLS)
                }
                // (A refused password or database: the master's come from
                // --sentinel-master-url, each sentinel's from its URL.)
                Some(master)
                    if e.kind() == StoreErrorKind::Config
                        && ["authentication", "WRONGPASS", "NOAUTH", "DB index"]
                            .iter()
                            .any(|word| e.to_string().contains(word)) =>
                {
                    format!(
                        "--redis-sentinel {} with --sentinel-master-url {}: {e} (the master's user, password and database are --sentinel-master-url's; each sentinel's, its own URL's)",
                        redact_all(urls),
                        redacted(master)
                    )
                    .into()
                }
                _ => bad_url("--redis-sentinel", &redact_all(urls), e, SENTINEL_URLS),
            })?;
        tracing::info!(
            "store: redis master `{}` through sentinels {}",
            args.sentinel_master,
            redact_all(urls)
        );
        serve(&args, config, loaded, store, mode, proxies, (hangups, stop)).await
    } else if let Some(urls) = &args.redis_cluster {
        let store = with_tls(RedisStore::builder().cluster(urls.clone()), &args)?
            .timeout(timeout)
            .build()
            .await
            .map_err(|e| bad_url("--redis-cluster", &redact_all(urls), e, CLUSTER_URLS))?;
        tracing::info!("store: redis cluster {}", redact_all(urls));
        serve(&args, config, loaded, store, mode, proxies, (hangups, stop)).await
    } else {
        tracing::info!("store: memory");
        serve(
            &args,
            config,
            loaded,
            MemoryStore::new(),
            mode,
            proxies,
            (hangups, stop),
        )
        .await
    }
}

/// `builder` with the certificates of `--redis-ca`, `--redis-cert` and
/// `--redis-key`, read from their files.
fn with_tls(
    mut builder: RedisStoreBuilder,
    args: &Args,
) -> Result<RedisStoreBuilder, Box<dyn std::error::Error>> {
    let read = |flag: &str, path: &std::path::Path| {
        std::fs::read(path).map_err(|e| format!("{flag} {}: {e}", path.display()))
    };
    if let Some(ca) = &args.redis_ca {
        builder = builder.tls_root_certificate(read("--redis-ca", ca)?);
    }
    if let (Some(cert), Some(key)) = (&args.redis_cert, &args.redis_key) {
        builder =
            builder.tls_client_certificate(read("--redis-cert", cert)?, read("--redis-key", key)?);
    }
    Ok(builder)
}

/// The error of a Redis flag the store refused: the flag, its URL (given
/// here without its password) and the store's reason, and, for a URL it
/// could not read, the URLs it takes. (A store that cannot connect is no
/// error: it keeps trying in the background. One whose server is set up
/// otherwise, such as a wrong password or a Cluster node given to
/// `--redis`, is, and its URL was fine.)
fn bad_url(flag: &str, url: &str, error: StoreError, expected: &str) -> Box<dyn std::error::Error> {
    let unreadable = error.to_string().contains("invalid redis");
    match error.kind() {
        StoreErrorKind::Config if unreadable => format!("{flag} {url}: {error}; {expected}").into(),
        StoreErrorKind::Config => format!("{flag} {url}: {error}").into(),
        _ => error.into(),
    }
}

/// A list of URLs for the log, each without its password.
fn redact_all(urls: &[String]) -> String {
    urls.iter()
        .map(|url| redacted(url))
        .collect::<Vec<_>>()
        .join(",")
}

/// Warns about a rule table that is valid but most likely not what was
/// meant: at start-up, and after each reload.
fn warn_about(config: &Config) {
    if config.rules().is_empty() {
        tracing::warn!("the configuration has no routes: no request is limited");
    }
    for warning in config.rules().warnings() {
        tracing::warn!("{warning}");
    }
    // (By group and count: the keys are secrets, not for the logs.)
    let mut unruled = BTreeMap::<&str, usize>::new();
    for (_, group) in config.groups_without_rules() {
        *unruled.entry(group).or_default() += 1;
    }
    for (group, keys) in unruled {
        tracing::warn!(
            "no rule names group `{group}`, which [groups] gives {keys} key(s): their users are never limited"
        );
    }
}

/// `1 route`, `2 routes`.
fn routes(n: usize) -> String {
    format!("{n} route{}", if n == 1 { "" } else { "s" })
}

async fn serve<St: Store>(
    args: &Args,
    config: Config,
    loaded: Option<String>,
    store: St,
    mode: FailMode,
    proxies: ForwardedIp,
    (hangups, stop): (Hangups, impl Future<Output = ()> + Send + 'static),
) -> Result<(SocketAddr, Server), Box<dyn std::error::Error>> {
    let groups = Arc::new(arc_swap::ArcSwap::from_pointee(config.groups().clone()));
    let proxies = Arc::new(if args.rfc7239 {
        proxies.rfc7239()
    } else {
        proxies
    });
    let rules = ReloadableRules::new(config.rules().clone());
    let reloads = reloads(args, hangups, loaded, rules.clone(), groups.clone());
    let mut layer = RateLimitLayer::new(rules, store).fail_mode(mode);
    let adjustments: Vec<(Status, Adjustment)> = (args.penalties.iter())
        .map(|&(status, n)| (status, Adjustment::Penalty(n)))
        .chain(
            args.refunds
                .iter()
                .map(|&(s, n)| (s, Adjustment::Refund(n))),
        )
        .collect();
    if !adjustments.is_empty() {
        for (status, adjustment) in &adjustments {
            let status = match status {
                Status::Code(code) => code.to_string(),
                Status::Class(class) => format!("{class}xx"),
            };
            match adjustment {
                Adjustment::Penalty(n) => tracing::info!("a {status} answer spends {n} more"),
                Adjustment::Refund(n) => tracing::info!("a {status} answer gives {n} back"),
                _ => {}
            }
        }
        layer = layer.adjust_on_response(move |status, _| {
            let (_, adjustment) = adjustments.iter().find(|(s, _)| s.matches(status))?;
            Some(*adjustment)
        });
    }
    let layer = layer
        // (An identity that answers at once: the layer decides without
        // holding the request.)
        .identify(identity::immediate(move |head: &Parts| {
            identify(head, &groups.load(), &proxies)
        }))
        // Responses keep axum's own body type: no box per response.
        .same_body();
    let app = Router::new()
        .fallback(
            |uri: http::Uri, headers: http::HeaderMap, mut body: axum::body::Body| async move {
                // (An allowed upload is read to its end and dropped, so that
                // its client gets the answer rather than a broken pipe.)
                while let Some(Ok(_)) = http_body_util::BodyExt::frame(&mut body).await {}
                // (`x-demo-status: 401` answers 401, to try --penalty.)
                let status = match headers.get("x-demo-status").map(demo_status) {
                    None => http::StatusCode::OK,
                    Some(Some(status)) => status,
                    Some(None) => {
                        return (http::StatusCode::BAD_REQUEST, BAD_DEMO_STATUS.to_owned())
                    }
                };
                let word = if status.is_success() {
                    "ok"
                } else {
                    status.as_str()
                };
                (status, format!("{word} {}\n", uri.path()))
            },
        )
        .layer(layer);
    let listener = tokio::net::TcpListener::bind(args.listen)
        .await
        .map_err(|e| format!("cannot listen on {}: {e}", args.listen))?;
    let addr = listener.local_addr()?;
    tracing::info!("listening on http://{addr}");
    // (Stopping starts the drain's clock.)
    let draining = Arc::new(tokio::sync::Notify::new());
    let drain_started = draining.clone();
    let server = axum::serve(
        listener,
        app.into_make_service_with_connect_info::<SocketAddr>(),
    )
    .with_graceful_shutdown(async move {
        stop.await;
        tracing::info!(
            "stopping: no new connections; answering the requests in flight (for {} s at most)",
            DRAIN.as_secs()
        );
        drain_started.notify_one();
    })
    .into_future();
    // (The reloads end with the server.)
    Ok((
        addr,
        Box::pin(async move {
            tokio::select! {
                result = server => result,
                () = reloads => Ok(()),
                () = async {
                    draining.notified().await;
                    tokio::time::sleep(DRAIN).await;
                } => {
                    tracing::warn!("connections still open after {} s (requests in flight, or clients that never finished one); stopping without them", DRAIN.as_secs());
                    Ok(())
                }
            }
        }),
    ))
}

/// Loads `--config` again on SIGHUP, and whenever its text changes from
/// `loaded` (the text loaded at start-up; looked at every
/// `--reload-check-ms`): the new routes, rules and `[groups]` apply
/// to the next requests, and budgets carry over where their keys do. A file
/// that does not load is reported, and the running table kept. (Never ends;
/// without `--config`, does nothing.)
fn reloads(
    args: &Args,
    mut hangups: Hangups,
    loaded: Option<String>,
    rules: ReloadableRules,
    groups: Arc<arc_swap::ArcSwap<BTreeMap<String, String>>>,
) -> impl Future<Output = ()> + Send + 'static {
    let path = args.config.clone();
    let every = Duration::from_millis(args.reload_check_ms);
    let on_redis =
        args.redis.is_some() || args.redis_sentinel.is_some() || args.redis_cluster.is_some();
    async move {
        let Some(path) = path else {
            // (A hang-up, as a reload script sends every server, does not
            // end one without a file to reload.)
            loop {
                hangup(&mut hangups).await;
                tracing::info!("SIGHUP: no --config to reload; the built-in table stays");
            }
        };
        // (Not read again here: a change made between start-up and this
        // task's first run is a change.)
        let mut last = loaded;
        // A changed text is loaded once two looks in a row read it: a file
        // being written (truncated, then filled) is not taken half-way.
        let mut seen: Option<String> = None;
        // (A file that cannot be read is reported when asked to reload, and
        // once per new reason while it stays so.)
        let mut unreadable: Option<String> = None;
        loop {
            let asked = tokio::select! {
                () = tick(every) => false,
                () = hangup(&mut hangups) => true,
            };
            let text = match read_config(&path).await {
                Ok(text) => {
                    // (Said when it is what runs: a changed text is said
                    // when loaded.)
                    if unreadable.take().is_some() && last.as_deref() == Some(text.as_str()) {
                        tracing::info!(
                            "{} can be read again, unchanged: the running table stays",
                            path.display()
                        );
                    }
                    text
                }
                Err(e) => {
                    let reason = e.to_string();
                    if asked || unreadable.as_deref() != Some(reason.as_str()) {
                        tracing::warn!(
                            "cannot read {}: {reason}; keeping the running table",
                            path.display()
                        );
                    }
                    unreadable = Some(reason);
                    continue;
                }
            };
            if !asked {
                if last.as_deref() == Some(text.as_str()) {
                    seen = None;
                    continue;
                }
                if seen.as_deref() != Some(text.as_str()) {
                    seen = Some(text);
                    continue;
                }
            }
            seen = None;
            // (Checked off the server's task: a large table takes a while,
            // and the server accepts connections meanwhile.)
            let previous = rules.get();
            let checking = tokio::task::spawn_blocking(move || {
                let checked = Config::from_toml(&text);
                let changes = match &checked {
                    Ok(config) => config.rules().budget_changes(&previous),
                    Err(_) => Vec::new(),
                };
                (checked, text, changes)
            });
            let (checked, text, changes) = match checking.await {
                Ok(done) => done,
                Err(e) => {
                    tracing::warn!("{}: {e}; keeping the running table", path.display());
                    continue;
                }
            };
            match checked {
                // (A table that had routes does not lose them all by a
                // reload: an empty file is most likely one being written.)
                Ok(config) if config.rules().is_empty() && !rules.get().is_empty() => {
                    tracing::warn!(
                        "{} has no routes; keeping the running table (to limit nothing for a while, keep the routes and set `shadow = true` at the top of the file)",
                        path.display()
                    );
                }
                Ok(config) => {
                    // (Two swaps: one request between them may read the
                    // new groups with the old rules.)
                    groups.store(Arc::new(config.groups().clone()));
                    rules.set(config.rules().clone());
                    tracing::info!(
                        "reloaded {}: {}",
                        path.display(),
                        routes(config.rules().len())
                    );
                    log_budget_changes(&changes, on_redis);
                    warn_about(&config);
                }
                Err(e) => tracing::warn!("{}: {e}; keeping the running table", path.display()),
            }
            last = Some(text);
        }
    }
}

/// The most budget changes a reload lists one line each.
const LISTED_CHANGES: usize = 20;

/// Says which rules' budgets a reload did not carry over as they were (see
/// `Rules::budget_changes`): who starts with a full budget, or with new
/// windows empty. Those of this server's store only.
fn log_budget_changes(changes: &[tower_ratelimit::rules::BudgetChange], on_redis: bool) {
    use tower_ratelimit::rules::ChangedOn;
    let other = if on_redis {
        ChangedOn::Memory
    } else {
        ChangedOn::Redis
    };
    let shown: Vec<_> = changes.iter().filter(|c| c.stores != other).collect();
    for change in shown.iter().take(LISTED_CHANGES) {
        tracing::info!("budgets: {change}");
    }
    if shown.len() > LISTED_CHANGES {
        tracing::info!(
            "budgets: and {} more changes like these",
            shown.len() - LISTED_CHANGES
        );
    }
}

/// The largest config file read: far above any real table (16,000 regex
/// routes take about 1 MiB), so that a wrong path (`/dev/zero`, a log)
/// cannot fill the memory.
pub const MAX_CONFIG_BYTES: u64 = 16 << 20;

/// The text of the config file: a regular file (a FIFO or a device would
/// hang or never end) of at most [`MAX_CONFIG_BYTES`]; one that is not
/// UTF-8 is an error that says where (line and byte).
async fn read_config(path: &std::path::Path) -> Result<String, String> {
    use tokio::io::AsyncReadExt;
    let metadata = tokio::fs::metadata(path).await.map_err(|e| e.to_string())?;
    if !metadata.is_file() {
        return Err(if metadata.is_dir() {
            "a directory, not a file".to_owned()
        } else {
            "not a regular file (a FIFO, a socket or a device)".to_owned()
        });
    }
    // (One text whatever the size: a file that keeps growing is said once,
    // not at every look.)
    let too_large =
        || format!("larger than a rule table may be ({MAX_CONFIG_BYTES} bytes, 16 MiB)");
    if metadata.len() > MAX_CONFIG_BYTES {
        return Err(too_large());
    }
    let file = tokio::fs::File::open(path)
        .await
        .map_err(|e| e.to_string())?;
    let mut bytes = Vec::new();
    // (It may have grown since.)
    file.take(MAX_CONFIG_BYTES + 1)
        .read_to_end(&mut bytes)
        .await
        .map_err(|e| e.to_string())?;
    if bytes.len() as u64 > MAX_CONFIG_BYTES {
        return Err(too_large());
    }
    String::from_utf8(bytes).map_err(|e| {
        let at = e.utf8_error().valid_up_to();
        let before = &e.as_bytes()[..at];
        let line = before.iter().filter(|&&b| b == b'\n').count() + 1;
        let column = at
            - before
                .iter()
                .rposition(|&b| b == b'\n')
                .map_or(0, |i| i + 1)
            + 1;
        format!(
            "not UTF-8 text at line {line}, column {column} (byte {})",
            at + 1
        )
    })
}

/// The answer to an `x-demo-status` that [`demo_status`] refuses.
const BAD_DEMO_STATUS: &str =
    "x-demo-status must be a status from 200 to 599, but not 204, 205 or 304\n";

/// The status an `x-demo-status` header asks for: 200 to 599, but not
/// 204, 205 or 304, whose responses have no body (the demo's has one), nor
/// a 1xx, which is not a final answer; `None` for any other value.
fn demo_status(value: &http::HeaderValue) -> Option<http::StatusCode> {
    // (Three digits exactly: `u16`'s parse takes `+401` and `0401` too.)
    let text = value.to_str().ok()?.trim();
    if text.len() != 3 || !text.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let code: u16 = text.parse().ok()?;
    match code {
        204 | 205 | 304 => None,
        200..=599 => http::StatusCode::from_u16(code).ok(),
        _ => None,
    }
}

/// Waits `every` (forever for zero: no looking).
async fn tick(every: Duration) {
    if every.is_zero() {
        std::future::pending().await
    } else {
        tokio::time::sleep(every).await
    }
}

/// SIGHUP, caught (`None`: it cannot be, or there is none).
#[cfg(unix)]
type Hangups = Option<tokio::signal::unix::Signal>;
#[cfg(not(unix))]
type Hangups = Option<()>;

/// SIGHUP, taken over: from now on a hang-up is a reload, never the end
/// of the process.
fn catch_hangups() -> Hangups {
    #[cfg(unix)]
    return tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup())
        .map_err(|e| tracing::warn!("cannot catch SIGHUP: {e}"))
        .ok();
    #[cfg(not(unix))]
    None
}

/// The next SIGHUP (forever where there is none).
#[cfg(unix)]
async fn hangup(signals: &mut Option<tokio::signal::unix::Signal>) {
    let Some(signals) = signals else {
        return std::future::pending().await;
    };
    if signals.recv().await.is_none() {
        std::future::pending().await
    }
}

#[cfg(not(unix))]
async fn hangup(_: &mut Option<()>) {
    std::future::pending().await
}

fn identify(
    head: &Parts,
    groups: &BTreeMap<String, String>,
    proxies: &ForwardedIp,
) -> Result<Identity, IdentityError> {
    // (An empty key is no key: the client is known by its address. A key
    // sent twice is refused: which of them did anything check?)
    if let Some(key) = single_header(&head.headers, "x-api-key")?.filter(|k| !k.is_empty()) {
        // (Compared as bytes: a key of UTF-8 text, `ключ`, matches as a
        // client sends it.)
        let group = std::str::from_utf8(key.as_bytes())
            .ok()
            .and_then(|k| groups.get(k))
            .cloned()
            .unwrap_or_else(|| "default".to_owned());
        // ("key:" keeps keys apart from the other kinds of user: a key
        // that reads as an IP address cannot spend that client's budget.)
        let user = [b"key:".as_slice(), key.as_bytes()].concat();
        return Ok(Identity::new(user).with_group(group));
    }
    let peer = head
        .extensions
        .get::<ConnectInfo<SocketAddr>>()
        .ok_or_else(|| IdentityError::new("no peer address"))?;
    Ok(match proxies.client(peer.0.ip(), &head.headers) {
        // (An IPv6 client stands for its /64, as `ClientIp` does.)
        Client::Ip(ip) => Identity::from_ip(ip),
        Client::Token(token) => Identity::new(format!("token:{token}")),
    })
}
