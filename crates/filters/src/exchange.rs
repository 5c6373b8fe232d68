//! What a filter's callback sees of its request: the views the router moves into the
//! instance's store for the length of one callback and takes back after it, and what the
//! filter asked for during it (a local answer, a resumed stream, calls to make).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::header::{HeaderName, HeaderValue};
use http::HeaderMap;

/// A request's head as filters read and edit it: its pseudo-fields beside its fields.
#[derive(Debug, Clone, Default)]
pub struct RequestHead {
    /// `:method`.
    pub method: String,
    /// `:path`: the path and query.
    pub path: String,
    /// `:authority`: the host routed on.
    pub authority: String,
    /// `:scheme`.
    pub scheme: &'static str,
    /// The fields.
    pub headers: HeaderMap,
}

/// An answer's head as filters read and edit it.
#[derive(Debug, Clone, Default)]
pub struct ResponseHead {
    /// `:status`.
    pub status: u16,
    /// The fields.
    pub headers: HeaderMap,
}

/// An answer a filter made in place of the app's (`proxy_send_local_response`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LocalResponse {
    /// Its status.
    pub status: u16,
    /// Its fields.
    pub headers: Vec<(HeaderName, HeaderValue)>,
    /// Its body.
    pub body: Bytes,
    /// The filter's reason (`status_code_details`), for the log.
    pub details: String,
}

/// A call a filter dispatched (`proxy_http_call`), made by the router after the callback.
#[derive(Debug, Clone)]
pub struct HttpCall {
    pub(crate) token: u32,
    /// The upstream the filter named.
    pub upstream: String,
    /// Its pseudo-fields (`:method`, `:path`, `:authority`) and fields.
    pub headers: Vec<(String, Vec<u8>)>,
    /// Its body.
    pub body: Bytes,
    /// How long the filter waits for its answer.
    pub timeout: Duration,
}

/// The answer to a filter's call; `None` in the router's hands when it failed or timed out.
#[derive(Debug, Clone, Default)]
pub struct HttpCallAnswer {
    /// Its status.
    pub status: u16,
    /// Its fields.
    pub headers: Vec<(String, Vec<u8>)>,
    /// Its body.
    pub body: Bytes,
}

/// What the router knows of a request, for `proxy_get_property`.
#[derive(Debug, Clone, Default)]
pub struct RequestFacts {
    /// The app's name.
    pub app: Arc<str>,
    /// The client's address.
    pub source: Option<SocketAddr>,
    /// The request's id.
    pub request_id: String,
    /// `HTTP/1.1`, `HTTP/2`, `HTTP/3`.
    pub protocol: &'static str,
}

/// The state of one callback, moved in and out of the store around it.
#[derive(Debug, Default)]
pub(crate) struct Exchange {
    pub(crate) facts: Option<Arc<RequestFacts>>,
    pub(crate) request: Option<RequestHead>,
    pub(crate) response: Option<ResponseHead>,
    pub(crate) request_body: Option<Vec<u8>>,
    pub(crate) response_body: Option<Vec<u8>>,
    pub(crate) call_answer: Option<HttpCallAnswer>,
    pub(crate) local_response: Option<LocalResponse>,
    pub(crate) resumed: bool,
    pub(crate) calls: Vec<HttpCall>,
    /// Whether the callback runs for a request (not the root context): only then may it
    /// answer or dispatch calls that resume it.
    pub(crate) in_request: bool,
    /// The callback (on the answer's head) paused: the filter waits for the answer's body.
    pub(crate) paused_for_body: bool,
}

impl Exchange {
    /// Forgets what the last callback asked for, before the next one.
    pub(crate) fn clear_outcome(&mut self) {
        self.local_response = None;
        self.resumed = false;
        self.calls.clear();
        self.call_answer = None;
        self.paused_for_body = false;
    }
}

impl RequestHead {
    /// The pseudo-fields first, then the fields, as Envoy lists them.
    pub(crate) fn pairs(&self) -> Vec<(&[u8], &[u8])> {
        let mut pairs: Vec<(&[u8], &[u8])> = vec![
            (b":authority", self.authority.as_bytes()),
            (b":path", self.path.as_bytes()),
            (b":method", self.method.as_bytes()),
            (b":scheme", self.scheme.as_bytes()),
        ];
        pairs.extend(
            self.headers
                .iter()
                .map(|(name, value)| (name.as_str().as_bytes(), value.as_bytes())),
        );
        pairs
    }

    pub(crate) fn pseudo(&self, name: &[u8]) -> Option<&str> {
        Some(match name {
            b":authority" => &self.authority,
            b":path" => &self.path,
            b":method" => &self.method,
            b":scheme" => self.scheme,
            _ => return None,
        })
    }

    /// Sets a pseudo-field; false when `name` is none, or the value is not one.
    pub(crate) fn set_pseudo(&mut self, name: &[u8], value: &[u8]) -> bool {
        let Ok(value) = std::str::from_utf8(value) else {
            return false;
        };
        match name {
            b":authority" if !value.is_empty() => self.authority = value.to_string(),
            b":path" if value.starts_with('/') => self.path = value.to_string(),
            b":method" if !value.is_empty() && value.bytes().all(|b| b.is_ascii_alphabetic()) => {
                self.method = value.to_string()
            }
            _ => return false,
        }
        true
    }
}
