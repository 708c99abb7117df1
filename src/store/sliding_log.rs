//! The exact sliding window (sliding log), as a pure function over one
//! budget's log. The Redis script `scripts/sliding_log.lua` implements the
//! same function; this one is its specification.
//!
//! The log holds the distinct microsecond timestamps of allowed requests,
//! sorted. A request of cost `c` at `now` takes the first `c` free
//! microseconds at or after `now`, so two requests in one microsecond are
//! both counted (the second one 1 µs later). An entry at `t` is inside a
//! window of length `d` at `now` while `now < t + d`.

use std::time::Duration;

use super::log::Log;
use super::{constraining, Adjustment, Decision, WindowState};
use crate::rules::{Window, MAX_WINDOWS};

/// Decides on a request of `cost` at `now` against `windows` (shortest
/// first), trims entries older than the longest window, and records the
/// request when allowed and `record` is set.
pub(crate) fn check(
    log: &mut Log,
    windows: &[Window],
    cost: u32,
    now: u64,
    record: bool,
) -> Decision {
    if let [window] = windows {
        return check_one(log, *window, cost, now, record);
    }
    check_many(log, windows, cost, now, record)
}

/// [`check`] for any number of windows. (Out of line: the one-window
/// path stays compact in the instruction cache, and this one in its own
/// lines.)
#[inline(never)]
fn check_many(log: &mut Log, windows: &[Window], cost: u32, now: u64, record: bool) -> Decision {
    if windows.is_empty() {
        // No window limits nothing, and keeps nothing: the log stays as it
        // is (trimmed to a longest window of 0, it would lose every entry).
        return Decision::new(true, None, Duration::ZERO, []);
    }
    let longest = windows.last().map_or(0, Window::micros);
    log.trim(|t| t.saturating_add(longest) <= now);
    let total = log.len() as u64;
    let mut counts = [0u64; MAX_WINDOWS];
    let mut allowed = true;
    let mut retry = 0u64;
    for (i, w) in windows.iter().enumerate() {
        // The longest window holds the whole trimmed log: no search (for a
        // one-window rule, none at all).
        let start = if w.micros() == longest {
            0
        } else {
            log.partition_point(|t| t.saturating_add(w.micros()) <= now)
        };
        let count = total - start as u64;
        counts[i] = count;
        let need = (count + u64::from(cost)).saturating_sub(u64::from(w.limit()));
        if need > 0 {
            allowed = false;
            // The `need`-th oldest entry of the window must leave it.
            let wait = match log.get(start + (need - 1) as usize) {
                Some(t) if need <= count => t.saturating_add(w.micros()).saturating_sub(now),
                // Costs more than the window holds: it never passes; report
                // the whole window.
                _ => w.micros(),
            };
            retry = retry.max(wait);
        }
    }
    if allowed && record {
        push(log, now, cost);
        for count in counts.iter_mut().take(windows.len()) {
            *count += u64::from(cost);
        }
    }
    let remaining = |i: usize, w: &Window| {
        u32::try_from(u64::from(w.limit()).saturating_sub(counts[i])).unwrap_or(u32::MAX)
    };
    let reset = constraining(
        windows
            .iter()
            .enumerate()
            .map(|(i, w)| (remaining(i, w), w.micros())),
    )
    .and_then(|i| {
        let w = windows.get(i)?;
        let oldest = log.get(log.len().checked_sub(usize::try_from(counts[i]).ok()?)?)?;
        (counts[i] > 0).then(|| oldest.saturating_add(w.micros()).saturating_sub(now))
    })
    .unwrap_or(0);
    Decision::new(
        allowed,
        Some(Duration::from_micros(retry)),
        Duration::from_micros(reset),
        windows
            .iter()
            .enumerate()
            .map(|(i, w)| WindowState::new(*w, remaining(i, w))),
    )
}

/// [`check`] for a rule of one window (the commonest): the same answer with
/// no per-window counts, search or choice of the constraining window, so
/// the hot path runs less code.
fn check_one(log: &mut Log, w: Window, cost: u32, now: u64, record: bool) -> Decision {
    let d = w.micros();
    log.trim(|t| t.saturating_add(d) <= now);
    // The whole trimmed log is in the window.
    let mut count = log.len() as u64;
    let need = (count + u64::from(cost)).saturating_sub(u64::from(w.limit()));
    let allowed = need == 0;
    let retry = if allowed {
        0
    } else {
        // The `need`-th oldest entry must leave the window (or, for a cost
        // above the limit, the whole window).
        match log.get((need - 1) as usize) {
            Some(t) if need <= count => t.saturating_add(d).saturating_sub(now),
            _ => d,
        }
    };
    if allowed && record {
        push(log, now, cost);
        count += u64::from(cost);
    }
    let remaining = u32::try_from(u64::from(w.limit()).saturating_sub(count)).unwrap_or(u32::MAX);
    // The window frees a slot when its oldest entry leaves it.
    let reset = match log.front() {
        Some(oldest) if count > 0 => oldest.saturating_add(d).saturating_sub(now),
        _ => 0,
    };
    Decision::new(
        allowed,
        Some(Duration::from_micros(retry)),
        Duration::from_micros(reset),
        std::iter::once(WindowState::new(w, remaining)),
    )
}

/// Applies `adjustment` at `now` to a budget of `windows` (shortest
/// first): entries that left the longest window are dropped first, as a
/// check drops them; a penalty of `n` takes the first `n` free microseconds
/// at or after `now` (at most the largest limit of them, and no more than
/// leave the log twice that limit long), a refund of `n` drops the `n`
/// newest entries (or all).
pub(crate) fn adjust(log: &mut Log, windows: &[Window], adjustment: Adjustment, now: u64) {
    let longest = windows.last().map_or(0, Window::micros);
    log.trim(|t| t.saturating_add(longest) <= now);
    match adjustment {
        Adjustment::Penalty(n) => {
            let most = windows.iter().map(Window::limit).max().unwrap_or(0);
            let room = (2 * u64::from(most)).saturating_sub(log.len() as u64);
            let n = u32::try_from(room)
                .unwrap_or(u32::MAX)
                .min(n.min(most))
                .min(crate::rules::MAX_LOG_COST);
            if n > 0 {
                push(log, now, n);
            }
        }
        Adjustment::Refund(n) => {
            for _ in 0..n.min(u32::try_from(log.len()).unwrap_or(u32::MAX)) {
                log.pop_back();
            }
        }
    }
}

/// Takes the first `cost` free microseconds at or after `now`.
#[inline]
fn push(log: &mut Log, now: u64, cost: u32) {
    // The common case: time moved past the newest entry (and the commonest
    // cost, 1, is one push).
    if cost == 1 && log.back().is_none_or(|last| last < now) {
        log.push_back(now);
        return;
    }
    push_among(log, now, cost);
}

/// [`push`] for a cost above 1, or a time at or before the newest entry.
#[inline(never)]
fn push_among(log: &mut Log, now: u64, cost: u32) {
    let mut t = now;
    let mut left = u64::from(cost);
    while left > 0 {
        let Some(last) = log.back().filter(|&last| last >= t) else {
            log.extend((0..left).map(|i| t + i));
            return;
        };
        // Entries are distinct and sorted: when every microsecond from t
        // to the newest entry is taken (a budget busier than one request
        // per microsecond), the first free one follows the newest. The
        // `span` entries that would fill t..=last are the last `span` of
        // the log exactly when the first of them is t (distinct, sorted,
        // none above last): one look instead of a search.
        let span = last - t + 1;
        let packed = usize::try_from(span)
            .ok()
            .and_then(|span| log.len().checked_sub(span))
            .is_some_and(|i| log.get(i) == Some(t));
        if packed {
            log.extend((1..=left).map(|i| last + i));
            return;
        }
        let from = log.partition_point(|e| e < t);
        if log.get(from) != Some(t) {
            log.insert(from, t);
            left -= 1;
        }
        t += 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::rules::MAX_LOG_LIMIT;

    /// A cost above any window's limit (a window allows at most
    /// `MAX_LOG_LIMIT`, which the stores enforce) is refused without
    /// writing an entry, and waits the whole window: however large, it
    /// costs no memory (an entry per unit would be gigabytes).
    #[test]
    fn a_cost_above_the_limit_is_refused_without_writing() {
        let day = Window::new(Duration::from_secs(86_400), MAX_LOG_LIMIT).unwrap();
        let mut log = Log::default();
        assert!(check(&mut log, &[day], 3, 1_000, true).allowed());
        let d = check(&mut log, &[day], 600_000_000, 2_000, true);
        assert!(!d.allowed());
        assert_eq!(d.retry_after(), Some(day.duration()));
        assert_eq!(d.windows()[0].remaining, MAX_LOG_LIMIT - 3);
        assert_eq!(log.len(), 3);
    }

    proptest::proptest! {
        /// The one-window path answers and records exactly as the general
        /// one: same decisions, same log, whatever the clock and costs do.
        #[test]
        fn one_window_path_matches_the_general_one(
            limit in 1u32..6,
            secs in 1u64..4,
            steps in proptest::collection::vec((0u64..1_500_000, 1u32..4, 0u8..8), 1..60),
        ) {
            let window = [w(secs, limit)];
            let (mut one, mut many) = (Log::default(), Log::default());
            let mut now = 10_000_000u64;
            for (step, cost, kind) in steps {
                // Mostly forward; sometimes the same microsecond or back.
                now = match kind {
                    0 => now,
                    1 => now.saturating_sub(step / 4),
                    _ => now + step,
                };
                let record = kind != 7;
                let a = check_one(&mut one, window[0], cost, now, record);
                let b = check_many(&mut many, &window, cost, now, record);
                proptest::prop_assert_eq!(&a, &b);
                proptest::prop_assert_eq!(&one, &many);
            }
        }
    }

    proptest::proptest! {
        /// `push` takes exactly the first `cost` free microseconds at or
        /// after `now`, as the plain definition does one at a time,
        /// whatever holes and runs the log has.
        #[test]
        fn push_takes_the_first_free_microseconds(
            taken in proptest::collection::btree_set(0u64..64, 0..40),
            now in 0u64..70,
            cost in 1u32..12,
        ) {
            let mut log: Log = taken.iter().copied().collect();
            push(&mut log, now, cost);
            let mut want = taken.clone();
            let mut t = now;
            for _ in 0..cost {
                while want.contains(&t) {
                    t += 1;
                }
                want.insert(t);
            }
            let want: Vec<u64> = want.into_iter().collect();
            proptest::prop_assert_eq!(log.to_vec(), want);
        }
    }

    #[test]
    fn requests_take_the_first_free_microseconds_at_or_after_now() {
        let run = |log: &[u64], now: u64, cost: u32| {
            let mut log: Log = log.iter().copied().collect();
            push(&mut log, now, cost);
            log.to_vec()
        };
        assert_eq!(run(&[], 5, 3), [5, 6, 7]);
        assert_eq!(run(&[1, 2], 5, 1), [1, 2, 5]);
        // Packed up to the newest entry: after it.
        assert_eq!(run(&[100, 101, 102], 100, 2), [100, 101, 102, 103, 104]);
        // Holes are filled first.
        assert_eq!(run(&[100, 102], 100, 2), [100, 101, 102, 103]);
        assert_eq!(run(&[100, 105], 101, 1), [100, 101, 105]);
        assert_eq!(
            run(&[100, 102, 103], 100, 3),
            [100, 101, 102, 103, 104, 105]
        );
    }

    fn w(secs: u64, limit: u32) -> Window {
        Window::new(Duration::from_secs(secs), limit).unwrap()
    }

    const S: u64 = 1_000_000;

    #[test]
    fn allows_up_to_the_limit_then_reports_exact_retry() {
        let mut log = Log::default();
        let windows = [w(1, 2)];
        assert!(check(&mut log, &windows, 1, 10 * S, true).allowed());
        assert!(check(&mut log, &windows, 1, 10 * S, true).allowed());
        let d = check(&mut log, &windows, 1, 10 * S, true);
        assert!(!d.allowed());
        // The second entry was recorded one microsecond later; the first
        // leaves at 11 s, which frees one slot.
        assert_eq!(d.retry_after(), Some(Duration::from_secs(1)));
        assert_eq!(d.reset_after(), Duration::from_secs(1));
        assert!(!check(&mut log, &windows, 1, 11 * S - 1, true).allowed());
        assert!(check(&mut log, &windows, 1, 11 * S, true).allowed());
    }

    #[test]
    fn denied_requests_consume_nothing() {
        let mut log = Log::default();
        let windows = [w(1, 5), w(60, 2)];
        assert!(check(&mut log, &windows, 1, S, true).allowed());
        assert!(check(&mut log, &windows, 1, S, true).allowed());
        for _ in 0..10 {
            assert!(!check(&mut log, &windows, 1, 2 * S, true).allowed());
        }
        assert_eq!(log.len(), 2);
    }

    #[test]
    fn cost_above_limit_is_denied_with_the_window_as_wait() {
        let mut log = Log::default();
        let d = check(&mut log, &[w(10, 3)], 4, S, true);
        assert!(!d.allowed());
        assert_eq!(d.retry_after(), Some(Duration::from_secs(10)));
        assert_eq!(log.len(), 0);
    }

    #[test]
    fn a_clock_that_goes_back_takes_free_slots() {
        let mut log = Log::default();
        let windows = [w(10, 10)];
        check(&mut log, &windows, 2, 5 * S, true);
        check(&mut log, &windows, 2, 5 * S - 1, true);
        assert_eq!(log.to_vec(), [5 * S - 1, 5 * S, 5 * S + 1, 5 * S + 2]);
    }

    #[test]
    fn penalties_that_pile_up_stay_within_twice_the_largest_limit() {
        let mut log = Log::default();
        let windows = [w(1, 3), w(60, 10)];
        for _ in 0..50 {
            adjust(&mut log, &windows, Adjustment::Penalty(u32::MAX), 5 * S);
        }
        assert_eq!(log.len(), 20);
        // The first free microseconds from now, one after another.
        assert_eq!(log.front(), Some(5 * S));
        assert_eq!(log.back(), Some(5 * S + 19));
        adjust(&mut log, &windows, Adjustment::Refund(15), 5 * S);
        assert_eq!(log.to_vec(), (0..5).map(|i| 5 * S + i).collect::<Vec<_>>());
        // Entries that left the longest window go first.
        adjust(&mut log, &windows, Adjustment::Refund(1), 66 * S);
        assert_eq!(log.len(), 0);
    }
}
