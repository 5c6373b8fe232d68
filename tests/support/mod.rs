//! What the end-to-end suites are made of: the real `switchyard` binary started as a child
//! process on free ports, real backends on 127.0.0.1, and a raw HTTP/1.1 client so tests
//! control exactly what goes on the wire.

#![allow(dead_code, unreachable_pub, unused_imports)]

mod backend;
mod client;
pub mod pki;
mod redis;
mod router;
pub mod tls;

pub use backend::{Backend, Behaviour, Recorded};
pub use client::{get, request, Response};
pub use redis::RedisServer;
pub use router::RouterProcess;

use std::time::{Duration, Instant};

/// A port that was free a moment ago on 127.0.0.1.
pub fn free_port() -> u16 {
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
