//! Message framing hygiene: a backend must have exactly one way to tell where a request
//! ends, because request smuggling needs two parties that disagree about it.
//!
//! Pingora's HTTP/1 reader already refuses the worst (differing Content-Length values, a
//! final coding other than chunked, Transfer-Encoding on HTTP/1.0, obsolete line folding)
//! and re-frames the body it forwards. What is left is what it passes through as received:
//! framing headers repeated or spelled in ways other servers read differently, and protocol
//! upgrades that would hand the client a raw tunnel to the backend.

use http::header::{CONNECTION, CONTENT_LENGTH, TRANSFER_ENCODING, UPGRADE};
use pingora::http::RequestHeader;

use crate::respond::LocalAnswer;

/// Refuses what cannot be made unambiguous and drops an upgrade the router will not tunnel.
/// Runs on the request as read, before routing, so later stages see the normalised form.
pub(crate) fn check_request(request: &mut RequestHeader) -> Result<(), LocalAnswer> {
    let chunked_count = transfer_codings(request)
        .filter(|coding| coding.eq_ignore_ascii_case("chunked"))
        .count();
    // Chunked applied twice cannot be forwarded faithfully: the body is de-chunked once.
    if chunked_count > 1 {
        return Err(LocalAnswer::AmbiguousFraming);
    }
    drop_non_websocket_upgrade(request);
    Ok(())
}

/// Rewrites the framing headers of the request sent to the backend into one canonical
/// form: a single `Transfer-Encoding` line (and then no Content-Length), or a single
/// Content-Length.
pub(crate) fn normalise_for_backend(request: &mut RequestHeader) -> pingora::Result<()> {
    if request.headers.contains_key(TRANSFER_ENCODING) {
        // `identity` is no coding at all (and unknown to RFC 9112 readers); the rest is kept
        // in order, ending with the chunked that Pingora checked is last.
        let codings: Vec<String> = transfer_codings(request)
            .filter(|coding| !coding.eq_ignore_ascii_case("identity"))
            .map(|coding| coding.to_ascii_lowercase())
            .collect();
        request.remove_header(&CONTENT_LENGTH);
        request.insert_header(TRANSFER_ENCODING, codings.join(", "))?;
        return Ok(());
    }
    // Pingora accepts repeated Content-Length lines only when they agree; one is enough.
    let first_length = request.headers.get(CONTENT_LENGTH).cloned();
    if let Some(length) = first_length {
        request.insert_header(CONTENT_LENGTH, length)?;
    }
    Ok(())
}

fn transfer_codings(request: &RequestHeader) -> impl Iterator<Item = &str> {
    request
        .headers
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
fn drop_non_websocket_upgrade(request: &mut RequestHeader) {
    let Some(upgrade) = request.headers.get(UPGRADE) else {
        return;
    };
    let websocket = request.headers.get_all(UPGRADE).iter().count() == 1
        && upgrade.as_bytes().eq_ignore_ascii_case(b"websocket");
    if websocket {
        return;
    }
    request.remove_header(&UPGRADE);
    request.remove_header("http2-settings");
    request.remove_header(&CONNECTION);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request_with(headers: &[(&'static str, &'static str)]) -> RequestHeader {
        let mut request = RequestHeader::build("POST", b"/", None).expect("request");
        for (name, value) in headers {
            request.append_header(*name, *value).expect("header");
        }
        request
    }

    fn values(request: &RequestHeader, name: &str) -> Vec<String> {
        request
            .headers
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
        normalise_for_backend(&mut request).expect("normalised");
        assert_eq!(values(&request, "transfer-encoding"), ["gzip, chunked"]);
        assert!(values(&request, "content-length").is_empty());
    }

    #[test]
    fn repeated_equal_content_lengths_become_one() {
        let mut request = request_with(&[("content-length", "5"), ("content-length", "5")]);
        normalise_for_backend(&mut request).expect("normalised");
        assert_eq!(values(&request, "content-length"), ["5"]);
    }

    #[test]
    fn chunked_twice_is_refused() {
        let mut request = request_with(&[("transfer-encoding", "chunked, chunked")]);
        assert_eq!(
            check_request(&mut request),
            Err(LocalAnswer::AmbiguousFraming)
        );
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
