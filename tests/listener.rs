//! The listener: routing, local answers, forwarded headers, retries past a dead backend,
//! the access log, backend connection reuse, WebSockets that outlive a deploy and end with
//! 1001 when their app is deleted, HTTPS redirects, uploads answered before they are read
//! still getting their answer, and the HTTP/1.x driver's own rules (pipelined requests in
//! order, `Expect: 100-continue`, HTTP/1.0 keep-alive). The stages (WAF, cache, images,
//! mirror, static files) have suites of their own.

use switchyard_test_support as support;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use serde_json::json;
use support::websocket::{close_frame_within, exchange, open_websocket};
use support::{free_port, Backend, RouterProcess};
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;

/// A router and its plain HTTP listener.
fn router_and_http() -> (RouterProcess, SocketAddr) {
    let router = RouterProcess::start();
    let http = router.http;
    (router, http)
}

#[test]
fn the_listener_routes_by_host_and_answers_for_itself_when_it_must() {
    let (router, http) = router_and_http();
    let shop = Backend::start("shop");
    let blog = Backend::start("blog");
    router.put_app(
        "shop",
        json!({"domains": ["shop.test", "*.shop.test"], "backends": [shop.addr.to_string()]}),
    );
    router.put_app(
        "blog",
        json!({"domains": ["blog.test"], "backends": [blog.addr.to_string()]}),
    );
    router.put_app("empty", json!({"domains": ["empty.test"], "backends": []}));

    for (host, app) in [
        ("shop.test", "shop"),
        ("WWW.shop.test:80", "shop"),
        ("blog.test", "blog"),
    ] {
        let response = support::get(http, host, "/").expect("response");
        assert_eq!(response.status, 200, "{host}: {}", response.text());
        assert_eq!(response.json()["backend"], app, "{host}");
        let id = response.header("x-request-id").expect("a request id");
        assert_eq!(id.len(), 32, "{id}");
    }

    let unknown = support::get(http, "nobody.test", "/").expect("response");
    assert_eq!(unknown.status, 404);
    assert!(unknown.text().contains("no app"), "{}", unknown.text());
    let empty = support::get(http, "empty.test", "/").expect("response");
    assert_eq!(empty.status, 503, "{}", empty.text());
    let no_host =
        support::request(http, "GET / HTTP/1.1\r\nConnection: close\r\n\r\n").expect("response");
    assert_eq!(no_host.status, 400);

    // Forwarded headers in, hop-by-hop headers out, the client's request id kept.
    let given_id = "trace-0123456789abcdef-xyz";
    let response = support::request(
        http,
        &format!(
            "GET /path?q=1 HTTP/1.1\r\nHost: blog.test\r\nX-Request-Id: {given_id}\r\n\
             X-Forwarded-For: 203.0.113.9\r\nConnection: close, X-Secret-Hop\r\n\
             X-Secret-Hop: 1\r\nKeep-Alive: timeout=5\r\n\r\n"
        ),
    )
    .expect("response");
    assert_eq!(response.status, 200, "{}", response.text());
    assert_eq!(response.header("x-request-id"), Some(given_id));
    let seen = blog.recorded().pop().expect("a request reached blog");
    assert_eq!(seen.target, "/path?q=1");
    assert_eq!(
        seen.headers.get("x-forwarded-for").map(String::as_str),
        Some("203.0.113.9, 127.0.0.1")
    );
    assert_eq!(
        seen.headers.get("x-forwarded-proto").map(String::as_str),
        Some("http")
    );
    assert_eq!(
        seen.headers.get("x-request-id").map(String::as_str),
        Some(given_id)
    );
    assert!(!seen.headers.contains_key("x-secret-hop"), "{seen:?}");
    assert!(!seen.headers.contains_key("keep-alive"), "{seen:?}");

    // The access log has the request, as the main listener logs its own.
    support::eventually(
        Duration::from_secs(3),
        "the request in the access log",
        || {
            router.access_records().iter().any(|record| {
                record["request_id"] == given_id
                    && record["status"] == 200
                    && record["app"] == "blog"
                    && record["path"] == "/path?q=1"
                    && record["upstream"] == blog.addr.to_string()
                    && record["refused"].is_null()
            })
        },
    );
    // The router's own answers say why, by the refusals' table's label: in the access log
    // and in their count (the head without a Host never became a request: counted only).
    support::eventually(
        Duration::from_secs(3),
        "the refusals in the access log",
        || {
            let records = router.access_records();
            let refused = |status: u64, reason: &str| {
                records
                    .iter()
                    .any(|r| r["status"] == status && r["refused"] == reason)
            };
            refused(404, "unknown_host") && refused(503, "no_backends")
        },
    );
    for reason in ["unknown_host", "no_backends", "malformed_head"] {
        let series = format!("switchyard_refusals_total{{reason=\"{reason}\"}}");
        assert_eq!(router.metric(&series), 1.0, "{series}");
    }
}

#[test]
fn a_dead_backend_is_skipped_and_the_request_answered_by_another() {
    let (router, http) = router_and_http();
    let alive = Backend::start("alive");
    let dead = SocketAddr::from(([127, 0, 0, 1], free_port()));
    router.put_app(
        "retry",
        json!({"domains": ["retry.test"], "backends": [dead.to_string(), alive.addr.to_string()]}),
    );
    for _ in 0..6 {
        let response = support::get(http, "retry.test", "/").expect("response");
        assert_eq!(response.status, 200, "{}", response.text());
        assert_eq!(response.json()["backend"], "alive");
    }
    assert!(router.metric("switchyard_upstream_retries_total") >= 1.0);

    router.put_app(
        "gone",
        json!({"domains": ["gone.test"], "backends": [dead.to_string()]}),
    );
    let response = support::get(http, "gone.test", "/").expect("response");
    assert_eq!(response.status, 502, "{}", response.text());
}

/// Reads one response with a Content-Length body from a kept-alive connection.
fn read_response(reader: &mut BufReader<TcpStream>) -> (u16, Vec<u8>) {
    let mut status_line = String::new();
    reader.read_line(&mut status_line).expect("status line");
    let status = status_line
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("a status line: {status_line:?}"));
    let mut length = 0;
    loop {
        let mut line = String::new();
        reader.read_line(&mut line).expect("header line");
        let line = line.trim_end();
        if line.is_empty() {
            break;
        }
        if let Some((name, value)) = line.split_once(':') {
            if name.eq_ignore_ascii_case("content-length") {
                length = value.trim().parse().expect("a length");
            }
        }
    }
    let mut body = vec![0; length];
    reader.read_exact(&mut body).expect("body");
    (status, body)
}

#[test]
fn kept_alive_clients_reuse_a_few_backend_connections() {
    let (router, http) = router_and_http();
    let backend = Backend::start("pooled");
    router.put_app(
        "pooled",
        json!({"domains": ["pooled.test"], "backends": [backend.addr.to_string()]}),
    );
    const CLIENTS: usize = 4;
    const REQUESTS: usize = 100;
    for _ in 0..CLIENTS {
        let stream = TcpStream::connect(http).expect("connect");
        stream
            .set_read_timeout(Some(Duration::from_secs(5)))
            .expect("timeout");
        let mut writer = stream.try_clone().expect("clone");
        let mut reader = BufReader::new(stream);
        for i in 0..REQUESTS {
            writer
                .write_all(format!("GET /{i} HTTP/1.1\r\nHost: pooled.test\r\n\r\n").as_bytes())
                .expect("send");
            let (status, body) = read_response(&mut reader);
            assert_eq!(status, 200, "{}", String::from_utf8_lossy(&body));
        }
    }
    assert_eq!(backend.requests(), CLIENTS * REQUESTS);
    // One connection per thread serves every request made one after another.
    let opened = router.metric("switchyard_backend_connections_opened_total");
    assert!(
        (1.0..=2.0).contains(&opened),
        "{opened} backend connections for {} requests",
        CLIENTS * REQUESTS
    );
    assert!(router.metric("switchyard_idle_backend_connections") >= 1.0);
}

/// A client still sending a body the router has answered without reading (an unknown host,
/// a refused upload) gets that answer: the rest of the body is read and dropped, then the
/// connection closes, rather than a reset that could cost the client the answer.
#[test]
fn an_upload_answered_before_it_is_read_still_gets_its_answer() {
    let (_router, http) = router_and_http();
    let body = vec![b'x'; 32 << 20];
    let mut client = TcpStream::connect(http).expect("connect");
    client
        .set_read_timeout(Some(Duration::from_secs(10)))
        .expect("timeout");
    write!(
        client,
        "POST /upload HTTP/1.1\r\nHost: nobody.test\r\nContent-Length: {}\r\n\r\n",
        body.len()
    )
    .expect("head");
    // More than the sockets' buffers hold: this only returns if the router reads it all.
    client.write_all(&body).expect("the whole body is taken");
    let mut answer = String::new();
    client
        .read_to_string(&mut answer)
        .expect("the answer, then the end");
    assert!(answer.starts_with("HTTP/1.1 404"), "{answer}");
    assert!(answer.contains("connection: close"), "{answer}");
}

#[test]
fn an_app_that_asks_for_https_is_redirected_there() {
    let (router, http) = router_and_http();
    let backend = Backend::start("secure");
    router.put_app(
        "secure",
        json!({"domains": ["secure.test"], "backends": [backend.addr.to_string()],
               "https_redirect": true}),
    );
    let redirect = support::get(http, "secure.test", "/a?b=c").expect("response");
    assert_eq!(redirect.status, 308);
    assert_eq!(
        redirect.header("location"),
        Some(format!("https://secure.test:{}/a?b=c", router.https.port()).as_str())
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn websockets_outlive_a_deploy_and_end_with_1001_when_their_app_is_deleted() {
    let (router, http) = router_and_http();
    let first = Backend::start("first");
    let second = Backend::start("second");
    router.put_app(
        "chat",
        json!({"domains": ["chat.test"], "backends": [first.addr.to_string()]}),
    );
    let mut old = open_websocket(http, "chat.test").await;
    assert_eq!(exchange(&mut old, "hello").await, "first:hello");
    assert_eq!(router.metric("switchyard_open_websockets"), 1.0);

    router.scale("chat", &[second.addr]);
    // Three drain graces: a deploy alone closes nothing.
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(exchange(&mut old, "still").await, "first:still");
    let mut new = open_websocket(http, "chat.test").await;
    assert_eq!(exchange(&mut new, "hi").await, "second:hi");
    // Long and many messages cross intact both ways.
    let long = "x".repeat(200_000);
    assert_eq!(exchange(&mut new, &long).await, format!("second:{long}"));
    for i in 0..200 {
        assert_eq!(
            exchange(&mut old, &i.to_string()).await,
            format!("first:{i}")
        );
    }

    assert_eq!(router.admin_call("DELETE", "/v1/apps/chat", None).0, 204);
    let deleted = Instant::now();
    for socket in [&mut old, &mut new] {
        let (code, reason) = close_frame_within(socket, Duration::from_secs(5)).await;
        assert_eq!(code, CloseCode::Away);
        assert_eq!(reason, "backend connection closed by the router");
    }
    assert!(
        deleted.elapsed() >= Duration::from_millis(900),
        "not before the grace: {:?}",
        deleted.elapsed()
    );
    assert_eq!(
        router.metric("switchyard_drained_connections_total{reason=\"app_deleted\"}"),
        2.0
    );
    support::eventually(Duration::from_secs(3), "the relays to end", || {
        router.metric("switchyard_open_websockets") == 0.0
    });
}

#[test]
fn an_idle_http2_connection_is_asked_to_go_away_after_the_client_idle_timeout() {
    use support::h2_raw::{
        frame, request_block, Connection, END_HEADERS, END_STREAM, GOAWAY, HEADERS,
    };
    let router = RouterProcess::start_with(&["--client-idle-timeout-s", "1"]);
    let backend = Backend::start("idle");
    router.put_app(
        "idle",
        json!({"domains": ["idle.test"], "backends": [backend.addr.to_string()]}),
    );
    let mut connection = Connection::open(router.http);
    let request = request_block("GET", "idle.test", b"/", &[]);
    connection
        .send(&frame(HEADERS, END_HEADERS | END_STREAM, 1, &request))
        .expect("send");
    let opened = Instant::now();
    let mut goaway = None;
    while goaway.is_none() && opened.elapsed() < Duration::from_secs(5) {
        match connection.next_frame(Instant::now() + Duration::from_millis(100)) {
            Some(frame) if frame.kind == GOAWAY => goaway = Some(opened.elapsed()),
            _ => {}
        }
    }
    let after = goaway.expect("a GOAWAY within 5 s of the last request");
    assert!(
        after >= Duration::from_millis(900) && after < Duration::from_secs(3),
        "GOAWAY after {after:?}, the idle timeout being 1 s"
    );
    assert_eq!(backend.requests(), 1, "the request was served first");
}

/// A backend that answers each request on its connections with `size` bytes of a pattern,
/// and tells, for each answer, when it had written the last byte.
fn large_answer_backend(
    size: usize,
    content_type: &'static str,
) -> (SocketAddr, std::sync::mpsc::Receiver<Instant>) {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = listener.local_addr().expect("addr");
    let (written, answers) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for stream in listener.incoming().take(4) {
            let Ok(mut stream) = stream else { return };
            let written = written.clone();
            std::thread::spawn(move || {
                let body: Vec<u8> = (0..size).map(|i| (i % 251) as u8).collect();
                let mut reader = BufReader::new(stream.try_clone().expect("clone"));
                loop {
                    let mut line = String::new();
                    // One request head, to its blank line.
                    loop {
                        line.clear();
                        match reader.read_line(&mut line) {
                            Ok(0) | Err(_) => return,
                            Ok(_) if line == "\r\n" => break,
                            Ok(_) => {}
                        }
                    }
                    let head = format!(
                        "HTTP/1.1 200 OK\r\nContent-Type: {content_type}\r\nContent-Length: {size}\r\n\r\n"
                    );
                    if stream.write_all(head.as_bytes()).is_err()
                        || stream.write_all(&body).is_err()
                    {
                        return;
                    }
                    let _ = written.send(Instant::now());
                }
            });
        }
    });
    (addr, answers)
}

/// Sends a GET for `host` and reads no more than its answer's first KiB; the connection
/// and how many bytes of the body that KiB held.
fn slow_reader(http: SocketAddr, host: &str) -> (TcpStream, usize) {
    slow_reader_on(TcpStream::connect(http).expect("connect"), host)
}

/// The same on a connection already open (kept alive: served by the same listener thread,
/// whose pool holds the backend connections it made).
fn slow_reader_on(mut client: TcpStream, host: &str) -> (TcpStream, usize) {
    write!(client, "GET /big HTTP/1.1\r\nHost: {host}\r\n\r\n").expect("send");
    let mut first = [0u8; 1024];
    client.read_exact(&mut first).expect("the answer begins");
    assert!(
        first.starts_with(b"HTTP/1.1 200"),
        "{}",
        String::from_utf8_lossy(&first)
    );
    let head_end = first
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .expect("a head within 1 KiB")
        + 4;
    (client, first.len() - head_end)
}

/// Reads the rest of the answer and checks every byte of its body; the connection, for
/// the next request.
fn read_whole_answer((mut client, already): (TcpStream, usize), size: usize) -> TcpStream {
    client
        .set_read_timeout(Some(Duration::from_secs(20)))
        .expect("timeout");
    let mut body = Vec::with_capacity(size);
    let mut buffer = vec![0u8; 1 << 16];
    while already + body.len() < size {
        let want = (size - already - body.len()).min(buffer.len());
        let n = client.read(&mut buffer[..want]).expect("read");
        assert!(n > 0, "the answer ended short");
        body.extend_from_slice(&buffer[..n]);
    }
    let expected: Vec<u8> = (already..size).map(|i| (i % 251) as u8).collect();
    assert!(
        body == expected,
        "the body read ahead came back out of order or changed"
    );
    client
}

#[test]
fn a_slow_reader_does_not_hold_the_backend_while_answers_that_stream_do() {
    const SIZE: usize = 32 << 20;
    let router = RouterProcess::start_with(&["--response-buffer-mb", "64"]);
    let (buffered, buffered_done) = large_answer_backend(SIZE, "application/octet-stream");
    let (opted_out, opted_out_done) = large_answer_backend(SIZE, "application/octet-stream");
    let (events, events_done) = large_answer_backend(SIZE, "text/event-stream");
    router.put_app(
        "files",
        json!({"domains": ["files.test"], "backends": [buffered.to_string()]}),
    );
    router.put_app(
        "streams",
        json!({"domains": ["streams.test"], "backends": [opted_out.to_string()],
               "response_buffering": false}),
    );
    router.put_app(
        "events",
        json!({"domains": ["events.test"], "backends": [events.to_string()]}),
    );

    // 32 MiB is more than the sockets' buffers hold (a few MiB each way): only a router
    // that reads ahead lets the backend finish while its client reads nothing.
    let started = Instant::now();
    let client = slow_reader(router.http, "files.test");
    let finished = buffered_done
        .recv_timeout(Duration::from_secs(10))
        .expect("the backend wrote its whole answer while the client read 1 KiB");
    assert!(finished - started < Duration::from_secs(10));
    assert!(router.metric("switchyard_responses_read_ahead_total") >= 1.0);
    assert!(
        router.metric("switchyard_response_spool_bytes") > 0.0,
        "past its 1 MiB of memory, the answer is spooled"
    );
    assert!(router.metric("switchyard_response_buffer_memory_bytes") > 0.0);
    let client = read_whole_answer(client, SIZE);
    assert_eq!(router.metric("switchyard_response_spool_bytes"), 0.0);
    assert_eq!(
        router.metric("switchyard_response_buffer_memory_bytes"),
        0.0
    );

    // The backend's connection went back to the pool: a second request reuses it.
    let opened = router.metric("switchyard_backend_connections_opened_total");
    let again = slow_reader_on(client, "files.test");
    buffered_done
        .recv_timeout(Duration::from_secs(10))
        .expect("the second answer written whole too");
    assert_eq!(
        router.metric("switchyard_backend_connections_opened_total"),
        opened
    );
    read_whole_answer(again, SIZE);

    // An app that streams, and an event stream, go at the client's pace.
    for (host, done) in [
        ("streams.test", &opted_out_done),
        ("events.test", &events_done),
    ] {
        let client = slow_reader(router.http, host);
        assert!(
            done.recv_timeout(Duration::from_secs(3)).is_err(),
            "{host}: the backend could write its whole answer to a client that read 1 KiB"
        );
        read_whole_answer(client, SIZE);
        done.recv_timeout(Duration::from_secs(10))
            .expect("written once read");
    }
    assert_eq!(router.metric("switchyard_responses_read_ahead_total"), 2.0);
}

/// Reads one answer from `reader`: its status, its lower-cased fields and its body (by
/// Content-Length, chunks, or none for a 1xx).
fn read_answer(reader: &mut impl BufRead) -> (u16, Vec<(String, String)>, Vec<u8>) {
    let mut line = String::new();
    reader.read_line(&mut line).expect("status line");
    let status: u16 = line
        .split(' ')
        .nth(1)
        .and_then(|code| code.parse().ok())
        .unwrap_or_else(|| panic!("a status line, not {line:?}"));
    let mut fields = Vec::new();
    loop {
        let mut line = String::new();
        reader.read_line(&mut line).expect("field line");
        let line = line.trim_end();
        if line.is_empty() {
            break;
        }
        let (name, value) = line.split_once(':').expect("name: value");
        fields.push((name.to_ascii_lowercase(), value.trim().to_string()));
    }
    let field = |name: &str| {
        fields
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.clone())
    };
    let mut body = Vec::new();
    if (100..200).contains(&status) {
        return (status, fields, body);
    }
    if let Some(length) = field("content-length") {
        body.resize(length.parse().expect("a length"), 0);
        reader.read_exact(&mut body).expect("the body");
    } else if field("transfer-encoding").is_some_and(|v| v.contains("chunked")) {
        loop {
            let mut size = String::new();
            reader.read_line(&mut size).expect("chunk size");
            let size = usize::from_str_radix(size.trim(), 16).expect("hex size");
            let mut chunk = vec![0; size + 2];
            reader.read_exact(&mut chunk).expect("chunk");
            if size == 0 {
                break;
            }
            body.extend_from_slice(&chunk[..size]);
        }
    }
    (status, fields, body)
}

fn path_of(body: &[u8]) -> String {
    let description: serde_json::Value = serde_json::from_slice(body).expect("the backend's JSON");
    description["path"].as_str().unwrap_or_default().to_string()
}

/// A router with one app, `app.test`, and a client connection to its HTTP listener, with a
/// reader of the answers on it.
fn app_behind_one_connection() -> (RouterProcess, Backend, TcpStream, BufReader<TcpStream>) {
    let (router, http) = router_and_http();
    let app = Backend::start("app");
    router.put_app(
        "app",
        json!({"domains": ["app.test"], "backends": [app.addr.to_string()]}),
    );
    let client = TcpStream::connect(http).expect("connect");
    client
        .set_read_timeout(Some(Duration::from_secs(5)))
        .expect("timeout");
    let reader = BufReader::new(client.try_clone().expect("clone"));
    (router, app, client, reader)
}

#[test]
fn one_connection_answers_pipelined_requests_in_order_and_expect_continue_before_the_body() {
    let (_router, app, mut client, mut reader) = app_behind_one_connection();

    // Three requests in one write, a body between two heads: each answered, in order.
    client
        .write_all(
            b"GET /one HTTP/1.1\r\nHost: app.test\r\n\r\n\
              POST /two HTTP/1.1\r\nHost: app.test\r\nContent-Length: 5\r\n\r\nhello\
              GET /three HTTP/1.1\r\nHost: app.test\r\n\r\n",
        )
        .expect("pipelined requests");
    for path in ["/one", "/two", "/three"] {
        let (status, _, body) = read_answer(&mut reader);
        assert_eq!(status, 200, "{path}");
        assert_eq!(path_of(&body), path);
    }
    let seen = app.recorded();
    assert_eq!(seen.len(), 3, "{seen:?}");
    assert_eq!(seen[1].body, b"hello");

    // The body of an Expect: 100-continue request goes once the router has asked for it.
    client
        .write_all(
            b"PUT /four HTTP/1.1\r\nHost: app.test\r\nContent-Length: 3\r\n\
              Expect: 100-continue\r\n\r\n",
        )
        .expect("head");
    let (interim, _, _) = read_answer(&mut reader);
    assert_eq!(interim, 100);
    client.write_all(b"abc").expect("body");
    let (status, _, body) = read_answer(&mut reader);
    assert_eq!((status, path_of(&body)), (200, "/four".to_string()));
    assert_eq!(
        app.recorded().last().map(|r| r.body.clone()),
        Some(b"abc".to_vec())
    );

    // One refused before its body is read gets its answer without a 100, and the
    // connection closes after it: its unread body must not read as a request.
    client
        .write_all(
            b"POST /five HTTP/1.1\r\nHost: nobody.test\r\nContent-Length: 3\r\n\
              Expect: 100-continue\r\n\r\n",
        )
        .expect("head");
    let (status, fields, _) = read_answer(&mut reader);
    assert_eq!(status, 404);
    assert!(
        fields.contains(&("connection".to_string(), "close".to_string())),
        "{fields:?}"
    );
    assert_eq!(app.recorded().len(), 4);
}

#[test]
fn an_http10_client_keeps_its_connection_only_when_it_asks() {
    let (_router, _app, mut client, mut reader) = app_behind_one_connection();
    for path in ["/a", "/b"] {
        write!(
            client,
            "GET {path} HTTP/1.0\r\nHost: app.test\r\nConnection: keep-alive\r\n\r\n"
        )
        .expect("request");
        let (status, fields, body) = read_answer(&mut reader);
        assert_eq!((status, path_of(&body)), (200, path.to_string()));
        assert!(
            fields.contains(&("connection".to_string(), "keep-alive".to_string())),
            "{fields:?}"
        );
    }
    // Without asking, the answer is the connection's last.
    client
        .write_all(b"GET /c HTTP/1.0\r\nHost: app.test\r\n\r\n")
        .expect("request");
    let (status, fields, _) = read_answer(&mut reader);
    assert_eq!(status, 200);
    assert!(
        fields.contains(&("connection".to_string(), "close".to_string())),
        "{fields:?}"
    );
    let mut rest = Vec::new();
    reader.read_to_end(&mut rest).expect("the close");
    assert!(rest.is_empty(), "{rest:?}");
}
