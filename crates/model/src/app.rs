use std::fmt;
use std::net::SocketAddr;

use serde::{Deserialize, Serialize};

use crate::{Domain, Mirror, RequestBuffering, ResponseCache};

/// An app's name: `[a-z0-9][a-z0-9-]{0,62}`, the key it is stored and addressed under.
#[derive(
    Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize, schemars::JsonSchema,
)]
#[serde(try_from = "String", into = "String")]
pub struct AppName(String);

impl AppName {
    /// What [`AppName::parse`] accepts, as a regular expression (for the OpenAPI document).
    pub const PATTERN: &'static str = "^[a-z0-9][a-z0-9-]{0,62}$";

    /// Validates a name as given in a URL path or a store key.
    pub fn parse(input: &str) -> Result<Self, String> {
        let bytes = input.as_bytes();
        let valid_first = bytes
            .first()
            .is_some_and(|b| b.is_ascii_lowercase() || b.is_ascii_digit());
        let valid_rest = bytes
            .iter()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || *b == b'-');
        if !valid_first || !valid_rest || bytes.len() > 63 {
            return Err(
                "must match [a-z0-9][a-z0-9-]{0,62}: lowercase letters, digits and '-', at most 63"
                    .into(),
            );
        }
        Ok(Self(input.to_string()))
    }

    /// The name as a string.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl TryFrom<String> for AppName {
    type Error = String;
    fn try_from(value: String) -> Result<Self, Self::Error> {
        Self::parse(&value)
    }
}

impl From<AppName> for String {
    fn from(value: AppName) -> Self {
        value.0
    }
}

impl fmt::Display for AppName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// One container (or, for a DNS name, the containers it names) of an app and a relative
/// weight.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize, schemars::JsonSchema)]
pub struct Backend {
    /// Where the container listens.
    pub address: BackendAddress,
    /// Share of traffic relative to the app's other backends (1..=100); each address a name
    /// resolves to gets this weight.
    pub weight: u16,
}

/// Where a backend listens: an IP socket address, or a name the router resolves in the
/// background (never on the request path) and re-resolves at its TTL.
#[derive(
    Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize, schemars::JsonSchema,
)]
#[serde(try_from = "String", into = "String")]
pub enum BackendAddress {
    /// `10.0.0.5:8080` or `[fd00::5]:8080`.
    Ip(SocketAddr),
    /// `web-1.internal:8080`: every A/AAAA address of the name, on this port.
    Name {
        /// The DNS name, lowercase, as given (a trailing dot makes it absolute).
        host: String,
        /// The port on every address.
        port: u16,
    },
    /// `srv:_http._tcp.web.service.consul`: the targets, ports and weights of the SRV
    /// records with the lowest priority.
    Srv(String),
}

/// Prefix of an SRV backend.
pub const SRV_PREFIX: &str = "srv:";

impl BackendAddress {
    /// The shape [`BackendAddress::parse`] takes, as a regular expression, with the
    /// `=WEIGHT` an app file may add (for the app file schema; the parser checks more).
    pub const PATTERN: &'static str = r"^(srv:[A-Za-z0-9_.-]{1,253}|[A-Za-z0-9.-]{1,253}:[0-9]{1,5}|\[[0-9A-Fa-f:.]+\]:[0-9]{1,5})(=[0-9]{1,3})?$";

    /// Parses `ip:port`, `host:port` or `srv:NAME`.
    pub fn parse(text: &str) -> Result<Self, String> {
        if let Some(name) = text.strip_prefix(SRV_PREFIX) {
            validate_dns_name(name, true)
                .map_err(|reason| format!("'{text}': the SRV name {reason}"))?;
            return Ok(Self::Srv(name.to_ascii_lowercase()));
        }
        if let Ok(address) = text.parse::<SocketAddr>() {
            if address.port() == 0 {
                return Err("port must not be 0".into());
            }
            if address.ip().is_unspecified() || address.ip().is_multicast() {
                return Err(format!("'{}' cannot be connected to", address.ip()));
            }
            return Ok(Self::Ip(address));
        }
        let not_an_address = || {
            format!(
                "'{text}' is not ip:port, host:port or srv:NAME (e.g. 10.0.0.5:8080, \
                 web-1.internal:8080, srv:_http._tcp.web.service.consul)"
            )
        };
        let (host, port) = text.rsplit_once(':').ok_or_else(not_an_address)?;
        let port: u16 = port.parse().map_err(|_| not_an_address())?;
        if port == 0 {
            return Err("port must not be 0".into());
        }
        if host.contains(':') || host.starts_with('[') {
            return Err(not_an_address());
        }
        validate_dns_name(host, false).map_err(|reason| format!("'{host}' {reason}"))?;
        Ok(Self::Name {
            host: host.to_ascii_lowercase(),
            port,
        })
    }

    /// The IP address, when it is one.
    pub fn ip(&self) -> Option<SocketAddr> {
        match self {
            Self::Ip(address) => Some(*address),
            Self::Name { .. } | Self::Srv(_) => None,
        }
    }
}

/// A DNS name's syntax: dot-separated labels of letters, digits, `-` (and `_` for SRV
/// names, whose service and protocol labels start with one), at most 253 characters.
fn validate_dns_name(name: &str, srv: bool) -> Result<(), String> {
    let trimmed = name.strip_suffix('.').unwrap_or(name);
    if trimmed.is_empty() || trimmed.len() > 253 {
        return Err("must be a DNS name of 1 to 253 characters".into());
    }
    for label in trimmed.split('.') {
        let valid = !label.is_empty()
            && label.len() <= 63
            && !label.starts_with('-')
            && !label.ends_with('-')
            && label
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || (srv && b == b'_'));
        if !valid {
            return Err(format!(
                "has an invalid label '{label}' (letters, digits and '-', at most 63)"
            ));
        }
    }
    Ok(())
}

impl TryFrom<String> for BackendAddress {
    type Error = String;
    fn try_from(value: String) -> Result<Self, Self::Error> {
        Self::parse(&value)
    }
}

impl From<BackendAddress> for String {
    fn from(value: BackendAddress) -> Self {
        value.to_string()
    }
}

impl fmt::Display for BackendAddress {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Ip(address) => write!(f, "{address}"),
            Self::Name { host, port } => write!(f, "{host}:{port}"),
            Self::Srv(name) => write!(f, "{SRV_PREFIX}{name}"),
        }
    }
}

/// Highest weight a backend may have; bounds the round-robin schedule's length.
pub const MAX_WEIGHT: u16 = 100;
/// Most backends one app may have; bounds per-app balancer state.
pub(crate) const MAX_BACKENDS: usize = 1000;
/// Most domains one app may have.
pub(crate) const MAX_DOMAINS: usize = 1000;

/// How an app's requests are spread over its backends.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, schemars::JsonSchema,
)]
#[serde(rename_all = "snake_case")]
pub enum Balancer {
    /// Smooth weighted round robin: each backend gets its weight's share, interleaved.
    #[default]
    RoundRobin,
    /// Power of two choices on in-flight requests, weighted: favours the less loaded backend.
    LeastLoaded,
}

/// Active HTTP health checking of an app's backends.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct HealthCheck {
    /// Path requested with GET; a 2xx or 3xx answer is healthy.
    pub path: String,
    /// Time between two probes of one backend.
    pub interval_ms: u64,
    /// Deadline for one probe.
    pub timeout_ms: u64,
    /// Consecutive failures that mark a backend down.
    pub unhealthy_threshold: u32,
    /// Consecutive successes that bring a down backend back.
    pub healthy_threshold: u32,
}

impl Default for HealthCheck {
    fn default() -> Self {
        Self {
            path: "/".into(),
            interval_ms: 2_000,
            timeout_ms: 1_000,
            unhealthy_threshold: 2,
            healthy_threshold: 2,
        }
    }
}

/// Upstream deadlines for one app. A read or write that passes its deadline answers 504.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct Timeouts {
    /// TCP connect to a backend.
    pub connect_ms: u64,
    /// Waiting for each read from a backend (the response header, then each body chunk).
    pub read_ms: u64,
    /// Waiting for each write to a backend.
    pub write_ms: u64,
}

impl Default for Timeouts {
    fn default() -> Self {
        Self {
            connect_ms: 3_000,
            read_ms: 60_000,
            write_ms: 60_000,
        }
    }
}

/// An app as stored: its domains, its containers and its options.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct App {
    /// Unique name.
    pub name: AppName,
    /// Hostnames routed to this app; a domain belongs to at most one app.
    pub domains: Vec<Domain>,
    /// Containers; empty means the app answers 503.
    pub backends: Vec<Backend>,
    /// Balancing policy.
    #[serde(default)]
    pub balancer: Balancer,
    /// Active health checks; passive health (refused connections) is always on.
    #[serde(default)]
    pub health_check: Option<Box<HealthCheck>>,
    /// Upstream deadlines.
    #[serde(default)]
    pub timeouts: Timeouts,
    /// How many other backends an idempotent request may be retried on after a failure.
    #[serde(default = "default_retries")]
    pub retries: u8,
    /// Answer plain-HTTP requests with a 308 to the same URL over HTTPS.
    #[serde(default)]
    pub https_redirect: bool,
    /// `Strict-Transport-Security` sent on HTTPS responses.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hsts: Option<Hsts>,
    /// Copy a share of the requests to shadow backends.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mirror: Option<Box<Mirror>>,
    /// Keep and serve responses without asking the app.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cache: Option<Box<ResponseCache>>,
    /// A directory served first, `try_files`-style: a file under it answers GET and HEAD
    /// without the cache or the app.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub static_root: Option<String>,
    /// Inspect requests with the OWASP Core Rule Set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub waf: Option<crate::Waf>,
    /// Originals resized on request under a path prefix.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub images: Option<Box<crate::Images>>,
    /// What happens to open connections to a backend the app no longer lists.
    #[serde(default, skip_serializing_if = "Drain::keeps_connections")]
    pub drain: Drain,
    /// How the app's certificates are obtained.
    #[serde(default, skip_serializing_if = "AppTls::is_default")]
    pub tls: AppTls,
    /// Guardrails: allowed networks, rates, requests in flight, sizes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limits: Option<Box<crate::Limits>>,
    /// The app's weight in the router's fair share of CPU when an event loop is saturated:
    /// its share is its weight over the weights of the apps using CPU lately (1 each by
    /// default, so equal shares).
    #[serde(
        default = "default_cpu_weight",
        skip_serializing_if = "is_default_cpu_weight"
    )]
    pub cpu_weight: u16,
    /// Answers are read ahead of slow clients (`--response-buffer-mb`), freeing the
    /// backend's connection; false for apps that stream (long polls, progressive pages).
    #[serde(default = "reads_ahead", skip_serializing_if = "is_true")]
    pub response_buffering: bool,
    /// Request bodies are read whole before a backend is chosen (memory, then a spool file),
    /// so a slow upload never holds one of the app's workers; off, or under some path
    /// prefixes, they stream to the backend as they come.
    #[serde(default, skip_serializing_if = "RequestBuffering::is_default")]
    pub request_buffering: RequestBuffering,
    /// HTTPS answers carry `Alt-Svc` for the router's HTTP/3 listener (when it has one);
    /// false keeps the app's clients on TCP.
    #[serde(default = "advertised", skip_serializing_if = "is_true")]
    pub advertise_http3: bool,
    /// Moves answered before the app: hosts and path prefixes sent elsewhere.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub redirects: Vec<crate::Redirect>,
    /// Switched off: 503 with the app's page, its backends left alone.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub maintenance: Option<Box<crate::Maintenance>>,
    /// The app's pages for the router's own 502, 503 and 504.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error_pages: Option<Box<crate::ErrorPages>>,
    /// Fields set, appended or removed on requests and answers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub headers: Option<Box<crate::HeaderRules>>,
    /// HTTP Basic authentication in front of the app.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub basic_auth: Option<Box<crate::BasicAuth>>,
    /// Sticky sessions: a client's requests go to the backend that served its first.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub affinity: Option<crate::Affinity>,
    /// Answers compressed for clients that accept it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub compress: Option<crate::Compress>,
    /// proxy-wasm filters run on its requests, in order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub filters: Vec<crate::FilterUse>,
    /// What the app is told beyond the fields every backend gets.
    #[serde(default, skip_serializing_if = "AppForwarding::is_default")]
    pub forwarding: AppForwarding,
}

/// What an app is told of its clients beyond the fields every request to a backend carries
/// (`X-Forwarded-For`, `-Proto`, `-Port`, `X-Request-Id`, `X-Request-Start`, `Via`).
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, schemars::JsonSchema,
)]
pub struct AppForwarding {
    /// `X-Forwarded-Host`: the Host the client asked for (frameworks that build absolute
    /// URLs read it).
    #[serde(default)]
    pub x_forwarded_host: bool,
    /// A PROXY protocol header opens each connection to the app's backends, naming the
    /// client's address and the one it reached (for servers that read the client on the
    /// connection, not in a field).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub proxy_protocol: Option<ProxyProtocol>,
}

/// The version of HAProxy's PROXY protocol a backend reads: stored and written as 1 or 2.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(try_from = "u8", into = "u8")]
pub enum ProxyProtocol {
    /// The text header (`PROXY TCP4 …\r\n`).
    V1,
    /// The binary header, which every current server that reads one understands.
    V2,
}

impl TryFrom<u8> for ProxyProtocol {
    type Error = &'static str;

    fn try_from(version: u8) -> Result<Self, Self::Error> {
        match version {
            1 => Ok(Self::V1),
            2 => Ok(Self::V2),
            _ => Err("the PROXY protocol version is 1 or 2"),
        }
    }
}

impl From<ProxyProtocol> for u8 {
    fn from(version: ProxyProtocol) -> Self {
        match version {
            ProxyProtocol::V1 => 1,
            ProxyProtocol::V2 => 2,
        }
    }
}

impl AppForwarding {
    fn is_default(&self) -> bool {
        *self == Self::default()
    }
}

/// Most an app's `cpu_weight` may be: a thousand times another app's share.
pub(crate) const MAX_CPU_WEIGHT: u16 = 1000;

fn default_cpu_weight() -> u16 {
    1
}

fn is_default_cpu_weight(weight: &u16) -> bool {
    *weight == 1
}

fn reads_ahead() -> bool {
    true
}

fn advertised() -> bool {
    true
}

fn is_true(value: &bool) -> bool {
    *value
}

/// How an app's certificates are obtained: uploaded by the operator (the default), or also
/// ordered by the router from its ACME CA for each exact domain without a valid upload.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, schemars::JsonSchema,
)]
pub struct AppTls {
    /// Order certificates for the app's domains by ACME.
    #[serde(default)]
    pub acme: bool,
}

impl AppTls {
    fn is_default(&self) -> bool {
        *self == Self::default()
    }
}

/// What happens to connections still open to a backend removed from the app (scale down,
/// redeploy, address change). By default nothing: the platform decides when a container
/// dies, and its connections end when it closes them or the client does.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, schemars::JsonSchema,
)]
pub struct Drain {
    /// Close connections to a removed backend this long after it left the app (a WebSocket
    /// gets a close frame 1001, going away); `None` keeps them until one side closes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub removed_backend_s: Option<u64>,
}

impl Drain {
    /// Longest deadline an app may set: a week.
    pub const MAX_REMOVED_BACKEND_S: u64 = 7 * 86_400;

    /// Whether connections to removed backends are kept until one side closes them.
    pub fn keeps_connections(&self) -> bool {
        self.removed_backend_s.is_none()
    }
}

/// HTTP Strict Transport Security for an app's HTTPS responses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct Hsts {
    /// How long browsers remember to use HTTPS only.
    pub max_age_s: u64,
    /// Whether subdomains are covered too.
    pub include_subdomains: bool,
    /// Whether the app asks to be on browsers' preload lists.
    pub preload: bool,
}

impl Hsts {
    /// The header value, e.g. `max-age=31536000; includeSubDomains`.
    pub fn header_value(&self) -> String {
        let mut value = format!("max-age={}", self.max_age_s);
        if self.include_subdomains {
            value.push_str("; includeSubDomains");
        }
        if self.preload {
            value.push_str("; preload");
        }
        value
    }
}

pub(crate) fn default_retries() -> u8 {
    2
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The mixed-version fleet of docs/operations.md: an app a newer router stored, with a
    /// field this version does not know, is read (the field ignored), and one an older
    /// router stored, without this version's options, takes their defaults.
    #[test]
    fn apps_stored_by_another_version_are_read() {
        let newer = serde_json::json!({
            "name": "shop",
            "domains": ["shop.test"],
            "backends": [],
            "an_option_of_a_later_version": {"on": true},
        });
        let app: App = serde_json::from_value(newer).expect("a newer app is read");
        assert_eq!(app.name.as_str(), "shop");
        let older = serde_json::json!({"name": "shop", "domains": ["shop.test"], "backends": []});
        let app: App = serde_json::from_value(older).expect("an older app is read");
        assert_eq!(app.retries, default_retries());
        assert!(app.hsts.is_none());
    }
}
