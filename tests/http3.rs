//! HTTP/3 through the real binary, spoken by a client not written here: aioquic's (a
//! Python QUIC and HTTP/3 stack, `tests/h3_client.py`, in the virtual environment
//! scripts/test makes; `SWITCHYARD_TEST_PYTHON` names another interpreter that has it).

use switchyard_test_support as support;

use std::sync::Arc;
use std::time::Duration;

use serde_json::{json, Value};
use support::h3::ask as ask_h3;
use support::pki::Ca;
use support::{eventually, free_port, Backend, RouterProcess};

struct Rig {
    router: RouterProcess,
    backend: Backend,
    h3_port: u16,
    ca_file: tempfile::NamedTempFile,
}

impl Rig {
    /// A router serving HTTP/3 beside HTTPS, an app on `shop.test` and `*.apps.test`, their
    /// certificates from a CA of the test's.
    fn start() -> Self {
        Self::start_with(&[])
    }

    /// [`start`](Self::start), with more `serve` flags.
    fn start_with(extra: &[&str]) -> Self {
        let h3_port = free_port();
        let address = format!("127.0.0.1:{h3_port}");
        let args: Vec<&str> = ["--http3", address.as_str()]
            .into_iter()
            .chain(extra.iter().copied())
            .collect();
        let router = RouterProcess::start_with(&args);
        let backend = Backend::start("shop");
        let ca = Ca::root("HTTP/3 Test Root");
        router.store_cert("shop.test", &ca.issue(&["shop.test"], -1, 30));
        router.store_cert("*.apps.test", &ca.issue(&["*.apps.test"], -1, 30));
        router.put_app(
            "shop",
            json!({"domains": ["shop.test", "*.apps.test"], "backends": [backend.addr.to_string()]}),
        );
        let ca_file = tempfile::NamedTempFile::new().expect("a file for the CA");
        std::fs::write(ca_file.path(), ca.pem()).expect("write the CA");
        Self {
            router,
            backend,
            h3_port,
            ca_file,
        }
    }

    /// One request over a new HTTP/3 connection: what the client saw.
    fn h3(&self, server_name: &str, args: &[&str]) -> Value {
        ask_h3(self.h3_port, self.ca_file.path(), server_name, args)
            .unwrap_or_else(|e| panic!("{e}\nrouter: {}", self.router.logs()))
    }
}

/// One request over a new HTTP/3 connection to `port`: what the client saw.
fn header<'a>(answer: &'a Value, name: &str) -> Option<&'a str> {
    answer["headers"]
        .as_array()?
        .iter()
        .find(|pair| pair[0] == name)
        .and_then(|pair| pair[1].as_str())
}

#[test]
fn https_answers_advertise_http3_and_its_requests_reach_the_app_through_every_stage() {
    let rig = Rig::start();
    let mut tls = support::tls::connect(rig.router.https, Some("shop.test"), &["http/1.1"])
        .expect("a TLS handshake");
    let over_tls = tls.get("shop.test", "/").expect("a request over TLS");
    assert_eq!(
        over_tls.header("alt-svc"),
        Some(format!("h3=\":{}\"; ma=86400", rig.h3_port).as_str()),
        "browsers learn of HTTP/3 from any HTTPS answer"
    );

    // An app that opts out keeps its clients on TCP (its exact domain, under the
    // wildcard certificate).
    rig.router.put_app(
        "quiet",
        json!({"domains": ["quiet.apps.test"], "backends": [rig.backend.addr.to_string()],
               "advertise_http3": false}),
    );
    let mut quiet = support::tls::connect(rig.router.https, Some("quiet.apps.test"), &["http/1.1"])
        .expect("a TLS handshake");
    let quiet_answer = quiet
        .get("quiet.apps.test", "/")
        .expect("a request over TLS");
    assert_eq!(quiet_answer.status, 200);
    assert_eq!(quiet_answer.header("alt-svc"), None);
    let (_, explained) =
        rig.router
            .admin_call("GET", "/v1/explain?host=quiet.apps.test&path=/", None);
    let http3 = explained["stages"]
        .as_array()
        .and_then(|s| s.iter().find(|s| s["stage"] == "http3"))
        .cloned()
        .unwrap_or(Value::Null);
    assert_eq!(http3["applies"], false, "{explained}");

    let answer = rig.h3("shop.test", &["--path", "/cart?id=7"]);
    assert_eq!(answer["status"], 200, "{answer}");
    let seen: Value = serde_json::from_str(answer["text"].as_str().unwrap_or("")).expect("JSON");
    assert_eq!(seen["path"], "/cart?id=7");
    assert_eq!(seen["headers"]["host"], "shop.test");
    assert_eq!(seen["headers"]["x-forwarded-proto"], "https");
    assert_eq!(seen["headers"]["via"], "3 switchyard");
    assert!(header(&answer, "x-request-id").is_some(), "{answer}");
    assert_eq!(rig.router.metric("switchyard_http3_requests_total"), 1.0);
    eventually(
        Duration::from_secs(5),
        "the closed connection's figures",
        || {
            rig.router.metric("switchyard_quic_rtt_seconds_count") >= 1.0
                && rig
                    .router
                    .metric("switchyard_quic_packets_total{kind=\"sent\"}")
                    > 0.0
        },
    );
    let access = rig.router.access_records();
    assert!(
        access.iter().any(|r| r["protocol"] == "HTTP/3"),
        "{access:?}"
    );

    // A body up and a body down, streamed.
    let upload = rig.h3(
        "shop.test",
        &[
            "--method",
            "POST",
            "--path",
            "/upload",
            "--body-bytes",
            "1048576",
        ],
    );
    assert_eq!(upload["status"], 200, "{upload}");
    let seen: Value = serde_json::from_str(upload["text"].as_str().unwrap_or("")).expect("JSON");
    assert_eq!(seen["body_len"], 1_048_576);
    let download = rig.h3("shop.test", &["--path", "/bytes?n=4194304"]);
    assert_eq!(download["status"], 200, "{download}");
    assert_eq!(download["body_len"], 4_194_304);
    // A chunked answer, piece by piece as the app sends it.
    let streamed = rig.h3("shop.test", &["--path", "/stream?chunks=5&interval_ms=20"]);
    assert_eq!(streamed["status"], 200, "{streamed}");
    let expected: String = (0..5).map(|i| format!("chunk {i} from shop\n")).collect();
    assert_eq!(streamed["text"], expected.as_str());
    assert_eq!(rig.backend.requests(), 6);
}

#[test]
fn the_certificate_is_chosen_by_sni_from_a_routers_first_handshake() {
    let mut rig = Rig::start();
    // A router just started has loaded the stored certificates before its first QUIC
    // handshake (which cannot wait for the store): no client's first connection fails.
    assert!(rig.router.terminate().success());
    rig.router.restart();
    let answer = rig.h3("a.apps.test", &[]);
    assert_eq!(
        answer["status"],
        200,
        "{answer}\nrouter: {}",
        rig.router.logs()
    );
    let other = rig.h3("shop.test", &[]);
    assert_eq!(other["status"], 200, "{other}");
    assert_ne!(
        answer["cert_sha256"], other["cert_sha256"],
        "each name its own certificate, chosen by SNI"
    );
    assert_eq!(
        rig.router
            .metric("switchyard_quic_handshakes_total{result=\"certificate_cold\"}"),
        0.0
    );
    assert!(
        rig.router
            .metric("switchyard_quic_handshakes_total{result=\"completed\"}")
            >= 1.0
    );
}

#[test]
fn a_certificate_changed_in_the_store_is_served_on_the_next_handshake() {
    let rig = Rig::start();
    let ca = Ca::root("Rotated Root");
    let first = ca.issue(&["shop.test"], -1, 30);
    rig.router.store_cert("shop.test", &first);
    std::fs::write(rig.ca_file.path(), ca.pem()).expect("trust the new root");
    let served = || {
        let answer = rig.h3("shop.test", &[]);
        answer["cert_sha256"]
            .as_str()
            .unwrap_or_default()
            .to_string()
    };
    let hex =
        |fingerprint: &[u8]| -> String { fingerprint.iter().map(|b| format!("{b:02x}")).collect() };
    eventually(
        Duration::from_secs(10),
        "the first certificate over QUIC",
        || served() == hex(&first.fingerprint),
    );
    let second = ca.issue(&["shop.test"], -1, 60);
    rig.router.store_cert("shop.test", &second);
    eventually(
        Duration::from_secs(10),
        "the replaced certificate over QUIC",
        || served() == hex(&second.fingerprint),
    );
}

#[test]
fn malformed_http3_requests_are_refused_not_forwarded() {
    let rig = Rig::start();
    // Warm the name over TCP first, as a browser following Alt-Svc has.
    let mut tls = support::tls::connect(rig.router.https, Some("shop.test"), &["http/1.1"])
        .expect("a TLS handshake");
    assert_eq!(tls.get("shop.test", "/").expect("a request").status, 200);
    let before = rig.backend.requests();
    // A field naming the connection: a stream error H3_MESSAGE_ERROR (RFC 9114 §4.2).
    let connection_field = rig.h3("shop.test", &["--header", "connection: close"]);
    assert_eq!(connection_field["reset"], 0x10e, "{connection_field}");
    let transfer_encoding = rig.h3("shop.test", &["--header", "transfer-encoding: chunked"]);
    assert_eq!(transfer_encoding["reset"], 0x10e, "{transfer_encoding}");
    // A body shorter than its Content-Length is malformed (§4.1.2): never a whole request.
    let short = rig.h3(
        "shop.test",
        &[
            "--method",
            "POST",
            "--body-bytes",
            "5",
            "--declared-length",
            "10",
        ],
    );
    assert_eq!(short["status"], 400, "{short}");
    assert_eq!(
        rig.backend.requests(),
        before,
        "nothing malformed reached the app"
    );
    let fine = rig.h3("shop.test", &["--method", "POST", "--body-bytes", "5"]);
    assert_eq!(fine["status"], 200, "{fine}");
}

#[test]
fn a_stopping_router_finishes_the_http3_requests_under_way() {
    let rig = Arc::new(Rig::start());
    let mut tls = support::tls::connect(rig.router.https, Some("shop.test"), &["http/1.1"])
        .expect("a TLS handshake");
    assert_eq!(tls.get("shop.test", "/").expect("a request").status, 200);
    let in_flight = {
        let rig = rig.clone();
        std::thread::spawn(move || rig.h3("shop.test", &["--path", "/slow?ms=1000"]))
    };
    eventually(
        Duration::from_secs(5),
        "the slow request at the app",
        || rig.backend.requests() == 2,
    );
    rig.router.signal_terminate();
    let answer = in_flight.join().expect("the client's thread");
    assert_eq!(answer["status"], 200, "{answer}");
    assert_eq!(answer["text"], "shop");
    let Ok(mut rig) = Arc::try_unwrap(rig) else {
        panic!("the rig has one owner left");
    };
    assert!(rig.router.wait_exit().success());
}

#[test]
fn http3_requests_under_way_finish_across_a_binary_upgrade() {
    let mut rig = Rig::start();
    // Clients of their own (each its own UDP port), each uploading through the hand-over:
    // unsteered, the kernel would give each client's packets to one of the two routers by
    // the addresses' hash, and about half of these uploads would stall at the new router,
    // which knows nothing of their connections.
    const CLIENTS: usize = 6;
    let ca = rig.ca_file.path().to_path_buf();
    let port = rig.h3_port;
    let in_flight: Vec<_> = (0..CLIENTS)
        .map(|_| {
            let ca = ca.clone();
            std::thread::spawn(move || {
                ask_h3(
                    port,
                    &ca,
                    "shop.test",
                    &[
                        "--method",
                        "POST",
                        "--path",
                        "/upload",
                        "--body-bytes",
                        "40960",
                        "--body-chunks",
                        "10",
                        "--chunk-interval-ms",
                        "120",
                    ],
                )
            })
        })
        .collect();
    eventually(Duration::from_secs(10), "every upload begun", || {
        rig.router.metric("switchyard_quic_connections") >= CLIENTS as f64
    });
    let mut old = rig.router.upgrade();
    // A new connection while the old router drains: the new router's.
    let fresh = rig.h3("shop.test", &[]);
    assert_eq!(fresh["status"], 200, "{fresh}");
    for client in in_flight {
        let answer = client.join().expect("the client's thread");
        let answer = answer.unwrap_or_else(|e| panic!("{e}\nrouter: {}", rig.router.logs()));
        assert_eq!(
            answer["status"],
            200,
            "{answer}\nrouter: {}",
            rig.router.logs()
        );
        let seen: Value =
            serde_json::from_str(answer["text"].as_str().unwrap_or("")).expect("JSON");
        assert_eq!(seen["body_len"], 40_960);
    }
    assert!(old.wait().expect("the old router's exit").success());
    let after = rig.h3("shop.test", &[]);
    assert_eq!(after["status"], 200, "{after}");
}

#[test]
fn a_name_without_a_certificate_of_its_own_is_served_the_default_on_its_first_handshake() {
    let ca = Ca::root("Default Root");
    let default = ca.issue(&["fallback.test"], -1, 30);
    let dir = tempfile::tempdir().expect("a directory");
    let (cert, key) = (dir.path().join("cert.pem"), dir.path().join("key.pem"));
    std::fs::write(&cert, &default.cert_pem).expect("write the certificate");
    std::fs::write(&key, &default.key_pem).expect("write the key");
    let h3_port = free_port();
    let router = RouterProcess::start_with(&[
        "--http3",
        &format!("127.0.0.1:{h3_port}"),
        "--default-cert",
        cert.to_str().expect("a path"),
        "--default-key",
        key.to_str().expect("a path"),
    ]);
    let backend = Backend::start("fallback");
    router.put_app(
        "fallback",
        json!({"domains": ["fallback.test"], "backends": [backend.addr.to_string()]}),
    );
    let ca_file = dir.path().join("ca.pem");
    std::fs::write(&ca_file, ca.pem()).expect("write the CA");
    // The store's certificates were all read at start: a name not among them is known to
    // have none, and is served the default at once rather than after a lookup.
    let answer = eventually_answer(|| ask_h3(h3_port, &ca_file, "fallback.test", &[]));
    assert_eq!(answer["status"], 200, "{answer}\nrouter: {}", router.logs());
    assert_eq!(
        answer["cert_sha256"],
        default
            .fingerprint
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect::<String>()
    );
    assert_eq!(
        router.metric("switchyard_quic_handshakes_total{result=\"certificate_cold\"}"),
        0.0
    );
}

/// The first answer that is not a 404 (the app's route may not be applied yet): routing,
/// not the handshake, is what may take a moment here.
fn eventually_answer(mut ask: impl FnMut() -> Result<Value, String>) -> Value {
    let mut last = None;
    eventually(Duration::from_secs(5), "the app's route", || {
        let answer = ask().unwrap_or_else(|e| panic!("{e}"));
        let routed = answer["status"] != 404;
        last = Some(answer);
        routed
    });
    last.expect("an answer")
}

#[test]
fn a_websocket_over_http3_is_refused_and_never_reaches_the_app() {
    let rig = Rig::start();
    let fine = rig.h3("shop.test", &[]);
    assert_eq!(fine["status"], 200, "{fine}");
    let before = rig.backend.requests();
    // RFC 9220's extended CONNECT. The listener does not announce
    // SETTINGS_ENABLE_CONNECT_PROTOCOL (h3 0.0.8 knows no `websocket` protocol), so a
    // client sending it anyway has sent a malformed request.
    let websocket = rig.h3(
        "shop.test",
        &[
            "--method",
            "CONNECT",
            "--path",
            "/chat",
            "--header",
            ":protocol: websocket",
            "--header",
            "sec-websocket-version: 13",
        ],
    );
    // Malformed (RFC 9114 §4.1.2): a stream error, H3_MESSAGE_ERROR (0x10e).
    assert!(websocket["status"].is_null(), "{websocket}");
    assert_eq!(websocket["reset"], 0x10e, "{websocket}");
    assert_eq!(rig.backend.requests(), before, "nothing reached the app");
}

/// The fields the app saw on its last request to `path`.
fn seen_by_app(
    rig: &Rig,
    method: &str,
    path: &str,
) -> Option<std::collections::BTreeMap<String, String>> {
    rig.backend
        .recorded()
        .into_iter()
        .rev()
        .find(|r| r.method == method && r.target == path)
        .map(|r| r.headers)
}

#[test]
fn zero_rtt_is_refused_unless_switched_on() {
    let rig = Rig::start();
    let answer = rig.h3("shop.test", &["--resume", "--path", "/resumed"]);
    assert_eq!(answer["status"], 200, "{answer}");
    // The ticket says no early data: the client waits for the handshake.
    assert_eq!(answer["early_data_offered"], false, "{answer}");
    assert_eq!(answer["early_data_accepted"], false, "{answer}");
    let fields = seen_by_app(&rig, "GET", "/resumed").expect("the request at the app");
    assert!(!fields.contains_key("early-data"), "{fields:?}");
}

#[test]
fn zero_rtt_when_on_takes_safe_methods_with_early_data_and_answers_others_too_early() {
    let rig = Rig::start_with(&["--http3-early-data", "on"]);
    let get = rig.h3("shop.test", &["--resume", "--replay", "--path", "/early"]);
    assert_eq!(get["status"], 200, "{get}\nrouter: {}", rig.router.logs());
    assert_eq!(get["early_data_offered"], true, "{get}");
    assert_eq!(get["early_data_accepted"], true, "{get}");
    // A ticket is taken once: its early data, sent again, is refused (then sent after the
    // handshake, as an ordinary request).
    assert_eq!(get["replay_early_data_accepted"], false, "{get}");
    let early: Vec<_> = rig
        .backend
        .recorded()
        .into_iter()
        .filter(|r| r.target == "/early")
        .map(|r| r.headers.get("early-data").cloned())
        .collect();
    assert_eq!(early, vec![Some("1".to_string()), None], "{early:?}");

    let post = rig.h3(
        "shop.test",
        &[
            "--resume",
            "--method",
            "POST",
            "--path",
            "/early-post",
            "--body-bytes",
            "5",
        ],
    );
    assert_eq!(post["status"], 425, "{post}");
    assert!(
        seen_by_app(&rig, "POST", "/early-post").is_none(),
        "an unsafe request in early data never reaches the app"
    );
    // After the handshake the same POST is an ordinary request.
    let later = rig.h3(
        "shop.test",
        &[
            "--method",
            "POST",
            "--path",
            "/early-post",
            "--body-bytes",
            "5",
        ],
    );
    assert_eq!(later["status"], 200, "{later}");
    let fields = seen_by_app(&rig, "POST", "/early-post").expect("the POST at the app");
    assert!(!fields.contains_key("early-data"), "{fields:?}");

    let metric = |name: &str| rig.router.metric(name);
    assert!(metric("switchyard_quic_early_data_total{result=\"accepted\"}") >= 2.0);
    assert_eq!(
        metric("switchyard_http3_early_requests_total{result=\"too_early\"}"),
        1.0
    );
    assert!(metric("switchyard_http3_early_requests_total{result=\"forwarded\"}") >= 1.0);
}

#[test]
fn a_body_the_router_answers_without_is_not_read_to_its_end() {
    let rig = Rig::start();
    rig.router.put_app(
        "shop",
        json!({
            "domains": ["shop.test", "*.apps.test"],
            "backends": [rig.backend.addr.to_string()],
            "redirects": [{"path_prefix": "/old", "to": "/new"}],
        }),
    );
    // An upload the router answers (a redirect) before its end: the answer goes out and
    // the client is asked to stop sending (STOP_SENDING; quinn's code 0, which HTTP/3
    // takes as H3_NO_ERROR, being unknown to it: RFC 9114 section 8.1) instead of the rest
    // being read for seconds, as an HTTP/1 client's is.
    let moved = rig.h3(
        "shop.test",
        &[
            "--method",
            "POST",
            "--path",
            "/old/form",
            "--body-bytes",
            "262144",
            "--body-chunks",
            "8",
            "--chunk-interval-ms",
            "50",
        ],
    );
    assert_eq!(moved["status"], 301, "{moved}\n{}", rig.router.logs());
    assert!(
        moved["stop_sending"].is_u64(),
        "asked to stop sending: {moved}"
    );
    assert_eq!(rig.backend.requests(), 0);
}

#[test]
fn streams_reset_before_any_of_their_data_return_their_credit() {
    let rig = Rig::start();
    let warm = rig.h3("shop.test", &[]);
    assert_eq!(warm["status"], 200, "{warm}");
    // 300 streams (128 at once) each reset before its HEADERS left: the router sees a
    // RESET_STREAM and nothing else, and still gives each stream's credit back.
    let burst = rig.h3("shop.test", &["--reset-unsent", "300"]);
    assert_eq!(
        (burst["sent"].as_u64(), burst["starved"].as_bool()),
        (Some(300), Some(false)),
        "{burst}\n{}",
        rig.router.logs()
    );
    assert_eq!(burst["after"]["status"], 200, "{burst}");
    assert_eq!(rig.backend.requests(), 2, "none of them reached the app");
}

#[test]
fn streams_a_client_cancels_hold_no_more_than_its_stream_limit() {
    let rig = Rig::start();
    let warm = rig.h3("shop.test", &[]);
    assert_eq!(warm["status"], 200, "{warm}");
    // HTTP/2's rapid reset over HTTP/3: each request takes the app 200 ms, and the client
    // cancels every one 50 ms after sending it, 100 at a time. A stream's credit comes back
    // only once the router has finished its side, so cancelled requests still count
    // against the 128 a connection may have open (the h2 listener needs a count of its own
    // because a reset there frees the slot at once); and the credit does come back: all
    // 600 go out.
    rig.backend
        .set_behaviour(support::Behaviour::Delay(Duration::from_millis(200)));
    let burst = rig.h3(
        "shop.test",
        &["--reset-burst", "600", "--path", "/cancelled"],
    );
    assert_eq!(burst["sent"], 600, "{burst}");
    assert_eq!(
        burst["blocked"],
        0,
        "{burst}: {} at the app, {} at once\n{}",
        rig.backend.requests(),
        rig.backend.max_concurrent(),
        rig.router.logs()
    );
    let most = rig.backend.max_concurrent();
    assert!(
        (1..=128).contains(&most),
        "{most} cancelled requests at the app at once"
    );
    rig.backend.set_behaviour(support::Behaviour::Normal);
    let after = rig.h3("shop.test", &[]);
    assert_eq!(after["status"], 200, "{after}");
}

/// Over HTTPS/1.1 an app's answer kept as read gets all three of the router's own fields —
/// the request id, its HSTS and HTTP/3's Alt-Svc — written after its own (the HTTP/1
/// driver's list of them had room for two: the third panicked the connection's task).
#[test]
fn an_https_answer_carries_the_request_id_hsts_and_alt_svc_together() {
    let rig = Rig::start();
    rig.router.put_app(
        "strict",
        json!({"domains": ["strict.apps.test"], "backends": [rig.backend.addr.to_string()],
               "hsts": {"max_age_s": 600}}),
    );
    let mut tls = support::tls::connect(rig.router.https, Some("strict.apps.test"), &["http/1.1"])
        .expect("a TLS handshake");
    let answer = tls
        .get("strict.apps.test", "/")
        .unwrap_or_else(|e| panic!("{e}\nrouter: {}", rig.router.logs()));
    assert_eq!(answer.status, 200);
    assert_eq!(
        answer.header("strict-transport-security"),
        Some("max-age=600")
    );
    assert_eq!(
        answer.header("alt-svc"),
        Some(format!("h3=\":{}\"; ma=86400", rig.h3_port).as_str())
    );
    assert!(answer.header("x-request-id").is_some());
}
