//! The hyper example, over a real TCP connection with a real HTTP client.

#[path = "../examples/hyper.rs"]
#[allow(dead_code, unreachable_pub)]
mod example;

use bytes::Bytes;
use http::{Request, StatusCode};
use http_body_util::{BodyExt, Empty};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;

#[tokio::test]
async fn a_plain_hyper_service_is_limited_over_a_real_connection() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let server = tokio::spawn(example::serve(listener));
    let client = Client::builder(TokioExecutor::new()).build_http::<Empty<Bytes>>();
    let get = |path: &str| {
        Request::builder()
            .uri(format!("http://{addr}{path}"))
            .body(Empty::new())
            .unwrap()
    };
    let started = std::time::Instant::now();
    let first = client.request(get("/api/x")).await.unwrap();
    assert_eq!(first.status(), StatusCode::OK);
    assert_eq!(first.headers()["x-ratelimit-limit"], "1");
    let body = first.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(body, "hello from /api/x\n");
    let second = client.request(get("/api/y")).await.unwrap();
    // (1 a second: the second is refused when it came within the second,
    // as it does unless the machine stalled.)
    if started.elapsed() < std::time::Duration::from_millis(900) {
        assert_eq!(second.status(), StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(second.headers()["retry-after"], "1");
        assert_eq!(second.headers()["content-type"], "application/problem+json");
    }
    let free = client.request(get("/other")).await.unwrap();
    assert_eq!(free.status(), StatusCode::OK);
    assert!(!free.headers().contains_key("x-ratelimit-limit"));
    server.abort();
}
