//! Parsing of operator input (the admin API's JSON bodies) into validated model types.
//!
//! JSON is walked by hand rather than through `serde` derive so that every refusal names the
//! exact field (`backends[1].weight`), which is what an API client needs to point at.

use std::collections::HashSet;
use std::net::SocketAddr;

use serde_json::{Map, Value};

use crate::app::{default_retries, MAX_BACKENDS, MAX_CPU_WEIGHT, MAX_DOMAINS, MAX_WEIGHT};
use crate::cache::parse_cache;
use crate::mirror::{parse_mirror, MAX_FILTERS};
use crate::{
    App, AppName, AppTls, Backend, BackendAddress, Balancer, Domain, Drain, HealthCheck, Hsts,
    Timeouts, ValidationError,
};

pub(crate) type Fields<'a> = &'a Map<String, Value>;

/// The fields an app's spec may have.
const APP_FIELDS: &[&str] = &[
    "name",
    "domains",
    "backends",
    "balancer",
    "health_check",
    "timeouts",
    "retries",
    "https_redirect",
    "hsts",
    "mirror",
    "cache",
    "static_root",
    "waf",
    "images",
    "drain",
    "tls",
    "limits",
    "response_buffering",
    "request_buffering",
    "advertise_http3",
    "cpu_weight",
    "redirects",
    "maintenance",
    "error_pages",
    "headers",
    "basic_auth",
    "forwarding",
    "affinity",
    "compress",
    "filters",
    // What GET shows of the named backends' addresses: read-only, ignored here, so
    // an app read and written back is accepted.
    "resolved_backends",
];

/// Builds an app from the body of `PUT /v1/apps/{name}`.
///
/// Unknown fields are refused rather than ignored: a typo in an option must not silently
/// leave an app without the behaviour its operator asked for.
pub fn parse_app_spec(name: &str, body: &Value) -> Result<App, ValidationError> {
    let name = AppName::parse(name).map_err(|m| ValidationError::new("name", m))?;
    let fields = as_object(body, "")?;
    refuse_unknown(fields, APP_FIELDS, "")?;
    if let Some(given) = fields.get("name") {
        if given.as_str() != Some(name.as_str()) {
            return Err(ValidationError::new(
                "name",
                "does not match the name in the path",
            ));
        }
    }
    let domains = match fields.get("domains") {
        Some(v) => parse_domains(v)?,
        None => Vec::new(),
    };
    let backends = match fields.get("backends") {
        Some(v) => parse_backends(v).map_err(|e| e.under("backends"))?,
        None => Vec::new(),
    };
    let balancer = match fields.get("balancer") {
        None => Balancer::default(),
        Some(Value::String(s)) if s == "round_robin" => Balancer::RoundRobin,
        Some(Value::String(s)) if s == "least_loaded" => Balancer::LeastLoaded,
        Some(_) => {
            return Err(ValidationError::new(
                "balancer",
                "must be \"round_robin\" or \"least_loaded\"",
            ))
        }
    };
    let health_check = match fields.get("health_check") {
        None | Some(Value::Null) => None,
        Some(v) => Some(Box::new(
            parse_health_check(v).map_err(|e| e.under("health_check"))?,
        )),
    };
    let timeouts = match fields.get("timeouts") {
        None => Timeouts::default(),
        Some(v) => parse_timeouts(v).map_err(|e| e.under("timeouts"))?,
    };
    let retries = match fields.get("retries") {
        None => default_retries(),
        Some(v) => integer_in(v, 0, 10).map_err(|m| ValidationError::new("retries", m))? as u8,
    };
    let https_redirect = optional_bool(fields, "https_redirect", false)?;
    let response_buffering = optional_bool(fields, "response_buffering", true)?;
    let advertise_http3 = optional_bool(fields, "advertise_http3", true)?;
    let request_buffering = setting(
        fields,
        "request_buffering",
        crate::request_buffering::parse_request_buffering,
    )?
    .unwrap_or_default();
    let cpu_weight = match fields.get("cpu_weight") {
        None | Some(Value::Null) => 1,
        Some(v) => integer_in(v, 1, u64::from(MAX_CPU_WEIGHT))
            .map_err(|m| ValidationError::new("cpu_weight", m))? as u16,
    };
    let hsts = setting(fields, "hsts", parse_hsts)?;
    let mirror = setting(fields, "mirror", parse_mirror)?.map(Box::new);
    let cache = setting(fields, "cache", parse_cache)?.map(Box::new);
    let static_root = setting(fields, "static_root", |v| {
        parse_static_root(v).map_err(|m| ValidationError::new("", m))
    })?;
    let waf = setting(fields, "waf", crate::waf::parse_waf)?.flatten();
    let images = setting(fields, "images", crate::images::parse_images)?.map(Box::new);
    let drain = setting(fields, "drain", parse_drain)?.unwrap_or_default();
    let tls = setting(fields, "tls", parse_tls)?.unwrap_or_default();
    let limits = setting(fields, "limits", crate::limits::parse_limits)?.map(Box::new);
    let redirects = setting(fields, "redirects", |v| {
        crate::redirects::parse_redirects(v, &domains)
    })?
    .unwrap_or_default();
    let maintenance =
        setting(fields, "maintenance", crate::pages::parse_maintenance)?.map(Box::new);
    let error_pages =
        setting(fields, "error_pages", crate::pages::parse_error_pages)?.map(Box::new);
    let headers = setting(fields, "headers", crate::header_rules::parse_header_rules)?
        .map(Box::new)
        .filter(|rules| !rules.request.is_empty() || !rules.response.is_empty());
    let basic_auth =
        setting(fields, "basic_auth", crate::basic_auth::parse_basic_auth)?.map(Box::new);
    let forwarding = setting(fields, "forwarding", parse_forwarding)?.unwrap_or_default();
    let affinity = setting(fields, "affinity", crate::affinity::parse_affinity)?;
    let compress = setting(fields, "compress", crate::compress::parse_compress)?;
    let filters = setting(fields, "filters", crate::filters::parse_filters)?.unwrap_or_default();
    Ok(App {
        name,
        compress,
        filters,
        affinity,
        redirects,
        maintenance,
        error_pages,
        headers,
        basic_auth,
        forwarding,
        limits,
        domains,
        backends,
        balancer,
        health_check,
        timeouts,
        retries,
        https_redirect,
        hsts,
        mirror,
        cache,
        static_root,
        waf,
        images,
        drain,
        tls,
        response_buffering,
        request_buffering,
        advertise_http3,
        cpu_weight,
    })
}

/// The optional setting `key` as `parse` reads it, its errors placed under the key;
/// `None` when it is absent or null.
fn setting<T>(
    fields: Fields<'_>,
    key: &str,
    parse: impl FnOnce(&Value) -> Result<T, ValidationError>,
) -> Result<Option<T>, ValidationError> {
    match fields.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(value) => parse(value).map(Some).map_err(|e| e.under(key)),
    }
}

/// Parses the body of `PUT /v1/apps/{name}/backends`: `{"backends": [...]}`.
pub fn parse_backends_spec(body: &Value) -> Result<Vec<Backend>, ValidationError> {
    let fields = as_object(body, "")?;
    refuse_unknown(fields, &["backends"], "")?;
    let list = fields
        .get("backends")
        .ok_or_else(|| ValidationError::new("backends", "is required"))?;
    parse_backends(list).map_err(|e| e.under("backends"))
}

fn parse_domains(value: &Value) -> Result<Vec<Domain>, ValidationError> {
    let items = value
        .as_array()
        .ok_or_else(|| ValidationError::new("domains", "must be an array of hostnames"))?;
    if items.len() > MAX_DOMAINS {
        return Err(ValidationError::new(
            "domains",
            format!("at most {MAX_DOMAINS} domains per app"),
        ));
    }
    let mut seen = HashSet::new();
    let mut domains = Vec::with_capacity(items.len());
    for (i, item) in items.iter().enumerate() {
        let field = format!("domains[{i}]");
        let text = item
            .as_str()
            .ok_or_else(|| ValidationError::new(&field, "must be a string"))?;
        let domain = Domain::parse(text).map_err(|m| ValidationError::new(&field, m))?;
        if !seen.insert(domain.clone()) {
            return Err(ValidationError::new(&field, "is listed twice"));
        }
        domains.push(domain);
    }
    Ok(domains)
}

/// Field names are relative (`[1].weight`); the caller prefixes them.
fn parse_backends(value: &Value) -> Result<Vec<Backend>, ValidationError> {
    let items = value.as_array().ok_or_else(|| {
        ValidationError::new(
            "",
            "must be an array of \"ip:port\", \"host:port\", \"srv:NAME\" (each may end in \
             \"=WEIGHT\") or {address, weight}",
        )
    })?;
    if items.len() > MAX_BACKENDS {
        return Err(ValidationError::new(
            "",
            format!("at most {MAX_BACKENDS} backends per app"),
        ));
    }
    let mut seen = HashSet::new();
    let mut backends = Vec::with_capacity(items.len());
    for (i, item) in items.iter().enumerate() {
        let index = format!("[{i}]");
        let backend = parse_backend(item).map_err(|e| e.under(&index))?;
        if !seen.insert(backend.address.clone()) {
            return Err(ValidationError::new(index, "is listed twice"));
        }
        backends.push(backend);
    }
    Ok(backends)
}

fn parse_backend(value: &Value) -> Result<Backend, ValidationError> {
    match value {
        Value::String(text) => {
            // `host:port=WEIGHT`: `=` appears in no address form.
            let (address, weight) = match text.rsplit_once('=') {
                Some((address, weight)) => (
                    address,
                    weight
                        .parse::<u64>()
                        .ok()
                        .filter(|w| (1..=u64::from(MAX_WEIGHT)).contains(w))
                        .ok_or_else(|| {
                            ValidationError::new(
                                "",
                                format!("the weight after '=' must be 1 to {MAX_WEIGHT}"),
                            )
                        })? as u16,
                ),
                None => (text.as_str(), 1),
            };
            Ok(Backend {
                address: BackendAddress::parse(address).map_err(|m| ValidationError::new("", m))?,
                weight,
            })
        }
        Value::Object(fields) => {
            refuse_unknown(fields, &["address", "weight"], "")?;
            let address = fields
                .get("address")
                .and_then(Value::as_str)
                .ok_or_else(|| {
                    ValidationError::new("address", "is required, as \"ip:port\" or \"host:port\"")
                })?;
            let address =
                BackendAddress::parse(address).map_err(|m| ValidationError::new("address", m))?;
            let weight = match fields.get("weight") {
                None => 1,
                Some(v) => integer_in(v, 1, u64::from(MAX_WEIGHT))
                    .map_err(|m| ValidationError::new("weight", m))?
                    as u16,
            };
            Ok(Backend { address, weight })
        }
        _ => Err(ValidationError::new(
            "",
            "must be \"ip:port\", \"host:port\", \"srv:NAME\" or {\"address\": …, \"weight\": N}",
        )),
    }
}

pub(crate) fn parse_socket_addr(text: &str) -> Result<SocketAddr, String> {
    let address: SocketAddr = text
        .parse()
        .map_err(|_| format!("'{text}' is not an ip:port address (e.g. 10.0.0.5:8080)"))?;
    if address.port() == 0 {
        return Err("port must not be 0".into());
    }
    if address.ip().is_unspecified() || address.ip().is_multicast() {
        return Err(format!("'{}' cannot be connected to", address.ip()));
    }
    Ok(address)
}

fn parse_health_check(value: &Value) -> Result<HealthCheck, ValidationError> {
    let fields = as_object(value, "")?;
    refuse_unknown(
        fields,
        &[
            "path",
            "interval_ms",
            "timeout_ms",
            "unhealthy_threshold",
            "healthy_threshold",
        ],
        "",
    )?;
    let defaults = HealthCheck::default();
    let path = match fields.get("path") {
        None => defaults.path,
        Some(Value::String(p))
            if p.starts_with('/') && p.len() <= 1024 && p.bytes().all(|b| b.is_ascii_graphic()) =>
        {
            p.clone()
        }
        Some(_) => {
            return Err(ValidationError::new(
                "path",
                "must be an absolute path of printable ASCII (e.g. \"/health\")",
            ))
        }
    };
    let interval_ms =
        optional_integer(fields, "interval_ms", 100, 3_600_000, defaults.interval_ms)?;
    let timeout_ms = optional_integer(fields, "timeout_ms", 10, 60_000, defaults.timeout_ms)?;
    if timeout_ms > interval_ms {
        return Err(ValidationError::new(
            "timeout_ms",
            "must not exceed interval_ms",
        ));
    }
    Ok(HealthCheck {
        path,
        interval_ms,
        timeout_ms,
        unhealthy_threshold: optional_integer(fields, "unhealthy_threshold", 1, 100, 2)? as u32,
        healthy_threshold: optional_integer(fields, "healthy_threshold", 1, 100, 2)? as u32,
    })
}

fn parse_forwarding(value: &Value) -> Result<crate::AppForwarding, ValidationError> {
    let fields = as_object(value, "")?;
    refuse_unknown(fields, &["x_forwarded_host", "proxy_protocol"], "")?;
    let x_forwarded_host = optional_bool(fields, "x_forwarded_host", false)?;
    let proxy_protocol = match fields.get("proxy_protocol") {
        None | Some(Value::Null) => None,
        Some(value) => Some(
            value
                .as_u64()
                .and_then(|version| u8::try_from(version).ok())
                .and_then(|version| crate::ProxyProtocol::try_from(version).ok())
                .ok_or_else(|| ValidationError::new("proxy_protocol", "must be 1 or 2"))?,
        ),
    };
    Ok(crate::AppForwarding {
        x_forwarded_host,
        proxy_protocol,
    })
}

fn parse_tls(value: &Value) -> Result<AppTls, ValidationError> {
    let fields = as_object(value, "")?;
    refuse_unknown(fields, &["acme"], "")?;
    let acme = optional_bool(fields, "acme", false)?;
    Ok(AppTls { acme })
}

fn parse_hsts(value: &Value) -> Result<Hsts, ValidationError> {
    let fields = as_object(value, "")?;
    refuse_unknown(fields, &["max_age_s", "include_subdomains", "preload"], "")?;
    let hsts = Hsts {
        max_age_s: optional_integer(fields, "max_age_s", 0, 2 * 365 * 86_400, 365 * 86_400)?,
        include_subdomains: optional_bool(fields, "include_subdomains", false)?,
        preload: optional_bool(fields, "preload", false)?,
    };
    // Browsers' preload lists refuse entries that do not cover subdomains for a year.
    if hsts.preload && (!hsts.include_subdomains || hsts.max_age_s < 365 * 86_400) {
        return Err(ValidationError::new(
            "preload",
            "needs include_subdomains and max_age_s of at least 31536000",
        ));
    }
    Ok(hsts)
}

fn parse_drain(value: &Value) -> Result<Drain, ValidationError> {
    let fields = as_object(value, "")?;
    refuse_unknown(fields, &["removed_backend_s"], "")?;
    let removed_backend_s = match fields.get("removed_backend_s") {
        None | Some(Value::Null) => None,
        Some(v) => Some(
            integer_in(v, 1, Drain::MAX_REMOVED_BACKEND_S)
                .map_err(|m| ValidationError::new("removed_backend_s", m))?,
        ),
    };
    Ok(Drain { removed_backend_s })
}

fn parse_timeouts(value: &Value) -> Result<Timeouts, ValidationError> {
    let fields = as_object(value, "")?;
    refuse_unknown(fields, &["connect_ms", "read_ms", "write_ms"], "")?;
    let defaults = Timeouts::default();
    Ok(Timeouts {
        connect_ms: optional_integer(fields, "connect_ms", 10, 60_000, defaults.connect_ms)?,
        read_ms: optional_integer(fields, "read_ms", 10, 3_600_000, defaults.read_ms)?,
        write_ms: optional_integer(fields, "write_ms", 10, 3_600_000, defaults.write_ms)?,
    })
}

/// A list of strings parsed one by one, at most `MAX_FILTERS`; `[i]` names a bad entry.
pub(crate) fn parse_list<T>(
    value: Option<&Value>,
    field: &str,
    parse: impl Fn(&str) -> Result<T, String>,
) -> Result<Vec<T>, ValidationError> {
    let Some(value) = value else {
        return Ok(Vec::new());
    };
    let items = value
        .as_array()
        .ok_or_else(|| ValidationError::new(field, "must be an array of strings"))?;
    if items.len() > MAX_FILTERS {
        return Err(ValidationError::new(
            field,
            format!("at most {MAX_FILTERS} entries"),
        ));
    }
    items
        .iter()
        .enumerate()
        .map(|(i, item)| {
            let field = format!("{field}[{i}]");
            let text = item
                .as_str()
                .ok_or_else(|| ValidationError::new(&field, "must be a string"))?;
            parse(text).map_err(|m| ValidationError::new(&field, m))
        })
        .collect()
}

fn parse_static_root(value: &Value) -> Result<String, &'static str> {
    let dir = value
        .as_str()
        .map(|d| d.trim_end_matches('/'))
        .filter(|d| {
            d.starts_with('/')
                && d.len() <= 4096
                && !d.contains('\0')
                && !d.split('/').any(|segment| segment == "..")
        })
        .ok_or("must be an absolute directory path without '..' (and not /)")?;
    Ok(dir.to_string())
}

pub(crate) fn as_object<'a>(value: &'a Value, field: &str) -> Result<Fields<'a>, ValidationError> {
    value
        .as_object()
        .ok_or_else(|| ValidationError::new(field, "must be a JSON object"))
}

pub(crate) fn refuse_unknown(
    fields: Fields<'_>,
    known: &[&str],
    prefix: &str,
) -> Result<(), ValidationError> {
    match fields.keys().find(|k| !known.contains(&k.as_str())) {
        Some(unknown) => Err(ValidationError::new(
            format!("{prefix}{unknown}"),
            format!("unknown field; expected one of: {}", known.join(", ")),
        )),
        None => Ok(()),
    }
}

/// A true-or-false field, `default` when absent.
pub(crate) fn optional_bool(
    fields: Fields<'_>,
    name: &str,
    default: bool,
) -> Result<bool, ValidationError> {
    match fields.get(name) {
        None => Ok(default),
        Some(Value::Bool(b)) => Ok(*b),
        Some(_) => Err(ValidationError::new(name, "must be true or false")),
    }
}

pub(crate) fn optional_integer(
    fields: Fields<'_>,
    name: &str,
    min: u64,
    max: u64,
    default: u64,
) -> Result<u64, ValidationError> {
    match fields.get(name) {
        None => Ok(default),
        Some(v) => integer_in(v, min, max).map_err(|m| ValidationError::new(name, m)),
    }
}

/// An optional integer field within `min..=max`; `None` when absent.
pub(crate) fn integer_field(
    fields: Fields<'_>,
    name: &str,
    min: u64,
    max: u64,
) -> Result<Option<u64>, ValidationError> {
    fields
        .get(name)
        .map(|v| integer_in(v, min, max).map_err(|m| ValidationError::new(name, m)))
        .transpose()
}

/// Whether `text` is a token as RFC 9110 §5.6.2 has it (field names, cookie names): one or
/// more letters, digits and `!#$%&'*+-.^_`|~`.
pub(crate) fn is_token(text: &str) -> bool {
    !text.is_empty()
        && text
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b))
}

pub(crate) fn integer_in(value: &Value, min: u64, max: u64) -> Result<u64, String> {
    match value.as_u64() {
        Some(n) if (min..=max).contains(&n) => Ok(n),
        _ => Err(format!("must be an integer from {min} to {max}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_full_spec_is_accepted() {
        let app = parse_app_spec(
            "shop",
            &json!({
                "domains": ["Shop.Example.com", "*.shop.example.com"],
                "backends": ["127.0.0.1:9001", {"address": "[::1]:9002", "weight": 3}],
                "balancer": "least_loaded",
                "health_check": {"path": "/health", "interval_ms": 500, "timeout_ms": 200},
                "timeouts": {"read_ms": 5000},
                "retries": 1
            }),
        )
        .expect("valid spec");
        assert_eq!(app.domains[0].as_str(), "shop.example.com");
        assert!(app.domains[1].is_wildcard());
        assert_eq!(app.backends[1].weight, 3);
        assert_eq!(app.balancer, Balancer::LeastLoaded);
        assert_eq!(app.health_check.as_ref().map(|h| h.interval_ms), Some(500));
        assert_eq!(app.timeouts.read_ms, 5000);
        assert_eq!(app.timeouts.connect_ms, Timeouts::default().connect_ms);
        assert_eq!(app.retries, 1);
        assert!(app.drain.keeps_connections(), "no deadline unless asked");
    }

    #[test]
    fn a_drain_deadline_is_kept_and_round_trips() {
        let app =
            parse_app_spec("ws", &json!({"drain": {"removed_backend_s": 5}})).expect("valid spec");
        assert_eq!(app.drain.removed_backend_s, Some(5));
        let stored = serde_json::to_value(&app).expect("serialise");
        assert_eq!(stored["drain"], json!({"removed_backend_s": 5}));
        let back: App = serde_json::from_value(stored).expect("deserialise");
        assert_eq!(back, app);
        let plain = parse_app_spec("ws", &json!({"drain": null})).expect("valid spec");
        assert!(
            serde_json::to_value(&plain)
                .expect("serialise")
                .get("drain")
                .is_none(),
            "apps stored before the option existed read and write the same"
        );
    }

    #[test]
    fn backends_may_be_names_srv_records_and_carry_a_weight_suffix() {
        let app = parse_app_spec(
            "named",
            &json!({"backends": [
                "10.0.0.5:8080=3",
                "Web-1.Internal:8080",
                "web-2.internal.:9000=7",
                "srv:_http._tcp.web.service.consul",
                {"address": "api.internal:80", "weight": 5},
            ]}),
        )
        .expect("valid spec");
        let shown: Vec<(String, u16)> = app
            .backends
            .iter()
            .map(|b| (b.address.to_string(), b.weight))
            .collect();
        assert_eq!(
            shown,
            [
                ("10.0.0.5:8080".to_string(), 3),
                ("web-1.internal:8080".to_string(), 1),
                ("web-2.internal.:9000".to_string(), 7),
                ("srv:_http._tcp.web.service.consul".to_string(), 1),
                ("api.internal:80".to_string(), 5),
            ]
        );
        // Stored as the strings they were given as; read back the same.
        let stored = serde_json::to_value(&app).expect("serialise");
        assert_eq!(stored["backends"][1]["address"], "web-1.internal:8080");
        let back: App = serde_json::from_value(stored).expect("deserialise");
        assert_eq!(back, app);
    }

    #[test]
    fn every_refusal_names_its_field() {
        let cases: &[(&str, Value, &str)] = &[
            ("Bad_Name", json!({}), "name"),
            ("ok", json!([]), ""),
            ("ok", json!({"domain": []}), "domain"),
            ("ok", json!({"domains": "a.com"}), "domains"),
            ("ok", json!({"domains": ["a.com", "b..com"]}), "domains[1]"),
            ("ok", json!({"domains": ["a.com", "A.com"]}), "domains[1]"),
            (
                "ok",
                json!({"backends": ["127.0.0.1:80", "nope"]}),
                "backends[1]",
            ),
            ("ok", json!({"backends": ["bad_host:80"]}), "backends[0]"),
            (
                "ok",
                json!({"backends": ["web.internal:80=0"]}),
                "backends[0]",
            ),
            ("ok", json!({"backends": ["srv:"]}), "backends[0]"),
            ("ok", json!({"backends": ["web.internal"]}), "backends[0]"),
            (
                "ok",
                json!({"backends": ["web.internal:80", "WEB.internal:80=2"]}),
                "backends[1]",
            ),
            ("ok", json!({"backends": ["127.0.0.1:0"]}), "backends[0]"),
            (
                "ok",
                json!({"backends": [{"address": "127.0.0.1:80", "weight": 0}]}),
                "backends[0].weight",
            ),
            (
                "ok",
                json!({"backends": [{"address": "127.0.0.1:80", "wieght": 2}]}),
                "backends[0].wieght",
            ),
            (
                "ok",
                json!({"backends": ["127.0.0.1:80", "127.0.0.1:80"]}),
                "backends[1]",
            ),
            ("ok", json!({"balancer": "random"}), "balancer"),
            (
                "ok",
                json!({"health_check": {"path": "health"}}),
                "health_check.path",
            ),
            (
                "ok",
                json!({"health_check": {"interval_ms": 100, "timeout_ms": 500}}),
                "health_check.timeout_ms",
            ),
            (
                "ok",
                json!({"timeouts": {"read_ms": -1}}),
                "timeouts.read_ms",
            ),
            ("ok", json!({"retries": 11}), "retries"),
            ("ok", json!({"name": "other"}), "name"),
            (
                "ok",
                json!({"mirror": {"backends": ["127.0.0.1:9"], "key": "ip"}}),
                "mirror.key",
            ),
            ("ok", json!({"static_root": "srv/www"}), "static_root"),
            ("ok", json!({"static_root": "/srv/../etc"}), "static_root"),
            ("ok", json!({"static_root": "/"}), "static_root"),
            ("ok", json!({"drain": 5}), "drain"),
            ("ok", json!({"drain": {"removed_s": 5}}), "drain.removed_s"),
            (
                "ok",
                json!({"drain": {"removed_backend_s": 0}}),
                "drain.removed_backend_s",
            ),
            (
                "ok",
                json!({"drain": {"removed_backend_s": 604_801}}),
                "drain.removed_backend_s",
            ),
        ];
        for (name, body, field) in cases {
            let err = parse_app_spec(name, body).expect_err(&format!("{body} must be refused"));
            assert_eq!(&err.field, field, "{body}: {err}");
        }
    }

    #[test]
    fn backends_body_requires_the_list() {
        assert_eq!(
            parse_backends_spec(&json!({})).map_err(|e| e.field),
            Err("backends".to_string())
        );
        let backends = parse_backends_spec(&json!({"backends": ["10.0.0.1:8080"]})).expect("valid");
        assert_eq!(backends[0].address.ip().map(|a| a.port()), Some(8080));
    }

    #[test]
    fn app_names_follow_the_pattern() {
        for ok in ["a", "0", "my-app-2", &"a".repeat(63)] {
            assert!(AppName::parse(ok).is_ok(), "{ok}");
        }
        for bad in ["", "-a", "A", "a_b", "a.b", &"a".repeat(64)] {
            assert!(AppName::parse(bad).is_err(), "{bad}");
        }
    }
}
