//! The exact sliding window (sliding log), as a pure function over one
//! budget's log. The Redis script `scripts/sliding_log.lua` implements the
//! same function; this one is its specification.
//!
//! The log holds the microsecond timestamps of allowed requests, strictly
//! increasing: a request at `now` is recorded at `max(now, last + 1)`, and a
//! request of cost `c` takes `c` consecutive microseconds. An entry at `t` is
//! inside a window of length `d` at `now` while `now < t + d`.

use std::collections::VecDeque;
use std::time::Duration;

use super::{Decision, WindowState};
use crate::rules::Window;

/// Decides on a request of `cost` at `now` against `windows` (shortest
/// first), trims entries older than the longest window, and records the
/// request when allowed.
pub(crate) fn check(log: &mut VecDeque<u64>, windows: &[Window], cost: u32, now: u64) -> Decision {
    let longest = windows.last().map_or(0, Window::micros);
    while log
        .front()
        .is_some_and(|&t| t.saturating_add(longest) <= now)
    {
        log.pop_front();
    }
    // Index of the first entry inside each window.
    let mut starts = [0usize; crate::rules::MAX_WINDOWS];
    let mut allowed = true;
    let mut retry = 0u64;
    for (i, w) in windows.iter().enumerate() {
        let start = log.partition_point(|&t| t.saturating_add(w.micros()) <= now);
        starts[i] = start;
        let count = log.len() - start;
        let need = (count as u64 + u64::from(cost)).saturating_sub(u64::from(w.limit()));
        if need > 0 {
            allowed = false;
            // The `need`-th oldest entry of the window must leave it.
            let wait = match usize::try_from(need - 1)
                .ok()
                .and_then(|k| log.get(start + k))
            {
                Some(&t) if need <= count as u64 => {
                    t.saturating_add(w.micros()).saturating_sub(now)
                }
                // Costs more than the window holds: it never passes; report
                // the whole window.
                _ => w.micros(),
            };
            retry = retry.max(wait);
        }
    }
    if allowed {
        let first = log.back().map_or(now, |&last| now.max(last + 1));
        log.extend((0..u64::from(cost)).map(|i| first + i));
    }
    let states = windows.iter().zip(starts).map(|(w, start)| {
        let count = (log.len() - start) as u64;
        let remaining = u64::from(w.limit()).saturating_sub(count);
        let reset = log
            .get(start)
            .map_or(0, |&t| t.saturating_add(w.micros()).saturating_sub(now));
        WindowState::new(
            *w,
            u32::try_from(remaining).unwrap_or(u32::MAX),
            Duration::from_micros(reset),
        )
    });
    Decision::new(allowed, Some(Duration::from_micros(retry)), states)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn w(secs: u64, limit: u32) -> Window {
        Window::new(Duration::from_secs(secs), limit).unwrap()
    }

    const S: u64 = 1_000_000;

    #[test]
    fn allows_up_to_the_limit_then_reports_exact_retry() {
        let mut log = VecDeque::new();
        let windows = [w(1, 2)];
        assert!(check(&mut log, &windows, 1, 10 * S).allowed());
        assert!(check(&mut log, &windows, 1, 10 * S).allowed());
        let d = check(&mut log, &windows, 1, 10 * S);
        assert!(!d.allowed());
        // The second entry was recorded one microsecond later; the first
        // leaves at 11 s, which frees one slot.
        assert_eq!(d.retry_after(), Some(Duration::from_secs(1)));
        assert!(!check(&mut log, &windows, 1, 11 * S - 1).allowed());
        assert!(check(&mut log, &windows, 1, 11 * S).allowed());
    }

    #[test]
    fn denied_requests_consume_nothing() {
        let mut log = VecDeque::new();
        let windows = [w(1, 5), w(60, 2)];
        assert!(check(&mut log, &windows, 1, S).allowed());
        assert!(check(&mut log, &windows, 1, S).allowed());
        for _ in 0..10 {
            assert!(!check(&mut log, &windows, 1, 2 * S).allowed());
        }
        assert_eq!(log.len(), 2);
    }

    #[test]
    fn cost_above_limit_is_denied_with_the_window_as_wait() {
        let mut log = VecDeque::new();
        let d = check(&mut log, &[w(10, 3)], 4, S);
        assert!(!d.allowed());
        assert_eq!(d.retry_after(), Some(Duration::from_secs(10)));
        assert!(log.is_empty());
    }
}
