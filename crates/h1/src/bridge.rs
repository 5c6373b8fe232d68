//! Where the codec meets the `http` crate's types: the requests of HTTP/2 clients (hyper's
//! server hands them over as `http::Request`) written for an HTTP/1.1 backend by the same
//! rules as HTTP/1.1 clients' requests, and a backend's answer made into the
//! `http::response::Parts` an HTTP/2 client's stream is answered with. The HTTP/1.1 path
//! itself never builds these types.

use http::header::{HeaderName, HeaderValue};
use http::{HeaderMap, StatusCode};

use crate::fields::{self, Connection};
use crate::request::RequestBody;
use crate::response::{ResponseBody, ResponseHead};
use crate::write::{write_field, write_framing};

/// Writes the head of `parts` for an HTTP/1.1 backend into `out` (appending): origin-form
/// target, the fields less hop-by-hop ones (and those `Connection` names) and less those
/// `extra` names (lower-case: the router's own forwarding fields replace the client's),
/// `body`'s framing, then `extra`. The caller decides `body` from what it knows of the stream (a
/// `content-length` it checked against the DATA frames, or chunked when it does not
/// know); an HTTP/2 request's `:authority` is written as Host when the fields have none.
/// A request naming no host at all is the caller's to refuse first (the router routes by
/// host): what this writes for it no HTTP/1.1 server takes.
pub fn write_request_parts(
    out: &mut Vec<u8>,
    parts: &http::request::Parts,
    body: RequestBody,
    extra: &[(&str, &[u8])],
) {
    out.extend_from_slice(parts.method.as_str().as_bytes());
    out.push(b' ');
    out.extend_from_slice(
        parts
            .uri
            .path_and_query()
            .map_or("/", |path| path.as_str())
            .as_bytes(),
    );
    out.extend_from_slice(b" HTTP/1.1\r\n");
    let connection_values = || {
        parts
            .headers
            .get_all(http::header::CONNECTION)
            .iter()
            .map(HeaderValue::as_bytes)
    };
    let connection = Connection::from_values(connection_values());
    let mut host_written = false;
    for (name, value) in &parts.headers {
        if !fields::forwarded(name.as_str(), &connection, connection_values())
            || extra.iter().any(|(replaced, _)| *replaced == name.as_str())
        {
            continue;
        }
        host_written |= name == http::header::HOST;
        write_field(out, name.as_str(), value.as_bytes());
    }
    if let (false, Some(authority)) = (host_written, parts.uri.authority()) {
        write_field(out, "Host", authority.as_str().as_bytes());
    }
    write_framing(out, body);
    for (name, value) in extra {
        write_field(out, name, value);
    }
    out.extend_from_slice(b"\r\n");
}

/// Why a backend's answer cannot be given to an HTTP/2 client as it is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BridgeError {
    /// A status code outside 100–999, or a field name or value `http` refuses.
    Invalid,
}

/// The answer's status and its end-to-end fields, for an HTTP/2 stream: hop-by-hop fields
/// (HTTP/2 has no such fields and refuses connection-specific ones) and the framing
/// fields left out, but for a Content-Length an answer without a body announces (HEAD,
/// 304), which HTTP/2 keeps.
pub fn response_parts(head: &ResponseHead<'_, '_>) -> Result<(StatusCode, HeaderMap), BridgeError> {
    let status = StatusCode::from_u16(head.code).map_err(|_| BridgeError::Invalid)?;
    let mut headers = HeaderMap::with_capacity(head.headers.len());
    for header in head.headers {
        // HTTP/2 keeps a Content-Length it can check against the DATA frames.
        let keep_length = header.name.eq_ignore_ascii_case("content-length")
            && (head.announces_length() || matches!(head.body, ResponseBody::Length(_)));
        if !keep_length
            && !fields::forwarded(
                header.name,
                &head.connection,
                fields::connection_values(head.headers),
            )
        {
            continue;
        }
        let name =
            HeaderName::from_bytes(header.name.as_bytes()).map_err(|_| BridgeError::Invalid)?;
        let value = HeaderValue::from_bytes(header.value).map_err(|_| BridgeError::Invalid)?;
        headers.append(name, value);
    }
    Ok((status, headers))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{header_slots, parse_request, parse_response};

    fn parts(request: http::Request<()>) -> http::request::Parts {
        request.into_parts().0
    }

    #[test]
    fn an_http2_request_is_written_as_an_http1_one_by_the_same_rules() {
        let request = http::Request::builder()
            .method("POST")
            .uri("https://app.test/a?b")
            .header("content-type", "text/plain")
            .header("connection", "x-secret")
            .header("x-secret", "s")
            .header("te", "trailers")
            .header("content-length", "99")
            .header("x-forwarded-proto", "gopher")
            .body(())
            .expect("request");
        let mut out = Vec::new();
        write_request_parts(
            &mut out,
            &parts(request),
            RequestBody::Length(5),
            &[("x-forwarded-proto", b"https")],
        );
        // The client's X-Forwarded-Proto is replaced, not repeated.
        assert_eq!(
            String::from_utf8(out.clone()).expect("ascii"),
            "POST /a?b HTTP/1.1\r\ncontent-type: text/plain\r\nHost: app.test\r\n\
             Content-Length: 5\r\nx-forwarded-proto: https\r\n\r\n"
        );
        // What it wrote reads back as the request it is.
        let mut slots = header_slots();
        let head = parse_request(&out, &mut slots)
            .expect("valid")
            .expect("complete");
        assert_eq!((head.method, head.path()), ("POST", "/a?b"));
        assert_eq!(head.authority, Some(&b"app.test"[..]));
        assert_eq!(head.body, RequestBody::Length(5));
    }

    #[test]
    fn a_body_of_unknown_length_goes_chunked() {
        let request = http::Request::builder()
            .method("PUT")
            .uri("/u")
            .header("host", "app.test")
            .body(())
            .expect("request");
        let mut out = Vec::new();
        write_request_parts(&mut out, &parts(request), RequestBody::Chunked, &[]);
        assert_eq!(
            String::from_utf8(out).expect("ascii"),
            "PUT /u HTTP/1.1\r\nhost: app.test\r\nTransfer-Encoding: chunked\r\n\r\n"
        );
    }

    #[test]
    fn an_answer_loses_its_hop_by_hop_fields_for_http2() {
        let raw = b"HTTP/1.1 200 OK\r\nConnection: keep-alive, X-Hop\r\nX-Hop: 1\r\n\
                    Transfer-Encoding: chunked\r\nSet-Cookie: a=1\r\nSet-Cookie: b=2\r\n\r\n";
        let mut slots = header_slots();
        let head = parse_response(raw, &mut slots, false)
            .expect("valid")
            .expect("complete");
        let (status, headers) = response_parts(&head).expect("valid");
        assert_eq!(status, StatusCode::OK);
        assert_eq!(headers.len(), 2);
        assert_eq!(headers.get_all("set-cookie").iter().count(), 2);
        let raw = b"HTTP/1.1 304 Not Modified\r\nContent-Length: 7\r\nETag: \"x\"\r\n\r\n";
        let mut slots = header_slots();
        let head = parse_response(raw, &mut slots, false)
            .expect("valid")
            .expect("complete");
        let (_, headers) = response_parts(&head).expect("valid");
        assert_eq!(
            headers.get("content-length").map(HeaderValue::as_bytes),
            Some(&b"7"[..])
        );
    }
}
