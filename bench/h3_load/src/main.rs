//! A closed-loop HTTP/3 load for bench/http3_network.py: `connections` QUIC connections,
//! each keeping `streams` GETs in flight, until `requests` are answered; or, with
//! `--fresh`, every request on a connection of its own (full handshake), `connections` at
//! once. Prints one line of JSON (answered, failed, seconds); `--latency-file` gets each
//! request's milliseconds, one per line (as bench/h3_load.py, whose options these are).
//!
//! The server's certificate is not checked against a CA (the bench's is self-signed), but
//! its handshake signature is, so a handshake costs what a browser's does.

use std::cell::RefCell;
use std::error::Error;
use std::net::{SocketAddr, ToSocketAddrs};
use std::rc::Rc;
use std::sync::Arc;
use std::time::Instant;

use bytes::{Buf, Bytes};
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::CryptoProvider;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{DigitallySignedStruct, SignatureScheme};

type Failure = Box<dyn Error>;
type Requests = h3::client::SendRequest<h3_quinn::OpenStreams, Bytes>;

struct Options {
    target: SocketAddr,
    server_name: String,
    uri: http::Uri,
    requests: usize,
    connections: usize,
    streams: usize,
    fresh: bool,
    latency_file: Option<String>,
}

fn options() -> Result<Options, Failure> {
    let mut args = std::env::args().skip(1);
    let (mut host, mut port, mut server_name, mut path) =
        ("127.0.0.1".to_string(), None, None, "/".to_string());
    let (mut requests, mut connections, mut streams) = (10_000, 4, 10);
    let (mut fresh, mut latency_file) = (false, None);
    while let Some(flag) = args.next() {
        let mut value = || args.next().ok_or(format!("{flag} needs a value"));
        match flag.as_str() {
            "--host" => host = value()?,
            "--port" => port = Some(value()?.parse::<u16>()?),
            "--server-name" => server_name = Some(value()?),
            "--path" => path = value()?,
            "--requests" => requests = value()?.parse()?,
            "--connections" => connections = value()?.parse()?,
            "--streams" => streams = value()?.parse()?,
            "--latency-file" => latency_file = Some(value()?),
            "--fresh" => fresh = true,
            other => return Err(format!("unknown option {other}").into()),
        }
    }
    let port = port.ok_or("--port is required")?;
    let server_name = server_name.ok_or("--server-name is required")?;
    let target = (host.as_str(), port)
        .to_socket_addrs()?
        .next()
        .ok_or("no address")?;
    let uri = format!("https://{server_name}:{port}{path}").parse()?;
    Ok(Options {
        target,
        server_name,
        uri,
        requests,
        connections: connections.max(1),
        streams: streams.max(1),
        fresh,
        latency_file,
    })
}

/// Accepts any certificate, checking the handshake's signature with it.
#[derive(Debug)]
struct AnyCertificate(Arc<CryptoProvider>);

impl ServerCertVerifier for AnyCertificate {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

fn client_config() -> Result<quinn::ClientConfig, Failure> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut tls = rustls::ClientConfig::builder_with_provider(provider.clone())
        .with_protocol_versions(&[&rustls::version::TLS13])?
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(AnyCertificate(provider)))
        .with_no_client_auth();
    tls.alpn_protocols = vec![b"h3".to_vec()];
    let quic = quinn::crypto::rustls::QuicClientConfig::try_from(tls)?;
    Ok(quinn::ClientConfig::new(Arc::new(quic)))
}

#[derive(Default)]
struct Tally {
    answered: usize,
    failed: usize,
    latencies_ms: Vec<f64>,
    /// Requests still to be sent.
    left: usize,
}

impl Tally {
    fn take_one(tally: &RefCell<Tally>) -> bool {
        let mut tally = tally.borrow_mut();
        let some = tally.left > 0;
        tally.left = tally.left.saturating_sub(1);
        some
    }
}

/// A new connection: its quinn handle, what sends its requests, and the task driving it.
async fn connect(
    endpoint: &quinn::Endpoint,
    options: &Options,
) -> Result<(quinn::Connection, Requests), Failure> {
    let quic = endpoint
        .connect(options.target, &options.server_name)?
        .await?;
    let (mut driver, requests) = h3::client::new(h3_quinn::Connection::new(quic.clone())).await?;
    tokio::task::spawn_local(async move {
        let _ = std::future::poll_fn(|cx| driver.poll_close(cx)).await;
    });
    Ok((quic, requests))
}

async fn get(requests: &mut Requests, uri: &http::Uri) -> Result<u16, Failure> {
    let request = http::Request::get(uri.clone()).body(())?;
    let mut stream = requests.send_request(request).await?;
    stream.finish().await?;
    let response = stream.recv_response().await?;
    while let Some(mut chunk) = stream.recv_data().await? {
        chunk.advance(chunk.remaining());
    }
    Ok(response.status().as_u16())
}

async fn timed_get(requests: &mut Requests, options: &Options, tally: &RefCell<Tally>) {
    let started = Instant::now();
    let status = get(requests, &options.uri).await;
    let mut tally = tally.borrow_mut();
    match status {
        Ok(200) => {
            tally.answered += 1;
            tally
                .latencies_ms
                .push(started.elapsed().as_secs_f64() * 1000.0);
        }
        Ok(_) | Err(_) => tally.failed += 1,
    }
}

async fn one_connection(
    endpoint: quinn::Endpoint,
    options: Rc<Options>,
    tally: Rc<RefCell<Tally>>,
) -> Result<(), Failure> {
    let (quic, requests) = connect(&endpoint, &options).await?;
    let mut loops = Vec::new();
    for _ in 0..options.streams {
        let (mut requests, options, tally) = (requests.clone(), options.clone(), tally.clone());
        loops.push(tokio::task::spawn_local(async move {
            while Tally::take_one(&tally) {
                timed_get(&mut requests, &options, &tally).await;
            }
        }));
    }
    for each in loops {
        each.await?;
    }
    quic.close(0u32.into(), b"done");
    Ok(())
}

async fn fresh_connections(
    endpoint: quinn::Endpoint,
    options: Rc<Options>,
    tally: Rc<RefCell<Tally>>,
) {
    while Tally::take_one(&tally) {
        match connect(&endpoint, &options).await {
            Ok((quic, mut requests)) => {
                timed_get(&mut requests, &options, &tally).await;
                quic.close(0u32.into(), b"done");
            }
            Err(_) => tally.borrow_mut().failed += 1,
        }
    }
}

async fn run(options: Options) -> Result<(), Failure> {
    let bind: SocketAddr = if options.target.is_ipv4() {
        "0.0.0.0:0".parse()?
    } else {
        "[::]:0".parse()?
    };
    let mut endpoint = quinn::Endpoint::client(bind)?;
    endpoint.set_default_client_config(client_config()?);
    let options = Rc::new(options);
    let tally = Rc::new(RefCell::new(Tally {
        left: options.requests,
        ..Tally::default()
    }));
    let started = Instant::now();
    let mut workers = Vec::new();
    for _ in 0..options.connections {
        let (endpoint, options, tally) = (endpoint.clone(), options.clone(), tally.clone());
        workers.push(tokio::task::spawn_local(async move {
            if options.fresh {
                fresh_connections(endpoint, options, tally).await;
            } else if let Err(e) = one_connection(endpoint, options, tally.clone()).await {
                eprintln!("a connection failed: {e}");
                tally.borrow_mut().failed += 1;
            }
        }));
    }
    for worker in workers {
        worker.await?;
    }
    let seconds = started.elapsed().as_secs_f64();
    endpoint.wait_idle().await;
    let tally = tally.borrow();
    if let Some(path) = &options.latency_file {
        let lines: String = tally
            .latencies_ms
            .iter()
            .map(|ms| format!("{ms:.3}\n"))
            .collect();
        std::fs::write(path, lines)?;
    }
    println!(
        "{}",
        serde_json::json!({"answered": tally.answered, "failed": tally.failed, "seconds": seconds})
    );
    Ok(())
}

fn main() -> Result<(), Failure> {
    let options = options()?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    tokio::task::LocalSet::new().block_on(&runtime, run(options))
}
