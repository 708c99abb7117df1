//! The embedded in-process store.
//!
//! Budgets live in a hash table split into shards, each behind its own
//! mutex, so concurrent requests for different budgets rarely meet and no
//! lock is global. A check hashes its budget once, locks one shard, and runs
//! the algorithm on that budget's state; the answer is ready at once (the
//! returned future is [`std::future::Ready`], no allocation).
//!
//! # Memory
//!
//! The store holds one entry per budget with a request in its windows,
//! and sets no limit on their number: an identity that anyone can vary
//! (a header, an IPv6 address: [`Identity::from_ip`](crate::identity::Identity::from_ip)
//! groups IPv6 clients by their /64) makes a budget per value until its
//! windows pass. An entry is 128 bytes in its table; a sliding log also
//! keeps a ring of 8 bytes per request in its longest window, on the heap;
//! the counter algorithms keep nothing more.
//!
//! A budget whose windows are all empty is garbage. It is reclaimed by a
//! *sweep* of its shard, which starts:
//!
//! - when a check adds a budget to a shard that has doubled in size since
//!   its last sweep (so the table never holds more than about twice the
//!   live budgets), once the shard holds its share of 16,384 budgets (so a
//!   budget that empties between its requests, such as a token bucket far
//!   from its limit, is found again rather than removed and made anew, as
//!   long as the store holds fewer budgets than that);
//! - at a shard's first check a minute after its last sweep, so that
//!   budgets whose windows passed do not hold memory for good in a store
//!   too small to double (a burst of identities that ended); and
//! - on demand, with [`MemoryStore::sweep`], which sweeps each shard in
//!   one go, in turn.
//!
//! A full table is not grown in place: a table twice as large takes its
//! place, and the entries move to it, the empty ones left behind (past the
//! same share of 16,384). A table left four times larger than what it
//! holds moves to a smaller one the same way.
//!
//! **No check pays for the table's size.** Sweeps and moves run a step at
//! a time inside the shard's next checks, 64 buckets a step, and a budget
//! is found in either table while its entries move; only tables of up to
//! 512 buckets are swept or moved in one go (microseconds), and a move
//! still under way when the new table fills up (which the steps make
//! rare) ends at once. Growing at
//! once, as hashbrown grows a table, moves every entry inside the one
//! check that fills it, with the shard locked: `cargo bench --bench
//! growth` (a million new users, every check timed) puts the slowest check
//! at 0.4–0.8 ms, against 18.5–26 ms for the same tables grown at once and
//! 27–32 ms for governor's map (which also grows at once); at four million
//! users, 3–15 ms against 80–130 ms and 140–160 ms. What is left is making
//! the new table and freeing the old one (with glibc, making it may first
//! tidy the small blocks expired budgets freed: a few ms, once).

use std::future::{ready, Ready};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use std::hash::BuildHasher;

use hashbrown::HashTable;

use super::counters::{self, Slot};
use super::{
    sliding_log, AdjustFuture, Adjustment, Check, CheckRef, Decision, GlobalRef, Store, StoreError,
};
use crate::clock::{Clock, FastClock, Timestamp};
use crate::rules::Algorithm;

/// What tells a route-wide budget's entry from a user budget's spelled the
/// same (see [`MemoryStore::hash_of`] for the per-algorithm constants).
const ROUTE_SALT: u64 = 0x27d4_eb2f_1656_67c5;

/// A store's shards leave empty budgets behind when they grow only once
/// they hold this many budgets in all (about 2 MB of them), a shard at
/// least 64; nor do they shrink below their share.
const KEPT_BUDGETS: usize = 16_384;

/// A shard's least share of [`KEPT_BUDGETS`].
const MIN_KEPT: usize = 64;

/// A shard also sweeps at its first check this long after its last sweep,
/// whatever its size, so that budgets whose windows have passed (a flood
/// of identities that ended, a burst that grew a log) do not hold memory
/// until the table grows again, which it may never do (microseconds).
const SWEEP_EVERY: u64 = 60_000_000;

/// The buckets a step of a shard's upkeep (a move or a sweep) looks at:
/// at most this many entries moved or dropped by one step. A check runs
/// one step, and a second when it adds a budget (its insert's).
const STEP_BUCKETS: usize = 64;

/// A table of at most this many buckets is moved or swept in one go.
const SMALL_TABLE: usize = 512;

/// An exact in-process store; clones share the same budgets.
///
/// ```
/// use std::time::Duration;
/// use futures_util::FutureExt;
/// use tower_ratelimit::{Check, MemoryStore, Store, Window};
///
/// let store = MemoryStore::new();
/// let windows = [Window::new(Duration::from_secs(1), 1)?];
/// // The memory store answers at once: its future is always ready.
/// let first = store.check(Check::new("r1:alice", windows)).now_or_never().unwrap()?;
/// let second = store.check(Check::new("r1:alice", windows)).now_or_never().unwrap()?;
/// assert!(first.allowed() && !second.allowed());
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone, Debug)]
pub struct MemoryStore {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    shards: Box<[Shard]>,
    /// `57 - log2(shards)`: a budget's shard is the bits of its hash just
    /// below the top 7. hashbrown indexes its table with the low bits and
    /// tags each entry with the top 7: shards taken from either would leave
    /// a shard's entries fewer distinct indexes or tags (more false matches
    /// and key compares).
    shift: u32,
    hasher: foldhash::fast::RandomState,
    clock: StoreClock,
}

/// The store's own clock: the default one called directly (a call the
/// compiler sees, not one through a pointer), any other through its trait
/// object.
#[derive(Debug)]
enum StoreClock {
    Fast(FastClock),
    Other(Arc<dyn Clock>),
}

impl StoreClock {
    fn now(&self) -> Timestamp {
        match self {
            StoreClock::Fast(clock) => clock.now(),
            StoreClock::Other(clock) => clock.now(),
        }
    }
}

/// One shard, alone on its cache line so neighbours do not contend.
#[derive(Debug)]
#[repr(align(128))]
struct Shard(Mutex<ShardState>);

#[derive(Debug)]
struct ShardState {
    table: HashTable<Entry>,
    /// While the table moves to a new one (see [`Upkeep::Move`]): the
    /// entries not moved yet. Empty otherwise.
    old: HashTable<Entry>,
    /// The upkeep under way, a step of which runs in every check.
    upkeep: Upkeep,
    /// Sweep when an insert finds the table this long: twice what the
    /// last sweep (or move that dropped empty budgets) left, and at least
    /// `floor`.
    sweep_at: usize,
    /// This shard's share of [`KEPT_BUDGETS`].
    floor: usize,
    /// A check at or after this time (microseconds) runs a step of upkeep
    /// first: 0 while one is under way, else the next sweep's time (see
    /// [`SWEEP_EVERY`]). One comparison on every check's path.
    sweep_by: u64,
    /// The next sweep's time while a move is under way.
    next_sweep: u64,
}

/// A shard's upkeep, run a step ([`STEP_BUCKETS`]) at a time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Upkeep {
    Idle,
    /// A sweep: the table's empty entries are dropped, from this bucket on.
    Sweep {
        next: usize,
    },
    /// A move: the entries of `old`, from this bucket on, go to the table
    /// (the empty ones dropped if `drop_empty`).
    Move {
        next: usize,
        drop_empty: bool,
    },
}

/// A budget in a shard's table: 120 bytes, aligned on 128 so that finding
/// and updating it touch one pair of adjacent cache lines (which CPUs fetch
/// together), its key and (for counters of one window length) its state
/// included.
#[derive(Debug)]
#[repr(align(128))]
struct Entry {
    hash: u64,
    budget: Name,
    /// When this budget's state becomes garbage: every window empty and no
    /// block running (microseconds).
    expires: u64,
    /// The end of a block (`block_time`), or 0.
    blocked_until: u64,
    state: State,
}

impl Entry {
    fn new(hash: u64, budget: &str, algorithm: Algorithm) -> Self {
        Self {
            hash,
            budget: Name::new(budget),
            expires: 0,
            blocked_until: 0,
            state: State::new(algorithm),
        }
    }

    /// Whether this is the entry of `budget` whose hash is `hash` (for one
    /// algorithm: see [`MemoryStore::hash_of`]).
    #[inline]
    fn is(&self, hash: u64, budget: &str) -> bool {
        self.hash == hash && self.budget.is(budget)
    }

    /// Whether the entry holds anything at `now`.
    fn live(&self, now: u64) -> bool {
        self.expires > now || self.blocked_until > now
    }

    /// Decides on `check` with this entry as the user's budget and `global`
    /// as the route's: blocks first, then both budgets' windows, recorded
    /// in both or neither. The Redis scripts do the same.
    fn decide(&mut self, check: &CheckRef<'_>, global: Option<&mut Entry>, now: u64) -> Decision {
        if check.block.is_some() && self.blocked_until > now {
            return self.blocked(check, now);
        }
        if let (Some(route), Some(g)) = (global, check.global) {
            return self.decide_both(check, route, g, now);
        }
        let user = self.run(check.algorithm, check.windows, check.cost, now, true);
        if !user.allowed() && check.block.is_some() {
            return self.block(check, user, now);
        }
        user
    }

    /// The answer to a blocked user: nothing remaining in the user's
    /// windows (see [`Decision::new_blocked`]).
    #[cold]
    #[inline(never)]
    fn blocked(&self, check: &CheckRef<'_>, now: u64) -> Decision {
        Decision::new_blocked(
            Duration::from_micros(self.blocked_until - now),
            check.windows.iter().copied(),
        )
    }

    /// Both budgets: looks at both without recording, then records in both
    /// only if both allow.
    #[inline(never)]
    fn decide_both(
        &mut self,
        check: &CheckRef<'_>,
        route: &mut Entry,
        g: GlobalRef<'_>,
        now: u64,
    ) -> Decision {
        let (algorithm, cost) = (check.algorithm, check.cost);
        let user = self.run(algorithm, check.windows, cost, now, false);
        let shared = route.run(algorithm, g.windows, cost, now, false);
        if user.allowed() && shared.allowed() {
            let user = self.run(algorithm, check.windows, cost, now, true);
            let shared = route.run(algorithm, g.windows, cost, now, true);
            return Decision::join(user, shared);
        }
        let user_denied = !user.allowed();
        let joined = Decision::join(user, shared);
        if user_denied {
            return self.block(check, joined, now);
        }
        joined
    }

    /// The answer to a request the user's own windows denied: a block, if
    /// the rule has one, reporting the longer of the block and the wait.
    /// At a cost of 1 (or 0) it also holds that long (a block shorter than the
    /// wait would end with the user denied and blocked again, so every
    /// blocked answer reports when the user can pass); a costlier
    /// request's wait is its own, not a cheaper one's (and one above a
    /// limit waits for ever), so it holds for the block time.
    #[inline(never)]
    fn block(&mut self, check: &CheckRef<'_>, denied: Decision, now: u64) -> Decision {
        let Some(block) = check.block else {
            return denied;
        };
        let wait = block.max(denied.retry_after().unwrap_or_default());
        let hold = if check.cost <= 1 { wait } else { block };
        self.blocked_until = now.saturating_add(crate::clock::duration_micros(hold));
        Decision::new_blocked(wait, check.windows.iter().copied())
    }

    /// Runs the algorithm on this entry's state; records when allowed and
    /// `record` is set, and keeps the expiry in step.
    fn run(
        &mut self,
        algorithm: Algorithm,
        windows: &[crate::rules::Window],
        cost: u32,
        now: u64,
        record: bool,
    ) -> Decision {
        let (decision, expires) = self.state.run(algorithm, windows, cost, now, record);
        if record && decision.allowed() {
            self.expires = self.expires.max(expires);
        }
        decision
    }
}

/// The longest budget key kept in its entry.
const INLINE_NAME: usize = 54;

/// A budget's key. A short one (a policy's 18 bytes and a user's id of up
/// to 36: an address, a UUID) is kept in the entry itself, so a lookup
/// compares it without reading other memory (and a new budget allocates
/// nothing for it); a longer one is on the heap.
type Name = crate::key::ShortStr<INLINE_NAME>;

/// A counter algorithm's slots (one per window length): the first in the
/// entry itself (a budget checked against one window length reads no other
/// memory, and allocates nothing), more on the heap.
#[derive(Debug, Default)]
enum SlotList {
    #[default]
    Empty,
    One(Slot),
    Many(Vec<Slot>),
}

impl std::ops::Deref for SlotList {
    type Target = [Slot];

    fn deref(&self) -> &[Slot] {
        match self {
            SlotList::Empty => &[],
            SlotList::One(slot) => std::slice::from_ref(slot),
            SlotList::Many(slots) => slots,
        }
    }
}

impl std::ops::DerefMut for SlotList {
    fn deref_mut(&mut self) -> &mut [Slot] {
        match self {
            SlotList::Empty => &mut [],
            SlotList::One(slot) => std::slice::from_mut(slot),
            SlotList::Many(slots) => slots,
        }
    }
}

impl counters::Slots for SlotList {
    fn add(&mut self, slot: Slot) -> usize {
        match self {
            SlotList::Empty => *self = SlotList::One(slot),
            SlotList::One(first) => *self = SlotList::Many(vec![*first, slot]),
            SlotList::Many(slots) => slots.push(slot),
        }
        self.len().saturating_sub(1)
    }
}

/// A budget's state, by algorithm.
#[derive(Debug)]
enum State {
    Log(super::log::Log),
    Slots(SlotList),
}

impl State {
    fn new(algorithm: Algorithm) -> Self {
        match algorithm {
            Algorithm::SlidingLog => State::Log(super::log::Log::default()),
            _ => State::Slots(SlotList::Empty),
        }
    }

    /// Runs `algorithm` on this state; returns the decision and when the
    /// state becomes garbage.
    fn run(
        &mut self,
        algorithm: Algorithm,
        windows: &[crate::rules::Window],
        cost: u32,
        now: u64,
        record: bool,
    ) -> (Decision, u64) {
        match (algorithm, self) {
            (Algorithm::SlidingLog, State::Log(log)) => {
                let decision = sliding_log::check(log, windows, cost, now, record);
                let longest = windows.last().map_or(0, |w| w.micros());
                let expires = log.back().map_or(now, |t| t.saturating_add(longest));
                (decision, expires)
            }
            (Algorithm::FixedWindow, State::Slots(s)) => {
                counters::fixed_window(s, windows, cost, now, record)
            }
            (Algorithm::SlidingWindow, State::Slots(s)) => {
                counters::sliding_window(s, windows, cost, now, record)
            }
            (Algorithm::TokenBucket, State::Slots(s)) => {
                counters::token_bucket(s, windows, cost, now, record)
            }
            // A state of another shape: no entry holds one (each algorithm
            // has its own entry, see `MemoryStore::hash_of`); start afresh
            // rather than misread it, should one ever.
            (algorithm, state) => {
                state.reset(algorithm);
                state.run(algorithm, windows, cost, now, record)
            }
        }
    }

    /// Applies `adjustment` at `now`; returns when the state becomes
    /// garbage (at the earliest).
    fn adjust(
        &mut self,
        algorithm: Algorithm,
        windows: &[crate::rules::Window],
        adjustment: Adjustment,
        now: u64,
    ) -> u64 {
        match (algorithm, self) {
            (Algorithm::SlidingLog, State::Log(log)) => {
                sliding_log::adjust(log, windows, adjustment, now);
                let longest = windows.last().map_or(0, |w| w.micros());
                log.back().map_or(now, |t| t.saturating_add(longest))
            }
            (algorithm, State::Slots(s)) if algorithm != Algorithm::SlidingLog => {
                counters::adjust(algorithm, s, windows, adjustment, now)
            }
            (algorithm, state) => {
                state.reset(algorithm);
                state.adjust(algorithm, windows, adjustment, now)
            }
        }
    }

    /// A fresh state of `algorithm`'s shape. (Out of line: rules never get
    /// here.)
    #[cold]
    #[inline(never)]
    fn reset(&mut self, algorithm: Algorithm) {
        *self = State::new(algorithm);
    }
}

impl Default for MemoryStore {
    fn default() -> Self {
        Self::new()
    }
}

impl MemoryStore {
    /// A store on the system clock (read through the CPU's time-stamp
    /// counter where it is invariant, from the wall time when the store is
    /// made: monotonic, a few nanoseconds a read), with a shard count sized
    /// to the machine. The first store made in a process calibrates the
    /// counter, once (a few milliseconds here; at most 200).
    pub fn new() -> Self {
        Self::with_store_clock(StoreClock::Fast(FastClock::new()))
    }

    /// A store whose own time (used for checks that carry no time, and for
    /// [`sweep`](Self::sweep)) comes from `clock`.
    pub fn with_clock(clock: impl Clock) -> Self {
        Self::with_store_clock(StoreClock::Other(Arc::new(clock)))
    }

    fn with_store_clock(clock: StoreClock) -> Self {
        let threads = std::thread::available_parallelism().map_or(4, usize::from);
        let shards = (threads * 8).next_power_of_two().clamp(16, 1024);
        let shift = 57 - shards.trailing_zeros();
        let floor = (KEPT_BUDGETS / shards).max(MIN_KEPT);
        let shards = (0..shards)
            .map(|_| {
                Shard(Mutex::new(ShardState {
                    table: HashTable::new(),
                    old: HashTable::new(),
                    upkeep: Upkeep::Idle,
                    sweep_at: floor,
                    floor,
                    sweep_by: 0,
                    next_sweep: 0,
                }))
            })
            .collect();
        Self {
            inner: Arc::new(Inner {
                shards,
                shift,
                hasher: foldhash::fast::RandomState::default(),
                clock,
            }),
        }
    }

    /// The number of budgets currently held (including ones a sweep would
    /// reclaim): a budget checked under several algorithms, as while a
    /// reload changes one, counts once per algorithm.
    pub fn len(&self) -> usize {
        self.inner
            .shards
            .iter()
            .map(|s| {
                let state = lock(s);
                state.table.len() + state.old.len()
            })
            .sum()
    }

    /// Whether no budget is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Reclaims every budget whose windows are empty at the store's clock,
    /// at once (each shard locked in turn for as long as its sweep takes);
    /// returns how many budgets remain. Checks reclaim them a few at a time
    /// anyway (see [Memory](self#memory)): this is for tests and for a
    /// store about to be measured. Behind a layer with a clock of its own
    /// ([`RateLimitLayer::clock`](crate::RateLimitLayer::clock)), whose
    /// checks carry that clock's time, sweep at that time with
    /// [`sweep_at`](Self::sweep_at): on another clock, budgets that are
    /// live on the layer's may look empty, and be dropped.
    pub fn sweep(&self) -> usize {
        self.sweep_at(self.inner.clock.now())
    }

    /// Like [`sweep`](Self::sweep), at an explicit time.
    pub fn sweep_at(&self, now: Timestamp) -> usize {
        self.inner
            .shards
            .iter()
            .map(|s| {
                let mut state = lock(s);
                state.sweep_all(now.as_micros());
                state.table.len()
            })
            .sum()
    }

    /// Decides at once (the memory store never waits).
    pub(crate) fn decide_now(&self, check: &CheckRef<'_>) -> Decision {
        self.decide(check)
    }

    /// Applies `adjustment` to the user's budget of `check` (see
    /// [`Store::adjust`]).
    fn adjust_now(&self, check: &CheckRef<'_>, adjustment: Adjustment) {
        let inner = &*self.inner;
        let now = check.now.unwrap_or_else(|| inner.clock.now()).as_micros();
        let hash = self.hash_of(check.budget, check.algorithm);
        let mut shard = lock(&inner.shards[self.shard_of(hash)]);
        let (algorithm, windows) = (check.algorithm, check.windows);
        if let Some(entry) = shard.find_mut(hash, check.budget, now) {
            let expires = entry.state.adjust(algorithm, windows, adjustment, now);
            entry.expires = entry.expires.max(expires);
            return;
        }
        // A budget with nothing spent has nothing to give back.
        if let Adjustment::Penalty(_) = adjustment {
            let mut entry = Entry::new(hash, check.budget, algorithm);
            entry.expires = entry.state.adjust(algorithm, windows, adjustment, now);
            if entry.live(now) {
                shard.insert(entry, now);
            }
        }
    }

    /// The hash of `budget`'s entry for `algorithm`. A budget has one entry
    /// per algorithm (as it has one key per algorithm on Redis), so that
    /// tables of two algorithms in use at once (during a reload, or on
    /// replicas on either side of one) each find their own state and
    /// neither resets the other's: the hashes of one budget's entries
    /// differ by a constant per algorithm (none for the default), and an
    /// entry is found by its whole hash and its budget.
    #[inline]
    fn hash_of(&self, budget: &str, algorithm: Algorithm) -> u64 {
        let salt = match algorithm {
            Algorithm::SlidingLog => 0,
            Algorithm::SlidingWindow => 0x9e37_79b9_7f4a_7c15,
            Algorithm::FixedWindow => 0xc2b2_ae3d_27d4_eb4f,
            Algorithm::TokenBucket => 0x1656_67b1_9e37_79f9,
        };
        self.inner.hasher.hash_one(budget) ^ salt
    }

    fn shard_of(&self, hash: u64) -> usize {
        // (The shard count is a power of two: the mask keeps the index in
        // range whatever the shift, without a division.)
        usize::try_from(hash >> self.inner.shift).unwrap_or(0) & (self.inner.shards.len() - 1)
    }

    fn decide(&self, check: &CheckRef<'_>) -> Decision {
        let inner = &*self.inner;
        let now = check.now.unwrap_or_else(|| inner.clock.now()).as_micros();
        let hash = self.hash_of(check.budget, check.algorithm);
        let user_shard = self.shard_of(hash);
        let Some(global) = check.global else {
            let mut shard = lock(&inner.shards[user_shard]);
            if now >= shard.sweep_by {
                shard.upkeep(now);
            }
            let (decision, blocked) = match shard.table.find_mut(hash, |e| e.is(hash, check.budget))
            {
                Some(entry) => {
                    let before = entry.blocked_until;
                    let decision = entry.decide(check, None, now);
                    let blocked = if decision.allowed() || entry.blocked_until == before {
                        0
                    } else {
                        entry.blocked_until
                    };
                    (decision, blocked)
                }
                None => shard.decide_new(hash, check, now),
            };
            drop(shard);
            if blocked != 0 {
                self.spread_block(check, blocked, now);
            }
            return decision;
        };
        self.decide_two(check, global, hash, user_shard, now)
    }

    /// A check of a user's budget and its route's, perhaps in two shards
    /// (out of line: the common one-budget path stays compact).
    #[inline(never)]
    fn decide_two(
        &self,
        check: &CheckRef<'_>,
        global: GlobalRef<'_>,
        hash: u64,
        user_shard: usize,
        now: u64,
    ) -> Decision {
        let inner = &*self.inner;
        // Two budgets, perhaps in two shards: lock them in index order so
        // concurrent checks cannot deadlock, take both entries out, decide,
        // and put back what is still live.
        // (A route's budget has its own entries even if a caller of the
        // `Store` trait spells it as a user's budget: the layer never does,
        // and on Redis the two are different keys.)
        let global_hash = self.hash_of(global.budget, check.algorithm) ^ ROUTE_SALT;
        let global_shard = self.shard_of(global_hash);
        let (mut first, mut second) = match user_shard.cmp(&global_shard) {
            std::cmp::Ordering::Equal => (lock(&inner.shards[user_shard]), None),
            std::cmp::Ordering::Less => {
                let a = lock(&inner.shards[user_shard]);
                (a, Some(lock(&inner.shards[global_shard])))
            }
            std::cmp::Ordering::Greater => {
                let b = lock(&inner.shards[global_shard]);
                (lock(&inner.shards[user_shard]), Some(b))
            }
        };
        let mut user = first
            .take(hash, check.budget)
            .unwrap_or_else(|| Entry::new(hash, check.budget, check.algorithm));
        let route_shard = second.as_deref_mut().unwrap_or(&mut first);
        let mut route = route_shard
            .take(global_hash, global.budget)
            .unwrap_or_else(|| Entry::new(global_hash, global.budget, check.algorithm));
        let before = user.blocked_until;
        let decision = user.decide(check, Some(&mut route), now);
        let blocked = user.blocked_until;
        if route.live(now) {
            route_shard.insert(route, now);
        }
        if user.live(now) {
            first.insert(user, now);
        }
        drop((first, second));
        if blocked != before {
            self.spread_block(check, blocked, now);
        }
        decision
    }

    /// Gives a block just set on a budget's entry for one algorithm to its
    /// entries for the others (made if need be), as on Redis, where a
    /// budget's block is one key whatever the algorithm: a block is the
    /// user's, so a reload that changes the rule's algorithm leaves a
    /// blocked user blocked. Called with no shard locked (blocks are rare:
    /// the common paths never get here).
    #[cold]
    #[inline(never)]
    fn spread_block(&self, check: &CheckRef<'_>, until: u64, now: u64) {
        if until <= now {
            return;
        }
        for algorithm in Algorithm::ALL {
            if algorithm == check.algorithm {
                continue;
            }
            let hash = self.hash_of(check.budget, algorithm);
            let mut shard = lock(&self.inner.shards[self.shard_of(hash)]);
            match shard.find_mut(hash, check.budget, now) {
                Some(entry) => entry.blocked_until = entry.blocked_until.max(until),
                None => {
                    let mut entry = Entry::new(hash, check.budget, algorithm);
                    entry.blocked_until = until;
                    shard.insert(entry, now);
                }
            }
        }
    }
}

impl ShardState {
    /// The first request of a budget this shard does not hold.
    #[inline(never)]
    /// Also returns the end of a block the check set, or 0.
    fn decide_new(&mut self, hash: u64, check: &CheckRef<'_>, now: u64) -> (Decision, u64) {
        // (While the table moves, the budget may be in the old one.)
        let mut entry = self
            .take_old(hash, check.budget)
            .unwrap_or_else(|| Entry::new(hash, check.budget, check.algorithm));
        let before = entry.blocked_until;
        let decision = entry.decide(check, None, now);
        // (A block this check set, not one the entry held: see `decide`.)
        let blocked = if decision.allowed() || entry.blocked_until == before {
            0
        } else {
            entry.blocked_until
        };
        // A denied first request without a block leaves nothing to keep.
        if entry.live(now) {
            self.insert(entry, now);
        }
        (decision, blocked)
    }

    fn take(&mut self, hash: u64, budget: &str) -> Option<Entry> {
        match self.table.find_entry(hash, |e| e.is(hash, budget)) {
            Ok(entry) => Some(entry.remove().0),
            Err(_) => self.take_old(hash, budget),
        }
    }

    /// Takes the entry out of the table being moved from, if any.
    fn take_old(&mut self, hash: u64, budget: &str) -> Option<Entry> {
        if self.old.is_empty() {
            return None;
        }
        let entry = self.old.find_entry(hash, |e| e.is(hash, budget)).ok()?;
        Some(entry.remove().0)
    }

    /// The entry of `budget`, moved to the table first if it is still in
    /// the old one.
    fn find_mut(&mut self, hash: u64, budget: &str, now: u64) -> Option<&mut Entry> {
        if let Some(entry) = self.take_old(hash, budget) {
            self.insert(entry, now);
        }
        self.table.find_mut(hash, |e| e.is(hash, budget))
    }

    /// Inserts an entry that is not in the table. A full table is not
    /// grown at once (hashbrown would move every entry then): a larger one
    /// takes its place, and the entries move to it step by step.
    fn insert(&mut self, entry: Entry, now: u64) {
        if now >= self.sweep_by || self.table.len() >= self.sweep_at {
            self.upkeep(now);
        }
        if self.table.len() >= self.table.capacity() {
            self.grow(now);
        }
        self.table.insert_unique(entry.hash, entry, |e| e.hash);
    }

    /// Starts moving the full table to one twice its length (out of line:
    /// once per doubling).
    #[cold]
    #[inline(never)]
    fn grow(&mut self, now: u64) {
        // (A move still under way when the new table fills up, which
        // steps on every insert make rare, ends at once.)
        self.finish_move(now);
        let drop_empty = self.table.len() >= self.floor;
        let larger = HashTable::with_capacity((2 * self.table.len()).max(16));
        self.start_move(larger, drop_empty, now);
    }

    /// Puts `table` (new, empty) in place and starts moving the entries to
    /// it (all at once for a small table).
    fn start_move(&mut self, table: HashTable<Entry>, drop_empty: bool, now: u64) {
        if !matches!(self.upkeep, Upkeep::Move { .. }) {
            self.next_sweep = match self.upkeep {
                // (A move drops what a sweep under way would.)
                Upkeep::Sweep { .. } if drop_empty => now.saturating_add(SWEEP_EVERY),
                Upkeep::Sweep { .. } => 0,
                _ => self.sweep_by,
            };
        }
        self.old = std::mem::replace(&mut self.table, table);
        self.upkeep = Upkeep::Move {
            next: 0,
            drop_empty,
        };
        self.sweep_by = 0;
        if self.old.num_buckets() <= SMALL_TABLE {
            self.finish_move(now);
        }
    }

    /// Ends a move under way at once.
    fn finish_move(&mut self, now: u64) {
        while matches!(self.upkeep, Upkeep::Move { .. }) {
            self.step(now, usize::MAX);
        }
    }

    /// A step of upkeep, in a check at or after `sweep_by` or an insert
    /// that finds the table `sweep_at` long: a sweep starts if nothing is
    /// under way (out of line: rare).
    #[cold]
    #[inline(never)]
    fn upkeep(&mut self, now: u64) {
        if self.upkeep == Upkeep::Idle {
            self.upkeep = Upkeep::Sweep { next: 0 };
            self.sweep_by = 0;
        }
        let buckets = match self.upkeep {
            Upkeep::Sweep { .. } if self.table.num_buckets() <= SMALL_TABLE => usize::MAX,
            _ => STEP_BUCKETS,
        };
        self.step(now, buckets);
    }

    /// Looks at up to `buckets` buckets of the upkeep under way, and ends
    /// it after the last.
    fn step(&mut self, now: u64, buckets: usize) {
        match self.upkeep {
            Upkeep::Idle => {}
            Upkeep::Sweep { next } => {
                let end = next.saturating_add(buckets).min(self.table.num_buckets());
                for index in next..end {
                    if let Ok(entry) = self.table.get_bucket_entry(index) {
                        if !entry.get().live(now) {
                            entry.remove();
                        }
                    }
                }
                if end < self.table.num_buckets() {
                    self.upkeep = Upkeep::Sweep { next: end };
                } else {
                    self.next_sweep = now.saturating_add(SWEEP_EVERY);
                    self.sweep_at = (2 * self.table.len()).max(self.floor);
                    self.finish(now);
                }
            }
            Upkeep::Move { next, drop_empty } => {
                let end = next.saturating_add(buckets).min(self.old.num_buckets());
                for index in next..end {
                    if let Ok(entry) = self.old.get_bucket_entry(index) {
                        let (entry, _) = entry.remove();
                        if !drop_empty || entry.live(now) {
                            self.table.insert_unique(entry.hash, entry, |e| e.hash);
                        }
                    }
                }
                if end < self.old.num_buckets() {
                    self.upkeep = Upkeep::Move {
                        next: end,
                        drop_empty,
                    };
                } else {
                    // (Freed in this check, which returns its memory to
                    // the system: within the 0.4–0.8 ms of the slowest
                    // check at a million budgets, several ms at four
                    // million. Freed on a thread of its own, it cost the
                    // checks more, 3–14 ms at a million: the thread's
                    // start and its unmapping were felt by this core.)
                    self.old = HashTable::new();
                    if drop_empty {
                        self.sweep_at = (2 * self.table.len()).max(self.floor);
                    }
                    self.finish(now);
                }
            }
        }
    }

    /// Ends the upkeep under way; a table left four times larger than it
    /// needs (and than its floor) then moves to a smaller one.
    fn finish(&mut self, now: u64) {
        self.upkeep = Upkeep::Idle;
        self.sweep_by = self.next_sweep;
        let needed = self.table.len().max(self.floor);
        if self.table.capacity() > 4 * needed {
            // (Room too for the new budgets of the checks the move takes,
            // one step each at least: the small table does not fill up
            // before the large one is empty.)
            let during = self.table.num_buckets() / STEP_BUCKETS;
            let smaller = HashTable::with_capacity(2 * needed + during);
            // (Only to a table with fewer buckets: hashbrown rounds a
            // capacity up to a power of two buckets, which may be this
            // table's own; a move to it would end here again, and start the
            // same move, for ever: `sweep` never returned, and every check
            // of the shard took a step.)
            if smaller.num_buckets() < self.table.num_buckets() {
                self.start_move(smaller, true, now);
            }
        }
    }

    /// Drops every empty entry at once (see [`MemoryStore::sweep`]).
    fn sweep_all(&mut self, now: u64) {
        self.finish_move(now);
        self.table.retain(|e| e.live(now));
        self.upkeep = Upkeep::Idle;
        self.sweep_at = (2 * self.table.len()).max(self.floor);
        self.next_sweep = now.saturating_add(SWEEP_EVERY);
        self.sweep_by = self.next_sweep;
        let needed = self.table.len().max(self.floor);
        if self.table.capacity() > 4 * needed {
            self.table.shrink_to(2 * needed, |e| e.hash);
        }
    }
}

/// A panic while a shard was locked cannot leave it inconsistent (every
/// update is a push or a pop), so a poisoned lock is simply taken.
fn lock(shard: &Shard) -> MutexGuard<'_, ShardState> {
    shard.0.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Store for MemoryStore {
    type Future = Ready<Result<Decision, StoreError>>;

    fn check(&self, check: Check) -> Self::Future {
        let check = check.as_ref();
        ready(check.supported().map(|()| self.decide(&check)))
    }

    fn check_now(&self, check: &CheckRef<'_>) -> Option<Result<Decision, StoreError>> {
        Some(check.supported().map(|()| self.decide(check)))
    }

    fn always_decides_at_once(&self) -> bool {
        true
    }

    fn adjust(&self, check: Check, adjustment: Adjustment) -> AdjustFuture {
        let check = check.as_ref();
        let result = check.shape_supported().map(|()| {
            if !adjustment.is_empty() && !check.windows.is_empty() {
                self.adjust_now(&check, adjustment);
            }
        });
        Box::pin(ready(result))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::ManualClock;
    use crate::rules::Window;
    use std::time::Duration;

    /// `n` users (`r:0`, `r:1`, ...) whose sliding-log budgets are in
    /// `user`'s shard, whatever the number of shards.
    fn users_in_shard_of(store: &MemoryStore, user: &str, n: usize) -> Vec<String> {
        let shard = |user: &str| store.shard_of(store.hash_of(user, Algorithm::SlidingLog));
        (0..)
            .map(|i| format!("r:{i}"))
            .filter(|u| shard(u) == shard(user))
            .take(n)
            .collect()
    }

    #[test]
    fn an_entry_is_one_pair_of_cache_lines() {
        assert_eq!(std::mem::size_of::<Entry>(), 128);
        assert_eq!(std::mem::align_of::<Entry>(), 128);
        // (And so is a shard, its lock and its table's handle together.)
        assert_eq!(std::mem::size_of::<Shard>(), 128);
    }

    #[test]
    fn sweep_reclaims_budgets_with_empty_windows() {
        let clock = ManualClock::new(Timestamp::from_micros(1_000_000));
        let store = MemoryStore::with_clock(clock.clone());
        let windows: Arc<[Window]> = [Window::new(Duration::from_secs(10), 5).unwrap()].into();
        for user in 0..1000 {
            let d = store.decide(&Check::new(format!("r:{user}"), windows.clone()).as_ref());
            assert!(d.allowed());
        }
        assert_eq!(store.sweep(), 1000);
        clock.advance(Duration::from_secs(10));
        assert_eq!(store.sweep(), 0);
        assert!(store.is_empty());
    }

    /// A store far below the size at which its shards sweep as they grow
    /// (a few budgets, once large, whose windows have passed) still frees
    /// them: a shard sweeps at its first check a minute after its last.
    #[test]
    fn a_shard_sweeps_a_minute_after_its_last_sweep() {
        let clock = ManualClock::new(Timestamp::from_micros(1_000_000));
        let store = MemoryStore::with_clock(clock.clone());
        let windows: Arc<[Window]> = [Window::new(Duration::from_secs(1), 5).unwrap()].into();
        let check = |user: &str| {
            store.decide(
                &Check::new(user.to_owned(), windows.clone())
                    .at(clock.now())
                    .as_ref(),
            )
        };
        // 100 budgets in x's shard (whatever the number of shards).
        let users = users_in_shard_of(&store, "r:x", 100);
        for user in &users {
            assert!(check(user).allowed());
        }
        // Their windows passed, but the shard has not swept since.
        clock.advance(Duration::from_secs(30));
        assert!(check("r:x").allowed());
        assert_eq!(store.len(), 101);
        // A minute after its first sweep, the shard's next check sweeps it:
        // x's budget alone, made anew, is left.
        clock.advance(Duration::from_secs(31));
        assert!(check("r:x").allowed());
        assert_eq!(store.len(), 1);
    }

    #[test]
    fn automatic_sweeps_bound_the_table() {
        let clock = ManualClock::new(Timestamp::from_micros(1_000_000));
        let store = MemoryStore::with_clock(clock.clone());
        let windows: Arc<[Window]> = [Window::new(Duration::from_secs(1), 1).unwrap()].into();
        // 100,000 one-off users, each idle a second later: the table must
        // stay near the number of live budgets, not grow to 100,000.
        for user in 0..100_000u32 {
            let d = store.decide(
                &Check::new(format!("r:{user}"), windows.clone())
                    .at(clock.now())
                    .as_ref(),
            );
            assert!(d.allowed());
            clock.advance(Duration::from_millis(1));
        }
        let held = store.len();
        assert!(
            held < 2 * 1000 + KEPT_BUDGETS.max(64 * store.inner.shards.len()),
            "held {held}"
        );
    }

    /// A full table does not grow in one go inside one check: its entries
    /// move to a table twice as large, a step's buckets at a time (two
    /// steps in a check that adds a budget), and every budget is found
    /// (and counts on) in either table meanwhile, whatever path reaches it.
    /// A table four times larger than it needs moves to one with fewer
    /// buckets, or stays: never to one of its own size, which would end
    /// with the same move again (found by an outside model test: a shard
    /// of 8,192 buckets left with 1,729 to 1,791 budgets moved to a table
    /// of 8,192 buckets for ever, and `sweep` never returned).
    #[test]
    fn a_table_shrinks_to_fewer_buckets_or_not_at_all() {
        let store = MemoryStore::with_clock(ManualClock::new(Timestamp::from_micros(1)));
        let budgets: Vec<(u64, String)> = (0..8_000)
            .map(|i| {
                let budget = format!("u{i}");
                (store.hash_of(&budget, Algorithm::SlidingLog), budget)
            })
            .collect();
        let mut shard = lock(&store.inner.shards[0]);
        let floor = shard.floor;
        for (capacity, lens) in [(7_000, 1_700..1_800), (14_000, 3_440..3_600)] {
            for len in lens.step_by(4).filter(|&len| len >= floor) {
                shard.table = HashTable::with_capacity(capacity);
                let buckets = shard.table.num_buckets();
                for (hash, budget) in &budgets[..len] {
                    let mut entry = Entry::new(*hash, budget, Algorithm::SlidingLog);
                    entry.expires = u64::MAX;
                    shard.table.insert_unique(*hash, entry, |e| e.hash);
                }
                shard.finish(1);
                if let Upkeep::Move { .. } = shard.upkeep {
                    assert!(shard.table.num_buckets() < buckets, "{len} in {buckets}");
                }
                // The moves end (at most one: to a table no longer too
                // large), every budget kept.
                for _ in 0..3 {
                    shard.step(1, usize::MAX);
                }
                assert_eq!(shard.upkeep, Upkeep::Idle, "{len} in {buckets}");
                assert_eq!(shard.table.len(), len);
                assert!(shard.old.is_empty());
                // And an explicit sweep returns.
                shard.sweep_all(1);
                assert_eq!(shard.table.len(), len);
            }
        }
    }

    #[test]
    fn a_growing_table_moves_a_step_at_a_time_and_loses_no_budget() {
        let clock = ManualClock::new(Timestamp::from_micros(1_000_000));
        let store = MemoryStore::with_clock(clock.clone());
        let windows: Arc<[Window]> = [Window::new(Duration::from_secs(3600), 10).unwrap()].into();
        let check = |user: &str| {
            let check = Check::new(user.to_owned(), windows.clone()).at(clock.now());
            store.decide(&check.as_ref())
        };
        let shard = store.shard_of(store.hash_of("r:x", Algorithm::SlidingLog));
        let state = || lock(&store.inner.shards[shard]);
        let users = users_in_shard_of(&store, "r:x", 20_000);
        let mut moves = 0;
        let mut moving = false;
        let mut used: Vec<String> = Vec::new();
        for (n, user) in users.iter().enumerate() {
            let before = state().old.len();
            assert_eq!(check(user).windows()[0].remaining, 9);
            let shard = state();
            if let Upkeep::Move { .. } = shard.upkeep {
                if moving {
                    // (A check takes a step, and its insert another.)
                    assert!(before - shard.old.len() <= 2 * STEP_BUCKETS);
                } else {
                    moves += 1;
                    assert!(
                        shard.old.len() > n / 2,
                        "moved {} of {n} at once",
                        n - shard.old.len()
                    );
                }
            }
            let started = !moving && matches!(shard.upkeep, Upkeep::Move { .. });
            moving = matches!(shard.upkeep, Upkeep::Move { .. });
            drop(shard);
            if started {
                // Budgets still in the old table, found by a penalty, a
                // route-wide check and a block, each moved over.
                // (Users checked once: not those checked again below.)
                let old: Vec<String> = users[..n]
                    .iter()
                    .enumerate()
                    .filter(|(i, u)| i % 97 != 0 && !used.contains(u))
                    .map(|(_, u)| u)
                    .filter(|u| {
                        let hash = store.hash_of(u, Algorithm::SlidingLog);
                        state().old.find(hash, |e| e.is(hash, u)).is_some()
                    })
                    .take(3)
                    .cloned()
                    .collect();
                assert_eq!(old.len(), 3);
                used.extend(old.iter().cloned());
                let penalty = Check::new(old[0].clone(), windows.clone()).at(clock.now());
                store.adjust_now(&penalty.as_ref(), Adjustment::Penalty(4));
                assert_eq!(check(&old[0]).windows()[0].remaining, 4);
                let route = crate::GlobalCheck::new("route:*", windows.clone());
                let both = Check::new(old[1].clone(), windows.clone())
                    .with_global(route)
                    .at(clock.now());
                assert_eq!(store.decide(&both.as_ref()).windows()[0].remaining, 8);
                let blocking = Check::new(old[2].clone(), windows.clone())
                    .with_block(Duration::from_secs(5))
                    .with_algorithm(Algorithm::TokenBucket)
                    .at(clock.now());
                for _ in 0..10 {
                    assert!(store.decide(&blocking.as_ref()).allowed());
                }
                assert!(!store.decide(&blocking.as_ref()).allowed());
                // (The block reached the sliding log's entry, in the old
                // table or moved.)
                let blocked = Check::new(old[2].clone(), windows.clone())
                    .with_block(Duration::from_secs(5))
                    .at(clock.now());
                assert!(store.decide(&blocked.as_ref()).blocked);
                let hash = store.hash_of(&old[2], Algorithm::SlidingLog);
                assert!(state().old.find(hash, |e| e.is(hash, &old[2])).is_none());
            }
            // Midway through a move, every budget so far counts on, the
            // first ones (the most likely still in the old table) too.
            if moving && n % 997 == 0 {
                for earlier in users[..n].iter().step_by(97) {
                    let remaining = check(earlier).windows()[0].remaining;
                    assert!(remaining < 9, "{earlier} was made anew");
                }
            }
        }
        assert!(moves >= 3, "{moves} moves");
        // Every user once (the token bucket entries of the blocked ones
        // aside), and the route.
        let others = 3 * moves + 1;
        assert_eq!(store.len(), 20_000 + others);
        while matches!(state().upkeep, Upkeep::Move { .. }) {
            check(&users[0]);
        }
        assert!(state().old.is_empty());
        assert_eq!(store.len(), 20_000 + others);
    }

    #[test]
    fn budgets_that_empty_between_requests_are_kept_below_the_floor() {
        let clock = ManualClock::new(Timestamp::from_micros(1_000_000));
        let store = MemoryStore::with_clock(clock.clone());
        let windows: Arc<[Window]> = [Window::new(Duration::from_secs(1), 1_000).unwrap()].into();
        // 5,000 users, each budget empty a millisecond after its request
        // (a bucket of 1,000 a second, far from its limit), requests 2 ms
        // apart: found again at the next round, not swept and made anew
        // (nor twice). (Within the minute after which a shard sweeps
        // anyway: 30 s in all.)
        for _ in 0..3 {
            for user in 0..5_000u32 {
                let check = Check::new(format!("r:{user}"), windows.clone())
                    .with_algorithm(Algorithm::TokenBucket)
                    .at(clock.now());
                assert!(store.decide(&check.as_ref()).allowed());
                clock.advance(Duration::from_millis(2));
            }
            assert_eq!(store.len(), 5_000);
        }
        // (A sweep asked for still reclaims them.)
        assert_eq!(store.sweep(), 0);
    }

    #[test]
    fn keys_in_the_entry_and_on_the_heap_are_told_apart() {
        let store = MemoryStore::new();
        let windows: Arc<[Window]> = [Window::new(Duration::from_secs(60), 1).unwrap()].into();
        // Around the inline length: keys that differ only in their last
        // byte or their length, on either side of it.
        let base = "k".repeat(INLINE_NAME + 2);
        let mut keys: Vec<String> = Vec::new();
        for len in [
            1,
            INLINE_NAME - 1,
            INLINE_NAME,
            INLINE_NAME + 1,
            INLINE_NAME + 2,
        ] {
            keys.push(base[..len].to_owned());
            keys.push(format!("{}x", &base[..len - 1]));
        }
        keys.push(String::new());
        for key in &keys {
            let first = store.decide(&Check::new(key.as_str(), windows.clone()).as_ref());
            assert!(first.allowed(), "{} bytes: a first request", key.len());
        }
        for key in &keys {
            let second = store.decide(&Check::new(key.as_str(), windows.clone()).as_ref());
            assert!(!second.allowed(), "{} bytes: its own budget", key.len());
        }
        assert_eq!(store.len(), keys.len());
    }

    #[test]
    fn counters_keep_each_window_length_as_more_are_checked() {
        let store = MemoryStore::new();
        let now = Timestamp::from_micros(5_000_000);
        let w = |secs, limit| Window::new(Duration::from_secs(secs), limit).unwrap();
        for algorithm in [
            Algorithm::FixedWindow,
            Algorithm::SlidingWindow,
            Algorithm::TokenBucket,
        ] {
            let budget = format!("r:{algorithm:?}");
            let check = |windows: Vec<Window>| {
                let windows: Arc<[Window]> = windows.into();
                let check = Check::new(budget.as_str(), windows)
                    .with_algorithm(algorithm)
                    .at(now);
                store.decide(&check.as_ref())
            };
            // One window length (its slot in the entry), then a second and
            // a third (on the heap): every count carries on.
            let remaining =
                |d: &Decision| d.windows().iter().map(|w| w.remaining).collect::<Vec<_>>();
            assert_eq!(remaining(&check(vec![w(1, 10)])), [9]);
            assert_eq!(remaining(&check(vec![w(1, 10), w(60, 20)])), [8, 19]);
            assert_eq!(
                remaining(&check(vec![w(1, 10), w(60, 20), w(3600, 30)])),
                [7, 18, 29]
            );
            assert_eq!(remaining(&check(vec![w(60, 20)])), [17], "{algorithm:?}");
        }
    }
}
