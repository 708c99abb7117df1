//! The O(1) algorithms: fixed window, sliding window counter and token
//! bucket (GCRA), as pure functions over a budget's small state. The Redis
//! scripts `fixed_window.lua`, `sliding_window.lua` and `token_bucket.lua`
//! implement the same functions with the same arithmetic (integers below
//! 2^53, and IEEE doubles in the same order for the sliding window), so both
//! stores make identical decisions.
//!
//! State is kept per window *length* (a budget shared by a zone may be
//! checked against different windows by different routes): one
//! [`Slot`] per window length, `[length, a, b, c]`.

use std::time::Duration;

use arrayvec::ArrayVec;

use super::{constraining, Adjustment, Decision, WindowState};
use crate::rules::{Algorithm, Window, MAX_WINDOWS};

/// `[window length (µs), a, b, c]`; the meaning of a, b, c depends on the
/// algorithm.
pub(crate) type Slot = [u64; 4];

/// A budget's slots: the memory store's list, which grows as windows are
/// added, or the fixed array a Redis reply is read into (no allocation).
pub(crate) trait Slots: std::ops::DerefMut<Target = [Slot]> {
    /// Adds a slot; returns its index (for a full array, that of the last
    /// one: wrong numbers for a reply that names other windows, never a
    /// panic).
    fn add(&mut self, slot: Slot) -> usize;
}

impl Slots for Vec<Slot> {
    fn add(&mut self, slot: Slot) -> usize {
        self.push(slot);
        self.len() - 1
    }
}

impl Slots for ArrayVec<Slot, MAX_WINDOWS> {
    fn add(&mut self, slot: Slot) -> usize {
        let _ = self.try_push(slot);
        self.len().saturating_sub(1)
    }
}

/// Finds (or adds, zeroed) the slot of each window; returns their indexes.
fn slots(state: &mut impl Slots, windows: &[Window]) -> [usize; MAX_WINDOWS] {
    let mut at = [0usize; MAX_WINDOWS];
    for (i, w) in windows.iter().enumerate() {
        at[i] = slot(state, w);
    }
    at
}

/// Finds (or adds, zeroed) the slot of `w`; returns its index.
fn slot(state: &mut impl Slots, w: &Window) -> usize {
    match state.iter().position(|s| s[0] == w.micros()) {
        Some(p) => p,
        None => state.add([w.micros(), 0, 0, 0]),
    }
}

fn clamp_u32(v: u64) -> u32 {
    u32::try_from(v).unwrap_or(u32::MAX)
}

fn decision(
    allowed: bool,
    retry: u64,
    windows: &[Window],
    remaining: &[u32],
    reset: impl Fn(usize) -> u64,
) -> Decision {
    let reset =
        constraining(remaining.iter().zip(windows).map(|(r, w)| (*r, w.micros()))).map_or(0, reset);
    Decision::new(
        allowed,
        Some(Duration::from_micros(retry)),
        Duration::from_micros(reset),
        windows
            .iter()
            .zip(remaining)
            .map(|(w, &r)| WindowState::new(*w, r)),
    )
}

/// Fixed windows aligned on the Unix epoch: window `k` of length `d` is
/// `[k*d, (k+1)*d)`. Slot: `[d, k, count, _]`. Returns the decision and when
/// the state becomes garbage.
pub(crate) fn fixed_window(
    state: &mut impl Slots,
    windows: &[Window],
    cost: u32,
    now: u64,
    record: bool,
) -> (Decision, u64) {
    let at = slots(state, windows);
    let cost = u64::from(cost);
    let mut counts = [0u64; MAX_WINDOWS];
    let mut ks = [0u64; MAX_WINDOWS];
    let mut allowed = true;
    let mut retry = 0u64;
    for (i, w) in windows.iter().enumerate() {
        let d = w.micros();
        let slot = state[at[i]];
        // A slot of the next window after `now`'s (a request counted first
        // that read the clock later, or a clock stepped back) is the
        // current one: its count holds until it ends.
        let k = later(now / d, slot[1]);
        ks[i] = k;
        counts[i] = if slot[1] == k { slot[2] } else { 0 };
        if counts[i] + cost > u64::from(w.limit()) {
            allowed = false;
            // The next window starts empty; a cost above the limit never fits.
            let wait = if cost > u64::from(w.limit()) {
                d
            } else {
                (k + 1).saturating_mul(d) - now
            };
            retry = retry.max(wait);
        }
    }
    let mut expires = now;
    for (i, w) in windows.iter().enumerate() {
        let d = w.micros();
        let k = ks[i];
        if allowed && record {
            counts[i] += cost;
            state[at[i]] = [d, k, counts[i], 0];
        }
        expires = expires.max((k + 1).saturating_mul(d));
    }
    let mut remaining = [0u32; MAX_WINDOWS];
    for (i, w) in windows.iter().enumerate() {
        remaining[i] = clamp_u32(u64::from(w.limit()).saturating_sub(counts[i]));
    }
    let n = windows.len();
    let d = decision(allowed, retry, windows, &remaining[..n], |i| {
        (ks[i] + 1).saturating_mul(windows[i].micros()) - now
    });
    (d, expires)
}

/// The current window number: `now`'s, or the next one when a slot holds
/// it (a request counted first that read the clock later, or a clock
/// stepped back across an edge). A state further ahead is from a clock
/// that ran ahead and came back: it is not kept (as before this rule), so a
/// big step back cannot hold a budget for as long as the step.
fn later(k: u64, stored: u64) -> u64 {
    if stored == k + 1 {
        stored
    } else {
        k
    }
}

/// The sliding window counter: the current fixed window's count plus the
/// previous window's count weighted by how much of it the sliding window
/// still covers. Slot: `[d, k, current count, previous count]`.
pub(crate) fn sliding_window(
    state: &mut impl Slots,
    windows: &[Window],
    cost: u32,
    now: u64,
    record: bool,
) -> (Decision, u64) {
    let at = slots(state, windows);
    let mut cur = [0u64; MAX_WINDOWS];
    let mut prev = [0u64; MAX_WINDOWS];
    let mut ks = [0u64; MAX_WINDOWS];
    // Per window: the time elapsed in its current window, and how long
    // until that window starts (0 but for a later window, below).
    let mut elapsed = [0u64; MAX_WINDOWS];
    let mut ahead = [0u64; MAX_WINDOWS];
    let mut allowed = true;
    let mut retry = 0u64;
    for (i, w) in windows.iter().enumerate() {
        let d = w.micros();
        let slot = state[at[i]];
        // A slot of the next window after `now`'s (a request counted first
        // that read the clock later, or a clock stepped back) is the
        // current one, taken from its start.
        let k = later(now / d, slot[1]);
        ks[i] = k;
        elapsed[i] = now.saturating_sub(k * d);
        ahead[i] = (k * d).saturating_sub(now);
        (cur[i], prev[i]) = if slot[1] == k {
            (slot[2], slot[3])
        } else if slot[1] + 1 == k {
            (0, slot[2])
        } else {
            (0, 0)
        };
        if used(prev[i], cur[i], d, elapsed[i]) + f64::from(cost) > f64::from(w.limit()) {
            allowed = false;
            retry = retry.max(
                ahead[i] + sliding_wait(prev[i], cur[i], d, elapsed[i], w.limit(), u64::from(cost)),
            );
        }
    }
    let mut expires = now;
    for (i, w) in windows.iter().enumerate() {
        let d = w.micros();
        let k = ks[i];
        if allowed && record {
            cur[i] += u64::from(cost);
            state[at[i]] = [d, k, cur[i], prev[i]];
        }
        // The current count still weighs in during the next window.
        expires = expires.max((k + 2).saturating_mul(d));
    }
    let mut remaining = [0u32; MAX_WINDOWS];
    for (i, w) in windows.iter().enumerate() {
        let used = used(prev[i], cur[i], w.micros(), elapsed[i]);
        // (A cast truncates: the floor of a number at least 0, with no
        // call to libm.)
        remaining[i] = clamp_u32((f64::from(w.limit()) - used).max(0.0) as u64);
    }
    let n = windows.len();
    let d = decision(allowed, retry, windows, &remaining[..n], |i| {
        let w = windows[i];
        ahead[i]
            + sliding_wait(
                prev[i],
                cur[i],
                w.micros(),
                elapsed[i],
                w.limit(),
                u64::from(remaining[i]) + 1,
            )
    });
    (d, expires)
}

/// The weighted count: `prev * (d - elapsed) / d + cur`, as IEEE doubles in
/// exactly this order (the Lua script computes the same expression).
///
/// (Converted through i64, one instruction each where u64 takes several:
/// the same doubles for every number below 2^63, which counts and
/// microsecond times are.)
fn used(prev: u64, cur: u64, d: u64, elapsed: u64) -> f64 {
    let f = |v: u64| v as i64 as f64;
    f(prev) * f(d - elapsed) / f(d) + f(cur)
}

/// The time until `k` more requests fit (the smallest whole microsecond at
/// which they do), or `d` when `k` exceeds the limit.
fn sliding_wait(prev: u64, cur: u64, d: u64, elapsed: u64, limit: u32, k: u64) -> u64 {
    let limit = u64::from(limit);
    if k > limit {
        return d;
    }
    // Candidate: within this window when the current count leaves room,
    // else in the next one (where `cur` becomes the previous count).
    let (p, c, base, offset) = if cur + k <= limit {
        (prev, cur, elapsed, 0)
    } else {
        (cur, 0, 0, d - elapsed)
    };
    let fits = |e: u64| used(p, c, d, e) + k as f64 <= limit as f64;
    if fits(base) {
        return offset;
    }
    // Solve p * (d - e) / d <= limit - c - k for e, then settle rounding on
    // the exact predicate: the first e that fits, which is one (`fits`
    // only grows with e, and holds at d). The estimate is almost always
    // right or one off; where doubles round coarsely (huge limits, long
    // windows) a binary search finds it in at most 64 steps. (A cast,
    // which truncates and reads NaN as 0, does for ceil.)
    let room = (limit - c - k) as f64;
    let e = ((d as f64 - room * d as f64 / p as f64) as u64)
        .max(base + 1)
        .min(d);
    let e = if fits(e) {
        if fits(e - 1) {
            first_fit(base + 1, e - 1, fits)
        } else {
            e
        }
    } else if e < d && fits(e + 1) {
        e + 1
    } else {
        first_fit(e + 1, d, fits)
    };
    offset + e - base
}

/// The first e in `lo ..= hi` where `fits` holds, given it holds at `hi`
/// and only grows with e.
fn first_fit(mut lo: u64, mut hi: u64, fits: impl Fn(u64) -> bool) -> u64 {
    while lo < hi {
        let mid = lo + (hi - lo) / 2;
        if fits(mid) {
            hi = mid;
        } else {
            lo = mid + 1;
        }
    }
    hi
}

/// GCRA: a window of `n` per `w` is a bucket of `n` refilled one every
/// `t = ceil(w / n)` microseconds (never faster than the configured rate).
/// Slot: `[w, theoretical arrival time, _, _]`.
pub(crate) fn token_bucket(
    state: &mut impl Slots,
    windows: &[Window],
    cost: u32,
    now: u64,
    record: bool,
) -> (Decision, u64) {
    match windows {
        [w] => token_bucket_one(state, w, cost, now, record),
        _ => token_bucket_many(state, windows, cost, now, record),
    }
}

/// [`token_bucket`] for any number of windows. (Out of line: the
/// one-window path stays compact in the instruction cache, and this one
/// in its own lines.)
#[inline(never)]
fn token_bucket_many(
    state: &mut impl Slots,
    windows: &[Window],
    cost: u32,
    now: u64,
    record: bool,
) -> (Decision, u64) {
    let at = slots(state, windows);
    let cost = u64::from(cost);
    let mut tat = [0u64; MAX_WINDOWS];
    // Each window's bucket, worked out once (a division).
    let mut buckets = [(0u64, 1u64); MAX_WINDOWS];
    let mut allowed = true;
    let mut retry = 0u64;
    for (i, w) in windows.iter().enumerate() {
        let (n, t) = bucket(w);
        buckets[i] = (n, t);
        tat[i] = state[at[i]][1].max(now);
        let next = tat[i].saturating_add(cost.saturating_mul(t));
        if let Some(wait) = bucket_wait((n, t), cost, next, now) {
            allowed = false;
            retry = retry.max(wait);
        }
    }
    let mut expires = now;
    let mut remaining = [0u32; MAX_WINDOWS];
    for (i, w) in windows.iter().enumerate() {
        let (n, t) = buckets[i];
        if allowed && record {
            tat[i] = tat[i].saturating_add(cost.saturating_mul(t));
            state[at[i]] = [w.micros(), tat[i], 0, 0];
        }
        expires = expires.max(tat[i]);
        remaining[i] = bucket_remaining((n, t), tat[i], now);
    }
    let n = windows.len();
    let d = decision(allowed, retry, windows, &remaining[..n], |i| {
        bucket_reset(buckets[i], tat[i], now, remaining[i])
    });
    (d, expires)
}

/// [`token_bucket`] for one window (a single quota, the common rule): the
/// same arithmetic without the per-window arrays, a short path of its own
/// (as the one-window sliding log has).
fn token_bucket_one(
    state: &mut impl Slots,
    w: &Window,
    cost: u32,
    now: u64,
    record: bool,
) -> (Decision, u64) {
    let at = slot(state, w);
    let cost = u64::from(cost);
    let (n, t) = bucket(w);
    let mut tat = state.get(at).map_or(0, |s| s[1]).max(now);
    let next = tat.saturating_add(cost.saturating_mul(t));
    let wait = bucket_wait((n, t), cost, next, now);
    let allowed = wait.is_none();
    let retry = wait.unwrap_or(0);
    if allowed && record {
        tat = next;
        if let Some(slot) = state.get_mut(at) {
            *slot = [w.micros(), tat, 0, 0];
        }
    }
    let remaining = bucket_remaining((n, t), tat, now);
    let reset = bucket_reset((n, t), tat, now, remaining);
    let decision = Decision::new(
        allowed,
        Some(Duration::from_micros(retry)),
        Duration::from_micros(reset),
        [WindowState::new(*w, remaining)],
    );
    (decision, tat)
}

/// Applies `adjustment` at `now` to a counter algorithm's state (see
/// [`Adjustment`]): a penalty adds at most a window's limit to its count,
/// and never takes it beyond twice the limit (a bucket: that many tokens'
/// worth of arrival time, never beyond twice its size ahead of now); a
/// refund takes from the current window's count (a bucket: tokens back,
/// up to full). Returns when the state becomes garbage.
pub(crate) fn adjust(
    algorithm: Algorithm,
    state: &mut impl Slots,
    windows: &[Window],
    adjustment: Adjustment,
    now: u64,
) -> u64 {
    let mut expires = now;
    for w in windows {
        let at = slot(state, w);
        let (d, s) = (w.micros(), state[at]);
        let n = match adjustment {
            Adjustment::Penalty(n) => i128::from(n.min(w.limit())),
            Adjustment::Refund(n) => -i128::from(n),
        };
        // A value moved by n: at least 0, and a penalty's at most `most`
        // (but never below where it was).
        let moved = |value: u64, most: u64| {
            let (value, most) = (i128::from(value), i128::from(most));
            let moved = if n > 0 {
                (value + n).min(most.max(value))
            } else {
                (value + n).max(0)
            };
            u64::try_from(moved).unwrap_or(u64::MAX)
        };
        let twice = 2 * u64::from(w.limit());
        state[at] = match algorithm {
            Algorithm::FixedWindow => {
                let k = later(now / d, s[1]);
                let count = if s[1] == k { s[2] } else { 0 };
                expires = expires.max((k + 1).saturating_mul(d));
                [d, k, moved(count, twice), 0]
            }
            Algorithm::SlidingWindow => {
                let k = later(now / d, s[1]);
                let (cur, prev) = if s[1] == k {
                    (s[2], s[3])
                } else if s[1] + 1 == k {
                    (0, s[2])
                } else {
                    (0, 0)
                };
                expires = expires.max((k + 2).saturating_mul(d));
                [d, k, moved(cur, twice), prev]
            }
            _ => {
                // (n tokens are n refill intervals of arrival time, from
                // now at the earliest: a bucket never holds more than full.)
                let (size, t) = bucket(w);
                let base = s[1].max(now);
                let by = u64::try_from(n.unsigned_abs())
                    .unwrap_or(u64::MAX)
                    .saturating_mul(t);
                let tat = if n > 0 {
                    let most = now.saturating_add(2 * size * t);
                    base.saturating_add(by).min(most.max(base))
                } else {
                    base.saturating_sub(by).max(now)
                };
                expires = expires.max(tat);
                [d, tat, 0, 0]
            }
        };
    }
    expires
}

/// The wait of a request whose arrival time would be `next` in bucket
/// `(n, t)`, or `None` if it fits: until it fits, or the whole bucket for a
/// cost above its size.
fn bucket_wait((n, t): (u64, u64), cost: u64, next: u64, now: u64) -> Option<u64> {
    match (next - now > n * t, cost > n) {
        (false, _) => None,
        (true, true) => Some(n * t),
        (true, false) => Some(next - now - n * t),
    }
}

/// The requests bucket `(n, t)` still allows at `now`, with arrival time
/// `tat`.
fn bucket_remaining((n, t): (u64, u64), tat: u64, now: u64) -> u32 {
    clamp_u32((n * t).saturating_sub(tat - now) / t)
}

/// When bucket `(n, t)`, with `remaining` of it left, has room for one
/// more: 0 when full.
fn bucket_reset((n, t): (u64, u64), tat: u64, now: u64, remaining: u32) -> u64 {
    let r = u64::from(remaining);
    if r >= n {
        0
    } else {
        (tat - now).saturating_sub((n - r - 1) * t)
    }
}

/// `(n, t)`: the bucket size and the refill interval of a window.
pub(crate) fn bucket(w: &Window) -> (u64, u64) {
    let n = u64::from(w.limit());
    (n, w.micros().div_ceil(n).max(1))
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: u64 = 1_000_000;

    fn w(ms: u64, limit: u32) -> Window {
        Window::new(Duration::from_millis(ms), limit).unwrap()
    }

    #[test]
    fn fixed_window_resets_at_the_boundary() {
        let mut s = Vec::new();
        let windows = [w(1000, 2)];
        assert!(fixed_window(&mut s, &windows, 1, 10 * S + 100, true)
            .0
            .allowed());
        assert!(fixed_window(&mut s, &windows, 1, 10 * S + 200, true)
            .0
            .allowed());
        let (d, _) = fixed_window(&mut s, &windows, 1, 10 * S + 300, true);
        assert!(!d.allowed());
        assert_eq!(d.retry_after(), Some(Duration::from_micros(S - 300)));
        assert!(!fixed_window(&mut s, &windows, 1, 11 * S - 1, true)
            .0
            .allowed());
        assert!(fixed_window(&mut s, &windows, 1, 11 * S, true).0.allowed());
    }

    #[test]
    fn a_later_window_in_the_state_is_the_current_one() {
        // A request that read the clock just before a window's edge is
        // counted after one that read it just after (or the clock stepped
        // back): the later window's count still holds, and the wait runs
        // from the real time.
        type Algo = fn(&mut Vec<Slot>, &[Window], u32, u64, bool) -> (Decision, u64);
        // (The sliding window's one request weighs in all through the next
        // window too.)
        for (algorithm, wait) in [
            (fixed_window as Algo, S + 1),
            (sliding_window as Algo, 2 * S + 1),
        ] {
            let mut s = Vec::new();
            let windows = [w(1000, 1)];
            assert!(algorithm(&mut s, &windows, 1, 11 * S, true).0.allowed());
            let (early, _) = algorithm(&mut s, &windows, 1, 11 * S - 1, true);
            assert!(!early.allowed());
            assert_eq!(early.retry_after(), Some(Duration::from_micros(wait)));
            assert!(!algorithm(&mut s, &windows, 1, 11 * S + 1, true).0.allowed());
            assert!(algorithm(&mut s, &windows, 1, 13 * S, true).0.allowed());
            // A state further ahead (a clock that ran ahead, then came back)
            // is not kept: it would hold the budget as long as the step.
            let mut s = Vec::new();
            assert!(algorithm(&mut s, &windows, 1, 20 * S, true).0.allowed());
            assert!(algorithm(&mut s, &windows, 1, 11 * S, true).0.allowed());
        }
    }

    #[test]
    fn sliding_waits_are_the_first_microsecond_that_fits_even_when_doubles_round_coarsely() {
        // A year-long window with a limit near u32::MAX: the weighted count
        // stays put for millions of microseconds at a time (a step-by-step
        // search took 7.5M steps here).
        let year = 365 * 24 * 3600 * S;
        for (prev, cur, d, elapsed, limit, k) in [
            (1, 0, year, 0, u32::MAX, u64::from(u32::MAX) - 1),
            (1, 0, 30 * 24 * 3600 * S, 5, u32::MAX, u64::from(u32::MAX)),
            (3, 1, year, 17, 100_000_000, 99_999_997),
            (7, 2, 1_000, 100, 10, 3),
        ] {
            let wait = sliding_wait(prev, cur, d, elapsed, limit, k);
            let limit = f64::from(limit);
            // Where it lands: within this window or the next one.
            let (p, c, base) = if cur + k <= limit as u64 {
                (prev, cur, elapsed)
            } else {
                (cur, 0, 0)
            };
            let e = if base == elapsed && cur + k <= limit as u64 {
                elapsed + wait
            } else {
                wait - (d - elapsed)
            };
            let fits = |e: u64| used(p, c, d, e) + k as f64 <= limit;
            assert!(fits(e), "{prev} {cur} {d} {elapsed} {k}: {wait}");
            assert!(
                e == base || !fits(e - 1),
                "{prev} {cur} {d} {elapsed} {k}: {wait}"
            );
        }
    }

    #[test]
    fn sliding_window_weighs_the_previous_window() {
        let mut s = Vec::new();
        let windows = [w(1000, 10)];
        for _ in 0..10 {
            assert!(sliding_window(&mut s, &windows, 1, 10 * S, true)
                .0
                .allowed());
        }
        // Half-way through the next window the previous 10 weigh 5.
        let mut allowed = 0;
        for _ in 0..10 {
            allowed += u32::from(
                sliding_window(&mut s, &windows, 1, 11 * S + S / 2, true)
                    .0
                    .allowed(),
            );
        }
        assert_eq!(allowed, 5);
        let (d, _) = sliding_window(&mut s, &windows, 1, 11 * S + S / 2, true);
        let wait = d.retry_after().unwrap().as_micros() as u64;
        // One more fits once the previous window weighs 4: at 60 %.
        assert_eq!(wait, S / 10);
        assert!(
            !sliding_window(&mut s, &windows, 1, 11 * S + S / 2 + wait - 1, true)
                .0
                .allowed()
        );
        assert!(
            sliding_window(&mut s, &windows, 1, 11 * S + S / 2 + wait, true)
                .0
                .allowed()
        );
    }

    proptest::proptest! {
        /// The one-window token bucket decides, records and expires exactly
        /// as the general one does on that window.
        #[test]
        fn one_window_token_bucket_is_the_general_one(
            ms in 1u64..100_000,
            limit in 1u32..2_000,
            steps in proptest::collection::vec((0u64..200_000, 0u32..5, proptest::bool::weighted(0.9)), 1..200),
        ) {
            let windows = [w(ms, limit)];
            let (mut one, mut many) = (Vec::new(), Vec::new());
            let mut now = 1_767_225_600 * S;
            for (gap, cost, record) in steps {
                now += gap;
                let a = token_bucket_one(&mut one, &windows[0], cost, now, record);
                let b = token_bucket_many(&mut many, &windows, cost, now, record);
                proptest::prop_assert_eq!(&a, &b);
                proptest::prop_assert_eq!(&one, &many);
            }
        }
    }

    #[test]
    fn token_bucket_bursts_then_refills_evenly() {
        let mut s = Vec::new();
        let windows = [w(1000, 4)];
        for left in (0..4).rev() {
            let (d, _) = token_bucket(&mut s, &windows, 1, 10 * S, true);
            assert!(d.allowed());
            assert_eq!(d.windows()[0].remaining, left);
        }
        let (d, _) = token_bucket(&mut s, &windows, 1, 10 * S, true);
        assert!(!d.allowed());
        assert_eq!(d.retry_after(), Some(Duration::from_millis(250)));
        assert!(!token_bucket(&mut s, &windows, 1, 10 * S + S / 4 - 1, true)
            .0
            .allowed());
        assert!(token_bucket(&mut s, &windows, 1, 10 * S + S / 4, true)
            .0
            .allowed());
    }

    #[test]
    fn denied_requests_leave_every_state_untouched() {
        type Algorithm = fn(&mut Vec<Slot>, &[Window], u32, u64, bool) -> (Decision, u64);
        for algorithm in [fixed_window as Algorithm, sliding_window, token_bucket] {
            let mut s = Vec::new();
            let windows = [w(1000, 5), w(60_000, 2)];
            assert!(algorithm(&mut s, &windows, 1, S, true).0.allowed());
            assert!(algorithm(&mut s, &windows, 1, S, true).0.allowed());
            let before = s.clone();
            for _ in 0..5 {
                assert!(!algorithm(&mut s, &windows, 1, S + 10, true).0.allowed());
            }
            assert_eq!(s, before);
        }
    }

    /// A clock at the end of time (a timestamp set by hand) overflows no
    /// window's end: the window counters still decide, and a denial still
    /// waits; nothing panics. (A token bucket's theoretical arrival time
    /// saturates there: it only has to stay sane.)
    #[test]
    fn a_clock_at_the_end_of_time_decides_without_overflow() {
        type Algorithm = fn(&mut Vec<Slot>, &[Window], u32, u64, bool) -> (Decision, u64);
        let windows = [w(1000, 1), w(3_600_000, 2)];
        let now = u64::MAX - 5;
        let _ = token_bucket(&mut Vec::new(), &windows, 1, now, true);
        for algorithm in [fixed_window as Algorithm, sliding_window] {
            let mut s = Vec::new();
            let (first, expires) = algorithm(&mut s, &windows, 1, now, true);
            assert!(first.allowed());
            assert!(expires >= now);
            let (second, _) = algorithm(&mut s, &windows, 1, now + 1, true);
            assert!(!second.allowed());
            assert!(second.retry_after().is_some_and(|r| r > Duration::ZERO));
            for adjustment in [Adjustment::Penalty(3), Adjustment::Refund(1)] {
                let kind = [
                    super::Algorithm::FixedWindow,
                    super::Algorithm::SlidingWindow,
                    super::Algorithm::TokenBucket,
                ];
                for kind in kind {
                    adjust(kind, &mut Vec::new(), &windows, adjustment, now);
                }
            }
        }
    }

    #[test]
    fn penalties_that_pile_up_stay_within_twice_a_window() {
        let windows = [w(60_000, 5)];
        let now = 10 * 60 * S;
        for algorithm in [
            Algorithm::FixedWindow,
            Algorithm::SlidingWindow,
            Algorithm::TokenBucket,
        ] {
            let mut state: Vec<Slot> = Vec::new();
            for _ in 0..50 {
                adjust(
                    algorithm,
                    &mut state,
                    &windows,
                    Adjustment::Penalty(u32::MAX),
                    now,
                );
            }
            let held = match algorithm {
                Algorithm::TokenBucket => (state[0][1] - now) / bucket(&windows[0]).1,
                _ => state[0][2],
            };
            assert_eq!(held, 10, "{algorithm:?}");
            // A refund gives back no more than was spent.
            adjust(
                algorithm,
                &mut state,
                &windows,
                Adjustment::Refund(u32::MAX),
                now,
            );
            let left = match algorithm {
                Algorithm::TokenBucket => state[0][1] - now,
                _ => state[0][2],
            };
            assert_eq!(left, 0, "{algorithm:?}");
        }
    }
}
