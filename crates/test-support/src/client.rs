//! A deliberately small HTTP/1.1 client: one request per connection, any Host header.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

/// A parsed response.
#[derive(Debug)]
pub struct Response {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Response {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("body is not JSON ({e}): {}", self.text()))
    }
}

/// `GET path` with the given Host.
pub fn get(addr: SocketAddr, host: &str, path: &str) -> std::io::Result<Response> {
    send(addr, "GET", host, path, "")
}

/// `method path` without a body, with the given Host and `extra` header lines (each ending
/// in `\r\n`).
pub fn send(
    addr: SocketAddr,
    method: &str,
    host: &str,
    path: &str,
    extra: &str,
) -> std::io::Result<Response> {
    request(
        addr,
        &format!("{method} {path} HTTP/1.1\r\nHost: {host}\r\n{extra}Connection: close\r\n\r\n"),
    )
}

/// Sends raw request bytes and reads the response until the server closes.
pub fn request(addr: SocketAddr, raw: &str) -> std::io::Result<Response> {
    let mut stream = TcpStream::connect_timeout(&addr, Duration::from_secs(5))?;
    stream.set_read_timeout(Some(Duration::from_secs(15)))?;
    stream.write_all(raw.as_bytes())?;
    let mut bytes = Vec::new();
    stream.read_to_end(&mut bytes).map_err(|e| match e.kind() {
        std::io::ErrorKind::WouldBlock => {
            std::io::Error::new(std::io::ErrorKind::TimedOut, "no answer within 15 s")
        }
        _ => e,
    })?;
    parse(&bytes).ok_or_else(|| {
        std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!(
                "unparseable response: {:?}",
                String::from_utf8_lossy(&bytes)
            ),
        )
    })
}

/// The status and headers of a response head (up to and including the blank line).
pub(crate) fn parse_head(head: &[u8]) -> Option<Response> {
    let head = std::str::from_utf8(head).ok()?.trim_end();
    let mut lines = head.split("\r\n");
    let status = lines.next()?.split(' ').nth(1)?.parse().ok()?;
    let headers: Vec<(String, String)> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_string(), v.trim().to_string()))
        .collect();
    Some(Response {
        status,
        headers,
        body: Vec::new(),
    })
}

fn parse(bytes: &[u8]) -> Option<Response> {
    let head_end = bytes.windows(4).position(|w| w == b"\r\n\r\n")?;
    let Response {
        status, headers, ..
    } = parse_head(&bytes[..head_end + 4])?;
    let raw_body = &bytes[head_end + 4..];
    let chunked = headers
        .iter()
        .any(|(k, v)| k.eq_ignore_ascii_case("transfer-encoding") && v.contains("chunked"));
    let body = if chunked {
        dechunk(raw_body)?
    } else {
        raw_body.to_vec()
    };
    Some(Response {
        status,
        headers,
        body,
    })
}

fn dechunk(mut data: &[u8]) -> Option<Vec<u8>> {
    let mut body = Vec::new();
    loop {
        let line_end = data.windows(2).position(|w| w == b"\r\n")?;
        let size_text = std::str::from_utf8(&data[..line_end]).ok()?;
        let size = usize::from_str_radix(size_text.split(';').next()?.trim(), 16).ok()?;
        data = &data[line_end + 2..];
        if size == 0 {
            return Some(body);
        }
        body.extend_from_slice(data.get(..size)?);
        data = data.get(size + 2..)?;
    }
}
