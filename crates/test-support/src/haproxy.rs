//! A real HAProxy as a backend that reads the PROXY protocol (`accept-proxy`: versions 1 and
//! 2 both) and answers every request with the addresses it was told, so a test checks the
//! router's header against a parser it did not write. On a free port of 127.0.0.1, with its
//! own directory, stopped by its PID.

use std::net::{SocketAddr, TcpStream};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::free_port;

pub struct ProxyProtocolEcho {
    child: Child,
    pub addr: SocketAddr,
    _dir: tempfile::TempDir,
}

impl ProxyProtocolEcho {
    pub fn start() -> Self {
        let addr = SocketAddr::from(([127, 0, 0, 1], free_port()));
        let dir = tempfile::tempdir().expect("tempdir");
        let config = dir.path().join("haproxy.cfg");
        // `src` and `dst` are what the header announced; for a "local" header (the
        // router's own connections) they are the connection's own. Every answer may be
        // cached a second and served stale while revalidated (its ETag to revalidate with,
        // which HAProxy never matches: a revalidation gets the new addresses).
        let text = format!(
            "defaults\n  mode http\n  timeout connect 2s\n  timeout client 10s\n  \
             timeout server 10s\n  timeout http-keep-alive 10s\n\
             frontend echo\n  bind {addr} accept-proxy\n  \
             http-request return status 200 content-type text/plain \
             lf-string \"%[src] %[src_port] %[dst] %[dst_port]\"\n  \
             http-after-response set-header Cache-Control \
             \"max-age=1, stale-while-revalidate=30\"\n  \
             http-after-response set-header ETag '\"e\"'\n"
        );
        std::fs::write(&config, text).expect("write haproxy.cfg");
        let child = Command::new("haproxy")
            .arg("-db")
            .arg("-f")
            .arg(&config)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("haproxy (scripts/test installs it)");
        let echo = Self {
            child,
            addr,
            _dir: dir,
        };
        let start = Instant::now();
        while TcpStream::connect(addr).is_err() {
            assert!(
                start.elapsed() < Duration::from_secs(10),
                "haproxy did not start on {addr}"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        echo
    }
}

impl Drop for ProxyProtocolEcho {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
