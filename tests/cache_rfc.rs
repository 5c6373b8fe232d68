//! The response cache against RFC 9111, end to end: the real router in front of an origin
//! that sends exactly the fields of each case (`/origin?…`, test-support's backend). Every
//! rule is checked for the memory store and the shared Redis store: each test runs one app
//! of each (`mem.test`, `fleet.test`) on the same router and origin.

use switchyard_test_support as support;

use std::sync::Arc;
use std::time::Duration;

use serde_json::{json, Value};
use support::{eventually, Backend, Behaviour, RedisServer, RouterProcess};

const STORES: [(&str, &str); 2] = [("mem.test", "memory"), ("fleet.test", "redis")];

struct Rig {
    redis: RedisServer,
    router: RouterProcess,
    origin: Backend,
}

impl Rig {
    /// A router with a cache Redis, and an app per store with `options` besides.
    fn start(options: Value) -> Self {
        let redis = RedisServer::start();
        let router = start_router(&redis);
        let origin = Backend::start("origin");
        add_apps(&router, &origin, &options);
        Self {
            redis,
            router,
            origin,
        }
    }

    fn send(&self, host: &str, method: &str, path: &str, extra: &str) -> support::Response {
        self.router.send(method, host, path, extra)
    }

    /// A GET's status, `X-Cache` and body; for the Redis store, waits for a copy the answer
    /// may have made to be written (in the background) before going on.
    fn get(&self, host: &str, path: &str) -> (u16, String, String) {
        let response = self.get_with(host, path, "");
        (
            response.status,
            response.header("x-cache").unwrap_or("").to_string(),
            response.text(),
        )
    }

    fn get_with(&self, host: &str, path: &str, extra: &str) -> support::Response {
        let writes = redis_writes(&self.router);
        let response = self.send(host, "GET", path, extra);
        let wrote = matches!(response.header("x-cache"), Some("MISS" | "REVALIDATED"));
        if host == "fleet.test" && wrote && response.status != 304 {
            // Not every miss is kept: wait briefly, and only as long as writes may come.
            let _ = wait_until(Duration::from_millis(300), || {
                redis_writes(&self.router) > writes
            });
        }
        response
    }
}

fn start_router(redis: &RedisServer) -> RouterProcess {
    // A generous Redis deadline: a timed-out read is a miss by design, which would make
    // these cases measure the machine's load.
    RouterProcess::start_with(&[
        "--cache-redis",
        &redis.url(),
        "--cache-redis-timeout-ms",
        "1000",
    ])
}

fn add_apps(router: &RouterProcess, origin: &Backend, options: &Value) {
    for (host, store) in STORES {
        let mut cache = json!({"store": store, "paths": ["/*"]});
        for (name, value) in options.as_object().into_iter().flatten() {
            cache[name] = value.clone();
        }
        router.put_app(
            host.trim_end_matches(".test"),
            json!({"domains": [host], "backends": [origin.addr.to_string()], "cache": cache}),
        );
    }
}

fn redis_writes(router: &RouterProcess) -> f64 {
    ["stored", "invalidated", "failed", "shed"]
        .iter()
        .map(|r| {
            router.metric(&format!(
                "switchyard_cache_redis_writes_total{{result=\"{r}\"}}"
            ))
        })
        .sum()
}

fn wait_until(limit: Duration, mut done: impl FnMut() -> bool) -> bool {
    let deadline = std::time::Instant::now() + limit;
    while std::time::Instant::now() < deadline {
        if done() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    done()
}

/// The verdicts of `n` GETs of `path` in a row.
fn verdicts(rig: &Rig, host: &str, path: &str, n: usize) -> Vec<String> {
    (0..n).map(|_| rig.get(host, path).1).collect()
}

#[test]
fn expires_minus_date_gives_the_freshness_lifetime() {
    let rig = Rig::start(json!({}));
    for (host, store) in STORES {
        // §4.2.1: s-maxage over max-age over Expires - Date.
        let expires = "/origin/expires?date=0&expires=2";
        let shared_max = "/origin/s?h=Cache-Control:max-age%3D1%2C%20s-maxage%3D60";
        let max_over_expires = "/origin/m?h=Cache-Control:max-age%3D60&expires=-10";
        for path in [expires, shared_max, max_over_expires] {
            assert_eq!(
                verdicts(&rig, host, path, 2),
                ["MISS", "HIT"],
                "{store} {path}"
            );
        }
        std::thread::sleep(Duration::from_millis(3100));
        assert_eq!(rig.get(host, expires).1, "MISS", "{store}: Expires passed");
        assert_eq!(
            rig.get(host, shared_max).1,
            "HIT",
            "{store}: s-maxage decides"
        );
        assert_eq!(rig.get(host, max_over_expires).1, "HIT", "{store}");
    }
}

#[test]
fn an_invalid_max_age_or_expires_means_stale() {
    let rig = Rig::start(json!({}));
    for (host, store) in STORES {
        // §4.2.1 and §5.3: not a fallback to a default, stale.
        for path in [
            "/origin/q?h=Cache-Control:max-age%3D%2260%22",
            "/origin/n?h=Cache-Control:max-age%3D-5",
            "/origin/e?h=Expires:0",
            "/origin/d?h=Expires:tomorrow",
        ] {
            assert_eq!(
                verdicts(&rig, host, path, 2),
                ["MISS", "MISS"],
                "{store} {path}"
            );
        }
        // Stale with a validator: kept, and revalidated at once.
        let with_tag = "/origin/t?h=Cache-Control:max-age%3D%2260%22&h=ETag:%22v%22";
        assert_eq!(
            verdicts(&rig, host, with_tag, 2),
            ["MISS", "REVALIDATED"],
            "{store}"
        );
    }
}

#[test]
fn age_from_upstream_is_counted_and_sent_on_every_cached_answer() {
    let rig = Rig::start(json!({}));
    for (host, store) in STORES {
        // §4.2.3: the Age the answer came with counts; §5.1: the cache sends its own.
        let aged = "/origin/aged?h=Cache-Control:max-age%3D100&h=Age:40";
        let first = rig.get_with(host, aged, "");
        assert_eq!(first.header("x-cache"), Some("MISS"));
        let hit = rig.get_with(host, aged, "");
        assert_eq!(hit.header("x-cache"), Some("HIT"), "{store}");
        let age: u64 = hit.header("age").and_then(|a| a.parse().ok()).expect("Age");
        assert!((40..45).contains(&age), "{store}: Age {age}");
        std::thread::sleep(Duration::from_millis(1100));
        let later: u64 = rig
            .get_with(host, aged, "")
            .header("age")
            .and_then(|a| a.parse().ok())
            .expect("Age");
        assert!(later > age, "{store}: the copy ages ({age} then {later})");

        // Older than its lifetime on arrival, with nothing to revalidate with: not kept.
        let too_old = "/origin/old?h=Cache-Control:max-age%3D100&h=Age:100";
        assert_eq!(
            verdicts(&rig, host, too_old, 2),
            ["MISS", "MISS"],
            "{store}"
        );
        // A Date 300 s in the past makes the answer that old.
        let dated = "/origin/dated?h=Cache-Control:max-age%3D200&date=-300";
        assert_eq!(verdicts(&rig, host, dated, 2), ["MISS", "MISS"], "{store}");
    }
}

#[test]
fn heuristic_freshness_needs_last_modified_and_a_default_ttl_is_the_apps_choice() {
    let rig = Rig::start(json!({}));
    for (host, store) in STORES {
        // §4.2.2: nothing said, nothing kept.
        assert_eq!(
            verdicts(&rig, host, "/origin/plain", 2),
            ["MISS", "MISS"],
            "{store}"
        );
        let modified = "/origin/lm?last_modified=100000";
        assert_eq!(
            verdicts(&rig, host, modified, 2),
            ["MISS", "HIT"],
            "{store}"
        );
        // Only for the statuses cacheable by default.
        let found = "/origin/found?status=302&last_modified=100000";
        assert_eq!(verdicts(&rig, host, found, 2), ["MISS", "MISS"], "{store}");
        let gone = "/origin/gone?status=410&last_modified=100000";
        assert_eq!(verdicts(&rig, host, gone, 2), ["MISS", "HIT"], "{store}");
        // Other statuses with explicit freshness are kept.
        let found_for_a_while = "/origin/found2?status=302&h=Cache-Control:max-age%3D60";
        assert_eq!(
            verdicts(&rig, host, found_for_a_while, 2),
            ["MISS", "HIT"],
            "{store}"
        );
    }
    let floor = Rig::start(json!({"default_ttl_s": 60}));
    for (host, store) in STORES {
        let plain = "/origin/plain";
        assert_eq!(verdicts(&floor, host, plain, 2), ["MISS", "HIT"], "{store}");
    }
}

#[test]
fn a_304_from_the_app_refreshes_the_stored_headers() {
    let rig = Rig::start(json!({}));
    for (host, store) in STORES {
        // §4.3.3, §4.3.4: validated with the copy's ETag, refreshed with the 304's fields.
        let tagged = "/origin/r?h=Cache-Control:max-age%3D1&h=ETag:%22v1%22";
        let dated = "/origin/l?h=Cache-Control:max-age%3D1&h=Last-Modified:Fri,%2015%20Jan%202027%2007:00:00%20GMT";
        for path in [tagged, dated] {
            let first = rig.get_with(host, path, "");
            assert_eq!(first.header("x-cache"), Some("MISS"), "{store}");
            let served = first.header("x-served").expect("X-Served").to_string();
            std::thread::sleep(Duration::from_millis(1100));
            let before = rig.origin.requests();
            let refreshed = rig.get_with(host, path, "");
            assert_eq!(refreshed.status, 200);
            assert_eq!(refreshed.header("x-cache"), Some("REVALIDATED"), "{store}");
            assert_eq!(refreshed.text(), first.text(), "{store}: the stored body");
            let refreshed_by = refreshed.header("x-served").expect("X-Served");
            assert_ne!(
                refreshed_by, served,
                "{store}: the 304's fields replace the copy's"
            );
            assert_eq!(rig.origin.requests(), before + 1);
            let asked = rig.origin.recorded().pop().expect("the revalidation");
            if path == tagged {
                assert_eq!(
                    asked.headers.get("if-none-match").map(String::as_str),
                    Some("\"v1\"")
                );
            } else {
                assert_eq!(
                    asked.headers.get("if-modified-since").map(String::as_str),
                    Some("Fri, 15 Jan 2027 07:00:00 GMT")
                );
            }
            // Fresh again, with the refreshed fields.
            let hit = rig.get_with(host, path, "");
            assert_eq!(hit.header("x-cache"), Some("HIT"), "{store}");
            assert_eq!(hit.header("x-served"), Some(refreshed_by), "{store}");
        }
    }
}

#[test]
fn must_revalidate_and_its_kin_are_never_served_stale() {
    let rig = Rig::start(json!({"stale_if_error_s": 60}));
    let plain = "/origin/p?h=Cache-Control:max-age%3D1";
    // The answer's own stale-if-error does not beat them either.
    let strict = [
        "/origin/mr?h=Cache-Control:max-age%3D1%2C%20must-revalidate%2C%20stale-if-error%3D60",
        "/origin/pr?h=Cache-Control:max-age%3D1%2C%20proxy-revalidate",
        "/origin/sm?h=Cache-Control:s-maxage%3D1%2C%20stale-if-error%3D60",
        "/origin/ncv?h=Cache-Control:max-age%3D1%2C%20no-cache%2C%20stale-if-error%3D60&h=ETag:%22n%22",
    ];
    for (host, _) in STORES {
        for path in strict.iter().chain([&plain]) {
            assert_eq!(rig.get(host, path).1, "MISS");
        }
        // no-cache: kept, but never answered without the app.
        assert_eq!(rig.get(host, strict[3]).1, "REVALIDATED");
    }
    std::thread::sleep(Duration::from_millis(1100));
    rig.origin.set_behaviour(Behaviour::Status(500));
    for (host, store) in STORES {
        // §4.2.4: the app's own stale_if_error_s does not beat the answer's directives.
        let (status, verdict, _) = rig.get(host, plain);
        assert_eq!((status, verdict.as_str()), (200, "STALE"), "{store}");
        for path in strict {
            let (status, verdict, _) = rig.get(host, path);
            assert_eq!((status, verdict.as_str()), (500, "MISS"), "{store} {path}");
        }
    }
    // §5.2.2.2: an app that cannot be reached is no excuse either: the router's own 502.
    rig.origin.set_behaviour(Behaviour::Reset);
    for (host, store) in STORES {
        for path in strict {
            // The router's own answer: no copy in it, so no X-Cache.
            let (status, verdict, _) = rig.get(host, path);
            assert_eq!((status, verdict.as_str()), (502, ""), "{store} {path}");
        }
        let (status, verdict, _) = rig.get(host, plain);
        assert_eq!((status, verdict.as_str()), (200, "STALE"), "{store}");
    }
    rig.origin.set_behaviour(Behaviour::Normal);
    for (host, store) in STORES {
        // §5.2.2.4: no-cache is kept, and revalidated before every use.
        let no_cache = "/origin/nc?h=Cache-Control:no-cache&h=ETag:%22n%22";
        assert_eq!(
            verdicts(&rig, host, no_cache, 3),
            ["MISS", "REVALIDATED", "REVALIDATED"],
            "{store}"
        );
    }
}

#[test]
fn a_clients_conditional_request_gets_a_304_from_a_stored_copy() {
    let rig = Rig::start(json!({}));
    let path = "/origin/c?h=Cache-Control:max-age%3D60&h=ETag:W/%22v1%22&h=Last-Modified:Fri,%2015%20Jan%202027%2007:00:00%20GMT";
    for (host, store) in STORES {
        // On a miss the app is asked for the whole answer, which is kept; the client's
        // own condition is then answered by the cache.
        let first = rig.get_with(host, path, "If-None-Match: \"v1\"\r\n");
        assert_eq!((first.status, first.header("x-cache")), (200, Some("MISS")));
        let asked = rig.origin.recorded().pop().expect("the fill");
        assert!(!asked.headers.contains_key("if-none-match"), "{store}");

        let conditional = |extra: &str| {
            let response = rig.get_with(host, path, extra);
            assert_eq!(response.header("x-cache"), Some("HIT"), "{store} {extra}");
            response
        };
        // §4.3.2, RFC 9110 §13.1.2: weak comparison, any listed tag, or *.
        for matching in ["\"v1\"", "W/\"v1\"", "\"v0\", W/\"v1\"", "*"] {
            let answer = conditional(&format!("If-None-Match: {matching}\r\n"));
            assert_eq!(answer.status, 304, "{store} {matching}");
            assert!(answer.body.is_empty());
            assert_eq!(answer.header("etag"), Some("W/\"v1\""));
            assert!(answer.header("age").is_some() && answer.header("cache-control").is_some());
            assert_eq!(answer.header("content-length"), None);
        }
        assert_eq!(conditional("If-None-Match: \"v2\"\r\n").status, 200);
        let since = |date: &str| conditional(&format!("If-Modified-Since: {date}\r\n")).status;
        assert_eq!(since("Fri, 15 Jan 2027 07:00:00 GMT"), 304, "{store}");
        assert_eq!(since("Fri, 15 Jan 2027 06:00:00 GMT"), 200, "{store}");
        // If-None-Match decides when both are sent.
        let both = "If-None-Match: \"v2\"\r\nIf-Modified-Since: Fri, 15 Jan 2027 07:00:00 GMT\r\n";
        assert_eq!(conditional(both).status, 200, "{store}");
    }
}

#[test]
fn an_unsafe_request_invalidates_its_url_and_same_origin_locations_on_every_router() {
    let rig = Rig::start(json!({}));
    // A second router of the fleet: the Redis store's invalidations reach it too.
    let other = start_router(&rig.redis);
    add_apps(&other, &rig.origin, &json!({}));
    let kept = |name: &str| format!("/origin/{name}?h=Cache-Control:max-age%3D60");
    // A Location's value, escaped once more to travel in the query.
    let location = |name: &str| format!("/origin/{name}%3Fh%3DCache-Control:max-age%253D60");
    for (host, store) in STORES {
        for name in ["a", "b", "c", "d", "e"] {
            assert_eq!(
                verdicts(&rig, host, &kept(name), 2),
                ["MISS", "HIT"],
                "{store}"
            );
        }
        // §4.4: the URL of a successful POST.
        let post = rig.send(host, "POST", &kept("a"), "Content-Length: 0\r\n");
        assert_eq!((post.status, post.header("x-cache")), (200, Some("BYPASS")));
        // A DELETE elsewhere whose Location and Content-Location name cached URLs.
        let delete = format!(
            "/origin/x?h=Location:{}&h=Content-Location:http://{host}{}",
            location("b"),
            location("c")
        );
        assert_eq!(rig.send(host, "DELETE", &delete, "").status, 200);
        // Not after a failure, nor for another origin.
        let failed = format!("/origin/y?status=500&h=Location:{}", location("d"));
        assert_eq!(
            rig.send(host, "POST", &failed, "Content-Length: 0\r\n")
                .status,
            500
        );
        let elsewhere = format!(
            "/origin/z?h=Location:http://elsewhere.test{}",
            location("e")
        );
        assert_eq!(
            rig.send(host, "PUT", &elsewhere, "Content-Length: 0\r\n")
                .status,
            200
        );

        let expected = [
            ("a", "MISS"),
            ("b", "MISS"),
            ("c", "MISS"),
            ("d", "HIT"),
            ("e", "HIT"),
        ];
        // The Redis store is read on the other router: the invalidation reached the fleet.
        let reader = if store == "redis" {
            let mut redis = rig.redis.connection().expect("redis");
            eventually(Duration::from_secs(2), "the copies gone from Redis", || {
                ["a", "b", "c"].iter().all(|name| {
                    let key = format!("switchyard:cache:fleet:http://{host}{}", kept(name));
                    !redis::cmd("EXISTS")
                        .arg(key)
                        .query::<bool>(&mut redis)
                        .expect("EXISTS")
                })
            });
            &other
        } else {
            &rig.router
        };
        for (name, verdict) in expected {
            let answer = reader.send("GET", host, &kept(name), "");
            assert_eq!(answer.header("x-cache"), Some(verdict), "{store} {name}");
        }
    }
    assert!(rig.router.metric("switchyard_cache_invalidations_total") >= 6.0);
}

#[test]
fn stale_if_error_and_targeted_cache_control_come_from_the_app() {
    let rig = Rig::start(json!({}));
    let stale_if_error = "/origin/sie?h=Cache-Control:max-age%3D1%2C%20stale-if-error%3D60";
    let targeted = "/origin/cdn?h=CDN-Cache-Control:max-age%3D60&h=Cache-Control:no-store";
    let surrogate = "/origin/sc?h=Surrogate-Control:max-age%3D60&h=Cache-Control:private";
    let overruled = "/origin/no?h=CDN-Cache-Control:no-store&h=Cache-Control:max-age%3D60";
    for (host, store) in STORES {
        assert_eq!(rig.get(host, stale_if_error).1, "MISS");
        // RFC 9213: the targeted field is read before Cache-Control, and not passed on.
        for path in [targeted, surrogate] {
            for verdict in ["MISS", "HIT"] {
                let answer = rig.get_with(host, path, "");
                assert_eq!(answer.header("x-cache"), Some(verdict), "{store} {path}");
                assert_eq!(answer.header("cdn-cache-control"), None);
                assert_eq!(answer.header("surrogate-control"), None);
                assert!(answer.header("cache-control").is_some(), "the client's own");
            }
        }
        assert_eq!(
            verdicts(&rig, host, overruled, 2),
            ["MISS", "MISS"],
            "{store}"
        );
    }
    std::thread::sleep(Duration::from_millis(1100));
    rig.origin.set_behaviour(Behaviour::Status(503));
    for (host, store) in STORES {
        // RFC 5861: the app's stale-if-error lets the copy stand in.
        let (status, verdict, _) = rig.get(host, stale_if_error);
        assert_eq!((status, verdict.as_str()), (200, "STALE"), "{store}");
    }
}

#[test]
fn hop_by_hop_fields_are_not_stored_and_set_cookie_is_kept_when_the_app_says() {
    let rig = Rig::start(json!({"cache_set_cookie": true}));
    let path = "/origin/h?h=Cache-Control:max-age%3D60&h=Connection:X-Trace&h=X-Trace:1&h=Set-Cookie:v%3D1&h=X-Kept:yes";
    for (host, store) in STORES {
        assert_eq!(rig.get(host, path).1, "MISS");
        let hit = rig.get_with(host, path, "");
        assert_eq!(hit.header("x-cache"), Some("HIT"), "{store}");
        // §3.1: fields named in Connection describe that connection only.
        assert_eq!(hit.header("x-trace"), None, "{store}");
        assert_eq!(hit.header("x-kept"), Some("yes"), "{store}");
        assert_eq!(
            hit.header("set-cookie"),
            Some("v=1"),
            "{store}: cache_set_cookie"
        );
    }
    let strict = Rig::start(json!({}));
    for (host, store) in STORES {
        assert_eq!(
            verdicts(&strict, host, path, 2),
            ["MISS", "MISS"],
            "{store}"
        );
    }
}

#[test]
fn explain_shows_a_stored_copys_age_lifetime_and_what_decided_it() {
    let rig = Rig::start(json!({}));
    let path = "/origin/explained?date=0&expires=100&h=Age:7";
    let encoded: String = path
        .bytes()
        .map(|b| match b {
            b'a'..=b'z' | b'A'..=b'Z' | b'0'..=b'9' | b'/' | b'-' | b'_' | b'.' => {
                char::from(b).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect();
    for (host, store) in STORES {
        let explain = || {
            let query = format!("/v1/explain?host={host}&path={encoded}");
            let (status, answer) = rig.router.admin_call("GET", &query, None);
            assert_eq!(status, 200, "{answer}");
            answer
        };
        assert_eq!(explain()["stored"], json!([]), "{store}: nothing yet");
        assert_eq!(rig.get(host, path).1, "MISS");
        let answer = explain();
        let copy = &answer["stored"][0];
        assert_eq!(
            copy["url"],
            json!(format!("http://{host}{path}")),
            "{answer}"
        );
        assert_eq!(
            copy["decided_by"],
            json!("Expires - Date"),
            "{store}: {answer}"
        );
        let lifetime = copy["freshness_lifetime_s"].as_u64().expect("lifetime");
        assert!((99..=100).contains(&lifetime), "{store}: {answer}");
        let age = copy["age_s"].as_u64().expect("age");
        assert!(
            (7..10).contains(&age),
            "{store}: the upstream Age counts: {answer}"
        );
        assert_eq!(copy["state"], json!("fresh"));
    }
    // The same, as the CLI prints it.
    let admin = rig.router.admin.to_string();
    let output = std::process::Command::new(RouterProcess::binary())
        .args(["explain", "mem.test", path, "--admin", &admin])
        .output()
        .expect("run the CLI");
    let printed = String::from_utf8_lossy(&output.stdout);
    assert!(
        printed.contains("cached:") && printed.contains("(Expires - Date), fresh"),
        "{printed}"
    );
}

#[test]
fn a_range_of_a_stored_answer_is_answered_206() {
    let rig = Rig::start(json!({}));
    let path = "/origin/ranged?h=Cache-Control:max-age%3D60&h=ETag:%22r%22";
    for (host, store) in STORES {
        let whole = rig.get_with(host, path, "");
        assert_eq!(whole.header("x-cache"), Some("MISS"));
        let body = whole.body.clone();
        let ranged = |extra: &str| {
            let answer = rig.get_with(host, path, extra);
            assert_eq!(answer.header("x-cache"), Some("HIT"), "{store} {extra}");
            answer
        };
        // §3.4 and RFC 9110 §14: one range of the stored body.
        let part = ranged("Range: bytes=2-4\r\n");
        assert_eq!(part.status, 206, "{store}");
        assert_eq!(part.body, body[2..5].to_vec());
        let total = body.len();
        assert_eq!(
            part.header("content-range").map(str::to_string),
            Some(format!("bytes 2-4/{total}"))
        );
        let suffix = ranged("Range: bytes=-3\r\n");
        assert_eq!(
            (suffix.status, suffix.body.clone()),
            (206, body[total - 3..].to_vec())
        );
        let past = ranged(&format!("Range: bytes={total}-\r\n"));
        assert_eq!(past.status, 416, "{store}");
        assert_eq!(
            past.header("content-range").map(str::to_string),
            Some(format!("bytes */{total}"))
        );
        // Several ranges, or an If-Range the copy does not match: the whole answer.
        assert_eq!(ranged("Range: bytes=0-1,3-4\r\n").status, 200);
        assert_eq!(
            ranged("Range: bytes=0-1\r\nIf-Range: \"other\"\r\n").status,
            200
        );
        assert_eq!(
            ranged("Range: bytes=0-1\r\nIf-Range: \"r\"\r\n").status,
            206
        );
        let head = rig.send(host, "HEAD", path, "Range: bytes=0-1\r\n");
        assert_eq!(head.status, 200, "{store}: ranges are a GET's");
    }
}

#[test]
fn stale_while_revalidate_answers_at_once_and_refreshes_in_the_background() {
    let rig = Arc::new(Rig::start(json!({})));
    // The revalidation's second counts in the refreshed copy's age (§4.2.3): a max-age of 2
    // leaves it fresh for the requests after it.
    let path = "/origin/swr?h=Cache-Control:max-age%3D2%2C%20stale-while-revalidate%3D30&h=ETag:%22s%22&revalidate_ms=1000";
    let strict = "/origin/strict?h=Cache-Control:max-age%3D2%2C%20stale-while-revalidate%3D30%2C%20must-revalidate&h=ETag:%22s%22&revalidate_ms=1000";
    let mut first_served = Vec::new();
    for (host, _) in STORES {
        for path in [path, strict] {
            let first = rig.get_with(host, path, "");
            assert_eq!(first.header("x-cache"), Some("MISS"));
            first_served.push(first.header("x-served").unwrap_or("").to_string());
        }
    }
    std::thread::sleep(Duration::from_millis(2100));
    for (i, (host, store)) in STORES.into_iter().enumerate() {
        // RFC 5861: answered at once with the stale copy, and again while the app is asked.
        for _ in 0..2 {
            let started = std::time::Instant::now();
            let (status, verdict, _) = rig.get(host, path);
            assert_eq!((status, verdict.as_str()), (200, "STALE"), "{store}");
            assert!(started.elapsed() < Duration::from_millis(500), "{store}");
        }
        // The background revalidation's 304 refreshes the copy for the requests after it.
        eventually(Duration::from_secs(4), "the refreshed copy", || {
            let answer = rig.get_with(host, path, "");
            answer.header("x-cache") == Some("HIT")
                && answer.header("x-served") != Some(first_served[2 * i].as_str())
        });

        // must-revalidate: never stale; the first request revalidates and the others wait.
        let revalidating = {
            let rig = rig.clone();
            std::thread::spawn(move || rig.get(host, strict).1)
        };
        std::thread::sleep(Duration::from_millis(300));
        let started = std::time::Instant::now();
        let (status, verdict, _) = rig.get(host, strict);
        assert_eq!((status, verdict.as_str()), (200, "HIT"), "{store}");
        assert!(started.elapsed() >= Duration::from_millis(500), "{store}");
        assert_eq!(revalidating.join().expect("revalidation"), "REVALIDATED");
    }
    let refreshed = "switchyard_cache_background_revalidations_total{result=\"not_modified\"}";
    assert_eq!(rig.router.metric(refreshed), 2.0, "one per store");
}

#[test]
fn an_invalid_age_makes_an_answer_stale_not_age_zero() {
    let rig = Rig::start(json!({}));
    // §4.2.3, §5.1: a word, a sign, a fraction, a parameter, a list, two lines.
    let invalid = [
        "h=Age:old",
        "h=Age:-1",
        "h=Age:1.5",
        "h=Age:0%3B%20foo%3Dbar",
        "h=Age:old%2C%200",
        "h=Age:0%2C%200",
        "h=Age:0&h=Age:0",
        "h=Age:3600&h=Age:3600",
    ];
    for (host, store) in STORES {
        for (i, age) in invalid.iter().enumerate() {
            let path = format!("/origin/age{i}?h=Cache-Control:max-age%3D7200&{age}");
            assert_eq!(
                verdicts(&rig, host, &path, 2),
                ["MISS", "MISS"],
                "{store} {age}: not kept, nothing to revalidate with"
            );
            let tagged = format!("{path}&h=ETag:%22a{i}%22");
            assert_eq!(
                verdicts(&rig, host, &tagged, 2),
                ["MISS", "REVALIDATED"],
                "{store} {age}: kept stale, revalidated before use"
            );
        }
        let valid = "/origin/age?h=Cache-Control:max-age%3D7200&h=Age:3600";
        assert_eq!(verdicts(&rig, host, valid, 2), ["MISS", "HIT"], "{store}");
    }
}

#[test]
fn a_304_never_relabels_the_stored_body() {
    let rig = Rig::start(json!({}));
    // §3.2, §4.3.4: the 304 names another coding, digest, range and tag; only the other
    // fields are refreshed.
    let path = "/origin/label?h=Cache-Control:max-age%3D1&h=ETag:%22r1%22\
                &h=Content-MD5:c3RvcmVk&h=X-Release:1\
                &h304=ETag:%22r2%22&h304=Content-Encoding:gzip&h304=Content-MD5:b3RoZXI%3D\
                &h304=Content-Range:bytes%200-2/3&h304=Content-Length:3&h304=X-Release:2";
    for (host, store) in STORES {
        let first = rig.get_with(host, path, "");
        assert_eq!(first.header("x-cache"), Some("MISS"), "{store}");
        std::thread::sleep(Duration::from_millis(1100));
        let refreshed = rig.get_with(host, path, "");
        assert_eq!(refreshed.header("x-cache"), Some("REVALIDATED"), "{store}");
        let hit = rig.get_with(host, path, "");
        assert_eq!(hit.header("x-cache"), Some("HIT"), "{store}");
        for answer in [&refreshed, &hit] {
            assert_eq!(answer.text(), first.text(), "{store}: the stored body");
            assert_eq!(answer.header("etag"), Some("\"r1\""), "{store}");
            assert_eq!(answer.header("content-md5"), Some("c3RvcmVk"), "{store}");
            assert_eq!(answer.header("content-encoding"), None, "{store}");
            assert_eq!(answer.header("content-range"), None, "{store}");
            assert_eq!(
                answer.header("content-length"),
                Some(first.text().len().to_string().as_str()),
                "{store}"
            );
            assert_eq!(answer.header("x-release"), Some("2"), "{store}: refreshed");
        }
    }
}

#[test]
fn must_understand_and_the_precedence_of_targeted_fields() {
    let rig = Rig::start(json!({}));
    let cases = [
        // §5.2.2.3: a status this cache does not know is not kept; a known one is, and
        // must-understand sets aside the no-store meant for caches that do not know it.
        (
            "status=599&h=Cache-Control:max-age%3D60%2C%20must-understand",
            "MISS",
        ),
        (
            "h=Cache-Control:max-age%3D60%2C%20must-understand%2C%20no-store",
            "HIT",
        ),
        // CDN-Cache-Control, then Surrogate-Control, then Cache-Control: each pair.
        (
            "h=Surrogate-Control:max-age%3D60&h=Cache-Control:no-store",
            "HIT",
        ),
        (
            "h=Surrogate-Control:no-store&h=Cache-Control:max-age%3D60",
            "MISS",
        ),
        (
            "h=CDN-Cache-Control:max-age%3D60&h=Surrogate-Control:no-store",
            "HIT",
        ),
        (
            "h=CDN-Cache-Control:no-store&h=Surrogate-Control:max-age%3D60",
            "MISS",
        ),
        (
            "h=CDN-Cache-Control:max-age%3D60&h=Cache-Control:no-store",
            "HIT",
        ),
        (
            "h=CDN-Cache-Control:no-store&h=Cache-Control:max-age%3D60",
            "MISS",
        ),
        // A directive for another surrogate does not speak to this one.
        (
            "h=Surrogate-Control:max-age%3D60%3Bedge-b&h=Cache-Control:no-store",
            "MISS",
        ),
        (
            "h=Surrogate-Control:no-store%3Bedge-b&h=Cache-Control:max-age%3D60",
            "HIT",
        ),
    ];
    for (host, store) in STORES {
        for (i, (query, second)) in cases.iter().enumerate() {
            let path = format!("/origin/mu{i}?{query}");
            assert_eq!(
                verdicts(&rig, host, &path, 2),
                ["MISS", *second],
                "{store} {query}"
            );
        }
    }
}
