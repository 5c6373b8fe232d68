//! What a backend is told about the client a request comes from and the router it came
//! through: `X-Forwarded-For` (the client's address appended to what the request carried),
//! `X-Forwarded-Proto`, `X-Forwarded-Port` (the port the client connected to),
//! `X-Request-Id`, `X-Request-Start` (when the router took the request, `t=` and
//! microseconds since the epoch, as Heroku's router sets it: APM agents and autoscalers
//! read the time a request queued behind the app's busy workers from it), `Via` (RFC 9110
//! §7.6.3: the protocol the request came in and the router's pseudonym, after any earlier
//! hops'), and `X-Forwarded-Host` for apps that ask. Every request the router sends on a
//! client's behalf carries them — the client's own, a mirror copy, an image's original —
//! made here, once a request, and written by whichever writer sends it: the HTTP/1 writer
//! from [`Forwarding::fields`], a map from [`Forwarding::set_on`].

use std::net::IpAddr;
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use http::header::{HeaderName, VIA};
use http::{HeaderMap, HeaderValue, Version};

pub(crate) const X_FORWARDED_FOR: HeaderName = HeaderName::from_static("x-forwarded-for");
pub(crate) const X_REQUEST_ID: HeaderName = HeaderName::from_static("x-request-id");

/// How many fields [`Forwarding::fields`] gives at most.
pub(crate) const MOST_FIELDS: usize = 7;

/// What a request's forwarding fields are made of, beside the client's address.
pub(crate) struct Hop<'a> {
    /// Whether the client came over TLS.
    pub(crate) tls: bool,
    pub(crate) request_id: &'a Arc<str>,
    /// The port the client connected to.
    pub(crate) server_port: u16,
    /// When the router took the request, by the wall clock.
    pub(crate) started: SystemTime,
    /// The version the client spoke.
    pub(crate) version: Version,
    /// The Host the client asked for, when the app wants `X-Forwarded-Host`.
    pub(crate) forwarded_host: Option<&'a [u8]>,
}

/// The forwarding fields of one request, which replace any of the same name it carried
/// (but `Via`, which follows the request's own).
pub(crate) struct Forwarding {
    /// `None` with no client address, or none that could be made a value: the request's
    /// own `X-Forwarded-For`, if any, then goes on as it came.
    forwarded_for: Option<HeaderValue>,
    tls: bool,
    request_id: Arc<str>,
    request_start: Digits<18>,
    port: Digits<7>,
    via: &'static str,
    forwarded_host: Option<HeaderValue>,
}

impl Forwarding {
    /// `previous`: the `X-Forwarded-For` the request carried; `client_address`: the client's
    /// address already made a value, for a request that carried none (a connection makes
    /// it once for all its requests).
    pub(crate) fn new(
        previous: Option<&[u8]>,
        client_ip: Option<IpAddr>,
        client_address: Option<&HeaderValue>,
        hop: &Hop<'_>,
    ) -> Self {
        let forwarded_for = match (client_ip, previous, client_address) {
            (None, _, _) => None,
            (Some(_), None, Some(own)) => Some(own.clone()),
            (Some(ip), previous, _) => HeaderValue::try_from(forwarded_for(previous, ip)).ok(),
        };
        let started_us = hop
            .started
            .duration_since(UNIX_EPOCH)
            .map_or(0, |since| since.as_micros() as u64);
        Self {
            forwarded_for,
            tls: hop.tls,
            request_id: hop.request_id.clone(),
            request_start: Digits::of(started_us),
            port: Digits::of(u64::from(hop.server_port)),
            via: via_of(hop.version),
            forwarded_host: hop
                .forwarded_host
                .and_then(|host| HeaderValue::from_bytes(host).ok()),
        }
    }

    /// Names (lower case) and values, in the order they are written.
    pub(crate) fn fields(&self) -> impl Iterator<Item = (&'static str, &[u8])> {
        let proto: &[u8] = if self.tls { b"https" } else { b"http" };
        [
            (
                "x-forwarded-for",
                self.forwarded_for.as_ref().map(HeaderValue::as_bytes),
            ),
            ("x-forwarded-proto", Some(proto)),
            ("x-forwarded-port", Some(self.port.as_bytes())),
            ("x-request-id", Some(self.request_id.as_bytes())),
            ("x-request-start", Some(self.request_start.with_prefix())),
            ("via", Some(self.via.as_bytes())),
            (
                "x-forwarded-host",
                self.forwarded_host.as_ref().map(HeaderValue::as_bytes),
            ),
        ]
        .into_iter()
        .filter_map(|(name, value)| Some((name, value?)))
    }

    /// Puts the fields in `headers`, in place of any of the same name (`Via` after any).
    pub(crate) fn set_on(self, headers: &mut HeaderMap) {
        // The writer's list, the one list of the fields and their order.
        for (name, value) in self.fields() {
            let Ok(value) = HeaderValue::from_bytes(value) else {
                continue;
            };
            let name = HeaderName::from_static(name);
            if name == VIA {
                headers.append(name, value);
            } else {
                headers.insert(name, value);
            }
        }
    }
}

/// `Via`'s value for a request that came in `version`: the protocol, then the router's
/// pseudonym (RFC 9110 §7.6.3 lets a proxy name itself so rather than by host).
fn via_of(version: Version) -> &'static str {
    match version {
        Version::HTTP_10 => "1.0 switchyard",
        Version::HTTP_2 => "2 switchyard",
        Version::HTTP_3 => "3 switchyard",
        _ => "1.1 switchyard",
    }
}

/// A number's decimal digits, kept without an allocation; `t=` before them for
/// `X-Request-Start`. `N`: the most digits and the prefix's two (a microsecond clock
/// needs 16 digits until 2286, a port 5).
struct Digits<const N: usize> {
    bytes: [u8; N],
    start: usize,
}

impl<const N: usize> Digits<N> {
    fn of(n: u64) -> Self {
        // itoa: two digits a step from a table, a fifth of a division loop's instructions
        // (callgrind), on every request.
        let mut buffer = itoa::Buffer::new();
        let digits = buffer.format(n).as_bytes();
        let digits = &digits[digits.len().saturating_sub(N - 2)..];
        let mut bytes = [0u8; N];
        let start = N - digits.len();
        bytes[start..].copy_from_slice(digits);
        bytes[start - 2] = b't';
        bytes[start - 1] = b'=';
        Self { bytes, start }
    }

    fn as_bytes(&self) -> &[u8] {
        &self.bytes[self.start..]
    }

    fn with_prefix(&self) -> &[u8] {
        &self.bytes[self.start - 2..]
    }
}

/// The forwarding fields in `headers`, for a request the router makes itself on the
/// client's behalf (a mirror copy, an image's original).
pub(crate) fn set_forwarded_headers(
    client_ip: Option<IpAddr>,
    headers: &mut HeaderMap,
    hop: &Hop<'_>,
) {
    let previous = headers.get(X_FORWARDED_FOR).map(HeaderValue::as_bytes);
    Forwarding::new(previous, client_ip, None, hop).set_on(headers);
}

/// `X-Forwarded-For` with `client` appended to what the request carried.
fn forwarded_for(previous: Option<&[u8]>, client: IpAddr) -> String {
    match previous.and_then(|v| std::str::from_utf8(v).ok()) {
        Some(previous) if !previous.trim().is_empty() => format!("{previous}, {client}"),
        _ => client.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hop(request_id: &Arc<str>, tls: bool) -> Hop<'_> {
        Hop {
            tls,
            request_id,
            server_port: 8443,
            started: SystemTime::now(),
            version: Version::HTTP_11,
            forwarded_host: None,
        }
    }

    #[test]
    fn the_client_is_appended_to_a_chain_it_brought_and_starts_one_otherwise() {
        let client: IpAddr = "192.0.2.7".parse().expect("address");
        let v6: IpAddr = "2001:db8::1".parse().expect("address");
        for (previous, client, expected) in [
            (None, client, "192.0.2.7"),
            (Some(""), client, "192.0.2.7"),
            (Some("  "), client, "192.0.2.7"),
            (Some("203.0.113.1"), client, "203.0.113.1, 192.0.2.7"),
            (
                Some("203.0.113.1, 198.51.100.2"),
                v6,
                "203.0.113.1, 198.51.100.2, 2001:db8::1",
            ),
        ] {
            assert_eq!(
                forwarded_for(previous.map(str::as_bytes), client),
                expected,
                "{previous:?}"
            );
        }
    }

    #[test]
    fn the_writer_and_the_map_get_the_same_fields() {
        let request_id: Arc<str> = Arc::from("4bf92f3577b34da6");
        let client: IpAddr = "192.0.2.7".parse().expect("address");
        let own = HeaderValue::from_static("192.0.2.7");
        for (previous, expected) in [
            (None, "192.0.2.7"),
            (Some(&b"203.0.113.1"[..]), "203.0.113.1, 192.0.2.7"),
        ] {
            let mut hop = hop(&request_id, true);
            hop.forwarded_host = Some(b"shop.example.com");
            let written = Forwarding::new(previous, Some(client), Some(&own), &hop);
            let fields: Vec<(&str, Vec<u8>)> = written
                .fields()
                .map(|(name, value)| (name, value.to_vec()))
                .collect();
            let start = fields
                .iter()
                .find(|(name, _)| *name == "x-request-start")
                .map(|(_, value)| value.clone())
                .expect("x-request-start");
            let mut headers = HeaderMap::new();
            if let Some(previous) = previous {
                headers.insert(
                    X_FORWARDED_FOR,
                    HeaderValue::from_bytes(previous).expect("value"),
                );
            }
            set_forwarded_headers(Some(client), &mut headers, &hop);
            let mut mapped: Vec<(&str, Vec<u8>)> = headers
                .iter()
                .map(|(name, value)| (name.as_str(), value.as_bytes().to_vec()))
                .collect();
            let mut wanted = vec![
                ("x-forwarded-for", expected.as_bytes().to_vec()),
                ("x-forwarded-proto", b"https".to_vec()),
                ("x-forwarded-port", b"8443".to_vec()),
                ("x-request-id", b"4bf92f3577b34da6".to_vec()),
                ("x-request-start", start.clone()),
                ("via", b"1.1 switchyard".to_vec()),
                ("x-forwarded-host", b"shop.example.com".to_vec()),
            ];
            assert_eq!(fields, wanted, "written from {previous:?}");
            // Made a moment later: the same start, to the microsecond or one after.
            let mapped_start = headers["x-request-start"].as_bytes().to_vec();
            let micros = |v: &[u8]| -> u64 {
                std::str::from_utf8(&v[2..])
                    .expect("ascii")
                    .parse()
                    .expect("digits")
            };
            assert!(micros(&mapped_start).abs_diff(micros(&start)) < 1000);
            for (name, value) in &mut mapped {
                if *name == "x-request-start" {
                    *value = start.clone();
                }
            }
            mapped.sort();
            wanted.sort();
            assert_eq!(mapped, wanted, "mapped from {previous:?}");
        }
    }

    #[test]
    fn request_start_is_when_the_request_was_taken_in_microseconds() {
        let id: Arc<str> = Arc::from("id");
        let mut hop = hop(&id, false);
        hop.started = SystemTime::now() - std::time::Duration::from_millis(250);
        let before = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .expect("clock")
            .as_micros() as u64;
        let forwarding = Forwarding::new(None, None, None, &hop);
        let value = forwarding.request_start.with_prefix();
        let text = std::str::from_utf8(value).expect("ascii");
        let micros: u64 = text
            .strip_prefix("t=")
            .expect("t=")
            .parse()
            .expect("digits");
        assert_eq!(text.len(), 18, "{text}");
        assert!(
            before - 260_000 < micros && micros <= before - 249_000,
            "{micros} vs {before}"
        );
        assert_eq!(Digits::<7>::of(443).as_bytes(), b"443");
        assert_eq!(Digits::<7>::of(65535).as_bytes(), b"65535");
        assert_eq!(Digits::<7>::of(0).as_bytes(), b"0");
    }

    #[test]
    fn via_names_the_protocol_the_request_came_in_and_follows_earlier_hops() {
        let id: Arc<str> = Arc::from("id");
        let mut hop = hop(&id, false);
        hop.version = Version::HTTP_2;
        let mut headers = HeaderMap::new();
        headers.insert(VIA, HeaderValue::from_static("1.1 cdn.example"));
        set_forwarded_headers(None, &mut headers, &hop);
        let via: Vec<_> = headers.get_all(VIA).iter().collect();
        assert_eq!(via, ["1.1 cdn.example", "2 switchyard"]);
        assert_eq!(via_of(Version::HTTP_10), "1.0 switchyard");
    }

    #[test]
    fn proto_and_request_id_say_what_the_router_saw() {
        let request_id: Arc<str> = Arc::from("0123456789abcdef0123456789abcdef");
        for (tls, proto) in [(false, "http"), (true, "https")] {
            let mut headers = HeaderMap::new();
            headers.insert("x-forwarded-proto", HeaderValue::from_static("spoofed"));
            headers.insert("x-request-start", HeaderValue::from_static("t=1"));
            set_forwarded_headers(None, &mut headers, &hop(&request_id, tls));
            assert_eq!(headers["x-forwarded-proto"], proto);
            assert_eq!(headers["x-request-id"], &*request_id);
            assert_ne!(
                headers["x-request-start"], "t=1",
                "the client's claim is replaced"
            );
            assert!(
                !headers.contains_key("x-forwarded-for"),
                "no client address, no entry"
            );
            assert!(!headers.contains_key("x-forwarded-host"), "not asked for");
        }
    }
}
