//! Building rule tables: the TOML format, and every error it can raise.

use std::time::Duration;

use tower_ratelimit::{Algorithm, Config, ConfigErrorKind, Route, Rule, Rules};

const ISSUE_EXAMPLE: &str = r#"
[groups]                 # read by the example server: API key -> group; other keys are "default"
"admin-key" = "admin"

[[routes]]
path = "^/towns"
rules = [
  { group = "default", second = 1 },
  { group = "admin" },
]

[[routes]]
path = "^/multiple"
rules = [{ second = 5, minute = 100, hour = 1000 }]   # group defaults to "default"
"#;

#[test]
fn the_documented_example_loads() {
    let config = Config::from_toml(ISSUE_EXAMPLE).unwrap();
    assert_eq!(
        config.groups().get("admin-key").map(String::as_str),
        Some("admin")
    );
    assert_eq!(config.rules().len(), 2);
}

#[test]
fn the_example_config_loads() {
    let config = Config::from_toml(include_str!("../examples/ratelimit.toml")).unwrap();
    assert_eq!(config.rules().len(), 8);
    assert_eq!(config.rules().warnings(), []);
    assert_eq!(
        config.groups().get("partner-key").map(String::as_str),
        Some("partner")
    );
}

#[test]
fn every_rule_field_loads() {
    let rules = Rules::from_toml(
        r#"
        [[routes]]
        path = "^/all"
        rules = [
          { group = "a", method = "post", day = 10, month = 100, zone = "z", algorithm = "sliding-log" },
          { group = "a", windows = [{ seconds = 10, limit = 5 }, { millis = 250, limit = 1 }] },
        ]
        "#,
    )
    .unwrap();
    assert_eq!(rules.len(), 1);
}

fn error(text: &str) -> tower_ratelimit::ConfigError {
    Config::from_toml(text).unwrap_err()
}

#[test]
fn unknown_fields_are_rejected_and_named() {
    let err = error(
        r#"
        [[routes]]
        path = "^/a"
        rules = [{ secnd = 1 }]
        "#,
    );
    assert!(matches!(err.kind(), ConfigErrorKind::Parse(_)));
    let text = err.to_string();
    assert!(text.contains("secnd") && text.contains("line 4"), "{text}");

    let err = error("[[routes]]\npath = \"^/a\"\nlimit = 3\n");
    assert!(err.to_string().contains("limit"), "{err}");
    let err = error("rutes = []\n");
    assert!(err.to_string().contains("rutes"), "{err}");
    assert_eq!(err.route(), None);

    // In a route's fields, the route and the rule are named as well as
    // the line: here the second route's second rule, and a value of the
    // wrong type in the first route.
    let err = error(
        r#"
        [[routes]]
        path = "^/a"
        rules = [{ second = 1 }]

        [[routes]]
        path = "^/b"
        rules = [{ minute = 1 }, { group = "g", hour = 1, methd = "POST" }]
        "#,
    );
    assert_eq!(err.route(), Some((1, "^/b")));
    assert_eq!(err.rule(), Some((1, "g")));
    let text = err.to_string();
    assert!(
        text.contains("route #1 `^/b`, rule #1 (group `g`)")
            && text.contains("methd")
            && text.contains("line 8"),
        "{text}"
    );
    let err = error("[[routes]]\npath = \"^/a\"\nshadow = \"yes\"\nrules = [{ second = 1 }]\n");
    assert_eq!(err.route(), Some((0, "^/a")));
    assert_eq!(err.rule(), None);
    // A value of the wrong type where a name is read: shown as written.
    let err = error("[[routes]]\npath = \"^/a\"\nrules = [{ group = 5, second = 1 }]\n");
    assert_eq!(err.rule(), Some((0, "5")));
    // A path that is no string is no pattern: the route is its number.
    let err = error("[[routes]]\npath = 7\nrules = [{ second = 1 }]\n");
    assert_eq!(err.route(), Some((0, "")));
    assert!(err.to_string().contains("route #0, field `path`"), "{err}");
}

/// A field the parser refuses (unknown, or of the wrong type) is named by
/// `field()` too, as one a range check refuses is: the rule's, the
/// route's, or one in the route-wide limit; a route without `path` says
/// so, not an empty pattern.
#[test]
fn parse_errors_name_the_field() {
    let route = |fields: &str| format!("[[routes]]\npath = \"^/a\"\n{fields}\n");
    for (fields, field) in [
        ("rules = [{ secnd = 1 }]", "secnd"),
        ("rules = [{ second = 1.5 }]", "second"),
        ("rules = [{ second = \"5\" }]", "second"),
        (
            "rules = [{ group = \"g\", minute = 1, methd = \"POST\" }]",
            "methd",
        ),
        ("shadow = \"yes\"\nrules = [{ second = 1 }]", "shadow"),
        ("limit = 3", "limit"),
        (
            "global = { second = 2, cost = 1 }\nrules = [{ minute = 10 }]",
            "global.cost",
        ),
        (
            "global = { second = \"2\" }\nrules = [{ minute = 10 }]",
            "global.second",
        ),
        // Another table is wrong whole: not a key inside it.
        ("rules = { second = 1 }", "rules"),
        ("rules = [{ second = 1 }]\n[routes.extra]\nx = 1", "extra"),
        ("rules = [{ second = 1, cost = 0.5 }]", "cost"),
        (
            "rules = [{ windows = [{ seconds = 1, limit = 1 }, { millis = 1.5, limit = 1 }] }]",
            "windows[1]",
        ),
    ] {
        let err = error(&route(fields));
        assert!(
            matches!(err.kind(), ConfigErrorKind::Parse(_)),
            "{fields}: {err}"
        );
        assert_eq!(err.field(), Some(field), "{fields}: {err}");
        assert!(
            err.to_string().contains(&format!("field `{field}`")),
            "{err}"
        );
        // What the field takes, not a Rust type's name.
        assert!(!err.to_string().contains("expected i64"), "{err}");
        assert!(!err.to_string().contains("expected u64"), "{err}");
    }
    let err = error("[[routes]]\npath = 5\nrules = [{ second = 1 }]\n");
    assert_eq!(err.field(), Some("path"), "{err}");
    let err = error("[[routes]]\nrules = [{ second = 1 }]\n");
    assert_eq!(err.field(), Some("path"), "{err}");
    let text = err.to_string();
    assert!(
        text.contains("route #0, field `path`") && !text.contains("``"),
        "{text}"
    );
}

#[test]
fn invalid_regex_names_the_route() {
    let err = error(
        "[[routes]]\npath = \"^/ok\"\nrules = [{ second = 1 }]\n[[routes]]\npath = \"^/bad(\"\n",
    );
    assert!(matches!(err.kind(), ConfigErrorKind::InvalidRegex(_)));
    assert_eq!(err.route(), Some((1, "^/bad(")));
    assert_eq!(err.field(), Some("path"));
    assert!(
        err.to_string().contains("route #1 `^/bad(`, field `path`"),
        "{err}"
    );
}

#[test]
fn zero_and_negative_limits_name_route_rule_and_field() {
    let err = error("[[routes]]\npath = \"^/a\"\nrules = [{ group = \"g\", minute = 0 }]\n");
    assert!(matches!(err.kind(), ConfigErrorKind::InvalidLimit(0)));
    assert_eq!(err.route(), Some((0, "^/a")));
    assert_eq!(err.rule(), Some((0, "g")));
    assert_eq!(err.field(), Some("minute"));
    assert!(err.to_string().contains("field `minute`"), "{err}");

    let err = error("[[routes]]\npath = \"^/a\"\nrules = [{ second = -3 }]\n");
    assert!(matches!(err.kind(), ConfigErrorKind::InvalidLimit(-3)));

    let err =
        error("[[routes]]\npath = \"^/a\"\nrules = [{ windows = [{ seconds = 5, limit = 0 }] }]\n");
    assert_eq!(err.field(), Some("windows[0]"));

    let err = Rules::builder()
        .route("^/a", [Rule::new().hour(0)])
        .build()
        .unwrap_err();
    assert_eq!(err.field(), Some("hour"));
}

/// A rule's `cost` that no request could ever pass, or that limits
/// nothing, is refused, named by route, rule and field.
#[test]
fn costs_that_never_pass_are_rejected_and_named() {
    let at = |text: &str| {
        let err = error(&format!("[[routes]]\npath = \"^/a\"\nrules = [{text}]\n"));
        assert_eq!(err.route(), Some((0, "^/a")), "{err}");
        assert_eq!(err.field(), Some("cost"), "{err}");
        err
    };
    let err = at("{ minute = 10, cost = -1 }");
    assert!(
        matches!(err.kind(), ConfigErrorKind::InvalidCost(_)),
        "{err}"
    );
    assert!(err.to_string().contains("-1 is not a cost"), "{err}");
    let err = at("{ second = 3, minute = 10, cost = 4 }");
    assert!(
        err.to_string()
            .contains("4 is more than the limit of 3 per 1s: no request could ever pass"),
        "{err}"
    );
    let err = at("{ minute = 5000, cost = 1001 }");
    assert!(err.to_string().contains("sliding log"), "{err}");
    let err = at("{ group = \"admin\", cost = 2 }");
    assert!(matches!(err.kind(), ConfigErrorKind::NoEffect), "{err}");
    assert!(err.to_string().contains("a cost needs windows"), "{err}");
    // A route-wide limit below the cost: no request could pass either.
    let err = error(
        "[[routes]]\npath = \"^/a\"\nglobal = { second = 2 }\nrules = [{ minute = 10, cost = 3 }]\n",
    );
    assert!(
        matches!(err.kind(), ConfigErrorKind::InvalidCost(_)),
        "{err}"
    );
    assert!(
        err.to_string()
            .contains("3 is more than the route-wide limit of 2 per 1s"),
        "{err}"
    );
    // A route-wide limit has windows only: in a file, `cost` is an
    // unknown field there; in code, a field it does not take.
    let err = error("[[routes]]\npath = \"^/a\"\nglobal = { second = 2, cost = 1 }\nrules = [{ minute = 10 }]\n");
    assert!(err.to_string().contains("unknown field `cost`"), "{err}");
    let err = Rules::builder()
        .add_route(
            tower_ratelimit::Route::new("^/a")
                .rules([Rule::new().minute(10)])
                .global(Rule::new().second(2).cost(1)),
        )
        .build()
        .unwrap_err();
    assert_eq!(err.field(), Some("global.cost"), "{err}");
    // In range: a table, from the file as from code.
    let text = "[[routes]]\npath = \"^/a\"\nrules = [{ minute = 5000, cost = 1000 }, { group = \"b\", minute = 10, cost = 0, algorithm = \"token-bucket\" }]\n";
    assert!(Config::from_toml(text).is_ok());
    let err = Rules::builder()
        .route("^/a", [Rule::new().second(1).cost(2)])
        .build()
        .unwrap_err();
    assert_eq!(err.field(), Some("cost"));
}

#[test]
fn limits_beyond_u32_are_rejected() {
    let err = error("[[routes]]\npath = \"^/a\"\nrules = [{ second = 5000000000 }]\n");
    assert!(matches!(
        err.kind(),
        ConfigErrorKind::InvalidLimit(5_000_000_000)
    ));
    // (The message gives the range, not only the lower bound.)
    assert!(
        err.to_string()
            .ends_with("limit must be a whole number from 1 to 4294967295, got 5000000000"),
        "{err}"
    );
}

#[test]
fn duplicate_windows_are_rejected() {
    let err = error(
        "[[routes]]\npath = \"^/a\"\nrules = [{ second = 1, windows = [{ seconds = 1, limit = 5 }] }]\n",
    );
    assert!(matches!(err.kind(), ConfigErrorKind::DuplicateWindow));
    assert_eq!(err.field(), Some("windows[0]"));
    let err = Rules::builder()
        .route(
            "^/a",
            [Rule::new().minute(5).per(Duration::from_secs(60), 3)],
        )
        .build()
        .unwrap_err();
    assert!(matches!(err.kind(), ConfigErrorKind::DuplicateWindow));
}

#[test]
fn bad_window_durations_are_rejected() {
    let config = |window: &str| {
        format!("[[routes]]\npath = \"^/a\"\nrules = [{{ windows = [{window}] }}]\n")
    };
    let err = error(&config("{ seconds = 0, limit = 1 }"));
    assert!(
        matches!(err.kind(), ConfigErrorKind::InvalidDuration),
        "{err}"
    );
    for window in ["{ limit = 1 }", "{ seconds = 1, millis = 5, limit = 1 }"] {
        let err = error(&config(window));
        assert!(
            matches!(err.kind(), ConfigErrorKind::WindowLength),
            "{window}: {err}"
        );
        assert_eq!(err.field(), Some("windows[0]"));
        assert!(
            err.to_string()
                .ends_with("a window takes exactly one of `seconds` and `millis`"),
            "{err}"
        );
    }
    // A fraction of a second points to `millis`; a negative count says
    // what `seconds` takes.
    for (window, says) in [
        ("{ seconds = 0.5, limit = 1 }", "millis = 500"),
        ("{ seconds = -1, limit = 1 }", "at least 1, got -1"),
    ] {
        let err = error(&config(window));
        assert!(matches!(err.kind(), ConfigErrorKind::Parse(_)), "{err}");
        let text = err.to_string();
        assert!(
            text.contains("a whole number of") && text.contains(says),
            "{window}: {text}"
        );
    }
}

#[test]
fn empty_patterns_are_rejected() {
    let err = error("[[routes]]\npath = \"\"\nrules = [{ second = 1 }]\n");
    assert!(matches!(err.kind(), ConfigErrorKind::EmptyPattern), "{err}");
    assert_eq!(err.route(), Some((0, "")));
    assert!(err.to_string().contains("write `^/`"), "{err}");
    let err = error("[exclude]\npaths = [\"^/health\", \"\"]\n");
    assert!(matches!(err.kind(), ConfigErrorKind::EmptyPattern), "{err}");
    assert_eq!(err.field(), Some("exclude.paths[1]"));
}

#[test]
fn unreachable_rules_are_rejected() {
    let err = Rules::builder()
        .route("^/a", [Rule::new().second(1), Rule::new().second(2)])
        .build()
        .unwrap_err();
    assert!(matches!(err.kind(), ConfigErrorKind::UnreachableRule));
    assert_eq!(err.rule(), Some((1, "default")));
    // A method-specific rule after a catch-all one for the same group.
    let err = Rules::builder()
        .route(
            "^/a",
            [Rule::new().second(1), Rule::new().method("POST").second(2)],
        )
        .build()
        .unwrap_err();
    assert!(matches!(err.kind(), ConfigErrorKind::UnreachableRule));
    // The other order is fine, and so are other groups.
    Rules::builder()
        .route(
            "^/a",
            [
                Rule::new().method("POST").second(1),
                Rule::new().second(2),
                Rule::group("x"),
            ],
        )
        .build()
        .unwrap();
}

#[test]
fn bad_methods_and_empty_names_are_rejected() {
    let err = Rules::builder()
        .route("^/a", [Rule::new().method("GE T").second(1)])
        .build()
        .unwrap_err();
    assert!(matches!(err.kind(), ConfigErrorKind::InvalidMethod(m) if m == "GE T"));
    assert_eq!(err.field(), Some("method"));
    assert!(
        err.to_string()
            .contains("`GE T` is not a valid HTTP method"),
        "{err}"
    );
    let err = Rules::builder()
        .route("^/a", [Rule::group("")])
        .build()
        .unwrap_err();
    assert!(matches!(err.kind(), ConfigErrorKind::EmptyName));
    let err = Rules::builder()
        .route("^/a", [Rule::new().zone("").second(1)])
        .build()
        .unwrap_err();
    assert_eq!(err.field(), Some("zone"));
}

#[test]
fn rules_of_one_zone_must_agree_on_algorithm_and_window_lengths() {
    use tower_ratelimit::Algorithm;
    // Same windows, other limits, another group: one budget, allowed.
    let ok = Rules::builder()
        .route("^/a", [Rule::new().zone("z").minute(2).hour(10)])
        .route(
            "^/b",
            [
                Rule::group("big").zone("z").minute(20).hour(100),
                Rule::new().zone("z").minute(5).hour(50),
                // An unlimited group names the zone but keeps no counts.
                Rule::group("free").zone("z"),
            ],
        )
        .build();
    assert!(ok.is_ok(), "{:?}", ok.err());
    // Other window lengths: the check of one route would drop the counts
    // the other keeps. The error names the second route's rule and field.
    let err = Rules::builder()
        .route("^/a", [Rule::new().zone("z").minute(2)])
        .route("^/b", [Rule::new().zone("z").second(5)])
        .build()
        .unwrap_err();
    assert!(matches!(err.kind(), ConfigErrorKind::ZoneWindows));
    assert_eq!(err.field(), Some("zone"));
    assert!(err.to_string().contains("^/b"), "{err}");
    let err = Rules::builder()
        .route("^/a", [Rule::new().zone("z").minute(2)])
        .route("^/b", [Rule::new().zone("z").minute(2).hour(9)])
        .build()
        .unwrap_err();
    assert!(matches!(err.kind(), ConfigErrorKind::ZoneWindows));
    let err = Rules::builder()
        .route("^/a", [Rule::new().zone("z").minute(2)])
        .route(
            "^/b",
            [Rule::new()
                .zone("z")
                .minute(2)
                .algorithm(Algorithm::TokenBucket)],
        )
        .build()
        .unwrap_err();
    assert!(matches!(err.kind(), ConfigErrorKind::ZoneAlgorithm));
    assert_eq!(err.field(), Some("zone"));
    // An unlimited rule naming the zone counts nothing: no conflict.
    let ok = Rules::builder()
        .route(
            "^/a",
            [
                Rule::group("admin").zone("z"),
                Rule::new()
                    .zone("z")
                    .minute(10)
                    .algorithm(Algorithm::TokenBucket),
            ],
        )
        .build();
    assert!(ok.is_ok(), "{:?}", ok.err());
}

#[test]
fn two_routes_with_one_pattern_are_rejected() {
    let err = Rules::builder()
        .route("^/a", [Rule::new().minute(2)])
        .route("^/b", [Rule::new().minute(2)])
        .route("^/a", [Rule::group("pro").hour(9)])
        .build()
        .unwrap_err();
    assert!(matches!(err.kind(), ConfigErrorKind::DuplicateRoute));
    assert_eq!(err.route(), Some((2, "^/a")));
}

#[test]
fn a_route_wide_limit_is_counted_one_way() {
    use tower_ratelimit::{Algorithm, Route};
    let route = || Route::new("^/a").global(Rule::new().second(100));
    let ok = Rules::builder()
        .add_route(route().rules([Rule::new().second(1), Rule::group("pro").minute(9)]))
        .build();
    assert!(ok.is_ok(), "{:?}", ok.err());
    let err = Rules::builder()
        .add_route(
            route().rules([
                Rule::new().second(1),
                Rule::group("pro")
                    .second(5)
                    .algorithm(Algorithm::TokenBucket),
            ]),
        )
        .build()
        .unwrap_err();
    assert!(matches!(err.kind(), ConfigErrorKind::GlobalAlgorithm));
    assert_eq!(err.rule(), Some((1, "pro")));
    assert_eq!(err.field(), Some("algorithm"));
    // The route-wide limit itself has only windows.
    let err = Rules::builder()
        .add_route(
            Route::new("^/a")
                .global(Rule::new().second(100).block_time(Duration::from_secs(9)))
                .rules([Rule::new().second(1)]),
        )
        .build()
        .unwrap_err();
    assert!(matches!(err.kind(), ConfigErrorKind::GlobalField));
    assert_eq!(err.field(), Some("global.block_time"));
}

#[test]
fn too_many_windows_are_rejected() {
    let mut rule = Rule::new();
    for s in 1..=9 {
        rule = rule.per(Duration::from_secs(s), 10);
    }
    let err = Rules::builder().route("^/a", [rule]).build().unwrap_err();
    assert!(matches!(err.kind(), ConfigErrorKind::TooManyWindows));
    // Named by the first window too many.
    assert_eq!(err.field(), Some("windows[8]"));
    assert!(
        err.to_string()
            .contains("field `windows[8]`: a rule may have at most 8 windows"),
        "{err}"
    );
}

#[test]
fn malformed_toml_is_an_error_not_a_panic() {
    for text in [
        "[[routes]",
        "routes = 5",
        "[[routes]]\npath = 3",
        "\u{0}",
        "[[routes]]\nrules = []",
    ] {
        assert!(Config::from_toml(text).is_err(), "{text:?}");
    }
}

#[test]
fn route_wide_limits_need_windows_and_no_zones() {
    let err = error("[[routes]]\npath = \"^/a\"\nglobal = {}\nrules = [{ minute = 5 }]\n");
    assert!(
        matches!(err.kind(), ConfigErrorKind::EmptyGlobal),
        "{err:?}"
    );
    assert_eq!(err.route(), Some((0, "^/a")));
    assert!(
        err.to_string()
            .contains("route-wide limit needs at least one window"),
        "{err}"
    );

    let err = error(
        "[[routes]]\npath = \"^/ok\"\nrules = [{ second = 1 }]\n\n[[routes]]\npath = \"^/b\"\nglobal = { second = 20 }\nrules = [{ zone = \"z\", minute = 5 }]\n",
    );
    assert!(
        matches!(err.kind(), ConfigErrorKind::ZoneWithGlobal),
        "{err:?}"
    );
    assert_eq!(err.route(), Some((1, "^/b")));
    assert!(err.to_string().contains("route #1 `^/b`"), "{err}");

    // The same through the builder.
    let err = Rules::builder()
        .add_route(
            tower_ratelimit::Route::new("^/c")
                .rules([Rule::new().minute(5).zone("z")])
                .global(Rule::new().second(20)),
        )
        .build()
        .unwrap_err();
    assert!(
        matches!(err.kind(), ConfigErrorKind::ZoneWithGlobal),
        "{err:?}"
    );
    let err = Rules::builder()
        .add_route(
            tower_ratelimit::Route::new("^/d")
                .rules([Rule::new().minute(5)])
                .global(Rule::new()),
        )
        .build()
        .unwrap_err();
    assert!(
        matches!(err.kind(), ConfigErrorKind::EmptyGlobal),
        "{err:?}"
    );
}

#[test]
fn limit_texts_load_from_code_and_config() {
    for text in [
        "10/second",
        "10 per second; 100/minute",
        "5/10 seconds, 1000/day | 20/2min",
        "1/ms;2/SECONDS;3 PER Hour;4/d;5/month;6/year",
        " 10/second ; ",
    ] {
        Rules::builder()
            .route("^/a", [Rule::new().limits(text)])
            .build()
            .unwrap_or_else(|e| panic!("{text}: {e}"));
    }
    let config = Config::from_toml(
        r#"
        [[routes]]
        path = "^/api"
        rules = [{ group = "free", limits = "10/second; 500 per hour" }, { limits = "100/minute" }]
        global = { limits = "1000/second" }
        "#,
    )
    .unwrap();
    assert_eq!(config.rules().len(), 1);
}

#[test]
fn unreadable_limit_texts_are_rejected_and_named() {
    let route = |text: &str| {
        Rules::builder()
            .route("^/ok", [Rule::new().second(1)])
            .route(
                "^/api",
                [Rule::new().second(1), Rule::group("g").limits(text)],
            )
            .build()
            .unwrap_err()
    };
    for (text, field, says) in [
        ("10/fortnight", "limits[0]", "unknown unit `fortnight`"),
        (
            "5/second; ten/minute",
            "limits[1]",
            "`ten` is not a whole number",
        ),
        ("10 seconds", "limits[0]", "expected `<limit>/<unit>`"),
        ("10/0 seconds", "limits[0]", "`0` is not a length of window"),
        (
            "10/0.5 seconds",
            "limits[0]",
            "`0.5` is not a whole number of units",
        ),
        (
            "99999999999999999999/second",
            "limits[0]",
            "is too large (at most 4294967295)",
        ),
        (
            "1/99999999999999999999 s",
            "limits[0]",
            "longer than any window",
        ),
        ("", "limits", "holds no limit"),
        (
            " ; ,",
            "limits[0]",
            "has an empty item (it starts with a separator",
        ),
        (
            ";10/s",
            "limits[0]",
            "has an empty item (it starts with a separator",
        ),
        (
            "10/second;;20/minute",
            "limits[1]",
            "has an empty item (two separators in a row",
        ),
        ("+1/second", "limits[0]", "`+1` is not a whole number"),
        (
            "1/second\n; 2/x\n{key}",
            "limits[1]",
            "unknown unit `x\\n{key}`",
        ),
    ] {
        let err = route(text);
        assert!(
            matches!(err.kind(), ConfigErrorKind::LimitText(_)),
            "{text:?}: {err}"
        );
        assert_eq!(err.route(), Some((1, "^/api")), "{text:?}");
        assert_eq!(err.rule(), Some((1, "g")), "{text:?}");
        assert_eq!(err.field(), Some(field), "{text:?}: {err}");
        let message = err.to_string();
        assert!(message.contains(says), "{text:?}: {message}");
        assert!(!message.contains('\n'), "{text:?}: {message}");
    }
    // Limits and lengths out of range are the windows' own errors.
    for (text, field) in [
        ("0/second", "limits[0]"),
        ("1/second; -3/minute", "limits[1]"),
    ] {
        let err = route(text);
        assert!(
            matches!(err.kind(), ConfigErrorKind::InvalidLimit(_)),
            "{err}"
        );
        assert_eq!(err.field(), Some(field));
    }
    let err = route("1/11 years");
    assert!(
        matches!(err.kind(), ConfigErrorKind::InvalidDuration),
        "{err}"
    );
    // Windows already given another way.
    let err = Rules::builder()
        .route(
            "^/a",
            [Rule::new().minute(5).limits("10/second; 6 per minute")],
        )
        .build()
        .unwrap_err();
    assert!(
        matches!(err.kind(), ConfigErrorKind::DuplicateWindow),
        "{err}"
    );
    assert_eq!(err.field(), Some("limits[1]"));
    // And from a file, with the route and rule named.
    let err = error("[[routes]]\npath = \"^/a\"\nrules = [{ limits = \"3/minutes; 2/eon\" }]\n");
    assert_eq!(
        err.to_string(),
        "invalid rate-limit configuration: route #0 `^/a`, rule #0 (group `default`), \
         field `limits[1]`: cannot read `2/eon`: unknown unit `eon` (expected millisecond, \
         second, minute, hour, day, month or year)"
    );
}

/// Limits an algorithm cannot count exactly are build errors naming the
/// window: a sliding log records an entry per request (so at most
/// `MAX_LOG_LIMIT` a window: a byte budget would hold an entry per byte),
/// a token bucket refills at most one a microsecond (a larger limit would
/// silently refill slower than configured).
#[test]
fn limits_beyond_what_the_algorithm_counts_are_rejected() {
    use tower_ratelimit::rules::MAX_LOG_LIMIT;
    let err =
        error("[[routes]]\npath = \"^/up\"\nrules = [{ group = \"g\", second = 10000000 }]\n");
    assert!(matches!(
        err.kind(),
        ConfigErrorKind::LimitForAlgorithm(Algorithm::SlidingLog)
    ));
    assert_eq!(err.route(), Some((0, "^/up")));
    assert_eq!(err.rule(), Some((0, "g")));
    // (Named as the file wrote it.)
    assert_eq!(err.field(), Some("second"));
    assert!(err.to_string().contains("token bucket"), "{err}");
    // The largest is fine, and so is the same limit for another algorithm.
    let ok = |rule: Rule| Rules::builder().route("^/up", [rule]).build();
    assert!(ok(Rule::new().second(MAX_LOG_LIMIT)).is_ok());
    assert!(ok(Rule::new()
        .second(10_000_000)
        .algorithm(Algorithm::SlidingWindow))
    .is_ok());
    // A route-wide window is counted with the rule's algorithm.
    let err = Rules::builder()
        .add_route(
            Route::new("^/up")
                .rules([Rule::new().second(5)])
                .global(Rule::new().minute(MAX_LOG_LIMIT + 1)),
        )
        .build()
        .unwrap_err();
    assert_eq!(err.field(), Some("global"));
    let err =
        error("[[routes]]\npath = \"^/up\"\nrules = [{ limits = \"5/second; 1000001/hour\" }]\n");
    assert_eq!(err.field(), Some("limits[1]"), "{err}");
    // An unlimited group on that route never counts the route-wide budget.
    let built = Rules::builder()
        .add_route(
            Route::new("^/up")
                .rules([
                    Rule::new().second(5).algorithm(Algorithm::SlidingWindow),
                    Rule::group("internal"),
                ])
                .global(Rule::new().hour(2_000_000)),
        )
        .build();
    assert!(built.is_ok(), "{:?}", built.err());

    let err = error(
        "[[routes]]\npath = \"^/up\"\nrules = [{ algorithm = \"token-bucket\", second = 2000000 }]\n",
    );
    assert!(matches!(
        err.kind(),
        ConfigErrorKind::LimitForAlgorithm(Algorithm::TokenBucket)
    ));
    // (Named as a file spells it.)
    assert!(
        err.to_string()
            .contains("`token-bucket` refills at most one request per microsecond"),
        "{err}"
    );
    assert!(ok(Rule::new()
        .second(1_000_000)
        .algorithm(Algorithm::TokenBucket))
    .is_ok());
    assert!(ok(Rule::new()
        .minute(2_000_000)
        .algorithm(Algorithm::TokenBucket))
    .is_ok());
}

/// Fields that could never act are errors, not silently ignored: a block
/// time on a rule without windows, a route-wide limit on a route whose
/// rules are all unlimited.
#[test]
fn fields_without_effect_are_rejected() {
    let err = error("[[routes]]\npath = \"^/a\"\nrules = [{ group = \"g\", block_time = 10 }]\n");
    assert!(matches!(err.kind(), ConfigErrorKind::NoEffect));
    assert_eq!(err.field(), Some("block_time"));
    assert_eq!(err.rule(), Some((0, "g")));
    assert!(
        err.to_string()
            .ends_with("has no effect here: a block time needs windows on its rule"),
        "{err}"
    );
    let err = Rules::builder()
        .add_route(
            Route::new("^/g")
                .rules([Rule::group("admin")])
                .global(Rule::new().minute(1)),
        )
        .build()
        .unwrap_err();
    assert!(matches!(err.kind(), ConfigErrorKind::NoEffect));
    assert_eq!(err.route(), Some((0, "^/g")));
    assert_eq!(err.field(), Some("global"));
    assert!(
        err.to_string().ends_with(
            "has no effect here: a route-wide limit needs a rule with windows on its route"
        ),
        "{err}"
    );

    // A route without rules: every request goes on to the next route.
    for text in [
        "[[routes]]\npath = \"^/a\"\n",
        "[[routes]]\npath = \"^/a\"\nrules = []\n",
    ] {
        let err = error(text);
        assert!(matches!(err.kind(), ConfigErrorKind::NoEffect), "{err}");
        assert_eq!(err.route(), Some((0, "^/a")));
        assert_eq!(err.field(), Some("rules"));
        assert!(err.to_string().contains("`exclude`"), "{err}");
    }
    let err = Rules::builder()
        .route("^/a", [Rule::new().second(1)])
        .route("^/b", [])
        .build()
        .unwrap_err();
    assert_eq!(err.route(), Some((1, "^/b")));
    assert_eq!(err.field(), Some("rules"));
}

/// A limit that is not an integer says what a limit is, not a type name.
#[test]
fn limits_that_are_not_integers_say_what_a_limit_is() {
    for limit in ["1.5", "\"10\"", "true", "99999999999999999999"] {
        let err = error(&format!(
            "[[routes]]\npath = \"^/a\"\nrules = [{{ second = {limit} }}]\n"
        ));
        assert!(
            err.to_string()
                .contains("a limit: a whole number from 1 to 4294967295"),
            "{limit}: {err}"
        );
    }
    let err = error(
        "[[routes]]\npath = \"^/a\"\nrules = [{ windows = [{ seconds = 5, limit = 2.5 }] }]\n",
    );
    assert!(err.to_string().contains("a whole number from 1"), "{err}");
    // A fractional length in a limit text gets the same in milliseconds.
    let err = error("[[routes]]\npath = \"^/a\"\nrules = [{ limits = \"5/1.5 seconds\" }]\n");
    assert!(err.to_string().contains("write `1500 ms`"), "{err}");
    let err = error("[[routes]]\npath = \"^/a\"\nrules = [{ limits = \"5/0.5 minute\" }]\n");
    assert!(err.to_string().contains("write `30000 ms`"), "{err}");
    // (Exact, from the digits: no float's rounding.)
    let hint = |text: &str| {
        error(&format!(
            "[[routes]]\npath = \"^/a\"\nrules = [{{ limits = \"{text}\" }}]\n"
        ))
        .to_string()
    };
    assert!(hint("5/1.001 s").contains("write `1001 ms`"));
    assert!(hint("5/2.25 min").contains("write `135000 ms`"));
    let not_whole = hint("5/1.0000000000000000001 s");
    assert!(!not_whole.contains("write `"), "{not_whole}");
    assert!(not_whole.contains("nor of milliseconds"), "{not_whole}");
    assert!(hint("5/1.5 ms").contains("nor of milliseconds"));
    for odd in [
        "5/1.5.5 s",
        "5/,5 s",
        "5/1e3 s",
        "5/99999999999999999999.5 years",
    ] {
        assert!(hint(odd).contains("cannot read"), "{odd}");
    }
}

/// `[groups]` entries with an empty key (which names no one) or an empty
/// group (which no rule can name) are errors.
#[test]
fn empty_group_entries_are_rejected() {
    for entry in [
        "\"k\" = \"\"",
        "\"\" = \"admin\"",
        "\" \" = \"admin\"",
        "\"k\" = \"  \"",
    ] {
        let err = error(&format!(
            "[groups]\n{entry}\n\n[[routes]]\npath = \"^/a\"\nrules = [{{ group = \"admin\" }}]\n"
        ));
        assert!(
            matches!(err.kind(), ConfigErrorKind::EmptyName),
            "{entry}: {err}"
        );
        assert!(
            err.field().is_some_and(|f| f.starts_with("groups.")),
            "{err}"
        );
    }
}

/// A megabyte-long line or pattern is not echoed whole: every line of the
/// message is cut at 400 bytes, saying how much was left out.
#[test]
fn a_huge_input_gets_a_short_error() {
    let garbage = "x".repeat(1 << 20);
    let pattern = format!("^/{}(", "a".repeat(1 << 20));
    let inputs = [
        garbage.clone(),
        format!("[[routes]]\npath = \"{pattern}\"\nrules = [{{ minute = 1 }}]\n"),
    ];
    for text in inputs {
        let error = tower_ratelimit::Config::from_toml(&text)
            .unwrap_err()
            .to_string();
        assert!(error.len() < 4_000, "{} bytes", error.len());
        assert!(error.lines().all(|l| l.len() <= 440), "{error}");
        assert!(error.contains("more bytes)"), "{error}");
    }
}

/// `windows = []` names no window: refused, as `limits = ""` is, rather
/// than read as a rule without limits.
#[test]
fn an_empty_windows_list_is_refused() {
    let err = Config::from_toml(
        "[[routes]]\npath = \"^/api\"\nrules = [{ group = \"g\", windows = [] }]\n",
    )
    .unwrap_err();
    assert!(matches!(err.kind(), ConfigErrorKind::LimitText(_)), "{err}");
    assert_eq!(err.rule(), Some((0, "g")), "{err}");
    assert_eq!(err.field(), Some("windows"), "{err}");
    assert!(err.to_string().contains("holds no window"), "{err}");
    // Left out, the rule has no limits.
    let config =
        Config::from_toml("[[routes]]\npath = \"^/api\"\nrules = [{ group = \"g\" }]\n").unwrap();
    assert_eq!(config.rules().len(), 1);
}

/// A `block_time` that is not a duration says how to write one; one out of
/// range (zero, negative, beyond 10 years) is refused by the range check.
#[test]
fn a_block_time_that_is_not_a_duration_says_how_to_write_one() {
    let load = |form: &str| {
        Config::from_toml(&format!(
            "[[routes]]\npath = \"^/a\"\nrules = [{{ second = 1, block_time = {form} }}]\n"
        ))
    };
    for (form, why) in [
        ("\"5 fortnights\"", "unknown unit `fortnights`"),
        ("\"5 m 3\"", "`3` has no unit"),
        ("\"1.2.3s\"", "`1.2.3` is not a number"),
        ("\"m\"", "expected a number at `m`"),
        ("\"-5m\"", "a block time is not negative"),
        ("\".\"", "expected a number at `.`"),
        ("\"1M\"", "`M` could be a minute or a month"),
        (
            "\"5µs\"",
            "unknown unit `µs` (ms, s, m or min, h, d, month, year)",
        ),
        // (A number as text is: sub-millisecond precision is refused alike.)
        ("1.0001", "`1.0001` is not a whole number of milliseconds"),
        ("\"\"", "it is empty"),
        ("\"1.0005s\"", "not a whole number of milliseconds"),
        ("\"1,000s\"", "write numbers without `,`"),
        ("\"+300\"", "expected a number at `+300`"),
        ("\"+5m\"", "expected a number at `+5m`"),
        ("true", "invalid type: boolean"),
    ] {
        let err = load(form).unwrap_err();
        if form != "true" {
            assert!(
                matches!(err.kind(), ConfigErrorKind::InvalidBlockTime(_)),
                "{form}: {err}"
            );
        }
        let shown = err.to_string();
        assert!(shown.contains(why), "{form}: {shown}");
        assert!(
            shown.contains("or a duration with its unit"),
            "{form}: {shown}"
        );
        // (Named as every rule's error is, but a value of the wrong type,
        // which the file's parser reports at its line.)
        if form != "true" {
            assert_eq!(err.route(), Some((0, "^/a")), "{form}: {shown}");
            assert_eq!(err.rule(), Some((0, "default")), "{form}: {shown}");
            assert_eq!(err.field(), Some("block_time"), "{form}: {shown}");
        }
    }
    // A long value is cut, so that why it is wrong stays on the line.
    let err = load(&format!("\"{}x\"", "1h ".repeat(300)))
        .unwrap_err()
        .to_string();
    assert!(err.contains("more bytes)"), "{err}");
    assert!(err.contains("expected a number at `x`"), "{err}");
    assert!(err.lines().all(|line| line.len() < 1_000), "{err}");
    // Units are read whatever their case, but for `M`.
    let rules = load("\"1H 30Min\"").unwrap().rules().clone();
    assert_eq!(rules.len(), 1);
    for form in [
        "0",
        "-5",
        "\"0s\"",
        "\"3661d\"",
        "1e300",
        "\"99999999999999999999h\"",
        "\"99999999999999999999\"",
    ] {
        let err = load(form).err().unwrap_or_else(|| panic!("{form} loaded"));
        assert_eq!(err.field(), Some("block_time"), "{form}: {err}");
    }
}

/// A valid table's warnings: a method that is no standard one (with the
/// standard one a typo most likely meant), a route every path of which is
/// excluded, a rule whose method is excluded. A clean table has none.
#[test]
fn warnings_name_what_is_most_likely_not_meant() {
    use tower_ratelimit::ConfigWarningKind;
    let clean = Rules::builder()
        .exclude_path("^/health")
        .exclude_method("OPTIONS")
        .route("^/api", [Rule::new().method("post").second(1)])
        .route("^/he", [Rule::new().second(1)])
        .route("^/(health|status)", [Rule::new().second(1)])
        .route("/health/deep", [Rule::new().second(1)])
        .route("(?i)^/health/x", [Rule::new().second(1)])
        .route("^/g", [Rule::new().method("GET").second(1)])
        .build()
        .unwrap();
    assert_eq!(clean.warnings(), []);
    assert_eq!(clean.len(), 6);

    // An exclusion that spells a character percent-encoded excludes
    // nothing (the decoded path has the character instead): warned about;
    // not `%2F` (kept encoded), nor `^/%2525` (`/%252525` decodes to
    // `/%2525`), nor one whose decoding another exclusion matches.
    let encoded = |exclusions: &[&str]| -> Vec<(String, String)> {
        let mut builder = Rules::builder().route("^/", [Rule::new().second(1)]);
        for x in exclusions {
            builder = builder.exclude_path(*x);
        }
        let rules = builder.build().unwrap();
        rules
            .warnings()
            .iter()
            .map(|w| match w.kind() {
                ConfigWarningKind::EncodedExclusion(x) => {
                    (w.field().unwrap().to_owned(), x.clone())
                }
                other => panic!("{other:?}"),
            })
            .collect()
    };
    let at = |i: usize, x: &str| (format!("exclude.paths[{i}]"), x.to_owned());
    assert_eq!(
        encoded(&["^/a%2Fb", "^/a%20b", "^/%2541", "/x%41", "^/%2525"]),
        [at(1, "^/a%20b"), at(2, "^/%2541")]
    );
    // (A lowercase `%2f` decodes to `%2F`, which it does not match.)
    assert_eq!(encoded(&["^/a%2fb"]), [at(0, "^/a%2fb")]);
    assert_eq!(encoded(&["^/a%20b", "^/a b"]), []);
    let rules = Rules::builder()
        .exclude_path("^/a%20b")
        .route("^/", [Rule::new().second(1)])
        .build()
        .unwrap();
    assert!(rules.warnings()[0]
        .to_string()
        .contains("so this excludes nothing"));

    // Routes under an exclusion.
    let excluded = |route: &str, exclusion: &str| {
        let rules = Rules::builder()
            .exclude_path("^/other")
            .exclude_path(exclusion)
            .route(route, [Rule::new().second(1)])
            .build()
            .unwrap();
        // (An exclusion with a `%XX` is warned about on its own.)
        let found: Vec<_> = rules
            .warnings()
            .iter()
            .filter(|w| !matches!(w.kind(), ConfigWarningKind::EncodedExclusion(_)))
            .collect();
        match found[..] {
            [] => false,
            [w] => {
                assert_eq!(w.route(), Some((0, route)));
                assert_eq!(
                    w.kind(),
                    &ConfigWarningKind::ExcludedRoute {
                        exclusion: 1,
                        pattern: exclusion.to_owned()
                    }
                );
                assert!(
                    w.to_string().contains("so its rules apply only to a path that spells the excluded part percent-encoded"),
                    "{w}"
                );
                true
            }
            ref more => panic!("{more:?}"),
        }
    };
    for (route, exclusion) in [
        ("^/health/deep", "^/health"),
        ("^/health(/.*)?$", "^/health"),
        ("^/healthz", "^/health"),
        ("^/(health|healthz)/x", "^/health"),
        ("^/api/internal/x", "/internal/"),
        ("/internal/x", "/internal/"),
        ("^/a.*b$", "^/a.*b$"),
    ] {
        assert!(excluded(route, exclusion), "{route} under {exclusion}");
    }
    for (route, exclusion) in [
        ("^/he", "^/health"),
        ("^/healt[hz]", "^/health"),
        ("^/health|^/x", "^/health"),
        ("/health/x", "^/health"),
        ("^/a.*b$", "^/a.*c$"),
        ("^/api/internal", "/internal/"),
        // (An exclusion with a `%XX` never matches the decoded path, so a
        // request for the route's own spelling is limited: `/a%20b/x`.)
        ("^/a%20b/x", "^/a%20b"),
        ("^/%41", "^/%41"),
    ] {
        assert!(!excluded(route, exclusion), "{route} under {exclusion}");
    }

    // Methods.
    let rules = Rules::builder()
        .exclude_method("PSOT")
        .exclude_method("options")
        .exclude_method("HEAD")
        .route(
            "^/a",
            [
                Rule::group("typo").method("gett").second(1),
                // (A registered extension method: no warning.)
                Rule::group("dav").method("PROPFIND").second(1),
                Rule::group("private").method("FROB").second(1),
                Rule::group("pre").method("OPTIONS").second(1),
                // (HEAD excluded, GET not: a GET rule still limits GETs.)
                Rule::group("get").method("GET").second(1),
                Rule::group("head").method("HEAD").second(1),
            ],
        )
        .build()
        .unwrap();
    let found: Vec<_> = rules
        .warnings()
        .iter()
        .map(|w| (w.rule().map(|(_, g)| g), w.field(), w.kind().clone()))
        .collect();
    let unusual = |method: &str, nearest| ConfigWarningKind::UnusualMethod {
        method: method.to_owned(),
        nearest,
    };
    assert_eq!(
        found,
        [
            (
                None,
                Some("exclude.methods[0]"),
                unusual("PSOT", Some("POST"))
            ),
            (Some("typo"), Some("method"), unusual("GETT", Some("GET"))),
            (Some("private"), Some("method"), unusual("FROB", None)),
            (
                Some("pre"),
                Some("method"),
                ConfigWarningKind::ExcludedMethod("OPTIONS".to_owned())
            ),
            (
                Some("head"),
                Some("method"),
                ConfigWarningKind::ExcludedMethod("HEAD".to_owned())
            ),
        ]
    );
    let shown: Vec<String> = rules.warnings().iter().map(|w| w.to_string()).collect();
    assert_eq!(
        shown[1],
        "route #0 `^/a`, rule #0 (group `typo`), field `method`: `GETT` is not a registered HTTP method, so only requests sent with exactly `GETT` are concerned; did you mean `GET`?"
    );
    assert!(shown[2].ends_with("(right for a private extension method)"));
    // `*` (IANA's reserved name) is no method: said so.
    let rules = Rules::builder()
        .route("^/a", [Rule::new().method("*").second(1)])
        .build()
        .unwrap();
    assert!(
        rules.warnings()[0]
            .to_string()
            .ends_with("leave the method out to mean every method"),
        "{}",
        rules.warnings()[0]
    );
    // A suggestion only one edit away (a letter changed, added, left out,
    // two swapped).
    for (method, nearest) in [
        ("GE", Some("GET")),
        ("PACTH", Some("PATCH")),
        ("DELET", Some("DELETE")),
        ("OPTIONSS", Some("OPTIONS")),
        ("LIST", None),
        ("POLL", None),
        ("PROPPATHC", Some("PROPPATCH")),
        ("PROPFIDN", Some("PROPFIND")),
    ] {
        let rules = Rules::builder()
            .route("^/a", [Rule::new().method(method).second(1)])
            .build()
            .unwrap();
        assert_eq!(
            rules.warnings()[0].kind(),
            &unusual(method, nearest),
            "{method}"
        );
    }
    // Excluding GET excludes HEAD too: a HEAD rule never applies.
    let rules = Rules::builder()
        .exclude_method("GET")
        .route("^/a", [Rule::new().method("HEAD").second(1)])
        .build()
        .unwrap();
    assert_eq!(
        rules.warnings()[0].kind(),
        &ConfigWarningKind::ExcludedMethod("HEAD".to_owned())
    );
}

/// A pattern longer than `MAX_PATTERN_LEN` is refused by its length,
/// before it is parsed (a 10 MB one took 850 MB to be refused as too
/// large); one that compiles too large is refused naming its route too.
#[test]
fn overlong_and_oversized_patterns_are_refused_by_name() {
    use tower_ratelimit::rules::MAX_PATTERN_LEN;
    let long = format!("^/{}", "a".repeat(MAX_PATTERN_LEN));
    let err = Rules::builder()
        .route("^/ok", [Rule::new().second(1)])
        .route(long.clone(), [Rule::new().second(1)])
        .build()
        .unwrap_err();
    assert!(
        matches!(err.kind(), ConfigErrorKind::PatternTooLong(n) if *n == MAX_PATTERN_LEN + 2),
        "{err}"
    );
    assert_eq!(err.route().map(|(i, _)| i), Some(1));
    assert!(
        err.to_string().contains("more than a path pattern may be"),
        "{err}"
    );
    let err = Rules::builder()
        .exclude_path(long)
        .route("^/ok", [Rule::new().second(1)])
        .build()
        .unwrap_err();
    assert!(
        matches!(err.kind(), ConfigErrorKind::PatternTooLong(_)),
        "{err}"
    );
    assert_eq!(err.field(), Some("exclude.paths[0]"));
    // Short, but too large compiled (as the `regex` crate would refuse it).
    for (route, exclusion) in [("^/\\w{5000}", None), ("^/ok", Some("^/\\w{5000}"))] {
        let mut builder = Rules::builder().route(route, [Rule::new().second(1)]);
        if let Some(x) = exclusion {
            builder = builder.exclude_path(x);
        }
        let err = builder.build().unwrap_err();
        assert!(
            matches!(
                err.kind(),
                ConfigErrorKind::InvalidRegex(regex::Error::CompiledTooBig(_))
            ),
            "{err}"
        );
        assert_eq!(err.route().is_some(), exclusion.is_none(), "{err}");
    }
    // Perl and Unicode classes beyond what compiles are refused before
    // they are translated (each `\w` is thousands of bytes then), inside
    // brackets too, by their number; ASCII classes are not counted.
    let classes = format!("^/{}", "\\w".repeat(4_000));
    let bracketed = format!("^/(?i)[{}]", "\\pL".repeat(1_025));
    for (pattern, n) in [(classes.as_str(), 4_000), (bracketed.as_str(), 1_025)] {
        let err = Rules::builder()
            .route("^/ok", [Rule::new().second(1)])
            .route(pattern, [Rule::new().second(1)])
            .build()
            .unwrap_err();
        assert!(
            matches!(err.kind(), ConfigErrorKind::TooManyClasses(k) if *k == n),
            "{err}"
        );
        assert_eq!(err.route().map(|(i, _)| i), Some(1));
        assert!(
            err.to_string()
                .contains(&format!("the pattern has {n} Perl or Unicode classes")),
            "{err}"
        );
    }
    let ascii = format!("^/x/{}", "[0-9]".repeat(1_025));
    assert!(Rules::builder()
        .route(ascii, [Rule::new().second(1)])
        .build()
        .is_ok());
    // One too large compiled backwards, and an exclusion too large, by its
    // index.
    let err = Rules::builder()
        .route("^/\\w{500}", [Rule::new().second(1)])
        .build()
        .unwrap_err();
    assert!(
        matches!(
            err.kind(),
            ConfigErrorKind::InvalidRegex(regex::Error::CompiledTooBig(_))
        ),
        "{err}"
    );
    let err = Rules::builder()
        .exclude_path("^/x")
        .exclude_path("^/\\w{250}")
        .route("^/ok", [Rule::new().second(1)])
        .build()
        .unwrap_err();
    assert_eq!(err.field(), Some("exclude.paths[1]"), "{err}");
    // Routes each within the limit but too large together: the one that
    // takes the set past its limit is named, with what to write instead.
    let mut builder = Rules::builder();
    for i in 0..50 {
        builder = builder.route(format!("^/x{i}/\\w{{190}}"), [Rule::new().second(1)]);
    }
    let err = builder.build().unwrap_err();
    assert!(
        matches!(err.kind(), ConfigErrorKind::RoutesTooLarge),
        "{err}"
    );
    let at = err.route().map(|(i, _)| i);
    assert!(at.is_some_and(|i| (30..50).contains(&i)), "{err}");
    assert!(err.to_string().contains("[_0-9A-Za-z]"), "{err}");
    // Just under the length limit, a plain literal still loads.
    let rules = Rules::builder()
        .route(
            format!("^/{}", "a".repeat(100_000)),
            [Rule::new().second(1)],
        )
        .build()
        .unwrap();
    assert_eq!(rules.len(), 1);
}

/// A rule that an earlier, broader route always takes first is warned
/// about, naming that route: the first matching route with a rule for the
/// request's group and method applies.
#[test]
fn rules_shadowed_by_an_earlier_route_are_warned_about() {
    use tower_ratelimit::ConfigWarningKind;
    let shadowed = |routes: &[(&str, Rule)]| -> Vec<(usize, usize, usize)> {
        let mut builder = Rules::builder();
        for (pattern, rule) in routes {
            builder = builder.route(*pattern, [rule.clone()]);
        }
        let rules = builder.build().unwrap();
        rules
            .warnings()
            .iter()
            .filter_map(|w| match w.kind() {
                ConfigWarningKind::ShadowedRule { route, pattern } => {
                    assert_eq!(pattern, routes[*route].0);
                    assert!(
                        w.to_string().contains("list the narrower route first"),
                        "{w}"
                    );
                    Some((w.route().unwrap().0, w.rule().unwrap().0, *route))
                }
                _ => None,
            })
            .collect()
    };
    let any = || Rule::new().second(1);
    // Listed after the broader route: shadowed.
    assert_eq!(
        shadowed(&[("^/api", any()), ("^/api/login", any())]),
        [(1, 0, 0)]
    );
    assert_eq!(
        shadowed(&[("^/api", Rule::new()), ("^/api/login$", any())]),
        [(1, 0, 0)],
        "an unlimited rule takes the request too"
    );
    assert_eq!(
        shadowed(&[("^/a", any()), ("^/b", any()), ("^/(a|b)/x", any())]),
        [(2, 0, 0)]
    );
    // A broader route's literal longer than 100 bytes too.
    let long = format!("^/{}", "l".repeat(150));
    assert_eq!(
        shadowed(&[(&long, any()), (&format!("{long}/x"), any())]),
        [(1, 0, 0)]
    );
    // A broader route written with a trailing `.*` (or `.*$`) too.
    assert_eq!(
        shadowed(&[("^/api/.*", any()), ("^/api/login", any())]),
        [(1, 0, 0)]
    );
    assert_eq!(
        shadowed(&[("^/api.*$", any()), ("^/api/login$", any())]),
        [(1, 0, 0)]
    );
    assert_eq!(
        shadowed(&[
            ("^/api", any().method("GET")),
            ("^/api/x", any().method("HEAD"))
        ]),
        [(1, 0, 0)]
    );
    assert_eq!(
        shadowed(&[
            ("^/api", any().method("POST")),
            ("^/api/x", any().method("post"))
        ]),
        [(1, 0, 0)]
    );
    // A broader route with other regex syntax, compared by automata.
    for (broader, narrower) in [
        ("^/api/", "^/api/[a-z]+"),
        ("^/v[0-9]", "^/v[12]/x"),
        ("^/v[0-9]", "^/v1/[a-z]+$"),
        ("^/(users|teams)", "^/users/[0-9]+$"),
        ("/admin", "^/x/admin"),
        ("(?i)^/api", "^/API/x"),
        ("^/files/[^/]+", "^/files/[a-z]+/raw$"),
    ] {
        assert_eq!(
            shadowed(&[(broader, any()), (narrower, any())]),
            [(1, 0, 0)],
            "{narrower} under {broader}"
        );
    }
    // In a table of 128 routes whose literal prefixes are all one, `/a/`
    // (so each pair is compared), the last one is under the sixth.
    let mut many: Vec<String> = (0..127).map(|i| format!("^/a/[a-z]+/n{i}$")).collect();
    many.push("^/a/[a-z]/n5$".to_owned());
    let table: Vec<(&str, Rule)> = many.iter().map(|p| (p.as_str(), any())).collect();
    assert_eq!(shadowed(&table), [(127, 0, 5)]);
    // Not shadowed.
    for routes in [
        vec![("^/api/[a-z]+", any()), ("^/api/", any())],
        vec![("^/api/[a-z]+$", any()), ("^/api/x1", any())],
        vec![("^/v[0-9]$", any()), ("^/v1/x", any())],
        vec![("^/files/[^/]+$", any()), ("^/files/[a-z]+/raw$", any())],
        vec![("^/api/login", any()), ("^/api", any())],
        vec![("^/api/.+", any()), ("^/api/", any())],
        vec![("^/api\\.x.*", any()), ("^/api/login", any())],
        vec![("^/api", Rule::group("admin")), ("^/api/login", any())],
        vec![("^/api", any().method("POST")), ("^/api/login", any())],
        vec![
            ("^/api", any().method("HEAD")),
            ("^/api/login", any().method("GET")),
        ],
        vec![("^/a", any()), ("^/a|^/c", any())],
        vec![("^/api", any()), ("/api/x", any())],
        vec![("^/api/", any()), ("^/api", any())],
        vec![("^/api$", any()), ("^/api/x", any())],
    ] {
        assert_eq!(
            shadowed(&routes),
            [],
            "{:?}",
            routes.iter().map(|r| r.0).collect::<Vec<_>>()
        );
    }
}
