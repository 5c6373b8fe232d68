//! Request buffering on the real binary: a body trickled by a slow client reaches the
//! backend in one piece after its last byte (HTTP/1.1 and HTTP/2 here, HTTP/3 in
//! tests/http3.rs), apps and paths that stream get it as it comes, full budgets answer 503
//! and slow uploads 408 with nothing left held, and `Expect: 100-continue` is answered by
//! the router.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::json;
use support::{eventually, RouterProcess};
use switchyard_test_support as support;

/// What the timing backend saw of one request.
#[derive(Debug, Clone)]
struct Seen {
    /// When the request's first byte arrived, and its last.
    first_byte: Instant,
    last_byte: Instant,
    head: String,
    body: Vec<u8>,
}

impl Seen {
    fn field(&self, name: &str) -> Option<String> {
        self.head.lines().find_map(|line| {
            let (field, value) = line.split_once(':')?;
            field
                .eq_ignore_ascii_case(name)
                .then(|| value.trim().to_string())
        })
    }
}

/// A backend that notes when each request's bytes arrive: one thread per connection,
/// requests framed by Content-Length or chunked, each answered 200.
struct TimingBackend {
    addr: SocketAddr,
    seen: Arc<Mutex<Vec<Seen>>>,
}

impl TimingBackend {
    fn start() -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
        let addr = listener.local_addr().expect("address");
        let seen: Arc<Mutex<Vec<Seen>>> = Arc::default();
        let noted = seen.clone();
        std::thread::spawn(move || {
            for stream in listener.incoming().flatten() {
                let noted = noted.clone();
                std::thread::spawn(move || serve(stream, &noted));
            }
        });
        Self { addr, seen }
    }

    fn seen(&self) -> Vec<Seen> {
        self.seen.lock().expect("seen").clone()
    }
}

fn serve(stream: TcpStream, noted: &Mutex<Vec<Seen>>) {
    let _ = stream.set_read_timeout(Some(Duration::from_secs(30)));
    let mut writer = stream.try_clone().expect("clone");
    let mut reader = BufReader::new(stream);
    loop {
        let mut head = String::new();
        let mut first_byte = None;
        loop {
            let mut line = String::new();
            match reader.read_line(&mut line) {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
            first_byte.get_or_insert_with(Instant::now);
            if line == "\r\n" {
                break;
            }
            head.push_str(&line);
        }
        let mut seen = Seen {
            first_byte: first_byte.expect("a head"),
            last_byte: Instant::now(),
            head,
            body: Vec::new(),
        };
        let chunked = seen
            .field("transfer-encoding")
            .is_some_and(|t| t.contains("chunked"));
        if chunked {
            loop {
                let mut size = String::new();
                if reader.read_line(&mut size).unwrap_or(0) == 0 {
                    return;
                }
                let size = usize::from_str_radix(size.trim(), 16).expect("a chunk size");
                let mut chunk = vec![0; size + 2];
                if reader.read_exact(&mut chunk).is_err() {
                    return;
                }
                seen.body.extend_from_slice(&chunk[..size]);
                if size == 0 {
                    break;
                }
            }
        } else if let Some(length) = seen.field("content-length") {
            let mut body = vec![0; length.parse().expect("a length")];
            if reader.read_exact(&mut body).is_err() {
                return;
            }
            seen.body = body;
        }
        seen.last_byte = Instant::now();
        let answer = format!("{} bytes", seen.body.len());
        noted.lock().expect("seen").push(seen);
        let written = write!(
            writer,
            "HTTP/1.1 200 OK\r\ncontent-length: {}\r\n\r\n{answer}",
            answer.len()
        );
        if written.is_err() {
            return;
        }
    }
}

/// Sends `pieces` pieces of `piece` bytes, `every` apart, chunked, and reads the answer;
/// its status, and when the last byte went.
fn trickle(
    router: SocketAddr,
    host: &str,
    path: &str,
    pieces: usize,
    piece: usize,
    every: Duration,
) -> (u16, Instant) {
    let mut client = TcpStream::connect(router).expect("connect");
    client
        .set_read_timeout(Some(Duration::from_secs(30)))
        .expect("timeout");
    write!(
        client,
        "POST {path} HTTP/1.1\r\nhost: {host}\r\ntransfer-encoding: chunked\r\n\r\n"
    )
    .expect("head");
    for n in 0..pieces {
        let data = vec![b'a' + (n % 26) as u8; piece];
        write!(client, "{piece:x}\r\n").expect("size");
        client.write_all(&data).expect("data");
        client.write_all(b"\r\n").expect("end of chunk");
        std::thread::sleep(every);
    }
    client.write_all(b"0\r\n\r\n").expect("last chunk");
    let sent = Instant::now();
    (status_of(&mut client), sent)
}

fn status_of(client: &mut TcpStream) -> u16 {
    let mut answer = [0; 12];
    client.read_exact(&mut answer).expect("an answer");
    let line = String::from_utf8_lossy(&answer);
    line[9..12].parse().expect("a status")
}

fn app(router: &RouterProcess, name: &str, backend: SocketAddr, extra: serde_json::Value) {
    let mut spec = json!({"domains": [format!("{name}.test")], "backends": [backend.to_string()]});
    if let (Some(spec), Some(extra)) = (spec.as_object_mut(), extra.as_object()) {
        spec.extend(extra.clone());
    }
    router.put_app(name, spec);
}

fn gauges_at_rest(router: &RouterProcess) {
    eventually(Duration::from_secs(5), "the buffers given back", || {
        router.metric("switchyard_request_buffer_memory_bytes") == 0.0
            && router.metric("switchyard_request_spool_bytes") == 0.0
    });
}

#[test]
fn a_trickled_body_reaches_the_backend_in_one_piece_after_its_last_byte_unless_it_streams() {
    let router = RouterProcess::start();
    let backend = TimingBackend::start();
    app(&router, "buffered", backend.addr, json!({}));
    app(
        &router,
        "streams",
        backend.addr,
        json!({"request_buffering": false}),
    );
    app(
        &router,
        "grpc",
        backend.addr,
        json!({"request_buffering": {"streaming_paths": ["/live/"]}}),
    );
    let every = Duration::from_millis(100);

    let (status, last_sent) = trickle(router.http, "buffered.test", "/upload", 10, 1024, every);
    assert_eq!(status, 200);
    let seen = backend.seen().pop().expect("the backend got it");
    assert!(
        seen.first_byte >= last_sent - Duration::from_millis(5),
        "the backend saw the head {:?} before the client's last byte",
        last_sent.saturating_duration_since(seen.first_byte)
    );
    assert!(
        seen.last_byte - seen.first_byte < Duration::from_millis(50),
        "head to last byte {:?}",
        seen.last_byte - seen.first_byte
    );
    assert_eq!(seen.field("content-length").as_deref(), Some("10240"));
    assert_eq!(seen.field("transfer-encoding"), None);
    assert_eq!(seen.body.len(), 10240);
    assert!(
        seen.body[..1024].iter().all(|b| *b == b'a')
            && seen.body[9216..].iter().all(|b| *b == b'j')
    );

    // An app that streams, and a streaming path: the head goes on at once, the body as
    // it comes (chunked, as sent).
    for (host, path) in [("streams.test", "/upload"), ("grpc.test", "/live/feed")] {
        let (status, last_sent) = trickle(router.http, host, path, 10, 1024, every);
        assert_eq!(status, 200);
        let seen = backend.seen().pop().expect("the backend got it");
        assert!(
            last_sent - seen.first_byte > Duration::from_millis(600),
            "{host}: the head came only {:?} before the last byte",
            last_sent.saturating_duration_since(seen.first_byte)
        );
        assert_eq!(
            seen.field("transfer-encoding").as_deref(),
            Some("chunked"),
            "{host}"
        );
        assert_eq!(seen.body.len(), 10240);
    }
    // The path not under the prefix is buffered.
    let (status, last_sent) = trickle(router.http, "grpc.test", "/form", 3, 1024, every);
    assert_eq!(status, 200);
    let seen = backend.seen().pop().expect("the backend got it");
    assert!(seen.first_byte >= last_sent - Duration::from_millis(5));

    assert_eq!(
        router.metric(r#"switchyard_request_buffer_total{outcome="memory"}"#),
        2.0
    );
    assert_eq!(
        router.metric(r#"switchyard_request_buffer_total{outcome="streamed"}"#),
        1.0
    );
    gauges_at_rest(&router);
}

#[test]
fn an_http2_body_without_a_length_is_buffered_and_sent_with_one() {
    let router = RouterProcess::start();
    let backend = TimingBackend::start();
    app(&router, "buffered", backend.addr, json!({}));
    // curl reads the upload from its stdin, which is written slowly: DATA frames as the
    // pieces come, no content-length.
    let mut curl = Command::new("curl")
        .args([
            "-s",
            "--http2-prior-knowledge",
            "-T",
            "-",
            "-o",
            "/dev/null",
        ])
        .args(["-w", "%{http_version} %{http_code}"])
        .arg(format!("http://{}/h2-upload", router.http))
        .args(["-H", "host: buffered.test"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("curl (installed by scripts/test)");
    let mut stdin = curl.stdin.take().expect("curl's stdin");
    for _ in 0..8 {
        stdin.write_all(&[b'h'; 2048]).expect("a piece");
        stdin.flush().expect("flush");
        std::thread::sleep(Duration::from_millis(100));
    }
    drop(stdin);
    let last_sent = Instant::now();
    let output = curl.wait_with_output().expect("curl ends");
    assert_eq!(String::from_utf8_lossy(&output.stdout), "2 200");
    let seen = backend.seen().pop().expect("the backend got it");
    assert!(
        seen.first_byte >= last_sent - Duration::from_millis(20),
        "the backend saw the head {:?} before the client's last byte",
        last_sent.saturating_duration_since(seen.first_byte)
    );
    assert_eq!(seen.field("content-length").as_deref(), Some("16384"));
    assert_eq!(seen.field("transfer-encoding"), None);
    assert_eq!(seen.body, vec![b'h'; 16384]);
    gauges_at_rest(&router);
}

/// Sends `length` bytes with a Content-Length at once; the answer's status and
/// `Retry-After`.
fn upload(router: SocketAddr, host: &str, length: usize) -> (u16, Option<String>) {
    let answer = support::send(
        router,
        "POST",
        host,
        "/big",
        &format!("content-length: {length}\r\n\r\n{}", "b".repeat(length)),
    )
    .expect("an answer");
    (
        answer.status,
        answer.header("retry-after").map(str::to_string),
    )
}

#[test]
fn full_budgets_answer_503_at_once_and_give_back_what_was_held() {
    // 1 MiB of memory and of spool for all bodies; 256 KiB of a body kept in memory.
    let router = RouterProcess::start_with(&[
        "--request-buffer-kb",
        "256",
        "--request-buffer-memory-mb",
        "1",
        "--request-spool-mb",
        "1",
    ]);
    let backend = TimingBackend::start();
    app(&router, "buffered", backend.addr, json!({}));
    app(
        &router,
        "limited",
        backend.addr,
        json!({"limits": {"max_body_bytes": 100_000}}),
    );

    // In memory, then spooled: both reach the backend whole.
    assert_eq!(upload(router.http, "buffered.test", 200_000).0, 200);
    assert_eq!(upload(router.http, "buffered.test", 900_000).0, 200);
    let bodies: Vec<usize> = backend.seen().iter().map(|s| s.body.len()).collect();
    assert_eq!(bodies, [200_000, 900_000]);
    assert_eq!(
        router.metric(r#"switchyard_request_buffer_total{outcome="spooled"}"#),
        1.0
    );

    // Past the spool's megabyte: 503 with Retry-After, not a stall.
    let started = Instant::now();
    let (status, retry_after) = upload(router.http, "buffered.test", 1_200_000);
    assert_eq!((status, retry_after.as_deref()), (503, Some("5")));
    assert!(started.elapsed() < Duration::from_secs(5));
    // Past the app's limit: 413, as when streamed (a declared length past it is refused
    // before any of the body is read, by the limits; a chunked one where it passes it).
    assert_eq!(upload(router.http, "limited.test", 150_000).0, 413);
    let (status, _) = trickle(
        router.http,
        "limited.test",
        "/big",
        2,
        60_000,
        Duration::ZERO,
    );
    assert_eq!(status, 413);
    assert_eq!(
        router.metric(r#"switchyard_request_buffer_total{outcome="full"}"#),
        1.0
    );
    assert_eq!(
        router.metric(r#"switchyard_request_buffer_total{outcome="too_large"}"#),
        1.0
    );
    assert_eq!(
        backend.seen().len(),
        2,
        "nothing refused reached the backend"
    );
    gauges_at_rest(&router);

    // Memory: five bodies held at once, each 240 KiB in memory, pass the megabyte; one of
    // them finds no room.
    let holders: Vec<_> = (0..5)
        .map(|_| {
            let mut client = TcpStream::connect(router.http).expect("connect");
            write!(
                client,
                "POST /held HTTP/1.1\r\nhost: buffered.test\r\ncontent-length: 400000\r\n\r\n{}",
                "m".repeat(240 * 1024)
            )
            .expect("most of a body");
            client
        })
        .collect();
    eventually(Duration::from_secs(5), "one body without room", || {
        router.metric(r#"switchyard_request_buffer_total{outcome="full"}"#) == 2.0
    });
    drop(holders);
    gauges_at_rest(&router);
}

#[test]
fn an_upload_behind_its_pace_or_past_its_deadline_is_refused_408_leaving_nothing_held() {
    // A second of grace, then 1,000 bytes a second.
    let router = RouterProcess::start_with(&[
        "--request-body-grace-s",
        "1",
        "--request-body-min-rate",
        "1000",
    ]);
    let backend = TimingBackend::start();
    app(&router, "buffered", backend.addr, json!({}));
    app(
        &router,
        "deadline",
        backend.addr,
        json!({"request_buffering": {"deadline_s": 1, "min_rate_bytes": 0}}),
    );
    // 100 bytes every 200 ms: 500 bytes a second, behind the pace once the second of
    // grace is spent: refused by about 2 s.
    let started = Instant::now();
    let (status, _) = trickle_until_answered(
        router.http,
        "buffered.test",
        100,
        Duration::from_millis(200),
    );
    assert_eq!(status, 408);
    let took = started.elapsed();
    assert!(
        took > Duration::from_millis(1000) && took < Duration::from_secs(5),
        "{took:?}"
    );
    // Fast enough but past the app's whole-body deadline of 1 s.
    let started = Instant::now();
    let (status, _) = trickle_until_answered(
        router.http,
        "deadline.test",
        4096,
        Duration::from_millis(100),
    );
    assert_eq!(status, 408);
    let took = started.elapsed();
    assert!(
        took >= Duration::from_millis(1000) && took < Duration::from_secs(3),
        "{took:?}"
    );
    assert_eq!(
        router.metric(r#"switchyard_request_buffer_total{outcome="too_slow"}"#),
        2.0
    );
    assert!(
        backend.seen().is_empty(),
        "nothing refused reached the backend"
    );
    gauges_at_rest(&router);
}

/// Sends chunks of `piece` bytes `every` apart until an answer comes (at most 10 s).
fn trickle_until_answered(
    router: SocketAddr,
    host: &str,
    piece: usize,
    every: Duration,
) -> (u16, Instant) {
    let mut client = TcpStream::connect(router).expect("connect");
    write!(
        client,
        "POST /slow HTTP/1.1\r\nhost: {host}\r\ntransfer-encoding: chunked\r\n\r\n"
    )
    .expect("head");
    client.set_nonblocking(true).expect("non-blocking");
    let started = Instant::now();
    let mut answer = Vec::new();
    while started.elapsed() < Duration::from_secs(10) {
        let mut buffer = [0; 512];
        match client.read(&mut buffer) {
            Ok(0) => break,
            Ok(n) => {
                answer.extend_from_slice(&buffer[..n]);
                if answer.len() >= 12 {
                    break;
                }
            }
            Err(_) => {}
        }
        // The router may have closed its side once it answered.
        let _ = write!(client, "{piece:x}\r\n{}\r\n", "s".repeat(piece));
        std::thread::sleep(every);
    }
    let line = String::from_utf8_lossy(&answer);
    (
        line.get(9..12).and_then(|s| s.parse().ok()).unwrap_or(0),
        Instant::now(),
    )
}

#[test]
fn expect_100_continue_is_answered_by_the_router_and_the_backend_gets_the_body_at_once() {
    let router = RouterProcess::start();
    let backend = TimingBackend::start();
    app(&router, "buffered", backend.addr, json!({}));
    let mut client = TcpStream::connect(router.http).expect("connect");
    client
        .set_read_timeout(Some(Duration::from_secs(10)))
        .expect("timeout");
    write!(
        client,
        "PUT /file HTTP/1.1\r\nhost: buffered.test\r\ncontent-length: 5\r\nexpect: 100-continue\r\n\r\n"
    )
    .expect("head");
    let mut interim = [0; 25];
    client.read_exact(&mut interim).expect("an interim answer");
    assert_eq!(&interim, b"HTTP/1.1 100 Continue\r\n\r\n");
    assert!(
        backend.seen().is_empty(),
        "no backend is asked before the body is in"
    );
    client.write_all(b"hello").expect("the body");
    assert_eq!(status_of(&mut client), 200);
    let seen = backend.seen().pop().expect("the backend got it");
    assert_eq!(seen.body, b"hello");
}

#[test]
fn an_http3_body_is_read_whole_before_the_backend_unless_the_app_streams() {
    let h3_port = support::free_port();
    let router = RouterProcess::start_with(&["--http3", &format!("127.0.0.1:{h3_port}")]);
    let ca = support::pki::Ca::root("Buffering Test Root");
    router.store_cert("*.apps.test", &ca.issue(&["*.apps.test"], -1, 30));
    let ca_file = tempfile::NamedTempFile::new().expect("a file for the CA");
    std::fs::write(ca_file.path(), ca.pem()).expect("write the CA");
    let backend = TimingBackend::start();
    for (name, extra) in [
        ("buffered", json!({})),
        ("streams", json!({"request_buffering": false})),
    ] {
        let mut spec = json!({"domains": [format!("{name}.apps.test")],
                              "backends": [backend.addr.to_string()]});
        spec.as_object_mut()
            .expect("an object")
            .extend(extra.as_object().expect("an object").clone());
        router.put_app(name, spec);
    }
    // Five pieces 100 ms apart: 400 ms from the first to the last.
    let trickled = [
        "--method",
        "POST",
        "--path",
        "/upload",
        "--body-bytes",
        "20480",
        "--body-chunks",
        "5",
        "--chunk-interval-ms",
        "100",
    ];
    for (host, buffered) in [("buffered.apps.test", true), ("streams.apps.test", false)] {
        let answer = support::h3::ask(h3_port, ca_file.path(), host, &trickled)
            .unwrap_or_else(|e| panic!("{e}\n{}", router.logs()));
        assert_eq!(answer["status"], 200, "{host}: {answer}");
        let seen = backend.seen().pop().expect("the backend got it");
        assert_eq!(seen.body.len(), 20_480, "{host}");
        let spread = seen.last_byte - seen.first_byte;
        if buffered {
            assert!(
                spread < Duration::from_millis(50),
                "{host}: head to last byte {spread:?}"
            );
        } else {
            assert!(
                spread > Duration::from_millis(300),
                "{host}: head to last byte {spread:?}"
            );
        }
    }
    assert_eq!(
        router.metric(r#"switchyard_request_buffer_total{outcome="memory"}"#),
        1.0
    );
    gauges_at_rest(&router);
}
