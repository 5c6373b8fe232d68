//! Request smuggling and HTTP/1 parsing: raw bytes from a client through the real router to a
//! backend that records every byte it receives (`support::wiretap`).
//!
//! A desync needs two parsers that disagree about where a request ends. So for every case
//! the bytes the backend received are read twice — the RFC way (chunked wins) and the old
//! way (Content-Length wins) — and must give the same requests, end on a request boundary,
//! and be framed so that no reader could differ: CRLF line ends, one Content-Length or one
//! `Transfer-Encoding: chunked` and never both, token header names, no folded lines, no
//! protocol upgrade other than WebSocket. A request smuggled inside another (`/smuggled`)
//! must never reach the backend as a request of its own, and the next client, whose request
//! may travel on the same pooled backend connection, must get its own answer.

use switchyard_test_support as support;

use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use serde_json::json;
use support::h2_raw;
use support::wiretap::{read_wire, Framing, WireRequest, Wiretap};
use support::RouterProcess;

const HOST: &str = "smuggle.test";

/// What the router must do with a case.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Expect {
    /// Refused with this status before anything reaches the backend.
    Refused(u16),
    /// Refused with some 4xx, or the connection closed without an answer.
    RefusedAny,
    /// Forwarded (normalised); the backend answers the one request the router saw.
    Forwarded,
    /// Either, for framing a server may rightly take either way: refused with a 4xx before
    /// anything reaches the backend, or forwarded normalised (hyper refuses a bare LF in a
    /// chunk extension and a space in the target, as RFC 9112 allows; others normalise).
    RefusedOrForwarded,
}

struct Case {
    name: &'static str,
    raw: Vec<u8>,
    expect: Expect,
}

fn case(name: &'static str, raw: impl AsRef<[u8]>, expect: Expect) -> Case {
    Case {
        name,
        raw: raw.as_ref().to_vec(),
        expect,
    }
}

/// A smuggled request, as an attacker would hide it in a body.
fn smuggled() -> String {
    format!("GET /smuggled HTTP/1.1\r\nHost: {HOST}\r\nX: ")
}

// A table of cases, one a few lines, rather than a function of many concerns.
#[allow(clippy::too_many_lines)]
fn http1_cases() -> Vec<Case> {
    use Expect::*;
    let s = smuggled();
    let chunk = format!("{:x}\r\n{s}\r\n0\r\n\r\n", s.len());
    let h = format!("Host: {HOST}\r\n");
    vec![
        // CL.TE: a front end using Content-Length would pass the smuggled request along in
        // the body; chunked must win and the connection must close after the answer.
        case(
            "CL.TE",
            format!(
                "POST / HTTP/1.1\r\n{h}Content-Length: {}\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n{s}",
                5 + s.len()
            ),
            Forwarded,
        ),
        // TE.CL: the smuggled request is chunk data; a backend reading Content-Length: 4
        // would take it for the next request unless Content-Length is dropped.
        case(
            "TE.CL",
            format!("POST / HTTP/1.1\r\n{h}Content-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\n{chunk}"),
            Forwarded,
        ),
        case(
            "conflicting Content-Length",
            format!("POST / HTTP/1.1\r\n{h}Content-Length: 5\r\nContent-Length: 40\r\n\r\nhello{s}"),
            Refused(400),
        ),
        case(
            "Content-Length list with different values",
            format!("POST / HTTP/1.1\r\n{h}Content-Length: 5, 40\r\n\r\nhello{s}"),
            Refused(400),
        ),
        case(
            "duplicate identical Content-Length",
            format!("POST / HTTP/1.1\r\n{h}Content-Length: 5\r\nContent-Length: 5\r\n\r\nhello"),
            Forwarded,
        ),
        case(
            "Content-Length with a sign",
            format!("POST / HTTP/1.1\r\n{h}Content-Length: +5\r\n\r\nhello"),
            Refused(400),
        ),
        case(
            "negative Content-Length",
            format!("POST / HTTP/1.1\r\n{h}Content-Length: -1\r\n\r\nhello"),
            Refused(400),
        ),
        case(
            "Content-Length in hex",
            format!("POST / HTTP/1.1\r\n{h}Content-Length: 0x5\r\n\r\nhello"),
            Refused(400),
        ),
        case(
            "Content-Length named hop-by-hop in Connection",
            format!("POST / HTTP/1.1\r\n{h}Content-Length: {}\r\nConnection: Content-Length\r\n\r\n{s}\r\n\r\n", s.len() + 4),
            Forwarded,
        ),
        case(
            "Transfer-Encoding named hop-by-hop in Connection",
            format!("POST / HTTP/1.1\r\n{h}Transfer-Encoding: chunked\r\nConnection: Transfer-Encoding\r\n\r\n{chunk}"),
            Forwarded,
        ),
        case(
            "Transfer-Encoding: xchunked",
            format!("POST / HTTP/1.1\r\n{h}Content-Length: 4\r\nTransfer-Encoding: xchunked\r\n\r\n{chunk}"),
            Refused(400),
        ),
        case(
            "Transfer-Encoding: chunked, identity",
            format!("POST / HTTP/1.1\r\n{h}Transfer-Encoding: chunked, identity\r\n\r\n{chunk}"),
            Refused(400),
        ),
        case(
            "Transfer-Encoding: identity, chunked",
            format!("POST / HTTP/1.1\r\n{h}Transfer-Encoding: identity, chunked\r\n\r\n{chunk}"),
            Forwarded,
        ),
        case(
            "Transfer-Encoding split over two lines",
            format!("POST / HTTP/1.1\r\n{h}Transfer-Encoding: identity\r\nTransfer-Encoding: chunked\r\n\r\n{chunk}"),
            Forwarded,
        ),
        case(
            "Transfer-Encoding chunked then a second line",
            format!("POST / HTTP/1.1\r\n{h}Transfer-Encoding: chunked\r\nTransfer-Encoding: x\r\n\r\n{chunk}"),
            Refused(400),
        ),
        case(
            "Transfer-Encoding in upper case",
            format!("POST / HTTP/1.1\r\n{h}Transfer-Encoding: CHUNKED\r\n\r\n{chunk}"),
            Forwarded,
        ),
        case(
            "space before the colon",
            format!("POST / HTTP/1.1\r\n{h}Transfer-Encoding : chunked\r\nContent-Length: 4\r\n\r\n{chunk}"),
            Refused(400),
        ),
        case(
            "vertical tab before chunked",
            format!("POST / HTTP/1.1\r\n{h}Transfer-Encoding:\x0bchunked\r\nContent-Length: 4\r\n\r\n{chunk}"),
            RefusedAny,
        ),
        case(
            "Transfer-Encoding on HTTP/1.0",
            format!("POST / HTTP/1.0\r\n{h}Transfer-Encoding: chunked\r\n\r\n{chunk}"),
            Refused(400),
        ),
        case(
            "folded Transfer-Encoding line",
            format!("POST / HTTP/1.1\r\n{h}Transfer-Encoding:\r\n chunked\r\nContent-Length: 4\r\n\r\n{chunk}"),
            Refused(400),
        ),
        case(
            "folded header line",
            format!("GET / HTTP/1.1\r\n{h}X-Folded: a\r\n b\r\n\r\n"),
            Refused(400),
        ),
        case(
            "chunk size with 0x prefix",
            format!("POST / HTTP/1.1\r\n{h}Transfer-Encoding: chunked\r\n\r\n0x5\r\nhello\r\n0\r\n\r\n{s}"),
            RefusedAny,
        ),
        case(
            "negative chunk size",
            format!("POST / HTTP/1.1\r\n{h}Transfer-Encoding: chunked\r\n\r\n-5\r\nhello\r\n0\r\n\r\n"),
            RefusedAny,
        ),
        case(
            "chunk size overflowing 64 bits",
            format!("POST / HTTP/1.1\r\n{h}Transfer-Encoding: chunked\r\n\r\n10000000000000005\r\nhello\r\n0\r\n\r\n{s}"),
            RefusedAny,
        ),
        case(
            "chunk data longer than its size",
            format!("POST / HTTP/1.1\r\n{h}Transfer-Encoding: chunked\r\n\r\n3\r\nhello\r\n0\r\n\r\n"),
            RefusedAny,
        ),
        case(
            "bare LF in a chunk extension",
            format!("POST / HTTP/1.1\r\n{h}Transfer-Encoding: chunked\r\n\r\n5;\nxx\r\nhello\r\n0\r\n\r\n"),
            RefusedOrForwarded,
        ),
        case(
            "bare LF line ends",
            format!("GET / HTTP/1.1\nHost: {HOST}\nX-A: b\n\n"),
            Forwarded,
        ),
        case(
            "bare CR in a header value",
            format!("GET / HTTP/1.1\r\n{h}X-A: a\rTransfer-Encoding: chunked\r\n\r\n"),
            Refused(400),
        ),
        case(
            "NUL in a header value",
            format!("GET / HTTP/1.1\r\n{h}X-A: a\0b\r\n\r\n"),
            Refused(400),
        ),
        case(
            "space in a header name",
            format!("GET / HTTP/1.1\r\n{h}Transfer Encoding: chunked\r\n\r\n"),
            Refused(400),
        ),
        case(
            "non-token header name",
            format!("GET / HTTP/1.1\r\n{h}X(A): b\r\n\r\n"),
            Refused(400),
        ),
        case(
            "header line without a colon",
            format!("GET / HTTP/1.1\r\n{h}Transfer-Encoding chunked\r\n\r\n"),
            Refused(400),
        ),
        case(
            "two Host headers",
            format!("GET / HTTP/1.1\r\n{h}Host: other.test\r\n\r\n"),
            Refused(400),
        ),
        case(
            "absolute URI naming another host",
            format!("GET http://other.test/ HTTP/1.1\r\n{h}\r\n"),
            Refused(400),
        ),
        case(
            "request line with a tab",
            format!("GET\t/ HTTP/1.1\r\n{h}\r\n"),
            RefusedAny,
        ),
        // Refused, or percent-encoded into the single target `/%20/smuggled`.
        case(
            "target with a space",
            format!("GET / /smuggled HTTP/1.1\r\n{h}\r\n"),
            RefusedOrForwarded,
        ),
        case(
            "oversized request line",
            format!("GET /{} HTTP/1.1\r\n{h}\r\n", "a".repeat(70_000)),
            RefusedAny,
        ),
        case(
            "oversized header section",
            format!("GET / HTTP/1.1\r\n{h}{}\r\n", format!("X-Pad: {}\r\n", "a".repeat(400)).repeat(200)),
            Refused(431),
        ),
        // Over the 100 header lines hyper takes: refused while reading, before any routing.
        case(
            "too many header lines",
            format!("GET / HTTP/1.1\r\n{h}{}\r\n", "X-Pad: a\r\n".repeat(2_000)),
            RefusedAny,
        ),
        // h2c upgrade smuggling: a backend that accepts would talk HTTP/2 directly with the
        // client through the router's tunnel, past every per-request rule.
        case(
            "h2c upgrade",
            format!("GET / HTTP/1.1\r\n{h}Upgrade: h2c\r\nHTTP2-Settings: AAMAAABkAARAAAAAAAIAAAAA\r\nConnection: Upgrade, HTTP2-Settings\r\n\r\n"),
            Forwarded,
        ),
    ]
}

/// Sends one case on a fresh connection and reads answers until the router closes or goes
/// quiet. Returns the statuses of the answers.
fn exchange(router: SocketAddr, raw: &[u8]) -> Vec<u16> {
    let mut stream = TcpStream::connect(router).expect("router accepts");
    stream
        .set_read_timeout(Some(Duration::from_millis(300)))
        .expect("read timeout");
    // A refused request may make the router close while we are still writing.
    let _ = stream.write_all(raw);
    let mut received = Vec::new();
    let mut buf = [0u8; 16 * 1024];
    let deadline = Instant::now() + Duration::from_secs(3);
    let mut quiet_since = Instant::now();
    while Instant::now() < deadline {
        match stream.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => {
                received.extend_from_slice(&buf[..n]);
                quiet_since = Instant::now();
            }
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
                if !received.is_empty() && quiet_since.elapsed() > Duration::from_millis(600) {
                    break;
                }
            }
            Err(_) => break,
        }
    }
    statuses(&received)
}

fn statuses(received: &[u8]) -> Vec<u16> {
    let text = String::from_utf8_lossy(received);
    let mut found = Vec::new();
    let mut rest = text.as_ref();
    while let Some(at) = rest.find("HTTP/1.") {
        let line = &rest[at..];
        if let Some(status) = line.get(9..12).and_then(|s| s.parse().ok()) {
            found.push(status);
        }
        rest = &rest[at + 7..];
    }
    found
}

/// What makes bytes unambiguous to any HTTP/1.1 reader.
fn framing_problems(request: &WireRequest) -> Vec<String> {
    let mut problems = Vec::new();
    let head = &request.head;
    if head
        .iter()
        .enumerate()
        .any(|(i, &b)| b == b'\n' && (i == 0 || head[i - 1] != b'\r'))
    {
        problems.push("bare LF in the header section".into());
    }
    if head
        .windows(3)
        .any(|w| w[0] == b'\r' && w[1] == b'\n' && (w[2] == b' ' || w[2] == b'\t'))
    {
        problems.push("folded header line".into());
    }
    let is_token = |s: &str| {
        !s.is_empty()
            && s.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b))
    };
    for (name, value) in &request.headers {
        if !is_token(name) {
            problems.push(format!("header name {name:?}"));
        }
        if value.bytes().any(|b| b == b'\r' || b == 0) {
            problems.push(format!("control byte in {name}"));
        }
    }
    let all = |wanted: &str| -> Vec<&str> {
        request
            .headers
            .iter()
            .filter(|(n, _)| n.eq_ignore_ascii_case(wanted))
            .map(|(_, v)| v.as_str())
            .collect()
    };
    let lengths = all("content-length");
    let encodings = all("transfer-encoding");
    if lengths.len() > 1 {
        problems.push(format!("{} Content-Length headers", lengths.len()));
    }
    if !lengths.is_empty() && !encodings.is_empty() {
        problems.push("both Content-Length and Transfer-Encoding".into());
    }
    if !encodings.is_empty() && encodings != ["chunked"] {
        problems.push(format!("Transfer-Encoding {encodings:?}"));
    }
    if lengths
        .iter()
        .any(|v| !v.bytes().all(|b| b.is_ascii_digit()))
    {
        problems.push(format!("Content-Length {lengths:?}"));
    }
    for upgrade in all("upgrade") {
        if !upgrade.eq_ignore_ascii_case("websocket") {
            problems.push(format!("Upgrade: {upgrade}"));
        }
    }
    if !all("http2-settings").is_empty() {
        problems.push("HTTP2-Settings forwarded".into());
    }
    problems
}

/// Checks every byte the backend received since the last look; returns the complete
/// requests. A request cut short (the router found the body bad after sending the head on)
/// is acceptable only on a connection the router then closed: left open, the next request
/// on it would be read as the rest of the body.
fn check_backend_wires(wiretap: &Wiretap, case: &str) -> Vec<WireRequest> {
    let mut requests = Vec::new();
    for (index, wire) in wiretap.wires().iter().enumerate() {
        if wire.bytes.is_empty() {
            continue;
        }
        let (by_rfc, rfc_rest) = read_wire(&wire.bytes, Framing::TransferEncodingFirst);
        let (by_length, length_rest) = read_wire(&wire.bytes, Framing::ContentLengthFirst);
        let shown = String::from_utf8_lossy(&wire.bytes);
        assert_eq!(by_rfc, by_length, "{case}: readers disagree on {shown:?}");
        assert_eq!(
            rfc_rest, length_rest,
            "{case}: readers disagree on where {shown:?} stops"
        );
        if let Some(rest) = rfc_rest {
            support::eventually(
                Duration::from_secs(3),
                &format!("{case}: the router closes the connection of an aborted request ({rest})"),
                || wiretap.wires().get(index).is_some_and(|w| w.closed),
            );
        }
        for request in &by_rfc {
            let problems = framing_problems(request);
            assert!(problems.is_empty(), "{case}: {problems:?} in {shown:?}");
            assert!(
                !request.target.starts_with("/smuggled"),
                "{case}: a smuggled request reached the backend: {shown:?}"
            );
        }
        requests.extend(by_rfc);
    }
    wiretap.clear();
    requests
}

fn start() -> (RouterProcess, Wiretap) {
    let router = RouterProcess::start();
    let wiretap = Wiretap::start();
    router.put_app(
        "smuggle",
        json!({"domains": [HOST], "backends": [wiretap.addr.to_string()]}),
    );
    (router, wiretap)
}

/// A client after the attack, likely on the same pooled backend connection, gets its own
/// answer: nothing the attacker left behind is read as its request or response.
fn assert_next_client_unaffected(router: &RouterProcess, wiretap: &Wiretap, case: &str) {
    let answer = router.get(HOST, "/victim");
    assert_eq!(
        answer.status, 200,
        "{case}: the next client got {}",
        answer.status
    );
    assert_eq!(
        answer.text(),
        "seen GET /victim",
        "{case}: the next client's answer"
    );
    let reached = check_backend_wires(wiretap, case);
    let targets: Vec<&str> = reached.iter().map(|r| r.target.as_str()).collect();
    assert_eq!(targets, ["/victim"], "{case}: after the next client");
}

#[test]
fn http1_desync_attempts_are_refused_or_normalised() {
    let (router, wiretap) = start();
    let mut report = Vec::new();
    for case in http1_cases() {
        let statuses = exchange(router.http, &case.raw);
        // Let a forwarded request finish on the backend side before reading its bytes.
        std::thread::sleep(Duration::from_millis(50));
        let reached = check_backend_wires(&wiretap, case.name);
        let first = statuses.first().copied();
        match case.expect {
            Expect::Refused(status) => {
                assert_eq!(first, Some(status), "{}: answers {statuses:?}", case.name);
                assert!(
                    reached.is_empty(),
                    "{}: reached the backend: {reached:?}",
                    case.name
                );
            }
            Expect::RefusedAny => {
                assert!(
                    first.is_none_or(|s| (400..500).contains(&s)),
                    "{}: answers {statuses:?}",
                    case.name
                );
                assert!(
                    reached.is_empty(),
                    "{}: reached the backend: {reached:?}",
                    case.name
                );
            }
            Expect::Forwarded => {
                assert_eq!(first, Some(200), "{}: answers {statuses:?}", case.name);
                assert_eq!(reached.len(), 1, "{}: backend saw {reached:?}", case.name);
            }
            Expect::RefusedOrForwarded => match first {
                Some(200) => {
                    assert_eq!(reached.len(), 1, "{}: backend saw {reached:?}", case.name);
                }
                Some(status) if (400..500).contains(&status) => {
                    assert!(reached.is_empty(), "{}: reached {reached:?}", case.name);
                }
                other => panic!("{}: answers {other:?}", case.name),
            },
        }
        report.push(format!("{}: {statuses:?} {reached:?}", case.name));
        assert_next_client_unaffected(&router, &wiretap, case.name);
    }
    eprintln!("{}", report.join("\n"));
    // Those the codec refused before any stage are counted, by status.
    let refused = |status: &str| {
        router.metric(&format!(
            "switchyard_client_heads_refused_total{{status=\"{status}\"}}"
        ))
    };
    assert!(refused("400") >= 10.0, "{}", refused("400"));
    assert!(refused("431") >= 1.0, "{}", refused("431"));
    assert_eq!(router.get(HOST, "/").status, 200, "the router still serves");
}

fn get_with(path: &[u8], extra: &[(&[u8], &[u8])]) -> Vec<Vec<u8>> {
    use h2_raw::{frame, request_block, END_HEADERS, END_STREAM, HEADERS};
    vec![frame(
        HEADERS,
        END_HEADERS | END_STREAM,
        1,
        &request_block("GET", HOST, path, extra),
    )]
}

fn post_with(extra: &[(&[u8], &[u8])], body: &[u8]) -> Vec<Vec<u8>> {
    use h2_raw::{frame, request_block, DATA, END_HEADERS, END_STREAM, HEADERS};
    vec![
        frame(
            HEADERS,
            END_HEADERS,
            1,
            &request_block("POST", HOST, b"/", extra),
        ),
        frame(DATA, END_STREAM, 1, body),
    ]
}

#[test]
fn http2_requests_that_would_smuggle_when_downgraded_to_http1_are_refused() {
    use h2_raw::{exchange, Outcome};
    let router = RouterProcess::start();
    let wiretap = Wiretap::start();
    router.put_app(
        "smuggle",
        json!({"domains": [HOST], "backends": [wiretap.addr.to_string()]}),
    );
    let s = smuggled();
    let crlf_value = format!("a\r\n\r\n{s}");
    let crlf_path = format!("/ HTTP/1.1\r\nHost: {HOST}\r\n\r\n{s}");
    let malformed: Vec<(&str, Vec<Vec<u8>>)> = vec![
        (
            "transfer-encoding",
            get_with(b"/", &[(b"transfer-encoding", b"chunked")]),
        ),
        (
            "connection",
            get_with(b"/", &[(b"connection", b"keep-alive")]),
        ),
        (
            "keep-alive",
            get_with(b"/", &[(b"keep-alive", b"timeout=5")]),
        ),
        ("upgrade", get_with(b"/", &[(b"upgrade", b"h2c")])),
        (
            "te other than trailers",
            get_with(b"/", &[(b"te", b"gzip")]),
        ),
        (
            "CRLF in a value",
            get_with(b"/", &[(b"x-a", crlf_value.as_bytes())]),
        ),
        (
            "LF in a value",
            get_with(b"/", &[(b"x-a", b"a\nTransfer-Encoding: chunked")]),
        ),
        ("CRLF in :path", get_with(crlf_path.as_bytes(), &[])),
        ("space in :path", get_with(b"/ /smuggled", &[])),
        ("upper-case name", get_with(b"/", &[(b"X-Upper", b"a")])),
        ("colon in a name", get_with(b"/", &[(b"x:a", b"b")])),
        (
            "content-length shorter than DATA",
            post_with(&[(b"content-length", b"0")], s.as_bytes()),
        ),
    ];
    let mut report = Vec::new();
    for (name, frames) in &malformed {
        let outcome = exchange(router.http, frames);
        std::thread::sleep(Duration::from_millis(50));
        let reached = check_backend_wires(&wiretap, name);
        report.push(format!("{name}: {outcome:?}"));
        assert!(
            matches!(
                outcome,
                Outcome::Reset(_) | Outcome::GoAway(_) | Outcome::Answered(400..=499)
            ),
            "{name}: {outcome:?}"
        );
        // HTTP/2 checks a declared content-length against DATA only as the DATA arrives,
        // after the request head may have gone on: the backend then has a complete request
        // with the declared (empty) body, and the rest never leaves the router.
        let declared_empty = name.ends_with("content-length shorter than DATA");
        assert!(
            reached.iter().all(|r| declared_empty && r.body.is_empty()),
            "{name}: reached the backend: {reached:?}"
        );
        assert_next_client_unaffected(&router, &wiretap, name);
    }
    eprintln!("{}", report.join("\n"));

    // Well-formed HTTP/2 still goes through, framed cleanly for the HTTP/1.1 backend.
    let outcome = exchange(
        router.http,
        &post_with(&[(b"content-length", b"5")], b"hello"),
    );
    assert_eq!(outcome, Outcome::Answered(200));
    std::thread::sleep(Duration::from_millis(50));
    let reached = check_backend_wires(&wiretap, "valid HTTP/2 POST");
    assert_eq!(reached.len(), 1, "{reached:?}");
    assert_eq!(reached[0].body, b"hello");
}
