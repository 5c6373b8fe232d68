//! The admin API over TLS, for fleets whose admin API is reached over the network: the
//! router's certificate, and optionally client certificates signed by a CA of the
//! operator's (`--admin-client-ca`), checked in the handshake before any HTTP is read.
//! OpenSSL, as for the proxy's own listeners; one hyper HTTP/1 connection per client.

use std::net::SocketAddr;
use std::path::Path;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::ConnectInfo;
use axum::Router;
use hyper_util::rt::TokioIo;
use openssl::ssl::{Ssl, SslAcceptor, SslFiletype, SslMethod, SslVerifyMode};
use tokio::net::TcpListener;
use tokio_openssl::SslStream;
use tower::ServiceExt;

/// Time a client has to finish its handshake: a silent peer never holds a task.
const HANDSHAKE_DEADLINE: Duration = Duration::from_secs(10);
/// Connections served at once; beyond, new ones wait in the listen queue.
const MAX_CONNECTIONS: usize = 256;

/// The admin listener's TLS: certificate, key, and the CA client certificates must chain to.
pub struct AdminTls {
    acceptor: SslAcceptor,
}

impl AdminTls {
    /// Reads the PEM files; an error names the file and why.
    pub fn from_files(cert: &Path, key: &Path, client_ca: Option<&Path>) -> Result<Self, String> {
        let mut builder = SslAcceptor::mozilla_intermediate_v5(SslMethod::tls_server())
            .map_err(|e| format!("admin TLS: {e}"))?;
        builder
            .set_certificate_chain_file(cert)
            .map_err(|e| format!("admin_tls_cert {}: {e}", cert.display()))?;
        builder
            .set_private_key_file(key, SslFiletype::PEM)
            .map_err(|e| format!("admin_tls_key {}: {e}", key.display()))?;
        builder.check_private_key().map_err(|e| {
            format!(
                "admin_tls_key {} does not match the certificate: {e}",
                key.display()
            )
        })?;
        if let Some(ca) = client_ca {
            builder
                .set_ca_file(ca)
                .map_err(|e| format!("admin_client_ca {}: {e}", ca.display()))?;
            builder.set_verify(SslVerifyMode::PEER | SslVerifyMode::FAIL_IF_NO_PEER_CERT);
        }
        Ok(Self {
            acceptor: builder.build(),
        })
    }
}

/// Serves `router` over TLS on `listener` until `shutdown` completes; connections under way
/// are let finish.
pub(crate) async fn serve(
    listener: TcpListener,
    router: Router,
    tls: Arc<AdminTls>,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let slots = Arc::new(tokio::sync::Semaphore::new(MAX_CONNECTIONS));
    let mut shutdown = std::pin::pin!(shutdown);
    loop {
        let Ok(slot) = slots.clone().acquire_owned().await else {
            return Ok(());
        };
        let (tcp, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(e) => {
                    log::warn!("admin API: accept failed: {e}");
                    continue;
                }
            },
            () = &mut shutdown => return Ok(()),
        };
        let (router, tls) = (router.clone(), tls.clone());
        tokio::spawn(async move {
            let _slot = slot;
            if let Err(e) = serve_connection(tcp, peer, router, &tls).await {
                log::debug!("admin API connection from {peer}: {e}");
            }
        });
    }
}

async fn serve_connection(
    tcp: tokio::net::TcpStream,
    peer: SocketAddr,
    router: Router,
    tls: &AdminTls,
) -> Result<(), String> {
    let ssl = Ssl::new(tls.acceptor.context()).map_err(|e| e.to_string())?;
    let mut stream = SslStream::new(ssl, tcp).map_err(|e| e.to_string())?;
    tokio::time::timeout(HANDSHAKE_DEADLINE, Pin::new(&mut stream).accept())
        .await
        .map_err(|_| "handshake timed out".to_string())?
        .map_err(|e| format!("handshake: {e}"))?;
    let service =
        hyper::service::service_fn(move |mut request: hyper::Request<hyper::body::Incoming>| {
            // The client's address, for the audit log, as axum's own serving gives it.
            request.extensions_mut().insert(ConnectInfo(peer));
            router.clone().oneshot(request.map(axum::body::Body::new))
        });
    hyper::server::conn::http1::Builder::new()
        .serve_connection(TokioIo::new(stream), service)
        .await
        .map_err(|e| e.to_string())
}
