//! What a backend is told about the client a request comes from: `X-Forwarded-For` (the
//! client's address appended to what the request carried), `X-Forwarded-Proto` and
//! `X-Request-Id`. Every request the router sends on a client's behalf carries them: the
//! client's own (`listener/service.rs`), a mirror copy, an image's original.

use std::net::IpAddr;

use http::{HeaderMap, HeaderValue};

use crate::context::RequestCtx;

/// `X-Forwarded-For` (with `client_ip` appended), `X-Forwarded-Proto` and `X-Request-Id`,
/// for a request the router makes itself on the client's behalf (a mirror copy, an image's
/// original).
pub(crate) fn set_forwarded_headers(
    client_ip: Option<IpAddr>,
    headers: &mut HeaderMap,
    ctx: &RequestCtx,
) {
    if let Some(client_ip) = client_ip {
        let previous = headers.get("x-forwarded-for").map(HeaderValue::as_bytes);
        let forwarded_for = forwarded_for(previous, client_ip);
        if let Ok(value) = HeaderValue::try_from(forwarded_for) {
            headers.insert("x-forwarded-for", value);
        }
    }
    headers.insert(
        "x-forwarded-proto",
        HeaderValue::from_static(if ctx.tls { "https" } else { "http" }),
    );
    if let Ok(value) = HeaderValue::try_from(ctx.request_id.as_str()) {
        headers.insert("x-request-id", value);
    }
}

/// `X-Forwarded-For` with `client` appended to what the request carried.
pub(crate) fn forwarded_for(previous: Option<&[u8]>, client: IpAddr) -> String {
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
    fn proto_and_request_id_say_what_the_router_saw() {
        let mut ctx = RequestCtx::new();
        ctx.request_id = "0123456789abcdef0123456789abcdef".into();
        for (tls, proto) in [(false, "http"), (true, "https")] {
            ctx.tls = tls;
            let mut headers = HeaderMap::new();
            headers.insert("x-forwarded-proto", HeaderValue::from_static("spoofed"));
            set_forwarded_headers(None, &mut headers, &ctx);
            assert_eq!(headers["x-forwarded-proto"], proto);
            assert_eq!(headers["x-request-id"], ctx.request_id.as_str());
            assert!(
                !headers.contains_key("x-forwarded-for"),
                "no client address, no entry"
            );
        }
    }
}
