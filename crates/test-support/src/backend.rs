//! Test backends: real TCP servers on 127.0.0.1 speaking HTTP/1.1 with keep-alive, and
//! WebSocket on Upgrade. They run on a runtime of their own so that tests may block.
//!
//! Paths: `/health` answers the configurable health status; `/slow?ms=N` waits first;
//! `/stream?chunks=N&interval_ms=M` sends a chunked body slowly; `/origin…` is a caching
//! origin that sends exactly the fields its query asks for (see `origin_answer`);
//! anything else answers JSON describing the request (backend name, method, path, headers,
//! body length).

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU16, AtomicUsize, Ordering};
use std::sync::{Arc, LazyLock, Mutex};
use std::time::Duration;

use futures_util::{SinkExt, StreamExt};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::AbortHandle;
use tokio_tungstenite::tungstenite::handshake::derive_accept_key;
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;
use tokio_tungstenite::tungstenite::protocol::{CloseFrame, Role};
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::WebSocketStream;

static RUNTIME: LazyLock<tokio::runtime::Runtime> = LazyLock::new(|| {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("backend runtime")
});

struct Shared {
    name: String,
    requests: AtomicUsize,
    health_status: AtomicU16,
    tasks: Mutex<Vec<AbortHandle>>,
    behaviour: Mutex<Behaviour>,
    recorded: Mutex<Vec<Recorded>>,
    in_flight: AtomicUsize,
    max_in_flight: AtomicUsize,
    open_websockets: AtomicUsize,
    /// Set when the backend shuts down gracefully: WebSockets say goodbye first.
    going_away: tokio::sync::watch::Sender<bool>,
}

/// How a backend treats every request (WebSocket upgrades aside).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Behaviour {
    /// Answers by path, as described at the top of this file.
    Normal,
    /// Waits this long, then answers normally.
    Delay(Duration),
    /// Answers this status with a short body.
    Status(u16),
    /// Answers this status with an empty body.
    BareStatus(u16),
    /// Resets the connection (RST) once the request is read.
    Reset,
}

/// A request as the backend received it.
#[derive(Debug, Clone)]
pub struct Recorded {
    pub method: String,
    pub target: String,
    pub headers: BTreeMap<String, String>,
    pub body: Vec<u8>,
}

/// Requests kept for inspection; later ones are counted but not kept.
const MAX_RECORDED: usize = 100_000;

/// A running backend; stopped (every socket closed) on `stop` or drop.
pub struct Backend {
    pub addr: SocketAddr,
    shared: Arc<Shared>,
}

impl Backend {
    /// The name it answers with (`backend` in its JSON, before the text a WebSocket echoes).
    pub fn name(&self) -> &str {
        &self.shared.name
    }

    /// Starts a backend named `name` on a free port.
    pub fn start(name: &str) -> Self {
        Self::start_on("127.0.0.1:0".parse().expect("address"), name)
    }

    /// Starts a backend on a given address (to bring a stopped one back).
    pub fn start_on(addr: SocketAddr, name: &str) -> Self {
        // Bound with std so this works from async tests too; converted on the backend runtime.
        let listener = std::net::TcpListener::bind(addr)
            .unwrap_or_else(|e| panic!("backend {name} cannot bind {addr}: {e}"));
        listener
            .set_nonblocking(true)
            .expect("non-blocking listener");
        let addr = listener.local_addr().expect("bound address");
        let shared = Arc::new(Shared {
            name: name.to_string(),
            requests: AtomicUsize::new(0),
            health_status: AtomicU16::new(200),
            tasks: Mutex::new(Vec::new()),
            behaviour: Mutex::new(Behaviour::Normal),
            recorded: Mutex::new(Vec::new()),
            in_flight: AtomicUsize::new(0),
            max_in_flight: AtomicUsize::new(0),
            open_websockets: AtomicUsize::new(0),
            going_away: tokio::sync::watch::Sender::new(false),
        });
        let accept_shared = shared.clone();
        let accept = RUNTIME.spawn(async move {
            let Ok(listener) = TcpListener::from_std(listener) else {
                return;
            };
            while let Ok((stream, _)) = listener.accept().await {
                let _ = stream.set_nodelay(true);
                let conn_shared = accept_shared.clone();
                let task = tokio::spawn(serve_connection(stream, conn_shared));
                accept_shared
                    .tasks
                    .lock()
                    .expect("tasks")
                    .push(task.abort_handle());
            }
        });
        shared
            .tasks
            .lock()
            .expect("tasks")
            .push(accept.abort_handle());
        Self { addr, shared }
    }

    /// Requests answered so far (WebSocket upgrades included).
    pub fn requests(&self) -> usize {
        self.shared.requests.load(Ordering::Relaxed)
    }

    /// How every request is treated from now on.
    pub fn set_behaviour(&self, behaviour: Behaviour) {
        *self.shared.behaviour.lock().expect("behaviour") = behaviour;
    }

    /// Every request received so far (up to a bound), in arrival order.
    pub fn recorded(&self) -> Vec<Recorded> {
        self.shared.recorded.lock().expect("recorded").clone()
    }

    /// The most requests this backend was handling at once.
    pub fn max_concurrent(&self) -> usize {
        self.shared.max_in_flight.load(Ordering::Relaxed)
    }

    /// What `/health` answers from now on.
    pub fn set_health_status(&self, status: u16) {
        self.shared.health_status.store(status, Ordering::Relaxed);
    }

    /// WebSockets open to this backend now.
    pub fn open_websockets(&self) -> usize {
        self.shared.open_websockets.load(Ordering::Relaxed)
    }

    /// Sends every open WebSocket a close frame 1001 (going away) and then stops, as a
    /// server shutting down gracefully does.
    pub fn shut_down_gracefully(&self) {
        self.shared.going_away.send_replace(true);
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        while self.open_websockets() > 0 && std::time::Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
        self.stop();
    }

    /// Closes the listener and every open connection, like a killed container.
    pub fn stop(&self) {
        for task in self.shared.tasks.lock().expect("tasks").drain(..) {
            task.abort();
        }
    }
}

impl Drop for Backend {
    fn drop(&mut self) {
        self.stop();
    }
}

async fn serve_connection(stream: TcpStream, shared: Arc<Shared>) {
    let mut reader = BufReader::new(stream);
    loop {
        let Some(request) = read_request(&mut reader).await else {
            return;
        };
        shared.requests.fetch_add(1, Ordering::Relaxed);
        {
            let mut recorded = shared.recorded.lock().expect("recorded");
            if recorded.len() < MAX_RECORDED {
                recorded.push(Recorded {
                    method: request.method.clone(),
                    target: request.target.clone(),
                    headers: request.headers.clone(),
                    body: request.body.clone(),
                });
            }
        }
        let is_websocket = request
            .headers
            .get("upgrade")
            .is_some_and(|v| v.eq_ignore_ascii_case("websocket"));
        if is_websocket {
            shared.open_websockets.fetch_add(1, Ordering::Relaxed);
            serve_websocket(reader.into_inner(), &request, &shared).await;
            shared.open_websockets.fetch_sub(1, Ordering::Relaxed);
            return;
        }
        let behaviour = *shared.behaviour.lock().expect("behaviour");
        let now = shared.in_flight.fetch_add(1, Ordering::AcqRel) + 1;
        shared.max_in_flight.fetch_max(now, Ordering::AcqRel);
        let answered = match behaviour {
            Behaviour::Normal => respond(&mut reader, &request, &shared).await,
            Behaviour::Delay(delay) => {
                tokio::time::sleep(delay).await;
                respond(&mut reader, &request, &shared).await
            }
            Behaviour::Status(status) => {
                write_response(reader.get_mut(), status, "text/plain", b"failing").await
            }
            Behaviour::BareStatus(status) => {
                write_response(reader.get_mut(), status, "text/plain", b"").await
            }
            Behaviour::Reset => {
                let _ = reader.get_ref().set_zero_linger();
                Err(std::io::ErrorKind::ConnectionReset.into())
            }
        };
        shared.in_flight.fetch_sub(1, Ordering::AcqRel);
        if answered.is_err() {
            return;
        }
    }
}

struct Request {
    method: String,
    target: String,
    headers: BTreeMap<String, String>,
    body: Vec<u8>,
}

async fn read_request(reader: &mut BufReader<TcpStream>) -> Option<Request> {
    let mut line = String::new();
    if reader.read_line(&mut line).await.ok()? == 0 {
        return None;
    }
    let mut parts = line.split_whitespace();
    let method = parts.next()?.to_string();
    let target = parts.next()?.to_string();
    let mut headers = BTreeMap::new();
    loop {
        let mut header = String::new();
        reader.read_line(&mut header).await.ok()?;
        let header = header.trim_end();
        if header.is_empty() {
            break;
        }
        let (name, value) = header.split_once(':')?;
        headers.insert(name.trim().to_ascii_lowercase(), value.trim().to_string());
    }
    let mut body = Vec::new();
    if let Some(length) = headers
        .get("content-length")
        .and_then(|v| v.parse::<usize>().ok())
    {
        body.resize(length, 0);
        reader.read_exact(&mut body).await.ok()?;
    } else if headers
        .get("transfer-encoding")
        .is_some_and(|v| v.contains("chunked"))
    {
        loop {
            let mut size_line = String::new();
            reader.read_line(&mut size_line).await.ok()?;
            let size = usize::from_str_radix(size_line.trim().split(';').next()?, 16).ok()?;
            let mut chunk = vec![0; size + 2];
            reader.read_exact(&mut chunk).await.ok()?;
            if size == 0 {
                break;
            }
            body.extend_from_slice(&chunk[..size]);
        }
    }
    Some(Request {
        method,
        target,
        headers,
        body,
    })
}

fn query_param(target: &str, key: &str) -> Option<u64> {
    let query = target.split_once('?')?.1;
    query
        .split('&')
        .filter_map(|kv| kv.split_once('='))
        .find(|(k, _)| *k == key)
        .and_then(|(_, v)| v.parse().ok())
}

async fn respond(
    reader: &mut BufReader<TcpStream>,
    request: &Request,
    shared: &Shared,
) -> std::io::Result<()> {
    let path = request.target.split('?').next().unwrap_or("/");
    let stream = reader.get_mut();
    match path {
        "/health" => {
            let status = shared.health_status.load(Ordering::Relaxed);
            write_response(stream, status, "text/plain", b"health").await
        }
        "/slow" => {
            let ms = query_param(&request.target, "ms").unwrap_or(1000);
            tokio::time::sleep(Duration::from_millis(ms)).await;
            write_response(stream, 200, "text/plain", shared.name.as_bytes()).await
        }
        "/bytes" => {
            // `n` zero bytes, written as fast as the reader takes them.
            let length = query_param(&request.target, "n").unwrap_or(0);
            stream
                .write_all(format!("HTTP/1.1 200 OK\r\nContent-Type: application/octet-stream\r\nContent-Length: {length}\r\n\r\n").as_bytes())
                .await?;
            let piece = vec![0u8; 64 * 1024];
            let mut left = length as usize;
            while left > 0 {
                let n = left.min(piece.len());
                stream.write_all(&piece[..n]).await?;
                left -= n;
            }
            Ok(())
        }
        "/stream" => {
            let chunks = query_param(&request.target, "chunks").unwrap_or(10);
            let interval = query_param(&request.target, "interval_ms").unwrap_or(100);
            stream
                .write_all(b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nTransfer-Encoding: chunked\r\n\r\n")
                .await?;
            for i in 0..chunks {
                let chunk = format!("chunk {i} from {}\n", shared.name);
                stream
                    .write_all(format!("{:x}\r\n{chunk}\r\n", chunk.len()).as_bytes())
                    .await?;
                stream.flush().await?;
                tokio::time::sleep(Duration::from_millis(interval)).await;
            }
            stream.write_all(b"0\r\n\r\n").await
        }
        _ if path.starts_with("/origin") => {
            let served = shared.requests.load(Ordering::Relaxed);
            let conditional = request.headers.contains_key("if-none-match")
                || request.headers.contains_key("if-modified-since");
            if let Some(ms) = query_param(&request.target, "revalidate_ms").filter(|_| conditional)
            {
                tokio::time::sleep(Duration::from_millis(ms)).await;
            }
            stream
                .write_all(&origin_answer(
                    request,
                    served,
                    std::time::SystemTime::now(),
                ))
                .await
        }
        _ => {
            let description = serde_json::json!({
                "backend": shared.name,
                "method": request.method,
                "path": request.target,
                "headers": request.headers,
                "body_len": request.body.len(),
            });
            let body = serde_json::to_vec(&description).unwrap_or_default();
            let extra = response_headers_asked(&request.target);
            write_response_with(stream, 200, "application/json", &extra, &body).await
        }
    }
}

/// The answer of the caching origin, the `served`th request of the backend, at `now`. Its
/// query names the answer: `status=N` (200), `h=Name:Value` for each field as sent
/// (percent-encoded), and fields made at `now`: `date=S` (a `Date` S seconds from now,
/// negative for the past), `expires=S`, `last_modified=S` (seconds ago); a conditional
/// request waits `revalidate_ms=N` first (the caller does that wait). The body is
/// `origin N` (text/plain unless an `h=` says otherwise), and `X-Served: N` tells which
/// request made a copy. A request whose
/// `If-None-Match` holds the answer's `ETag`, or whose `If-Modified-Since` is its
/// `Last-Modified`, gets a 304 with the same fields, but for those named by `h304=Name:Value`,
/// sent instead.
fn origin_answer(request: &Request, served: usize, now: std::time::SystemTime) -> Vec<u8> {
    let query = request.target.split_once('?').map_or("", |(_, q)| q);
    let at = |offset: &str| -> Option<String> {
        let seconds: i64 = offset.parse().ok()?;
        let when = if seconds >= 0 {
            now + Duration::from_secs(seconds.unsigned_abs())
        } else {
            now - Duration::from_secs(seconds.unsigned_abs())
        };
        Some(httpdate::fmt_http_date(when))
    };
    let mut status = 200;
    let mut fields: Vec<(String, String)> = Vec::new();
    let mut on_304: Vec<(String, String)> = Vec::new();
    for (key, value) in query.split('&').filter_map(|kv| kv.split_once('=')) {
        let value = percent_decoded(value);
        let made = match key {
            "status" => {
                status = value.parse().unwrap_or(200);
                None
            }
            "h304" => {
                on_304.extend(
                    value
                        .split_once(':')
                        .map(|(n, v)| (n.to_string(), v.trim().to_string())),
                );
                None
            }
            "h" => value
                .split_once(':')
                .map(|(n, v)| (n.to_string(), v.trim().to_string())),
            "date" => at(&value).map(|d| ("Date".to_string(), d)),
            "expires" => at(&value).map(|d| ("Expires".to_string(), d)),
            "last_modified" => at(&format!("-{value}")).map(|d| ("Last-Modified".to_string(), d)),
            _ => None,
        };
        fields.extend(made);
    }
    let field = |name: &str| {
        fields
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    };
    let unchanged = match request.headers.get("if-none-match") {
        Some(asked) => field("etag").is_some_and(|tag| asked.split(',').any(|t| t.trim() == tag)),
        None => request
            .headers
            .get("if-modified-since")
            .is_some_and(|since| field("last-modified") == Some(since.as_str())),
    };
    let body = format!("origin {served}");
    let (status, body) = if unchanged && status == 200 {
        (304, "")
    } else {
        (status, body.as_str())
    };
    let replaced = |name: &str| on_304.iter().any(|(n, _)| n.eq_ignore_ascii_case(name));
    let sent: Vec<&(String, String)> = if status == 304 {
        let kept = fields.iter().filter(|(name, _)| !replaced(name));
        kept.chain(on_304.iter()).collect()
    } else {
        fields.iter().collect()
    };
    let mut head = format!("HTTP/1.1 {status} X\r\nX-Served: {served}\r\n");
    for (name, value) in sent {
        head.push_str(&format!("{name}: {value}\r\n"));
    }
    if status != 304 {
        if field("content-type").is_none() {
            head.push_str("Content-Type: text/plain\r\n");
        }
        head.push_str(&format!("Content-Length: {}\r\n", body.len()));
    }
    head.push_str("\r\n");
    let mut answer = head.into_bytes();
    answer.extend_from_slice(body.as_bytes());
    answer
}

/// `%XX` escapes decoded (the query's own separators and spaces are sent escaped).
fn percent_decoded(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut decoded = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let escaped = (bytes[i] == b'%')
            .then(|| text.get(i + 1..i + 3))
            .flatten()
            .and_then(|hex| u8::from_str_radix(hex, 16).ok());
        match escaped {
            Some(byte) => {
                decoded.push(byte);
                i += 3;
            }
            None => {
                decoded.push(bytes[i]);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&decoded).into_owned()
}

/// Response headers a request asks for in its query: `cc=` (Cache-Control), `vary=`,
/// `cookie=` (a Set-Cookie), so tests can drive caching decisions.
fn response_headers_asked(target: &str) -> String {
    let Some((_, query)) = target.split_once('?') else {
        return String::new();
    };
    let mut headers = String::new();
    for (key, value) in query.split('&').filter_map(|kv| kv.split_once('=')) {
        let value = value.replace("%20", " ").replace("%2C", ",");
        match key {
            "cc" => headers.push_str(&format!("Cache-Control: {value}\r\n")),
            "vary" => headers.push_str(&format!("Vary: {value}\r\n")),
            "cookie" => headers.push_str(&format!("Set-Cookie: {value}\r\n")),
            _ => {}
        }
    }
    headers
}

async fn write_response(
    stream: &mut TcpStream,
    status: u16,
    content_type: &str,
    body: &[u8],
) -> std::io::Result<()> {
    write_response_with(stream, status, content_type, "", body).await
}

async fn write_response_with(
    stream: &mut TcpStream,
    status: u16,
    content_type: &str,
    extra_headers: &str,
    body: &[u8],
) -> std::io::Result<()> {
    let head = format!(
        "HTTP/1.1 {status} X\r\nContent-Type: {content_type}\r\n{extra_headers}Content-Length: {}\r\n\r\n",
        body.len()
    );
    // One write: a head and a body in two small segments would wait out the router's
    // delayed ACK (Nagle), adding 40 ms to every request.
    let mut response = head.into_bytes();
    response.extend_from_slice(body);
    stream.write_all(&response).await
}

/// Completes the handshake by hand (the request head is already read), then echoes every
/// text message as `NAME:message` until the client closes or the backend goes away.
async fn serve_websocket(mut stream: TcpStream, request: &Request, shared: &Shared) {
    let name = &shared.name;
    let mut going_away = shared.going_away.subscribe();
    let Some(key) = request.headers.get("sec-websocket-key") else {
        return;
    };
    let head = format!(
        "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Accept: {}\r\n\r\n",
        derive_accept_key(key.as_bytes())
    );
    if stream.write_all(head.as_bytes()).await.is_err() {
        return;
    }
    let mut socket = WebSocketStream::from_raw_socket(stream, Role::Server, None).await;
    loop {
        let message = tokio::select! {
            message = socket.next() => message,
            _ = async { going_away.wait_for(|away| *away).await.is_ok() } => {
                let goodbye = CloseFrame {
                    code: CloseCode::Away,
                    reason: "backend shutting down".into(),
                };
                let _ = socket.close(Some(goodbye)).await;
                return;
            }
        };
        let Some(Ok(message)) = message else {
            return;
        };
        let reply = match message {
            Message::Text(text) => Message::text(format!("{name}:{text}")),
            Message::Close(_) => return,
            _ => continue,
        };
        if socket.send(reply).await.is_err() {
            return;
        }
    }
}
