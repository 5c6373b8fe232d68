//! The WAF end to end: the real router with libmodsecurity and Debian's OWASP Core Rule Set,
//! in front of a real backend that records what reaches it.

use switchyard_test_support as support;

use std::sync::Arc;
use std::time::Duration;

use serde_json::{json, Value};
use support::{eventually, Backend, Behaviour, RedisServer, RouterProcess};

fn protect(router: &RouterProcess, backend: &Backend, waf: Value) {
    router.put_app(
        "shop",
        json!({"domains": ["shop.test"], "backends": [backend.addr.to_string()], "waf": waf}),
    );
}

fn send(router: &RouterProcess, raw_head: &str, body: &str) -> support::Response {
    let request = format!(
        "{raw_head}Host: shop.test\r\nUser-Agent: Mozilla/5.0 (X11; Linux x86_64) Firefox/120.0\r\n\
         Accept: */*\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    support::request(router.http, &request)
        .unwrap_or_else(|e| panic!("{raw_head}: {e}\n{}", router.logs()))
}

fn get(router: &RouterProcess, target: &str, extra_headers: &str) -> support::Response {
    send(
        router,
        &format!("GET {target} HTTP/1.1\r\n{extra_headers}"),
        "",
    )
}

fn post(router: &RouterProcess, target: &str, content_type: &str, body: &str) -> support::Response {
    send(
        router,
        &format!("POST {target} HTTP/1.1\r\nContent-Type: {content_type}\r\n"),
        body,
    )
}

const FORM: &str = "application/x-www-form-urlencoded";

#[test]
fn block_mode_stops_attack_probes_and_lets_ordinary_requests_through() {
    let router = RouterProcess::start();
    let backend = Backend::start("shop");
    protect(&router, &backend, json!({"mode": "block"}));

    // Ordinary traffic: pages with queries, a form post, a JSON API call — all reach the app,
    // bodies intact.
    assert_eq!(get(&router, "/products?page=2&sort=price", "").status, 200);
    assert_eq!(
        get(&router, "/", "Cookie: session=abc123; theme=dark\r\n").status,
        200
    );
    let form = post(
        &router,
        "/contact",
        FORM,
        "name=Ada+Lovelace&message=Hello%2C+world",
    );
    assert_eq!(form.status, 200, "{}", form.text());
    let api_body = r#"{"name": "Ada", "tags": ["a", "b"], "quantity": 3}"#;
    let api = post(&router, "/api/orders", "application/json", api_body);
    assert_eq!(api.status, 200, "{}", api.text());
    let recorded = backend.recorded();
    assert_eq!(recorded.len(), 4);
    assert_eq!(
        recorded[3].body,
        api_body.as_bytes(),
        "the inspected body is forwarded whole"
    );
    let big_body = format!("data={}", "x".repeat(100_000));
    assert_eq!(post(&router, "/upload", FORM, &big_body).status, 200);
    assert_eq!(
        backend.recorded()[4].body,
        big_body.as_bytes(),
        "a spooled body is forwarded whole"
    );

    // Probes in the query, a header, a form body, a JSON body and the path: 403, never the app.
    let probes: Vec<(&str, support::Response)> = vec![
        (
            "sqli in query",
            get(&router, "/products?id=1%27%20OR%20%271%27=%271", ""),
        ),
        (
            "xss in query",
            get(&router, "/search?q=%3Cscript%3Ealert(1)%3C/script%3E", ""),
        ),
        (
            "xss in header",
            get(
                &router,
                "/",
                "Referer: <script>alert(document.cookie)</script>\r\n",
            ),
        ),
        (
            "shell in form",
            post(&router, "/contact", FORM, "name=x&cmd=%3Bcat%20/etc/passwd"),
        ),
        (
            "sqli in json",
            post(
                &router,
                "/api",
                "application/json",
                r#"{"q": "1' OR '1'='1"}"#,
            ),
        ),
        (
            "path traversal",
            get(&router, "/files?name=../../../../etc/passwd", ""),
        ),
    ];
    for (probe, response) in &probes {
        assert_eq!(response.status, 403, "{probe}: {}", response.text());
        let id = response.header("x-request-id").unwrap_or("none");
        assert!(
            response.text().contains(id),
            "{probe}: the body names the request id"
        );
    }
    assert_eq!(backend.requests(), 5, "no probe reached the app");
    assert_eq!(
        router.metric("switchyard_waf_requests_total{app=\"shop\",result=\"blocked\"}"),
        probes.len() as f64
    );
    let logs = router.logs();
    assert!(logs.contains("WAF rule 942100 matched"), "{logs}");
    assert!(logs.contains("app shop"), "{logs}");
}

/// A form of about `size` bytes whose attack, if any, comes last.
fn large_form(size: usize, attack: bool) -> String {
    let mut form = format!("comment={}", "lorem+ipsum+dolor+".repeat(size / 18));
    if attack {
        form.push_str("&cmd=%3Bcat%20/etc/passwd");
    }
    form
}

fn post_chunked(router: &RouterProcess, body: &str) -> support::Response {
    let chunks: String = body
        .as_bytes()
        .chunks(10_000)
        .map(|c| format!("{:x}\r\n{}\r\n", c.len(), String::from_utf8_lossy(c)))
        .collect();
    let request = format!(
        "POST /upload HTTP/1.1\r\nHost: shop.test\r\nUser-Agent: Mozilla/5.0 Firefox/120.0\r\n\
         Accept: */*\r\nContent-Type: {FORM}\r\nTransfer-Encoding: chunked\r\n\
         Connection: close\r\n\r\n{chunks}0\r\n\r\n"
    );
    support::request(router.http, &request).unwrap_or_else(|e| panic!("chunked: {e}"))
}

#[test]
fn large_and_chunked_bodies_are_spooled_inspected_whole_and_forwarded_whole() {
    let router = RouterProcess::start();
    let backend = Backend::start("shop");
    protect(
        &router,
        &backend,
        // A generous deadline: a missed one would pass the body uninspected (on_overload open).
        json!({"mode": "block", "max_body_bytes": 300_000, "timeout_ms": 30_000}),
    );

    // Past the 64 KiB kept in memory: spooled, inspected, then forwarded byte for byte.
    let benign = large_form(200_000, false);
    assert_eq!(post(&router, "/upload", FORM, &benign).status, 200);
    let benign_chunked = large_form(150_000, false);
    assert_eq!(post_chunked(&router, &benign_chunked).status, 200);
    let recorded = backend.recorded();
    assert_eq!(recorded.len(), 2);
    assert_eq!(recorded[0].body, benign.as_bytes());
    assert_eq!(recorded[1].body, benign_chunked.as_bytes());

    // An attack at the end of a large body, declared or chunked: 403, and the app never gets
    // the body.
    for (how, response) in [
        (
            "declared",
            post(&router, "/upload", FORM, &large_form(200_000, true)),
        ),
        ("chunked", post_chunked(&router, &large_form(150_000, true))),
    ] {
        assert_eq!(response.status, 403, "{how}: {}", response.text());
        let id = response.header("x-request-id").unwrap_or("none");
        assert!(response.text().contains(id), "{how}: {}", response.text());
    }
    // An attack in the URL of a large upload is refused on the headers alone.
    let early = send(
        &router,
        "POST /upload?id=1%27%20OR%20%271%27=%271 HTTP/1.1\r\nContent-Type: text/plain\r\n",
        &"x".repeat(100_000),
    );
    assert_eq!(early.status, 403, "{}", early.text());
    assert_eq!(
        backend.recorded().len(),
        2,
        "no refused body reached the app"
    );

    // Past max_body_bytes the rest streams on uninspected (ProcessPartial), and is counted.
    let partial = large_form(400_000, true);
    assert_eq!(post(&router, "/upload", FORM, &partial).status, 200);
    assert_eq!(backend.recorded()[2].body, partial.as_bytes());
    assert_eq!(
        router.metric("switchyard_waf_body_uninspected_total{app=\"shop\"}"),
        1.0
    );
    assert_eq!(
        router.metric("switchyard_waf_requests_total{app=\"shop\",result=\"blocked\"}"),
        3.0
    );
    // Spool files are unlinked as they are made, and their disk is given back.
    assert_eq!(router.metric("switchyard_waf_spool_bytes"), 0.0);
    let spool_dir = router.data_dir().join("waf-spool");
    let left: Vec<_> = std::fs::read_dir(&spool_dir)
        .unwrap_or_else(|e| panic!("{}: {e}", spool_dir.display()))
        .collect();
    assert!(left.is_empty(), "{left:?}");
}

#[test]
fn a_full_spool_follows_the_apps_overload_policy() {
    use std::io::{Read, Write};
    let router = RouterProcess::start_with(&["--waf-spool-mb", "1"]);
    let backend = Backend::start("shop");
    // The WAF's own spool serves apps that stream their bodies: one read whole first is
    // inspected in the request spool's file (tests below).
    router.put_app(
        "shop",
        json!({"domains": ["shop.test"], "backends": [backend.addr.to_string()],
               "request_buffering": false,
               // A generous deadline: this is about room in the spool, not time (the CRS
               // takes about a second for 800 KB here, more on a busy machine).
               "waf": {"mode": "block", "on_overload": "closed", "max_body_bytes": 900_000,
                       "timeout_ms": 30_000}}),
    );
    // A slow upload holds 700 KB of the 1 MiB spool...
    let body = large_form(800_000, false);
    let mut slow = std::net::TcpStream::connect(router.http).expect("connect");
    write!(
        slow,
        "POST /upload HTTP/1.1\r\nHost: shop.test\r\nUser-Agent: Mozilla/5.0 Firefox/120.0\r\n\
         Accept: */*\r\nContent-Type: {FORM}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    )
    .expect("head");
    slow.write_all(&body.as_bytes()[..700_000])
        .expect("first part");
    support::eventually(std::time::Duration::from_secs(10), "700 KB spooled", || {
        router.metric("switchyard_waf_spool_bytes") >= 700_000.0
    });
    // ... so another one has no room: this app fails closed.
    let refused = post(&router, "/upload", FORM, &body);
    assert_eq!(refused.status, 503, "{}", refused.text());
    assert_eq!(
        router.metric("switchyard_waf_requests_total{app=\"shop\",result=\"overload_refused\"}"),
        1.0
    );
    // The slow one finishes, inspected, and its room is given back.
    slow.write_all(&body.as_bytes()[700_000..]).expect("rest");
    let mut answer = String::new();
    slow.read_to_string(&mut answer).expect("answer");
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    assert_eq!(backend.recorded().len(), 1);
    assert_eq!(backend.recorded()[0].body, body.as_bytes());
    assert_eq!(router.metric("switchyard_waf_spool_bytes"), 0.0);
    assert_eq!(
        router.metric("switchyard_waf_spool_budget_bytes"),
        1_048_576.0
    );
}

/// A small body is read whole for its inspection: a retry (an idempotent PUT whose first
/// backend resets the connection) must still send all of it.
#[test]
fn a_body_read_for_inspection_goes_whole_to_the_backend_a_retry_picks() {
    let router = RouterProcess::start();
    let (failing, healthy) = (Backend::start("failing"), Backend::start("healthy"));
    failing.set_behaviour(Behaviour::Reset);
    router.put_app(
        "shop",
        json!({"domains": ["shop.test"], "retries": 1,
               "backends": [failing.addr.to_string(), healthy.addr.to_string()],
               // Detect: the CRS refuses PUT by policy; the body is read and inspected the same.
               "waf": {"mode": "detect", "timeout_ms": 30_000}}),
    );
    let bodies: Vec<String> = (0..4)
        .map(|n| format!("item={n}&note={}", "lorem+ipsum+".repeat(300)))
        .collect();
    for body in &bodies {
        let response = send(
            &router,
            &format!("PUT /cart HTTP/1.1\r\nContent-Type: {FORM}\r\n"),
            body,
        );
        assert_eq!(response.status, 200, "{}", response.text());
    }
    let recorded: Vec<Vec<u8>> = healthy.recorded().into_iter().map(|r| r.body).collect();
    let sent: Vec<Vec<u8>> = bodies.iter().map(|b| b.as_bytes().to_vec()).collect();
    assert_eq!(recorded, sent);
    assert!(router.metric("switchyard_upstream_retries_total") >= 1.0);
}

#[test]
fn detect_mode_logs_matches_and_lets_them_through() {
    let router = RouterProcess::start();
    let backend = Backend::start("shop");
    protect(
        &router,
        &backend,
        json!({"mode": "detect", "paranoia": 2, "timeout_ms": 30_000}),
    );
    let probe = get(&router, "/products?id=1%27%20OR%20%271%27=%271", "");
    assert_eq!(probe.status, 200);
    assert_eq!(backend.requests(), 1);
    // A spooled body too: inspected, logged, and sent on whole.
    let large = large_form(100_000, true);
    assert_eq!(post(&router, "/upload", FORM, &large).status, 200);
    assert_eq!(backend.recorded()[1].body, large.as_bytes());
    assert_eq!(
        router.metric("switchyard_waf_requests_total{app=\"shop\",result=\"matched\"}"),
        2.0
    );
    let logs = router.logs();
    assert!(logs.contains("WAF rule 942100 matched"), "{logs}");
    assert!(logs.contains("WAF rule 932100 matched"), "{logs}");
}

/// Many concurrent inspections of large bodies on one worker with a queue of one and a short
/// deadline: most cannot be inspected in time.
/// Each answer's status and `Retry-After`.
fn overload(router: &Arc<RouterProcess>, host: &str) -> Vec<(u16, Option<String>)> {
    let body = format!("comment={}", "lorem ipsum dolor sit amet ".repeat(2_000));
    let request = format!(
        "POST /comments HTTP/1.1\r\nHost: {host}\r\nContent-Type: {FORM}\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    let clients: Vec<_> = (0..40)
        .map(|_| {
            let (router, request) = (router.clone(), request.clone());
            std::thread::spawn(move || {
                support::request(router.http, &request)
                    .map(|r| (r.status, r.header("retry-after").map(str::to_string)))
                    .unwrap_or_else(|e| panic!("{e}\n{}", router.logs()))
            })
        })
        .collect();
    clients
        .into_iter()
        .map(|c| c.join().expect("client"))
        .collect()
}

#[test]
fn an_overloaded_pool_fails_open_or_closed_as_configured() {
    let args = ["--pool-threads", "1", "--pool-queue", "1"];
    let router = Arc::new(RouterProcess::start_with(&args));
    let (strict, lenient) = (Backend::start("strict"), Backend::start("lenient"));
    for (name, backend, policy) in [("strict", &strict, "closed"), ("lenient", &lenient, "open")] {
        router.put_app(
            name,
            json!({
                "domains": [format!("{name}.test")], "backends": [backend.addr.to_string()],
                "waf": {"mode": "block", "timeout_ms": 5, "on_overload": policy}
            }),
        );
    }

    let answers = overload(&router, "strict.test");
    assert!(
        answers
            .iter()
            .all(|(status, retry_after)| *status != 503 || retry_after.as_deref() == Some("1")),
        "a busy pool's 503 asks the client to come back: {answers:?}"
    );
    let statuses: Vec<u16> = answers.iter().map(|(status, _)| *status).collect();
    let refused = statuses.iter().filter(|&&s| s == 503).count();
    assert!(refused > 0, "{statuses:?}");
    assert!(
        statuses.iter().all(|&s| s == 200 || s == 503),
        "{statuses:?}"
    );
    assert_eq!(
        strict.requests(),
        statuses.len() - refused,
        "refused ones never reached it"
    );

    let statuses: Vec<u16> = overload(&router, "lenient.test")
        .into_iter()
        .map(|(status, _)| status)
        .collect();
    assert!(statuses.iter().all(|&s| s == 200), "{statuses:?}");
    assert_eq!(lenient.requests(), statuses.len());
    let passed =
        router.metric("switchyard_waf_requests_total{app=\"lenient\",result=\"overload_passed\"}");
    assert!(passed > 0.0, "some passed uninspected");
    let pool_refusals = router
        .metric("switchyard_pool_rejected_total{reason=\"queue_full\",stage=\"waf\"}")
        + router
            .metric("switchyard_pool_rejected_total{reason=\"would_miss_deadline\",stage=\"waf\"}")
        + router.metric("switchyard_pool_timeouts_total{stage=\"waf\"}");
    assert!(
        pool_refusals >= passed + refused as f64,
        "every overload is counted by the pool"
    );
}

#[test]
fn without_the_rule_set_protected_apps_follow_their_overload_policy() {
    let router = RouterProcess::start_with(&["--waf", "off"]);
    let backend = Backend::start("shop");
    protect(
        &router,
        &backend,
        json!({"mode": "block", "on_overload": "closed"}),
    );
    assert_eq!(get(&router, "/", "").status, 503);
    router.put_app(
        "blog",
        json!({
            "domains": ["blog.test"], "backends": [backend.addr.to_string()],
            "waf": {"mode": "block", "on_overload": "open"}
        }),
    );
    let probe = router.get("blog.test", "/posts?id=1%27%20OR%20%271%27=%271");
    assert_eq!(probe.status, 200, "passed uninspected");
    assert!(router.logs().contains("--waf off"), "{}", router.logs());
    let (status, error) = router.admin_call("POST", "/v1/waf/reload", None);
    assert_eq!(
        (status, error["field"].as_str()),
        (409, Some("waf")),
        "{error}"
    );

    let (status, error) = router.admin_call(
        "PUT",
        "/v1/apps/shop",
        Some(
            &json!({"domains": ["shop.test"], "waf": {"mode": "block", "paranoia": 7}}).to_string(),
        ),
    );
    assert_eq!(
        (status, error["field"].as_str()),
        (400, Some("waf.paranoia")),
        "{error}"
    );
}

#[test]
fn custom_rules_reload_without_a_restart_and_a_broken_file_keeps_the_rules_in_use() {
    let dir = tempfile::tempdir().expect("tempdir");
    let rules = dir.path().join("custom.conf");
    std::fs::write(&rules, "# the platform's own rules\n").expect("rules");
    let router = RouterProcess::start_with(&["--waf-rules", rules.to_str().expect("utf-8 path")]);
    let backend = Backend::start("shop");
    protect(&router, &backend, json!({"mode": "block"}));
    assert_eq!(get(&router, "/internal/debug", "").status, 200);

    std::fs::write(
        &rules,
        "SecRule REQUEST_URI \"@beginsWith /internal/\" \
         \"id:10001,phase:1,deny,status:403,log,msg:'internal paths are closed'\"\n",
    )
    .expect("rules");
    let (status, answer) = router.admin_call("POST", "/v1/waf/reload", None);
    assert_eq!(status, 200, "{answer}");
    assert_eq!(answer["rules"].as_u64().map(|n| n > 100), Some(true));
    assert_eq!(get(&router, "/internal/debug", "").status, 403);
    assert!(
        router
            .logs()
            .contains("WAF rule 10001 matched: internal paths are closed"),
        "{}",
        router.logs()
    );

    std::fs::write(
        &rules,
        "SecRule NO_SUCH_VARIABLE \"@rx x\" \"id:10002,deny\"\n",
    )
    .expect("rules");
    let (status, error) = router.admin_call("POST", "/v1/waf/reload", None);
    assert_eq!(
        (status, error["field"].as_str()),
        (400, Some("rules")),
        "{error}"
    );
    assert!(
        error["error"]
            .as_str()
            .unwrap_or("")
            .contains("custom.conf"),
        "{error}"
    );
    assert_eq!(
        get(&router, "/internal/debug", "").status,
        403,
        "the rules in use stay"
    );
    assert_eq!(get(&router, "/products?page=2", "").status, 200);
}

#[test]
fn a_router_forced_to_inspect_inline_still_inspects() {
    // Inline exists for the benchmarks' comparison (not a setting); it must inspect the same.
    let router = RouterProcess::start_with_env(&[], &[("SWITCHYARD_BENCH_POOL", "inline")]);
    let backend = Backend::start("shop");
    protect(&router, &backend, json!({"mode": "block"}));
    assert_eq!(get(&router, "/products?page=2", "").status, 200);
    let probe = get(&router, "/products?id=1%27%20OR%20%271%27=%271", "");
    assert_eq!(probe.status, 403, "{}", probe.text());
    assert_eq!(backend.requests(), 1);
    assert_eq!(router.metric("switchyard_pool_threads"), 0.0);
    assert!(router.logs().contains("run inline on the event loops"));
}

/// How many `waf_reload` changes `router` has applied (its own announcement included).
fn waf_reloads_applied(router: &RouterProcess) -> usize {
    let (status, log) = router.admin_call("GET", "/v1/changes?limit=500", None);
    assert_eq!(status, 200, "{log}");
    log["changes"].as_array().map_or(0, |c| {
        c.iter().filter(|c| c["kind"] == "waf_reload").count()
    })
}

#[test]
fn a_reload_on_one_router_reaches_every_router_sharing_the_store() {
    const INTERNAL: &str = "SecRule REQUEST_URI \"@beginsWith /internal/\" \
         \"id:10001,phase:1,deny,status:403,log,msg:'internal paths are closed'\"\n";
    const SECRET: &str = "SecRule REQUEST_URI \"@beginsWith /secret/\" \
         \"id:10003,phase:1,deny,status:403,log,msg:'secret paths are closed'\"\n";
    let redis = RedisServer::start();
    let dir = tempfile::tempdir().expect("tempdir");
    // Each router reads its own files, as each host of a fleet has its own copy.
    let files = [dir.path().join("a.conf"), dir.path().join("b.conf")];
    let routers: Vec<RouterProcess> = files
        .iter()
        .map(|file| {
            std::fs::write(file, "# the platform's own rules\n").expect("rules");
            let router = RouterProcess::start_with(&[
                "--store",
                &redis.url(),
                "--waf-rules",
                file.to_str().expect("utf-8 path"),
            ]);
            eventually(Duration::from_secs(5), "the change subscription", || {
                router.metric("switchyard_store_subscription_connected") == 1.0
            });
            router
        })
        .collect();
    let (a, b) = (&routers[0], &routers[1]);
    let backend = Backend::start("shop");
    protect(a, &backend, json!({"mode": "block"}));
    eventually(
        Duration::from_secs(5),
        "the app on the other router",
        || get(b, "/internal/debug", "").status == 200,
    );

    for file in &files {
        std::fs::write(file, INTERNAL).expect("rules");
    }
    let (status, answer) = a.admin_call("POST", "/v1/waf/reload", None);
    assert_eq!(status, 200, "{answer}");
    assert_eq!(get(a, "/internal/debug", "").status, 403);
    eventually(
        Duration::from_secs(10),
        "the reload on the other router",
        || get(b, "/internal/debug", "").status == 403,
    );
    assert_eq!(
        b.metric("switchyard_waf_reloads_total{origin=\"fleet\",result=\"loaded\"}"),
        1.0
    );
    // The router that made the reload hears it back, from itself and through Redis, and
    // does not load again.
    eventually(Duration::from_secs(5), "the announcement back", || {
        waf_reloads_applied(a) >= 2
    });
    assert_eq!(
        a.metric("switchyard_waf_reloads_total{origin=\"api\",result=\"loaded\"}"),
        1.0
    );
    assert_eq!(
        a.metric("switchyard_waf_reloads_total{origin=\"fleet\",result=\"loaded\"}"),
        0.0
    );

    // A router whose files do not load keeps the rules in use, and says why.
    std::fs::write(&files[0], format!("{INTERNAL}{SECRET}")).expect("rules");
    std::fs::write(
        &files[1],
        "SecRule NO_SUCH_VARIABLE \"@rx x\" \"id:10002,deny\"\n",
    )
    .expect("rules");
    let (status, answer) = a.admin_call("POST", "/v1/waf/reload", None);
    assert_eq!(status, 200, "{answer}");
    assert_eq!(get(a, "/secret/plans", "").status, 403);
    eventually(
        Duration::from_secs(10),
        "the refused reload on the other router",
        || b.metric("switchyard_waf_reloads_total{origin=\"fleet\",result=\"refused\"}") == 1.0,
    );
    assert_eq!(get(b, "/internal/debug", "").status, 403);
    assert_eq!(get(b, "/secret/plans", "").status, 200);
    assert!(
        b.logs()
            .contains("the WAF reload announced to the fleet does not load here"),
        "{}",
        b.logs()
    );
}
