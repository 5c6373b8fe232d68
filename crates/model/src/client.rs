//! Deadlines for client connections, shared by the settings that override them and the proxy
//! that applies them.

use std::time::Duration;

/// How long the router waits on a client before closing its connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ClientTimeouts {
    /// For a whole request head, from the connection's start (or, on a kept-alive
    /// connection, from `idle` after the previous answer).
    pub header: Duration,
    /// Between two requests on an HTTP/1.1 connection (and for each read of the next
    /// request's head).
    pub idle: Duration,
    /// For each read of a request body. Never applied to an upgraded connection (WebSocket),
    /// where a silent client is normal.
    pub body: Duration,
    /// For each write of a response piece (at most 64 KiB) the client does not take.
    pub send: Duration,
}

/// Seconds each of [`ClientTimeouts`] is unless configured otherwise (nginx: 75 s for
/// `keepalive_timeout`, 60 s for `client_header_timeout`, `client_body_timeout` and
/// `send_timeout`).
pub const DEFAULT_CLIENT_TIMEOUT_S: u64 = 60;

impl Default for ClientTimeouts {
    fn default() -> Self {
        let default = Duration::from_secs(DEFAULT_CLIENT_TIMEOUT_S);
        Self {
            header: default,
            idle: default,
            body: default,
            send: default,
        }
    }
}
