//! Response caching: which of an app's responses the router keeps and serves without asking
//! the app, for how long, and how long a stale copy may stand in when the app fails.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::spec::{
    as_object, integer_field, optional_bool, optional_integer, parse_list, refuse_unknown, Fields,
};
use crate::{PathPattern, ValidationError};

/// Largest per-app cache size.
const MAX_CACHE_BYTES: u64 = 16 * 1024 * 1024 * 1024;
/// Largest single response kept.
const MAX_OBJECT_BYTES: u64 = 64 * 1024 * 1024;

/// Where cached responses live.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum CacheStore {
    /// In this router's memory, bounded by bytes per app and in total.
    Memory,
    /// In the router's cache Redis (`--cache-redis`), shared by every router of a fleet; Redis's
    /// own `maxmemory` policy evicts. Written by the router after a miss.
    Redis,
    /// The versioned layout in the router's cache Redis, written by the app (as a Rails app
    /// that versions its pages does): the version of a
    /// URL in the hash `resource_versions` (field: the full URL), its body under
    /// `FULL_URL:version=N`. The router only reads.
    #[serde(rename = "redis-versioned")]
    RedisVersioned,
}

/// An app's response cache. Nothing is cached unless its path matches `paths`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct ResponseCache {
    /// Where responses are kept.
    pub store: CacheStore,
    /// Paths whose GET and HEAD responses may be cached (`/exact` or `/prefix*`).
    pub paths: Vec<PathPattern>,
    /// Freshness floor for answers that give no explicit freshness (`s-maxage`, `max-age`,
    /// `Expires`), for apps that want one; off by default, as RFC 9111 has it. Read as
    /// `ttl_s` too: apps stored before it was renamed keep what they had.
    #[serde(default, alias = "ttl_s", skip_serializing_if = "Option::is_none")]
    pub default_ttl_s: Option<u64>,
    /// How long past freshness a copy may be served when the app fails or is down.
    pub stale_if_error_s: u64,
    /// Most bytes this app's cached responses take in memory (bodies and headers); unused by
    /// the Redis stores.
    pub max_bytes: u64,
    /// Largest response kept; larger ones pass through uncached.
    pub max_object_bytes: u64,
    /// Cache responses that set cookies (the `Set-Cookie` header is not stored).
    #[serde(default)]
    pub cache_set_cookie: bool,
    /// Serve and fill the cache for requests that carry `Authorization`.
    #[serde(default)]
    pub cache_authorized: bool,
}

impl ResponseCache {
    /// Whether `path` is one the app opted in for.
    pub fn covers(&self, path: &str) -> bool {
        self.paths.iter().any(|p| p.matches(path))
    }
}

/// Parses the `cache` option of an app spec; field names are relative to it.
pub(crate) fn parse_cache(value: &Value) -> Result<ResponseCache, ValidationError> {
    let fields = as_object(value, "")?;
    refuse_unknown(
        fields,
        &[
            "store",
            "paths",
            "default_ttl_s",
            "ttl_s",
            "stale_if_error_s",
            "max_bytes",
            "max_object_bytes",
            "cache_set_cookie",
            "cache_authorized",
        ],
        "",
    )?;
    let store = match fields.get("store") {
        None => CacheStore::Memory,
        Some(Value::String(s)) if s == "memory" => CacheStore::Memory,
        Some(Value::String(s)) if s == "redis-versioned" => CacheStore::RedisVersioned,
        Some(Value::String(s)) if s == "redis" => CacheStore::Redis,
        Some(_) => {
            return Err(ValidationError::new(
                "store",
                "must be \"memory\", \"redis\" or \"redis-versioned\"",
            ))
        }
    };
    let paths = parse_list(fields.get("paths"), "paths", PathPattern::parse)?;
    if paths.is_empty() {
        return Err(ValidationError::new(
            "paths",
            "is required: patterns such as \"/\" or \"/assets/*\"",
        ));
    }
    let max_bytes = optional_integer(fields, "max_bytes", 1024, MAX_CACHE_BYTES, 64 << 20)?;
    let max_object_bytes = optional_integer(
        fields,
        "max_object_bytes",
        1,
        MAX_OBJECT_BYTES,
        (1 << 20).min(max_bytes),
    )?;
    if max_object_bytes > max_bytes {
        return Err(ValidationError::new(
            "max_object_bytes",
            "must not exceed max_bytes",
        ));
    }
    Ok(ResponseCache {
        store,
        paths,
        default_ttl_s: default_ttl(fields)?,
        stale_if_error_s: optional_integer(fields, "stale_if_error_s", 0, 30 * 86_400, 0)?,
        max_bytes,
        max_object_bytes,
        cache_set_cookie: optional_bool(fields, "cache_set_cookie", false)?,
        cache_authorized: optional_bool(fields, "cache_authorized", false)?,
    })
}

/// `default_ttl_s`, or `ttl_s` as specs written before the rename name it (not both).
fn default_ttl(fields: Fields<'_>) -> Result<Option<u64>, ValidationError> {
    // `null` is "none", as a spec read back from the API and sent again may say.
    let given = |name: &str| fields.get(name).is_some_and(|v| !v.is_null());
    let name = match (given("default_ttl_s"), given("ttl_s")) {
        (false, false) => return Ok(None),
        (true, true) => {
            return Err(ValidationError::new(
                "ttl_s",
                "is the old name of default_ttl_s: give one of them",
            ))
        }
        (true, false) => "default_ttl_s",
        (false, true) => "ttl_s",
    };
    integer_field(fields, name, 1, 365 * 86_400)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn defaults_and_round_trip() {
        let cache =
            parse_cache(&json!({"paths": ["/", "/foo*"], "stale_if_error_s": 300})).expect("valid");
        assert_eq!((cache.default_ttl_s, cache.stale_if_error_s), (None, 300));
        for name in ["default_ttl_s", "ttl_s"] {
            let floor = parse_cache(&json!({"paths": ["/"], name: 30})).expect("valid");
            assert_eq!(floor.default_ttl_s, Some(30), "{name}");
            let none = parse_cache(&json!({"paths": ["/"], name: null})).expect("valid");
            assert_eq!(none.default_ttl_s, None, "{name}: null is none");
        }
        let shown = serde_json::to_value(&cache).expect("serialise");
        assert!(
            shown.get("default_ttl_s").is_none(),
            "none is not shown: {shown}"
        );
        let before_the_rename = json!({"store": "memory", "paths": ["/"], "ttl_s": 60,
            "stale_if_error_s": 0, "max_bytes": 65536, "max_object_bytes": 1024});
        let stored: ResponseCache = serde_json::from_value(before_the_rename).expect("old form");
        assert_eq!(stored.default_ttl_s, Some(60));
        assert!(cache.covers("/") && cache.covers("/foo/bar") && !cache.covers("/bar"));
        let stored = serde_json::to_string(&cache).expect("serialise");
        assert_eq!(
            serde_json::from_str::<ResponseCache>(&stored).expect("back"),
            cache
        );
    }

    #[test]
    fn every_refusal_names_its_field() {
        let cases: &[(Value, &str)] = &[
            (json!({}), "paths"),
            (json!({"paths": []}), "paths"),
            (json!({"paths": ["x"]}), "paths[0]"),
            (json!({"paths": ["/"], "store": "disk"}), "store"),
            (json!({"paths": ["/"], "ttl_s": 0}), "ttl_s"),
            (json!({"paths": ["/"], "default_ttl_s": 0}), "default_ttl_s"),
            (
                json!({"paths": ["/"], "default_ttl_s": 5, "ttl_s": 5}),
                "ttl_s",
            ),
            (json!({"paths": ["/"], "max_bytes": 10}), "max_bytes"),
            (
                json!({"paths": ["/"], "max_bytes": 2048, "max_object_bytes": 4096}),
                "max_object_bytes",
            ),
            (
                json!({"paths": ["/"], "cache_set_cookie": 1}),
                "cache_set_cookie",
            ),
            (json!({"paths": ["/"], "tll_s": 5}), "tll_s"),
        ];
        for (spec, field) in cases {
            let err = parse_cache(spec).expect_err(&format!("{spec} must be refused"));
            assert_eq!(&err.field, field, "{spec}: {err}");
        }
    }
}
