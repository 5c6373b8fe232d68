//! Graceful binary upgrade under load: a new router process takes over the listening
//! sockets of the running one over the data directory's hand-over socket, the old one
//! (sent SIGQUIT) finishes what it has and exits, and no client sees a failed request.

use switchyard_test_support as support;

use std::io::{BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::json;
use support::{Backend, RouterProcess};

/// Clients opening a new connection per request, all through the upgrade.
const CLOSING_CLIENTS: usize = 3;

#[derive(Default)]
struct Tally {
    answered: AtomicUsize,
    /// Requests on a reused keep-alive connection that the server closed before answering:
    /// RFC 9112 §9.3.1 lets a client retry these (nothing was processed), and it did.
    retried_on_closed_idle: AtomicUsize,
    failures: Mutex<Vec<String>>,
}

impl Tally {
    fn fail(&self, what: String) {
        self.failures.lock().expect("tally").push(what);
    }
}

#[test]
fn a_binary_upgrade_under_load_fails_no_request_and_keeps_the_store() {
    let mut router = RouterProcess::start();
    let backend = Backend::start("web");
    router.put_app(
        "web",
        json!({"domains": ["web.test"], "backends": [backend.addr.to_string()]}),
    );
    let old_pid = router.pid();
    let stop = Arc::new(AtomicBool::new(false));
    let tally = Arc::new(Tally::default());

    let mut clients = Vec::new();
    for _ in 0..CLOSING_CLIENTS {
        let (stop, tally, http) = (stop.clone(), tally.clone(), router.http);
        clients.push(std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                match support::get(http, "web.test", "/") {
                    Ok(r) if r.status == 200 => {
                        tally.answered.fetch_add(1, Ordering::Relaxed);
                    }
                    Ok(r) => tally.fail(format!("status {}", r.status)),
                    Err(e) => tally.fail(format!("new connection: {e}")),
                }
            }
        }));
    }
    {
        let (stop, tally, http) = (stop.clone(), tally.clone(), router.http);
        clients.push(std::thread::spawn(move || {
            keep_alive_client(http, &stop, &tally)
        }));
    }
    // A download still in flight when the old process stops accepting, which it finishes
    // within the shutdown grace (2 s here): the new process holds the sockets already, and
    // the old one stops accepting as soon as it gets SIGQUIT.
    let interval_ms = 100;
    let http = router.http;
    let download = std::thread::spawn(move || {
        support::get(
            http,
            "web.test",
            &format!("/stream?chunks=16&interval_ms={interval_ms}"),
        )
    });

    // The hand-over starts with the load under way and the download begun at the backend.
    support::eventually(
        Duration::from_secs(5),
        "the load under way and the download begun",
        || {
            tally.answered.load(Ordering::Relaxed) >= 20
                && backend
                    .recorded()
                    .iter()
                    .any(|r| r.target.starts_with("/stream"))
        },
    );
    let mut old = router.upgrade();
    let old_status = old.wait().expect("wait for the old process");
    assert!(
        old_status.success(),
        "the old router exits cleanly: {old_status}"
    );
    // The new process alone now: the load goes on until it has answered some of it.
    let answered_at_exit = tally.answered.load(Ordering::Relaxed);
    support::eventually(
        Duration::from_secs(10),
        "the new process to answer the load",
        || tally.answered.load(Ordering::Relaxed) >= answered_at_exit + 50,
    );
    stop.store(true, Ordering::Relaxed);
    for client in clients {
        client.join().expect("client thread");
    }

    let failures = tally.failures.lock().expect("tally").clone();
    let answered = tally.answered.load(Ordering::Relaxed);
    eprintln!(
        "{answered} requests answered through the upgrade, {} keep-alive retries, failures: {failures:?}",
        tally.retried_on_closed_idle.load(Ordering::Relaxed)
    );
    assert!(failures.is_empty(), "failed requests: {failures:?}");
    // Answers carry `Connection: close` once the old process stops accepting, so only a
    // request sent in the instant its keep-alive connection was closed can meet it: the
    // connection open then, and at most one made in that same instant that the old
    // process still took and answered before it stopped (seen 2 times in 14 runs).
    let retried = tally.retried_on_closed_idle.load(Ordering::Relaxed);
    assert!(
        retried <= 2,
        "{retried} keep-alive requests met a closed connection"
    );
    assert!(answered > 100, "the load ran throughout: {answered}");

    let download = download.join().expect("download thread").expect("download");
    assert_eq!(download.status, 200);
    assert_eq!(
        download.text().lines().count(),
        16,
        "the whole stream arrived"
    );

    assert_ne!(router.pid(), old_pid);
    let (status, _) = router.admin_call("GET", "/v1/apps/web", None);
    assert_eq!(
        status, 200,
        "the new process opened the store the old one released"
    );
    router.put_app(
        "after",
        json!({"domains": ["after.test"], "backends": [backend.addr.to_string()]}),
    );
    assert_eq!(router.get("after.test", "/").status, 200);
    assert!(
        router.metric("switchyard_requests_total{app=\"web\",class=\"2xx\"}") > 0.0,
        "the new process served the load after the hand-over"
    );
    assert!(
        router
            .logs()
            .contains("store released for the next router process"),
        "the old process released the store"
    );
    // The old process's very sockets, not new ones beside them in the SO_REUSEPORT group:
    // what the kernel had queued on them is not reset when the old one stops.
    assert!(
        router.logs().contains("listener took over"),
        "{}",
        router.logs()
    );
}

/// One client on persistent connections, sending the next request as soon as the last
/// answer arrived; it follows `Connection: close` by reconnecting.
fn keep_alive_client(http: SocketAddr, stop: &AtomicBool, tally: &Tally) {
    let mut connection: Option<(BufReader<TcpStream>, usize)> = None;
    while !stop.load(Ordering::Relaxed) {
        let (reader, used) = match connection.take() {
            Some(open) => open,
            None => match TcpStream::connect(http) {
                Ok(stream) => {
                    let _ = stream.set_read_timeout(Some(Duration::from_secs(10)));
                    (BufReader::new(stream), 0)
                }
                Err(e) => {
                    tally.fail(format!("keep-alive connect: {e}"));
                    continue;
                }
            },
        };
        let mut reader = reader;
        let sent = reader
            .get_mut()
            .write_all(b"GET /ka HTTP/1.1\r\nHost: web.test\r\n\r\n");
        match (sent, read_response(&mut reader)) {
            (Ok(()), Ok(Some((200, keep)))) => {
                tally.answered.fetch_add(1, Ordering::Relaxed);
                if keep {
                    connection = Some((reader, used + 1));
                }
            }
            (Ok(()), Ok(Some((status, _)))) => tally.fail(format!("keep-alive status {status}")),
            // Closed before a byte of the answer, on a connection that had served before.
            (_, Ok(None)) if used > 0 => {
                tally.retried_on_closed_idle.fetch_add(1, Ordering::Relaxed);
            }
            (Err(e), _) if used > 0 && e.kind() == std::io::ErrorKind::BrokenPipe => {
                tally.retried_on_closed_idle.fetch_add(1, Ordering::Relaxed);
            }
            (sent, read) => tally.fail(format!("keep-alive request: {sent:?} {read:?}")),
        }
    }
}

/// Status and whether the connection stays open; `None` when closed (or reset) before any
/// byte of an answer.
fn read_response(reader: &mut BufReader<TcpStream>) -> std::io::Result<Option<(u16, bool)>> {
    let mut line = String::new();
    match reader.read_line(&mut line) {
        Ok(0) => return Ok(None),
        // Closed with our request unread (the kernel answers that with a reset).
        Err(e) if line.is_empty() && e.kind() == std::io::ErrorKind::ConnectionReset => {
            return Ok(None)
        }
        Err(e) => return Err(e),
        Ok(_) => {}
    }
    let status: u16 = line
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| std::io::Error::other(format!("bad status line {line:?}")))?;
    let (mut length, mut keep) = (0usize, true);
    loop {
        line.clear();
        reader.read_line(&mut line)?;
        let header = line.trim_end();
        if header.is_empty() {
            break;
        }
        let (name, value) = header.split_once(':').unwrap_or((header, ""));
        let value = value.trim();
        if name.eq_ignore_ascii_case("content-length") {
            length = value.parse().map_err(std::io::Error::other)?;
        } else if name.eq_ignore_ascii_case("connection") && value.eq_ignore_ascii_case("close") {
            keep = false;
        }
    }
    let mut body = vec![0; length];
    std::io::Read::read_exact(reader, &mut body)?;
    Ok(Some((status, keep)))
}

#[test]
fn an_upgrade_with_no_router_to_take_over_from_gives_up() {
    let router = RouterProcess::start();
    let data_dir = router.data_dir();
    drop(router);
    let started = std::time::Instant::now();
    let (_, stderr) = RouterProcess::refused_start([
        "--upgrade",
        "--data-dir",
        &data_dir.display().to_string(),
        "--http",
        "127.0.0.1:0",
        "--admin",
        "127.0.0.1:0",
    ]);
    assert!(
        started.elapsed() < Duration::from_secs(30),
        "gave up in bounded time"
    );
    assert!(stderr.to_lowercase().contains("sock"), "{stderr}");
}

/// The datagrams a router sends its service manager (`NOTIFY_SOCKET`), as systemd would
/// read them.
struct ServiceManager {
    socket: std::os::unix::net::UnixDatagram,
    _dir: tempfile::TempDir,
    path: std::path::PathBuf,
}

impl ServiceManager {
    fn new() -> Self {
        let dir = tempfile::tempdir().expect("a directory");
        let path = dir.path().join("notify.sock");
        let socket = std::os::unix::net::UnixDatagram::bind(&path).expect("bind the socket");
        socket
            .set_read_timeout(Some(Duration::from_secs(20)))
            .expect("a read timeout");
        Self {
            socket,
            _dir: dir,
            path,
        }
    }

    /// The next message (the test fails after 20 s without one).
    fn next(&self) -> String {
        let mut buffer = [0u8; 4096];
        let length = self.socket.recv(&mut buffer).expect("a notification");
        String::from_utf8_lossy(&buffer[..length]).into_owned()
    }
}

#[test]
fn an_upgrade_from_systemds_reload_quits_the_old_router_and_names_the_new_main_process() {
    let manager = ServiceManager::new();
    let notify_socket = manager.path.display().to_string();
    let mut router = RouterProcess::start_with_env(&[], &[("NOTIFY_SOCKET", &notify_socket)]);
    let backend = Backend::start("web");
    router.put_app(
        "web",
        json!({"domains": ["web.test"], "backends": [backend.addr.to_string()]}),
    );
    let old_pid = router.pid();
    assert_eq!(
        manager.next(),
        format!("READY=1\nMAINPID={old_pid}\nSTATUS=serving")
    );
    // A download under way through the hand-over, finished by the old process.
    let http = router.http;
    let download = std::thread::spawn(move || {
        support::get(http, "web.test", "/stream?chunks=10&interval_ms=100")
    });
    support::eventually(Duration::from_secs(5), "the download begun", || {
        backend
            .recorded()
            .iter()
            .any(|r| r.target.starts_with("/stream"))
    });

    let mut old = router.upgrade_quitting_predecessor();
    let new_pid = router.pid();
    // First the new main process (before the old one may exit), then ready; the old one,
    // quitting for a hand-over, never says the service is stopping.
    assert_eq!(manager.next(), format!("MAINPID={new_pid}"));
    assert_eq!(
        manager.next(),
        format!("READY=1\nMAINPID={new_pid}\nSTATUS=serving")
    );
    let status = old.wait().expect("the old router's exit");
    assert!(status.success(), "the old router exits by itself: {status}");
    let answer = download
        .join()
        .expect("the download's thread")
        .expect("the download");
    assert_eq!(answer.status, 200);
    assert_eq!(router.get("web.test", "/").status, 200);

    // SIGTERM is the unit's stop: said, then done.
    assert!(router.terminate().success());
    assert_eq!(manager.next(), "STOPPING=1");
    manager
        .socket
        .set_read_timeout(Some(Duration::from_millis(300)))
        .expect("a read timeout");
    let mut rest = [0u8; 64];
    assert!(
        manager.socket.recv(&mut rest).is_err(),
        "nothing more was sent"
    );
}
