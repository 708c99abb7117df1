//! A gRPC (tonic) server behind the layer: the standard health service,
//! limited to 2 checks per second per client. A denied call gets the gRPC
//! answer `RESOURCE_EXHAUSTED`, with the wait in `retry-after` (seconds)
//! and `grpc-retry-pushback-ms` metadata. The server also answers gRPC
//! server reflection (v1 and v1alpha), which no rule names, so generic
//! clients such as `grpcurl` find the service without a `.proto` file.
//!
//! ```sh
//! cargo run --example tonic            # listens on 127.0.0.1:50051
//! cargo run --example tonic -- client  # (another terminal) three checks in a row:
//!                                      # Serving, Serving, then ResourceExhausted
//! # or, with grpcurl:
//! grpcurl -plaintext 127.0.0.1:50051 grpc.health.v1.Health/Check
//! # Budgets in Redis (replicas on one Redis share them), another address:
//! cargo run --example tonic -- --listen 127.0.0.1:50052 --redis redis://127.0.0.1:6379
//! cargo run --example tonic -- client --listen 127.0.0.1:50052
//! ```
//!
//! `tests/grpc.rs` drives this very server with a real tonic client, and
//! this client too.

use std::net::SocketAddr;

use http::request::Parts;
use tokio::net::TcpListener;
use tonic::transport::server::TcpIncoming;
use tonic_health::pb::health_client::HealthClient;
use tonic_health::pb::HealthCheckRequest;
use tower_ratelimit::identity::{single_header, ClientIp, Identity, IdentityError};
use tower_ratelimit::store::redis::RedisStore;
use tower_ratelimit::{MemoryStore, RateLimitLayer, Rule, Rules, Store};

/// The user is the `x-api-key` metadata, else the peer IP (tonic records it
/// as `TcpConnectInfo`, which `ClientIp`, the layer's default identity,
/// reads with the crate's `tonic` feature). Keys get a prefix no IP has,
/// so a key that reads as an address is not that client. An empty key is
/// no key: the client is known by its address (else every client sending
/// one would share one budget); a key sent twice is refused.
pub fn identify(head: &Parts) -> std::future::Ready<Result<Identity, IdentityError>> {
    std::future::ready(single_header(&head.headers, "x-api-key").and_then(|key| {
        let key = key.map(|v| v.as_bytes()).filter(|k| !k.is_empty());
        match (key, ClientIp::peer(head)) {
            (Some(key), _) => Ok(Identity::new([b"key:".as_slice(), key].concat())),
            (None, Some(peer)) => Ok(Identity::from_ip(peer.ip())),
            (None, None) => Err(IdentityError::new("no api key and no peer address")),
        }
    }))
}

/// Serves the health service, rate-limited, on `listener`, with budgets
/// in memory.
pub async fn serve(listener: TcpListener) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    serve_with(listener, MemoryStore::new()).await
}

/// [`serve`], with budgets in `store`.
pub async fn serve_with<St: Store>(
    listener: TcpListener,
    store: St,
) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    let rules = Rules::builder()
        // gRPC paths are /<package>.<Service>/<Method>.
        .route(r"^/grpc\.health\.v1\.Health/", [Rule::new().second(2)])
        .build()?;
    let layer = RateLimitLayer::new(rules, store).identify(identify);
    let (reporter, health) = tonic_health::server::health_reporter();
    reporter
        .set_service_status("", tonic_health::ServingStatus::Serving)
        .await;
    // Reflection describes the health service (and itself); its path,
    // /grpc.reflection.v1.ServerReflection/..., matches no rule.
    let reflection = || {
        tonic_reflection::server::Builder::configure()
            .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
    };
    tonic::transport::Server::builder()
        .layer(layer)
        .add_service(health)
        .add_service(reflection().build_v1()?)
        .add_service(reflection().build_v1alpha()?)
        .serve_with_incoming(TcpIncoming::from(listener))
        .await?;
    Ok(())
}

/// Calls the health service at `addr` `times` times in a row, as one
/// client (no API key: limited by its IP), and returns each answer as a
/// line: the serving status, or the code of a refusal with its message
/// and its `retry-after`.
pub async fn call(
    addr: SocketAddr,
    times: usize,
) -> Result<Vec<String>, Box<dyn std::error::Error + Send + Sync>> {
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))?
        .connect()
        .await?;
    let mut client = HealthClient::new(channel);
    let mut answers = Vec::with_capacity(times);
    for _ in 0..times {
        let request = tonic::Request::new(HealthCheckRequest {
            service: String::new(),
        });
        answers.push(match client.check(request).await {
            Ok(reply) => format!("{:?}", reply.into_inner().status()),
            Err(status) => format!(
                "{:?}: {} (retry-after: {})",
                status.code(),
                status.message(),
                status
                    .metadata()
                    .get("retry-after")
                    .and_then(|v| v.to_str().ok())
                    .unwrap_or("none")
            ),
        });
    }
    Ok(answers)
}

/// The command line: `[client] [--listen ADDR] [--redis URL]`.
struct Args {
    client: bool,
    addr: SocketAddr,
    redis: Option<String>,
}

const USAGE: &str = "usage: tonic [client] [--listen ADDR (default 127.0.0.1:50051)] [--redis URL (server: budgets in this Redis)]";

#[allow(dead_code)]
fn args() -> Result<Args, String> {
    let mut args = Args {
        client: false,
        addr: SocketAddr::from(([127, 0, 0, 1], 50051)),
        redis: None,
    };
    let mut given = std::env::args().skip(1);
    while let Some(arg) = given.next() {
        match arg.as_str() {
            "client" => args.client = true,
            "--listen" => {
                let addr = given.next().ok_or(USAGE)?;
                args.addr = addr
                    .parse()
                    .map_err(|e| format!("--listen {addr:?}: {e} (an IP and port)"))?;
            }
            "--redis" => args.redis = Some(given.next().ok_or(USAGE)?),
            "-h" | "--help" => {
                println!("{USAGE}");
                std::process::exit(0);
            }
            other => return Err(format!("unknown argument {other:?}\n{USAGE}")),
        }
    }
    if args.client && args.redis.is_some() {
        return Err(format!(
            "--redis is the server's (the client calls it)\n{USAGE}"
        ));
    }
    Ok(args)
}

#[allow(dead_code)]
#[tokio::main]
async fn main() -> std::process::ExitCode {
    // (The store's warnings, such as a Redis not reachable yet, on stderr.)
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| "info,redis=error".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    match run().await {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("{e}");
            std::process::ExitCode::FAILURE
        }
    }
}

#[allow(dead_code)]
async fn run() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    let Args {
        client,
        addr,
        redis,
    } = args()?;
    if client {
        let answers = call(addr, 3).await.map_err(|e| {
            // (With the causes: tonic's own error says "transport
            // error" alone.)
            let mut text = format!("cannot call the server on {addr}: {e}");
            let mut cause = e.source();
            while let Some(c) = cause {
                text.push_str(&format!(": {c}"));
                cause = c.source();
            }
            text
        })?;
        for answer in answers {
            println!("{answer}");
        }
        return Ok(());
    }
    let listener = TcpListener::bind(addr)
        .await
        .map_err(|e| format!("cannot listen on {addr}: {e}"))?;
    println!("gRPC health service on {}", listener.local_addr()?);
    match redis {
        Some(url) => {
            let store = RedisStore::builder()
                .url(url.as_str())
                .build()
                .await
                .map_err(|e| format!("--redis {url}: {e}"))?;
            serve_with(listener, store).await?;
        }
        None => serve(listener).await?,
    }
    Ok(())
}
