//! The Redis store: budgets shared by every replica of a service.
//!
//! Every check is **one** `EVALSHA` of the rule's algorithm script
//! (`scripts/sliding_log.lua`, `sliding_window.lua`, `fixed_window.lua`,
//! `token_bucket.lua`, each behind `scripts/prelude.lua`), which
//! decides on all windows of the rule atomically, on the Redis server's
//! clock (`TIME`), and records the request in all of them or in none.
//! Checks with 1 to 5 windows, no route-wide windows and no block time (the
//! common shape; a sliding log's may have a block time) run a straight-line script made for their algorithm and
//! window count instead ([`straight_lua`]): the same decisions, for 44%
//! (fixed window) to 47% (sliding window) less of Redis's CPU on the same
//! state. The straight-line sliding log keeps its log packed in one string
//! (see the [key layout](#key-layout)), read and written a few dozen bytes
//! at a time: 0.55–0.73x the Redis time per check of the sorted set the
//! general script keeps. The straight-line counter scripts (fixed window, sliding
//! window, token bucket) only decide and record: they answer with their
//! clock and the state they left, and the store works out the remaining
//! counts, the reset and the retry from it with the memory store's own
//! functions, so Redis spends nothing on the report and both stores report
//! alike by construction. Every script is loaded when a connection is made.
//!
//! A penalty or a refund ([`Store::adjust`]) is one
//! `EVALSHA` of [`ADJUST_LUA`] on the user's key, outside the batches: it
//! changes the budget's state in whichever layout its checks keep it, as
//! the memory store does (the equivalence properties mix adjustments into
//! their checks), with its TTL, in a form the next check reads as its own.
//! A sliding log is searched, not read whole: a penalty on a log of
//! 100,000 entries costs Redis about what it costs on one of 1,000, a
//! refund a copy of the log made by Redis (benches/HISTORY.md, round 27).
//!
//! # Connections
//!
//! - [`RedisStoreBuilder::url`] (the default shape): one multiplexed,
//!   pipelining connection, shared by every request, replaced in the
//!   background when it breaks. A check costs at most one Redis command:
//!   a check alone is one `EVALSHA`; the checks of requests that run in
//!   the same scheduler tick leave together (here and on a pool's
//!   connection), with no window to wait out, and those of one algorithm
//!   and window count go as one call of a batch script
//!   ([`batched_lua`]), up to 64 a call: one write, one deadline, one
//!   script call and one reading of Redis's clock for them all, each
//!   decided exactly as alone. A server that refuses a call on keys of
//!   several slots gets them one command each from then on; behind a
//!   proxy that shards keys and routes a call by its first key, set
//!   [`RedisStoreBuilder::combine_checks`] off.
//! - [`RedisStoreBuilder::sentinel`]: the same connection, made to the
//!   master that Redis Sentinel names, and made again (to the new master)
//!   when the one it has breaks or answers `READONLY` after a failover.
//! - [`RedisStoreBuilder::cluster`]: Redis Cluster through redis-rs' async
//!   cluster client, with response and connection timeouts set. The
//!   client follows `MOVED` and `ASK` while slots migrate, and sends a call
//!   again (twice at most, within the check's deadline) when a node's
//!   connection breaks: a check whose script ran just before the break is
//!   then counted twice. The error is always that way: a Cluster check
//!   never charges a user less than it allowed. **While a slot migrates**
//!   (a reshard), a check whose keys are all on one node is decided
//!   there. A check of two keys or more (a route-wide limit's: the user's
//!   state and the route's; a rule's with a block time: the state and the
//!   block marker, which exists only while the user is blocked) one of
//!   which does not exist (a new user, one whose windows emptied, a user
//!   not blocked) or whose keys are split between the nodes is answered
//!   `TRYAGAIN` by Redis, which runs nothing: the store sends it again, 2
//!   to 16 ms apart, until its deadline, so it is decided if the slot's
//!   keys have moved by then, and fails by the fail mode otherwise. (A
//!   route's budgets share one slot, a user's one of their own;
//!   `redis-cli --cluster reshard` moves a slot in one go.) A check the old node redirects with
//!   `ASK` that the client's own tries do not settle is sent by the store
//!   to the new node with its `ASKING` in one write (redis-rs sends
//!   `ASKING` apart, where another call may use it up). (On a caller's Cluster pool, the
//!   client deadpool-redis makes waits redis-rs' default 1.28 s before it
//!   tries a `TRYAGAIN` again, past any deadline: there such a check fails
//!   by the fail mode until the slot has moved.)
//! - [`RedisStoreBuilder::pool`] / [`RedisStoreBuilder::cluster_pool`]: a
//!   `deadpool-redis` pool the caller owns and may share with other code.
//!   Its connections multiplex, so the store checks one out when it starts
//!   and runs every check on it, as on its own connection, and replaces it through
//!   the pool when it breaks. Checking one out per check would add the
//!   pool's health check (`UNWATCH` + `PING`, one more round trip) to
//!   every check: measured under 50 concurrent checks, that shape serves
//!   0.22–0.26× the checks per second (`cargo bench --bench redis_load`).
//!
//! # Deadline and failures
//!
//! Every check has a deadline ([`RedisStoreBuilder::timeout`], default
//! 50 ms) covering the script, its `NOSCRIPT` retry, on a Cluster its
//! tries while its slot moves, and its one try again after a refusal as
//! late (below). A check that misses
//! it, or fails, returns a [`StoreError`] and the layer applies its
//! [`FailMode`](crate::FailMode). A broken connection is replaced in the
//! background (retrying every 25 to 500 ms), so limiting resumes by itself
//! within a second of Redis answering again; requests never wait for a
//! reconnect (each try after a random part of the backoff, so replicas
//! that lost Redis together do not come back in step; a server still
//! loading its data is sent no scripts until it answers). A Cluster
//! client, which reconnects to a node by itself, is kept while a node
//! answers it: after three failed checks in a row (each within ten
//! seconds of the one before), `PING`s through it, for up to a second,
//! decide whether it is dropped (no node answers: checks fail at once
//! until a new one connects) or kept. A kept one is replaced, by a new
//! client made at most every two seconds, only if it cannot read the
//! failed check's key from that key's master and the new one can, as
//! after a failover. The scripts
//! are loaded with `SCRIPT LOAD` when a connection is made; after `SCRIPT FLUSH` or a failover, `NOSCRIPT` makes the next
//! call load its script again and retry. A Cluster master added since,
//! while its first slot moves in, is one no slot leads to yet, which a
//! load sent to every master misses: a check the old node sends on to it
//! (`ASK`) and that it answers `NOSCRIPT` loads the script on every master
//! `CLUSTER NODES` lists (by address, and by announced hostname; not those
//! marked failing, and only through connections the client holds, as the
//! one that followed the `ASK`), then goes again.
//!
//! A check carries its deadline on the server's clock (read with `TIME`
//! when the store connects, every 10 s, and at once when a check finds it
//! unknown, at most four times a second), plus a margin of the reading's
//! error, 5 ms and 1 ms per second since the reading, rounded up to 2 ms,
//! so that Redis, stalled past it, refuses the check instead of recording
//! a request the layer already answered by its fail mode; one refused
//! while the store still waits goes once more without a deadline in the
//! time left. On a Cluster (the store's own client or a caller's pool), on
//! the clock of the master that serves the check's slot, as the store last
//! read the slots.
//!
//! # Key layout
//!
//! One key per budget: `<prefix>:{<policy>:<user>}:<algorithm>` (and
//! `<prefix>:{<policy>:<user>}:b`, the block marker, for rules with a
//! `block_time`), where
//!
//! - `<prefix>` is [`RedisStoreBuilder::prefix`] (default `rl`);
//! - `<policy>` is `r` + 16 hex digits of the SHA-256 of the route pattern
//!   (with `.METHOD` appended for rules that name a method, and `/` + the
//!   encoded group when the group's rule counts otherwise than the route's
//!   `default` group's, or its first rule's without one), or `z` + the
//!   encoded zone name;
//! - `<user>` is the percent-encoded identity, or `#` + 32 hex digits of its
//!   SHA-256 when the encoding is longer than 128 bytes (see [`crate::key`]).
//!
//! The braces make `<policy>:<user>` the hash tag, so every key of one check
//! lives in one Cluster slot; encoded parts never contain `{`, `}` or `:`.
//! A route with a route-wide limit tags every key with the route instead:
//! `<prefix>:{r<route>}:<policy>:<user>:<algorithm>` for users and
//! `<prefix>:{r<route>}:*:<algorithm>` for the route's own budget, so the
//! user's and the route's windows are decided in one script call, at the
//! price of one hot slot per such route on Cluster.
//! `<algorithm>` is `p3` (sliding log on the common shape, packed), `l`
//! (sliding log with route-wide windows or more than 5: a sorted set
//! whose members and scores are microsecond timestamps), `sw2` (sliding
//! window), `fw2` (fixed window) or `tb2` (token bucket); the `2` of a
//! packed layout is its format's second version (numbers as doubles,
//! where the first packed 64-bit integers): a first-version key (`p`,
//! `sw`, `fw`, `tb`) is never read and expires, so the replicas of a
//! rolling upgrade never misread each other's state. The counter
//! algorithms keep a budget's counters in one string of little-endian
//! doubles (whole numbers; per window: its length, then its counters or
//! arrival time), read with one `GET` and written with one `SET ... PX`
//! (or in place, `SETRANGE`, while its TTL holds). A packed log is one
//! string of little-endian doubles too: its entries
//! (sorted distinct microsecond timestamps), then a trailer as long as
//! the rule needs (`scripts/straight_packed_log.lua` describes it: per
//! window where it started at the last check, then the number of entries,
//! where the log starts and a fingerprint of the windows), read with one
//! `GETRANGE` of the trailer and the newest entry (96 bytes for 3 windows;
//! the trailer and 32 entries, 344 bytes, when every window is counted
//! exactly or one has a limit of at most 32, so that a short window's start
//! is found in that read) and appended to with one `SETRANGE`; a log of another window count is
//! rewritten once with the rule's trailer; entries that left the longest window
//! leave the string in one copy once they are as many as the live ones
//! (about 1 ms of Redis time per 100,000 live entries, once per as many
//! checks). A rule that changes between the two sliding-log layouts
//! (route-wide windows added or removed, or more than 5 windows) starts
//! its budgets afresh, and a change back finds them as
//! they were left, if their TTL has not ended. Every key's TTL ends when its newest entry leaves the longest
//! window (a packed log's a quarter of that window later, at least a
//! second and at most a minute, so most writes keep it), so no key
//! outlives its usefulness.

/// The `deadpool-redis` the store takes pools of
/// ([`RedisStoreBuilder::pool`]): build them with this one, so the
/// versions match.
pub use deadpool_redis;

use std::future::Future;
use std::io::Write as _;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use arc_swap::ArcSwapOption;
use arrayvec::ArrayVec;
use redis::aio::{ConnectionLike, MultiplexedConnection};
use redis::cluster_async::ClusterConnection;
use redis::{AsyncConnectionConfig, RedisError, RedisResult, Script};

use self::watch::Watch;
use super::counters::{self, Slot};
use super::{
    AdjustFuture, Adjustment, Check, CheckRef, Decision, Store, StoreError, StoreErrorKind,
    WindowState,
};
use crate::rules::{Algorithm, Window, MAX_WINDOWS};

mod watch;

macro_rules! script {
    ($($file:literal),+) => {
        concat!(
            include_str!("../../scripts/prelude.lua"),
            $(include_str!(concat!("../../scripts/", $file))),+
        )
    };
}

/// The sliding-log script (`scripts/prelude.lua` +
/// `scripts/sliding_log_add.lua` + `scripts/sliding_log.lua`).
pub const SLIDING_LOG_LUA: &str = script!("sliding_log_add.lua", "sliding_log.lua");
/// The sliding-window-counter script (`scripts/prelude.lua` +
/// `scripts/counter_state.lua` + `scripts/sliding_window_wait.lua` +
/// `scripts/sliding_window.lua`).
pub const SLIDING_WINDOW_LUA: &str = script!(
    "counter_state.lua",
    "sliding_window_wait.lua",
    "sliding_window.lua"
);
/// The fixed-window script (`scripts/prelude.lua` +
/// `scripts/counter_state.lua` + `scripts/fixed_window.lua`).
pub const FIXED_WINDOW_LUA: &str = script!("counter_state.lua", "fixed_window.lua");
/// The token-bucket (GCRA) script (`scripts/prelude.lua` +
/// `scripts/counter_state.lua` + `scripts/token_bucket.lua`).
pub const TOKEN_BUCKET_LUA: &str = script!("counter_state.lua", "token_bucket.lua");

/// The general script of `algorithm`: the one the store runs for checks
/// with route-wide windows, a block time (but for a sliding log's), or
/// more windows than a straight-line script is made for (see
/// [`straight_lua`]).
pub fn general_lua(algorithm: Algorithm) -> &'static str {
    match algorithm {
        Algorithm::SlidingLog => SLIDING_LOG_LUA,
        Algorithm::SlidingWindow => SLIDING_WINDOW_LUA,
        Algorithm::FixedWindow => FIXED_WINDOW_LUA,
        Algorithm::TokenBucket => TOKEN_BUCKET_LUA,
    }
}

/// The script of [`Store::adjust`] (`scripts/straight_log_packed.lua`, for
/// its `packed`, + `scripts/sliding_log_add.lua`, for the sorted set's
/// `add_entries`, + `scripts/adjust.lua`): a penalty or a refund on a
/// user's budget, in whichever layout its checks keep it.
pub const ADJUST_LUA: &str = concat!(
    include_str!("../../scripts/straight_log_packed.lua"),
    include_str!("../../scripts/sliding_log_add.lua"),
    include_str!("../../scripts/adjust.lua")
);

use super::STRAIGHT_MAX_WINDOWS;

/// The straight-line sliding-log template: `scripts/straight_prelude.lua`
/// and `scripts/straight_packed_log.lua`, whose log is one packed string
/// (see [`straight_lua`]).
const STRAIGHT_SLIDING_LOG: &str = concat!(
    include_str!("../../scripts/straight_prelude.lua"),
    include_str!("../../scripts/straight_packed_log.lua")
);
/// The straight-line sliding-window template (with
/// `scripts/straight_counter_state.lua`).
const STRAIGHT_SLIDING_WINDOW: &str = concat!(
    include_str!("../../scripts/straight_prelude.lua"),
    include_str!("../../scripts/straight_counter_state.lua"),
    include_str!("../../scripts/straight_sliding_window.lua")
);
/// The straight-line fixed-window template.
const STRAIGHT_FIXED_WINDOW: &str = concat!(
    include_str!("../../scripts/straight_prelude.lua"),
    include_str!("../../scripts/straight_counter_state.lua"),
    include_str!("../../scripts/straight_fixed_window.lua")
);
/// The straight-line token-bucket template.
const STRAIGHT_TOKEN_BUCKET: &str = concat!(
    include_str!("../../scripts/straight_prelude.lua"),
    include_str!("../../scripts/straight_counter_state.lua"),
    include_str!("../../scripts/straight_token_bucket.lua")
);

/// How a straight-line counter script saves its state (`$SAVE` in the
/// templates).
const STRAIGHT_SAVE: &str = include_str!("../../scripts/straight_save.lua");

/// The rare re-layout of a counter algorithm's stored state for changed
/// windows (`$REMAP` in the templates, made only where it runs).
const STRAIGHT_REMAP: &str = include_str!("../../scripts/straight_remap.lua");

/// The packed log's TTL (`$TTL`) and its packing of a list of entries
/// (`$PACKED`), written out on the rare paths that run them.
const STRAIGHT_LOG_TTL: &str = include_str!("../../scripts/straight_log_ttl.lua");
const STRAIGHT_LOG_PACKED: &str = include_str!("../../scripts/straight_log_packed.lua");

/// The packed log's helper functions (`$HELPERS`, or the batch script's
/// `$SHARED`).
const STRAIGHT_LOG_HELPERS: &str = include_str!("../../scripts/straight_log_helpers.lua");

/// The straight-line script the store runs for a check of `windows` user
/// windows with `algorithm`, no route-wide windows and no block time (a
/// sliding log's may have one), when there is one (1 to 5 windows): it decides exactly as the general script
/// (and the memory store), with every number in a Lua local and no loop on
/// its usual path, so Redis spends 44-47% less on it; the sliding log's
/// keeps its log packed in one string instead of a sorted set
/// (BENCHMARKS.md).
///
/// ```
/// use tower_ratelimit::store::redis::straight_lua;
/// use tower_ratelimit::Algorithm;
///
/// let script = straight_lua(Algorithm::TokenBucket, 3).expect("made for 3 windows");
/// assert!(script.contains("d3, n3"));
/// assert!(straight_lua(Algorithm::SlidingLog, 1).is_some());
/// assert!(straight_lua(Algorithm::TokenBucket, 6).is_none());
/// ```
pub fn straight_lua(algorithm: Algorithm, windows: usize) -> Option<String> {
    match counter_template(algorithm) {
        None => packed_log_lua(windows, &ALONE),
        Some(template) => counter_lua(template, windows, &ALONE),
    }
}

/// A counter algorithm's straight-line template, and the names of the
/// numbers its state keeps per window (`@` for the window's number; the
/// first, its length); `None` for the sliding log.
fn counter_template(algorithm: Algorithm) -> Option<(&'static str, &'static str)> {
    match algorithm {
        Algorithm::SlidingLog => None,
        Algorithm::SlidingWindow => Some((STRAIGHT_SLIDING_WINDOW, "x@, c@, p@, s@")),
        Algorithm::FixedWindow => Some((STRAIGHT_FIXED_WINDOW, "e@, c@, s@")),
        Algorithm::TokenBucket => Some((STRAIGHT_TOKEN_BUCKET, "e@, a@")),
    }
}

/// The counter script of `template` (and its state's numbers) for
/// `windows` windows (1 to [`STRAIGHT_MAX_WINDOWS`]), reading its argument,
/// key and clock through `call`.
fn counter_lua((template, names): (&str, &str), windows: usize, call: &CallVars) -> Option<String> {
    if !(1..=STRAIGHT_MAX_WINDOWS).contains(&windows) {
        return None;
    }
    let width = names.split(',').count();
    let bytes = (8 * width * windows).to_string();
    // (The state's names go in before the windows are expanded: they are
    // written once per window, in `scripts/straight_counter_state.lua`.)
    let first = names.split(',').next().unwrap_or(names);
    let template = template
        .replace("$STATENAMES", names)
        .replace("$STATEFMT", &"d".repeat(width))
        .replace("$STATEFIRST", first)
        .replace("$STATEWIDTH", &width.to_string());
    Some(super::template::expand(
        &template,
        windows,
        &[
            ("ARGS", call.own_args(windows, false)),
            ("KEY1", call.key.to_owned()),
            ("LIBS", call.libs.to_owned()),
            ("REPLY", call.reply.0.to_owned()),
            ("DONE", call.reply.1.to_owned()),
            ("BYTES", bytes),
            ("SAVE", STRAIGHT_SAVE.trim_end().to_owned()),
            ("REMAP", STRAIGHT_REMAP.trim_end().to_owned()),
        ],
    ))
}

/// A straight-line check's numbers and clock (`scripts/straight_args.lua`).
const STRAIGHT_ARGS: &str = include_str!("../../scripts/straight_args.lua");

/// The names and format of the numbers a straight-line check reads beyond
/// `now`, `cost` and the windows': only the sliding log's fingerprint and
/// read mode, and block time (`$ARGFP`, `$ARGFMT`, `$BLOCKVAR`,
/// `$BLOCKFMT` in `scripts/straight_args.lua`).
fn extra_args(log: bool) -> [(&'static str, String); 4] {
    let (fp, fp_format, block, block_format) = match log {
        true => (", fp, exact", "dd", ", block", "d"),
        false => ("", "", "", ""),
    };
    [
        ("ARGFP", fp.to_owned()),
        ("ARGFMT", fp_format.to_owned()),
        ("BLOCKVAR", block.to_owned()),
        ("BLOCKFMT", block_format.to_owned()),
    ]
}

/// Where a straight-line script reads its check's numbers, its key and
/// the server's clock, and how it answers (`$ARGS`, `$KEY1` in
/// `scripts/straight_prelude.lua`; `$ARGV`, `$SERVERNOW` in
/// `scripts/straight_args.lua`; `$REPLY`, `$DONE` where the templates
/// answer).
struct CallVars {
    /// The string the numbers are unpacked from.
    numbers: &'static str,
    /// Whether the check runs in a batch: then the batch script around it
    /// reads its numbers and clock once per run of checks that have the
    /// same (`$ARGS` in `scripts/batched.lua`), and makes the helper
    /// functions once per batch (`$SHARED`), not the check's code.
    in_batch: bool,
    key: &'static str,
    /// The block marker's key (`$KEY2`, the sliding log's).
    block_key: &'static str,
    /// How `now` is set from the server's clock (`$SERVERNOW`): `TIME`
    /// for a check alone, the batch's one reading for a check in a batch.
    clock: &'static str,
    /// The library functions' locals (`$LIBS`), made by the check's code
    /// alone and by the batch script in a batch.
    libs: &'static str,
    /// What goes before and after the answer (`$REPLY`, `$DONE`): a check
    /// alone returns it; a check in a batch, whose code the batch script
    /// runs inline in its loop (a Lua function call costs Redis about
    /// 1,100 instructions for a frame this size), stores it in its place
    /// in the replies and leaves the check's `repeat ... until true`.
    reply: (&'static str, &'static str),
}

impl CallVars {
    /// The check's code's own `$ARGS`: its numbers and clock alone;
    /// nothing in a batch, whose script reads them.
    fn own_args(&self, windows: usize, log: bool) -> String {
        match self.in_batch {
            true => String::new(),
            false => self.args(windows, log),
        }
    }

    /// The numbers and clock of a check of `windows` windows
    /// (`scripts/straight_args.lua`; `log`: the sliding log's).
    fn args(&self, windows: usize, log: bool) -> String {
        let mut vars = vec![
            ("ARGV", self.numbers.to_owned()),
            ("SERVERNOW", self.clock.to_owned()),
        ];
        vars.extend(extra_args(log));
        super::template::expand(STRAIGHT_ARGS, windows, &vars)
            .trim_end()
            .to_owned()
    }
}

/// The library functions a straight-line script calls, as locals
/// (`$LIBS`; see `scripts/straight_prelude.lua`).
const LIBS: &str =
    "local rcall, pack8, unpack8, fmt = redis.call, struct.pack, struct.unpack, string.format";

/// A check alone: its own call's.
const ALONE: CallVars = CallVars {
    numbers: "ARGV[1]",
    in_batch: false,
    key: "KEYS[1]",
    block_key: "KEYS[2]",
    clock: "local t, deadline = redis.call('TIME'), -now\nnow = t[1] * 1000000 + t[2]\nif now > deadline and deadline > 1 then return '' end",
    libs: LIBS,
    reply: ("return", ""),
};

/// Check `i` of a batch (`scripts/batched.lua`).
const IN_BATCH: CallVars = CallVars {
    // (Unpacked once for every run of checks of the same numbers.)
    numbers: "ARGV[g]",
    in_batch: true,
    key: "KEYS[i]",
    // (A check with a block time has a second key, and is never sent in a
    // batch.)
    block_key: "error('a check with a block time in a batch')",
    // (Once per run: each check of a run past its deadline answers '').
    clock:
        "local deadline = -now\nnow = clock or server_now()\nlate = now > deadline and deadline > 1",
    libs: "",
    reply: ("replies[i] =", " break"),
};

/// Checks of one algorithm and window count sent together
/// (`scripts/batched.lua`).
const BATCHED: &str = include_str!("../../scripts/batched.lua");

/// The script that runs a batch of checks of `algorithm` with `windows`
/// user windows (of the shape [`straight_lua`] is made for, and no block
/// time) in one call: `KEYS[i]` is check `i`'s key, and `ARGV` holds each
/// run of checks' numbers once, followed by how many checks (in order)
/// have them; it answers with the list of what [`straight_lua`]'s script
/// answers for each check, in order, all decided at one reading of the
/// server's clock.
///
/// ```
/// use tower_ratelimit::store::redis::batched_lua;
/// use tower_ratelimit::Algorithm;
///
/// let script = batched_lua(Algorithm::FixedWindow, 2).expect("made for 2 windows");
/// assert!(script.contains("local n = #KEYS"));
/// assert!(batched_lua(Algorithm::SlidingLog, 5).is_some());
/// assert!(batched_lua(Algorithm::FixedWindow, 6).is_none());
/// ```
pub fn batched_lua(algorithm: Algorithm, windows: usize) -> Option<String> {
    let (check, shared, log) = match counter_template(algorithm) {
        None => (
            packed_log_lua(windows, &IN_BATCH)?,
            STRAIGHT_LOG_HELPERS,
            true,
        ),
        Some(template) => (counter_lua(template, windows, &IN_BATCH)?, "", false),
    };
    Some(super::template::expand(
        BATCHED,
        windows,
        &[
            ("ARGS", IN_BATCH.args(windows, log)),
            ("CHECK", check.trim_end().to_owned()),
            ("SHARED", shared.trim_end().to_owned()),
            ("LIBS", LIBS.to_owned()),
        ],
    ))
}

/// The straight-line sliding log: its log packed in one string with a
/// trailer as long as the rule's window count needs (its hints, then five
/// numbers every trailer ends with, so a script finds them whatever rule
/// wrote the log; see `scripts/straight_packed_log.lua`).
fn packed_log_lua(windows: usize, call: &CallVars) -> Option<String> {
    if !(1..=STRAIGHT_MAX_WINDOWS).contains(&windows) {
        return None;
    }
    // The trailer's bytes: two numbers per window and five, 8 bytes each;
    // the first read takes it and the 32 entries before it.
    let trailer = 8 * (2 * windows + 5);
    Some(super::template::expand(
        STRAIGHT_SLIDING_LOG,
        windows,
        &[
            ("ARGS", call.own_args(windows, true)),
            ("KEY1", call.key.to_owned()),
            ("KEY2", call.block_key.to_owned()),
            ("LIBS", call.libs.to_owned()),
            ("REPLY", call.reply.0.to_owned()),
            ("DONE", call.reply.1.to_owned()),
            (
                "HELPERS",
                if call.in_batch {
                    String::new()
                } else {
                    STRAIGHT_LOG_HELPERS.trim_end().to_owned()
                },
            ),
            ("TRAILER", trailer.to_string()),
            ("READ", (trailer + 256).to_string()),
            ("SHORT", (trailer + 8).to_string()),
            // (Where the newest entry is, from the read's end, and where
            // `at` is, from the trailer's start.)
            ("BEFORE", (trailer + 7).to_string()),
            ("ATOFFSET", (16 * windows + 8).to_string()),
            ("TTL", STRAIGHT_LOG_TTL.trim_end().to_owned()),
            ("PACKED", STRAIGHT_LOG_PACKED.trim_end().to_owned()),
        ],
    ))
}

/// Whether a check runs a straight-line script: 1 to
/// [`STRAIGHT_MAX_WINDOWS`] user windows, no route-wide windows and no
/// block time (a sliding log's may have one).
fn straight(check: &Check) -> bool {
    check.global.is_none()
        && (check.block.is_none() || check.algorithm == Algorithm::SlidingLog)
        && (1..=STRAIGHT_MAX_WINDOWS).contains(&check.windows.len())
}

/// The scripts, hashed once: one general and five straight-line ones (1 to
/// 5 windows) per algorithm, in [`ALGORITHMS`] order.
struct Scripts {
    general: [Script; 4],
    straight: [[Script; STRAIGHT_MAX_WINDOWS]; 4],
    /// The batch scripts ([`batched_lua`]), in [`ALGORITHMS`] order, 1 to
    /// 5 windows each.
    batched: [[Script; STRAIGHT_MAX_WINDOWS]; 4],
    /// [`ADJUST_LUA`].
    adjust: Script,
    /// `NOSCRIPT` reloads: one at a time, and counted, so that the checks
    /// in flight when the server lost its scripts (`SCRIPT FLUSH`, a
    /// restart) share one load instead of each sending its own.
    reloading: tokio::sync::Mutex<()>,
    reloads: AtomicU64,
}

/// The algorithms, in the order [`Scripts`] keeps their scripts.
const ALGORITHMS: [Algorithm; 4] = Algorithm::ALL;

/// An algorithm's place in [`ALGORITHMS`].
fn algorithm_index(algorithm: Algorithm) -> usize {
    match algorithm {
        Algorithm::SlidingLog => 0,
        Algorithm::SlidingWindow => 1,
        Algorithm::FixedWindow => 2,
        Algorithm::TokenBucket => 3,
    }
}

impl Scripts {
    /// The script an `EVALSHA` names (by its second argument).
    fn named_by(&self, cmd: &redis::Cmd) -> Option<&Script> {
        let redis::Arg::Simple(sha) = cmd.args_iter().nth(1)? else {
            return None;
        };
        self.all().find(|s| s.get_hash().as_bytes() == sha)
    }

    /// `SCRIPT LOAD` of the script an `EVALSHA` names (see
    /// [`AskAgain::load_on_every_master`]). A rare path: the code is made
    /// again.
    fn load_cmd(&self, cmd: &redis::Cmd) -> Option<redis::Cmd> {
        let wanted = self.named_by(cmd)?.get_hash();
        let at = self.all().position(|s| s.get_hash() == wanted)?;
        let mut load = redis::cmd("SCRIPT");
        load.arg("LOAD").arg(Self::codes().nth(at)?);
        Some(load)
    }

    /// Every script the store may call.
    fn all(&self) -> impl Iterator<Item = &Script> {
        self.general
            .iter()
            .chain(self.straight.iter().flatten())
            .chain(self.batched.iter().flatten())
            .chain(std::iter::once(&self.adjust))
    }

    /// Loads the scripts `cmds` name (each once): what a `NOSCRIPT` reply
    /// needs, all at once (one round trip on a multiplexed connection), not
    /// every script the store has.
    async fn load_for<'a, C: ConnectionLike + Clone>(
        &self,
        conn: &mut C,
        cmds: impl Iterator<Item = &'a redis::Cmd>,
    ) -> RedisResult<()> {
        let mut scripts: Vec<&Script> = Vec::new();
        for cmd in cmds {
            let Some(script) = self.named_by(cmd) else {
                return self.load(conn).await;
            };
            if !scripts.iter().any(|s| s.get_hash() == script.get_hash()) {
                scripts.push(script);
            }
        }
        // (All at once: one round trip on a multiplexed connection, not
        // one per script, within what is left of the checks' deadline.)
        let loads = scripts.into_iter().map(|script| {
            let mut conn = conn.clone();
            async move { script.prepare_invoke().load_async(&mut conn).await }
        });
        futures_util::future::try_join_all(loads).await.map(drop)
    }

    fn new() -> Self {
        // (`from_fn` makes its elements in order: the order of `codes`.)
        let mut codes = Self::codes();
        let mut next = || Script::new(&codes.next().unwrap_or_default());
        Self {
            general: std::array::from_fn(|_| next()),
            straight: std::array::from_fn(|_| std::array::from_fn(|_| next())),
            batched: std::array::from_fn(|_| std::array::from_fn(|_| next())),
            adjust: next(),
            reloading: tokio::sync::Mutex::new(()),
            reloads: AtomicU64::new(0),
        }
    }

    /// Every script's code, in the order of [`all`](Self::all).
    fn codes() -> impl Iterator<Item = String> {
        let general = ALGORITHMS.into_iter().map(|a| general_lua(a).to_owned());
        let straight = ALGORITHMS.into_iter().flat_map(move |a| {
            (1..=STRAIGHT_MAX_WINDOWS).map(move |w| straight_lua(a, w).unwrap_or_default())
        });
        let batched = ALGORITHMS.into_iter().flat_map(move |a| {
            (1..=STRAIGHT_MAX_WINDOWS).map(move |w| batched_lua(a, w).unwrap_or_default())
        });
        general
            .chain(straight)
            .chain(batched)
            .chain(std::iter::once(ADJUST_LUA.to_owned()))
    }

    /// Which batch script runs `check` with others of its kind (an index
    /// for [`batched`](Self::batched)): a check on a straight-line script
    /// with one key (no block time); `None` for every other.
    fn batch_of(check: &Check) -> Option<u8> {
        if !straight(check) || check.block.is_some() {
            return None;
        }
        // (A straight-line check has 1 to STRAIGHT_MAX_WINDOWS windows.)
        let index = algorithm_index(check.algorithm) * STRAIGHT_MAX_WINDOWS
            + check.windows.len().saturating_sub(1);
        u8::try_from(index).ok()
    }

    /// The batch script of [`batch_of`](Self::batch_of)'s index.
    fn batched(&self, index: u8) -> Option<&Script> {
        self.batched.iter().flatten().nth(usize::from(index))
    }

    /// The script for a check: a straight-line one when there is one for
    /// its shape, else its algorithm's.
    fn get(&self, check: &Check) -> &Script {
        let i = algorithm_index(check.algorithm);
        if straight(check) {
            if let Some(script) = self.straight[i].get(check.windows.len().wrapping_sub(1)) {
                return script;
            }
        }
        &self.general[i]
    }

    /// Loads the scripts the server does not have (`SCRIPT EXISTS` first:
    /// a server that keeps them, as it does across a reconnect, gets one
    /// command instead of one load per script; a Cluster client asks every
    /// master, and a script counts as there only if every master has it).
    async fn ensure<C: ConnectionLike + Clone>(&self, conn: &mut C) -> RedisResult<()> {
        let mut exists = redis::cmd("SCRIPT");
        exists.arg("EXISTS");
        for script in self.all() {
            exists.arg(script.get_hash());
        }
        let there: Vec<bool> = match exists.query_async(conn).await {
            Ok(there) => there,
            // (A proxy that does not know the command: load them all. Not a
            // server that refuses every command for now, as one loading its
            // data after a restart does: it would refuse them all too, on
            // every try of every replica.)
            Err(e) if !broken(&e) && !e.is_timeout() && !refuses_for_now(&e) => Vec::new(),
            Err(e) => return Err(e),
        };
        if there.len() != self.all().count() {
            return self.load(conn).await;
        }
        let loads = self
            .all()
            .zip(there)
            .filter(|(_, there)| !there)
            .map(|(script, _)| {
                let mut conn = conn.clone();
                async move { script.prepare_invoke().load_async(&mut conn).await }
            });
        futures_util::future::try_join_all(loads).await.map(drop)
    }

    /// Loads every script through `conn` (`SCRIPT LOAD`), so calls find
    /// them by SHA: all at once, so a multiplexed connection sends them
    /// together (one round trip, not one per script), and a Cluster
    /// client sends each to every master (it would send a pipeline of
    /// them to one node).
    async fn load<C: ConnectionLike + Clone>(&self, conn: &mut C) -> RedisResult<()> {
        let loads = self.all().map(|script| {
            let mut conn = conn.clone();
            async move { script.prepare_invoke().load_async(&mut conn).await }
        });
        futures_util::future::try_join_all(loads).await.map(drop)
    }
}

/// Which of a check's keys (see [`RedisStore::keys`]).
#[derive(Clone, Copy)]
enum KeyKind {
    State,
    Block,
    Route,
}

/// The last part of a budget's key: algorithms (and a sliding log's two
/// layouts) never share state.
fn suffix(check: &Check) -> &'static str {
    match check.algorithm {
        Algorithm::SlidingLog if straight(check) => "p3",
        Algorithm::SlidingLog => "l",
        Algorithm::SlidingWindow => "sw2",
        Algorithm::FixedWindow => "fw2",
        Algorithm::TokenBucket => "tb2",
    }
}

const DEFAULT_TIMEOUT: Duration = Duration::from_millis(50);
const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_millis(500);
const DEFAULT_KEEPALIVE: Duration = Duration::from_secs(1);
/// Timeouts in a row after which a connection is presumed dead: each of a
/// call sent after the one before timed out (calls in flight together, that
/// one stall times out at once, count as one).
const TIMEOUTS_BEFORE_RECONNECT: u32 = 3;

/// On a Cluster, the longest time between two failures counted in a row
/// (see `Lazy::observe_timeout`), in microseconds: long enough for a
/// master that gets a check every few seconds, or a deadline of seconds.
const FAILURE_SPAN_US: u64 = 10_000_000;

/// The pause between two asks of a kept Cluster client's masters (see
/// `Lazy::drop_if_unanswered`).
const PROBE_PAUSE: Duration = Duration::from_millis(100);

/// On a Cluster, the shortest time between two new clients made beside a
/// kept one that answers, in microseconds.
const REPLACEMENT_GAP_US: u64 = 2_000_000;

/// The first key of a script call (`EVALSHA sha numkeys key ...`), if it
/// has one.
fn first_key(cmd: &redis::Cmd) -> Option<&[u8]> {
    let mut args = cmd.args_iter().filter_map(|arg| match arg {
        redis::Arg::Simple(bytes) => Some(bytes),
        _ => None,
    });
    let name = args.next()?;
    if !name.eq_ignore_ascii_case(b"EVALSHA") && !name.eq_ignore_ascii_case(b"EVAL") {
        return None;
    }
    let _script = args.next()?;
    let keys = args.next()?;
    (keys != b"0").then(|| args.next()).flatten()
}

/// The server's clock as seen from here: its offset from this process's
/// monotonic clock, read with `TIME` when a connection is made, every
/// few seconds after, and at once when a check finds it unknown (see
/// `Lazy::want_clock`). A check carries its deadline on the server's clock
/// (in the sign of its `now`, see `scripts/prelude.lua`), so that Redis,
/// stalled past it (a fork, a long command, a paused process), refuses the
/// check instead of recording a request the layer already answered by its
/// fail mode.
struct ServerClock {
    origin: Instant,
    /// The reading the deadlines ride on, swapped whole (a deadline never
    /// pairs one reading's offset with another's error); `None`: none yet,
    /// or asked to read again.
    reading: ArcSwapOption<Reading>,
    /// Bumped by [`doubt`](Self::doubt): a reading sent before is not
    /// kept (another node's clock, when a Cluster master's number went to
    /// another).
    generation: AtomicU64,
}

/// One reading of the server's clock (see [`ServerClock::read_by`]).
#[derive(Debug)]
struct Reading {
    /// Server microseconds minus microseconds since the clock's origin.
    offset: i64,
    /// Its error, in microseconds: half its round trip.
    error: u64,
    /// When it was taken, in milliseconds since the clock's origin.
    at_ms: u64,
    /// Whether its round trip took over [`TRUSTED_READING`]: read again at
    /// the next chance.
    rough: bool,
}

impl Reading {
    /// Whether this reading, taken at `now_ms`, replaces `kept`: a trusted
    /// one always (the latest has the least drift), a rough one only a
    /// rough one whose error is by now as large or larger.
    fn replaces(&self, kept: &Reading, now_ms: u64) -> bool {
        !self.rough || (kept.rough && self.error <= kept.error_at(now_ms))
    }

    /// Its error at `now_ms`: its own, and the clocks' drift since (see
    /// [`CLOCK_DRIFT`]), in microseconds.
    fn error_at(&self, now_ms: u64) -> u64 {
        let since_us = now_ms.saturating_sub(self.at_ms).saturating_mul(1_000);
        self.error.saturating_add(since_us / CLOCK_DRIFT)
    }
}

/// What a deadline on the server's clock allows beyond the check's own,
/// besides the reading's error (half its round trip) and the clocks' drift
/// since (see [`CLOCK_DRIFT`]): room to spare, as a check refused as late
/// while the store still waits for it goes once more without a deadline
/// (see `RedisStore::run`). A check that Redis runs later than its
/// deadline and this (and the deadline's rounding, up to 2 ms) is refused
/// by the script; one it runs in between is recorded, though the layer
/// answered it by its fail mode (until round 44 the margin was 500 ms, and
/// stalls shorter than that charged the requests; an outside trial of a
/// 25 ms margin and 16 ms of rounding still saw requests that waited
/// 50–90 ms in a paused Redis charged).
const CLOCK_MARGIN: Duration = Duration::from_millis(5);

/// The most two clocks may drift apart, as a share of the time since a
/// reading: 1 in 1,000 (NTP slews a clock by at most 500 ppm, and the two
/// may slew apart).
const CLOCK_DRIFT: u64 = 1_000;

/// The longest round trip of a reading that is trusted (its error is up
/// to half of it); a longer one is kept only while no other is known.
const TRUSTED_READING: Duration = Duration::from_millis(100);

/// How long a reading of a Cluster master's clock may take (at least; the
/// store's response timeout when longer). It runs beside the checks, not
/// before any: a master whose clock is not known yet has its checks sent
/// without a deadline, so on a loaded machine a reading cut at a short
/// response timeout (50 ms) again and again left a master's checks
/// without one for as long.
const CLOCK_PATIENCE: Duration = Duration::from_millis(500);

/// How often the server's clock is read again while checks flow.
const CLOCK_READ_EVERY: Duration = Duration::from_secs(10);

/// How often a check that finds its server's clock unknown may have it
/// read at once (see `Lazy::want_clock`): a server or proxy that refuses
/// `TIME` is asked a few times a second, not once per check.
const CLOCK_WANTED_EVERY: Duration = Duration::from_millis(250);

impl ServerClock {
    fn new() -> Self {
        Self {
            origin: Instant::now(),
            reading: ArcSwapOption::empty(),
            generation: AtomicU64::new(0),
        }
    }

    fn micros(&self, at: Instant) -> i64 {
        saturating_i64(
            u64::try_from(at.duration_since(self.origin).as_micros()).unwrap_or(u64::MAX),
        )
    }

    fn millis(&self, at: Instant) -> u64 {
        u64::try_from(at.duration_since(self.origin).as_millis()).unwrap_or(u64::MAX)
    }

    /// Reads the server's clock on `conn` (see [`read_by`](Self::read_by)).
    async fn read<C: ConnectionLike>(&self, conn: &mut C) -> RedisResult<()> {
        self.read_by(redis::cmd("TIME").query_async(conn)).await
    }

    /// Reads the server's `TIME` (seconds, microseconds) asked by `time`,
    /// a future not started yet (the command is sent when it is first
    /// polled: the server read its clock between then and its reply).
    /// A reading whose round trip took over [`TRUSTED_READING`] is rough:
    /// kept only while no other is known, or in place of a rough one
    /// whose error is now larger (its error, half the round trip, widens
    /// the deadlines, which still refuse a check run after a stall longer
    /// than that), and the clock is read again at the next chance.
    async fn read_by(
        &self,
        time: impl Future<Output = RedisResult<(i64, i64)>>,
    ) -> RedisResult<()> {
        self.read_since(self.generation.load(Ordering::Acquire), time)
            .await
    }

    /// [`read_by`](Self::read_by), for a reading asked for while the
    /// clock's generation was `generation` (one asked for before a doubt
    /// is not kept, though its task runs after).
    async fn read_since(
        &self,
        generation: u64,
        time: impl Future<Output = RedisResult<(i64, i64)>>,
    ) -> RedisResult<()> {
        let sent = Instant::now();
        let (secs, micros) = time.await?;
        let received = Instant::now();
        let round_trip = received.duration_since(sent);
        let local = (self.micros(sent) + self.micros(received)) / 2;
        let server = secs.saturating_mul(1_000_000).saturating_add(micros);
        let now_ms = self.millis(received);
        let new = Arc::new(Reading {
            offset: server.saturating_sub(local),
            error: crate::clock::duration_micros(round_trip / 2),
            at_ms: now_ms,
            rough: round_trip > TRUSTED_READING,
        });
        self.reading.rcu(|current| {
            // (A doubt that came meanwhile wins.)
            if self.generation.load(Ordering::Acquire) != generation {
                return current.clone();
            }
            match current {
                Some(kept) if !new.replaces(kept, now_ms) => current.clone(),
                _ => Some(Arc::clone(&new)),
            }
        });
        // (A doubt that came as it was stored: this one is forgotten, not
        // a newer one read since.)
        if self.generation.load(Ordering::Acquire) != generation {
            self.reading.rcu(|current| match current {
                Some(kept) if Arc::ptr_eq(kept, &new) => None,
                _ => current.clone(),
            });
        }
        Ok(())
    }

    /// Whether the clock should be read (never read, asked to, read
    /// roughly, or read [`CLOCK_READ_EVERY`] ago).
    fn stale(&self) -> bool {
        let now_ms = self.millis(Instant::now());
        match &*self.reading.load() {
            None => true,
            Some(reading) => {
                reading.rough
                    || now_ms.saturating_sub(reading.at_ms) >= CLOCK_READ_EVERY.as_millis() as u64
            }
        }
    }

    /// A check's deadline on the server's clock, in microseconds, for a
    /// check asked at `asked` (now) with `timeout`: that, plus [`CLOCK_MARGIN`], the
    /// reading's error and the clocks' drift since (rounded up to
    /// 2,048 µs, so that the checks of one batch mostly share it and their
    /// numbers); `None` while the clock is unknown.
    fn deadline(&self, asked: Instant, timeout: Duration) -> Option<i64> {
        let guard = self.reading.load();
        let reading = guard.as_ref()?;
        let now = self.micros(asked);
        let after = crate::clock::duration_micros(timeout + CLOCK_MARGIN)
            .saturating_add(reading.error_at(self.millis(asked)));
        let at = now
            .saturating_add(reading.offset)
            .saturating_add(saturating_i64(after));
        Some((at | 0x7ff).saturating_add(1))
    }

    /// Whether a reading is known (see [`deadline`](Self::deadline)).
    fn known(&self) -> bool {
        self.reading.load().is_some()
    }

    /// Asks for a new reading (a check was refused as late while this
    /// process still waited for it: the offset is off).
    fn doubt(&self) {
        self.generation.fetch_add(1, Ordering::AcqRel);
        self.reading.store(None);
    }
}

/// How often the slots of a Cluster are read again through its client (see
/// `Lazy::read_slot_map`).
const SLOT_MAP_EVERY: Duration = Duration::from_secs(5);

/// How often a Sentinel store asks which master the sentinels name: after
/// `SENTINEL FAILOVER` the old master runs on as a master until the
/// sentinels demote it, and what the store writes there until it asks is
/// lost (one `SENTINEL GET-MASTER-ADDR-BY-NAME` per period per store).
const FOLLOW_EVERY: Duration = Duration::from_millis(250);

/// How [`expect_master`] refuses a master a sentinel named before a
/// failover.
const STALE_MASTER: &str = "the sentinels asked still name";

/// How often a reconnect that keeps failing says so as a warning (see
/// `Lazy::reconnect`).
const REPEAT_WARNING: Duration = Duration::from_secs(30);

/// How long after the store leaves a master for the one a sentinel named
/// a new connection goes to that one only (see [`expect_master`]).
const EXPECT_FOR: Duration = Duration::from_secs(2);

/// Whether a connection may be made to `at`, the master the sentinels a
/// reconnect asked name: not while another is expected (see
/// [`Follow::expected`]). The sentinel that tells the store of a failover
/// is often the first to know; the others, asked in turn by the reconnect,
/// may name the old master for a moment more, and a connection there
/// would write to it, every write lost, until the next question a second
/// later (an outside trial: 5 of 33 failovers, twice the writes lost). The
/// reconnect asks again, from the next sentinel, 25 ms on. Once the
/// expected master is reached, or [`EXPECT_FOR`] has passed (a sentinel
/// that was wrong), any is taken.
fn expect_master(
    expected: &std::sync::Mutex<Option<(String, tokio::time::Instant)>>,
    at: &str,
) -> Result<(), RedisError> {
    let mut expected = expected
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    match expected.as_ref() {
        Some((master, since)) if master != at && since.elapsed() < EXPECT_FOR => Err(io_error(
            std::io::ErrorKind::Other,
            format!("{STALE_MASTER} {at}, not the new master {master}: asking again"),
        )),
        _ => {
            *expected = None;
            Ok(())
        }
    }
}

/// For a target that moves (Sentinel): the master's address as the
/// sentinels name it now, and the address the current connection was made
/// to. A failover names a new master at once, but the old one may run on,
/// still a master, for seconds until the sentinels demote it: a store that
/// waited for an error there would spend budgets that the promotion drops.
struct Follow {
    /// Asks; `true`: another sentinel than the one last asked.
    master_now: Box<dyn Fn(bool) -> BoxFuture<Option<String>> + Send + Sync>,
    connected_to: Arc<std::sync::Mutex<Option<String>>>,
    /// The new master a sentinel named when the store left the old one for
    /// it, and when: for [`EXPECT_FOR`], a connection is made there only
    /// (see [`expect_master`]).
    expected: Arc<std::sync::Mutex<Option<(String, tokio::time::Instant)>>>,
    /// How long one question may take: a connection to each sentinel in
    /// turn, and an answer.
    patience: Duration,
}

impl Follow {
    /// The address the current connection was made to.
    fn connected(&self) -> Option<String> {
        self.connected_to
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }
}

/// Asks the sentinels, in turn, which address they name as `service`'s
/// master (`SENTINEL GET-MASTER-ADDR-BY-NAME`), over one connection kept to
/// the first that answers.
fn follow_sentinels(sentinels: &[String], service: &str, timeout: Duration, tls: Tls) -> Follow {
    let sentinels: Arc<[String]> = sentinels.into();
    let service: Arc<str> = service.into();
    let kept: Arc<tokio::sync::Mutex<Option<MultiplexedConnection>>> = Arc::default();
    // (Each question starts from the next sentinel: one that drops
    // connections without a word costs a question its connect timeout, not
    // every question all of it.)
    let turn = Arc::new(AtomicUsize::new(0));
    let patience = timeout
        .saturating_mul(
            u32::try_from(sentinels.len())
                .unwrap_or(u32::MAX)
                .saturating_add(1),
        )
        .max(Duration::from_millis(500));
    let config = AsyncConnectionConfig::new()
        .set_connection_timeout(Some(timeout))
        .set_response_timeout(Some(timeout));
    let master_now = move |another: bool| -> BoxFuture<Option<String>> {
        let (sentinels, service, kept) = (sentinels.clone(), service.clone(), kept.clone());
        let tls = tls.clone();
        let first = turn.fetch_add(1, Ordering::Relaxed);
        let config = config.clone();
        Box::pin(async move {
            let ask = |mut conn: MultiplexedConnection| {
                let service = service.clone();
                async move {
                    let (host, port): (String, u16) = redis::cmd("SENTINEL")
                        .arg("GET-MASTER-ADDR-BY-NAME")
                        .arg(&*service)
                        .query_async(&mut conn)
                        .await
                        .ok()?;
                    Some((format!("{host}:{port}"), conn))
                }
            };
            let mut slot = kept.lock().await;
            if another {
                *slot = None;
            }
            if let Some(conn) = slot.take() {
                if let Some((at, conn)) = ask(conn).await {
                    *slot = Some(conn);
                    return Some(at);
                }
            }
            let n = sentinels.len();
            for url in (0..n).filter_map(|i| sentinels.get((first + i) % n)) {
                let Ok(client) = tls.sentinel_client(url) else {
                    continue;
                };
                let Ok(conn) = client
                    .get_multiplexed_async_connection_with_config(&config)
                    .await
                else {
                    continue;
                };
                if let Some((at, conn)) = ask(conn).await {
                    *slot = Some(conn);
                    return Some(at);
                }
            }
            None
        })
    };
    Follow {
        master_now: Box::new(master_now),
        connected_to: Arc::default(),
        expected: Arc::default(),
        patience,
    }
}

/// Whether every sentinel answers that it knows no master named `service`
/// (`SENTINEL GET-MASTER-ADDR-BY-NAME` gives nil): a setup mistake. One
/// that cannot be reached, or answers otherwise, leaves it open: a master
/// that is down or failing over is still named. (redis-rs reports both as
/// `MasterNameNotFoundBySentinel`.)
async fn unknown_to_every_sentinel(
    sentinels: &[String],
    service: &str,
    timeout: Duration,
    tls: &Tls,
) -> bool {
    let config = AsyncConnectionConfig::new()
        .set_connection_timeout(Some(timeout))
        .set_response_timeout(Some(timeout));
    for url in sentinels {
        let Ok(client) = tls.sentinel_client(url) else {
            return false;
        };
        let Ok(mut conn) = client
            .get_multiplexed_async_connection_with_config(&config)
            .await
        else {
            return false;
        };
        let named: RedisResult<Option<(String, u16)>> = redis::cmd("SENTINEL")
            .arg("GET-MASTER-ADDR-BY-NAME")
            .arg(service)
            .query_async(&mut conn)
            .await;
        if !matches!(named, Ok(None)) {
            return false;
        }
    }
    !sentinels.is_empty()
}

/// A client of `service`'s master through `sentinels` (tried in that
/// order), with `certificates` for the master when its connection is TLS
/// (`mode`; `settings`: its credentials and database) and for the
/// sentinels when their urls are `rediss://`. (The sentinels share the
/// first one's credentials and protocol: redis-rs' builder takes one set,
/// and `build` refuses sentinels whose credentials differ.)
#[cfg(feature = "tls")]
fn sentinel_with_certificates(
    sentinels: &[String],
    service: &str,
    settings: Option<&redis::RedisConnectionInfo>,
    mode: Option<redis::TlsMode>,
    certificates: redis::TlsCertificates,
) -> RedisResult<redis::sentinel::SentinelClient> {
    use redis::sentinel::{SentinelClientBuilder, SentinelServerType};
    use redis::IntoConnectionInfo;
    let infos = sentinels
        .iter()
        .map(|url| url.as_str().into_connection_info())
        .collect::<RedisResult<Vec<_>>>()?;
    let addrs = infos.iter().map(|info| info.addr().clone());
    let mut builder = SentinelClientBuilder::new(addrs, service, SentinelServerType::Master)?;
    if let Some(first) = infos.first().map(redis::ConnectionInfo::redis_settings) {
        if let Some(username) = first.username() {
            builder = builder.set_client_to_sentinel_username(username);
        }
        if let Some(password) = first.password() {
            builder = builder.set_client_to_sentinel_password(password);
        }
        builder = builder.set_client_to_sentinel_protocol(first.protocol());
    }
    if sentinels.iter().all(|url| is_tls_url(url)) {
        builder = builder.set_client_to_sentinel_certificates(certificates.clone());
    }
    if let Some(settings) = settings {
        builder = builder
            .set_client_to_redis_db(settings.db())
            .set_client_to_redis_protocol(settings.protocol());
        if let Some(username) = settings.username() {
            builder = builder.set_client_to_redis_username(username);
        }
        if let Some(password) = settings.password() {
            builder = builder.set_client_to_redis_password(password);
        }
    }
    if let Some(mode) = mode {
        builder = builder
            .set_client_to_redis_tls_mode(mode)
            .set_client_to_redis_certificates(certificates);
    }
    builder.build()
}

/// How a [`Lazy`] treats its kind of connection.
#[derive(Clone, Copy)]
struct Shape {
    /// See [`Lazy::drop_when_broken`].
    drop_when_broken: bool,
    /// See [`Lazy::heals`].
    heals: bool,
    /// See [`Lazy::keepalive`]; `None` for none.
    keepalive: Option<Duration>,
    /// The deadline of a keepalive ping.
    ping_timeout: Duration,
    /// Whether checks carry a deadline on the store's one reading of the
    /// server's clock (not on a Cluster: its nodes' clocks may disagree by
    /// more than the margin, and the checks of a Cluster carry one on
    /// their master's: see `Watch::clock`).
    deadlines: bool,
    /// Whether a connection without a [`Watch`] of its own (a caller's
    /// Cluster pool) keeps a map of the slots (see `Watch::map_only`).
    slot_map: bool,
}

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;
type Connect<C> = Box<dyn Fn() -> BoxFuture<RedisResult<C>> + Send + Sync>;

/// A store kept in Redis (standalone, Cluster or Sentinel); clones share one
/// connection.
///
/// It needs Redis 6.0 or later (the scripts read the server's `TIME` and
/// keep TTLs with `KEEPTTL`), and a Tokio runtime: build it inside one, and
/// check inside one (its connection, batches and reconnects run as tasks).
///
/// ```no_run
/// use std::time::Duration;
/// use tower_ratelimit::store::redis::RedisStore;
///
/// # async fn run() -> Result<(), tower_ratelimit::StoreError> {
/// let store = RedisStore::builder()
///     .url("redis://127.0.0.1:6379")
///     .timeout(Duration::from_millis(50))
///     .build()
///     .await?;
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct RedisStore {
    inner: Arc<Inner>,
}

struct Inner {
    backend: Backend,
    /// Sends the checks of a multiplexed connection (the default one, or a
    /// caller's pool's) in batches; `None` for a Cluster, or a store built
    /// outside a Tokio runtime.
    batcher: Option<Batcher>,
    prefix: Box<str>,
    timeout: Duration,
    scripts: Arc<Scripts>,
    clock: Arc<ServerClock>,
}

impl Inner {
    /// The reading of the server's clock a check's deadline rides on: the
    /// store's one, or on a Cluster, that of the master that serves the
    /// check's slot.
    fn clock_of(&self, check: &Check) -> Option<&ServerClock> {
        match &self.backend {
            Backend::Cluster(_) | Backend::ClusterPool(_) => {
                let (watch, domain) = self.cluster_domain(&check.as_ref())?;
                watch.clock(domain)
            }
            Backend::Direct(_) | Backend::Pool(_) => Some(&self.clock),
        }
    }

    /// See [`Lazy::want_clock`].
    #[cold]
    #[inline(never)]
    fn want_clock(&self) {
        match &self.backend {
            Backend::Direct(lazy) => lazy.want_clock(),
            Backend::Cluster(lazy) => lazy.want_clock(),
            Backend::Pool(lazy) => lazy.want_clock(),
            Backend::ClusterPool(lazy) => lazy.want_clock(),
        }
    }

    /// On a Cluster: the slots' masters (see [`Lazy::masters`]), and the
    /// failure domain of the check's slot (see [`Watch::domain_of`]).
    fn cluster_domain(&self, check: &CheckRef<'_>) -> Option<(&Watch, u32)> {
        let watch = self.masters()?;
        let slot = check_slot(check)?;
        Some((watch, watch.domain_of(slot)))
    }

    /// See [`Lazy::masters`].
    fn masters(&self) -> Option<&Watch> {
        match &self.backend {
            Backend::Cluster(lazy) => lazy.masters().map(|w| &**w),
            Backend::ClusterPool(lazy) => lazy.masters().map(|w| &**w),
            Backend::Direct(_) | Backend::Pool(_) => None,
        }
    }
}

/// Checks sent together. redis-rs writes each command of a multiplexed
/// connection as it comes: the task that writes is woken by the request
/// that queued the command and runs right after it (Tokio's LIFO slot),
/// before the other requests ready in the same tick have queued theirs,
/// so a loaded server makes one write (one TCP segment, whose receiving
/// side loopback also runs on the sender's core) per check. The batcher
/// is one task that, once woken, yields once (so the requests ready in
/// this tick queue their checks) and sends what is queued as one pipeline:
/// one write, one buffer and one response deadline per batch instead of
/// per check, and no window to wait out (as envoyproxy's ratelimit has
/// with its pipeline window). One check alone goes at once, after that
/// one yield.
struct Batcher {
    jobs: tokio::sync::mpsc::UnboundedSender<Job>,
    /// The runtime the batching task runs on: checks made on another one
    /// (a store shared across runtimes) go one at a time, so none waits on
    /// a runtime that may have stopped, or is not being driven.
    runtime: tokio::runtime::Id,
}

/// One check waiting in a batch.
struct Job {
    call: Call,
    reply: Reply,
    /// When the check's deadline ends: counted from when it was queued, so
    /// the wait in the queue is inside it.
    due: tokio::time::Instant,
}

/// What a queued check sends.
enum Call {
    /// A command of its own.
    Own(redis::Cmd),
    /// A check that a batch script may run with others of its kind
    /// ([`Scripts::batch_of`]: one key, one argument), kept as the check
    /// itself (two reference counts, no allocation): its command is
    /// written only if it goes alone, and its key and numbers are written
    /// straight into its batch's call otherwise.
    Batchable {
        check: Check,
        kind: u8,
        /// Its deadline on the server's clock (see [`each_script_number`]).
        deadline: Option<i64>,
    },
}

impl Call {
    /// The command that sends this check alone.
    fn command(&self, prefix: &str, scripts: &Scripts) -> std::borrow::Cow<'_, redis::Cmd> {
        match self {
            Call::Own(cmd) => std::borrow::Cow::Borrowed(cmd),
            Call::Batchable {
                check, deadline, ..
            } => std::borrow::Cow::Owned(eval_cmd(prefix, scripts.get(check), check, *deadline)),
        }
    }

    /// [`command`](Self::command), owned.
    fn into_command(self, prefix: &str, scripts: &Scripts) -> redis::Cmd {
        match self {
            Call::Own(cmd) => cmd,
            Call::Batchable {
                check, deadline, ..
            } => eval_cmd(prefix, scripts.get(&check), &check, deadline),
        }
    }
}

/// Where a check's answer goes.
type Reply = tokio::sync::oneshot::Sender<Result<Vec<u8>, StoreError>>;

/// Whom one command of a batch's pipeline answers: one check (its own
/// command), or several of one kind (their batch script's call; the
/// checks are kept, to go one command each to a server that refuses it).
enum Answer {
    One(Reply),
    Many(Vec<Job>),
}

impl Answer {
    /// Sends every check of `answers` the answer `f` gives it, in order.
    fn each(answers: Vec<Answer>, mut f: impl FnMut(Reply)) {
        for answer in answers {
            match answer {
                Answer::One(reply) => f(reply),
                Answer::Many(jobs) => jobs.into_iter().for_each(|job| f(job.reply)),
            }
        }
    }
}

/// The most checks sent in one pipeline.
const MAX_BATCH: usize = 256;

/// The most checks decided by one call of a batch script: a call holds
/// Redis (every client of it) for its whole run, a few microseconds per
/// check.
const MAX_PER_CALL: usize = 64;

impl Batcher {
    /// Starts the batching task on the current runtime (none outside one),
    /// for a store whose keys start with `prefix`.
    fn spawn<C>(lazy: &Arc<Lazy<C>>, deadline: Duration, prefix: &str) -> Option<Self>
    where
        C: AskAgain + Clone + Send + Sync + 'static,
    {
        let runtime = tokio::runtime::Handle::try_current().ok()?;
        let (jobs, queue) = tokio::sync::mpsc::unbounded_channel();
        let prefix = Arc::from(prefix);
        runtime.spawn(batch_loop(Arc::downgrade(lazy), queue, deadline, prefix));
        Some(Self {
            jobs,
            runtime: runtime.id(),
        })
    }

    /// Whether the caller runs on the batching task's runtime.
    fn here(&self) -> bool {
        tokio::runtime::Handle::try_current().is_ok_and(|h| h.id() == self.runtime)
    }

    /// Queues `call` and waits for its reply. The batch's deadline, which
    /// ends with its earliest check's, bounds the wait: a batch always
    /// answers every check it holds.
    async fn invoke(&self, call: Call, deadline: Duration) -> Result<Vec<u8>, StoreError> {
        let (reply, answer) = tokio::sync::oneshot::channel();
        let due = tokio::time::Instant::now() + deadline;
        let job = Job { call, reply, due };
        if self.jobs.send(job).is_err() {
            // (The batching task is gone: its runtime shut down.)
            return Err(not_connected());
        }
        answer.await.unwrap_or_else(|_| Err(not_connected()))
    }
}

/// The batching task: takes what is queued once the requests of this tick
/// have run, and sends it as one pipeline (each on its own task, so a slow
/// batch does not hold the next). Ends with the store, and holds its
/// connection only while a batch is on it (a caller's pool gets its
/// connection back as the store is dropped).
async fn batch_loop<C>(
    lazy: std::sync::Weak<Lazy<C>>,
    mut queue: tokio::sync::mpsc::UnboundedReceiver<Job>,
    deadline: Duration,
    prefix: Arc<str>,
) where
    C: AskAgain + Clone + Send + Sync + 'static,
{
    let mut jobs = Vec::new();
    while queue.recv_many(&mut jobs, MAX_BATCH).await > 0 {
        tokio::task::yield_now().await;
        while jobs.len() < MAX_BATCH {
            match queue.try_recv() {
                Ok(job) => jobs.push(job),
                Err(_) => break,
            }
        }
        let batch = std::mem::take(&mut jobs);
        let Some(lazy) = lazy.upgrade() else { return };
        tokio::spawn(send_batch(lazy, batch, deadline, Arc::clone(&prefix)));
    }
}

/// Sends one batch as a pipeline and answers each of its checks. Bounded
/// by its earliest check's deadline, a `NOSCRIPT` reload and second try
/// included; a check whose deadline passed in the queue is answered at once
/// and not sent. The connection's health is observed once per batch, and
/// a timeout counts against it only when Redis had at least half the
/// deadline (a runtime too busy to send in time is not Redis's fault).
async fn send_batch<C>(lazy: Arc<Lazy<C>>, mut jobs: Vec<Job>, deadline: Duration, prefix: Arc<str>)
where
    C: AskAgain + Clone + Send + Sync + 'static,
{
    let sent_at = tokio::time::Instant::now();
    if jobs
        .iter()
        .any(|job| job.due <= sent_at || job.reply.is_closed())
    {
        late(&mut jobs, sent_at);
        if jobs.is_empty() {
            return;
        }
    }
    // (The batch ends when its earliest check's deadline does.)
    let due = jobs
        .iter()
        .map(|job| job.due)
        .min()
        .unwrap_or(sent_at + deadline);
    let counts = due.saturating_duration_since(sent_at) * 2 >= deadline;
    let started = sent_at;
    let timed_out = |lazy: &Arc<Lazy<C>>| {
        if counts {
            lazy.observe_timeout(started);
        }
    };
    let Some(mut conn) = lazy.get() else {
        lazy.reconnect();
        for job in jobs {
            let _ = job.reply.send(Err(not_connected()));
        }
        return;
    };
    if jobs.len() == 1 {
        // A check alone: sent as the command it is (no pipeline, no lists).
        for job in jobs {
            let cmd = job.call.command(&prefix, &lazy.scripts);
            let sent = tokio::time::timeout_at(due, run_one(&lazy, &mut conn, &cmd)).await;
            let result = match sent {
                Ok(result) => {
                    lazy.observe(&result, started);
                    result.map_err(store_error)
                }
                Err(_) => {
                    timed_out(&lazy);
                    Err(StoreError::timeout())
                }
            };
            let _ = job.reply.send(result);
        }
        return;
    }
    let (pipe, answers) = pipeline(&lazy, &prefix, jobs);
    let sent =
        tokio::time::timeout_at(due, run_batch(&lazy, &prefix, &mut conn, &pipe, &answers)).await;
    match sent {
        Ok(Ok((results, health))) => {
            lazy.observe::<()>(&health.map_or(Ok(()), Err), started);
            let mut results = results.into_iter();
            Answer::each(answers, |reply| {
                let result = results.next().unwrap_or_else(|| Err(short_reply()));
                if matches!(&result, Err(e) if !lazy.heals && is_moved(e)) {
                    lazy.tell_moved();
                }
                let _ = reply.send(result.map_err(store_error));
            });
        }
        Ok(Err(error)) => {
            lazy.observe::<()>(&Err(error.clone()), started);
            Answer::each(answers, |reply| {
                let _ = reply.send(Err(store_error(error.clone())));
            });
        }
        Err(_) => {
            timed_out(&lazy);
            Answer::each(answers, |reply| {
                let _ = reply.send(Err(StoreError::timeout()));
            });
        }
    }
}

/// Answers the checks of `jobs` whose deadline is over at `now` with a
/// timeout, drops those whose caller is gone (a request dropped while its
/// check waited in the queue: sent, it would spend the user's budget for
/// an answer no one reads), and keeps the others. (Out of line: only a
/// stalled runtime, or a dropped request, gets here.)
#[cold]
#[inline(never)]
fn late(jobs: &mut Vec<Job>, now: tokio::time::Instant) {
    let mut kept = Vec::with_capacity(jobs.len());
    for job in jobs.drain(..) {
        if job.reply.is_closed() {
            continue;
        }
        if job.due <= now {
            let _ = job.reply.send(Err(StoreError::timeout()));
        } else {
            kept.push(job);
        }
    }
    *jobs = kept;
}

/// A batch's pipeline: the checks that have a batch script, two or more of
/// a kind, as one call of it; every other check as its own command. (Two
/// checks of one kind keep their order; checks of different kinds, which
/// came at the same moment, may run in another order than they were
/// queued, each atomically.)
fn pipeline<C>(lazy: &Lazy<C>, prefix: &str, jobs: Vec<Job>) -> (redis::Pipeline, Vec<Answer>) {
    let combine = lazy.combine.load(Ordering::Relaxed);
    let mut pipe = redis::Pipeline::with_capacity(jobs.len());
    let mut answers = Vec::with_capacity(jobs.len());
    let mut kinds: Vec<(u8, Vec<Job>)> = Vec::new();
    for job in jobs {
        match &job.call {
            Call::Batchable { kind, .. } if combine => {
                let kind = *kind;
                match kinds
                    .iter_mut()
                    .find(|(k, same)| *k == kind && same.len() < MAX_PER_CALL)
                {
                    Some((_, same)) => same.push(job),
                    None => kinds.push((kind, vec![job])),
                }
            }
            _ => {
                pipe.add_command(job.call.into_command(prefix, &lazy.scripts));
                answers.push(Answer::One(job.reply));
            }
        }
    }
    for (kind, same) in kinds {
        let call = match (same.len(), lazy.scripts.batched(kind)) {
            (2.., Some(script)) => batch_call(script, prefix, &same),
            _ => None,
        };
        match call {
            Some(call) => {
                pipe.add_command(call);
                answers.push(Answer::Many(same));
            }
            None => {
                for job in same {
                    pipe.add_command(job.call.into_command(prefix, &lazy.scripts));
                    answers.push(Answer::One(job.reply));
                }
            }
        }
    }
    (pipe, answers)
}

/// A batchable check's one argument (see [`ScriptArgs`]), on the stack;
/// `None` past its room (more windows than a batch script has).
fn batch_numbers(check: &Check, deadline: Option<i64>) -> Option<BatchNumbers> {
    let mut numbers = BatchNumbers::new();
    let mut fits = true;
    each_script_number(check, deadline, |n| {
        fits &= numbers.try_extend_from_slice(&word(n)).is_ok();
    });
    fits.then_some(numbers)
}

/// Room for a batchable check's numbers: its fixed ones (at most 7, see
/// [`each_script_number`]) and two per window, [`STRAIGHT_MAX_WINDOWS`] of
/// them.
type BatchNumbers = arrayvec::ArrayVec<u8, { 8 * (8 + 2 * STRAIGHT_MAX_WINDOWS) }>;

/// One call of `script` for the checks of `jobs` (each a batchable check:
/// one key and one argument), written straight from the checks: their
/// keys, then each run of checks with the same numbers as those numbers
/// and the run's length (`scripts/batched.lua`). The checks keep their
/// order (two of one key must run in the order they came), so numbers that
/// alternate go once per run. `None` if a check is not of that shape.
fn batch_call(script: &Script, prefix: &str, jobs: &[Job]) -> Option<redis::Cmd> {
    let mut runs: Vec<(BatchNumbers, usize)> = Vec::with_capacity(1);
    let mut key_bytes = 0;
    for job in jobs {
        let Call::Batchable {
            check, deadline, ..
        } = &job.call
        else {
            return None;
        };
        let numbers = batch_numbers(check, *deadline)?;
        key_bytes += prefix.len() + check.budget.len() + 24;
        match runs.last_mut() {
            Some((same, count)) if *same == numbers => *count += 1,
            _ => runs.push((numbers, 1)),
        }
    }
    let bytes = key_bytes + runs.iter().map(|(n, _)| n.len() + 32).sum::<usize>();
    let mut call = redis::Cmd::with_capacity(3 + jobs.len() + 2 * runs.len(), 64 + bytes);
    call.arg("EVALSHA").arg(script.get_hash()).arg(jobs.len());
    for job in jobs {
        if let Call::Batchable { check, .. } = &job.call {
            call.arg(KeyArg {
                prefix,
                check,
                kind: KeyKind::State,
            });
        }
    }
    for (numbers, count) in runs {
        call.arg(&numbers[..]).arg(count);
    }
    Some(call)
}

/// One command's reply, sent again once the scripts are loaded if Redis
/// did not know its script.
async fn run_one<C: AskAgain + Clone>(
    lazy: &Lazy<C>,
    conn: &mut C,
    cmd: &redis::Cmd,
) -> RedisResult<Vec<u8>> {
    match conn.req_packed_command(cmd).await.and_then(bulk) {
        // (Boxed: a rare path, kept out of every batch's future.)
        Err(e) if is_noscript(&e) => {
            Box::pin(reload_and_retry(conn, cmd, &lazy.scripts, &[])).await
        }
        result => result,
    }
}

/// A batch's answers, one per check in the order of `answers`: its
/// pipeline's replies, a batch script's list split among its checks.
/// Checks of a batch script the server refused for their keys' slots go
/// again one command each (and their kind does from then on); the error
/// of that second try, if any, is returned too, for the connection's
/// health.
async fn run_batch<C: ConnectionLike + Clone>(
    lazy: &Lazy<C>,
    prefix: &str,
    conn: &mut C,
    pipe: &redis::Pipeline,
    answers: &[Answer],
) -> RedisResult<(Vec<RedisResult<Vec<u8>>>, Option<RedisError>)> {
    let replies = run_pipeline(lazy, conn, pipe).await?;
    let mut health = None;
    let mut out = Vec::with_capacity(pipe.len());
    for (reply, answer) in replies.into_iter().zip(answers) {
        match answer {
            Answer::One(_) => out.push(reply.and_then(bulk)),
            Answer::Many(jobs) => match reply {
                Err(e)
                    if e.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::CrossSlot) =>
                {
                    lazy.combine.store(false, Ordering::Relaxed);
                    let mut each = redis::Pipeline::with_capacity(jobs.len());
                    for job in jobs {
                        each.add_command(job.call.command(prefix, &lazy.scripts).into_owned());
                    }
                    // (A failed second try answers only these checks.)
                    match run_pipeline(lazy, conn, &each).await {
                        Ok(again) => out.extend(again.into_iter().map(|r| r.and_then(bulk))),
                        Err(error) => {
                            out.extend(std::iter::repeat_n(Err(error.clone()), jobs.len()));
                            health = Some(error);
                        }
                    }
                }
                reply => split(reply, jobs.len(), &mut out),
            },
        }
    }
    // (A replica's answer, to the call or to a check inside a batch
    // script's, or a connection that broke under a `NOSCRIPT` reload or its
    // second try: the connection is to be remade, now rather than at the
    // next batch.)
    if health.is_none() {
        health = out.iter().find_map(|r| {
            r.as_ref()
                .err()
                .filter(|e| read_only(e) || broken(e))
                .cloned()
        });
    }
    Ok((out, health))
}

/// A batch script's reply, one answer per check (`n` of them) into `out`.
fn split(reply: RedisResult<redis::Value>, n: usize, out: &mut Vec<RedisResult<Vec<u8>>>) {
    match reply {
        Ok(redis::Value::Array(items)) if items.len() == n => {
            out.extend(items.into_iter().map(bulk));
        }
        Ok(other) => {
            let error = RedisError::from((
                redis::ErrorKind::UnexpectedReturnType,
                "a batch of checks got no list of one answer per check",
                format!("{other:?}"),
            ));
            out.extend(std::iter::repeat_n(Err(error), n));
        }
        Err(error) => out.extend(std::iter::repeat_n(Err(error), n)),
    }
}

/// One pipeline's replies, one per command (a server's error reply as an
/// error); commands Redis did not know the script of (`NOSCRIPT`: its
/// script cache was flushed) are sent again once their scripts are loaded.
async fn run_pipeline<C: ConnectionLike + Clone>(
    lazy: &Lazy<C>,
    conn: &mut C,
    pipe: &redis::Pipeline,
) -> RedisResult<Vec<RedisResult<redis::Value>>> {
    let replies = conn.req_packed_commands(pipe, 0, pipe.len()).await?;
    if replies.len() != pipe.len() {
        return Err(short_reply());
    }
    let mut results: Vec<RedisResult<redis::Value>> = replies.into_iter().map(own_error).collect();
    let unknown: Vec<usize> = results
        .iter()
        .enumerate()
        .filter(|(_, r)| matches!(r, Err(e) if is_noscript(e)))
        .map(|(i, _)| i)
        .collect();
    if unknown.is_empty() {
        return Ok(results);
    }
    // (A failed reload or second try answers only the commands it was
    // for: the others have run, and keep their answers.)
    let unknown_cmds = || {
        pipe.cmd_iter()
            .enumerate()
            .filter_map(|(i, cmd)| unknown.contains(&i).then_some(cmd))
    };
    let second = async {
        lazy.scripts.load_for(conn, unknown_cmds()).await?;
        let mut again = redis::Pipeline::with_capacity(unknown.len());
        for cmd in unknown_cmds() {
            again.add_command(cmd.clone());
        }
        let second = conn.req_packed_commands(&again, 0, again.len()).await?;
        if second.len() != unknown.len() {
            return Err(short_reply());
        }
        Ok(second)
    }
    .await;
    match second {
        Ok(second) => {
            for (&i, value) in unknown.iter().zip(second) {
                if let Some(slot) = results.get_mut(i) {
                    *slot = own_error(value);
                }
            }
        }
        Err(error) => {
            for &i in &unknown {
                if let Some(slot) = results.get_mut(i) {
                    *slot = Err(error.clone());
                }
            }
        }
    }
    Ok(results)
}

/// A command's reply, or its error: the command's own, not one in a list
/// it answers (a batch script's failed check), which
/// `Value::extract_error` would make the whole reply's.
fn own_error(value: redis::Value) -> RedisResult<redis::Value> {
    match value {
        redis::Value::ServerError(error) => Err(error.into()),
        value => Ok(value),
    }
}

/// A pipeline answered with fewer replies than it had commands (redis-rs
/// does not, but a check must never be left without an answer).
fn short_reply() -> RedisError {
    RedisError::from((
        redis::ErrorKind::UnexpectedReturnType,
        "a pipeline of checks got fewer replies than it sent",
    ))
}

/// A script's reply: one string (a server error as the error it is).
fn bulk(value: redis::Value) -> RedisResult<Vec<u8>> {
    match value.extract_error()? {
        redis::Value::BulkString(bytes) => Ok(bytes),
        other => Err(RedisError::from((
            redis::ErrorKind::UnexpectedReturnType,
            "a rate-limit script answered with no string",
            format!("{other:?}"),
        ))),
    }
}

enum Backend {
    Direct(Arc<Lazy<MultiplexedConnection>>),
    Cluster(Arc<Lazy<ClusterConnection>>),
    Pool(Arc<Lazy<Held<deadpool_redis::Connection, MultiplexedConnection>>>),
    ClusterPool(Arc<Lazy<Held<deadpool_redis::cluster::Connection, ClusterConnection>>>),
}

/// A connection of a caller's pool, checked out for as long as the store
/// uses it: the pool's connections multiplex, so one serves every check,
/// and a check costs one command instead of a checkout's health check
/// (`UNWATCH` + `PING` on every `pool.get()`) and the script. Clones share
/// the checkout; the last one dropped (the store's, or a broken
/// connection's once the store has stopped using it) gives the connection
/// back to the pool, whose own health check then keeps or replaces it.
struct Held<O, C> {
    conn: C,
    _checkout: Arc<O>,
}

impl<O, C: Clone> Clone for Held<O, C> {
    fn clone(&self) -> Self {
        Self {
            conn: self.conn.clone(),
            _checkout: self._checkout.clone(),
        }
    }
}

impl<O: Send + Sync, C: ConnectionLike + Send> ConnectionLike for Held<O, C> {
    fn req_packed_command<'a>(
        &'a mut self,
        cmd: &'a redis::Cmd,
    ) -> redis::RedisFuture<'a, redis::Value> {
        self.conn.req_packed_command(cmd)
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        cmd: &'a redis::Pipeline,
        offset: usize,
        count: usize,
    ) -> redis::RedisFuture<'a, Vec<redis::Value>> {
        self.conn.req_packed_commands(cmd, offset, count)
    }

    fn get_db(&self) -> i64 {
        self.conn.get_db()
    }
}

/// How the store checks a connection out of a caller's pool and keeps it
/// (see [`Held`]); a checkout that waits past `timeout` (an exhausted pool
/// without a wait timeout of its own) fails, and is tried again.
fn checkout<O, C>(
    get: impl Fn() -> BoxFuture<Result<O, deadpool_redis::PoolError>> + Send + Sync + 'static,
    timeout: Duration,
) -> Connect<Held<O, C>>
where
    O: std::ops::Deref<Target = C> + Send + Sync + 'static,
    C: Clone + 'static,
{
    Box::new(move || {
        let get = get();
        Box::pin(async move {
            let object = match tokio::time::timeout(timeout, get).await {
                Ok(Ok(object)) => object,
                Ok(Err(deadpool_redis::PoolError::Backend(e))) => return Err(e),
                Ok(Err(e)) => return Err(io_error(std::io::ErrorKind::Other, e.to_string())),
                Err(_) => {
                    return Err(io_error(
                        std::io::ErrorKind::TimedOut,
                        "no connection from the pool in time".to_owned(),
                    ))
                }
            };
            Ok(Held {
                conn: (*object).clone(),
                _checkout: Arc::new(object),
            })
        })
    })
}

fn io_error(kind: std::io::ErrorKind, message: String) -> RedisError {
    RedisError::from(std::io::Error::new(kind, message))
}

impl std::fmt::Debug for RedisStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let shape = match self.inner.backend {
            Backend::Direct(_) => "multiplexed",
            Backend::Cluster(_) => "cluster",
            Backend::Pool(_) => "pool",
            Backend::ClusterPool(_) => "cluster pool",
        };
        f.debug_struct("RedisStore")
            .field("shape", &shape)
            .field("prefix", &self.inner.prefix)
            .field("timeout", &self.inner.timeout)
            .finish()
    }
}

/// A connection that is made, and remade when it breaks, in the background.
struct Lazy<C> {
    current: ArcSwapOption<C>,
    connect: Connect<C>,
    reconnecting: AtomicBool,
    timeouts: AtomicU32,
    /// When the last timeout counted in `timeouts` was seen (see
    /// [`Lazy::micros`]; 0: none yet).
    last_timeout: AtomicU64,
    /// The origin of `last_timeout` (on tokio's clock, as the calls'
    /// deadlines).
    origin: tokio::time::Instant,
    /// Whether a broken connection is dropped at once (a multiplexed
    /// connection never recovers; the cluster client heals itself).
    drop_when_broken: bool,
    /// Whether the connection is a Cluster client's, which reconnects to a
    /// node itself: an I/O error from one node (a master down) is no reason
    /// to replace the whole client (and reload every script on every node).
    heals: bool,
    /// Set by every reply; the keepalive task clears it, and pings a
    /// connection that stayed idle.
    used: AtomicBool,
    /// When a call last got a reply (see [`Lazy::micros`]; 0: never): a
    /// reconnect loop beside a kept Cluster client ends once it answers
    /// again.
    answered_at: AtomicU64,
    /// Whether a `MOVED` on a connection to one server was logged.
    told_moved: AtomicBool,
    /// Whether a reconnect refused for a wrong setup was logged (once, until
    /// a connection is made: a Cluster's loops end and start again while
    /// its kept client answers).
    told_misconfigured: AtomicBool,
    clock: Arc<ServerClock>,
    /// Set for Sentinel (see [`Follow`]).
    follow: Option<Follow>,
    /// Set for a Cluster the store made (see [`Watch`]).
    watch: Option<Arc<Watch>>,
    /// Set for a Cluster without a watch (a caller's pool): the slots'
    /// masters, read every [`SLOT_MAP_EVERY`] (see `Watch::map_only`; a
    /// watch's are read so too, while it holds no master).
    map_only: Option<Arc<Watch>>,
    /// See [`Shape::deadlines`].
    deadlines: bool,
    /// Whether a round of [`read_master_clocks`](Self::read_master_clocks)
    /// runs (in a task of its own: see [`maintain`](Self::maintain)).
    reading_clocks: AtomicBool,
    /// When (see [`Lazy::micros`]; 0: never) a check last had the
    /// server's clock read at once (see [`want_clock`](Self::want_clock)).
    clock_wanted_at: AtomicU64,
    scripts: Arc<Scripts>,
    /// Whether a batch's checks of one kind go as one call of their batch
    /// script; turned off for good when the server refuses a call whose
    /// keys live in several slots (a proxy in front of a sharded
    /// deployment), after which they go one command each.
    combine: AtomicBool,
    /// Bounds loading the scripts on a new connection (a pool's may have
    /// no response timeout, or a long one).
    load_timeout: Duration,
    /// Bounds the calls that tell whether a Cluster client reaches its
    /// masters (each also cut by the client's response timeout): twice the
    /// connection timeout and the response timeout, as a client may first
    /// finish a refresh of its slots, which waits on a master in trouble
    /// (its checks wait meanwhile, as ever).
    probe_timeout: Duration,
    /// Bounds the script a new connection runs before checks are sent on
    /// it (see [`runs_scripts`](Self::runs_scripts)): the checks' own
    /// deadline.
    ready_timeout: Duration,
    /// Whether a connection was ever made (the first is logged as made,
    /// the next ones as made again).
    connected_once: AtomicBool,
    /// On a Cluster: the first key of the last check that failed, which a
    /// new client must reach to replace a kept one (see
    /// [`try_connect`](Self::try_connect)).
    failed_key: ArcSwapOption<Vec<u8>>,
    /// On a Cluster: when (see [`Lazy::micros`]) a new client may next be
    /// made beside a kept one that answers.
    next_replacement: AtomicU64,
    /// See [`Common::probe_key`].
    probe_key: Arc<str>,
}

/// A reading of the server's clock under way (a round of a Cluster's
/// masters', or one asked for by a check: see `Lazy::want_clock`): lets
/// the next start when this one ends, however it ends.
struct ClockRound<C>(Arc<Lazy<C>>);

impl<C> Drop for ClockRound<C> {
    fn drop(&mut self) {
        self.0.reading_clocks.store(false, Ordering::Release);
    }
}

/// What every connection of a store shares: its scripts, its reading of
/// the server's clock, and the bound on a new connection's setup.
#[derive(Clone)]
struct Common {
    scripts: Arc<Scripts>,
    clock: Arc<ServerClock>,
    load_timeout: Duration,
    /// A key of the store's (under its prefix) that no budget uses, on
    /// which a new store asks whether its user may run its checks (see
    /// [`Lazy::check_access`]).
    probe_key: Arc<str>,
}

impl<C: AskAgain + Clone + Send + Sync + 'static> Lazy<C> {
    fn new(
        connect: Connect<C>,
        shape: Shape,
        common: &Common,
        follow: Option<Follow>,
        watch: Option<Arc<Watch>>,
    ) -> Arc<Self> {
        let Common {
            scripts,
            clock,
            load_timeout,
            probe_key,
        } = common.clone();
        let map_only = match (&watch, shape.slot_map) {
            (None, true) => Watch::map_only(),
            _ => None,
        };
        Arc::new(Self {
            clock,
            follow,
            watch,
            map_only,
            deadlines: shape.deadlines,
            reading_clocks: AtomicBool::new(false),
            clock_wanted_at: AtomicU64::new(0),
            current: ArcSwapOption::empty(),
            connect,
            reconnecting: AtomicBool::new(false),
            timeouts: AtomicU32::new(0),
            last_timeout: AtomicU64::new(0),
            origin: tokio::time::Instant::now(),
            drop_when_broken: shape.drop_when_broken,
            heals: shape.heals,
            used: AtomicBool::new(false),
            answered_at: AtomicU64::new(0),
            told_moved: AtomicBool::new(false),
            told_misconfigured: AtomicBool::new(false),
            scripts,
            combine: AtomicBool::new(true),
            load_timeout,
            probe_timeout: load_timeout / 2 + shape.ping_timeout,
            ready_timeout: shape.ping_timeout,
            connected_once: AtomicBool::new(false),
            failed_key: ArcSwapOption::empty(),
            next_replacement: AtomicU64::new(0),
            probe_key,
        })
    }

    /// Connects now, or, when that fails (logged, naming `what`), keeps
    /// trying in the background: a store is usable before Redis is, its
    /// checks failing meanwhile. Its upkeep runs in the background too (see
    /// [`maintain`](Self::maintain)), and, with `follow`, the question of
    /// where the master is (see [`follow`](Self::follow)). A target set up
    /// wrongly (see [`misconfigured`]) is an error: no retry would mend it,
    /// and the layer would apply its fail mode for good.
    async fn launch(
        connect: Connect<C>,
        shape: Shape,
        common: &Common,
        follow: Option<Follow>,
        watch: Option<Arc<Watch>>,
        what: &str,
    ) -> Result<Arc<Self>, StoreError> {
        let lazy = Self::new(connect, shape, common, follow, watch);
        if lazy.follow.is_some() {
            lazy.follow();
        }
        // (A Cluster's masters are asked as the client connects: one that
        // hangs is held before the first check of its slots.)
        let survey = async {
            if let Some(watch) = &lazy.watch {
                watch.survey().await;
            }
        };
        let (connected, ()) = tokio::join!(lazy.try_connect(), survey);
        match connected.map(|()| lazy.check_access()) {
            Ok(access) => {
                if let Err(error) = access.await {
                    return Err(config_error(format!("{what}: {error}")));
                }
                // (The first checks carry deadlines too, when the masters
                // answer in time; a slower one's reading goes on behind.)
                lazy.read_slot_map(shape.ping_timeout).await;
                if let Some(round) = lazy.read_clocks_behind(shape.ping_timeout) {
                    let _ = tokio::time::timeout(shape.ping_timeout, round).await;
                }
            }
            Err(error) if misconfigured(&error) => {
                let hint = match error.to_string().contains(NOT_A_CLUSTER_SIGN) {
                    true => format!(" ({NOT_A_CLUSTER})"),
                    false => String::new(),
                };
                return Err(config_error(format!("{what}: {error}{hint}")));
            }
            Err(error) if is_replica(&error) => {
                tracing::warn!(
                    %error,
                    "{what} is a replica; retrying in the background until it is a master"
                );
                // (Said: not again by the loop's first try.)
                lazy.told_misconfigured.store(true, Ordering::Relaxed);
                lazy.reconnect();
            }
            Err(error) if error.to_string().contains(SCRIPTS_TOO_SLOW) => {
                tracing::warn!(
                    %error,
                    "{what} answers, but runs no script in time yet; retrying in the background"
                );
                lazy.reconnect();
            }
            Err(error) => {
                tracing::warn!(
                    %error,
                    "{what} not reachable yet; retrying in the background (if this lasts: is the server up, and does its port speak TLS exactly when the url is rediss://?)"
                );
                lazy.reconnect();
            }
        }
        lazy.maintain(shape.keepalive.filter(|p| !p.is_zero()), shape.ping_timeout);
        Ok(lazy)
    }

    /// Every tick (a second, or half the keepalive period if shorter):
    /// reads the server's clock when it is due (see [`ServerClock`]; on a
    /// Cluster, each master's, as its nodes keep clocks of their own: see
    /// [`read_master_clocks`](Self::read_master_clocks), and the slots
    /// every [`SLOT_MAP_EVERY`]: see [`read_slot_map`](Self::read_slot_map));
    /// and, with a
    /// `keepalive` period, reads it too when that long passed without a
    /// reply on the connection: the reading is the ping, so a connection
    /// the server (its `timeout`), a load balancer or a NAT closed while
    /// idle is found, and replaced, before a request needs it, and one kept
    /// busy is never closed for idleness. While checks flow, one command
    /// every [`CLOCK_READ_EVERY`] (on a Cluster, one per master, and a
    /// `CLUSTER SLOTS` every [`SLOT_MAP_EVERY`]), none per request. Ends
    /// with the store.
    fn maintain(self: &Arc<Self>, keepalive: Option<Duration>, ping_timeout: Duration) {
        const SECOND: Duration = Duration::from_secs(1);
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let weak = Arc::downgrade(self);
        // (Half the keepalive: a connection is pinged once idle for the
        // keepalive, and at most half that again.)
        let tick = keepalive.map_or(SECOND, |k| (k / 2).clamp(Duration::from_millis(1), SECOND));
        // (Ticks without a reply after which the connection is idle.)
        let idle_after = keepalive.map(|k| {
            u32::try_from(k.as_nanos().div_ceil(tick.as_nanos().max(1)))
                .unwrap_or(u32::MAX)
                .max(1)
        });
        runtime.spawn(async move {
            let mut ticks = tokio::time::interval(tick);
            ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            ticks.tick().await;
            let mut unused = 0u32;
            let mut map_read = tokio::time::Instant::now();
            loop {
                ticks.tick().await;
                let Some(this) = weak.upgrade() else { return };
                if this.masters().is_some() && map_read.elapsed() >= SLOT_MAP_EVERY {
                    map_read = tokio::time::Instant::now();
                    this.read_slot_map(ping_timeout).await;
                }
                this.read_clocks_behind(ping_timeout);
                unused = match this.used.swap(false, Ordering::Relaxed) {
                    true => 0,
                    false => unused.saturating_add(1),
                };
                let idle = idle_after.is_some_and(|n| unused >= n);
                let due = idle || (this.deadlines && this.clock.stale());
                if !due {
                    continue;
                }
                let Some(mut conn) = this.get() else { continue };
                let started = tokio::time::Instant::now();
                let read = this.clock.read(&mut conn);
                match tokio::time::timeout(ping_timeout, read).await {
                    Ok(result) => this.observe(&result, started),
                    Err(_) => this.observe_timeout(started),
                }
                // (The reading's own reply marked the connection used.)
                this.used.store(false, Ordering::Relaxed);
                unused = 0;
            }
        });
    }

    /// A check found the clock of the server that runs it unknown (not
    /// read yet on a new connection, doubted after a refusal as late, a
    /// Cluster master new to the slot map): it is read now, in a task of
    /// its own, not at the upkeep's next tick, a second on at most; until
    /// then a check that server runs after a stall is recorded though the
    /// layer answered it by its fail mode. At most once every
    /// [`CLOCK_WANTED_EVERY`] (on a Cluster, a round of the masters' clocks
    /// that are due, one round at a time). (Out of line: rare.)
    #[cold]
    #[inline(never)]
    fn want_clock(self: &Arc<Self>) {
        // (A Cluster's own clock is not its checks': its masters' are.)
        let cluster = self.masters().is_some();
        if !self.deadlines && !cluster {
            return;
        }
        let now = self.micros(tokio::time::Instant::now());
        let last = self.clock_wanted_at.load(Ordering::Relaxed);
        let every = crate::clock::duration_micros(CLOCK_WANTED_EVERY);
        if (last != 0 && now.saturating_sub(last) < every)
            || self
                .clock_wanted_at
                .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
                .is_err()
        {
            return;
        }
        if cluster {
            self.read_clocks_behind(self.ready_timeout);
            return;
        }
        // (No connection: the reconnect reads it as it connects. One
        // reading at a time: a server that hangs is not sent another every
        // turn.)
        let (Ok(runtime), Some(mut conn)) = (tokio::runtime::Handle::try_current(), self.get())
        else {
            return;
        };
        if self.reading_clocks.swap(true, Ordering::AcqRel) {
            return;
        }
        let generation = self.clock.generation.load(Ordering::Acquire);
        let round = ClockRound(Arc::clone(self));
        let patience = self.ready_timeout.max(CLOCK_PATIENCE);
        runtime.spawn(async move {
            let this = &round.0;
            let cmd = redis::cmd("TIME");
            let time = cmd.query_async(&mut conn);
            let read = tokio::time::timeout(patience, this.clock.read_since(generation, time));
            // (A server that refuses `TIME` is asked again only as the
            // upkeep reads the clock, once a second, not at every turn; a
            // slow or broken connection is no refusal.)
            if let Ok(Err(e)) = read.await {
                if !e.is_timeout() && !broken(&e) {
                    let later = this
                        .micros(tokio::time::Instant::now())
                        .saturating_add(crate::clock::duration_micros(CLOCK_READ_EVERY));
                    this.clock_wanted_at.store(later, Ordering::Relaxed);
                }
            }
            drop(round);
        });
    }

    /// On a Cluster: a round of
    /// [`read_master_clocks`](Self::read_master_clocks), each reading
    /// bounded by `timeout` or [`CLOCK_PATIENCE`] (the longer), in a task
    /// of its own (a master slow to answer delays neither the upkeep's
    /// other work nor the store's start), one round at a time; `None` when
    /// no clock is due, or one runs already (or on one server, or outside
    /// a Tokio runtime). (The round holds the store's connection until it
    /// ends, at most that long after the store is dropped.)
    fn read_clocks_behind(
        self: &Arc<Self>,
        timeout: Duration,
    ) -> Option<tokio::task::JoinHandle<()>> {
        let runtime = tokio::runtime::Handle::try_current().ok()?;
        if self.masters()?.clocks_due().is_empty()
            || self.reading_clocks.swap(true, Ordering::AcqRel)
        {
            return None;
        }
        let round = ClockRound(Arc::clone(self));
        Some(runtime.spawn(async move {
            round
                .0
                .read_master_clocks(timeout.max(CLOCK_PATIENCE))
                .await;
            drop(round);
        }))
    }

    /// The slots' masters of a Cluster: the store's watch of them, or the
    /// map a caller's pool keeps.
    fn masters(&self) -> Option<&Arc<Watch>> {
        self.watch.as_ref().or(self.map_only.as_ref())
    }

    /// On a Cluster: reads the slots' masters (`CLUSTER SLOTS` of any
    /// node, bounded by `timeout`) into the map of a caller's pool, or into
    /// the store's watch while it holds no master (its own rounds read them
    /// while it does; a check does not fail when its slot moves, and the
    /// watch would otherwise keep the old master for it).
    async fn read_slot_map(&self, timeout: Duration) {
        let map = match (&self.map_only, &self.watch) {
            (Some(map), _) => map,
            (None, Some(watch)) if !watch.any_held() => watch,
            _ => return,
        };
        let Some(mut conn) = self.get() else {
            return;
        };
        let seen = map.current();
        let Some(ask) = conn.cluster_slots() else {
            return;
        };
        match tokio::time::timeout(timeout, ask).await {
            Ok(Ok(answer)) => map.adopt(answer, &seen),
            Ok(Err(e)) => map.refused(&e),
            Err(_) => {}
        }
    }

    /// On a Cluster: reads the clock of each master whose
    /// reading is due (see [`Watch::clocks_due`]: never read, or
    /// [`CLOCK_READ_EVERY`] ago; not a held master), all at once, each
    /// bounded by `timeout`. A master's checks carry no deadline until its
    /// clock is read (a promoted replica's: as its first check finds it
    /// unknown, see [`want_clock`](Self::want_clock)).
    async fn read_master_clocks(&self, timeout: Duration) {
        let Some(watch) = self.masters() else { return };
        let due = watch.clocks_due();
        if due.is_empty() {
            return;
        }
        let Some(conn) = self.get() else { return };
        let readings = due.into_iter().filter_map(|(domain, slot)| {
            let clock = watch.clock(domain)?;
            let mut conn = conn.clone();
            Some(async move {
                if let Some(time) = conn.time_at_slot(slot) {
                    let _ = tokio::time::timeout(timeout, clock.read_by(time)).await;
                }
            })
        });
        futures_util::future::join_all(readings).await;
    }

    /// Asks the sentinels every [`FOLLOW_EVERY`] which master they name (see
    /// [`Follow`]), in a task of its own (a slow question never delays the
    /// keepalive), which ends with the store.
    fn follow(self: &Arc<Self>) {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let weak = Arc::downgrade(self);
        runtime.spawn(async move {
            let mut ticks = tokio::time::interval(FOLLOW_EVERY);
            ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            ticks.tick().await;
            // (The last disagreement acted on: named, connected to.)
            // The last disagreement acted on (named, connected to), when,
            // and how long to leave that same one alone since (kept across
            // agreements: a sentinel that names a stale master for good is
            // acted on ever more rarely, not after every agreement); and
            // whether none agreed since (the next question then goes to
            // another sentinel).
            let mut acted: Option<((String, String), tokio::time::Instant, Duration)> = None;
            let mut disagreeing = false;
            loop {
                ticks.tick().await;
                let Some(this) = weak.upgrade() else { return };
                let Some(follow) = &this.follow else { return };
                let question = (follow.master_now)(disagreeing);
                let asked = tokio::time::timeout(follow.patience, question).await;
                drop(this);
                let Ok(Some(named)) = asked else { continue };
                let Some(this) = weak.upgrade() else { return };
                let Some(follow) = &this.follow else { return };
                let Some(connected) = follow.connected().filter(|at| *at != named) else {
                    disagreeing = false;
                    continue;
                };
                // A reconnect may land where it was: the sentinels it asks
                // may not name the promoted replica yet, or (skipping a
                // master they see down) name another than the one asked
                // here. The same disagreement is then acted on again after
                // 1 s, 2 s, 4 s ... (at most 30 s apart), and the next
                // question goes to another sentinel; any reconnect waits a
                // second after the last (none at every other question
                // while the sentinels disagree).
                let pair = (named, connected);
                let hold = match &acted {
                    Some((last, at, hold)) if *last == pair => {
                        if at.elapsed() < *hold {
                            continue;
                        }
                        (*hold * 2).min(Duration::from_secs(30))
                    }
                    Some((_, at, _)) if at.elapsed() < Duration::from_secs(1) => continue,
                    _ => Duration::from_secs(1),
                };
                if this.get().is_none() {
                    continue;
                }
                tracing::info!(master = %pair.0, "the sentinels name a new master; reconnecting");
                *follow
                    .expected
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner) =
                    Some((pair.0.clone(), tokio::time::Instant::now()));
                this.drop_and_reconnect();
                acted = Some((pair, tokio::time::Instant::now(), hold));
                disagreeing = true;
            }
        });
    }

    /// Makes a connection, loads the scripts on it and puts it in use (a
    /// Cluster client in place of a kept one only if it reaches the master
    /// of the checks that failed).
    async fn try_connect(&self) -> Result<(), RedisError> {
        let mut conn = (self.connect)().await?;
        // A new Cluster client replaces a kept one only if the master of
        // the last failed check's key, as its slots say (after a failover,
        // the new one), answers it (the kept one did not: see `reconnect`).
        // One that would send it to the master in trouble too would only
        // wait on it, its first calls on a refresh of the slots that asks
        // it, every master's checks with them; the kept one still serves
        // the others. (Asked before the scripts are: a client turned down
        // loads nothing.)
        if self.heals && self.current.load().is_some() {
            let Some(key) = self.failed_key.load_full() else {
                return Err(io_error(
                    std::io::ErrorKind::Other,
                    "no failed check to try a new cluster client on: the kept one stays".to_owned(),
                ));
            };
            if !self.reaches(&mut conn, &key).await {
                return Err(io_error(
                    std::io::ErrorKind::TimedOut,
                    "a new cluster client does not reach the failing checks' master either: the kept one stays".to_owned(),
                ));
            }
        }
        // Loaded once per connection, so calls find them by SHA (those the
        // server has already, from before or from another replica, are not
        // sent again).
        let prepare = async {
            if !self.heals {
                not_a_cluster_node(&mut conn).await?;
                not_a_replica(&mut conn).await?;
            }
            self.scripts.ensure(&mut conn).await?;
            if !self.deadlines {
                return Ok(());
            }
            // (Another server's offset is not this one's: unknown until
            // read. A server or proxy that refuses `TIME` leaves it so, and
            // the checks without a deadline; a broken connection is an
            // error.)
            self.clock.doubt();
            match self.clock.read(&mut conn).await {
                Err(e) if broken(&e) || e.is_timeout() => Err(e),
                _ => Ok(()),
            }
        };
        tokio::time::timeout(self.load_timeout, prepare)
            .await
            .map_err(|_| {
                io_error(
                    std::io::ErrorKind::TimedOut,
                    "loading the scripts timed out".to_owned(),
                )
            })??;
        if !self.heals {
            self.runs_scripts(&mut conn).await?;
        }
        self.current.store(Some(Arc::new(conn)));
        self.connected_once.store(true, Ordering::Relaxed);
        self.timeouts.store(0, Ordering::Relaxed);
        self.failed_key.store(None);
        Ok(())
    }

    /// Whether the store's user may run its checks: an `EVALSHA` of a batch
    /// script on a key of the store's, with no check in it, which the
    /// script answers with an error at once, touching nothing; but the
    /// server first checks the user's ACL, for the command and for writing
    /// the key. A refusal (`NOPERM`) is the error: every check would fail
    /// for good. Anything else passes (a server that takes its time, a
    /// Cluster master the store's watch holds, which is not asked: the
    /// store decides on the others meanwhile). On a Cluster only: any other
    /// connection ran the same probe as it was made, where a server that
    /// takes longer than the store's timeout fails the connection (see
    /// [`runs_scripts`](Self::runs_scripts)).
    async fn check_access(&self) -> Result<(), RedisError> {
        // (A connection not a Cluster's ran the probe as it was made: see
        // `runs_scripts`.)
        if !self.heals {
            return Ok(());
        }
        let key = self.probe_key.as_bytes();
        if self
            .watch
            .as_ref()
            .is_some_and(|w| w.holding(key).is_some())
        {
            return Ok(());
        }
        let Some(mut conn) = self.get() else {
            return Ok(());
        };
        let Some(probe) = self.access_probe() else {
            return Ok(());
        };
        let asked = probe.query_async::<redis::Value>(&mut conn);
        match tokio::time::timeout(self.probe_timeout, asked).await {
            Ok(Err(e)) if e.code() == Some("NOPERM") => Err(e),
            _ => Ok(()),
        }
    }

    /// The access probe: an `EVALSHA` of a batch script with no check in
    /// it, on the store's probe key.
    fn access_probe(&self) -> Option<redis::Cmd> {
        let script = self.scripts.batched(0)?;
        let mut probe = redis::cmd("EVALSHA");
        probe
            .arg(script.get_hash())
            .arg(1)
            .arg(self.probe_key.as_bytes());
        Some(probe)
    }

    /// Whether a new connection (not a Cluster's: its client is asked
    /// master by master, see [`reconnect`](Self::reconnect)) runs a script
    /// within the checks' deadline: the access probe's `EVALSHA` (see
    /// [`check_access`](Self::check_access)), which answers at once and
    /// touches nothing. A server that answers reads but holds writes and
    /// scripts (`CLIENT PAUSE ... WRITE`, as a coordinated `FAILOVER`
    /// does), or one slower than the deadline, would otherwise be connected
    /// to again and again, every check on it waiting out its deadline
    /// before the connection is dropped again: the connection is not used
    /// until its server runs the script in time, and checks fail at once
    /// meanwhile. Any answer passes (the probe's own error) but a refusal
    /// (`NOPERM`: the store's user may not run its checks, an error at
    /// start-up, as [`check_access`](Self::check_access) says, and said
    /// once by a reconnect); a time-out or a broken connection does not.
    async fn runs_scripts(&self, conn: &mut C) -> Result<(), RedisError> {
        let Some(probe) = self.access_probe() else {
            return Ok(());
        };
        let asked = probe.query_async::<redis::Value>(conn);
        let slow = || {
            io_error(
                std::io::ErrorKind::TimedOut,
                format!(
                    "{SCRIPTS_TOO_SLOW} ({} ms): are its writes paused (CLIENT PAUSE, a FAILOVER), or is it busy?",
                    self.ready_timeout.as_millis()
                ),
            )
        };
        match tokio::time::timeout(self.ready_timeout, asked).await {
            Ok(Err(e)) if e.is_timeout() => Err(slow()),
            Ok(Err(e)) if broken(&e) || e.code() == Some("NOPERM") => Err(e),
            Ok(_) => Ok(()),
            Err(_) => Err(slow()),
        }
    }

    /// Whether `conn` reads `key` from its slot's master within the probe
    /// timeout (see [`AskAgain::read_at_master`]); true for a connection
    /// that is not a Cluster's.
    async fn reaches(&self, conn: &mut C, key: &[u8]) -> bool {
        match conn.read_at_master(key) {
            Some(read) => matches!(
                tokio::time::timeout(self.probe_timeout, read).await,
                Ok(Ok(()))
            ),
            None => true,
        }
    }

    fn get(&self) -> Option<C> {
        self.current.load().as_deref().cloned()
    }

    /// Runs the script on the current connection, and notices when the
    /// connection breaks. The connection's response timeout (`deadline`)
    /// bounds each command; a `NOSCRIPT` reload and its second try are
    /// bounded together by what is left of `deadline`.
    async fn invoke(
        self: &Arc<Self>,
        cmd: &redis::Cmd,
        deadline: Duration,
    ) -> Result<Vec<u8>, StoreError> {
        let Some(mut conn) = self.get() else {
            // (No connection and, it may be, no loop making one: a loop that
            // made one ends a moment after, and a check that saw it break
            // in that moment could not start another. One atomic swap when
            // a loop is running.)
            self.reconnect();
            return Err(not_connected());
        };
        let started = tokio::time::Instant::now();
        let result = match cmd.query_async(&mut conn).await {
            // (A Cluster's: a single server's `MOVED`, a proxy's, does not
            // pass. Boxed: a rare path, kept out of every check's future.)
            Err(e) if self.heals && slot_moving(&e) => {
                // (Ended a millisecond before the deadline, so that this
                // says why the check timed out before the caller's bound on
                // the whole call, when there is one, ends it without a
                // word.)
                let until = started + deadline.saturating_sub(Duration::from_millis(1));
                let again = again_while_moving(&mut conn, cmd, e, until);
                match Box::pin(again).await {
                    Some(result) => result,
                    None => {
                        self.observe_timeout(started);
                        return Err(timed_out_moving());
                    }
                }
            }
            result => result,
        };
        let result = match result {
            Err(e) if is_noscript(&e) => {
                let left = deadline.saturating_sub(started.elapsed());
                // (Boxed: a rare path, kept out of every check's future.)
                let held = self
                    .watch
                    .as_ref()
                    .map(|w| w.held_nodes())
                    .unwrap_or_default();
                let retry = Box::pin(reload_and_retry(&mut conn, cmd, &self.scripts, &held));
                match tokio::time::timeout(left, retry).await {
                    Ok(result) => result,
                    Err(_) => {
                        self.observe_timeout(started);
                        return Err(StoreError::timeout());
                    }
                }
            }
            result => result,
        };
        self.observe(&result, started);
        result.map_err(store_error)
    }

    /// [`invoke`](Self::invoke) under the store's deadline as a whole, for
    /// connections that may take longer than their response timeout (a
    /// Cluster client retries) or were made without the store's (a caller's
    /// pool). Boxed: these futures are several times the multiplexed
    /// connection's, and a check's future is as large as the largest of
    /// them, copied whenever it moves.
    async fn invoke_bounded(
        self: &Arc<Self>,
        cmd: &redis::Cmd,
        deadline: Duration,
    ) -> Result<Vec<u8>, StoreError> {
        if let Some(watch) = self.watch.as_ref().filter(|w| w.any_held()) {
            if let Some(node) = first_key(cmd).and_then(|key| watch.holding(key)) {
                return Err(held(&node));
            }
        }
        let started = tokio::time::Instant::now();
        let call = Box::pin(self.invoke(cmd, deadline));
        let reply = match tokio::time::timeout(deadline, call).await {
            Ok(reply) => reply,
            Err(_) => {
                self.observe_timeout(started);
                Err(StoreError::timeout())
            }
        };
        if self.heals {
            if let Err(e) = &reply {
                if matches!(
                    e.kind(),
                    StoreErrorKind::Timeout | StoreErrorKind::Unavailable
                ) {
                    let key = first_key(cmd);
                    self.failed_key.store(key.map(|k| Arc::new(k.to_vec())));
                    if let Some(watch) = &self.watch {
                        watch.suspect();
                    }
                }
            }
        }
        reply
    }

    /// Starts one background reconnect loop, unless one is running; it
    /// ends with the store (it holds no reference to it while it waits).
    fn reconnect(self: &Arc<Self>) {
        if self.reconnecting.swap(true, Ordering::AcqRel) {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            self.reconnecting.store(false, Ordering::Release);
            return;
        };
        let weak = Arc::downgrade(self);
        let started = self.micros(tokio::time::Instant::now());
        runtime.spawn(async move {
            let mut backoff = Duration::from_millis(50);
            let mut tried = false;
            // (When a failed try was last said as a warning: the first of
            // a loop, then one every `REPEAT_WARNING`, the others at debug
            // level. The layer's warnings say only that the store is not
            // connected; this says why, as a sentinel down.)
            let mut warned: Option<tokio::time::Instant> = None;
            loop {
                let Some(this) = weak.upgrade() else { return };
                // (After a try that failed: a kept Cluster client that
                // answers calls sent since the loop began has healed, and
                // a caller's pool may have no other to give while the store
                // holds its last. The first try is always made.)
                if tried && this.get().is_some() && this.answered_at.load(Ordering::Relaxed) > started {
                    tracing::debug!("the kept redis cluster client answers");
                    this.reconnecting.store(false, Ordering::Release);
                    return;
                }
                tried = true;
                if this.heals {
                    this.drop_if_unanswered().await;
                    // A kept client that answers is replaced only when it
                    // cannot read the last failed check's key from that
                    // key's master (a master that hangs, or a failover the
                    // client did not learn of from a master that does not
                    // answer; not one that was only slow), and at most
                    // every two seconds (a new client is a connection to
                    // every node).
                    if this.get().is_some()
                        && (!this.replacement_may_be_due()
                            || this.failed_key_held().await
                            || !this.replacement_due()
                            || (!this.moved_lately() && this.kept_reaches_failed_key().await))
                    {
                        this.reconnecting.store(false, Ordering::Release);
                        return;
                    }
                }
                let again = this.connected_once.load(Ordering::Relaxed);
                match this.try_connect().await {
                    Ok(()) => {
                        this.told_misconfigured.store(false, Ordering::Relaxed);
                        // (Through sentinels: the master it reached.)
                        let master = this.follow.as_ref().and_then(Follow::connected);
                        let master = master.as_deref();
                        if again {
                            tracing::info!(master, "rate-limit store reconnected to redis");
                        } else {
                            tracing::info!(master, "rate-limit store connected to redis");
                        }
                        this.reconnecting.store(false, Ordering::Release);
                        // (On a Cluster, its masters' clocks now, as at
                        // start-up, not at the next tick: until read, a
                        // master's checks carry no deadline, and one it
                        // runs after a stall is recorded though the layer
                        // answered it by its fail mode.)
                        if this.masters().is_some() {
                            this.read_slot_map(this.ready_timeout).await;
                            this.read_clocks_behind(this.ready_timeout);
                        }
                        return;
                    }
                    // (Set up wrongly since the store was built, as a
                    // password changed on the server: said once, as an
                    // error, since it will not mend by itself.)
                    Err(error)
                        if misconfigured(&error)
                            && !this.told_misconfigured.swap(true, Ordering::Relaxed) =>
                    {
                        tracing::error!(%error, "redis reconnect refused: the store's setup is wrong");
                    }
                    // (A replica: said once too, as a warning; a failover may
                    // make it a master.)
                    Err(error)
                        if is_replica(&error)
                            && !this.told_misconfigured.swap(true, Ordering::Relaxed) =>
                    {
                        tracing::warn!(%error, "redis reconnect refused: trying again until the server is a master");
                    }
                    // (A sentinel that has not heard of a failover yet: the
                    // next try asks another, in a moment.)
                    Err(error) if error.to_string().contains(STALE_MASTER) => {
                        tracing::debug!(%error, "redis reconnect failed");
                    }
                    Err(error) if warned.is_none_or(|at| at.elapsed() >= REPEAT_WARNING) => {
                        warned = Some(tokio::time::Instant::now());
                        // (redis-rs' words when the master the sentinels
                        // name does not answer as a master, as while a
                        // failover is under way.)
                        let hint = error
                            .to_string()
                            .contains("MasterNameNotFoundBySentinel")
                            .then_some("no sentinel names a master that answers as one: a failover under way?");
                        tracing::warn!(%error, hint, "redis reconnect failed; retrying in the background");
                    }
                    Err(error) => tracing::debug!(%error, "redis reconnect failed"),
                }
                drop(this);
                // (Between half the backoff and all of it: the replicas that
                // lost their connections at one moment do not all come back
                // at the next.)
                tokio::time::sleep(jittered(backoff)).await;
                backoff = (backoff * 2).min(Duration::from_millis(500));
            }
        });
    }

    /// Drops a kept Cluster client that no master answers (the whole
    /// Cluster down, or the client stuck), so that checks fail at once
    /// instead of each waiting on it, or making it try to reconnect (redis-rs
    /// then logs an error for every check); one that some master answers
    /// is kept: it serves them.
    async fn drop_if_unanswered(&self) {
        let Some(mut conn) = self.get() else {
            return;
        };
        // (Asked again every 100 ms for the probe timeout while the asks
        // time out: each is cut by the client's response timeout, and a
        // client busy refreshing its slots answers nothing for a moment.
        // Refused connections, a Cluster down, end it at once.)
        let until = tokio::time::Instant::now() + self.probe_timeout;
        let slots: Vec<u16> = probed_slots()
            .filter(|&slot| !self.watch.as_ref().is_some_and(|w| w.holds_slot(slot)))
            .collect();
        // (Every master held: the client is asked nothing, and kept; the
        // checks fail at once without it until one answers.)
        if slots.is_empty() {
            return;
        }
        loop {
            let Some(some) = conn.answers_on_some_master(&slots) else {
                return;
            };
            match tokio::time::timeout_at(until, some).await {
                Ok(Ok(())) => return,
                Ok(Err(e)) if !e.is_timeout() => break,
                _ => {}
            }
            if tokio::time::Instant::now() + PROBE_PAUSE >= until {
                break;
            }
            tokio::time::sleep(PROBE_PAUSE).await;
        }
        self.current.store(None);
    }

    /// Whether the last failed check's master is held (see [`Watch`]), once
    /// the watch has asked it: no new client would reach it either, and
    /// asking it through the kept one (which may hold no connection to it)
    /// would send it to another node, whose redirect makes the client
    /// refresh its slots, waiting on that master.
    async fn failed_key_held(&self) -> bool {
        match (&self.watch, self.failed_key.load_full()) {
            (Some(watch), Some(key)) => watch.verdict(&key).await,
            _ => false,
        }
    }

    /// Whether the watch saw a held master's slots move lately (see
    /// [`Watch::moved_lately`]).
    fn moved_lately(&self) -> bool {
        self.watch.as_ref().is_some_and(|w| w.moved_lately())
    }

    /// Whether the kept client reads the last failed check's key from its
    /// master (true with no such key: nothing to try a new client on).
    async fn kept_reaches_failed_key(&self) -> bool {
        match (self.get(), self.failed_key.load_full()) {
            (Some(mut conn), Some(key)) => self.reaches(&mut conn, &key).await,
            _ => true,
        }
    }

    /// Whether a new Cluster client may be made beside the kept one now
    /// (see [`replacement_due`](Self::replacement_due), which takes the
    /// turn).
    fn replacement_may_be_due(&self) -> bool {
        self.micros(tokio::time::Instant::now()) >= self.next_replacement.load(Ordering::Relaxed)
    }

    /// Whether a new Cluster client may be made beside the kept one now,
    /// and if so, not again for two seconds.
    fn replacement_due(&self) -> bool {
        let now = self.micros(tokio::time::Instant::now());
        let next = self.next_replacement.load(Ordering::Relaxed);
        now >= next
            && self
                .next_replacement
                .compare_exchange(
                    next,
                    now + REPLACEMENT_GAP_US,
                    Ordering::Relaxed,
                    Ordering::Relaxed,
                )
                .is_ok()
    }

    /// Notes what a call sent at `started` got back.
    fn observe<T>(self: &Arc<Self>, result: &RedisResult<T>, started: tokio::time::Instant) {
        match result {
            Ok(_) => {
                // (On a Cluster, another master's answer says nothing of
                // the one in trouble: failures are counted over a span of
                // time instead, see `observe_timeout`.)
                if !self.heals {
                    self.timeouts.store(0, Ordering::Relaxed);
                }
                self.used.store(true, Ordering::Relaxed);
                if !self.drop_when_broken {
                    let sent = self.micros(started);
                    self.answered_at.fetch_max(sent, Ordering::Relaxed);
                }
            }
            // (redis-rs reports its response timeout as an I/O error: it is
            // checked first, so one slow reply does not drop the connection.)
            Err(e) if e.is_timeout() => self.observe_timeout(started),
            Err(e) if broken(e) && !self.heals => self.drop_and_reconnect(),
            // (A Cluster client's: counted as timeouts are, so that a
            // Cluster down as a whole is found, and its client dropped.)
            Err(e) if broken(e) => self.observe_timeout(started),
            // (Not on a Cluster, whose client follows a failover itself.)
            Err(e) if self.drop_when_broken && read_only(e) => self.drop_and_reconnect(),
            Err(e) if !self.heals && is_moved(e) => self.tell_moved(),
            Err(_) => {}
        }
    }

    /// Says once, as an error, that the one server this store was built on
    /// answers `MOVED`: it is (now) a master of a Redis Cluster of several
    /// masters, which a store built with `url(..)` cannot follow (`build`
    /// refuses a node of such a Cluster; one of a single master may gain
    /// others later). (Out of line: rare.)
    #[cold]
    #[inline(never)]
    fn tell_moved(&self) {
        if !self.told_moved.swap(true, Ordering::Relaxed) {
            tracing::error!(
                "the redis server answers MOVED: it is a node of a Redis Cluster of several masters now, and serves only its own slots; checks of budgets in the others' slots fail (the fail mode applies): build the store with `cluster(..)` (or `cluster_pool(..)`)"
            );
        }
    }

    /// One slow reply (a fork, a long command of another client) is not a
    /// broken connection; several in a row are treated as one (and, on a
    /// Cluster, I/O errors too, each within ten seconds of the one before,
    /// whatever other masters answered: see
    /// [`drop_if_unanswered`](Self::drop_if_unanswered) and
    /// [`try_connect`](Self::try_connect)). A timeout
    /// counts only for a call sent after the last one counted: the calls in
    /// flight during one stall (a Cluster client's checks go one call each)
    /// time out together and count once.
    fn observe_timeout(self: &Arc<Self>, started: tokio::time::Instant) {
        let now = self.micros(tokio::time::Instant::now());
        let last = self.last_timeout.load(Ordering::Relaxed);
        if self.micros(started) < last
            || self
                .last_timeout
                .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
                .is_err()
        {
            return;
        }
        // (On a Cluster: failures in a row, each within ten seconds of the
        // one before, whatever other masters answered between them.)
        if self.heals && now.saturating_sub(last) > FAILURE_SPAN_US {
            self.timeouts.store(0, Ordering::Relaxed);
        }
        if self.timeouts.fetch_add(1, Ordering::Relaxed) + 1 >= TIMEOUTS_BEFORE_RECONNECT {
            self.timeouts.store(0, Ordering::Relaxed);
            self.drop_and_reconnect();
        }
    }

    /// `at` in microseconds since this connection's origin (at least 1, so
    /// that 0 means no timeout counted yet).
    fn micros(&self, at: tokio::time::Instant) -> u64 {
        u64::try_from(at.saturating_duration_since(self.origin).as_micros())
            .unwrap_or(u64::MAX)
            .saturating_add(1)
    }

    /// Stops using the current connection (checks fail at once meanwhile,
    /// instead of each waiting out its deadline) and connects again.
    fn drop_and_reconnect(self: &Arc<Self>) {
        if self.drop_when_broken {
            self.current.store(None);
        }
        self.reconnect();
    }
}

/// Refuses a server that is a replica (`INFO replication` says
/// `role:slave`): it would answer every check `READONLY`, on which the
/// store drops the connection, and it would connect to it again at once,
/// once per check. Refused, the connection is tried again in the
/// background (every 25–500 ms), and checks fail at once meanwhile; a
/// replica a failover promotes is used once it is a master. (A user whose
/// ACL denies `INFO` is not asked.)
async fn not_a_replica<C: ConnectionLike>(conn: &mut C) -> Result<(), RedisError> {
    let info: RedisResult<String> = redis::cmd("INFO")
        .arg("replication")
        .query_async(conn)
        .await;
    match info {
        Ok(text) if text.lines().any(|line| line.trim_end() == "role:slave") => {
            Err(io_error(std::io::ErrorKind::Other, A_REPLICA.to_owned()))
        }
        Err(e) if broken(&e) || e.is_timeout() => Err(e),
        _ => Ok(()),
    }
}

/// How a connection to a replica is refused (see [`not_a_replica`]).
const A_REPLICA: &str =
    "the server is a replica (read-only): point the store at its master, or at its sentinels";

/// Whether `e` is [`not_a_replica`]'s refusal.
fn is_replica(e: &RedisError) -> bool {
    e.to_string().contains(A_REPLICA)
}

/// How a new connection whose server does not run the access probe in time
/// fails (see `Lazy::runs_scripts`): a server that answers, told apart at
/// start-up from one not reachable.
const SCRIPTS_TOO_SLOW: &str = "the server did not run a script within the store's timeout";

/// A random time between half of `backoff` and all of it.
fn jittered(backoff: Duration) -> Duration {
    use std::hash::BuildHasher;
    let random = foldhash::fast::RandomState::default().hash_one(std::time::Instant::now());
    // (A fraction of 2^16.)
    let part = u32::try_from(random >> 48).unwrap_or(0);
    backoff / 2 + (backoff / 2) * part / 65_536
}

/// Errors on connecting that no retry mends: the target is set up wrongly.
/// A Cluster client on a server without cluster support, a direct
/// connection to a node of a Cluster of several masters (see
/// [`not_a_cluster_node`]), a password the server refuses, a user its ACL
/// denies the scripts' commands (`NOPERM`). (A master name no sentinel
/// knows is asked apart: [`unknown_to_every_sentinel`].)
fn misconfigured(e: &RedisError) -> bool {
    if matches!(
        e.kind(),
        redis::ErrorKind::AuthenticationFailed | redis::ErrorKind::InvalidClientConfig
    ) {
        return true;
    }
    if e.code() == Some("NOPERM") {
        return true;
    }
    let text = e.to_string();
    // (And a TLS handshake that failed on a certificate, on either side,
    // or that a server answered with something else than TLS: rustls'
    // words. A server that does not answer a handshake at all, as a plain
    // Redis often does, is not told from one not reachable yet: the store
    // keeps trying, as the warning at `build` says.)
    [
        NOT_A_CLUSTER_SIGN,
        "DB index is out of range",
        "WRONGPASS",
        "NOAUTH",
        "invalid peer certificate",
        "received fatal alert",
        "received corrupt message",
    ]
    .iter()
    .any(|sign| text.contains(sign))
}

/// How a server that is no Cluster node answers a Cluster's command.
const NOT_A_CLUSTER_SIGN: &str = "cluster support disabled";

/// What that answer means to a store built for a Cluster.
const NOT_A_CLUSTER: &str = "the server is not a Cluster node: reach a standalone server with RedisStoreBuilder::url, or the demo's --redis";

/// A server's refusal of any command for a while: loading its data
/// (`LOADING`), a replica cut from its master (`MASTERDOWN`), a script
/// running too long (`BUSY`), a Cluster not serving (`CLUSTERDOWN`,
/// `TRYAGAIN`). (Not an ACL's `NOPERM` on `SCRIPT EXISTS`: the scripts are
/// then loaded, and a `NOPERM` on that is a setup error.)
fn refuses_for_now(e: &RedisError) -> bool {
    matches!(
        e.code(),
        Some("LOADING" | "MASTERDOWN" | "BUSY" | "CLUSTERDOWN" | "TRYAGAIN")
    )
}

/// Refuses a direct connection to a node of a Redis Cluster with more than
/// one master: it would answer `MOVED` for every budget whose slot another
/// master serves (those checks failing for good, by the fail mode). A
/// server that does not answer `INFO` or `CLUSTER INFO` (a proxy) is let be.
async fn not_a_cluster_node<C: ConnectionLike>(conn: &mut C) -> Result<(), RedisError> {
    let answer = |reply: RedisResult<String>| match reply {
        Ok(text) => Ok(Some(text)),
        Err(e) if broken(&e) || e.is_timeout() => Err(e),
        Err(_) => Ok(None),
    };
    let info = answer(redis::cmd("INFO").arg("cluster").query_async(conn).await)?;
    if !info.is_some_and(|text| text.contains("cluster_enabled:1")) {
        return Ok(());
    }
    let Some(text) = answer(redis::cmd("CLUSTER").arg("INFO").query_async(conn).await)? else {
        return Ok(());
    };
    let masters = text
        .lines()
        .find_map(|line| line.strip_prefix("cluster_size:"))
        .and_then(|n| n.trim().parse::<u64>().ok())
        .unwrap_or(0);
    if masters > 1 {
        return Err(RedisError::from((
            redis::ErrorKind::InvalidClientConfig,
            "a direct connection to a node of a Redis Cluster",
            format!(
                "the server is one of {masters} masters of a Cluster, and would answer MOVED \
                 for the budgets the others serve: build the store with `cluster(..)` \
                 (or `cluster_pool(..)`)"
            ),
        )));
    }
    Ok(())
}

/// Errors after which a connection cannot be trusted any more.
fn broken(e: &RedisError) -> bool {
    e.is_io_error()
        || e.is_connection_dropped()
        || e.is_connection_refusal()
        || e.is_unrecoverable_error()
}

/// `READONLY`: the server is (now) a replica, a master demoted by a
/// failover; a new connection finds the new master (through Sentinel, or
/// behind the same address). (Also as Redis 6 reports it from inside a
/// script: `ERR Error running script ... -READONLY ...`.)
fn read_only(e: &RedisError) -> bool {
    e.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::ReadOnly)
        || e.to_string().contains("READONLY")
}

fn store_error(e: RedisError) -> StoreError {
    let kind = if e.is_timeout() {
        StoreErrorKind::Timeout
    } else if e.is_io_error() || e.is_connection_dropped() || e.is_connection_refusal() {
        StoreErrorKind::Unavailable
    } else {
        StoreErrorKind::Backend
    };
    StoreError::new(kind, e)
}

/// A check whose slot was moving between Cluster nodes (`ASK`, `TRYAGAIN`)
/// until its deadline passed while it was sent again: said so, as a slow
/// server is not the cause.
#[cold]
fn timed_out_moving() -> StoreError {
    StoreError::new(
        StoreErrorKind::Timeout,
        "its key's slot was moving between cluster nodes (ASK / TRYAGAIN) until the deadline; a check on several keys waits until the slot has moved",
    )
}

/// A check the script refused because the server's clock was past its
/// deadline, answered while this process still waited, with no time left
/// to try again (or, defensively, an empty reply to the try again, which
/// carries no deadline; see `RedisStore::run`).
#[cold]
fn refused_as_late() -> StoreError {
    StoreError::new(
        StoreErrorKind::Timeout,
        "redis ran the check after its deadline on the server's clock; nothing was recorded",
    )
}

/// The Cluster client of the store at `urls`, with its (connection,
/// response) timeouts.
fn cluster_client(
    tls: &Tls,
    urls: &[String],
    (connect_timeout, response_timeout): (Duration, Duration),
) -> Result<redis::cluster::ClusterClient, StoreError> {
    tls.cluster(urls)?
        .connection_timeout(connect_timeout)
        .response_timeout(response_timeout)
        .retries(2)
        // (Its waits before trying a `TRYAGAIN`, `CLUSTERDOWN` or `LOADING`
        // again: 1.28 s at least by default, beyond any check's deadline; a
        // few milliseconds here, the store trying again within the
        // deadline.)
        .min_retry_wait(1)
        .max_retry_wait(4)
        .retry_wait_formula(2, 2)
        .build()
        .map_err(|e| config_error(format!("invalid redis cluster nodes: {e}")))
}

/// The watch of the masters of the Cluster at `urls` (see [`Watch`]):
/// its connections take the first URL's settings (user, password, TLS), as
/// redis-rs' client's do.
fn cluster_watch(
    tls: &Tls,
    urls: &[String],
    connect_timeout: Duration,
    timeout: Duration,
) -> Result<Option<Arc<Watch>>, StoreError> {
    use redis::IntoConnectionInfo;
    let Some(first) = urls.first() else {
        return Ok(None);
    };
    let base = tls.client(first)?.get_connection_info().clone();
    let seeds = urls
        .iter()
        .filter_map(|url| {
            let info = url.as_str().into_connection_info().ok()?;
            match info.addr() {
                redis::ConnectionAddr::Tcp(host, port)
                | redis::ConnectionAddr::TcpTls { host, port, .. } => {
                    Some((url.clone(), (host.clone(), *port)))
                }
                _ => None,
            }
        })
        .collect();
    Ok(Watch::new(base, seeds, connect_timeout, timeout))
}

/// A check of a held Cluster master's slots (see [`Watch`]).
#[cold]
fn held(node: &watch::Node) -> StoreError {
    StoreError::new(
        StoreErrorKind::Unavailable,
        format!(
            "the redis cluster master of this check's slot ({}) answers nothing; its checks fail at once until it answers or its slots move",
            watch::name(node)
        ),
    )
}

fn not_connected() -> StoreError {
    StoreError::new(
        StoreErrorKind::Unavailable,
        "not connected to redis (reconnecting)",
    )
}

/// `url` with its password, if any, replaced by `***`, for errors and
/// logs: the user part's (everything up to the last `@`, so that a
/// password holding `/`, `?` or `#`, which a URL that does not parse may
/// have, is covered too; it may cover more) and a `pass` or `password`
/// in the query (a Unix socket's).
///
/// ```
/// use tower_ratelimit::store::redis::redacted;
///
/// assert_eq!(redacted("redis://app:s3cret@db:6379/0"), "redis://app:***@db:6379/0");
/// assert_eq!(redacted("redis://:s3/c#ret@db"), "redis://:***@db");
/// assert_eq!(redacted("unix:///run/redis.sock?db=1&pass=s3cret"), "unix:///run/redis.sock?db=1&pass=***");
/// assert_eq!(redacted("redis://u:pa/ss@db/0"), "redis://u:***@db/0");
/// assert_eq!(redacted("redis://db:6379"), "redis://db:6379");
/// // (Never the password, if at the price of more: an `@` in the query.)
/// assert!(!redacted("unix:///s?pass=s3cret&user=a@b").contains("s3cret"));
/// ```
pub fn redacted(url: &str) -> std::borrow::Cow<'_, str> {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.into();
    };
    let mut out = format!("{scheme}://");
    let mut changed = false;
    let after = match rest.rsplit_once('@') {
        Some((user, after)) => {
            // (A name, when what comes before the first `:` looks like one.)
            match user.split_once(':') {
                Some((name, _)) if !name.contains(['/', '?', '#']) => {
                    out.push_str(name);
                    out.push_str(":***@");
                }
                Some(_) => out.push_str("***@"),
                None if user.contains(['/', '?', '#']) => out.push_str("***@"),
                None => {
                    out.push_str(user);
                    out.push('@');
                }
            }
            changed = out.contains("***");
            after
        }
        None => rest,
    };
    match after.split_once('?') {
        Some((path, query)) => {
            out.push_str(path);
            out.push('?');
            for (i, pair) in query.split('&').enumerate() {
                if i > 0 {
                    out.push('&');
                }
                match pair.split_once('=') {
                    Some((key, _))
                        if key.eq_ignore_ascii_case("pass")
                            || key.eq_ignore_ascii_case("password") =>
                    {
                        out.push_str(key);
                        out.push_str("=***");
                        changed = true;
                    }
                    _ => out.push_str(pair),
                }
            }
        }
        None => out.push_str(after),
    }
    match changed {
        true => out.into(),
        false => url.into(),
    }
}

fn config_error(message: impl Into<String>) -> StoreError {
    StoreError::new(StoreErrorKind::Config, message.into())
}

/// Where a [`RedisStore`] connects.
enum Target {
    Url(String),
    Cluster(Vec<String>),
    Sentinel {
        sentinels: Vec<String>,
        service: String,
        /// The master's credentials and database, as a URL.
        master: Option<String>,
    },
    Pool(deadpool_redis::Pool),
    ClusterPool(deadpool_redis::cluster::Pool),
}

/// Whether `url` names a Unix socket (`unix://`, `redis+unix://`,
/// `valkey+unix://`).
fn is_socket_url(url: &str) -> bool {
    let scheme = url.split_once("://").map_or("", |(scheme, _)| scheme);
    scheme.eq_ignore_ascii_case("unix") || scheme.to_ascii_lowercase().ends_with("+unix")
}

/// Whether `url` is one that redis-rs reaches over TLS (`rediss://`,
/// `valkeys://`).
fn is_tls_url(url: &str) -> bool {
    let scheme = url.split_once("://").map_or("", |(scheme, _)| scheme);
    scheme.eq_ignore_ascii_case("rediss") || scheme.eq_ignore_ascii_case("valkeys")
}

/// `Ok` when what was given as PEM holds what it should: a certificate
/// for the roots and the client, a private key for the client. (rustls
/// would take an empty set of roots, and then blame the server's
/// certificate.)
#[cfg(feature = "tls")]
fn pem_given(certificates: &redis::TlsCertificates) -> Result<(), StoreError> {
    let holds = |pem: &[u8], label: &str| {
        let label = format!("-----BEGIN {label}-----");
        pem.windows(label.len()).any(|w| w == label.as_bytes())
    };
    let has_key = |pem: &[u8]| {
        ["PRIVATE KEY", "EC PRIVATE KEY", "RSA PRIVATE KEY"]
            .iter()
            .any(|l| holds(pem, l))
    };
    if let Some(roots) = &certificates.root_cert {
        if !holds(roots, "CERTIFICATE") {
            return Err(config_error(
                "tls_root_certificate: no PEM certificate (-----BEGIN CERTIFICATE-----) in it",
            ));
        }
    }
    if let Some(client) = &certificates.client_tls {
        if !holds(&client.client_cert, "CERTIFICATE") {
            return Err(config_error(
                "tls_client_certificate: no PEM certificate (-----BEGIN CERTIFICATE-----) in its first argument",
            ));
        }
        if !has_key(&client.client_key) {
            return Err(config_error(
                "tls_client_certificate: no PEM private key (-----BEGIN PRIVATE KEY-----) in its second argument",
            ));
        }
    }
    Ok(())
}

/// The certificates of a store's `rediss://` connections (the `tls`
/// feature; nothing without it), and the clients made with them.
#[derive(Clone, Default)]
struct Tls {
    #[cfg(feature = "tls")]
    certificates: Option<redis::TlsCertificates>,
}

impl Tls {
    #[cfg(feature = "tls")]
    fn certificates(&mut self) -> &mut redis::TlsCertificates {
        self.certificates.get_or_insert(redis::TlsCertificates {
            client_tls: None,
            root_cert: None,
        })
    }

    /// Whether certificates were given.
    fn given(&self) -> bool {
        #[cfg(feature = "tls")]
        return self.certificates.is_some();
        #[cfg(not(feature = "tls"))]
        false
    }

    /// A client of one server at `url`, with the certificates if any.
    fn client(&self, url: &str) -> Result<redis::Client, StoreError> {
        self.usable(std::iter::once(url))?;
        let client = redis::Client::open(url)
            .map_err(|e| config_error(format!("invalid redis url `{}`: {e}", redacted(url))))?;
        #[cfg(feature = "tls")]
        if let Some(certificates) = &self.certificates {
            // (The url read, what is wrong now is in the certificates.)
            return redis::Client::build_with_tls(url, certificates.clone())
                .map_err(|e| config_error(format!("the TLS certificates: {e}")));
        }
        Ok(client)
    }

    /// A client of the sentinel at `url`: with the certificates if any and
    /// its url is `rediss://`.
    fn sentinel_client(&self, url: &str) -> RedisResult<redis::Client> {
        #[cfg(feature = "tls")]
        if let Some(certificates) = &self.certificates {
            if is_tls_url(url) {
                return redis::Client::build_with_tls(url, certificates.clone());
            }
        }
        redis::Client::open(url)
    }

    /// `Ok` unless the sentinels reached over the network are some over
    /// TLS and some not, or the certificates given
    /// to a Sentinel store cannot be used as given: credentials that differ
    /// from one sentinel to another (redis-rs' builder takes one set),
    /// neither the master (`master_url`: its url, or else the first
    /// sentinel's) nor the sentinels over TLS, or a client certificate for
    /// a master not verified (`#insecure`: redis-rs connects to it with no
    /// certificate then).
    #[cfg_attr(not(feature = "tls"), allow(unused_variables))]
    fn sentinels_usable(
        &self,
        sentinels: &[String],
        master_url: Option<&str>,
    ) -> Result<(), StoreError> {
        // (Sentinels over the network, TLS for all or for none: the
        // master's TLS follows theirs, and one sentinel in clear would
        // pass in clear what the others protect. A local socket, which
        // has no TLS, goes with either.)
        let network = sentinels.iter().filter(|url| !is_socket_url(url));
        let (tls, all) = network.fold((0, 0), |(t, a), url| {
            (t + usize::from(is_tls_url(url)), a + 1)
        });
        if tls != 0 && tls != all {
            return Err(config_error(
                "the sentinels' urls are some rediss:// or valkeys:// (TLS) and some redis:// or valkey://: give those reached over the network one scheme",
            ));
        }
        #[cfg(feature = "tls")]
        if let Some(certificates) = &self.certificates {
            use redis::IntoConnectionInfo;
            pem_given(certificates)?;
            let master_tls = master_url.is_some_and(is_tls_url);
            if tls == 0 && !master_tls {
                return Err(config_error(
                    "TLS certificates were given to a Sentinel store whose sentinels and master (sentinel_master_url, or else the first sentinel's url) are not rediss://",
                ));
            }
            if master_tls
                && master_url.is_some_and(|url| url.ends_with("#insecure"))
                && certificates.client_tls.is_some()
            {
                return Err(config_error(
                    "a client certificate cannot reach a Sentinel store's master whose url ends with #insecure (it would be connected to without one): verify it with tls_root_certificate instead",
                ));
            }
            let credentials = |url: &String| {
                url.as_str().into_connection_info().ok().map(|info| {
                    let settings = info.redis_settings();
                    (
                        settings.username().map(str::to_owned),
                        settings.password().map(str::to_owned),
                    )
                })
            };
            let first = sentinels.first().map(credentials);
            if sentinels.iter().any(|url| Some(credentials(url)) != first) {
                return Err(config_error(
                    "TLS certificates were given to a Sentinel store whose sentinels' urls hold different credentials (they must hold the same ones)",
                ));
            }
        }
        Ok(())
    }

    /// A Cluster client's builder for `urls`, with the certificates if any.
    fn cluster(&self, urls: &[String]) -> Result<redis::cluster::ClusterClientBuilder, StoreError> {
        self.usable(urls.iter().map(String::as_str))?;
        let builder = redis::cluster::ClusterClient::builder(urls.iter().map(String::as_str));
        #[cfg(feature = "tls")]
        if let Some(certificates) = &self.certificates {
            return Ok(builder.certs(certificates.clone()));
        }
        Ok(builder)
    }

    /// `Ok` when `urls` can be reached as given: `rediss://` needs the
    /// `tls` feature, and certificates need `rediss://` URLs.
    fn usable<'a>(&self, mut urls: impl Iterator<Item = &'a str>) -> Result<(), StoreError> {
        let tls = is_tls_url;
        let mut all = true;
        for url in urls.by_ref() {
            if tls(url) && !cfg!(feature = "tls") {
                return Err(config_error(format!(
                    "`{}`: rediss:// (TLS) needs tower-ratelimit's `tls` feature",
                    redacted(url)
                )));
            }
            all &= tls(url);
        }
        if self.given() && !all {
            return Err(config_error(
                "TLS certificates were given for a server whose url is not rediss://",
            ));
        }
        #[cfg(feature = "tls")]
        if let Some(certificates) = &self.certificates {
            pem_given(certificates)?;
        }
        Ok(())
    }

    /// `Ok` unless certificates were given to a store that does not use
    /// them (`what`).
    fn unused_by(&self, what: &str) -> Result<(), StoreError> {
        if self.given() {
            return Err(config_error(format!(
                "TLS certificates apply to url(..), cluster(..) and sentinel(..) stores, not to {what}"
            )));
        }
        Ok(())
    }
}

/// Configures a [`RedisStore`].
#[must_use]
pub struct RedisStoreBuilder {
    target: Option<Target>,
    prefix: String,
    timeout: Duration,
    connect_timeout: Duration,
    combine_checks: bool,
    keepalive: Option<Duration>,
    /// The CA and client certificate for `rediss://` (the `tls` feature).
    tls: Tls,
}

impl std::fmt::Debug for RedisStoreBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisStoreBuilder")
            .field("prefix", &self.prefix)
            .field("timeout", &self.timeout)
            .field("combine_checks", &self.combine_checks)
            .field("keepalive", &self.keepalive)
            .finish_non_exhaustive()
    }
}

impl RedisStore {
    /// Starts configuring a store.
    pub fn builder() -> RedisStoreBuilder {
        RedisStoreBuilder {
            target: None,
            prefix: "rl".to_owned(),
            timeout: DEFAULT_TIMEOUT,
            connect_timeout: DEFAULT_CONNECT_TIMEOUT,
            combine_checks: true,
            keepalive: Some(DEFAULT_KEEPALIVE),
            tls: Tls::default(),
        }
    }

    /// A store on one Redis server at `url`, with default settings.
    pub async fn connect(url: &str) -> Result<Self, StoreError> {
        Self::builder().url(url).build().await
    }

    /// The masters of a Cluster that this store holds now, as `host:port`:
    /// those that answer nothing, whose checks fail at once (the fail mode
    /// applies) until they answer or their slots move (see
    /// [`cluster`](RedisStoreBuilder::cluster)). Empty while every master
    /// answers, and for a store on one server, Sentinel or a caller's
    /// pool; empty too while the store cannot read the Cluster's slots
    /// on connections of its own (no node reached yet, or a user whose ACL
    /// denies `CLUSTER SLOTS`, which is logged once). For a readiness
    /// probe, a metric or a log.
    ///
    /// ```no_run
    /// # async fn f() -> Result<(), tower_ratelimit::StoreError> {
    /// use tower_ratelimit::store::redis::RedisStore;
    ///
    /// let store = RedisStore::builder()
    ///     .cluster(["redis://127.0.0.1:7000", "redis://127.0.0.1:7001"])
    ///     .build()
    ///     .await?;
    /// for master in store.held_masters() {
    ///     eprintln!("redis cluster master {master} answers nothing");
    /// }
    /// # Ok(()) }
    /// ```
    pub fn held_masters(&self) -> Vec<String> {
        match &self.inner.backend {
            Backend::Cluster(lazy) => lazy.watch.as_ref().map_or_else(Vec::new, |watch| {
                watch
                    .held_nodes()
                    .into_iter()
                    .map(|node| watch::name(&node))
                    .collect()
            }),
            _ => Vec::new(),
        }
    }

    /// Whether a check sent now carries its deadline on the server's clock
    /// (see the module's "Deadline and failures"): the clock has been read
    /// on the connection in use, and on a Cluster the clock of every master
    /// its slots name (but [held](Self::held_masters) ones, whose checks
    /// fail at once). `false` before, and after a refusal as late until the
    /// clock is read again (the next check asks for that at once), or for
    /// good with a server or proxy that refuses `TIME`. A check without a
    /// deadline that a stalled server runs after the layer answered it by
    /// its fail mode is still recorded: a readiness probe may wait for
    /// this.
    ///
    /// ```no_run
    /// # async fn f() -> Result<(), tower_ratelimit::StoreError> {
    /// use tower_ratelimit::store::redis::RedisStore;
    ///
    /// let store = RedisStore::builder().url("redis://127.0.0.1:6379").build().await?;
    /// if !store.deadlines_known() {
    ///     eprintln!("redis's clock is not read yet: a stalled server may charge requests answered by the fail mode");
    /// }
    /// # Ok(()) }
    /// ```
    pub fn deadlines_known(&self) -> bool {
        match (self.inner.masters(), &self.inner.backend) {
            (Some(watch), _) => watch.clocks_known(),
            (None, Backend::Direct(_) | Backend::Pool(_)) => self.inner.clock.known(),
            (None, _) => false,
        }
    }

    /// The Redis keys of a check: the user's state, the user's block marker,
    /// and the route-wide state (see the [key layout](self#key-layout)).
    pub fn keys(&self, check: &Check) -> [String; 3] {
        [
            self.key(check, KeyKind::State),
            self.key(check, KeyKind::Block),
            if check.global.is_some() {
                self.key(check, KeyKind::Route)
            } else {
                String::new()
            },
        ]
    }

    /// One key of a check (see [`keys`](Self::keys)); the route's needs a
    /// route-wide check.
    fn key(&self, check: &Check, kind: KeyKind) -> String {
        let mut key = String::new();
        write_key(&self.inner.prefix, check, kind, |piece| key.push_str(piece));
        key
    }

    async fn run(inner: Arc<Inner>, check: Check) -> Result<Decision, StoreError> {
        let script = inner.scripts.get(&check);
        let started = Instant::now();
        let clock = match check.now {
            None => inner.clock_of(&check),
            Some(_) => None,
        };
        let on_server = clock.and_then(|clock| clock.deadline(started, inner.timeout));
        if on_server.is_none() && clock.is_some() {
            inner.want_clock();
        }
        let mut reply = inner.send(&check, script, on_server, inner.timeout).await?;
        if reply.is_empty() {
            // Refused as late while this process still waits: the clock's
            // reading is off for this check (a clock stepped; on a Cluster,
            // a check redirected to another master, or a slot map not read
            // since its slot moved). Nothing was recorded: once more,
            // without a deadline, in the time left. (The refusal is the
            // last run's: a Cluster client that sent the call again after
            // a connection broke under it may have run it before, as any
            // such retry may.)
            if let Some(clock) = clock {
                clock.doubt();
            }
            let left = inner.timeout.saturating_sub(started.elapsed());
            if left.is_zero() {
                return Err(refused_as_late());
            }
            let cmd = eval_cmd(&inner.prefix, script, &check, None);
            reply = inner.send_alone(&cmd, left).await?;
            if reply.is_empty() {
                return Err(refused_as_late());
            }
        }
        if ScriptKind::of(&check) == ScriptKind::StraightCounter {
            decode_counters(&check, &reply)
        } else {
            decode(&check, &reply)
        }
    }
}

impl Inner {
    /// Sends a check's call once more after a refusal as late (see
    /// `RedisStore::run`): alone, not in a batch (whose bound, its
    /// earliest check's, it would shorten for the others), bounded by
    /// `left` as a whole on every connection, and not counted in the
    /// connection's health (a short bound that runs out says little). It
    /// carries no deadline on the server's clock: were Redis slower than
    /// `left` here, it would record a check answered by the fail mode.
    async fn send_alone(&self, cmd: &redis::Cmd, left: Duration) -> Result<Vec<u8>, StoreError> {
        let call = Box::pin(async {
            match &self.backend {
                Backend::Direct(lazy) => lazy.invoke(cmd, left).await,
                Backend::Cluster(lazy) => lazy.invoke(cmd, left).await,
                Backend::Pool(lazy) => lazy.invoke(cmd, left).await,
                Backend::ClusterPool(lazy) => lazy.invoke(cmd, left).await,
            }
        });
        tokio::time::timeout(left, call)
            .await
            .unwrap_or_else(|_| Err(StoreError::timeout()))
    }

    /// Sends a check's call of `script` (with its deadline on the server's
    /// clock, `on_server`), bounded by `deadline`: its reply.
    async fn send(
        &self,
        check: &Check,
        script: &Script,
        on_server: Option<i64>,
        deadline: Duration,
    ) -> Result<Vec<u8>, StoreError> {
        let batch = Scripts::batch_of(check);
        let cmd = || eval_cmd(&self.prefix, script, check, on_server);
        match (&self.batcher, &self.backend) {
            // A multiplexed connection's checks (the store's own or a
            // caller's pool's) go in batches, each under the store's
            // deadline as a whole (see `Batcher`); but a sliding log's
            // that has no batch script (a block time, route-wide windows):
            // sent in a pipeline, its script costs Redis about 0.7 µs more
            // per call than spread out, more than the batch saves
            // (benches/HISTORY.md, round 14).
            (Some(batcher), _)
                if (batch.is_some() || check.algorithm != Algorithm::SlidingLog)
                    && batcher.here() =>
            {
                let call = match batch {
                    // (The batch task writes its key and numbers, or its
                    // command if it goes alone.)
                    Some(kind) => Call::Batchable {
                        check: check.clone(),
                        kind,
                        deadline: on_server,
                    },
                    None => Call::Own(cmd()),
                };
                batcher.invoke(call, deadline).await
            }
            // One check at a time: the connection's own response timeout
            // (the store's) bounds the call, no second timer per request.
            (_, Backend::Direct(lazy)) => lazy.invoke(&cmd(), deadline).await,
            // A Cluster client may retry, and a pool's connection was made
            // with the caller's response timeout, not the store's: the
            // store's deadline bounds them as a whole (and their futures
            // are boxed, see `invoke_bounded`).
            (_, Backend::Cluster(lazy)) => lazy.invoke_bounded(&cmd(), deadline).await,
            (_, Backend::Pool(lazy)) => lazy.invoke_bounded(&cmd(), deadline).await,
            (_, Backend::ClusterPool(lazy)) => lazy.invoke_bounded(&cmd(), deadline).await,
        }
    }
}

impl RedisStore {
    /// [`Store::adjust`]: one call of [`ADJUST_LUA`] on the user's key,
    /// under the store's deadline, outside the batches.
    async fn run_adjust(
        inner: Arc<Inner>,
        check: Check,
        adjustment: Adjustment,
    ) -> Result<(), StoreError> {
        let n = match adjustment {
            // (A sliding log writes an entry per unit: at most MAX_LOG_COST.)
            Adjustment::Penalty(n) if check.algorithm == Algorithm::SlidingLog => {
                i64::from(n.min(crate::rules::MAX_LOG_COST))
            }
            Adjustment::Penalty(n) => i64::from(n),
            Adjustment::Refund(n) => -i64::from(n),
        };
        let (layout, fp) = match (check.algorithm, straight(&check)) {
            (Algorithm::SlidingLog, false) => (1, 0),
            (Algorithm::SlidingLog, true) => (2, windows_fingerprint(&check.windows)),
            (Algorithm::SlidingWindow, _) => (3, 0),
            (Algorithm::FixedWindow, _) => (4, 0),
            (Algorithm::TokenBucket, _) => (5, 0),
        };
        let mut numbers = Vec::with_capacity(8 * (4 + 2 * check.windows.len()));
        let now = check.now.map_or(-1, |now| saturating_i64(now.as_micros()));
        for number in [now, n, layout, fp] {
            numbers.extend_from_slice(&word(number));
        }
        for w in check.windows.iter() {
            numbers.extend_from_slice(&word(saturating_i64(w.micros())));
            numbers.extend_from_slice(&word(i64::from(w.limit())));
        }
        let mut cmd = redis::cmd("EVALSHA");
        cmd.arg(inner.scripts.adjust.get_hash())
            .arg(1)
            .arg(KeyArg {
                prefix: &inner.prefix,
                check: &check,
                kind: KeyKind::State,
            })
            .arg(numbers);
        let deadline = inner.timeout;
        match &inner.backend {
            Backend::Direct(lazy) => lazy.invoke_bounded(&cmd, deadline).await,
            Backend::Cluster(lazy) => lazy.invoke_bounded(&cmd, deadline).await,
            Backend::Pool(lazy) => lazy.invoke_bounded(&cmd, deadline).await,
            Backend::ClusterPool(lazy) => lazy.invoke_bounded(&cmd, deadline).await,
        }
        .map(drop)
    }
}

/// The Cluster slot of a check's keys (they share it: see [`write_key`]),
/// from their hash tag (the prefix holds no brace, so the key's tag is the
/// check's up to its first `}`); `None` for an empty one, when the slot is
/// the whole key's.
fn check_slot(check: &CheckRef<'_>) -> Option<u16> {
    let tag = check.global.map_or(check.budget, |global| global.tag());
    watch::tag_slot(tag.as_bytes())
}

/// Writes one key of a check (see [`RedisStore::keys`]), piece by piece.
fn write_key(prefix: &str, check: &Check, kind: KeyKind, mut put: impl FnMut(&str)) {
    let alg = suffix(check);
    let budget = &*check.budget;
    // Every key shares the route's tag when the check has route-wide
    // windows, so the script may touch them all on one Cluster node.
    let (tag, rest) = match &check.global {
        Some(global) => (global.tag(), Some(budget)),
        None => (budget, None),
    };
    let last = match kind {
        KeyKind::State => alg,
        KeyKind::Block => "b",
        KeyKind::Route if check.global.is_some() => alg,
        KeyKind::Route => return,
    };
    put(prefix);
    put(":{");
    put(tag);
    put("}:");
    match (kind, rest) {
        (KeyKind::Route, _) => put("*:"),
        (_, Some(budget)) => {
            put(budget);
            put(":");
        }
        (_, None) => {}
    }
    put(last);
}

/// A check's `EVALSHA`, its keys and its packed numbers written straight
/// into the command's one buffer (made at its size): no string per key,
/// no vector per argument, no copy of them into the command.
fn eval_cmd(prefix: &str, script: &Script, check: &Check, deadline: Option<i64>) -> redis::Cmd {
    // The block marker only when the script may touch it, or a place
    // holder before the route's key: every key costs Redis about 1,500
    // instructions per call. The place holder is the route's key itself
    // (the script reads the marker only with a block time): a key that
    // never exists would make Redis answer `TRYAGAIN` to every route-wide
    // check while the route's slot migrates between Cluster nodes, where
    // it decides one whose keys are all on the node it asks.
    let with_block = check.block.is_some() || check.global.is_some();
    let with_route = check.global.is_some();
    let keys = 1 + usize::from(with_block) + usize::from(with_route);
    let key_len = prefix.len() + check.budget.len() + 24;
    let mut cmd = redis::Cmd::with_capacity(4 + keys, 60 + keys * key_len + args_len(check));
    cmd.arg("EVALSHA").arg(script.get_hash()).arg(keys);
    let key = |kind| KeyArg {
        prefix,
        check,
        kind,
    };
    cmd.arg(key(KeyKind::State));
    if check.block.is_some() {
        cmd.arg(key(KeyKind::Block));
    } else if with_block {
        cmd.arg(key(KeyKind::Route));
    }
    if with_route {
        cmd.arg(key(KeyKind::Route));
    }
    cmd.arg(ScriptArgs(check, deadline));
    cmd
}

/// One key of a check, written into a command as it is formatted.
struct KeyArg<'a> {
    prefix: &'a str,
    check: &'a Check,
    kind: KeyKind,
}

impl redis::ToRedisArgs for KeyArg<'_> {
    fn write_redis_args<W: ?Sized + redis::RedisWrite>(&self, out: &mut W) {
        let mut w = out.writer_for_next_arg();
        write_key(self.prefix, self.check, self.kind, |piece| {
            let _ = w.write_all(piece.as_bytes());
        });
    }
}

/// A check's [`script_args`], written into a command, with its deadline on
/// the server's clock (see [`each_script_number`]).
struct ScriptArgs<'a>(&'a Check, Option<i64>);

impl redis::ToRedisArgs for ScriptArgs<'_> {
    fn write_redis_args<W: ?Sized + redis::RedisWrite>(&self, out: &mut W) {
        // Gathered on the stack (a check of up to 16 windows in all), then
        // written at once.
        let mut buf = arrayvec::ArrayVec::<u8, { 8 * (5 + 2 * 16) }>::new();
        let mut w = out.writer_for_next_arg();
        each_script_number(self.0, self.1, |n| {
            if buf.try_extend_from_slice(&word(n)).is_err() {
                let _ = w.write_all(&buf);
                buf.clear();
                let _ = buf.try_extend_from_slice(&word(n));
            }
        });
        let _ = w.write_all(&buf);
    }
}

/// The one argument of a check's script call (`ARGV[1]`, see
/// `scripts/prelude.lua`): its numbers packed as little-endian doubles
/// (an `f64`'s bytes), which the script unpacks with `struct` instead of
/// parsing text (parsing a dozen decimal strings was a sixth of the
/// script's CPU).
///
/// In order: now in microseconds (`-1`: the server's `TIME`), cost, block
/// time in microseconds (`0`: none; not for a straight-line counter
/// script, which a check with a block time never runs), the user's window
/// count and the
/// route-wide window count (only for the general scripts: a straight-line
/// script, see [`straight_lua`], is made for its window count, and every
/// number it unpacks costs Redis about 300 instructions), the (length in
/// microseconds, limit) pairs of the user's windows and of the route-wide
/// ones, then, for the straight-line sliding log alone, a fingerprint of the
/// user's windows (it keeps it with its hints) and how the script reads
/// the log: 1 for [`Check::exact_windows`], else 2 if a user window's limit
/// is at most 32 (its first read then takes the 32 entries before the
/// trailer), else 0.
///
/// ```
/// use std::time::Duration;
/// use tower_ratelimit::store::{redis::script_args, Check};
/// use tower_ratelimit::{Algorithm, Window};
///
/// let window = Window::new(Duration::from_secs(1), 10)?;
/// let numbers = |args: Vec<u8>| -> Vec<i64> {
///     args.chunks(8)
///         .map(|c| f64::from_le_bytes(c.try_into().unwrap()) as i64)
///         .collect()
/// };
/// // One window, no route-wide ones: a straight-line script's arguments.
/// let straight = numbers(script_args(&Check::new("api:alice", vec![window])));
/// assert_eq!(straight[..5], [-1, 1, 0, 1_000_000, 10]);
/// assert_eq!(straight.len(), 7);
/// assert_eq!(straight[6], 1);
/// // Not counted exactly, with a limit of at most 32: the log's long first read.
/// let lax = Check::new("api:alice", vec![window]).with_exact_windows(false);
/// assert_eq!(numbers(script_args(&lax))[6], 2);
/// // A counter algorithm's straight-line script: no block time either.
/// let counter = Check::new("api:alice", vec![window]).with_algorithm(Algorithm::FixedWindow);
/// assert_eq!(numbers(script_args(&counter)), [-1, 1, 1_000_000, 10]);
/// // Six windows (1 to 6 s): the general script's, with the window counts.
/// let six = (1..=6)
///     .map(|s| Window::new(Duration::from_secs(s), 10))
///     .collect::<Result<Vec<_>, _>>()?;
/// let general = numbers(script_args(&Check::new("api:alice", six)));
/// assert_eq!(general[..7], [-1, 1, 0, 6, 0, 1_000_000, 10]);
/// assert_eq!(general.len(), 5 + 2 * 6);
/// # Ok::<(), tower_ratelimit::ConfigError>(())
/// ```
pub fn script_args(check: &Check) -> Vec<u8> {
    let mut out = Vec::with_capacity(args_len(check));
    each_script_number(check, None, |n| out.extend_from_slice(&word(n)));
    out
}

/// The length of a check's [`script_args`].
fn args_len(check: &Check) -> usize {
    let kind = ScriptKind::of(check);
    let global = check.global.as_ref().map_or(0, |g| g.windows.len());
    let optional = usize::from(kind.takes_block())
        + 2 * usize::from(kind.takes_counts())
        + 2 * usize::from(kind.takes_fingerprint());
    8 * (2 + optional + 2 * (check.windows.len() + global))
}

/// Which script a check runs, and so which of the optional numbers of
/// [`script_args`] it is sent: a straight-line script is made for its
/// window count and has no route-wide windows; a counter algorithm's never
/// has a block time; only the packed sliding log reads the fingerprint.
#[derive(Clone, Copy, PartialEq, Eq)]
enum ScriptKind {
    General,
    StraightCounter,
    PackedLog,
}

impl ScriptKind {
    fn of(check: &Check) -> Self {
        match (straight(check), check.algorithm) {
            (false, _) => Self::General,
            (true, Algorithm::SlidingLog) => Self::PackedLog,
            (true, _) => Self::StraightCounter,
        }
    }

    fn takes_block(self) -> bool {
        self != Self::StraightCounter
    }

    fn takes_counts(self) -> bool {
        self == Self::General
    }

    fn takes_fingerprint(self) -> bool {
        self == Self::PackedLog
    }
}

/// Each number of a check's [`script_args`], in order. On the server's
/// clock, `now` is `-deadline` (microseconds on that clock) when the check
/// has one: the script refuses the check, recording nothing, once the
/// clock is past it (`-1`: no deadline).
fn each_script_number(check: &Check, deadline: Option<i64>, mut push: impl FnMut(i64)) {
    let kind = ScriptKind::of(check);
    let global_windows = check.global.as_ref().map_or(&[][..], |g| &g.windows[..]);
    push(match check.now {
        Some(now) => saturating_i64(now.as_micros()),
        None => deadline.map_or(-1, |d| -d),
    });
    push(i64::from(check.cost));
    if kind.takes_block() {
        push(saturating_i64(
            check.block.map_or(0, crate::clock::duration_micros),
        ));
    }
    if kind.takes_counts() {
        push(saturating_i64(check.windows.len() as u64));
        push(saturating_i64(global_windows.len() as u64));
    }
    for w in check.windows.iter().chain(global_windows) {
        push(saturating_i64(w.micros()));
        push(i64::from(w.limit()));
    }
    if kind.takes_fingerprint() {
        push(windows_fingerprint(&check.windows));
        push(log_read(check));
    }
}

/// How the packed sliding log reads a check's log, the last of its
/// numbers (`exact` in `scripts/straight_packed_log.lua`): 1 when every
/// window is counted exactly, else 2 when a window's limit is at most 32
/// (all its entries are in the first read's 32 before the trailer), else 0
/// (the trailer and the newest entry alone). Worked out here once, where
/// the script compared every window's limit on every check.
fn log_read(check: &Check) -> i64 {
    if check.exact_windows {
        1
    } else if check.windows.iter().any(|w| w.limit() <= 32) {
        2
    } else {
        0
    }
}

/// The fingerprint of a budget's windows (their number and lengths): the
/// packed sliding log keeps it with its window hints, which hold only for
/// the windows they were worked out for. One number instead of every
/// window's length spares the script two numbers to unpack and pack per
/// window. A fixed multiply-and-rotate hash, one multiplication per
/// number (it runs on every check), so every replica and version computes
/// the same one; odd and below 2^53, so a Lua number holds it exactly and
/// it is never the 0 of an empty trailer. (Two window sets with one
/// fingerprint on one key would need a 1-in-2^52 chance at a rule change.)
fn windows_fingerprint(windows: &[Window]) -> i64 {
    const K: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut hash = (windows.len() as u64).wrapping_mul(K);
    for w in windows {
        hash = (hash.rotate_left(29) ^ w.micros()).wrapping_mul(K);
    }
    ((hash >> 11) | 1) as i64
}

fn saturating_i64(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

/// Whether a Cluster node answered that the call's slot is moving to
/// another node: `TRYAGAIN` (a call of several keys, some moved and some
/// not yet), or an `ASK` or `MOVED` redirect the Cluster client's own
/// retries did not settle (two calls redirected at once to one connection
/// can take each other's `ASKING`). Redis ran nothing, so the call may go
/// again.
fn slot_moving(e: &RedisError) -> bool {
    use redis::ServerErrorKind::{Ask, Moved, TryAgain};
    matches!(e.kind(), redis::ErrorKind::Server(TryAgain | Ask | Moved))
}

/// How long a call answered [`slot_moving`] first waits before it goes
/// again (a slot's keys move in a few milliseconds), doubled at each try
/// up to [`MOVING_PAUSE_MAX`]; the check's deadline bounds the tries.
const MOVING_PAUSE: Duration = Duration::from_millis(2);

/// The longest wait between two tries of a call whose slot is moving: a
/// check that cannot be decided until the slot has moved (see the module
/// docs) costs the slot's nodes a few calls, not one every 2 ms.
const MOVING_PAUSE_MAX: Duration = Duration::from_millis(16);

/// Sends `cmd` again while its slot is moving (see [`slot_moving`]): after
/// an `ASK`, at once, to the node it names, with its `ASKING` (see
/// [`AskAgain`]); otherwise a moment later. Until `until` (the check's
/// deadline): `None` if it passed during a try, which Redis may have
/// run.
async fn again_while_moving<C: AskAgain>(
    conn: &mut C,
    cmd: &redis::Cmd,
    first: RedisError,
    until: tokio::time::Instant,
) -> Option<RedisResult<Vec<u8>>> {
    let mut last = first;
    let mut pause = MOVING_PAUSE;
    let mut after_ask = false;
    loop {
        // (`redirect_node` gives the node's address and the slot.)
        let asked = last
            .redirect_node()
            .filter(|_| last.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::Ask))
            .and_then(|(address, _slot)| address.rsplit_once(':'))
            .and_then(|(host, port)| Some((host.to_owned(), port.parse().ok()?)));
        // (An `ASK` goes at once, once.)
        if asked.is_none() || after_ask {
            // (Waiting is no try: a deadline that passes here leaves the
            // last answer, that Redis ran nothing.)
            if tokio::time::Instant::now() + pause >= until {
                return Some(Err(last));
            }
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(MOVING_PAUSE_MAX);
        }
        after_ask = asked.is_some();
        let attempt = async {
            if let Some(asking) = asked.and_then(|node| conn.ask_again(cmd, node)) {
                return asking.await;
            }
            cmd.query_async(conn).await
        };
        match tokio::time::timeout_at(until, attempt).await {
            Err(_) => return None,
            Ok(Err(e)) if slot_moving(&e) => last = e,
            Ok(result) => return Some(result),
        }
    }
}

/// How a connection sends a call again after an `ASK` its client did not
/// settle. redis-rs' Cluster client sends `ASKING` and waits for its
/// answer before it sends the call, so another call on the same
/// connection may come between them and use the node's one-call
/// permission: the call is then answered `MOVED`, sent back to the slot's
/// old node, `ASK`ed again, and so on until its tries run out (3–4% of the
/// checks of the moving slots failed so in a slow reshard). A Cluster
/// connection here sends `ASKING` and the call as one pipeline, one write
/// that nothing comes between.
trait AskAgain: ConnectionLike {
    /// `cmd` preceded by `ASKING`, as one write to `node` (host, port), or
    /// `None` for a connection that is not a Cluster's.
    fn ask_again<'a>(
        &'a mut self,
        _cmd: &'a redis::Cmd,
        _node: (String, u16),
    ) -> Option<redis::RedisFuture<'a, Vec<u8>>> {
        None
    }

    /// Whether some master of a Cluster answers a `PING` (the first
    /// answer ends it), or `None` for a connection that is not a
    /// Cluster's. A Cluster client whose checks time out again and again
    /// on one master in trouble still serves the others when this
    /// answers.
    fn answers_on_some_master(&mut self, _slots: &[u16]) -> Option<redis::RedisFuture<'_, ()>> {
        None
    }

    /// Reads `key` (`EXISTS`) from the master that serves its slot as this
    /// client knows it, sent there by its slot: `Ok` only if it answers
    /// (an integer; not a redirect, which another node would answer), or
    /// `None` for a connection that is not a Cluster's.
    fn read_at_master<'a>(&'a mut self, _key: &'a [u8]) -> Option<redis::RedisFuture<'a, ()>> {
        None
    }

    /// Runs `load` (a `SCRIPT LOAD`) on every master the Cluster's nodes
    /// list, with slots or none, or `None` for a connection that is not a
    /// Cluster's. A load sent to every master reaches those that serve a
    /// slot alone, so it misses a master added since the store loaded its
    /// scripts while its first slot moves in: its client follows the `ASK`
    /// there, and the call is answered `NOSCRIPT` until the slot is its.
    fn load_on_every_master<'a>(
        &'a mut self,
        _load: &'a redis::Cmd,
        _held: &'a [watch::Node],
    ) -> Option<redis::RedisFuture<'a, ()>> {
        None
    }

    /// The `TIME` of the master that serves `slot` as this client knows
    /// it, or `None` for a connection that is not a Cluster's.
    fn time_at_slot(&mut self, _slot: u16) -> Option<redis::RedisFuture<'_, (i64, i64)>> {
        None
    }

    /// `CLUSTER SLOTS`, asked of any node, or `None` for a connection that
    /// is not a Cluster's.
    fn cluster_slots(&mut self) -> Option<redis::RedisFuture<'_, redis::Value>> {
        None
    }
}

impl AskAgain for MultiplexedConnection {}

impl AskAgain for ClusterConnection {
    fn ask_again<'a>(
        &'a mut self,
        cmd: &'a redis::Cmd,
        (host, port): (String, u16),
    ) -> Option<redis::RedisFuture<'a, Vec<u8>>> {
        Some(Box::pin(async move {
            let mut pipe = redis::pipe();
            pipe.cmd("ASKING").add_command(cmd.clone());
            let node = redis::cluster_routing::SingleNodeRoutingInfo::ByAddress { host, port };
            // (The call's answer alone: the pipeline's second.)
            let answer = self.route_pipeline(pipe, 1, 1, node).await?;
            let value = answer.into_iter().next().ok_or_else(|| {
                RedisError::from((
                    redis::ErrorKind::UnexpectedReturnType,
                    "no answer to a call sent after ASKING",
                ))
            })?;
            Ok(<Vec<u8> as redis::FromRedisValue>::from_redis_value(
                value.extract_error()?,
            )?)
        }))
    }

    fn answers_on_some_master(&mut self, slots: &[u16]) -> Option<redis::RedisFuture<'_, ()>> {
        Some(ping_some_master(self, slots))
    }

    fn time_at_slot(&mut self, slot: u16) -> Option<redis::RedisFuture<'_, (i64, i64)>> {
        use redis::cluster_routing::{Route, RoutingInfo, SingleNodeRoutingInfo, SlotAddr};
        Some(Box::pin(async move {
            let master = SingleNodeRoutingInfo::SpecificNode(Route::new(slot, SlotAddr::Master));
            let time = self
                .route_command(redis::cmd("TIME"), RoutingInfo::SingleNode(master))
                .await?;
            Ok(<(i64, i64) as redis::FromRedisValue>::from_redis_value(
                time,
            )?)
        }))
    }

    fn cluster_slots(&mut self) -> Option<redis::RedisFuture<'_, redis::Value>> {
        Some(Box::pin(async move {
            redis::cmd("CLUSTER").arg("SLOTS").query_async(self).await
        }))
    }

    fn read_at_master<'a>(&'a mut self, key: &'a [u8]) -> Option<redis::RedisFuture<'a, ()>> {
        use redis::cluster_routing::{Route, RoutingInfo, SingleNodeRoutingInfo, SlotAddr};
        Some(Box::pin(async move {
            let master =
                SingleNodeRoutingInfo::SpecificNode(Route::with_key(key, SlotAddr::Master));
            let mut exists = redis::cmd("EXISTS");
            exists.arg(key);
            match self
                .route_command(exists, RoutingInfo::SingleNode(master))
                .await?
            {
                redis::Value::Int(_) => Ok(()),
                _ => Err(RedisError::from((
                    redis::ErrorKind::UnexpectedReturnType,
                    "EXISTS answered otherwise than by a number",
                ))),
            }
        }))
    }

    fn load_on_every_master<'a>(
        &'a mut self,
        load: &'a redis::Cmd,
        held: &'a [watch::Node],
    ) -> Option<redis::RedisFuture<'a, ()>> {
        Some(Box::pin(async move {
            let nodes: String = redis::cmd("CLUSTER").arg("NODES").query_async(self).await?;
            // (Not a held master (see `Watch`): the client may hold no
            // connection to it, and redis-rs answers a command sent by
            // address to such a node by reconnecting from its initial
            // nodes, which would wait on it.)
            let loads = cluster_masters(&nodes, held).map(|(host, port)| {
                let mut conn = self.clone();
                let node = redis::cluster_routing::SingleNodeRoutingInfo::ByAddress {
                    host: host.to_owned(),
                    port,
                };
                async move {
                    conn.route_command(
                        load.clone(),
                        redis::cluster_routing::RoutingInfo::SingleNode(node),
                    )
                    .await
                }
            });
            // (A node the client holds no connection to is not reached by
            // address; the one that answered `NOSCRIPT` after an `ASK` is.
            // Loaded if any load succeeded.)
            let loaded = futures_util::future::join_all(loads).await;
            match loaded.iter().any(Result::is_ok) {
                true => Ok(()),
                false => loaded.into_iter().find_map(Result::err).map_or(Ok(()), Err),
            }
        }))
    }
}

/// The masters of a `CLUSTER NODES` answer that may be reached, by
/// (host, port): each line is `id ip:port@bus[,hostname] flags master
/// ...`; a master named by a hostname too is listed under both names (a
/// Cluster set to announce hostnames is known to the client by them); one
/// that `held` names under either is left out.
fn cluster_masters<'a>(
    nodes: &'a str,
    held: &'a [watch::Node],
) -> impl Iterator<Item = (&'a str, u16)> + 'a {
    nodes
        .lines()
        .filter_map(master_names)
        .map(Iterator::collect::<Vec<_>>)
        // (A held master is left out under every name it has.)
        .filter(move |names| {
            !names
                .iter()
                .any(|(host, port)| held.iter().any(|(h, p)| h == host && p == port))
        })
        .flatten()
        .filter(|(host, port)| !host.is_empty() && *port != 0)
}

/// The names of the master one `CLUSTER NODES` line lists, if it lists a
/// master that may be reached (see [`cluster_masters`]).
fn master_names(line: &str) -> Option<impl Iterator<Item = (&str, u16)>> {
    let mut fields = line.split_whitespace();
    let address = fields.nth(1)?;
    let flags = fields.next()?;
    let usable = flags
        .split(',')
        .all(|f| !matches!(f, "fail" | "fail?" | "noaddr" | "handshake"));
    if !usable || !flags.split(',').any(|f| f == "master") {
        return None;
    }
    let (ip_port, hostname) = match address.split_once(',') {
        Some((ip_port, hostname)) => (ip_port, Some(hostname)),
        None => (address, None),
    };
    let (ip, port) = ip_port.split('@').next()?.rsplit_once(':')?;
    let port: u16 = port.parse().ok()?;
    let hostname = hostname.filter(|h| !h.is_empty()).map(|h| (h, port));
    Some(std::iter::once((ip, port)).chain(hostname))
}

impl<O: Send + Sync, C: AskAgain + Send> AskAgain for Held<O, C> {
    fn ask_again<'a>(
        &'a mut self,
        cmd: &'a redis::Cmd,
        node: (String, u16),
    ) -> Option<redis::RedisFuture<'a, Vec<u8>>> {
        self.conn.ask_again(cmd, node)
    }

    fn load_on_every_master<'a>(
        &'a mut self,
        load: &'a redis::Cmd,
        held: &'a [watch::Node],
    ) -> Option<redis::RedisFuture<'a, ()>> {
        self.conn.load_on_every_master(load, held)
    }

    fn answers_on_some_master(&mut self, slots: &[u16]) -> Option<redis::RedisFuture<'_, ()>> {
        self.conn.answers_on_some_master(slots)
    }

    fn read_at_master<'a>(&'a mut self, key: &'a [u8]) -> Option<redis::RedisFuture<'a, ()>> {
        self.conn.read_at_master(key)
    }

    fn time_at_slot(&mut self, slot: u16) -> Option<redis::RedisFuture<'_, (i64, i64)>> {
        self.conn.time_at_slot(slot)
    }

    fn cluster_slots(&mut self) -> Option<redis::RedisFuture<'_, redis::Value>> {
        self.conn.cluster_slots()
    }
}

/// Slots spread over the whole range, one in 1,024 and the last: every
/// master that serves a range of more than 1,024 slots serves one.
fn probed_slots() -> impl Iterator<Item = u16> {
    (0..16).map(|i| i * 1024).chain([16383])
}

/// A `PING` to the master of `slot`, as `conn` knows it.
fn ping_slot(conn: &ClusterConnection, slot: u16) -> redis::RedisFuture<'static, ()> {
    use redis::cluster_routing::{Route, RoutingInfo, SingleNodeRoutingInfo, SlotAddr};
    let mut conn = conn.clone();
    Box::pin(async move {
        let master = SingleNodeRoutingInfo::SpecificNode(Route::new(slot, SlotAddr::Master));
        conn.route_command(redis::cmd("PING"), RoutingInfo::SingleNode(master))
            .await
            .map(drop)
    })
}

/// Whether a master of the Cluster answers, asked through its slots (see
/// [`probed_slots`]; a slot whose master the client holds no connection
/// to is asked of another node it holds, which may be a replica): the
/// first answer ends it. (Not redis-rs' `PING` to
/// every master at once, which fails as a whole when the client has no
/// connection to one of them.)
fn ping_some_master(conn: &ClusterConnection, slots: &[u16]) -> redis::RedisFuture<'static, ()> {
    let pings: Vec<_> = slots.iter().map(|&slot| ping_slot(conn, slot)).collect();
    if pings.is_empty() {
        let none = io_error(std::io::ErrorKind::Other, "no slot to ask".to_owned());
        return Box::pin(std::future::ready(Err(none)));
    }
    Box::pin(async move { futures_util::future::select_ok(pings).await.map(drop) })
}

/// Whether the answer is a Cluster's `MOVED` redirect.
fn is_moved(e: &RedisError) -> bool {
    e.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::Moved)
}

/// Whether Redis did not know the script (`NOSCRIPT`).
fn is_noscript(e: &RedisError) -> bool {
    e.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::NoScript)
}

/// Loads the script `cmd` names through `conn` and sends `cmd` again;
/// on a Cluster that still does not know it, loads it on every master
/// its nodes list (see [`AskAgain::load_on_every_master`]) and sends
/// `cmd` a third time.
async fn reload_and_retry<C: AskAgain + Clone>(
    conn: &mut C,
    cmd: &redis::Cmd,
    scripts: &Scripts,
    held: &[watch::Node],
) -> RedisResult<Vec<u8>> {
    match reload_and_retry_once(conn, cmd, scripts).await {
        Err(e) if is_noscript(&e) => {
            let Some(load) = scripts.load_cmd(cmd) else {
                return Err(e);
            };
            match conn.load_on_every_master(&load, held) {
                Some(loading) => loading.await?,
                None => return Err(e),
            }
            cmd.query_async(conn).await
        }
        result => result,
    }
}

/// [`reload_and_retry`]'s load through `conn` and second try.
async fn reload_and_retry_once<C: ConnectionLike + Clone>(
    conn: &mut C,
    cmd: &redis::Cmd,
    scripts: &Scripts,
) -> RedisResult<Vec<u8>> {
    // (Checks answered `NOSCRIPT` together wait for the first one's load,
    // then call again; a load that did not cover this script, such as
    // another's, or another node's, is followed by this one's own.)
    let seen = scripts.reloads.load(Ordering::Acquire);
    let guard = scripts.reloading.lock().await;
    if scripts.reloads.load(Ordering::Acquire) == seen {
        scripts.load_for(conn, std::iter::once(cmd)).await?;
        scripts.reloads.fetch_add(1, Ordering::Release);
        drop(guard);
        return cmd.query_async(conn).await;
    }
    drop(guard);
    match cmd.query_async(conn).await {
        Err(e) if is_noscript(&e) => {
            scripts.load_for(conn, std::iter::once(cmd)).await?;
            cmd.query_async(conn).await
        }
        result => result,
    }
}

/// A reply's numbers: every script answers with one string of
/// little-endian IEEE 754 doubles (whole numbers, as [`word`] sends them;
/// a fraction is cut toward zero, NaN reads as 0, and a number beyond
/// `i64` as its bound).
fn words(reply: &[u8]) -> impl Iterator<Item = i64> + '_ {
    reply.chunks_exact(8).map(|c| {
        let mut n = [0u8; 8];
        n.copy_from_slice(c);
        f64::from_le_bytes(n) as i64
    })
}

/// A number as the scripts' `struct` format `d` reads it: a little-endian
/// IEEE 754 double, 8 bytes on every platform Redis runs on. Every number
/// in a script is a Lua double anyway (an integer of up to 2^53, such as a
/// clock in microseconds, is exact), and `d` costs Redis about 100
/// instructions less per number to pack or unpack than the 64-bit integer
/// format `i8`, which converts byte by byte and parses its size.
fn word(n: i64) -> [u8; 8] {
    (n as f64).to_le_bytes()
}

/// A general script's reply (and a straight-line sliding log's; see
/// `scripts/prelude.lua`): allowed, retry (µs), reset (µs), blocked, then
/// the remaining of every window. The straight-line sliding log answers an
/// allowed check with reset and the remaining alone (allowed, no wait, not
/// blocked: three numbers it need not pack), and the usual allowed check
/// with what it wrote over the log's trailer ([`decode_written`]).
fn decode(check: &Check, reply: &[u8]) -> Result<Decision, StoreError> {
    let global = check.global.as_ref().map(|g| &g.windows[..]).unwrap_or(&[]);
    let count = check.windows.len() + global.len();
    let packed_log = ScriptKind::of(check) == ScriptKind::PackedLog;
    if packed_log && reply.len() == 8 * (6 + 2 * count) {
        return decode_written(&check.windows, reply);
    }
    let allowed_only = packed_log && reply.len() == 8 * (1 + count);
    if !allowed_only && reply.len() != 8 * (4 + count) {
        return Err(unexpected(reply));
    }
    let mut numbers = words(reply);
    let mut next = || numbers.next().unwrap_or(0);
    let (allowed, retry, reset, blocked) = if allowed_only {
        (1, 0, next(), 0)
    } else {
        (next(), next(), next(), next())
    };
    let windows = check.windows.iter().chain(global);
    let micros = |v: i64| Duration::from_micros(u64::try_from(v).unwrap_or(0));
    if blocked == 1 {
        return Ok(Decision::new_blocked(
            micros(retry),
            check.windows.iter().copied(),
        ));
    }
    let states = windows.map(|w| {
        let r = next();
        WindowState::new(*w, u32::try_from(r.max(0)).unwrap_or(u32::MAX))
    });
    Ok(Decision::new(
        allowed == 1,
        Some(micros(retry)),
        micros(reset),
        states,
    ))
}

/// The straight-line sliding log's reply to the usual allowed check (one
/// entry appended; see `scripts/straight_packed_log.lua`): the bytes it
/// wrote over the log's old trailer, the new entry then the new trailer:
/// per window its first entry's index and that entry, then the log's size,
/// the script's clock, the TTL's end, where the log starts and the
/// windows' fingerprint. The report is worked out here as the script's
/// end would: a window counts the entries from its first to the last
/// (an upper bound for a window the script did not search, which it
/// leaves so only when that cannot be the fewest remaining), and the
/// window with the fewest remaining (on a tie, the shorter, then the
/// first) resets when its first entry leaves it. Redis packs no reply
/// and works none of it out: about a tenth of a check's instructions
/// (`benches/HISTORY.md`, round 51). An allowed check counts at least its
/// own entry and at most its limit in every window; numbers that do not
/// are an error, not a report.
fn decode_written(windows: &[Window], reply: &[u8]) -> Result<Decision, StoreError> {
    let mut numbers = words(reply).skip(1);
    let mut firsts = ArrayVec::<(i64, i64), MAX_WINDOWS>::new();
    for _ in windows {
        let first = (numbers.next().unwrap_or(0), numbers.next().unwrap_or(0));
        if firsts.try_push(first).is_err() {
            return Err(unexpected(reply));
        }
    }
    let size = numbers.next().unwrap_or(0);
    let now = numbers.next().unwrap_or(0);
    let mut states = ArrayVec::<WindowState, MAX_WINDOWS>::new();
    for (w, &(index, _)) in windows.iter().zip(&firsts) {
        let count = size.saturating_add(1).saturating_sub(index);
        let remaining = i64::from(w.limit()).saturating_sub(count);
        let Ok(remaining) = u32::try_from(remaining) else {
            return Err(not_following());
        };
        if count < 1 {
            return Err(not_following());
        }
        let _ = states.try_push(WindowState::new(*w, remaining));
    }
    let fewest = super::constraining(states.iter().map(|s| (s.remaining, s.window().micros())));
    let reset = fewest
        .and_then(|i| Some((windows.get(i)?, firsts.get(i)?.1)))
        .map_or(0, |(w, oldest)| {
            oldest
                .saturating_add(saturating_i64(w.micros()))
                .saturating_sub(now)
        });
    let reset = Duration::from_micros(u64::try_from(reset).unwrap_or(0));
    Ok(Decision::new(true, Some(Duration::ZERO), reset, states))
}

/// A script's reply whose decision does not follow from the numbers it
/// returned with it.
fn not_following() -> StoreError {
    StoreError::new(
        StoreErrorKind::Backend,
        "the script's decision does not follow from the state it returned",
    )
}

/// A straight-line counter script's reply (fixed window, sliding window,
/// token bucket): whether it allowed the request, its clock, and the
/// budget's state as the script left it, per window the numbers it stores
/// (`[d, count, window]`, `[d, count, previous, window]`, `[d, TAT]`).
/// The report (remaining, reset, retry) is worked out here, by the memory
/// store's own function run on the state as the script found it (an
/// allowed request's cost taken back out): Redis spends nothing on it, and
/// both stores report alike by construction. The function decides again on
/// the way, and must agree with the script.
fn decode_counters(check: &Check, reply: &[u8]) -> Result<Decision, StoreError> {
    type Report =
        fn(&mut ArrayVec<Slot, MAX_WINDOWS>, &[Window], u32, u64, bool) -> (Decision, u64);
    let (width, report): (usize, Report) = match check.algorithm {
        Algorithm::FixedWindow => (3, counters::fixed_window),
        Algorithm::SlidingWindow => (4, counters::sliding_window),
        Algorithm::TokenBucket => (2, counters::token_bucket),
        Algorithm::SlidingLog => return Err(unexpected(reply)),
    };
    let windows = &check.windows[..];
    if reply.len() != 8 * (2 + width * windows.len()) {
        return Err(unexpected(reply));
    }
    let mut numbers = words(reply).map(|v| u64::try_from(v).unwrap_or(0));
    let mut next = || numbers.next().unwrap_or(0);
    let allowed = next() == 1;
    let now = next();
    let cost = u64::from(check.cost);
    let spent = |v: u64, unit: u64| {
        if allowed {
            v.saturating_sub(cost.saturating_mul(unit))
        } else {
            v
        }
    };
    // Each window's stored numbers, as the memory store's slot.
    let mut state = ArrayVec::<Slot, MAX_WINDOWS>::new();
    for w in windows {
        let d = next();
        let _ = state.try_push(match check.algorithm {
            Algorithm::FixedWindow => {
                let (count, k) = (next(), next());
                [d, k, spent(count, 1), 0]
            }
            Algorithm::SlidingWindow => {
                let (count, prev, k) = (next(), next(), next());
                [d, k, spent(count, 1), prev]
            }
            // (The token bucket: the sliding log returned above.)
            _ => [d, spent(next(), counters::bucket(w).1), 0, 0],
        });
    }
    let (decision, _) = report(&mut state, windows, check.cost, now, true);
    if decision.allowed() != allowed {
        return Err(not_following());
    }
    Ok(decision)
}

fn unexpected(reply: &[u8]) -> StoreError {
    StoreError::new(
        StoreErrorKind::Backend,
        format!("unexpected script reply of {} bytes", reply.len()),
    )
}

impl Store for RedisStore {
    type Future = BoxFuture<Result<Decision, StoreError>>;

    fn check(&self, mut check: Check) -> Self::Future {
        if let Err(error) = check.as_ref().supported() {
            return Box::pin(std::future::ready(Err(error)));
        }
        // No windows limit nothing and keep nothing: a check without any is
        // allowed without a command (the scripts would store an empty state
        // over the budget's), and a route-wide budget without windows is
        // left out. (The layer sends neither.)
        if check.windows.is_empty() {
            let allowed = Decision::new(true, None, Duration::ZERO, []);
            return Box::pin(std::future::ready(Ok(allowed)));
        }
        if check.global.as_ref().is_some_and(|g| g.windows.is_empty()) {
            check.global = None;
        }
        Box::pin(Self::run(self.inner.clone(), check))
    }

    /// On a Cluster: the master that serves the check's slot now, as the
    /// store last read the slots (its watch of the masters, or through a
    /// caller's pool every 5 s; 1 to 63, each master numbered as the store
    /// first names it; 0 when the slot's master is not known yet). One master that hangs then sends only its own
    /// budgets to [`FailMode::Fallback`](crate::FailMode::Fallback)'s
    /// in-process store; once its replica is promoted, its slots are
    /// another part, asked again at once. Otherwise 0: the whole store.
    fn failure_domain(&self, check: &CheckRef<'_>) -> u32 {
        self.inner
            .cluster_domain(check)
            .map_or(0, |(_, domain)| domain)
    }

    /// The Cluster master of `domain`: `redis cluster master HOST:PORT`.
    fn failure_domain_name(&self, domain: u32) -> Option<String> {
        let node = self.inner.masters()?.domain_node(domain)?;
        Some(format!("redis cluster master {}", watch::name(&node)))
    }

    fn adjust(&self, check: Check, adjustment: Adjustment) -> AdjustFuture {
        if let Err(error) = check.as_ref().shape_supported() {
            return Box::pin(std::future::ready(Err(error)));
        }
        if adjustment.is_empty() || check.windows.is_empty() {
            return Box::pin(std::future::ready(Ok(())));
        }
        Box::pin(Self::run_adjust(self.inner.clone(), check, adjustment))
    }
}

impl RedisStoreBuilder {
    /// One Redis server, e.g. `redis://127.0.0.1:6379` (the default shape:
    /// one multiplexed connection). `url`, [`cluster`](Self::cluster),
    /// [`sentinel`](Self::sentinel), [`pool`](Self::pool) and
    /// [`cluster_pool`](Self::cluster_pool) each name the store's target:
    /// the last one called is the target.
    pub fn url(mut self, url: impl Into<String>) -> Self {
        self.target = Some(Target::Url(url.into()));
        self
    }

    /// A Redis Cluster, given some of its nodes (the first one's user,
    /// password and TLS settings apply to every node). Besides redis-rs'
    /// Cluster client, the store watches each master on connections of its
    /// own: the checks of a master that answers nothing fail at once (the
    /// fail mode applies) until it answers or its slots move, so that it
    /// holds back no other master's checks (see the README's failure
    /// modes).
    pub fn cluster<U: Into<String>>(mut self, urls: impl IntoIterator<Item = U>) -> Self {
        self.target = Some(Target::Cluster(urls.into_iter().map(Into::into).collect()));
        self
    }

    /// A master watched by Redis Sentinel: `sentinels` are the sentinels'
    /// addresses (`redis://127.0.0.1:26379`), `service` the name they know
    /// the master by (`mymaster`). Every connection is made to the master
    /// they name at that moment; one to a master that was demoted is
    /// dropped at its first `READONLY` answer, and one to a master the
    /// sentinels no longer name (asked four times a second, over one kept
    /// connection to a sentinel) is dropped then, so after a failover the
    /// store follows the new master within a quarter of a second and one
    /// reconnect (its checks meanwhile fail, and the layer's fail mode
    /// applies). What it wrote to the old master after the replica's
    /// promotion is lost, as a failover loses a master's last writes, and
    /// those requests' budgets are spent again: the sentinels name the new
    /// master about a second after promoting it (their own timing), so that
    /// is about a second of traffic (measured under `SENTINEL FAILOVER` at
    /// 8,500 checks a second: 9,000–9,600 checks lost; 11,200–11,500 when
    /// the store asked once a second). One
    /// multiplexed connection, as with [`url`](Self::url).
    ///
    /// ```no_run
    /// use tower_ratelimit::store::redis::RedisStore;
    ///
    /// # async fn run() -> Result<(), tower_ratelimit::StoreError> {
    /// let store = RedisStore::builder()
    ///     .sentinel(["redis://10.0.0.1:26379", "redis://10.0.0.2:26379"], "mymaster")
    ///     .build()
    ///     .await?;
    /// # let _ = store; Ok(()) }
    /// ```
    pub fn sentinel<U: Into<String>>(
        mut self,
        sentinels: impl IntoIterator<Item = U>,
        service: impl Into<String>,
    ) -> Self {
        self.target = Some(Target::Sentinel {
            sentinels: sentinels.into_iter().map(Into::into).collect(),
            service: service.into(),
            master: None,
        });
        self
    }

    /// After [`sentinel`](Self::sentinel) (called before it, or with
    /// another target, it does nothing; a later `sentinel` drops it): the
    /// master's credentials and database, as a URL whose address is not used (the sentinels give
    /// it), e.g. `redis://app:secret@master/2`. Without it, the master is
    /// reached with no password, on database 0. Its scheme says whether the
    /// master is reached over TLS (`rediss://`, with the `tls` feature;
    /// `#insecure` at its end skips the verification, and then no client
    /// certificate can be presented to it: `build` refuses one); without
    /// it, the first sentinel's URL does.
    pub fn sentinel_master_url(mut self, url: impl Into<String>) -> Self {
        if let Some(Target::Sentinel { master, .. }) = &mut self.target {
            *master = Some(url.into());
        }
        self
    }

    /// With the `tls` feature: trusts `pem` (one or more PEM certificates)
    /// as the roots for `rediss://` connections made by a
    /// [`url`](Self::url), [`cluster`](Self::cluster) or
    /// [`sentinel`](Self::sentinel) store, instead of the system's root
    /// certificates (they replace them): for a Redis whose certificate a
    /// private CA signed. A Sentinel store uses them for the sentinels if
    /// their URLs are all `rediss://`, and for the master if its connection
    /// is TLS (see [`sentinel_master_url`](Self::sentinel_master_url));
    /// `build` fails if neither is, if some sentinels' URLs are `rediss://`
    /// and some not, or if their credentials differ (redis-rs then takes
    /// one set for all). A caller's pool uses its own configuration: given
    /// to one, the certificates make `build` fail, as with a URL that is
    /// not `rediss://`. `rediss://HOST/#insecure`
    /// skips the server's verification, for tests. `build` refuses what
    /// holds no PEM certificate, and a certificate the server or the store
    /// refuses.
    ///
    /// Building a store with the `tls` feature makes ring rustls' process
    /// default crypto provider, if none is installed yet: an application
    /// that installs another does so before.
    ///
    /// ```no_run
    /// use tower_ratelimit::store::redis::RedisStore;
    ///
    /// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
    /// let store = RedisStore::builder()
    ///     .url("rediss://redis.internal:6380")
    ///     .tls_root_certificate(std::fs::read("/etc/redis/ca.crt")?)
    ///     .build()
    ///     .await?;
    /// # let _ = store; Ok(()) }
    /// ```
    #[cfg(feature = "tls")]
    pub fn tls_root_certificate(mut self, pem: impl Into<Vec<u8>>) -> Self {
        self.tls.certificates().root_cert = Some(pem.into());
        self
    }

    /// With the `tls` feature: the client certificate and its private key
    /// (PEM) that a [`url`](Self::url), [`cluster`](Self::cluster) or
    /// [`sentinel`](Self::sentinel) store presents on `rediss://`
    /// connections (a Sentinel store's to the master and to `rediss://`
    /// sentinels), for a Redis that asks clients for one (its
    /// `tls-auth-clients`, on by default). `build` refuses it for a
    /// caller's pool or a URL that is not `rediss://`, and a certificate or
    /// key that holds no PEM one.
    #[cfg(feature = "tls")]
    pub fn tls_client_certificate(
        mut self,
        certificate: impl Into<Vec<u8>>,
        key: impl Into<Vec<u8>>,
    ) -> Self {
        self.tls.certificates().client_tls = Some(redis::ClientTlsConfig {
            client_cert: certificate.into(),
            client_key: key.into(),
        });
        self
    }

    /// A `deadpool-redis` pool owned by the caller.
    ///
    /// The store checks one connection out of it when built and keeps it
    /// while it lives (clones share it): the pool's connections multiplex,
    /// so that one carries every check, one command each, with no
    /// `pool.get()` health check per check. A broken one is given back
    /// (the pool's own health check then keeps or drops it) and another is
    /// checked out in the background, while checks fail fast (the layer's
    /// [`FailMode`](crate::FailMode)). Size the pool for your own code plus
    /// this one connection; a checkout that waits past
    /// [`connect_timeout`](Self::connect_timeout) fails and is tried again.
    ///
    /// ```no_run
    /// use tower_ratelimit::store::redis::{deadpool_redis, RedisStore};
    ///
    /// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
    /// let pool = deadpool_redis::Config::from_url("redis://127.0.0.1:6379")
    ///     .create_pool(Some(deadpool_redis::Runtime::Tokio1))?;
    /// // The same pool serves the application's own commands.
    /// let store = RedisStore::builder().pool(pool.clone()).build().await?;
    /// # Ok(()) }
    /// ```
    pub fn pool(mut self, pool: deadpool_redis::Pool) -> Self {
        self.target = Some(Target::Pool(pool));
        self
    }

    /// A `deadpool-redis` cluster pool owned by the caller; one of its
    /// connections is kept checked out, as with [`pool`](Self::pool). A
    /// Cluster client heals node by node, so it is kept while a master
    /// answers it (it serves them): after failed checks in a row the store
    /// asks the pool for another in the background, and swaps it in once
    /// it is ready and reads the failed check's key from its master where
    /// the kept one cannot (or at once when no node answers the kept one).
    /// A pool makes its clients with no response timeout and a connection
    /// timeout of a second, longer than the store waits for one (the
    /// connection timeout): while a node its URLs name hangs, it gives the
    /// store none, and a hung master's promoted replica is followed only
    /// once the kept client learns of it (the store's own client, with
    /// [`cluster`](Self::cluster), follows it within a few seconds).
    /// The store reads the Cluster's slots through it (`CLUSTER SLOTS` at
    /// connect and every 5 s; its user needs `cluster|slots`), so that
    /// [`FailMode::Fallback`](crate::FailMode::Fallback) is down master by
    /// master and each check carries its master's deadline.
    /// Size the pool for your own code plus two connections.
    pub fn cluster_pool(mut self, pool: deadpool_redis::cluster::Pool) -> Self {
        self.target = Some(Target::ClusterPool(pool));
        self
    }

    /// The first part of every key (default `rl`). It must not contain `{`
    /// or `}`: the hash tag is the budget's.
    pub fn prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = prefix.into();
        self
    }

    /// The deadline of one check (default 50 ms): the script, its reload
    /// and second try after a `NOSCRIPT`, on a Cluster its tries while its
    /// slot moves (2 to 16 ms apart), and its one try again after Redis
    /// refused it as late while the store still waited (see the module's
    /// docs). A check past it fails with
    /// [`StoreErrorKind::Timeout`], and the
    /// layer's fail mode applies; give at least a round trip and Redis's
    /// own time (a zero deadline fails every check).
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// How long the store's connection (its own, or the one it holds from
    /// a caller's pool; not a Cluster client's, which heals node by node)
    /// may stay idle before the store pings it, at most half that again
    /// later (default 1 s; `None`: never).
    /// A connection that a server's `timeout`, a load balancer or a NAT
    /// closed while idle is then found and replaced before a request needs
    /// it, and one pinged is not closed for idleness; while checks flow, no
    /// ping is sent.
    ///
    /// ```no_run
    /// # async fn f() -> Result<(), tower_ratelimit::StoreError> {
    /// use std::time::Duration;
    /// use tower_ratelimit::store::redis::RedisStore;
    ///
    /// let store = RedisStore::builder()
    ///     .url("redis://127.0.0.1:6379")
    ///     .keepalive(Some(Duration::from_secs(10)))
    ///     .build()
    ///     .await?;
    /// # Ok(()) }
    /// ```
    pub fn keepalive(mut self, idle: Option<Duration>) -> Self {
        self.keepalive = idle;
        self
    }

    /// The deadline of establishing a connection, or of checking one out
    /// of a caller's pool (default 500 ms). Making a connection ready
    /// (the scripts checked and loaded, the server's clock read) may take
    /// four times as long again, as may finding a Cluster's nodes or a
    /// Sentinel's master; [`build`](Self::build) waits for its first try,
    /// so a slow target can hold it several times this (requests never
    /// wait for a connection).
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }

    /// Whether the checks sent together on one server (a batch: the
    /// requests of one scheduler tick) go, those of one algorithm and
    /// window count, as one call of a batch script (the default), or one
    /// `EVALSHA` each, still in one write. Turn it off behind a proxy that
    /// shards keys over several servers and routes a call by its first key
    /// (twemproxy, Envoy's Redis proxy): a call of several users' checks
    /// would reach the first user's shard only. A server that refuses such
    /// a call (`CROSSSLOT`) turns it off by itself. A Cluster's checks go
    /// one command each whatever this says.
    ///
    /// ```no_run
    /// use tower_ratelimit::store::redis::RedisStore;
    ///
    /// # async fn run() -> Result<(), tower_ratelimit::StoreError> {
    /// // Through a sharding proxy:
    /// let store = RedisStore::builder()
    ///     .url("redis://twemproxy:22121")
    ///     .combine_checks(false)
    ///     .build()
    ///     .await?;
    /// # Ok(()) }
    /// ```
    pub fn combine_checks(mut self, combine: bool) -> Self {
        self.combine_checks = combine;
        self
    }

    /// Builds the store and loads the script.
    ///
    /// Fails only on configuration errors ([`StoreErrorKind::Config`]): no
    /// target, an invalid URL, a prefix with braces, a `rediss://` URL
    /// without the `tls` feature, TLS certificates that hold no PEM
    /// certificate or key, that are given to a caller's pool or a URL that
    /// is not `rediss://`, or that a Sentinel store cannot use as given (see
    /// `tls_root_certificate`); and a target that
    /// answers but is set up otherwise than the store was, which no retry
    /// would mend: `cluster(..)` on a server without cluster support,
    /// `url(..)` or `pool(..)` on a node of a Cluster of several masters
    /// (which would answer `MOVED` for the others' budgets), a master name
    /// no sentinel knows, a database number the server does not have, a
    /// password the server refuses, a user whose ACL denies `SCRIPT LOAD`
    /// or `EVALSHA`, or writing keys under the store's prefix (asked as the
    /// store connects, with an `EVALSHA` on `<prefix>:{probe}:access` that
    /// touches nothing; asked again on every new connection but a
    /// Cluster's, which is used only once its server runs it within the
    /// store's timeout; a refusal there is logged once, as an error), a TLS
    /// certificate either side refuses. (The
    /// store's user needs `EVALSHA`, `SCRIPT LOAD` and its keys, and uses `SCRIPT EXISTS`, `TIME` and `INFO` where
    /// its ACL allows them; on a Cluster, also what redis-rs's cluster
    /// client asks, such as `CLUSTER SLOTS`, and `PING` and `EXISTS` to
    /// tell whether a client reaches its masters while checks fail; a
    /// store made with `cluster(..)` also sends `CLUSTER SLOTS` and `PING`
    /// on connections of its own, as it connects and when checks fail, to
    /// find a master that answers nothing, whose checks then fail at once
    /// (see the README).) A Redis that
    /// cannot be reached yet is not an error, nor a replica (which a
    /// failover may promote; it would answer every check `READONLY`): the
    /// store logs a warning, keeps connecting in the background, and until
    /// then every check fails, so the layer's fail mode applies.
    pub async fn build(self) -> Result<RedisStore, StoreError> {
        if self.prefix.contains(['{', '}']) {
            return Err(config_error("the key prefix must not contain `{` or `}`"));
        }
        let response_timeout = self.timeout;
        let connect_timeout = self.connect_timeout;
        let common = Common {
            scripts: Arc::new(Scripts::new()),
            clock: Arc::new(ServerClock::new()),
            // (Loading the scripts on a new connection: a few dozen round
            // trips.)
            load_timeout: connect_timeout.saturating_mul(4),
            probe_key: format!("{}:{{probe}}:access", self.prefix).into(),
        };
        // A multiplexed connection (of its own or a pool's) is replaced when
        // it breaks, and kept alive while idle; a Cluster client (of its own
        // or a pool's) heals itself node by node, and is replaced only when
        // it times out again and again, and kept until another is ready: it
        // still serves every master but the one in trouble.
        let direct = Shape {
            drop_when_broken: true,
            heals: false,
            keepalive: self.keepalive,
            ping_timeout: response_timeout,
            deadlines: true,
            slot_map: false,
        };
        let cluster = Shape {
            drop_when_broken: false,
            heals: true,
            keepalive: None,
            ping_timeout: response_timeout,
            deadlines: false,
            slot_map: true,
        };
        let tls = self.tls;
        // (rustls takes the process's default crypto provider, which it
        // picks by itself only when the build has one alone: ring, made the
        // default here unless the application installed one before, so
        // that a build with two, ring and aws-lc-rs, works too, on the
        // store's own connections and a caller's pool's.)
        #[cfg(feature = "tls")]
        if rustls::crypto::CryptoProvider::get_default().is_none() {
            let _ = rustls::crypto::ring::default_provider().install_default();
        }
        let backend = match self.target {
            None => return Err(config_error("no redis url, cluster or pool given")),
            Some(Target::Url(url)) => {
                let client = tls.client(&url)?;
                let config = AsyncConnectionConfig::new()
                    .set_connection_timeout(Some(connect_timeout))
                    .set_response_timeout(Some(response_timeout));
                let connect: Connect<MultiplexedConnection> = Box::new(move || {
                    let client = client.clone();
                    let config = config.clone();
                    Box::pin(async move {
                        client
                            .get_multiplexed_async_connection_with_config(&config)
                            .await
                    })
                });
                Backend::Direct(Lazy::launch(connect, direct, &common, None, None, "redis").await?)
            }
            Some(Target::Sentinel {
                sentinels,
                service,
                master,
            }) => {
                use redis::sentinel::{
                    SentinelClient, SentinelNodeConnectionInfo, SentinelServerType,
                };
                use redis::IntoConnectionInfo;
                // (Certificates are for the master, whose connection is
                // TLS when its url, or else the first sentinel's, is
                // `rediss://`; and for the sentinels, if all of theirs
                // are.)
                let master_tls = master.as_deref().or(sentinels.first().map(String::as_str));
                Tls::default().usable(sentinels.iter().map(String::as_str))?;
                Tls::default().usable(master_tls.into_iter())?;
                tls.sentinels_usable(&sentinels, master_tls)?;
                let settings = match &master {
                    Some(url) => {
                        let info = url.as_str().into_connection_info().map_err(|e| {
                            config_error(format!(
                                "invalid redis master url `{}`: {e}",
                                redacted(url)
                            ))
                        })?;
                        Some(info.redis_settings().clone())
                    }
                    None => None,
                };
                let node = settings.clone().map(|settings| {
                    SentinelNodeConnectionInfo::default().set_redis_connection_info(settings)
                });
                #[cfg(feature = "tls")]
                let mode = match master_tls {
                    Some(url) if is_tls_url(url) && url.ends_with("#insecure") => {
                        Some(redis::TlsMode::Insecure)
                    }
                    Some(url) if is_tls_url(url) => Some(redis::TlsMode::Secure),
                    _ => None,
                };
                #[cfg(feature = "tls")]
                let node = match mode {
                    Some(mode) => Some(node.unwrap_or_default().set_tls_mode(mode)),
                    None => node,
                };
                let what = format!("redis master `{service}` (through its sentinels)");
                if unknown_to_every_sentinel(&sentinels, &service, connect_timeout, &tls).await {
                    return Err(config_error(format!(
                        "{what}: no sentinel knows a master named `{service}`"
                    )));
                }
                let follow = follow_sentinels(&sentinels, &service, connect_timeout, tls.clone());
                let connected_to = follow.connected_to.clone();
                let expected = follow.expected.clone();
                let build = move |first: usize| {
                    // (Each attempt starts from the next sentinel: one that
                    // is down costs every attempt nothing but its turn.)
                    let mut order = sentinels.clone();
                    let n = order.len().max(1);
                    order.rotate_left(first % n);
                    #[cfg(feature = "tls")]
                    if let Some(certificates) = &tls.certificates {
                        return sentinel_with_certificates(
                            &order,
                            &service,
                            settings.as_ref(),
                            mode,
                            certificates.clone(),
                        );
                    }
                    SentinelClient::build(
                        order.iter().map(String::as_str).collect(),
                        service.clone(),
                        node.clone(),
                        SentinelServerType::Master,
                    )
                };
                build(0).map_err(|e| config_error(format!("invalid redis sentinel setup: {e}")))?;
                let attempts = Arc::new(AtomicU32::new(0));
                let config = AsyncConnectionConfig::new()
                    .set_connection_timeout(Some(connect_timeout))
                    .set_response_timeout(Some(response_timeout));
                let build = Arc::new(build);
                let connect: Connect<MultiplexedConnection> = Box::new(move || {
                    let config = config.clone();
                    let first = attempts.fetch_add(1, Ordering::Relaxed) as usize;
                    let client = build(first);
                    let connected_to = connected_to.clone();
                    let expected = expected.clone();
                    Box::pin(async move {
                        let mut client = client?;
                        // (The sentinels' answers have no timeout of their
                        // own: the whole connection is bounded.)
                        let connect = async {
                            let master = client.async_get_client().await?;
                            let at = master.get_connection_info().addr().to_string();
                            expect_master(&expected, &at)?;
                            let conn = master
                                .get_multiplexed_async_connection_with_config(&config)
                                .await?;
                            *connected_to
                                .lock()
                                .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(at);
                            Ok(conn)
                        };
                        tokio::time::timeout(connect_timeout.saturating_mul(4), connect)
                            .await
                            .unwrap_or_else(|_| {
                                Err(io_error(
                                    std::io::ErrorKind::TimedOut,
                                    "connecting through the sentinels timed out".to_owned(),
                                ))
                            })
                    })
                });
                Backend::Direct(
                    Lazy::launch(connect, direct, &common, Some(follow), None, &what).await?,
                )
            }
            Some(Target::Cluster(urls)) => {
                let timeouts = (connect_timeout, response_timeout);
                let client = cluster_client(&tls, &urls, timeouts)?;
                let watch = cluster_watch(&tls, &urls, connect_timeout, response_timeout)?;
                let seeds = watch.clone();
                let connect: Connect<ClusterConnection> = Box::new(move || {
                    // (Without the seeds that answered nothing lately, when
                    // others remain: a new client waits on every seed it is
                    // given, as a hung master's promoted replica is followed.)
                    let fewer = seeds.as_ref().and_then(|w| w.answering_seeds());
                    let client = match fewer {
                        Some(urls) => {
                            cluster_client(&tls, &urls, timeouts).unwrap_or(client.clone())
                        }
                        None => client.clone(),
                    };
                    Box::pin(async move {
                        tokio::time::timeout(
                            connect_timeout.saturating_mul(4),
                            client.get_async_connection(),
                        )
                        .await
                        .unwrap_or_else(|_| {
                            Err(RedisError::from(std::io::Error::new(
                                std::io::ErrorKind::TimedOut,
                                "cluster connection timed out",
                            )))
                        })
                    })
                });
                Backend::Cluster(
                    Lazy::launch(connect, cluster, &common, None, watch, "redis cluster").await?,
                )
            }
            // (A pool's connections multiplex: the store keeps one checked
            // out, see `Held`. A broken one is dropped as another is checked
            // out (a Cluster client's, which heals, once another is ready):
            // it goes back to the pool once the checks still on it end,
            // within the store's deadline; two are held for that long at
            // most.)
            Some(Target::Pool(pool)) => {
                tls.unused_by("a caller's pool (whose own configuration sets its TLS)")?;
                let get = move || -> BoxFuture<_> {
                    let pool = pool.clone();
                    Box::pin(async move { pool.get().await })
                };
                let connect = checkout(get, connect_timeout);
                Backend::Pool(
                    Lazy::launch(connect, direct, &common, None, None, "redis (pool)").await?,
                )
            }
            Some(Target::ClusterPool(pool)) => {
                tls.unused_by("a caller's pool (whose own configuration sets its TLS)")?;
                let get = move || -> BoxFuture<_> {
                    let pool = pool.clone();
                    Box::pin(async move { pool.get().await })
                };
                let connect = checkout(get, connect_timeout);
                let what = "redis cluster (pool)";
                Backend::ClusterPool(
                    Lazy::launch(connect, cluster, &common, None, None, what).await?,
                )
            }
        };
        let batcher = match &backend {
            Backend::Direct(lazy) => {
                lazy.combine.store(self.combine_checks, Ordering::Relaxed);
                Batcher::spawn(lazy, self.timeout, &self.prefix)
            }
            Backend::Pool(lazy) => {
                lazy.combine.store(self.combine_checks, Ordering::Relaxed);
                Batcher::spawn(lazy, self.timeout, &self.prefix)
            }
            Backend::Cluster(_) | Backend::ClusterPool(_) => None,
        };
        Ok(RedisStore {
            inner: Arc::new(Inner {
                backend,
                batcher,
                prefix: self.prefix.into_boxed_str(),
                timeout: self.timeout,
                scripts: common.scripts,
                clock: common.clock,
            }),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rules::Window;

    fn packed(numbers: &[i64]) -> Vec<u8> {
        numbers.iter().flat_map(|&n| word(n)).collect()
    }

    /// The URLs redis-rs reaches over TLS, and certificates refused for
    /// any other.
    #[test]
    fn tls_urls_are_rediss_and_valkeys() {
        for url in ["rediss://h:6380", "REDISS://h", "valkeys://h:6380/0"] {
            assert!(is_tls_url(url), "{url}");
        }
        for url in [
            "redis://h",
            "valkey://h",
            "unix:///tmp/r.sock",
            "rediss",
            "h:6379",
        ] {
            assert!(!is_tls_url(url), "{url}");
        }
        assert!(
            Tls::default()
                .usable(["redis://h", "rediss://h"].into_iter())
                .is_ok()
                == cfg!(feature = "tls")
        );
        #[cfg(feature = "tls")]
        {
            let mut tls = Tls::default();
            tls.certificates().root_cert = Some(b"not a certificate".to_vec());
            let error = tls.usable(["rediss://a"].into_iter()).unwrap_err();
            assert!(
                error.to_string().contains("tls_root_certificate"),
                "{error}"
            );
            let pem = b"-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n";
            tls.certificates().root_cert = Some(pem.to_vec());
            assert!(tls
                .usable(["rediss://a", "valkeys://b"].into_iter())
                .is_ok());
            let error = tls
                .usable(["rediss://a", "redis://b"].into_iter())
                .unwrap_err();
            assert_eq!(error.kind(), StoreErrorKind::Config);
            assert_eq!(
                tls.unused_by("a pool").unwrap_err().kind(),
                StoreErrorKind::Config
            );
        }
    }

    /// A reconnect's wait lies between half its backoff and all of it,
    /// and is not the same for every try.
    #[test]
    fn reconnect_waits_are_jittered_within_the_backoff() {
        let backoff = Duration::from_millis(400);
        let waits: Vec<Duration> = (0..64).map(|_| jittered(backoff)).collect();
        assert!(
            waits.iter().all(|w| *w >= backoff / 2 && *w <= backoff),
            "{waits:?}"
        );
        let first = waits[0];
        assert!(waits.iter().any(|w| *w != first), "{waits:?}");
    }

    const TEST_SHAPE: Shape = Shape {
        drop_when_broken: true,
        heals: false,
        keepalive: None,
        ping_timeout: Duration::from_millis(50),
        deadlines: true,
        slot_map: false,
    };

    fn test_common() -> Common {
        Common {
            scripts: Arc::new(Scripts::new()),
            clock: Arc::new(ServerClock::new()),
            load_timeout: Duration::from_secs(2),
            probe_key: "rl:{probe}:access".into(),
        }
    }

    /// A connection that is always refused, counting its attempts.
    fn refused(attempts: Arc<AtomicU32>) -> Connect<MultiplexedConnection> {
        Box::new(move || {
            attempts.fetch_add(1, Ordering::Relaxed);
            Box::pin(async {
                Err(io_error(
                    std::io::ErrorKind::ConnectionRefused,
                    "down".to_owned(),
                ))
            })
        })
    }

    /// A check that finds no connection and no reconnect loop running (one
    /// that ended just as its new connection broke) starts one.
    #[tokio::test(start_paused = true)]
    async fn a_check_without_a_connection_starts_a_reconnect() {
        let attempts = Arc::new(AtomicU32::new(0));
        let connect = refused(attempts.clone());
        // (Not launched: no connection, no loop.)
        let lazy = Lazy::new(connect, TEST_SHAPE, &test_common(), None, None);
        let reply = lazy
            .invoke(&redis::cmd("PING"), Duration::from_millis(50))
            .await;
        assert!(reply.is_err_and(|e| e.kind() == StoreErrorKind::Unavailable));
        tokio::time::sleep(Duration::from_millis(10)).await;
        assert_eq!(attempts.load(Ordering::Relaxed), 1);
    }

    /// A store dropped while Redis is unreachable stops trying to connect
    /// (its loop held no reference to it while waiting), and a store
    /// kept keeps trying, every 500 ms at most.
    #[tokio::test(start_paused = true)]
    async fn the_reconnect_loop_ends_with_the_store() {
        let attempts = Arc::new(AtomicU32::new(0));
        let connect = refused(attempts.clone());
        let lazy = Lazy::launch(connect, TEST_SHAPE, &test_common(), None, None, "test")
            .await
            .unwrap();
        assert!(lazy.get().is_none());
        tokio::time::sleep(Duration::from_secs(5)).await;
        // At 0 (launch) and 0, then after waits of half to all of 50, 100,
        // 200, 400 and then 500 ms each: at most 750, 1,250, ... 4,750 ms
        // (14 in 5 s), at least 375, 625, 875, ... 4,875 (24).
        let kept = attempts.load(Ordering::Relaxed);
        assert!((14..=24).contains(&kept), "{kept}");
        drop(lazy);
        tokio::time::sleep(Duration::from_secs(5)).await;
        assert_eq!(attempts.load(Ordering::Relaxed), kept);
    }

    /// After a failover, a reconnect goes to the master the sentinel named,
    /// not to the old one another sentinel still names, for
    /// `EXPECT_FOR`; once reached, or after that, to any.
    #[test]
    fn a_reconnect_after_a_failover_goes_to_the_named_master_only() {
        use std::sync::Mutex;
        use tokio::time::Instant;
        let expected = Mutex::new(None);
        assert!(expect_master(&expected, "10.0.0.1:6379").is_ok());
        *expected.lock().unwrap() = Some(("10.0.0.2:6379".to_owned(), Instant::now()));
        let refused = expect_master(&expected, "10.0.0.1:6379").unwrap_err();
        assert!(
            refused
                .to_string()
                .contains("not the new master 10.0.0.2:6379"),
            "{refused}"
        );
        // (Still expected after a refusal.)
        assert!(expect_master(&expected, "10.0.0.1:6379").is_err());
        assert!(expect_master(&expected, "10.0.0.2:6379").is_ok());
        assert!(expected.lock().unwrap().is_none());
        assert!(expect_master(&expected, "10.0.0.1:6379").is_ok());
        // A sentinel that named a master the others never name: after
        // `EXPECT_FOR`, any is taken.
        let long_ago = Instant::now()
            .checked_sub(EXPECT_FOR + Duration::from_millis(1))
            .unwrap();
        *expected.lock().unwrap() = Some(("10.0.0.3:6379".to_owned(), long_ago));
        assert!(expect_master(&expected, "10.0.0.1:6379").is_ok());
        assert!(expected.lock().unwrap().is_none());
    }

    #[test]
    fn the_windows_fingerprint_is_fixed_exact_in_lua_and_tells_window_sets_apart() {
        let w = |secs: &[u64]| -> Vec<Window> {
            secs.iter()
                .map(|s| Window::new(Duration::from_secs(*s), 10).unwrap())
                .collect()
        };
        let sets = [w(&[1]), w(&[1, 60]), w(&[60, 1]), w(&[1, 61]), w(&[2, 60])];
        let prints: Vec<i64> = sets.iter().map(|s| windows_fingerprint(s)).collect();
        for (i, a) in prints.iter().enumerate() {
            assert!(*a > 0 && *a < 1 << 53 && a % 2 == 1, "{a}");
            assert!(prints[i + 1..].iter().all(|b| b != a), "{prints:?}");
        }
        // The limits do not count (hints are about where windows start).
        let other_limits = [Window::new(Duration::from_secs(1), 99).unwrap()];
        assert_eq!(windows_fingerprint(&other_limits), prints[0]);
        // Every replica and version must compute the same one: a change
        // here makes old and new replicas reset each other's hints.
        assert_eq!(prints[1], windows_fingerprint(&sets[1]));
        assert_eq!(prints[1], 8_262_142_914_930_329);
    }

    #[test]
    fn a_packed_reply_decodes_per_window() {
        let windows = [1, 60].map(|s| Window::new(Duration::from_secs(s), 10).unwrap());
        let check = Check::new("api:alice", windows.to_vec());
        let decision = decode(&check, &packed(&[1, 0, 250_000, 0, 9, 4])).unwrap();
        assert!(decision.allowed());
        assert_eq!(decision.reset_after(), Duration::from_micros(250_000));
        let remaining: Vec<u32> = decision.windows().iter().map(|w| w.remaining).collect();
        assert_eq!(remaining, [9, 4]);
        // Blocked: the wait, nothing remaining anywhere.
        let blocked = decode(&check, &packed(&[0, 5_000_000, 5_000_000, 1, 0, 0])).unwrap();
        assert!(!blocked.allowed());
        assert_eq!(blocked.retry_after(), Some(Duration::from_secs(5)));
        // The packed sliding log's allowed form, reset and the remaining
        // alone, decodes as the full one does.
        let short = decode(&check, &packed(&[250_000, 9, 4])).unwrap();
        assert_eq!(format!("{short:?}"), format!("{decision:?}"));
        // Only that script answers so: a general script's check (here, with
        // a block time on a counter algorithm) takes the full form alone.
        let general = check
            .clone()
            .with_algorithm(Algorithm::FixedWindow)
            .with_block(Duration::from_secs(1));
        assert!(decode(&general, &packed(&[250_000, 9, 4])).is_err());
    }

    #[test]
    fn the_packed_logs_written_trailer_decodes_as_its_report() {
        // 1 s / 10 and 60 s / 100; 40 entries, the second's from index 36
        // (5 entries, its oldest at 9.4 s), the minute's from index 1
        // (40, its oldest at 0.5 s); the clock at 10 s.
        let windows =
            [(1, 10), (60, 100)].map(|(s, n)| Window::new(Duration::from_secs(s), n).unwrap());
        let check = Check::new("api:alice", windows.to_vec());
        let trailer = |second: i64, minute: i64| {
            let (size, now) = (40, 10_000_000);
            packed(&[now, second, 9_400_000, minute, 500_000, size, now, 0, 1, 7])
        };
        let decision = decode(&check, &trailer(36, 1)).unwrap();
        assert!(decision.allowed());
        assert_eq!(decision.retry_after(), None);
        let remaining: Vec<u32> = decision.windows().iter().map(|w| w.remaining).collect();
        assert_eq!(remaining, [5, 60]);
        // The second's, the fewest remaining, resets when its oldest entry
        // leaves it: at 10.4 s.
        assert_eq!(decision.reset_after(), Duration::from_millis(400));
        // The same as the script's own reply for that state says.
        let reply = decode(&check, &packed(&[400_000, 5, 60])).unwrap();
        assert_eq!(format!("{decision:?}"), format!("{reply:?}"));
        // A tie goes to the shorter window: 5 left in each (the minute's
        // would reset in 50.5 s).
        let tie = decode(&check, &trailer(36, -54)).unwrap();
        assert_eq!(tie.reset_after(), Duration::from_millis(400));
        let minute = decode(&check, &trailer(38, -54)).unwrap();
        assert_eq!(minute.reset_after(), Duration::from_millis(50_500));
        // An allowed check past a window's limit, or not counted in one,
        // does not follow: an error, not a report.
        for first in [-20, 41, 42] {
            let error = decode(&check, &trailer(first, 1)).unwrap_err();
            assert_eq!(error.kind(), StoreErrorKind::Backend, "{first}");
        }
    }

    /// A throwaway `redis-server` on a free loopback port, killed when
    /// dropped (the integration tests' support has more; this module needs
    /// one server).
    struct Throwaway(std::process::Child, u16);

    impl Throwaway {
        fn start() -> Self {
            let port = std::net::TcpListener::bind("127.0.0.1:0")
                .and_then(|l| l.local_addr())
                .map(|a| a.port())
                .unwrap();
            let child = std::process::Command::new("redis-server")
                .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
                .args(["--save", "", "--appendonly", "no"])
                .stdout(std::process::Stdio::null())
                .spawn()
                .expect("redis-server");
            let server = Self(child, port);
            for _ in 0..500 {
                if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
                    return server;
                }
                std::thread::sleep(Duration::from_millis(10));
            }
            panic!("redis-server did not start on port {port}");
        }
    }

    impl Drop for Throwaway {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }

    /// A check the script refuses as late while the store still waits for
    /// it (the reading of the server's clock is off: here by a second; on
    /// a Cluster, a check redirected to another master) goes once more
    /// without a deadline: decided, and recorded once; and the clock is
    /// read again.
    #[tokio::test]
    async fn a_check_refused_as_late_while_awaited_goes_once_more_without_a_deadline() {
        let server = Throwaway::start();
        let store = RedisStore::builder()
            .url(format!("redis://127.0.0.1:{}", server.1))
            .timeout(Duration::from_secs(1))
            .build()
            .await
            .unwrap();
        let clock = &store.inner.clock;
        assert!(clock.deadline(Instant::now(), Duration::ZERO).is_some());
        // (The reading, two seconds behind the server.)
        let read = clock.reading.load_full().unwrap();
        let behind = Arc::new(Reading {
            offset: read.offset - 2_000_000,
            ..*read
        });
        clock.reading.store(Some(Arc::clone(&behind)));
        let windows = [Window::new(Duration::from_secs(60), 10).unwrap()];
        let remaining = |d: &Decision| d.windows().first().map(|w| w.remaining);
        for (nth, left) in [(1, 9), (2, 8)] {
            let check = Check::new("api:alice", windows.to_vec());
            let decision = store.check(check).await.unwrap();
            assert!(decision.allowed(), "check {nth}");
            assert_eq!(remaining(&decision), Some(left), "check {nth}");
            // (Refused, then decided: the reading is doubted until the
            // store reads the clock again.)
            assert_eq!(clock.deadline(Instant::now(), Duration::ZERO), None);
            clock.reading.store(Some(Arc::clone(&behind)));
        }
    }

    /// A check that finds the server's clock unknown (here doubted, as
    /// after a refusal as late) has it read at once, not at the upkeep's
    /// next tick, a second on: four times in a row, each reading within
    /// 400 ms of its check, where the ticks would meet one of the four at
    /// most (the next doubt comes 300 ms after a reading).
    #[tokio::test]
    async fn a_check_that_finds_the_clock_unknown_has_it_read_at_once() {
        let server = Throwaway::start();
        // (A timeout a loaded machine does not miss.)
        let store = RedisStore::builder()
            .url(format!("redis://127.0.0.1:{}", server.1))
            .keepalive(None)
            .timeout(Duration::from_secs(2))
            .build()
            .await
            .unwrap();
        assert!(store.deadlines_known());
        let clock = &store.inner.clock;
        let windows = [Window::new(Duration::from_secs(60), 1_000).unwrap()];
        for nth in 0..4 {
            // (Past the last one's turn: see `CLOCK_WANTED_EVERY`.)
            tokio::time::sleep(CLOCK_WANTED_EVERY + Duration::from_millis(50)).await;
            clock.doubt();
            assert!(!store.deadlines_known());
            let asked = Instant::now();
            let check = Check::new("api:alice", windows.to_vec());
            assert!(store.check(check).await.unwrap().allowed());
            while !store.deadlines_known() {
                assert!(
                    asked.elapsed() < Duration::from_millis(400),
                    "reading {nth}: not read at once"
                );
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        }
    }

    /// A reading asked for before a doubt, which ends after a newer one
    /// was read, is not kept, and leaves the newer one in use (before, it
    /// erased it: the checks went without a deadline until the next).
    #[tokio::test]
    async fn a_reading_from_before_a_doubt_leaves_a_newer_one_alone() {
        let clock = ServerClock::new();
        let before = clock.generation.load(Ordering::Acquire);
        clock.doubt();
        clock.read_by(async { Ok((2_000, 0)) }).await.unwrap();
        clock
            .read_since(before, async { Ok((1_000, 0)) })
            .await
            .unwrap();
        let deadline = clock.deadline(Instant::now(), Duration::ZERO).unwrap();
        assert!(deadline >= 2_000_000_000, "{deadline}");
    }

    /// A reading of the server's clock slower than [`TRUSTED_READING`]
    /// is kept while none other is known (its checks carry a deadline,
    /// widened by half its round trip, instead of none), and read again at
    /// the next chance; it never replaces a trusted one.
    #[tokio::test]
    async fn a_slow_reading_of_the_clock_is_kept_only_while_none_other_is() {
        // (Slow on the real clock, which the readings' round trips are
        // taken on; the bounds below come from instants taken around each
        // reading, so a slow machine only widens them.)
        let slow = |secs: i64| async move {
            tokio::time::sleep(Duration::from_millis(150)).await;
            Ok((secs, 0))
        };
        let clock = ServerClock::new();
        let us = |d: Duration| i64::try_from(d.as_micros()).unwrap();
        assert_eq!(
            clock.deadline(Instant::now(), Duration::from_millis(50)),
            None
        );
        let before = Instant::now();
        clock.read_by(slow(1_000)).await.unwrap();
        let after = Instant::now();
        // 1,000 s, and since the reading (at least half its round trip),
        // 50 ms on, 5 ms of margin, its error (at least 75 ms: half the
        // round trip), and up to 2 ms of rounding.
        let rough = clock.deadline(after, Duration::from_millis(50)).unwrap();
        let most = 1_000_057_000 + us(after - before) * 3 / 2 + 1_000;
        assert!((1_000_205_000..=most).contains(&rough), "{rough} {most}");
        assert!(clock.stale());
        // A trusted reading replaces it, and is not due again at once.
        let before = Instant::now();
        clock.read_by(async { Ok((2_000, 0)) }).await.unwrap();
        let after = Instant::now();
        let trusted = clock.deadline(after, Duration::from_millis(50)).unwrap();
        let most = 2_000_057_000 + us(after - before) * 3 / 2 + 1_000;
        assert!(
            (2_000_055_000..=most).contains(&trusted),
            "{trusted} {most}"
        );
        assert!(!clock.stale());
        // A slow one then leaves it as it was (read as 2,000 s, 150 ms or
        // more before: not 3,000 s).
        clock.read_by(slow(3_000)).await.unwrap();
        let later = Instant::now();
        let kept = clock.deadline(later, Duration::from_millis(50)).unwrap();
        let most = 2_000_057_000 + us(later - before) * 3 / 2 + 1_000;
        assert!((2_000_205_000..=most).contains(&kept), "{kept} {most}");
        assert!(!clock.stale());
    }

    /// Which reading replaces which: a trusted one any; a rough one none
    /// but a rough one whose error, with the drift since, is as large.
    #[test]
    fn a_rough_reading_replaces_only_a_rougher_one() {
        let reading = |error: u64, rough: bool| Reading {
            offset: 0,
            error,
            at_ms: 1_000,
            rough,
        };
        let (trusted, rough) = (reading(1_000, false), reading(80_000, true));
        assert!(reading(40_000, false).replaces(&trusted, 1_000));
        assert!(reading(40_000, false).replaces(&rough, 1_000));
        assert!(!reading(60_000, true).replaces(&trusted, 1_000));
        assert!(reading(60_000, true).replaces(&rough, 1_000));
        assert!(!reading(90_000, true).replaces(&rough, 1_000));
        // (10 s on, the kept one's error has grown by 10 ms of drift.)
        assert!(reading(90_000, true).replaces(&rough, 11_000));
    }

    #[test]
    fn a_reply_of_the_wrong_size_is_an_error_not_a_panic() {
        let windows = [Window::new(Duration::from_secs(1), 10).unwrap()];
        let check = Check::new("api:alice", windows.to_vec());
        for reply in [
            Vec::new(),
            packed(&[1, 0, 0, 0]),
            packed(&[1, 0, 0, 0, 9, 9]),
            vec![1; 41],
        ] {
            let error = decode(&check, &reply).unwrap_err();
            assert_eq!(
                error.kind(),
                StoreErrorKind::Backend,
                "{} bytes",
                reply.len()
            );
        }
    }

    /// A fixed-window check of 1 s / 10 and 1 min / 100 at 2.25 s past a
    /// minute, with `count` of the second and 50 of the minute spent.
    fn fixed_window_reply(allowed: bool, count: i64) -> (Check, Vec<u8>) {
        let windows =
            [(1, 10), (60, 100)].map(|(s, n)| Window::new(Duration::from_secs(s), n).unwrap());
        let mut check = Check::new("api:alice", windows.to_vec());
        check.algorithm = Algorithm::FixedWindow;
        let now = 62_250_000;
        let reply = packed(&[
            i64::from(allowed),
            now,
            1_000_000,
            count,
            62,
            60_000_000,
            50,
            1,
        ]);
        (check, reply)
    }

    #[test]
    fn a_counter_script_reply_is_reported_from_its_state() {
        // Allowed: the state holds the request; 10 - 4 and 100 - 50 remain,
        // and the second resets in 750 ms.
        let (check, reply) = fixed_window_reply(true, 4);
        let decision = decode_counters(&check, &reply).unwrap();
        assert!(decision.allowed());
        let remaining: Vec<u32> = decision.windows().iter().map(|w| w.remaining).collect();
        assert_eq!(remaining, [6, 50]);
        assert_eq!(decision.reset_after(), Duration::from_millis(750));
        // Denied by the full second: retry when it ends.
        let (check, reply) = fixed_window_reply(false, 10);
        let decision = decode_counters(&check, &reply).unwrap();
        assert!(!decision.allowed());
        assert_eq!(decision.retry_after(), Some(Duration::from_millis(750)));
    }

    #[test]
    fn a_counter_script_reply_that_contradicts_its_state_is_an_error() {
        // "Denied" with room left, "allowed" past the limit, a wrong size.
        for (allowed, count) in [(false, 4), (true, 11)] {
            let (check, reply) = fixed_window_reply(allowed, count);
            let error = decode_counters(&check, &reply).unwrap_err();
            assert_eq!(error.kind(), StoreErrorKind::Backend);
        }
        let (check, reply) = fixed_window_reply(true, 4);
        let error = decode_counters(&check, &reply[..reply.len() - 8]).unwrap_err();
        assert_eq!(error.kind(), StoreErrorKind::Backend);
    }

    /// The masters a `CLUSTER NODES` answer lists, with slots or none
    /// (a master just added), and not those that failed or have no
    /// address; replicas are left out.
    #[test]
    fn cluster_masters_are_read_from_cluster_nodes() {
        let nodes = "\
a1 127.0.0.1:7001@17001 myself,master - 0 0 1 connected 0-5460
b2 127.0.0.1:7002@17002,node-b.example master - 0 1 2 connected 5461-10922
c3 127.0.0.1:7003@17003 slave a1 0 1 1 connected
d4 127.0.0.1:7004@17004 master - 0 1 0 connected
e5 127.0.0.1:7005@17005 master,fail - 0 1 3 disconnected 10923-16383
f6 :0@0 master,noaddr - 0 1 4 disconnected
g7 ::1:7007@17007 master - 0 1 5 connected
h8 127.0.0.1:7008@17008 master,fail? - 0 1 6 connected
i9 :7009@17009 master - 0 1 7 connected
bad
";
        let masters: Vec<_> = cluster_masters(nodes, &[]).collect();
        assert_eq!(
            masters,
            [
                ("127.0.0.1", 7001),
                ("127.0.0.1", 7002),
                ("node-b.example", 7002),
                ("127.0.0.1", 7004),
                ("::1", 7007)
            ]
        );
        // (A held master is left out under both its names.)
        let held = [
            ("node-b.example".to_owned(), 7002),
            ("::1".to_owned(), 7007),
        ];
        let masters: Vec<_> = cluster_masters(nodes, &held).collect();
        assert_eq!(masters, [("127.0.0.1", 7001), ("127.0.0.1", 7004)]);
    }
}
