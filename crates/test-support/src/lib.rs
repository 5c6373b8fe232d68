//! What the end-to-end suites are made of: the real `switchyard` binary started as a child
//! process on free ports, real backends on 127.0.0.1, and a raw HTTP/1.1 client so tests
//! control exactly what goes on the wire.

// The suites' own vocabulary (Backend, RouterProcess, get, …): read where the tests use it.
#![allow(missing_docs)]

mod backend;
mod client;
pub mod dns;
pub mod h2_raw;
pub mod h3;
mod haproxy;
pub mod logd;
pub mod pebble;
pub mod pki;
mod redis;
mod router;
pub mod tls;
pub mod websocket;
pub mod wiretap;

pub use backend::{Backend, Behaviour, Recorded};
pub use client::{get, request, send, Response};
pub use haproxy::ProxyProtocolEcho;
pub use logd::LogdProcess;
pub use redis::{RedisSentinel, RedisServer};
pub use router::RouterProcess;

use std::time::{Duration, Instant};

/// A static root for an app, and the directory outside it its symlink points into:
/// `assets/site.css`, `index.html`, `big.txt` holding `big`, and `leak.txt`, a symlink to
/// `secret.txt` outside the root (which must never be served).
pub fn static_root(big: &str) -> (tempfile::TempDir, tempfile::TempDir) {
    let root = tempfile::tempdir().expect("static root");
    std::fs::create_dir_all(root.path().join("assets")).expect("assets dir");
    std::fs::write(root.path().join("assets/site.css"), "body{}").expect("css");
    std::fs::write(root.path().join("index.html"), "<h1>home</h1>").expect("index");
    std::fs::write(root.path().join("big.txt"), big).expect("big file");
    let outside = tempfile::tempdir().expect("outside");
    std::fs::write(outside.path().join("secret.txt"), "secret").expect("secret");
    std::os::unix::fs::symlink(
        outside.path().join("secret.txt"),
        root.path().join("leak.txt"),
    )
    .expect("symlink");
    (root, outside)
}

/// A free port on 127.0.0.1 that no other part of this test process will be handed.
///
/// Ports come from just below the kernel's ephemeral range, so they never collide with the
/// `bind(0)` ports of test backends or with the local ports of outgoing connections (a router
/// told to listen on a port a backend took a moment earlier would fail to start, while the
/// harness, seeing something answer, would talk to the backend instead).
/// Sends the signal `name` (`HUP`, `USR1`, `TERM`) to process `pid`.
pub fn send_signal(pid: u32, name: &str) {
    let status = std::process::Command::new("kill")
        .args([&format!("-{name}"), &pid.to_string()])
        .status()
        .expect("kill");
    assert!(status.success(), "kill -{name} {pid}");
}

pub fn free_port() -> u16 {
    static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let Some((low, span)) = harness_port_range() else {
        return kernel_chosen_port();
    };
    // Concurrent test binaries start at different offsets (cargo runs them one by one, other
    // runners may not).
    let origin = std::process::id() % span;
    for _ in 0..span {
        let offset = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let port = low + (origin + offset) % span;
        let Ok(port) = u16::try_from(port) else {
            continue;
        };
        if std::net::TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
    kernel_chosen_port()
}

/// The ports below the ephemeral range the harness hands out, when there is room for them.
fn harness_port_range() -> Option<(u32, u32)> {
    let range = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range").ok()?;
    let ephemeral_low: u32 = range.split_whitespace().next()?.parse().ok()?;
    let low = ephemeral_low.checked_sub(12_000)?.max(1_024);
    let span = ephemeral_low - low;
    (span >= 1_000).then_some((low, span))
}

fn kernel_chosen_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port on 127.0.0.1")
}

/// Polls `check` until it returns true or `deadline` passes; returns the time it took.
pub fn eventually(deadline: Duration, what: &str, mut check: impl FnMut() -> bool) -> Duration {
    let start = Instant::now();
    loop {
        if check() {
            return start.elapsed();
        }
        assert!(
            start.elapsed() < deadline,
            "timed out after {deadline:?} waiting for {what}"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Everything a child process wrote to `stderr-1.log`, `stderr-2.log`… in `dir`, one file
/// per start.
pub fn stderr_of_starts(dir: &std::path::Path, starts: usize) -> String {
    (1..=starts)
        .map(|n| std::fs::read_to_string(dir.join(format!("stderr-{n}.log"))).unwrap_or_default())
        .collect::<Vec<_>>()
        .join("\n--- restart ---\n")
}

/// The value of one series (name with labels, as exported) in Prometheus text; 0 if absent.
pub fn metric_in(text: &str, series: &str) -> f64 {
    text.lines()
        .find(|l| l.starts_with(series) && l[series.len()..].starts_with(' '))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0.0)
}
