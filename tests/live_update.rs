//! Changes take effect within moments, without a reload and without cutting connections: no
//! change cuts a connection; only deletion or a domain transfer does, after the drain grace
//! (1 s here), and a removed backend's connections end when it closes them, or at the app's
//! own deadline if it sets one.

use switchyard_test_support as support;

use std::time::{Duration, Instant};

use futures_util::StreamExt;
use serde_json::json;
use support::websocket::{close_frame_within, exchange, open_websocket};
use support::{eventually, Backend, RouterProcess};
use tokio_tungstenite::tungstenite::error::{Error as WsError, ProtocolError};
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;
use tokio_tungstenite::MaybeTlsStream;

#[test]
fn a_new_app_and_a_new_backend_answer_within_a_second_of_the_put() {
    let router = RouterProcess::start();
    let first = Backend::start("first");
    let second = Backend::start("second");
    assert_eq!(
        router.get("fresh.test", "/").status,
        404,
        "a cached 404 must not outlive the change"
    );

    router.put_app(
        "fresh",
        json!({"domains": ["fresh.test"], "backends": [first.addr.to_string()]}),
    );
    let took = eventually(Duration::from_secs(1), "the new app to answer", || {
        router.get("fresh.test", "/").status == 200
    });
    eprintln!("new app answered {took:?} after the PUT returned");

    router.scale("fresh", &[second.addr]);
    eventually(Duration::from_secs(1), "the new backend to serve", || {
        router.get("fresh.test", "/").json()["backend"] == "second"
    });

    router.put_app(
        "fresh",
        json!({"domains": ["renamed.test"], "backends": [second.addr.to_string()]}),
    );
    eventually(
        Duration::from_secs(1),
        "the old domain to stop routing",
        || router.get("fresh.test", "/").status == 404,
    );
    assert_eq!(router.get("renamed.test", "/").status, 200);

    router.put_app(
        "wild",
        json!({"domains": ["*.fresh.test"], "backends": [first.addr.to_string()]}),
    );
    eventually(
        Duration::from_secs(1),
        "a new wildcard to cover its subdomains",
        || router.get("any.fresh.test", "/").status == 200,
    );
    assert_eq!(router.admin_call("DELETE", "/v1/apps/wild", None).0, 204);
    eventually(
        Duration::from_secs(1),
        "a deleted app to stop routing",
        || router.get("any.fresh.test", "/").status == 404,
    );
}

/// The router that takes a write routes by it as soon as the write is answered: no window
/// in which a deploy script's next request still reaches the old backends.
#[test]
fn the_router_that_takes_a_write_routes_by_it_when_it_answers() {
    let router = RouterProcess::start();
    let names = ["blue", "green"];
    let backends = names.map(Backend::start);
    router.put_app(
        "deploy",
        json!({"domains": ["deploy.test"], "backends": [backends[0].addr.to_string()]}),
    );
    // Busy cores make the gap, if there is one, wide enough to see.
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let spinners: Vec<_> = (0..4)
        .map(|_| {
            let stop = stop.clone();
            std::thread::spawn(move || {
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    std::hint::spin_loop();
                }
            })
        })
        .collect();
    for round in 0..40 {
        let (live, name) = (&backends[round % 2], names[round % 2]);
        if round % 4 < 2 {
            router.scale("deploy", &[live.addr]);
        } else {
            router.put_app(
                "deploy",
                json!({"domains": ["deploy.test"], "backends": [live.addr.to_string()]}),
            );
        }
        let answer = router.get("deploy.test", "/");
        assert_eq!(
            answer.json()["backend"],
            json!(name),
            "round {round}: the first request after the write"
        );
    }
    assert_eq!(router.admin_call("DELETE", "/v1/apps/deploy", None).0, 204);
    assert_eq!(router.get("deploy.test", "/").status, 404);
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    for spinner in spinners {
        spinner.join().expect("spinner");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_websocket_survives_100_route_changes_and_10_scale_operations() {
    let router = RouterProcess::start();
    let home = Backend::start("home");
    let others: Vec<Backend> = (0..3)
        .map(|i| Backend::start(&format!("other{i}")))
        .collect();
    router.put_app(
        "chat",
        json!({"domains": ["chat.test"], "backends": [home.addr.to_string()]}),
    );
    let mut socket = open_websocket(router.http, "chat.test").await;
    assert_eq!(exchange(&mut socket, "hello").await, "home:hello");

    for i in 0..100 {
        let extra_domain = format!("alias{i}.chat.test");
        let balancer = if i % 2 == 0 {
            "round_robin"
        } else {
            "least_loaded"
        };
        router.put_app(
            "chat",
            json!({"domains": ["chat.test", extra_domain], "backends": [home.addr.to_string()], "balancer": balancer}),
        );
        assert_eq!(
            exchange(&mut socket, &format!("route-{i}")).await,
            format!("home:route-{i}")
        );
    }
    for i in 0..10 {
        let mut backends = vec![home.addr];
        backends.extend(others.iter().take(i % 4).map(|b| b.addr));
        router.scale("chat", &backends);
        assert_eq!(
            exchange(&mut socket, &format!("scale-{i}")).await,
            format!("home:scale-{i}")
        );
    }
    // Past the drain grace period: nothing was removed that this socket uses.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(exchange(&mut socket, "still here").await, "home:still here");

    // Its end is counted as an answer, but its lifetime is no answer time: the duration
    // histogram (the dashboard's p99) leaves it out.
    socket.close(None).await.expect("close");
    eventually(Duration::from_secs(5), "the WebSocket counted", || {
        router.metric("switchyard_requests_total{app=\"chat\",class=\"1xx\"}") == 1.0
    });
    assert_eq!(
        router.metric("switchyard_request_duration_seconds_count{class=\"1xx\"}"),
        0.0
    );
}

/// The failure this router exists to end: a WebSocket held open while its app's backends are replaced ten
/// times over a minute, one new WebSocket opened after each change. Every one of them keeps
/// echoing from the backend it started with, long past `--drain-grace-s` (1 s here).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn websockets_outlive_ten_replacements_of_their_backends_over_a_minute() {
    let router = RouterProcess::start();
    let first = Backend::start("first");
    let replacements: Vec<Backend> = ["b", "c", "d"].into_iter().map(Backend::start).collect();
    router.put_app(
        "deploys",
        json!({"domains": ["deploys.test"], "backends": [first.addr.to_string()]}),
    );
    let mut sockets = vec![("first", open_websocket(router.http, "deploys.test").await)];
    assert_eq!(exchange(&mut sockets[0].1, "hello").await, "first:hello");

    let started = Instant::now();
    for round in 0..10 {
        // b, c, d, b, c …: a backend comes back after it was removed, as a rescheduled
        // container may, and its older WebSockets count as served again.
        let next = &replacements[round % 3];
        let name = ["b", "c", "d"][round % 3];
        router.scale("deploys", &[next.addr]);
        for (backend, socket) in sockets.iter_mut() {
            let text = format!("round {round}");
            assert_eq!(
                exchange(socket, &text).await,
                format!("{backend}:{text}"),
                "round {round}: a WebSocket opened on {backend} still echoes from it"
            );
        }
        let mut fresh = open_websocket(router.http, "deploys.test").await;
        assert_eq!(
            exchange(&mut fresh, "new").await,
            format!("{name}:new"),
            "round {round}: a new WebSocket goes to the current backend"
        );
        sockets.push((name, fresh));
        let removed = sockets.iter().filter(|(b, _)| *b != name).count();
        eventually(
            Duration::from_secs(2),
            "the gauge to count the WebSockets to removed backends",
            || router.metric("switchyard_connections_to_removed_backends") == removed as f64,
        );
        tokio::time::sleep(Duration::from_secs(6).saturating_sub(Duration::from_millis(300))).await;
    }
    assert!(started.elapsed() >= Duration::from_secs(55));
    for (backend, socket) in sockets.iter_mut() {
        assert_eq!(exchange(socket, "end").await, format!("{backend}:end"));
    }
    assert_eq!(
        router.metric("switchyard_drained_connections_total{reason=\"removed_backend_deadline\"}"),
        0.0
    );
    assert_eq!(
        first.open_websockets(),
        1,
        "the first backend still serves its WebSocket"
    );
}

/// The removed backend decides when its WebSocket ends, as it would without a router: the
/// client sees the backend's own close, not an error from the router.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_removed_backend_closes_its_websockets_itself() {
    let router = RouterProcess::start();
    let leaving = Backend::start("leaving");
    let killed = Backend::start("killed");
    let staying = Backend::start("staying");
    router.put_app(
        "scaled",
        json!({"domains": ["scaled.test"], "backends": [leaving.addr.to_string()]}),
    );
    let mut polite = open_websocket(router.http, "scaled.test").await;
    router.scale("scaled", &[killed.addr]);
    let mut abrupt = open_websocket(router.http, "scaled.test").await;
    router.scale("scaled", &[staying.addr]);
    // Three times the drain grace: removal alone closes nothing.
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(exchange(&mut polite, "a").await, "leaving:a");
    assert_eq!(exchange(&mut abrupt, "b").await, "killed:b");
    let mut fresh = open_websocket(router.http, "scaled.test").await;
    assert_eq!(exchange(&mut fresh, "c").await, "staying:c");

    leaving.shut_down_gracefully();
    let (code, reason) = close_frame_within(&mut polite, Duration::from_secs(5)).await;
    assert_eq!(code, CloseCode::Away);
    assert_eq!(
        reason, "backend shutting down",
        "the backend's own close frame"
    );

    killed.stop();
    let end = tokio::time::timeout(Duration::from_secs(5), abrupt.next())
        .await
        .expect("the end within 5 s");
    assert!(
        matches!(
            end,
            None | Some(Err(WsError::ConnectionClosed))
                | Some(Err(WsError::Protocol(
                    ProtocolError::ResetWithoutClosingHandshake
                )))
        ),
        "the killed backend's end shows as the connection's end, nothing else: {end:?}"
    );
    assert_eq!(exchange(&mut fresh, "d").await, "staying:d");
    for reason in ["removed_backend_deadline", "app_deleted", "domain_moved"] {
        let series = format!("switchyard_drained_connections_total{{reason=\"{reason}\"}}");
        assert_eq!(router.metric(&series), 0.0, "the router closed nothing");
    }
}

/// With `drain.removed_backend_s`, a WebSocket still open that long after its backend left
/// is closed with 1001; a backend added back in the meantime starts its count again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drain_deadline_closes_a_removed_backends_websocket_with_going_away() {
    let router = RouterProcess::start();
    let old = Backend::start("old");
    let new = Backend::start("new");
    router.put_app(
        "deadline",
        json!({"domains": ["deadline.test"], "backends": [old.addr.to_string()], "drain": {"removed_backend_s": 5}}),
    );
    let mut socket = open_websocket(router.http, "deadline.test").await;
    assert_eq!(exchange(&mut socket, "a").await, "old:a");

    router.scale("deadline", &[new.addr]);
    tokio::time::sleep(Duration::from_secs(2)).await;
    router.scale("deadline", &[old.addr, new.addr]);
    tokio::time::sleep(Duration::from_secs(1)).await;
    router.scale("deadline", &[new.addr]);
    let removed_again = Instant::now();
    // Six seconds after the first removal: its deadline would have passed.
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(
        exchange(&mut socket, "b").await,
        "old:b",
        "the count started again at the second removal"
    );
    assert_eq!(
        router.metric("switchyard_connections_to_removed_backends"),
        1.0
    );

    let (code, _) = close_frame_within(&mut socket, Duration::from_secs(6)).await;
    let after = removed_again.elapsed();
    assert_eq!(code, CloseCode::Away);
    assert!(
        after >= Duration::from_millis(4800),
        "not before the deadline: {after:?}"
    );
    assert_eq!(
        router.metric("switchyard_drained_connections_total{reason=\"removed_backend_deadline\"}"),
        1.0
    );
    eventually(Duration::from_secs(2), "the gauge to drop", || {
        router.metric("switchyard_connections_to_removed_backends") == 0.0
    });
    let mut fresh = open_websocket(router.http, "deadline.test").await;
    assert_eq!(exchange(&mut fresh, "c").await, "new:c");
}

/// Deleting an app is a tenancy boundary: its connections end after `--drain-grace-s`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deleting_an_app_closes_its_websockets_after_the_grace() {
    let router = RouterProcess::start();
    let backend = Backend::start("doomed");
    router.put_app(
        "doomed",
        json!({"domains": ["doomed.test"], "backends": [backend.addr.to_string()]}),
    );
    let mut socket = open_websocket(router.http, "doomed.test").await;
    assert_eq!(router.admin_call("DELETE", "/v1/apps/doomed", None).0, 204);
    let deleted = Instant::now();
    assert_eq!(
        exchange(&mut socket, "a").await,
        "doomed:a",
        "open through the grace"
    );
    let (code, _) = close_frame_within(&mut socket, Duration::from_secs(5)).await;
    assert_eq!(code, CloseCode::Away);
    assert!(
        deleted.elapsed() >= Duration::from_millis(900),
        "not before the grace: {:?}",
        deleted.elapsed()
    );
    assert_eq!(
        router.metric("switchyard_drained_connections_total{reason=\"app_deleted\"}"),
        1.0
    );
}

/// A domain moved to another app takes its connections' tenancy with it: the old app's
/// connections by that domain end after the grace, its other domains' stay, and a domain
/// given back within the grace keeps its connections.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn moving_a_domain_to_another_app_closes_its_websockets_after_the_grace() {
    let router = RouterProcess::start();
    let seller = Backend::start("seller");
    let buyer = Backend::start("buyer");
    router.put_app(
        "seller",
        json!({"domains": ["sold.test", "kept.test", "back.test"], "backends": [seller.addr.to_string()]}),
    );
    let mut sold = open_websocket(router.http, "sold.test").await;
    let mut kept = open_websocket(router.http, "kept.test").await;
    let mut back = open_websocket(router.http, "back.test").await;

    router.put_app(
        "seller",
        json!({"domains": ["kept.test"], "backends": [seller.addr.to_string()]}),
    );
    router.put_app(
        "buyer",
        json!({"domains": ["sold.test"], "backends": [buyer.addr.to_string()]}),
    );
    let moved = Instant::now();
    router.put_app(
        "seller",
        json!({"domains": ["kept.test", "back.test"], "backends": [seller.addr.to_string()]}),
    );
    let (code, _) = close_frame_within(&mut sold, Duration::from_secs(5)).await;
    assert_eq!(code, CloseCode::Away);
    assert!(
        moved.elapsed() >= Duration::from_millis(900),
        "not before the grace"
    );
    let mut fresh = open_websocket(router.http, "sold.test").await;
    assert_eq!(exchange(&mut fresh, "a").await, "buyer:a");

    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(
        exchange(&mut kept, "b").await,
        "seller:b",
        "another domain's"
    );
    assert_eq!(
        exchange(&mut back, "c").await,
        "seller:c",
        "given back in time"
    );
    assert_eq!(
        router.metric("switchyard_drained_connections_total{reason=\"domain_moved\"}"),
        1.0
    );
}

#[test]
fn a_long_download_keeps_its_backend_through_changes_and_its_removal() {
    let router = RouterProcess::start();
    let origin = Backend::start("origin");
    let replacement = Backend::start("replacement");
    router.put_app(
        "files",
        json!({"domains": ["files.test"], "backends": [origin.addr.to_string()]}),
    );
    let http = router.http;
    // Three seconds long: three times the drain grace.
    let download = std::thread::spawn(move || {
        support::get(http, "files.test", "/stream?chunks=30&interval_ms=100")
    });
    std::thread::sleep(Duration::from_millis(200));
    for i in 0..10 {
        router.put_app(
            "files",
            json!({"domains": ["files.test", format!("f{i}.test")], "backends": [origin.addr.to_string(), replacement.addr.to_string()]}),
        );
    }
    router.scale("files", &[replacement.addr]);
    assert_eq!(
        router.get("files.test", "/").json()["backend"],
        "replacement"
    );
    let response = download.join().expect("download thread").expect("download");
    assert_eq!(response.status, 200);
    let text = response.text();
    assert_eq!(text.lines().count(), 30, "every chunk arrived: {text}");
    assert!(text.lines().all(|l| l.ends_with("from origin")));
}

/// A drain reaches a plain HTTP response too, not only upgraded connections: deleting the
/// app cuts its long download once the grace has passed.
#[test]
fn deleting_an_app_cuts_its_long_download_after_the_grace() {
    let router = RouterProcess::start();
    let origin = Backend::start("origin");
    router.put_app(
        "files",
        json!({"domains": ["files.test"], "backends": [origin.addr.to_string()]}),
    );
    let http = router.http;
    let started = Instant::now();
    // Five seconds long: five times the drain grace.
    let download = std::thread::spawn(move || {
        support::get(http, "files.test", "/stream?chunks=50&interval_ms=100")
    });
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(router.admin_call("DELETE", "/v1/apps/files", None).0, 204);
    let outcome = download.join().expect("download thread");
    let lasted = started.elapsed();
    assert!(
        lasted < Duration::from_millis(3500),
        "cut after the grace, not at its end: {lasted:?}"
    );
    if let Ok(response) = outcome {
        let chunks = response.text().lines().count();
        assert!((1..50).contains(&chunks), "cut short: {chunks} chunks");
    }
    assert_eq!(
        router.metric("switchyard_drained_connections_total{reason=\"app_deleted\"}"),
        1.0
    );
}

#[test]
fn apps_survive_a_restart_and_a_kill_9() {
    let mut router = RouterProcess::start();
    let backend = Backend::start("durable");
    router.put_app(
        "kept",
        json!({"domains": ["kept.test"], "backends": [backend.addr.to_string()]}),
    );
    let status = router.terminate();
    assert!(status.success(), "SIGTERM exits cleanly: {status}");
    router.restart();
    assert_eq!(
        router.get("kept.test", "/").status,
        200,
        "present after a restart"
    );

    router.put_app(
        "sudden",
        json!({"domains": ["sudden.test"], "backends": [backend.addr.to_string()]}),
    );
    router.kill9();
    router.restart();
    assert_eq!(
        router.get("sudden.test", "/").status,
        200,
        "an acknowledged PUT survives kill -9"
    );
    assert_eq!(router.get("kept.test", "/").status, 200);
    let (_, page) = router.admin_call("GET", "/v1/apps", None);
    assert_eq!(page["apps"].as_array().map(Vec::len), Some(2));
}

#[test]
fn sigterm_stops_accepting_but_finishes_in_flight_requests() {
    let mut router = RouterProcess::start();
    let backend = Backend::start("patient");
    router.put_app(
        "patient",
        json!({"domains": ["patient.test"], "backends": [backend.addr.to_string()]}),
    );
    let http = router.http;
    let in_flight = std::thread::spawn(move || support::get(http, "patient.test", "/slow?ms=1000"));
    eventually(
        Duration::from_secs(5),
        "the slow request to reach the backend",
        || backend.requests() == 1,
    );
    router.signal_terminate();
    eventually(Duration::from_secs(2), "the listener to close", || {
        std::net::TcpStream::connect(http).is_err()
    });
    let response = in_flight
        .join()
        .expect("client thread")
        .expect("the in-flight request completes");
    assert_eq!(response.status, 200);
    assert_eq!(response.text(), "patient");
    assert!(router.wait_exit().success());
}

#[test]
fn a_silent_websocket_client_outlives_the_body_timeout() {
    let router = RouterProcess::start_with(&["--client-body-timeout-s", "1"]);
    let backend = Backend::start("quiet");
    router.put_app(
        "quiet",
        json!({"domains": ["quiet.test"], "backends": [backend.addr.to_string()]}),
    );
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    runtime.block_on(async {
        let mut socket = open_websocket(router.http, "quiet.test").await;
        assert_eq!(exchange(&mut socket, "hello").await, "quiet:hello");
        // Silent for three times the body deadline: a WebSocket is not a slow upload.
        tokio::time::sleep(Duration::from_secs(3)).await;
        assert_eq!(
            exchange(&mut socket, "still here").await,
            "quiet:still here"
        );
    });
}

/// Clients leave without a goodbye all day (a phone loses its network under a WebSocket):
/// the router frees what the WebSocket held and logs no error for it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_resetting_its_websocket_is_not_an_error_in_the_log() {
    let router = RouterProcess::start();
    let backend = Backend::start("home");
    router.put_app(
        "chat",
        json!({"domains": ["chat.test"], "backends": [backend.addr.to_string()]}),
    );
    let mut socket = open_websocket(router.http, "chat.test").await;
    assert_eq!(exchange(&mut socket, "hello").await, "home:hello");
    assert_eq!(router.metric("switchyard_open_websockets"), 1.0);
    if let MaybeTlsStream::Plain(stream) = socket.get_ref() {
        // Closing with a zero linger sends a reset, as a vanished client's network does.
        stream.set_zero_linger().expect("SO_LINGER 0");
    }
    // Only what is logged from the reset on: the harness's own probes of the ports at
    // start leave their traces too.
    let logged_before = router.logs().len();
    drop(socket);
    eventually(
        Duration::from_secs(5),
        "the router to let the WebSocket go",
        || router.metric("switchyard_open_websockets") == 0.0 && backend.open_websockets() == 0,
    );
    // The request is logged once its relay has ended, with whatever the ending made.
    eventually(
        Duration::from_secs(5),
        "the WebSocket in the access log",
        || {
            router
                .access_records()
                .iter()
                .any(|record| record["app"] == "chat" && record["status"] == 101)
        },
    );
    let logs = router.logs();
    let errors: Vec<&str> = logs
        .get(logged_before..)
        .unwrap_or_default()
        .lines()
        .filter(|l| l.contains(" ERROR ") || l.contains(" WARN "))
        .collect();
    assert!(
        errors.is_empty(),
        "no error logged for a client's reset: {errors:#?}"
    );
}
