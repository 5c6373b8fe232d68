//! Requests reach the right app by Host, and failures get the statuses of the contract.

use switchyard_test_support as support;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::json;
use support::{eventually, Backend, RouterProcess};

#[test]
fn exact_and_wildcard_hosts_route_to_their_apps() {
    let router = RouterProcess::start();
    let shop = Backend::start("shop");
    let shop_eu = Backend::start("shop-eu");
    let blog = Backend::start("blog");
    router.put_app(
        "shop",
        json!({"domains": ["shop.test", "*.shop.test"], "backends": [shop.addr.to_string()]}),
    );
    router.put_app("shop-eu", json!({"domains": ["eu.shop.test", "*.eu.shop.test"], "backends": [shop_eu.addr.to_string()]}));
    router.put_app(
        "blog",
        json!({"domains": ["blog.test"], "backends": [blog.addr.to_string()]}),
    );

    let cases = [
        ("shop.test", "shop"),
        ("SHOP.Test", "shop"),
        ("shop.test:8080", "shop"),
        ("shop.test.", "shop"),
        ("www.shop.test", "shop"),
        ("a.b.shop.test", "shop"),
        ("eu.shop.test", "shop-eu"),
        ("x.eu.shop.test", "shop-eu"),
        ("blog.test", "blog"),
    ];
    for (host, app) in cases {
        let response = router.get(host, "/");
        assert_eq!(response.status, 200, "{host}: {}", response.text());
        assert_eq!(response.json()["backend"], app, "{host}");
    }
}

#[test]
fn unknown_host_gets_a_small_404() {
    let router = RouterProcess::start();
    for host in ["nobody.test", "blog.test.evil", "[::1]:80", "a b"] {
        let response = router.get(host, "/");
        assert_eq!(response.status, 404, "{host}");
        assert!(
            response.body.len() < 200,
            "{host}: the 404 body stays small"
        );
        assert!(response.text().contains("no app"), "{}", response.text());
    }
    let missing_host = support::request(router.http, "GET / HTTP/1.1\r\nConnection: close\r\n\r\n")
        .expect("response");
    assert_eq!(missing_host.status, 400);
}

#[test]
fn backends_receive_forwarded_headers_and_the_request_id() {
    let router = RouterProcess::start();
    let backend = Backend::start("echo");
    router.put_app(
        "echo",
        json!({"domains": ["echo.test"], "backends": [backend.addr.to_string()]}),
    );

    let response = router.get("echo.test", "/hello?x=1");
    let seen = response.json();
    assert_eq!(seen["path"], "/hello?x=1");
    assert_eq!(seen["headers"]["x-forwarded-for"], "127.0.0.1");
    assert_eq!(seen["headers"]["x-forwarded-proto"], "http");
    let request_id = seen["headers"]["x-request-id"]
        .as_str()
        .expect("request id sent to the backend");
    assert_eq!(request_id.len(), 32);
    assert_eq!(
        response.header("x-request-id"),
        Some(request_id),
        "the client sees the same id"
    );

    let given = "0123456789abcdef-given-by-edge";
    let response = support::request(
        router.http,
        &format!("GET / HTTP/1.1\r\nHost: echo.test\r\nX-Forwarded-For: 203.0.113.9\r\nX-Request-Id: {given}\r\nConnection: close\r\n\r\n"),
    )
    .expect("response");
    let seen = response.json();
    assert_eq!(seen["headers"]["x-forwarded-for"], "203.0.113.9, 127.0.0.1");
    assert_eq!(seen["headers"]["x-request-id"], given);

    let post = support::request(
        router.http,
        "POST /submit HTTP/1.1\r\nHost: echo.test\r\nContent-Length: 11\r\nConnection: close\r\n\r\nhello world",
    )
    .expect("response");
    assert_eq!(post.json()["body_len"], 11);
}

#[test]
fn failures_get_the_contract_statuses() {
    let router = RouterProcess::start();
    let slow = Backend::start("slow");
    let unused_port = support::free_port();
    router.put_app("empty", json!({"domains": ["empty.test"], "backends": []}));
    router.put_app(
        "down",
        json!({"domains": ["down.test"], "backends": [format!("127.0.0.1:{unused_port}")]}),
    );
    router.put_app("slow", json!({"domains": ["slow.test"], "backends": [slow.addr.to_string()], "timeouts": {"read_ms": 300}}));

    assert_eq!(
        router.get("empty.test", "/").status,
        503,
        "no backends → 503"
    );
    let refused = router.get("down.test", "/");
    assert_eq!(refused.status, 502, "unreachable backend → 502");
    assert!(
        !refused.text().contains("127.0.0.1"),
        "no internal detail in error bodies: {}",
        refused.text()
    );
    assert_eq!(
        router.get("down.test", "/").status,
        502,
        "marked down → still 502"
    );
    assert_eq!(
        router.get("slow.test", "/slow?ms=2000").status,
        504,
        "backend timeout → 504"
    );
    assert_eq!(router.get("slow.test", "/slow?ms=10").status, 200);
}

#[test]
fn weighted_round_robin_splits_by_weight() {
    let router = RouterProcess::start();
    let heavy = Backend::start("heavy");
    let light = Backend::start("light");
    router.put_app(
        "split",
        json!({"domains": ["split.test"], "backends": [{"address": heavy.addr.to_string(), "weight": 3}, light.addr.to_string()]}),
    );
    let mut heavy_count = 0;
    for _ in 0..200 {
        if router.get("split.test", "/").json()["backend"] == "heavy" {
            heavy_count += 1;
        }
    }
    assert_eq!(heavy_count, 150, "weight 3:1 over 200 requests");
}

#[test]
fn least_loaded_sends_new_requests_to_the_idle_backend() {
    let router = RouterProcess::start();
    let busy = Backend::start("busy");
    let idle = Backend::start("idle");
    router.put_app("p2c", json!({"domains": ["p2c.test"], "backends": [busy.addr.to_string()], "balancer": "least_loaded"}));
    let http = router.http;
    let holders: Vec<_> = (0..6)
        .map(|_| std::thread::spawn(move || support::get(http, "p2c.test", "/slow?ms=1500")))
        .collect();
    eventually(
        Duration::from_secs(5),
        "six slow requests on the busy backend",
        || busy.requests() == 6,
    );
    // The busy backend's in-flight count survives the scale-up: its state carries over.
    router.scale("p2c", &[busy.addr, idle.addr]);
    eventually(Duration::from_secs(2), "the scale-up to apply", || {
        router.get("p2c.test", "/").json()["backend"] == "idle"
    });
    let to_busy = (0..20)
        .filter(|_| router.get("p2c.test", "/").json()["backend"] == "busy")
        .count();
    for holder in holders {
        assert_eq!(
            holder
                .join()
                .expect("holder")
                .expect("slow response")
                .status,
            200
        );
    }
    assert_eq!(
        to_busy, 0,
        "quick requests went to the backend with six in flight"
    );
}

#[test]
fn a_backend_killed_mid_load_costs_no_idempotent_request() {
    let router = RouterProcess::start();
    let backends: Vec<Backend> = ["a", "b", "c"].iter().map(|n| Backend::start(n)).collect();
    let addrs: Vec<String> = backends.iter().map(|b| b.addr.to_string()).collect();
    router.put_app(
        "steady",
        json!({"domains": ["steady.test"], "backends": addrs}),
    );

    let sent = Arc::new(AtomicUsize::new(0));
    let http = router.http;
    let clients: Vec<_> = (0..4)
        .map(|_| {
            let sent = sent.clone();
            std::thread::spawn(move || {
                let mut failures = Vec::new();
                for _ in 0..150 {
                    sent.fetch_add(1, Ordering::Relaxed);
                    match support::get(http, "steady.test", "/slow?ms=5") {
                        Ok(r) if r.status == 200 => {}
                        Ok(r) => failures.push(format!("status {}: {}", r.status, r.text())),
                        Err(e) => failures.push(e.to_string()),
                    }
                }
                failures
            })
        })
        .collect();
    eventually(Duration::from_secs(10), "traffic to start", || {
        sent.load(Ordering::Relaxed) >= 100
    });
    backends[1].stop();
    let failures: Vec<String> = clients
        .into_iter()
        .flat_map(|c| c.join().expect("client"))
        .collect();
    assert!(
        failures.is_empty(),
        "client-visible errors: {failures:?}\n{}",
        router.logs()
    );
    assert_eq!(sent.load(Ordering::Relaxed), 600);
}

#[test]
fn an_apps_only_container_gets_traffic_again_as_soon_as_it_is_back() {
    let router = RouterProcess::start();
    let address = SocketAddr::from(([127, 0, 0, 1], support::free_port()));
    router.put_app(
        "restarting",
        json!({"domains": ["restarting.test"], "backends": [address.to_string()]}),
    );
    // The container is restarting: refused, and passively marked down.
    assert_eq!(router.get("restarting.test", "/").status, 502);
    let started = Instant::now();
    let _container = Backend::start_on(address, "restarted");
    let response = router.get("restarting.test", "/");
    assert_eq!(
        response.status, 200,
        "the marked backend is the only one: it is tried, not skipped for 10 s"
    );
    assert!(started.elapsed() < Duration::from_secs(2));
}

#[test]
fn active_health_checks_take_a_failing_backend_out_and_back() {
    let router = RouterProcess::start();
    let good = Backend::start("good");
    let sick = Backend::start("sick");
    router.put_app(
        "checked",
        json!({
            "domains": ["checked.test"],
            "backends": [good.addr.to_string(), sick.addr.to_string()],
            "health_check": {"path": "/health", "interval_ms": 100, "timeout_ms": 100, "unhealthy_threshold": 2, "healthy_threshold": 2}
        }),
    );
    assert_eq!(
        router.get("checked.test", "/").status,
        200,
        "the route is cached and checked from now on"
    );
    sick.set_health_status(500);
    eventually(
        Duration::from_secs(5),
        "the sick backend to be taken out",
        || (0..10).all(|_| router.get("checked.test", "/").json()["backend"] == "good"),
    );
    sick.set_health_status(200);
    eventually(Duration::from_secs(5), "the backend to come back", || {
        (0..4).any(|_| router.get("checked.test", "/").json()["backend"] == "sick")
    });
}

#[test]
fn the_access_log_has_one_json_line_per_request() {
    let router = RouterProcess::start();
    let backend = Backend::start("logged");
    router.put_app(
        "logged",
        json!({"domains": ["logged.test"], "backends": [backend.addr.to_string()]}),
    );
    for path in ["/one", "/two?q=1"] {
        assert_eq!(router.get("logged.test", path).status, 200);
    }
    assert_eq!(router.get("unknown.test", "/").status, 404);
    let mut lines = Vec::new();
    eventually(Duration::from_secs(3), "three access-log lines", || {
        lines = std::fs::read_to_string(router.access_log())
            .unwrap_or_default()
            .lines()
            .map(|l| serde_json::from_str::<serde_json::Value>(l).expect("each line is JSON"))
            .collect();
        lines.len() == 3
    });
    assert_eq!(lines[0]["app"], "logged");
    assert_eq!(lines[0]["path"], "/one");
    assert_eq!(lines[0]["status"], 200);
    assert_eq!(lines[0]["upstream"], backend.addr.to_string());
    assert!(lines[0]["upstream_ms"].as_f64().is_some());
    assert!(lines[0]["bytes_out"].as_u64().unwrap_or(0) > 0);
    assert_eq!(lines[1]["path"], "/two?q=1");
    assert_eq!(lines[2]["status"], 404);
    assert_eq!(lines[2]["app"], "");
    for field in [
        "time",
        "request_id",
        "host",
        "method",
        "duration_ms",
        "bytes_in",
    ] {
        assert!(!lines[0][field].is_null(), "{field} is logged");
    }
}

#[test]
fn metrics_count_requests_by_app_and_class_without_unknown_host_labels() {
    let router = RouterProcess::start();
    let backend = Backend::start("metered");
    router.put_app(
        "metered",
        json!({"domains": ["metered.test"], "backends": [backend.addr.to_string()]}),
    );
    for _ in 0..3 {
        router.get("metered.test", "/");
    }
    router.get("random-unknown-host.test", "/");
    let metrics = support::get(router.admin, "admin", "/metrics")
        .expect("metrics")
        .text();
    assert!(
        metrics.contains("switchyard_requests_total{app=\"metered\",class=\"2xx\"} 3"),
        "{metrics}"
    );
    assert!(
        metrics.contains("switchyard_requests_total{app=\"\",class=\"4xx\"} 1"),
        "{metrics}"
    );
    assert!(
        !metrics.contains("random-unknown-host"),
        "unknown hosts never become labels"
    );
    for name in [
        "switchyard_request_duration_seconds_bucket",
        "switchyard_route_cache_hits_total",
        "switchyard_route_cache_misses_total",
        "switchyard_route_cache_entries",
        "switchyard_active_requests",
        "switchyard_open_websockets",
    ] {
        assert!(metrics.contains(name), "{name} is exported");
    }
}

#[test]
fn a_deleted_apps_series_leave_the_metrics_within_a_batch_and_the_others_stay() {
    let router = RouterProcess::start();
    let backend = Backend::start("tenant");
    for name in ["leaving", "staying"] {
        router.put_app(
            name,
            json!({
                "domains": [format!("{name}.test")],
                "backends": [backend.addr.to_string()],
                "cache": {"paths": ["/*"]},
            }),
        );
        router.get(&format!("{name}.test"), "/");
    }
    let exported = |app: &str| {
        support::get(router.admin, "admin", "/metrics")
            .expect("metrics")
            .text()
            .contains(&format!("app=\"{app}\""))
    };
    assert!(exported("leaving") && exported("staying"));
    assert!(
        router.metric("switchyard_cache_requests_total{app=\"leaving\",result=\"MISS\"}") >= 1.0
    );
    let (status, body) = router.admin_call("DELETE", "/v1/apps/leaving", None);
    assert!(status < 300, "{status} {body}");
    // Deletions are forgotten in batches, every 30 s; counted once their series are gone.
    // Asked four times a second: a scrape every 5 ms for half a minute would load the
    // machine the other tests share.
    let deleted_at = Instant::now();
    while router.metric("switchyard_deleted_apps_forgotten_total") < 1.0 {
        assert!(
            deleted_at.elapsed() < Duration::from_secs(45),
            "the deleted app was not forgotten within 45 s"
        );
        std::thread::sleep(Duration::from_millis(250));
    }
    assert_eq!(
        router.metric("switchyard_deleted_apps_forgotten_total"),
        1.0
    );
    assert!(!exported("leaving"), "the deleted app's series left");
    assert!(exported("staying"), "the other app's series stay");
    assert_eq!(router.metric("switchyard_deleted_apps_noted"), 0.0);
}

#[test]
fn http2_clients_are_routed_by_authority() {
    let router = RouterProcess::start();
    let backend = Backend::start("h2");
    router.put_app(
        "h2",
        json!({"domains": ["h2.test"], "backends": [backend.addr.to_string()]}),
    );
    let cert = support::pki::Ca::root("Test Root").issue(&["h2.test"], -1, 30);
    router.store_cert("h2.test", &cert);
    // Prior knowledge on the plain listener, ALPN h2 on the TLS one; a request split over
    // two cookie fields reaches the HTTP/1.1 backend as one field.
    for (scheme, at, mode) in [
        ("http", router.http, "--http2-prior-knowledge"),
        ("https", router.https, "--http2"),
    ] {
        let output = std::process::Command::new("curl")
            .args(["-s", "-k", mode, "-w", "\n%{http_version} %{http_code}"])
            .args(["-H", "cookie: a=1", "-H", "cookie: b=2"])
            .args(["--connect-to", &format!("h2.test:443:{at}")])
            .args(["--connect-to", &format!("h2.test:80:{at}")])
            .arg(format!("{scheme}://h2.test/over-h2"))
            .output()
            .expect("curl (installed by scripts/test)");
        let text = String::from_utf8_lossy(&output.stdout);
        let (body, status_line) = text.rsplit_once('\n').expect("curl's status line");
        assert_eq!(status_line, "2 200", "{scheme}: {text}");
        let seen: serde_json::Value = serde_json::from_str(body).expect("backend JSON");
        assert_eq!(seen["backend"], "h2", "{scheme}");
        assert_eq!(seen["path"], "/over-h2", "{scheme}");
        let proto = if scheme == "https" { "https" } else { "http" };
        assert_eq!(seen["headers"]["x-forwarded-proto"], proto, "{scheme}");
        assert_eq!(seen["headers"]["cookie"], "a=1; b=2", "{scheme}");
    }
}

#[test]
fn malformed_requests_get_a_4xx_and_never_reach_a_backend() {
    let router = RouterProcess::start();
    let backend = Backend::start("guarded");
    router.put_app(
        "guarded",
        json!({"domains": ["guarded.test"], "backends": [backend.addr.to_string()]}),
    );
    let huge_header = format!(
        "GET / HTTP/1.1\r\nHost: guarded.test\r\nConnection: close\r\nX-Big: {}\r\n\r\n",
        "a".repeat(40_000)
    );
    let malformed = [
        "G\u{1}T / HTTP/1.1\r\nHost: guarded.test\r\n\r\n",
        "GET / HTTP/1.1\r\nHost: guarded.test\r\nBad Header Name: x\r\n\r\n",
        "GET / HTTP/1.1\r\nHost: guarded.test\r\nX-Nul: a\u{0}b\r\n\r\n",
        "GET / HTTP/1.1\r\nHost: guarded.test\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\nhello!",
        "GET / HTTP/9.9\r\nHost: guarded.test\r\n\r\n",
        huge_header.as_str(),
    ];
    for raw in malformed {
        match support::request(router.http, raw) {
            Ok(response) => assert!(
                (400..500).contains(&response.status),
                "{:?} → {}",
                &raw[..raw.len().min(60)],
                response.status
            ),
            // Closing the connection without an answer is also a refusal.
            Err(e) => assert!(
                e.kind() != std::io::ErrorKind::TimedOut,
                "{:?}: {e}",
                &raw[..raw.len().min(60)]
            ),
        }
    }
    assert_eq!(backend.requests(), 0, "no malformed request was forwarded");
    let huge = support::request(router.http, &huge_header).expect("an answer");
    assert_eq!(huge.status, 431);
    assert_eq!(
        router.get("guarded.test", "/").status,
        200,
        "the router still serves"
    );
}

/// Sends `request` on a kept-alive connection and reads one answer (with a Content-Length).
fn exchange_kept_alive(stream: &mut std::net::TcpStream, request: &str) -> String {
    use std::io::{Read, Write};
    stream.write_all(request.as_bytes()).expect("request");
    let mut received = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        let n = stream.read(&mut buf).expect("response");
        assert!(n > 0, "closed before answering");
        received.extend_from_slice(&buf[..n]);
        let text = String::from_utf8_lossy(&received);
        if let Some((head, body)) = text.split_once("\r\n\r\n") {
            let length: usize = head
                .lines()
                .find_map(|l| {
                    l.to_ascii_lowercase()
                        .strip_prefix("content-length:")
                        .map(|v| v.trim().parse().expect("length"))
                })
                .expect("a Content-Length");
            if body.len() >= length {
                return text.into_owned();
            }
        }
    }
}

#[test]
fn idle_keep_alive_connections_are_closed_after_the_idle_timeout() {
    use std::io::Read;
    let router = RouterProcess::start_with(&["--client-idle-timeout-s", "1"]);
    let backend = Backend::start("idle");
    router.put_app(
        "idle",
        json!({"domains": ["idle.test"], "backends": [backend.addr.to_string()]}),
    );
    let mut stream = std::net::TcpStream::connect(router.http).expect("connect");
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .expect("read timeout");
    // The client asks to be kept for an hour; the router's limit wins.
    let answer = exchange_kept_alive(
        &mut stream,
        "GET / HTTP/1.1\r\nHost: idle.test\r\nKeep-Alive: timeout=3600\r\n\r\n",
    );
    let answered = Instant::now();
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    let mut buf = [0u8; 4096];
    // Idle now: the router closes the connection after about a second.
    let n = stream
        .read(&mut buf)
        .expect("the router closes, not a read timeout");
    assert_eq!(n, 0, "nothing more is sent before the close");
    let idle = answered.elapsed();
    assert!(
        idle >= Duration::from_millis(900) && idle < Duration::from_secs(5),
        "closed after {idle:?} idle"
    );
}

#[test]
fn a_client_that_stops_sending_its_body_gets_408_after_the_body_timeout() {
    use std::io::{Read, Write};
    let router = RouterProcess::start_with(&["--client-body-timeout-s", "1"]);
    let backend = Backend::start("patient");
    router.put_app(
        "patient",
        json!({"domains": ["upload.test"], "backends": [backend.addr.to_string()]}),
    );
    let mut stream = std::net::TcpStream::connect(router.http).expect("connect");
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .expect("read timeout");
    stream
        .write_all(
            b"POST /upload HTTP/1.1\r\nHost: upload.test\r\nContent-Length: 1000\r\n\r\n0123456789",
        )
        .expect("request");
    let started = Instant::now();
    let mut received = Vec::new();
    // The router answers and closes; a read timeout here would mean it kept waiting.
    stream
        .read_to_end(&mut received)
        .expect("the router closes, not a read timeout");
    let waited = started.elapsed();
    let answer = String::from_utf8_lossy(&received);
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
    assert!(
        waited >= Duration::from_millis(900) && waited < Duration::from_secs(5),
        "answered after {waited:?}"
    );
    assert!(
        backend.recorded().is_empty(),
        "the backend never saw a complete request"
    );
}

#[test]
fn a_client_that_stops_reading_is_cut_off_after_the_send_timeout() {
    use std::io::{Read, Write};
    let router = RouterProcess::start_with(&["--client-send-timeout-s", "1"]);
    let backend = Backend::start("generous");
    router.put_app(
        "generous",
        json!({"domains": ["download.test"], "backends": [backend.addr.to_string()]}),
    );
    // Far more than the socket buffers between the backend, the router and this client hold,
    // so that the router has to wait for this client to read.
    const LENGTH: usize = 256 << 20;
    let mut stream = std::net::TcpStream::connect(router.http).expect("connect");
    stream
        .write_all(
            format!("GET /bytes?n={LENGTH} HTTP/1.1\r\nHost: download.test\r\n\r\n").as_bytes(),
        )
        .expect("request");
    // A client that reads nothing for three times the deadline.
    std::thread::sleep(Duration::from_secs(3));
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .expect("read timeout");
    let mut received = 0usize;
    let mut buf = vec![0u8; 1 << 16];
    let ended = loop {
        match stream.read(&mut buf) {
            Ok(0) => break "closed",
            Ok(n) => received += n,
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => break "reset",
            Err(e) => panic!("after {received} bytes: {e}"),
        }
    };
    assert!(
        received < LENGTH,
        "{received} bytes of {LENGTH} and {ended}: the router waited for the client"
    );
    eprintln!("the client got {received} bytes of {LENGTH}, then the connection was {ended}");
    assert_eq!(
        router.get("download.test", "/").status,
        200,
        "the router still serves"
    );
}

/// Sends `bytes` one at a time, `gap` apart, until the router closes the connection; returns
/// how many it took and when it closed (`None`: it never did).
fn drip(
    stream: &mut std::net::TcpStream,
    bytes: &[u8],
    gap: Duration,
) -> (usize, Option<Duration>) {
    use std::io::{Read, Write};
    let started = Instant::now();
    stream.set_read_timeout(Some(gap)).expect("read timeout");
    let mut buf = [0u8; 512];
    for (sent, byte) in bytes.iter().enumerate() {
        if stream.write_all(&[*byte]).is_err() {
            return (sent, Some(started.elapsed()));
        }
        match stream.read(&mut buf) {
            Ok(0) => return (sent + 1, Some(started.elapsed())),
            Ok(_) => panic!("an answer to a head that is not complete"),
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            Err(e) if e.kind() == std::io::ErrorKind::TimedOut => {}
            Err(_) => return (sent + 1, Some(started.elapsed())),
        }
    }
    (bytes.len(), None)
}

#[test]
fn a_request_head_must_arrive_whole_within_the_header_timeout() {
    use std::io::Read;
    let router = RouterProcess::start_with(&["--client-header-timeout-s", "2"]);
    let backend = Backend::start("heads");
    router.put_app(
        "heads",
        json!({"domains": ["heads.test"], "backends": [backend.addr.to_string()]}),
    );
    // A byte every 250 ms: each read is far within a per-read timeout, the whole head is not
    // (a 200-byte head would take 50 s).
    let head = format!(
        "GET / HTTP/1.1\r\nHost: heads.test\r\n{}\r\n",
        "X-Slow: loris\r\n".repeat(11)
    );
    let mut dripping = std::net::TcpStream::connect(router.http).expect("connect");
    let mut silent = std::net::TcpStream::connect(router.http).expect("connect");
    let silent_since = Instant::now();
    let (sent, closed_after) = drip(&mut dripping, head.as_bytes(), Duration::from_millis(250));
    let closed_after = closed_after.expect("the router closes a head that takes too long");
    assert!(sent < head.len(), "the whole head went through");
    assert!(
        closed_after >= Duration::from_millis(1800) && closed_after < Duration::from_secs(5),
        "closed after {closed_after:?} and {sent} bytes"
    );
    // Nothing at all: on the cleartext port the router first waits for bytes telling HTTP/2
    // from HTTP/1.1; that wait is part of the head's.
    silent
        .set_read_timeout(Some(Duration::from_secs(10)))
        .expect("read timeout");
    let mut buf = [0u8; 16];
    let read = silent.read(&mut buf);
    let silent_for = silent_since.elapsed();
    assert!(
        matches!(read, Ok(0)) || read.is_err() && silent_for < Duration::from_secs(9),
        "{read:?} after {silent_for:?}"
    );
    assert!(
        silent_for >= Duration::from_millis(1800) && silent_for < Duration::from_secs(5),
        "a silent connection closed after {silent_for:?}"
    );
    assert!(router.metric("switchyard_client_head_timeouts_total") >= 2.0);
    // A client sending its head at once is served.
    assert_eq!(router.get("heads.test", "/").status, 200);
}

#[test]
fn a_kept_alive_connection_gets_its_idle_time_before_the_next_head_is_due() {
    let router = RouterProcess::start_with(&[
        "--client-header-timeout-s",
        "1",
        "--client-idle-timeout-s",
        "5",
    ]);
    let backend = Backend::start("patient");
    router.put_app(
        "patient",
        json!({"domains": ["kept.test"], "backends": [backend.addr.to_string()]}),
    );
    let mut stream = std::net::TcpStream::connect(router.http).expect("connect");
    let request = "GET / HTTP/1.1\r\nHost: kept.test\r\n\r\n";
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .expect("read timeout");
    assert!(exchange_kept_alive(&mut stream, request).starts_with("HTTP/1.1 200"));
    // Longer than the header timeout, within the idle one.
    std::thread::sleep(Duration::from_secs(2));
    assert!(exchange_kept_alive(&mut stream, request).starts_with("HTTP/1.1 200"));
}

#[test]
fn a_client_that_leaves_mid_request_is_not_retried_on_another_backend() {
    use std::io::Write;
    let router = RouterProcess::start();
    let first = Backend::start("first");
    let second = Backend::start("second");
    router.put_app(
        "leaving",
        json!({"domains": ["leave.test"], "backends": [first.addr.to_string(), second.addr.to_string()]}),
    );
    let mut stream = std::net::TcpStream::connect(router.http).expect("connect");
    stream
        .write_all(b"GET /slow?ms=1000 HTTP/1.1\r\nHost: leave.test\r\n\r\n")
        .expect("request");
    eventually(
        Duration::from_secs(5),
        "a backend to get the request",
        || first.requests() + second.requests() == 1,
    );
    drop(stream);
    std::thread::sleep(Duration::from_millis(1500));
    assert_eq!(
        first.requests() + second.requests(),
        1,
        "the request went to a second backend after its client left"
    );
}

/// An app's static root answers GET and HEAD for the files under it, and only those: a
/// missing file, a symlink out of the root, `..` or another method goes to the app.
#[test]
fn files_under_the_static_root_answer_and_nothing_outside_it() {
    let router = RouterProcess::start();
    let backend = Backend::start("app");
    // Not a multiple of any read size, so the last piece is a short one.
    let big: String = (0..300_001u32)
        .map(|i| char::from(b'a' + (i % 26) as u8))
        .collect();
    let (root, _outside) = support::static_root(&big);
    std::fs::write(root.path().join("empty.txt"), "").expect("empty file");
    router.put_app(
        "site",
        json!({
            "domains": ["site.test"], "backends": [backend.addr.to_string()],
            "static_root": root.path().to_str().expect("utf-8 path"),
            "hsts": {"max_age_s": 600}
        }),
    );
    let send = |raw: String| support::request(router.http, &raw).unwrap_or_else(|e| panic!("{e}"));
    let get = |path: &str| {
        send(format!(
            "GET {path} HTTP/1.1\r\nHost: site.test\r\nConnection: close\r\n\r\n"
        ))
    };

    let css = get("/assets/site.css");
    assert_eq!((css.status, css.text().as_str()), (200, "body{}"));
    assert_eq!(css.header("content-type"), Some("text/css; charset=utf-8"));
    assert_eq!(css.header("content-length"), Some("6"));
    assert_eq!(
        css.header("x-request-id").map(str::len),
        Some(32),
        "the router's own answers carry the request id"
    );
    assert_eq!(
        css.header("strict-transport-security"),
        None,
        "not over TLS"
    );
    assert_eq!(get("/").text(), "<h1>home</h1>", "index.html");
    let empty = get("/empty.txt");
    assert_eq!((empty.status, empty.body.len()), (200, 0));
    let large = get("/big.txt");
    assert_eq!(large.status, 200);
    assert!(large.body == big.as_bytes(), "sent whole and in order");
    let head = send(
        "HEAD /assets/site.css HTTP/1.1\r\nHost: site.test\r\nConnection: close\r\n\r\n".into(),
    );
    assert_eq!((head.status, head.body.len()), (200, 0));
    assert_eq!(head.header("content-length"), Some("6"));
    assert_eq!(backend.requests(), 0, "the app was never asked");

    for path in [
        "/missing.css",
        "/leak.txt",
        "/assets/../../etc/passwd",
        "/assets",
    ] {
        let answer = get(path);
        assert_eq!(answer.status, 200, "{path}");
        assert!(
            answer.text().contains("\"backend\":\"app\""),
            "{path}: the app answers, not a file: {}",
            answer.text()
        );
    }
    let post = send(
        "POST /assets/site.css HTTP/1.1\r\nHost: site.test\r\nContent-Length: 2\r\nConnection: close\r\n\r\nhi".into(),
    );
    assert!(post.text().contains("\"backend\":\"app\""));
    assert_eq!(backend.requests(), 5);

    let cert = support::pki::Ca::root("Static Test Root").issue(&["site.test"], -1, 30);
    router.store_cert("site.test", &cert);
    let over_tls = support::tls::connect(router.https, Some("site.test"), &["http/1.1"])
        .and_then(|mut tls| tls.get("site.test", "/assets/site.css"))
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!((over_tls.status, over_tls.text().as_str()), (200, "body{}"));
    assert_eq!(
        over_tls.header("strict-transport-security"),
        Some("max-age=600")
    );
}
