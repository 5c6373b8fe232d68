//! Fleet mode: routers sharing one real Redis (started here on a free port). Changes reach
//! every router through Pub/Sub; a Redis outage never takes known routes down.

use switchyard_test_support as support;

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use support::pki::Ca;
use support::{eventually, tls, Backend, RedisServer, RouterProcess};

fn router_on(redis: &RedisServer) -> RouterProcess {
    RouterProcess::start_with(&["--store", &redis.url(), "--redis-timeout-ms", "300"])
}

/// A router on a running Redis, once it follows the change channel.
fn subscribed_router_on(redis: &RedisServer) -> RouterProcess {
    let router = router_on(redis);
    eventually(Duration::from_secs(5), "the change subscription", || {
        router.metric("switchyard_store_subscription_connected") == 1.0
    });
    router
}

fn backend_name(router: &RouterProcess, host: &str) -> Option<String> {
    let response = support::get(router.http, host, "/").ok()?;
    (response.status == 200).then(|| {
        response.json()["backend"]
            .as_str()
            .unwrap_or("")
            .to_string()
    })
}

#[test]
fn a_change_on_one_router_reaches_the_other_within_a_second() {
    let redis = RedisServer::start();
    let a = subscribed_router_on(&redis);
    let b = subscribed_router_on(&redis);
    let first = Backend::start("first");
    let second = Backend::start("second");

    a.put_app(
        "shop",
        json!({"domains": ["shop.test"], "backends": [first.addr.to_string()]}),
    );
    let took = eventually(
        Duration::from_secs(1),
        "router B to serve the new app",
        || backend_name(&b, "shop.test").as_deref() == Some("first"),
    );
    eprintln!("PUT on A answered on B after {took:?}");
    assert_eq!(backend_name(&a, "shop.test").as_deref(), Some("first"));

    a.scale("shop", &[second.addr]);
    assert_eq!(
        backend_name(&a, "shop.test").as_deref(),
        Some("second"),
        "the router that took the write routes by it as soon as it answers"
    );
    eventually(
        Duration::from_secs(1),
        "router B to follow the scale",
        || backend_name(&b, "shop.test").as_deref() == Some("second"),
    );

    let (status, listing) = b.admin_call("GET", "/v1/apps", None);
    assert_eq!(status, 200);
    assert_eq!(
        listing["apps"][0]["name"], "shop",
        "one store for the fleet"
    );

    let (status, conflict) = b.admin_call(
        "PUT",
        "/v1/apps/other",
        Some(&json!({"domains": ["shop.test"]}).to_string()),
    );
    assert_eq!((status, conflict["field"].as_str()), (409, Some("domains")));

    let cert = Ca::root("Test Root").issue(&["shop.test"], -1, 30);
    a.store_cert("shop.test", &cert);
    assert!(tls::connect(a.https, Some("shop.test"), &[])
        .is_ok_and(|c| c.fingerprint == cert.fingerprint));
    eventually(
        Duration::from_secs(1),
        "router B to serve the certificate",
        || {
            tls::connect(b.https, Some("shop.test"), &[])
                .is_ok_and(|c| c.fingerprint == cert.fingerprint)
        },
    );

    let (status, _) = a.admin_call("DELETE", "/v1/apps/shop", None);
    assert_eq!(status, 204);
    assert_eq!(
        support::get(a.http, "shop.test", "/")
            .map(|r| r.status)
            .ok(),
        Some(404)
    );
    eventually(Duration::from_secs(1), "router B to forget the app", || {
        support::get(b.http, "shop.test", "/").is_ok_and(|r| r.status == 404)
    });
}

#[test]
fn tooling_writing_the_documented_layout_and_publishing_is_picked_up() {
    let redis = RedisServer::start();
    let router = subscribed_router_on(&redis);
    let backend = Backend::start("external");
    assert_eq!(router.get("ext.test", "/").status, 404);

    // What a platform's own deploy tool does (docs/fleet.md, "Redis layout").
    let app = json!({"name": "ext", "domains": ["ext.test"],
                     "backends": [{"address": backend.addr.to_string(), "weight": 1}]});
    let mut conn = redis.connection().expect("redis");
    let (revision,): (i64,) = redis::pipe()
        .atomic()
        .cmd("SET")
        .arg("switchyard:app:ext")
        .arg(app.to_string())
        .ignore()
        .cmd("SET")
        .arg("switchyard:domain:ext.test")
        .arg("ext")
        .ignore()
        .cmd("ZADD")
        .arg("switchyard:apps")
        .arg(0)
        .arg("ext")
        .ignore()
        .cmd("INCR")
        .arg("switchyard:revision")
        .query(&mut conn)
        .expect("write");
    let event = json!({"kind": "app", "name": "ext", "domains": ["ext.test"], "rev": revision});
    let _: i64 = redis::cmd("PUBLISH")
        .arg("switchyard:changes")
        .arg(event.to_string())
        .query(&mut conn)
        .expect("publish");

    eventually(Duration::from_secs(1), "the externally written app", || {
        backend_name(&router, "ext.test").as_deref() == Some("external")
    });
    let (status, stored) = router.admin_call("GET", "/v1/apps/ext", None);
    assert_eq!((status, &stored["domains"]), (200, &json!(["ext.test"])));
}

#[test]
fn a_redis_outage_keeps_known_routes_serving_and_missed_changes_are_recovered() {
    let mut redis = RedisServer::start();
    let router = subscribed_router_on(&redis);
    let first = Backend::start("first");
    let second = Backend::start("second");
    router.put_app(
        "steady",
        json!({"domains": ["steady.test", "*.steady.test"], "backends": [first.addr.to_string()]}),
    );
    for host in ["steady.test", "a.steady.test"] {
        eventually(Duration::from_secs(1), "the app to be served", || {
            backend_name(&router, host).as_deref() == Some("first")
        });
    }
    // A fill racing the PUT's own event is not kept (it might be stale); once the event is
    // applied, the next requests fill the cache for good. "Known" routes are cached ones.
    let hits = router.metric("switchyard_route_cache_hits_total");
    eventually(Duration::from_secs(5), "the routes to be cached", || {
        ["steady.test", "a.steady.test"]
            .iter()
            .all(|host| backend_name(&router, host).as_deref() == Some("first"))
            && router.metric("switchyard_route_cache_hits_total") >= hits + 8.0
    });

    // Constant traffic to the cached hosts for the whole outage.
    let stop = Arc::new(AtomicBool::new(false));
    let (sent, failed) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let traffic = {
        let (stop, sent, failed) = (stop.clone(), sent.clone(), failed.clone());
        let http = router.http;
        std::thread::spawn(move || {
            let mut n = 0usize;
            while !stop.load(Ordering::Relaxed) {
                let host = if n.is_multiple_of(2) {
                    "steady.test"
                } else {
                    "a.steady.test"
                };
                n += 1;
                sent.fetch_add(1, Ordering::Relaxed);
                if !support::get(http, host, "/").is_ok_and(|r| r.status == 200) {
                    failed.fetch_add(1, Ordering::Relaxed);
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        })
    };

    redis.stop();
    let outage = Instant::now();
    std::thread::sleep(Duration::from_secs(1));
    let started = Instant::now();
    let (status, answer) = router.admin_call(
        "PUT",
        "/v1/apps/newcomer",
        Some(&json!({"domains": ["new.test"]}).to_string()),
    );
    assert_eq!(
        status, 503,
        "admin writes are refused while Redis is away: {answer}"
    );
    assert!(
        answer["error"].as_str().unwrap_or("").contains("store"),
        "{answer}"
    );
    let unknown = router.get("never-cached.test", "/");
    assert_eq!(unknown.status, 503, "an uncached host fails clearly");
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "failures are fast, not hangs: {:?}",
        started.elapsed()
    );
    while outage.elapsed() < Duration::from_secs(30) {
        std::thread::sleep(Duration::from_millis(200));
    }
    assert_eq!(router.metric("switchyard_store_available"), 0.0);
    assert!(router.metric("switchyard_stale_serves_total") > 0.0);

    redis.spawn();
    eventually(Duration::from_secs(10), "the router to resubscribe", || {
        router.metric("switchyard_store_subscription_connected") == 1.0
    });
    stop.store(true, Ordering::Relaxed);
    traffic.join().expect("traffic thread");
    let (sent, failed) = (sent.load(Ordering::Relaxed), failed.load(Ordering::Relaxed));
    eprintln!("{sent} requests during a 30 s Redis outage, {failed} failed");
    assert!(sent > 500, "traffic kept flowing: {sent}");
    assert_eq!(failed, 0, "no request to a known host failed");

    // A change whose event this router cannot receive: its subscription is killed in the
    // same transaction that writes and announces the change. Only the revision check on
    // resubscription can find it.
    let resyncs = router.metric("switchyard_route_resyncs_total");
    let (_, stored) = router.admin_call("GET", "/v1/apps/steady", None);
    let mut changed: Value = stored.clone();
    changed["backends"] = json!([{"address": second.addr.to_string(), "weight": 1}]);
    let mut conn = redis.connection().expect("redis");
    let _: () = redis::pipe()
        .atomic()
        .cmd("CLIENT")
        .arg("KILL")
        .arg("TYPE")
        .arg("pubsub")
        .ignore()
        .cmd("SET")
        .arg("switchyard:app:steady")
        .arg(changed.to_string())
        .ignore()
        .cmd("INCR")
        .arg("switchyard:revision")
        .ignore()
        .cmd("PUBLISH")
        .arg("switchyard:changes")
        .arg(json!({"kind": "app", "name": "steady", "domains": []}).to_string())
        .ignore()
        .query(&mut conn)
        .expect("missed change");
    eventually(
        Duration::from_secs(5),
        "the missed change to be recovered",
        || backend_name(&router, "steady.test").as_deref() == Some("second"),
    );
    assert!(router.metric("switchyard_route_resyncs_total") > resyncs);
    assert_eq!(
        router.put_app("newcomer", json!({"domains": ["new.test"]}))["name"],
        "newcomer"
    );
}

#[test]
fn a_router_started_while_redis_is_down_comes_up_and_serves_when_it_appears() {
    let mut redis = RedisServer::reserve();
    let router = router_on(&redis);
    let backend = Backend::start("late");
    let started = Instant::now();
    assert_eq!(router.get("late.test", "/").status, 503);
    assert!(started.elapsed() < Duration::from_secs(3));
    assert!(
        router.logs().contains("Redis"),
        "the outage is reported:\n{}",
        router.logs()
    );
    // Not ready for a load balancer: it knows no app yet.
    let (status, readiness) = router.admin_call("GET", "/readyz", None);
    assert_eq!((status, &readiness["status"]), (503, &json!("starting")));

    redis.spawn();
    eventually(Duration::from_secs(5), "ready once Redis answers", || {
        router.admin_call("GET", "/readyz", None).0 == 200
    });
    eventually(Duration::from_secs(5), "admin writes to succeed", || {
        router
            .admin_call(
                "PUT",
                "/v1/apps/late",
                Some(
                    &json!({"domains": ["late.test"], "backends": [backend.addr.to_string()]})
                        .to_string(),
                ),
            )
            .0
            == 200
    });
    eventually(Duration::from_secs(2), "the app to be served", || {
        backend_name(&router, "late.test").as_deref() == Some("late")
    });
}

#[test]
fn the_store_status_shows_the_subscription_and_the_last_revision_seen() {
    let mut redis = RedisServer::start();
    let a = subscribed_router_on(&redis);
    let b = subscribed_router_on(&redis);
    let (status, shown) = b.admin_call("GET", "/v1/store", None);
    assert_eq!(status, 200, "{shown}");
    assert_eq!(shown["kind"], "redis");
    assert_eq!(shown["subscribed"], true);
    assert!(
        redis
            .url()
            .ends_with(shown["location"].as_str().unwrap_or("?")),
        "{shown} for {}",
        redis.url()
    );
    let before = shown["last_revision"].as_i64().expect("a revision");
    // Redis keeps its own backups (RDB, AOF): the router says so, naming the field.
    let (status, refused) = b.admin_call("GET", "/v1/store/backup", None);
    assert_eq!(
        (status, &refused["field"]),
        (409, &json!("store")),
        "{refused}"
    );
    assert!(
        refused["error"].as_str().unwrap_or("").contains("RDB"),
        "{refused}"
    );
    assert!(shown["seconds_since_last_sync"].as_i64().expect("since") < 30);

    a.put_app(
        "counted",
        json!({"domains": ["counted.test"], "backends": ["127.0.0.1:9"]}),
    );
    eventually(
        Duration::from_secs(5),
        "router B sees the new revision",
        || b.admin_call("GET", "/v1/store", None).1["last_revision"].as_i64() == Some(before + 1),
    );
    assert_eq!(b.metric("switchyard_store_revision"), (before + 1) as f64);

    redis.stop();
    eventually(
        Duration::from_secs(10),
        "the subscription seen down",
        || b.admin_call("GET", "/v1/store", None).1["subscribed"] == false,
    );
    // `available` is the last call's outcome: a read that finds Redis away turns it.
    assert_eq!(b.admin_call("GET", "/v1/apps/counted", None).0, 503);
    assert_eq!(b.admin_call("GET", "/v1/store", None).1["available"], false);
    // Still ready: it routes from memory, and a fleet leaving its load balancer over a
    // Redis outage would be down for nothing.
    let (status, readiness) = b.admin_call("GET", "/readyz", None);
    assert_eq!(status, 200, "{readiness}");
    assert_eq!(readiness["store_available"], false);

    let embedded = RouterProcess::start();
    let shown = embedded.admin_call("GET", "/v1/store", None).1;
    assert_eq!(shown["kind"], "embedded");
    assert!(
        shown["location"]
            .as_str()
            .unwrap_or("")
            .ends_with("switchyard.redb"),
        "{shown}"
    );
    assert!(shown.get("subscribed").is_none(), "{shown}");
}

#[test]
fn a_router_runs_on_the_redis_acl_user_the_security_page_gives() {
    let redis = RedisServer::start();
    // The line of docs/security.md, as an operator would paste it.
    let page = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/security.md"))
        .expect("docs/security.md");
    let line = page
        .lines()
        .map(str::trim)
        .find(|line| line.starts_with("ACL SETUSER switchyard "))
        .expect("an ACL line in docs/security.md");
    let mut command = redis::cmd("ACL");
    for word in line.split_whitespace().skip(1) {
        command.arg(word.replace("PASSWORD", "router-secret"));
    }
    let mut admin = redis.connection().expect("a connection");
    command
        .query::<()>(&mut admin)
        .expect("the ACL line is taken");

    let url = redis
        .url()
        .replace("redis://", "redis://switchyard:router-secret@");
    let a = RouterProcess::start_with(&["--store", &url, "--redis-timeout-ms", "300"]);
    let b = RouterProcess::start_with(&["--store", &url, "--redis-timeout-ms", "300"]);
    for router in [&a, &b] {
        eventually(Duration::from_secs(5), "the change subscription", || {
            router.metric("switchyard_store_subscription_connected") == 1.0
        });
    }
    let backend = Backend::start("acl");
    a.put_app(
        "limited",
        json!({"domains": ["limited.test"], "backends": [backend.addr.to_string()]}),
    );
    eventually(
        Duration::from_secs(2),
        "router B routes by A's write",
        || backend_name(&b, "limited.test").as_deref() == Some("acl"),
    );
    let (status, shown) = b.admin_call("GET", "/v1/store", None);
    assert_eq!(
        (status, &shown["available"]),
        (200, &json!(true)),
        "{shown}"
    );
    assert!(
        !a.logs().contains("NOPERM") && !b.logs().contains("NOPERM"),
        "no call refused by the ACL:\n{}\n{}",
        a.logs(),
        b.logs()
    );
}

/// `DELETE path` on `router` with `If-Match: tag`: the status.
fn delete_if_match(router: &RouterProcess, path: &str, tag: &str) -> u16 {
    let request = format!(
        "DELETE {path} HTTP/1.1\r\nHost: a\r\nIf-Match: {tag}\r\nConnection: close\r\n\r\n"
    );
    support::request(router.admin, &request)
        .expect("response")
        .status
}

#[test]
fn an_if_match_write_through_one_router_loses_to_a_change_made_through_another() {
    let redis = RedisServer::start();
    let (a, b) = (subscribed_router_on(&redis), subscribed_router_on(&redis));
    a.put_app("raced", json!({"domains": ["raced.test"], "retries": 1}));
    let read = support::get(a.admin, "admin", "/v1/apps/raced").expect("response");
    let tag = read.header("etag").expect("an ETag").to_string();
    let seen_by_b = support::get(b.admin, "admin", "/v1/apps/raced").expect("response");
    assert_eq!(
        seen_by_b.header("etag"),
        Some(tag.as_str()),
        "one tag on every router"
    );
    b.put_app("raced", json!({"domains": ["raced.test"], "retries": 2}));
    let body = json!({"domains": ["raced.test"], "retries": 3}).to_string();
    let stale = support::request(
        a.admin,
        &format!(
            "PUT /v1/apps/raced HTTP/1.1\r\nHost: a\r\nIf-Match: {tag}\r\n\
             Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        ),
    )
    .expect("response");
    assert_eq!(stale.status, 412, "{}", stale.text());
    assert_eq!(a.admin_call("GET", "/v1/apps/raced", None).1["retries"], 2);
    assert_eq!(delete_if_match(&a, "/v1/apps/raced", &tag), 412);
    let current = support::get(a.admin, "admin", "/v1/apps/raced").expect("response");
    let current = current.header("etag").expect("an ETag").to_string();
    assert_eq!(delete_if_match(&a, "/v1/apps/raced", &current), 204);

    // Certificates the same: renewed through B, a delete from A's older read loses.
    let ca = Ca::root("Raced Root");
    a.store_cert("raced.test", &ca.issue(&["raced.test"], -1, 30));
    let read = support::get(a.admin, "admin", "/v1/certs/raced.test").expect("response");
    let tag = read.header("etag").expect("an ETag").to_string();
    b.store_cert("raced.test", &ca.issue(&["raced.test"], -1, 60));
    assert_eq!(delete_if_match(&a, "/v1/certs/raced.test", &tag), 412);
    assert_eq!(a.admin_call("GET", "/v1/certs/raced.test", None).0, 200);
}

#[test]
fn a_write_is_answered_once_a_replica_holds_it_and_refused_when_too_few_can() {
    let primary = RedisServer::start();
    let mut replica = RedisServer::start_replica_of(primary.addr);
    let start = |acks: &str| {
        let url = primary.url();
        let args = ["--store", &url, "--redis-timeout-ms", "300"];
        RouterProcess::start_with(
            &[
                &args[..],
                &[
                    "--store-ack-replicas",
                    acks,
                    "--store-ack-timeout-ms",
                    "300",
                ],
            ]
            .concat(),
        )
    };
    let spec = |domain: &str| json!({"domains": [domain], "backends": ["127.0.0.1:9"]});
    // `auto`: the primary has a replica, so a write is answered once the replica has it.
    let auto = start("auto");
    auto.put_app("held", spec("held.test"));
    let mut on_replica = replica.connection().expect("the replica");
    let stored: Option<String> = redis::cmd("GET")
        .arg("switchyard:app:held")
        .query(&mut on_replica)
        .expect("GET");
    assert!(stored.is_some(), "the replica holds the acknowledged write");

    // Two replicas asked of one: on the primary, not safe, and said so.
    let strict = start("2");
    let (status, refused) = strict.admin_call(
        "PUT",
        "/v1/apps/strict",
        Some(&spec("strict.test").to_string()),
    );
    assert_eq!(
        (status, &refused["field"]),
        (503, &json!("store")),
        "{refused}"
    );
    assert!(
        refused["error"]
            .as_str()
            .unwrap_or("")
            .contains("not yet safe"),
        "{refused}"
    );
    assert_eq!(
        strict.metric("switchyard_store_writes_not_durable_total"),
        1.0
    );
    let scaled = std::process::Command::new(RouterProcess::binary())
        .args(["apps", "scale", "held", "--backend", "127.0.0.1:10"])
        .args(["--admin", &strict.admin.to_string()])
        .output()
        .expect("the CLI");
    assert!(!scaled.status.success(), "the CLI exits non-zero");

    // No replica left: `auto` asks for none, an explicit 1 is refused, never lowered.
    replica.stop();
    eventually(
        Duration::from_secs(5),
        "the primary to see its replica go",
        || primary.info_has("connected_slaves:0"),
    );
    auto.put_app("alone", json!({"domains": ["alone.test"]}));
    let one = start("1");
    let (status, refused) =
        one.admin_call("PUT", "/v1/apps/one", Some(&spec("one.test").to_string()));
    assert_eq!(status, 503, "{refused}");
}
