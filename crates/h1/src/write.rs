//! Heads written once into one buffer for the next hop: the fields as received, less those
//! of the hop they came on, with the framing of the message written by the router.

use crate::fields::{self, tokens};
use crate::request::{RequestBody, RequestHead};
use crate::response::{ResponseBody, ResponseHead};
use httparse::Header;

/// Writes the request head for the backend into `out` (appending): origin-form target,
/// HTTP/1.1, the client's fields less hop-by-hop ones, one framing field, a WebSocket
/// upgrade if asked for, then `extra`. `answer_continue`: the router answers the client's
/// `Expect: 100-continue` itself, so the field is not forwarded.
pub fn write_request_head(
    out: &mut Vec<u8>,
    head: &RequestHead<'_, '_>,
    answer_continue: bool,
    extra: &[(&str, &[u8])],
) {
    out.extend_from_slice(head.method.as_bytes());
    out.push(b' ');
    let path = head.path();
    if path.starts_with('?') {
        out.push(b'/');
    }
    out.extend_from_slice(path.as_bytes());
    out.extend_from_slice(b" HTTP/1.1\r\n");
    let mut host_written = false;
    for header in head.headers {
        if forwarded(header, head.headers, &head.connection)
            && !(answer_continue && header.name.eq_ignore_ascii_case("expect"))
        {
            host_written |= header.name.eq_ignore_ascii_case("host");
            write_field(out, header.name, header.value);
        }
    }
    if let (false, Some(authority)) = (host_written, head.authority) {
        // An HTTP/1.0 absolute-form request: its host moves from the target to the field.
        write_field(out, "Host", authority);
    }
    match head.body {
        RequestBody::Chunked if head.other_codings => write_codings(out, head.headers),
        body => write_framing(out, body),
    }
    if head.websocket_upgrade {
        out.extend_from_slice(b"Upgrade: websocket\r\nConnection: upgrade\r\n");
    }
    for (name, value) in extra {
        write_field(out, name, value);
    }
    out.extend_from_slice(b"\r\n");
}

/// What the client's side of an answer needs to know.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClientSide {
    /// The client's HTTP/1.`minor_version`.
    pub minor_version: u8,
    /// The client connection stays open after this answer.
    pub keep_alive: bool,
    /// The body is written chunked (an HTTP/1.1 client given a chunked body); otherwise a
    /// chunked body is sent as its data alone and the connection's close ends it.
    pub chunked: bool,
}

/// Writes the answer's head for the client into `out` (appending).
pub fn write_response_head(
    out: &mut Vec<u8>,
    head: &ResponseHead<'_, '_>,
    client: ClientSide,
    extra: &[(&str, &[u8])],
) {
    out.extend_from_slice(b"HTTP/1.1 ");
    write_decimal(out, u64::from(head.code));
    out.push(b' ');
    out.extend_from_slice(head.reason.as_bytes());
    out.extend_from_slice(b"\r\n");
    for header in head.headers {
        if forwarded(header, head.headers, &head.connection)
            || (head.announces_length() && header.name.eq_ignore_ascii_case("content-length"))
        {
            write_field(out, header.name, header.value);
        }
    }
    match head.body {
        ResponseBody::Length(length) => write_length(out, length),
        ResponseBody::Chunked if client.chunked && head.other_codings => {
            write_codings(out, head.headers)
        }
        ResponseBody::Chunked if client.chunked => write_framing(out, RequestBody::Chunked),
        _ => {}
    }
    if head.code == 101 {
        out.extend_from_slice(b"Upgrade: websocket\r\nConnection: upgrade\r\n");
    } else if !client.keep_alive {
        out.extend_from_slice(b"Connection: close\r\n");
    } else if client.minor_version == 0 {
        out.extend_from_slice(b"Connection: keep-alive\r\n");
    }
    for (name, value) in extra {
        write_field(out, name, value);
    }
    out.extend_from_slice(b"\r\n");
}

fn forwarded(header: &Header<'_>, all: &[Header<'_>], connection: &fields::Connection) -> bool {
    fields::forwarded(
        header.name.as_bytes(),
        connection,
        fields::connection_values(all),
    )
}

pub(crate) fn write_field(out: &mut Vec<u8>, name: impl AsRef<[u8]>, value: &[u8]) {
    out.extend_from_slice(name.as_ref());
    out.extend_from_slice(b": ");
    out.extend_from_slice(value);
    out.extend_from_slice(b"\r\n");
}

fn write_length(out: &mut Vec<u8>, length: u64) {
    out.extend_from_slice(b"Content-Length: ");
    write_decimal(out, length);
    out.extend_from_slice(b"\r\n");
}

/// The one framing field of a body: a Content-Length, a chunked Transfer-Encoding, or
/// none.
pub(crate) fn write_framing(out: &mut Vec<u8>, body: RequestBody) {
    match body {
        RequestBody::Empty => {}
        RequestBody::Length(length) => write_length(out, length),
        RequestBody::Chunked => out.extend_from_slice(b"Transfer-Encoding: chunked\r\n"),
    }
}

/// One Transfer-Encoding line: the codings other than identity, in order, ending in the
/// one chunked the reader checked is last.
fn write_codings(out: &mut Vec<u8>, headers: &[Header<'_>]) {
    let values = headers
        .iter()
        .filter(|header| header.name.eq_ignore_ascii_case("transfer-encoding"))
        .map(|header| header.value);
    write_codings_of(out, b"Transfer-Encoding: ", values);
}

/// [`write_codings`] for the values of the Transfer-Encoding fields alone.
pub(crate) fn write_codings_of<'v>(
    out: &mut Vec<u8>,
    field: &[u8],
    values: impl Iterator<Item = &'v [u8]>,
) {
    out.extend_from_slice(field);
    let codings = values.flat_map(tokens).filter(|coding| {
        !coding.eq_ignore_ascii_case(b"identity") && !coding.eq_ignore_ascii_case(b"chunked")
    });
    for coding in codings {
        out.extend(coding.iter().map(u8::to_ascii_lowercase));
        out.extend_from_slice(b", ");
    }
    out.extend_from_slice(b"chunked\r\n");
}

pub(crate) fn write_decimal(out: &mut Vec<u8>, mut value: u64) {
    let mut digits = [0u8; 20];
    let mut at = digits.len();
    loop {
        at -= 1;
        digits[at] = b'0' + (value % 10) as u8;
        value /= 10;
        if value == 0 {
            break;
        }
    }
    out.extend_from_slice(&digits[at..]);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{header_slots, parse_request, parse_response};

    fn request_for_backend(raw: &[u8], answer_continue: bool) -> String {
        let mut slots = header_slots();
        let head = parse_request(raw, &mut slots)
            .expect("valid")
            .expect("complete");
        let mut out = Vec::new();
        write_request_head(
            &mut out,
            &head,
            answer_continue,
            &[("X-Forwarded-For", b"10.0.0.1")],
        );
        String::from_utf8(out).expect("ascii")
    }

    #[test]
    fn hop_by_hop_fields_stay_behind() {
        let written = request_for_backend(
            b"GET http://a.test/x HTTP/1.1\nHost: a.test\nConnection: keep-alive, X-Secret\n\
              Keep-Alive: 5\nX-Secret: s\nTE: trailers\nAccept: */*\nUpgrade: h2c\n\n",
            false,
        );
        assert_eq!(
            written,
            "GET /x HTTP/1.1\r\nHost: a.test\r\nAccept: */*\r\nX-Forwarded-For: 10.0.0.1\r\n\r\n"
        );
    }

    #[test]
    fn framing_is_written_once() {
        let written = request_for_backend(
            b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 4\r\nTransfer-Encoding: identity\r\n\
              Transfer-Encoding: gzip, CHUNKED\r\nExpect: 100-continue\r\n\r\n",
            true,
        );
        assert_eq!(
            written,
            "POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: gzip, chunked\r\n\
             X-Forwarded-For: 10.0.0.1\r\n\r\n"
        );
        let written = request_for_backend(
            b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\nContent-Length: 5\r\n\
              Connection: Content-Length\r\n\r\n",
            false,
        );
        assert_eq!(
            written,
            "POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\nX-Forwarded-For: 10.0.0.1\r\n\r\n"
        );
    }

    #[test]
    fn an_absolute_form_host_becomes_the_field() {
        assert_eq!(
            request_for_backend(b"GET http://a.test/x HTTP/1.0\r\n\r\n", false),
            "GET /x HTTP/1.1\r\nHost: a.test\r\nX-Forwarded-For: 10.0.0.1\r\n\r\n"
        );
        // Found by fuzz/h1_request: a query without a path was written as the target.
        assert_eq!(
            request_for_backend(
                b"GET http://a.test?q HTTP/1.1\r\nHost: a.test\r\n\r\n",
                false
            ),
            "GET /?q HTTP/1.1\r\nHost: a.test\r\nX-Forwarded-For: 10.0.0.1\r\n\r\n"
        );
    }

    #[test]
    fn a_websocket_upgrade_goes_on() {
        let written = request_for_backend(
            b"GET /ws HTTP/1.1\r\nHost: a\r\nUpgrade: WebSocket\r\nConnection: Upgrade\r\n\
              Sec-WebSocket-Key: k\r\n\r\n",
            false,
        );
        assert_eq!(
            written,
            "GET /ws HTTP/1.1\r\nHost: a\r\nSec-WebSocket-Key: k\r\nUpgrade: websocket\r\n\
             Connection: upgrade\r\nX-Forwarded-For: 10.0.0.1\r\n\r\n"
        );
    }

    fn answer_for_client(raw: &[u8], answers_head: bool, client: ClientSide) -> String {
        let mut slots = header_slots();
        let head = parse_response(raw, &mut slots, answers_head)
            .expect("valid")
            .expect("complete");
        let mut out = Vec::new();
        write_response_head(&mut out, &head, client, &[]);
        String::from_utf8(out).expect("ascii")
    }

    const KEEP: ClientSide = ClientSide {
        minor_version: 1,
        keep_alive: true,
        chunked: true,
    };

    #[test]
    fn answers_keep_their_fields_and_get_our_framing() {
        assert_eq!(
            answer_for_client(
                b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nKeep-Alive: timeout=5\r\nX: y\r\n\r\n",
                false,
                KEEP
            ),
            "HTTP/1.1 200 OK\r\nX: y\r\nContent-Length: 2\r\n\r\n"
        );
        assert_eq!(
            answer_for_client(
                b"HTTP/1.1 200 OK\r\nContent-Length: 7\r\n\r\n",
                true,
                ClientSide {
                    minor_version: 0,
                    ..KEEP
                }
            ),
            "HTTP/1.1 200 OK\r\nContent-Length: 7\r\nConnection: keep-alive\r\n\r\n"
        );
        assert_eq!(
            answer_for_client(
                b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n",
                false,
                ClientSide {
                    minor_version: 0,
                    keep_alive: false,
                    chunked: false
                }
            ),
            "HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n"
        );
        assert_eq!(
            answer_for_client(
                b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
                  Sec-WebSocket-Accept: a\r\n\r\n",
                false,
                KEEP
            ),
            "HTTP/1.1 101 Switching Protocols\r\nSec-WebSocket-Accept: a\r\nUpgrade: websocket\r\n\
             Connection: upgrade\r\n\r\n"
        );
    }

    #[test]
    fn decimals() {
        for value in [0u64, 7, 10, 1234567890, u64::MAX] {
            let mut out = Vec::new();
            write_decimal(&mut out, value);
            assert_eq!(String::from_utf8(out).expect("ascii"), value.to_string());
        }
    }
}
