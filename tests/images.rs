//! Image resizing end to end: originals served by a real HTTP backend or found under the
//! app's static root, resized by the router's worker pool, checked by decoding what comes
//! back.

use switchyard_test_support as support;

use std::io::{BufRead, BufReader, Cursor, Write};
use std::net::{SocketAddr, TcpListener};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use image::{DynamicImage, ImageFormat};
use serde_json::{json, Value};
use support::RouterProcess;

fn png(width: u32, height: u32) -> Vec<u8> {
    let pixels = image::RgbImage::from_fn(width, height, |x, y| {
        image::Rgb([(x % 251) as u8, (y % 241) as u8, ((x + y) % 239) as u8])
    });
    let mut out = Cursor::new(Vec::new());
    DynamicImage::ImageRgb8(pixels)
        .write_to(&mut out, ImageFormat::Png)
        .expect("encode");
    out.into_inner()
}

/// A backend serving fixed files (`Connection: close` each time) and counting requests.
struct Originals {
    addr: SocketAddr,
    requests: Arc<AtomicUsize>,
}

impl Originals {
    fn start(files: Vec<(&'static str, Vec<u8>)>) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
        let addr = listener.local_addr().expect("addr");
        let requests = Arc::new(AtomicUsize::new(0));
        let counted = requests.clone();
        let files = Arc::new(files);
        std::thread::spawn(move || {
            for stream in listener.incoming().flatten() {
                let (files, counted) = (files.clone(), counted.clone());
                std::thread::spawn(move || {
                    let mut reader = BufReader::new(stream);
                    let mut request_line = String::new();
                    if reader.read_line(&mut request_line).is_err() {
                        return;
                    }
                    let mut line = String::new();
                    while reader.read_line(&mut line).is_ok_and(|n| n > 2) {
                        line.clear();
                    }
                    counted.fetch_add(1, Ordering::Relaxed);
                    let path = request_line.split_whitespace().nth(1).unwrap_or("");
                    let mut stream = reader.into_inner();
                    let _ = match files.iter().find(|(p, _)| *p == path) {
                        Some((_, body)) => stream
                            .write_all(
                                format!(
                                    "HTTP/1.1 200 OK\r\nContent-Type: image/png\r\nCache-Control: public, max-age=600\r\n\
                                     Content-Length: {}\r\nConnection: close\r\n\r\n",
                                    body.len()
                                )
                                .as_bytes(),
                            )
                            .and_then(|()| stream.write_all(body)),
                        None => stream.write_all(
                            b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
                        ),
                    };
                });
            }
        });
        Self { addr, requests }
    }
}

fn gallery(router: &RouterProcess, originals: &Originals, images: Value, extra: Value) {
    let mut spec = json!({
        "domains": ["gallery.test"],
        "backends": [originals.addr.to_string()],
        "images": images,
    });
    if let (Some(spec), Some(extra)) = (spec.as_object_mut(), extra.as_object()) {
        spec.extend(extra.clone());
    }
    router.put_app("gallery", spec);
}

fn decoded(response: &support::Response) -> (ImageFormat, u32, u32) {
    let format = image::guess_format(&response.body).expect("an image came back");
    let image = image::load_from_memory(&response.body).expect("decodes");
    (format, image.width(), image.height())
}

#[test]
fn originals_from_the_app_are_resized_to_the_asked_box_and_format() {
    let router = RouterProcess::start();
    let originals = Originals::start(vec![
        ("/photos/wide.png", png(400, 200)),
        (
            "/photos/broken.png",
            b"\x89PNG\r\n\x1a\n this is not the rest of a PNG".to_vec(),
        ),
        ("/notes.txt", b"plain text, not an image".to_vec()),
    ]);
    gallery(
        &router,
        &originals,
        json!({"max_width": 1000, "max_height": 1000}),
        json!({}),
    );

    let contained = router.get("gallery.test", "/_img/100x100/photos/wide.png");
    assert_eq!(contained.status, 200, "{}", contained.text());
    assert_eq!(contained.header("content-type"), Some("image/png"));
    assert_eq!(
        decoded(&contained),
        (ImageFormat::Png, 100, 50),
        "aspect ratio kept"
    );
    assert_eq!(
        contained.header("cache-control"),
        Some("public, max-age=600")
    );

    let covered = router.get(
        "gallery.test",
        "/_img/120x90/photos/wide.png?fit=cover&format=jpeg",
    );
    assert_eq!(covered.header("content-type"), Some("image/jpeg"));
    assert_eq!(
        decoded(&covered),
        (ImageFormat::Jpeg, 120, 90),
        "the box filled"
    );

    let webp = router.get("gallery.test", "/_img/40x40/photos/wide.png?format=webp");
    assert_eq!(decoded(&webp), (ImageFormat::WebP, 40, 20));

    // Not images, or not there: 422 and the app's own 404, never a crash.
    let corrupt = router.get("gallery.test", "/_img/100x100/photos/broken.png");
    assert_eq!(corrupt.status, 422, "{}", corrupt.text());
    assert_eq!(
        router.get("gallery.test", "/_img/100x100/notes.txt").status,
        422
    );
    assert_eq!(
        router
            .get("gallery.test", "/_img/100x100/photos/absent.png")
            .status,
        404
    );
    // Requests the router refuses before fetching anything.
    let fetched = originals.requests.load(Ordering::Relaxed);
    for bad in [
        "/_img/100/photos/wide.png",
        "/_img/0x10/photos/wide.png",
        "/_img/1001x10/photos/wide.png",
        "/_img/10x10/photos/wide.png?format=gif",
    ] {
        let response = router.get("gallery.test", bad);
        assert_eq!(response.status, 400, "{bad}: {}", response.text());
    }
    assert_eq!(
        originals.requests.load(Ordering::Relaxed),
        fetched,
        "nothing fetched for them"
    );
    // Paths outside the prefix go to the app as usual.
    assert_eq!(
        router.get("gallery.test", "/photos/wide.png").body,
        png(400, 200)
    );
    assert_eq!(
        router.metric("switchyard_image_requests_total{app=\"gallery\",result=\"resized\"}"),
        3.0
    );
    assert_eq!(
        router.metric("switchyard_image_requests_total{app=\"gallery\",result=\"unprocessable\"}"),
        2.0
    );
    assert!(
        router.logs().contains("not resized"),
        "the refusal is logged with its reason"
    );
}

#[test]
fn a_resized_image_the_app_lets_be_cached_is_made_once() {
    let router = RouterProcess::start();
    let originals = Originals::start(vec![("/photos/wide.png", png(400, 200))]);
    gallery(
        &router,
        &originals,
        json!({}),
        json!({"cache": {"paths": ["/_img/*"], "default_ttl_s": 60}}),
    );
    let first = router.get("gallery.test", "/_img/100x100/photos/wide.png?format=webp");
    assert_eq!(first.status, 200, "{}", first.text());
    assert_eq!(first.header("x-cache"), Some("MISS"));
    for _ in 0..3 {
        let again = router.get("gallery.test", "/_img/100x100/photos/wide.png?format=webp");
        assert_eq!(again.status, 200);
        assert_eq!(again.header("x-cache"), Some("HIT"));
        assert_eq!(again.body, first.body, "the same image");
        assert_eq!(again.header("content-type"), Some("image/webp"));
    }
    // Another size or format is another entry.
    let other = router.get("gallery.test", "/_img/50x50/photos/wide.png");
    assert_eq!(other.header("x-cache"), Some("MISS"));
    assert_eq!(decoded(&other), (ImageFormat::Png, 50, 25));
    assert_eq!(
        originals.requests.load(Ordering::Relaxed),
        2,
        "fetched once per size"
    );
    assert_eq!(
        router.metric("switchyard_image_requests_total{app=\"gallery\",result=\"resized\"}"),
        2.0
    );
}

#[test]
fn a_file_under_the_static_root_is_resized_without_asking_the_app() {
    let router = RouterProcess::start();
    let originals = Originals::start(vec![]);
    let root = tempfile::tempdir().expect("root");
    std::fs::create_dir_all(root.path().join("img")).expect("dir");
    std::fs::write(root.path().join("img/tall.png"), png(60, 240)).expect("write");
    gallery(
        &router,
        &originals,
        json!({}),
        json!({"static_root": root.path().display().to_string()}),
    );
    let response = router.get("gallery.test", "/_img/30x30/img/tall.png");
    assert_eq!(response.status, 200, "{}", response.text());
    assert_eq!(decoded(&response), (ImageFormat::Png, 8, 30));
    assert_eq!(originals.requests.load(Ordering::Relaxed), 0);
}

#[test]
fn originals_over_the_size_limit_are_refused() {
    let router = RouterProcess::start();
    let originals = Originals::start(vec![("/big.png", png(300, 300))]);
    gallery(
        &router,
        &originals,
        json!({"max_source_bytes": 1000}),
        json!({}),
    );
    let response = router.get("gallery.test", "/_img/10x10/big.png");
    assert_eq!(response.status, 422);
    assert!(
        response.text().contains("max_source_bytes"),
        "{}",
        response.text()
    );
}

/// A router with one worker and a queue of one.
fn one_worker_router() -> RouterProcess {
    // nice rather than SCHED_IDLE: cargo runs two of these tests at once on a 2-CPU machine,
    // and a worker that gives way starves while the other router's loops keep both CPUs
    // busy (as it should; bench/ measures that). These tests are about refusals.
    RouterProcess::start_with(&[
        "--pool-threads",
        "1",
        "--pool-queue",
        "1",
        "--pool-sched",
        "nice",
    ])
}

/// A router with one worker and a queue of one, and a gallery whose original (2500×2500)
/// keeps the worker busy for a while at each resize.
fn one_worker_gallery() -> (RouterProcess, Originals) {
    let router = one_worker_router();
    let originals = Originals::start(vec![("/huge.png", png(2500, 2500))]);
    gallery(
        &router,
        &originals,
        json!({"timeout_ms": 20_000, "max_source_bytes": 67_108_864}),
        json!({}),
    );
    (router, originals)
}

#[test]
fn a_full_worker_pool_answers_503_with_retry_after_and_the_router_stays_up() {
    let (router, _originals) = one_worker_gallery();
    let http = router.http;
    let clients: Vec<_> = (0..6)
        .map(|_| {
            std::thread::spawn(move || {
                support::get(http, "gallery.test", "/_img/1000x1000/huge.png?fit=cover")
                    .expect("answered")
            })
        })
        .collect();
    let answers: Vec<_> = clients
        .into_iter()
        .map(|c| c.join().expect("client"))
        .collect();
    let resized = answers.iter().filter(|r| r.status == 200).count();
    let refused: Vec<_> = answers.iter().filter(|r| r.status == 503).collect();
    assert_eq!(resized + refused.len(), 6, "only 200 or 503");
    assert!(resized >= 1, "the pool did resize");
    assert!(
        !refused.is_empty(),
        "a queue of one cannot take six at once"
    );
    assert!(refused.iter().all(|r| r.header("retry-after") == Some("1")));
    assert!(
        router.metric("switchyard_image_requests_total{app=\"gallery\",result=\"overloaded\"}")
            >= 1.0
    );
    assert_eq!(
        router.get("gallery.test", "/huge.png").status,
        200,
        "plain requests still served"
    );
}

/// Six clients asking for `path` on fresh connections, one request after the other, until
/// told to stop: they keep a one-worker pool and its queue busy.
struct BusyClients {
    done: Arc<std::sync::atomic::AtomicBool>,
    clients: Vec<std::thread::JoinHandle<()>>,
}

impl BusyClients {
    fn start(http: SocketAddr, path: &str) -> Self {
        let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let clients = (0..6)
            .map(|_| {
                let (done, path) = (done.clone(), path.to_string());
                std::thread::spawn(move || {
                    while !done.load(Ordering::Relaxed) {
                        support::get(http, "gallery.test", &path).expect("answered");
                    }
                })
            })
            .collect();
        Self { done, clients }
    }

    /// Each ends after the request it is making.
    fn stop_asking(&self) {
        self.done.store(true, Ordering::Relaxed);
    }

    fn join(self) {
        self.stop_asking();
        for client in self.clients {
            client.join().expect("client");
        }
    }
}

/// A keep-alive connection to `http`: where to write requests, and its responses to read.
fn keep_alive(http: SocketAddr) -> (std::net::TcpStream, BufReader<std::net::TcpStream>) {
    let stream = std::net::TcpStream::connect(http).expect("connect");
    stream
        .set_read_timeout(Some(std::time::Duration::from_secs(30)))
        .expect("timeout");
    (stream.try_clone().expect("clone"), BufReader::new(stream))
}

/// Reads one response from a keep-alive connection (a body with Content-Length): its status.
fn read_one(reader: &mut BufReader<std::net::TcpStream>) -> u16 {
    let mut status = 0;
    let mut length = 0usize;
    let mut line = String::new();
    loop {
        line.clear();
        reader.read_line(&mut line).expect("a response head");
        let trimmed = line.trim_end();
        if trimmed.is_empty() {
            break;
        }
        if status == 0 {
            status = trimmed
                .split(' ')
                .nth(1)
                .and_then(|s| s.parse().ok())
                .unwrap_or(0);
        } else if let Some((name, value)) = trimmed.split_once(':') {
            if name.eq_ignore_ascii_case("content-length") {
                length = value.trim().parse().expect("a length");
            }
        }
    }
    let mut body = vec![0; length];
    std::io::Read::read_exact(reader, &mut body).expect("the body");
    status
}

#[test]
fn a_connection_that_asks_again_after_a_busy_refusal_waits_out_its_retry_after() {
    let (router, _originals) = one_worker_gallery();
    let http = router.http;
    // Others keep the one worker and its queue busy until the test is done.
    let busy = BusyClients::start(http, "/_img/1000x1000/huge.png?fit=cover");
    let (mut writer, mut reader) = keep_alive(http);
    let resize = "GET /_img/1000x1000/huge.png?fit=cover HTTP/1.1\r\nHost: gallery.test\r\n\r\n";
    let refused_at = (0..50)
        .find_map(|_| {
            writer.write_all(resize.as_bytes()).expect("send");
            (read_one(&mut reader) == 503).then(std::time::Instant::now)
        })
        .expect("a busy pool refused this connection once");
    // At once on the same connection, even for a plain file: held for a random half to all
    // of its Retry-After (1 s), where a careless client would otherwise keep the event loops
    // answering.
    writer
        .write_all(b"GET /huge.png HTTP/1.1\r\nHost: gallery.test\r\n\r\n")
        .expect("send");
    assert_eq!(read_one(&mut reader), 200);
    let held = refused_at.elapsed();
    assert!(
        held >= std::time::Duration::from_millis(450),
        "answered {held:?} after the refusal"
    );
    assert!(router.metric("switchyard_paced_requests_total") >= 1.0);
    busy.join();
}

/// Side of a PNG original whose resize to half takes a worker tens of milliseconds of CPU.
const MEDIUM: u32 = 800;

#[test]
fn a_client_that_asks_again_at_once_is_served_when_the_pool_frees_though_its_timeout_is_shorter_than_the_hold(
) {
    // The app gives a resize half a second: less than the half to whole second a connection
    // that asks again at once after a busy refusal is held. Resizes of MEDIUM take tens of
    // milliseconds of CPU, so a free worker fits one in what is left after a hold.
    let router = one_worker_router();
    let originals = Originals::start(vec![("/medium.png", png(MEDIUM, MEDIUM))]);
    gallery(&router, &originals, json!({"timeout_ms": 500}), json!({}));
    let http = router.http;
    let resize_path = format!("/_img/{0}x{0}/medium.png?fit=cover", MEDIUM / 2);
    let busy = BusyClients::start(http, &resize_path);
    let (mut writer, mut reader) = keep_alive(http);
    let resize = format!("GET {resize_path} HTTP/1.1\r\nHost: gallery.test\r\n\r\n");
    let mut ask = || {
        writer.write_all(resize.as_bytes()).expect("send");
        read_one(&mut reader)
    };
    assert!(
        (0..50).any(|_| ask() == 503),
        "the busy pool refused this connection"
    );
    // From here each ask comes at once after the last answer, so after a refusal it is
    // held; the others stop, and the pool frees within a resize or two. Had the hold been
    // taken off the half second in full, nothing would be left for a resize: each ask
    // would be refused and held again, for as long as the connection lasted.
    busy.stop_asking();
    let mut answers = Vec::new();
    while answers.last() != Some(&200) && answers.len() < 8 {
        answers.push(ask());
    }
    assert_eq!(
        answers.last(),
        Some(&200),
        "answers once the others stopped: {answers:?}"
    );
    assert!(router.metric("switchyard_paced_requests_total") >= 1.0);
    busy.join();
}

/// A port nothing listens on: connecting is refused.
fn closed_port() -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    listener.local_addr().expect("addr")
}

#[test]
fn an_unreachable_backend_is_marked_down_and_the_original_fetched_from_another() {
    let router = RouterProcess::start();
    let originals = Originals::start(vec![("/photos/wide.png", png(400, 200))]);
    router.put_app(
        "gallery",
        json!({
            "domains": ["gallery.test"],
            "backends": [closed_port().to_string(), originals.addr.to_string()],
            "retries": 1,
            "images": {"max_width": 1000, "max_height": 1000},
        }),
    );
    for _ in 0..6 {
        let resized = router.get("gallery.test", "/_img/100x100/photos/wide.png");
        assert_eq!(resized.status, 200, "{}", resized.text());
    }
    assert_eq!(originals.requests.load(Ordering::Relaxed), 6);
    // Tried once, then skipped while it is down.
    assert_eq!(
        router.metric("switchyard_upstream_errors_total{app=\"gallery\",kind=\"connect_error\"}"),
        1.0
    );
}

/// A backend that sends the head of a PNG's answer and half its body, then holds the rest
/// for `hold`: an original still arriving.
fn slow_original(hold: Duration) -> (SocketAddr, Arc<AtomicUsize>) {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = listener.local_addr().expect("addr");
    let requests = Arc::new(AtomicUsize::new(0));
    let counted = requests.clone();
    std::thread::spawn(move || {
        let body = png(400, 200);
        for stream in listener.incoming().flatten() {
            let (body, counted) = (body.clone(), counted.clone());
            std::thread::spawn(move || {
                let mut reader = BufReader::new(stream);
                let mut line = String::new();
                while reader.read_line(&mut line).is_ok_and(|n| n > 2) {
                    line.clear();
                }
                counted.fetch_add(1, Ordering::Relaxed);
                let mut stream = reader.into_inner();
                let head = format!(
                    "HTTP/1.1 200 OK\r\nContent-Type: image/png\r\nContent-Length: {}\r\n\r\n",
                    body.len()
                );
                let (first, rest) = body.split_at(body.len() / 2);
                let _ = stream
                    .write_all(head.as_bytes())
                    .and_then(|()| stream.write_all(first));
                std::thread::sleep(hold);
                let _ = stream.write_all(rest);
            });
        }
    });
    (addr, requests)
}

#[test]
fn an_original_fetched_from_a_removed_backend_is_let_go_at_the_apps_deadline() {
    let router = Arc::new(RouterProcess::start());
    let (slow, requests) = slow_original(Duration::from_secs(8));
    let other = Originals::start(vec![("/photos/wide.png", png(400, 200))]);
    router.put_app(
        "gallery",
        json!({
            "domains": ["gallery.test"],
            "backends": [slow.to_string()],
            "images": {"max_width": 1000, "max_height": 1000},
            "drain": {"removed_backend_s": 1},
        }),
    );
    let asking = {
        let router = router.clone();
        std::thread::spawn(move || {
            let started = Instant::now();
            let answer = router.get("gallery.test", "/_img/100x100/photos/wide.png");
            (answer, started.elapsed())
        })
    };
    support::eventually(Duration::from_secs(5), "the fetch under way", || {
        requests.load(Ordering::Relaxed) == 1
    });
    // The fetch's connection is in the table a drain reads.
    assert_eq!(router.metric("switchyard_upstream_connections_in_use"), 1.0);
    let (status, answer) = router.admin_call(
        "PUT",
        "/v1/apps/gallery/backends",
        Some(&json!({"backends": [other.addr.to_string()]}).to_string()),
    );
    assert_eq!(status, 200, "{answer}");
    let (answer, took) = asking.join().expect("the image request");
    assert_eq!(answer.status, 502, "{}", answer.text());
    assert!(
        took < Duration::from_secs(6),
        "let go at the deadline, not when the backend finished: {took:?}"
    );
    assert_eq!(
        router.metric("switchyard_drained_connections_total{reason=\"removed_backend_deadline\"}"),
        1.0
    );
    assert_eq!(router.metric("switchyard_upstream_connections_in_use"), 0.0);
    // New requests go to the backend that stays.
    let resized = router.get("gallery.test", "/_img/100x100/photos/wide.png");
    assert_eq!(resized.status, 200, "{}", resized.text());
}
