//! Traffic mirroring: which requests of an app are copied to shadow backends, and where.
//!
//! The split is consistent: a request's key (an API key, a client IP, a cookie …) is hashed
//! with a fixed function and compared with the share, like nginx's `split_clients`. The same
//! key is therefore always in or always out — across requests, routers and restarts — and
//! raising the share only adds keys.

use std::fmt;
use std::net::SocketAddr;

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use serde_json::Value;

use crate::spec::{
    as_object, integer_in, optional_bool, optional_integer, parse_list, parse_socket_addr,
    refuse_unknown,
};
use crate::ValidationError;

/// Parts of a whole the share is counted in: four decimal places of a percent.
const SHARE_SCALE: u64 = 1_000_000;
/// Most shadow backends per app.
const MAX_MIRROR_BACKENDS: usize = 16;
/// Most method or path filters per app.
pub(crate) const MAX_FILTERS: usize = 64;
/// Largest request body that may be mirrored.
pub const MAX_MIRROR_BODY: u64 = 64 * 1024 * 1024;

/// An app's mirroring: a share of its requests, chosen by key, copied to shadow backends
/// whose answers are ignored.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct Mirror {
    /// Shadow backends, used in turn.
    pub backends: Vec<SocketAddr>,
    /// Speak TLS to the shadow backends.
    #[serde(default)]
    pub tls: bool,
    /// Server name sent in the TLS handshake (and checked against the certificate).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sni: Option<String>,
    /// Check the shadow backends' certificates against the system's trust store.
    #[serde(default = "yes")]
    pub verify_tls: bool,
    /// Share of the requests that are mirrored.
    #[schemars(with = "f64", range(min = 0, max = 100))]
    pub percent: Share,
    /// What decides whether a request is in the share.
    pub key: MirrorKey,
    /// Only these methods are mirrored (empty: all).
    #[serde(default)]
    pub methods: Vec<String>,
    /// Only these paths are mirrored (empty: all).
    #[serde(default)]
    pub paths: Vec<PathPattern>,
    /// Deadline for connecting, for each write, and for the shadow's answer once the body
    /// is sent.
    pub timeout_ms: u64,
    /// Copies in progress at once; a copy over the cap is dropped, never queued.
    pub max_in_flight: u32,
    /// Largest request body mirrored; a larger one is not mirrored.
    pub max_body_bytes: u64,
}

fn yes() -> bool {
    true
}

impl Mirror {
    /// Whether a request is mirrored by its method and path (the key is decided apart).
    pub fn applies_to(&self, method: &str, path: &str) -> bool {
        (self.methods.is_empty() || self.methods.iter().any(|m| m == method))
            && (self.paths.is_empty() || self.paths.iter().any(|p| p.matches(path)))
    }

    /// Whether a request whose key has `value` is in the share.
    pub fn selects(&self, value: &[u8]) -> bool {
        self.percent.admits(key_hash(value) % SHARE_SCALE)
    }

    /// Whether a random draw (`0..u64::MAX`) is in the share, for `key: random`.
    pub fn selects_draw(&self, draw: u64) -> bool {
        self.percent.admits(draw % SHARE_SCALE)
    }
}

/// A share from 0 to 100 percent with four decimals, held as parts per million so that it
/// compares exactly; written as a JSON number of percent (`12.5`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Share(u32);

impl Share {
    /// A share from a percent, if it lies in 0..=100.
    pub fn from_percent(percent: f64) -> Option<Self> {
        if !(0.0..=100.0).contains(&percent) {
            return None;
        }
        Some(Self((percent * (SHARE_SCALE as f64 / 100.0)).round() as u32))
    }

    /// The share as a percent.
    pub fn percent(self) -> f64 {
        f64::from(self.0) * 100.0 / SHARE_SCALE as f64
    }

    fn admits(self, position: u64) -> bool {
        position < u64::from(self.0)
    }
}

impl Serialize for Share {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_f64(self.percent())
    }
}

impl<'de> Deserialize<'de> for Share {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let percent = f64::deserialize(deserializer)?;
        Share::from_percent(percent)
            .ok_or_else(|| serde::de::Error::custom("percent must be from 0 to 100"))
    }
}

/// What part of a request decides whether it is mirrored.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(try_from = "String", into = "String")]
pub enum MirrorKey {
    /// A fresh draw per request: the share is statistical, not sticky.
    Random,
    /// The client's IP address.
    ClientIp,
    /// A request header (name in lowercase).
    Header(String),
    /// A query-string parameter, compared as sent (not percent-decoded).
    Query(String),
    /// A cookie.
    Cookie(String),
}

impl MirrorKey {
    /// Parses `random`, `client_ip`, `header:NAME`, `query:NAME` or `cookie:NAME`.
    pub fn parse(text: &str) -> Result<Self, String> {
        let expected = "must be random, client_ip, header:NAME, query:NAME or cookie:NAME";
        match text {
            "random" => return Ok(Self::Random),
            "client_ip" => return Ok(Self::ClientIp),
            _ => {}
        }
        let (kind, name) = text.split_once(':').ok_or_else(|| expected.to_string())?;
        let valid_name = !name.is_empty()
            && name.len() <= 128
            && name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'));
        if !valid_name {
            return Err(format!(
                "'{name}' is not a valid {kind} name (letters, digits, '-', '_', '.')"
            ));
        }
        match kind {
            "header" => Ok(Self::Header(name.to_ascii_lowercase())),
            "query" => Ok(Self::Query(name.to_string())),
            "cookie" => Ok(Self::Cookie(name.to_string())),
            _ => Err(expected.to_string()),
        }
    }
}

impl fmt::Display for MirrorKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Random => f.write_str("random"),
            Self::ClientIp => f.write_str("client_ip"),
            Self::Header(name) => write!(f, "header:{name}"),
            Self::Query(name) => write!(f, "query:{name}"),
            Self::Cookie(name) => write!(f, "cookie:{name}"),
        }
    }
}

impl TryFrom<String> for MirrorKey {
    type Error = String;
    fn try_from(value: String) -> Result<Self, Self::Error> {
        Self::parse(&value)
    }
}

impl From<MirrorKey> for String {
    fn from(value: MirrorKey) -> Self {
        value.to_string()
    }
}

/// A path filter: `/exact`, or `/prefix*` for everything under a prefix.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(try_from = "String", into = "String")]
pub struct PathPattern {
    text: String,
}

impl PathPattern {
    /// Parses a pattern: an absolute path of printable ASCII, with at most a trailing `*`.
    pub fn parse(text: &str) -> Result<Self, String> {
        let body = text.strip_suffix('*').unwrap_or(text);
        if !text.starts_with('/')
            || text.len() > 1024
            || body.contains('*')
            || !text.bytes().all(|b| b.is_ascii_graphic())
        {
            return Err(format!(
                "'{text}' must be an absolute path, optionally ending in '*' (e.g. \"/api/*\")"
            ));
        }
        Ok(Self {
            text: text.to_string(),
        })
    }

    /// Whether `path` (without the query) matches.
    pub fn matches(&self, path: &str) -> bool {
        match self.text.strip_suffix('*') {
            Some(prefix) => path.starts_with(prefix),
            None => path == self.text,
        }
    }
}

impl TryFrom<String> for PathPattern {
    type Error = String;
    fn try_from(value: String) -> Result<Self, Self::Error> {
        Self::parse(&value)
    }
}

impl From<PathPattern> for String {
    fn from(value: PathPattern) -> Self {
        value.text
    }
}

/// FNV-1a, then MurmurHash3's finaliser to spread FNV's weak low bits. Fixed forever:
/// changing it would reshuffle who is mirrored on every router at once.
fn key_hash(value: &[u8]) -> u64 {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for byte in value {
        hash ^= u64::from(*byte);
        hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
    }
    hash ^= hash >> 33;
    hash = hash.wrapping_mul(0xff51_afd7_ed55_8ccd);
    hash ^= hash >> 33;
    hash = hash.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    hash ^ (hash >> 33)
}

/// Parses the `mirror` option of an app spec; field names are relative to it.
pub(crate) fn parse_mirror(value: &Value) -> Result<Mirror, ValidationError> {
    let fields = as_object(value, "")?;
    refuse_unknown(
        fields,
        &[
            "backends",
            "tls",
            "sni",
            "verify_tls",
            "percent",
            "key",
            "methods",
            "paths",
            "timeout_ms",
            "max_in_flight",
            "max_body_bytes",
        ],
        "",
    )?;
    let backends = parse_mirror_backends(fields.get("backends"))?;
    let sni = match fields.get("sni") {
        None | Some(Value::Null) => None,
        Some(Value::String(name))
            if !name.is_empty()
                && name.len() <= 253
                && name
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.')) =>
        {
            Some(name.to_ascii_lowercase())
        }
        Some(_) => return Err(ValidationError::new("sni", "must be a hostname")),
    };
    let percent = match fields.get("percent") {
        None => Share(SHARE_SCALE as u32),
        Some(v) => v
            .as_f64()
            .and_then(Share::from_percent)
            .ok_or_else(|| ValidationError::new("percent", "must be a number from 0 to 100"))?,
    };
    let key = match fields.get("key") {
        None => MirrorKey::Random,
        Some(Value::String(text)) => {
            MirrorKey::parse(text).map_err(|m| ValidationError::new("key", m))?
        }
        Some(_) => return Err(ValidationError::new("key", "must be a string")),
    };
    let methods = parse_list(fields.get("methods"), "methods", |text| {
        if !text.is_empty() && text.len() <= 32 && text.bytes().all(|b| b.is_ascii_uppercase()) {
            Ok(text.to_string())
        } else {
            Err(format!(
                "'{text}' is not a method in capitals (e.g. \"POST\")"
            ))
        }
    })?;
    let paths = parse_list(fields.get("paths"), "paths", PathPattern::parse)?;
    let max_body_bytes = match fields.get("max_body_bytes") {
        None => 1024 * 1024,
        Some(v) => integer_in(v, 0, MAX_MIRROR_BODY)
            .map_err(|m| ValidationError::new("max_body_bytes", m))?,
    };
    Ok(Mirror {
        backends,
        tls: optional_bool(fields, "tls", false)?,
        sni,
        verify_tls: optional_bool(fields, "verify_tls", true)?,
        percent,
        key,
        methods,
        paths,
        timeout_ms: optional_integer(fields, "timeout_ms", 10, 60_000, 5_000)?,
        max_in_flight: optional_integer(fields, "max_in_flight", 1, 100_000, 64)? as u32,
        max_body_bytes,
    })
}

fn parse_mirror_backends(value: Option<&Value>) -> Result<Vec<SocketAddr>, ValidationError> {
    let items = value
        .and_then(Value::as_array)
        .filter(|items| !items.is_empty())
        .ok_or_else(|| {
            ValidationError::new("backends", "is required: a non-empty array of \"ip:port\"")
        })?;
    if items.len() > MAX_MIRROR_BACKENDS {
        return Err(ValidationError::new(
            "backends",
            format!("at most {MAX_MIRROR_BACKENDS} shadow backends"),
        ));
    }
    let mut backends = Vec::with_capacity(items.len());
    for (i, item) in items.iter().enumerate() {
        let field = format!("backends[{i}]");
        let address = item
            .as_str()
            .ok_or_else(|| ValidationError::new(&field, "must be a string \"ip:port\""))
            .and_then(|text| {
                parse_socket_addr(text).map_err(|m| ValidationError::new(&field, m))
            })?;
        if backends.contains(&address) {
            return Err(ValidationError::new(field, "is listed twice"));
        }
        backends.push(address);
    }
    Ok(backends)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn mirror(spec: Value) -> Mirror {
        parse_mirror(&spec).expect("valid mirror spec")
    }

    fn selected(mirror: &Mirror) -> Vec<u32> {
        (1..=1000)
            .filter(|k| mirror.selects(k.to_string().as_bytes()))
            .collect()
    }

    #[test]
    fn the_split_is_fixed_and_raising_the_share_only_adds_keys() {
        let half = mirror(json!({"backends": ["127.0.0.1:9"], "percent": 50, "key": "query:k"}));
        let more = mirror(json!({"backends": ["127.0.0.1:9"], "percent": 70, "key": "query:k"}));
        let at_half = selected(&half);
        let at_seventy = selected(&more);
        assert!((450..=550).contains(&at_half.len()), "{}", at_half.len());
        assert!(
            (650..=750).contains(&at_seventy.len()),
            "{}",
            at_seventy.len()
        );
        assert!(at_half.iter().all(|k| at_seventy.contains(k)));
        // Pinned: a change to the hash would silently reshuffle every fleet's shadow traffic.
        assert_eq!(
            &at_half[..10],
            &[1, 2, 3, 4, 5, 7, 12, 14, 16, 17],
            "the key hash changed"
        );
    }

    #[test]
    fn shares_are_exact_at_the_edges() {
        let none = mirror(json!({"backends": ["127.0.0.1:9"], "percent": 0}));
        let all = mirror(json!({"backends": ["127.0.0.1:9"], "percent": 100}));
        assert!(selected(&none).is_empty());
        assert_eq!(selected(&all).len(), 1000);
        assert!(!none.selects_draw(0));
        assert!(all.selects_draw(u64::MAX));
        let fraction = mirror(json!({"backends": ["127.0.0.1:9"], "percent": 0.5}));
        assert_eq!(fraction.percent.percent(), 0.5);
    }

    #[test]
    fn filters_match_methods_and_paths() {
        let m = mirror(json!({
            "backends": ["127.0.0.1:9"], "methods": ["POST"], "paths": ["/api/*", "/login"]
        }));
        assert!(m.applies_to("POST", "/api/orders"));
        assert!(m.applies_to("POST", "/login"));
        assert!(!m.applies_to("POST", "/login/x"));
        assert!(!m.applies_to("GET", "/api/orders"));
    }

    #[test]
    fn round_trips_through_the_store_format() {
        let m = mirror(json!({
            "backends": ["127.0.0.1:9"], "percent": 12.5, "key": "header:X-User",
        }));
        assert_eq!(m.key, MirrorKey::Header("x-user".into()));
        let stored = serde_json::to_string(&m).expect("serialise");
        let back: Mirror = serde_json::from_str(&stored).expect("deserialise");
        assert_eq!(back, m);
        assert_eq!(
            serde_json::to_value(&m).expect("value")["percent"],
            json!(12.5)
        );
    }

    #[test]
    fn every_refusal_names_its_field() {
        let cases: &[(Value, &str)] = &[
            (json!([]), ""),
            (json!({}), "backends"),
            (json!({"backends": []}), "backends"),
            (json!({"backends": ["nope"]}), "backends[0]"),
            (
                json!({"backends": ["127.0.0.1:9", "127.0.0.1:9"]}),
                "backends[1]",
            ),
            (
                json!({"backends": ["127.0.0.1:9"], "percent": 101}),
                "percent",
            ),
            (
                json!({"backends": ["127.0.0.1:9"], "percent": "50"}),
                "percent",
            ),
            (json!({"backends": ["127.0.0.1:9"], "key": "query:"}), "key"),
            (json!({"backends": ["127.0.0.1:9"], "key": "path:x"}), "key"),
            (
                json!({"backends": ["127.0.0.1:9"], "methods": ["get"]}),
                "methods[0]",
            ),
            (
                json!({"backends": ["127.0.0.1:9"], "paths": ["api"]}),
                "paths[0]",
            ),
            (
                json!({"backends": ["127.0.0.1:9"], "paths": ["/a*b"]}),
                "paths[0]",
            ),
            (
                json!({"backends": ["127.0.0.1:9"], "timeout_ms": 0}),
                "timeout_ms",
            ),
            (
                json!({"backends": ["127.0.0.1:9"], "max_in_flight": 0}),
                "max_in_flight",
            ),
            (
                json!({"backends": ["127.0.0.1:9"], "max_body_bytes": -1}),
                "max_body_bytes",
            ),
            (json!({"backends": ["127.0.0.1:9"], "tls": "yes"}), "tls"),
            (json!({"backends": ["127.0.0.1:9"], "sni": "a b"}), "sni"),
            (json!({"backends": ["127.0.0.1:9"], "percnt": 5}), "percnt"),
        ];
        for (spec, field) in cases {
            let err = parse_mirror(spec).expect_err(&format!("{spec} must be refused"));
            assert_eq!(&err.field, field, "{spec}: {err}");
        }
    }
}
