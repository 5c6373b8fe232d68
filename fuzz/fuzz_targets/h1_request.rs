//! Issue 46's differential target: Switchyard's HTTP/1 request reader (`crates/h1`) against
//! strict httparse and hyper's server over the same bytes. A router smuggles when it and
//! the server behind it disagree about where a request ends, so:
//! - what Switchyard would forward (its written head and re-framed body) reads back, by
//!   strict httparse and by itself, as exactly one request with the same method, target,
//!   host and body, and writing that again gives the same bytes (one canonical form);
//! - where hyper also takes the request, it reads the same method, target and body bytes;
//! - the head the router writes from a client's fields as read (no map: origin form, no
//!   Upgrade, no Transfer-Encoding) reads back as the one written from their map: the same
//!   method, target, fields and framing, and `http` takes every field the codec took.
//!   Either side refusing what the other takes is not a divergence (refusing is safe);
//!   taking it with other boundaries is.
#![no_main]

use std::cell::RefCell;
use std::convert::Infallible;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper::{Request, Response};
use libfuzzer_sys::fuzz_target;
use switchyard_h1::{
    header_slots, parse_request, write_request_fields, write_request_head, write_request_parts,
    ChunkedReframer, RequestBody, RequestError, RequestHead,
};
use tokio::io::AsyncWriteExt;

/// What a reader took as the first request: method, target, body.
#[derive(Debug, PartialEq, Eq)]
struct Read {
    method: String,
    target: String,
    body: Vec<u8>,
}

/// Switchyard's reading of `data`: the request, and the bytes it would forward.
fn switchyard(data: &[u8]) -> Option<(Read, Vec<u8>, Option<Vec<u8>>)> {
    let mut slots = header_slots();
    let head = parse_request(data, &mut slots).ok()??;
    check_as_read(&head);
    let mut forwarded = Vec::new();
    write_request_head(&mut forwarded, &head, false, &[]);
    let rest = &data[head.head_len..];
    // The host the backend must see: the Host field as sent, or an HTTP/1.0 absolute
    // form's authority, written as the field.
    let host = head.header("host").or(head.authority).map(<[u8]>::to_vec);
    let body = head.body;
    let mut data_alone = Vec::new();
    match body {
        RequestBody::Empty => {}
        RequestBody::Length(length) => {
            let length = usize::try_from(length).ok()?;
            let bytes = rest.get(..length)?;
            forwarded.extend_from_slice(bytes);
            data_alone.extend_from_slice(bytes);
        }
        RequestBody::Chunked => {
            let read = ChunkedReframer::new().reframe(rest, &mut forwarded).ok()?;
            if !read.done {
                return None;
            }
            ChunkedReframer::dechunking()
                .reframe(rest, &mut data_alone)
                .ok()?;
        }
    }
    let read = Read {
        method: head.method.to_string(),
        target: head.target.to_string(),
        body: data_alone,
    };
    Some((read, forwarded, host))
}

/// The forwarded bytes read back: one request, the same one, in the same canonical form.
fn check_forwarded(read: &Read, forwarded: &[u8], host: Option<Vec<u8>>) {
    let mut slots = header_slots();
    let again = match parse_request(forwarded, &mut slots) {
        Ok(Some(head)) => head,
        other => panic!("forwarded bytes do not read back: {other:?} {forwarded:?}"),
    };
    assert_eq!(again.method, read.method);
    assert_eq!(
        again.path(),
        again.target,
        "forwarded target is origin-form"
    );
    assert_eq!(
        again.header("host").map(<[u8]>::to_vec),
        host,
        "Host field changed"
    );
    let mut written_again = Vec::new();
    write_request_head(&mut written_again, &again, false, &[]);
    assert_eq!(
        written_again,
        forwarded[..again.head_len],
        "writing the forwarded head again changed it"
    );
    let body = &forwarded[again.head_len..];
    match again.body {
        RequestBody::Empty => assert!(body.is_empty(), "bytes after a bodiless request"),
        RequestBody::Length(length) => {
            assert_eq!(body.len() as u64, length, "Content-Length and body differ");
            assert_eq!(body, read.body);
        }
        RequestBody::Chunked => {
            let mut canonical = Vec::new();
            let done = ChunkedReframer::new()
                .reframe(body, &mut canonical)
                .expect("forwarded chunked body reads back");
            assert!(
                done.done && done.consumed == body.len(),
                "chunked body ends elsewhere"
            );
            assert_eq!(canonical, body, "re-framing is not a fixpoint");
        }
    }
    // Strict httparse, the parser most of the Rust ecosystem shares, sees the same head.
    let mut headers = [httparse::EMPTY_HEADER; 128];
    let mut strict = httparse::Request::new(&mut headers);
    assert_eq!(
        strict.parse(forwarded).ok(),
        Some(httparse::Status::Complete(again.head_len)),
        "strict httparse reads another head"
    );
}

/// A request as hyper's server hands it over (as HTTP/2 requests reach the router) is
/// written for the backend by the codec's bridge; that must read back as the same request.
fn check_bridge(parts: &http::request::Parts, body_len: usize) {
    let mut written = Vec::new();
    let body = RequestBody::Length(body_len as u64);
    write_request_parts(&mut written, parts, body, &[]);
    let mut slots = header_slots();
    let head = match parse_request(&written, &mut slots) {
        Ok(Some(head)) => head,
        // hyper takes targets the codec refuses (non-ASCII bytes, fragments) and HTTP/1.0
        // requests naming no host (which the router refuses before any bridge: it routes
        // by host), and a head at its 100 fields may gain a Host: refusing is safe.
        Err(RequestError::BadTarget | RequestError::BadHost | RequestError::HeadTooLarge) => return,
        other => panic!("bridged request does not read back: {other:?} {written:?}"),
    };
    assert_eq!(head.method, parts.method.as_str());
    assert_eq!(
        head.path(),
        parts.uri.path_and_query().map_or("/", |p| p.as_str())
    );
    assert_eq!(head.body, body);
    assert_eq!(head.head_len, written.len(), "bytes after the bridged head");
}

/// The router keeps an HTTP/1.x client's fields as read unless its target is not in
/// origin form or it has Upgrade or Transfer-Encoding (`client_h1::take_head_into`), and
/// writes the backend's head from them (`write_request_fields`); the other requests, and
/// the routes whose stages read a request whole, go through a map (`write_request_parts`).
/// Both must give the backend the same request.
fn check_as_read(head: &RequestHead<'_, '_>) {
    let kept_as_read = head.target.starts_with('/')
        && head.header("upgrade").is_none()
        && head.header("transfer-encoding").is_none();
    if !kept_as_read {
        return;
    }
    let framing = match head.body {
        RequestBody::Length(length) => RequestBody::Length(length),
        _ => RequestBody::Empty,
    };
    let mut as_read = Vec::new();
    write_request_fields(
        &mut as_read,
        head.method.as_bytes(),
        head.target.as_bytes(),
        None,
        || head.headers.iter().map(|h| (h.name.as_bytes(), h.value)),
        framing,
        &[],
    );
    // A target `http` refuses (`<`, say) is refused with 400 before any stage
    // (`client_h1::take_head_into`), whichever way the fields are held.
    let Ok(mut request) = http::Request::builder()
        .method(head.method)
        .uri(head.target)
        .body(())
    else {
        return;
    };
    for field in head.headers {
        let name = http::header::HeaderName::from_bytes(field.name.as_bytes())
            .expect("http takes every field name the codec took");
        let value = http::HeaderValue::from_bytes(field.value)
            .expect("http takes every field value the codec took");
        request.headers_mut().append(name, value);
    }
    let (parts, ()) = request.into_parts();
    let mut via_map = Vec::new();
    write_request_parts(&mut via_map, &parts, framing, &[]);
    let read_back = |written: &[u8]| {
        let mut slots = header_slots();
        let head = match parse_request(written, &mut slots) {
            Ok(Some(head)) => head,
            other => panic!("written head does not read back: {other:?} {written:?}"),
        };
        assert_eq!(head.head_len, written.len(), "bytes after the written head");
        let mut fields: Vec<(String, Vec<u8>)> = head
            .headers
            .iter()
            .map(|h| (h.name.to_ascii_lowercase(), h.value.to_vec()))
            .collect();
        // A map groups the values of one name, in their order; the order of names is not
        // the request's. A stable sort by name keeps each name's values in order.
        fields.sort_by(|a, b| a.0.cmp(&b.0));
        (
            head.method.to_string(),
            head.target.to_string(),
            head.body,
            fields,
        )
    };
    assert_eq!(
        read_back(&as_read),
        read_back(&via_map),
        "the fields as read and their map give the backend different requests"
    );
}

thread_local! {
    static RUNTIME: RefCell<tokio::runtime::Runtime> = RefCell::new(
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime"),
    );
}

/// hyper's server over the same bytes: the first request it hands to a service, if any.
fn hyper(data: &[u8]) -> Option<Read> {
    RUNTIME.with(|runtime| {
        runtime.borrow().block_on(async {
            let (mut client, server) = tokio::io::duplex(data.len() + 1024);
            client.write_all(data).await.ok()?;
            client.shutdown().await.ok()?;
            let first = std::rc::Rc::new(RefCell::new(None));
            let seen = first.clone();
            let service = service_fn(move |request: Request<Incoming>| {
                let seen = seen.clone();
                async move {
                    let (parts, body) = request.into_parts();
                    if let Ok(body) = body.collect().await {
                        let body = body.to_bytes();
                        check_bridge(&parts, body.len());
                        if seen.borrow().is_none() {
                            *seen.borrow_mut() = Some(Read {
                                method: parts.method.to_string(),
                                target: parts.uri.to_string(),
                                body: body.to_vec(),
                            });
                        }
                    }
                    Ok::<_, Infallible>(Response::new(Full::new(Bytes::new())))
                }
            });
            let _ = tokio::time::timeout(
                std::time::Duration::from_secs(1),
                hyper::server::conn::http1::Builder::new()
                    .serve_connection(hyper_util::rt::TokioIo::new(server), service),
            )
            .await;
            let first = first.borrow_mut().take();
            first
        })
    })
}

fuzz_target!(|data: &[u8]| {
    let ours = switchyard(data);
    if let Some((read, forwarded, host)) = &ours {
        check_forwarded(read, forwarded, host.clone());
    }
    if let (Some((read, _, _)), Some(theirs)) = (&ours, hyper(data)) {
        assert_eq!(read.method, theirs.method, "method");
        // http::Uri spells an absolute form its own way (scheme case); origin forms alike.
        if read.target.starts_with('/') {
            assert_eq!(read.target, theirs.target, "target");
        }
        assert_eq!(
            read.body, theirs.body,
            "hyper reads another body: boundaries differ"
        );
    }
});
