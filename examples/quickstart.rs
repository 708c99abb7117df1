//! The smallest useful program: two routes, limited per client IP, in memory.
//!
//! ```sh
//! cargo run --example quickstart
//! curl -i http://127.0.0.1:3000/hello   # twice within a second: the second is 429
//! ```

use std::net::SocketAddr;

use axum::{routing::get, Router};
use tower_ratelimit::{MemoryStore, RateLimitLayer, Rule, Rules};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let rules = Rules::builder()
        // One request per second, and 30 per minute, per client IP.
        .route(r"^/hello", [Rule::new().second(1).minute(30)])
        .build()?;

    let app = Router::new()
        .route("/hello", get(|| async { "hello\n" }))
        .route("/free", get(|| async { "not limited\n" }))
        // same_body: responses keep axum's body type (axum boxes any other).
        .layer(RateLimitLayer::new(rules, MemoryStore::new()).same_body());

    let addr = "127.0.0.1:3000";
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|e| format!("cannot listen on {addr}: {e}"))?;
    println!("listening on http://{}", listener.local_addr()?);
    // The default identity is the peer IP, read from ConnectInfo.
    axum::serve(
        listener,
        app.into_make_service_with_connect_info::<SocketAddr>(),
    )
    .await?;
    Ok(())
}
