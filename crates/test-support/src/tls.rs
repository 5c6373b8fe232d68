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
    /// Certificates the server sent, the leaf included.
    pub chain_length: usize,
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
    let chain_length = stream
        .ssl()
        .peer_cert_chain()
        .map_or(0, |chain| chain.len());
    let alpn = stream
        .ssl()
        .selected_alpn_protocol()
        .map(|p| String::from_utf8_lossy(p).into_owned());
    Ok(TlsConnection {
        stream,
        fingerprint,
        chain_length,
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

/// A request as a [`TlsBackend`] received it, with the SNI name of its connection.
#[derive(Debug, Clone)]
pub struct TlsRecorded {
    pub sni: Option<String>,
    pub method: String,
    pub target: String,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

/// A TLS HTTP/1.1 backend (OpenSSL, one thread per connection, keep-alive) that records
/// every request and answers `200 ok`. Stopped with the test process.
pub struct TlsBackend {
    pub addr: SocketAddr,
    recorded: std::sync::Arc<std::sync::Mutex<Vec<TlsRecorded>>>,
}

impl TlsBackend {
    pub fn start(issued: &super::pki::Issued) -> Self {
        use openssl::pkey::PKey;
        use openssl::ssl::SslAcceptor;
        use openssl::x509::X509;

        let mut acceptor =
            SslAcceptor::mozilla_intermediate_v5(SslMethod::tls()).expect("acceptor");
        let chain = X509::stack_from_pem(issued.cert_pem.as_bytes()).expect("chain");
        acceptor.set_certificate(&chain[0]).expect("certificate");
        for extra in &chain[1..] {
            acceptor.add_extra_chain_cert(extra.clone()).expect("chain");
        }
        let key = PKey::private_key_from_pem(issued.key_pem.as_bytes()).expect("key");
        acceptor.set_private_key(&key).expect("key");
        let acceptor = std::sync::Arc::new(acceptor.build());
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let addr = listener.local_addr().expect("address");
        let recorded = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let shared = recorded.clone();
        std::thread::spawn(move || {
            for tcp in listener.incoming().flatten() {
                let acceptor = acceptor.clone();
                let shared = shared.clone();
                std::thread::spawn(move || {
                    if let Ok(stream) = acceptor.accept(tcp) {
                        serve_tls(stream, &shared);
                    }
                });
            }
        });
        Self { addr, recorded }
    }

    pub fn recorded(&self) -> Vec<TlsRecorded> {
        self.recorded.lock().expect("recorded").clone()
    }
}

fn serve_tls(stream: SslStream<TcpStream>, recorded: &std::sync::Mutex<Vec<TlsRecorded>>) {
    use std::io::BufRead;
    let sni = stream
        .ssl()
        .servername(openssl::ssl::NameType::HOST_NAME)
        .map(str::to_string);
    let mut reader = std::io::BufReader::new(stream);
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line).unwrap_or(0) == 0 {
            return;
        }
        let mut parts = line.split_whitespace();
        let (Some(method), Some(target)) = (parts.next(), parts.next()) else {
            return;
        };
        let (method, target) = (method.to_string(), target.to_string());
        let mut headers = Vec::new();
        loop {
            let mut header = String::new();
            if reader.read_line(&mut header).unwrap_or(0) == 0 {
                return;
            }
            let header = header.trim_end();
            if header.is_empty() {
                break;
            }
            if let Some((name, value)) = header.split_once(':') {
                headers.push((name.trim().to_ascii_lowercase(), value.trim().to_string()));
            }
        }
        let length = headers
            .iter()
            .find(|(n, _)| n == "content-length")
            .and_then(|(_, v)| v.parse::<usize>().ok())
            .unwrap_or(0);
        let mut body = vec![0; length];
        if reader.read_exact(&mut body).is_err() {
            return;
        }
        recorded.lock().expect("recorded").push(TlsRecorded {
            sni: sni.clone(),
            method,
            target,
            headers,
            body,
        });
        let stream = reader.get_mut();
        if stream
            .write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
            .is_err()
        {
            return;
        }
    }
}
