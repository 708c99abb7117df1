//! Bad input: property tests over the config loader, the identity → key
//! encoder and the forwarding-header parser, and hostile requests through
//! the layer. Nothing may panic, no two identities may share a key, and
//! memory stays within its documented bound.

mod support;

use std::net::IpAddr;
use std::time::Duration;

use axum::body::Body;
use http::{HeaderMap, HeaderValue, Request, StatusCode};
use proptest::prelude::*;
use support::App;
use tower_ratelimit::clock::{Clock, ManualClock, Timestamp};
use tower_ratelimit::identity::{Client, ForwardedIp};
use tower_ratelimit::{
    key, Check, Config, ConfigErrorKind, MemoryStore, Rule, Rules, Store, Window,
};

proptest! {
    #![proptest_config(ProptestConfig { cases: support::proptest_cases(512), ..ProptestConfig::default() })]

    /// Any text: a config or an error, never a panic.
    #[test]
    fn the_config_loader_never_panics_on_text(text in "\\PC{0,400}") {
        let _ = Config::from_toml(&text);
    }

    /// Structured but wild configs: every value out of range is an error
    /// that names a route, never a panic.
    #[test]
    fn the_config_loader_never_panics_on_wild_values(
        path in "[\\^a-z/(\\[*+?\\\\]{0,12}",
        second in proptest::num::i64::ANY,
        millis in proptest::num::u64::ANY,
        limit in proptest::num::i64::ANY,
        block in proptest::num::f64::ANY,
        method in "[A-Za-z \\-]{0,8}",
    ) {
        let text = format!(
            "[[routes]]\npath = {path:?}\nrules = [{{ method = {method:?}, second = {second}, block_time = {block:?}, windows = [{{ millis = {millis}, limit = {limit} }}] }}]\n"
        );
        if let Err(e) = Config::from_toml(&text) {
            prop_assert!(!e.to_string().is_empty());
        }
    }

    /// Any limit text: a table, or an error on one line naming the rule's
    /// `limits` field (or the rule, for too many windows), never a panic.
    #[test]
    fn limit_texts_never_panic(
        text in prop_oneof![
            "\\PC{0,80}",
            "([0-9 -]{0,12}(/| per )[0-9 ]{0,22}(ms|s|sec|min|hours?|DAY|months?|years?|x|\u{e9}t\u{e9})[;,| \n]{0,2}){1,4}",
        ],
    ) {
        match Rules::builder().route("^/a", [Rule::new().limits(&text)]).build() {
            Ok(rules) => prop_assert_eq!(rules.len(), 1),
            Err(e) => {
                let message = e.to_string();
                let named = e.field().is_some_and(|f| f.starts_with("limits"))
                    || matches!(e.kind(), ConfigErrorKind::TooManyWindows);
                prop_assert!(named, "{}", message);
                prop_assert_eq!(e.rule(), Some((0, "default")));
                prop_assert!(!message.contains('\n'), "{}", message);
            }
        }
    }

    /// Distinct identities, even ones built from key syntax, never share a
    /// key part, and a key part never contains a brace or a colon.
    #[test]
    fn identities_never_collide(
        a in proptest::collection::vec(prop_oneof![Just(b'{'), Just(b'}'), Just(b':'), Just(b'%'), Just(b'#'), any::<u8>()], 0..200),
        b in proptest::collection::vec(prop_oneof![Just(b'{'), Just(b'}'), Just(b':'), Just(b'%'), Just(b'#'), any::<u8>()], 0..200),
    ) {
        let (ka, kb) = (key::encode(&a), key::encode(&b));
        let clean = !ka.contains(['{', '}', ':']);
        prop_assert!(clean, "key syntax in {}", ka);
        prop_assert!(ka.len() <= key::MAX_ENCODED + 1);
        if a != b {
            prop_assert_ne!(&ka, &kb);
        }
    }

    /// The forwarding parser, on any header text: no panic, and an untrusted
    /// peer is always its own client.
    #[test]
    fn forwarded_headers_never_panic_or_override_untrusted_peers(
        xff in "[0-9a-f:.,\\[\\] ]{0,80}",
        forwarded in "[a-zA-Z0-9=;,:.\"\\[\\] ]{0,80}",
        peer in any::<[u8; 4]>(),
    ) {
        let identity = ForwardedIp::new(["10.0.0.0/8"]).unwrap();
        let mut headers = HeaderMap::new();
        if let Ok(v) = HeaderValue::from_str(&xff) {
            headers.insert("x-forwarded-for", v);
        }
        if let Ok(v) = HeaderValue::from_str(&forwarded) {
            headers.insert("forwarded", v);
        }
        let peer = IpAddr::from(peer);
        let client = identity.client(peer, &headers);
        if peer.to_string().starts_with("10.") {
            let _ = client;
        } else {
            prop_assert_eq!(client, Client::Ip(peer));
        }
    }
}

#[tokio::test]
async fn hostile_requests_are_answered_not_panicked_on() {
    let rules = Rules::builder()
        .route("^/", [Rule::new().second(5)])
        .build()
        .unwrap();
    let app = App::new(rules, MemoryStore::new());
    let huge = "x".repeat(60 * 1024);
    let requests = vec![
        // A 60 KiB identity.
        Request::builder()
            .uri("/a")
            .header("x-user", &huge)
            .body(Body::empty())
            .unwrap(),
        // Non-UTF-8 identity bytes.
        Request::builder()
            .uri("/a")
            .header(
                "x-user",
                HeaderValue::from_bytes(&[0xff, 0xfe, b'{']).unwrap(),
            )
            .body(Body::empty())
            .unwrap(),
        // The identity header repeated (the first one counts).
        Request::builder()
            .uri("/a")
            .header("x-user", "a")
            .header("x-user", "b")
            .body(Body::empty())
            .unwrap(),
        // A path of 60 KiB (http caps a URI below 64 KiB) and odd bytes.
        Request::builder()
            .uri(format!("/{}%00%ff", "p".repeat(60 * 1024)))
            .header("x-user", "u")
            .body(Body::empty())
            .unwrap(),
        // A non-UTF-8 content type, and a hundred copies of a header.
        {
            let mut r = Request::builder().uri("/a").header("x-user", "u").header(
                "content-type",
                HeaderValue::from_bytes(b"application/grpc\xff").unwrap(),
            );
            for i in 0..100 {
                r = r.header("x-forwarded-for", format!("10.0.0.{i}"));
            }
            r.body(Body::empty()).unwrap()
        },
    ];
    for request in requests {
        let reply = app.send_request(request).await;
        assert!(
            reply.status == StatusCode::OK || reply.status == StatusCode::TOO_MANY_REQUESTS,
            "{reply:?}"
        );
    }
}

/// One million distinct identities against the memory store, 1,000 new
/// ones every millisecond, each budget alive for 10 ms: the table never
/// holds more than about twice the live budgets (plus a small floor per
/// shard), and a sweep empties it once their windows have passed.
#[test]
fn a_million_identities_stay_within_the_memory_bound() {
    let clock = ManualClock::new(Timestamp::from_micros(1_767_225_600_000_000));
    let store = MemoryStore::with_clock(clock.clone());
    let windows: std::sync::Arc<[Window]> =
        [Window::new(Duration::from_millis(10), 1).unwrap()].into();
    let mut largest = 0;
    for i in 0..1_000_000u32 {
        if i % 1000 == 0 {
            clock.advance(Duration::from_millis(1));
            largest = largest.max(store.len());
        }
        let check = Check::new(format!("r:{i}"), windows.clone()).at(clock.now());
        let decision = futures_util::FutureExt::now_or_never(store.check(check))
            .unwrap()
            .unwrap();
        assert!(decision.allowed());
    }
    // Live: about 10,000 budgets. Floor: 64 per shard, at most 1,024 shards.
    assert!(
        largest <= 2 * 11_000 + 64 * 1024,
        "the table grew to {largest}"
    );
    clock.advance(Duration::from_millis(10));
    assert_eq!(store.sweep(), 0);
    assert!(store.is_empty());
}

/// The same through the layer, as hostile traffic arrives: a million
/// requests, each from a new identity (1,000 new ones every millisecond of
/// the injected clock, each budget alive for 10 ms). Every one is allowed,
/// and the layer's store never holds more than about twice the live
/// budgets.
#[tokio::test]
async fn a_million_identities_through_the_layer_stay_within_the_bound() {
    let store = MemoryStore::new();
    let rules = Rules::builder()
        .route("^/", [Rule::new().per(Duration::from_millis(10), 1)])
        .build()
        .unwrap();
    let app = App::new(rules, store.clone());
    let mut largest = 0;
    for i in 0..1_000_000u32 {
        if i % 1000 == 0 {
            app.advance_ms(1);
            largest = largest.max(store.len());
        }
        let reply = app.get("/a", &format!("attacker-{i}")).await;
        assert_eq!(reply.status, StatusCode::OK, "request {i}");
    }
    assert_eq!(app.inner_calls(), 1_000_000);
    // (The clone kept here is the layer's store: it sees the live budgets.)
    assert!(largest >= 9_000, "the table held only {largest}");
    assert!(
        largest <= 2 * 11_000 + 64 * 1024,
        "the table grew to {largest}"
    );
}
