//! A sliding-log budget's entries in memory: a ring of timestamps, sorted
//! and distinct, with its oldest and newest entries also kept beside it.
//!
//! A budget's oldest entry lies far from its newest in the ring (a window's
//! requests apart), and between two requests of one user a busy server
//! touches enough other memory to evict both from the core's caches. A
//! check reads the oldest (has anything left the window?) and the newest (is
//! the next microsecond free?), then writes after the newest; with both kept
//! beside the ring, in the budget's table entry, the ring is touched only
//! for that write (and for the entries that leave the window): one cache
//! line per check where there were three.

/// The timestamps of a budget's allowed requests, oldest first.
///
/// 40 bytes, so that a budget's whole table entry fits two cache lines.
/// A log holds at most `u32::MAX` entries, which no rule can reach: a check
/// is allowed only while its longest window holds fewer than its limit (a
/// `u32`), and entries older than that window are dropped first.
#[derive(Debug, Default)]
pub(crate) struct Log {
    /// The ring; its length is the capacity.
    buf: Box<[u64]>,
    /// The ring's slot of the oldest entry.
    head: u32,
    /// How many entries the log holds.
    len: u32,
    /// A copy of the oldest entry (0 when empty).
    oldest: u64,
    /// A copy of the newest entry (0 when empty).
    newest: u64,
}

/// A ring never shrinks below this many slots.
const MIN_CAPACITY: usize = 4;

impl Log {
    /// How many entries the log holds.
    pub(crate) fn len(&self) -> usize {
        self.len as usize
    }

    /// The oldest entry.
    pub(crate) fn front(&self) -> Option<u64> {
        (self.len > 0).then_some(self.oldest)
    }

    /// The newest entry.
    pub(crate) fn back(&self) -> Option<u64> {
        (self.len > 0).then_some(self.newest)
    }

    /// The ring's slot of the `i`-th oldest entry (`i` below the capacity).
    fn slot(&self, i: usize) -> usize {
        let j = self.head as usize + i;
        match j.checked_sub(self.buf.len()) {
            Some(wrapped) => wrapped,
            None => j,
        }
    }

    /// The `i`-th oldest entry.
    pub(crate) fn get(&self, i: usize) -> Option<u64> {
        let last = self.len().checked_sub(1)?;
        match i {
            0 => Some(self.oldest),
            _ if i == last => Some(self.newest),
            _ if i < last => self.buf.get(self.slot(i)).copied(),
            _ => None,
        }
    }

    /// The number of entries, from the oldest, for which `before` holds
    /// (it must hold for a prefix of the log).
    pub(crate) fn partition_point(&self, mut before: impl FnMut(u64) -> bool) -> usize {
        let Some(oldest) = self.front() else {
            return 0;
        };
        if !before(oldest) {
            return 0;
        }
        if before(self.newest) {
            return self.len();
        }
        // Every entry before `low` is before, the one at `high` is not.
        let (mut low, mut high) = (1, self.len() - 1);
        while low < high {
            let mid = low + (high - low) / 2;
            if self.get(mid).is_some_and(&mut before) {
                low = mid + 1;
            } else {
                high = mid;
            }
        }
        low
    }

    /// Drops the oldest entry.
    pub(crate) fn pop_front(&mut self) {
        match self.len {
            0 => {}
            1 => self.clear(),
            _ => {
                self.head = u32::try_from(self.slot(1)).unwrap_or(0);
                self.len -= 1;
                self.oldest = self.buf.get(self.head as usize).copied().unwrap_or(0);
            }
        }
    }

    /// Drops the newest entry.
    pub(crate) fn pop_back(&mut self) {
        match self.len {
            0 => {}
            1 => self.clear(),
            _ => {
                self.len -= 1;
                let last = self.slot(self.len() - 1);
                self.newest = self.buf.get(last).copied().unwrap_or(0);
            }
        }
    }

    /// Drops every entry, keeping the ring.
    fn clear(&mut self) {
        *self = Log {
            buf: std::mem::take(&mut self.buf),
            ..Log::default()
        };
    }

    /// Drops the oldest entries while `gone` holds for them (it must hold
    /// for a prefix of the log); then gives back memory if the ring is
    /// mostly empty. (A ring left empty is kept whole: its budget's next
    /// request most likely comes at the same rate as its last ones, and a
    /// budget that does not come back is swept whole.)
    pub(crate) fn trim(&mut self, mut gone: impl FnMut(u64) -> bool) {
        if self.len == 0 || !gone(self.oldest) {
            return;
        }
        if gone(self.newest) {
            // All of them: nothing in the ring need be read.
            self.clear();
            return;
        }
        // The newest stays; the oldest that stays is found from the front.
        let mut dropped = 1;
        while self.get(dropped).is_some_and(&mut gone) {
            dropped += 1;
        }
        self.head = u32::try_from(self.slot(dropped)).unwrap_or(0);
        self.len -= u32::try_from(dropped).unwrap_or(0);
        self.oldest = self.buf.get(self.head as usize).copied().unwrap_or(0);
        if self.buf.len() > 4 * self.len().max(MIN_CAPACITY) {
            self.reallocate(2 * self.len().max(MIN_CAPACITY));
        }
    }

    /// Adds `t` after the newest entry (`t` must be above it).
    pub(crate) fn push_back(&mut self, t: u64) {
        if self.len() == self.buf.len() && !self.grow() {
            // (Unreachable under any rule: see the type's docs.)
            self.pop_front();
        }
        let slot = self.slot(self.len());
        if let Some(s) = self.buf.get_mut(slot) {
            *s = t;
        }
        if self.len == 0 {
            self.oldest = t;
        }
        self.newest = t;
        self.len += 1;
    }

    /// Adds entries after the newest, in order (each above the last).
    pub(crate) fn extend(&mut self, ts: impl IntoIterator<Item = u64>) {
        for t in ts {
            self.push_back(t);
        }
    }

    /// Inserts `t` so that it becomes the `i`-th oldest entry (the log
    /// must stay sorted and distinct).
    pub(crate) fn insert(&mut self, i: usize, t: u64) {
        let len = self.len();
        if i >= len {
            self.push_back(t);
            return;
        }
        if len == self.buf.len() && !self.grow() {
            // (Unreachable under any rule: see the type's docs.)
            return;
        }
        // Move entries i.. one slot up, newest first.
        for k in (i..len).rev() {
            let (from, to) = (self.slot(k), self.slot(k + 1));
            if let Some(&e) = self.buf.get(from) {
                if let Some(s) = self.buf.get_mut(to) {
                    *s = e;
                }
            }
        }
        let slot = self.slot(i);
        if let Some(s) = self.buf.get_mut(slot) {
            *s = t;
        }
        if i == 0 {
            self.oldest = t;
        }
        self.len += 1;
    }

    /// Doubles the ring; false when it cannot hold more entries.
    #[cold]
    fn grow(&mut self) -> bool {
        if self.len == u32::MAX {
            return false;
        }
        let capacity = (2 * self.buf.len())
            .clamp(MIN_CAPACITY, u32::MAX as usize)
            .max(self.len() + 1);
        self.reallocate(capacity);
        true
    }

    /// Moves the entries into a ring of `capacity` slots, oldest in slot 0.
    #[cold]
    fn reallocate(&mut self, capacity: usize) {
        let mut buf = vec![0u64; capacity.max(self.len())].into_boxed_slice();
        for (k, s) in buf.iter_mut().enumerate().take(self.len()) {
            *s = self.buf.get(self.slot(k)).copied().unwrap_or(0);
        }
        self.buf = buf;
        self.head = 0;
    }

    /// The entries, oldest first.
    #[cfg(test)]
    pub(crate) fn to_vec(&self) -> Vec<u64> {
        (0..self.len()).filter_map(|i| self.get(i)).collect()
    }

    /// The ring's capacity.
    #[cfg(test)]
    fn capacity(&self) -> usize {
        self.buf.len()
    }
}

#[cfg(test)]
impl FromIterator<u64> for Log {
    fn from_iter<I: IntoIterator<Item = u64>>(ts: I) -> Self {
        let mut log = Log::default();
        log.extend(ts);
        log
    }
}

/// Two logs are equal when they hold the same entries (whatever their
/// rings' capacity and layout).
#[cfg(test)]
impl PartialEq for Log {
    fn eq(&self, other: &Self) -> bool {
        self.len == other.len && (0..self.len()).all(|i| self.get(i) == other.get(i))
    }
}

#[cfg(test)]
impl Eq for Log {}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::VecDeque;

    #[derive(Clone, Debug)]
    enum Op {
        Push(u64),
        Pop,
        PopBack,
        Trim(u64),
        Insert(usize, u64),
    }

    fn op() -> impl proptest::strategy::Strategy<Value = Op> {
        use proptest::prelude::*;
        prop_oneof![
            4 => (1u64..20).prop_map(Op::Push),
            1 => Just(Op::Pop),
            1 => Just(Op::PopBack),
            1 => (0u64..40).prop_map(Op::Trim),
            1 => (0usize..50, 0u64..4).prop_map(|(i, d)| Op::Insert(i, d)),
        ]
    }

    proptest::proptest! {
        /// Every operation leaves the log holding what a plain `VecDeque`
        /// holds after it, and every read answers as the `VecDeque` does,
        /// across growth, wrap-around and shrinking.
        #[test]
        fn matches_a_plain_deque(ops in proptest::collection::vec(op(), 0..300)) {
            let mut log = Log::default();
            let mut model: VecDeque<u64> = VecDeque::new();
            let mut clock = 100u64;
            for op in ops {
                match op {
                    Op::Push(step) => {
                        clock += step;
                        log.push_back(clock);
                        model.push_back(clock);
                    }
                    Op::Pop => {
                        log.pop_front();
                        model.pop_front();
                    }
                    Op::PopBack => {
                        log.pop_back();
                        model.pop_back();
                    }
                    Op::Trim(back) => {
                        let cut = clock.saturating_sub(back);
                        log.trim(|t| t < cut);
                        while model.front().is_some_and(|&t| t < cut) {
                            model.pop_front();
                        }
                    }
                    Op::Insert(i, d) => {
                        // A free timestamp that keeps the log sorted: just
                        // after the entry before `i`, if free.
                        let i = i.min(model.len());
                        let t = if i == 0 {
                            model.front().map_or(clock, |&f| f.saturating_sub(d + 1))
                        } else {
                            model[i - 1] + 1
                        };
                        let free = model.get(i).is_none_or(|&next| t < next)
                            && (i == 0 || model[i - 1] < t);
                        if free {
                            log.insert(i, t);
                            model.insert(i, t);
                            clock = clock.max(t);
                        }
                    }
                }
                proptest::prop_assert_eq!(log.len(), model.len());
                proptest::prop_assert_eq!(log.front(), model.front().copied());
                proptest::prop_assert_eq!(log.back(), model.back().copied());
                proptest::prop_assert_eq!(log.to_vec(), model.iter().copied().collect::<Vec<_>>());
                for i in 0..=model.len() {
                    proptest::prop_assert_eq!(log.get(i), model.get(i).copied());
                }
                for cut in [0, 100, clock / 2 + 50, clock, clock + 1] {
                    proptest::prop_assert_eq!(
                        log.partition_point(|t| t < cut),
                        model.partition_point(|&t| t < cut)
                    );
                }
                proptest::prop_assert!(log.capacity() >= log.len());
            }
        }
    }

    #[test]
    fn a_ring_gives_memory_back_once_mostly_empty() {
        let mut log: Log = (1..=1000).collect();
        assert!(log.capacity() >= 1000);
        log.trim(|t| t <= 990);
        assert_eq!(log.to_vec(), (991..=1000).collect::<Vec<_>>());
        assert!(log.capacity() <= 4 * 10, "{}", log.capacity());
        // Emptied, it keeps its ring for the budget's next requests.
        let kept = log.capacity();
        log.trim(|_| true);
        assert_eq!(log.len(), 0);
        assert_eq!(log.capacity(), kept);
        assert_eq!((log.front(), log.back()), (None, None));
    }

    #[test]
    fn a_log_is_40_bytes() {
        assert_eq!(std::mem::size_of::<Log>(), 40);
    }
}
