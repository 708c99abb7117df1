//! Throwaway `redis-server` processes for tests: a standalone server or a
//! 3-master cluster, each on free loopback ports, with its own directory and
//! log. Never 127.0.0.1:6379. Every process is killed when its handle is
//! dropped, and also when the test process dies (PR_SET_PDEATHSIG), so
//! nothing outlives a test run.
#![allow(unsafe_code)]

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{mpsc, OnceLock};
use std::time::{Duration, Instant};

static NEXT: AtomicU32 = AtomicU32::new(0);

/// A `redis-server` process.
pub struct RedisServer {
    pub port: u16,
    child: Option<Child>,
    dir: PathBuf,
    extra: Vec<String>,
    /// Arguments before the others (a sentinel's config file and
    /// `--sentinel`).
    first: Vec<String>,
}

/// A port that is free, and whose cluster-bus twin (+10000) is free too.
pub fn free_port() -> u16 {
    for _ in 0..200 {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        if port > 55_000 {
            continue;
        }
        if TcpListener::bind(("127.0.0.1", port + 10_000)).is_ok() {
            return port;
        }
    }
    panic!("no free port pair found");
}

fn ping(port: u16) -> bool {
    let Ok(mut stream) = TcpStream::connect(("127.0.0.1", port)) else {
        return false;
    };
    let _ = stream.set_read_timeout(Some(Duration::from_millis(200)));
    if stream.write_all(b"PING\r\n").is_err() {
        return false;
    }
    let mut buf = [0u8; 7];
    stream.read_exact(&mut buf).is_ok() && &buf == b"+PONG\r\n"
}

impl RedisServer {
    /// A standalone server.
    pub fn start() -> Self {
        Self::start_with(&[])
    }

    /// A server with extra `redis-server` arguments.
    pub fn start_with(extra: &[&str]) -> Self {
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let dir = std::env::temp_dir().join(format!("tower-ratelimit-{}-{n}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let mut server = Self {
            port: 0,
            child: None,
            dir,
            extra: extra.iter().map(|s| s.to_string()).collect(),
            first: Vec::new(),
        };
        // A port can be taken between choosing and binding: try a few.
        for _ in 0..5 {
            server.port = free_port();
            if server.spawn() {
                return server;
            }
        }
        panic!("redis-server did not start; log:\n{}", server.log());
    }

    fn spawn(&mut self) -> bool {
        if let Some(config) = self.first.first() {
            // (A sentinel rewrites its config: one written afresh per try.)
            let text = std::fs::read_to_string(format!("{config}.in")).unwrap();
            std::fs::write(config, text).unwrap();
        }
        let mut command = Command::new("redis-server");
        command
            .args(&self.first)
            .args(["--port", &self.port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no", "--protected-mode", "no"])
            .args(["--dir", self.dir.to_str().unwrap()])
            .args(["--logfile", "redis.log"])
            .args(&self.extra)
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        // SAFETY: prctl is async-signal-safe; it only sets a flag on the
        // child so that it is killed when the thread that spawned it dies.
        unsafe {
            command.pre_exec(|| {
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
                Ok(())
            });
        }
        let child = match command.spawn() {
            Ok(child) => child,
            Err(e) => panic!("cannot run redis-server (is it installed?): {e}"),
        };
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline {
            if ping(self.port) {
                return true;
            }
            if let Some(Ok(Some(_))) = self.child.as_mut().map(Child::try_wait) {
                self.child = None;
                return false;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        self.kill();
        false
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// The process id, while running.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("redis.log")).unwrap_or_default()
    }

    /// Kills the server (SIGKILL) and waits for it.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts the server again on the same port.
    pub fn restart(&mut self) {
        self.kill();
        for _ in 0..50 {
            if self.spawn() {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        panic!("redis-server did not restart; log:\n{}", self.log());
    }

    /// A Cluster node that holds every slot alone: it answers a command on
    /// keys of one slot, and refuses one whose keys live in several
    /// (`CROSSSLOT`), as a proxy in front of a sharded deployment does.
    #[allow(dead_code)]
    pub fn start_cluster_of_one() -> Self {
        Self::cluster_of_one(Self::start_with(&["--cluster-enabled", "yes"]))
    }

    /// `server`, a Cluster node, made to hold every slot alone (see
    /// [`start_cluster_of_one`](Self::start_cluster_of_one)).
    #[allow(dead_code)]
    pub fn cluster_of_one(server: Self) -> Self {
        assert_eq!(
            server.cli(&["cluster", "addslotsrange", "0", "16383"]),
            "OK"
        );
        let deadline = Instant::now() + Duration::from_secs(20);
        while !server
            .cli(&["cluster", "info"])
            .contains("cluster_state:ok")
        {
            assert!(Instant::now() < deadline, "cluster never became ok");
            std::thread::sleep(Duration::from_millis(20));
        }
        server
    }

    /// Runs `redis-cli` against this server and returns its output.
    pub fn cli(&self, args: &[&str]) -> String {
        cli(self.port, args)
    }

    /// How many times `command` ran on this server (`INFO commandstats`;
    /// calls inside scripts count).
    #[allow(dead_code)]
    pub fn calls(&self, command: &str) -> u64 {
        let prefix = format!("cmdstat_{command}:calls=");
        self.cli(&["info", "commandstats"])
            .lines()
            .find_map(|l| l.strip_prefix(&prefix))
            .and_then(|rest| rest.split(',').next()?.parse().ok())
            .unwrap_or(0)
    }

    /// The calls of `command` this server answered without an error (a
    /// store's access probe at start-up is a failed `EVALSHA`).
    #[allow(dead_code)]
    pub fn succeeded(&self, command: &str) -> u64 {
        let prefix = format!("cmdstat_{command}:");
        let stats = self.cli(&["info", "commandstats"]);
        let Some(line) = stats.lines().find_map(|l| l.strip_prefix(&prefix)) else {
            return 0;
        };
        let field = |name: &str| -> u64 {
            line.split(',')
                .find_map(|f| f.strip_prefix(name)?.parse().ok())
                .unwrap_or(0)
        };
        field("calls=").saturating_sub(field("failed_calls="))
    }

    /// [`log_entries`] on this server.
    #[allow(dead_code)]
    pub fn log_entries(&self, key: &str) -> Vec<i64> {
        log_entries(self.port, key)
    }
}

pub fn cli(port: u16, args: &[&str]) -> String {
    let output = Command::new("redis-cli")
        .args(["-h", "127.0.0.1", "-p", &port.to_string()])
        .args(args)
        .output()
        .expect("redis-cli");
    String::from_utf8_lossy(&output.stdout).trim().to_owned()
}

/// The entries of a sliding log's key, oldest first, whichever layout it
/// has: a sorted set (`...:l`) or the packed string (`...:p3`: entries,
/// then a trailer of little-endian doubles: (first index, first entry) per
/// window, then size, the hints' clock, the TTL's end, where the log
/// starts, the windows' fingerprint). Entries before the start were
/// dropped (they leave the string in batches).
#[allow(dead_code)]
pub fn log_entries(port: u16, key: &str) -> Vec<i64> {
    const READ: &str = "local t = redis.call('TYPE', KEYS[1]).ok \
        if t == 'zset' then return redis.call('ZRANGE', KEYS[1], 0, -1) end \
        if t ~= 'string' then return {} end \
        local v = redis.call('GET', KEYS[1]) \
        local size = struct.unpack('<d', v, #v - 39) \
        local start = struct.unpack('<d', v, #v - 15) \
        local out = {} \
        for i = start, size do \
          out[#out + 1] = string.format('%d', struct.unpack('<d', v, 8 * i - 7)) \
        end \
        return out";
    let out = cli(port, &["eval", READ, "1", key]);
    out.lines()
        .filter(|l| !l.is_empty())
        .map(|l| l.trim().parse().unwrap_or_else(|_| panic!("{key}: {out}")))
        .collect()
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.kill();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A master, one replica and one sentinel watching them as `mymaster`
/// (quorum 1), each on free ports.
#[allow(dead_code)]
pub struct RedisSentinels {
    pub master: RedisServer,
    pub replica: RedisServer,
    pub sentinel: RedisServer,
}

#[allow(dead_code)]
impl RedisSentinels {
    pub fn start() -> Self {
        let master = RedisServer::start();
        let replica =
            RedisServer::start_with(&["--replicaof", "127.0.0.1", &master.port.to_string()]);
        let sentinel = Self::spawn_sentinel(&format!(
            "sentinel monitor mymaster 127.0.0.1 {} 1\n\
             sentinel down-after-milliseconds mymaster 1000\n\
             sentinel failover-timeout mymaster 5000\n",
            master.port
        ));
        let set = Self {
            master,
            replica,
            sentinel,
        };
        // A failover needs a replica the sentinel knows, in sync.
        set.until("the sentinel to know the replica", || {
            set.sentinel
                .cli(&["sentinel", "replicas", "mymaster"])
                .contains(&set.replica.port.to_string())
                && set
                    .replica
                    .cli(&["info", "replication"])
                    .contains("master_link_status:up")
        });
        set
    }

    /// A sentinel on a free port, with `config` as its configuration (each
    /// try writes it afresh: a sentinel rewrites its file).
    fn spawn_sentinel(config: &str) -> RedisServer {
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let dir = std::env::temp_dir().join(format!("tower-ratelimit-{}-{n}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("sentinel.conf");
        std::fs::write(dir.join("sentinel.conf.in"), config).unwrap();
        let mut sentinel = RedisServer {
            port: 0,
            child: None,
            dir,
            extra: Vec::new(),
            first: vec![file.to_string_lossy().into_owned(), "--sentinel".to_owned()],
        };
        let started = (0..5).any(|_| {
            sentinel.port = free_port();
            sentinel.spawn()
        });
        assert!(
            started,
            "redis-sentinel did not start; log:\n{}",
            sentinel.log()
        );
        sentinel
    }

    fn until(&self, what: &str, done: impl Fn() -> bool) {
        let deadline = Instant::now() + Duration::from_secs(20);
        while !done() {
            assert!(Instant::now() < deadline, "waited 20 s for {what}");
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    pub fn sentinel_url(&self) -> String {
        self.sentinel.url()
    }

    /// The port the sentinel names as the master's.
    pub fn master_port(&self) -> u16 {
        let answer = self
            .sentinel
            .cli(&["sentinel", "get-master-addr-by-name", "mymaster"]);
        answer
            .lines()
            .nth(1)
            .and_then(|p| p.trim().parse().ok())
            .unwrap_or(0)
    }

    /// Promotes the replica (`SENTINEL FAILOVER`), once it has every write
    /// of the master, and waits until the sentinel names it and it acts as
    /// a master. The old master keeps running, still a master until the
    /// sentinel reconfigures it.
    pub fn failover(&self) {
        let synced: String = self.master.cli(&["wait", "1", "5000"]);
        assert_eq!(synced, "1", "the replica has the master's writes");
        assert_eq!(
            self.sentinel.cli(&["sentinel", "failover", "mymaster"]),
            "OK"
        );
        self.until("the replica to be promoted", || {
            self.master_port() == self.replica.port
                && self.replica.cli(&["role"]).starts_with("master")
        });
    }
}

/// A cluster of three masters (no replicas).
pub struct RedisCluster {
    pub nodes: Vec<RedisServer>,
}

impl RedisCluster {
    pub fn start() -> Self {
        Self::start_nodes(3, 0)
    }

    /// Three masters, each with one replica.
    pub fn start_with_replicas() -> Self {
        Self::start_nodes(6, 1)
    }

    fn start_nodes(count: usize, replicas: usize) -> Self {
        let nodes: Vec<RedisServer> = (0..count).map(|_| Self::start_node()).collect();
        let addresses: Vec<String> = nodes
            .iter()
            .map(|n| format!("127.0.0.1:{}", n.port))
            .collect();
        let output = Command::new("redis-cli")
            .args(["--cluster", "create"])
            .args(&addresses)
            .args(["--cluster-replicas", &replicas.to_string(), "--cluster-yes"])
            .output()
            .expect("redis-cli --cluster create");
        assert!(
            output.status.success(),
            "cluster create failed: {}",
            String::from_utf8_lossy(&output.stdout)
        );
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let ok = nodes
                .iter()
                .all(|n| n.cli(&["cluster", "info"]).contains("cluster_state:ok"));
            if ok {
                break;
            }
            assert!(Instant::now() < deadline, "cluster never became ok");
            std::thread::sleep(Duration::from_millis(50));
        }
        // Replicas must have synced before a test can rely on them.
        let synced = || {
            nodes.iter().all(|n| {
                let info = n.cli(&["info", "replication"]);
                !info.contains("role:slave") || info.contains("master_link_status:up")
            })
        };
        while replicas > 0 && !synced() {
            assert!(Instant::now() < deadline, "replicas never synced");
            std::thread::sleep(Duration::from_millis(50));
        }
        Self { nodes }
    }

    /// A Cluster node on its own, in no Cluster yet (its node timeout 2 s).
    pub fn start_node() -> RedisServer {
        RedisServer::start_with(&[
            "--cluster-enabled",
            "yes",
            "--cluster-config-file",
            "nodes.conf",
            "--cluster-node-timeout",
            "2000",
        ])
    }

    pub fn urls(&self) -> Vec<String> {
        self.nodes.iter().map(RedisServer::url).collect()
    }

    /// The node indexes of the master serving `slot` and of its replica.
    pub fn master_and_replica(&self, slot: u16) -> (usize, Option<usize>) {
        let view = self.nodes[0].cli(&["cluster", "nodes"]);
        let lines: Vec<Vec<&str>> = view
            .lines()
            .map(|l| l.split_whitespace().collect())
            .collect();
        let index_of = |address: &str| {
            let port: u16 = address.split(['@', ':']).nth(1).unwrap().parse().unwrap();
            self.nodes.iter().position(|n| n.port == port).unwrap()
        };
        let serves = |ranges: &[&str]| {
            ranges.iter().any(|r| match r.split_once('-') {
                Some((a, b)) => (a.parse::<u16>().unwrap()..=b.parse().unwrap()).contains(&slot),
                None => r.parse::<u16>().ok() == Some(slot),
            })
        };
        let master = lines
            .iter()
            .find(|f| f[2].contains("master") && serves(&f[8..]))
            .expect("a master serves every slot");
        let replica = lines
            .iter()
            .find(|f| f[3] == master[0])
            .map(|f| index_of(f[1]));
        (index_of(master[1]), replica)
    }
}

/// Ports of servers shared by every test of one test binary (each test uses
/// its own key prefix). They are spawned from a thread that lives as long
/// as the process, so PR_SET_PDEATHSIG kills them when the process ends.
pub struct Shared {
    pub standalone: String,
    pub cluster: Vec<String>,
}

pub fn shared() -> &'static Shared {
    static SHARED: OnceLock<Shared> = OnceLock::new();
    SHARED.get_or_init(|| {
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            let server = RedisServer::start();
            let cluster = RedisCluster::start();
            tx.send(Shared {
                standalone: server.url(),
                cluster: cluster.urls(),
            })
            .unwrap();
            // Keep the processes (and this thread) alive until exit.
            let _keep = (server, cluster);
            loop {
                std::thread::park();
            }
        });
        rx.recv().expect("shared redis servers")
    })
}

/// A key prefix no other test uses.
pub fn unique_prefix() -> String {
    format!(
        "t{}x{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    )
}

/// A private CA, a certificate it signed for a server at 127.0.0.1 (and
/// localhost), and one for a client: PEM files made with `openssl` in a
/// directory of their own (`ca.crt`, `server.crt`, `server.key`,
/// `client.crt`, `client.key`).
#[allow(dead_code)]
pub struct TlsFiles {
    pub dir: PathBuf,
}

impl Drop for TlsFiles {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

#[allow(dead_code)]
impl TlsFiles {
    pub fn make() -> Self {
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let dir =
            std::env::temp_dir().join(format!("tower-ratelimit-tls-{}-{n}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let run = |args: &[&str]| {
            let output = Command::new("openssl")
                .args(args)
                .current_dir(&dir)
                .output()
                .expect("openssl (apt-get install openssl)");
            assert!(
                output.status.success(),
                "openssl {args:?}: {}",
                String::from_utf8_lossy(&output.stderr)
            );
        };
        let key = |name: &str| {
            run(&[
                "ecparam",
                "-name",
                "prime256v1",
                "-genkey",
                "-noout",
                "-out",
                name,
            ])
        };
        key("ca.key");
        run(&[
            "req",
            "-x509",
            "-new",
            "-key",
            "ca.key",
            "-sha256",
            "-days",
            "2",
            "-subj",
            "/CN=tower-ratelimit test CA",
            "-out",
            "ca.crt",
        ]);
        for (who, usage, names) in [
            (
                "server",
                "serverAuth",
                "subjectAltName=IP:127.0.0.1,DNS:localhost\n",
            ),
            ("client", "clientAuth", ""),
        ] {
            key(&format!("{who}.key"));
            run(&[
                "req",
                "-new",
                "-key",
                &format!("{who}.key"),
                "-subj",
                &format!("/CN={who}"),
                "-out",
                &format!("{who}.csr"),
            ]);
            let ext = format!("{names}basicConstraints=CA:FALSE\nkeyUsage=digitalSignature\nextendedKeyUsage={usage}\n");
            std::fs::write(dir.join(format!("{who}.ext")), ext).unwrap();
            run(&[
                "x509",
                "-req",
                "-in",
                &format!("{who}.csr"),
                "-CA",
                "ca.crt",
                "-CAkey",
                "ca.key",
                "-CAcreateserial",
                "-days",
                "2",
                "-sha256",
                "-extfile",
                &format!("{who}.ext"),
                "-out",
                &format!("{who}.crt"),
            ]);
        }
        Self { dir }
    }

    pub fn path(&self, name: &str) -> String {
        self.dir.join(name).to_str().unwrap().to_owned()
    }

    pub fn read(&self, name: &str) -> Vec<u8> {
        std::fs::read(self.dir.join(name)).unwrap()
    }
}

#[allow(dead_code)]
impl RedisServer {
    /// A server that also serves TLS, on the returned port (its plain port
    /// stays, for `cli`), with the certificates of `files`; it asks
    /// clients for a certificate when `client_certificates` is set.
    pub fn start_tls(files: &TlsFiles, client_certificates: bool) -> (Self, u16) {
        Self::start_tls_with(files, client_certificates, &[])
    }

    /// A Cluster node serving TLS (its cluster bus too) that holds every
    /// slot alone (see [`cluster_of_one`](Self::cluster_of_one)), and its
    /// TLS port.
    #[allow(dead_code)]
    pub fn start_tls_cluster_of_one(files: &TlsFiles) -> (Self, u16) {
        let (server, tls_port) = Self::start_tls_with(
            files,
            false,
            &["--cluster-enabled", "yes", "--tls-cluster", "yes"],
        );
        (Self::cluster_of_one(server), tls_port)
    }

    /// [`start_tls`](Self::start_tls) with extra `redis-server` arguments.
    pub fn start_tls_with(
        files: &TlsFiles,
        client_certificates: bool,
        extra: &[&str],
    ) -> (Self, u16) {
        let tls_port = free_port().to_string();
        let (cert, key, ca) = (
            files.path("server.crt"),
            files.path("server.key"),
            files.path("ca.crt"),
        );
        let auth = if client_certificates { "yes" } else { "no" };
        let mut args = vec![
            "--tls-port",
            &tls_port,
            "--tls-cert-file",
            &cert,
            "--tls-key-file",
            &key,
            "--tls-ca-cert-file",
            &ca,
            "--tls-auth-clients",
            auth,
        ];
        args.extend_from_slice(extra);
        let server = Self::start_with(&args);
        (server, tls_port.parse().unwrap())
    }
}

#[allow(dead_code)]
impl RedisSentinels {
    /// A master serving TLS (and no replica), and a sentinel that watches
    /// it over TLS and serves TLS itself: (master, sentinel, the
    /// sentinel's TLS port). Plain ports stay, for `cli`.
    pub fn start_tls(files: &TlsFiles) -> (RedisServer, RedisServer, u16) {
        Self::start_tls_asking(files, false)
    }

    /// [`start_tls`](Self::start_tls), the master and the sentinel asking
    /// their clients for a certificate the CA signed (`client_certificates`;
    /// the sentinel presents `client.crt` to the master).
    pub fn start_tls_asking(
        files: &TlsFiles,
        client_certificates: bool,
    ) -> (RedisServer, RedisServer, u16) {
        let (master, master_tls) = RedisServer::start_tls(files, client_certificates);
        let tls_port = free_port();
        let auth = if client_certificates { "yes" } else { "no" };
        let sentinel = Self::spawn_sentinel(&format!(
            "tls-port {tls_port}\n\
             tls-cert-file {}\n\
             tls-key-file {}\n\
             tls-client-cert-file {}\n\
             tls-client-key-file {}\n\
             tls-ca-cert-file {}\n\
             tls-auth-clients {auth}\n\
             tls-replication yes\n\
             sentinel monitor mymaster 127.0.0.1 {master_tls} 1\n\
             sentinel down-after-milliseconds mymaster 1000\n",
            files.path("server.crt"),
            files.path("server.key"),
            files.path("client.crt"),
            files.path("client.key"),
            files.path("ca.crt"),
        ));
        (master, sentinel, tls_port)
    }
}
