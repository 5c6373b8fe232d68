//! An app's guardrails (`"limits"`): who may reach it (CIDR allow and deny lists), how fast
//! (requests per second for the app and per client), how much at once (requests in flight)
//! and how big (URI, header, body). The proxy's `limits` stage applies them.

use std::net::IpAddr;

use ipnet::IpNet;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::spec::{as_object, integer_field, optional_integer, refuse_unknown};
use crate::ValidationError;

/// Client records kept for per-client limits unless the router is told otherwise: about
/// 7 MiB (70 B a record, measured by bench/bench_limits.py).
pub const DEFAULT_LIMIT_CLIENTS: usize = 100_000;
/// Most CIDRs in one allow or deny list: each request walks the lists.
pub const MAX_CIDRS: usize = 1000;
/// Highest rate an app may set; beyond it a limit is no limit on one router.
const MAX_RATE: u64 = 1_000_000;
/// Longest a request may wait for a place in flight.
const MAX_QUEUE_MS: u64 = 60_000;

/// What a limit does when it is passed.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, schemars::JsonSchema,
)]
#[serde(rename_all = "snake_case")]
pub enum LimitMode {
    /// Refuse (403, 413, 414, 429, 431, 503).
    #[default]
    Enforce,
    /// Count what would have been refused and let it through: to size a limit first.
    Log,
}

/// Where an app's rate is counted.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, schemars::JsonSchema,
)]
#[serde(rename_all = "snake_case")]
pub enum LimitScope {
    /// On each router by itself: a fleet of N routers admits up to N × the rate.
    #[default]
    Router,
    /// Across the routers sharing the Redis store, synced every few milliseconds (the app
    /// rate only; per-client rates and requests in flight stay per router).
    Fleet,
}

/// A token bucket: `requests_per_s` on average, `burst` at once.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct Rate {
    /// Sustained requests per second.
    pub requests_per_s: u32,
    /// Requests admitted at once after a quiet spell (at least 1).
    pub burst: u32,
}

/// What tells one client of an app from another; written as the spec gives it.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(try_from = "String", into = "String")]
pub enum ClientKey {
    /// The client's address (behind trusted proxies, the one they forwarded).
    ClientIp,
    /// A request header's value, e.g. an API key.
    Header(String),
    /// A cookie's value, e.g. a session.
    Cookie(String),
}

impl ClientKey {
    /// As given in the spec: `client_ip`, `header:NAME`, `cookie:NAME`.
    pub fn parse(text: &str) -> Result<Self, String> {
        let valid_name = |name: &str| {
            !name.is_empty()
                && name.len() <= 128
                && name
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b))
        };
        match text.split_once(':') {
            None if text == "client_ip" => Ok(Self::ClientIp),
            Some(("header", name)) if valid_name(name) => {
                Ok(Self::Header(name.to_ascii_lowercase()))
            }
            Some(("cookie", name)) if valid_name(name) => Ok(Self::Cookie(name.to_string())),
            _ => Err(
                "must be \"client_ip\", \"header:NAME\" or \"cookie:NAME\" (NAME: letters, \
                 digits, '-', '_', '.')"
                    .into(),
            ),
        }
    }
}

impl TryFrom<String> for ClientKey {
    type Error = String;
    fn try_from(text: String) -> Result<Self, String> {
        Self::parse(&text)
    }
}

impl From<ClientKey> for String {
    fn from(key: ClientKey) -> Self {
        match key {
            ClientKey::ClientIp => "client_ip".into(),
            ClientKey::Header(name) => format!("header:{name}"),
            ClientKey::Cookie(name) => format!("cookie:{name}"),
        }
    }
}

/// What each client of the app may do.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct PerClient {
    /// How clients are told apart.
    pub key: ClientKey,
    /// The rate each gets (`requests_per_s` and `burst` beside `key`, as the spec has them).
    #[serde(flatten, skip_serializing_if = "Option::is_none")]
    pub rate: Option<Rate>,
    /// Requests each may have in flight at once, WebSockets included until they close (a
    /// browser's HTTP/1.1 connections each carry one at a time): 429 past it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_connections: Option<u32>,
}

/// An app's limits; every one optional.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize, schemars::JsonSchema)]
pub struct Limits {
    /// Only these networks may reach the app (empty: everyone not denied).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(with = "Vec<String>")]
    pub allow: Vec<IpNet>,
    /// These networks get 403, checked first.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(with = "Vec<String>")]
    pub deny: Vec<IpNet>,
    /// The app's requests per second, all clients together (`requests_per_s` and `burst`
    /// at the top, as the spec has them).
    #[serde(flatten, skip_serializing_if = "Option::is_none")]
    pub rate: Option<Rate>,
    /// Each client's rate and connections.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub per_client: Option<PerClient>,
    /// Requests being proxied at once (a WebSocket counts until it closes).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_in_flight: Option<u32>,
    /// How long a request past `max_in_flight` waits for a place before its 503: 0 refuses
    /// at once (a hard limit), more queues (a soft one).
    #[serde(default)]
    pub queue_ms: u64,
    /// Largest request body: 413, before the body goes on when its length is declared,
    /// and the body cut where it passes the limit otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_body_bytes: Option<u64>,
    /// Largest request header block (names and values): 431.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_header_bytes: Option<u32>,
    /// Longest request target (path and query): 414.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_uri_bytes: Option<u32>,
    /// Refuse, or only count.
    #[serde(default)]
    pub mode: LimitMode,
    /// Where the app rate is counted.
    #[serde(default)]
    pub scope: LimitScope,
}

impl Limits {
    /// Whether `ip` is refused by the app's allow and deny lists.
    pub fn denies(&self, ip: IpAddr) -> bool {
        self.deny.iter().any(|net| net.contains(&ip))
            || (!self.allow.is_empty() && !self.allow.iter().any(|net| net.contains(&ip)))
    }
}

/// Parses a CIDR (`10.0.0.0/8`, `2001:db8::/32`) or a single address.
pub fn parse_cidr(text: &str) -> Result<IpNet, String> {
    text.parse::<IpNet>()
        .or_else(|_| text.parse::<IpAddr>().map(IpNet::from))
        .map(|net| net.trunc())
        .map_err(|_| format!("'{text}' is not a CIDR (10.0.0.0/8) or an IP address"))
}

/// Parses the `limits` option.
pub(crate) fn parse_limits(value: &Value) -> Result<Limits, ValidationError> {
    let fields = as_object(value, "")?;
    refuse_unknown(
        fields,
        &[
            "allow",
            "deny",
            "requests_per_s",
            "burst",
            "per_client",
            "max_in_flight",
            "queue_ms",
            "max_body_bytes",
            "max_header_bytes",
            "max_uri_bytes",
            "mode",
            "scope",
        ],
        "",
    )?;
    let cidrs = |name: &str| -> Result<Vec<IpNet>, ValidationError> {
        let Some(list) = fields.get(name) else {
            return Ok(Vec::new());
        };
        let list = list
            .as_array()
            .filter(|l| l.len() <= MAX_CIDRS)
            .ok_or_else(|| {
                ValidationError::new(name, format!("must be a list of at most {MAX_CIDRS} CIDRs"))
            })?;
        list.iter()
            .enumerate()
            .map(|(i, v)| {
                v.as_str()
                    .ok_or_else(|| "must be a string".to_string())
                    .and_then(parse_cidr)
                    .map_err(|m| ValidationError::new(format!("{name}[{i}]"), m))
            })
            .collect()
    };
    let rate = parse_rate(fields)?;
    let per_client = match fields.get("per_client") {
        None | Some(Value::Null) => None,
        Some(v) => Some(parse_per_client(v).map_err(|e| e.under("per_client"))?),
    };
    let max_in_flight = integer_field(fields, "max_in_flight", 1, u64::from(u32::MAX))?;
    let queue_ms = optional_integer(fields, "queue_ms", 0, MAX_QUEUE_MS, 0)?;
    if queue_ms > 0 && max_in_flight.is_none() {
        return Err(ValidationError::new("queue_ms", "needs max_in_flight"));
    }
    let mode = match fields.get("mode").map(Value::as_str) {
        None | Some(Some("enforce")) => LimitMode::Enforce,
        Some(Some("log")) => LimitMode::Log,
        Some(_) => {
            return Err(ValidationError::new(
                "mode",
                "must be \"enforce\" or \"log\"",
            ))
        }
    };
    let scope = match fields.get("scope").map(Value::as_str) {
        None | Some(Some("router")) => LimitScope::Router,
        Some(Some("fleet")) if rate.is_some() => LimitScope::Fleet,
        Some(Some("fleet")) => {
            return Err(ValidationError::new(
                "scope",
                "\"fleet\" counts the app rate across routers: it needs requests_per_s",
            ))
        }
        Some(_) => {
            return Err(ValidationError::new(
                "scope",
                "must be \"router\" or \"fleet\"",
            ))
        }
    };
    Ok(Limits {
        scope,
        allow: cidrs("allow")?,
        deny: cidrs("deny")?,
        rate,
        per_client,
        max_in_flight: max_in_flight.map(|n| n as u32),
        queue_ms,
        max_body_bytes: integer_field(fields, "max_body_bytes", 0, u64::MAX)?,
        max_header_bytes: integer_field(fields, "max_header_bytes", 64, 1 << 20)?.map(|n| n as u32),
        max_uri_bytes: integer_field(fields, "max_uri_bytes", 16, 1 << 20)?.map(|n| n as u32),
        mode,
    })
}

/// `requests_per_s` and `burst`, by default a tenth of a second's worth (at least 2).
///
/// A burst of 1 admits less than the rate under overload: each admission waits for the
/// first request after its interval, and the gap to it is lost (measured: 60% of a
/// 1,000 req/s limit offered 2,000 req/s by vegeta). From 2 on, the bucket runs ahead of
/// the clock under load and holds the rate exactly.
fn parse_rate(fields: crate::spec::Fields<'_>) -> Result<Option<Rate>, ValidationError> {
    let Some(requests_per_s) = integer_field(fields, "requests_per_s", 1, MAX_RATE)? else {
        if fields.contains_key("burst") {
            return Err(ValidationError::new("burst", "needs requests_per_s"));
        }
        return Ok(None);
    };
    let default_burst = (requests_per_s / 10).max(2);
    let burst = optional_integer(fields, "burst", 1, MAX_RATE, default_burst)?;
    Ok(Some(Rate {
        requests_per_s: requests_per_s as u32,
        burst: burst as u32,
    }))
}

fn parse_per_client(value: &Value) -> Result<PerClient, ValidationError> {
    let fields = as_object(value, "")?;
    refuse_unknown(
        fields,
        &["key", "requests_per_s", "burst", "max_connections"],
        "",
    )?;
    let key = match fields.get("key") {
        None => ClientKey::ClientIp,
        Some(v) => v
            .as_str()
            .ok_or_else(|| "must be a string".to_string())
            .and_then(ClientKey::parse)
            .map_err(|m| ValidationError::new("key", m))?,
    };
    let rate = parse_rate(fields)?;
    let max_connections =
        integer_field(fields, "max_connections", 1, u64::from(u32::MAX))?.map(|n| n as u32);
    if rate.is_none() && max_connections.is_none() {
        return Err(ValidationError::new(
            "requests_per_s",
            "is required (or max_connections)",
        ));
    }
    Ok(PerClient {
        key,
        rate,
        max_connections,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_full_limits_option_is_accepted_and_round_trips() {
        let limits = parse_limits(&json!({
            "allow": ["10.0.0.0/8", "2001:db8::1"],
            "deny": ["10.1.2.3"],
            "requests_per_s": 50, "burst": 10,
            "per_client": {"key": "header:X-Api-Key", "requests_per_s": 5, "max_connections": 4},
            "max_in_flight": 100, "queue_ms": 200,
            "max_body_bytes": 1048576, "max_header_bytes": 8192, "max_uri_bytes": 2048,
            "mode": "log", "scope": "fleet",
        }))
        .expect("valid");
        assert_eq!(
            limits.rate,
            Some(Rate {
                requests_per_s: 50,
                burst: 10
            })
        );
        let per_client = limits.per_client.clone().expect("per client");
        assert_eq!(per_client.key, ClientKey::Header("x-api-key".into()));
        assert_eq!(
            per_client.rate.map(|r| r.burst),
            Some(2),
            "the default burst"
        );
        assert_eq!(per_client.max_connections, Some(4));
        assert!(limits.denies("10.1.2.3".parse().expect("ip")));
        assert!(!limits.denies("10.9.9.9".parse().expect("ip")));
        assert!(
            limits.denies("192.0.2.1".parse().expect("ip")),
            "not allowed"
        );
        let stored: Limits =
            serde_json::from_str(&serde_json::to_string(&limits).expect("json")).expect("back");
        assert_eq!(stored, limits);
        // What the API shows is what it takes.
        let shown = serde_json::to_value(&limits).expect("json");
        assert_eq!(parse_limits(&shown).expect("shown limits parse"), limits);
    }

    #[test]
    fn refusals_name_the_field() {
        let cases = [
            (json!({"allow": ["10.0.0.0/33"]}), "allow[0]"),
            (json!({"deny": "10.0.0.0/8"}), "deny"),
            (json!({"requests_per_s": 0}), "requests_per_s"),
            (json!({"burst": 5}), "burst"),
            (
                json!({"per_client": {"key": "ip", "requests_per_s": 1}}),
                "key",
            ),
            (
                json!({"per_client": {"key": "client_ip"}}),
                "requests_per_s",
            ),
            (json!({"queue_ms": 100}), "queue_ms"),
            (json!({"max_in_flight": 0}), "max_in_flight"),
            (json!({"max_uri_bytes": 1}), "max_uri_bytes"),
            (json!({"mode": "block"}), "mode"),
            (json!({"rate": 5}), "rate"),
            (json!({"scope": "fleet"}), "scope"),
            (json!({"requests_per_s": 5, "scope": "world"}), "scope"),
        ];
        for (spec, field) in cases {
            let err = parse_limits(&spec).expect_err(&spec.to_string());
            assert!(err.field.ends_with(field), "{spec}: {err:?}");
        }
    }
}
