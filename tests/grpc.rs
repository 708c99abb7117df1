//! The tonic example, driven by a real tonic client over TCP.

#[path = "../examples/tonic.rs"]
#[allow(dead_code, unreachable_pub)]
mod example;
mod support;

use tonic::Code;
use tonic_health::pb::health_client::HealthClient;
use tonic_health::pb::HealthCheckRequest;

/// A tonic client of the health service at `addr`.
async fn client(addr: std::net::SocketAddr) -> HealthClient<tonic::transport::Channel> {
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect()
        .await
        .unwrap();
    HealthClient::new(channel)
}

/// Rules limiting the health service to 2 calls a minute.
fn health_rules() -> tower_ratelimit::Rules {
    tower_ratelimit::Rules::builder()
        .route(
            r"^/grpc\.health\.v1\.Health/",
            [tower_ratelimit::Rule::new().minute(2)],
        )
        .build()
        .unwrap()
}

/// The health service, its whole server reported serving.
async fn serving_health(
) -> tonic_health::pb::health_server::HealthServer<impl tonic_health::pb::health_server::Health> {
    let (reporter, health) = tonic_health::server::health_reporter();
    reporter
        .set_service_status("", tonic_health::ServingStatus::Serving)
        .await;
    health
}

/// A health check of the whole server.
fn health_check() -> tonic::Request<HealthCheckRequest> {
    tonic::Request::new(HealthCheckRequest {
        service: String::new(),
    })
}

#[tokio::test]
async fn a_real_grpc_client_is_limited_the_grpc_way() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let server = tokio::spawn(example::serve(listener));
    let mut client = client(addr).await;
    let check = || {
        let mut request = health_check();
        request
            .metadata_mut()
            .insert("x-api-key", "alice".parse().unwrap());
        request
    };
    let started = std::time::Instant::now();
    for _ in 0..2 {
        let reply = client.check(check()).await.unwrap();
        assert_eq!(reply.get_ref().status, 1, "SERVING");
    }
    let third = client.check(check()).await;
    // (2 a second: the third is refused when it came within the second,
    // as it does unless the machine stalled.)
    if !support::came_within_a_second(started) {
        server.abort();
        return;
    }
    let denied = third.unwrap_err();
    assert_eq!(denied.code(), Code::ResourceExhausted);
    assert_eq!(denied.message(), "rate limit exceeded");
    let retry: u64 = denied
        .metadata()
        .get("retry-after")
        .unwrap()
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert_eq!(retry, 1);
    let pushback: u64 = denied
        .metadata()
        .get("grpc-retry-pushback-ms")
        .unwrap()
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!((1..=1000).contains(&pushback), "{pushback}");
    // Another caller has its own budget; the connection is still healthy.
    let mut other = health_check();
    other
        .metadata_mut()
        .insert("x-api-key", "bob".parse().unwrap());
    assert!(client.check(other).await.is_ok());
    server.abort();
}

/// With the `tonic` feature the default identity, the peer IP, works on a
/// tonic server as it is (tonic records the peer as `TcpConnectInfo`):
/// every call of one client shares one budget, and none is refused for a
/// missing address.
#[tokio::test]
async fn the_default_identity_reads_the_peer_a_tonic_server_records() {
    use tower_ratelimit::{MemoryStore, RateLimitLayer};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let rules = health_rules();
    let health = serving_health().await;
    let server = tokio::spawn(
        tonic::transport::Server::builder()
            .layer(RateLimitLayer::new(rules, MemoryStore::new()))
            .add_service(health)
            .serve_with_incoming(tonic::transport::server::TcpIncoming::from(listener)),
    );
    let mut client = client(addr).await;
    for _ in 0..2 {
        let reply = client.check(health_check()).await.unwrap();
        assert_eq!(reply.metadata().get("x-ratelimit-limit").unwrap(), "2");
    }
    let denied = client.check(health_check()).await.unwrap_err();
    assert_eq!(denied.code(), Code::ResourceExhausted, "{denied:?}");
    server.abort();
}

/// gRPC-Web's usual stack: tower-http's `CorsLayer` outside the layer on a
/// tonic server (it needs an empty body of the layer's type for its own
/// answers). A refused call still carries the CORS headers.
#[tokio::test]
async fn a_cors_layer_stacks_outside_the_layer_on_a_tonic_server() {
    use tower_ratelimit::{MemoryStore, RateLimitLayer};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let health = serving_health().await;
    let server = tokio::spawn(
        tonic::transport::Server::builder()
            .accept_http1(true)
            .layer(tower_http::cors::CorsLayer::permissive())
            .layer(RateLimitLayer::new(health_rules(), MemoryStore::new()))
            .add_service(health)
            .serve_with_incoming(tonic::transport::server::TcpIncoming::from(listener)),
    );
    let mut client = client(addr).await;
    let check = || {
        let mut request = health_check();
        let origin = "https://example.com".parse().unwrap();
        request.metadata_mut().insert("origin", origin);
        request
    };
    for _ in 0..2 {
        let reply = client.check(check()).await.unwrap();
        let metadata = reply.metadata();
        assert_eq!(metadata.get("access-control-allow-origin").unwrap(), "*");
        assert_eq!(metadata.get("x-ratelimit-limit").unwrap(), "2");
    }
    let denied = client.check(check()).await.unwrap_err();
    assert_eq!(denied.code(), Code::ResourceExhausted, "{denied:?}");
    let metadata = denied.metadata();
    assert_eq!(metadata.get("access-control-allow-origin").unwrap(), "*");
    server.abort();
}

#[tokio::test]
async fn the_examples_client_sees_the_third_call_refused() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let server = tokio::spawn(example::serve(listener));
    let started = std::time::Instant::now();
    let answers = example::call(addr, 3).await.unwrap();
    server.abort();
    assert_eq!(answers[..2], ["Serving", "Serving"], "{answers:?}");
    // (2 a second: the third waits for the first to leave the window; it
    // is refused when it came within the second, unless the machine
    // stalled.)
    if !support::came_within_a_second(started) {
        return;
    }
    assert!(
        answers[2].starts_with("ResourceExhausted: ") && answers[2].ends_with("(retry-after: 1)"),
        "{answers:?}"
    );
}

/// The example with its budgets in Redis (`--redis`): two servers on one
/// Redis, as two replicas, share the client's budget: its third call,
/// sent to the other server, is refused.
#[tokio::test]
async fn two_of_the_examples_servers_on_one_redis_share_a_budget() {
    let redis = support::redis_server::RedisServer::start();
    let mut addrs = Vec::new();
    let mut servers = Vec::new();
    for _ in 0..2 {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        addrs.push(listener.local_addr().unwrap());
        // (A deadline no busy machine's check outlasts: at the default
        // 50 ms a loaded machine's check may fail open.)
        let store = tower_ratelimit::store::redis::RedisStore::builder()
            .url(redis.url())
            .timeout(std::time::Duration::from_secs(5))
            .build()
            .await
            .unwrap();
        servers.push(tokio::spawn(example::serve_with(listener, store)));
    }
    let started = std::time::Instant::now();
    let mut answers = example::call(addrs[0], 2).await.unwrap();
    answers.extend(example::call(addrs[1], 1).await.unwrap());
    for server in servers {
        server.abort();
    }
    assert_eq!(answers[..2], ["Serving", "Serving"], "{answers:?}");
    // (Refused when the third call came within the second of the first.)
    if !support::came_within_a_second(started) {
        return;
    }
    assert!(
        answers[2].starts_with("ResourceExhausted: ") && answers[2].ends_with("(retry-after: 1)"),
        "{answers:?}"
    );
}

/// The example answers gRPC server reflection, so a generic client (grpcurl)
/// finds the health service without its `.proto` file; no rule names the
/// reflection service, so its calls are never limited and never spend a
/// caller's health-check budget.
#[tokio::test]
async fn the_example_answers_reflection_unlimited() {
    use tonic_reflection::pb::v1::server_reflection_client::ServerReflectionClient;
    use tonic_reflection::pb::v1::server_reflection_request::MessageRequest;
    use tonic_reflection::pb::v1::server_reflection_response::MessageResponse;
    use tonic_reflection::pb::v1::ServerReflectionRequest;

    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let server = tokio::spawn(example::serve(listener));
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut reflection = ServerReflectionClient::new(channel.clone());
    // Three calls, more than the health service's 2 a second.
    for _ in 0..3 {
        let request = ServerReflectionRequest {
            host: String::new(),
            message_request: Some(MessageRequest::ListServices(String::new())),
        };
        let reply = reflection
            .server_reflection_info(futures_util::stream::iter([request]))
            .await
            .unwrap();
        assert!(reply.metadata().get("x-ratelimit-limit").is_none());
        let mut answers = reply.into_inner();
        let answer = answers.message().await.unwrap().unwrap();
        let Some(MessageResponse::ListServicesResponse(list)) = answer.message_response else {
            panic!("{answer:?}");
        };
        let names: Vec<_> = list.service.iter().map(|s| s.name.as_str()).collect();
        assert!(names.contains(&"grpc.health.v1.Health"), "{names:?}");
    }
    // The same client's health checks still have their whole budget.
    let mut health = HealthClient::new(channel);
    let started = std::time::Instant::now();
    for _ in 0..2 {
        assert!(health.check(health_check()).await.is_ok());
    }
    let third = health.check(health_check()).await;
    // (2 a second: the third is refused when it came within the second,
    // as it does unless the machine stalled.)
    if support::came_within_a_second(started) {
        assert_eq!(third.unwrap_err().code(), Code::ResourceExhausted);
    }
    server.abort();
}

/// An identity error's message reaches a real gRPC client exactly, `%`,
/// newline and non-ASCII included (the layer percent-encodes
/// `grpc-message`, as the client decodes it); a request that costs more
/// than the limit is refused with a pushback of -1 (do not retry).
#[tokio::test]
async fn a_real_client_reads_messages_exactly_and_is_told_not_to_retry() {
    use tower_ratelimit::identity::{Identity, IdentityError};
    use tower_ratelimit::{MemoryStore, RateLimitLayer};
    const MESSAGE: &str = "key 100%41 rejected\nretry: nö";
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let rules = health_rules();
    let layer = RateLimitLayer::new(rules, MemoryStore::new())
        .identify(|head: &http::request::Parts| {
            let key = head.headers.get("x-api-key").map(|v| v.as_bytes().to_vec());
            std::future::ready(
                key.map(Identity::new)
                    .ok_or_else(|| IdentityError::new(MESSAGE)),
            )
        })
        .cost(|head| {
            if head.headers.contains_key("x-heavy") {
                3
            } else {
                1
            }
        });
    let health = serving_health().await;
    let server = tokio::spawn(
        tonic::transport::Server::builder()
            .layer(layer)
            .add_service(health)
            .serve_with_incoming(tonic::transport::server::TcpIncoming::from(listener)),
    );
    let mut client = client(addr).await;
    let failed = client.check(health_check()).await.unwrap_err();
    assert_eq!(failed.code(), Code::Unauthenticated);
    assert_eq!(failed.message(), MESSAGE);
    let mut heavy = health_check();
    heavy
        .metadata_mut()
        .insert("x-api-key", "carol".parse().unwrap());
    heavy.metadata_mut().insert("x-heavy", "1".parse().unwrap());
    let refused = client.check(heavy).await.unwrap_err();
    assert_eq!(refused.code(), Code::ResourceExhausted);
    assert_eq!(
        refused.metadata().get("grpc-retry-pushback-ms").unwrap(),
        "-1"
    );
    assert!(refused.metadata().get("retry-after").is_none());
    // The refused request spent nothing: the whole budget is left.
    let mut light = health_check();
    light
        .metadata_mut()
        .insert("x-api-key", "carol".parse().unwrap());
    let reply = client.check(light).await.unwrap();
    assert_eq!(reply.metadata().get("x-ratelimit-remaining").unwrap(), "1");
    server.abort();
}

/// The example knows a client by its `x-api-key`, and one that sends an
/// empty key by its address, as one without a key: otherwise every client
/// sending an empty key would share one budget.
#[test]
fn the_examples_identity_takes_an_empty_key_for_none() {
    use tonic::transport::server::TcpConnectInfo;
    let user = |key: Option<&str>, ip: [u8; 4]| {
        let mut request = http::Request::builder();
        if let Some(key) = key {
            request = request.header("x-api-key", key);
        }
        let mut request = request.body(()).unwrap();
        request.extensions_mut().insert(TcpConnectInfo {
            local_addr: None,
            remote_addr: Some((ip, 50051).into()),
        });
        let (head, ()) = request.into_parts();
        let identity = example::identify(&head).into_inner().unwrap();
        identity.user().to_vec()
    };
    let ip = |ip: [u8; 4]| {
        tower_ratelimit::identity::Identity::from_ip(ip.into())
            .user()
            .to_vec()
    };
    assert_eq!(user(Some(""), [127, 0, 0, 2]), ip([127, 0, 0, 2]));
    assert_eq!(user(Some(""), [127, 0, 0, 3]), ip([127, 0, 0, 3]));
    assert_eq!(user(None, [127, 0, 0, 3]), ip([127, 0, 0, 3]));
    assert_eq!(user(Some("k"), [127, 0, 0, 2]), b"key:k");
    assert_eq!(user(Some("k"), [127, 0, 0, 3]), b"key:k");
}
