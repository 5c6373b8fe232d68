//! Whether a shared cache may keep an app's answer, and for how long it stays fresh, read
//! from the answer's own fields as RFC 9111 says (§3 storing, §4.2 freshness and age), with
//! RFC 5861's `stale-if-error` and RFC 9213's targeted fields (`CDN-Cache-Control`, then
//! `Surrogate-Control`) read before `Cache-Control`.
//!
//! Freshness: `s-maxage`, else `max-age`, else `Expires` − `Date`; an invalid value of the
//! one that decides means stale. Without any of them, heuristic freshness (a tenth of the
//! time since `Last-Modified`, at most a day) for the statuses cacheable by default, or the
//! app's own `default_ttl_s` floor; otherwise the answer is not kept.

use std::time::{Duration, SystemTime};

use http::{header, HeaderMap, HeaderName};

/// Statuses a cache may keep without explicit freshness (RFC 9110 §15.1), 206 aside: the
/// cache keeps whole answers only.
const CACHEABLE_BY_DEFAULT: &[u16] = &[200, 203, 204, 300, 301, 308, 404, 405, 410, 414, 501];
/// Heuristic freshness is this fraction of the time since `Last-Modified` (§4.2.2's
/// "typical setting"), capped as Squid, Varnish and Traffic Server cap it.
const HEURISTIC_DIVISOR: u32 = 10;
const HEURISTIC_CEILING: Duration = Duration::from_secs(86_400);
/// Delta-seconds past this are taken as it (§1.2.2).
const LARGEST_DELTA: u64 = 1 << 31;

/// The targeted fields, most specific first (RFC 9213 §2.2: the first present wins, and
/// `Cache-Control` and `Expires` are then not read).
pub(crate) const TARGETED: [HeaderName; 2] = [
    HeaderName::from_static("cdn-cache-control"),
    HeaderName::from_static("surrogate-control"),
];

/// A directive's delta-seconds argument.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
enum Delta {
    #[default]
    Absent,
    Seconds(u64),
    /// Not a plain number: quoted, negative, empty.
    Invalid,
}

#[derive(Debug, Default)]
struct Directives {
    no_store: bool,
    no_cache: bool,
    private: bool,
    /// `must-revalidate` or `proxy-revalidate`.
    must_revalidate: bool,
    max_age: Delta,
    s_maxage: Delta,
    stale_if_error: Delta,
    stale_while_revalidate: Delta,
}

/// What the app's answer allows, once it may be kept.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Freshness {
    /// The freshness lifetime (§4.2.1).
    pub(crate) lifetime: Duration,
    /// The field that decided it, for `explain` and the logs.
    pub(crate) decided_by: &'static str,
    /// The age the answer arrived with (§4.2.3's corrected initial age).
    pub(crate) initial_age: Duration,
    /// How long past its freshness the copy may stand in for a failing app: zero when
    /// the app forbids serving it stale (`must-revalidate`, `proxy-revalidate`,
    /// `s-maxage`, `no-cache`).
    pub(crate) stale_if_error: Duration,
    /// How long past its freshness the copy may answer while another request revalidates
    /// it (RFC 5861 `stale-while-revalidate`); zero when it may not be served stale.
    pub(crate) stale_while_revalidate: Duration,
    /// Whether it carries a validator (`ETag`, `Last-Modified`) to revalidate with.
    pub(crate) has_validator: bool,
}

/// One exchange with the app, as the freshness rules need it.
pub(crate) struct Exchange<'a> {
    pub(crate) status: u16,
    pub(crate) headers: &'a HeaderMap,
    /// When the request was sent to the app, and when its answer arrived.
    pub(crate) sent_at: SystemTime,
    pub(crate) received_at: SystemTime,
    /// The app's `default_ttl_s`: freshness floor when the answer gives none.
    pub(crate) default_ttl: Option<Duration>,
    /// The app's own `stale_if_error_s`, beside the answer's `stale-if-error`.
    pub(crate) stale_if_error: Duration,
}

/// How long the answer stays fresh, or why it must not be kept.
pub(crate) fn decide(exchange: &Exchange<'_>) -> Result<Freshness, &'static str> {
    let Exchange {
        status, headers, ..
    } = *exchange;
    if !(200..600).contains(&status) || status == 206 {
        return Err("status");
    }
    let (directives, targeted) = directives_of(headers);
    if directives.no_store {
        return Err("no-store");
    }
    if directives.private {
        return Err("private");
    }
    let date = date_field(headers, header::DATE);
    let explicit = match (directives.s_maxage, directives.max_age) {
        (Delta::Seconds(s), _) => Some((s, "s-maxage")),
        (Delta::Invalid, _) => Some((0, "s-maxage (invalid)")),
        (Delta::Absent, Delta::Seconds(s)) => Some((s, "max-age")),
        (Delta::Absent, Delta::Invalid) => Some((0, "max-age (invalid)")),
        (Delta::Absent, Delta::Absent) if !targeted => {
            headers
                .get(header::EXPIRES)
                .map(|expires| match httpdate_of(expires.as_bytes()) {
                    Some(expires) => {
                        let since = date.unwrap_or(exchange.received_at);
                        let lifetime = expires.duration_since(since).unwrap_or_default();
                        (lifetime.as_secs(), "Expires - Date")
                    }
                    // "0" and other invalid dates mean already expired (§5.3).
                    None => (0, "Expires (invalid)"),
                })
        }
        (Delta::Absent, Delta::Absent) => None,
    };
    let has_validator = has_validator(headers);
    let (lifetime, decided_by) = match explicit {
        // Kept to be revalidated before every use (§5.2.2.4), whatever else it says.
        _ if directives.no_cache => (Duration::ZERO, "no-cache"),
        Some((seconds, by)) => (Duration::from_secs(seconds.min(LARGEST_DELTA)), by),
        None => {
            if !CACHEABLE_BY_DEFAULT.contains(&status) {
                return Err("status without explicit freshness");
            }
            let heuristic = heuristic_lifetime(headers, date.unwrap_or(exchange.received_at));
            match (heuristic, exchange.default_ttl) {
                (Some(h), Some(floor)) if floor > h => (floor, "default_ttl_s"),
                (Some(h), _) => (h, "heuristic (Last-Modified)"),
                (None, Some(floor)) => (floor, "default_ttl_s"),
                (None, None) => return Err("no freshness information"),
            }
        }
    };
    let serves_stale =
        !directives.must_revalidate && !directives.no_cache && directives.s_maxage == Delta::Absent;
    let granted = |delta: Delta| match delta {
        Delta::Seconds(s) if serves_stale => Duration::from_secs(s.min(LARGEST_DELTA)),
        _ => Duration::ZERO,
    };
    let stale_if_error = if serves_stale {
        granted(directives.stale_if_error).max(exchange.stale_if_error)
    } else {
        Duration::ZERO
    };
    let stale_while_revalidate = granted(directives.stale_while_revalidate);
    let initial_age = initial_age(exchange, date);
    if lifetime <= initial_age && !has_validator && stale_if_error.is_zero() {
        return Err("stale on arrival, without a validator");
    }
    Ok(Freshness {
        lifetime,
        decided_by,
        initial_age,
        stale_if_error,
        stale_while_revalidate,
        has_validator,
    })
}

/// The answer's directives: those of the first targeted field present (and whether one
/// was), else `Cache-Control`'s.
fn directives_of(headers: &HeaderMap) -> (Directives, bool) {
    for name in &TARGETED {
        if headers.contains_key(name) {
            return (parse_directives(headers, name), true);
        }
    }
    (parse_directives(headers, &header::CACHE_CONTROL), false)
}

fn parse_directives(headers: &HeaderMap, name: &HeaderName) -> Directives {
    let mut found = Directives::default();
    for value in headers.get_all(name) {
        for (directive, argument) in split_directives(value.as_bytes()) {
            let first = |slot: &mut Delta| {
                if *slot == Delta::Absent {
                    *slot = delta(argument);
                }
            };
            match directive.to_ascii_lowercase().as_str() {
                "no-store" => found.no_store = true,
                "no-cache" => found.no_cache = true,
                "private" => found.private = true,
                "must-revalidate" | "proxy-revalidate" => found.must_revalidate = true,
                "max-age" => first(&mut found.max_age),
                "s-maxage" => first(&mut found.s_maxage),
                "stale-if-error" => first(&mut found.stale_if_error),
                "stale-while-revalidate" => first(&mut found.stale_while_revalidate),
                _ => {}
            }
        }
    }
    found
}

/// `name[=argument]` pairs of a directive list; commas inside a quoted argument (as in
/// `no-cache="Set-Cookie, X"`) do not split it. Quoted arguments keep their quotes.
fn split_directives(value: &[u8]) -> Vec<(String, Option<String>)> {
    let mut directives = Vec::new();
    let mut current = Vec::new();
    let mut quoted = false;
    let mut escaped = false;
    for &byte in value.iter().chain(std::iter::once(&b',')) {
        match byte {
            _ if escaped => escaped = false,
            b'\\' if quoted => escaped = true,
            b'"' => quoted = !quoted,
            b',' if !quoted => {
                let text = String::from_utf8_lossy(&current).trim().to_string();
                current.clear();
                if !text.is_empty() {
                    let (name, argument) = match text.split_once('=') {
                        Some((n, a)) => (n.trim().to_string(), Some(a.trim().to_string())),
                        None => (text, None),
                    };
                    directives.push((name, argument));
                }
                continue;
            }
            _ => {}
        }
        current.push(byte);
    }
    directives
}

/// Delta-seconds (§1.2.2): digits only; larger than 2³¹ is 2³¹.
fn delta(argument: Option<String>) -> Delta {
    match argument {
        Some(digits) if !digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit()) => {
            Delta::Seconds(digits.parse().unwrap_or(LARGEST_DELTA))
        }
        _ => Delta::Invalid,
    }
}

fn heuristic_lifetime(headers: &HeaderMap, date: SystemTime) -> Option<Duration> {
    let last_modified = date_field(headers, header::LAST_MODIFIED)?;
    let unchanged_for = date.duration_since(last_modified).ok()?;
    Some((unchanged_for / HEURISTIC_DIVISOR).min(HEURISTIC_CEILING))
}

/// §4.2.3's corrected initial age: the larger of what the clocks say (`Date` to arrival)
/// and what caches before said (`Age`) plus the time the exchange took. `Date` counts in
/// whole seconds, so the apparent age is taken from the end of its second.
fn initial_age(exchange: &Exchange<'_>, date: Option<SystemTime>) -> Duration {
    let apparent = date
        .and_then(|date| {
            exchange
                .received_at
                .duration_since(date + Duration::from_secs(1))
                .ok()
        })
        .unwrap_or_default();
    let age_value = exchange
        .headers
        .get(header::AGE)
        .and_then(|v| v.to_str().ok())
        .filter(|v| !v.is_empty() && v.bytes().all(|b| b.is_ascii_digit()))
        .map_or(0, |v| v.parse().unwrap_or(LARGEST_DELTA).min(LARGEST_DELTA));
    let delay = exchange
        .received_at
        .duration_since(exchange.sent_at)
        .unwrap_or_default();
    apparent.max(Duration::from_secs(age_value) + delay)
}

/// Whether an answer carries a validator (`ETag`, `Last-Modified`) to be revalidated with.
pub(crate) fn has_validator(headers: &HeaderMap) -> bool {
    headers.contains_key(header::ETAG) || headers.contains_key(header::LAST_MODIFIED)
}

pub(crate) fn date_field(headers: &HeaderMap, name: HeaderName) -> Option<SystemTime> {
    httpdate_of(headers.get(name)?.as_bytes())
}

fn httpdate_of(value: &[u8]) -> Option<SystemTime> {
    httpdate::parse_http_date(std::str::from_utf8(value).ok()?.trim()).ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::response_cache::memory::FRESHNESS_DECIDERS;
    use crate::stage::cache::test_fields;

    fn decided(status: u16, fields: &[(&str, &str)]) -> Result<Freshness, &'static str> {
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000);
        decide(&Exchange {
            status,
            headers: &test_fields(fields),
            sent_at: now,
            received_at: now,
            default_ttl: None,
            stale_if_error: Duration::ZERO,
        })
    }

    fn lifetime(fields: &[(&str, &str)]) -> Option<(u64, &'static str)> {
        let decided = decided(200, fields).ok()?;
        assert!(
            FRESHNESS_DECIDERS.contains(&decided.decided_by),
            "{}",
            decided.decided_by
        );
        Some((decided.lifetime.as_secs(), decided.decided_by))
    }

    const NOW: &str = "Fri, 15 Jan 2027 08:00:00 GMT";

    #[test]
    fn s_maxage_over_max_age_over_expires_and_invalid_means_stale() {
        let etag = ("etag", "\"v1\"");
        assert_eq!(
            lifetime(&[("cache-control", "max-age=5, s-maxage=9")]),
            Some((9, "s-maxage"))
        );
        assert_eq!(
            lifetime(&[
                ("cache-control", "max-age=5"),
                ("expires", "Fri, 15 Jan 2027 09:00:00 GMT")
            ]),
            Some((5, "max-age"))
        );
        assert_eq!(
            lifetime(&[("date", NOW), ("expires", "Fri, 15 Jan 2027 08:02:00 GMT")]),
            Some((120, "Expires - Date"))
        );
        for invalid in ["max-age=-1", "max-age=\"60\"", "max-age=", "max-age"] {
            assert_eq!(
                lifetime(&[("cache-control", invalid), etag]),
                Some((0, "max-age (invalid)")),
                "{invalid}"
            );
            assert_eq!(
                lifetime(&[("cache-control", invalid)]),
                None,
                "{invalid}: stale and nothing to revalidate with"
            );
        }
        assert_eq!(
            lifetime(&[("expires", "0"), etag]),
            Some((0, "Expires (invalid)"))
        );
        assert_eq!(
            lifetime(&[("cache-control", "max-age=99999999999")]),
            Some((1 << 31, "max-age"))
        );
    }

    #[test]
    fn without_explicit_freshness_only_last_modified_gives_a_heuristic() {
        assert_eq!(lifetime(&[]), None);
        assert_eq!(lifetime(&[("date", NOW)]), None);
        assert_eq!(
            lifetime(&[
                ("date", NOW),
                ("last-modified", "Fri, 15 Jan 2027 07:00:00 GMT")
            ]),
            Some((360, "heuristic (Last-Modified)"))
        );
        assert_eq!(
            lifetime(&[
                ("date", NOW),
                ("last-modified", "Thu, 01 Jan 2015 00:00:00 GMT")
            ]),
            Some((86_400, "heuristic (Last-Modified)")),
            "capped at a day"
        );
        assert_eq!(
            decided(302, &[("last-modified", "Thu, 01 Jan 2015 00:00:00 GMT")]),
            Err("status without explicit freshness")
        );
        assert_eq!(
            decided(302, &[("cache-control", "max-age=60")]).map(|f| f.lifetime),
            Ok(Duration::from_secs(60))
        );
        assert_eq!(
            decided(206, &[("cache-control", "max-age=60")]),
            Err("status")
        );
        let floor = |fields: &[(&str, &str)]| {
            let now = SystemTime::now();
            decide(&Exchange {
                status: 200,
                headers: &test_fields(fields),
                sent_at: now,
                received_at: now,
                default_ttl: Some(Duration::from_secs(30)),
                stale_if_error: Duration::ZERO,
            })
            .map(|f| (f.lifetime.as_secs(), f.decided_by))
        };
        assert_eq!(floor(&[]), Ok((30, "default_ttl_s")));
        assert_eq!(floor(&[("cache-control", "max-age=5")]), Ok((5, "max-age")));
    }

    #[test]
    fn storing_refusals_and_the_directives_that_forbid_serving_stale() {
        assert_eq!(
            decided(200, &[("cache-control", "no-store")]),
            Err("no-store")
        );
        assert_eq!(
            decided(200, &[("cache-control", "private=\"x, y\", max-age=60")]),
            Err("private")
        );
        let with_window = |cc: &str| {
            let now = SystemTime::now();
            decide(&Exchange {
                status: 200,
                headers: &test_fields(&[("cache-control", cc), ("etag", "\"a\"")]),
                sent_at: now,
                received_at: now,
                default_ttl: None,
                stale_if_error: Duration::from_secs(100),
            })
            .map(|f| (f.lifetime.as_secs(), f.stale_if_error.as_secs()))
        };
        assert_eq!(with_window("max-age=10"), Ok((10, 100)));
        assert_eq!(with_window("max-age=10, stale-if-error=500"), Ok((10, 500)));
        assert_eq!(with_window("max-age=10, must-revalidate"), Ok((10, 0)));
        let while_revalidating = |cc: &str| {
            decided(200, &[("cache-control", cc)]).map(|f| f.stale_while_revalidate.as_secs())
        };
        assert_eq!(
            while_revalidating("max-age=10, stale-while-revalidate=30"),
            Ok(30)
        );
        assert_eq!(
            while_revalidating("max-age=10, stale-while-revalidate=30, must-revalidate"),
            Ok(0)
        );
        assert_eq!(with_window("s-maxage=10, stale-if-error=500"), Ok((10, 0)));
        assert_eq!(
            with_window("no-cache=\"set-cookie, x\", max-age=10"),
            Ok((0, 0))
        );
    }

    #[test]
    fn targeted_fields_are_read_before_cache_control() {
        assert_eq!(
            lifetime(&[
                ("cache-control", "no-store"),
                ("cdn-cache-control", "max-age=600")
            ]),
            Some((600, "max-age"))
        );
        assert_eq!(
            lifetime(&[
                ("surrogate-control", "max-age=60"),
                ("cdn-cache-control", "max-age=7")
            ]),
            Some((7, "max-age"))
        );
        assert_eq!(
            lifetime(&[
                ("cache-control", "max-age=60"),
                ("cdn-cache-control", "no-store")
            ]),
            None
        );
    }

    #[test]
    fn the_age_counts_upstream_age_the_exchange_and_the_date() {
        let sent = SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000);
        let age = |fields: &[(&str, &str)], took: u64| {
            decide(&Exchange {
                status: 200,
                headers: &test_fields(fields),
                sent_at: sent,
                received_at: sent + Duration::from_secs(took),
                default_ttl: None,
                stale_if_error: Duration::ZERO,
            })
            .map(|f| f.initial_age.as_secs())
        };
        assert_eq!(
            age(&[("cache-control", "max-age=600"), ("age", "100")], 2),
            Ok(102)
        );
        assert_eq!(
            age(&[("cache-control", "max-age=600"), ("age", "x")], 0),
            Ok(0)
        );
        let date = httpdate::fmt_http_date(sent - Duration::from_secs(300));
        assert_eq!(
            age(&[("cache-control", "max-age=600"), ("date", &date)], 0),
            Ok(299)
        );
    }
}
