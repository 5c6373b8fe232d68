//! Message framing hygiene: a backend must have exactly one way to tell where a request
//! ends, because request smuggling needs two parties that disagree about it.
//!
//! hyper's HTTP/1 reader already refuses the worst (differing Content-Length values, a
//! final coding other than chunked, obsolete line folding) and re-frames the body it
//! forwards. What is left is what it passes through as received:
//! framing headers repeated or spelled in ways other servers read differently, and protocol
//! upgrades that would hand the client a raw tunnel to the backend.

use http::header::{CONTENT_LENGTH, TRANSFER_ENCODING, UPGRADE};
use http::{HeaderMap, HeaderValue};

use crate::respond::Reason;

/// Refuses what cannot be made unambiguous and drops an upgrade the router will not tunnel.
/// Runs on the request as read, before routing, so later stages see the normalised form.
/// Returns the body length the request declares, for the stages after it: `None` for a
/// chunked body or none at all (hyper has refused a malformed or contradictory length).
pub(crate) fn check_request(headers: &mut HeaderMap) -> Result<Option<u64>, Reason> {
    check_codings(headers)?;
    if has_non_websocket_upgrade(headers) {
        for name in NON_WEBSOCKET_UPGRADE_HEADERS {
            headers.remove(name);
        }
    }
    if headers.contains_key(TRANSFER_ENCODING) {
        return Ok(None);
    }
    Ok(declared_length(
        headers.get(CONTENT_LENGTH).map(HeaderValue::as_bytes),
    ))
}

/// The body length a request without Transfer-Encoding declares in its first
/// Content-Length (the HTTP reader refused differing ones), read as the codec reads it.
pub(crate) fn declared_length(content_length: Option<&[u8]>) -> Option<u64> {
    content_length.and_then(switchyard_h1::content_length_value)
}

fn check_codings(headers: &HeaderMap) -> Result<(), Reason> {
    let chunked_count = transfer_codings(headers)
        .filter(|coding| coding.eq_ignore_ascii_case("chunked"))
        .count();
    // Chunked applied twice cannot be forwarded faithfully: the body is de-chunked once.
    if chunked_count > 1 {
        return Err(Reason::AmbiguousFraming);
    }
    Ok(())
}

/// Rewrites the framing headers of the request sent to the backend into one canonical
/// form: a single `Transfer-Encoding` line (and then no Content-Length), or a single
/// Content-Length.
pub(crate) fn normalise_for_backend(headers: &mut HeaderMap) {
    if headers.contains_key(TRANSFER_ENCODING) {
        let codings = canonical_codings(headers);
        headers.remove(CONTENT_LENGTH);
        if let Ok(value) = HeaderValue::try_from(codings) {
            headers.insert(TRANSFER_ENCODING, value);
        }
        return;
    }
    if let Some(length) = headers.get(CONTENT_LENGTH).cloned() {
        headers.insert(CONTENT_LENGTH, length);
    }
}

/// `identity` is no coding at all (and unknown to RFC 9112 readers); the rest is kept in
/// order, ending with the chunked the HTTP reader checked is last.
fn canonical_codings(headers: &HeaderMap) -> String {
    let codings: Vec<String> = transfer_codings(headers)
        .filter(|coding| !coding.eq_ignore_ascii_case("identity"))
        .map(|coding| coding.to_ascii_lowercase())
        .collect();
    codings.join(", ")
}

fn transfer_codings(headers: &HeaderMap) -> impl Iterator<Item = &str> {
    headers
        .get_all(TRANSFER_ENCODING)
        .into_iter()
        .filter_map(|value| value.to_str().ok())
        .flat_map(|value| value.split(','))
        .map(str::trim)
        .filter(|coding| !coding.is_empty())
}

/// An `Upgrade` to anything but WebSocket (`h2c` above all) is removed, so the backend
/// answers the request as plain HTTP/1.1: a backend that switched protocols would give the
/// client a tunnel past every per-request rule of the router.
fn has_non_websocket_upgrade(headers: &HeaderMap) -> bool {
    let Some(upgrade) = headers.get(UPGRADE) else {
        return false;
    };
    let websocket = headers.get_all(UPGRADE).iter().count() == 1
        && upgrade.as_bytes().eq_ignore_ascii_case(b"websocket");
    !websocket
}

/// What goes with an upgrade the router will not tunnel.
const NON_WEBSOCKET_UPGRADE_HEADERS: [&str; 3] = ["upgrade", "http2-settings", "connection"];

#[cfg(test)]
mod tests {
    use super::*;

    fn request_with(headers: &[(&'static str, &'static str)]) -> HeaderMap {
        let mut request = HeaderMap::new();
        for (name, value) in headers {
            request.append(*name, HeaderValue::from_static(value));
        }
        request
    }

    fn values(request: &HeaderMap, name: &str) -> Vec<String> {
        request
            .get_all(name)
            .iter()
            .map(|v| v.to_str().expect("text").to_string())
            .collect()
    }

    #[test]
    fn transfer_encoding_lines_become_one_and_content_length_goes() {
        let mut request = request_with(&[
            ("transfer-encoding", "identity"),
            ("transfer-encoding", "gzip, CHUNKED"),
            ("content-length", "4"),
        ]);
        normalise_for_backend(&mut request);
        assert_eq!(values(&request, "transfer-encoding"), ["gzip, chunked"]);
        assert!(values(&request, "content-length").is_empty());
    }

    #[test]
    fn repeated_equal_content_lengths_become_one() {
        let mut request = request_with(&[("content-length", "5"), ("content-length", "5")]);
        normalise_for_backend(&mut request);
        assert_eq!(values(&request, "content-length"), ["5"]);
    }

    #[test]
    fn the_declared_length_is_read_once_for_the_stages_after() {
        for (headers, expected) in [
            (&[("content-length", "5")][..], Some(5)),
            (&[("content-length", "0")][..], Some(0)),
            (&[][..], None),
            (&[("transfer-encoding", "chunked")][..], None),
            (
                &[("transfer-encoding", "chunked"), ("content-length", "5")][..],
                None,
            ),
        ] {
            let mut request = request_with(headers);
            assert_eq!(check_request(&mut request), Ok(expected), "{headers:?}");
        }
    }

    #[test]
    fn chunked_twice_is_refused() {
        let mut request = request_with(&[("transfer-encoding", "chunked, chunked")]);
        assert_eq!(check_request(&mut request), Err(Reason::AmbiguousFraming));
    }

    #[test]
    fn only_a_websocket_upgrade_survives() {
        let mut h2c = request_with(&[
            ("upgrade", "h2c"),
            ("http2-settings", "AAMAAABkAARAAAAAAAIAAAAA"),
            ("connection", "Upgrade, HTTP2-Settings"),
        ]);
        check_request(&mut h2c).expect("accepted");
        assert!(values(&h2c, "upgrade").is_empty());
        assert!(values(&h2c, "http2-settings").is_empty());
        let mut websocket = request_with(&[("upgrade", "websocket"), ("connection", "Upgrade")]);
        check_request(&mut websocket).expect("accepted");
        assert_eq!(values(&websocket, "upgrade"), ["websocket"]);
    }
}
