//! A real `redis-server` for the fleet tests, on a free port of 127.0.0.1 with its own
//! directory, stopped by its PID. Writes are logged to an append-only file fsynced on every
//! write, so a stopped and restarted server comes back with its data, like a production
//! Redis with persistence. A replica and the `redis-sentinel` processes watching them make
//! the failover a fleet must survive.

use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::free_port;

pub struct RedisServer {
    child: Option<Child>,
    pub addr: SocketAddr,
    dir: tempfile::TempDir,
    /// The primary this server replicates, for a replica.
    replica_of: Option<SocketAddr>,
}

impl RedisServer {
    pub fn start() -> Self {
        let mut server = Self::reserve();
        server.spawn();
        server
    }

    /// A replica of `primary`, once it has synchronised with it.
    pub fn start_replica_of(primary: SocketAddr) -> Self {
        let mut server = Self::reserve();
        server.replica_of = Some(primary);
        server.spawn();
        let start = Instant::now();
        while !server.info_has("master_link_status:up") {
            assert!(
                start.elapsed() < Duration::from_secs(10),
                "the replica did not synchronise with {primary}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        server
    }

    /// A server on an address where nothing runs yet (to start a router first).
    pub fn reserve() -> Self {
        Self {
            child: None,
            addr: SocketAddr::from(([127, 0, 0, 1], free_port())),
            dir: tempfile::tempdir().expect("tempdir"),
            replica_of: None,
        }
    }

    pub fn url(&self) -> String {
        format!("redis://{}/0", self.addr)
    }

    pub fn spawn(&mut self) {
        assert!(self.child.is_none(), "already running");
        let child = Command::new("redis-server")
            .args([
                "--bind",
                "127.0.0.1",
                "--port",
                &self.addr.port().to_string(),
            ])
            .args(["--dir", self.dir.path().to_str().expect("path")])
            .args([
                "--save",
                "",
                "--appendonly",
                "yes",
                "--appendfsync",
                "always",
            ])
            .args(["--daemonize", "no", "--protected-mode", "no"])
            .args(self.replica_of.iter().flat_map(|primary| {
                [
                    "--replicaof".to_string(),
                    primary.ip().to_string(),
                    primary.port().to_string(),
                ]
            }))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("redis-server (scripts/test installs it)");
        self.child = Some(child);
        let start = Instant::now();
        while self.connection().is_err() {
            assert!(
                start.elapsed() < Duration::from_secs(10),
                "redis-server did not start"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Sends a signal by name (`STOP`, `CONT`) to the server.
    pub fn signal(&self, name: &str) {
        let child = self.child.as_ref().expect("running");
        super::send_signal(child.id(), name);
    }

    /// SIGKILL: the outage a router must survive.
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    pub fn connection(&self) -> redis::RedisResult<redis::Connection> {
        redis::Client::open(self.url())?.get_connection_with_timeout(Duration::from_secs(1))
    }

    /// Whether `INFO replication` has this line.
    pub fn info_has(&self, line: &str) -> bool {
        self.connection()
            .and_then(|mut c| {
                redis::cmd("INFO")
                    .arg("replication")
                    .query::<String>(&mut c)
            })
            .is_ok_and(|info| info.lines().any(|l| l.trim() == line))
    }
}

/// A `redis-sentinel` on a free port of 127.0.0.1 watching one primary under `name`, with
/// short timeouts so a failover takes about two seconds, not the default half minute.
pub struct RedisSentinel {
    child: Option<Child>,
    pub addr: SocketAddr,
    _dir: tempfile::TempDir,
}

impl RedisSentinel {
    /// Milliseconds without an answer before a Sentinel thinks the primary down.
    pub const DOWN_AFTER_MS: u64 = 1000;

    pub fn start(name: &str, primary: SocketAddr, quorum: u32) -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        let addr = SocketAddr::from(([127, 0, 0, 1], free_port()));
        // Sentinel rewrites its configuration file: it must be its own and writable.
        let config = dir.path().join("sentinel.conf");
        std::fs::write(
            &config,
            format!(
                "port {port}\nbind 127.0.0.1\nprotected-mode no\ndaemonize no\ndir {dir}\n\
                 sentinel monitor {name} {ip} {primary_port} {quorum}\n\
                 sentinel down-after-milliseconds {name} {down}\n\
                 sentinel failover-timeout {name} 4000\n\
                 sentinel parallel-syncs {name} 1\n",
                port = addr.port(),
                dir = dir.path().display(),
                ip = primary.ip(),
                primary_port = primary.port(),
                down = Self::DOWN_AFTER_MS,
            ),
        )
        .expect("write sentinel.conf");
        let child = Command::new("redis-sentinel")
            .arg(&config)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("redis-sentinel (scripts/test installs it)");
        let sentinel = Self {
            child: Some(child),
            addr,
            _dir: dir,
        };
        let start = Instant::now();
        while sentinel.master_field(name, "ip").is_none() {
            assert!(
                start.elapsed() < Duration::from_secs(10),
                "redis-sentinel did not start"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        sentinel
    }

    /// One field of `SENTINEL MASTER name` (`num-slaves`, `num-other-sentinels`, `port`…).
    pub fn master_field(&self, name: &str, field: &str) -> Option<String> {
        let mut connection = redis::Client::open(format!("redis://{}", self.addr))
            .ok()?
            .get_connection_with_timeout(Duration::from_secs(1))
            .ok()?;
        let fields: Vec<String> = redis::cmd("SENTINEL")
            .arg("MASTER")
            .arg(name)
            .query(&mut connection)
            .ok()?;
        fields
            .chunks(2)
            .find(|pair| pair[0] == field)
            .and_then(|pair| pair.get(1).cloned())
    }
}

impl Drop for RedisSentinel {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.stop();
    }
}
