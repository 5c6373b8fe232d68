//! A real TLS client (OpenSSL) for the HTTPS listener: handshakes with any SNI name, reports
//! which certificate the server sent and what ALPN it chose, and speaks HTTP/1.1 over the
//! connection with keep-alive.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use openssl::ssl::{SslConnector, SslMethod, SslStream, SslVerifyMode};

use super::client::{parse_head, Response};
use super::pki::fingerprint;

/// An open TLS connection to the router.
pub struct TlsConnection {
    pub stream: SslStream<TcpStream>,
    /// SHA-256 of the leaf certificate the server presented.
    pub fingerprint: Vec<u8>,
    pub alpn: Option<String>,
}

/// Handshakes with `server_name` as SNI (none when `None`), offering `alpn` protocols.
/// Certificates are not verified here: tests compare the fingerprint with the one they
/// expect, which is stricter than chain validation.
pub fn connect(
    addr: SocketAddr,
    server_name: Option<&str>,
    alpn: &[&str],
) -> Result<TlsConnection, String> {
    let mut builder = SslConnector::builder(SslMethod::tls()).map_err(|e| e.to_string())?;
    builder.set_verify(SslVerifyMode::NONE);
    if !alpn.is_empty() {
        let wire: Vec<u8> = alpn
            .iter()
            .flat_map(|p| std::iter::once(p.len() as u8).chain(p.bytes()))
            .collect();
        builder.set_alpn_protos(&wire).map_err(|e| e.to_string())?;
    }
    let connector = builder.build();
    let mut config = connector.configure().map_err(|e| e.to_string())?;
    config.set_use_server_name_indication(server_name.is_some());
    config.set_verify_hostname(false);
    let tcp =
        TcpStream::connect_timeout(&addr, Duration::from_secs(5)).map_err(|e| e.to_string())?;
    tcp.set_read_timeout(Some(Duration::from_secs(10)))
        .map_err(|e| e.to_string())?;
    let stream = config
        .connect(server_name.unwrap_or("no-sni.invalid"), tcp)
        .map_err(|e| format!("TLS handshake failed: {e}"))?;
    let fingerprint = stream
        .ssl()
        .peer_certificate()
        .map(|c| fingerprint(&c))
        .ok_or("no peer certificate")?;
    let alpn = stream
        .ssl()
        .selected_alpn_protocol()
        .map(|p| String::from_utf8_lossy(p).into_owned());
    Ok(TlsConnection {
        stream,
        fingerprint,
        alpn,
    })
}

impl TlsConnection {
    /// Sends `GET path` with keep-alive and reads exactly one response.
    pub fn get(&mut self, host: &str, path: &str) -> Result<Response, String> {
        let raw = format!("GET {path} HTTP/1.1\r\nHost: {host}\r\n\r\n");
        self.stream
            .write_all(raw.as_bytes())
            .map_err(|e| e.to_string())?;
        read_response(&mut self.stream)
    }
}

/// Reads one response with a Content-Length body from a kept-alive connection.
fn read_response(stream: &mut impl Read) -> Result<Response, String> {
    let mut bytes = Vec::new();
    let mut buf = [0u8; 8192];
    loop {
        if let Some(head_end) = bytes.windows(4).position(|w| w == b"\r\n\r\n") {
            let mut response = parse_head(&bytes[..head_end + 4]).ok_or("bad response head")?;
            let length: usize = response
                .header("content-length")
                .and_then(|v| v.parse().ok())
                .ok_or("response without content-length")?;
            while bytes.len() < head_end + 4 + length {
                let n = stream.read(&mut buf).map_err(|e| e.to_string())?;
                if n == 0 {
                    return Err("connection closed mid-body".into());
                }
                bytes.extend_from_slice(&buf[..n]);
            }
            response.body = bytes[head_end + 4..head_end + 4 + length].to_vec();
            return Ok(response);
        }
        let n = stream.read(&mut buf).map_err(|e| e.to_string())?;
        if n == 0 {
            return Err("connection closed before a response".into());
        }
        bytes.extend_from_slice(&buf[..n]);
    }
}
