//! Changes take effect within moments, without a reload and without cutting connections;
//! only a removed backend loses its connections, after the drain grace period (1 s here).

mod support;

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use futures_util::{SinkExt, StreamExt};
use serde_json::json;
use support::{eventually, Backend, RouterProcess};
use tokio::net::TcpStream;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::{MaybeTlsStream, WebSocketStream};

type Socket = WebSocketStream<MaybeTlsStream<TcpStream>>;

async fn open_websocket(router: SocketAddr, host: &str) -> Socket {
    let stream = TcpStream::connect(router)
        .await
        .expect("connect to the router");
    let url = format!("ws://{host}:{}/chat", router.port());
    let (socket, response) = tokio_tungstenite::client_async(url, MaybeTlsStream::Plain(stream))
        .await
        .expect("WebSocket handshake through the router");
    assert_eq!(response.status(), 101);
    socket
}

async fn exchange(socket: &mut Socket, text: &str) -> String {
    socket.send(Message::text(text)).await.expect("send");
    let reply = tokio::time::timeout(Duration::from_secs(5), socket.next())
        .await
        .expect("a reply within 5 s")
        .expect("the socket is open")
        .expect("a frame");
    reply.into_text().expect("text").to_string()
}

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
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn removing_a_backend_closes_its_websockets_after_the_grace_period() {
    let router = RouterProcess::start();
    let leaving = Backend::start("leaving");
    let staying = Backend::start("staying");
    router.put_app(
        "drain",
        json!({"domains": ["drain.test"], "backends": [leaving.addr.to_string()]}),
    );
    let mut socket = open_websocket(router.http, "drain.test").await;
    assert_eq!(exchange(&mut socket, "a").await, "leaving:a");

    router.scale("drain", &[staying.addr]);
    let removed_at = Instant::now();
    assert_eq!(
        exchange(&mut socket, "b").await,
        "leaving:b",
        "the grace period lets it finish"
    );

    let closed = tokio::time::timeout(Duration::from_secs(5), async {
        loop {
            match socket.next().await {
                None | Some(Err(_)) | Some(Ok(Message::Close(_))) => return,
                Some(Ok(_)) => {}
            }
        }
    })
    .await;
    assert!(
        closed.is_ok(),
        "the connection to the removed backend was closed"
    );
    assert!(
        removed_at.elapsed() >= Duration::from_millis(900),
        "not before the grace period"
    );
    let mut fresh = open_websocket(router.http, "drain.test").await;
    assert_eq!(exchange(&mut fresh, "c").await, "staying:c");
}

#[test]
fn a_long_download_keeps_its_backend_through_changes() {
    let router = RouterProcess::start();
    let origin = Backend::start("origin");
    let replacement = Backend::start("replacement");
    router.put_app(
        "files",
        json!({"domains": ["files.test"], "backends": [origin.addr.to_string()]}),
    );
    let http = router.http;
    let download = std::thread::spawn(move || {
        support::get(http, "files.test", "/stream?chunks=20&interval_ms=50")
    });
    std::thread::sleep(Duration::from_millis(200));
    for i in 0..10 {
        router.put_app(
            "files",
            json!({"domains": ["files.test", format!("f{i}.test")], "backends": [origin.addr.to_string(), replacement.addr.to_string()]}),
        );
    }
    let response = download.join().expect("download thread").expect("download");
    assert_eq!(response.status, 200);
    let text = response.text();
    assert_eq!(text.lines().count(), 20, "every chunk arrived: {text}");
    assert!(text.lines().all(|l| l.ends_with("from origin")));
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
