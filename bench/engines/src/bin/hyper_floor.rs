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
use openssl::ssl::{Ssl, SslAcceptor};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio_openssl::SslStream;

#[path = "../floor_options.rs"]
mod floor_options;
use floor_options::reuse_port_listener;

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

fn main() {
    let options = floor_options::from_command_line("hyper-floor");
    let listen = Listen {
        http: options.listen,
        https: options.tls,
    };
    let routes = Arc::new(options.routes);
    floor_options::run_workers("hyper-floor", options.threads, move || {
        worker(listen.clone(), routes.clone())
    });
}
