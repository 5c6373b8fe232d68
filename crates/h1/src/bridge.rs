//! Where the codec meets the `http` crate's types: the requests of HTTP/2 clients (hyper's
//! server hands them over as `http::Request`) written for an HTTP/1.1 backend by the same
//! rules as HTTP/1.1 clients' requests, and a backend's answer made into the
//! `http::response::Parts` an HTTP/2 client's stream is answered with. The HTTP/1.1 path
//! itself never builds these types.

use http::header::{HeaderName, HeaderValue};
use http::{HeaderMap, StatusCode};

use crate::answer_fields::PlacedFields;
use crate::fields::{self, Connection};
use crate::request::RequestBody;
use crate::response::{ResponseBody, ResponseHead};
use crate::write::{write_codings_of, write_decimal, write_field, write_framing};

/// Writes the head of `parts` for an HTTP/1.1 backend into `out` (appending): origin-form
/// target, the fields less hop-by-hop ones (and those `Connection` names) and less those
/// `extra` names (lower-case: the router's own forwarding fields replace the client's; but
/// `Via`, a list each hop adds to (RFC 9110 §7.6.3): the client's lines stay, the router's
/// follows them),
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
    let target = parts.uri.path_and_query().map_or("/", |path| path.as_str());
    write_request_fields(
        out,
        parts.method.as_str().as_bytes(),
        target.as_bytes(),
        parts.uri.authority().map(|a| a.as_str().as_bytes()),
        || {
            parts
                .headers
                .iter()
                .map(|(name, value)| (name.as_str().as_bytes(), value.as_bytes()))
        },
        body,
        extra,
    );
}

/// [`write_request_parts`] for fields given as names and values: an HTTP/1.x client's
/// fields as it sent them, with no map built, by the same rules. `target` is in origin
/// form; `authority` is written as Host when the fields have none; `fields` gives them
/// afresh each time it is called (Connection is read on a first walk); names are compared
/// in any case.
pub fn write_request_fields<'f, I>(
    out: &mut Vec<u8>,
    method: &[u8],
    target: &[u8],
    authority: Option<&[u8]>,
    fields: impl Fn() -> I,
    body: RequestBody,
    extra: &[(&str, &[u8])],
) where
    I: Iterator<Item = (&'f [u8], &'f [u8])>,
{
    write_request_line(out, method, target);
    let connection_values = || {
        fields()
            .filter(|(name, _)| name.eq_ignore_ascii_case(b"connection"))
            .map(|(_, value)| value)
    };
    let connection = Connection::from_values(connection_values());
    let mut host_written = false;
    for (name, value) in fields() {
        if !kept(name, &connection, connection_values(), extra) {
            continue;
        }
        host_written |= name.eq_ignore_ascii_case(b"host");
        write_field(out, name, value);
    }
    if let (false, Some(authority)) = (host_written, authority) {
        write_field(out, "Host", authority);
    }
    end_request_head(out, body, extra, std::iter::empty());
}

/// [`write_request_fields`] for an HTTP/1.x client's fields where they were read, by the
/// same rules, but for how they are copied: a run of consecutive lines kept whole goes out
/// as it came, in one copy (the client's own spacing after the colon, which HTTP allows
/// either way), rather than name, colon, value and CRLF a field at a time (callgrind: the
/// field-at-a-time copies were a third of writing a backend's head). A line with anything
/// between its value and its CRLF is written anew. The fields name a Host (the client's
/// request had one: the router routed on it).
pub fn write_placed_request_fields<'m>(
    out: &mut Vec<u8>,
    method: &[u8],
    target: &[u8],
    placed: &PlacedFields,
    body: RequestBody,
    own: OwnFields<'_, impl Fn(&[u8]) -> bool, impl IntoIterator<Item = (&'m [u8], &'m [u8])>>,
) {
    let extra = own.replacing;
    write_request_line(out, method, target);
    let connection_values = || {
        placed
            .iter()
            .filter(|(name, _)| name.eq_ignore_ascii_case(b"connection"))
            .map(|(_, value)| value)
    };
    let connection = Connection::from_values(connection_values());
    let head = placed.head();
    // The run of whole lines not copied yet.
    let mut run: Option<(usize, usize)> = None;
    for line in placed.lines() {
        if !kept(line.name, &connection, connection_values(), extra) || (own.left_out)(line.name) {
            continue;
        }
        match (run, line.span) {
            (Some((start, end)), Some((line_start, line_end))) if end == line_start => {
                run = Some((start, line_end));
            }
            (_, span) => {
                if let Some((start, end)) = run {
                    out.extend_from_slice(&head[start..end]);
                }
                run = span;
                if span.is_none() {
                    write_field(out, line.name, line.value);
                }
            }
        }
    }
    if let Some((start, end)) = run {
        out.extend_from_slice(&head[start..end]);
    }
    end_request_head(out, body, extra, own.more);
}

/// What a backend's head gets besides an HTTP/1.x client's fields as read: the router's
/// own fields and the app's edits, applied as the head is written rather than on a map of
/// the client's fields (which would cost more than the whole head's copy).
pub struct OwnFields<'e, L, M> {
    /// Fields written after the client's, in place of any of the client's of the same name
    /// (but `Via`, which the router's follows).
    pub replacing: &'e [(&'e str, &'e [u8])],
    /// Whether a client's field of this name (as sent) is left out.
    pub left_out: L,
    /// Fields written after those, beside the client's that are not left out.
    pub more: M,
}

/// [`OwnFields`] with no field left out and none more.
pub type RouterFieldsOnly<'e> =
    OwnFields<'e, fn(&[u8]) -> bool, std::iter::Empty<(&'static [u8], &'static [u8])>>;

impl<'e> RouterFieldsOnly<'e> {
    /// The router's `replacing` fields alone.
    pub fn replacing(replacing: &'e [(&'e str, &'e [u8])]) -> Self {
        Self {
            replacing,
            left_out: |_| false,
            more: std::iter::empty(),
        }
    }
}

fn write_request_line(out: &mut Vec<u8>, method: &[u8], target: &[u8]) {
    out.extend_from_slice(method);
    out.push(b' ');
    out.extend_from_slice(target);
    out.extend_from_slice(b" HTTP/1.1\r\n");
}

/// Whether a request's field named `name` goes on to the backend: not hop-by-hop, not
/// named by its `Connection`, not one of the router's own `extra` fields that replace the
/// client's (but `Via`, which the router's follows).
fn kept<'v>(
    name: &[u8],
    connection: &Connection,
    connection_values: impl Iterator<Item = &'v [u8]>,
    extra: &[(&str, &[u8])],
) -> bool {
    fields::forwarded(name, connection, connection_values)
        && !extra.iter().any(|(replaced, _)| {
            replaced.as_bytes().eq_ignore_ascii_case(name) && !name.eq_ignore_ascii_case(b"via")
        })
}

/// The framing field, the router's own fields, `more` (the app's edits), and the end of
/// the head.
fn end_request_head<'m>(
    out: &mut Vec<u8>,
    body: RequestBody,
    extra: &[(&str, &[u8])],
    more: impl IntoIterator<Item = (&'m [u8], &'m [u8])>,
) {
    write_framing(out, body);
    for (name, value) in extra {
        write_field(out, name, value);
    }
    for (name, value) in more {
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
    for header in end_to_end_fields(head) {
        let name =
            HeaderName::from_bytes(header.name.as_bytes()).map_err(|_| BridgeError::Invalid)?;
        let value = HeaderValue::from_bytes(header.value).map_err(|_| BridgeError::Invalid)?;
        headers.append(name, value);
    }
    Ok((status, headers))
}

/// The fields of `head` that [`response_parts`] keeps, in their order: for a caller that
/// makes the values share the buffer the head was read into rather than copying them.
pub fn end_to_end_fields<'r, 'b>(
    head: &'r ResponseHead<'_, 'b>,
) -> impl Iterator<Item = &'r crate::Header<'b>> {
    head.headers.iter().filter(move |header| {
        // HTTP/2 keeps a Content-Length it can check against the DATA frames.
        let keep_length = header.name.eq_ignore_ascii_case("content-length")
            && (head.announces_length() || matches!(head.body, ResponseBody::Length(_)));
        keep_length
            || fields::forwarded(
                header.name.as_bytes(),
                &head.connection,
                fields::connection_values(head.headers),
            )
    })
}

/// The Transfer-Encoding lines of an answer whose app applied codings other than chunked
/// (none otherwise): they are the client's to undo, and its side chunks the body again
/// after them.
pub fn coding_fields<'r, 'b>(
    head: &'r ResponseHead<'_, 'b>,
) -> impl Iterator<Item = &'r crate::Header<'b>> {
    let lines = if head.other_codings {
        head.headers
    } else {
        &[]
    };
    lines
        .iter()
        .filter(|field| field.name.eq_ignore_ascii_case("transfer-encoding"))
}

/// How an answer's body goes to an HTTP/1.x client, decided by the driver from the request
/// (HEAD), the status, what it knows of the body and the client's version.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AnswerFraming {
    /// No body follows (HEAD, 1xx, 204, 304): the fields go as they are, a Content-Length
    /// the answer announces included.
    NoBody,
    /// Exactly this many bytes follow.
    Length(u64),
    /// Chunked (an HTTP/1.1 client, a body of unknown length).
    Chunked,
    /// The body ends with the connection (an HTTP/1.0 client, a body of unknown length).
    UntilClose,
}

/// What the answer says of the connection after it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AnswerConnection {
    /// Kept, and the client's version keeps it by default (HTTP/1.1): nothing is written.
    Kept,
    /// Kept for an HTTP/1.0 client, which closes unless told otherwise.
    KeptForHttp10,
    /// Closed after this answer.
    Closed,
    /// A protocol switch: the answer's own Upgrade and Connection go as they are.
    Switched,
}

/// Writes the head of an answer (`status`, `headers`) for an HTTP/1.x client into `out`
/// (appending): the framing fields written from `framing` alone (a Content-Length or
/// Transfer-Encoding in `headers` replaced; codings other than chunked kept ahead of
/// chunked), `Connection` from `connection`, and a Date from `date` — asked for only when
/// `headers` has none, as most apps' answers have one.
pub fn write_response_parts<D: AsRef<[u8]>>(
    out: &mut Vec<u8>,
    status: StatusCode,
    headers: &HeaderMap,
    framing: AnswerFraming,
    connection: AnswerConnection,
    date: impl FnOnce() -> D,
) {
    let fields = || {
        headers
            .iter()
            .map(|(name, value)| (name.as_str().as_bytes(), value.as_bytes()))
    };
    write_answer_head(out, status, fields, framing, connection, date);
}

/// [`write_response_parts`] for fields given as names and values: an answer's fields as
/// the backend sent them ([`crate::AnswerFields`]) and the router's own, with no map built.
/// `fields` gives them afresh each time it is called (the codings are read on a second
/// walk); names are compared in any case.
pub fn write_answer_head<'f, I, D>(
    out: &mut Vec<u8>,
    status: StatusCode,
    fields: impl Fn() -> I,
    framing: AnswerFraming,
    connection: AnswerConnection,
    date: impl FnOnce() -> D,
) where
    I: Iterator<Item = (&'f [u8], &'f [u8])>,
    D: AsRef<[u8]>,
{
    out.extend_from_slice(b"HTTP/1.1 ");
    out.extend_from_slice(status.as_str().as_bytes());
    out.push(b' ');
    out.extend_from_slice(status.canonical_reason().unwrap_or("Unknown").as_bytes());
    out.extend_from_slice(b"\r\n");
    let mut codings = false;
    let mut dated = false;
    for (name, value) in fields() {
        if name.eq_ignore_ascii_case(b"content-length") {
            if framing == AnswerFraming::NoBody {
                write_field(out, name, value);
            }
            continue;
        }
        if name.eq_ignore_ascii_case(b"transfer-encoding") {
            codings = true;
            continue;
        }
        if name.eq_ignore_ascii_case(b"connection") && connection != AnswerConnection::Switched {
            continue;
        }
        dated |= name.eq_ignore_ascii_case(b"date");
        write_field(out, name, value);
    }
    // Lower case, as the fields of a map are.
    match framing {
        AnswerFraming::Length(length) => {
            out.extend_from_slice(b"content-length: ");
            write_decimal(out, length);
            out.extend_from_slice(b"\r\n");
        }
        AnswerFraming::Chunked if codings => {
            let values = fields()
                .filter(|(name, _)| name.eq_ignore_ascii_case(b"transfer-encoding"))
                .map(|(_, value)| value);
            write_codings_of(out, b"transfer-encoding: ", values);
        }
        AnswerFraming::Chunked => out.extend_from_slice(b"transfer-encoding: chunked\r\n"),
        AnswerFraming::NoBody | AnswerFraming::UntilClose => {}
    }
    match connection {
        AnswerConnection::Closed => out.extend_from_slice(b"connection: close\r\n"),
        AnswerConnection::KeptForHttp10 => out.extend_from_slice(b"connection: keep-alive\r\n"),
        AnswerConnection::Kept | AnswerConnection::Switched => {}
    }
    if !dated {
        write_field(out, "date", date().as_ref());
    }
    out.extend_from_slice(b"\r\n");
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{header_slots, parse_request, parse_response, FieldPlace};

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
    fn the_routers_via_follows_the_clients_rather_than_replacing_it() {
        let fields: [(&[u8], &[u8]); 3] = [
            (b"Host", b"app.test"),
            (b"Via", b"1.0 cdn-a"),
            (b"via", b"1.1 cdn-b"),
        ];
        let mut out = Vec::new();
        write_request_fields(
            &mut out,
            b"GET",
            b"/",
            None,
            || fields.iter().copied(),
            RequestBody::Empty,
            &[("via", b"1.1 switchyard")],
        );
        assert_eq!(
            String::from_utf8(out).expect("ascii"),
            "GET / HTTP/1.1\r\nHost: app.test\r\nVia: 1.0 cdn-a\r\nvia: 1.1 cdn-b\r\n\
             via: 1.1 switchyard\r\n\r\n"
        );
    }

    /// The fields of `head` (a whole request head) where they were read.
    fn placed(head: &'static [u8]) -> PlacedFields {
        let mut slots = header_slots();
        let parsed = parse_request(head, &mut slots)
            .expect("valid")
            .expect("complete");
        let base = head.as_ptr() as usize;
        let at = |piece: &[u8]| (piece.as_ptr() as usize - base) as u32;
        let places: Vec<FieldPlace> = parsed
            .headers
            .iter()
            .map(|field| {
                let (name, value) = (at(field.name.as_bytes()), at(field.value));
                (
                    name,
                    name + field.name.len() as u32,
                    value,
                    value + field.value.len() as u32,
                )
            })
            .collect();
        PlacedFields::new(bytes::Bytes::from_static(head), &places)
    }

    /// `GET /p` with `fields` as read and the router's `own`, as a backend gets it.
    fn written_as_read<'m>(
        fields: &PlacedFields,
        own: OwnFields<'_, impl Fn(&[u8]) -> bool, impl IntoIterator<Item = (&'m [u8], &'m [u8])>>,
    ) -> Vec<u8> {
        let mut out = Vec::new();
        write_placed_request_fields(&mut out, b"GET", b"/p", fields, RequestBody::Empty, own);
        out
    }

    #[test]
    fn fields_as_read_go_out_by_the_same_rules_whole_lines_as_they_came() {
        let head: &'static [u8] = b"GET /p HTTP/1.1\r\nHost: app.test\r\nAccept:*/*\r\n\
            Connection: keep-alive, x-secret\r\nX-Secret: s\r\nUser-Agent: t\r\n\
            X-Trailing: 1 \t\r\nX-Forwarded-For: 203.0.113.9\r\nCookie: a=1\r\n\
            Via: 1.0 cdn\r\nAccept-Language: fr\n\r\n";
        let extra: &[(&str, &[u8])] = &[("x-forwarded-for", b"192.0.2.1"), ("via", b"1.1 sy")];
        let fields = placed(head);
        let out = written_as_read(&fields, OwnFields::replacing(extra));
        // Runs of kept lines as they came ("Accept:*/*" keeps its spacing); the hop-by-hop
        // fields, the one Connection names and the replaced X-Forwarded-For left out; the
        // line with trailing spaces and the one ending in a bare LF written anew.
        assert_eq!(
            String::from_utf8(out.clone()).expect("ascii"),
            "GET /p HTTP/1.1\r\nHost: app.test\r\nAccept:*/*\r\nUser-Agent: t\r\n\
             X-Trailing: 1\r\nCookie: a=1\r\nVia: 1.0 cdn\r\nAccept-Language: fr\r\n\
             x-forwarded-for: 192.0.2.1\r\nvia: 1.1 sy\r\n\r\n"
        );
        // The same fields, the same values and order as the field-at-a-time writer's.
        let mut one_at_a_time = Vec::new();
        write_request_fields(
            &mut one_at_a_time,
            b"GET",
            b"/p",
            None,
            || fields.iter(),
            RequestBody::Empty,
            extra,
        );
        let read = |bytes: &[u8]| -> Vec<(String, Vec<u8>)> {
            let mut slots = header_slots();
            let head = parse_request(bytes, &mut slots)
                .expect("valid")
                .expect("complete");
            head.headers
                .iter()
                .map(|h| (h.name.to_ascii_lowercase(), h.value.to_vec()))
                .collect()
        };
        assert_eq!(read(&out), read(&one_at_a_time));
    }

    #[test]
    fn the_apps_edits_leave_out_replace_and_append_beside_the_clients_fields() {
        let head: &'static [u8] =
            b"GET /p HTTP/1.1\r\nHost: app.test\r\nAccept-Encoding: gzip, br\r\n\
            X-Debug: 1\r\nX-Tenant: a\r\nAccept: */*\r\n\r\n";
        let fields = placed(head);
        let out = written_as_read(
            &fields,
            OwnFields {
                replacing: &[("via", b"1.1 sy")],
                left_out: |name: &[u8]| {
                    name.eq_ignore_ascii_case(b"x-debug")
                        || name.eq_ignore_ascii_case(b"accept-encoding")
                },
                more: [(&b"accept-encoding"[..], &b"br"[..]), (b"x-tenant", b"b")],
            },
        );
        assert_eq!(
            String::from_utf8(out).expect("ascii"),
            "GET /p HTTP/1.1\r\nHost: app.test\r\nX-Tenant: a\r\nAccept: */*\r\n\
             via: 1.1 sy\r\naccept-encoding: br\r\nx-tenant: b\r\n\r\n"
        );
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

    #[test]
    fn an_answer_for_an_http1_client_has_one_framing_written_by_the_router() {
        let mut headers = HeaderMap::new();
        headers.insert("content-type", HeaderValue::from_static("text/plain"));
        headers.insert("content-length", HeaderValue::from_static("99"));
        headers.insert("connection", HeaderValue::from_static("x-hop"));
        headers.insert(
            "date",
            HeaderValue::from_static("Sat, 28 Nov 2026 03:00:00 GMT"),
        );
        let date = b"Sat, 28 Nov 2026 04:00:00 GMT";
        let mut out = Vec::new();
        write_response_parts(
            &mut out,
            StatusCode::OK,
            &headers,
            AnswerFraming::Length(5),
            AnswerConnection::Closed,
            || date,
        );
        // The map's length and Connection give way to the router's; its own Date is kept.
        assert_eq!(
            String::from_utf8(out).expect("ascii"),
            "HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\ndate: Sat, 28 Nov 2026 03:00:00 GMT\r\n\
             content-length: 5\r\nconnection: close\r\n\r\n"
        );

        let mut headers = HeaderMap::new();
        headers.append(
            "transfer-encoding",
            HeaderValue::from_static("gzip, chunked"),
        );
        let mut out = Vec::new();
        write_response_parts(
            &mut out,
            StatusCode::NOT_FOUND,
            &headers,
            AnswerFraming::Chunked,
            AnswerConnection::KeptForHttp10,
            || date,
        );
        let written = String::from_utf8(out).expect("ascii");
        assert_eq!(
            written,
            "HTTP/1.1 404 Not Found\r\ntransfer-encoding: gzip, chunked\r\n\
             connection: keep-alive\r\ndate: Sat, 28 Nov 2026 04:00:00 GMT\r\n\r\n"
        );
        // What it wrote reads back with the framing it names.
        let mut slots = header_slots();
        let head = parse_response(written.as_bytes(), &mut slots, false)
            .expect("valid")
            .expect("complete");
        assert_eq!(head.body, ResponseBody::Chunked);

        // A HEAD's answer keeps the length it announces, and a 304 too.
        let mut headers = HeaderMap::new();
        headers.insert("content-length", HeaderValue::from_static("7"));
        let mut out = Vec::new();
        write_response_parts(
            &mut out,
            StatusCode::NOT_MODIFIED,
            &headers,
            AnswerFraming::NoBody,
            AnswerConnection::Kept,
            || date,
        );
        assert!(String::from_utf8(out)
            .expect("ascii")
            .contains("content-length: 7\r\n"));
    }
}
