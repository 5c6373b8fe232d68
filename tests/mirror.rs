//! Traffic mirroring end to end: the real router, a real primary backend and a real shadow
//! backend that records what it receives, misbehaves on demand, or is down.

use switchyard_test_support as support;

use std::collections::BTreeSet;
use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use support::{Backend, Behaviour, Recorded, RouterProcess};

const WAIT: Duration = Duration::from_secs(10);

fn app_with_mirror(router: &RouterProcess, primary: &Backend, mirror: Value) {
    router.put_app(
        "shop",
        json!({"domains": ["shop.test"], "backends": [primary.addr.to_string()], "mirror": mirror}),
    );
}

/// Waits until no copy of app `shop` is in progress and `expected` copies have ended
/// (sent or dropped), so what the shadow received is final.
fn copies_settled(router: &RouterProcess, expected: f64) {
    support::eventually(WAIT, "mirror copies to finish", || {
        let ended = router.metric("switchyard_mirror_sent_total{app=\"shop\",class=\"2xx\"}")
            + router.metric("switchyard_mirror_sent_total{app=\"shop\",class=\"5xx\"}")
            + dropped(router, "in_flight_limit")
            + dropped(router, "body_limit")
            + dropped(router, "error")
            + dropped(router, "timeout")
            + dropped(router, "aborted");
        ended >= expected && router.metric("switchyard_mirror_in_flight{app=\"shop\"}") == 0.0
    });
}

fn dropped(router: &RouterProcess, reason: &str) -> f64 {
    router.metric(&format!(
        "switchyard_mirror_dropped_total{{app=\"shop\",reason=\"{reason}\"}}"
    ))
}

fn send(router: &RouterProcess, raw: &str) -> support::Response {
    let response = support::request(router.http, raw).expect("an answer from the router");
    assert_eq!(response.status, 200, "{}", response.text());
    assert!(
        response.text().contains("\"backend\":\"primary\""),
        "the primary answers: {}",
        response.text()
    );
    response
}

#[test]
fn full_mirroring_delivers_every_request_with_body_and_headers() {
    let router = RouterProcess::start();
    let primary = Backend::start("primary");
    let shadow = Backend::start("shadow");
    app_with_mirror(
        &router,
        &primary,
        json!({"backends": [shadow.addr.to_string()], "percent": 100, "max_body_bytes": 4096}),
    );

    let mut sent = Vec::new();
    for i in 0..20 {
        let body = format!("order {i} ").repeat(i + 1);
        let raw = match i % 3 {
            0 => format!(
                "GET /items?page={i} HTTP/1.1\r\nHost: shop.test\r\nX-Trace: t{i}\r\nConnection: close\r\n\r\n"
            ),
            1 => format!(
                "POST /orders?n={i} HTTP/1.1\r\nHost: shop.test\r\nX-Trace: t{i}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            ),
            _ => format!(
                "PUT /orders/{i} HTTP/1.1\r\nHost: shop.test\r\nX-Trace: t{i}\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n{:x}\r\n{body}\r\n0\r\n\r\n",
                body.len()
            ),
        };
        let response = send(&router, &raw);
        let request_id = response
            .header("x-request-id")
            .expect("request id")
            .to_string();
        let (method, target, body) = match i % 3 {
            0 => ("GET", format!("/items?page={i}"), String::new()),
            1 => ("POST", format!("/orders?n={i}"), body),
            _ => ("PUT", format!("/orders/{i}"), body),
        };
        sent.push((method, target, body, format!("t{i}"), request_id));
    }
    copies_settled(&router, 20.0);

    let received = shadow.recorded();
    assert_eq!(received.len(), 20, "every request reached the shadow once");
    for (method, target, body, trace, request_id) in &sent {
        let copy: &Recorded = received
            .iter()
            .find(|r| r.headers.get("x-trace") == Some(trace))
            .unwrap_or_else(|| panic!("no copy of {method} {target}"));
        assert_eq!(&copy.method, method);
        assert_eq!(&copy.target, target);
        assert_eq!(String::from_utf8_lossy(&copy.body), *body, "{target}");
        assert_eq!(
            copy.headers.get("host").map(String::as_str),
            Some("shop.test")
        );
        assert_eq!(
            copy.headers.get("x-mirrored-by").map(String::as_str),
            Some("switchyard")
        );
        assert_eq!(copy.headers.get("x-request-id"), Some(request_id));
        assert_eq!(
            copy.headers.get("x-forwarded-for").map(String::as_str),
            Some("127.0.0.1")
        );
    }
    assert_eq!(primary.requests(), 20);
    assert_eq!(
        router.metric("switchyard_mirror_sent_total{app=\"shop\",class=\"2xx\"}"),
        20.0
    );

    // Bodies over max_body_bytes are not mirrored, whether declared or streamed; the
    // primary gets them whole.
    let big = "x".repeat(5000);
    send(
        &router,
        &format!(
            "POST /big HTTP/1.1\r\nHost: shop.test\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{big}",
            big.len()
        ),
    );
    let chunked = send(
        &router,
        &format!(
            "POST /big-chunked HTTP/1.1\r\nHost: shop.test\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n{:x}\r\n{big}\r\n0\r\n\r\n",
            big.len()
        ),
    );
    assert!(
        chunked.text().contains("\"body_len\":5000"),
        "{}",
        chunked.text()
    );
    copies_settled(&router, 22.0);
    assert_eq!(dropped(&router, "body_limit"), 2.0);
    assert!(
        shadow
            .recorded()
            .iter()
            .all(|r| r.target != "/big" && !(r.target == "/big-chunked" && r.body.len() == 5000)),
        "no oversized body was mirrored whole"
    );
}

fn mirrored_keys(router: &RouterProcess, shadow: &Backend) -> BTreeSet<u32> {
    let before = shadow.recorded().len();
    let ended_before = router.metric("switchyard_mirror_sent_total{app=\"shop\",class=\"2xx\"}");
    for key in 1..=1000 {
        let response = router.get("shop.test", &format!("/?apikey={key}"));
        assert_eq!(response.status, 200);
    }
    support::eventually(WAIT, "copies to end", || {
        let sent = router.metric("switchyard_mirror_sent_total{app=\"shop\",class=\"2xx\"}");
        router.metric("switchyard_mirror_in_flight{app=\"shop\"}") == 0.0
            && shadow.recorded().len() - before == (sent - ended_before) as usize
    });
    assert_eq!(
        dropped(router, "in_flight_limit") + dropped(router, "error"),
        0.0
    );
    shadow.recorded()[before..]
        .iter()
        .map(|r| {
            r.target
                .strip_prefix("/?apikey=")
                .and_then(|k| k.parse().ok())
                .unwrap_or_else(|| panic!("unexpected copy {}", r.target))
        })
        .collect()
}

#[test]
fn the_split_by_key_is_consistent_across_runs_restarts_and_raises() {
    let mut router = RouterProcess::start();
    let primary = Backend::start("primary");
    let shadow = Backend::start("shadow");
    app_with_mirror(
        &router,
        &primary,
        json!({"backends": [shadow.addr.to_string()], "percent": 50, "key": "query:apikey"}),
    );
    let first = mirrored_keys(&router, &shadow);
    assert!(
        (400..=600).contains(&first.len()),
        "about half of the keys: {}",
        first.len()
    );
    assert_eq!(
        mirrored_keys(&router, &shadow),
        first,
        "same keys on a second run"
    );

    router.terminate();
    router.restart();
    assert_eq!(
        mirrored_keys(&router, &shadow),
        first,
        "same keys after a restart"
    );

    // Raised to 70% with the CLI: every key mirrored at 50% still is, and more join.
    let admin = router.admin.to_string();
    let shadow_addr = shadow.addr.to_string();
    let output = Command::new(RouterProcess::binary())
        .args(["apps", "--admin", &admin, "mirror", "shop", "--backend"])
        .args([
            shadow_addr.as_str(),
            "--percent",
            "70",
            "--key",
            "query:apikey",
        ])
        .output()
        .expect("run the CLI");
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let (_, app) = router.admin_call("GET", "/v1/apps/shop", None);
    assert_eq!(app["mirror"]["percent"], json!(70.0));
    assert_eq!(
        app["backends"][0]["address"],
        json!(primary.addr.to_string()),
        "the CLI kept the rest of the app"
    );
    let raised = mirrored_keys(&router, &shadow);
    assert!(raised.is_superset(&first), "raising only adds keys");
    assert!(
        raised.len() > first.len() + 100,
        "{} → {}",
        first.len(),
        raised.len()
    );
}

#[test]
fn a_slow_mirror_never_slows_the_primary_and_the_in_flight_cap_holds() {
    let router = RouterProcess::start();
    let primary = Backend::start("primary");
    let shadow = Backend::start("shadow");
    shadow.set_behaviour(Behaviour::Delay(Duration::from_secs(1)));
    app_with_mirror(
        &router,
        &primary,
        json!({"backends": [shadow.addr.to_string()], "max_in_flight": 4, "timeout_ms": 3000}),
    );

    let started = Instant::now();
    let mut slowest = Duration::ZERO;
    for i in 0..60 {
        let request_started = Instant::now();
        send(
            &router,
            &format!(
                "POST /pay HTTP/1.1\r\nHost: shop.test\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{:02}",
                i
            ),
        );
        slowest = slowest.max(request_started.elapsed());
    }
    // Had any request waited for its 1 s copy, this would be far above half a second.
    assert!(
        slowest < Duration::from_millis(500),
        "slowest primary answer {slowest:?}"
    );
    let elapsed = started.elapsed();

    copies_settled(&router, 60.0);
    assert!(
        shadow.max_concurrent() <= 4,
        "the shadow saw {} copies at once",
        shadow.max_concurrent()
    );
    let delivered = router.metric("switchyard_mirror_sent_total{app=\"shop\",class=\"2xx\"}");
    let shed = dropped(&router, "in_flight_limit");
    assert_eq!(delivered + shed, 60.0);
    assert!(
        shed > 0.0,
        "60 requests in {elapsed:?} against 4 slots of 1 s"
    );
    assert!(delivered >= 4.0, "copies were delivered: {delivered}");
}

#[test]
fn a_failing_resetting_or_absent_mirror_changes_nothing_for_clients() {
    let router = RouterProcess::start();
    let primary = Backend::start("primary");
    let shadow = Backend::start("shadow");
    app_with_mirror(
        &router,
        &primary,
        json!({"backends": [shadow.addr.to_string()], "timeout_ms": 1000}),
    );
    let post = "POST /orders HTTP/1.1\r\nHost: shop.test\r\nContent-Length: 5\r\nConnection: close\r\n\r\nhello";
    let get = "GET /orders HTTP/1.1\r\nHost: shop.test\r\nConnection: close\r\n\r\n";

    shadow.set_behaviour(Behaviour::Status(500));
    for _ in 0..10 {
        send(&router, post);
        send(&router, get);
    }
    copies_settled(&router, 20.0);
    assert_eq!(
        router.metric("switchyard_mirror_sent_total{app=\"shop\",class=\"5xx\"}"),
        20.0,
        "the shadow's errors are counted, not passed on"
    );

    shadow.set_behaviour(Behaviour::Reset);
    for _ in 0..10 {
        send(&router, post);
        send(&router, get);
    }
    copies_settled(&router, 40.0);
    assert_eq!(
        dropped(&router, "error"),
        20.0,
        "resets are counted as errors"
    );

    shadow.stop();
    for _ in 0..10 {
        send(&router, post);
        send(&router, get);
    }
    copies_settled(&router, 60.0);
    assert_eq!(dropped(&router, "error"), 40.0, "refused connections too");
    assert_eq!(primary.requests(), 60);

    // A shadow that accepts and never answers: copies time out, clients do not notice.
    let silent = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    app_with_mirror(
        &router,
        &primary,
        json!({"backends": [silent.local_addr().expect("addr").to_string()], "timeout_ms": 300}),
    );
    for _ in 0..5 {
        send(&router, get);
    }
    copies_settled(&router, 65.0);
    assert_eq!(dropped(&router, "timeout"), 5.0);
}

#[test]
fn mirror_options_are_validated_field_by_field() {
    let router = RouterProcess::start();
    for (mirror, field) in [
        (json!({"backends": []}), "mirror.backends"),
        (
            json!({"backends": ["127.0.0.1:9"], "percent": 150}),
            "mirror.percent",
        ),
        (
            json!({"backends": ["127.0.0.1:9"], "key": "body:x"}),
            "mirror.key",
        ),
        (
            json!({"backends": ["127.0.0.1:9"], "paths": ["no-slash"]}),
            "mirror.paths[0]",
        ),
    ] {
        let body = json!({"domains": ["shop.test"], "mirror": mirror}).to_string();
        let (status, error) = router.admin_call("PUT", "/v1/apps/shop", Some(&body));
        assert_eq!(status, 400, "{error}");
        assert_eq!(error["field"], json!(field), "{error}");
    }
    let (status, _) = router.admin_call("GET", "/v1/apps/shop", None);
    assert_eq!(status, 404, "nothing was stored");
}

#[test]
fn copies_can_go_to_a_shadow_over_tls() {
    let router = RouterProcess::start();
    let primary = Backend::start("primary");
    let ca = support::pki::Ca::root("Shadow Test CA");
    let shadow = support::tls::TlsBackend::start(&ca.issue(&["shadow.test"], -1, 30));
    // The test CA is not in the system's trust store: with verification on, no copy goes out.
    app_with_mirror(
        &router,
        &primary,
        json!({"backends": [shadow.addr.to_string()], "tls": true, "sni": "shadow.test"}),
    );
    send(
        &router,
        "GET /verified HTTP/1.1\r\nHost: shop.test\r\nConnection: close\r\n\r\n",
    );
    copies_settled(&router, 1.0);
    assert_eq!(
        dropped(&router, "error"),
        1.0,
        "an untrusted shadow gets nothing"
    );
    assert!(shadow.recorded().is_empty());

    app_with_mirror(
        &router,
        &primary,
        json!({"backends": [shadow.addr.to_string()], "tls": true, "sni": "shadow.test",
               "verify_tls": false}),
    );
    send(
        &router,
        "POST /tls HTTP/1.1\r\nHost: shop.test\r\nContent-Length: 4\r\nConnection: close\r\n\r\nbody",
    );
    copies_settled(&router, 2.0);
    let received = shadow.recorded();
    assert_eq!(received.len(), 1, "{received:?}");
    assert_eq!(received[0].sni.as_deref(), Some("shadow.test"));
    assert_eq!(
        (received[0].method.as_str(), received[0].target.as_str()),
        ("POST", "/tls")
    );
    assert_eq!(received[0].body, b"body");
}
