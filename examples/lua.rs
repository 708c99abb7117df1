//! Prints the Lua script the Redis store runs for checks of one shape, to
//! read it, audit it, or load it by hand (`SCRIPT LOAD`) where scripts must
//! be approved first:
//!
//! ```sh
//! cargo run --example lua -- token-bucket 3     # 3 windows, no route-wide windows, no block time
//! cargo run --example lua -- sliding-log 3      # the same (its log packed in one string)
//! cargo run --example lua -- fixed-window 2 --general # any shape
//! cargo run --example lua -- token-bucket 3 --batched  # checks sent together
//! ```
//!
//! Checks with 1 to 5 windows, no route-wide windows and no block time (a
//! sliding log's may have one) run a straight-line script made for their
//! algorithm and window count; every other check runs its algorithm's
//! general script. Checks sent together (`--batched`): any algorithm, 1 to
//! 5 windows.

use tower_ratelimit::store::redis::{batched_lua, general_lua, straight_lua};
use tower_ratelimit::Algorithm;

fn main() -> std::process::ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let general = args.iter().any(|a| a == "--general");
    let batched = args.iter().any(|a| a == "--batched");
    let mut words = args.iter().filter(|a| !a.starts_with("--"));
    let algorithm = match words.next().map(String::as_str) {
        Some("sliding-log") => Algorithm::SlidingLog,
        Some("sliding-window") => Algorithm::SlidingWindow,
        Some("fixed-window") => Algorithm::FixedWindow,
        Some("token-bucket") => Algorithm::TokenBucket,
        _ => {
            eprintln!(
                "usage: lua <sliding-log|sliding-window|fixed-window|token-bucket> [windows] [--general|--batched]"
            );
            return std::process::ExitCode::FAILURE;
        }
    };
    let windows = match words.next().map(|w| w.parse::<usize>()) {
        None => 1,
        Some(Ok(n)) if n > 0 => n,
        Some(_) => {
            eprintln!("windows: a whole number from 1");
            return std::process::ExitCode::FAILURE;
        }
    };
    let straight = if general {
        None
    } else if batched {
        let Some(script) = batched_lua(algorithm, windows) else {
            eprintln!("checks are sent together for 1 to 5 windows, any algorithm");
            return std::process::ExitCode::FAILURE;
        };
        Some(script)
    } else {
        straight_lua(algorithm, windows)
    };
    let script = straight.unwrap_or_else(|| general_lua(algorithm).to_owned());
    print!("{script}");
    std::process::ExitCode::SUCCESS
}
