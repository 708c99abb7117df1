//! The masters of a Cluster the store made, watched on connections of the
//! store's own (see [`Watch`]).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use arc_swap::{ArcSwap, ArcSwapOption};
use redis::aio::MultiplexedConnection;
use redis::{
    AsyncConnectionConfig, ConnectionAddr, ConnectionInfo, IntoConnectionInfo, RedisError, Value,
};

/// A node, by the (host, port) the Cluster names it by.
pub(super) type Node = (String, u16);

/// How many slots a Cluster has.
const SLOTS: u16 = 16_384;

/// The pause between two rounds of [`Watch`]'s task.
const ROUND_EVERY: Duration = Duration::from_millis(250);

/// How long a held master that no connection is open to is left before it
/// is dialed again (a master that hangs leaves each connection in its
/// queue).
const DIAL_EVERY: Duration = Duration::from_millis(500);

/// How long after a held master's slots moved (the Cluster promoted its
/// replica) the store replaces its Cluster client without first asking
/// the kept one (see [`Watch::moved_lately`]).
const MOVED_SPAN: Duration = Duration::from_secs(5);

/// The least time a master is given to answer a `PING`: a master that is
/// only slow is not held.
const LEAST_ANSWER: Duration = Duration::from_millis(250);

/// Which master serves each slot, as the Cluster said when last asked, and
/// which of them are held.
#[derive(Clone, Default)]
pub(super) struct Map {
    /// (first slot, last slot, index in `nodes`), by first slot.
    ranges: Vec<(u16, u16, usize)>,
    nodes: Vec<Node>,
    /// By index in `nodes`: whether the master answers nothing.
    held: Vec<bool>,
    /// By index in `nodes`: whether the round that made this map asked
    /// the master, and when it was put in use.
    asked: Vec<bool>,
    /// By index in `nodes`: the master's failure domain (see
    /// [`Watch::domain_of`]), given when the map is put in use.
    domains: Vec<u32>,
    at: Option<tokio::time::Instant>,
}

impl Map {
    /// The index in `nodes` of the master of `slot`.
    fn node_of(&self, slot: u16) -> Option<usize> {
        let i = self
            .ranges
            .partition_point(|r| r.0 <= slot)
            .checked_sub(1)?;
        let &(_, last, node) = self.ranges.get(i)?;
        (slot <= last).then_some(node)
    }

    /// Marks `asked` (indexes in `nodes`) as asked by the round that made
    /// this map, and no other.
    fn mark_asked(&mut self, asked: &[usize]) {
        self.asked = vec![false; self.nodes.len()];
        for &i in asked {
            if let Some(a) = self.asked.get_mut(i) {
                *a = true;
            }
        }
    }

    fn held_nodes(&self) -> impl Iterator<Item = &Node> {
        self.nodes
            .iter()
            .zip(&self.held)
            .filter_map(|(node, held)| held.then_some(node))
    }
}

/// A breaker per master of a Cluster the store made.
///
/// redis-rs' Cluster client waits on a master that takes connections and
/// answers nothing (a stopped process, a node behind a partition) whenever
/// it connects to it, as when it refreshes its slots, and a client that
/// holds no connection to it (one made while it hangs, or whose slots were
/// refreshed meanwhile) is sent elsewhere by each check of its slots, and
/// refreshes them: every master's checks then wait. So the store reads the
/// slots itself (`CLUSTER SLOTS`) and asks the masters a `PING`, on
/// connections of its own: every master as it connects, and every master
/// again when a check fails. A master that answers nothing in time (its
/// connection or its `PING` times out, or it refuses connections) is
/// *held*: the checks of its slots fail at once (the fail mode applies),
/// without reaching the client, until it answers again or its slots move
/// to another master (the slots read and the held masters asked a round at
/// a time, 250 ms apart).
pub(super) struct Watch {
    /// The connection settings of the Cluster's first URL (its user,
    /// password and TLS), given each node's address.
    base: ConnectionInfo,
    /// The nodes the store was given (their URLs, and the nodes they
    /// name), asked for the slots when no node the watch holds a connection
    /// to answers.
    seeds: Vec<(String, Node)>,
    /// The masters held in the last few seconds, and when they last were
    /// (see [`answering_seeds`](Self::answering_seeds)).
    lately_held: ArcSwap<Vec<(Node, tokio::time::Instant)>>,
    map: ArcSwap<Map>,
    /// Whether any master is held: all a check reads while none is.
    any_held: AtomicBool,
    /// Whether a check failed since the last round took it: the next one
    /// asks every master.
    suspected: AtomicBool,
    /// Whether the task runs.
    running: AtomicBool,
    /// How many rounds the task has finished (see [`verdict`](Self::verdict)).
    rounds: tokio::sync::watch::Sender<u64>,
    /// Whether a slot map refused (an ACL that denies `CLUSTER SLOTS`) was
    /// logged.
    told_unmapped: AtomicBool,
    /// When a held master's slots last moved to another master, if they
    /// did.
    moved_at: ArcSwapOption<tokio::time::Instant>,
    /// The failure domain of each master the slots name (see
    /// [`give_domains`](Self::give_domains)).
    domains: std::sync::Mutex<Domains>,
    /// Each failure domain's master's clock, by its number (see
    /// [`clock`](Self::clock)).
    clocks: Box<[super::ServerClock]>,
    /// Held while a map is put in use (see [`adopt`](Self::adopt)).
    publishing: std::sync::Mutex<()>,
    connect_timeout: Duration,
    answer_timeout: Duration,
}

/// The failure domains of a Cluster's masters (see
/// [`Watch::give_domains`]).
#[derive(Default)]
struct Domains {
    of: HashMap<Node, u32>,
    /// Where the next new master's number is looked for from.
    next: u32,
}

/// The watch task's own: its connections, by node, and when it last
/// tried to connect to each held master it holds none to.
#[derive(Default)]
struct Conns {
    open: HashMap<Node, MultiplexedConnection>,
    dialed: HashMap<Node, tokio::time::Instant>,
    /// `PING`s in a row left unanswered on the open connection to a node:
    /// at [`SILENT_PINGS`] it is dropped and made again (a connection a
    /// partition or a forgetful NAT left dead stays silent for good, however
    /// the master fares).
    silent: HashMap<Node, u32>,
}

/// See [`Conns::silent`].
const SILENT_PINGS: u32 = 2;

/// What asking a master found.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Heard {
    Answer,
    Silence,
    /// Nothing that tells (an error other than silence, or a timer that
    /// fired late, the runtime stalled): the master is not held for it.
    Unknown,
}

impl Watch {
    /// A watch of the Cluster reached with `base`'s settings at `seeds`,
    /// or `None` when `base` is not a TCP address; `timeout` is the
    /// store's response timeout.
    pub(super) fn new(
        base: ConnectionInfo,
        seeds: Vec<(String, Node)>,
        connect_timeout: Duration,
        timeout: Duration,
    ) -> Option<Arc<Self>> {
        if matches!(base.addr(), ConnectionAddr::Unix(_)) {
            return None;
        }
        Some(Arc::new(Self {
            base,
            seeds,
            lately_held: ArcSwap::default(),
            map: ArcSwap::default(),
            any_held: AtomicBool::new(false),
            suspected: AtomicBool::new(false),
            running: AtomicBool::new(false),
            rounds: tokio::sync::watch::Sender::new(0),
            told_unmapped: AtomicBool::new(false),
            moved_at: ArcSwapOption::empty(),
            domains: std::sync::Mutex::default(),
            clocks: (0..64).map(|_| super::ServerClock::new()).collect(),
            publishing: std::sync::Mutex::new(()),
            connect_timeout,
            answer_timeout: timeout.saturating_mul(2).max(LEAST_ANSWER),
        }))
    }

    /// A watch that keeps only the slot map (the masters' failure domains
    /// and clocks), from the `CLUSTER SLOTS` answers given to it (see
    /// [`adopt`](Self::adopt)): for a caller's Cluster pool, whose nodes'
    /// settings the store does not know. It never connects, and holds no
    /// master.
    pub(super) fn map_only() -> Option<Arc<Self>> {
        let base = ConnectionAddr::Tcp("127.0.0.1".to_owned(), 0)
            .into_connection_info()
            .ok()?;
        Self::new(base, Vec::new(), Duration::ZERO, Duration::ZERO)
    }

    /// The map in use, to give [`adopt`](Self::adopt) with an answer
    /// asked for after this.
    pub(super) fn current(&self) -> Arc<Map> {
        self.map.load_full()
    }

    /// Puts in use the map of a `CLUSTER SLOTS` answer (of a node the
    /// store cannot name), asked for while `seen` was in use; unless
    /// another was put in use since (the watch's own round, which may hold
    /// a master), a master is held, it is the one in use, or it names a
    /// master by the node asked (an empty host: unknown here).
    pub(super) fn adopt(&self, answer: Value, seen: &Arc<Map>) {
        let Some(map) = parse_slots(answer, "") else {
            return;
        };
        if map.nodes.iter().any(|(host, _)| host.is_empty()) {
            return;
        }
        let _publishing = self
            .publishing
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let old = self.map.load();
        if !Arc::ptr_eq(&old, seen) || self.any_held() {
            return;
        }
        if old.ranges != map.ranges || old.nodes != map.nodes {
            drop(old);
            self.publish_locked(map);
        }
    }

    /// Whether any master is held (one relaxed load).
    #[inline]
    pub(super) fn any_held(&self) -> bool {
        self.any_held.load(Ordering::Relaxed)
    }

    /// The held master that serves `key`'s slot, if it is held.
    #[inline]
    pub(super) fn holding(&self, key: &[u8]) -> Option<Node> {
        if !self.any_held() {
            return None;
        }
        self.held_at(key_slot(key))
    }

    /// Whether the master of `slot` is held.
    pub(super) fn holds_slot(&self, slot: u16) -> bool {
        self.any_held() && self.held_at(slot).is_some()
    }

    /// The failure domain of `slot` (see `Store::failure_domain`): its
    /// master's (1 to 63, each master its own until 63 have been seen;
    /// a replica promoted in a master's place is another), or 0 when the
    /// slots read last name none for it.
    pub(super) fn domain_of(&self, slot: u16) -> u32 {
        let map = self.map.load();
        map.node_of(slot)
            .and_then(|i| map.domains.get(i))
            .copied()
            .unwrap_or(0)
    }

    /// The clock of failure domain `domain`'s master (see
    /// `ServerClock`): a check's deadline on a Cluster rides on the clock of
    /// the master that runs it, as each node keeps its own. `None` for
    /// domain 0 (no master known).
    pub(super) fn clock(&self, domain: u32) -> Option<&super::ServerClock> {
        match domain {
            0 => None,
            d => self.clocks.get(usize::try_from(d).ok()?),
        }
    }

    /// The masters whose clock is due a reading (see
    /// `ServerClock::stale`), by failure domain, each with the first slot
    /// it serves; not the held ones.
    pub(super) fn clocks_due(&self) -> Vec<(u32, u16)> {
        let map = self.map.load();
        let mut due: Vec<(u32, u16)> = Vec::new();
        for &(first, _, node) in &map.ranges {
            let domain = map.domains.get(node).copied().unwrap_or(0);
            let held = map.held.get(node) == Some(&true);
            let stale = self.clock(domain).is_some_and(|c| c.stale());
            if stale && !held && !due.iter().any(|&(d, _)| d == domain) {
                due.push((domain, first));
            }
        }
        due
    }

    /// Whether the slots name a master, and every master they name has
    /// its clock read, but the held ones (see `RedisStore::deadlines_known`).
    pub(super) fn clocks_known(&self) -> bool {
        let map = self.map.load();
        !map.ranges.is_empty()
            && map.ranges.iter().all(|&(_, _, node)| {
                let domain = map.domains.get(node).copied().unwrap_or(0);
                map.held.get(node) == Some(&true)
                    || self.clock(domain).is_some_and(super::ServerClock::known)
            })
    }

    /// The master of failure domain `domain`, if the slots name one.
    pub(super) fn domain_node(&self, domain: u32) -> Option<Node> {
        let domains = self
            .domains
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        domains
            .of
            .iter()
            .find_map(|(node, &d)| (d == domain).then(|| node.clone()))
    }

    /// `map`'s masters' failure domains: each keeps its own while the
    /// slots name it; a new one takes the next number from 1 to 63 round
    /// and round that no master of the map holds (so a replica promoted in
    /// a master's place is another part, and none shares a live master's
    /// until a Cluster has more than 63 masters); one the slots no longer
    /// name is forgotten.
    fn give_domains(&self, map: &mut Map) {
        let mut domains = self
            .domains
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let Domains { of, next } = &mut *domains;
        of.retain(|node, _| map.nodes.contains(node));
        let mut used: u64 = of.values().fold(0, |used, &d| used | 1 << (d % 64));
        map.domains = map
            .nodes
            .iter()
            .map(|node| {
                if let Some(&d) = of.get(node) {
                    return d;
                }
                let mut d = *next % 63 + 1;
                for _ in 0..63 {
                    if used & 1 << d == 0 {
                        break;
                    }
                    *next = next.wrapping_add(1);
                    d = *next % 63 + 1;
                }
                *next = next.wrapping_add(1);
                used |= 1 << d;
                of.insert(node.clone(), d);
                // (Another node's clock, if the number was used before.)
                if let Some(clock) = self.clock(d) {
                    clock.doubt();
                }
                d
            })
            .collect();
    }

    /// The masters held now.
    pub(super) fn held_nodes(&self) -> Vec<Node> {
        match self.any_held() {
            true => self.map.load().held_nodes().cloned().collect(),
            false => Vec::new(),
        }
    }

    #[cold]
    fn held_at(&self, slot: u16) -> Option<Node> {
        let map = self.map.load();
        let node = map.node_of(slot)?;
        match map.held.get(node) {
            Some(true) => map.nodes.get(node).cloned(),
            _ => None,
        }
    }

    /// A check failed: the masters are asked whether they answer.
    #[cold]
    pub(super) fn suspect(self: &Arc<Self>) {
        // (Sequentially consistent with the task's clearing of `running`
        // and its look at this flag: one of the two sees the other.)
        self.suspected.store(true, Ordering::SeqCst);
        if !self.running.load(Ordering::SeqCst) {
            self.start();
        }
    }

    /// Whether the master of `key`'s slot is held once a round that began
    /// after this call has asked it (within twice a round's longest time):
    /// for the store's reconnects, which must not ask the client of a
    /// master that hangs before the watch has had its say.
    pub(super) async fn verdict(self: &Arc<Self>, key: &[u8]) -> bool {
        // (Told by the last round, if it asked that master a moment ago.)
        let map = self.map.load_full();
        if let (Some(at), Some(node)) = (map.at, map.node_of(key_slot(key))) {
            if at.elapsed() <= ROUND_EVERY && map.asked.get(node) == Some(&true) {
                return map.held.get(node) == Some(&true);
            }
        }
        let mut rounds = self.rounds.subscribe();
        // (A round under way may have begun before this call: the next one
        // after it asks the masters.)
        let wanted = rounds.borrow_and_update().saturating_add(2);
        self.suspect();
        // (A round's longest: the slots read on the kept connections one
        // by one, then on new ones, and the masters asked on new ones.)
        let dial = self.connect_timeout + self.answer_timeout;
        let round = ROUND_EVERY + dial.saturating_mul(3);
        let _ =
            tokio::time::timeout(round.saturating_mul(2), rounds.wait_for(|&n| n >= wanted)).await;
        self.holding(key).is_some()
    }

    /// Whether a held master's slots moved to another master (the Cluster
    /// promoted its replica) in the last few seconds: the Cluster client
    /// may still send their checks to it, as redis-rs learns of no
    /// failover from a master that answers nothing, and is better replaced
    /// at once than asked.
    pub(super) fn moved_lately(&self) -> bool {
        self.moved_at
            .load()
            .as_deref()
            .is_some_and(|at| at.elapsed() < MOVED_SPAN)
    }

    /// The nodes a new Cluster client is best made on, when they differ
    /// from the seeds the store was given (`None` otherwise): the masters
    /// the slots name now that are not held, then the seeds, leaving out
    /// those held in the last few seconds. A new Cluster client connects to
    /// every node it is given, and waits on one that hangs for its
    /// connection timeout; and a client made on seeds that all hang (one
    /// seed, the master that hangs) reaches no node to learn of its
    /// promoted replica. Nodes the seeds do not name take the first seed's
    /// settings (its user, password and TLS).
    pub(super) fn answering_seeds(&self) -> Option<Vec<String>> {
        let lately = self.lately_held.load();
        let recent = |node: &Node| {
            lately
                .iter()
                .any(|(n, at)| n == node && at.elapsed() < MOVED_SPAN)
        };
        let (first, _) = self.seeds.first()?;
        let map = self.map.load();
        let mut urls: Vec<String> = Vec::new();
        let mut changed = false;
        for (node, held) in map.nodes.iter().zip(&map.held) {
            if *held || recent(node) {
                continue;
            }
            match self.seeds.iter().find(|(_, seed)| seed == node) {
                Some((url, _)) => urls.push(url.clone()),
                None => {
                    if let Some(url) = url_at(first, node) {
                        urls.push(url);
                        changed = true;
                    }
                }
            }
        }
        for (url, node) in &self.seeds {
            if recent(node) {
                changed = true;
            } else if !urls.contains(url) {
                urls.push(url.clone());
            }
        }
        (changed && !urls.is_empty()).then_some(urls)
    }

    /// Reads the slots and asks every master: called as the store
    /// connects, so that a master that hangs already is held before the
    /// first check of its slots.
    pub(super) async fn survey(self: &Arc<Self>) {
        let mut conns = Conns::default();
        let Some(mut map) = self.read_map(&mut conns, &Map::default()).await else {
            return;
        };
        let everyone: Vec<usize> = (0..map.nodes.len()).collect();
        map.held = self.ask(&mut conns, &map, &everyone, &[]).await;
        map.mark_asked(&everyone);
        if self.publish(map) {
            self.start();
        }
    }

    /// Starts the task, unless it runs: rounds every [`ROUND_EVERY`] while
    /// a master is held or suspected; it ends with the store.
    fn start(self: &Arc<Self>) {
        if self.running.swap(true, Ordering::SeqCst) {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            self.running.store(false, Ordering::Release);
            return;
        };
        let guard = Running {
            watch: Arc::downgrade(self),
            done: false,
        };
        runtime.spawn(async move {
            let mut conns = Conns::default();
            loop {
                let Some(this) = guard.watch.upgrade() else {
                    return;
                };
                let worked = this.round(&mut conns).await;
                this.rounds.send_modify(|n| *n = n.wrapping_add(1));
                if !worked {
                    this.running.store(false, Ordering::SeqCst);
                    // (A check that failed after the round began, before
                    // the flag was cleared, would wait for no one.)
                    let waiting = this.suspected.load(Ordering::SeqCst);
                    if !waiting || this.running.swap(true, Ordering::SeqCst) {
                        guard.disarm();
                        return;
                    }
                }
                drop(this);
                tokio::time::sleep(ROUND_EVERY).await;
            }
        });
    }

    /// One round: the slots read again (a held master's move to its
    /// replica when the Cluster promotes it), and the masters asked (every
    /// one when a check failed since the last round, else the held ones).
    /// False when there was nothing to do.
    async fn round(&self, conns: &mut Conns) -> bool {
        let suspected = self.suspected.swap(false, Ordering::SeqCst);
        let old = self.map.load_full();
        let held: Vec<Node> = old.held_nodes().cloned().collect();
        if !suspected && held.is_empty() {
            return false;
        }
        let mut map = match self.read_map(conns, &old).await {
            Some(map) => map,
            None => Map::clone(&old),
        };
        // (Every master when a check failed: the one that hangs may not be
        // the failed check's, as when a refresh of the client's slots
        // waited on it and held every check back.)
        let asked: Vec<usize> = (0..map.nodes.len())
            .filter(|&i| suspected || map.nodes.get(i).is_some_and(|n| held.contains(n)))
            .collect();
        map.held = self.ask(conns, &map, &asked, &held).await;
        // (A held master whose slots moved is asked no more: its
        // connection, which may be silent, is not asked for slots either.)
        for node in held.iter().filter(|n| !map.nodes.contains(n)) {
            conns.open.remove(node);
            conns.silent.remove(node);
            conns.dialed.remove(node);
        }
        map.mark_asked(&asked);
        self.publish(map);
        true
    }

    /// Puts `map` in use, saying which masters it holds and lets go of;
    /// whether it holds any.
    fn publish(&self, map: Map) -> bool {
        let _publishing = self
            .publishing
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        self.publish_locked(map)
    }

    /// [`publish`](Self::publish), `publishing` held.
    fn publish_locked(&self, mut map: Map) -> bool {
        let old = self.map.load();
        map.at = Some(tokio::time::Instant::now());
        self.give_domains(&mut map);
        for node in map.held_nodes() {
            if !old.held_nodes().any(|n| n == node) {
                tracing::warn!(
                    master = %name(node),
                    "a redis cluster master answers nothing: the checks of its slots fail at once (the fail mode applies) until it answers or its slots move"
                );
            }
        }
        for node in old.held_nodes() {
            if !map.nodes.contains(node) {
                self.moved_at
                    .store(Some(Arc::new(tokio::time::Instant::now())));
            }
            if !map.held_nodes().any(|n| n == node) {
                tracing::info!(
                    master = %name(node),
                    "a held redis cluster master {}",
                    if map.nodes.contains(node) { "answers again" } else { "serves no slot any more" }
                );
            }
        }
        let any = map.held.iter().any(|&h| h);
        let now = tokio::time::Instant::now();
        let lately = self.lately_held.load();
        if any || !lately.is_empty() {
            let mut still: Vec<(Node, tokio::time::Instant)> = lately
                .iter()
                .filter(|(node, at)| {
                    at.elapsed() < MOVED_SPAN && !map.held_nodes().any(|n| n == node)
                })
                .cloned()
                .collect();
            still.extend(map.held_nodes().map(|n| (n.clone(), now)));
            self.lately_held.store(Arc::new(still));
        }
        self.map.store(Arc::new(map));
        self.any_held.store(any, Ordering::Relaxed);
        any
    }

    /// By index in `map.nodes`: whether each of `asked` is held after
    /// being asked a `PING` on a connection of the watch's own. A master
    /// that was held (in `held`) stays so when nothing tells, and when it
    /// was dialed less than half a second ago and no connection to it is open
    /// (a master that hangs leaves each connection in its queue); the
    /// others are not held.
    async fn ask(&self, conns: &mut Conns, map: &Map, asked: &[usize], held: &[Node]) -> Vec<bool> {
        let now = tokio::time::Instant::now();
        let pings = asked.iter().filter_map(|&i| {
            let node = map.nodes.get(i)?.clone();
            let was_held = held.contains(&node);
            let conn = conns.open.remove(&node);
            let recent = conns
                .dialed
                .get(&node)
                .is_some_and(|at| now.duration_since(*at) < DIAL_EVERY);
            if was_held && conn.is_none() && recent {
                return None;
            }
            Some(async move {
                let (conn, heard, dialed) = self.ping(&node, conn, !was_held).await;
                (i, node, conn, heard, dialed)
            })
        });
        let answers = futures_util::future::join_all(pings).await;
        let mut verdicts: Vec<bool> = map.nodes.iter().map(|n| held.contains(n)).collect();
        for (i, node, conn, heard, dialed) in answers {
            if dialed {
                conns.dialed.insert(node.clone(), now);
            }
            if let Some(verdict) = verdicts.get_mut(i) {
                *verdict = match heard {
                    Heard::Answer => false,
                    Heard::Silence => true,
                    Heard::Unknown => *verdict,
                };
            }
            let silences = match heard {
                Heard::Silence => {
                    let n = conns.silent.entry(node.clone()).or_default();
                    *n += 1;
                    *n
                }
                _ => conns.silent.remove(&node).map_or(0, |_| 0),
            };
            let dead = silences >= SILENT_PINGS;
            if dead {
                conns.silent.remove(&node);
            }
            if let Some(conn) = conn.filter(|_| !dead) {
                conns.open.insert(node, conn);
            }
        }
        // (Not held: those not asked and not held before.)
        verdicts
    }

    /// What `node` answers a `PING` on `conn`, or on a new connection
    /// when there is none, it broke, or it is silent to a master that was
    /// `answering`; the connection to keep, and whether one was dialed. Any
    /// answer counts, an error too (a master loading its data, a command
    /// refused); silence is a timeout (of the connection or the `PING`)
    /// or a connection refused.
    async fn ping(
        &self,
        node: &Node,
        conn: Option<MultiplexedConnection>,
        answering: bool,
    ) -> (Option<MultiplexedConnection>, Heard, bool) {
        if let Some(mut conn) = conn {
            match self.ping_on(&mut conn).await {
                // (A connection that broke is made again; so is one silent
                // to a master that answered until now, before it is held:
                // a connection a firewall dropped without a word stays
                // silent, whatever the master does.)
                Err(()) => {}
                Ok(Heard::Silence) if answering => {}
                Ok(heard) => return (Some(conn), heard, false),
            }
        }
        let (conn, heard) = self.dial_and_ping(node).await;
        (conn, heard, true)
    }

    /// [`ping`](Self::ping) on a new connection.
    async fn dial_and_ping(&self, node: &Node) -> (Option<MultiplexedConnection>, Heard) {
        let started = tokio::time::Instant::now();
        let mut conn = match self.connect(node).await {
            Ok(conn) => conn,
            Err(e) if e.is_connection_refusal() => return (None, Heard::Silence),
            Err(e) if e.is_timeout() => {
                return (None, self.timed_out(started, self.connect_timeout))
            }
            Err(_) => return (None, Heard::Unknown),
        };
        match self.ping_on(&mut conn).await {
            Ok(heard) => (Some(conn), heard),
            Err(()) => (None, Heard::Unknown),
        }
    }

    /// What a `PING` on `conn` hears; `Err` when the connection broke.
    async fn ping_on(&self, conn: &mut MultiplexedConnection) -> Result<Heard, ()> {
        let cmd = redis::cmd("PING");
        let started = tokio::time::Instant::now();
        let ping = cmd.query_async::<Value>(conn);
        match tokio::time::timeout(self.answer_timeout, ping).await {
            Ok(Ok(_)) => Ok(Heard::Answer),
            Ok(Err(e)) if e.is_timeout() => Ok(self.timed_out(started, Duration::ZERO)),
            Ok(Err(e)) if e.is_io_error() || e.is_connection_dropped() => Err(()),
            Ok(Err(_)) => Ok(Heard::Answer),
            // (Kept while it only waits: the next round's `PING` goes after
            // this one, not on another connection left in the queue of the
            // silent master.)
            Err(_) => Ok(self.timed_out(started, Duration::ZERO)),
        }
    }

    /// Silence, after a wait begun at `started` and bounded by `extra` and
    /// the answer timeout, unless the timer fired late (the runtime
    /// stalled, and the answer may be waiting unread).
    fn timed_out(&self, started: tokio::time::Instant, extra: Duration) -> Heard {
        let bound = extra + self.answer_timeout;
        match started.elapsed() > bound + bound / 2 {
            true => Heard::Unknown,
            false => Heard::Silence,
        }
    }

    /// A connection of the watch's own to `node`, with the store's
    /// settings, bounded as a whole (a node that takes connections and
    /// answers nothing never finishes their handshake).
    async fn connect(&self, node: &Node) -> Result<MultiplexedConnection, RedisError> {
        let addr = match self.base.addr() {
            ConnectionAddr::TcpTls {
                insecure,
                tls_params,
                ..
            } => ConnectionAddr::TcpTls {
                host: node.0.clone(),
                port: node.1,
                insecure: *insecure,
                tls_params: tls_params.clone(),
            },
            _ => ConnectionAddr::Tcp(node.0.clone(), node.1),
        };
        let client = redis::Client::open(self.base.clone().set_addr(addr))?;
        let config = AsyncConnectionConfig::new()
            .set_connection_timeout(Some(self.connect_timeout))
            .set_response_timeout(Some(self.answer_timeout));
        let bound = self.connect_timeout + self.answer_timeout;
        tokio::time::timeout(
            bound,
            client.get_multiplexed_async_connection_with_config(&config),
        )
        .await
        .unwrap_or_else(|_| {
            Err(super::io_error(
                std::io::ErrorKind::TimedOut,
                "connecting to a cluster node timed out".to_owned(),
            ))
        })
    }

    /// The slots as a node the watch holds a connection to (not a held
    /// master of `old`), or else any of the seeds (asked together, the
    /// first answer taken), says they are.
    async fn read_map(&self, conns: &mut Conns, old: &Map) -> Option<Map> {
        let kept: Vec<Node> = conns
            .open
            .keys()
            .filter(|node| !old.held_nodes().any(|held| held == *node))
            .cloned()
            .collect();
        for node in kept {
            let Some(mut conn) = conns.open.remove(&node) else {
                continue;
            };
            if let Some(map) = self.slots(&mut conn, &node).await {
                conns.open.insert(node, conn);
                return Some(map);
            }
        }
        // (The seeds, and the masters last known that are not held: the
        // seeds may be gone since.)
        let mut candidates: Vec<&Node> = self.seeds.iter().map(|(_, node)| node).collect();
        for (node, held) in old.nodes.iter().zip(&old.held) {
            if !held && !candidates.contains(&node) {
                candidates.push(node);
            }
        }
        let asks = candidates.into_iter().map(|node| {
            Box::pin(async move {
                let mut conn = self.connect(node).await.map_err(drop)?;
                let map = self.slots(&mut conn, node).await.ok_or(())?;
                Ok::<_, ()>((node.clone(), conn, map))
            })
        });
        let ((node, conn, map), _) = futures_util::future::select_ok(asks).await.ok()?;
        conns.open.insert(node, conn);
        Some(map)
    }

    /// `CLUSTER SLOTS` on `conn` (to `node`), within the answer timeout; an
    /// error answered (an ACL's refusal) is logged once: no master is held
    /// while no map is read.
    async fn slots(&self, conn: &mut MultiplexedConnection, node: &Node) -> Option<Map> {
        let mut cmd = redis::cmd("CLUSTER");
        cmd.arg("SLOTS");
        let ask = cmd.query_async::<Value>(conn);
        match tokio::time::timeout(self.answer_timeout, ask).await {
            Ok(Ok(answer)) => parse_slots(answer, &node.0),
            Ok(Err(e)) => {
                self.refused(&e);
                None
            }
            Err(_) => None,
        }
    }

    /// Logs, once, a `CLUSTER SLOTS` answered with an error other than a
    /// broken connection or a timeout (an ACL's refusal): without the
    /// slots, a master that answers nothing is not found (it may hold every
    /// master's checks back), and the masters are one part for the
    /// fallback, their checks without a deadline.
    pub(super) fn refused(&self, e: &RedisError) {
        if e.kind() == redis::ErrorKind::Io || e.is_timeout() {
            return;
        }
        if !self.told_unmapped.swap(true, Ordering::Relaxed) {
            // (A server that is no Cluster node says so: the store's build
            // then fails with that error, and says why (NOT_A_CLUSTER), so
            // a warning of how a running store would fare only confuses.)
            if e.to_string().contains(super::NOT_A_CLUSTER_SIGN) {
                tracing::debug!(error = %e, "CLUSTER SLOTS refused: {}", super::NOT_A_CLUSTER);
                return;
            }
            tracing::warn!(
                error = %e,
                hint = "an ACL that denies it? allow the store's user `cluster|slots`",
                "CLUSTER SLOTS answered with an error: the store does not know which master serves which slot, so a master that answers nothing is not found, the masters fall back as one, and checks carry no deadline"
            );
        }
    }
}

/// Clears [`Watch::running`] and lets every held master go if the task
/// ends other than by its own choice (its runtime shut down): holds kept
/// with no task to lift them would fail their checks for good.
struct Running {
    watch: std::sync::Weak<Watch>,
    /// Set when the task ends by its own choice.
    done: bool,
}

impl Running {
    fn disarm(mut self) {
        self.done = true;
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        if self.done {
            return;
        }
        if let Some(watch) = self.watch.upgrade() {
            let mut map = Map::clone(&watch.map.load());
            map.held.iter_mut().for_each(|h| *h = false);
            watch.any_held.store(false, Ordering::Relaxed);
            watch.map.store(Arc::new(map));
            watch.running.store(false, Ordering::SeqCst);
        }
    }
}

/// The map a `CLUSTER SLOTS` answer gives (`None` for one that maps no
/// slot: a node that has not joined yet): each entry is `[first, last,
/// [host, port, id, ...], replicas ...]`; a host that is empty, null or a
/// wildcard address is the node asked (`asked`), as redis-rs takes it, and
/// `?` an unknown one (its slots left out).
fn parse_slots(answer: Value, asked: &str) -> Option<Map> {
    let Value::Array(entries) = answer else {
        return None;
    };
    let mut map = Map::default();
    for entry in entries {
        let Value::Array(entry) = entry else { continue };
        let mut fields = entry.into_iter();
        let (Some(Value::Int(first)), Some(Value::Int(last)), Some(Value::Array(master))) =
            (fields.next(), fields.next(), fields.next())
        else {
            continue;
        };
        let mut master = master.into_iter();
        let host = match master.next() {
            Some(Value::BulkString(host)) => match String::from_utf8(host) {
                Ok(host) => host,
                Err(_) => continue,
            },
            Some(Value::SimpleString(host)) => host,
            Some(Value::Nil) => String::new(),
            _ => continue,
        };
        let Some(Value::Int(port)) = master.next() else {
            continue;
        };
        let host = match host.as_str() {
            "" | "0.0.0.0" | "::" => asked.to_owned(),
            _ => host,
        };
        let (Ok(first), Ok(last), Ok(port)) = (
            u16::try_from(first),
            u16::try_from(last),
            u16::try_from(port),
        ) else {
            continue;
        };
        if host == "?" || first > last || last >= SLOTS {
            continue;
        }
        let node = (host, port);
        let index = match map.nodes.iter().position(|n| *n == node) {
            Some(index) => index,
            None => {
                map.nodes.push(node);
                map.nodes.len() - 1
            }
        };
        map.ranges.push((first, last, index));
    }
    if map.ranges.is_empty() {
        return None;
    }
    map.ranges.sort_unstable();
    map.held = vec![false; map.nodes.len()];
    map.asked = vec![false; map.nodes.len()];
    Some(map)
}

/// `url` (`redis[s]://[user[:password]@]host[:port][/db][?...]`) with
/// `node` as its host and port, the rest kept; `None` for a URL without
/// `://`.
fn url_at(url: &str, node: &Node) -> Option<String> {
    let (scheme, rest) = url.split_once("://")?;
    let end = rest.find(['/', '?']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(end);
    let user = authority.rfind('@').map_or("", |at| &authority[..=at]);
    Some(format!("{scheme}://{user}{}{tail}", name(node)))
}

/// `host:port`, or `[host]:port` for an IPv6 address.
pub(super) fn name((host, port): &Node) -> String {
    match host.contains(':') {
        true => format!("[{host}]:{port}"),
        false => format!("{host}:{port}"),
    }
}

/// The Cluster slot of `key`: CRC16 (XMODEM) of its hash tag (the bytes
/// between its first `{` and the next `}`, when there are some), or of the
/// whole key, modulo 16,384.
pub(super) fn key_slot(key: &[u8]) -> u16 {
    crc16(hash_tag(key).unwrap_or(key)) % SLOTS
}

/// The slot of every key whose first `{` is followed by `tag` (a key's hash
/// tag ends at the first `}` after it, in `tag` or after), if that hash tag
/// is not empty (else the slot is the whole key's).
pub(super) fn tag_slot(tag: &[u8]) -> Option<u16> {
    let end = tag.iter().position(|&b| b == b'}').unwrap_or(tag.len());
    tag.get(..end)
        .filter(|tag| !tag.is_empty())
        .map(|tag| crc16(tag) % SLOTS)
}

/// The bytes between `key`'s first `{` and the next `}`, if there are some.
fn hash_tag(key: &[u8]) -> Option<&[u8]> {
    key.iter().position(|&b| b == b'{').and_then(|open| {
        let rest = key.get(open + 1..)?;
        let close = rest.iter().position(|&b| b == b'}')?;
        rest.get(..close).filter(|tag| !tag.is_empty())
    })
}

/// CRC16-CCITT (XMODEM), as Redis Cluster computes it.
fn crc16(bytes: &[u8]) -> u16 {
    let mut crc: u16 = 0;
    for &byte in bytes {
        crc ^= u16::from(byte) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
        }
    }
    crc
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nodes_are_named_as_addresses() {
        assert_eq!(name(&("10.0.0.1".to_owned(), 7000)), "10.0.0.1:7000");
        assert_eq!(name(&("::1".to_owned(), 7000)), "[::1]:7000");
        assert_eq!(
            name(&("node-a.example".to_owned(), 7000)),
            "node-a.example:7000"
        );
    }

    #[test]
    fn slots_are_redis_clusters() {
        // (`CLUSTER KEYSLOT` on Redis 7.)
        assert_eq!(key_slot(b"foo"), 12_182);
        assert_eq!(key_slot(b"123456789"), 0x31C3);
        assert_eq!(key_slot(b"{user1000}.following"), key_slot(b"user1000"));
        assert_eq!(key_slot(b"foo{}{bar}"), crc16(b"foo{}{bar}") % SLOTS);
        assert_eq!(key_slot(b"foo{{bar}}zap"), key_slot(b"{bar"));
        assert_eq!(key_slot(b"foo{bar}{zap}"), key_slot(b"bar"));
        assert_eq!(key_slot(b""), 0);
    }

    #[test]
    fn a_tag_after_a_key_s_first_brace_tells_its_slot() {
        assert_eq!(tag_slot(b"r1:alice"), Some(key_slot(b"rl:{r1:alice}:p3")));
        // (A tag that holds a `}` ends there, as the key's does.)
        assert_eq!(tag_slot(b"r1}x"), Some(key_slot(b"rl:{r1}x}:p3")));
        // (An empty tag: the whole key counts.)
        assert_eq!(tag_slot(b""), None);
        assert_eq!(tag_slot(b"}r1"), None);
    }

    #[test]
    fn a_slot_s_failure_domain_is_its_master_s() {
        let watch = watch_of(&[7000, 7001], |port| format!("redis://127.0.0.1:{port}"));
        // (No slots read yet: no master known.)
        assert_eq!(watch.domain_of(5), 0);
        watch.publish(map(vec![node(7000), node(7001)], vec![false, false]));
        assert_eq!((watch.domain_of(5), watch.domain_of(8191)), (1, 1));
        assert_eq!((watch.domain_of(9000), watch.domain_of(16_383)), (2, 2));
        // A replica promoted in the second's place is a domain of its own;
        // the first keeps its.
        watch.publish(map(vec![node(7000), node(7002)], vec![false, false]));
        assert_eq!((watch.domain_of(5), watch.domain_of(9000)), (1, 3));
        assert_eq!(watch.domain_node(3), Some(node(7002)));
        // (The master the slots no longer name is forgotten.)
        assert_eq!(watch.domain_node(2), None);
        // Numbers go round, never to a master the slots name: 63 masters,
        // each a number of its own (the forgotten master's 2 among them).
        watch.publish(sixty_three_masters());
        let mut given = watch.map.load().domains.clone();
        given.sort_unstable();
        given.dedup();
        assert_eq!(given.len(), 63);
        assert!(given.iter().all(|d| (1..=63).contains(d)));
    }

    #[tokio::test]
    async fn each_master_s_clock_is_its_own_and_a_new_master_s_is_unknown() {
        let watch = watch_of(&[7000, 7001], |port| format!("redis://127.0.0.1:{port}"));
        let deadline = |domain: u32| {
            watch
                .clock(domain)
                .and_then(|c| c.deadline(std::time::Instant::now(), Duration::from_millis(50)))
        };
        assert_eq!(watch.clocks_due(), vec![]);
        watch.publish(map(vec![node(7000), node(7001)], vec![false, false]));
        // Each master's clock is due until read, by a slot of its own.
        assert_eq!(watch.clocks_due(), vec![(1, 0), (2, 8192)]);
        let read = watch.clock(2).unwrap().read_by(async { Ok((1_000, 0)) });
        read.await.unwrap();
        assert_eq!(watch.clocks_due(), vec![(1, 0)]);
        let on_2 = deadline(2).unwrap();
        // (On the master's clock, read as 1,000 s: a deadline 55 ms on,
        // and the reading's error, and up to 2 ms of rounding; and what
        // passed since the reading.)
        assert!((1_000_055_000..1_000_070_000).contains(&on_2), "{on_2}");
        assert_eq!((deadline(0), deadline(1)), (None, None));
        // A held master's clock is not asked for.
        watch.publish(map(vec![node(7000), node(7001)], vec![true, false]));
        assert_eq!(watch.clocks_due(), vec![]);
        // A replica promoted in the second's place: its clock is unknown.
        watch.publish(map(vec![node(7000), node(7002)], vec![false, false]));
        assert_eq!(watch.clocks_due(), vec![(1, 0), (3, 8192)]);
        assert_eq!(deadline(3), None);
        // The forgotten master's number, given to another master, comes
        // without its clock.
        watch.publish(sixty_three_masters());
        assert!(watch.domain_node(2).is_some());
        assert_eq!(deadline(2), None);
    }

    /// A node in a `CLUSTER SLOTS` answer.
    fn slots_node(host: &str, port: i64) -> Value {
        Value::Array(vec![
            Value::BulkString(host.as_bytes().to_vec()),
            Value::Int(port),
            Value::BulkString(b"id".to_vec()),
        ])
    }

    /// An entry of a `CLUSTER SLOTS` answer: slots `first` to `last`, their
    /// master and a replica.
    fn slots_entry(first: i64, last: i64, master: Value) -> Value {
        Value::Array(vec![
            Value::Int(first),
            Value::Int(last),
            master,
            slots_node("r", 1),
        ])
    }

    #[test]
    fn a_map_only_watch_takes_the_slots_it_is_given() {
        let watch = Watch::map_only().unwrap();
        assert_eq!(watch.domain_of(0), 0);
        // (A master named by an empty host: the node asked, unknown here.)
        let unnamed = Value::Array(vec![
            slots_entry(0, 8191, slots_node("10.0.0.1", 7000)),
            slots_entry(8192, 16383, slots_node("", 7001)),
        ]);
        watch.adopt(unnamed, &watch.current());
        assert_eq!(watch.domain_of(0), 0);
        let answer = || {
            Value::Array(vec![
                slots_entry(0, 8191, slots_node("10.0.0.1", 7000)),
                slots_entry(8192, 16383, slots_node("10.0.0.3", 7001)),
            ])
        };
        watch.adopt(answer(), &watch.current());
        assert_eq!((watch.domain_of(0), watch.domain_of(9000)), (1, 2));
        assert_eq!(watch.domain_node(1), Some(("10.0.0.1".to_owned(), 7000)));
        assert_eq!(watch.clocks_due(), vec![(1, 0), (2, 8192)]);
        // The same map is kept; another is put in use.
        let at = watch.map.load().at;
        watch.adopt(answer(), &watch.current());
        assert_eq!(watch.map.load().at, at);
        let other = Value::Array(vec![slots_entry(0, 16383, slots_node("10.0.0.2", 7000))]);
        // Not over a map put in use since the answer was asked for, nor
        // over one that holds a master (the watch's own rounds read the
        // slots then).
        let seen = watch.current();
        watch.publish(Map::clone(&watch.current()));
        watch.adopt(other.clone(), &seen);
        assert_eq!(watch.domain_of(0), 1);
        let mut holding = Map::clone(&watch.current());
        holding.held = vec![true, false];
        watch.publish(holding);
        watch.adopt(other.clone(), &watch.current());
        assert_eq!(watch.domain_of(0), 1);
        let mut free = Map::clone(&watch.current());
        free.held = vec![false, false];
        watch.publish(free);
        watch.adopt(other, &watch.current());
        assert_eq!((watch.domain_of(0), watch.domain_of(9000)), (3, 3));
        assert!(!watch.any_held());
    }

    /// 63 masters: 7000, 7002 and 61 more, all the slots the first's.
    fn sixty_three_masters() -> Map {
        let mut nodes = vec![node(7000), node(7002)];
        nodes.extend((0..61).map(|i| node(8000 + i)));
        let count = nodes.len();
        let mut many = map(nodes, vec![false; count]);
        many.ranges = vec![(0, 16_383, 0)];
        many
    }

    fn node(port: u16) -> Node {
        ("127.0.0.1".to_owned(), port)
    }

    /// A watch whose seeds are the nodes at `ports`, named by `url`.
    fn watch_of(ports: &[u16], url: impl Fn(u16) -> String) -> Arc<Watch> {
        use redis::IntoConnectionInfo;
        let base = url(ports[0]).as_str().into_connection_info().unwrap();
        let seeds = ports.iter().map(|&p| (url(p), node(p))).collect();
        Watch::new(base, seeds, Duration::from_millis(500), Duration::ZERO).unwrap()
    }

    /// Two masters, of the lower and upper half of the slots.
    fn map(nodes: Vec<Node>, held: Vec<bool>) -> Map {
        Map {
            ranges: vec![(0, 8191, 0), (8192, 16383, 1)],
            asked: vec![true; nodes.len()],
            domains: Vec::new(),
            nodes,
            held,
            at: None,
        }
    }

    #[test]
    fn a_held_master_is_left_out_of_new_clients_seeds_until_well_after_it_moved() {
        let url = |port: u16| format!("redis://127.0.0.1:{port}");
        let watch = watch_of(&[7000, 7001], url);
        let lower = (0..)
            .map(|i| format!("k{i}"))
            .find(|k| key_slot(k.as_bytes()) < 8192)
            .unwrap();
        assert_eq!(watch.answering_seeds(), None);
        assert_eq!(watch.holding(lower.as_bytes()), None);

        assert!(watch.publish(map(vec![node(7000), node(7001)], vec![true, false])));
        assert_eq!(watch.held_nodes(), [node(7000)]);
        assert_eq!(watch.holding(lower.as_bytes()), Some(node(7000)));
        assert_eq!(watch.holding(b"foo"), None);
        assert_eq!(watch.answering_seeds(), Some(vec![url(7001)]));
        assert!(!watch.moved_lately());

        // (Its replica, 7002, promoted: its slots moved.)
        assert!(!watch.publish(map(vec![node(7002), node(7001)], vec![false, false])));
        assert!(watch.held_nodes().is_empty());
        assert_eq!(watch.holding(lower.as_bytes()), None);
        assert!(watch.moved_lately());
        assert_eq!(watch.answering_seeds(), Some(vec![url(7002), url(7001)]));
    }

    /// One seed, the master that hangs: a new client is made on the
    /// masters the slots name that answer, with the seed's settings.
    #[test]
    fn a_sole_seed_held_leaves_new_clients_the_masters_that_answer() {
        let url = |port: u16| format!("rediss://app:s3cret@127.0.0.1:{port}/0?insecure");
        let watch = watch_of(&[7000], url);
        assert_eq!(watch.answering_seeds(), None);
        assert!(watch.publish(map(vec![node(7000), node(7001)], vec![true, false])));
        assert_eq!(watch.answering_seeds(), Some(vec![url(7001)]));
        // (Its replica, 7002, promoted.)
        assert!(!watch.publish(map(vec![node(7002), node(7001)], vec![false, false])));
        assert_eq!(watch.answering_seeds(), Some(vec![url(7002), url(7001)]));
    }

    #[test]
    fn urls_take_another_node_and_keep_the_rest() {
        let at = |url: &str, host: &str, port| url_at(url, &(host.to_owned(), port));
        assert_eq!(
            at("redis://127.0.0.1:7000", "10.0.0.2", 7001).as_deref(),
            Some("redis://10.0.0.2:7001")
        );
        assert_eq!(
            at("rediss://u:p@w@node-a/2?protocol=resp3", "node-b", 6380).as_deref(),
            Some("rediss://u:p@w@node-b:6380/2?protocol=resp3")
        );
        assert_eq!(
            at("redis://[::1]:7000", "fe80::2", 7001).as_deref(),
            Some("redis://[fe80::2]:7001")
        );
        assert_eq!(at("unix:/tmp/redis.sock", "h", 1), None);
    }

    #[test]
    fn a_slots_answer_maps_each_slot_to_its_master() {
        let (node, entry) = (slots_node, slots_entry);
        let answer = Value::Array(vec![
            entry(5461, 10922, node("10.0.0.2", 7001)),
            entry(0, 5460, node("", 7000)),
            entry(10923, 16383, node("10.0.0.2", 7001)),
            entry(16000, 16500, node("bad", 1)),
            entry(0, 1, node("?", 7009)),
            entry(
                2,
                3,
                Value::Array(vec![Value::BulkString(vec![0xff]), Value::Int(1)]),
            ),
        ]);
        let map = parse_slots(answer, "seed").unwrap();
        assert_eq!(
            map.nodes,
            [("10.0.0.2".to_owned(), 7001), ("seed".to_owned(), 7000)]
        );
        let master = |slot| map.node_of(slot).map(|i| map.nodes[i].1);
        assert_eq!(master(0), Some(7000));
        assert_eq!(master(5460), Some(7000));
        assert_eq!(master(5461), Some(7001));
        assert_eq!(master(16383), Some(7001));
        assert_eq!(
            parse_slots(Value::Int(1), "seed").map(|m| m.nodes.len()),
            None
        );
        let partial = parse_slots(Value::Array(vec![entry(100, 200, node("a", 1))]), "s").unwrap();
        assert_eq!(partial.node_of(99), None);
        assert_eq!(partial.node_of(201), None);
        assert_eq!(partial.node_of(150), Some(0));
    }
}
