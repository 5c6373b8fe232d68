//! The response cache end to end: the real router in front of a real backend that counts
//! what reaches it and sets caching headers on demand.

use switchyard_test_support as support;

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use support::{eventually, Backend, Behaviour, RouterProcess};

fn cached_app(router: &RouterProcess, backend: &Backend, cache: Value) {
    router.put_app(
        "site",
        json!({"domains": ["site.test"], "backends": [backend.addr.to_string()], "cache": cache}),
    );
}

fn fetch(router: &RouterProcess, path: &str) -> (u16, String, String) {
    let response = router.get("site.test", path);
    (
        response.status,
        response.header("x-cache").unwrap_or("").to_string(),
        response.text(),
    )
}

fn request_with(
    router: &RouterProcess,
    method: &str,
    path: &str,
    extra: &str,
) -> support::Response {
    support::send(router.http, method, "site.test", path, extra)
        .unwrap_or_else(|e| panic!("{method} {path}: {e}\n{}", router.logs()))
}

#[test]
fn only_opted_in_paths_are_cached_and_headers_decide_the_rest() {
    let router = RouterProcess::start();
    let backend = Backend::start("app");
    cached_app(
        &router,
        &backend,
        json!({"paths": ["/", "/assets/*"], "default_ttl_s": 60}),
    );

    let (status, first, body) = fetch(&router, "/assets/app.js");
    assert_eq!((status, first.as_str()), (200, "MISS"));
    let (_, second, cached_body) = fetch(&router, "/assets/app.js");
    assert_eq!(second, "HIT");
    assert_eq!(cached_body, body, "the stored body is served");
    assert_eq!(fetch(&router, "/").1, "MISS");
    assert_eq!(fetch(&router, "/").1, "HIT");
    assert_eq!(backend.requests(), 2, "hits never reached the app");

    let head = request_with(&router, "HEAD", "/assets/app.js", "");
    assert_eq!(head.header("x-cache"), Some("HIT"));
    assert!(head.body.is_empty());

    // Not opted in, not GET/HEAD, or with credentials: the app answers every time.
    for _ in 0..2 {
        assert_eq!(fetch(&router, "/account").1, "BYPASS");
        let post = request_with(&router, "POST", "/assets/app.js", "Content-Length: 0\r\n");
        assert_eq!(post.header("x-cache"), Some("BYPASS"));
        let authorized = request_with(&router, "GET", "/", "Authorization: Bearer x\r\n");
        assert_eq!(authorized.header("x-cache"), Some("BYPASS"));
    }
    assert_eq!(backend.requests(), 8);

    // The app's own headers: no-store, private and Set-Cookie are never kept.
    for path in [
        "/assets/a?cc=no-store",
        "/assets/b?cc=private",
        "/assets/c?cookie=sid%3D1",
        "/assets/d?cc=max-age=0",
    ] {
        let before = backend.requests();
        assert_eq!(fetch(&router, path).1, "MISS", "{path}");
        assert_eq!(fetch(&router, path).1, "MISS", "{path} was not kept");
        assert_eq!(backend.requests(), before + 2, "{path}");
    }
    assert_eq!(fetch(&router, "/assets/e?cc=max-age=60").1, "MISS");
    assert_eq!(fetch(&router, "/assets/e?cc=max-age=60").1, "HIT");
}

#[test]
fn vary_keeps_one_copy_per_variant() {
    let router = RouterProcess::start();
    let backend = Backend::start("app");
    cached_app(
        &router,
        &backend,
        json!({"paths": ["/*"], "default_ttl_s": 60}),
    );
    let path = "/page?vary=Accept-Language";
    let ask = |language: &str| {
        let response = request_with(
            &router,
            "GET",
            path,
            &format!("Accept-Language: {language}\r\n"),
        );
        let body = response.json();
        (
            response.header("x-cache").unwrap_or("").to_string(),
            body["headers"]["accept-language"]
                .as_str()
                .unwrap_or("")
                .to_string(),
        )
    };
    assert_eq!(ask("fr"), ("MISS".into(), "fr".into()));
    assert_eq!(ask("de"), ("MISS".into(), "de".into()));
    assert_eq!(ask("fr"), ("HIT".into(), "fr".into()), "the French copy");
    assert_eq!(ask("de"), ("HIT".into(), "de".into()), "the German copy");
    assert_eq!(backend.requests(), 2);
}

#[test]
fn concurrent_misses_send_one_request_to_the_app() {
    let router = Arc::new(RouterProcess::start());
    let backend = Backend::start("app");
    cached_app(
        &router,
        &backend,
        json!({"paths": ["/slow"], "default_ttl_s": 60}),
    );
    let clients: Vec<_> = (0..100)
        .map(|_| {
            let router = router.clone();
            std::thread::spawn(move || {
                let response = router.get("site.test", "/slow?ms=500");
                (response.status, response.text())
            })
        })
        .collect();
    for client in clients {
        let (status, body) = client.join().expect("client");
        assert_eq!((status, body.as_str()), (200, "app"));
    }
    assert_eq!(
        backend.requests(),
        1,
        "100 concurrent misses, one request to the app"
    );
}

#[test]
fn stale_copies_stand_in_while_the_app_fails_then_expire() {
    let router = RouterProcess::start();
    let backend = Backend::start("app");
    cached_app(
        &router,
        &backend,
        json!({"paths": ["/*"], "default_ttl_s": 1, "stale_if_error_s": 3}),
    );
    let stored_at = Instant::now();
    let (_, first, body) = fetch(&router, "/news");
    assert_eq!(first, "MISS");

    // Fresh, the copy is served without asking the app; expired, the app is asked again,
    // and when it answers 500 the stale copy is served instead.
    backend.set_behaviour(Behaviour::Status(500));
    let mut verdicts = Vec::new();
    eventually(Duration::from_secs(5), "the copy to expire", || {
        let (status, verdict, stale_body) = fetch(&router, "/news");
        assert_eq!((status, &stale_body), (200, &body), "{verdict}");
        verdicts.push(verdict);
        verdicts.last().is_some_and(|v| v == "STALE")
    });
    assert!(
        stored_at.elapsed() >= Duration::from_secs(1),
        "not stale before its default_ttl_s"
    );
    assert!(
        verdicts[..verdicts.len() - 1].iter().all(|v| v == "HIT"),
        "{verdicts:?}"
    );

    // An error without a body is replaced just as well.
    backend.set_behaviour(Behaviour::BareStatus(503));
    let (status, verdict, stale_body) = fetch(&router, "/news");
    assert_eq!((status, verdict.as_str()), (200, "STALE"));
    assert_eq!(stale_body, body);

    // The app is gone altogether: still the stale copy.
    backend.stop();
    let (status, verdict, stale_body) = fetch(&router, "/news");
    assert_eq!((status, verdict.as_str()), (200, "STALE"));
    assert_eq!(stale_body, body);

    // Past stale_if_error_s, the failure shows.
    eventually(Duration::from_secs(8), "the stale window to end", || {
        let (status, verdict, _) = fetch(&router, "/news");
        assert!(
            status == 502 || (status, verdict.as_str()) == (200, "STALE"),
            "{status} {verdict}"
        );
        status == 502
    });
    assert!(
        stored_at.elapsed() >= Duration::from_secs(4),
        "the stale copy stood in for default_ttl_s + stale_if_error_s"
    );
    assert!(router.metric("switchyard_cache_requests_total{app=\"site\",result=\"STALE\"}") >= 3.0);
}

#[test]
fn memory_stays_within_the_apps_bound() {
    let router = RouterProcess::start();
    let backend = Backend::start("app");
    cached_app(
        &router,
        &backend,
        json!({"paths": ["/*"], "max_bytes": 32768, "default_ttl_s": 60}),
    );
    for i in 0..300 {
        assert_eq!(fetch(&router, &format!("/item/{i}")).0, 200);
    }
    let held = router.metric("switchyard_cache_bytes{app=\"site\"}");
    assert!(held > 0.0 && held <= 32768.0, "{held} bytes held");
    assert!(router.metric("switchyard_cache_evictions_total") > 0.0);
    assert!(router.metric("switchyard_cache_stores_total") >= 300.0);
}

#[test]
fn cache_options_are_validated_field_by_field() {
    let router = RouterProcess::start();
    for (cache, field) in [
        (json!({}), "cache.paths"),
        (json!({"paths": ["nope"]}), "cache.paths[0]"),
        (json!({"paths": ["/"], "ttl_s": 0}), "cache.ttl_s"),
        (
            json!({"paths": ["/"], "default_ttl_s": 0}),
            "cache.default_ttl_s",
        ),
        (json!({"paths": ["/"], "store": "disk"}), "cache.store"),
    ] {
        let body = json!({"domains": ["site.test"], "cache": cache}).to_string();
        let (status, error) = router.admin_call("PUT", "/v1/apps/site", Some(&body));
        assert_eq!(status, 400, "{error}");
        assert_eq!(error["field"], json!(field), "{error}");
    }
    let (status, _) = router.admin_call("GET", "/v1/apps/site", None);
    assert_eq!(status, 404, "nothing was stored");
}

#[test]
fn a_purge_on_one_router_empties_the_entry_on_every_router() {
    let redis = support::RedisServer::start();
    let subscribed = || {
        let router = RouterProcess::start_with(&["--store", &redis.url()]);
        support::eventually(Duration::from_secs(5), "the change subscription", || {
            router.metric("switchyard_store_subscription_connected") == 1.0
        });
        assert_eq!(router.metric("switchyard_store_available"), 1.0);
        router
    };
    let (a, b) = (subscribed(), subscribed());
    let backend = Backend::start("app");
    cached_app(&a, &backend, json!({"paths": ["/*"], "default_ttl_s": 60}));
    for router in [&a, &b] {
        support::eventually(Duration::from_secs(2), "the app on both routers", || {
            router.get("site.test", "/news?page=1").status == 200
        });
        for path in ["/news?page=1", "/news/1", "/about"] {
            router.get("site.test", path);
            assert_eq!(fetch(router, path).1, "HIT", "{path} cached");
        }
    }

    let (status, answer) = a.admin_call("DELETE", "/v1/apps/site/cache?path=/news", None);
    assert_eq!(status, 200, "{answer}");
    for router in [&a, &b] {
        support::eventually(Duration::from_secs(1), "the purge on every router", || {
            fetch(router, "/news?page=1").1 == "MISS"
        });
        assert_eq!(fetch(router, "/news/1").1, "HIT", "only /news itself");
        assert_eq!(fetch(router, "/about").1, "HIT");
    }
    let (status, _) = b.admin_call("DELETE", "/v1/apps/site/cache?path=/&prefix=true", None);
    assert_eq!(status, 200);
    for router in [&a, &b] {
        support::eventually(Duration::from_secs(1), "the prefix purge", || {
            fetch(router, "/about").1 == "MISS"
        });
    }

    for (query, field) in [
        ("", "path"),
        ("?path=news", "path"),
        ("?path=/&prefix=yes", "prefix"),
    ] {
        let (status, error) = a.admin_call("DELETE", &format!("/v1/apps/site/cache{query}"), None);
        assert_eq!(
            (status, error["field"].as_str()),
            (400, Some(field)),
            "{error}"
        );
    }
    let (status, _) = a.admin_call("DELETE", "/v1/apps/nope/cache?path=/", None);
    assert_eq!(status, 404);
}

#[test]
fn files_under_the_static_root_answer_before_the_cache_and_the_app() {
    let router = RouterProcess::start();
    let backend = Backend::start("app");
    let big = "x".repeat(300_000);
    let (root, _outside) = support::static_root(&big);
    router.put_app(
        "site",
        json!({
            "domains": ["site.test"], "backends": [backend.addr.to_string()],
            "static_root": root.path().to_str().expect("utf-8 path"),
            "cache": {"paths": ["/*"]}
        }),
    );

    let css = router.get("site.test", "/assets/site.css");
    assert_eq!((css.status, css.text().as_str()), (200, "body{}"));
    assert_eq!(css.header("content-type"), Some("text/css; charset=utf-8"));
    let home = router.get("site.test", "/");
    assert_eq!(
        home.text(),
        "<h1>home</h1>",
        "a directory serves its index.html"
    );
    let large = router.get("site.test", "/big.txt");
    assert_eq!(large.body.len(), big.len(), "sent whole, in chunks");
    let head = request_with(&router, "HEAD", "/assets/site.css", "");
    assert_eq!((head.status, head.body.len()), (200, 0));
    assert_eq!(backend.requests(), 0, "the app was never asked");

    // Not on disk, outside the root, or not GET/HEAD: the cache and the app take over.
    let (_, verdict, body) = fetch(&router, "/assets/missing.css");
    assert_eq!(verdict, "MISS");
    assert!(body.contains("\"backend\":\"app\""), "{body}");
    let leak = router.get("site.test", "/leak.txt");
    assert!(
        !leak.text().contains("secret"),
        "a symlink out of the root is not followed"
    );
    let escape = request_with(&router, "GET", "/assets/%2e%2e/%2e%2e/etc/hostname", "");
    assert!(
        escape.text().contains("\"backend\":\"app\""),
        "{}",
        escape.text()
    );
    let post = request_with(&router, "POST", "/assets/site.css", "Content-Length: 0\r\n");
    assert!(post.text().contains("\"backend\":\"app\""));
    assert_eq!(backend.requests(), 4);
}

/// Plays the app's side of the versioned layout as a Rails app does: after answering a
/// cacheable GET it initialises the URL's version to 0 if absent and writes the body under
/// `FULL_URL:version=N`; invalidation is `HINCRBY resource_versions FULL_URL 1`.
fn rails_cache_response(redis: &support::RedisServer, full_url: &str, body: &str) {
    let mut connection = redis.connection().expect("redis");
    let version: Option<i64> = redis::cmd("HGET")
        .arg("resource_versions")
        .arg(full_url)
        .query(&mut connection)
        .expect("HGET");
    let version = match version {
        Some(v) => v,
        None => {
            let _: i64 = redis::cmd("HSET")
                .arg("resource_versions")
                .arg(full_url)
                .arg(0)
                .query(&mut connection)
                .expect("HSET");
            0
        }
    };
    let _: () = redis::cmd("SET")
        .arg(format!("{full_url}:version={version}"))
        .arg(body)
        .query(&mut connection)
        .expect("SET");
}

#[test]
fn the_redis_versioned_layout_written_by_the_app_is_served() {
    let mut redis = support::RedisServer::start();
    let router = RouterProcess::start_with(&["--cache-redis", &redis.url()]);
    // Routes in the embedded store: the cache's Redis link says nothing of a store's
    // availability (at 0 it fired SwitchyardStoreUnreachable for ever).
    let (_, scraped) = router.admin_call("GET", "/metrics", None);
    assert!(
        !scraped
            .as_str()
            .unwrap_or_default()
            .contains("switchyard_store_available"),
        "store availability exported on an embedded store"
    );
    let backend = Backend::start("app");
    cached_app(
        &router,
        &backend,
        json!({"store": "redis-versioned", "paths": ["/", "/foo*"]}),
    );
    let url = "http://site.test/foo/123?page=2";

    assert_eq!(fetch(&router, "/foo/123?page=2").1, "MISS");
    rails_cache_response(&redis, url, "<html>foo 123, v0</html>");
    let (status, verdict, body) = fetch(&router, "/foo/123?page=2");
    assert_eq!((status, verdict.as_str()), (200, "HIT"));
    assert_eq!(body, "<html>foo 123, v0</html>");
    let page = router.get("site.test", "/foo/123?page=2");
    assert_eq!(
        page.header("content-type"),
        Some("text/html; charset=utf-8")
    );
    assert_eq!(backend.requests(), 1, "hits come from Redis");

    // The app invalidates by bumping the version; the next request goes to the app, which
    // writes the new version's body.
    let mut connection = redis.connection().expect("redis");
    let _: i64 = redis::cmd("HINCRBY")
        .arg("resource_versions")
        .arg(url)
        .arg(1)
        .query(&mut connection)
        .expect("HINCRBY");
    assert_eq!(fetch(&router, "/foo/123?page=2").1, "MISS");
    rails_cache_response(&redis, url, "<html>foo 123, v1</html>");
    assert_eq!(
        fetch(&router, "/foo/123?page=2").2,
        "<html>foo 123, v1</html>"
    );
    assert_eq!(fetch(&router, "/bar").1, "BYPASS", "not opted in");

    // The router holds no copy of these pages: a purge is refused, saying what to do instead.
    let (status, answer) = router.admin_call("DELETE", "/v1/apps/site/cache?path=/foo", None);
    assert_eq!(
        (status, answer["field"].as_str()),
        (409, Some("cache.store")),
        "{answer}"
    );
    assert!(
        answer["error"]
            .as_str()
            .unwrap_or_default()
            .contains("HINCRBY"),
        "{answer}"
    );

    // Redis gone: every request is a miss answered by the app, never an error.
    redis.stop();
    let before = backend.requests();
    for _ in 0..20 {
        let (status, verdict, body) = fetch(&router, "/foo/123?page=2");
        assert_eq!((status, verdict.as_str()), (200, "MISS"));
        assert!(body.contains("\"backend\":\"app\""));
    }
    assert_eq!(backend.requests(), before + 20);
    assert!(cache_redis_errors(&router) >= 1.0, "the outage is counted");
}

/// Cache Redis failures of every kind that an outage produces.
fn cache_redis_errors(router: &RouterProcess) -> f64 {
    ["connect", "connection", "timeout"]
        .iter()
        .map(|kind| {
            router.metric(&format!(
                "switchyard_cache_redis_errors_total{{kind=\"{kind}\"}}"
            ))
        })
        .sum()
}

fn redis_keys(redis: &support::RedisServer, pattern: &str) -> Vec<String> {
    let mut connection = redis.connection().expect("redis");
    redis::cmd("KEYS")
        .arg(pattern)
        .query(&mut connection)
        .expect("KEYS")
}

#[test]
fn the_shared_redis_store_serves_every_router_and_misses_while_redis_is_away() {
    let mut redis = support::RedisServer::start();
    // A generous Redis deadline: on two loaded cores the 50 ms default can pass, and a
    // read or write that times out is a miss by design (which would make the counts below
    // measure the machine's load, not the sharing).
    let start = || {
        RouterProcess::start_with(&[
            "--cache-redis",
            &redis.url(),
            "--cache-redis-timeout-ms",
            "1000",
        ])
    };
    let (a, b) = (start(), start());
    let backend = Backend::start("app");
    let policy = json!({"store": "redis", "paths": ["/*"], "default_ttl_s": 60});
    for router in [&a, &b] {
        cached_app(router, &backend, policy.clone());
    }

    // Kept by router A, served by router B without asking the app.
    let (status, verdict, body) = fetch(&a, "/news");
    assert_eq!((status, verdict.as_str()), (200, "MISS"));
    // A writes its copy in the background, once its client has the answer.
    support::eventually(Duration::from_secs(2), "A's copy in Redis", || {
        !redis_keys(&redis, "switchyard:cache:site:*").is_empty()
    });
    support::eventually(Duration::from_secs(2), "router B serving A's copy", || {
        fetch(&b, "/news").1 == "HIT"
    });
    let hit = b.get("site.test", "/news");
    assert_eq!(hit.text(), body);
    assert!(hit.header("age").is_some());
    assert_eq!(backend.requests(), 1, "one request for the whole fleet");
    let keys = redis_keys(&redis, "switchyard:cache:site:*");
    assert_eq!(keys, ["switchyard:cache:site:http://site.test/news"]);
    let mut connection = redis.connection().expect("redis");
    let ttl_ms: i64 = redis::cmd("PTTL")
        .arg(&keys[0])
        .query(&mut connection)
        .expect("PTTL");
    assert!(
        ttl_ms > 50_000 && ttl_ms <= 60_000,
        "Redis expires it: {ttl_ms}"
    );

    // Variants travel too.
    let ask = |router: &RouterProcess, language: &str| {
        let response = request_with(
            router,
            "GET",
            "/page?vary=Accept-Language",
            &format!("Accept-Language: {language}\r\n"),
        );
        let seen = response.json()["headers"]["accept-language"]
            .as_str()
            .unwrap_or("")
            .to_string();
        (response.header("x-cache").unwrap_or("").to_string(), seen)
    };
    assert_eq!(ask(&a, "fr"), ("MISS".into(), "fr".into()));
    support::eventually(Duration::from_secs(2), "the French copy on B", || {
        ask(&b, "fr").0 == "HIT"
    });
    assert_eq!(ask(&b, "de"), ("MISS".into(), "de".into()));
    support::eventually(Duration::from_secs(2), "the German copy on A", || {
        ask(&a, "de") == ("HIT".into(), "de".into())
    });
    assert_eq!(ask(&a, "fr"), ("HIT".into(), "fr".into()));

    // Concurrent misses on one router still make one request.
    let before = backend.requests();
    let a = Arc::new(a);
    let clients: Vec<_> = (0..20)
        .map(|_| {
            let a = a.clone();
            std::thread::spawn(move || fetch(&a, "/slow?ms=300").0)
        })
        .collect();
    for client in clients {
        assert_eq!(client.join().expect("client"), 200);
    }
    assert_eq!(backend.requests(), before + 1);

    // A purge on A empties Redis once, for every router.
    let (status, answer) = a.admin_call("DELETE", "/v1/apps/site/cache?path=/news", None);
    assert_eq!(status, 200, "{answer}");
    assert_eq!(
        (answer["deleted"].as_u64(), answer["complete"].as_bool()),
        (Some(1), Some(true)),
        "{answer}"
    );
    assert_eq!(fetch(&b, "/news").1, "MISS");
    assert_eq!(fetch(&b, "/slow?ms=300").1, "HIT", "other paths stay");

    // Redis gone: misses answered by the app, never an error; purges say why they fail.
    redis.stop();
    let before = backend.requests();
    for router in [&*a, &b] {
        for _ in 0..10 {
            let (status, verdict, _) = fetch(router, "/slow?ms=1");
            assert_eq!((status, verdict.as_str()), (200, "MISS"));
        }
    }
    assert_eq!(backend.requests(), before + 20);
    assert!(cache_redis_errors(&a) >= 1.0, "the outage is counted");
    let (status, error) = a.admin_call("DELETE", "/v1/apps/site/cache?path=/news", None);
    assert_eq!(status, 503, "{error}");
    assert!(
        error["error"].as_str().unwrap_or("").contains("purged"),
        "{error}"
    );

    // Back: copies are kept and shared again.
    redis.spawn();
    support::eventually(
        Duration::from_secs(5),
        "the cache after Redis returns",
        || fetch(&a, "/back").1 == "HIT",
    );
    assert!(a.metric("switchyard_cache_redis_writes_total{result=\"stored\"}") >= 3.0);
}

#[test]
fn a_router_without_cache_redis_passes_shared_cache_apps_to_the_app() {
    let router = RouterProcess::start();
    let backend = Backend::start("app");
    cached_app(
        &router,
        &backend,
        json!({"store": "redis", "paths": ["/*"]}),
    );
    for _ in 0..2 {
        let (status, verdict, _) = fetch(&router, "/news");
        assert_eq!((status, verdict.as_str()), (200, "MISS"));
    }
    assert_eq!(backend.requests(), 2);
    assert!(
        router.logs().contains("needs --cache-redis"),
        "{}",
        router.logs()
    );
    let (status, error) = router.admin_call("DELETE", "/v1/apps/site/cache?path=/news", None);
    assert_eq!(status, 503);
    assert!(
        error["error"]
            .as_str()
            .unwrap_or("")
            .contains("no --cache-redis"),
        "{error}"
    );
}
