//! Apps' proxy-wasm filters through the real binary: the example filters of
//! examples/filters (built by `scripts/test` with the proxy-wasm Rust SDK) uploaded with
//! the CLI, run on the request path, limited, swapped without a reload, and served by a
//! whole fleet.

use switchyard_test_support as support;

use std::path::PathBuf;
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use openssl::hash::MessageDigest;
use openssl::pkey::PKey;
use openssl::sign::Signer;
use serde_json::{json, Value};
use support::{eventually, Backend, RedisServer, RouterProcess};

fn module(name: &str) -> PathBuf {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("examples/filters/target/wasm32-unknown-unknown/release")
        .join(format!("{name}.wasm"));
    assert!(
        path.exists(),
        "{} missing: scripts/test builds the example filters",
        path.display()
    );
    path
}

/// `switchyard filters put NAME FILE` against `router`: its exit status and output.
fn filters_put(router: &RouterProcess, name: &str, file: &std::path::Path) -> (bool, String) {
    let output = Command::new(RouterProcess::binary())
        .args(["filters", "put", name])
        .arg(file)
        .args(["--admin", &router.admin.to_string()])
        .output()
        .expect("run switchyard filters put");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    (output.status.success(), text)
}

fn stored(router: &RouterProcess, name: &str, file: &str) {
    let (ok, text) = filters_put(router, name, &module(file));
    assert!(ok, "filters put {name}: {text}");
}

fn app_with(router: &RouterProcess, name: &str, domain: &str, backend: &Backend, filters: Value) {
    router.put_app(
        name,
        json!({"domains": [domain], "backends": [backend.addr.to_string()], "filters": filters}),
    );
}

#[test]
fn a_header_policy_filter_edits_both_heads_and_a_new_version_takes_over_without_a_reload() {
    let router = RouterProcess::start();
    let backend = Backend::start("site");
    stored(&router, "policy", "header_policy");
    let policy = |version: &str| {
        json!([{"name": "policy", "config": {
            "require": ["user-agent"],
            "remove_request": ["x-debug"],
            "set_response": {"x-policy": version, "x-frame-options": "DENY"},
            "remove_response": ["content-type"]
        }}])
    };
    app_with(&router, "site", "site.test", &backend, policy("v1"));
    let answer = router.send("GET", "site.test", "/a", "User-Agent: t\r\nX-Debug: 1\r\n");
    assert_eq!(answer.status, 200, "{}", answer.text());
    assert_eq!(answer.header("x-policy"), Some("v1"));
    assert_eq!(answer.header("x-frame-options"), Some("DENY"));
    assert_eq!(answer.header("content-type"), None);
    let seen = backend.recorded().pop().expect("the app got the request");
    assert!(!seen.headers.contains_key("x-debug"), "{:?}", seen.headers);
    // Without the field the policy requires, the filter answers itself.
    let refused = router.send("GET", "site.test", "/a", "");
    assert_eq!(refused.status, 400, "{}", refused.text());
    assert!(refused.text().contains("user-agent"), "{}", refused.text());
    assert_eq!(backend.requests(), 1);

    // A new configuration, then a new module under the same name: the next request has it.
    app_with(&router, "site", "site.test", &backend, policy("v2"));
    let answer = router.send("GET", "site.test", "/a", "User-Agent: t\r\n");
    assert_eq!(answer.header("x-policy"), Some("v2"));
    let pid = router.pid();
    stored(&router, "policy", "misbehave");
    app_with(
        &router,
        "site",
        "site.test",
        &backend,
        json!([{"name": "policy", "config": "echo"}]),
    );
    let answer = router.send("GET", "site.test", "/p?q=1", "User-Agent: t\r\n");
    assert_eq!(answer.status, 200, "{}", answer.text());
    assert_eq!(answer.header("x-echo-status"), Some("200"));
    // The app's answer body went through the filter whole, and out with its new length.
    assert!(answer.text().contains("\"PATH\""), "{}", answer.text());
    let seen = backend.recorded().pop().expect("the app got the request");
    assert_eq!(
        seen.headers.get("x-echo-request-path").map(String::as_str),
        Some("/p?q=1")
    );
    assert_eq!(
        seen.headers.get("x-echo-request-host").map(String::as_str),
        Some("site.test")
    );
    assert_eq!(
        seen.headers.get("x-echo-route-name").map(String::as_str),
        Some("site")
    );
    assert_eq!(router.pid(), pid, "no restart");

    // The request body reaches the filter whole and goes on as it left it.
    let body = "hello filters";
    let answer = router.send(
        "POST",
        "site.test",
        "/upload",
        &format!(
            "User-Agent: t\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        ),
    );
    assert_eq!(answer.status, 200, "{}", answer.text());
    let seen = backend.recorded().pop().expect("the app got the upload");
    assert_eq!(seen.body, body.to_ascii_uppercase().as_bytes());

    let explained = router
        .admin_call("GET", "/v1/explain?host=site.test&path=/", None)
        .1;
    let stage = (explained["stages"].as_array().into_iter().flatten())
        .find(|s| s["stage"] == "filters")
        .cloned()
        .unwrap_or(Value::Null);
    assert_eq!(stage["applies"], true, "{explained}");
    assert!(
        stage["why"].as_str().is_some_and(|w| w.contains("policy")),
        "{stage}"
    );
}

fn signed(secret: &str, path: &str, expires: u64) -> String {
    let key = PKey::hmac(secret.as_bytes()).expect("key");
    let mut signer = Signer::new(MessageDigest::sha256(), &key).expect("signer");
    signer
        .update(format!("{path}\n{expires}").as_bytes())
        .expect("update");
    let sig: String = signer
        .sign_to_vec()
        .expect("sign")
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    format!("{path}?expires={expires}&sig={sig}")
}

#[test]
fn signed_urls_are_checked_by_the_filter_and_the_app_sees_only_the_good_ones() {
    let router = RouterProcess::start();
    let backend = Backend::start("files");
    stored(&router, "signed", "signed_url");
    app_with(
        &router,
        "files",
        "files.test",
        &backend,
        json!([{"name": "signed", "config": {"secret": "s3cret", "prefix": "/private/"}}]),
    );
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("clock")
        .as_secs();
    assert_eq!(router.get("files.test", "/public/a").status, 200);
    let good = router.get("files.test", &signed("s3cret", "/private/a.pdf", now + 60));
    assert_eq!(good.status, 200, "{}", good.text());
    for (target, why) in [
        ("/private/a.pdf".to_string(), "not signed"),
        (
            signed("wrong", "/private/a.pdf", now + 60),
            "does not match",
        ),
        (signed("s3cret", "/private/a.pdf", now - 5), "expired"),
        (
            signed("s3cret", "/private/b.pdf", now + 60).replace("/b.pdf", "/a.pdf"),
            "does not match",
        ),
    ] {
        let refused = router.get("files.test", &target);
        assert_eq!(refused.status, 403, "{target}: {}", refused.text());
        assert!(refused.text().contains(why), "{target}: {}", refused.text());
    }
    assert_eq!(
        backend.requests(),
        2,
        "only the public and the well-signed request reached the app"
    );
}

#[test]
fn an_auth_filter_calls_the_auth_app_and_lets_through_only_what_it_accepts() {
    let router = RouterProcess::start();
    let backend = Backend::start("app");
    let auth = Backend::start("auth");
    router.put_app(
        "auth",
        json!({"domains": ["auth.internal"], "backends": [auth.addr.to_string()]}),
    );
    stored(&router, "auth", "auth_call");
    let calling = |path: &str| json!([{"name": "auth", "config": {"upstream": "auth", "path": path, "timeout_ms": 2000}}]);
    app_with(
        &router,
        "accepting",
        "ok.test",
        &backend,
        calling("/origin?h=x-user:alice"),
    );
    app_with(
        &router,
        "refusing",
        "no.test",
        &backend,
        calling("/origin?status=403"),
    );
    app_with(
        &router,
        "nowhere",
        "nowhere.test",
        &backend,
        json!([{"name": "auth", "config": {"upstream": "no-such-app"}}]),
    );

    let answer = router.send(
        "GET",
        "ok.test",
        "/account",
        "Authorization: Bearer t0k3n\r\n",
    );
    assert_eq!(answer.status, 200, "{}", answer.text());
    let seen = backend.recorded().pop().expect("the app got the request");
    assert_eq!(
        seen.headers.get("x-user").map(String::as_str),
        Some("alice")
    );
    let call = auth.recorded().pop().expect("the auth app was called");
    assert_eq!(
        call.headers.get("authorization").map(String::as_str),
        Some("Bearer t0k3n")
    );

    let refused = router.send(
        "GET",
        "no.test",
        "/account",
        "Authorization: Bearer bad\r\n",
    );
    assert_eq!(refused.status, 401, "{}", refused.text());
    let unreachable = router.get("nowhere.test", "/account");
    assert_eq!(unreachable.status, 503, "{}", unreachable.text());
    assert_eq!(
        backend.requests(),
        1,
        "only the accepted request reached the app"
    );
    assert!(router.metric("switchyard_filter_http_calls_total{result=\"answered\"}") >= 2.0);
    assert!(router.metric("switchyard_filter_http_calls_total{result=\"failed\"}") >= 1.0);
}

/// p99 of `samples`.
fn p99(samples: &mut [Duration]) -> Duration {
    samples.sort();
    samples[(samples.len() * 99 / 100).min(samples.len() - 1)]
}

fn latencies(router: &RouterProcess, host: &str, count: usize) -> Vec<Duration> {
    (0..count)
        .map(|_| {
            let started = Instant::now();
            let answer = router.get(host, "/");
            assert_eq!(answer.status, 200, "{host}: {}", answer.text());
            started.elapsed()
        })
        .collect()
}

#[test]
fn a_spinning_filter_is_stopped_at_its_deadline_and_never_stalls_another_app() {
    let router = Arc::new(RouterProcess::start());
    let backend = Backend::start("both");
    stored(&router, "rogue", "misbehave");
    app_with(&router, "quiet", "quiet.test", &backend, json!([]));
    app_with(
        &router,
        "rogue",
        "rogue.test",
        &backend,
        json!([{"name": "rogue", "config": "spin", "deadline_ms": 50}]),
    );
    let alone = p99(&mut latencies(&router, "quiet.test", 200));

    let spinning = Arc::new(AtomicBool::new(true));
    let rogue_answers: Vec<_> = (0..2)
        .map(|_| {
            let (router, spinning) = (router.clone(), spinning.clone());
            std::thread::spawn(move || {
                let mut statuses = Vec::new();
                while spinning.load(Ordering::Relaxed) {
                    statuses.push(router.get("rogue.test", "/").status);
                }
                statuses
            })
        })
        .collect();
    std::thread::sleep(Duration::from_millis(200));
    let beside = p99(&mut latencies(&router, "quiet.test", 200));
    spinning.store(false, Ordering::Relaxed);
    let statuses: Vec<u16> = rogue_answers
        .into_iter()
        .flat_map(|t| t.join().expect("rogue client"))
        .collect();
    eprintln!(
        "quiet app's p99 alone {alone:?}, beside a spinning filter {beside:?}; rogue requests: {}",
        statuses.len()
    );
    assert!(
        !statuses.is_empty() && statuses.iter().all(|s| *s == 500),
        "{statuses:?}"
    );
    let stopped = router.metric(
        "switchyard_filter_failures_total{app=\"rogue\",filter=\"rogue\",reason=\"deadline\"}",
    );
    assert!(
        stopped >= statuses.len() as f64,
        "{stopped} stopped for {} requests",
        statuses.len()
    );
    // Each spin holds a thread for at most a tick (1 ms) at a time: the quiet app's
    // requests run between the ticks.
    assert!(
        beside < alone + Duration::from_millis(25),
        "p99 {beside:?} beside the spinning filter, {alone:?} alone"
    );
    assert!(
        router.logs().contains("filter 'rogue' stopped (deadline)"),
        "the failure is logged"
    );
}

#[test]
fn failing_filters_fail_open_or_closed_and_bad_modules_are_refused_at_upload() {
    let router = RouterProcess::start();
    let backend = Backend::start("app");
    stored(&router, "rogue", "misbehave");
    app_with(
        &router,
        "open",
        "open.test",
        &backend,
        json!([{"name": "rogue", "config": "trap", "fail_open": true}]),
    );
    app_with(
        &router,
        "hoard",
        "hoard.test",
        &backend,
        json!([{"name": "rogue", "config": "grow", "memory_mib": 8}]),
    );
    app_with(
        &router,
        "ghost",
        "ghost.test",
        &backend,
        json!([{"name": "not-stored"}]),
    );
    assert_eq!(
        router.get("open.test", "/").status,
        200,
        "a trapping filter that fails open is skipped"
    );
    let hoard = router.get("hoard.test", "/");
    assert_eq!(hoard.status, 500, "{}", hoard.text());
    assert!(hoard.text().contains("filter failed"), "{}", hoard.text());
    assert_eq!(router.get("ghost.test", "/").status, 500);
    assert_eq!(backend.requests(), 1);
    assert!(
        router.metric(
            "switchyard_filter_failures_total{app=\"hoard\",filter=\"rogue\",reason=\"memory\"}"
        ) >= 1.0
    );
    assert!(
        router.metric(
            "switchyard_filter_failures_total{app=\"open\",filter=\"rogue\",reason=\"trap\"}"
        ) >= 1.0
    );

    let junk = tempfile::NamedTempFile::new().expect("temp file");
    std::fs::write(junk.path(), b"\0asm\x01\0\0\0garbage").expect("write");
    let (ok, text) = filters_put(&router, "junk", junk.path());
    assert!(!ok, "{text}");
    assert!(
        text.contains("module:") && text.contains("HTTP 400"),
        "{text}"
    );
    let (status, body) = router.admin_call("GET", "/v1/filters/junk", None);
    assert_eq!(status, 404, "nothing stored: {body}");
    let (status, body) = router.admin_call(
        "PUT",
        "/v1/apps/bad",
        Some(r#"{"filters": [{"name": "Bad!"}]}"#),
    );
    assert_eq!(
        (status, body["field"].as_str()),
        (400, Some("filters[0].name")),
        "{body}"
    );
}

#[test]
fn a_module_put_on_one_router_is_served_by_every_router_of_the_fleet_within_a_second() {
    let redis = RedisServer::start();
    let on_redis = ["--store", &redis.url(), "--redis-timeout-ms", "300"];
    let first = RouterProcess::start_with(&on_redis);
    let second = RouterProcess::start_with(&on_redis);
    for router in [&first, &second] {
        eventually(Duration::from_secs(10), "subscribed", || {
            router.metric("switchyard_store_subscription_connected") == 1.0
        });
    }
    let backend = Backend::start("app");
    stored(&first, "policy", "header_policy");
    app_with(
        &first,
        "site",
        "site.test",
        &backend,
        json!([{"name": "policy", "config": {"set_response": {"x-policy": "v1"}}}]),
    );
    eventually(
        Duration::from_secs(5),
        "the second router serves v1",
        || second.get("site.test", "/").header("x-policy") == Some("v1"),
    );
    // A new module under the same name, put on the first router: the second serves it.
    let started = Instant::now();
    stored(&first, "policy", "misbehave");
    let took = eventually(
        Duration::from_secs(5),
        "the second router runs the new module",
        || second.get("site.test", "/").header("x-policy").is_none(),
    );
    eprintln!(
        "a module change reached the second router in {took:?} ({:?} with the upload)",
        started.elapsed()
    );
    assert!(took < Duration::from_secs(1), "{took:?}");
    let (status, listed) = second.admin_call("GET", "/v1/filters", None);
    assert_eq!(status, 200);
    assert_eq!(listed[0]["name"], "policy", "{listed}");
}
