//! The masters of a Cluster the store made, watched on connections of the
//! store's own (see [`Watch`]).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use arc_swap::ArcSwap;
use redis::aio::MultiplexedConnection;
use redis::{AsyncConnectionConfig, ConnectionAddr, ConnectionInfo, RedisError, Value};

/// A node, by the (host, port) the Cluster names it by.
pub(super) type Node = (String, u16);

/// How many slots a Cluster has.
const SLOTS: u16 = 16_384;

/// The pause between two rounds of [`Watch`]'s task.
const ROUND_EVERY: Duration = Duration::from_millis(250);

/// How often the task reads the slots again while it runs: a held master's
/// slots move to its replica when the Cluster promotes it.
const MAP_EVERY: Duration = Duration::from_secs(1);

/// The most slots waiting to have their master asked.
const MAX_SUSPECTS: usize = 64;

/// The least time a master is given to answer a `PING`: a master that is
/// only slow is not held.
const LEAST_ANSWER: Duration = Duration::from_millis(250);

/// Which master serves each slot, as the Cluster said when last asked, and
/// which of them are held.
#[derive(Clone, Default)]
struct Map {
    /// (first slot, last slot, index in `nodes`), by first slot.
    ranges: Vec<(u16, u16, usize)>,
    nodes: Vec<Node>,
    /// By index in `nodes`: whether the master answers nothing.
    held: Vec<bool>,
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
/// it refreshes its slots, and a client that holds no connection to it
/// (one made while it hangs, or whose slots were refreshed meanwhile) is
/// sent elsewhere by each check of its slots, and refreshes them: every
/// master's checks then wait. So the store reads the slots itself
/// (`CLUSTER SLOTS`) and asks each master a `PING`, on connections of its
/// own: as it connects, and when a check fails, of that check's master.
/// A master that does not answer is *held*: the checks of its slots fail
/// at once (the fail mode applies), without reaching the client, until it
/// answers again (asked every 250 ms) or its slots move to another master
/// (read every second meanwhile).
pub(super) struct Watch {
    /// The connection settings of the Cluster's first URL (its user,
    /// password and TLS), given each node's address.
    base: ConnectionInfo,
    /// The nodes the store was given, asked for the slots when no master
    /// known answers.
    seeds: Vec<Node>,
    map: ArcSwap<Map>,
    /// Whether any master is held: all a check reads while none is.
    any_held: AtomicBool,
    /// Slots of failed checks, whose masters the task asks next.
    suspects: Mutex<Vec<u16>>,
    /// Whether the task runs.
    running: AtomicBool,
    connect_timeout: Duration,
    answer_timeout: Duration,
}

/// Connections of the watch's own, by node (kept while its task runs).
type Conns = HashMap<Node, MultiplexedConnection>;

impl Watch {
    /// A watch of the Cluster reached with `base`'s settings at `seeds`,
    /// or `None` when `base` is not a TCP address; `timeout` is the
    /// store's response timeout.
    pub(super) fn new(
        base: ConnectionInfo,
        seeds: Vec<Node>,
        connect_timeout: Duration,
        timeout: Duration,
    ) -> Option<Arc<Self>> {
        if matches!(base.addr(), ConnectionAddr::Unix(_)) {
            return None;
        }
        Some(Arc::new(Self {
            base,
            seeds,
            map: ArcSwap::default(),
            any_held: AtomicBool::new(false),
            suspects: Mutex::new(Vec::new()),
            running: AtomicBool::new(false),
            connect_timeout,
            answer_timeout: timeout.saturating_mul(2).max(LEAST_ANSWER),
        }))
    }

    /// The held master that serves `key`'s slot, if it is held.
    #[inline]
    pub(super) fn holding(&self, key: &[u8]) -> Option<Node> {
        if !self.any_held.load(Ordering::Relaxed) {
            return None;
        }
        self.held_at(key_slot(key))
    }

    /// Whether the master of `slot` is held.
    pub(super) fn holds_slot(&self, slot: u16) -> bool {
        self.any_held.load(Ordering::Relaxed) && self.held_at(slot).is_some()
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

    /// A check of `key` failed: its master is asked whether it answers.
    #[cold]
    pub(super) fn suspect(self: &Arc<Self>, key: &[u8]) {
        let slot = key_slot(key);
        {
            let mut suspects = self.suspects.lock().unwrap_or_else(PoisonError::into_inner);
            if suspects.len() < MAX_SUSPECTS && !suspects.contains(&slot) {
                suspects.push(slot);
            }
        }
        self.start();
    }

    /// Reads the slots and asks every master: called as the store
    /// connects, so that a master that hangs already is held before the
    /// first check of its slots.
    pub(super) async fn survey(self: &Arc<Self>) {
        let mut conns = Conns::new();
        let Some(mut map) = self.read_map(&mut conns, &Map::default()).await else {
            return;
        };
        let everyone: Vec<usize> = (0..map.nodes.len()).collect();
        map.held = self.ask(&mut conns, &map.nodes, &everyone).await;
        if self.publish(map) {
            self.start();
        }
    }

    /// Starts the task, unless it runs: rounds every [`ROUND_EVERY`] while
    /// a master is held or suspected; it ends with the store.
    fn start(self: &Arc<Self>) {
        if self.running.swap(true, Ordering::AcqRel) {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            self.running.store(false, Ordering::Release);
            return;
        };
        let weak = Arc::downgrade(self);
        runtime.spawn(async move {
            let mut conns = Conns::new();
            let mut map_read: Option<tokio::time::Instant> = None;
            loop {
                let Some(this) = weak.upgrade() else { return };
                if !this.round(&mut conns, &mut map_read).await {
                    this.running.store(false, Ordering::Release);
                    // (A slot suspected after the round took them, before
                    // the flag was cleared, would wait for no one.)
                    let waiting = !this
                        .suspects
                        .lock()
                        .unwrap_or_else(PoisonError::into_inner)
                        .is_empty();
                    if !waiting || this.running.swap(true, Ordering::AcqRel) {
                        return;
                    }
                }
                drop(this);
                tokio::time::sleep(ROUND_EVERY).await;
            }
        });
    }

    /// One round: the suspected and held masters asked, the slots read
    /// again when due. False when there was nothing to do.
    async fn round(&self, conns: &mut Conns, map_read: &mut Option<tokio::time::Instant>) -> bool {
        let suspects =
            std::mem::take(&mut *self.suspects.lock().unwrap_or_else(PoisonError::into_inner));
        let old = self.map.load_full();
        let held: Vec<Node> = old.held_nodes().cloned().collect();
        if suspects.is_empty() && held.is_empty() {
            return false;
        }
        let due = map_read.is_none_or(|at| at.elapsed() >= MAP_EVERY);
        let mut map = match due {
            true => match self.read_map(conns, &old).await {
                Some(map) => {
                    *map_read = Some(tokio::time::Instant::now());
                    map
                }
                None => Map::clone(&old),
            },
            false => Map::clone(&old),
        };
        let mut asked: Vec<usize> = suspects.iter().filter_map(|&s| map.node_of(s)).collect();
        asked.extend(
            map.nodes
                .iter()
                .enumerate()
                .filter(|(_, node)| held.contains(node))
                .map(|(i, _)| i),
        );
        asked.sort_unstable();
        asked.dedup();
        map.held = self.ask(conns, &map.nodes, &asked).await;
        self.publish(map);
        true
    }

    /// Puts `map` in use, saying which masters it holds and lets go of;
    /// whether it holds any.
    fn publish(&self, map: Map) -> bool {
        let old = self.map.load();
        for node in map.held_nodes() {
            if !old.held_nodes().any(|n| n == node) {
                tracing::warn!(
                    master = %format_args!("{}:{}", node.0, node.1),
                    "a redis cluster master answers nothing: the checks of its slots fail at once (the fail mode applies) until it answers or its slots move"
                );
            }
        }
        for node in old.held_nodes() {
            let still = map.held_nodes().any(|n| n == node);
            let serves = map.nodes.contains(node);
            if !still {
                tracing::info!(
                    master = %format_args!("{}:{}", node.0, node.1),
                    "a held redis cluster master {}",
                    if serves { "answers again" } else { "serves no slot any more" }
                );
            }
        }
        let any = map.held.iter().any(|&h| h);
        self.map.store(Arc::new(map));
        self.any_held.store(any, Ordering::Relaxed);
        any
    }

    /// By index in `nodes`: whether each of `asked` answered nothing (a
    /// `PING` on a connection of the watch's own, within its bounds);
    /// false for those not asked.
    async fn ask(&self, conns: &mut Conns, nodes: &[Node], asked: &[usize]) -> Vec<bool> {
        let pings = asked.iter().filter_map(|&i| {
            let node = nodes.get(i)?.clone();
            let conn = conns.remove(&node);
            Some(async move {
                let (conn, answered) = self.ping(&node, conn).await;
                (i, node, conn, answered)
            })
        });
        let answers = futures_util::future::join_all(pings).await;
        let mut held = vec![false; nodes.len()];
        for (i, node, conn, answered) in answers {
            if let Some(conn) = conn {
                conns.insert(node, conn);
            }
            if let Some(h) = held.get_mut(i) {
                *h = !answered;
            }
        }
        held
    }

    /// Whether `node` answers a `PING` (on `conn`, or a new connection),
    /// and the connection to keep. Any answer counts, an error too (a
    /// master loading its data, a command refused): only silence and a
    /// connection that fails hold a master.
    async fn ping(
        &self,
        node: &Node,
        conn: Option<MultiplexedConnection>,
    ) -> (Option<MultiplexedConnection>, bool) {
        let conn = match conn {
            Some(conn) => Ok(conn),
            None => self.connect(node).await,
        };
        let mut conn = match conn {
            Ok(conn) => conn,
            Err(e) => return (None, !silent(&e)),
        };
        let cmd = redis::cmd("PING");
        let ping = cmd.query_async::<Value>(&mut conn);
        match tokio::time::timeout(self.answer_timeout, ping).await {
            Ok(Ok(_)) => (Some(conn), true),
            Ok(Err(e)) if !silent(&e) => (Some(conn), true),
            // (Kept while it only waits: the next round's `PING` goes
            // after this one, not on another connection the silent master
            // leaves in its queue, one a round.)
            Ok(Err(e)) if e.is_timeout() => (Some(conn), false),
            Err(_) => (Some(conn), false),
            Ok(Err(_)) => (None, false),
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

    /// The slots as a master of `old` that answered, or else any of the
    /// seeds (asked together, the first answer taken), says they are.
    async fn read_map(&self, conns: &mut Conns, old: &Map) -> Option<Map> {
        let kept: Vec<Node> = old
            .nodes
            .iter()
            .zip(old.held.iter().chain(std::iter::repeat(&false)))
            .filter(|(node, held)| !**held && conns.contains_key(*node))
            .map(|(node, _)| node.clone())
            .collect();
        for node in kept {
            let Some(mut conn) = conns.remove(&node) else {
                continue;
            };
            if let Some(map) = self.slots(&mut conn, &node).await {
                conns.insert(node, conn);
                return Some(map);
            }
        }
        let asks = self.seeds.iter().map(|node| {
            Box::pin(async move {
                let mut conn = self.connect(node).await.map_err(drop)?;
                let map = self.slots(&mut conn, node).await.ok_or(())?;
                Ok::<_, ()>((node.clone(), conn, map))
            })
        });
        let ((node, conn, map), _) = futures_util::future::select_ok(asks).await.ok()?;
        conns.insert(node, conn);
        Some(map)
    }

    /// `CLUSTER SLOTS` on `conn` (to `node`), within the answer timeout.
    async fn slots(&self, conn: &mut MultiplexedConnection, node: &Node) -> Option<Map> {
        let mut cmd = redis::cmd("CLUSTER");
        cmd.arg("SLOTS");
        let ask = cmd.query_async::<Value>(conn);
        let answer = tokio::time::timeout(self.answer_timeout, ask)
            .await
            .ok()?
            .ok()?;
        parse_slots(answer, &node.0)
    }
}

/// Whether an error says the node answered nothing: a timeout, or a
/// connection refused, reset or dropped.
fn silent(e: &RedisError) -> bool {
    e.is_timeout() || e.is_io_error() || e.is_connection_refusal() || e.is_connection_dropped()
}

/// The map a `CLUSTER SLOTS` answer gives: each entry is `[first, last,
/// [host, port, id, ...], replicas ...]`; an empty host is the node asked
/// (`asked`), and `?` an unknown one (its slots left out).
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
            Some(Value::BulkString(host)) => String::from_utf8(host).ok()?,
            Some(Value::SimpleString(host)) => host,
            _ => continue,
        };
        let Some(Value::Int(port)) = master.next() else {
            continue;
        };
        let host = if host.is_empty() {
            asked.to_owned()
        } else {
            host
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
    map.ranges.sort_unstable();
    map.held = vec![false; map.nodes.len()];
    Some(map)
}

/// The Cluster slot of `key`: CRC16 (XMODEM) of its hash tag (the bytes
/// between its first `{` and the next `}`, when there are some), or of the
/// whole key, modulo 16,384.
pub(super) fn key_slot(key: &[u8]) -> u16 {
    let tag = key.iter().position(|&b| b == b'{').and_then(|open| {
        let rest = key.get(open + 1..)?;
        let close = rest.iter().position(|&b| b == b'}')?;
        rest.get(..close).filter(|tag| !tag.is_empty())
    });
    crc16(tag.unwrap_or(key)) % SLOTS
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
    fn a_slots_answer_maps_each_slot_to_its_master() {
        let node = |host: &str, port: i64| {
            Value::Array(vec![
                Value::BulkString(host.as_bytes().to_vec()),
                Value::Int(port),
                Value::BulkString(b"id".to_vec()),
            ])
        };
        let entry = |first: i64, last: i64, master: Value| {
            Value::Array(vec![
                Value::Int(first),
                Value::Int(last),
                master,
                node("r", 1),
            ])
        };
        let answer = Value::Array(vec![
            entry(5461, 10922, node("10.0.0.2", 7001)),
            entry(0, 5460, node("", 7000)),
            entry(10923, 16383, node("10.0.0.2", 7001)),
            entry(16000, 16500, node("bad", 1)),
            entry(0, 1, node("?", 7009)),
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
