//! The floor of a shared-nothing hyper engine, as nginx's workers are laid out: one thread
//! per worker, each with its own single-threaded runtime, its own SO_REUSEPORT listener and
//! its own pool of backend connections, so no request touches state another thread owns.
//! Host → backend and nothing else; WebSocket upgrades are relayed.
//!
//! TLS (`--tls-listen` with `--cert` and `--key`) is OpenSSL's, one acceptor shared by all
//! threads so that session tickets resume on any of them.
//!
//! `hyper-floor --listen 127.0.0.1:8080 --threads 2 --route app7.bench=127.0.0.1:9001 …`

use std::collections::HashMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Empty};
use hyper::body::Incoming;
use hyper::header::{HeaderValue, HOST, UPGRADE};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Request, Response, StatusCode, Uri};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioIo};
use openssl::ssl::{Ssl, SslAcceptor, SslFiletype, SslMethod};
use socket2::{Domain, Socket, Type};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio_openssl::SslStream;

type Body = BoxBody<Bytes, hyper::Error>;
type Backends = Client<HttpConnector, Incoming>;

fn status(code: StatusCode) -> Response<Body> {
    let mut response = Response::new(Empty::new().map_err(|never| match never {}).boxed());
    *response.status_mut() = code;
    response
}

async fn proxy(
    mut request: Request<Incoming>,
    routes: Arc<HashMap<String, SocketAddr>>,
    backends: Backends,
) -> Result<Response<Body>, Infallible> {
    let host = request
        .headers()
        .get(HOST)
        .and_then(|h| h.to_str().ok())
        .map(|h| h.split(':').next().unwrap_or(h).to_ascii_lowercase());
    let Some(address) = host.and_then(|h| routes.get(&h).copied()) else {
        return Ok(status(StatusCode::NOT_FOUND));
    };
    let path = request
        .uri()
        .path_and_query()
        .map_or("/", |p| p.as_str())
        .to_string();
    let Ok(uri) = format!("http://{address}{path}").parse::<Uri>() else {
        return Ok(status(StatusCode::BAD_REQUEST));
    };
    let upgrade = request.headers().get(UPGRADE).cloned();
    let client_upgrade = upgrade.is_some().then(|| hyper::upgrade::on(&mut request));
    let (mut parts, body) = request.into_parts();
    parts.uri = uri;
    if let Some(upgrade) = upgrade {
        // hyper drops hop-by-hop headers it does not manage; an upgrade needs them back.
        parts.headers.insert(UPGRADE, upgrade);
        parts.headers.insert(
            hyper::header::CONNECTION,
            HeaderValue::from_static("upgrade"),
        );
    }
    let mut response = match backends.request(Request::from_parts(parts, body)).await {
        Ok(response) => response,
        Err(_) => return Ok(status(StatusCode::BAD_GATEWAY)),
    };
    if response.status() == StatusCode::SWITCHING_PROTOCOLS {
        if let Some(client_upgrade) = client_upgrade {
            let backend_upgrade = hyper::upgrade::on(&mut response);
            tokio::spawn(async move {
                if let (Ok(client), Ok(backend)) = (client_upgrade.await, backend_upgrade.await) {
                    let _ = tokio::io::copy_bidirectional(
                        &mut TokioIo::new(client),
                        &mut TokioIo::new(backend),
                    )
                    .await;
                }
            });
        }
    }
    Ok(response.map(|body| body.boxed()))
}

fn reuse_port_listener(address: SocketAddr) -> std::io::Result<std::net::TcpListener> {
    let socket = Socket::new(Domain::for_address(address), Type::STREAM, None)?;
    socket.set_reuse_address(true)?;
    socket.set_reuse_port(true)?;
    socket.set_nodelay(true)?;
    socket.set_nonblocking(true)?;
    socket.bind(&address.into())?;
    socket.listen(4096)?;
    Ok(socket.into())
}

/// What a worker listens on: plain HTTP, and HTTPS when a certificate is given.
#[derive(Clone)]
struct Listen {
    http: SocketAddr,
    https: Option<(SocketAddr, Arc<SslAcceptor>)>,
}

fn serve<S>(stream: S, routes: Arc<HashMap<String, SocketAddr>>, backends: Backends)
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    tokio::spawn(async move {
        let service = service_fn(move |request| proxy(request, routes.clone(), backends.clone()));
        let _ = http1::Builder::new()
            .serve_connection(TokioIo::new(stream), service)
            .with_upgrades()
            .await;
    });
}

async fn accept_tls(
    listener: tokio::net::TcpListener,
    acceptor: Arc<SslAcceptor>,
    routes: Arc<HashMap<String, SocketAddr>>,
    backends: Backends,
) -> std::io::Result<()> {
    loop {
        let (stream, _) = listener.accept().await?;
        let _ = stream.set_nodelay(true);
        let (acceptor, routes, backends) = (acceptor.clone(), routes.clone(), backends.clone());
        tokio::spawn(async move {
            let Ok(ssl) = Ssl::new(acceptor.context()) else {
                return;
            };
            let Ok(mut tls) = SslStream::new(ssl, stream) else {
                return;
            };
            if Pin::new(&mut tls).accept().await.is_ok() {
                serve(tls, routes, backends);
            }
        });
    }
}

fn worker(listen: Listen, routes: Arc<HashMap<String, SocketAddr>>) -> std::io::Result<()> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async move {
        let listener = tokio::net::TcpListener::from_std(reuse_port_listener(listen.http)?)?;
        let mut connector = HttpConnector::new();
        connector.set_nodelay(true);
        let backends: Backends = Client::builder(TokioExecutor::new())
            .pool_idle_timeout(Duration::from_secs(30))
            .pool_max_idle_per_host(4096)
            .build(connector);
        if let Some((address, acceptor)) = listen.https {
            let listener = tokio::net::TcpListener::from_std(reuse_port_listener(address)?)?;
            let (routes, backends) = (routes.clone(), backends.clone());
            tokio::spawn(async move {
                if let Err(e) = accept_tls(listener, acceptor, routes, backends).await {
                    eprintln!("hyper-floor: TLS listener stopped: {e}");
                }
            });
        }
        loop {
            let (stream, _) = listener.accept().await?;
            let _ = stream.set_nodelay(true);
            serve(stream, routes.clone(), backends.clone());
        }
    })
}

fn tls_acceptor(cert: &PathBuf, key: &PathBuf) -> Result<SslAcceptor, String> {
    let mut acceptor =
        SslAcceptor::mozilla_intermediate_v5(SslMethod::tls_server()).map_err(|e| e.to_string())?;
    acceptor
        .set_certificate_chain_file(cert)
        .map_err(|e| format!("--cert {}: {e}", cert.display()))?;
    acceptor
        .set_private_key_file(key, SslFiletype::PEM)
        .map_err(|e| format!("--key {}: {e}", key.display()))?;
    Ok(acceptor.build())
}

fn main() {
    let mut listen: SocketAddr = ([127, 0, 0, 1], 8080).into();
    let mut tls_listen: Option<SocketAddr> = None;
    let (mut cert, mut key) = (None, None);
    let mut threads = 2;
    let mut routes = HashMap::new();
    let mut given = std::env::args().skip(1);
    while let (Some(flag), Some(value)) = (given.next(), given.next()) {
        let parsed = match flag.as_str() {
            "--listen" => value.parse().map(|a| listen = a).map_err(|e| e.to_string()),
            "--tls-listen" => value
                .parse()
                .map(|a| tls_listen = Some(a))
                .map_err(|e| e.to_string()),
            "--cert" => {
                cert = Some(PathBuf::from(&value));
                Ok(())
            }
            "--key" => {
                key = Some(PathBuf::from(&value));
                Ok(())
            }
            "--threads" => value
                .parse::<usize>()
                .map(|n| threads = n)
                .map_err(|e| e.to_string()),
            "--route" => match value.split_once('=').map(|(h, a)| (h, a.parse())) {
                Some((host, Ok(address))) => {
                    routes.insert(host.to_ascii_lowercase(), address);
                    Ok(())
                }
                _ => Err("expected HOST=IP:PORT".to_string()),
            },
            _ => Err("unknown flag".to_string()),
        };
        if let Err(e) = parsed {
            eprintln!("hyper-floor: {flag} {value}: {e}");
            std::process::exit(2);
        }
    }
    let https = match (tls_listen, cert, key) {
        (None, _, _) => None,
        (Some(address), Some(cert), Some(key)) => match tls_acceptor(&cert, &key) {
            Ok(acceptor) => Some((address, Arc::new(acceptor))),
            Err(e) => {
                eprintln!("hyper-floor: {e}");
                std::process::exit(2);
            }
        },
        (Some(_), _, _) => {
            eprintln!("hyper-floor: --tls-listen needs --cert and --key");
            std::process::exit(2);
        }
    };
    let listen = Listen {
        http: listen,
        https,
    };
    let routes = Arc::new(routes);
    let workers: Vec<_> = (0..threads)
        .map(|_| {
            let (listen, routes) = (listen.clone(), routes.clone());
            std::thread::spawn(move || worker(listen, routes))
        })
        .collect();
    for worker in workers {
        if let Ok(Err(e)) = worker.join() {
            eprintln!("hyper-floor: worker stopped: {e}");
            std::process::exit(1);
        }
    }
}
