//! A backend that keeps every byte the router sent it, connection by connection, so that a
//! test can check what a backend really received rather than what a parser made of it.
//!
//! It answers each request it can frame (RFC 9112: chunked wins over Content-Length) with
//! `200` and a body naming the request, and closes a connection it cannot frame. The
//! recorded bytes can then be read the way two different backends would read them
//! (`Framing`), which is how request smuggling is caught: a desync needs two parties that
//! disagree on where a request ends.

use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::Duration;

/// Bytes kept per connection; a test sends far less.
const MAX_KEPT_PER_CONNECTION: usize = 1 << 20;

pub struct Wiretap {
    pub addr: SocketAddr,
    connections: Arc<Mutex<Vec<Arc<Mutex<Wire>>>>>,
    stopping: Arc<AtomicBool>,
}

/// What one connection carried.
#[derive(Debug, Clone, Default)]
pub struct Wire {
    pub bytes: Vec<u8>,
    /// The router closed it (or it was closed for bytes that could not be framed).
    pub closed: bool,
}

impl Wiretap {
    pub fn start() -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").expect("wiretap binds");
        listener
            .set_nonblocking(true)
            .expect("non-blocking listener");
        let addr = listener.local_addr().expect("bound address");
        let connections: Arc<Mutex<Vec<Arc<Mutex<Wire>>>>> = Arc::default();
        let stopping = Arc::new(AtomicBool::new(false));
        let (accepted, stop) = (connections.clone(), stopping.clone());
        thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                match listener.accept() {
                    Ok((stream, _)) => {
                        let wire = Arc::new(Mutex::new(Wire::default()));
                        accepted.lock().expect("connections").push(wire.clone());
                        let stop = stop.clone();
                        thread::spawn(move || serve(stream, &wire, &stop));
                    }
                    Err(e) if e.kind() == ErrorKind::WouldBlock => {
                        thread::sleep(Duration::from_millis(5));
                    }
                    Err(_) => return,
                }
            }
        });
        Self {
            addr,
            connections,
            stopping,
        }
    }

    /// Everything received so far, one entry per connection, in the order they were accepted.
    pub fn wires(&self) -> Vec<Wire> {
        self.connections
            .lock()
            .expect("connections")
            .iter()
            .map(|wire| wire.lock().expect("wire").clone())
            .collect()
    }

    /// Forgets what was recorded, and the connections already closed.
    pub fn clear(&self) {
        let mut connections = self.connections.lock().expect("connections");
        connections.retain(|wire| !wire.lock().expect("wire").closed);
        for wire in connections.iter() {
            wire.lock().expect("wire").bytes.clear();
        }
    }
}

impl Drop for Wiretap {
    fn drop(&mut self) {
        self.stopping.store(true, Ordering::Relaxed);
    }
}

fn serve(stream: TcpStream, wire: &Mutex<Wire>, stopping: &AtomicBool) {
    serve_until_closed(stream, wire, stopping);
    wire.lock().expect("wire").closed = true;
}

fn serve_until_closed(mut stream: TcpStream, wire: &Mutex<Wire>, stopping: &AtomicBool) {
    let _ = stream.set_read_timeout(Some(Duration::from_millis(100)));
    let mut pending = Vec::new();
    let mut buf = [0u8; 16 * 1024];
    while !stopping.load(Ordering::Relaxed) {
        let n = match stream.read(&mut buf) {
            Ok(0) => return,
            Ok(n) => n,
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => continue,
            Err(_) => return,
        };
        {
            let mut kept = wire.lock().expect("wire");
            let room = MAX_KEPT_PER_CONNECTION.saturating_sub(kept.bytes.len());
            kept.bytes.extend_from_slice(&buf[..n.min(room)]);
        }
        pending.extend_from_slice(&buf[..n]);
        loop {
            match next_request(&pending, Framing::TransferEncodingFirst) {
                Parse::Complete(request, used) => {
                    pending.drain(..used);
                    let body = format!("seen {} {}", request.method, request.target);
                    let answer = format!(
                        "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: {}\r\n\r\n{body}",
                        body.len()
                    );
                    if stream.write_all(answer.as_bytes()).is_err() {
                        return;
                    }
                }
                Parse::Incomplete => break,
                Parse::Invalid(_) => {
                    let _ = stream.write_all(
                        b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
                    );
                    return;
                }
            }
        }
    }
}

/// How a backend decides where a request body ends when a request is ambiguous. Real
/// servers differ exactly here; a router must never send bytes on which they could.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Framing {
    /// RFC 9112: any Transfer-Encoding mentioning chunked wins over Content-Length.
    TransferEncodingFirst,
    /// Older servers: the first Content-Length wins over Transfer-Encoding.
    ContentLengthFirst,
}

#[derive(Clone, PartialEq, Eq)]
pub struct WireRequest {
    /// The request line and header section exactly as received, blank line included.
    pub head: Vec<u8>,
    pub method: String,
    pub target: String,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl std::fmt::Debug for WireRequest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{:?} + body {:?}",
            String::from_utf8_lossy(&self.head),
            String::from_utf8_lossy(&self.body)
        )
    }
}

impl WireRequest {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

pub enum Parse {
    Complete(WireRequest, usize),
    Incomplete,
    Invalid(String),
}

/// Reads the requests on one connection's bytes the way a lenient backend using `framing`
/// would (bare LF accepted as a line end, first Content-Length taken). Returns the requests
/// and, if the bytes do not end on a request boundary, why.
pub fn read_wire(wire: &[u8], framing: Framing) -> (Vec<WireRequest>, Option<String>) {
    let mut requests = Vec::new();
    let mut at = 0;
    while at < wire.len() {
        match next_request(&wire[at..], framing) {
            Parse::Complete(request, used) => {
                requests.push(request);
                at += used;
            }
            Parse::Incomplete => {
                return (
                    requests,
                    Some(format!("{} bytes left unframed", wire.len() - at)),
                )
            }
            Parse::Invalid(why) => return (requests, Some(why)),
        }
    }
    (requests, None)
}

fn next_request(bytes: &[u8], framing: Framing) -> Parse {
    let Some(head_end) = find_head_end(bytes) else {
        return Parse::Incomplete;
    };
    let head = String::from_utf8_lossy(&bytes[..head_end.0]).into_owned();
    let mut lines = head.split('\n').map(|line| line.trim_end_matches('\r'));
    let request_line = lines.next().unwrap_or_default();
    let mut parts = request_line.split(' ');
    let (Some(method), Some(target)) = (parts.next(), parts.next()) else {
        return Parse::Invalid(format!("request line {request_line:?}"));
    };
    let mut headers = Vec::new();
    for line in lines.filter(|line| !line.is_empty()) {
        let Some((name, value)) = line.split_once(':') else {
            return Parse::Invalid(format!("header line {line:?}"));
        };
        headers.push((name.to_string(), value.trim().to_string()));
    }
    let request = WireRequest {
        head: bytes[..head_end.1].to_vec(),
        method: method.to_string(),
        target: target.to_string(),
        headers,
        body: Vec::new(),
    };
    let chunked = request
        .headers
        .iter()
        .any(|(n, v)| n.eq_ignore_ascii_case("transfer-encoding") && v.contains("chunked"));
    let length = request
        .header("content-length")
        .map(|v| v.parse::<usize>().ok());
    let body_start = head_end.1;
    let use_chunked = match framing {
        Framing::TransferEncodingFirst => chunked,
        Framing::ContentLengthFirst => chunked && length.is_none(),
    };
    if use_chunked {
        return read_chunked(bytes, body_start, request);
    }
    match length {
        Some(None) => Parse::Invalid("unparseable Content-Length".into()),
        Some(Some(length)) => {
            if bytes.len() < body_start + length {
                return Parse::Incomplete;
            }
            let mut request = request;
            request.body = bytes[body_start..body_start + length].to_vec();
            Parse::Complete(request, body_start + length)
        }
        None => Parse::Complete(request, body_start),
    }
}

/// Where the header section ends: (end of the last header line, start of the body).
fn find_head_end(bytes: &[u8]) -> Option<(usize, usize)> {
    let mut line_start = 0;
    for (i, &b) in bytes.iter().enumerate() {
        if b != b'\n' {
            continue;
        }
        let line = &bytes[line_start..i];
        if line.is_empty() || line == b"\r" {
            return Some((line_start, i + 1));
        }
        line_start = i + 1;
    }
    None
}

fn read_line(bytes: &[u8], from: usize) -> Option<(&[u8], usize)> {
    let end = bytes[from..].iter().position(|&b| b == b'\n')? + from;
    let line = &bytes[from..end];
    Some((line.strip_suffix(b"\r").unwrap_or(line), end + 1))
}

fn read_chunked(bytes: &[u8], mut at: usize, mut request: WireRequest) -> Parse {
    loop {
        let Some((size_line, data_start)) = read_line(bytes, at) else {
            return Parse::Incomplete;
        };
        let size_text = String::from_utf8_lossy(size_line);
        let size_text = size_text.split(';').next().unwrap_or_default().trim();
        let Ok(size) = usize::from_str_radix(size_text, 16) else {
            return Parse::Invalid(format!("chunk size {size_text:?}"));
        };
        if size == 0 {
            // Trailer fields, then an empty line.
            let mut trailer_at = data_start;
            loop {
                let Some((line, next)) = read_line(bytes, trailer_at) else {
                    return Parse::Incomplete;
                };
                trailer_at = next;
                if line.is_empty() {
                    return Parse::Complete(request, trailer_at);
                }
            }
        }
        let Some(data_end) = data_start.checked_add(size) else {
            return Parse::Invalid("chunk size overflows".into());
        };
        if bytes.len() < data_end + 2 {
            return Parse::Incomplete;
        }
        if &bytes[data_end..data_end + 2] != b"\r\n" {
            return Parse::Invalid("chunk data not followed by CRLF".into());
        }
        request.body.extend_from_slice(&bytes[data_start..data_end]);
        at = data_end + 2;
    }
}
