//! Time sources.
//!
//! Every decision on a budget reads a [`Clock`] (the store's, or the
//! layer's when one is given), so window edges can be tested exactly with
//! a [`ManualClock`]. (Without one, the layer times its denial cache and
//! its fallback probes on the system's monotonic clock.)
//!
//! ```
//! use std::time::Duration;
//! use tower_ratelimit::clock::{Clock, ManualClock, Timestamp};
//!
//! let clock = ManualClock::new(Timestamp::from_micros(1_000_000));
//! clock.advance(Duration::from_millis(1500));
//! assert_eq!(clock.now(), Timestamp::from_micros(2_500_000));
//! ```

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// A point in time: whole microseconds since the Unix epoch.
///
/// Microseconds are the resolution of Redis' `TIME` and fit exactly in the
/// 53-bit mantissa of a sorted-set score until the year 2255.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Timestamp(u64);

impl Timestamp {
    /// A timestamp `micros` microseconds after the Unix epoch.
    pub const fn from_micros(micros: u64) -> Self {
        Self(micros)
    }

    /// Microseconds since the Unix epoch.
    pub const fn as_micros(self) -> u64 {
        self.0
    }

    /// This timestamp moved `by` later (saturating).
    #[must_use]
    pub fn saturating_add(self, by: Duration) -> Self {
        Self(self.0.saturating_add(duration_micros(by)))
    }
}

/// Whole microseconds in `d`, saturating at `u64::MAX`.
pub(crate) fn duration_micros(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX)
}

/// A source of the current time.
pub trait Clock: Send + Sync + fmt::Debug + 'static {
    /// The current time.
    fn now(&self) -> Timestamp;
}

/// The operating system's wall clock.
#[derive(Clone, Copy, Debug, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> Timestamp {
        // A clock set before 1970 reads as the epoch rather than panicking.
        let since = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or(Duration::ZERO);
        // (In u64: `Duration::as_micros` works in u128, on every check.)
        Timestamp(
            since
                .as_secs()
                .saturating_mul(1_000_000)
                .saturating_add(u64::from(since.subsec_micros())),
        )
    }
}

/// The system clock, read the fast way (the memory store's own): the wall
/// time when it is made, plus the time since on a monotonic clock read
/// from the CPU's counter (through `quanta`, as tower_governor reads it: a
/// few nanoseconds, where the OS clock costs about 20). Only where the
/// counter is one clock for every core: on x86 when Linux itself keeps
/// time with it (clocksource `tsc`, which the kernel gives up when the
/// cores' counters disagree), and on other architectures, whose counter is
/// fixed-frequency; elsewhere, and if the counter ever reads behind its
/// start, it reads [`SystemClock`]. A step of the wall clock (NTP) does not
/// move it. quanta calibrates the counter once per process, on the first
/// one made (a few milliseconds; at most 200).
#[derive(Clone, Debug)]
pub(crate) struct FastClock {
    /// The counter, its reading and the wall time when this clock was
    /// made; `None`: the system clock.
    counter: Option<(quanta::Clock, u64, u64)>,
}

impl FastClock {
    pub(crate) fn new() -> Self {
        let counter = counter_is_one_clock().then(|| {
            let clock = quanta::Clock::new();
            let start = clock.raw();
            (clock, start, SystemClock.now().0)
        });
        Self { counter }
    }
}

/// Whether the CPU's counter can be read as one clock on any core.
fn counter_is_one_clock() -> bool {
    if cfg!(any(target_arch = "x86", target_arch = "x86_64")) {
        cfg!(target_os = "linux")
            && std::fs::read_to_string(
                "/sys/devices/system/clocksource/clocksource0/current_clocksource",
            )
            .is_ok_and(|source| source.trim() == "tsc")
    } else {
        true
    }
}

impl Clock for FastClock {
    fn now(&self) -> Timestamp {
        match &self.counter {
            Some((clock, start, wall)) => {
                let raw = clock.raw();
                if raw < *start {
                    return SystemClock.now();
                }
                let since = clock.delta_as_nanos(*start, raw);
                Timestamp(wall.saturating_add(since / 1000))
            }
            None => SystemClock.now(),
        }
    }
}

/// A clock that only moves when told to; clones share the same time.
///
/// Inject it into a layer with
/// [`RateLimitLayer::clock`](crate::RateLimitLayer::clock) to make window
/// tests exact: the layer then passes its time to the store with every check,
/// so the memory store and the Redis scripts decide on the same instants.
#[derive(Clone, Debug, Default)]
pub struct ManualClock {
    micros: Arc<AtomicU64>,
}

impl ManualClock {
    /// A clock stopped at `start`.
    pub fn new(start: Timestamp) -> Self {
        Self {
            micros: Arc::new(AtomicU64::new(start.0)),
        }
    }

    /// Moves the clock forward by `by`.
    pub fn advance(&self, by: Duration) {
        self.micros.fetch_add(duration_micros(by), Ordering::SeqCst);
    }

    /// Sets the clock to `to` (it may move backwards).
    pub fn set(&self, to: Timestamp) {
        self.micros.store(to.0, Ordering::SeqCst);
    }
}

impl Clock for ManualClock {
    fn now(&self) -> Timestamp {
        Timestamp(self.micros.load(Ordering::SeqCst))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn manual_clock_clones_share_time() {
        let a = ManualClock::new(Timestamp::from_micros(5));
        let b = a.clone();
        a.advance(Duration::from_micros(10));
        assert_eq!(b.now().as_micros(), 15);
        b.set(Timestamp::from_micros(1));
        assert_eq!(a.now().as_micros(), 1);
    }

    #[test]
    fn fast_clock_keeps_to_the_system_clock_and_never_goes_back() {
        let fast = FastClock::new();
        let mut last = fast.now();
        for _ in 0..1000 {
            let now = fast.now();
            assert!(now >= last);
            last = now;
        }
        std::thread::sleep(Duration::from_millis(20));
        let (a, b) = (fast.now().as_micros(), SystemClock.now().as_micros());
        // (Within 5 ms of each other, and about 20 ms on from the start:
        // the counter's calibration is close, not exact.)
        assert!(a.abs_diff(b) < 5_000, "fast {a}, system {b}");
        if let Some((_, _, wall)) = fast.counter {
            assert!(a >= wall + 19_000);
        }
    }

    #[test]
    fn system_clock_is_after_2020() {
        assert!(SystemClock.now().as_micros() > 1_577_836_800_000_000);
    }
}
