//! One budget for every replica: the layer on a Redis store.
//!
//! ```sh
//! cargo run --example redis -- redis://127.0.0.1:6379
//! # run it twice on two ports (PORT=3001 ...): together they allow 2/s.
//! curl -i -H 'x-api-key: alice' http://127.0.0.1:3000/api/hello
//! ```

use std::net::SocketAddr;
use std::time::Duration;

use axum::{routing::get, Router};
use tower_ratelimit::identity::HeaderKey;
use tower_ratelimit::store::redis::RedisStore;
use tower_ratelimit::{FailMode, RateLimitLayer, Rule, Rules};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    // The store's log on stderr: Redis not reachable, the fail mode
    // applied (at most one warning a second), reconnected. RUST_LOG
    // overrides the level.
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| "info,redis=error".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    let url = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "redis://127.0.0.1:6379".to_owned());
    let port: u16 = std::env::var("PORT")
        .ok()
        .and_then(|p| p.parse().ok())
        .unwrap_or(3000);

    let rules = Rules::builder()
        .route(r"^/api", [Rule::new().second(2).minute(60)])
        .build()?;
    // One multiplexed connection; every check is one EVALSHA with a 50 ms
    // deadline. Without Redis the service keeps answering (fail open).
    let store = RedisStore::builder()
        .url(url)
        .prefix("demo")
        .timeout(Duration::from_millis(50))
        .build()
        .await?;
    let layer = RateLimitLayer::new(rules, store)
        .fail_mode(FailMode::Open)
        // (Any key as it comes: a real service keys users by keys it has
        // verified, see `identity::HeaderKey`.)
        .identify(HeaderKey::new(http::HeaderName::from_static("x-api-key")))
        .same_body();

    let app = Router::new()
        .route("/api/hello", get(|| async { "hello\n" }))
        .layer(layer);
    let listener = tokio::net::TcpListener::bind(SocketAddr::from(([127, 0, 0, 1], port))).await?;
    println!("listening on http://{}", listener.local_addr()?);
    axum::serve(listener, app).await?;
    Ok(())
}
