//! A request head, read once: the view the router's stages see and the rules that decide
//! where the request ends.

use httparse::{Header, ParserConfig, Status};

use crate::fields::{self, Connection, LengthError};
use crate::HeaderSlots;

/// How the request's body is framed, decided once (RFC 9112 §6.3).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RequestBody {
    /// No body: neither Content-Length nor Transfer-Encoding.
    Empty,
    /// Exactly this many bytes follow the head.
    Length(u64),
    /// A chunked body; forwarded re-framed by [`crate::ChunkedReframer`].
    Chunked,
}

/// Why a request is refused before anything of it is forwarded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RequestError {
    /// The head is not HTTP/1.x as RFC 9112 writes it (a bad byte, a folded line, a
    /// missing colon, a bad request line).
    Malformed,
    /// More than [`crate::MAX_HEADERS`] lines, or a head past [`crate::MAX_HEAD_BYTES`].
    HeadTooLarge,
    /// A Content-Length that is not one decimal number.
    BadContentLength,
    /// Transfer codings that do not end in one `chunked` (RFC 9112 §6.1: 400, then close).
    BadTransferEncoding,
    /// Transfer-Encoding in an HTTP/1.0 request, which an HTTP/1.0 reader would not see.
    TransferEncodingOnHttp10,
    /// No host named (HTTP/1.1 without a Host, HTTP/1.0 without a Host or an absolute-form
    /// target), or more than one Host.
    BadHost,
    /// An absolute-form target naming another host than the Host field.
    ConflictingHost,
    /// A target that is neither origin-form, absolute-form, `*` nor ASCII.
    BadTarget,
}

impl RequestError {
    fn from_length(error: LengthError) -> Self {
        match error {
            LengthError::BadContentLength => RequestError::BadContentLength,
            LengthError::BadCodings => RequestError::BadTransferEncoding,
        }
    }
}

/// A parsed request head: slices of the read buffer, valid until the caller reads into it
/// again.
#[derive(Debug)]
pub struct RequestHead<'h, 'b> {
    /// The method as sent (a token).
    pub method: &'b str,
    /// The request target as sent.
    pub target: &'b str,
    /// 0 for HTTP/1.0, 1 for HTTP/1.1.
    pub minor_version: u8,
    /// The header lines, in order, names and values as received.
    pub headers: &'h [Header<'b>],
    /// Bytes of the head, its last CRLF included: the body starts there.
    pub head_len: usize,
    /// Where the body ends.
    pub body: RequestBody,
    /// The host the request names: an absolute-form target's authority, else Host.
    pub authority: Option<&'b [u8]>,
    /// Where in `target` the origin-form path starts (after an absolute form's authority).
    path_start: usize,
    /// The request's `Connection` fields.
    pub connection: Connection,
    /// `Expect: 100-continue` was sent.
    pub expects_continue: bool,
    /// The WebSocket upgrade asked for (`Upgrade: websocket` named in `Connection`).
    pub websocket_upgrade: bool,
    /// Both Content-Length and chunked were sent: chunked wins, Content-Length is dropped,
    /// and the connection closes after the answer (RFC 9112 §6.3 item 3), as the client and
    /// the router may already disagree about the bytes that follow.
    pub close_after: bool,
    /// Codings other than chunked to keep for the backend (rare: `gzip, chunked`).
    pub other_codings: bool,
}

impl<'b> RequestHead<'_, 'b> {
    /// The target in origin form (`/path?query`), or `*`. An absolute form with a query
    /// and no path (`http://a?q`) gives `?q`: its origin form is `/?q`, which
    /// [`crate::write_request_head`] writes.
    pub fn path(&self) -> &'b str {
        match &self.target[self.path_start..] {
            "" => "/",
            path => path,
        }
    }

    /// Whether the client's connection may carry another request after this one.
    pub fn keeps_connection(&self) -> bool {
        !self.close_after && self.connection.persists(self.minor_version)
    }

    /// The value of the first header named `name`.
    pub fn header(&self, name: &str) -> Option<&'b [u8]> {
        self.headers
            .iter()
            .find(|header| header.name.eq_ignore_ascii_case(name))
            .map(|header| header.value)
    }

    /// Whether repeating the request cannot change anything on the origin (RFC 9110 §9.2.2):
    /// a stale pooled connection may be retried for these.
    pub fn is_idempotent(&self) -> bool {
        matches!(
            self.method,
            "GET" | "HEAD" | "OPTIONS" | "TRACE" | "PUT" | "DELETE"
        )
    }
}

fn config() -> ParserConfig {
    // httparse's defaults are strict: one space between request-line parts, no space
    // before a colon, no folded lines, no invalid header skipped. A bare LF ending a line
    // is taken as CRLF; the head is written anew with CRLF, so the next hop sees one form.
    ParserConfig::default()
}

/// Parses the request head at the start of `buf`. `Ok(None)`: more bytes are needed (and
/// the caller refuses with 431 once it holds [`crate::MAX_HEAD_BYTES`] without a head).
pub fn parse_request<'h, 'b>(
    buf: &'b [u8],
    slots: &'h mut HeaderSlots<'b>,
) -> Result<Option<RequestHead<'h, 'b>>, RequestError> {
    let mut request = httparse::Request::new(&mut []);
    let head_len = match config().parse_request_with_uninit_headers(&mut request, buf, slots) {
        Ok(Status::Complete(length)) => length,
        Ok(Status::Partial) => return Ok(None),
        Err(httparse::Error::TooManyHeaders) => return Err(RequestError::HeadTooLarge),
        Err(_) => return Err(RequestError::Malformed),
    };
    let (Some(method), Some(target), Some(minor_version)) =
        (request.method, request.path, request.version)
    else {
        return Err(RequestError::Malformed);
    };
    let headers: &'h [Header<'b>] = request.headers;
    // A fragment is never part of a request target (RFC 9112 §3.2); servers part on it
    // (hyper drops it, others keep it in the path), so it is refused, not forwarded.
    if !target.is_ascii() || target.contains('#') {
        return Err(RequestError::BadTarget);
    }
    let (framing, connection) = fields::framing_and_connection(headers);
    let framing = framing.map_err(RequestError::from_length)?;
    let body = match (framing.transfer_encoding, framing.content_length) {
        (true, _) if minor_version == 0 => return Err(RequestError::TransferEncodingOnHttp10),
        (true, _) if !framing.chunked_last => return Err(RequestError::BadTransferEncoding),
        (true, _) => RequestBody::Chunked,
        (false, Some(length)) => RequestBody::Length(length),
        (false, None) => RequestBody::Empty,
    };
    let (authority, path_start) = authority(target, headers, minor_version)?;
    let mut expects_continue = false;
    let mut websocket = false;
    for header in headers {
        if header.name.eq_ignore_ascii_case("expect") {
            expects_continue = header.value.eq_ignore_ascii_case(b"100-continue");
        } else if header.name.eq_ignore_ascii_case("upgrade") {
            // One Upgrade naming WebSocket alone; anything else (h2c above all) is dropped.
            websocket = !websocket && header.value.eq_ignore_ascii_case(b"websocket");
        }
    }
    Ok(Some(RequestHead {
        method,
        target,
        minor_version,
        headers,
        head_len,
        body,
        authority,
        path_start,
        connection,
        expects_continue,
        websocket_upgrade: websocket && connection.upgrade && method == "GET",
        close_after: framing.transfer_encoding && framing.content_length.is_some(),
        other_codings: framing.other_codings,
    }))
}

/// The host the request is for, and where the origin-form path starts in the target. An
/// absolute-form target's authority wins over Host (RFC 9112 §3.2.2); the two naming
/// different hosts is refused, as the router and the backend would route it apart.
fn authority<'b>(
    target: &'b str,
    headers: &[Header<'b>],
    minor_version: u8,
) -> Result<(Option<&'b [u8]>, usize), RequestError> {
    let mut hosts = headers
        .iter()
        .filter(|header| header.name.eq_ignore_ascii_case("host"));
    let host = hosts.next().map(|header| header.value);
    if hosts.next().is_some() || (host.is_none() && minor_version >= 1) {
        return Err(RequestError::BadHost);
    }
    if target.starts_with('/') || target == "*" {
        // An HTTP/1.0 request may name no host at all; a router cannot route it, and the
        // HTTP/1.1 request it would become must carry one (RFC 9112 §3.2).
        return match host {
            Some(host) => Ok((Some(host), 0)),
            None => Err(RequestError::BadHost),
        };
    }
    let scheme_len = if starts_with_ignore_case(target, "http://") {
        7
    } else if starts_with_ignore_case(target, "https://") {
        8
    } else {
        return Err(RequestError::BadTarget);
    };
    let rest = &target[scheme_len..];
    let authority_len = rest.find(['/', '?']).unwrap_or(rest.len());
    let named = &rest.as_bytes()[..authority_len];
    // host [":" port] as RFC 3986 spells it (no userinfo): a byte outside it is refused,
    // not forwarded in the Host field of an HTTP/1.0 request.
    let authority_byte = |b: &u8| b.is_ascii_alphanumeric() || b"-._~!$&'()*+,;=:[]%".contains(b);
    if named.is_empty() || !named.iter().all(authority_byte) {
        return Err(RequestError::BadTarget);
    }
    if host.is_some_and(|host| !same_host(host, named)) {
        return Err(RequestError::ConflictingHost);
    }
    Ok((Some(named), scheme_len + authority_len))
}

fn starts_with_ignore_case(text: &str, prefix: &str) -> bool {
    text.len() >= prefix.len()
        && text.as_bytes()[..prefix.len()].eq_ignore_ascii_case(prefix.as_bytes())
}

/// Two authorities naming the same host: case and a trailing dot aside, ports compared
/// only when both give one.
fn same_host(a: &[u8], b: &[u8]) -> bool {
    // Slices of the authorities compared in place: no copy on the request path.
    fn split(authority: &[u8]) -> (&[u8], Option<&[u8]>) {
        let (host, port) = match authority.iter().rposition(|&c| c == b':') {
            Some(colon) if !authority.ends_with(b"]") => {
                (&authority[..colon], Some(&authority[colon + 1..]))
            }
            _ => (authority, None),
        };
        (host.strip_suffix(b".").unwrap_or(host), port)
    }
    let ((host_a, port_a), (host_b, port_b)) = (split(a), split(b));
    host_a.eq_ignore_ascii_case(host_b)
        && (port_a.is_none() || port_b.is_none() || port_a == port_b)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::header_slots;

    fn parse(raw: &[u8]) -> Result<Option<(RequestBody, usize, bool)>, RequestError> {
        let mut slots = header_slots();
        parse_request(raw, &mut slots)
            .map(|head| head.map(|h| (h.body, h.head_len, h.keeps_connection())))
    }

    #[test]
    fn a_plain_get_is_read_in_place() {
        let raw = b"GET /a?b HTTP/1.1\r\nHost: App.Test\r\nAccept: */*\r\n\r\nGET /next";
        let mut slots = header_slots();
        let head = parse_request(raw, &mut slots)
            .expect("valid")
            .expect("complete");
        assert_eq!(
            (head.method, head.path(), head.minor_version),
            ("GET", "/a?b", 1)
        );
        assert_eq!(head.authority, Some(&b"App.Test"[..]));
        assert_eq!(head.body, RequestBody::Empty);
        assert_eq!(&raw[head.head_len..], b"GET /next");
        assert!(head.keeps_connection());
        assert_eq!(head.header("accept"), Some(&b"*/*"[..]));
    }

    #[test]
    fn a_partial_head_asks_for_more() {
        assert_eq!(parse(b"GET / HTTP/1.1\r\nHost: a\r\n"), Ok(None));
    }

    #[test]
    fn framing_rules() {
        use RequestBody::*;
        let cases: [(&[u8], Result<RequestBody, RequestError>); 9] = [
            (b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\n\r\n", Ok(Length(5))),
            (b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n", Ok(Chunked)),
            (
                b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\n",
                Ok(Chunked),
            ),
            (
                b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\nContent-Length: 40\r\n\r\n",
                Err(RequestError::BadContentLength),
            ),
            (
                b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked, identity\r\n\r\n",
                Err(RequestError::BadTransferEncoding),
            ),
            (
                b"POST / HTTP/1.0\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n",
                Err(RequestError::TransferEncodingOnHttp10),
            ),
            (b"GET / HTTP/1.1\r\nHost: a\r\nX: a\r\n b\r\n\r\n", Err(RequestError::Malformed)),
            (
                b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding : chunked\r\n\r\n",
                Err(RequestError::Malformed),
            ),
            (b"GET / HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n", Err(RequestError::BadHost)),
        ];
        for (raw, expected) in cases {
            assert_eq!(
                parse(raw).map(|h| h.expect("complete").0),
                expected,
                "{}",
                String::from_utf8_lossy(raw)
            );
        }
    }

    #[test]
    fn both_lengths_close_the_connection_after_the_answer() {
        let raw = b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\n";
        assert!(!parse(raw).expect("valid").expect("complete").2);
    }

    #[test]
    fn bad_bytes_are_refused() {
        for raw in [
            &b"GET / HTTP/1.1\r\nHost: a\r\nX-A: a\rTransfer-Encoding: chunked\r\n\r\n"[..],
            b"GET / HTTP/1.1\r\nHost: a\r\nX-A: a\0b\r\n\r\n",
            b"GET / HTTP/1.1\r\nHost: a\r\nX(A): b\r\n\r\n",
            b"GET / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding chunked\r\n\r\n",
            b"GET\t/ HTTP/1.1\r\nHost: a\r\n\r\n",
            b"GET / /smuggled HTTP/1.1\r\nHost: a\r\n\r\n",
            b"GET / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding:\x0bchunked\r\n\r\n",
        ] {
            assert!(
                matches!(parse(raw), Err(RequestError::Malformed)),
                "{}",
                String::from_utf8_lossy(raw)
            );
        }
        let many = format!(
            "GET / HTTP/1.1\r\nHost: a\r\n{}\r\n",
            "X: a\r\n".repeat(200)
        );
        assert_eq!(parse(many.as_bytes()), Err(RequestError::HeadTooLarge));
    }

    #[test]
    fn absolute_form_names_the_host() {
        let mut slots = header_slots();
        let raw = b"GET http://app.test:80/x?y HTTP/1.1\r\nHost: APP.test.\r\n\r\n";
        let head = parse_request(raw, &mut slots)
            .expect("valid")
            .expect("complete");
        assert_eq!(head.authority, Some(&b"app.test:80"[..]));
        assert_eq!(head.path(), "/x?y");
        let other = b"GET http://other.test/ HTTP/1.1\r\nHost: app.test\r\n\r\n";
        assert_eq!(parse(other), Err(RequestError::ConflictingHost));
        assert_eq!(
            parse(b"GET ftp://a/ HTTP/1.1\r\nHost: a\r\n\r\n"),
            Err(RequestError::BadTarget)
        );
        // Found by fuzz/h1_request: an authority with bytes no host has.
        assert_eq!(
            parse(b"GET http://oth>er/ HTTP/1.0\r\n\r\n"),
            Err(RequestError::BadTarget)
        );
        // Found by fuzz/h1_request: hyper reads `/a` where others read `/a#b`.
        assert_eq!(
            parse(b"GET /a#b HTTP/1.1\r\nHost: a\r\n\r\n"),
            Err(RequestError::BadTarget)
        );
    }

    #[test]
    fn http10_closes_unless_asked_and_must_name_a_host_too() {
        let closed = parse(b"GET / HTTP/1.0\r\nHost: a\r\n\r\n");
        assert!(!closed.expect("valid").expect("complete").2);
        let kept = parse(b"GET / HTTP/1.0\r\nHost: a\r\nConnection: keep-alive\r\n\r\n");
        assert!(kept.expect("valid").expect("complete").2);
        assert_eq!(parse(b"GET / HTTP/1.1\r\n\r\n"), Err(RequestError::BadHost));
        // Found by fuzz/h1_request: forwarded as HTTP/1.1, it would have carried no Host.
        assert_eq!(parse(b"PRI * HTTP/1.0\r\n\r\n"), Err(RequestError::BadHost));
        let mut slots = header_slots();
        let absolute = parse_request(b"GET http://a.test/x HTTP/1.0\r\n\r\n", &mut slots);
        let head = absolute.expect("valid").expect("complete");
        assert_eq!(head.authority, Some(&b"a.test"[..]));
    }

    #[test]
    fn only_a_websocket_upgrade_is_one() {
        let mut slots = header_slots();
        let raw =
            b"GET /ws HTTP/1.1\r\nHost: a\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n";
        let head = parse_request(raw, &mut slots)
            .expect("valid")
            .expect("complete");
        assert!(head.websocket_upgrade);
        let mut slots = header_slots();
        let h2c = b"GET / HTTP/1.1\r\nHost: a\r\nUpgrade: h2c\r\nConnection: Upgrade\r\n\r\n";
        let head = parse_request(h2c, &mut slots)
            .expect("valid")
            .expect("complete");
        assert!(!head.websocket_upgrade);
    }
}
