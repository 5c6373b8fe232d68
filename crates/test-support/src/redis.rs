//! A real `redis-server` for the fleet tests, on a free port of 127.0.0.1 with its own
//! directory, stopped by its PID. Writes are logged to an append-only file fsynced on every
//! write, so a stopped and restarted server comes back with its data, like a production
//! Redis with persistence.

use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::free_port;

pub struct RedisServer {
    child: Option<Child>,
    pub addr: SocketAddr,
    dir: tempfile::TempDir,
}

impl RedisServer {
    pub fn start() -> Self {
        let mut server = Self {
            child: None,
            addr: SocketAddr::from(([127, 0, 0, 1], free_port())),
            dir: tempfile::tempdir().expect("tempdir"),
        };
        server.spawn();
        server
    }

    /// A server on an address where nothing runs yet (to start a router first).
    pub fn reserve() -> Self {
        Self {
            child: None,
            addr: SocketAddr::from(([127, 0, 0, 1], free_port())),
            dir: tempfile::tempdir().expect("tempdir"),
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
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.stop();
    }
}
