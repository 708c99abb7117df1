//! Shared by the benchmark harnesses: throwaway redis-server processes, and
//! reading Redis' own command statistics.
#![allow(dead_code, unreachable_pub)]

#[path = "../../tests/support/redis_server.rs"]
pub mod redis_server;

/// The environment variable `name` read as a number (a harness's
/// setting), or `default` if unset or not one.
pub fn env<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// One field (`calls`, `usec_per_call`, ...) of one command's line in
/// `INFO commandstats` (`cmdstat_evalsha:calls=3,usec=...`).
pub fn commandstat(info: &str, command: &str, field: &str) -> f64 {
    let prefix = format!("cmdstat_{command}:");
    let key = format!("{field}=");
    info.lines()
        .find(|l| l.starts_with(&prefix))
        .and_then(|l| {
            l.split([':', ','])
                .find_map(|kv| kv.strip_prefix(key.as_str()))
        })
        .and_then(|v| v.parse().ok())
        .unwrap_or(0.0)
}

/// The sum of `calls` over every command in `INFO commandstats`.
pub fn total_calls(info: &str) -> f64 {
    info.lines()
        .filter(|l| {
            l.starts_with("cmdstat_")
                && !l.starts_with("cmdstat_info:")
                && !l.starts_with("cmdstat_config")
        })
        .filter_map(|l| l.split([':', ',']).find_map(|kv| kv.strip_prefix("calls=")))
        .filter_map(|v| v.parse::<f64>().ok())
        .sum()
}

/// The median (sorts the values): the middle one, or the mean of the two
/// in the middle of an even count; 0 for none.
pub fn median(values: &mut [f64]) -> f64 {
    values.sort_by(|a, b| a.total_cmp(b));
    let n = values.len();
    match (
        values.get(n / 2),
        n.checked_sub(1).and_then(|_| values.get((n - 1) / 2)),
    ) {
        (Some(high), Some(low)) => (high + low) / 2.0,
        _ => 0.0,
    }
}
