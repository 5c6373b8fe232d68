//! Certificates ordered by ACME from a real CA: Pebble and its DNS (every name resolves to
//! 127.0.0.1), started by the harness on free ports, validating HTTP-01 against the
//! router's plain HTTP listener. An opted-in app's domains get certificates served on the
//! next handshake; a validation that fails lands in `failed` with the CA's reason and waits
//! its back-off; a restart orders nothing again; two routers sharing Redis order once and
//! both serve, and a renewal leaves open connections alone.

use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use support::pebble::Pebble;
use support::{free_port, Backend, RedisServer, RouterProcess};
use switchyard_test_support as support;

/// The issuer looks again every second, so tests wait for orders, not intervals.
const CHECK_EVERY_SECOND: [&str; 2] = ["--acme-check-interval-s", "1"];

fn acme_router(pebble: &Pebble, http_port: u16, more: &[&str]) -> RouterProcess {
    let mut flags = pebble.router_flags();
    flags.extend(CHECK_EVERY_SECOND.iter().map(|s| s.to_string()));
    flags.extend(more.iter().map(|s| s.to_string()));
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    RouterProcess::start_on(http_port, &flags)
}

/// The domain's certificate description with its ACME state, once the state is `status`.
fn wait_for_state(router: &RouterProcess, domain: &str, status: &str) -> Value {
    let path = format!("/v1/certs/{domain}");
    let start = Instant::now();
    loop {
        let shown = router.admin_call("GET", &path, None).1;
        if shown["acme"]["status"] == status {
            return shown;
        }
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "{domain} never reached {status}: {shown}\n{}",
            router.logs()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn issued_by_pebble(pebble: &Pebble) -> usize {
    pebble.log().matches("Issued certificate serial").count()
}

#[test]
fn an_opted_in_app_gets_certificates_served_on_the_next_handshake_and_kept_over_a_restart() {
    let http_port = free_port();
    let pebble = Pebble::start(http_port);
    let mut router = acme_router(&pebble, http_port, &[]);
    // Holding the lease with nothing issued yet, the router knows no expiry: the metric is
    // absent, not 0 (which fired SwitchyardAcmeCertificateNearExpiry on every new router).
    support::eventually(Duration::from_secs(10), "the fleet's lease", || {
        router.metric("switchyard_acme_lease_held") == 1.0
    });
    let (_, scraped) = router.admin_call("GET", "/metrics", None);
    let scraped = scraped.as_str().unwrap_or_default().to_string();
    assert!(
        scraped.contains("switchyard_acme_lease_held 1"),
        "{scraped}"
    );
    assert!(
        !scraped.contains("switchyard_acme_soonest_expiry_days"),
        "an expiry exported before any certificate"
    );
    let backend = Backend::start("shop");
    router.put_app(
        "shop",
        json!({
            "domains": ["shop.test", "www.shop.test", "*.cdn.shop.test"],
            "backends": [backend.addr.to_string()],
            "https_redirect": true,
            "tls": {"acme": true},
        }),
    );
    router.put_app(
        "manual",
        json!({"domains": ["manual.test"], "backends": [backend.addr.to_string()]}),
    );

    for domain in ["shop.test", "www.shop.test"] {
        let shown = wait_for_state(&router, domain, "issued");
        assert!(
            shown["issuer"].as_str().unwrap_or("").contains("Pebble"),
            "{shown}"
        );
        assert_eq!(shown["acme"]["attempts"], 0);
        let not_after = shown["not_after"].as_i64().expect("not_after");
        assert_eq!(shown["acme"]["not_after_unix"], not_after);
        let not_before = shown["not_before"].as_i64().expect("not_before");
        assert_eq!(
            shown["acme"]["renew_at_unix"],
            not_before + (not_after - not_before) * 2 / 3,
            "renewed two thirds into its lifetime"
        );
        // The next handshake for the name gets it, and the app answers over it.
        let mut tls = support::tls::connect(router.https, Some(domain), &[]).expect("handshake");
        assert_eq!(
            Some(hex(&tls.fingerprint).as_str()),
            shown["sha256"].as_str()
        );
        assert!(
            tls.chain_length >= 2,
            "the CA's chain is served with the leaf"
        );
        let answer = tls.get(domain, "/").expect("GET over TLS");
        assert_eq!(answer.status, 200);
        assert_eq!(answer.json()["backend"], "shop");
    }
    // The redirect to HTTPS the app asks for never stood in the CA's way (the order
    // succeeded through it), and other paths are still redirected.
    assert_eq!(router.get("shop.test", "/").status, 308);

    let wildcard = wait_for_state(&router, "*.cdn.shop.test", "unsupported");
    assert!(
        wildcard["acme"]["reason"]
            .as_str()
            .unwrap_or("")
            .contains("DNS-01"),
        "{wildcard}"
    );
    assert_eq!(
        router.admin_call("GET", "/v1/certs/manual.test", None).0,
        404,
        "nothing is ordered for an app that did not opt in"
    );

    let (status, acme) = router.admin_call("GET", "/v1/acme", None);
    assert_eq!(status, 200, "{acme}");
    assert!(acme["lease"]["holder"].is_string(), "{acme}");
    assert_eq!(acme["domains"].as_array().map(Vec::len), Some(3), "{acme}");
    // What needs a look: only the wildcard, which HTTP-01 cannot order.
    let (_, attention) =
        router.admin_call("GET", "/v1/acme?status=failed,pending,unsupported", None);
    let listed: Vec<&str> = attention["domains"]
        .as_array()
        .expect("domains")
        .iter()
        .filter_map(|d| d["domain"].as_str())
        .collect();
    assert_eq!(listed, ["*.cdn.shop.test"], "{attention}");
    // By expiry, each issued certificate carries its ACME state.
    let (_, by_expiry) = router.admin_call("GET", "/v1/certs?order=expiry", None);
    let certs = by_expiry["certs"].as_array().expect("certs");
    assert_eq!(certs.len(), 2, "{by_expiry}");
    assert!(
        certs.iter().all(|c| c["acme"]["status"] == "issued"),
        "{by_expiry}"
    );
    assert_eq!(
        router.metric("switchyard_acme_orders_total{result=\"issued\"}"),
        2.0
    );
    assert_eq!(router.metric("switchyard_acme_lease_held"), 1.0);
    // Counted by the periodic round over every domain (each second here).
    support::eventually(Duration::from_secs(10), "the expiry metric", || {
        router.metric("switchyard_acme_soonest_expiry_days") > 30.0
    });
    assert_eq!(
        router.metric("switchyard_acme_domains{state=\"issued\"}"),
        2.0
    );
    assert_eq!(
        router.metric("switchyard_acme_domains{state=\"unsupported\"}"),
        1.0
    );
    // Pebble 2.4 has no renewal information (ARI): the issuer asked, learnt it, and keeps
    // renewing at two thirds. It asks in the round after the one that issued, which may
    // not have run when the expiry metric above is first counted.
    support::eventually(
        Duration::from_secs(10),
        "the renewal information asked",
        || {
            router
                .logs()
                .contains("the CA offers no renewal information")
        },
    );

    let status = Command::new(RouterProcess::binary())
        .args(["certs", "status", "--admin", &router.admin.to_string()])
        .output()
        .expect("switchyard certs status");
    let text = String::from_utf8_lossy(&status.stdout);
    assert!(status.status.success(), "{text}");
    assert!(
        text.contains("www.shop.test") && text.contains("issued"),
        "{text}"
    );
    assert!(text.contains("unsupported"), "{text}");

    // A restart finds every certificate and state in the store: nothing is ordered again.
    let issued = issued_by_pebble(&pebble);
    assert_eq!(issued, 2);
    router.terminate();
    router.restart();
    let first = router.admin_call("GET", "/v1/certs/shop.test", None).1;
    assert_eq!(first["acme"]["status"], "issued");
    std::thread::sleep(Duration::from_secs(3));
    assert_eq!(
        issued_by_pebble(&pebble),
        issued,
        "re-ordered after a restart"
    );
    assert_eq!(router.metric("switchyard_acme_lease_held"), 1.0);
    assert_eq!(
        router.metric("switchyard_acme_orders_total{result=\"issued\"}"),
        0.0
    );
}

#[test]
fn a_failed_validation_is_recorded_with_the_reason_and_waits_its_back_off() {
    // Pebble validates on a port where nothing listens: the name is not served by us.
    let pebble = Pebble::start(free_port());
    let router = acme_router(&pebble, free_port(), &[]);
    router.put_app(
        "elsewhere",
        json!({"domains": ["elsewhere.test"], "backends": ["127.0.0.1:9"], "tls": {"acme": true}}),
    );
    let started = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock")
        .as_secs() as i64;
    let shown = wait_for_state(&router, "elsewhere.test", "failed");
    let acme = &shown["acme"];
    assert_eq!(acme["attempts"], 1, "{shown}");
    let reason = acme["reason"].as_str().unwrap_or("");
    assert!(
        reason.contains("refused") || reason.contains("connection"),
        "the CA's reason: {reason}"
    );
    let next_try = acme["next_try_unix"].as_i64().expect("next try");
    assert!(
        (started + 55..=started + 75).contains(&next_try),
        "a minute's back-off: {next_try} vs {started}"
    );
    // Rounds every second, and still no second order before the back-off ends.
    let orders = pebble.log().matches("POST /order-plz").count();
    assert_eq!(orders, 1, "{}", pebble.log());
    std::thread::sleep(Duration::from_secs(3));
    assert_eq!(pebble.log().matches("POST /order-plz").count(), orders);
    assert_eq!(
        router.metric("switchyard_acme_orders_total{result=\"failed\"}"),
        1.0
    );
    assert_eq!(
        router.metric("switchyard_acme_domains{state=\"failed\"}"),
        1.0
    );
}

/// Two routers on one Redis: one holds the lease and orders, the CA validates against the
/// other (whichever router the name's traffic reaches answers the challenge), both serve the
/// certificate; a renewal replaces it on the next handshake and leaves open connections up.
#[test]
fn a_fleet_orders_once_answers_challenges_on_every_router_and_renews_without_cutting() {
    let redis = RedisServer::start();
    let store = redis.url();
    let validated_port = free_port();
    let pebble = Pebble::start(validated_port);
    let first = acme_router(&pebble, free_port(), &["--store", &store]);
    let second = acme_router(&pebble, validated_port, &["--store", &store]);
    let backend = Backend::start("fleet");
    first.put_app(
        "fleet",
        json!({"domains": ["fleet.test"], "backends": [backend.addr.to_string()], "tls": {"acme": true}}),
    );
    let shown = wait_for_state(&first, "fleet.test", "issued");
    let issued = shown["sha256"].as_str().expect("sha256").to_string();
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!(issued_by_pebble(&pebble), 1, "ordered once for the fleet");
    let orders: f64 = [&first, &second]
        .iter()
        .map(|r| r.metric("switchyard_acme_orders_total{result=\"issued\"}"))
        .sum();
    assert_eq!(orders, 1.0);
    let holders: f64 = [&first, &second]
        .iter()
        .map(|r| r.metric("switchyard_acme_lease_held"))
        .sum();
    assert_eq!(holders, 1.0, "one lease holder");
    for router in [&first, &second] {
        let tls = support::tls::connect(router.https, Some("fleet.test"), &[]).expect("handshake");
        assert_eq!(hex(&tls.fingerprint), issued);
    }

    // Renewal: the record says it is due (as it would two thirds into a 90-day lifetime).
    let mut open = support::tls::connect(second.https, Some("fleet.test"), &[]).expect("handshake");
    assert_eq!(open.get("fleet.test", "/").expect("GET").status, 200);
    let mut redis_connection = redis.connection().expect("redis");
    let key = "switchyard:acme:domain:fleet.test";
    let mut record: Value = serde_json::from_str(
        &redis::cmd("GET")
            .arg(key)
            .query::<String>(&mut redis_connection)
            .expect("state record"),
    )
    .expect("JSON");
    record["renew_at_unix"] = json!(0);
    redis::cmd("SET")
        .arg(key)
        .arg(record.to_string())
        .query::<()>(&mut redis_connection)
        .expect("SET");
    let start = Instant::now();
    let renewed = loop {
        let shown = first.admin_call("GET", "/v1/certs/fleet.test", None).1;
        // The certificate and the order's record are two writes: the view may show the
        // new certificate a moment before the record counts it.
        if shown["sha256"].as_str().is_some_and(|s| s != issued)
            && shown["acme"]["issued_count"] == 2
        {
            break shown;
        }
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "not renewed: {shown}\n{}\n{}",
            first.logs(),
            second.logs()
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    assert_eq!(renewed["acme"]["issued_count"], 2, "{renewed}");
    let reopened = support::tls::connect(second.https, Some("fleet.test"), &[]).expect("handshake");
    assert_eq!(
        Some(hex(&reopened.fingerprint).as_str()),
        renewed["sha256"].as_str()
    );
    let answer = open
        .get("fleet.test", "/")
        .expect("the connection opened before the renewal still answers");
    assert_eq!(answer.status, 200);
    assert_eq!(hex(&open.fingerprint), issued, "it kept its certificate");
}

/// The lease holder killed in the middle of an order: once its lease runs out (30 s), the
/// other router takes it and finishes the domain.
#[test]
fn a_holder_killed_mid_order_is_taken_over_when_its_lease_runs_out() {
    let redis = RedisServer::start();
    let store = redis.url();
    let validated_port = free_port();
    let pebble = Pebble::start(validated_port);
    // The holder starts first and takes the lease; the survivor is the router on the port
    // Pebble validates, so its own order can succeed once it takes over (were the holder
    // on that port, the survivor's challenge would be refused and the test would wait out a
    // back-off).
    let first = acme_router(&pebble, free_port(), &["--store", &store]);
    support::eventually(
        Duration::from_secs(10),
        "the first router to take the lease",
        || first.metric("switchyard_acme_lease_held") == 1.0,
    );
    let mut routers = [
        first,
        acme_router(&pebble, validated_port, &["--store", &store]),
    ];
    let (holder, survivor) = (0, 1);
    routers[survivor].put_app(
        "late",
        json!({"domains": ["late.test"], "backends": ["127.0.0.1:9"], "tls": {"acme": true}}),
    );
    let start = Instant::now();
    let seen = loop {
        let shown = routers[survivor]
            .admin_call("GET", "/v1/certs/late.test", None)
            .1;
        if matches!(
            shown["acme"]["status"].as_str(),
            Some("validating" | "issued")
        ) {
            break shown["acme"]["status"].as_str().unwrap_or("").to_string();
        }
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "no order started: {shown}"
        );
        std::thread::sleep(Duration::from_millis(2));
    };
    routers[holder].kill9();
    let killed = Instant::now();
    let shown = wait_for_state(&routers[survivor], "late.test", "issued");
    assert_eq!(routers[survivor].metric("switchyard_acme_lease_held"), 1.0);
    if seen == "validating" {
        assert_eq!(
            routers[survivor].metric("switchyard_acme_orders_total{result=\"issued\"}"),
            1.0,
            "the survivor finished the order: {shown}"
        );
        assert!(
            killed.elapsed() >= Duration::from_secs(20),
            "not before the lease ran out: {:?}",
            killed.elapsed()
        );
    }
    let tls =
        support::tls::connect(routers[survivor].https, Some("late.test"), &[]).expect("handshake");
    assert_eq!(
        Some(hex(&tls.fingerprint).as_str()),
        shown["sha256"].as_str()
    );
}

/// A CA that requires external account binding: an account made with the key id and HMAC
/// given gets certificates; without them the CA's refusal is the domain's reason.
#[test]
fn external_account_binding_is_sent_when_given_and_its_absence_is_reported() {
    let hmac = "zWNDZM6eQGHWpSRTPal5eIUYFTu7EajVIoguysqZ9wG44nMEtx3MUAsUDkMTQ12W";
    let http_port = free_port();
    let pebble = Pebble::start_requiring(http_port, Some(("kid-1", hmac)));
    let unbound = acme_router(&pebble, free_port(), &[]);
    unbound.put_app(
        "unbound",
        json!({"domains": ["unbound.test"], "backends": ["127.0.0.1:9"], "tls": {"acme": true}}),
    );
    let refused = wait_for_state(&unbound, "unbound.test", "failed");
    let reason = refused["acme"]["reason"].as_str().unwrap_or("");
    assert!(
        reason.contains("creating the account") && reason.to_lowercase().contains("external"),
        "the CA's refusal: {reason}"
    );

    let bound = acme_router(
        &pebble,
        http_port,
        &["--acme-eab-kid", "kid-1", "--acme-eab-hmac", hmac],
    );
    bound.put_app(
        "bound",
        json!({"domains": ["bound.test"], "backends": ["127.0.0.1:9"], "tls": {"acme": true}}),
    );
    let issued = wait_for_state(&bound, "bound.test", "issued");
    let tls = support::tls::connect(bound.https, Some("bound.test"), &[]).expect("handshake");
    assert_eq!(
        Some(hex(&tls.fingerprint).as_str()),
        issued["sha256"].as_str()
    );
}

#[test]
fn tls_alpn_01_is_answered_on_the_https_listener_when_port_80_is_closed() {
    // Pebble checks HTTP-01 on a port where nothing listens: only TLS-ALPN-01, on the
    // router's HTTPS listener, can succeed.
    let https_port = free_port();
    let pebble = Pebble::start_validating_tls(free_port(), https_port);
    let mut flags = pebble.router_flags();
    flags.extend(CHECK_EVERY_SECOND.iter().map(|s| s.to_string()));
    flags.extend(["--acme-challenge".to_string(), "tls-alpn-01".to_string()]);
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    let router = RouterProcess::start_on_ports(free_port(), https_port, &flags);
    let backend = Backend::start("alpn");
    router.put_app(
        "alpn",
        json!({"domains": ["alpn.test"], "backends": [backend.addr.to_string()], "tls": {"acme": true}}),
    );

    let shown = wait_for_state(&router, "alpn.test", "issued");
    assert_eq!(issued_by_pebble(&pebble), 1);
    assert!(
        router
            .logs()
            .contains("answered a TLS-ALPN-01 validation for alpn.test"),
        "{}",
        router.logs()
    );
    let mut tls = support::tls::connect(router.https, Some("alpn.test"), &[]).expect("handshake");
    assert_eq!(
        Some(hex(&tls.fingerprint).as_str()),
        shown["sha256"].as_str()
    );
    assert_eq!(tls.get("alpn.test", "/").expect("GET").status, 200);
    // The order is over and its answer removed: a validator's handshake now gets no
    // certificate at all, never the app's.
    assert!(
        support::tls::connect(router.https, Some("alpn.test"), &["acme-tls/1"]).is_err(),
        "a TLS-ALPN-01 handshake with no order open was answered"
    );
    assert_eq!(
        router.metric("switchyard_acme_orders_total{result=\"issued\"}"),
        1.0
    );
}
