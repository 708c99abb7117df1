//! The README's Rust snippets, compiled and run: each is copied below
//! verbatim (between the `// README` markers), and the first test checks
//! that the README still says exactly that, so the two cannot drift apart.

use axum::body::Body;
use http::{Request, StatusCode};
use tower::ServiceExt;
use tower_ratelimit::{ConfigError, RateLimitLayer, Rules};

/// The blocks of `text` between a line `open` and the next line `close`
/// (both trimmed), each less `indent` at the start of its lines.
fn blocks(text: &str, open: &str, close: &str, indent: &str) -> Vec<String> {
    let mut blocks = Vec::new();
    let mut current: Option<Vec<&str>> = None;
    for line in text.lines() {
        match (&mut current, line.trim()) {
            (None, l) if l == open => current = Some(Vec::new()),
            (Some(lines), l) if l == close => {
                blocks.push(lines.join("\n"));
                current = None;
            }
            (Some(lines), _) => lines.push(line.strip_prefix(indent).unwrap_or(line)),
            (None, _) => {}
        }
    }
    blocks
}

/// The README's ```rust blocks, in order.
fn readme_snippets() -> Vec<String> {
    blocks(include_str!("../README.md"), "```rust", "```", "")
}

/// This file's copies of them, in order: the lines between each
/// `// README` marker and the next `// end`, less the copy's indentation.
fn copies() -> Vec<String> {
    blocks(include_str!("readme.rs"), "// README", "// end", "    ")
}

#[test]
fn the_readme_shows_the_code_tested_here() {
    let snippets = readme_snippets();
    assert_eq!(snippets.len(), 2, "README's rust blocks: {snippets:#?}");
    assert_eq!(snippets, copies());
}

/// The first snippet: the axum app with its rules and identity.
#[rustfmt::skip]
fn quickstart() -> Result<axum::Router, ConfigError> {
    // README
    use axum::{routing::get, Router};
    use tower_ratelimit::{identity::Identity, MemoryStore, RateLimitLayer, Rule, Rules};

    let rules = Rules::builder()
        .route(r"^/towns", [Rule::group("default").second(1), Rule::group("admin")]) // admin: no limits
        .route(r"^/multiple", [Rule::new().second(5).minute(100).hour(1000)])
        .exclude_method("OPTIONS")        // OPTIONS (CORS preflights) pass, unlimited
        .build()?;                        // Err(ConfigError) names the bad route, rule and field

    let app: Router = Router::new()
        .route("/towns", get(|| async { "towns" }))
        .layer(RateLimitLayer::new(rules, MemoryStore::new()).identify(|head: &axum::http::request::Parts| {
            let key = head.headers.get("x-api-key").map(|v| v.as_bytes().to_vec());
            async move {
                Ok(match key {
                    Some(k) if k == b"admin-key" => Identity::new(k).with_group("admin"),
                    Some(k) => Identity::new([b"key:".as_slice(), &k].concat()), // a key is never "anonymous"
                    None => Identity::new("anonymous"),
                })
            }
        }).same_body());                  // under axum: keep axum's body type (no box per response)
    // end
    Ok(app)
}

/// The second snippet, compiled but not run: it names the usual Redis
/// address, and the tests touch only the Redis servers they start (the
/// store itself is tested in tests/redis.rs).
#[rustfmt::skip]
#[allow(dead_code)]
async fn on_redis(rules: Rules) -> Result<impl Sized, Box<dyn std::error::Error>> {
    // README
    use std::time::Duration;
    use tower_ratelimit::{store::redis::RedisStore, FailMode};

    let store = RedisStore::builder()
        .url("redis://127.0.0.1:6379")          // or .cluster([...]), .pool(pool), .cluster_pool(pool)
        .timeout(Duration::from_millis(50))     // the deadline of every check
        .build()
        .await?;
    let layer = RateLimitLayer::new(rules, store).fail_mode(FailMode::Open);
    // end
    Ok(layer)
}

async fn get(app: &axum::Router, path: &str, key: Option<&str>) -> (StatusCode, Option<String>) {
    let mut request = Request::get(path);
    if let Some(key) = key {
        request = request.header("x-api-key", key);
    }
    let response = app
        .clone()
        .oneshot(request.body(Body::empty()).unwrap())
        .await
        .unwrap();
    let remaining = response
        .headers()
        .get("x-ratelimit-remaining")
        .map(|v| v.to_str().unwrap().to_owned());
    (response.status(), remaining)
}

#[tokio::test]
async fn the_readme_app_limits_as_the_readme_says() {
    let app = quickstart().unwrap();
    assert_eq!(
        get(&app, "/towns", None).await,
        (StatusCode::OK, Some("0".into()))
    );
    assert_eq!(
        get(&app, "/towns", None).await,
        (StatusCode::TOO_MANY_REQUESTS, Some("0".into()))
    );
    // Another user has a budget of their own; admin has no limits (and no
    // headers).
    assert_eq!(get(&app, "/towns", Some("k")).await.0, StatusCode::OK);
    // A key that reads "anonymous" is not the anonymous user.
    assert_eq!(
        get(&app, "/towns", Some("anonymous")).await.0,
        StatusCode::OK
    );
    for _ in 0..5 {
        assert_eq!(
            get(&app, "/towns", Some("admin-key")).await,
            (StatusCode::OK, None)
        );
    }
}
