//! HTTPS with per-domain certificates chosen by SNI from the store: real TLS handshakes
//! against the real binary, with certificates generated here, checked by fingerprint.

use switchyard_test_support as support;

use std::io::Write;
use std::net::{SocketAddr, TcpStream};
use std::process::Command;
use std::time::Duration;

use serde_json::{json, Value};
use support::pki::{Ca, Issued};
use support::tls::{self, TlsConnection};
use support::{eventually, free_port, Backend, RouterProcess};

fn handshake(router: &RouterProcess, at: SocketAddr, server_name: &str) -> TlsConnection {
    tls::connect(at, Some(server_name), &["http/1.1"]).unwrap_or_else(|e| {
        panic!(
            "handshake for {server_name} at {at}: {e}\n{}",
            router.logs()
        )
    })
}

#[test]
fn sni_picks_the_exact_then_the_wildcard_certificate_and_unknown_names_fail_cleanly() {
    let router = RouterProcess::start();
    let backend = Backend::start("shop");
    let ca = Ca::root("Test Root");
    let shop = ca.issue(&["shop.test"], -1, 30);
    let wildcard = ca.issue(&["*.apps.test"], -1, 30);
    router.store_cert("shop.test", &shop);
    router.store_cert("*.apps.test", &wildcard);
    router.put_app(
        "shop",
        json!({"domains": ["shop.test", "*.apps.test"], "backends": [backend.addr.to_string()]}),
    );
    assert_eq!(
        router.metric("switchyard_cert_cache_entries"),
        0.0,
        "nothing is parsed before a handshake needs it"
    );

    let https = router.https;
    let mut exact = handshake(&router, https, "shop.test");
    assert_eq!(exact.fingerprint, shop.fingerprint, "the exact certificate");
    let response = exact
        .get("shop.test", "/over-tls")
        .expect("request over TLS");
    assert_eq!(response.status, 200);
    let seen = response.json();
    assert_eq!(seen["headers"]["x-forwarded-proto"], "https");
    assert!(router.metric("switchyard_cert_cache_misses_total") >= 1.0);

    let misses = router.metric("switchyard_cert_cache_misses_total");
    handshake(&router, https, "shop.test");
    assert_eq!(
        router.metric("switchyard_cert_cache_misses_total"),
        misses,
        "a warm certificate is served from the cache"
    );

    assert_eq!(
        handshake(&router, https, "Blog.Apps.Test").fingerprint,
        wildcard.fingerprint,
        "a one-label wildcard match, case-insensitive"
    );
    let refused_before =
        router.metric("switchyard_tls_handshakes_total{result=\"no_certificate\"}");
    for uncovered in ["deep.blog.apps.test", "unknown.test"] {
        let refused = tls::connect(https, Some(uncovered), &[]);
        assert!(refused.is_err(), "{uncovered} has no certificate");
    }
    assert!(
        tls::connect(https, None, &[]).is_err(),
        "no SNI and no default certificate"
    );
    assert_eq!(
        router.metric("switchyard_tls_handshakes_total{result=\"no_certificate\"}"),
        refused_before + 3.0,
        "each refusal counted"
    );
    // The refusals cost nothing to the others.
    assert_eq!(
        handshake(&router, https, "shop.test").fingerprint,
        shop.fingerprint
    );
    assert_eq!(
        router.get("shop.test", "/").status,
        200,
        "plain HTTP still serves"
    );

    let https = router.https;
    let offered_both = tls::connect(https, Some("shop.test"), &["h2", "http/1.1"])
        .expect("handshake")
        .alpn;
    assert_eq!(
        offered_both.as_deref(),
        Some("h2"),
        "HTTP/2 is preferred by ALPN"
    );
    let http11_only = tls::connect(https, Some("shop.test"), &["http/1.1"])
        .expect("handshake")
        .alpn;
    assert_eq!(http11_only.as_deref(), Some("http/1.1"));
}

#[test]
fn the_default_certificate_answers_names_without_their_own() {
    let ca = Ca::root("Test Root");
    let default = ca.issue(&["default.invalid"], -1, 30);
    let dir = tempfile::tempdir().expect("tempdir");
    let cert_path = dir.path().join("default.pem");
    let key_path = dir.path().join("default.key");
    std::fs::write(&cert_path, &default.cert_pem).expect("write");
    std::fs::write(&key_path, &default.key_pem).expect("write");
    let router = RouterProcess::start_with(&[
        "--default-cert",
        cert_path.to_str().expect("path"),
        "--default-key",
        key_path.to_str().expect("path"),
    ]);
    let own = ca.issue(&["own.test"], -1, 30);
    router.store_cert("own.test", &own);

    let https = router.https;
    assert_eq!(
        handshake(&router, https, "own.test").fingerprint,
        own.fingerprint,
    );
    assert_eq!(
        handshake(&router, https, "stranger.test").fingerprint,
        default.fingerprint,
    );
    let no_sni = tls::connect(https, None, &[]).expect("handshake without SNI");
    assert_eq!(no_sni.fingerprint, default.fingerprint);
    // Its end of validity is exported for the alert no store scan would raise.
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock")
        .as_secs_f64();
    let days_left =
        (router.metric("switchyard_default_certificate_expiry_timestamp_seconds") - now) / 86_400.0;
    assert!((29.9..=30.0).contains(&days_left), "{days_left} days left");
    let plain = RouterProcess::start();
    let (_, scraped) = plain.admin_call("GET", "/metrics", None);
    assert!(
        !scraped
            .as_str()
            .unwrap_or_default()
            .contains("switchyard_default_certificate_expiry_timestamp_seconds "),
        "absent without a default certificate"
    );

    // A default certificate whose key does not match refuses to start, with the reason.
    let other = ca.issue(&["x.invalid"], -1, 30);
    std::fs::write(&key_path, &other.key_pem).expect("write");
    let (http, https) = (free_port().to_string(), free_port().to_string());
    let output = Command::new(RouterProcess::binary())
        .args(["serve", "--http", &format!("127.0.0.1:{http}")])
        .args(["--https", &format!("127.0.0.1:{https}")])
        .args(["--admin", &format!("127.0.0.1:{}", free_port())])
        .args(["--default-cert", cert_path.to_str().expect("path")])
        .args(["--default-key", key_path.to_str().expect("path")])
        .args(["--data-dir", dir.path().join("d").to_str().expect("path")])
        .output()
        .expect("run");
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("does not match"), "{stderr}");
}

#[test]
fn invalid_certificates_are_refused_naming_the_problem_and_nothing_is_stored() {
    let router = RouterProcess::start();
    let ca = Ca::root("Test Root");
    let intermediate = ca.intermediate("Test Intermediate");
    let good = ca.issue(&["good.test"], -1, 30);
    let other = ca.issue(&["good.test"], -1, 30);
    let expired = ca.issue(&["good.test"], -30, -1);
    let future = ca.issue(&["good.test"], 2, 30);
    let chained_in_order =
        intermediate.issue_with_chain(&["good.test"], -1, 30, &[&intermediate.cert]);
    let out_of_order = {
        let leaf = intermediate.issue(&["good.test"], -1, 30);
        Issued {
            cert_pem: format!("{}{}", intermediate.pem(), leaf.cert_pem),
            ..leaf
        }
    };
    let wrong_issuer = intermediate.issue_with_chain(&["good.test"], -1, 30, &[&ca.cert]);

    let cases: Vec<(&str, Value, &str, &str)> = vec![
        (
            "good.test",
            json!({"cert_pem": "nope", "key_pem": good.key_pem}),
            "cert_pem",
            "no certificate",
        ),
        (
            "good.test",
            json!({"cert_pem": good.cert_pem, "key_pem": "nope"}),
            "key_pem",
            "private key",
        ),
        (
            "good.test",
            json!({"cert_pem": good.cert_pem, "key_pem": other.key_pem}),
            "key_pem",
            "does not match",
        ),
        (
            "good.test",
            json!({"cert_pem": expired.cert_pem, "key_pem": expired.key_pem}),
            "cert_pem",
            "expired",
        ),
        (
            "good.test",
            json!({"cert_pem": future.cert_pem, "key_pem": future.key_pem}),
            "cert_pem",
            "not valid before",
        ),
        (
            "good.test",
            json!({"cert_pem": out_of_order.cert_pem, "key_pem": out_of_order.key_pem}),
            "cert_pem",
            "out of order",
        ),
        (
            "good.test",
            json!({"cert_pem": wrong_issuer.cert_pem, "key_pem": wrong_issuer.key_pem}),
            "cert_pem",
            "out of order",
        ),
        (
            "other.test",
            json!({"cert_pem": good.cert_pem, "key_pem": good.key_pem}),
            "domain",
            "does not cover",
        ),
        (
            "*.test",
            json!({"cert_pem": good.cert_pem, "key_pem": good.key_pem}),
            "domain",
            "wildcard",
        ),
        (
            "good.test",
            json!({"cert_pem": good.cert_pem}),
            "key_pem",
            "required",
        ),
        (
            "good.test",
            json!({"cert_pem": good.cert_pem, "key_pem": good.key_pem, "force": true}),
            "force",
            "unknown field",
        ),
        (
            "good.test",
            json!({"cert_pem": good.cert_pem, "key_pem": good.key_pem, "allow_expired": "yes"}),
            "allow_expired",
            "true or false",
        ),
    ];
    for (domain, body, field, words) in &cases {
        let (status, answer) = router.admin_call(
            "PUT",
            &format!("/v1/certs/{domain}"),
            Some(&body.to_string()),
        );
        assert_eq!(status, 400, "{domain} {field}: {answer}");
        assert_eq!(answer["field"], *field, "{answer}");
        let error = answer["error"].as_str().unwrap_or_default();
        assert!(
            error.contains(words),
            "{field}: expected '{words}' in '{error}'"
        );
    }
    let (status, listing) = router.admin_call("GET", "/v1/certs", None);
    assert_eq!(status, 200);
    assert_eq!(listing["certs"], json!([]), "nothing refused was stored");

    // A leaf followed by its issuer is accepted, and is what clients receive.
    router.store_cert("good.test", &chained_in_order);
    let https = router.https;
    let served = handshake(&router, https, "good.test");
    assert_eq!(served.fingerprint, chained_in_order.fingerprint);
    assert_eq!(served.chain_length, 2, "the leaf and its issuer are sent");
    // An expired certificate is accepted when asked for explicitly.
    let (status, info) = router.admin_call(
        "PUT",
        "/v1/certs/good.test",
        Some(
            &json!({"cert_pem": expired.cert_pem, "key_pem": expired.key_pem, "allow_expired": true})
                .to_string(),
        ),
    );
    assert_eq!(status, 200, "{info}");
    let (_, listing) = router.admin_call("GET", "/v1/certs", None);
    let listed = &listing["certs"][0];
    assert_eq!(listed["domain"], "good.test");
    assert_eq!(listed["issuer"], "CN=Test Root");
    assert!(listed["not_after"].as_i64().is_some());
    assert!(
        !listing.to_string().contains("PRIVATE KEY"),
        "listings never carry keys"
    );
    let (status, _) = router.admin_call("DELETE", "/v1/certs/good.test", None);
    assert_eq!(status, 204);
    let https = router.https;
    assert!(
        tls::connect(https, Some("good.test"), &[]).is_err(),
        "a deleted certificate is no longer served"
    );
    let (status, answer) = router.admin_call("DELETE", "/v1/certs/good.test", None);
    assert_eq!((status, answer["field"].as_str()), (404, Some("domain")));
}

#[test]
fn a_new_certificate_serves_the_next_handshake_while_open_connections_keep_working() {
    let router = RouterProcess::start();
    let backend = Backend::start("site");
    router.put_app(
        "site",
        json!({"domains": ["site.test"], "backends": [backend.addr.to_string()]}),
    );
    let ca = Ca::root("Test Root");
    let old = ca.issue(&["site.test"], -1, 30);
    let new = ca.issue(&["site.test"], -1, 90);
    router.store_cert("site.test", &old);

    let mut before: Vec<_> = [router.https]
        .into_iter()
        .map(|https| {
            let mut connection = handshake(&router, https, "site.test");
            assert_eq!(connection.fingerprint, old.fingerprint);
            assert_eq!(
                connection.get("site.test", "/1").expect("request").status,
                200
            );
            connection
        })
        .collect();

    router.store_cert("site.test", &new);
    let https = router.https;
    let took = eventually(Duration::from_secs(1), "the new certificate", || {
        handshake(&router, https, "site.test").fingerprint == new.fingerprint
    });
    eprintln!("new certificate served {took:?} after the PUT returned");

    for connection in &mut before {
        for i in 0..3 {
            let response = connection
                .get("site.test", &format!("/after-rotation-{i}"))
                .unwrap_or_else(|e| {
                    panic!("the connection opened before the swap still works: {e}")
                });
            assert_eq!(response.status, 200);
        }
    }
}

#[test]
fn http_redirects_to_https_keeping_path_and_query_and_hsts_is_sent_over_tls_only() {
    let router = RouterProcess::start();
    let backend = Backend::start("secure");
    router.put_app(
        "secure",
        json!({
            "domains": ["secure.test"],
            "backends": [backend.addr.to_string()],
            "https_redirect": true,
            "hsts": {"max_age_s": 31536000, "include_subdomains": true}
        }),
    );
    router.put_app(
        "plain",
        json!({"domains": ["plain.test"], "backends": [backend.addr.to_string()]}),
    );
    let cert = Ca::root("Test Root").issue(&["secure.test"], -1, 30);
    router.store_cert("secure.test", &cert);

    let redirected = router.get("secure.test", "/cart/items?id=7&x=a%20b");
    assert_eq!(redirected.status, 308);
    assert_eq!(
        redirected.header("location"),
        Some(
            format!(
                "https://secure.test:{}/cart/items?id=7&x=a%20b",
                router.https.port()
            )
            .as_str()
        )
    );
    assert!(redirected.header("strict-transport-security").is_none());
    let acme = router.get("secure.test", "/.well-known/acme-challenge/token");
    assert_eq!(
        acme.status, 200,
        "ACME HTTP-01 challenges are not redirected"
    );
    assert_eq!(
        router.get("plain.test", "/").status,
        200,
        "other apps are not redirected"
    );

    let https = router.https;
    let mut conn = handshake(&router, https, "secure.test");
    let response = conn.get("secure.test", "/cart").expect("request over TLS");
    assert_eq!(response.status, 200);
    assert_eq!(
        response.header("strict-transport-security"),
        Some("max-age=31536000; includeSubDomains"),
    );
    let mut plain = handshake(&router, https, "secure.test");
    let response = plain.get("plain.test", "/").expect("request over TLS");
    assert_eq!(response.status, 200);
    assert!(
        response.header("strict-transport-security").is_none(),
        "only apps that ask get HSTS"
    );

    let (status, answer) = router.admin_call(
        "PUT",
        "/v1/apps/secure",
        Some(&json!({"hsts": {"max_age_s": 10, "preload": true}}).to_string()),
    );
    assert_eq!(
        (status, answer["field"].as_str()),
        (400, Some("hsts.preload"))
    );
}

#[test]
fn a_wss_websocket_keeps_working_across_a_certificate_rotation() {
    let router = RouterProcess::start();
    let backend = Backend::start("chat");
    router.put_app(
        "chat",
        json!({"domains": ["chat.test"], "backends": [backend.addr.to_string()]}),
    );
    let ca = Ca::root("Test Root");
    let old = ca.issue(&["chat.test"], -1, 30);
    let new = ca.issue(&["chat.test"], -1, 60);
    router.store_cert("chat.test", &old);

    let mut sockets: Vec<_> = [router.https]
        .into_iter()
        .map(|https| {
            let conn = handshake(&router, https, "chat.test");
            assert_eq!(conn.fingerprint, old.fingerprint);
            let url = format!("wss://chat.test:{}/chat", https.port());
            let (socket, response) = tungstenite::client(url.as_str(), conn.stream)
                .unwrap_or_else(|e| panic!("WebSocket handshake over TLS: {e}"));
            assert_eq!(response.status(), 101);
            socket
        })
        .collect();
    let exchange = |socket: &mut tungstenite::WebSocket<_>, text: &str| -> String {
        socket.send(tungstenite::Message::text(text)).expect("send");
        socket
            .read()
            .expect("reply")
            .into_text()
            .expect("text")
            .to_string()
    };
    for socket in &mut sockets {
        assert_eq!(exchange(socket, "before"), "chat:before");
        // A message larger than one TLS record crosses whole.
        let large = "x".repeat(100_000);
        assert_eq!(exchange(socket, &large), format!("chat:{large}"),);
    }

    router.store_cert("chat.test", &new);
    let https = router.https;
    eventually(Duration::from_secs(1), "the new certificate", || {
        handshake(&router, https, "chat.test").fingerprint == new.fingerprint
    });
    for socket in &mut sockets {
        for i in 0..5 {
            assert_eq!(
                exchange(socket, &format!("after-{i}")),
                format!("chat:after-{i}")
            );
        }
    }
}

/// `openssl s_client`, saving the session to `save` and offering the one in `offer`;
/// returns whether the session was resumed.
fn s_client(at: SocketAddr, save: &std::path::Path, offer: Option<&std::path::Path>) -> bool {
    let mut command = Command::new("openssl");
    command
        .args(["s_client", "-tls1_3", "-connect", &at.to_string()])
        .args(["-servername", "resume.test", "-sess_out"])
        .arg(save)
        .arg("-ign_eof")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    if let Some(offer) = offer {
        command.arg("-sess_in").arg(offer);
    }
    // A request that the router answers and then closes: TLS 1.3 tickets arrive after the
    // handshake, so the client must stay until the server is done.
    let mut child = command.spawn().expect("openssl s_client");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(b"GET / HTTP/1.0\r\nHost: resume.test\r\n\r\n")
        .expect("write request");
    let output = child.wait_with_output().expect("openssl s_client");
    let text = String::from_utf8_lossy(&output.stdout);
    assert!(
        text.contains("New,") || text.contains("Reused,"),
        "s_client did not complete a handshake:\n{text}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    text.contains("Reused,")
}

#[test]
fn sessions_resume_with_tickets_until_their_key_rotates_out() {
    let router = RouterProcess::start_with(&["--tls-ticket-rotation-s", "2"]);
    let cert = Ca::root("Test Root").issue(&["resume.test"], -1, 30);
    router.store_cert("resume.test", &cert);
    let dir = tempfile::tempdir().expect("tempdir");
    let mut first_sessions = Vec::new();
    let https = router.https;
    let first = dir.path().join("first.pem");
    let second = dir.path().join("second.pem");
    let resumed_before = router.metric("switchyard_tls_handshakes_total{result=\"resumed\"}");
    assert!(
        !s_client(https, &first, None),
        "the first handshake is full"
    );
    assert!(
        s_client(https, &second, Some(&first)),
        "a returning client resumes"
    );
    assert_eq!(
        router.metric("switchyard_tls_handshakes_total{result=\"resumed\"}"),
        resumed_before + 1.0,
        "the resumption counted"
    );
    // Read after the first ticket was sealed: a rotation between the two is counted in it,
    // never one short.
    let rotations_since_sealed = router.metric("switchyard_tls_ticket_key_rotations_total");
    first_sessions.push((https, first));

    // Two keys are kept: two rotations after the first ticket was sealed, its key is gone.
    eventually(Duration::from_secs(10), "two ticket key rotations", || {
        router.metric("switchyard_tls_ticket_key_rotations_total") >= rotations_since_sealed + 2.0
    });
    for (https, first) in first_sessions {
        assert!(
            !s_client(https, &dir.path().join("third.pem"), Some(&first)),
            "a ticket sealed with a rotated-out key is refused (full handshake)"
        );
    }
}

#[test]
fn certificates_expiring_soon_are_counted() {
    let router = RouterProcess::start_with(&["--cert-expiry-scan-s", "1"]);
    let ca = Ca::root("Test Root");
    router.store_cert("soon.test", &ca.issue(&["soon.test"], -80, 5));
    router.store_cert("later.test", &ca.issue(&["later.test"], -1, 60));
    eventually(Duration::from_secs(5), "the expiry scan", || {
        router.metric("switchyard_certificates_stored") == 2.0
    });
    assert_eq!(router.metric("switchyard_certificates_expiring_soon"), 1.0);
    // The TCP listener is up even though nothing was parsed at start-up.
    assert!(TcpStream::connect(router.https).is_ok());
}

/// What `openssl s_client` negotiated with these extra arguments: the `Cipher is` line, or
/// None when the handshake failed.
fn negotiated_cipher(at: SocketAddr, extra: &[&str]) -> Option<String> {
    let output = Command::new("openssl")
        .args(["s_client", "-connect", &at.to_string()])
        .args(["-servername", "params.test"])
        .args(extra)
        .stdin(std::process::Stdio::null())
        .output()
        .expect("openssl s_client");
    let text = String::from_utf8_lossy(&output.stdout);
    text.lines()
        .find_map(|line| {
            line.split_once("Cipher is ")
                .map(|(_, c)| c.trim().to_string())
        })
        .filter(|cipher| cipher != "(NONE)")
}

#[test]
fn tls_parameters_follow_mozillas_intermediate_profile() {
    let router = RouterProcess::start();
    let cert = Ca::root("Test Root").issue(&["params.test"], -1, 30);
    router.store_cert("params.test", &cert);

    let https = router.https;
    // Key exchange: X25519, P-256 and P-384 only.
    for group in ["X25519", "P-256", "P-384"] {
        assert!(
            negotiated_cipher(https, &["-groups", group]).is_some(),
            "{group} is offered"
        );
    }
    for group in ["X448", "P-521"] {
        assert_eq!(
            negotiated_cipher(https, &["-groups", group]),
            None,
            "{group} is refused"
        );
    }
    // TLS 1.2 picks by the server's order: a client listing AES-256 first still gets the
    // server's first choice, and one listing ChaCha20 first (no AES hardware) gets
    // ChaCha20.
    let tls12 = |ciphers: &str| negotiated_cipher(https, &["-tls1_2", "-cipher", ciphers]);
    assert_eq!(
        tls12("ECDHE-ECDSA-AES256-GCM-SHA384:ECDHE-ECDSA-AES128-GCM-SHA256").as_deref(),
        Some("ECDHE-ECDSA-AES128-GCM-SHA256"),
    );
    assert_eq!(
        tls12("ECDHE-ECDSA-CHACHA20-POLY1305:ECDHE-ECDSA-AES128-GCM-SHA256").as_deref(),
        Some("ECDHE-ECDSA-CHACHA20-POLY1305"),
    );
    // No TLS 1.1 and no suite without forward secrecy, even for a client willing to use
    // them.
    assert_eq!(
        negotiated_cipher(https, &["-tls1_1", "-cipher", "DEFAULT@SECLEVEL=0"]),
        None,
    );
    assert_eq!(
        tls12("AES128-GCM-SHA256:AES128-SHA:ECDHE-ECDSA-AES128-SHA@SECLEVEL=0"),
        None,
    );
    // TLS 1.2 renegotiation asked by the client is refused. The same session without the
    // ask is answered: the check sees an answer when there is one.
    let (refused, answered) = tls12_session(https, false);
    assert!(
        answered && !refused,
        "a TLS 1.2 session that asks for nothing is answered"
    );
    let (refused, answered) = tls12_session(https, true);
    assert!(
        refused,
        "client-started renegotiation is refused with no_renegotiation"
    );
    assert!(!answered, "nothing is answered past the refusal");
}

/// A TLS 1.2 session by `s_client` that, once its handshake is done, asks to renegotiate
/// (`R`) when `renegotiate`, then sends a request. Returns whether the server refused the
/// renegotiation (its `no_renegotiation` alert) and whether the request was answered.
fn tls12_session(at: SocketAddr, renegotiate: bool) -> (bool, bool) {
    use std::io::{BufRead, BufReader, Read};
    // `timeout` bounds a session whose server never ends it; stdin stays open until the
    // server has, so s_client never quits on its own end of input before the answer.
    let mut child = Command::new("timeout")
        .args([
            "20",
            "openssl",
            "s_client",
            "-tls1_2",
            "-connect",
            &at.to_string(),
        ])
        .args(["-servername", "params.test"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("openssl s_client");
    let mut stdin = child.stdin.take().expect("stdin");
    let mut stdout = BufReader::new(child.stdout.take().expect("stdout"));
    // s_client reads its input only once the handshake is done, and prints this last.
    let mut text = String::new();
    while !text.contains("Verify return code") || !text.ends_with("---\n") {
        if stdout.read_line(&mut text).expect("s_client's output") == 0 {
            panic!("s_client ended before its handshake was done:\n{text}");
        }
    }
    if renegotiate {
        // The refusal ends the session; a server that went along would have printed the
        // new handshake, and gets the request next.
        let _ = stdin.write_all(b"R\n");
    }
    // HTTP/1.0: the server closes once it has answered, which ends s_client's output.
    let _ = stdin.write_all(b"GET / HTTP/1.0\r\nHost: params.test\r\n\r\n");
    let _ = stdout.read_to_string(&mut text);
    drop(stdin);
    let output = child.wait_with_output().expect("openssl s_client");
    let errors = String::from_utf8_lossy(&output.stderr);
    (
        errors.contains("no renegotiation"),
        text.contains("HTTP/1."),
    )
}
