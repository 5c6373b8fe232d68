//! Whether a shared cache may keep an app's answer, and for how long it stays fresh, read
//! from the answer's own fields as RFC 9111 says (§3 storing, §4.2 freshness and age), with
//! RFC 5861's `stale-if-error` and RFC 9213's targeted fields (`CDN-Cache-Control`, then
//! `Surrogate-Control`) read before `Cache-Control`.
//!
//! Freshness: `s-maxage`, else `max-age`, else `Expires` − `Date`; an invalid value of the
//! one that decides means stale, and so does an invalid `Age` (§4.2.3: anything but one
//! non-negative integer). Without any of them, heuristic freshness (a tenth of the time
//! since `Last-Modified`, at most a day) for the statuses cacheable by default, or the
//! app's own `default_ttl_s` floor; otherwise the answer is not kept.
//!
//! Which field speaks to this cache: `CDN-Cache-Control` when present, else
//! `Surrogate-Control` when it holds a directive for every surrogate (one targeted at a
//! named device, `max-age=60;edge-b`, is another surrogate's; Fastly likewise reads only
//! its own), else `Cache-Control` and `Expires`.

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
/// The final statuses whose caching rules this cache knows (RFC 9110 §15, with 425, 429 and
/// 451 from RFC 8470, 6585 and 7725): an answer with `must-understand` and any other status
/// is not kept (RFC 9111 §5.2.2.3).
const UNDERSTOOD: &[u16] = &[
    200, 201, 202, 203, 204, 205, 206, 300, 301, 302, 303, 304, 305, 307, 308, 400, 401, 402, 403,
    404, 405, 406, 407, 408, 409, 410, 411, 412, 413, 414, 415, 416, 417, 421, 422, 425, 426, 428,
    429, 451, 500, 501, 502, 503, 504, 505,
];
/// The directives this cache reads; a `Surrogate-Control` with none of them (only
/// `content="ESI/1.0"`, or only other devices' directives) leaves the decision to
/// `Cache-Control`.
const READ_DIRECTIVES: &[&str] = &[
    "no-store",
    "no-cache",
    "private",
    "must-revalidate",
    "proxy-revalidate",
    "must-understand",
    "max-age",
    "s-maxage",
    "stale-if-error",
    "stale-while-revalidate",
];

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
    /// `must-understand`: kept only when the status is one this cache knows, and then
    /// `no-store` (there for caches that do not know it) is not read.
    must_understand: bool,
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
    if directives.must_understand {
        if !UNDERSTOOD.contains(&status) {
            return Err("must-understand, status not understood");
        }
    } else if directives.no_store {
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
    let age = age_field(headers);
    let (lifetime, decided_by) = match explicit {
        // Kept to be revalidated before every use (§5.2.2.4), whatever else it says.
        _ if directives.no_cache => (Duration::ZERO, "no-cache"),
        // How old it is cannot be known: stale, as an invalid lifetime is (§4.2.3).
        Some(_) if age == Delta::Invalid => (Duration::ZERO, "Age (invalid)"),
        Some((seconds, by)) => (Duration::from_secs(seconds.min(LARGEST_DELTA)), by),
        None => {
            if !CACHEABLE_BY_DEFAULT.contains(&status) {
                return Err("status without explicit freshness");
            }
            let heuristic = heuristic_lifetime(headers, date.unwrap_or(exchange.received_at));
            match (heuristic, exchange.default_ttl) {
                _ if age == Delta::Invalid => (Duration::ZERO, "Age (invalid)"),
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
    let initial_age = initial_age(exchange, date, age);
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

/// The answer's directives: those of the first targeted field that speaks to this cache
/// (and whether one did), else `Cache-Control`'s.
fn directives_of(headers: &HeaderMap) -> (Directives, bool) {
    for name in &TARGETED {
        if headers.contains_key(name) && speaks_to_this_cache(headers, name) {
            return (parse_directives(headers, name), true);
        }
    }
    (parse_directives(headers, &header::CACHE_CONTROL), false)
}

/// `CDN-Cache-Control` speaks to every CDN cache (RFC 9213 §3.1). `Surrogate-Control`
/// speaks only through the directives this cache reads that name no device (the Edge
/// Architecture's `directive;device-token` is for that device).
fn speaks_to_this_cache(headers: &HeaderMap, name: &HeaderName) -> bool {
    if name != TARGETED[1] {
        return true;
    }
    headers.get_all(name).iter().any(|value| {
        split_directives(value.as_bytes())
            .iter()
            .any(|(directive, argument)| {
                !names_a_device(directive, argument.as_deref())
                    && READ_DIRECTIVES.contains(&directive.to_ascii_lowercase().as_str())
            })
    })
}

/// Whether a `Surrogate-Control` directive is targeted at one device (`no-store;edge-b`,
/// `max-age=60;edge-b`).
fn names_a_device(directive: &str, argument: Option<&str>) -> bool {
    directive.contains(';') || argument.is_some_and(|a| !a.starts_with('"') && a.contains(';'))
}

fn parse_directives(headers: &HeaderMap, name: &HeaderName) -> Directives {
    let mut found = Directives::default();
    let device_targeted = *name == TARGETED[1];
    for value in headers.get_all(name) {
        for (directive, argument) in split_directives(value.as_bytes()) {
            let argument = match argument {
                _ if !device_targeted => argument,
                _ if names_a_device(&directive, argument.as_deref()) => continue,
                // The Edge Architecture's `max-age=N+M`: fresh for N, then M more for
                // removal, which this cache does not model.
                Some(a) => Some(a.split_once('+').map_or(a.clone(), |(n, _)| n.to_string())),
                None => None,
            };
            let first = |slot: &mut Delta| {
                if *slot == Delta::Absent {
                    *slot = delta(argument);
                }
            };
            match directive.to_ascii_lowercase().as_str() {
                "no-store" => found.no_store = true,
                "no-cache" => found.no_cache = true,
                "must-understand" => found.must_understand = true,
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
/// whole seconds, so the apparent age is taken from the end of its second. An invalid
/// `Age` counts nothing here: it has already made the answer stale.
fn initial_age(exchange: &Exchange<'_>, date: Option<SystemTime>, age: Delta) -> Duration {
    let apparent = date
        .and_then(|date| {
            exchange
                .received_at
                .duration_since(date + Duration::from_secs(1))
                .ok()
        })
        .unwrap_or_default();
    let age_value = match age {
        Delta::Seconds(seconds) => seconds.min(LARGEST_DELTA),
        Delta::Absent | Delta::Invalid => 0,
    };
    let delay = exchange
        .received_at
        .duration_since(exchange.sent_at)
        .unwrap_or_default();
    apparent.max(Duration::from_secs(age_value) + delay)
}

/// The `Age` an answer arrived with (§5.1): one line of delta-seconds, else invalid — a
/// word, a sign, a fraction, a parameter, a list, or a second line even of the same value
/// (which of two ages is meant cannot be told).
fn age_field(headers: &HeaderMap) -> Delta {
    let mut lines = headers.get_all(header::AGE).iter();
    match (lines.next(), lines.next()) {
        (None, _) => Delta::Absent,
        (Some(value), None) => match value.to_str() {
            Ok(text) => delta(Some(text.trim().to_string())),
            Err(_) => Delta::Invalid,
        },
        (Some(_), Some(_)) => Delta::Invalid,
    }
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
    fn an_invalid_age_makes_the_answer_stale() {
        let etag = ("etag", "\"v1\"");
        let fresh_for = |ages: &[&str]| {
            let mut fields = vec![("cache-control", "max-age=7200"), etag];
            fields.extend(ages.iter().map(|age| ("age", *age)));
            lifetime(&fields)
        };
        assert_eq!(fresh_for(&["3600"]), Some((7200, "max-age")));
        assert_eq!(
            fresh_for(&[" 0"]),
            Some((7200, "max-age")),
            "spaces are not part of it"
        );
        for invalid in [
            &["old"][..],
            &["-1"],
            &["1.5"],
            &["0; foo=bar"],
            &["0; x=1"],
            &["old, 0"],
            &["0, 0"],
            &[""],
            &["0", "0"],
            &["3600", "3600"],
        ] {
            assert_eq!(
                fresh_for(invalid),
                Some((0, "Age (invalid)")),
                "{invalid:?}"
            );
        }
        assert_eq!(
            decided(200, &[("cache-control", "max-age=7200"), ("age", "1.5")]),
            Err("stale on arrival, without a validator")
        );
        assert_eq!(
            lifetime(&[
                ("date", NOW),
                ("last-modified", "Fri, 15 Jan 2027 07:00:00 GMT"),
                ("age", "x"),
                etag
            ]),
            Some((0, "Age (invalid)")),
            "heuristic freshness too"
        );
    }

    #[test]
    fn must_understand_keeps_only_statuses_this_cache_knows_and_overrides_no_store() {
        let with = |status, cc| decided(status, &[("cache-control", cc)]).map(|f| f.lifetime);
        assert_eq!(
            with(599, "max-age=60, must-understand"),
            Err("must-understand, status not understood")
        );
        assert_eq!(
            with(599, "max-age=60, must-understand, no-store"),
            Err("must-understand, status not understood")
        );
        assert_eq!(
            with(599, "max-age=60"),
            Ok(Duration::from_secs(60)),
            "without it, explicit freshness stores any final status"
        );
        assert_eq!(
            with(200, "max-age=60, must-understand, no-store"),
            Ok(Duration::from_secs(60))
        );
        assert_eq!(
            with(404, "max-age=60, must-understand"),
            Ok(Duration::from_secs(60))
        );
        assert_eq!(
            with(200, "max-age=60, must-understand, private"),
            Err("private")
        );
        assert_eq!(with(200, "max-age=60, no-store"), Err("no-store"));
    }

    #[test]
    fn surrogate_control_speaks_only_through_directives_for_every_surrogate() {
        // CDN-Cache-Control, then Surrogate-Control, then Cache-Control: each pair.
        assert_eq!(
            lifetime(&[
                ("surrogate-control", "max-age=60"),
                ("cache-control", "no-store")
            ]),
            Some((60, "max-age"))
        );
        assert_eq!(
            lifetime(&[
                ("surrogate-control", "no-store"),
                ("cache-control", "max-age=60")
            ]),
            None
        );
        assert_eq!(
            lifetime(&[
                ("cdn-cache-control", "max-age=60"),
                ("surrogate-control", "no-store")
            ]),
            Some((60, "max-age"))
        );
        assert_eq!(
            lifetime(&[
                ("cdn-cache-control", "no-store"),
                ("surrogate-control", "max-age=60")
            ]),
            None
        );
        // Another device's directives, or none this cache reads: Cache-Control decides.
        for other in [
            "max-age=600;edge-b",
            "no-store;edge-b",
            "content=\"ESI/1.0\"",
        ] {
            assert_eq!(
                lifetime(&[("surrogate-control", other), ("cache-control", "max-age=5")]),
                Some((5, "max-age")),
                "{other}"
            );
        }
        assert_eq!(
            lifetime(&[
                (
                    "surrogate-control",
                    "content=\"ESI/1.0\", max-age=30;edge-b, max-age=60+600"
                ),
                ("cache-control", "max-age=5")
            ]),
            Some((60, "max-age")),
            "its own max-age, the removal time after + aside"
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
            age(
                &[
                    ("cache-control", "max-age=600"),
                    ("age", "x"),
                    ("etag", "\"e\"")
                ],
                0
            ),
            Ok(0),
            "an invalid Age counts nothing: the answer is stale already"
        );
        let date = httpdate::fmt_http_date(sent - Duration::from_secs(300));
        assert_eq!(
            age(&[("cache-control", "max-age=600"), ("date", &date)], 0),
            Ok(299)
        );
    }
}
