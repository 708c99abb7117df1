//! The layer on a plain hyper 1.x service (no axum): hyper-util's
//! connection builder, `tower::ServiceBuilder`, and the peer address passed
//! to the layer as a `SocketAddr` request extension.
//!
//! ```sh
//! cargo run --example hyper            # listens on 127.0.0.1:3000
//! curl -i http://127.0.0.1:3000/api    # twice in a second: 429
//! ```
//!
//! `tests/hyper.rs` drives this very server over a real connection.

use std::convert::Infallible;
use std::net::SocketAddr;

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;
use tower::ServiceBuilder;
use tower_ratelimit::{MemoryStore, RateLimitLayer, Rule, Rules};

async fn hello(request: Request<Incoming>) -> Result<Response<Full<Bytes>>, Infallible> {
    let text = format!("hello from {}\n", request.uri().path());
    Ok(Response::new(Full::new(Bytes::from(text))))
}

/// Serves `hello` behind the layer on `listener`, until the task is dropped.
pub async fn serve(listener: TcpListener) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    let rules = Rules::builder()
        .route(r"^/api", [Rule::new().second(1).minute(30)])
        .build()?;
    // One layer (and one store) for every connection.
    let layer = RateLimitLayer::new(rules, MemoryStore::new());
    loop {
        let (stream, peer) = listener.accept().await?;
        let service = ServiceBuilder::new()
            // The default identity (ClientIp) reads a SocketAddr extension.
            .map_request(move |mut request: Request<Incoming>| {
                request.extensions_mut().insert::<SocketAddr>(peer);
                request
            })
            .layer(layer.clone())
            .service_fn(hello);
        tokio::spawn(async move {
            let connection = auto::Builder::new(TokioExecutor::new());
            let _ = connection
                .serve_connection(TokioIo::new(stream), TowerToHyperService::new(service))
                .await;
        });
    }
}

#[allow(dead_code)]
#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    let addr = "127.0.0.1:3000";
    let listener = TcpListener::bind(addr)
        .await
        .map_err(|e| format!("cannot listen on {addr}: {e}"))?;
    println!("listening on http://{}", listener.local_addr()?);
    serve(listener).await
}
