//! What a backend is told about the client a request comes from: `X-Forwarded-For` (the
//! client's address appended to what the request carried), `X-Forwarded-Proto` and
//! `X-Request-Id`. Every request the router sends on a client's behalf carries them — the
//! client's own, a mirror copy, an image's original — made here, once a request, and
//! written by whichever writer sends it: the HTTP/1 writer from [`Forwarding::fields`], a
//! map from [`Forwarding::set_on`].

use std::net::IpAddr;

use http::header::HeaderName;
use http::{HeaderMap, HeaderValue};

pub(crate) const X_FORWARDED_FOR: HeaderName = HeaderName::from_static("x-forwarded-for");
pub(crate) const X_FORWARDED_PROTO: HeaderName = HeaderName::from_static("x-forwarded-proto");
pub(crate) const X_REQUEST_ID: HeaderName = HeaderName::from_static("x-request-id");

/// The forwarding fields of one request, which replace any of the same name it carried.
pub(crate) struct Forwarding {
    /// `None` with no client address, or none that could be made a value: the request's
    /// own `X-Forwarded-For`, if any, then goes on as it came.
    forwarded_for: Option<HeaderValue>,
    tls: bool,
    request_id: String,
}

impl Forwarding {
    /// `previous`: the `X-Forwarded-For` the request carried; `client_address`: the client's
    /// address already made a value, for a request that carried none (a connection makes
    /// it once for all its requests); `tls`: whether the client came over TLS.
    pub(crate) fn new(
        previous: Option<&[u8]>,
        client_ip: Option<IpAddr>,
        client_address: Option<&HeaderValue>,
        tls: bool,
        request_id: &str,
    ) -> Self {
        let forwarded_for = match (client_ip, previous, client_address) {
            (None, _, _) => None,
            (Some(_), None, Some(own)) => Some(own.clone()),
            (Some(ip), previous, _) => HeaderValue::try_from(forwarded_for(previous, ip)).ok(),
        };
        Self {
            forwarded_for,
            tls,
            request_id: request_id.to_owned(),
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
            ("x-request-id", Some(self.request_id.as_bytes())),
        ]
        .into_iter()
        .filter_map(|(name, value)| Some((name, value?)))
    }

    /// Puts the fields in `headers`, in place of any of the same name.
    pub(crate) fn set_on(self, headers: &mut HeaderMap) {
        if let Some(forwarded_for) = self.forwarded_for {
            headers.insert(X_FORWARDED_FOR, forwarded_for);
        }
        headers.insert(
            X_FORWARDED_PROTO,
            HeaderValue::from_static(if self.tls { "https" } else { "http" }),
        );
        if let Ok(value) = HeaderValue::try_from(self.request_id) {
            headers.insert(X_REQUEST_ID, value);
        }
    }
}

/// The forwarding fields in `headers`, for a request the router makes itself on the
/// client's behalf (a mirror copy, an image's original).
pub(crate) fn set_forwarded_headers(
    client_ip: Option<IpAddr>,
    headers: &mut HeaderMap,
    tls: bool,
    request_id: &str,
) {
    let previous = headers.get(X_FORWARDED_FOR).map(HeaderValue::as_bytes);
    Forwarding::new(previous, client_ip, None, tls, request_id).set_on(headers);
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
        let request_id = "4bf92f3577b34da6";
        let client: IpAddr = "192.0.2.7".parse().expect("address");
        let own = HeaderValue::from_static("192.0.2.7");
        for (previous, expected) in [
            (None, "192.0.2.7"),
            (Some(&b"203.0.113.1"[..]), "203.0.113.1, 192.0.2.7"),
        ] {
            let fields: Vec<(&str, Vec<u8>)> =
                Forwarding::new(previous, Some(client), Some(&own), true, request_id)
                    .fields()
                    .map(|(name, value)| (name, value.to_vec()))
                    .collect();
            let mut headers = HeaderMap::new();
            if let Some(previous) = previous {
                headers.insert(
                    X_FORWARDED_FOR,
                    HeaderValue::from_bytes(previous).expect("value"),
                );
            }
            set_forwarded_headers(Some(client), &mut headers, true, request_id);
            let mapped: Vec<(&str, Vec<u8>)> = headers
                .iter()
                .map(|(name, value)| (name.as_str(), value.as_bytes().to_vec()))
                .collect();
            let wanted = vec![
                ("x-forwarded-for", expected.as_bytes().to_vec()),
                ("x-forwarded-proto", b"https".to_vec()),
                ("x-request-id", b"4bf92f3577b34da6".to_vec()),
            ];
            assert_eq!(fields, wanted, "written from {previous:?}");
            let mut mapped = mapped;
            mapped.sort();
            assert_eq!(mapped, wanted, "mapped from {previous:?}");
        }
    }

    #[test]
    fn proto_and_request_id_say_what_the_router_saw() {
        let request_id = "0123456789abcdef0123456789abcdef";
        for (tls, proto) in [(false, "http"), (true, "https")] {
            let mut headers = HeaderMap::new();
            headers.insert("x-forwarded-proto", HeaderValue::from_static("spoofed"));
            set_forwarded_headers(None, &mut headers, tls, request_id);
            assert_eq!(headers["x-forwarded-proto"], proto);
            assert_eq!(headers["x-request-id"], request_id);
            assert!(
                !headers.contains_key("x-forwarded-for"),
                "no client address, no entry"
            );
        }
    }
}
