//! Connections for the requests the router makes itself, beside the client's: copies to
//! shadow backends (mirror) and originals fetched for image resizing. Plain or TLS (a
//! shadow may be reached over HTTPS, verified or not), HTTP/1.1, kept idle per target
//! (`idle_connections`) by the thread that made them. The client's own requests go
//! through the thread's backend pool (`pool`), which these never touch, so a slow shadow
//! can never hold a primary's connection.

use std::net::SocketAddr;
use std::pin::Pin;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::combinators::UnsyncBoxBody;
use hyper::client::conn::http1::{self, SendRequest};
use hyper_util::rt::TokioIo;
use openssl::ssl::{SslConnector, SslMethod, SslVerifyMode};
use parking_lot::Mutex;
use prometheus::IntGauge;
use switchyard_model::ProxyProtocol;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;
use tokio_openssl::SslStream;

use crate::idle_connections::{self, ms_since, IdleConnections, Keepable};
use crate::proxy_protocol::Announced;

/// The body of a request the router makes: any stream of bytes that may fail.
pub(crate) type SideBody = UnsyncBoxBody<Bytes, Box<dyn std::error::Error + Send + Sync>>;

/// Where a side request goes.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct Target {
    pub(crate) address: SocketAddr,
    /// `None` for cleartext.
    pub(crate) tls: Option<TlsTarget>,
    /// The PROXY protocol version an app's backend reads (its "local" header goes first).
    pub(crate) proxy_protocol: Option<ProxyProtocol>,
}

/// How a TLS target is reached.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct TlsTarget {
    /// The name sent in SNI and, when verifying, checked against the certificate.
    pub(crate) server_name: Option<String>,
    /// Whether the certificate chain is verified against the system's roots.
    pub(crate) verify: bool,
}

/// A connection ready for one request.
pub(crate) struct SideConnection {
    pub(crate) sender: SendRequest<SideBody>,
    target: Target,
}

/// Why no connection could be had.
#[derive(Debug)]
pub(crate) enum ConnectError {
    TimedOut,
    Failed(String),
}

impl std::fmt::Display for ConnectError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::TimedOut => f.write_str("connect timed out"),
            Self::Failed(e) => f.write_str(e),
        }
    }
}

impl Keepable for SideConnection {
    fn is_closed(&self) -> bool {
        self.sender.is_closed()
    }
}

/// One thread's idle side connections, at most `limit` in all, counted in `gauge`.
pub(crate) struct SidePool {
    idle: Mutex<IdleConnections<Target, SideConnection>>,
    /// Its own clock for the idle times: it is used off the listener threads too.
    started: Instant,
}

impl SidePool {
    pub(crate) fn new(limit: usize, gauge: IntGauge) -> Self {
        Self {
            idle: Mutex::new(IdleConnections::new(limit, gauge)),
            started: Instant::now(),
        }
    }

    /// A kept connection to `target` that still works, or a new one made within `timeout`
    /// (TCP and TLS handshakes together).
    pub(crate) async fn get(
        &self,
        target: &Target,
        timeout: Duration,
    ) -> Result<SideConnection, ConnectError> {
        loop {
            let now_ms = ms_since(self.started);
            let Some(mut connection) = self.idle.lock().take(target, now_ms) else {
                break;
            };
            if idle_connections::ready(&mut connection.sender).await {
                return Ok(connection);
            }
        }
        match tokio::time::timeout(timeout, connect(target)).await {
            Ok(connected) => connected,
            Err(_) => Err(ConnectError::TimedOut),
        }
    }

    /// Keeps `connection`, whose last response was read to its end; closes it when the
    /// pool is full.
    pub(crate) fn put(&self, connection: SideConnection) {
        let target = connection.target.clone();
        self.idle
            .lock()
            .put(target, connection, ms_since(self.started));
    }

    /// Closes the connections idle for too long or closed by their peer.
    pub(crate) fn sweep(&self) {
        self.idle.lock().sweep(ms_since(self.started));
    }
}

async fn connect(target: &Target) -> Result<SideConnection, ConnectError> {
    let failed = |e: &dyn std::fmt::Display| ConnectError::Failed(e.to_string());
    let mut stream = TcpStream::connect(target.address)
        .await
        .map_err(|e| failed(&e))?;
    let _ = stream.set_nodelay(true);
    if let Some(version) = target.proxy_protocol {
        let own = Announced {
            version,
            ends: None,
        };
        stream
            .write_all(&own.header())
            .await
            .map_err(|e| failed(&e))?;
    }
    let address = target.address;
    let sender = match &target.tls {
        None => handshake(stream, address).await?,
        Some(tls) => {
            let connector = tls_connector(tls.verify).map_err(|e| failed(&e))?;
            let mut config = connector.configure().map_err(|e| failed(&e))?;
            config.set_verify_hostname(tls.verify && tls.server_name.is_some());
            config.set_use_server_name_indication(tls.server_name.is_some());
            let ssl = config
                .into_ssl(tls.server_name.as_deref().unwrap_or(""))
                .map_err(|e| failed(&e))?;
            let mut stream = SslStream::new(ssl, stream).map_err(|e| failed(&e))?;
            Pin::new(&mut stream)
                .connect()
                .await
                .map_err(|e| failed(&e))?;
            handshake(stream, address).await?
        }
    };
    Ok(SideConnection {
        sender,
        target: target.clone(),
    })
}

async fn handshake<S>(stream: S, address: SocketAddr) -> Result<SendRequest<SideBody>, ConnectError>
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let (sender, connection) = http1::handshake(TokioIo::new(stream))
        .await
        .map_err(|e| ConnectError::Failed(e.to_string()))?;
    tokio::spawn(async move {
        if let Err(e) = connection.await {
            log::debug!("side connection to {address} ended: {e}");
        }
    });
    Ok(sender)
}

/// OpenSSL's client context, built once per thread for each of the two verification modes
/// (loading the system's roots for each connection would cost more than the handshake).
fn tls_connector(verify: bool) -> Result<SslConnector, openssl::error::ErrorStack> {
    thread_local! {
        static VERIFYING: std::cell::OnceCell<SslConnector> = const { std::cell::OnceCell::new() };
        static TRUSTING: std::cell::OnceCell<SslConnector> = const { std::cell::OnceCell::new() };
    }
    let build = || -> Result<SslConnector, openssl::error::ErrorStack> {
        let mut builder = SslConnector::builder(SslMethod::tls_client())?;
        if !verify {
            builder.set_verify(SslVerifyMode::NONE);
        }
        Ok(builder.build())
    };
    let cell = if verify { &VERIFYING } else { &TRUSTING };
    cell.with(|cell| {
        if let Some(connector) = cell.get() {
            return Ok(connector.clone());
        }
        let connector = build()?;
        Ok(cell.get_or_init(|| connector).clone())
    })
}
