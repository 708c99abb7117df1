//! The local cache of denials.
//!
//! When an asynchronous store (Redis; one that answers at once needs no
//! cache) says a budget is denied for a request of cost `c` until
//! `T` under a rule's policy, another request of cost `c` for that budget
//! under the same policy cannot pass before `T` (denied requests consume
//! nothing, and nothing but time frees a slot), so the layer can deny it
//! in-process, with no store round trip, with the same `Retry-After`. Under
//! attack this keeps the store's load flat. Other policies sharing the
//! budget (a zone's routes, a route's groups: other limits or block times)
//! and other costs ask the store. `T` is counted from when the store was
//! asked, so an entry can only end early.
//!
//! The cache is sharded (no global lock), bounded (entries beyond the
//! capacity are simply not cached; expired ones are dropped as shards
//! fill), and costs one atomic load per request while it is empty, two
//! once every entry it holds has ended (no lock, no hash).

use std::collections::HashMap;
use std::hash::BuildHasher;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use crate::store::Decision;

const SHARDS: usize = 16;

#[derive(Debug)]
struct Denied {
    until: u64,
    at: u64,
    policy: u64,
    cost: u32,
    /// A request that never passes (costlier than a limit): its entry
    /// gives way to a cheaper one's.
    never: bool,
    decision: Decision,
}

/// A shard's entries, and a time at or before which none of them expires
/// (exact after a sweep, lowered by each insert), so that a shard full of
/// live entries turns new ones away without scanning itself each time.
#[derive(Debug, Default)]
struct Entries {
    map: HashMap<Box<str>, Denied>,
    first_expiry: u64,
    /// When a budget of the shard last had its entry forgotten (a refund
    /// landed): a denial the store was asked for before then may have
    /// been decided before the refund, and is not kept.
    forgotten: u64,
}

type Shard = Mutex<Entries>;

/// Budgets known to be denied, until when.
#[derive(Debug)]
pub(crate) struct DenialCache {
    shards: Box<[Shard]>,
    hasher: foldhash::fast::RandomState,
    per_shard: usize,
    len: AtomicUsize,
    /// The latest end of any entry made: none holds at or after it.
    latest: AtomicU64,
}

impl DenialCache {
    pub(crate) fn new(capacity: usize) -> Self {
        Self {
            shards: (0..SHARDS).map(|_| Mutex::default()).collect(),
            hasher: foldhash::fast::RandomState::default(),
            per_shard: capacity.div_ceil(SHARDS).max(1),
            len: AtomicUsize::new(0),
            latest: AtomicU64::new(0),
        }
    }

    fn shard(&self, budget: &str) -> &Shard {
        let i = usize::try_from(self.hasher.hash_one(budget)).unwrap_or(0) % SHARDS;
        &self.shards[i]
    }

    /// Whether nothing is cached (one atomic load).
    pub(crate) fn is_empty(&self) -> bool {
        self.len.load(Ordering::Relaxed) == 0
    }

    /// The cached denial of a request of `cost` for `budget` under `policy`
    /// at `now` (microseconds on the layer's clock), with its waits
    /// shortened by the time since it was cached.
    pub(crate) fn get(&self, budget: &str, policy: u64, cost: u32, now: u64) -> Option<Decision> {
        if self.len.load(Ordering::Relaxed) == 0 || now >= self.latest.load(Ordering::Relaxed) {
            return None;
        }
        let mut shard = self
            .shard(budget)
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let hit = shard.map.get(budget)?;
        if hit.until <= now {
            shard.map.remove(budget);
            self.len.fetch_sub(1, Ordering::Relaxed);
            return None;
        }
        // `now` may be a little older than the entry: it was read before this
        // request waited for the lock, maybe before the entry was made.
        let elapsed = Duration::from_micros(now.saturating_sub(hit.at));
        (policy == hit.policy && cost == hit.cost).then(|| hit.decision.rewound(elapsed))
    }

    /// Forgets `budget`'s denial, if one is cached: a refund landed at
    /// `now`, and its next request may pass. A denial of the store asked
    /// for before `now` is not cached afterwards (the store may have
    /// decided it before the refund; any budget of the shard: one time a
    /// shard, not a time a budget).
    pub(crate) fn forget(&self, budget: &str, now: u64) {
        let mut shard = self
            .shard(budget)
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        shard.forgotten = shard.forgotten.max(now);
        if shard.map.remove(budget).is_some() {
            self.len.fetch_sub(1, Ordering::Relaxed);
        }
    }

    /// Remembers that `budget` is denied for requests of `cost` under
    /// `policy` until `now + decision.retry_after()`, or until its
    /// constraining window frees a slot if that is sooner. With
    /// `every_window` (the response shows every window's remaining, not
    /// the constraining one's alone), only while no other window can
    /// change: a window with entries frees a slot at a time the decision
    /// does not tell, after which a replay would show it as it was. (A
    /// block holds every window at nothing left until it ends.)
    #[expect(
        clippy::too_many_arguments,
        reason = "one call site, in the layer; each is a different fact about the denial"
    )]
    pub(crate) fn insert(
        &self,
        budget: &str,
        policy: u64,
        cost: u32,
        now: u64,
        decision: &Decision,
        every_window: bool,
        hold: Option<Duration>,
    ) {
        let Some(retry) = decision.retry_after().filter(|w| !w.is_zero()) else {
            return;
        };
        if every_window && !decision.is_blocked() {
            let constraining = decision.constraining_index();
            let others_may_change = decision
                .windows()
                .iter()
                .enumerate()
                .any(|(i, w)| Some(i) != constraining && w.remaining < w.window().limit());
            if others_may_change {
                return;
            }
        }
        // Replayed, the decision's windows are as the store saw them, so it
        // is kept no longer than they hold: until its constraining window
        // (the one its headers report) frees a slot, if that comes before
        // the retry (a request that needs more than one slot). Until then
        // it stays the constraining window: the others' remaining only
        // grows, and one with as few left that lost the tie stays behind
        // it.
        let reset = decision.reset_after();
        let wait = if reset.is_zero() {
            retry
        } else {
            retry.min(reset)
        };
        // (A block that holds less than the wait it reports: the entry
        // ends with it, so that the next request is blocked again.)
        let wait = hold.map_or(wait, |hold| wait.min(hold));
        let never = decision.exceeds_limit(cost);
        let until = now.saturating_add(crate::clock::duration_micros(wait));
        let mut shard = self
            .shard(budget)
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if now < shard.forgotten {
            return;
        }
        // (One entry a budget: a denial of another cost does not push out
        // one that still holds, but for one that never passes, which a
        // client could send once a window to keep its other denials from
        // being cached.)
        if shard
            .map
            .get(budget)
            .is_some_and(|held| held.until > now && held.cost != cost && (never || !held.never))
        {
            return;
        }
        if shard.map.len() >= self.per_shard && !shard.map.contains_key(budget) {
            // Full: nothing to drop before the first entry expires.
            if now < shard.first_expiry {
                return;
            }
            let before = shard.map.len();
            shard.map.retain(|_, d| d.until > now);
            self.len
                .fetch_sub(before - shard.map.len(), Ordering::Relaxed);
            shard.first_expiry = next_sweep(&shard.map, self.per_shard);
            if shard.map.len() >= self.per_shard {
                return;
            }
        }
        let entry = Denied {
            until,
            at: now,
            policy,
            cost,
            never,
            decision: decision.clone(),
        };
        shard.first_expiry = if shard.map.is_empty() {
            until
        } else {
            shard.first_expiry.min(until)
        };
        if shard.map.insert(budget.into(), entry).is_none() {
            self.len.fetch_add(1, Ordering::Relaxed);
        }
        self.latest.fetch_max(until, Ordering::Relaxed);
    }
}

/// When a shard's next sweep may free anything: its first expiry, or, when
/// it is still nearly full, the time an eighth of its entries have expired
/// (so that a shard whose entries expire one by one is swept once per
/// eighth of them, not on every insert after each expiry).
fn next_sweep(map: &HashMap<Box<str>, Denied>, per_shard: usize) -> u64 {
    if map.len() < per_shard - per_shard / 8 {
        return map.values().map(|d| d.until).min().unwrap_or(u64::MAX);
    }
    let mut untils: Vec<u64> = map.values().map(|d| d.until).collect();
    let eighth = untils.len() / 8;
    *untils.select_nth_unstable(eighth).1
}

#[cfg(test)]
mod tests {
    use super::*;

    fn denied(ms: u64) -> Decision {
        Decision::new(
            false,
            Some(Duration::from_millis(ms)),
            Duration::from_millis(ms),
            [],
        )
    }

    #[test]
    fn serves_denials_until_they_expire() {
        let cache = DenialCache::new(100);
        assert!(cache.get("b", 7, 1, 0).is_none());
        cache.insert("b", 7, 2, 1_000, &denied(10), false, None);
        // Other costs might pass, or wait longer: they go to the store.
        assert!(cache.get("b", 7, 1, 1_000).is_none());
        assert!(cache.get("b", 7, 3, 1_000).is_none());
        let hit = cache.get("b", 7, 2, 4_000).unwrap();
        assert_eq!(hit.retry_after(), Some(Duration::from_millis(7)));
        assert!(cache.get("b", 7, 2, 10_999).is_some());
        assert!(cache.get("b", 7, 2, 11_000).is_none());
        // (Once every entry has ended, a lookup reads two atomics and no
        // shard: the ended entry is dropped as its shard fills.)
        assert_eq!(cache.len.load(Ordering::Relaxed), 1);
        // Another entry, live: an ended one met on the way is dropped.
        cache.insert("c", 7, 2, 11_000, &denied(10), false, None);
        assert!(cache.get("b", 7, 2, 12_000).is_none());
        assert_eq!(cache.len.load(Ordering::Relaxed), 1);
        assert!(cache.get("c", 7, 2, 12_000).is_some());
    }

    #[test]
    fn a_denial_is_kept_only_while_its_constraining_window_holds() {
        use crate::store::WindowState;
        use crate::Window;
        // A request of cost 2 against a spent window of 2 in 2 s: its first
        // slot frees in 500 ms, its second (the request's wait) in 1.4 s.
        let windows = [WindowState::new(
            Window::new(Duration::from_secs(2), 2).unwrap(),
            0,
        )];
        let decision = Decision::new(
            false,
            Some(Duration::from_millis(1_400)),
            Duration::from_millis(500),
            windows,
        );
        let cache = DenialCache::new(100);
        cache.insert("b", 0, 2, 0, &decision, false, None);
        let hit = cache.get("b", 0, 2, 499_999).unwrap();
        assert_eq!(hit.reset_after(), Duration::from_micros(1));
        assert_eq!(hit.retry_after(), Some(Duration::from_micros(900_001)));
        // Past it, the replay would report a window that has moved on.
        assert!(cache.get("b", 0, 2, 500_000).is_none());
        // A decision whose reset is no sooner than its wait keeps the wait.
        cache.insert("c", 0, 1, 0, &denied(10), false, None);
        assert!(cache.get("c", 0, 1, 9_999).is_some());
    }

    #[test]
    fn shown_every_window_a_denial_is_kept_only_while_the_others_cannot_change() {
        use crate::store::WindowState;
        use crate::Window;
        let second = Window::new(Duration::from_secs(1), 1).unwrap();
        let minute = Window::new(Duration::from_secs(60), 3).unwrap();
        // A second's window and a minute's, both spent: the headers report
        // the second (a tie goes to the shorter), which frees a slot in
        // 400 ms; the request waits 59 s for the minute.
        let both = Decision::new(
            false,
            Some(Duration::from_secs(59)),
            Duration::from_millis(400),
            [WindowState::new(second, 0), WindowState::new(minute, 0)],
        );
        let cache = DenialCache::new(100);
        // (Showing the second alone, the replay holds until it frees a
        // slot, not for the whole wait.)
        cache.insert("x", 0, 1, 0, &both, false, None);
        assert!(cache.get("x", 0, 1, 399_999).is_some());
        assert!(cache.get("x", 0, 1, 400_000).is_none());
        // Showing both, it is not kept.
        cache.insert("b", 0, 1, 0, &both, true, None);
        assert!(cache.get("b", 0, 1, 1).is_none());
        // Once the second's window is empty, the minute alone can change.
        let alone = Decision::new(
            false,
            Some(Duration::from_secs(58)),
            Duration::from_secs(58),
            [WindowState::new(second, 1), WindowState::new(minute, 0)],
        );
        cache.insert("b", 0, 1, 0, &alone, true, None);
        assert!(cache.get("b", 0, 1, 57_999_999).is_some());
        // A block holds every window at nothing left until it ends.
        let blocked = Decision::new_blocked(Duration::from_secs(300), [second, minute]);
        cache.insert("c", 0, 1, 0, &blocked, true, None);
        assert!(cache.get("c", 0, 1, 299_999_999).is_some());
    }

    /// A refund forgets its budget's denial, and a denial the store was
    /// asked for before it (maybe decided before the refund) is not kept.
    #[test]
    fn a_refund_forgets_a_denial_and_turns_away_one_asked_before_it() {
        let cache = DenialCache::new(100);
        cache.insert("b", 0, 1, 0, &denied(10), false, None);
        cache.forget("b", 1_000);
        assert!(cache.get("b", 0, 1, 1_001).is_none());
        cache.insert("b", 0, 1, 999, &denied(10), false, None);
        assert!(cache.get("b", 0, 1, 1_001).is_none());
        cache.insert("b", 0, 1, 1_000, &denied(10), false, None);
        assert!(cache.get("b", 0, 1, 1_001).is_some());
    }

    #[test]
    fn a_denial_of_another_cost_does_not_push_out_one_that_holds() {
        let cache = DenialCache::new(100);
        cache.insert("b", 0, 1, 0, &denied(10), false, None);
        // (A request that never passes, alternated with cost-1 ones.)
        cache.insert("b", 0, u32::MAX, 1_000, &denied(60_000), false, None);
        assert!(cache.get("b", 0, 1, 2_000).is_some());
        assert!(cache.get("b", 0, u32::MAX, 2_000).is_none());
        // Once it has ended, another takes its place.
        cache.insert("b", 0, u32::MAX, 10_000, &denied(60_000), false, None);
        assert!(cache.get("b", 0, u32::MAX, 11_000).is_some());
    }

    #[test]
    fn a_denial_serves_only_its_own_policy() {
        // Two rules sharing the budget key (a zone's routes, a route's
        // groups) may have other limits: one's denial says nothing of the
        // other's.
        let cache = DenialCache::new(100);
        cache.insert("z:alice", 1, 1, 0, &denied(60_000), false, None);
        assert!(cache.get("z:alice", 2, 1, 10).is_none());
        assert!(cache.get("z:alice", 1, 1, 10).is_some());
    }

    #[test]
    fn a_reading_older_than_the_entry_is_not_an_underflow() {
        // A request read the clock, then waited for the shard lock while
        // another request cached a denial.
        let cache = DenialCache::new(100);
        cache.insert("b", 0, 1, 5_000, &denied(10), false, None);
        let hit = cache.get("b", 0, 1, 4_000).unwrap();
        assert_eq!(hit.retry_after(), Some(Duration::from_millis(10)));
    }

    /// `n` budgets in the shard of `b0`.
    fn same_shard(cache: &DenialCache, n: usize) -> Vec<String> {
        (0..)
            .map(|i| format!("b{i}"))
            .filter(|b| std::ptr::eq(cache.shard(b), cache.shard("b0")))
            .take(n)
            .collect()
    }

    #[test]
    fn a_full_shard_makes_room_when_its_first_entry_expires() {
        let cache = DenialCache::new(SHARDS * 2);
        let same = same_shard(&cache, 4);
        let first = |c: &DenialCache| c.shard("b0").lock().unwrap().first_expiry;
        cache.insert(&same[0], 0, 1, 0, &denied(5), false, None);
        cache.insert(&same[1], 0, 1, 0, &denied(10), false, None);
        assert_eq!(first(&cache), 5_000);
        // Full of live entries: turned away, the shard left as it was.
        cache.insert(&same[2], 0, 1, 4_000, &denied(10), false, None);
        assert!(cache.get(&same[2], 0, 1, 4_001).is_none());
        assert_eq!(cache.len.load(Ordering::Relaxed), 2);
        // The first entry has expired: it makes room.
        cache.insert(&same[3], 0, 1, 5_000, &denied(10), false, None);
        assert!(cache.get(&same[3], 0, 1, 5_001).is_some());
        assert!(cache.get(&same[1], 0, 1, 5_001).is_some());
        assert!(cache.get(&same[0], 0, 1, 5_001).is_none());
        assert_eq!(first(&cache), 10_000);
        assert_eq!(cache.len.load(Ordering::Relaxed), 2);
    }

    #[test]
    fn a_nearly_full_shard_is_swept_once_per_eighth_of_its_entries() {
        let cache = DenialCache::new(SHARDS * 16);
        let same = same_shard(&cache, 19);
        // 16 entries, expiring 1, 2, ..., 16 ms from 0.
        for (i, key) in same[..16].iter().enumerate() {
            cache.insert(key, 0, 1, 0, &denied(i as u64 + 1), false, None);
        }
        // At 1 ms the first has expired: room for one.
        cache.insert(&same[16], 0, 1, 1_000, &denied(100), false, None);
        assert!(cache.get(&same[16], 0, 1, 1_001).is_some());
        // At 2 ms the second has expired too, but the shard is not swept
        // again until an eighth of it (two entries) has: no room yet.
        cache.insert(&same[17], 0, 1, 2_000, &denied(100), false, None);
        assert!(cache.get(&same[17], 0, 1, 2_001).is_none());
        // At 3 ms it is: two entries leave, one comes in.
        cache.insert(&same[18], 0, 1, 3_000, &denied(100), false, None);
        assert!(cache.get(&same[18], 0, 1, 3_001).is_some());
        assert_eq!(cache.len.load(Ordering::Relaxed), 15);
    }

    #[test]
    fn is_bounded() {
        let cache = DenialCache::new(32);
        for i in 0..10_000 {
            cache.insert(&format!("b{i}"), 0, 1, 0, &denied(1000), false, None);
        }
        assert!(cache.len.load(Ordering::Relaxed) <= 32);
        // Expired entries make room again.
        cache.insert("late", 0, 1, 2_000_000, &denied(1000), false, None);
        assert!(cache.get("late", 0, 1, 2_000_001).is_some());
    }
}
