//! instant-acme's HTTP, over OpenSSL: one connection per request (an issuer makes a few
//! requests a minute at most), each step under a deadline so a CA that stops answering
//! fails the order instead of holding the issuer.

use std::future::Future;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use bytes::Bytes;
use http::header::HOST;
use http::{HeaderValue, Request};
use hyper_util::rt::TokioIo;
use instant_acme::{BodyWrapper, BytesResponse, HttpClient};
use openssl::ssl::{SslConnector, SslMethod};
use openssl::x509::X509;
use tokio::net::TcpStream;
use tokio_openssl::SslStream;

/// Connecting, the TLS handshake, and a response's head each get this long.
const STEP_TIMEOUT: Duration = Duration::from_secs(15);

type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// An HTTPS client for the ACME directory. Its OpenSSL context (the system's roots are
/// tens of milliseconds to load) is made on the first request, off the router's start-up.
#[derive(Clone)]
pub(crate) struct OpensslClient {
    ca_file: Option<PathBuf>,
    connector: Arc<OnceLock<Result<SslConnector, String>>>,
}

impl OpensslClient {
    /// Trusts the system's roots and, when given, the CA in `ca_file` (a private ACME
    /// server's: Pebble's, step-ca's), which is checked now: a router is refused at start
    /// rather than failing every order.
    pub(crate) fn new(ca_file: Option<&Path>) -> Result<Self, String> {
        if let Some(path) = ca_file {
            let pem = std::fs::read(path)
                .map_err(|e| format!("cannot read the ACME CA file {}: {e}", path.display()))?;
            match X509::stack_from_pem(&pem) {
                Ok(certs) if !certs.is_empty() => {}
                _ => return Err(format!("{} holds no PEM certificate", path.display())),
            }
        }
        Ok(Self {
            ca_file: ca_file.map(Path::to_path_buf),
            connector: Arc::default(),
        })
    }

    fn connector(&self) -> Result<SslConnector, String> {
        self.connector
            .get_or_init(|| {
                let mut builder = SslConnector::builder(SslMethod::tls_client())
                    .map_err(|e| format!("cannot set up TLS for ACME: {e}"))?;
                if let Some(path) = &self.ca_file {
                    builder.set_ca_file(path).map_err(|e| {
                        format!("cannot load the ACME CA file {}: {e}", path.display())
                    })?;
                }
                Ok(builder.build())
            })
            .clone()
    }
}

impl HttpClient for OpensslClient {
    fn request(
        &self,
        request: Request<BodyWrapper<Bytes>>,
    ) -> Pin<Box<dyn Future<Output = Result<BytesResponse, instant_acme::Error>> + Send>> {
        let connector = self.connector();
        Box::pin(async move {
            let connector = connector.map_err(|e| instant_acme::Error::Other(e.into()))?;
            send(connector, request)
                .await
                .map_err(instant_acme::Error::Other)
        })
    }
}

async fn send(
    connector: SslConnector,
    mut request: Request<BodyWrapper<Bytes>>,
) -> Result<BytesResponse, BoxError> {
    let uri = request.uri().clone();
    if uri.scheme_str() != Some("https") {
        return Err(format!("the ACME directory must be https: {uri}").into());
    }
    let host = uri.host().ok_or("an ACME URL without a host")?;
    let port = uri.port_u16().unwrap_or(443);
    let tcp = tokio::time::timeout(STEP_TIMEOUT, TcpStream::connect((host, port)))
        .await
        .map_err(|_| format!("connecting to {host}:{port} timed out"))??;
    let name = host.trim_start_matches('[').trim_end_matches(']');
    let ssl = connector.configure()?.into_ssl(name)?;
    let mut tls = SslStream::new(ssl, tcp)?;
    tokio::time::timeout(STEP_TIMEOUT, Pin::new(&mut tls).connect())
        .await
        .map_err(|_| format!("TLS handshake with {host}:{port} timed out"))??;
    let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(tls)).await?;
    tokio::spawn(async move {
        if let Err(e) = connection.await {
            log::debug!("acme: connection to the CA ended: {e}");
        }
    });
    let authority = uri.authority().map(|a| a.as_str()).unwrap_or(host);
    request
        .headers_mut()
        .insert(HOST, HeaderValue::from_str(authority)?);
    let path = uri.path_and_query().map_or("/", |p| p.as_str());
    *request.uri_mut() = path.parse()?;
    let response = tokio::time::timeout(STEP_TIMEOUT, sender.send_request(request))
        .await
        .map_err(|_| format!("{host}:{port} did not answer in time"))??;
    Ok(BytesResponse::from(response))
}
