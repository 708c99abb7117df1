//! The conformance suite on the in-memory store, and its own properties.

mod support;

use http::StatusCode;
use support::App;
use tower_ratelimit::{MemoryStore, Rule, Rules};

conformance_suite!(async { tower_ratelimit::MemoryStore::new() });

#[tokio::test]
async fn unmatched_and_unlimited_requests_never_touch_the_store() {
    let store = MemoryStore::new();
    let rules = Rules::builder()
        .route(
            "^/towns",
            [Rule::group("default").second(1), Rule::group("admin")],
        )
        .build()
        .unwrap();
    let app = App::new(rules, store.clone());
    for _ in 0..10 {
        assert_eq!(app.get("/elsewhere", "u").await.status, StatusCode::OK);
        assert_eq!(
            app.get_as("/towns", "a", "admin").await.status,
            StatusCode::OK
        );
        assert_eq!(
            app.get_as("/towns", "g", "guest").await.status,
            StatusCode::OK
        );
    }
    assert!(store.is_empty());
    app.get("/towns", "u").await;
    assert_eq!(store.len(), 1);
}
