//! The per-app switches platform teams expect, through the real binary: redirects,
//! maintenance and error pages, header rules, password protection, and the forwarding
//! fields every backend gets (queue time, port, Via) and the PROXY protocol for those that
//! read it.

use switchyard_test_support as support;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde_json::{json, Value};
use support::{free_port, Backend, RouterProcess};

const HTML: &str = "Accept: text/html,application/xhtml+xml,*/*;q=0.8\r\n";

#[test]
fn redirects_move_hosts_and_prefixes_before_the_app_and_leave_challenges_alone() {
    let router = RouterProcess::start();
    let backend = Backend::start("site");
    router.put_app(
        "site",
        json!({
            "domains": ["example.test", "www.example.test"],
            "backends": [backend.addr.to_string()],
            "redirects": [
                {"host": "www.example.test", "to": "https://example.test", "status": 301},
                {"path_prefix": "/old", "to": "/new", "status": 308},
                {"path_prefix": "/docs/", "to": "https://docs.example.org/v2/", "status": 302}
            ]
        }),
    );
    for (host, path, status, location) in [
        (
            "www.example.test",
            "/cart?id=7",
            301,
            "https://example.test/cart?id=7",
        ),
        ("example.test", "/old/a/b?x=1", 308, "/new/a/b?x=1"),
        ("example.test", "/old", 308, "/new"),
        (
            "example.test",
            "/docs/api",
            302,
            "https://docs.example.org/v2/api",
        ),
    ] {
        let response = router.send("GET", host, path, "");
        assert_eq!(response.status, status, "{host}{path}: {}", response.text());
        assert_eq!(response.header("location"), Some(location), "{host}{path}");
    }
    // A path only starting like the prefix, and the apex, go to the app.
    assert_eq!(router.get("example.test", "/older").status, 200);
    assert_eq!(backend.requests(), 1, "redirects never reached the app");
    // The app (or the fleet's issuer) must be able to answer HTTP-01 for the moved host.
    let challenge = router.get("www.example.test", "/.well-known/acme-challenge/tok3n");
    assert_eq!(challenge.status, 200, "{}", challenge.text());
    assert_eq!(
        challenge.json()["path"],
        "/.well-known/acme-challenge/tok3n"
    );
    let stage = explained_stage(&router, "www.example.test", "/cart", "redirects");
    assert_eq!(stage["applies"], true, "{stage}");
    assert!(stage["why"]
        .as_str()
        .is_some_and(|w| w.contains("https://example.test/cart")));
}

/// What `explain` says of `stage` for a request to `host` and `path` (null when absent).
fn explained_stage(router: &RouterProcess, host: &str, path: &str, stage: &str) -> Value {
    let explained = router
        .admin_call("GET", &format!("/v1/explain?host={host}&path={path}"), None)
        .1;
    explained["stages"]
        .as_array()
        .and_then(|stages| stages.iter().find(|s| s["stage"] == stage))
        .cloned()
        .unwrap_or(Value::Null)
}

#[test]
fn maintenance_answers_503_with_the_page_to_browsers_and_text_to_the_rest() {
    let router = RouterProcess::start();
    let backend = Backend::start("shop");
    let page = "<!doctype html><h1>Back in a few minutes</h1>";
    let spec = |enabled: bool| {
        json!({
            "domains": ["shop.test"],
            "backends": [backend.addr.to_string()],
            "maintenance": {"enabled": enabled, "page_html": page, "retry_after_s": 300}
        })
    };
    router.put_app("shop", spec(true));
    let browser = router.send("GET", "shop.test", "/", HTML);
    assert_eq!(browser.status, 503);
    assert_eq!(browser.text(), page);
    assert_eq!(
        browser.header("content-type"),
        Some("text/html; charset=utf-8")
    );
    assert_eq!(browser.header("retry-after"), Some("300"));
    assert_eq!(browser.header("cache-control"), Some("no-store"));
    let api = router.send(
        "POST",
        "shop.test",
        "/api/orders",
        "Accept: application/json\r\n",
    );
    assert_eq!(api.status, 503);
    assert!(api.text().contains("under maintenance"), "{}", api.text());
    assert!(api
        .header("content-type")
        .is_some_and(|t| t.starts_with("text/plain")));
    let head = router.send("HEAD", "shop.test", "/", HTML);
    assert_eq!(head.status, 503);
    assert!(head
        .header("content-type")
        .is_some_and(|t| t.starts_with("text/plain")));
    assert_eq!(backend.requests(), 0, "the backends are left alone");

    router.put_app("shop", spec(false));
    assert_eq!(router.send("GET", "shop.test", "/", HTML).status, 200);
    assert_eq!(backend.requests(), 1);
}

#[test]
fn a_maintenance_page_given_by_url_is_fetched_once_when_the_app_is_written() {
    let router = RouterProcess::start();
    let backend = Backend::start("shop");
    let status_host = Backend::start("status");
    let html = "h=Content-Type:text%2Fhtml%3B%20charset%3Dutf-8";
    let spec = |url: String| {
        json!({
            "domains": ["shop.test"],
            "backends": [backend.addr.to_string()],
            "maintenance": {"enabled": true, "page_url": url}
        })
    };
    // Through a redirect, as status pages often are.
    let moved = format!(
        "http://{}/origin?status=302&h=Location:%2Forigin%3Fh%3DContent-Type%3Atext%252Fhtml",
        status_host.addr
    );
    let stored = router.put_app("shop", spec(moved.clone()));
    assert_eq!(stored["maintenance"]["page_url"], moved.as_str());
    assert_eq!(stored["maintenance"]["page_html"], "origin 2", "{stored}");
    assert_eq!(status_host.requests(), 2, "the redirect and the page, once");
    for _ in 0..3 {
        let browser = router.send("GET", "shop.test", "/", HTML);
        assert_eq!(browser.status, 503);
        assert_eq!(browser.text(), "origin 2");
    }
    assert_eq!(status_host.requests(), 2, "answers never fetch the page");
    assert_eq!(backend.requests(), 0);
    // Written again, the page is fetched anew.
    let direct = format!("http://{}/origin?{html}", status_host.addr);
    let stored = router.put_app("shop", spec(direct));
    assert_eq!(stored["maintenance"]["page_html"], "origin 3");

    // What cannot be the page refuses the write and keeps the app as it was.
    let closed = format!("http://127.0.0.1:{}/down.html", free_port());
    for url in [
        format!("http://{}/origin", status_host.addr),
        format!("http://{}/origin?status=404&{html}", status_host.addr),
        closed,
    ] {
        let (status, error) =
            router.admin_call("PUT", "/v1/apps/shop", Some(&spec(url.clone()).to_string()));
        assert_eq!(status, 400, "{url}: {error}");
        assert_eq!(error["field"], "maintenance.page_url", "{url}: {error}");
    }
    assert_eq!(
        router.send("GET", "shop.test", "/", HTML).text(),
        "origin 3"
    );
}

#[test]
fn error_pages_replace_the_routers_own_answers_never_the_apps() {
    let router = RouterProcess::start();
    let failing = Backend::start("failing");
    failing.set_behaviour(support::Behaviour::Status(502));
    let page = "<h1>Something broke, we are on it</h1>";
    let nowhere = format!("127.0.0.1:{}", free_port());
    for (name, backend) in [("gone", nowhere), ("failing", failing.addr.to_string())] {
        router.put_app(
            name,
            json!({
                "domains": [format!("{name}.test")],
                "backends": [backend],
                "retries": 0,
                "error_pages": {"502": page, "504": "<h1>slow</h1>"}
            }),
        );
    }
    let browser = router.send("GET", "gone.test", "/", HTML);
    assert_eq!(browser.status, 502);
    assert_eq!(browser.text(), page);
    assert_eq!(
        browser.header("content-type"),
        Some("text/html; charset=utf-8")
    );
    let api = router.send("GET", "gone.test", "/", "");
    assert_eq!(api.status, 502);
    assert!(
        api.text().contains("request id"),
        "the router's text: {}",
        api.text()
    );
    let apps_own = router.send("GET", "failing.test", "/", HTML);
    assert_eq!(apps_own.status, 502);
    assert_ne!(apps_own.text(), page, "an answer the app sent is its own");
}

#[test]
fn header_rules_edit_requests_and_every_answer_cached_ones_included() {
    let router = RouterProcess::start();
    let backend = Backend::start("web");
    router.put_app(
        "web",
        json!({
            "domains": ["web.test"],
            "backends": [backend.addr.to_string()],
            "cache": {"paths": ["/cached/*"]},
            "limits": {"max_body_bytes": 10},
            "headers": {
                "request": {"set": {"X-Tenant": "web"}, "append": {"X-Tags": "edge"}, "remove": ["X-Debug"]},
                "response": {
                    "set": {"X-Frame-Options": "DENY", "Strict-Transport-Security-Report-Only": "1"},
                    "remove": ["Set-Cookie"]
                }
            }
        }),
    );
    let response = router.send(
        "GET",
        "web.test",
        "/plain?cookie=session=1",
        "X-Debug: 1\r\nX-Tenant: spoofed\r\n",
    );
    assert_eq!(response.status, 200);
    let seen = response.json()["headers"].clone();
    assert_eq!(seen["x-tenant"], "web", "set replaces the client's");
    assert_eq!(seen["x-tags"], "edge");
    assert!(seen.get("x-debug").is_none(), "{seen}");
    assert!(
        seen.get("x-request-id").is_some(),
        "the router's own fields stay"
    );
    assert_eq!(response.header("x-frame-options"), Some("DENY"));
    assert_eq!(response.header("set-cookie"), None);
    assert!(response.header("x-request-id").is_some());

    let first = router.get("web.test", "/cached/a?cc=max-age=60");
    let second = router.get("web.test", "/cached/a?cc=max-age=60");
    assert_eq!(
        second.header("x-cache"),
        Some("HIT"),
        "{:?}",
        second.headers
    );
    for answer in [&first, &second] {
        assert_eq!(answer.header("x-frame-options"), Some("DENY"));
    }
    // The router's own answers for the app carry them too.
    let too_large = router.send("POST", "web.test", "/upload", "Content-Length: 100\r\n");
    assert_eq!(too_large.status, 413, "{}", too_large.text());
    assert_eq!(too_large.header("x-frame-options"), Some("DENY"));

    let (status, error) = router.admin_call(
        "PUT",
        "/v1/apps/web",
        Some(&json!({"headers": {"response": {"remove": ["X-Request-Id"]}}}).to_string()),
    );
    assert_eq!(status, 400, "{error}");
    assert_eq!(error["field"], "headers.response.remove[0]", "{error}");
}

#[test]
fn every_backend_is_told_when_the_request_came_on_which_port_and_through_what() {
    let router = RouterProcess::start();
    let backend = Backend::start("apm");
    for (name, host) in [("plain", false), ("hosted", true)] {
        router.put_app(
            name,
            json!({
                "domains": [format!("{name}.test")],
                "backends": [backend.addr.to_string()],
                "forwarding": {"x_forwarded_host": host}
            }),
        );
    }
    let before = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("clock")
        .as_micros();
    let seen = router
        .send(
            "GET",
            "plain.test",
            "/",
            "Via: 1.0 cdn.example\r\nX-Request-Start: t=1\r\n",
        )
        .json()["headers"]
        .clone();
    let after = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("clock")
        .as_micros();
    let start: u128 = seen["x-request-start"]
        .as_str()
        .and_then(|v| v.strip_prefix("t="))
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("X-Request-Start: {seen}"));
    assert!(
        (before..=after).contains(&start),
        "{before} <= {start} <= {after}"
    );
    assert_eq!(seen["x-forwarded-port"], router.http.port().to_string());
    // The test backend keeps the last of repeated fields: the router's Via follows the CDN's.
    assert_eq!(seen["via"], "1.1 switchyard");
    assert!(
        seen.get("x-forwarded-host").is_none(),
        "not asked for: {seen}"
    );
    let hosted = router.get("hosted.test", "/").json()["headers"].clone();
    assert_eq!(hosted["x-forwarded-host"], "hosted.test");
}

/// Two requests on one keep-alive connection to the router, the second closing it: what
/// each answer said, and the port the connection came from.
fn two_on_one_connection(router: &RouterProcess, host: &str) -> (Vec<String>, u16) {
    let mut stream = TcpStream::connect(router.http).expect("connect to the router");
    stream
        .set_read_timeout(Some(Duration::from_secs(15)))
        .expect("timeout");
    let port = stream.local_addr().expect("local address").port();
    let raw = format!(
        "GET /a HTTP/1.1\r\nHost: {host}\r\n\r\nGET /b HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n"
    );
    stream.write_all(raw.as_bytes()).expect("send");
    let mut answers = Vec::new();
    stream.read_to_end(&mut answers).expect("read the answers");
    let text = String::from_utf8_lossy(&answers);
    // Each answer's body is one line of addresses after its head.
    let bodies = text
        .split("HTTP/1.1 ")
        .skip(1)
        .map(|answer| {
            let (head, body) = answer.split_once("\r\n\r\n").unwrap_or((answer, ""));
            assert!(head.starts_with("200"), "{text}");
            body.trim().to_string()
        })
        .collect();
    (bodies, port)
}

#[test]
fn the_proxy_protocol_names_each_client_to_a_backend_that_reads_it() {
    let router = RouterProcess::start();
    let echo = support::ProxyProtocolEcho::start();
    let check =
        json!({"path": "/health", "interval_ms": 200, "timeout_ms": 150, "unhealthy_threshold": 1});
    for (name, version) in [("v2", json!(2)), ("v1", json!(1)), ("none", Value::Null)] {
        router.put_app(
            name,
            json!({
                "domains": [format!("{name}.test")],
                "backends": [echo.addr.to_string()],
                "health_check": check,
                "forwarding": {"proxy_protocol": version}
            }),
        );
    }
    router.put_app(
        "cached",
        json!({
            "domains": ["cached.test"],
            "backends": [echo.addr.to_string()],
            "cache": {"store": "memory", "paths": ["/*"]},
            "forwarding": {"proxy_protocol": 2}
        }),
    );
    let router_end = format!("127.0.0.1 {}", router.http.port());
    let opened = "switchyard_backend_connections_opened_total";
    for host in ["v2.test", "v1.test"] {
        let before = router.metric(opened);
        let (first, first_port) = two_on_one_connection(&router, host);
        let told = format!("127.0.0.1 {first_port} {router_end}");
        assert_eq!(
            first,
            [told.clone(), told],
            "{host}: HAProxy was told the client"
        );
        // Another client's requests never ride the first's connection, idle as it is.
        let (second, second_port) = two_on_one_connection(&router, host);
        let told = format!("127.0.0.1 {second_port} {router_end}");
        assert_eq!(second, [told.clone(), told], "{host}");
        assert_eq!(
            router.metric(opened) - before,
            2.0,
            "{host}: one backend connection for each client connection, kept for its second request"
        );
    }
    // Without the header HAProxy drops the connection: the router answers 502.
    assert_eq!(router.get("none.test", "/").status, 502);
    // The health checks of an app that speaks the protocol open with its "local" header, so
    // HAProxy answers them; the same checks without one are refused and mark it down (an app
    // is checked once requested).
    let down = |app: &str| {
        router.metric(&format!(
            "switchyard_health_transitions_total{{app=\"{app}\",state=\"down\"}}"
        ))
    };
    support::eventually(
        Duration::from_secs(10),
        "the check without a header fails",
        || down("none") >= 1.0,
    );
    // Checked since before the unheadered app was, and twice more after its fall.
    std::thread::sleep(Duration::from_millis(450));
    assert_eq!(down("v2") + down("v1"), 0.0, "{}", router.logs());
    assert_eq!(router.get("v2.test", "/").status, 200);
    // A background revalidation is the router's own request: its "local" header leaves
    // HAProxy the connection's own addresses (its own port as `dst`), where a client's
    // request named the router's.
    let first = router.get("cached.test", "/page");
    assert_eq!(first.header("x-cache"), Some("MISS"));
    assert!(first.text().ends_with(&router_end), "{}", first.text());
    std::thread::sleep(Duration::from_millis(1100));
    assert_eq!(
        router.get("cached.test", "/page").header("x-cache"),
        Some("STALE")
    );
    let own_end = format!("127.0.0.1 {}", echo.addr.port());
    support::eventually(
        Duration::from_secs(5),
        "the copy refreshed by the router",
        || {
            let answer = router.get("cached.test", "/page");
            answer.header("x-cache") == Some("HIT") && answer.text().ends_with(&own_end)
        },
    );
    let stage = explained_stage(&router, "v2.test", "/", "forwarding");
    assert!(
        stage["why"]
            .as_str()
            .is_some_and(|why| why.contains("PROXY protocol v2")),
        "{stage}"
    );
}

/// A bcrypt hash as `htpasswd -nbB -C 5` makes it (the `$2y$` variant).
fn htpasswd(password: &str) -> String {
    bcrypt::hash_with_result(password, 5)
        .expect("bcrypt")
        .format_for_version(bcrypt::Version::TwoY)
}

fn basic(user: &str, password: &str) -> String {
    let token = openssl::base64::encode_block(format!("{user}:{password}").as_bytes());
    format!("Authorization: Basic {token}\r\n")
}

/// Requests to password-protected apps with `result`, as the router counts them.
fn auth_checks(router: &RouterProcess, result: &str) -> f64 {
    router.metric(&format!(
        "switchyard_basic_auth_checks_total{{result=\"{result}\"}}"
    ))
}

#[test]
fn a_password_protects_the_app_but_its_open_paths_and_failures_lock_a_client_out() {
    let router = RouterProcess::start();
    let backend = Backend::start("staging");
    router.put_app(
        "staging",
        json!({
            "domains": ["staging.test"],
            "backends": [backend.addr.to_string()],
            "basic_auth": {
                "realm": "Staging",
                "users": {"alice": htpasswd("correct horse"), "bob": htpasswd("battery")},
                "open_paths": ["/health"]
            }
        }),
    );
    let anonymous = router.get("staging.test", "/");
    assert_eq!(anonymous.status, 401);
    assert_eq!(
        anonymous.header("www-authenticate"),
        Some("Basic realm=\"Staging\", charset=\"UTF-8\"")
    );
    assert_eq!(router.get("staging.test", "/health").status, 200, "open");
    assert_eq!(backend.requests(), 1);

    let alice = basic("alice", "correct horse");
    assert_eq!(router.send("GET", "staging.test", "/", &alice).status, 200);
    let verified = auth_checks(&router, "verified");
    assert_eq!(verified, 1.0);
    assert_eq!(
        router.send("GET", "staging.test", "/again", &alice).status,
        200
    );
    assert_eq!(
        auth_checks(&router, "cached"),
        1.0,
        "a second request costs no bcrypt"
    );
    let wrong = router.send("GET", "staging.test", "/", &basic("bob", "staple"));
    assert_eq!(wrong.status, 401);
    assert!(wrong.header("www-authenticate").is_some());

    // Nine more failures make ten in the window: the client is locked out, even with the
    // right password, and the backend never sees the attempts.
    for _ in 0..9 {
        let failed = router.send("GET", "staging.test", "/", &basic("mallory", "guess"));
        assert_eq!(failed.status, 401);
    }
    let locked = router.send("GET", "staging.test", "/", &basic("bob", "battery"));
    assert_eq!(locked.status, 429, "{}", locked.text());
    let wait: u64 = locked
        .header("retry-after")
        .and_then(|v| v.parse().ok())
        .expect("Retry-After");
    assert!((1..=60).contains(&wait));
    assert_eq!(backend.requests(), 3, "the open path and alice's two");
}

#[test]
fn a_burst_with_the_same_new_credentials_costs_one_check() {
    let router = RouterProcess::start();
    let backend = Backend::start("review");
    // Cost 12: a check of some 200 ms, long enough for the burst to arrive during it.
    let hash = bcrypt::hash_with_result("page of assets", 12)
        .expect("bcrypt")
        .format_for_version(bcrypt::Version::TwoY);
    router.put_app(
        "review",
        json!({
            "domains": ["review.test"],
            "backends": [backend.addr.to_string()],
            "basic_auth": {"users": {"carol": hash}}
        }),
    );
    let carol = basic("carol", "page of assets");
    let burst = 8;
    std::thread::scope(|scope| {
        let requests: Vec<_> = (0..burst)
            .map(|i| {
                let (router, carol) = (&router, &carol);
                scope
                    .spawn(move || router.send("GET", "review.test", &format!("/asset/{i}"), carol))
            })
            .collect();
        for request in requests {
            assert_eq!(request.join().expect("a request").status, 200);
        }
    });
    let result = |name: &str| auth_checks(&router, name);
    assert_eq!(result("verified"), 1.0, "one bcrypt for the burst");
    assert!(result("shared") >= 1.0, "the burst waited for it");
    assert_eq!(result("shared") + result("cached"), f64::from(burst - 1));
    assert_eq!(
        router.metric("switchyard_basic_auth_checks_under_way"),
        0.0,
        "the check left with the request that began it"
    );
    // Wrong credentials are refused to every request of a burst that shares their check.
    let wrong = basic("carol", "not it");
    std::thread::scope(|scope| {
        for _ in 0..3 {
            scope.spawn(|| {
                assert_eq!(router.send("GET", "review.test", "/", &wrong).status, 401);
            });
        }
    });
    assert_eq!(result("verified"), 1.0);
    assert_eq!(backend.requests(), burst as usize);
}

/// One request on a kept-alive connection: its answer's status, the body read by its
/// Content-Length.
fn exchange_on(stream: &mut TcpStream, host: &str, fields: &str) -> u16 {
    let raw = format!("GET / HTTP/1.1\r\nHost: {host}\r\n{fields}\r\n");
    stream.write_all(raw.as_bytes()).expect("send");
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        stream.read_exact(&mut byte).expect("an answer's head");
        head.push(byte[0]);
    }
    let head = String::from_utf8_lossy(&head).to_ascii_lowercase();
    let length: usize = (head.lines())
        .find_map(|line| line.strip_prefix("content-length:"))
        .and_then(|value| value.trim().parse().ok())
        .expect("a length");
    let mut body = vec![0; length];
    stream.read_exact(&mut body).expect("the body");
    head[9..12].parse().expect("a status")
}

#[test]
fn credentials_that_passed_on_a_connection_pass_again_until_the_app_changes() {
    let router = RouterProcess::start();
    let backend = Backend::start("staging");
    let app = |users: Value| {
        json!({
            "domains": ["kept.test"],
            "backends": [backend.addr.to_string()],
            "basic_auth": {"users": users}
        })
    };
    router.put_app("kept", app(json!({"alice": htpasswd("correct horse")})));
    let mut stream = TcpStream::connect(router.http).expect("connect to the router");
    stream
        .set_read_timeout(Some(Duration::from_secs(15)))
        .expect("timeout");
    let alice = basic("alice", "correct horse");
    assert_eq!(exchange_on(&mut stream, "kept.test", &alice), 200);
    for _ in 0..3 {
        assert_eq!(exchange_on(&mut stream, "kept.test", &alice), 200);
    }
    let result = |name: &str| auth_checks(&router, name);
    assert_eq!((result("verified"), result("cached")), (1.0, 3.0));
    let wrong = basic("alice", "staple");
    assert_eq!(
        exchange_on(&mut stream, "kept.test", &wrong),
        401,
        "another field"
    );
    assert_eq!(exchange_on(&mut stream, "kept.test", &alice), 200);
    // Alice leaves the app: the connection's note is for the app as it was.
    router.put_app("kept", app(json!({"bob": htpasswd("battery")})));
    support::eventually(Duration::from_secs(10), "alice is refused", || {
        exchange_on(&mut stream, "kept.test", &alice) == 401
    });
    assert_eq!(
        exchange_on(&mut stream, "kept.test", &basic("bob", "battery")),
        200
    );
}

#[test]
fn bad_switches_are_refused_naming_the_field() {
    let router = RouterProcess::start();
    for (spec, field) in [
        (
            json!({"domains": ["a.test"], "redirects": [{"host": "b.test", "to": "https://a.test"}]}),
            "redirects[0].host",
        ),
        (
            json!({"redirects": [{"path_prefix": "/a", "to": "https://a.test", "status": 303}]}),
            "redirects[0].status",
        ),
        (
            json!({"maintenance": {"enabled": "yes"}}),
            "maintenance.enabled",
        ),
        (
            json!({"maintenance": {"page_url": "file:///etc/passwd"}}),
            "maintenance.page_url",
        ),
        (
            json!({"error_pages": {"500": "<p>x</p>"}}),
            "error_pages.500",
        ),
        (
            json!({"headers": {"request": {"set": {"X-A": "a\u{7f}b"}}}}),
            "headers.request.set.X-A",
        ),
        (
            json!({"basic_auth": {"users": {"alice": "plaintext"}}}),
            "basic_auth.users.alice",
        ),
        (
            json!({"forwarding": {"x_forwarded_host": 1}}),
            "forwarding.x_forwarded_host",
        ),
        (
            json!({"forwarding": {"proxy_protocol": 3}}),
            "forwarding.proxy_protocol",
        ),
        (json!({"advertise_http3": "no"}), "advertise_http3"),
    ] {
        let (status, error) = router.admin_call("PUT", "/v1/apps/bad", Some(&spec.to_string()));
        assert_eq!(status, 400, "{spec}: {error}");
        assert_eq!(error["field"], field, "{spec}: {error}");
    }
}

/// The `name=value` of an answer's `Set-Cookie`, for cookie `name`.
fn affinity_cookie(response: &support::Response, name: &str) -> Option<String> {
    cookie_pairs(response)
        .into_iter()
        .find(|pair| pair.starts_with(&format!("{name}=")))
}

/// Every `Set-Cookie` pair of an answer, `name=value`, sorted.
fn cookie_pairs(response: &support::Response) -> Vec<String> {
    let mut pairs: Vec<String> = response
        .headers
        .iter()
        .filter(|(field, _)| field.eq_ignore_ascii_case("set-cookie"))
        .map(|(_, value)| value.split(';').next().unwrap_or_default().to_string())
        .collect();
    pairs.sort();
    pairs
}

#[test]
fn the_sticky_cookie_joins_the_apps_own_cookies_whether_or_not_its_fields_are_a_map() {
    let router = RouterProcess::start();
    let backend = Backend::start("one");
    // One app whose answer goes on as read, one whose cache makes it a map.
    router.put_app(
        "plain",
        json!({
            "domains": ["plain.test"],
            "backends": [backend.addr.to_string()],
            "affinity": {"cookie": "sticky"},
            "headers": {"response": {"set": {"x-frame-options": "DENY"}}}
        }),
    );
    router.put_app(
        "mapped",
        json!({
            "domains": ["mapped.test"],
            "backends": [backend.addr.to_string()],
            "affinity": {"cookie": "sticky"},
            "cache": {"paths": ["/never/*"]},
            "headers": {"response": {"set": {"x-frame-options": "DENY"}}}
        }),
    );
    for host in ["plain.test", "mapped.test"] {
        support::eventually(Duration::from_secs(10), "a cookie is set", || {
            affinity_cookie(&router.get(host, "/"), "sticky").is_some()
        });
        let answer = router.get(host, "/?cookie=theme=dark");
        let pairs = cookie_pairs(&answer);
        assert_eq!(pairs.len(), 2, "{host}: {pairs:?}");
        assert_eq!(
            pairs[1], "theme=dark",
            "{host}: the app's own cookie is kept: {pairs:?}"
        );
        assert!(pairs[0].starts_with("sticky="), "{host}: {pairs:?}");
        // A client the cookie already sends home gets the app's cookie alone.
        let home = format!("Cookie: {}\r\n", pairs[0]);
        let again = router.send("GET", host, "/?cookie=theme=light", &home);
        assert_eq!(cookie_pairs(&again), ["theme=light"], "{host}");
    }
    for host in ["plain.test", "mapped.test"] {
        assert_eq!(
            router.get(host, "/").header("x-frame-options"),
            Some("DENY")
        );
    }
}

fn served_by(response: &support::Response) -> String {
    response.json()["backend"]
        .as_str()
        .unwrap_or_default()
        .to_string()
}

#[test]
fn sticky_sessions_hold_a_client_to_its_backend_until_it_leaves_across_a_fleet() {
    let redis = support::RedisServer::start();
    let routers: Vec<RouterProcess> = (0..2)
        // A generous Redis deadline: a write timed out under the suite's load (the default
        // 500 ms is a production router's) would fail the PUT, not the feature.
        .map(|_| {
            RouterProcess::start_with(&["--store", &redis.url(), "--redis-timeout-ms", "2000"])
        })
        .collect();
    let backends: Vec<Backend> = ["one", "two", "three"].map(Backend::start).into();
    let spec = |backends: &[&Backend]| {
        json!({
            "domains": ["sticky.test"],
            "backends": backends.iter().map(|b| b.addr.to_string()).collect::<Vec<_>>(),
            "affinity": {"cookie": "sticky", "ttl_s": 3600}
        })
    };
    routers[0].put_app("sticky", spec(&[&backends[0], &backends[1]]));
    // Each router reads the fleet's key from the store as it starts: until then it balances
    // and sets no cookie.
    support::eventually(Duration::from_secs(10), "both routers set cookies", || {
        routers
            .iter()
            .all(|r| affinity_cookie(&r.get("sticky.test", "/"), "sticky").is_some())
    });

    let first = routers[0].get("sticky.test", "/");
    let cookie = affinity_cookie(&first, "sticky").expect("a first answer sets the cookie");
    let set = first
        .headers
        .iter()
        .find(|(f, _)| f.eq_ignore_ascii_case("set-cookie"));
    let attributes = set.map(|(_, v)| v.as_str()).unwrap_or_default();
    assert!(
        attributes.contains("HttpOnly") && attributes.contains("Max-Age=3600"),
        "{attributes}"
    );
    let home = served_by(&first);
    assert!(
        !cookie.contains("127.0.0.1"),
        "the token names no address: {cookie}"
    );
    let with_cookie = format!("Cookie: theme=dark; {cookie}\r\n");
    // Both routers of the fleet send the client home, and set no new cookie.
    for router in &routers {
        for _ in 0..6 {
            let answer = router.send("GET", "sticky.test", "/", &with_cookie);
            assert_eq!(served_by(&answer), home);
            assert_eq!(affinity_cookie(&answer, "sticky"), None);
        }
    }
    // A WebSocket with the cookie goes home too.
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    let reply = runtime.block_on(async {
        use futures_util::{SinkExt, StreamExt};
        use tokio_tungstenite::tungstenite::client::IntoClientRequest;
        let url = format!("ws://sticky.test:{}/chat", routers[1].http.port());
        let mut request = url.into_client_request().expect("request");
        let value = cookie.parse().expect("cookie value");
        request.headers_mut().insert("cookie", value);
        let stream = tokio::net::TcpStream::connect(routers[1].http)
            .await
            .expect("connect");
        let (mut socket, _) = tokio_tungstenite::client_async(request, stream)
            .await
            .expect("WebSocket through the router");
        socket
            .send(tokio_tungstenite::tungstenite::Message::text("hi"))
            .await
            .expect("send");
        let reply = socket.next().await.expect("reply").expect("frame");
        reply.into_text().expect("text").to_string()
    });
    assert_eq!(reply, format!("{home}:hi"));

    // Scaling out moves nobody.
    routers[0].put_app("sticky", spec(&[&backends[0], &backends[1], &backends[2]]));
    support::eventually(
        Duration::from_secs(5),
        "the third backend takes traffic",
        || routers[1].get("sticky.test", "/").json()["backend"] == "three",
    );
    for router in &routers {
        let answer = router.send("GET", "sticky.test", "/", &with_cookie);
        assert_eq!(served_by(&answer), home, "scaling out moved a session");
    }

    // The home backend leaves the app: the client is re-balanced and gets a new cookie.
    let others: Vec<&Backend> = backends.iter().filter(|b| b.name() != home).collect();
    routers[0].put_app("sticky", spec(&others));
    support::eventually(
        Duration::from_secs(5),
        "the removal reaches both routers",
        || {
            routers
                .iter()
                .all(|r| served_by(&r.send("GET", "sticky.test", "/", &with_cookie)) != home)
        },
    );
    let moved = routers[1].send("GET", "sticky.test", "/", &with_cookie);
    let new_cookie = affinity_cookie(&moved, "sticky").expect("a new cookie");
    assert_ne!(new_cookie, cookie);
    let new_home = served_by(&moved);
    let again = routers[0].send(
        "GET",
        "sticky.test",
        "/",
        &format!("Cookie: {new_cookie}\r\n"),
    );
    assert_eq!(served_by(&again), new_home);
    assert!(routers[0].metric("switchyard_affinity_total{result=\"kept\"}") >= 6.0);
    assert!(routers[1].metric("switchyard_affinity_total{result=\"moved\"}") >= 1.0);
}

/// The body of an answer decoded by its `Content-Encoding` (as it is when it has none).
fn decoded(response: &support::Response) -> Vec<u8> {
    use std::io::Read;
    let mut out = Vec::new();
    match response.header("content-encoding") {
        Some("gzip") => {
            flate2::read::GzDecoder::new(&response.body[..])
                .read_to_end(&mut out)
                .expect("gzip");
        }
        Some("br") => {
            brotli::Decompressor::new(&response.body[..], 4096)
                .read_to_end(&mut out)
                .expect("brotli");
        }
        Some("zstd") => out = zstd::stream::decode_all(&response.body[..]).expect("zstd"),
        _ => out = response.body.clone(),
    }
    out
}

#[test]
fn answers_are_compressed_as_the_client_prefers_streamed_and_cached_once_per_coding() {
    let router = RouterProcess::start();
    let backend = Backend::start("texts");
    router.put_app(
        "texts",
        json!({
            "domains": ["texts.test"],
            "backends": [backend.addr.to_string()],
            "cache": {"paths": ["/cached/*"]},
            "compress": {"min_bytes": 200}
        }),
    );
    // A JSON answer of some 3 KB: the app's echo of a long field.
    let pad = format!("X-Pad: {}\r\n", "abc ".repeat(700));
    let plain = router.send("GET", "texts.test", "/a", &pad);
    assert_eq!(
        plain.header("content-encoding"),
        None,
        "no Accept-Encoding, no coding"
    );
    assert_eq!(plain.header("vary"), Some("Accept-Encoding"));
    let text = plain.body.clone();
    assert!(text.len() > 2800, "{}", text.len());
    for (accept, coding) in [
        ("gzip, deflate", "gzip"),
        ("gzip, deflate, br", "br"),
        ("gzip, deflate, br, zstd", "zstd"),
        ("zstd;q=0.5, gzip", "gzip"),
    ] {
        let answer = router.send(
            "GET",
            "texts.test",
            "/a",
            &format!("{pad}Accept-Encoding: {accept}\r\n"),
        );
        assert_eq!(answer.status, 200);
        assert_eq!(answer.header("content-encoding"), Some(coding), "{accept}");
        assert_eq!(answer.header("content-length"), None, "streamed: {accept}");
        assert!(
            answer.body.len() * 4 < text.len(),
            "{accept}: {} bytes",
            answer.body.len()
        );
        let body: Value = serde_json::from_slice(&decoded(&answer)).expect("JSON once decoded");
        assert_eq!(
            body["headers"]["accept-encoding"], coding,
            "the app is told the one coding"
        );
    }
    // A stream is compressed as it comes, and whole once decoded.
    let stream = router.send(
        "GET",
        "texts.test",
        "/stream?chunks=20&interval_ms=5",
        "Accept-Encoding: gzip\r\n",
    );
    assert_eq!(stream.header("content-encoding"), Some("gzip"));
    let lines = String::from_utf8(decoded(&stream)).expect("text");
    assert_eq!(lines.lines().count(), 20, "{lines}");
    // Never twice, never against no-transform, never a small answer.
    let encoded = router.send(
        "GET",
        "texts.test",
        "/origin?h=Content-Encoding:gzip&h=Content-Type:text/html",
        "Accept-Encoding: br\r\n",
    );
    assert_eq!(encoded.header("content-encoding"), Some("gzip"));
    assert!(
        encoded.text().starts_with("origin "),
        "{:?}",
        encoded.text()
    );
    let kept = router.send(
        "GET",
        "texts.test",
        "/b?cc=no-transform",
        &format!("{pad}Accept-Encoding: gzip\r\n"),
    );
    assert_eq!(kept.header("content-encoding"), None);
    let small = router.send("GET", "texts.test", "/health", "Accept-Encoding: gzip\r\n");
    assert_eq!(small.header("content-encoding"), None);

    // The cache keeps one copy per coding, each served as stored.
    let cached = |accept: &str| {
        let extra = format!("{pad}Accept-Encoding: {accept}\r\n");
        router.send("GET", "texts.test", "/cached/page?cc=max-age=60", &extra)
    };
    let first_gzip = cached("gzip");
    assert_eq!(first_gzip.header("x-cache"), Some("MISS"));
    let second_gzip = cached("deflate, gzip");
    assert_eq!(
        second_gzip.header("x-cache"),
        Some("HIT"),
        "{:?}",
        second_gzip.headers
    );
    assert_eq!(second_gzip.header("content-encoding"), Some("gzip"));
    assert!(
        decoded(&second_gzip) == decoded(&first_gzip),
        "the stored copy"
    );
    let first_br = cached("br");
    assert_eq!(
        first_br.header("x-cache"),
        Some("MISS"),
        "another coding, another copy"
    );
    let second_br = cached("br");
    assert_eq!(second_br.header("x-cache"), Some("HIT"));
    assert_eq!(second_br.header("content-encoding"), Some("br"));
    assert!(decoded(&second_br) == decoded(&first_br), "the stored copy");
    let identity = cached("identity");
    assert_eq!(
        identity.header("x-cache"),
        Some("MISS"),
        "and one uncompressed"
    );
    assert_eq!(identity.header("content-encoding"), None);
    let stored: Value = serde_json::from_slice(&cached("").body).expect("plain JSON");
    assert!(
        stored["headers"].get("accept-encoding").is_none(),
        "{}",
        stored["headers"]
    );
    assert!(router.metric("switchyard_compress_total{result=\"gzip\"}") >= 3.0);
    assert_eq!(
        router.metric("switchyard_compress_streams"),
        0.0,
        "every place given back"
    );
}

/// An answer's fields as a multiset, less those that differ between two requests (and the
/// cache's verdict).
fn comparable_fields(response: &support::Response) -> Vec<(String, String)> {
    let mut fields: Vec<_> = (response.headers.iter())
        .map(|(name, value)| (name.to_ascii_lowercase(), value.clone()))
        .filter(|(name, _)| {
            !["date", "x-request-id", "x-served", "x-cache"].contains(&name.as_str())
        })
        .collect();
    fields.sort();
    fields
}

/// The fields the echoing backend saw, less those that name the request or its host.
fn fields_seen(response: &support::Response) -> Value {
    let mut body: Value = serde_json::from_slice(&decoded(response)).expect("the echo's JSON");
    let seen = body["headers"].as_object_mut().expect("the echo's fields");
    seen.retain(|name, _| {
        !(name == "host" || name.starts_with("x-request-") || name.starts_with("x-forwarded-"))
    });
    body["headers"].take()
}

#[test]
fn compression_and_header_rules_edit_fields_as_read_as_they_edit_a_map() {
    let router = RouterProcess::start();
    let backend = Backend::start("edits");
    let rules = json!({
        "request": {
            "set": {"X-Tenant": "web"},
            "append": {"X-Tags": "edge"},
            "remove": ["X-Debug"]
        },
        "response": {
            "set": {"X-Frame-Options": "DENY"},
            "append": {"Vary": "Origin"},
            "remove": ["Set-Cookie"]
        }
    });
    // The same settings; the second app's cache (on paths never asked for) makes both
    // sides of its requests maps, the first's go on as read.
    for (name, cache) in [
        ("asread", None),
        ("mapped", Some(json!({"paths": ["/never/*"]}))),
    ] {
        let mut app = json!({
            "domains": [format!("{name}.test")],
            "backends": [backend.addr.to_string()],
            "compress": {"min_bytes": 200},
            "headers": rules,
        });
        if let Some(cache) = cache {
            app["cache"] = cache;
        }
        router.put_app(name, app);
    }
    let pad = format!("X-Pad: {}\r\n", "abc ".repeat(100));
    let asks = [
        (
            "/a?vary=Cookie&cookie=s%3D1",
            format!("{pad}Accept-Encoding: gzip, br\r\nX-Debug: 1\r\nX-Tenant: spoofed\r\n"),
        ),
        (
            "/b?cc=no-transform",
            format!("{pad}Accept-Encoding: gzip\r\n"),
        ),
        ("/c", format!("{pad}X-Tags: client\r\n")),
        ("/health", "Accept-Encoding: zstd\r\n".to_string()),
        (
            "/origin?h=Content-Type:text/html&h=Content-Encoding:gzip",
            "Accept-Encoding: br\r\n".to_string(),
        ),
    ];
    for (path, extra) in &asks {
        let as_read = router.send("GET", "asread.test", path, extra);
        let mapped = router.send("GET", "mapped.test", path, extra);
        assert_eq!(as_read.status, 200, "{path}: {}", as_read.text());
        assert_eq!(as_read.status, mapped.status, "{path}");
        // The origin's body counts the requests it answered: its length differs.
        let fields = |answer: &support::Response| {
            let mut fields = comparable_fields(answer);
            fields.retain(|(name, _)| !(path.starts_with("/origin") && name == "content-length"));
            fields
        };
        assert_eq!(
            fields(&as_read),
            fields(&mapped),
            "{path}: the answers' fields"
        );
        assert_eq!(as_read.header("x-frame-options"), Some("DENY"), "{path}");
        assert!(as_read.header("set-cookie").is_none(), "{path}");
        match *path {
            "/health" => assert!(as_read.body == mapped.body && as_read.body == b"health"),
            _ if path.starts_with("/origin") => assert!(as_read.text().starts_with("origin ")),
            // The echo, decoded: what the app was sent.
            _ => assert_eq!(
                fields_seen(&as_read),
                fields_seen(&mapped),
                "{path}: the app's"
            ),
        }
    }
    // What both said, checked on its own.
    let first = router.send("GET", "asread.test", asks[0].0, &asks[0].1);
    assert_eq!(first.header("content-encoding"), Some("br"));
    assert_eq!(first.header("content-length"), None, "streamed");
    let vary: Vec<_> = (first.headers.iter())
        .filter(|(name, _)| name.eq_ignore_ascii_case("vary"))
        .map(|(_, value)| value.as_str())
        .collect();
    assert_eq!(vary, ["Cookie", "Accept-Encoding", "Origin"]);
    let seen = fields_seen(&first);
    assert_eq!(
        seen["accept-encoding"], "br",
        "the app is told the one coding"
    );
    assert_eq!(seen["x-tenant"], "web", "set replaces the client's");
    assert!(seen.get("x-debug").is_none(), "{seen}");
    let third = router.send("GET", "asread.test", asks[2].0, &asks[2].1);
    let seen = fields_seen(&third);
    assert!(
        seen.get("accept-encoding").is_none(),
        "no coding offered: {seen}"
    );
    assert_eq!(seen["x-tags"], "edge", "appended after the client's");
    let kept = router.send("GET", "asread.test", asks[1].0, &asks[1].1);
    assert_eq!(kept.header("content-encoding"), None, "no-transform");
    assert!(kept.header("content-length").is_some());
    let small = router.send("GET", "asread.test", asks[3].0, &asks[3].1);
    assert_eq!(small.header("content-encoding"), None, "under min_bytes");
}
